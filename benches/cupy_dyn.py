#!/usr/bin/env python3
"""CuPy with sizes that change every step, under CuPy's own memory pool,
the driver's pool (cudaMallocAsync) and xlog.

    XLOG_CUDA_LIBRARY=/path/libxlog_cuda.so python3 benches/cupy_dyn.py --out OUT
        [--allocators default,async,xlog] [--steps 40] [--repeat 2]

    XLOG_CUDA_LIBRARY=... python3 benches/cupy_dyn.py --ab --out OUT [--passes 6]
        # step time only: both allocators in one process, in turns

    python3 benches/cupy_dyn.py --self-test    # the pure-Python parts, no GPU

The workload is a query engine's in CuPy: each step a fact table of a new
row count (2^16..2^24, log-uniform) is filtered, joined to a dimension of
a new size by gather, grouped (bincount, argsort, unique), and the step
also multiplies matrices and takes an FFT of new shapes. The last three
steps' group sums stay alive, so blocks of one step outlive the next. All
sizes come from a seeded generator, the data from CuPy's seeded one: every
allocator runs the same steps and must give the same answers (checked).

Allocators, one process each, in turns (`--repeat` rounds):

  default  CuPy's MemoryPool (its default: caching, blocks split in bins)
  async    CuPy's MemoryAsyncPool on the device's default driver pool,
           release threshold raised to the maximum (a caching pool; at 0
           the driver gives memory back at every synchronisation)
  xlog     xlog_cuda.cupy.enable(): CuPy allocates through xlog's hooks

Per run: the steps run twice (the first pass warms CuPy's kernel cache),
the second timed (median step time); the device peak is NVML's over both
passes, less what the process held before its first allocation (its
context); xlog's run also reports its peak live and held bytes and the
charged peak. Output: results.json and results.md in --out.

`--ab` measures time only, the way `w7_ab.py` does for PyTorch: separate
processes on the GPU machine differ in host speed by more than the
allocators do. One process holds CuPy's MemoryPool and xlog; after a warm
pass under each, every step of `--passes` passes runs under each
allocator in turn (the order rotated with the step and the pass, so each
allocator runs each step first as often as second: the first run of a
step creates the FFT plan of its length, which the second reuses), each
between two
synchronisations. Reported: the ratio of totals and the median per-step
ratio, xlog against CuPy's pool, and whether both gave the same answers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from w7_turns import turn_order  # noqa: E402

ALLOCATORS = ["default", "async", "xlog"]
SEED = 5150
KEEP_STEPS = 3
MiB = 1 << 20


def step_plan(n: int, seed: int = SEED) -> List[Dict[str, int]]:
    """Every step's sizes: fact rows, dimension rows, groups, the matrix
    product's rows and columns, the FFT's length."""
    rng = random.Random(seed)
    plan = []
    for _ in range(n):
        plan.append({
            "rows": int(2 ** rng.uniform(16, 24)),
            "dim": int(2 ** rng.uniform(12, 20)),
            "groups": rng.randint(16, 4096),
            "mm_rows": rng.randint(256, 4096),
            "mm_cols": rng.randint(256, 4096),
            "fft": int(2 ** rng.uniform(14, 22)),
        })
    return plan


def run_step(cp, i: int, s: Dict[str, int], kept: List[Any]) -> float:
    """One step of the plan; a number that depends on every result."""
    cp.random.seed(i)
    keys = cp.random.randint(0, s["dim"], s["rows"], dtype=cp.int64)
    vals = cp.random.random(s["rows"], dtype=cp.float32)
    attr = cp.random.random(s["dim"], dtype=cp.float32)
    mask = vals > 0.3
    k, v = keys[mask], vals[mask]
    joined = v * attr[k]
    group = k % s["groups"]
    sums = cp.bincount(group, weights=joined, minlength=s["groups"])
    order = cp.argsort(group)
    first = float(joined[order][:16].sum())
    uniq, counts = cp.unique(group, return_counts=True)
    x = cp.random.random((s["mm_rows"], 512), dtype=cp.float32)
    y = cp.random.random((512, s["mm_cols"]), dtype=cp.float32)
    z = x @ y
    f = cp.fft.rfft(cp.random.random(s["fft"], dtype=cp.float32))
    kept.append(sums)
    del kept[:-KEEP_STEPS]
    total = sum(float(t.sum()) for t in kept)
    return total + first + float(z[0, 0]) + float(cp.abs(f[1])) + float(counts.sum()) + int(uniq.size)


def child(allocator: str, steps: int, out: str) -> None:
    import pynvml
    from w7_training import NvmlPeak

    if allocator == "xlog":
        import xlog_cuda.cupy

        xlog_cuda.cupy.enable()
    import cupy as cp

    if allocator == "async":
        pool = cp.cuda.runtime.deviceGetDefaultMemPool(0)
        cp.cuda.runtime.memPoolSetAttribute(pool, cp.cuda.runtime.cudaMemPoolAttrReleaseThreshold, 2**64 - 1)
        cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
    elif allocator != "default" and allocator != "xlog":
        raise SystemExit(f"unknown allocator {allocator!r}")
    cp.cuda.runtime.free(0)  # the context, before the baseline
    cp.cuda.Device(0).synchronize()
    nv = NvmlPeak()
    time.sleep(0.05)
    base = nv.used()
    nv.start()
    plan = step_plan(steps)
    kept: List[Any] = []
    answers, times = [], []
    for rep in range(2):
        for i, s in enumerate(plan):
            cp.cuda.Device(0).synchronize()
            t0 = time.perf_counter()
            answer = run_step(cp, i, s, kept)
            cp.cuda.Device(0).synchronize()
            if rep == 1:
                times.append((time.perf_counter() - t0) * 1e3)
                answers.append(answer)
    peak = nv.stop()
    result: Dict[str, Any] = {
        "allocator": allocator,
        "device": nv.name(),
        "cupy": cp.__version__,
        "median_step_ms": statistics.median(times),
        "device_peak_bytes": peak - base,
        "answers": answers,
    }
    if allocator == "xlog":
        st = xlog_cuda.cupy.stats(0)
        result.update(peak_live_bytes=st.peak_live_bytes, charged_peak_bytes=st.peak_outstanding_bytes,
                      pages_mapped=st.pages_mapped, pages_unmapped=st.pages_unmapped)
    pynvml.nvmlShutdown()
    with open(out, "w") as fh:
        json.dump(result, fh)


def ab(steps: int, passes: int, out: str) -> None:
    import xlog_cuda.cupy

    xlog_cuda.cupy.enable()
    import cupy as cp

    arms = {"default": cp.cuda.MemoryPool().malloc, "xlog": cp.cuda.get_allocator()}
    names = list(arms)
    plan = step_plan(steps)
    kept = {name: [] for name in names}
    answers = {name: [] for name in names}
    times = {name: [] for name in names}

    def one(name: str, i: int, s: Dict[str, int]) -> Tuple[float, float]:
        cp.cuda.set_allocator(arms[name])
        cp.cuda.Device(0).synchronize()
        t0 = time.perf_counter()
        answer = run_step(cp, i, s, kept[name])
        cp.cuda.Device(0).synchronize()
        return (time.perf_counter() - t0) * 1e3, answer

    for name in names:  # warm: CuPy's kernels and each allocator's layout
        for i, s in enumerate(plan):
            one(name, i, s)
    for p in range(passes):
        for i, s in enumerate(plan):
            order = [names[j] for j in turn_order(len(names), p + i)]  # each arm takes each step first in turn
            for name in order:
                ms, answer = one(name, i, s)
                times[name].append(ms)
                if p == 0:
                    answers[name].append(answer)
    result = {
        "passes": passes, "steps": steps, "times_ms": times,
        "ratio_of_totals": sum(times["xlog"]) / sum(times["default"]),
        "median_step_ratio": statistics.median(x / d for x, d in zip(times["xlog"], times["default"])),
        "median_ms": {n: statistics.median(t) for n, t in times.items()},
        "same_answers": same_answers(answers["xlog"], answers["default"]),
        "pages_mapped": xlog_cuda.cupy.stats(0).pages_mapped,
    }
    with open(out, "w") as fh:
        json.dump(result, fh)
    print(f"in turns, {passes} passes of {steps} steps: xlog / CuPy's pool {result['ratio_of_totals']:.3f} by totals, "
          f"{result['median_step_ratio']:.3f} median per step; median ms {result['median_ms']}; "
          f"answers {'same' if result['same_answers'] else 'DIFFER'}; xlog pages mapped {result['pages_mapped']}")


def same_answers(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6) for x, y in zip(a, b))


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per allocator: medians and ranges of step time and device peak, and
    whether every run gave the first run's answers; peak live from xlog."""
    by: Dict[str, List[Dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["allocator"], []).append(r)
    reference = runs[0]["answers"] if runs else []
    live = [r["peak_live_bytes"] for r in runs if r.get("peak_live_bytes")]
    # What the device holds for the process beyond its allocator (CuPy's
    # kernels, cuBLAS, cuRAND and cuFFT's own memory), the same under every
    # allocator: xlog's device peak less what it charged.
    untracked = [r["device_peak_bytes"] - r["charged_peak_bytes"] for r in runs if r.get("charged_peak_bytes")]
    out: Dict[str, Any] = {"peak_live_bytes": statistics.median(live) if live else None,
                           "untracked_bytes": statistics.median(untracked) if untracked else 0, "allocators": {}}
    for name, rs in by.items():
        peaks = [r["device_peak_bytes"] for r in rs]
        steps = [r["median_step_ms"] for r in rs]
        out["allocators"][name] = {
            "runs": len(rs),
            "device_peak_bytes": statistics.median(peaks),
            "device_peak_range": [min(peaks), max(peaks)],
            "median_step_ms": statistics.median(steps),
            "step_ms_range": [min(steps), max(steps)],
            "same_answers": all(same_answers(r["answers"], reference) for r in rs),
        }
    return out


def markdown(summary: Dict[str, Any]) -> str:
    live, untracked = summary["peak_live_bytes"], summary["untracked_bytes"]
    allocs = summary["allocators"]
    smallest = min((a["device_peak_bytes"] for n, a in allocs.items() if n != "xlog"), default=None)
    lines = ["| allocator | runs | median step ms (range) | device peak MiB (range) | vs smallest peer | (device - untracked) / live | answers |",
             "|---|---:|---|---|---:|---:|---|"]
    for name, a in allocs.items():
        peak = a["device_peak_bytes"]
        lo, hi = a["device_peak_range"]
        vs = f"{peak / smallest:.3f}" if smallest else ""
        per_live = f"{(peak - untracked) / live:.3f}" if live else ""
        lines.append(f"| {name} | {a['runs']} | {a['median_step_ms']:.2f} ({a['step_ms_range'][0]:.2f}-{a['step_ms_range'][1]:.2f}) "
                     f"| {peak / MiB:.0f} ({lo / MiB:.0f}-{hi / MiB:.0f}) | {vs} | {per_live} | {'same' if a['same_answers'] else '**differ**'} |")
    if live:
        lines.append(f"\nxlog's peak live: {live / MiB:.1f} MiB; untracked (xlog's device peak less its charged peak): "
                     f"{untracked / MiB:.1f} MiB.")
    return "\n".join(lines) + "\n"


def self_test() -> None:
    plan = step_plan(200)
    assert plan == step_plan(200) and plan != step_plan(200, seed=1)
    assert all(2**16 <= s["rows"] <= 2**24 and 2**12 <= s["dim"] <= 2**20 and 16 <= s["groups"] <= 4096 for s in plan)
    assert len({s["rows"] for s in plan}) > 190 and len({s["fft"] for s in plan}) > 190
    runs = [
        {"allocator": "default", "answers": [1.0, 2.0], "device_peak_bytes": 300 * MiB, "median_step_ms": 5.0},
        {"allocator": "xlog", "answers": [1.0, 2.0000001], "device_peak_bytes": 210 * MiB, "median_step_ms": 5.2,
         "peak_live_bytes": 200 * MiB, "charged_peak_bytes": 205 * MiB},
        {"allocator": "default", "answers": [1.0, 2.0], "device_peak_bytes": 320 * MiB, "median_step_ms": 4.8},
        {"allocator": "xlog", "answers": [1.0, 2.5], "device_peak_bytes": 220 * MiB, "median_step_ms": 5.0,
         "peak_live_bytes": 200 * MiB, "charged_peak_bytes": 205 * MiB},
    ]
    s = summarize(runs)
    assert s["peak_live_bytes"] == 200 * MiB and s["untracked_bytes"] == 10 * MiB
    assert s["allocators"]["default"]["device_peak_bytes"] == 310 * MiB and s["allocators"]["default"]["same_answers"]
    assert s["allocators"]["xlog"]["device_peak_range"] == [210 * MiB, 220 * MiB]
    assert not s["allocators"]["xlog"]["same_answers"], "an answer off by 25% is not the same"
    md = markdown(s)
    assert "| xlog | 2 |" in md and "**differ**" in md and "0.694" in md  # 215 / 310
    assert "| 1.500 |" in md and "| 1.025 |" in md  # (310 - 10) / 200, (215 - 10) / 200
    print("cupy_dyn self-test: ok")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    p.add_argument("--allocators", default=",".join(ALLOCATORS))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--ab", action="store_true")
    p.add_argument("--passes", type=int, default=6)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args(argv)
    if a.self_test:
        self_test()
        return 0
    if a.child:
        child(a.child, a.steps, a.json)
        return 0
    if not a.out:
        p.error("--out is required")
    allocators = [x for x in a.allocators.split(",") if x]
    if not allocators or set(allocators) - set(ALLOCATORS) or a.steps < 1 or a.repeat < 1:
        p.error(f"--allocators from {ALLOCATORS}, --steps and --repeat at least 1")
    os.makedirs(a.out, exist_ok=True)
    if a.ab:
        ab(a.steps, a.passes, os.path.join(a.out, "ab.json"))
        return 0
    runs = []
    for rep in range(a.repeat):
        for name in allocators:
            path = os.path.join(a.out, f"run-{name}-{rep}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--steps", str(a.steps), "--json", path]
            rc = subprocess.run(cmd, timeout=a.timeout).returncode
            if rc != 0 or not os.path.exists(path):
                print(f"{name} run {rep}: failed (rc {rc})", file=sys.stderr)
                continue
            with open(path) as fh:
                runs.append(json.load(fh))
            r = runs[-1]
            print(f"{name} run {rep}: {r['median_step_ms']:.2f} ms, device peak {r['device_peak_bytes'] / MiB:.0f} MiB", flush=True)
    summary = summarize(runs)
    with open(os.path.join(a.out, "results.json"), "w") as fh:
        json.dump({"runs": runs, "summary": summary}, fh, indent=1)
    md = markdown(summary)
    with open(os.path.join(a.out, "results.md"), "w") as fh:
        fh.write(md)
    print(md)
    return 0 if summary["allocators"] else 1


if __name__ == "__main__":
    sys.exit(main())
