#!/usr/bin/env python3
"""PyTorch and CuPy on libxlog_cuda, checked on a real GPU.

Run through scripts/gpu-frameworks (which sets the library and Python
paths). Without arguments this is the driver: it runs every scenario in a
subprocess of its own (PyTorch's allocator can be set only once per
process), collects their results, prints a summary table, writes
results.json / results.csv (and each scenario's output) to the output
directory, and exits non-zero if any check failed (77 when PyTorch, CuPy or
a CUDA device is missing).

Scenarios:
  train         MLP training loop (300 steps, synthetic data) under a 2 GiB
                budget configured through the environment (XLOG_BUDGET_BYTES,
                XLOG_LOG_PATH): loss falls, peak outstanding <= budget, the
                CSV log holds one line per allocate and free.
  oom           a budget too small for the loop: what PyTorch does with the
                hook's NULL (OutOfMemoryError expected, its text carrying
                requested, live, cached, pending and limit), our reason in
                xlog_cuda.last_error(), then recovery in the same process.
  shared        PyTorch and CuPy in one process under one budget: the hook
                stats equal the sum of what both hold; DLPack views allocate
                nothing; a CuPy allocation is refused while PyTorch holds the
                budget and fits once PyTorch frees.
  time_default  the training loop on PyTorch's own caching allocator
  time_xlog     the same loop on xlog (no log): mean step times and ratio.
  numba         Numba through xlog_cuda.numba, enabled by
                NUMBA_CUDA_MEMORY_MANAGER=xlog_cuda.numba under a 256 MiB
                budget from the environment: a kernel over xlog-backed
                arrays gives the right result, stats count the arrays, an
                over-budget array raises Numba's out-of-memory error with
                xlog's reason, freed arrays give their bytes back, and
                (with PyTorch) Numba and PyTorch share the budget.

The train scenario also writes a memory report of its log
(train-report.html, and train-report.png with matplotlib).
  enable_cost   xlog_cuda.torch.enable() in two fresh processes sharing an
                empty shim cache: the first builds the OOM shim, the second
                must load it (<= 0.5 s for enable(), no cpp_extension) and
                still raise torch.OutOfMemoryError on a refusal.
  record_stream a tensor read on a side stream (after a long GPU sleep),
                freed, and its memory allocated and overwritten at once on
                the default stream: without record_stream (the control) the
                side stream reads the new data; with Tensor.record_stream
                (through the shim's record-stream hook) and with
                xlog_cuda.torch.record_stream it reads the original data.
  inspect       with XLOG_TRACK_CALLSITES=1: xlog_cuda.torch.memory_stats()
                (PyTorch's key names) agrees with the tensors alive,
                live_blocks() finds a tensor's block with the label set by
                xlog_cuda.call_site(), peaks hold after a free and restart at
                reset_peak_memory_stats(), per-tag counters add up, and
                memory_summary() names the tensor.
  graphs        CUDA graphs under xlog_cuda.torch.enable(). torch.cuda.graph
                (must work): enable() set the graph-pool hooks; forward +
                backward of a small MLP captures (warmed up on the capture
                stream first); the capture's memory is held and charged; 120
                replays with new data copied into the static inputs give
                eager's loss and gradients each time; deleting the graph and
                its outputs gives the memory back; xlog is consistent and
                later allocations work. torch.compile(mode="reduce-overhead")
                of a small function: outputs checked where it runs; where
                PyTorch refuses, its exact exception as info (not a failure)
                and a check that xlog stayed consistent. Stats of each phase
                are printed; tracebacks go to graphs-errors.txt.

Usage: gpu_frameworks.py [--out DIR] [--only NAME[,NAME...]]
       gpu_frameworks.py --scenario NAME --result FILE --workdir DIR
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

GiB = 1 << 30
MiB = 1 << 20

TRAIN_BUDGET = 2 * GiB
OOM_BUDGET = 256 * MiB
SHARED_BUDGET = 1 * GiB
STEPS = 300
TIMED_STEPS = 300
WARMUP_STEPS = 30
SCENARIO_TIMEOUT_S = 150
NUMBA_BUDGET = 256 * MiB
ORDER = ["train", "oom", "shared", "time_default", "time_xlog", "numba", "enable_cost", "record_stream", "inspect",
         "graphs"]
# What each scenario imports (the driver skips when one is missing).
NEEDS = {"train": ["torch"], "oom": ["torch"], "shared": ["torch", "cupy"], "time_default": ["torch"],
         "time_xlog": ["torch"], "numba": ["numba.cuda", "numpy"], "enable_cost": ["torch"],
         "record_stream": ["torch"], "inspect": ["torch"], "graphs": ["torch"]}
# Scenarios that need longer than SCENARIO_TIMEOUT_S (torch.compile's first
# compile of a function takes tens of seconds).
SCENARIO_TIMEOUTS = {"graphs": 420}
ENABLE_TARGET_S = 0.5
SKIP = 77


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


class Result:
    """What one scenario found: checks (pass/fail), infos, metrics."""

    def __init__(self, scenario: str):
        self.scenario = scenario
        self.checks: List[Dict[str, Any]] = []
        self.metrics: Dict[str, Any] = {}

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append({"name": name, "status": "ok" if ok else "FAIL", "detail": detail})
        print(f"[{self.scenario}] {'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        return ok

    def info(self, name: str, detail: str) -> None:
        self.checks.append({"name": name, "status": "info", "detail": detail})
        print(f"[{self.scenario}] info {name}: {detail}", flush=True)

    def skip(self, name: str, detail: str) -> None:
        self.checks.append({"name": name, "status": "skip", "detail": detail})
        print(f"[{self.scenario}] skip {name}: {detail}", flush=True)

    def to_json(self) -> Dict[str, Any]:
        return {"scenario": self.scenario, "checks": self.checks, "metrics": self.metrics}


def stats_dict(st) -> Dict[str, int]:
    return {k: getattr(st, k) for k in st.__dataclass_fields__}


# ---------------------------------------------------------------------------
# The training loop (the same code for every scenario)
# ---------------------------------------------------------------------------

D_IN, HIDDEN, CLASSES, SAMPLES = 256, 1024, 10, 8192


def make_problem(torch, seed: int = 0):
    """A synthetic classification task a small MLP learns quickly: labels
    are the argmax of a random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(D_IN, CLASSES, generator=g)
    x = torch.randn(SAMPLES, D_IN, generator=g)
    y = (x @ teacher).argmax(dim=1)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(D_IN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    ).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt, x.cuda(), y.cuda()


