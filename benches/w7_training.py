#!/usr/bin/env python3
"""benches/w7_training.py — W7 (real training under three allocators) and
W8 (budget-tight training under xlog), issue 12.

W7: each model trains under PyTorch's caching allocator ("caching"),
PyTorch's cudaMallocAsync backend ("async", PYTORCH_ALLOC_CONF /
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync set before torch is
imported) and xlog through xlog_cuda.torch.enable() ("xlog"), every run in
a fresh subprocess of its own. Models (random weights, built from their
configs; no download):

  resnet50  torchvision ResNet-50, batch 64 x 3 x 224 x 224, SGD, bf16 autocast
  gpt2      transformers GPT-2 small (GPT2Config()), batch 8 x seq 512, AdamW,
            bf16 autocast
  gpt2_dyn  the same GPT-2 with a new sequence length each step, drawn
            uniformly from [64, 1024] with a fixed seed (the same lengths
            under every allocator)

Per run: warm-up steps, then timed steps, each bracketed by
torch.cuda.synchronize(); the median step time; the device memory peak from
NVML (pynvml.nvmlDeviceGetMemoryInfo(handle).used, sampled by a thread
about every millisecond, minus the process's baseline taken after CUDA
initialisation and before the model is built); for xlog also the hook
runtime's peak_outstanding_bytes and the largest reserved_bytes seen after
a step.

W8: GPT-2 (fixed shape) under xlog with XLOG_BUDGET_BYTES = 1.1 x xlog's own
unconstrained NVML device peak from W7: steps completed, refusals
(failed_allocations), median step time against the unconstrained run,
device peak against the budget.

Output (--out DIR): results.json (every run, the aggregates, the targets)
and results.md (the tables), with the device, date and versions. A run that
fails or times out is a row with its error, never the end of the whole
benchmark. Exit status 0 when it ran (whatever the numbers say), 2 on bad
arguments.

    XLOG_CUDA_LIBRARY=/path/libxlog_cuda.so python3 benches/w7_training.py --out OUT
        [--models resnet50,gpt2,gpt2_dyn] [--allocators caching,async,xlog]
        [--steps 30] [--warmup 5] [--repeat 1] [--no-w8] [--timeout 240]

    python3 benches/w7_training.py --self-test    # the pure-Python parts, no GPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1 << 30
MiB = 1 << 20

MODELS = ["resnet50", "gpt2", "gpt2_dyn"]
ALLOCATORS = ["caching", "async", "xlog"]
ALLOCATOR_NAMES = {
    "caching": "PyTorch caching",
    "async": "PyTorch cudaMallocAsync",
    "xlog": "xlog (enable())",
}
W8_MODEL = "gpt2"
W8_FACTOR_NUM, W8_FACTOR_DEN = 11, 10  # 1.1 x

RESNET_BATCH, RESNET_IMAGE = 64, 224
GPT2_BATCH, GPT2_SEQ = 8, 512
DYN_MIN_SEQ, DYN_MAX_SEQ, DYN_SEED = 64, 1024, 1234
SAMPLE_INTERVAL_S = 0.001

# Targets of issue 12 for W7/W8.
STEP_TIME_VS_CACHING = 1.00
DYN_PEAK_VS_CACHING = 0.75
OUTSTANDING_VS_DEVICE_PEAK = 1.10
W8_STEP_TIME_VS_UNCONSTRAINED = 1.05


# ---------------------------------------------------------------------------
# Pure helpers (no torch, no GPU): aggregation, budget, tables
# ---------------------------------------------------------------------------


def median(values: Iterable[float]) -> Optional[float]:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def w8_budget(device_peak_bytes: int) -> int:
    """XLOG_BUDGET_BYTES for W8: 1.1 x the unconstrained device peak,
    rounded up to a whole byte (integer arithmetic, no float rounding)."""
    if not isinstance(device_peak_bytes, int) or device_peak_bytes <= 0:
        raise ValueError(f"device peak must be a positive number of bytes, got {device_peak_bytes!r}")
    return -(-device_peak_bytes * W8_FACTOR_NUM // W8_FACTOR_DEN)


def dyn_seq_lens(n: int, seed: int = DYN_SEED, low: int = DYN_MIN_SEQ, high: int = DYN_MAX_SEQ) -> List[int]:
    """The sequence lengths of the dynamic-shape run: uniform in [low, high]
    from a seeded generator, the same list in every process."""
    import random

    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


def aggregate(runs: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """W7 runs -> {model: {allocator: summary}}. Over the repeats of one
    (model, allocator): the median of the per-run median step times, the
    median device peak (and the largest), xlog's largest peak outstanding
    and reserved bytes, the total refusals, and the errors of failed runs."""
    groups: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for run in runs:
        if run.get("mode", "w7") != "w7":
            continue
        groups.setdefault((run["model"], run["allocator"]), []).append(run)
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for (model, allocator), group in groups.items():
        ok = [r for r in group if r.get("ok")]
        errors = [r.get("error") or "failed" for r in group if not r.get("ok")]
        summary: Dict[str, Any] = {
            "runs": len(group),
            "ok_runs": len(ok),
            "errors": errors,
            "median_step_ms": median(r.get("median_step_ms") for r in ok),
            "step_ms_per_run": [r.get("median_step_ms") for r in ok],
            "device_peak_bytes": median(r.get("device_peak_bytes") for r in ok),
            "device_peak_bytes_max": max((r["device_peak_bytes"] for r in ok if r.get("device_peak_bytes") is not None), default=None),
            "failed_steps": sum(r.get("failed_steps", 0) for r in ok),
        }
        xlog = [r["xlog"] for r in ok if r.get("xlog")]
        if xlog:
            summary["peak_outstanding_bytes"] = max(x.get("peak_outstanding_bytes", 0) for x in xlog)
            summary["reserved_bytes_max"] = max(x.get("reserved_bytes_max", 0) for x in xlog)
            summary["failed_allocations"] = sum(x.get("failed_allocations", 0) for x in xlog)
            summary["cache_hits"] = sum(x.get("cache_hits", 0) for x in xlog)
            summary["cache_misses"] = sum(x.get("cache_misses", 0) for x in xlog)
            peak = summary["device_peak_bytes"]
            summary["outstanding_vs_device_peak"] = ratio(summary["peak_outstanding_bytes"], peak)
        out.setdefault(model, {})[allocator] = summary
    for model, by_alloc in out.items():
        base = by_alloc.get("caching", {})
        asyn = by_alloc.get("async", {})
        for summary in by_alloc.values():
            summary["step_vs_caching"] = ratio(summary.get("median_step_ms"), base.get("median_step_ms"))
            summary["peak_vs_caching"] = ratio(summary.get("device_peak_bytes"), base.get("device_peak_bytes"))
            summary["peak_vs_async"] = ratio(summary.get("device_peak_bytes"), asyn.get("device_peak_bytes"))
    return out


def summarize_w8(runs: Sequence[Dict[str, Any]], w7: Dict[str, Dict[str, Dict[str, Any]]]) -> Optional[Dict[str, Any]]:
    """W8 runs (repeats) against the unconstrained xlog run of the same model."""
    w8 = [r for r in runs if r.get("mode") == "w8"]
    if not w8:
        return None
    ok = [r for r in w8 if r.get("ok")]
    unconstrained = w7.get(W8_MODEL, {}).get("xlog", {})
    step = median(r.get("median_step_ms") for r in ok)
    budget = w8[0].get("budget_bytes")
    peak = median(r.get("device_peak_bytes") for r in ok)
    return {
        "model": W8_MODEL,
        "runs": len(w8),
        "ok_runs": len(ok),
        "errors": [r.get("error") or "failed" for r in w8 if not r.get("ok")],
        "budget_bytes": budget,
        "unconstrained_device_peak_bytes": w8[0].get("unconstrained_device_peak_bytes"),
        "steps_attempted": sum(r.get("steps_attempted", 0) for r in ok),
        "steps_completed": sum(r.get("steps_completed", 0) for r in ok),
        "refusals": sum((r.get("xlog") or {}).get("failed_allocations", 0) for r in ok),
        "failed_steps": sum(r.get("failed_steps", 0) for r in ok),
        "median_step_ms": step,
        "unconstrained_median_step_ms": unconstrained.get("median_step_ms"),
        "step_vs_unconstrained": ratio(step, unconstrained.get("median_step_ms")),
        "device_peak_bytes": peak,
        "peak_within_budget": None if peak is None or budget is None else peak <= budget,
    }


def evaluate_targets(w7: Dict[str, Dict[str, Dict[str, Any]]], w8: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The issue's W7/W8 targets: [{target, measured, limit, met}], met None
    when a number is missing."""
    rows: List[Dict[str, Any]] = []

    def add(target: str, measured: Optional[float], limit: float, fmt: str = "{:.3f}") -> None:
        rows.append(
            {
                "target": target,
                "measured": None if measured is None else fmt.format(measured),
                "limit": fmt.format(limit) if isinstance(limit, float) else str(limit),
                "met": None if measured is None else measured <= limit,
            }
        )

    for model in MODELS:
        x = w7.get(model, {}).get("xlog")
        if x is None:
            continue
        add(f"W7 {model}: xlog step time / caching", x.get("step_vs_caching"), STEP_TIME_VS_CACHING)
        add(f"W7 {model}: xlog device peak / cudaMallocAsync's", x.get("peak_vs_async"), 1.0)
        if model == "gpt2_dyn":
            add(f"W7 {model}: xlog device peak / caching's", x.get("peak_vs_caching"), DYN_PEAK_VS_CACHING)
        add(f"W7 {model}: xlog peak outstanding / its device peak", x.get("outstanding_vs_device_peak"), OUTSTANDING_VS_DEVICE_PEAK)
    if w8 is not None:
        add("W8: refusals", None if not w8["ok_runs"] else float(w8["refusals"]), 0.0, "{:.0f}")
        add("W8: step time / unconstrained", w8.get("step_vs_unconstrained"), W8_STEP_TIME_VS_UNCONSTRAINED)
        peak, budget = w8.get("device_peak_bytes"), w8.get("budget_bytes")
        add("W8: device peak / budget", ratio(peak, budget), 1.0)
    return rows


