#!/usr/bin/env python3
"""What one allocate + free costs the host through CuPy, per allocator:
`cupy.empty` (no kernel) in a loop that keeps a window of live arrays,
each iteration dropping the oldest and allocating one of a size drawn from
a fixed pseudo-random sequence. All allocators in one process, in rounds
taken in turns (so they see the same host state); nanoseconds per pair,
the median of the rounds.

    XLOG_CUDA_LIBRARY=/path/libxlog_cuda.so python3 benches/cupy_alloc_cost.py
        [--iterations 100000] [--rounds 7] [--window 16]

Arms:
  default     CuPy's MemoryPool
  xlog        what xlog_cuda.cupy.enable() installs: CuPy's CFunctionAllocator
              over xlog's hooks, behind a Python check that turns a refusal
              into OutOfMemoryError
  xlog_bare   the same CFunctionAllocator with no Python check (not
              something to use: a refusal would give a NULL pointer); the
              difference to `xlog` is what the check costs
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Dict, List


def sizes(n: int, seed: int = 77) -> List[int]:
    rng = random.Random(seed)
    return [rng.choice((256, 4096, 65536, 1 << 20, 3 << 20)) + rng.randrange(0, 4096, 256) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--json")
    a = ap.parse_args()

    import xlog_cuda.cupy

    xlog_cuda.cupy.enable()
    import cupy as cp

    arms = {
        "default": cp.cuda.MemoryPool().malloc,
        "xlog": cp.cuda.get_allocator(),
        "xlog_bare": xlog_cuda.cupy._state.allocator.malloc,
    }
    plan = sizes(a.iterations)
    ns: Dict[str, List[float]] = {k: [] for k in arms}
    names = list(arms)
    for r in range(a.rounds + 1):  # round 0 warms every arm
        for name in names[r % len(names):] + names[:r % len(names)]:
            cp.cuda.set_allocator(arms[name])
            ring = [None] * a.window
            cp.cuda.Device(0).synchronize()
            t0 = time.perf_counter_ns()
            for i, n in enumerate(plan):
                ring[i % a.window] = cp.empty(n, dtype=cp.uint8)
            ring = None
            cp.cuda.Device(0).synchronize()
            if r > 0:
                ns[name].append((time.perf_counter_ns() - t0) / a.iterations)
    out = {k: statistics.median(v) for k, v in ns.items()}
    print("ns per allocate + free (median of rounds): " + ", ".join(f"{k} {v:.0f}" for k, v in out.items())
          + f"; xlog / default {out['xlog'] / out['default']:.3f}, the check {out['xlog'] - out['xlog_bare']:.0f} ns")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"ns": ns, "median": out}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
