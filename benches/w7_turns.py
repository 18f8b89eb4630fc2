#!/usr/bin/env python3
"""W7 step time in turns: two allocators, one process each, taking the
same steps one after the other.

    XLOG_CUDA_LIBRARY=/path/libxlog_cuda.so python3 benches/w7_turns.py --out OUT
        [--models gpt2_dyn,mlm_dyn] [--allocators caching,xlog] [--steps 10]
        [--warmup 5] [--passes 3] [--unit step|pass] [--cpus 4,5] [--timeout 600]

    python3 benches/w7_turns.py --self-test    # the pure-Python parts, no GPU

Why. The GPU machine's host runs at a speed that moves by up to a factor
of two from one process to the next and within one (a pure-Python loop
timed at 96-223 ms in the same image, pinned to a core or not; BENCHMARKS.md,
"Physical memory, eleventh pass"), and a W7 step of a model with changing
shapes is often host-bound. Separate processes, one allocator after the
other (`w7_training.py`), then compare host speeds as much as allocators:
three or four repeats left step-time ratios between 0.85 and 1.25 for
either allocator against itself. Here both processes are built and warmed
first; then each timed step runs in one process, then the same step in the
other (the order alternating from step to step), so the two see the same
host within a fraction of a second.

How. For each model, one child process per allocator (the environment of
`w7_training.child_env`): imports, `xlog_cuda.torch.enable()` for xlog,
the model and optimizer of `w7_training.build_workload`, then for a model
whose shapes change the timed plan once untimed (`--shapes-warm` in W7's
terms), for a fixed-shape model `--warmup` steps. Then `--passes` passes
over the `--steps` timed steps, in turns; a child runs a step only when
told, synchronises, and answers with its wall time. Both children hold
their memory at once (the GPU must hold both models), so this measures
time only: device peaks come from `w7_training.py`'s separate processes.

`caching_pluggable` is a control: PyTorch's own caching allocator reached
through `CUDAPluggableAllocator`, the interface xlog plugs into (a
forwarding library built at the child's start with PyTorch's
cpp_extension, cached). Against `caching` it gives what the interface
alone costs a step; against xlog, what xlog costs beyond it.

An allocator may carry settings for its own child's environment,
`+NAME=VALUE` after its name (`xlog+EXP_SLACK=2`: an experiment build's
knob), so two configurations of one allocator can take turns.

Output: per model, the per-step times of each allocator, the ratio of the
totals (every timed step of every pass) against the first allocator, the
median of the per-step ratios, and each pass's ratio of totals (their
spread); results.json and results.md in --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import w7_training as W  # noqa: E402


# ---------------------------------------------------------------------------
# The child: one model, one allocator, steps on demand
# ---------------------------------------------------------------------------

#: Allocators of this script's own, beside W7's.
CONTROL_ALLOCATORS = ("caching_pluggable",)

# The control's forwarding library: PyTorch's native caching allocator
# (taken before the switch and initialised after it, since PyTorch then
# initialises only the current one) behind the plain functions
# CUDAPluggableAllocator calls.
_FORWARD_SOURCE = r'''
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <sys/types.h>

static c10::cuda::CUDACachingAllocator::CUDAAllocator* g_native = nullptr;

extern "C" __attribute__((visibility("default"))) void* w7_forward_malloc(ssize_t size, int device, cudaStream_t stream) {
  return g_native->raw_alloc_with_stream(static_cast<size_t>(size), stream);
}

extern "C" __attribute__((visibility("default"))) void w7_forward_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
  g_native->raw_delete(ptr);
}

int64_t w7_forward_take_native() {
  g_native = c10::cuda::CUDACachingAllocator::get();
  return reinterpret_cast<int64_t>(g_native);
}

void w7_forward_init_native() {
  g_native->init(c10::cuda::device_count());
}
'''


def use_caching_through_pluggable(torch) -> None:
    """Make PyTorch's allocator its own caching allocator behind
    CUDAPluggableAllocator (before CUDA is initialised)."""
    from torch.utils.cpp_extension import load_inline

    mod = load_inline(name="w7_forward_alloc", cpp_sources=_FORWARD_SOURCE,
                      functions=["w7_forward_take_native", "w7_forward_init_native"], with_cuda=True, verbose=False)
    if not mod.w7_forward_take_native():
        raise RuntimeError("no native caching allocator to forward to")
    alloc = torch.cuda.memory.CUDAPluggableAllocator(mod.__file__, "w7_forward_malloc", "w7_forward_free")
    # The swap refuses an allocator already initialised: the native one is
    # initialised after it (PyTorch initialises only the current one).
    torch.cuda.memory.change_current_allocator(alloc)
    mod.w7_forward_init_native()


def child_main(spec: Dict[str, Any]) -> int:
    """Build and warm the workload, print `ready`, then run `step I` lines
    from stdin (answering `ms WALL HOST GPU`) until `end` (answering
    `stats {json}`)."""
    out = sys.stdout
    if spec.get("cpus"):
        # Every child on the same cores: the host's cores run at speeds
        # that differ, and a process keeps to the cores it started on.
        os.sched_setaffinity(0, spec["cpus"])
    W.preimport(spec)
    xt = None
    if spec["allocator"] in W.XLOG_ALLOCATORS:
        import xlog_cuda.torch as xt  # noqa: F811

        xt.enable(backend="cuda")
    import torch

    if spec["allocator"] == "caching_pluggable":
        use_caching_through_pluggable(torch)
    torch.manual_seed(0)
    torch.cuda.init()
    W.warm_up_cuda(torch)
    timed = W.step_plan(spec["model"], spec["steps"])
    if timed is not None:
        warm, plan = len(timed), timed + timed
    else:
        warm, plan = spec["warmup"], None
    _, _, step = W.build_workload(torch, spec["model"], plan)
    for i in range(warm):
        step(i)
    torch.cuda.synchronize()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "end":
            break
        # The i-th timed step: the plan's second pass, every pass alike.
        wall, host, gpu = W.timed_step(torch, step, warm + int(words[1]))
        out.write(f"ms {wall:.4f} {host:.4f} {gpu:.4f}\n")
        out.flush()
    stats: Dict[str, Any] = {"pid": os.getpid(), "torch": torch.__version__}
    if xt is not None:
        st = xt.stats(0)
        stats.update(pages_mapped=st.pages_mapped, pages_unmapped=st.pages_unmapped, cache_misses=st.cache_misses,
                     allocations=st.allocations, failed_allocations=st.failed_allocations)
    out.write("stats " + json.dumps(stats) + "\n")
    out.flush()
    return 0


# ---------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------


def split_label(label: str) -> "tuple[str, Dict[str, str]]":
    """An allocator label: its name, then any `+NAME=VALUE` environment
    settings of that child alone (an experiment build's knobs, e.g.
    `xlog+EXP_SLACK=2`)."""
    name, *extra = label.split("+")
    env = {}
    for item in extra:
        key, eq, value = item.partition("=")
        if not key or not eq:
            raise ValueError(f"allocator {label!r}: {item!r} is not NAME=VALUE")
        env[key] = value
    return name, env


class Turn:
    """One child process, spoken to line by line. A watchdog kills it
    `timeout` seconds after it started, so a hung step ends the model's
    run with an error instead of the benchmark."""

    def __init__(self, spec: Dict[str, Any], label: str, log_path: str, timeout: float):
        self.spec = spec
        self.timeout = timeout
        self.expired = False
        self.log = open(log_path, "w")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
        env = W.child_env(spec["allocator"])
        env.update(split_label(label)[1])
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)
        self.watchdog = threading.Timer(timeout, self._expire)
        self.watchdog.daemon = True
        self.watchdog.start()

    def _expire(self) -> None:
        self.expired = True
        if self.proc.poll() is None:
            self.proc.kill()

    def expect(self, word: str) -> str:
        """The rest of the next stdout line starting with `word`."""
        while True:
            line = self.proc.stdout.readline()
            if not line:
                why = f"timed out after {self.timeout:.0f} s" if self.expired else "ended"
                raise RuntimeError(f"{self.spec['allocator']} child {why} (see {self.log.name})")
            if line.startswith(word):
                return line[len(word):].strip()

    def step(self, i: int) -> List[float]:
        """Run timed step `i`: [wall, host, GPU] ms."""
        self.proc.stdin.write(f"step {i}\n")
        self.proc.stdin.flush()
        return [float(x) for x in self.expect("ms").split()]

    def finish(self) -> Dict[str, Any]:
        self.proc.stdin.write("end\n")
        self.proc.stdin.flush()
        stats = json.loads(self.expect("stats"))
        self.proc.wait(timeout=60)
        self.watchdog.cancel()
        self.log.close()
        return stats

    def kill(self) -> None:
        self.watchdog.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def turn_order(n_alloc: int, k: int) -> List[int]:
    """Which allocator goes first at the k-th turn: rotated each turn, so
    each goes first as often as the others (and none always follows the
    same one)."""
    return [(k + j) % n_alloc for j in range(n_alloc)]


def summarize(times: Dict[str, List[List[float]]], base: str) -> Dict[str, Dict[str, Any]]:
    """Per allocator: its total over every pass and step, the ratio of
    totals and the median of per-step ratios against `base`, and each
    pass's ratio of totals. `times[a][p][s]` is allocator a's time for
    step s of pass p (ms)."""
    out: Dict[str, Dict[str, Any]] = {}
    ref = times[base]
    ref_total = sum(sum(p) for p in ref)
    for a, passes in times.items():
        total = sum(sum(p) for p in passes)
        per_step = [t / r for p, rp in zip(passes, ref) for t, r in zip(p, rp) if r > 0]
        per_pass = [sum(p) / sum(rp) for p, rp in zip(passes, ref) if sum(rp) > 0]
        out[a] = {
            "total_ms": total,
            "median_step_ms": statistics.median([t for p in passes for t in p]),
            "ratio_of_totals": total / ref_total if ref_total > 0 else None,
            "median_step_ratio": statistics.median(per_step) if per_step else None,
            "pass_ratios": per_pass,
        }
    return out


def run_model(args, model: str, out_dir: str) -> Dict[str, Any]:
    steps = args.steps
    allocs = args.allocators
    children: Dict[str, Turn] = {}
    res: Dict[str, Any] = {"model": model, "allocators": allocs, "steps": steps, "passes": args.passes}
    try:
        for i, a in enumerate(allocs):
            name = split_label(a)[0]
            spec = {"model": model, "allocator": name, "mode": "w7", "repeat": 0, "steps": steps,
                    "warmup": args.warmup, "shapes_warm": True, "cpus": args.cpus}
            children[a] = Turn(spec, a, os.path.join(out_dir, f"{model}-{i}-{name}.log"), args.timeout)
        # The children build and warm up at the same time (untimed).
        for a in allocs:
            children[a].expect("ready")
        # raw[a][p][s] = [wall, host, GPU] of allocator a, pass p, step s
        raw: Dict[str, List[List[List[float]]]] = {a: [] for a in allocs}
        for p in range(args.passes):
            for a in allocs:
                raw[a].append([])
            if args.unit == "pass":
                # A whole pass each, in turns: only a pass's first step
                # follows the other process's work.
                for j in turn_order(len(allocs), p):
                    a = allocs[j]
                    raw[a][-1].extend(children[a].step(s) for s in range(steps))
                continue
            for s in range(steps):
                # Rotated with the step and the pass, so each allocator
                # takes each step first in turn.
                for j in turn_order(len(allocs), p + s):
                    a = allocs[j]
                    raw[a][-1].append(children[a].step(s))
        times = {a: [[t[0] for t in p] for p in passes] for a, passes in raw.items()}
        res["times_ms"] = times
        res["host_ms"] = {a: [[t[1] for t in p] for p in passes] for a, passes in raw.items()}
        res["gpu_ms"] = {a: [[t[2] for t in p] for p in passes] for a, passes in raw.items()}
        res["summary"] = summarize(times, allocs[0])
        for a in allocs:
            res["summary"][a]["median_host_ms"] = statistics.median(x for p in res["host_ms"][a] for x in p)
            res["summary"][a]["median_gpu_ms"] = statistics.median(x for p in res["gpu_ms"][a] for x in p)
        res["child_stats"] = {a: children.pop(a).finish() for a in list(allocs)}
        res["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported, the next model still runs
        res["ok"] = False
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        for c in children.values():
            c.kill()
    return res


def format_markdown(report: Dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        "# W7 in turns: step time, allocators taking the same steps one after the other",
        "",
        f"- device: {meta.get('device')} (driver {meta.get('driver')})",
        f"- date: {meta['date']}; library: {meta['library']}",
        f"- {meta['steps']} timed steps a pass, {meta['passes']} passes, in turns of one {meta['unit']} "
        f"(the order rotated with the step and the pass); ratios against the first allocator; children pinned to cores "
        f"{meta.get('cpus') or 'none'}",
        "",
        "| model | allocator | median step ms | host ms | GPU ms | ratio of totals | median per-step ratio | per-pass ratios |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["models"]:
        if not r.get("ok"):
            lines.append(f"| {r['model']} | ERROR | {r.get('error')} | | | | | |")
            continue
        for a, s in r["summary"].items():
            passes = ", ".join(f"{x:.3f}" for x in s["pass_ratios"])
            lines.append(f"| {r['model']} | {a} | {s['median_step_ms']:.2f} | {s['median_host_ms']:.2f} | "
                         f"{s['median_gpu_ms']:.2f} | {s['ratio_of_totals']:.3f} | "
                         f"{s['median_step_ratio']:.3f} | {passes} |")
    return "\n".join(lines) + "\n"


def drive(args) -> int:
    os.makedirs(args.out, exist_ok=True)
    meta = {k: v for k, v in W.driver_meta(argparse.Namespace(
        steps=args.steps, warmup=args.warmup, gen_kv_steps=0, gen_kv_warmup=0, repeat=1, shapes_warm=True)).items()
        if k in ("date", "device", "driver", "library", "python")}
    meta.update(steps=args.steps, passes=args.passes, unit=args.unit, cpus=args.cpus)
    meta["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report: Dict[str, Any] = {"meta": meta, "models": []}
    for model in args.models:
        t0 = time.monotonic()
        r = run_model(args, model, args.out)
        r["seconds"] = time.monotonic() - t0
        report["models"].append(r)
        if r.get("ok"):
            print(f"w7_turns: {model}: " + ", ".join(
                f"{a} {s['ratio_of_totals']:.3f} (passes {', '.join(f'{x:.3f}' for x in s['pass_ratios'])})"
                for a, s in r["summary"].items()) + f" ({r['seconds']:.0f} s)", flush=True)
        else:
            print(f"w7_turns: {model}: ERROR {r.get('error')}", flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=2)
    text = format_markdown(report)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    print("\n" + text, flush=True)
    return 0


def self_test() -> int:
    assert turn_order(2, 0) == [0, 1] and turn_order(2, 1) == [1, 0] and turn_order(3, 4) == [1, 2, 0]
    times = {"caching": [[10.0, 20.0], [10.0, 30.0]], "xlog": [[11.0, 18.0], [9.0, 33.0]]}
    s = summarize(times, "caching")
    assert s["caching"]["ratio_of_totals"] == 1.0 and s["caching"]["pass_ratios"] == [1.0, 1.0]
    assert abs(s["xlog"]["ratio_of_totals"] - 71.0 / 70.0) < 1e-12
    assert s["xlog"]["pass_ratios"] == [29.0 / 30.0, 42.0 / 40.0]
    # per-step ratios 1.1, 0.9, 0.9, 1.1: median 1.0
    assert abs(s["xlog"]["median_step_ratio"] - 1.0) < 1e-12
    assert s["xlog"]["median_step_ms"] == 14.5
    assert split_label("xlog") == ("xlog", {}) and split_label("xlog+A=1+B=x=y") == ("xlog", {"A": "1", "B": "x=y"})
    print("w7_turns self-test: ok")
    return 0


def comma_list(text: str) -> List[str]:
    """`a,b,,c` -> ['a', 'b', 'c']: an argparse type."""
    return [x for x in text.split(",") if x]


def cpu_list(text: str) -> List[int]:
    """`4,5` -> [4, 5]: an argparse type."""
    return [int(c) for c in comma_list(text)]


def check_models(p: argparse.ArgumentParser, models: Sequence[str]) -> None:
    """Exit through `p` on a model W7 does not have."""
    for m in models:
        if m not in W.ALL_MODELS:
            p.error(f"unknown model {m!r} (one of {', '.join(W.ALL_MODELS)})")


def parse_args(argv: Optional[Sequence[str]] = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="w7-turns-out")
    p.add_argument("--models", default="gpt2_dyn,mlm_dyn", type=comma_list)
    p.add_argument("--allocators", default="caching,xlog", type=comma_list)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps of a fixed-shape model")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--unit", choices=("step", "pass"), default="step",
                   help="what one turn is: one step (default) or a whole pass of --steps steps")
    p.add_argument("--cpus", default=[], type=cpu_list,
                   help="pin every child to these cores (e.g. 2,3); default: no pinning")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a child may live (each model's run)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args(argv)
    check_models(p, args.models)
    for a in args.allocators:
        try:
            name, _ = split_label(a)
        except ValueError as e:
            p.error(str(e))
        if name not in W.TORCH_ALLOC_CONF and name not in W.XLOG_ALLOCATORS and name not in CONTROL_ALLOCATORS:
            p.error(f"unknown allocator {a!r}")
    if len(set(args.allocators)) != len(args.allocators):
        p.error("an allocator named twice")
    if len(args.allocators) < 2 or args.steps < 1 or args.passes < 1:
        p.error("two allocators or more, --steps and --passes at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.self_test:
        return self_test()
    if args.child:
        return child_main(json.loads(args.child))
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
