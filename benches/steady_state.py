#!/usr/bin/env python3
"""Replay one step of a recorded training trace many times on sim and
print, step by step, the misses and the held bytes: whether the arena's
layout settles (no miss once the shapes repeat) or keeps moving memory.

    python3 benches/steady_state.py TRACE [--steps 12] [--marks-per-step 4] [--gpu-lag 200]
                                          [--max-maps-per-step N] [--as-recorded]

A step is found by its largest allocation: the trace's largest size is
allocated `--marks-per-step` times a step (GPT-2's logits and their
gradients: 4). The step repeated is the trace's second-to-last whole one
(the last may be cut short); it is replayed after everything before it,
then again and again. Blocks a step frees that an earlier step allocated
(carried between steps: gradients, optimizer state) are matched by size to
what the previous repeat left live, so every repeat frees what the one
before carried.

Why: on the GPU a miss in a fixed-shape loop maps hundreds of pages (an
823 MB logits block is 50 of the arena's 16 MiB large pages), each costing about
the same driver time whatever its size, so pages mapped per step in the
steady state is what the step time pays for; the lag-free and lagged footprint
replays (check_traces.py) see only the peak. The sim's streams run
`--gpu-lag` operations behind the host, as a GPU does. Environment as for
`python -m xlog_cuda.replay` (XLOG_CUDA_LIBRARY picks the library).

`--as-recorded`: replay the trace whole, as it was recorded, a row at
each step's mark, instead of repeating one step (`--steps` is then not
used). A repeated step is an idealisation: a trace of a whole run also
has its first steps' allocations in place (optimizer state, the first
step's different shapes). On the 25-step GPT-2 trace recorded on an H200
(`benches/traces/h200-w7-gpt2-25steps.csv.gz`), blocks of 256 MiB or more
carved from the top of their range looked settled in 13 repeats of one
step and were not, as recorded (5,107 pages mapped in steps 5-25 against
4,092). BENCHMARKS.md, "Physical memory, sixth pass".

`--max-maps-per-step N`: exit 1 when the pages mapped per step, averaged
over the second half of the repeats, exceed N. `--max-held-ratio R`: exit
1 when what the arena holds passes R times the live peak at any step: in a
step repeated, fragmentation can make it create pages step after step
(with a lending slack of 1/256 the ResNet-50 step held 1.004x its live
peak at first, 1.044x after 80 repeats, and 1.034x on the GPU after 13
steps), which a replay of the short recorded trace does not show. The
ctests `steady_state_remap_gpt2`, `_resnet50` and `_resnet50_lagged` bound
both on the recorded GPT-2 and ResNet-50 steps, and
`steady_state_remap_gpt2_recorded` on the 25-step GPT-2 trace as recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict, deque
from typing import Any, Deque, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from xlog_cuda import replay as R  # noqa: E402
from xlog_cuda._config import Config  # noqa: E402
from xlog_cuda._runtime import Runtime  # noqa: E402


def repeated_ops(trace: R.Trace, marks_per_step: int, steps: int):
    """The trace's operations up to its second-to-last whole step, then that
    step `steps` times: (ops, sizes, block streams, the largest size)."""
    big = max(trace.sizes)
    marks = [i for i, op in enumerate(trace.ops) if op >= 0 and trace.sizes[op] == big]
    if len(marks) < 2 * marks_per_step + 1:
        raise SystemExit(f"the trace allocates its largest size ({big:,} bytes) {len(marks)} times: "
                         f"fewer than two whole steps of {marks_per_step}")
    start, end = marks[-1 - 2 * marks_per_step], marks[-1 - marks_per_step]
    step = trace.ops[start:end]
    freed = {~op for op in step if op < 0}
    carried_out = [op for op in step if op >= 0 and op not in freed]
    sizes, streams = list(trace.sizes), list(trace.block_stream)
    ops = list(trace.ops[:start])
    previous: Dict[int, int] = {}
    for rep in range(steps):
        ids: Dict[int, int] = {}
        # What the previous repeat carried out, by size, oldest first.
        carried: Dict[int, Deque[int]] = defaultdict(deque)
        for op in carried_out if rep else []:
            carried[trace.sizes[op]].append(previous[op])
        for op in step:
            if op >= 0:
                new = op if rep == 0 else len(sizes)
                if rep:
                    sizes.append(trace.sizes[op])
                    streams.append(trace.block_stream[op])
                ids[op] = new
                ops.append(new)
            elif ~op in ids:
                ops.append(~ids[~op])
            elif rep == 0:
                ops.append(op)  # carried in from before: the trace's own block
            elif carried[trace.sizes[~op]]:
                ops.append(~carried[trace.sizes[~op]].popleft())
            # else: nothing the previous repeat carried matches; skipped
        previous = ids
    return ops, sizes, streams, big


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=12, help="repeats of the step (default 12)")
    ap.add_argument("--marks-per-step", type=int, default=4,
                    help="allocations of the trace's largest size per step (default 4: GPT-2)")
    ap.add_argument("--gpu-lag", type=int, default=200, help="as replay's --gpu-lag (default 200)")
    ap.add_argument("--memory", choices=("arena", "pool"), default="arena")
    ap.add_argument("--max-maps-per-step", type=float, default=None,
                    help="exit 1 when the mean pages mapped per step over the second half exceeds this")
    ap.add_argument("--as-recorded", action="store_true",
                    help="replay the trace whole as recorded instead of repeating one step")
    ap.add_argument("--max-held-ratio", type=float, default=None,
                    help="exit 1 when the held bytes at any step's mark exceed this times the live peak")
    args = ap.parse_args()
    if args.steps < 2 or args.marks_per_step < 1 or args.gpu_lag < 0:
        ap.error("--steps must be >= 2, --marks-per-step >= 1, --gpu-lag >= 0")
    trace = R.read_trace(args.trace)
    if args.as_recorded:
        ops, sizes, block_stream, big = list(trace.ops), list(trace.sizes), list(trace.block_stream), max(trace.sizes)
    else:
        ops, sizes, block_stream, big = repeated_ops(trace, args.marks_per_step, args.steps)
    capacity = R.default_capacity(trace.peak_live_bytes, len(trace.streams))
    rt = Runtime(device=0, config=Config(backend="sim", memory=args.memory, sim_capacity_bytes=capacity,
                                         stream_pool_size=max(16, len(trace.streams))))
    lag = R.GpuLag([], args.gpu_lag)
    try:
        streams = [rt.acquire_stream() for _ in trace.streams]
        lag.streams = streams
        blocks: Dict[int, Any] = {}
        last, seen, step = rt.stats(), 0, 0
        maps: List[int] = []
        worst = 0.0
        print("step  allocations  misses  pages mapped  unmapped  held GiB  peak live GiB  held/peak live")
        for done, op in enumerate(ops):
            lag.tick(done)
            if op >= 0:
                if sizes[op] == big:
                    seen += 1
                    if seen % args.marks_per_step == 0:
                        st = rt.stats()
                        ratio = st.outstanding_bytes / max(1, st.peak_live_bytes)
                        print(f"{step:4}  {st.allocations - last.allocations:11}  {st.cache_misses - last.cache_misses:6}"
                              f"  {st.pages_mapped - last.pages_mapped:12}  {st.pages_unmapped - last.pages_unmapped:8}"
                              f"  {st.outstanding_bytes / 2**30:8.3f}  {st.peak_live_bytes / 2**30:13.3f}  {ratio:14.3f}",
                              flush=True)
                        maps.append(st.pages_mapped - last.pages_mapped)
                        worst = max(worst, ratio)
                        last, step = st, step + 1
                blocks[op] = rt.allocate(sizes[op], streams[block_stream[op]])
            else:
                block = blocks.pop(~op, None)
                if block is not None:
                    block.free()
        for block in blocks.values():
            block.free()
        for s in streams:
            s.release()
    finally:
        lag.release()
        rt.close()
    # The first row is the warm-up before the repeats (as recorded: the
    # first step); the second half of the rest is the steady state.
    tail = maps[1:][len(maps[1:]) // 2:]
    mean = sum(tail) / len(tail) if tail else 0.0
    ok = True
    verdict = f"pages mapped per step, mean of the last {len(tail)}: {mean:.1f}"
    if args.max_maps_per_step is not None:
        ok = mean <= args.max_maps_per_step
        verdict += f"; bound {args.max_maps_per_step:g}: " + ("ok" if ok else "EXCEEDED")
    print(verdict)
    verdict = f"held / live peak, the most at any step: {worst:.3f}"
    if args.max_held_ratio is not None:
        held_ok = worst <= args.max_held_ratio
        verdict += f"; bound {args.max_held_ratio:g}: " + ("ok" if held_ok else "EXCEEDED")
        ok = ok and held_ok
    print(verdict)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
