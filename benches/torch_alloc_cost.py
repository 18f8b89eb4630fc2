"""What one allocate + free costs the host through PyTorch's allocator
interface, per allocator: the C++ call PyTorch makes for every tensor
(`c10::cuda::CUDACachingAllocator::get()->allocate(n)`, then the DataPtr's
deleter), timed in a loop with no Python and no kernel in between.

Each allocator runs in its own process (the allocator is chosen before CUDA
starts), the processes in turns (`--turns`), all on the same cores
(`--cpus`). In each process the loop keeps a window of live blocks (a ring
of `--window` DataPtrs; each iteration frees the oldest and allocates a
block of a size drawn from `--sizes`, a fixed pseudo-random sequence) and
reports nanoseconds per pair, the median of `--repeats` timed loops.

Allocators: as `w7_turns.py` names them (`caching`, `caching_pluggable`,
`xlog`, and `+NAME=VALUE` settings of one process, e.g.
`xlog+XLOG_TORCH_ALLOCATOR=pluggable`).

    python3 benches/torch_alloc_cost.py --allocators caching,caching_pluggable,xlog,xlog+XLOG_TORCH_ALLOCATOR=pluggable
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import w7_turns as T  # noqa: E402

_LOOP_SOURCE = r'''
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
#include <vector>

// ns per allocate + free: a ring of `window` live DataPtrs, each iteration
// frees the oldest and allocates sizes[i % sizes.size()].
double alloc_cost_run(int64_t iters, int64_t window, std::vector<int64_t> sizes) {
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  std::vector<c10::DataPtr> ring(static_cast<size_t>(window));
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    auto& slot = ring[static_cast<size_t>(i % window)];
    slot.clear();
    slot = allocator->allocate(static_cast<size_t>(sizes[static_cast<size_t>(i) % sizes.size()]));
  }
  auto stop = std::chrono::steady_clock::now();
  for (auto& slot : ring) slot.clear();
  return std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(iters);
}
'''


def size_sequence(kind: str, n: int = 4096) -> List[int]:
    """`kind`: "small" (512 B to 2 MiB), "mixed" (512 B to 128 MiB, mostly
    small, as a training step's), a fixed pseudo-random sequence."""
    state = 12345
    out = []
    top = 20 if kind == "small" else 26
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        r = state >> 33
        exp = 9 + (r % (top - 9 + 1) if kind == "small" else min(r % 24, r % 18))
        size = (1 << exp) + (r >> 8) % (1 << exp)
        out.append(int(size))
    return out


def child_main(spec: Dict[str, Any]) -> int:
    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])
    name = spec["allocator"]
    if name.startswith("xlog"):
        import xlog_cuda.torch as xt

        xt.enable(backend="cuda")
    import torch

    if name == "caching_pluggable":
        T.use_caching_through_pluggable(torch)
    torch.cuda.init()
    torch.empty(1, device="cuda")
    from torch.utils.cpp_extension import load_inline

    mod = load_inline(name="torch_alloc_cost_loop", cpp_sources=_LOOP_SOURCE, functions=["alloc_cost_run"],
                      with_cuda=True, verbose=False)
    sizes = size_sequence(spec["sizes"])
    mod.alloc_cost_run(spec["iters"], spec["window"], sizes)  # warm: every size seen once
    torch.cuda.synchronize()
    runs = [mod.alloc_cost_run(spec["iters"], spec["window"], sizes) for _ in range(spec["repeats"])]
    torch.cuda.synchronize()
    info: Dict[str, Any] = {"allocator": spec["label"], "ns": runs}
    if name.startswith("xlog"):
        import xlog_cuda.torch as xt

        info["kind"] = xt.enable_info().get("allocator")
    print("result " + json.dumps(info), flush=True)
    return 0


def parse_args(argv: Optional[Sequence[str]] = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allocators", default="caching,caching_pluggable,xlog,xlog+XLOG_TORCH_ALLOCATOR=pluggable")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--iters", type=int, default=200000)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sizes", choices=("small", "mixed"), default="mixed")
    p.add_argument("--cpus", default="", help="cores for every process, e.g. 4,5")
    p.add_argument("--out", default="", help="a JSON file for the results")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    cpus = [int(c) for c in args.cpus.split(",") if c]
    labels = [a for a in args.allocators.split(",") if a]
    per: Dict[str, List[float]] = {label: [] for label in labels}
    kinds: Dict[str, Any] = {}
    for turn in range(args.turns):
        order = labels[turn % len(labels):] + labels[:turn % len(labels)]
        for label in order:
            name, extra = T.split_label(label)
            spec = {"allocator": name, "label": label, "iters": args.iters, "window": args.window,
                    "repeats": args.repeats, "sizes": args.sizes, "cpus": cpus}
            env = dict(os.environ, **extra)
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                                  env=env, capture_output=True, text=True, timeout=900)
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith("result ")), None)
            if done.returncode != 0 or line is None:
                sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
                raise SystemExit(f"{label}: the child failed (rc {done.returncode})")
            info = json.loads(line[len("result "):])
            per[label].append(statistics.median(info["ns"]))
            kinds[label] = info.get("kind")
            print(f"turn {turn} {label}: {statistics.median(info['ns']):.1f} ns a pair ({info['ns']})", flush=True)
    base = statistics.median(per[labels[0]])
    print(f"\n| allocator | ns a pair (median of {args.turns} processes) | range | / {labels[0]} |")
    print("|---|---:|---|---:|")
    for label in labels:
        med = statistics.median(per[label])
        kind = f" ({kinds[label]})" if kinds.get(label) else ""
        print(f"| {label}{kind} | {med:.1f} | {min(per[label]):.1f}-{max(per[label]):.1f} | {med / base:.3f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "ns": per, "kinds": kinds}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
