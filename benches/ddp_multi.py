#!/usr/bin/env python3
"""benches/ddp_multi.py — torch.distributed (DDP over NCCL) with one xlog
hook runtime per rank, issue 15.

Run by torchrun, one process per GPU; rank r trains on device r:

    torchrun --nproc-per-node 2 benches/ddp_multi.py --allocator xlog --budget 4GiB --out OUT
    torchrun --nproc-per-node 2 benches/ddp_multi.py --allocator caching --out OUT

With `--allocator xlog` each rank calls
`xlog_cuda.torch.enable(budget=..., device=rank)` before CUDA starts, so its
PyTorch allocations (parameters, activations, gradients, DDP's buckets) go
through the hook runtime of its own device, under its own budget. NCCL's
own buffers are NCCL's (cudaMalloc), outside any allocator.

The model: a small MLP (4 x Linear(2048, 2048) + GELU) regressing a fixed
random teacher network, AdamW, batch 256 per rank, bf16 autocast. Each rank
draws its own batches (seed + rank), DDP averages the gradients.

Per rank: the loss of the first and last 10 steps, the median step time
(warm-up steps excluded, each step bracketed by torch.cuda.synchronize),
and with xlog the hook runtime's stats (peak outstanding bytes, budget
limit, failed allocations, allocations). Rank 0 gathers every rank's
result, prints one PASS/FAIL line per check and writes
OUT/ddp-<allocator>.json:

  loss falls         last-10 mean < 0.5 x first-10 mean, on every rank
  own device         (xlog) each rank's hooks serve only its own device, and
                     allocated there
  peak <= budget     (xlog) peak_outstanding_bytes <= budget_limit == --budget
  no refusal         (xlog) failed_allocations == 0

The step-time comparison with PyTorch's caching allocator (target: xlog <=
1.0 x caching) is made by scripts/gpu-multi from the two JSON files
(`--compare CACHING.json XLOG.json` does it here too).

Exit status: 0 every check passed, 1 a check failed, 2 bad arguments or
setup. `--self-test` checks the pure-Python parts without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

HIDDEN = 2048
LAYERS = 4
BATCH = 256


def parse_size(text: str) -> int:
    units = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
    t = text.strip().upper()
    number = t.rstrip("KMGIB")
    unit = t[len(number):]
    if unit not in units or not number:
        raise ValueError(f"not a size: {text!r}")
    return int(float(number) * units[unit])


def evaluate(results: Sequence[Dict[str, Any]], allocator: str, budget: int) -> List[Tuple[bool, str]]:
    """The checks over every rank's result: (passed, line) pairs."""
    checks: List[Tuple[bool, str]] = []
    for r in sorted(results, key=lambda r: r["rank"]):
        rank = r["rank"]
        first, last = r["loss_first"], r["loss_last"]
        checks.append((last < 0.5 * first, f"rank {rank}: loss falls ({first:.4g} -> {last:.4g})"))
        if allocator != "xlog":
            continue
        s = r["xlog"]
        own = r["hook_devices"] == [r["device"]] and s["allocations"] > 0
        checks.append((own, f"rank {rank}: hooks on its own device only (devices {r['hook_devices']}, "
                            f"device {r['device']}, {s['allocations']} allocations)"))
        checks.append((s["budget_limit"] == budget and s["peak_outstanding_bytes"] <= budget,
                       f"rank {rank}: peak {s['peak_outstanding_bytes']} <= budget {s['budget_limit']} "
                       f"(asked {budget})"))
        checks.append((s["failed_allocations"] == 0, f"rank {rank}: no refusal ({s['failed_allocations']} failed)"))
    ranks = sorted(r["rank"] for r in results)
    checks.append((ranks == list(range(len(ranks))) and len(ranks) >= 2, f"ranks reporting: {ranks}"))
    return checks


def compare(caching: Dict[str, Any], xlog: Dict[str, Any], max_ratio: float = 1.0) -> Tuple[bool, str]:
    """Step time of xlog against the caching allocator: the slowest rank of
    each run (DDP steps in lockstep, so the slowest rank is the step)."""
    t_caching = max(r["step_ms"] for r in caching["ranks"])
    t_xlog = max(r["step_ms"] for r in xlog["ranks"])
    ratio = t_xlog / t_caching
    return (ratio <= max_ratio,
            f"DDP step time xlog {t_xlog:.3f} ms vs caching {t_caching:.3f} ms: {ratio:.3f}x (target <= {max_ratio})")