def train(torch, model, opt, x, y, steps: int, batch: int, seed: int = 1):
    """`steps` optimizer steps; returns (losses, per-step seconds). Each
    step ends with loss.item(), so a step's time covers its GPU work."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    losses: List[float] = []
    times: List[float] = []
    for _ in range(steps):
        start = time.perf_counter()
        idx = torch.randint(0, x.shape[0], (batch,), device="cuda", generator=g)
        logits = model(x[idx])
        loss = torch.nn.functional.cross_entropy(logits, y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    return losses, times


def loss_summary(losses: List[float]) -> Dict[str, float]:
    head, tail = losses[:10], losses[-10:]
    return {"initial_loss": statistics.fmean(head), "final_loss": statistics.fmean(tail)}


# ---------------------------------------------------------------------------
# Scenarios (each runs in its own process)
# ---------------------------------------------------------------------------


def scenario_train(r: Result, workdir: str) -> None:
    import xlog_cuda.interop as xi
    import xlog_cuda.torch as xt

    # Configured from the environment the driver set: XLOG_BACKEND=cuda,
    # XLOG_BUDGET_BYTES=2GiB, XLOG_LOG_PATH=<workdir>/train-log.csv.
    log_path = os.environ["XLOG_LOG_PATH"]
    xt.enable()
    import torch

    model, opt, x, y = make_problem(torch)
    losses, times = train(torch, model, opt, x, y, STEPS, batch=512)
    torch.cuda.synchronize()
    xi.drain(0)  # retire the frees and flush the CSV log
    st = xt.stats(0)
    r.metrics.update(loss_summary(losses))
    r.metrics["mean_step_ms"] = 1e3 * statistics.fmean(times[WARMUP_STEPS:])
    r.metrics["stats"] = stats_dict(st)
    init, final = r.metrics["initial_loss"], r.metrics["final_loss"]
    r.check("loss falls", final < 0.5 * init, f"mean of first 10 steps {init:.4f}, of last 10 {final:.4f} (need < half)")
    r.check("budget from XLOG_BUDGET_BYTES", st.budget_limit == TRAIN_BUDGET, f"budget_limit {st.budget_limit}")
    r.check(
        "peak outstanding <= budget",
        0 < st.peak_outstanding_bytes <= st.budget_limit,
        f"peak {st.peak_outstanding_bytes} B ({st.peak_outstanding_bytes / MiB:.1f} MiB) of {st.budget_limit}",
    )
    r.check("no refused allocation", st.failed_allocations == 0, f"failed_allocations {st.failed_allocations}")
    r.check(
        "allocations went through the hooks",
        st.allocations >= STEPS,
        f"{st.allocations} allocations, {st.deallocations} frees, {st.live_blocks} live blocks ({st.live_bytes} B)",
    )

    rows = list(csv.reader(open(log_path, newline="")))
    header_ok = bool(rows) and rows[0] == [
        "Thread", "Time", "Action", "Pointer", "Size", "Stream", "Tag", "Device", "Process", "Detail"
    ]
    actions: Dict[str, int] = {}
    tags = set()
    for row in rows[1:]:
        actions[row[2]] = actions.get(row[2], 0) + 1
        tags.add(row[6])
    r.metrics["log_lines"] = actions
    r.check("log header", header_ok, f"{log_path}: {rows[0] if rows else 'empty file'}")
    r.check(
        "log has a line per allocate and free",
        actions.get("allocate", 0) == st.allocations and actions.get("free", 0) == st.deallocations,
        f"allocate lines {actions.get('allocate', 0)} (stats {st.allocations}), "
        f"free lines {actions.get('free', 0)} (stats {st.deallocations}), tags {sorted(tags)}",
    )
    del model, opt, x, y
    gc.collect()
    torch.cuda.synchronize()
    xi.drain(0)
    r.info("left at the end", f"{xt.stats(0).live_blocks} blocks still live (PyTorch keeps its cuBLAS workspace)")

    # The memory report of this run (python -m xlog_cuda.report).
    from xlog_cuda import report

    page = os.path.join(workdir, "train-report.html")
    try:
        import matplotlib  # noqa: F401

        png: Optional[str] = os.path.join(workdir, "train-report.png")
    except ImportError:
        png = None
    t0 = time.perf_counter()
    data = report.write_report(log_path, page, png, title="gpu-frameworks train: PyTorch MLP on xlog")
    took = time.perf_counter() - t0
    final = xt.stats(0)
    r.metrics["report"] = {"html": page, "png": png, "seconds": round(took, 3), "lines": data["lines"],
                           "peak_live_bytes": data["peak"]["bytes"]}
    r.check(
        "memory report written",
        os.path.getsize(page) > 10_000 and data["counts"]["allocate"] == final.allocations,
        f"{page} ({os.path.getsize(page)} B, {took:.2f} s): {data['counts']['allocate']} allocations read "
        f"(stats {final.allocations}), peak live {data['peak']['bytes']} B at {data['peak']['t']:.3f} s"
        + (f"; {png}" if png else "; no PNG (matplotlib missing)"),
    )
    r.check(
        "report peak <= runtime peak",
        0 < data["peak"]["bytes"] <= final.peak_outstanding_bytes,
        f"log's live peak {data['peak']['bytes']} B, runtime's peak outstanding {final.peak_outstanding_bytes} B "
        "(outstanding also counts freed-but-pending bytes)",
    )


def scenario_oom(r: Result, workdir: str) -> None:
    import xlog_cuda
    import xlog_cuda.interop as xi
    import xlog_cuda.torch as xt

    xt.enable(budget=OOM_BUDGET, backend="cuda")
    import torch

    r.metrics["torch_version"] = torch.__version__
    r.info("how refusals reach PyTorch", xt.oom_shim())
    oom_error = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError

    # 1. What does PyTorch do with the hook's NULL? Probe with torch.empty:
    #    no kernel touches the memory, so this is safe either way.
    raised: Optional[BaseException] = None
    probe = None
    try:
        probe = torch.empty(OOM_BUDGET + MiB, dtype=torch.uint8, device="cuda")
    except BaseException as e:  # noqa: BLE001 - we report whatever it is
        raised = e
    reason = xlog_cuda.last_error()
    if raised is None:
        ptr = probe.data_ptr()
        del probe
        r.check(
            "PyTorch raises on a refused allocation",
            False,
            f"torch {torch.__version__} did not raise: torch.empty returned a tensor with data_ptr() = {ptr:#x}; "
            "its CUDAPluggableAllocator does not check the NULL, so a kernel writing such a tensor "
            "would fault. The rest of this scenario is skipped (it would crash the process).",
        )
        r.info("our reason", reason or "(empty)")
        return
    r.check(
        "PyTorch raises torch.OutOfMemoryError on a refused allocation",
        isinstance(raised, oom_error),
        f"{type(raised).__module__}.{type(raised).__name__}: {str(raised).splitlines()[0][:200] if str(raised) else ''}",
    )
    r.check(
        "our reason in xlog_cuda.last_error()",
        "out of budget" in reason and f"requested {OOM_BUDGET + MiB} bytes" in reason and f"limit {OOM_BUDGET}" in reason,
        reason or "(empty)",
    )
    text = str(raised)
    r.check(
        "torch.OutOfMemoryError's text carries the numbers",
        f"requested {OOM_BUDGET + MiB} bytes" in text and f"limit {OOM_BUDGET}" in text
        and all(f" {k} " in text for k in ("live", "cached", "pending")),
        text.splitlines()[0][:300] if text else "(empty)",
    )

    # 2. A training loop whose first activation (131072 x 1024 fp32 = 512 MiB)
    #    cannot fit in 256 MiB: refused in the forward pass (main thread).
    model, opt, x, y = make_problem(torch)
    train(torch, model, opt, x, y, 3, batch=512)  # warm up within the budget
    before = xt.stats(0)
    big_batch = 131072
    caught: Optional[BaseException] = None
    reason = ""
    try:
        train(torch, model, opt, x, y, 5, batch=big_batch)
    except oom_error as e:
        caught = e
        reason = xlog_cuda.last_error()  # first: any later library call on this thread replaces it
    except RuntimeError as e:
        caught = e
        reason = xlog_cuda.last_error()
    r.check(
        "over-budget training step raises torch.OutOfMemoryError",
        caught is not None and isinstance(caught, oom_error),
        f"{type(caught).__name__ if caught else 'nothing raised'}",
    )
    expected = big_batch * HIDDEN * 4
    r.check(
        "our reason names the refused request",
        "out of budget" in reason and "requested" in reason and f"limit {OOM_BUDGET}" in reason,
        (reason or "(empty: a free on this thread cleared it, or the refusal happened on another thread)")
        + f"; the first activation is {expected} B",
    )
    text = str(caught) if caught is not None else ""
    r.check(
        "the training step's torch.OutOfMemoryError carries the numbers",
        "requested" in text and f"limit {OOM_BUDGET}" in text,
        text.splitlines()[0][:300] if text else "(nothing raised)",
    )
    caught = None  # drop the traceback and the frames' tensors
    gc.collect()
    after = xt.stats(0)
    r.check(
        "refusals counted",
        after.failed_allocations > before.failed_allocations,
        f"failed_allocations {before.failed_allocations} -> {after.failed_allocations}",
    )
    r.check(
        "peak outstanding <= budget",
        after.peak_outstanding_bytes <= OOM_BUDGET,
        f"peak {after.peak_outstanding_bytes} of {OOM_BUDGET}",
    )

    # 3. Recovery in the same process: the loop at a batch that fits.
    torch.cuda.empty_cache()  # a no-op for a pluggable allocator without reset_fn; harmless
    try:
        losses, _ = train(torch, model, opt, x, y, 20, batch=512)
        ok = all(l == l and l < 1e6 for l in losses)  # finite
        r.check("training continues after the refusal", ok, f"20 steps at batch 512, last loss {losses[-1]:.4f}")
    except BaseException as e:  # noqa: BLE001
        r.check("training continues after the refusal", False, f"{type(e).__name__}: {e}")
    small = torch.ones(16 * MiB // 4, device="cuda")
    r.check("a smaller allocation succeeds", float(small.sum()) == float(small.numel()), f"{small.nbytes} B tensor")
    del small, model, opt, x, y
    gc.collect()
    torch.cuda.synchronize()
    xi.drain(0)
    r.metrics["stats"] = stats_dict(xt.stats(0))


def scenario_shared(r: Result, workdir: str) -> None:
    import xlog_cuda.cupy as xcp
    import xlog_cuda.interop as xi
    import xlog_cuda.torch as xt

    xt.enable(budget=SHARED_BUDGET, backend="cuda")
    xcp.enable()  # joins the hooks (and the budget) of device 0
    import cupy
    import torch

    r.metrics["torch_version"] = torch.__version__
    r.metrics["cupy_version"] = cupy.__version__

    def snap():
        torch.cuda.synchronize()
        cupy.cuda.runtime.deviceSynchronize()
        return xt.stats(0), xi.live_blocks(0)

    # Warm up both (contexts, handles, RNG state) before measuring deltas.
    w1 = torch.zeros(1, device="cuda")
    w2 = cupy.zeros(1, dtype=cupy.float32)
    base, base_blocks = snap()

    t_sizes = [(3_000_000, torch.float32), (1_234_567, torch.uint8)]
    c_sizes = [(5_000_000, cupy.float32), (777, cupy.uint8)]
    ts = [torch.empty(n, dtype=dt, device="cuda") for n, dt in t_sizes]
    cs = [cupy.empty(n, dtype=dt) for n, dt in c_sizes]
    want = sum(t.untyped_storage().nbytes() for t in ts) + sum(c.nbytes for c in cs)
    now, blocks = snap()
    r.metrics["requested_bytes"] = want
    # live_bytes counts device bytes: each request rounded up to the
    # allocator's block size (512 B in the arena).
    ptrs = {t.data_ptr() for t in ts} | {c.data.ptr for c in cs}
    mine = [b for b in xt.live_blocks(0) if b.ptr in ptrs]
    device_bytes = sum(b.device_bytes for b in mine)
    r.check(
        "live_bytes = the device bytes of what PyTorch and CuPy hold",
        len(mine) == 4
        and sum(b.size for b in mine) == want
        and all(b.size <= b.device_bytes < b.size + 4096 for b in mine)
        and now.live_bytes - base.live_bytes == device_bytes,
        f"delta {now.live_bytes - base.live_bytes} B, device bytes of the {len(mine)} blocks {device_bytes} B, "
        f"requested {want} B (torch {[t.untyped_storage().nbytes() for t in ts]}, cupy {[c.nbytes for c in cs]})",
    )
    r.check(
        "live blocks = tensors + arrays",
        now.live_blocks - base.live_blocks == 4 and blocks - base_blocks == 4,
        f"stats delta {now.live_blocks - base.live_blocks}, xlog_interop_live_blocks delta {blocks - base_blocks}",
    )

    # A 0-element tensor: PyTorch's 0-byte request gets NULL and no block,
    # as from its own allocator (a real pointer made its storage resize
    # copy for nothing).
    z = torch.empty(0, device="cuda")
    zs, zb = snap()
    r.check(
        "0-element tensor: no block",
        zs.live_blocks == now.live_blocks and zs.live_bytes == now.live_bytes and z.data_ptr() == 0,
        f"{zs.live_blocks - now.live_blocks} block(s), {zs.live_bytes - now.live_bytes} B, data_ptr {z.data_ptr():#x}",
    )
    del z

    # DLPack views share the memory: no allocation.
    before, _ = snap()
    c_view = cupy.from_dlpack(ts[0])
    t_view = torch.from_dlpack(cs[0])
    after, _ = snap()
    r.check(
        "DLPack views allocate nothing",
        after.live_bytes == before.live_bytes and after.allocations == before.allocations,
        f"allocations {before.allocations} -> {after.allocations}",
    )
    ts[0].fill_(1.0)
    cs[0].fill(2.0)
    seen = (float(c_view.sum()), float(t_view.sum()))
    agree = abs(seen[0] - 3e6) <= 1e-6 * 3e6 and abs(seen[1] - 1e7) <= 1e-6 * 1e7
    r.check("both see each other's writes", agree, f"torch fill(1) -> cupy sum {seen[0]}, cupy fill(2) -> torch sum {seen[1]}")
    del c_view, t_view
    gc.collect()
    settled, _ = snap()
    r.info(
        "after the reductions",
        f"live_bytes {settled.live_bytes - now.live_bytes:+d} B vs before them "
        "(reductions allocate scratch space and free it; 0 expected)",
    )

    # cuBLAS keeps a workspace allocated through the allocator.
    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    pre, _ = snap()
    c = a @ b
    post, _ = snap()
    r.info(
        "matmul extra bytes",
        f"{post.live_bytes - pre.live_bytes - c.untyped_storage().nbytes()} B beyond the {c.untyped_storage().nbytes()} B "
        "result (PyTorch's cuBLAS workspace, kept for the process; 0 if it existed already)",
    )
    del a, b, c

    # One budget for both: PyTorch holds most of it, CuPy is refused, then fits.
    del ts, cs
    gc.collect()
    big = torch.empty(700 * MiB, dtype=torch.uint8, device="cuda")
    try:
        cupy.empty(400 * MiB, dtype=cupy.uint8)
        r.check("CuPy refused while PyTorch holds the budget", False, "cupy.empty(400 MiB) succeeded")
    except cupy.cuda.memory.OutOfMemoryError as e:
        r.check(
            "CuPy refused while PyTorch holds the budget",
            "[xlog: xlog_cupy_malloc: out of budget" in str(e),
            str(e)[:300],
        )
    del big
    try:
        fits = cupy.empty(400 * MiB, dtype=cupy.uint8)
        r.check("CuPy fits once PyTorch frees", fits.nbytes == 400 * MiB, "cupy.empty(400 MiB) after del")
        del fits
    except cupy.cuda.memory.OutOfMemoryError as e:
        r.check("CuPy fits once PyTorch frees", False, str(e)[:300])
    end, _ = snap()
    xi.drain(0)
    r.check(
        "peak outstanding <= budget",
        end.peak_outstanding_bytes <= SHARED_BUDGET,
        f"peak {end.peak_outstanding_bytes} of {SHARED_BUDGET}",
    )
    del w1, w2
    r.metrics["stats"] = stats_dict(xt.stats(0))


def _timed(r: Result, use_xlog: bool) -> None:
    if use_xlog:
        import xlog_cuda.torch as xt

        xt.enable(budget=TRAIN_BUDGET, backend="cuda")
    import torch

    model, opt, x, y = make_problem(torch)
    train(torch, model, opt, x, y, WARMUP_STEPS, batch=512)
    losses, times = train(torch, model, opt, x, y, TIMED_STEPS, batch=512, seed=2)
    ms = [1e3 * t for t in times]
    r.metrics.update(
        {
            "allocator": "xlog" if use_xlog else "pytorch-caching",
            "steps": TIMED_STEPS,
            "mean_step_ms": statistics.fmean(ms),
            "median_step_ms": statistics.median(ms),
            "p90_step_ms": sorted(ms)[int(0.9 * len(ms))],
            "final_loss": losses[-1],
        }
    )
    r.check("timed loop ran", len(ms) == TIMED_STEPS, f"mean {statistics.fmean(ms):.3f} ms/step")
    if use_xlog:
        st = xt.stats(0)
        r.metrics["stats"] = stats_dict(st)
        r.check("no refused allocation", st.failed_allocations == 0, f"failed_allocations {st.failed_allocations}")


def scenario_time_default(r: Result, workdir: str) -> None:
    _timed(r, use_xlog=False)


def scenario_time_xlog(r: Result, workdir: str) -> None:
    _timed(r, use_xlog=True)


def scenario_numba(r: Result, workdir: str) -> None:
    """Enabled by NUMBA_CUDA_MEMORY_MANAGER=xlog_cuda.numba (set by the
    driver, with XLOG_BACKEND=cuda, XLOG_BUDGET_BYTES=256MiB and a log)."""
    import numpy as np

    # The GPU image pairs numba-cuda with numpy 2.5, which no longer has
    # `numpy.row_stack` (deprecated since numpy 2.0); numba-cuda still calls
    # it when it launches a kernel. That is the image's mismatch, not the
    # plug-in's: give numpy its old alias back (the same function) and say
    # so in the results.
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
        r.metrics["numpy_row_stack_alias"] = f"added for numpy {np.__version__}"
    from numba import cuda
    from numba.cuda.cudadrv import driver as nb_driver

    import xlog_cuda.interop as xi
    import xlog_cuda.numba as xn

    try:
        from importlib.metadata import version

        r.metrics["numba_cuda_version"] = version("numba-cuda")
    except Exception:  # noqa: BLE001 - informational
        pass
    r.metrics["numba_version"] = __import__("numba").__version__

    @cuda.jit
    def axpy(a, x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    ctx = cuda.current_context()  # creates the context: binds the plug-in
    manager = type(ctx.memory_manager)
    r.check("Numba uses the xlog plug-in", manager.__name__ == "XlogNumbaManager",
            f"{manager.__module__}.{manager.__name__}")
    base = xn.stats(0)
    r.check("budget from XLOG_BUDGET_BYTES", base.budget_limit == NUMBA_BUDGET, f"budget_limit {base.budget_limit}")

    n = 1 << 22  # 16 MiB per float32 array
    x_host = np.arange(n, dtype=np.float32)
    x = cuda.to_device(x_host)
    y = cuda.to_device(np.ones(n, dtype=np.float32))
    out = cuda.device_array(n, dtype=np.float32)
    now = xn.stats(0)
    r.check(
        "stats count Numba's arrays",
        now.live_bytes - base.live_bytes == 3 * n * 4 and now.live_blocks - base.live_blocks == 3,
        f"live_bytes +{now.live_bytes - base.live_bytes} (3 arrays of {n * 4} B), live_blocks +{now.live_blocks - base.live_blocks}",
    )
    axpy[(n + 255) // 256, 256](np.float32(2.0), x, y, out)
    cuda.synchronize()
    got = out.copy_to_host()
    want = 2.0 * x_host + 1.0
    r.check("a kernel over xlog-backed arrays", bool(np.array_equal(got, want)),
            f"out[:3] = {got[:3].tolist()}, out[-1] = {float(got[-1])} (expected {float(want[-1])})")
    info = ctx.get_memory_info()
    remaining = xn.stats(0).budget_remaining
    r.check("get_memory_info is the budget", info.total == NUMBA_BUDGET and info.free == remaining,
            f"{info}, budget_remaining {remaining}")

    # A refusal: Numba's out-of-memory error, with xlog's reason.
    try:
        cuda.device_array(NUMBA_BUDGET // 4, dtype=np.float32)
        r.check("over-budget array refused", False, "cuda.device_array(256 MiB) succeeded under a 256 MiB budget")
    except nb_driver.CudaAPIError as e:
        message = str(e)
        r.check(
            "over-budget array raises Numba's out-of-memory error with xlog's reason",
            "OUT_OF_MEMORY" in repr(e.code).upper() or int(e.code) == 2,
            f"{type(e).__name__}: {message[:240]}",
        )
        r.check("the message names the numbers", "out of budget" in message and f"limit {NUMBA_BUDGET}" in message,
                message[:240])
    r.check("refusal counted", xn.stats(0).failed_allocations > base.failed_allocations,
            f"failed_allocations {base.failed_allocations} -> {xn.stats(0).failed_allocations}")

    # Freed arrays give their bytes back.
    del x, y, out
    gc.collect()
    cuda.synchronize()
    xi.drain(0)
    after = xn.stats(0)
    r.check("freed arrays give their bytes back", after.live_bytes == base.live_bytes and after.pending_bytes == 0,
            f"live_bytes {after.live_bytes} (before the arrays {base.live_bytes}), pending {after.pending_bytes}")

    # One budget with PyTorch, when it is there.
    try:
        import xlog_cuda.torch as xt

        xt.enable()  # joins the hooks Numba opened from the environment
        import torch
    except ImportError as e:
        r.skip("Numba and PyTorch share the budget", f"PyTorch not importable: {e}")
    else:
        big = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        try:
            cuda.device_array(100 * MiB, dtype=np.uint8)
            r.check("Numba refused while PyTorch holds the budget", False, "cuda.device_array(100 MiB) succeeded")
        except nb_driver.CudaAPIError as e:
            r.check("Numba refused while PyTorch holds the budget", "out of budget" in str(e), str(e)[:200])
        del big
        torch.cuda.synchronize()
        try:
            fits = cuda.device_array(100 * MiB, dtype=np.uint8)
            r.check("Numba fits once PyTorch frees", fits.nbytes == 100 * MiB, "cuda.device_array(100 MiB) after del")
            del fits
        except nb_driver.CudaAPIError as e:
            r.check("Numba fits once PyTorch frees", False, str(e)[:200])
    xi.drain(0)
    log = os.environ.get("XLOG_LOG_PATH")
    if log and os.path.exists(log):
        rows = list(csv.reader(open(log, newline="")))
        tag = rows[0].index("Tag") if rows and "Tag" in rows[0] else 6
        numba_rows = sum(1 for row in rows[1:] if len(row) > tag and row[tag] == "numba")
        r.check("Numba's allocations are in the log, tagged numba", numba_rows >= 6, f"{numba_rows} rows tagged numba in {log}")
    r.metrics["stats"] = stats_dict(xn.stats(0))
ENABLE_PROCESS = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import xlog_cuda, xlog_cuda.torch as xt
t2 = time.perf_counter()
xt.enable(budget="64MiB", backend="cuda")
t3 = time.perf_counter()
info = xt.enable_info()
x = torch.ones(1 << 20, device="cuda")
ok = float(x.sum()) == float(1 << 20)
t4 = time.perf_counter()
raised = ""
try:
    torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as e:
    raised = "torch.OutOfMemoryError"
except BaseException as e:
    raised = type(e).__module__ + "." + type(e).__name__
print(json.dumps({
    "import_torch_s": t1 - t0, "import_xlog_s": t2 - t1, "enable_s": t3 - t2,
    "first_tensor_s": t4 - t3, "tensor_ok": ok, "refusal_raises": raised,
    "reason": xlog_cuda.last_error(),
    "shim": info.get("shim"), "shim_origin": info.get("shim_origin"), "shim_problem": info.get("shim_problem"),
    "steps_s": info.get("seconds"),
    "cpp_extension_imported": "torch.utils.cpp_extension" in sys.modules,
}))
"""


