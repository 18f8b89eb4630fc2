#!/usr/bin/env python3
"""Write a realistic xlog log on the sim backend: a small training loop.

    sample_log.py OUT.csv [--steps N]

Two streams (compute, copy); weights and optimizer state that live for the
whole run; per step an input batch on the copy stream, activations that
grow through the forward pass and shrink through the backward pass,
gradients, and a scratch workspace per layer. One cache block is never
freed (the runtime writes a `leak` row for it at close) and one allocation
fails (an injected driver fault: an `allocate failure` row). Call sites are
tracked, so every allocate row carries its call site in Detail. Used by the
report_chromium test and to make docs/report.png.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import xlog_cuda as xc  # noqa: E402

MiB = 1 << 20
LAYERS = 6


def write_sample(path: str, steps: int = 12, pause: float = 0.002) -> None:
    # The runtime appends to an existing log: start a fresh one.
    if os.path.exists(path):
        os.remove(path)
    # Call sites tracked: each allocate row names its Python call site in
    # Detail, which the report groups by call stack.
    config = xc.Config(backend="sim", budget_bytes=512 * MiB, log_path=path, sim_capacity_bytes=1 << 30,
                       track_call_sites=True)
    rt = xc.Runtime(0, config)
    compute = rt.acquire_stream()
    copy = rt.acquire_stream()
    weights = [rt.allocate((8 + 2 * i) * MiB, compute, tag="weights") for i in range(LAYERS)]
    optimizer = [rt.allocate(2 * w.size, compute, tag="optimizer") for w in weights]
    leaked = None
    for step in range(steps):
        batch = rt.allocate(6 * MiB, copy, tag="input")
        acts = []
        for layer in range(LAYERS):
            scratch = rt.allocate(12 * MiB, compute, tag="workspace")
            acts.append(rt.allocate((4 + layer) * MiB, compute, tag="activations"))
            time.sleep(pause)
            scratch.free()
        grads = []
        for layer in reversed(range(LAYERS)):
            grads.append(rt.allocate(weights[layer].size, compute, tag="gradients"))
            acts.pop().free()
            time.sleep(pause)
        if step == 4:
            leaked = rt.allocate(24 * MiB, compute, tag="cache")  # never freed
        if step == 8:
            rt.sim_inject_fault("alloc", 1)
            try:
                rt.allocate(32 * MiB, compute, tag="activations")
            except xc.DriverError:
                pass
        for g in grads:
            g.free()
        batch.free()
        rt.reap()
        time.sleep(pause)
    for b in optimizer + weights:
        b.free()
    rt.drain()
    compute.release()
    copy.release()
    report = rt.close()  # the cache block is still live: a leak row
    assert report.blocks == 1, report
    del leaked


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    write_sample(args.out, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