def fmt_gib(n: Optional[float]) -> str:
    return "—" if n is None else f"{n / GiB:.2f}"


def fmt_num(x: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "—" if x is None else f"{x:.{digits}f}{suffix}"


def one_line(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_markdown(report: Dict[str, Any]) -> str:
    meta = report.get("meta", {})
    w7 = report.get("w7", {})
    w8 = report.get("w8")
    lines = [
        "# W7 / W8: real training under three allocators",
        "",
        f"- device: {meta.get('device', '?')} (driver {meta.get('driver', '?')})",
        f"- date: {meta.get('date', '?')}",
        f"- torch {meta.get('torch', '?')}, torchvision {meta.get('torchvision', '?')}, "
        f"transformers {meta.get('transformers', '?')}, Python {meta.get('python', '?')}",
        f"- library: {meta.get('library', '?')}",
        f"- steps: {meta.get('warmup', '?')} warm-up + {meta.get('steps', '?')} timed per run, "
        f"{meta.get('repeat', '?')} repeat(s); medians; device peak = NVML used (sampled ~1 ms) minus "
        "the process's baseline after CUDA init",
        "",
        "## W7",
        "",
        "| model | allocator | median step ms | vs caching | device peak GiB | vs caching | vs cudaMallocAsync "
        "| xlog peak outstanding GiB | outstanding / device peak | xlog reserved GiB (max) | refusals | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for model in MODELS:
        for allocator in ALLOCATORS:
            s = w7.get(model, {}).get(allocator)
            if s is None:
                continue
            notes = []
            if s["errors"]:
                notes.append(f"{len(s['errors'])} of {s['runs']} run(s) failed: " + one_line(s["errors"][0]))
            if s.get("failed_steps"):
                notes.append(f"{s['failed_steps']} step(s) failed")
            is_xlog = allocator == "xlog"
            lines.append(
                "| "
                + " | ".join(
                    [
                        model,
                        ALLOCATOR_NAMES[allocator],
                        fmt_num(s.get("median_step_ms")),
                        fmt_num(s.get("step_vs_caching"), 3),
                        fmt_gib(s.get("device_peak_bytes")),
                        fmt_num(s.get("peak_vs_caching"), 3),
                        fmt_num(s.get("peak_vs_async"), 3),
                        fmt_gib(s.get("peak_outstanding_bytes")) if is_xlog else "",
                        fmt_num(s.get("outstanding_vs_device_peak"), 3) if is_xlog else "",
                        fmt_gib(s.get("reserved_bytes_max")) if is_xlog else "",
                        str(s.get("failed_allocations", "")) if is_xlog else "",
                        "; ".join(notes),
                    ]
                )
                + " |"
            )
    lines.append("")
    lines.append("## W8: GPT-2 with XLOG_BUDGET_BYTES = 1.1 x xlog's unconstrained device peak")
    lines.append("")
    if w8 is None:
        lines.append(report.get("w8_skipped") or "not run")
    else:
        lines += [
            "| budget GiB | steps completed | refusals | median step ms | unconstrained ms | vs unconstrained "
            "| device peak GiB | peak <= budget | notes |",
            "|---:|---:|---:|---:|---:|---:|---:|---|---|",
            "| "
            + " | ".join(
                [
                    fmt_gib(w8.get("budget_bytes")),
                    f"{w8['steps_completed']} of {w8['steps_attempted']}",
                    str(w8["refusals"]),
                    fmt_num(w8.get("median_step_ms")),
                    fmt_num(w8.get("unconstrained_median_step_ms")),
                    fmt_num(w8.get("step_vs_unconstrained"), 3),
                    fmt_gib(w8.get("device_peak_bytes")),
                    {True: "yes", False: "NO", None: "—"}[w8.get("peak_within_budget")],
                    "; ".join(one_line(e) for e in w8["errors"][:1]),
                ]
            )
            + " |",
        ]
    lines += ["", "## Targets", "", "| target | measured | limit | met |", "|---|---:|---:|---|"]
    for t in report.get("targets", []):
        met = {True: "yes", False: "**no**", None: "— (no number)"}[t["met"]]
        lines.append(f"| {t['target']} | {t['measured'] or '—'} | {t['limit']} | {met} |")
    lines.append("")
    lines.append(f"Total {report.get('seconds', 0):.0f} s.")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# The child: one model under one allocator (runs with the GPU)
# ---------------------------------------------------------------------------


class NvmlPeak:
    """Device memory in use (NVML, device-wide), sampled by a thread."""

    def __init__(self, torch, interval_s: float = SAMPLE_INTERVAL_S):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self.handle = self._handle_of_current_device(torch)
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _handle_of_current_device(self, torch):
        nv = self._nvml
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        try:
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            return nv.nvmlDeviceGetHandleByPciBusId(bus)
        except Exception:  # noqa: BLE001 - older torch without PCI fields, or another format
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            index = int(visible) if visible.isdigit() else 0
            return nv.nvmlDeviceGetHandleByIndex(index)

    def used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def name(self) -> str:
        n = self._nvml.nvmlDeviceGetName(self.handle)
        return n.decode() if isinstance(n, bytes) else str(n)

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self.used()
            self.samples += 1
            if value > self.peak:
                self.peak = value
            time.sleep(self.interval_s)

    def start(self) -> None:
        self.peak = self.used()
        self._thread = threading.Thread(target=self._run, name="nvml-peak", daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, self.used())
        return self.peak


def build_workload(torch, model_name: str, seq_lens: List[int]):
    """(model, optimizer, step(i) -> loss tensor, versions)."""
    F = torch.nn.functional
    versions: Dict[str, str] = {}
    if model_name == "resnet50":
        import torchvision

        versions["torchvision"] = torchvision.__version__
        model = torchvision.models.resnet50(weights=None).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(RESNET_BATCH, 3, RESNET_IMAGE, RESNET_IMAGE, device="cuda")
        y = torch.randint(0, 1000, (RESNET_BATCH,), device="cuda")

        def step(i: int):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return model, opt, step, versions
    if model_name in ("gpt2", "gpt2_dyn"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel

        versions["transformers"] = transformers.__version__
        config = GPT2Config()
        config.use_cache = False
        model = GPT2LMHeadModel(config).cuda()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        vocab = config.vocab_size
        gen = torch.Generator(device="cuda").manual_seed(0)

        def step(i: int):
            seq = seq_lens[i] if model_name == "gpt2_dyn" else GPT2_SEQ
            ids = torch.randint(0, vocab, (GPT2_BATCH, seq), device="cuda", generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return model, opt, step, versions
    raise ValueError(f"unknown model {model_name!r}")


def run_child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """One model under one allocator; returns the result dict (ok or not)."""
    started = time.perf_counter()
    res: Dict[str, Any] = {k: spec[k] for k in ("model", "allocator", "mode", "repeat")}
    res.update(ok=False, error=None, pid=os.getpid())
    xt = None
    try:
        if spec["allocator"] == "xlog":
            import torch  # noqa: F401  (imported first: enable() is timed without it)
            import xlog_cuda.torch as xt  # noqa: F811

            t0 = time.perf_counter()
            xt.enable(backend="cuda")  # budget from XLOG_BUDGET_BYTES (W8) or none
            res["enable_s"] = time.perf_counter() - t0
            info = xt.enable_info()
            res["shim_origin"] = info.get("shim_origin")
            res["shim"] = info.get("shim") or info.get("shim_problem")
        import torch

        res["torch"] = torch.__version__
        torch.manual_seed(0)
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        try:
            res["allocator_backend"] = torch.cuda.memory.get_allocator_backend()
        except Exception as e:  # noqa: BLE001
            res["allocator_backend"] = f"? ({type(e).__name__})"
        expected_backend = {"caching": "native", "async": "cudaMallocAsync"}.get(spec["allocator"])
        if expected_backend and res["allocator_backend"] != expected_backend:
            raise RuntimeError(f"allocator backend is {res['allocator_backend']!r}, expected {expected_backend!r}")
        nvml = NvmlPeak(torch)
        res["device"] = nvml.name()
        baseline = nvml.used()
        res["baseline_bytes"] = baseline

        warmup, steps = spec["warmup"], spec["steps"]
        seq_lens = dyn_seq_lens(warmup + steps)
        nvml.start()
        model, opt, step, versions = build_workload(torch, spec["model"], seq_lens)
        res.update(versions)
        oom_types: Tuple[type, ...] = tuple(
            t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t
        )
        times: List[float] = []
        losses: List[float] = []
        failed, first_error = 0, None
        reserved_max = 0
        for i in range(warmup + steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                loss = step(i)
                torch.cuda.synchronize()
            except oom_types as e:
                if spec["mode"] != "w8":
                    raise
                failed += 1
                first_error = first_error or f"step {i}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                opt.zero_grad(set_to_none=True)
                loss = None
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            if loss is not None:
                if i >= warmup:
                    times.append(elapsed)
                if i == 0 or i == warmup + steps - 1:
                    losses.append(float(loss))
            if xt is not None:
                reserved_max = max(reserved_max, xt.stats(0).reserved_bytes)
        peak = nvml.stop()
        res.update(
            steps_attempted=warmup + steps,
            steps_completed=warmup + steps - failed,
            failed_steps=failed,
            first_error=first_error,
            warmup=warmup,
            timed_steps=len(times),
            step_ms=[1e3 * t for t in times],
            median_step_ms=1e3 * statistics.median(times) if times else None,
            peak_used_bytes=peak,
            device_peak_bytes=peak - baseline,
            nvml_samples=nvml.samples,
            losses=losses,
        )
        if spec["model"] == "gpt2_dyn":
            res["seq_lens"] = seq_lens
        try:
            res["torch_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
            res["torch_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        except Exception:  # noqa: BLE001 - the pluggable allocator has no such stats
            pass
        if xt is not None:
            st = xt.stats(0)
            x = {k: getattr(st, k) for k in st.__dataclass_fields__}
            x["reserved_bytes_max"] = max(reserved_max, st.reserved_bytes)
            res["xlog"] = x
        if spec["mode"] == "w8":
            res["budget_bytes"] = spec.get("budget_bytes")
            res["unconstrained_device_peak_bytes"] = spec.get("unconstrained_device_peak_bytes")
        res["ok"] = len(times) > 0
        if not times:
            res["error"] = first_error or "no step completed"
    except BaseException as e:  # noqa: BLE001 - reported in the table
        res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        res["traceback"] = traceback.format_exc()[-4000:]
    res["wall_s"] = time.perf_counter() - started
    return res


# ---------------------------------------------------------------------------
# The driver (no CUDA context of its own: NVML readings are device-wide)
# ---------------------------------------------------------------------------


def child_env(allocator: str, budget: Optional[int] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLOG_") or k in ("XLOG_CUDA_LIBRARY", "XLOG_CUDA_CACHE_DIR")}
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        env.pop(name, None)
    if allocator == "async":
        env["PYTORCH_ALLOC_CONF"] = "backend:cudaMallocAsync"
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    if allocator == "xlog":
        env["XLOG_BACKEND"] = "cuda"
        if budget is not None:
            env["XLOG_BUDGET_BYTES"] = str(budget)
    python_dir = os.path.join(REPO, "python")
    env["PYTHONPATH"] = python_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    nvidia = "/usr/local/nvidia/lib64"
    if os.path.isdir(nvidia) and nvidia not in env.get("LD_LIBRARY_PATH", "").split(":"):
        env["LD_LIBRARY_PATH"] = nvidia + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def spawn(spec: Dict[str, Any], env: Dict[str, str], out_dir: str, timeout: float) -> Dict[str, Any]:
    tag = f"{spec['mode']}-{spec['model']}-{spec['allocator']}-r{spec['repeat']}"
    result_path = os.path.join(out_dir, "runs", tag + ".json")
    log_path = os.path.join(out_dir, "runs", tag + ".log")
    os.makedirs(os.path.dirname(result_path), exist_ok=True)
    if os.path.exists(result_path):
        os.remove(result_path)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec), "--result", result_path]
    t0 = time.monotonic()
    rc: Optional[int]
    try:
        with open(log_path, "w") as log:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = None
    elapsed = time.monotonic() - t0
    try:
        with open(result_path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {k: spec[k] for k in ("model", "allocator", "mode", "repeat")}
        res["ok"] = False
        tail = [l.strip() for l in open(log_path, errors="replace").read().splitlines() if l.strip()][-1:]
        if rc is None:
            res["error"] = f"timed out after {timeout:.0f} s"
        else:
            res["error"] = f"exit {rc}" + (f": {tail[0][:300]}" if tail else "")
    res["process_s"] = elapsed
    res["log"] = log_path
    status = f"{res['median_step_ms']:.2f} ms/step, peak {fmt_gib(res.get('device_peak_bytes'))} GiB" if res.get("ok") else f"ERROR {res.get('error')}"
    print(f"w7: {tag}: {status} ({elapsed:.0f} s)", flush=True)
    return res


def driver_meta(args) -> Dict[str, Any]:
    meta: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "host": platform.node(),
        "library": os.environ.get("XLOG_CUDA_LIBRARY", "(build trees of this checkout)"),
        "steps": args.steps,
        "warmup": args.warmup,
        "repeat": args.repeat,
    }
    try:  # NVML only: the driver must not hold a CUDA context
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        meta["device"] = name.decode() if isinstance(name, bytes) else str(name)
        drv = pynvml.nvmlSystemGetDriverVersion()
        meta["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
        meta["device_total_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
    except Exception as e:  # noqa: BLE001
        meta["device"] = f"? (NVML: {type(e).__name__}: {e})"
    return meta


def drive(args) -> int:
    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    meta = driver_meta(args)
    print(f"w7: {meta.get('device')} — models {args.models}, allocators {args.allocators}, "
          f"{args.warmup}+{args.steps} steps, repeat {args.repeat}; output in {out_dir}", flush=True)
    runs: List[Dict[str, Any]] = []
    for r in range(args.repeat):
        for model in args.models:
            for allocator in args.allocators:
                spec = {"model": model, "allocator": allocator, "mode": "w7", "repeat": r,
                        "steps": args.steps, "warmup": args.warmup}
                runs.append(spawn(spec, child_env(allocator), out_dir, args.timeout))
    w7 = aggregate(runs)

    w8_skipped = None
    if args.w8:
        base = w7.get(W8_MODEL, {}).get("xlog", {})
        peak = base.get("device_peak_bytes")
        if "xlog" not in args.allocators or W8_MODEL not in args.models:
            w8_skipped = f"skipped: W8 needs the W7 run of {W8_MODEL} under xlog (--models/--allocators)"
        elif not peak or peak <= 0:
            w8_skipped = f"skipped: the unconstrained {W8_MODEL}/xlog run has no device peak ({'; '.join(base.get('errors', [])) or 'no number'})"
        else:
            budget = w8_budget(int(peak))
            for r in range(args.repeat):
                spec = {"model": W8_MODEL, "allocator": "xlog", "mode": "w8", "repeat": r, "steps": args.steps,
                        "warmup": args.warmup, "budget_bytes": budget, "unconstrained_device_peak_bytes": int(peak)}
                runs.append(spawn(spec, child_env("xlog", budget), out_dir, args.timeout))
    else:
        w8_skipped = "not run (--no-w8)"
    w8 = summarize_w8(runs, w7)

    for run in runs:  # versions as the children saw them
        for key in ("torch", "torchvision", "transformers"):
            if run.get(key) and key not in meta:
                meta[key] = run[key]
    report = {
        "meta": meta,
        "w7": w7,
        "w8": w8,
        "w8_skipped": w8_skipped,
        "targets": evaluate_targets(w7, w8),
        "runs": runs,
        "seconds": time.monotonic() - started,
    }
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    text = format_markdown(report)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    print("\n" + text, flush=True)
    return 0


# ---------------------------------------------------------------------------
# Self-test of the pure parts (no GPU, no torch)
# ---------------------------------------------------------------------------


def synthetic_runs() -> List[Dict[str, Any]]:
    """Runs shaped like real child results, with known numbers."""
    runs = []
    table = {  # model: {allocator: (median ms per repeat, device peak GiB per repeat)}
        "resnet50": {"caching": ([33.0, 34.0], [3.6, 3.6]), "async": ([35.0, 36.0], [3.4, 3.5]), "xlog": ([32.0, 33.0], [3.3, 3.3])},
        "gpt2": {"caching": ([45.0, 47.0], [8.2, 8.2]), "async": ([48.0, 50.0], [8.0, 8.0]), "xlog": ([46.0, 48.0], [8.1, 8.1])},
        "gpt2_dyn": {"caching": ([30.0, 31.0], [21.0, 21.0]), "async": ([33.0, 34.0], [14.6, 14.6]), "xlog": ([30.0, 30.0], [14.0, 15.0])},
    }
    for model, by_alloc in table.items():
        for allocator, (steps, peaks) in by_alloc.items():
            for r, (ms, gib) in enumerate(zip(steps, peaks)):
                run = {"model": model, "allocator": allocator, "mode": "w7", "repeat": r, "ok": True,
                       "median_step_ms": ms, "device_peak_bytes": int(gib * GiB), "failed_steps": 0}
                if allocator == "xlog":
                    run["xlog"] = {"peak_outstanding_bytes": int(gib * 1.05 * GiB), "reserved_bytes_max": int(gib * GiB),
                                   "failed_allocations": 0, "cache_hits": 100, "cache_misses": 10}
                runs.append(run)
    runs.append({"model": "resnet50", "allocator": "async", "mode": "w7", "repeat": 2, "ok": False,
                 "error": "timed out after 240 s"})
    return runs


def self_test() -> int:
    runs = synthetic_runs()
    w7 = aggregate(runs)
    rn, g, d = w7["resnet50"], w7["gpt2"], w7["gpt2_dyn"]
    assert rn["caching"]["median_step_ms"] == 33.5 and rn["xlog"]["median_step_ms"] == 32.5
    assert abs(rn["xlog"]["step_vs_caching"] - 32.5 / 33.5) < 1e-12
    assert rn["async"]["runs"] == 3 and rn["async"]["ok_runs"] == 2 and rn["async"]["errors"] == ["timed out after 240 s"]
    assert d["xlog"]["device_peak_bytes"] == (int(14.0 * GiB) + int(15.0 * GiB)) / 2
    assert d["xlog"]["device_peak_bytes_max"] == int(15.0 * GiB)
    assert abs(d["xlog"]["peak_vs_caching"] - 14.5 / 21.0) < 1e-6
    assert abs(g["xlog"]["outstanding_vs_device_peak"] - 1.05) < 1e-6
    assert w8_budget(10) == 11 and w8_budget(100) == 110 and w8_budget(101) == 112  # 111.1 rounds up
    assert w8_budget(8 * GiB) == 8 * GiB + (8 * GiB * 1 + 9) // 10
    for bad in (0, -5, 1.5, None):
        try:
            w8_budget(bad)  # type: ignore[arg-type]
        except ValueError:
            pass
        else:
            raise AssertionError(f"w8_budget({bad!r}) did not raise")
    lens = dyn_seq_lens(200)
    assert lens == dyn_seq_lens(200) and min(lens) >= DYN_MIN_SEQ and max(lens) <= DYN_MAX_SEQ and len(set(lens)) > 50
    assert dyn_seq_lens(5) == lens[:5]

    budget = w8_budget(int(8.1 * GiB))
    w8_runs = [{"model": "gpt2", "allocator": "xlog", "mode": "w8", "repeat": 0, "ok": True, "median_step_ms": 48.0,
                "device_peak_bytes": int(8.2 * GiB), "budget_bytes": budget, "steps_attempted": 35, "steps_completed": 35,
                "failed_steps": 0, "unconstrained_device_peak_bytes": int(8.1 * GiB), "xlog": {"failed_allocations": 0}}]
    w8 = summarize_w8(runs + w8_runs, w7)
    assert w8 is not None and w8["refusals"] == 0 and w8["steps_completed"] == 35 and w8["peak_within_budget"] is True
    assert abs(w8["step_vs_unconstrained"] - 48.0 / 47.0) < 1e-12
    targets = {t["target"]: t for t in evaluate_targets(w7, w8)}
    assert targets["W7 resnet50: xlog step time / caching"]["met"] is True
    assert targets["W7 gpt2: xlog step time / caching"]["met"] is False  # 47 vs 46
    assert targets["W7 gpt2_dyn: xlog device peak / caching's"]["met"] is True
    assert targets["W8: refusals"]["met"] is True and targets["W8: step time / unconstrained"]["met"] is True
    no_numbers = evaluate_targets({"gpt2": {"xlog": {"step_vs_caching": None}}}, None)
    assert no_numbers[0]["met"] is None and no_numbers[0]["measured"] is None

    report = {"meta": {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-24", "torch": "2.11.0+cu130"},
              "w7": w7, "w8": w8, "targets": evaluate_targets(w7, w8), "seconds": 321.0}
    text = format_markdown(report)
    assert "NVIDIA H100 80GB HBM3" in text and "torch 2.11.0+cu130" in text
    assert "| resnet50 | PyTorch cudaMallocAsync | 35.50 |" in text
    assert "1 of 3 run(s) failed: timed out after 240 s" in text
    assert "| 35 of 35 | 0 |" in text and "Total 321 s." in text
    header = [l for l in text.splitlines() if l.startswith("| model | allocator")][0]
    widths = {len(l.split("|")) for l in text.splitlines() if l.startswith("| resnet50") or l.startswith("| gpt2")}
    assert widths == {len(header.split("|"))}, "every W7 row has the header's columns"
    text = format_markdown({"meta": {}, "w7": {}, "w8": None, "w8_skipped": "not run (--no-w8)", "targets": []})
    assert "not run (--no-w8)" in text

    env = child_env("async")
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert "XLOG_BACKEND" not in env
    env = child_env("xlog", budget=12345)
    assert env["XLOG_BUDGET_BYTES"] == "12345" and env["XLOG_BACKEND"] == "cuda"
    assert "PYTORCH_ALLOC_CONF" not in env and env["PYTHONPATH"].split(os.pathsep)[0] == os.path.join(REPO, "python")
    print("w7_training self-test: ok")
    return 0


# ---------------------------------------------------------------------------


def parse_args(argv: Optional[List[str]] = None):
    ap = argparse.ArgumentParser(description="W7/W8: real training under PyTorch's allocators and xlog")
    ap.add_argument("--out", help="output directory (results.json, results.md, runs/)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {MODELS}")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS), help=f"comma-separated, from {ALLOCATORS}")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up steps per run (default 5)")
    ap.add_argument("--repeat", type=int, default=1, help="repeats of every run (default 1)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per run before it is killed (default 240)")
    ap.add_argument("--no-w8", dest="w8", action="store_false", help="skip W8")
    ap.add_argument("--self-test", action="store_true", help="check the pure-Python parts and exit (no GPU)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child or args.self_test:
        return args
    args.models = [m for m in args.models.split(",") if m]
    args.allocators = [a for a in args.allocators.split(",") if a]
    bad = [m for m in args.models if m not in MODELS] + [a for a in args.allocators if a not in ALLOCATORS]
    if bad:
        ap.error(f"unknown model(s)/allocator(s) {bad}; models {MODELS}, allocators {ALLOCATORS}")
    if args.steps < 1 or args.warmup < 0 or args.repeat < 1 or args.timeout <= 0:
        ap.error("--steps and --repeat must be >= 1, --warmup >= 0, --timeout > 0")
    if not args.out:
        ap.error("--out DIR is required")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.self_test:
        return self_test()
    if args.child:
        res = run_child(json.loads(args.child))
        with open(args.result, "w") as f:
            json.dump(res, f, indent=2, default=str)
        if not res.get("ok"):
            print(res.get("traceback") or res.get("error"), file=sys.stderr)
        return 0 if res.get("ok") else 1
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