def scenario_enable_cost(r: Result, workdir: str) -> None:
    """Two fresh processes call enable() against one empty shim cache."""
    cache = os.path.join(workdir, f"shim-cache-{os.getpid()}")
    env = dict(os.environ, XLOG_CUDA_CACHE_DIR=cache)
    runs: List[Dict[str, Any]] = []
    for which in ("first", "second"):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", ENABLE_PROCESS], env=env, capture_output=True, text=True, timeout=120)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            r.check(f"{which} process ran", False, f"exit {p.returncode}: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
            return
        run = json.loads(p.stdout.strip().splitlines()[-1])
        run["process_s"] = wall
        runs.append(run)
        r.info(
            f"{which} process",
            f"enable() {run['enable_s']:.3f} s (shim {run['shim_origin'] or 'none'}; steps "
            + ", ".join(f"{k} {v:.3f}" for k, v in (run["steps_s"] or {}).items())
            + f"), import torch {run['import_torch_s']:.2f} s, whole process {wall:.2f} s",
        )
    first, second = runs
    r.metrics["enable_first_s"] = first["enable_s"]
    r.metrics["enable_second_s"] = second["enable_s"]
    r.metrics["enable_runs"] = runs
    r.check("first process built the shim", first["shim_origin"] == "built", first["shim_problem"] or first["shim_origin"])
    r.check(
        "second process loaded it from the cache",
        second["shim_origin"] == "cached" and second["shim"] == first["shim"] and not second["cpp_extension_imported"],
        f"origin {second['shim_origin']!r}, cpp_extension imported: {second['cpp_extension_imported']}",
    )
    r.check(
        f"enable() in the second process <= {ENABLE_TARGET_S} s",
        second["enable_s"] <= ENABLE_TARGET_S,
        f"{second['enable_s']:.3f} s (first: {first['enable_s']:.3f} s)",
    )
    for which, run in (("first", first), ("second", second)):
        r.check(
            f"refusal raises torch.OutOfMemoryError ({which} process)",
            run["refusal_raises"] == "torch.OutOfMemoryError" and run["tensor_ok"],
            f"{run['refusal_raises'] or 'nothing raised'}; reason: {run['reason'][:160]}",
        )