def train(args: argparse.Namespace) -> Dict[str, Any]:
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    world = int(os.environ["WORLD_SIZE"])
    device = local_rank
    if args.allocator == "xlog":
        import xlog_cuda.torch as xt  # before torch initialises CUDA

        xt.enable(budget=args.budget, device=device, backend="cuda")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", device))
    torch.manual_seed(1234)  # same initial weights on every rank (DDP broadcasts them anyway)

    def mlp() -> torch.nn.Module:
        layers: List[torch.nn.Module] = []
        for _ in range(LAYERS):
            layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU()]
        layers.append(torch.nn.Linear(HIDDEN, 1))
        return torch.nn.Sequential(*layers).cuda()

    teacher = mlp().requires_grad_(False)
    model = DDP(mlp(), device_ids=[device])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator(device="cuda").manual_seed(99 + rank)
    losses: List[float] = []
    times: List[float] = []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        x = torch.randn(BATCH, HIDDEN, device="cuda", generator=gen)
        with torch.no_grad():
            y = teacher(x)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1000.0)
        losses.append(loss.item())
    result: Dict[str, Any] = {
        "rank": rank,
        "device": device,
        "allocator": args.allocator,
        "step_ms": statistics.median(times),
        "loss_first": statistics.mean(losses[:10]),
        "loss_last": statistics.mean(losses[-10:]),
        "steps": len(losses),
    }
    if args.allocator == "xlog":
        import dataclasses

        import xlog_cuda.torch as xt

        result["xlog"] = dataclasses.asdict(xt.stats(device))
        result["hook_devices"] = xt.enable_info().get("devices", [])
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, result)
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "ranks": gathered}


def self_test() -> int:
    ok = parse_size("4GiB") == 4 << 30 and parse_size("512MiB") == 512 << 20 and parse_size("100") == 100
    xlog_stats = {"allocations": 10, "budget_limit": 1 << 30, "peak_outstanding_bytes": 1 << 29, "failed_allocations": 0}
    good = [
        {"rank": r, "device": r, "loss_first": 1.0, "loss_last": 0.1, "step_ms": 2.0, "hook_devices": [r],
         "xlog": dict(xlog_stats)}
        for r in range(2)
    ]
    ok &= all(passed for passed, _ in evaluate(good, "xlog", 1 << 30))
    bad = [dict(r) for r in good]
    bad[1] = dict(bad[1], loss_last=0.9, hook_devices=[0, 1], xlog=dict(xlog_stats, failed_allocations=2))
    failed = [line for passed, line in evaluate(bad, "xlog", 1 << 30) if not passed]
    ok &= len(failed) == 3 and all("rank 1" in line for line in failed)
    over = [dict(r, xlog=dict(xlog_stats, peak_outstanding_bytes=(1 << 30) + 1)) for r in good]
    ok &= sum(not p for p, _ in evaluate(over, "xlog", 1 << 30)) == 2
    ok &= not evaluate(good[:1], "caching", 0)[-1][0]  # one rank is not a distributed run
    ok &= compare({"ranks": good}, {"ranks": good})[0]
    ok &= not compare({"ranks": good}, {"ranks": [dict(r, step_ms=2.5) for r in good]})[0]
    print("self-test", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allocator", choices=["xlog", "caching"], default="xlog")
    p.add_argument("--budget", default="4GiB", help="per-rank xlog budget (size string)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--out", default=".")
    p.add_argument("--compare", nargs=2, metavar=("CACHING_JSON", "XLOG_JSON"))
    p.add_argument("--max-ratio", type=float, default=1.0)
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.compare:
        with open(args.compare[0]) as f_caching, open(args.compare[1]) as f_xlog:
            passed, line = compare(json.load(f_caching), json.load(f_xlog), args.max_ratio)
        print(("PASS: " if passed else "FAIL: ") + line)
        return 0 if passed else 1
    try:
        args.budget = parse_size(args.budget)
    except ValueError as e:
        print(f"error: --budget: {e}", file=sys.stderr)
        return 2
    if args.steps < 20:
        print("error: --steps must be at least 20 (the loss check averages 10 at each end)", file=sys.stderr)
        return 2
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("error: run under torchrun (RANK / WORLD_SIZE are not set)", file=sys.stderr)
        return 2
    out = train(args)
    if out["rank"] != 0:
        return 0
    checks = evaluate(out["ranks"], args.allocator, args.budget)
    for passed, line in checks:
        print(("PASS: " if passed else "FAIL: ") + f"[{args.allocator}] " + line, flush=True)
    for r in out["ranks"]:
        print(f"[{args.allocator}] rank {r['rank']}: median step {r['step_ms']:.3f} ms", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"ddp-{args.allocator}.json")
    with open(path, "w") as f:
        json.dump({"allocator": args.allocator, "budget": args.budget, "ranks": out["ranks"],
                   "checks": [{"passed": p, "check": line} for p, line in checks]}, f, indent=1)
    return 0 if all(p for p, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
