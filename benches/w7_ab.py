#!/usr/bin/env python3
"""W7 step time with both allocators in one process: PyTorch's caching
allocator and xlog take the same steps one after the other.

    XLOG_CUDA_LIBRARY=/path/libxlog_cuda.so python3 benches/w7_ab.py --out OUT
        [--models mlm_dyn,gpt2] [--arms caching,xlog,caching#2] [--steps 10]
        [--warmup 5] [--passes 10] [--cpus 4,5]

    python3 benches/w7_ab.py --self-test    # the pure-Python parts, no GPU

Why. `w7_turns.py` runs each allocator in a process of its own, in turns.
The GPU machine's host speed differs from one process to the next (a
pure-Python loop at 96-223 ms; BENCHMARKS.md, "eleventh pass"), and even
PyTorch's own allocator behind another interface ran 0.955-1.031 of
itself there: a difference of 1-2% between allocators is below what
separate processes resolve. Here one process holds both allocators, so
both run on the same host state, the same model and the same CUDA
context, and the only thing that changes from one step to the next is
which allocator serves it.

How. A small allocator built at start with PyTorch's cpp_extension
becomes PyTorch's current allocator (a CUDAPluggableAllocator subclass,
as xlog's own native allocator in `xlog_cuda/_torch_oom_shim.cpp`). Its
`allocate` serves a tensor from PyTorch's native caching allocator in
mode 0 and from xlog's hooks (`xlog_torch_malloc`, the hook runtime set up
by `xlog_cuda.interop.setup_hooks`) in mode 1; each tensor's deleter
returns it to the allocator that made it, whatever the mode is when it
dies. Raw allocations (`raw_alloc`, rare: workspaces) always go to the
caching allocator. Mode 0 costs the caching allocator one more virtual
call than PyTorch's own path, which a `caching#2` arm against `caching`
bounds (an arm named `NAME#K` is another arm of allocator NAME).

Each model is built once; each arm runs the warm-up (for a model whose
shapes change, the timed plan once, untimed), then `--passes` passes over
the `--steps` timed steps: each step is taken by every arm in turn (the
order rotated with the step and the pass, so each arm takes each step
first as often as the others), each between two synchronisations. Both
allocators keep their memory, so this measures time only.

Output: per model, each arm's per-step times, the ratio of totals and the
median of per-step ratios against the first arm, each pass's ratio, and
xlog's pages mapped / unmapped and misses during its own steps;
results.json and results.md in --out.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import w7_training as W  # noqa: E402
from w7_turns import check_models, comma_list, cpu_list, summarize, turn_order  # noqa: E402

#: The allocators an arm may name, and the mode of the switch each one is.
MODES = {"caching": 0, "xlog": 1}

_AB_SOURCE = r'''
#include <c10/core/Device.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace {
using XMalloc = void* (*)(ssize_t, int, void*);
using XFree = void (*)(void*, ssize_t, int, void*);
using XRecord = int (*)(void*, void*);

c10::cuda::CUDACachingAllocator::CUDAAllocator* g_native = nullptr;
XMalloc g_xmalloc = nullptr;
XFree g_xfree = nullptr;
XRecord g_xrecord = nullptr;
std::atomic<int> g_mode{0};
c10::DeleterFnPtr g_native_delete = nullptr;

// Time spent in each allocator's allocate and free, and their counts, per
// mode: [mode][0 allocate ns, 1 allocates, 2 free ns, 3 frees]. The
// caller's thread only (the steps run on one thread).
int64_t g_spent[2][4] = {};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void xlog_delete(void* ptr) {
  if (ptr == nullptr) return;
  int64_t t = now_ns();
  g_xfree(ptr, 0, c10::cuda::current_device(), nullptr);
  g_spent[1][2] += now_ns() - t;
  g_spent[1][3] += 1;
}

// The caching allocator's own deleter (its context is the pointer), timed.
void caching_delete(void* ptr) {
  int64_t t = now_ns();
  g_native_delete(ptr);
  g_spent[0][2] += now_ns() - t;
  g_spent[0][3] += 1;
}

class AbAllocator final : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  AbAllocator()
      : CUDAPluggableAllocator(
            [](size_t size, int, cudaStream_t stream) { return g_native->raw_alloc_with_stream(size, stream); },
            [](void* ptr, size_t, int, cudaStream_t) { g_native->raw_delete(ptr); }) {}

  void init(int device_count) override {
    CUDAPluggableAllocator::init(device_count);
    g_native->init(device_count);
  }

  c10::DataPtr allocate(size_t size) override {
    int64_t t = now_ns();
    if (g_mode.load(std::memory_order_relaxed) == 0) {
      c10::DataPtr p = g_native->allocate(size);
      g_spent[0][0] += now_ns() - t;
      g_spent[0][1] += 1;
      if (p.get() == nullptr || p.get_context() != p.get()) return p;  // not its usual form: left untimed
      if (g_native_delete == nullptr) g_native_delete = p.get_deleter();
      if (p.get_deleter() != g_native_delete) return p;
      p.release_context();
      return {p.get(), p.get(), &caching_delete, p.device()};
    }
    c10::DeviceIndex device = c10::cuda::current_device();
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* ptr = g_xmalloc(static_cast<ssize_t>(size), device, static_cast<void*>(stream));
    g_spent[1][0] += now_ns() - t;
    g_spent[1][1] += 1;
    TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr || size == 0, "xlog refused ", size, " bytes");
    return {ptr, ptr, &xlog_delete, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return g_native->raw_deleter(); }
  void* raw_alloc(size_t n) override { return g_native->raw_alloc(n); }
  void* raw_alloc_with_stream(size_t n, cudaStream_t s) override { return g_native->raw_alloc_with_stream(n, s); }
  void raw_delete(void* ptr) override { g_native->raw_delete(ptr); }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get_deleter() == &caching_delete) {
      c10::DataPtr same(ptr.get(), ptr.get(), g_native_delete, ptr.device());
      g_native->recordStream(same, stream);
      same.release_context();
    } else if (ptr.get_deleter() == &xlog_delete) {
      g_xrecord(ptr.get(), static_cast<void*>(stream.stream()));
    } else {
      g_native->recordStream(ptr, stream);
    }
  }
};
}  // namespace

int64_t ab_install(int64_t xmalloc, int64_t xfree, int64_t xrecord) {
  g_xmalloc = reinterpret_cast<XMalloc>(xmalloc);
  g_xfree = reinterpret_cast<XFree>(xfree);
  g_xrecord = reinterpret_cast<XRecord>(xrecord);
  g_native = c10::cuda::CUDACachingAllocator::get();
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(std::make_shared<AbAllocator>());
  g_native->init(c10::cuda::device_count());
  return 1;
}

void ab_set_mode(int64_t mode) { g_mode.store(static_cast<int>(mode), std::memory_order_relaxed); }

std::vector<int64_t> ab_spent() {
  std::vector<int64_t> out;
  for (auto& mode : g_spent)
    for (int64_t v : mode) out.push_back(v);
  return out;
}
'''


def allocator_of(arm: str) -> str:
    """`xlog`, `caching`, `caching#2` -> the allocator the arm runs."""
    name = arm.split("#", 1)[0]
    if name not in MODES:
        raise ValueError(f"unknown allocator in arm {arm!r} (one of {', '.join(MODES)})")
    return name


def install_switch(torch):
    """Set up xlog's hooks for device 0 and make PyTorch's allocator the
    switch (before CUDA is initialised); returns the built module."""
    from torch.utils.cpp_extension import load_inline

    from xlog_cuda import _library, interop

    interop.setup_hooks(0, backend="cuda", by="w7_ab")
    lib = _library.load()
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    mod = load_inline(name="w7_ab_switch", cpp_sources=_AB_SOURCE, functions=["ab_install", "ab_set_mode", "ab_spent"],
                      with_cuda=True, verbose=False)
    mod.ab_install(addr(lib.xlog_torch_malloc), addr(lib.xlog_torch_free), addr(lib.xlog_torch_record_stream_hook))
    return mod


def xlog_counters() -> List[int]:
    from xlog_cuda import interop

    st = interop.stats(0)
    return [st.pages_mapped, st.pages_unmapped, st.cache_misses, st.allocations]


def run_model(torch, switch, args, model: str) -> Dict[str, Any]:
    arms = args.arms
    res: Dict[str, Any] = {"model": model, "arms": arms, "steps": args.steps, "passes": args.passes}
    timed = W.step_plan(model, args.steps)
    if timed is not None:
        warm, plan = len(timed), timed + timed
    else:
        warm, plan = args.warmup, None
    torch.manual_seed(0)
    switch.ab_set_mode(0)
    built = W.build_workload(torch, model, plan)
    step = built[2]
    for arm in arms:
        switch.ab_set_mode(MODES[allocator_of(arm)])
        for i in range(warm):
            step(i)
        torch.cuda.synchronize()
    # raw[a][p][s] = [wall, host, GPU] ms of arm a, pass p, step s
    raw: Dict[str, List[List[List[float]]]] = {a: [] for a in arms}
    counters = [0, 0, 0, 0]
    spent_before = list(switch.ab_spent())
    for p in range(args.passes):
        for a in arms:
            raw[a].append([])
        for s in range(args.steps):
            # Rotated with the step and the pass: each arm takes each
            # step first in turn (a step's first run can pay what the
            # second then reuses, e.g. a library's plan for a new shape).
            for j in turn_order(len(arms), p + s):
                a = arms[j]
                is_xlog = allocator_of(a) == "xlog"
                switch.ab_set_mode(MODES[allocator_of(a)])
                before = xlog_counters() if is_xlog else None
                raw[a][-1].append(list(W.timed_step(torch, step, warm + s)))
                if before is not None:
                    counters = [c + y - x for c, x, y in zip(counters, before, xlog_counters())]
    spent = [y - x for x, y in zip(spent_before, switch.ab_spent())]
    switch.ab_set_mode(0)
    del built, step
    times = {a: [[t[0] for t in p] for p in passes] for a, passes in raw.items()}
    res["times_ms"] = times
    res["host_ms"] = {a: [[t[1] for t in p] for p in passes] for a, passes in raw.items()}
    res["summary"] = summarize(times, arms[0])
    for a in arms:
        res["summary"][a]["median_host_ms"] = statistics.median(x for p in res["host_ms"][a] for x in p)
    res["xlog_steps"] = dict(zip(("pages_mapped", "pages_unmapped", "misses", "allocations"), counters))
    res["inside"] = inside_of(spent)
    return res


def inside_of(spent: Sequence[int]) -> Dict[str, Dict[str, float]]:
    """The switch's clocks over the timed steps (`ab_spent` deltas: per
    mode, allocate ns, allocates, free ns, frees) as ns an allocate and a
    free, per allocator."""
    out: Dict[str, Dict[str, float]] = {}
    for name, mode in MODES.items():
        a_ns, a_n, f_ns, f_n = spent[4 * mode: 4 * mode + 4]
        out[name] = {"allocate_ns": a_ns / a_n if a_n else 0.0, "allocates": a_n,
                     "free_ns": f_ns / f_n if f_n else 0.0, "frees": f_n}
    return out


def format_markdown(report: Dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        "# W7 step time, both allocators in one process",
        "",
        f"- device: {meta.get('device')} (driver {meta.get('driver')}); torch {meta.get('torch')}",
        f"- date: {meta.get('date')}; library: {meta.get('library')}",
        f"- {meta['steps']} timed steps a pass, {meta['passes']} passes; every step taken by each arm in turn "
        f"(order rotated with the step and the pass); ratios against `{meta['arms'][0]}`; cores {meta.get('cpus') or 'any'}",
        "",
        "| model | arm | median step ms | median host ms | ratio of totals | median per-step ratio | pass ratios (min-max) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for m in report["models"]:
        if not m.get("ok", True):
            lines.append(f"| {m['model']} | failed: {m.get('error', '?')} | | | | | |")
            continue
        for a in m["arms"]:
            s = m["summary"][a]
            pr = s["pass_ratios"]
            lines.append(
                f"| {m['model']} | {a} | {s['median_step_ms']:.2f} | {s['median_host_ms']:.2f} | "
                f"{s['ratio_of_totals']:.3f} | {s['median_step_ratio']:.3f} | {min(pr):.3f}-{max(pr):.3f} |"
            )
    lines.append("")
    for m in report["models"]:
        if m.get("ok", True):
            x = m["xlog_steps"]
            lines.append(f"- {m['model']}, xlog's own timed steps: {x['pages_mapped']} pages mapped, "
                         f"{x['pages_unmapped']} unmapped, {x['misses']} misses, {x['allocations']} allocations")
            inside = m.get("inside")
            if inside:
                lines.append("  - inside the allocators (timed steps, every arm of each): " + "; ".join(
                    f"{name} {v['allocate_ns']:.0f} ns an allocate ({v['allocates']}), "
                    f"{v['free_ns']:.0f} ns a free ({v['frees']})" for name, v in inside.items()))
    return "\n".join(lines) + "\n"


def driver_version() -> str:
    """The driver's version, from NVML (e.g. 580.159.04)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception as e:  # noqa: BLE001
        return f"? (NVML: {type(e).__name__}: {e})"