RS_ELEMENTS = 16 * MiB  # float32: a 64 MiB block
RS_SLEEP_CYCLES = 400_000_000  # torch.cuda._sleep: a few hundred ms on an H100


def _side_stream_read(torch, side, record: str):
    """Fill x (1.0) on the default stream, read it on `side` after a long
    sleep (the copy into `out` starts well after the host has moved on),
    then free x and at once allocate y of the same size on the default
    stream and fill it with 2.0. `record`: "tensor" (x.record_stream),
    "xlog" (xlog_cuda.torch.record_stream) or "none" (the control). Returns
    (x's address, y's address, elements of `out` that are not 1.0)."""
    import xlog_cuda.torch as xt

    out = torch.empty(RS_ELEMENTS, device="cuda")
    x = torch.full((RS_ELEMENTS,), 1.0, device="cuda")
    torch.cuda.synchronize()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(RS_SLEEP_CYCLES)
        out.copy_(x)
    if record == "tensor":
        x.record_stream(side)
    elif record == "xlog":
        xt.record_stream(x, side)
    x_ptr = x.data_ptr()
    del x
    y = torch.empty(RS_ELEMENTS, device="cuda")
    y.fill_(2.0)
    y_ptr = y.data_ptr()
    torch.cuda.synchronize()
    wrong = int((out != 1.0).sum().item())
    del y, out
    return x_ptr, y_ptr, wrong


