"""Do kernels run as fast on xlog's memory as on PyTorch's own?

    XLOG_CUDA_LIBRARY=... PYTHONPATH=python python3 benches/gpu_memory_probe.py [--repeats 15] [--out FILE]

xlog maps its memory page by page through CUDA's virtual-memory API (2 MiB
pages, 16 MiB for blocks of 256 MiB and more); PyTorch's caching allocator
takes whole segments from cudaMalloc. Step time compares the allocators'
host cost and the kernels together, so this probe times the kernels alone,
on tensors from each allocator in one process (the switch of `w7_ab.py`):

- `gather`: random 4-byte reads over the whole tensor (`torch.take` with
  uniformly random indices), where the GPU's address translation counts
  most: every read may need another page's translation;
- `copy`: a streaming copy of the tensor (bandwidth);
- `matmul`: a bf16 GEMM of 8192 x 8192 matrices.

Each kernel runs on each allocator's tensors in turn (the order swapped
each repeat), timed with CUDA events; prints the medians and the ratio
xlog / caching for each tensor size. Needs a GPU."""

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import w7_training as W  # noqa: E402
from w7_ab import MODES, install_switch  # noqa: E402

MIB = 1 << 20


def timed(torch, fn, reps: int = 5) -> float:
    """GPU milliseconds per call of `fn` (`reps` calls between the two
    events of `w7_training.timed_step`)."""
    return W.timed_step(torch, lambda _: [fn() for _ in range(reps)], 0)[2] / reps


def operands(torch, switch, mode: int, mib: int) -> Dict[str, object]:
    """Tensors of one allocator: a float32 tensor of `mib` MiB, random
    indices into it, outputs, and two 8192 x 8192 bf16 matrices."""
    switch.ab_set_mode(mode)
    n = mib * MIB // 4
    x = torch.rand(n, device="cuda")
    idx = torch.randint(0, n, (16 * MIB,), device="cuda")
    ops = {
        "x": x, "idx": idx, "gathered": torch.empty(16 * MIB, device="cuda"), "y": torch.empty_like(x),
        "a": torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16),
        "b": torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16),
        "c": torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16),
    }
    switch.ab_set_mode(0)
    return ops


def kernels(torch, o) -> Dict[str, object]:
    return {
        "gather": lambda: torch.take(o["x"], o["idx"], out=o["gathered"]),
        "copy": lambda: o["y"].copy_(o["x"]),
        "matmul": lambda: torch.matmul(o["a"], o["b"], out=o["c"]),
    }


def probe(torch, switch, mib: int, repeats: int, reps: int) -> Dict[str, Dict[str, List[float]]]:
    ops = {name: operands(torch, switch, mode, mib) for name, mode in MODES.items()}
    runs = {name: kernels(torch, o) for name, o in ops.items()}
    out: Dict[str, Dict[str, List[float]]] = {k: {a: [] for a in MODES} for k in runs["caching"]}
    for kernel in out:
        for a in MODES:  # warm
            timed(torch, runs[a][kernel], 2)
        for r in range(repeats):
            order = list(MODES) if r % 2 == 0 else list(reversed(list(MODES)))
            for a in order:
                out[kernel][a].append(timed(torch, runs[a][kernel], reps))
    del ops, runs
    torch.cuda.synchronize()
    return out


def summary_lines(mib: int, res: Dict[str, Dict[str, List[float]]]) -> List[str]:
    """One line per kernel: each allocator's median ms, the ratio of the
    medians xlog / caching, and the range of the per-repeat ratios."""
    lines = []
    for kernel, by in res.items():
        med = {a: statistics.median(v) for a, v in by.items()}
        ratio = med["xlog"] / med["caching"]
        pairs = [x / c for x, c in zip(by["xlog"], by["caching"])]
        lines.append(f"{mib} MiB {kernel}: caching {med['caching']:.3f} ms, xlog {med['xlog']:.3f} ms, "
                     f"xlog/caching {ratio:.3f} (pairs {min(pairs):.3f}-{max(pairs):.3f})")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sizes", default="128,4096", help="tensor sizes in MiB, comma-separated")
    ap.add_argument("--reps", type=int, default=5, help="calls of a kernel between two events")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch

    switch = install_switch(torch)
    torch.cuda.init()
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "sizes": {},
              "caching_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "library": os.environ.get("XLOG_CUDA_LIBRARY", "")}
    for mib in [int(s) for s in args.sizes.split(",")]:
        res = probe(torch, switch, mib, args.repeats, args.reps)
        report["sizes"][mib] = res
        for line in summary_lines(mib, res):
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