def drive(args) -> int:
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)
    for model in args.models:
        W.preimport({"model": model, "allocator": "xlog"})
    import torch

    switch = install_switch(torch)
    torch.cuda.init()
    W.warm_up_cuda(torch)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "library": os.environ.get("XLOG_CUDA_LIBRARY", ""), "arms": args.arms, "steps": args.steps,
        "passes": args.passes, "cpus": args.cpus, "driver": driver_version(),
    }
    report: Dict[str, Any] = {"meta": meta, "models": []}
    os.makedirs(args.out, exist_ok=True)
    for model in args.models:
        try:
            report["models"].append(run_model(torch, switch, args, model))
        except Exception as e:  # noqa: BLE001 - reported, the next model still runs
            report["models"].append({"model": model, "ok": False, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.synchronize()
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(report, f, indent=1)
    text = format_markdown(report)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(m.get("ok", True) for m in report["models"]) else 1


def self_test() -> int:
    assert allocator_of("xlog") == "xlog" and allocator_of("caching#2") == "caching"
    try:
        allocator_of("expandable")
    except ValueError:
        pass
    else:
        raise AssertionError("an unknown allocator was accepted")
    report = {
        "meta": {"arms": ["caching", "xlog"], "steps": 2, "passes": 2},
        "models": [{
            "model": "m", "arms": ["caching", "xlog"],
            "summary": summarize({"caching": [[10.0, 20.0], [10.0, 30.0]], "xlog": [[11.0, 18.0], [9.0, 33.0]]},
                                 "caching"),
            "xlog_steps": {"pages_mapped": 3, "pages_unmapped": 1, "misses": 2, "allocations": 9},
            "inside": inside_of([3000, 3, 2000, 4, 9000, 9, 0, 0]),
        }],
    }
    for a in ("caching", "xlog"):
        report["models"][0]["summary"][a]["median_host_ms"] = 1.0
    text = format_markdown(report)
    assert "| m | xlog | 14.50 | 1.00 | 1.014 | 1.000 | 0.967-1.050 |" in text, text
    assert "3 pages mapped, 1 unmapped, 2 misses, 9 allocations" in text
    assert "caching 1000 ns an allocate (3), 500 ns a free (4); xlog 1000 ns an allocate (9), 0 ns a free (0)" in text, text
    print("w7_ab self-test: ok")
    return 0


def parse_args(argv: Optional[Sequence[str]] = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="w7-ab-out")
    p.add_argument("--models", default="mlm_dyn,gpt2", type=comma_list)
    p.add_argument("--arms", default="caching,xlog,caching#2", type=comma_list)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps of a fixed-shape model, per arm")
    p.add_argument("--passes", type=int, default=10)
    p.add_argument("--cpus", default=[], type=cpu_list,
                   help="pin the process to these cores (e.g. 4,5); default: no pinning")
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args(argv)
    check_models(p, args.models)
    for a in args.arms:
        try:
            allocator_of(a)
        except ValueError as e:
            p.error(str(e))
    if len(set(args.arms)) != len(args.arms) or len(args.arms) < 2:
        p.error("two arms or more, each named once (a second arm of one allocator: NAME#2)")
    if args.steps < 1 or args.passes < 1:
        p.error("--steps and --passes at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.self_test:
        return self_test()
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