def scenario_record_stream(r: Result, workdir: str) -> None:
    """Tensor.record_stream reaches xlog: memory read on a side stream is
    not handed out again (and overwritten) before that read is done."""
    import xlog_cuda.torch as xt

    xt.enable(budget=2 * GiB, backend="cuda")
    import torch

    info = xt.enable_info()
    r.metrics["torch_version"] = torch.__version__
    r.check(
        "enable() installed the record-stream hook",
        bool(info.get("record_stream_hook")),
        f"shim {info.get('shim')}; {info.get('record_stream_problem') or 'hook set'}",
    )
    side = torch.cuda.Stream()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()

    # Control: without record_stream the freed block goes straight back to
    # the default stream's cache, y gets its address, and y's fill lands
    # before the side stream's delayed read.
    x_ptr, y_ptr, wrong = _side_stream_read(torch, side, "none")
    r.check("control: the freed address is handed out again at once", x_ptr == y_ptr, f"x {x_ptr:#x}, y {y_ptr:#x}")
    r.check(
        "control: without record_stream the side stream reads overwritten data",
        wrong > 0,
        f"{wrong} of {RS_ELEMENTS} elements read as 2.0 instead of 1.0 (the race this check guards against)",
    )

    for how, label in (("tensor", "Tensor.record_stream"), ("xlog", "xlog_cuda.torch.record_stream")):
        x_ptr, y_ptr, wrong = _side_stream_read(torch, side, how)
        r.check(
            f"{label}: the side stream reads the original data",
            wrong == 0,
            f"{wrong} of {RS_ELEMENTS} elements wrong; x {x_ptr:#x}, y {y_ptr:#x} "
            f"({'same address: the reuse waited on the GPU' if x_ptr == y_ptr else 'another address'})",
        )
    r.metrics["stats"] = stats_dict(xt.stats(0))


