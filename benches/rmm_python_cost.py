#!/usr/bin/env python3
"""The per-allocation cost of xlog as RMM's resource from Python (issue 26
item 2), beside RMM's own resources, in one process on one GPU.

    python3 benches/rmm_python_cost.py [--pairs N] [--repeat R] [--sizes 256,1048576]

For each resource it times `rmm.DeviceBuffer(size=S)` followed by its
deletion (an allocate+free pair through RMM's Python API, uninitialised
memory, on the default stream), N pairs per repeat, and prints the median
and range over the repeats in microseconds per pair:

  cuda        rmm.mr.CudaMemoryResource (cudaMalloc/cudaFree)
  cuda_async  rmm.mr.CudaAsyncMemoryResource (cudaMallocAsync)
  pool        rmm.mr.PoolMemoryResource over cuda
  xlog        xlog_cuda.rmm.resource() (a CallbackMemoryResource over xlog's hooks)

Needs rmm (rmm-cu13) and a GPU; exits 77 without them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default="256,1048576")
    args = ap.parse_args()
    try:
        import rmm
        import xlog_cuda.rmm as xrmm
    except ImportError as e:
        print(f"rmm_python_cost: SKIP: {e}")
        return 77
    sizes = [int(s) for s in args.sizes.split(",") if s]
    resources = {
        "cuda": lambda: rmm.mr.CudaMemoryResource(),
        "cuda_async": lambda: rmm.mr.CudaAsyncMemoryResource(),
        "pool": lambda: rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30),
        "xlog": lambda: xrmm.resource(backend="cuda"),
    }
    print(f"rmm {rmm.__version__}; {args.pairs} pairs x {args.repeat} repeats; us per DeviceBuffer allocate+free")
    print("| resource | " + " | ".join(f"{s} B" for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name, make in resources.items():
        mr = make()
        rmm.mr.set_current_device_resource(mr)
        cells = []
        for size in sizes:
            for _ in range(200):  # warm-up: first-touch, pool growth
                rmm.DeviceBuffer(size=size)
            per_pair = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                for _ in range(args.pairs):
                    rmm.DeviceBuffer(size=size)
                per_pair.append((time.perf_counter() - t0) / args.pairs * 1e6)
            cells.append(f"{statistics.median(per_pair):.2f} ({min(per_pair):.2f}-{max(per_pair):.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    rmm.mr.set_current_device_resource(rmm.mr.CudaMemoryResource())
    return 0


if __name__ == "__main__":
    sys.exit(main())
