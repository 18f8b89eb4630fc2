#!/usr/bin/env python3
"""Where a W7 training step's time goes: host enqueue or GPU.

    python3 benches/host_gpu_split.py ALLOCATOR MODEL [--steps 16] [--skip 6] [--per-step]

ALLOCATOR is caching, expandable (PyTorch's caching allocator with
expandable segments) or xlog (xlog_cuda.torch.enable(), the library that
XLOG_CUDA_LIBRARY names); MODEL is one of benches/w7_training.py's models,
built by its build_workload. One process, one allocator, nothing else
running (W7 starts the next run's process while one runs, which costs a
host-bound model time). For each step it times the host from the step's
start until the step is enqueued, the GPU between CUDA events recorded at
both ends, and the wall time to a synchronize; it prints the medians of
the steps after the first `--skip`. A step whose host time is close to its
wall time is host-bound: an allocator's host cost (or a synchronisation
inside the step) shows there, not in the GPU time. `--per-step` also
prints every step's three times (a drift from step to step, which medians
hide).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("allocator", choices=("caching", "expandable", "xlog"))
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--skip", type=int, default=6)
    ap.add_argument("--per-step", action="store_true", help="print every step's host, GPU and wall ms")
    args = ap.parse_args()
    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    sys.path.insert(0, os.path.join(here, "..", "python"))
    import w7_training as w7

    if args.allocator == "xlog":
        import xlog_cuda.torch as xt

        xt.enable(backend="cuda")
    import torch

    torch.manual_seed(0)
    plan = w7.step_plan(args.model, args.steps)
    _, _, step = w7.build_workload(torch, args.model, plan)
    host, gpu, wall = [], [], []
    for i in range(args.steps):
        w, h, g = w7.timed_step(torch, step, i)
        if args.per_step:
            print(f"step {i:3d}: host {h:7.2f}  gpu {g:7.2f}  wall {w:7.2f} ms")
        if i >= args.skip:
            host.append(h)
            wall.append(w)
            gpu.append(g)
    med = statistics.median
    print(f"{args.model:9s} {args.allocator:10s} wall {med(wall):6.2f} ms  host-enqueue {med(host):6.2f} ms  "
          f"gpu(events) {med(gpu):6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