def scenario_inspect(r: Result, workdir: str) -> None:
    """memory_stats / live_blocks / reset_peak / memory_summary under xlog
    (the driver sets XLOG_BACKEND=cuda and XLOG_TRACK_CALLSITES=1)."""
    import torch

    import xlog_cuda
    import xlog_cuda.torch as xt

    xt.enable()
    dev = torch.device("cuda", 0)
    big_bytes, small_bytes = 64 * MiB, 1 * MiB
    with xlog_cuda.call_site("inspect-big"):
        big = torch.empty(big_bytes, dtype=torch.uint8, device=dev)
    small = torch.empty(small_bytes, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    st = xt.stats(0)
    ms = xt.memory_stats(0)
    r.check(
        "allocated_bytes.all.current is the live bytes",
        ms["allocated_bytes.all.current"] == st.live_bytes >= big_bytes + small_bytes,
        f"allocated {ms['allocated_bytes.all.current']}, stats live {st.live_bytes}",
    )
    r.check(
        "requested_bytes.all.current counts both tensors",
        ms["requested_bytes.all.current"] >= big_bytes + small_bytes,
        f"requested {ms['requested_bytes.all.current']}",
    )
    r.check(
        "reserved >= allocated, no inactive split",
        ms["reserved_bytes.all.current"] >= ms["allocated_bytes.all.current"]
        and ms["inactive_split_bytes.all.current"] == 0,
        f"reserved {ms['reserved_bytes.all.current']}",
    )
    blocks = {b.ptr: b for b in xt.live_blocks(0)}
    mine = blocks.get(big.untyped_storage().data_ptr())
    r.check(
        "live_blocks() has the big tensor with its call-site label",
        mine is not None and mine.size == big_bytes and mine.call_site == "inspect-big" and mine.age_s is not None,
        f"{mine}",
    )
    r.check(
        "the small tensor has no label",
        blocks.get(small.untyped_storage().data_ptr()) is not None
        and blocks[small.untyped_storage().data_ptr()].call_site is None,
        f"{blocks.get(small.untyped_storage().data_ptr())}",
    )
    peak = ms["allocated_bytes.all.peak"]
    del big
    torch.cuda.synchronize()
    after = xt.memory_stats(0)
    r.check(
        "a free lowers current, the peak stays",
        after["allocated_bytes.all.current"] <= peak - big_bytes and after["allocated_bytes.all.peak"] == peak,
        f"current {after['allocated_bytes.all.current']}, peak {after['allocated_bytes.all.peak']} (was {peak})",
    )
    xt.reset_peak_memory_stats(0)
    reset = xt.memory_stats(0)
    r.check(
        "reset_peak_memory_stats restarts the peaks",
        reset["allocated_bytes.all.peak"] == reset["allocated_bytes.all.current"]
        and reset["reserved_bytes.all.peak"] == reset["reserved_bytes.all.current"],
        f"allocated peak {reset['allocated_bytes.all.peak']}, reserved peak {reset['reserved_bytes.all.peak']}",
    )
    tags = xt.tag_stats(0)
    r.check(
        "per-tag live bytes add up to the live bytes",
        sum(t.live_bytes for t in tags) == xt.stats(0).live_bytes and all(t.allocations >= t.frees for t in tags),
        ", ".join(f"{t.tag or '(untagged)'}: {t.live_bytes} B live, {t.allocations} allocations" for t in tags),
    )
    text = xt.memory_summary(0)
    with open(os.path.join(workdir, "inspect-summary.txt"), "w") as f:
        f.write(text)
    r.check(
        "memory_summary() names the live bytes and the small tensor's size",
        f"{xt.stats(0).live_bytes} B" in text and str(small_bytes) in text,
        text.splitlines()[0] if text else "empty",
    )
    try:
        theirs = torch.cuda.memory_stats(0)
        r.info("torch.cuda.memory_stats() under the pluggable allocator", f"{len(theirs)} keys")
    except Exception as e:  # noqa: BLE001 - what PyTorch does is informational
        r.info("torch.cuda.memory_stats() under the pluggable allocator", f"{type(e).__name__}: {str(e)[:160]}")
    del small


def _first_lines(e: BaseException, n: int = 3) -> str:
    """The exception's type and the first `n` non-empty lines of its text."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__module__}.{type(e).__name__}: " + " | ".join(lines[:n])


def _graphs_consistent(r: Result, torch, label: str) -> None:
    """After a graph attempt: xlog's figures agree with each other and new
    allocations and kernels still work."""
    import xlog_cuda.interop as xi
    import xlog_cuda.torch as xt

    problems = []
    try:
        torch.cuda.synchronize()
    except BaseException as e:  # noqa: BLE001 - reported
        problems.append(f"torch.cuda.synchronize raised {_first_lines(e, 1)}")
    try:
        xi.drain(0)
    except BaseException as e:  # noqa: BLE001 - reported
        problems.append(f"xlog_cuda.interop.drain raised {_first_lines(e, 1)}")
    st = xt.stats(0)
    held = st.live_bytes + st.cached_bytes + st.pending_bytes
    if st.outstanding_bytes < held:
        problems.append(f"outstanding {st.outstanding_bytes} < live+cached+pending {held}")
    if st.budget_limit and st.budget_limit - st.budget_remaining != st.outstanding_bytes:
        problems.append(
            f"the budget charges {st.budget_limit - st.budget_remaining} B but outstanding is {st.outstanding_bytes} B"
        )
    try:
        n = 1 << 20
        t = torch.full((n,), 3.0, device="cuda")
        total = float((t * 2.0).sum().item())
        if total != 6.0 * n:
            problems.append(f"a new tensor's sum is {total}, expected {6.0 * n}")
        del t
        torch.cuda.synchronize()
    except BaseException as e:  # noqa: BLE001 - reported
        problems.append(f"a new allocation and kernel raised {_first_lines(e, 1)}")
    r.check(
        f"{label}: xlog is consistent afterwards and later allocations work",
        not problems,
        "; ".join(problems)
        or f"outstanding {st.outstanding_bytes} B (live {st.live_bytes}, cached {st.cached_bytes}, pending "
        f"{st.pending_bytes}), budget remaining {st.budget_remaining}; a new 4 MiB tensor computes right",
    )


def scenario_graphs(r: Result, workdir: str) -> None:
    """torch.cuda.graph and torch.compile(mode="reduce-overhead") with xlog as
    PyTorch's allocator: what works is checked, what PyTorch refuses is
    reported with its exact text."""
    import xlog_cuda.torch as xt

    xt.enable(budget=2 * GiB, backend="cuda")
    import torch

    r.metrics["torch_version"] = torch.__version__
    errors_path = os.path.join(workdir, "graphs-errors.txt")
    errors = open(errors_path, "w")

    def keep(what: str, e: BaseException) -> str:
        errors.write(f"===== {what}\n{''.join(traceback.format_exception(type(e), e, e.__traceback__))}\n")
        errors.flush()
        return _first_lines(e)

    # ---- 1. torch.cuda.graph: capture a small MLP's forward and backward,
    # replay it with new inputs, compare with eager every time, then delete
    # the graph and see its memory come back.
    info = xt.enable_info()
    r.check(
        "enable() set PyTorch's graph-pool hooks (torch.cuda.graph reaches xlog)",
        bool(info.get("graph_pools_hook")),
        f"graph_pools_hook={info.get('graph_pools_hook')} problem={info.get('graph_pools_problem')!r} "
        f"shim={info.get('shim')} shim_problem={info.get('shim_problem')!r}",
    )
    outcome: Dict[str, Any] = {}
    phases: Dict[str, Dict[str, int]] = {}

    def phase(name: str) -> Dict[str, int]:
        torch.cuda.synchronize()
        st = stats_dict(xt.stats(0))
        phases[name] = st
        print(f"[graphs] stats {name}: " + json.dumps(st), flush=True)
        return st

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).cuda()
    params = list(model.parameters())
    static_x = torch.randn(32, 64, device="cuda")
    static_y = torch.randn(32, 10, device="cuda")

    def step(x, y):
        return torch.nn.functional.mse_loss(model(x), y)

    def eager(x, y):
        loss = step(x, y)
        grads = torch.autograd.grad(loss, params)
        return loss.detach(), grads

    capture_stream = torch.cuda.Stream()
    # Warm up on the capture stream (cuBLAS makes its workspace for a
    # stream on first use: before the capture, not inside it) and on the
    # default stream (the eager comparisons).
    capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture_stream):
        for _ in range(3):
            step(static_x, static_y).backward()
    torch.cuda.current_stream().wait_stream(capture_stream)
    for _ in range(2):
        eager(static_x, static_y)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    xt.trim(0)
    base = phase("before the capture (trimmed)")
    graph = torch.cuda.CUDAGraph()
    static_loss = None
    try:
        with torch.cuda.graph(graph, stream=capture_stream):
            static_loss = step(static_x, static_y)
            static_loss.backward()
        outcome["capture"] = "ok"
    except BaseException as e:  # noqa: BLE001 - reported with everything known
        outcome["capture"] = keep("torch.cuda.graph capture", e)
    captured = phase("after the capture")
    outcome["allocations_during_capture"] = captured["allocations"] - base["allocations"]
    charged = captured["outstanding_bytes"] - base["outstanding_bytes"]
    r.check(
        "torch.cuda.graph: forward + backward of an MLP captures under enable()",
        static_loss is not None,
        f"{outcome['capture']}; {outcome['allocations_during_capture']} allocations went through xlog during "
        f"the capture; graph_pools_problem={info.get('graph_pools_problem')!r}; full traceback in {errors_path}",
    )
    budget_charged = captured["budget_limit"] - captured["budget_remaining"]
    r.check(
        "torch.cuda.graph: the capture's memory is held and charged to the budget",
        static_loss is not None and charged > 0 and budget_charged == captured["outstanding_bytes"],
        f"outstanding {base['outstanding_bytes']} -> {captured['outstanding_bytes']} B (+{charged}); live "
        f"{captured['live_bytes']}, cached {captured['cached_bytes']}; budget charges {budget_charged} B",
    )
    replays = 120
    def replay_and_compare() -> "tuple[int, float, str]":
        """Refill the static inputs, replay, compare loss and gradients with
        eager each time; (replays done, worst relative difference, error)."""
        worst, done = 0.0, 0
        grads = [p.grad for p in params]
        try:
            for i in range(replays):
                gen = torch.Generator(device="cuda").manual_seed(1000 + i)
                x = torch.randn(32, 64, device="cuda", generator=gen)
                y = torch.randn(32, 10, device="cuda", generator=gen)
                static_x.copy_(x)
                static_y.copy_(y)
                graph.replay()
                want_loss, want_grads = eager(x, y)
                torch.cuda.synchronize()
                diffs = [float((static_loss - want_loss).abs().item())]
                for g, w in zip(grads, want_grads):
                    diffs.append(float((g - w).abs().max().item()) / (1.0 + float(w.abs().max().item())))
                worst = max(worst, max(diffs))
                done += 1
        except BaseException as e:  # noqa: BLE001 - reported
            return done, worst, keep("torch.cuda.graph replay", e)
        return done, worst, ""

    if static_loss is not None:
        done, worst, error = replay_and_compare()
        outcome["replay"] = f"{done} replays, largest relative difference from eager {worst:.3g}" + (
            f"; then {error}" if error else ""
        )
        r.check(
            f"torch.cuda.graph: {replays} replays with new inputs give eager's loss and gradients every time",
            done == replays and worst <= 1e-4,
            f"{outcome['replay']} (loss and every parameter's gradient compared each replay)",
        )
    phase("after the replays")
    # The graph goes first (PyTorch's releasePool) while its outputs (the
    # loss, the gradients) are alive; their frees then give the rest back.
    del graph
    gc.collect()
    released_graph = phase("graph deleted, outputs alive")
    static_loss = None
    model.zero_grad(set_to_none=True)
    gc.collect()
    freed = phase("outputs freed")
    xt.trim(0)
    after = phase("after trim")
    r.check(
        "torch.cuda.graph: deleting the graph and its outputs gives the capture's memory back",
        after["outstanding_bytes"] <= base["outstanding_bytes"] and after["live_bytes"] <= base["live_bytes"],
        f"outstanding: before capture {base['outstanding_bytes']}, captured {captured['outstanding_bytes']}, graph "
        f"deleted {released_graph['outstanding_bytes']}, outputs freed {freed['outstanding_bytes']}, after trim "
        f"{after['outstanding_bytes']} B; live {base['live_bytes']} -> {after['live_bytes']} B",
    )
    r.metrics["cuda_graph_phases"] = phases
    _graphs_consistent(r, torch, "torch.cuda.graph")
    r.metrics["cuda_graph"] = outcome

    # ---- 2. torch.compile(mode="reduce-overhead"): CUDA graph trees.
    compiled: Dict[str, Any] = {}

    def f(a, b):
        return torch.nn.functional.gelu(a @ b) + 1.0

    try:
        from torch._dynamo.utils import counters

        counters.clear()
    except Exception:  # noqa: BLE001 - the counters are only informational
        counters = None
    try:
        cf = torch.compile(f, mode="reduce-overhead")
        b = torch.randn(64, 64, device="cuda")
        worst = 0.0
        calls = 6  # cudagraph trees warm up, then record, then replay
        for i in range(calls):
            a = torch.randn(64, 64, device="cuda", generator=torch.Generator(device="cuda").manual_seed(200 + i))
            got = cf(a, b).clone()
            want = f(a, b)
            torch.cuda.synchronize()
            worst = max(worst, float((got - want).abs().max().item()))
        compiled["result"] = f"{calls} calls, largest difference from eager {worst:.3g}"
        skips = dict(counters["inductor"]) if counters is not None else {}
        compiled["inductor_counters"] = {k: v for k, v in skips.items() if "cudagraph" in k}
        if counters is None:
            graphed_text = "unknown (torch._dynamo.utils.counters is not importable)"
        elif any(v for k, v in skips.items() if "cudagraph_skips" in k):
            graphed_text = f"no: inductor skipped CUDA graphs ({compiled['inductor_counters']})"
        else:
            graphed_text = "yes (inductor counted no cudagraph skip)"
        r.check(
            'torch.compile(mode="reduce-overhead"): outputs match eager',
            worst <= 1e-3,
            f"{calls} calls; largest |compiled - eager| {worst:.3g}; inductor cudagraph counters "
            f"{compiled['inductor_counters'] or 'none'}",
        )
        r.info(
            'torch.compile(mode="reduce-overhead"): ran as CUDA graphs',
            graphed_text,
        )
    except BaseException as e:  # noqa: BLE001 - what PyTorch does is the finding
        compiled["result"] = keep('torch.compile(mode="reduce-overhead")', e)
        r.info('torch.compile(mode="reduce-overhead") under xlog\'s pluggable allocator', compiled["result"])
    _graphs_consistent(r, torch, 'torch.compile(mode="reduce-overhead")')
    r.metrics["compile_reduce_overhead"] = compiled
    errors.close()
    r.metrics["errors_file"] = errors_path


SCENARIOS = {
    "train": scenario_train,
    "oom": scenario_oom,
    "shared": scenario_shared,
    "time_default": scenario_time_default,
    "time_xlog": scenario_time_xlog,
    "numba": scenario_numba,
    "enable_cost": scenario_enable_cost,
    "record_stream": scenario_record_stream,
    "inspect": scenario_inspect,
    "graphs": scenario_graphs,
}


def run_scenario(name: str, result_path: str, workdir: str) -> int:
    r = Result(name)
    code = 0
    try:
        SCENARIOS[name](r, workdir)
    except BaseException as e:  # noqa: BLE001 - reported as a failed check
        r.check("scenario ran to the end", False, f"{type(e).__name__}: {e}")
        traceback.print_exc()
        code = 1
    with open(result_path, "w") as f:
        json.dump(r.to_json(), f, indent=2)
    return code


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def preflight(env: Dict[str, str], only: List[str]) -> Optional[str]:
    """None if what the chosen scenarios import, and a CUDA device, are
    there; else why not."""
    modules = sorted({m for name in only for m in NEEDS[name]})
    code = (
        "import importlib, sys\n"
        f"mods = {modules!r}\n"
        "got = {m: importlib.import_module(m) for m in mods}\n"
        "print(' '.join(f'{m} {getattr(got[m], \"__version__\", \"\")}' for m in mods))\n"
        "if 'torch' in got:\n"
        "    sys.exit(0 if got['torch'].cuda.is_available() else 3)\n"
        "if 'numba.cuda' in got:\n"
        "    sys.exit(0 if got['numba.cuda'].is_available() else 3)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if p.returncode == 3:
        return "no CUDA device is visible: " + p.stdout.strip()
    if p.returncode != 0:
        return f"one of {modules} is not importable: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    print("gpu-frameworks:", p.stdout.strip(), flush=True)
    return None


def scenario_env(name: str, workdir: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLOG_") or k == "XLOG_CUDA_LIBRARY"}
    if name == "train":
        env["XLOG_BACKEND"] = "cuda"
        env["XLOG_BUDGET_BYTES"] = "2GiB"
        env["XLOG_LOG_PATH"] = os.path.join(workdir, "train-log.csv")
    if name == "numba":
        env["NUMBA_CUDA_MEMORY_MANAGER"] = "xlog_cuda.numba"
        env["XLOG_BACKEND"] = "cuda"
        env["XLOG_BUDGET_BYTES"] = "256MiB"
        env["XLOG_LOG_PATH"] = os.path.join(workdir, "numba-log.csv")
    if name == "inspect":
        env["XLOG_BACKEND"] = "cuda"
        env["XLOG_TRACK_CALLSITES"] = "1"
    return env


def drive(out_dir: str, only: List[str]) -> int:
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    why_not = preflight(dict(os.environ), only)
    if why_not is not None:
        print(f"gpu-frameworks: SKIP: {why_not}", flush=True)
        with open(os.path.join(out_dir, "summary.txt"), "w") as f:
            f.write(f"SKIPPED: {why_not}\n")
        return SKIP

    results: Dict[str, Dict[str, Any]] = {}
    for name in only:
        result_path = os.path.join(out_dir, f"{name}.json")
        log_path = os.path.join(out_dir, f"{name}.log")
        if os.path.exists(result_path):
            os.remove(result_path)
        t0 = time.monotonic()
        cmd = [sys.executable, os.path.abspath(__file__), "--scenario", name, "--result", result_path, "--workdir", out_dir]
        print(f"gpu-frameworks: running {name}", flush=True)
        try:
            with open(log_path, "w") as log:
                p = subprocess.run(
                    cmd, env=scenario_env(name, out_dir), stdout=log, stderr=subprocess.STDOUT,
                    timeout=SCENARIO_TIMEOUTS.get(name, SCENARIO_TIMEOUT_S),
                )
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = 124
        elapsed = time.monotonic() - t0
        try:
            with open(result_path) as f:
                res = json.load(f)
        except (OSError, ValueError):
            res = {"scenario": name, "checks": [], "metrics": {}}
        if rc != 0:
            tail = open(log_path, errors="replace").read().strip().splitlines()[-3:]
            res["checks"].append(
                {"name": "process exit", "status": "FAIL", "detail": f"exit {rc}" + ("" if not tail else ": " + " | ".join(tail))}
            )
        res["seconds"] = round(elapsed, 1)
        res["exit"] = rc
        results[name] = res
        for line in open(log_path, errors="replace"):
            if line.startswith("xlog: "):
                res["checks"].append({"name": "library stderr", "status": "info", "detail": line.strip()[:300]})
                break

    # Step time ratio.
    comparison: Dict[str, Any] = {}
    d, x = results.get("time_default", {}).get("metrics", {}), results.get("time_xlog", {}).get("metrics", {})
    if "mean_step_ms" in d and "mean_step_ms" in x:
        comparison = {
            "default_mean_step_ms": d["mean_step_ms"],
            "xlog_mean_step_ms": x["mean_step_ms"],
            "default_median_step_ms": d["median_step_ms"],
            "xlog_median_step_ms": x["median_step_ms"],
            "ratio_mean": x["mean_step_ms"] / d["mean_step_ms"],
            "ratio_median": x["median_step_ms"] / d["median_step_ms"],
        }
        limit = os.environ.get("XLOG_FRAMEWORKS_MAX_RATIO")
        if limit:
            ok = comparison["ratio_mean"] <= float(limit)
            results["time_xlog"]["checks"].append(
                {"name": f"step time ratio <= {limit}", "status": "ok" if ok else "FAIL", "detail": f"{comparison['ratio_mean']:.3f}"}
            )

    # Summary.
    lines: List[str] = []
    failed = 0
    lines.append(f"{'SCENARIO':<13} {'STATUS':<6} {'CHECK':<58} DETAIL")
    for name in only:
        res = results[name]
        for c in res["checks"]:
            if c["status"] == "FAIL":
                failed += 1
            detail = c["detail"].replace("\n", " ")
            lines.append(f"{name:<13} {c['status']:<6} {c['name'][:58]:<58} {detail[:160]}")
    lines.append("")
    cost = results.get("enable_cost", {}).get("metrics", {})
    if "enable_second_s" in cost:
        lines.append(
            f"xlog_cuda.torch.enable(): first process {cost['enable_first_s']:.3f} s (builds the OOM shim), "
            f"second process {cost['enable_second_s']:.3f} s (cached shim; target <= {ENABLE_TARGET_S} s)"
        )
        lines.append("")
    if comparison:
        lines.append("step time (MLP 256-1024-1024-10, batch 512, Adam; loss.item() each step):")
        lines.append(f"  {'allocator':<18} {'mean ms':>9} {'median ms':>10}")
        lines.append(f"  {'pytorch caching':<18} {comparison['default_mean_step_ms']:>9.3f} {comparison['default_median_step_ms']:>10.3f}")
        lines.append(f"  {'xlog hooks':<18} {comparison['xlog_mean_step_ms']:>9.3f} {comparison['xlog_median_step_ms']:>10.3f}")
        lines.append(f"  ratio xlog/default: mean {comparison['ratio_mean']:.3f}, median {comparison['ratio_median']:.3f}")
    total = time.monotonic() - started
    lines.append("")
    lines.append(
        f"gpu-frameworks: {'ALL PASSED' if failed == 0 else f'{failed} CHECK(S) FAILED'} "
        f"in {total:.0f} s (per scenario: " + ", ".join(f"{n} {results[n]['seconds']} s" for n in only) + ")"
    )
    summary = "\n".join(lines)
    print("\n" + summary, flush=True)
    with open(os.path.join(out_dir, "summary.txt"), "w") as f:
        f.write(summary + "\n")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"scenarios": results, "step_time": comparison, "failed_checks": failed, "seconds": total}, f, indent=2)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "status", "check", "detail"])
        for name in only:
            for c in results[name]["checks"]:
                w.writerow([name, c["status"], c["name"], c["detail"]])
        for key, value in comparison.items():
            w.writerow(["step_time", "metric", key, f"{value:.6g}"])
    return 0 if failed == 0 else 1


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") and os.path.join(os.environ["OUT"], "gpu-frameworks"))
    ap.add_argument("--only", default=",".join(ORDER), help="comma-separated scenarios (default: all)")
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.scenario:
        return run_scenario(args.scenario, args.result, args.workdir)
    only = [s for s in args.only.split(",") if s]
    unknown = [s for s in only if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; choose from {ORDER}")
    out_dir = args.out or os.path.join(os.getcwd(), "build-gpu", "gpu-frameworks")
    return drive(out_dir, only)


if __name__ == "__main__":
    sys.exit(main())
