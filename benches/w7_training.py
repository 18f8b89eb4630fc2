#!/usr/bin/env python3
"""benches/w7_training.py — W7 (real training and generation under PyTorch's
three allocators and xlog's two memory mechanisms) and W8 (the same
changing-shape models under a budget), issues 12 and 24.

W7: each model runs under every allocator, each run in a fresh subprocess
of its own, with the allocator chosen in its environment before torch is
imported:

  caching     PyTorch's caching allocator (no PYTORCH_*ALLOC_CONF)
  async       PyTorch's cudaMallocAsync backend (backend:cudaMallocAsync)
  expandable  PyTorch's caching allocator with expandable_segments:True
  xlog        xlog through xlog_cuda.torch.enable(), the library's default
              memory mechanism (the VMM arena, XLOG_MEMORY=arena)
  xlog_pool   the same with XLOG_MEMORY=pool (the driver pool as the arena)

Models (random weights, built from their configs; no download):

  resnet50  torchvision ResNet-50, batch 64 x 3 x 224 x 224, SGD, bf16 autocast
  gpt2      transformers GPT-2 small (GPT2Config()), batch 8 x seq 512, AdamW,
            bf16 autocast
  gpt2_dyn  the same GPT-2 with a new sequence length each step, uniform in
            [64, 1024]
  mlm_dyn   BERT-base masked LM (BertForMaskedLM(BertConfig())), batch 16, a
            new length each step uniform in [32, 512], 15% of the tokens
            masked (labels -100 elsewhere), AdamW, bf16 autocast
  gen_kv    GPT-2 small in bf16 generating under torch.no_grad: each step a
            new prompt (batch uniform in [1, 16], length in [16, 256]), then
            64..256 new tokens one at a time with past_key_values (a KV cache
            that grows every token); the step time is the whole generation.
            Steps: --gen-kv-steps / --gen-kv-warmup (it is the slow one)

More models with changing shapes, run only when named in --models (they
are not in the default set):

  cnn_dyn   torchvision EfficientNet-B0, each step a new batch (uniform in
            [16, 128]) and image side (128..320 in steps of 32), SGD, bf16
            autocast: convolution workspaces of every size
  t5_dyn    transformers T5 (T5Config(), t5-small's shape) sequence to
            sequence, batch 16, source length uniform in [32, 512] and
            target length in [8, 256] each step, AdamW, bf16 autocast
  llama_gen a Llama-style decoder (LlamaConfig: 12 layers, hidden 1024, 16
            heads, 4 key/value heads, vocab 32000) in bf16 generating under
            torch.no_grad, batch uniform in [1, 32], prompt in [32, 1024],
            16..128 new tokens one at a time with past_key_values; steps as
            gen_kv's
  det_dyn   torchvision Faster R-CNN (ResNet-50 FPN, no weights) training,
            each step a new batch (uniform in [2, 8]) of images of a new
            side (320..800 in steps of 32; aspect ratios 1, 1.5 and 2) with
            1..30 random boxes each, SGD, bf16 autocast: proposals and
            sampled regions change in number inside the model too
  kv_serve  serving where the KV cache is most of the memory: a Llama-style
            decoder (16 layers, hidden 2048, 16 heads and 16 key/value
            heads, vocab 32000) in bf16 under torch.no_grad, batch uniform
            in [8, 48], prompt in [128, 768], 64..160 new tokens; the
            prompt's logits only for its last position (logits_to_keep=1),
            so each token's torch.cat of every layer's keys and values is
            what the allocator sees; steps as gen_kv's
  bert_serve BERT-base in bf16 under torch.no_grad as an inference
            server: each step four requests, each of its own batch (uniform
            in [1, 64]) and length (in [16, 512]), nothing kept between them

The changing shapes come from seeded generators: every allocator sees the
same sequence. `--shapes-warm` warms up on the timed steps' own shapes: the
plan of the timed steps runs twice, the first pass untimed (in place of
`--warmup` for the models whose shapes change). The first step of each new
shape costs the framework far more than any allocator does (kernel
selection and loading: BERT's steps took 204-220 ms the first time a length
came and 46 ms the next, with either allocator, on an H100), so a run of a
few new shapes measures that; with the shapes warm, the timed pass measures
the allocator's steady state of changing sizes.

Per run: warm-up steps, then timed steps, each bracketed by
torch.cuda.synchronize(); the median step time. Memory:

- baseline: NVML used once CUDA, a warm-up allocation and the cuBLAS
  handles exist (GPU_NOTES.md), less what the allocator holds at that
  moment (torch.cuda.memory_reserved(), or xlog's charged bytes): the
  context and libraries of the process;
- device peak: NVML used (pynvml.nvmlDeviceGetMemoryInfo, sampled by a
  thread about every millisecond) minus that baseline;
- peak live: torch.cuda.max_memory_allocated() under PyTorch's allocators,
  stats().peak_live_bytes under xlog; "device/live" = device peak / peak live;
- xlog's charged peak: stats().peak_held_bytes (peak_outstanding_bytes where
  the library has no held figure); "charged/device" = charged peak / device
  peak;
- untracked growth: NVML used at the end, less the allocator's holding then,
  less the baseline: memory the process took after the baseline that no
  allocator accounts for (kernel modules loaded lazily, library workspaces).

W8: each changing-shape model (--w8-models) under xlog (--w8-allocators)
with XLOG_BUDGET_BYTES = 1.05 x the smallest device peak among PyTorch's
allocators measured for that model in the same invocation (its first
repeat): steps completed, refusals (failed_allocations), and whether NVML
used minus the baseline ever went above the budget (the largest excess, and
how many samples did).

Order: W7 repeat 1, W8, then W7's further repeats. While one run executes
the next one's process is started and imports torch and its model library,
then waits to be told to go (--no-prestart turns this off); nothing touches
CUDA before that. --time-budget skips the runs that would end past it (a
skipped run is a row saying so).

Output (--out DIR): results.json (every run, the aggregates, the targets;
an xlog run also has, per step, its allocations, misses and pages mapped
and unmapped: `xlog_per_step`),
results.md (the tables) and runs/ (each run's result and log), with the
device, date and versions. A run that fails or times out is a row with its
error, never the end of the whole benchmark. Exit status 0 when it ran
(whatever the numbers say), 2 on bad arguments.

    XLOG_CUDA_LIBRARY=/path/libxlog_cuda.so python3 benches/w7_training.py --out OUT
        [--models resnet50,gpt2,gpt2_dyn,mlm_dyn,gen_kv]
        [--allocators caching,async,expandable,xlog,xlog_pool]
        [--steps 30] [--warmup 5] [--gen-kv-steps 10] [--gen-kv-warmup 2] [--shapes-warm]
        [--repeat 1] [--timeout 240] [--time-budget 0] [--no-prestart]
        [--no-w8] [--w8-models gpt2_dyn,mlm_dyn,gen_kv] [--w8-allocators xlog]
        [--w8-repeat 1]

    python3 benches/w7_training.py --self-test    # the pure-Python parts, no GPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1 << 30
MiB = 1 << 20

MODELS = ["resnet50", "gpt2", "gpt2_dyn", "mlm_dyn", "gen_kv"]
# Run only when named (`--models`): more changing shapes to check against.
EXTRA_MODELS = ["cnn_dyn", "t5_dyn", "llama_gen", "det_dyn", "bert_serve", "kv_serve"]
ALL_MODELS = MODELS + EXTRA_MODELS
DYN_MODELS = ["gpt2_dyn", "mlm_dyn", "gen_kv"] + EXTRA_MODELS
# Generation models: their steps are --gen-kv-steps / --gen-kv-warmup.
GEN_MODELS = ("gen_kv", "llama_gen", "kv_serve")
ALLOCATORS = ["caching", "async", "expandable", "xlog", "xlog_pool"]
TORCH_ALLOCATORS = ("caching", "async", "expandable")
XLOG_ALLOCATORS = ("xlog", "xlog_pool")
ALLOCATOR_NAMES = {
    "caching": "PyTorch caching",
    "async": "PyTorch cudaMallocAsync",
    "expandable": "PyTorch expandable_segments",
    "xlog": "xlog (default: arena)",
    "xlog_pool": "xlog (XLOG_MEMORY=pool)",
}
# XLOG_MEMORY of each xlog allocator (None: the library's default, unset).
XLOG_MEMORY = {"xlog": None, "xlog_pool": "pool"}
# PYTORCH_(CUDA_)ALLOC_CONF of each PyTorch allocator (None: unset).
TORCH_ALLOC_CONF = {"caching": None, "async": "backend:cudaMallocAsync", "expandable": "expandable_segments:True"}

W8_MODELS = ["gpt2_dyn", "mlm_dyn", "gen_kv"]
W8_FACTOR_NUM, W8_FACTOR_DEN = 105, 100  # 1.05 x

RESNET_BATCH, RESNET_IMAGE = 64, 224
GPT2_BATCH, GPT2_SEQ = 8, 512
DYN_MIN_SEQ, DYN_MAX_SEQ, DYN_SEED = 64, 1024, 1234
MLM_BATCH, MLM_MIN_SEQ, MLM_MAX_SEQ, MLM_SEED, MLM_MASK_P, MLM_MASK_ID = 16, 32, 512, 4321, 0.15, 103
GEN_MIN_BATCH, GEN_MAX_BATCH = 1, 16
GEN_MIN_PROMPT, GEN_MAX_PROMPT = 16, 256
GEN_MIN_NEW, GEN_MAX_NEW = 64, 256
GEN_SEED = 2468
CNN_MIN_BATCH, CNN_MAX_BATCH, CNN_SIDES, CNN_SEED = 16, 128, list(range(128, 321, 32)), 1357
T5_BATCH, T5_MIN_SRC, T5_MAX_SRC, T5_MIN_TGT, T5_MAX_TGT, T5_SEED = 16, 32, 512, 8, 256, 8642
LLAMA_MIN_BATCH, LLAMA_MAX_BATCH, LLAMA_MIN_PROMPT, LLAMA_MAX_PROMPT = 1, 32, 32, 1024
LLAMA_MIN_NEW, LLAMA_MAX_NEW, LLAMA_SEED = 16, 128, 9753
KVS_MIN_BATCH, KVS_MAX_BATCH, KVS_MIN_PROMPT, KVS_MAX_PROMPT = 8, 48, 128, 768
KVS_MIN_NEW, KVS_MAX_NEW, KVS_SEED = 64, 160, 8080
DET_MIN_BATCH, DET_MAX_BATCH, DET_SIDES, DET_MAX_BOXES, DET_SEED = 2, 8, list(range(320, 801, 32)), 30, 2718
SERVE_REQUESTS, SERVE_MAX_BATCH, SERVE_MIN_SEQ, SERVE_MAX_SEQ, SERVE_SEED = 4, 64, 16, 512, 3141
SAMPLE_INTERVAL_S = 0.001

# Targets of issue 24 for W7/W8 (xlog against PyTorch's allocators).
PEAK_VS_SMALLEST_PEER = 1.00
STEP_TIME_VS_CACHING = 1.00
DEVICE_VS_LIVE = 1.10
CHARGED_VS_DEVICE_LOW, CHARGED_VS_DEVICE_HIGH = 1.00, 1.05


# ---------------------------------------------------------------------------
# Pure helpers (no torch, no GPU): plans, aggregation, budget, tables
# ---------------------------------------------------------------------------


def median(values: Iterable[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


def w8_budget(device_peak_bytes: int) -> int:
    """XLOG_BUDGET_BYTES for W8: 1.05 x the smallest PyTorch device peak,
    rounded up to a whole byte (integer arithmetic, no float rounding)."""
    if not isinstance(device_peak_bytes, int) or isinstance(device_peak_bytes, bool) or device_peak_bytes <= 0:
        raise ValueError(f"device peak must be a positive number of bytes, got {device_peak_bytes!r}")
    return -(-device_peak_bytes * W8_FACTOR_NUM // W8_FACTOR_DEN)


def dyn_seq_lens(n: int, seed: int = DYN_SEED, low: int = DYN_MIN_SEQ, high: int = DYN_MAX_SEQ) -> List[int]:
    """Sequence lengths uniform in [low, high] from a seeded generator: the
    same list in every process."""
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


def gen_plan(n: int, seed: int = GEN_SEED) -> List[Tuple[int, int, int]]:
    """gen_kv's steps: (batch, prompt length, new tokens), each uniform in
    its range, from a seeded generator."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        batch = rng.randint(GEN_MIN_BATCH, GEN_MAX_BATCH)
        prompt = rng.randint(GEN_MIN_PROMPT, GEN_MAX_PROMPT)
        new = rng.randint(GEN_MIN_NEW, GEN_MAX_NEW)
        out.append((batch, prompt, new))
    return out


def uniform_plan(n: int, seed: int, *ranges: Sequence[int]) -> List[Tuple[int, ...]]:
    """n steps, each a tuple with one value per range (a list to choose
    from, or an inclusive (low, high) pair), from a seeded generator."""
    rng = random.Random(seed)
    pick = lambda r: rng.choice(r) if isinstance(r, list) else rng.randint(r[0], r[1])
    return [tuple(pick(r) for r in ranges) for _ in range(n)]


def step_plan(model: str, n: int) -> Optional[List[Any]]:
    """What changes from step to step of `model` (n steps), or None for a
    fixed-shape model."""
    if model == "cnn_dyn":
        return uniform_plan(n, CNN_SEED, (CNN_MIN_BATCH, CNN_MAX_BATCH), CNN_SIDES)
    if model == "t5_dyn":
        return uniform_plan(n, T5_SEED, (T5_MIN_SRC, T5_MAX_SRC), (T5_MIN_TGT, T5_MAX_TGT))
    if model == "llama_gen":
        return uniform_plan(n, LLAMA_SEED, (LLAMA_MIN_BATCH, LLAMA_MAX_BATCH), (LLAMA_MIN_PROMPT, LLAMA_MAX_PROMPT),
                            (LLAMA_MIN_NEW, LLAMA_MAX_NEW))
    if model == "kv_serve":
        return uniform_plan(n, KVS_SEED, (KVS_MIN_BATCH, KVS_MAX_BATCH), (KVS_MIN_PROMPT, KVS_MAX_PROMPT),
                            (KVS_MIN_NEW, KVS_MAX_NEW))
    if model == "det_dyn":
        return uniform_plan(n, DET_SEED, (DET_MIN_BATCH, DET_MAX_BATCH), DET_SIDES, (1, DET_MAX_BOXES))
    if model == "bert_serve":
        return uniform_plan(n, SERVE_SEED, *[(1, SERVE_MAX_BATCH), (SERVE_MIN_SEQ, SERVE_MAX_SEQ)] * SERVE_REQUESTS)
    if model == "gpt2_dyn":
        return dyn_seq_lens(n)
    if model == "mlm_dyn":
        return dyn_seq_lens(n, seed=MLM_SEED, low=MLM_MIN_SEQ, high=MLM_MAX_SEQ)
    if model == "gen_kv":
        return gen_plan(n)
    return None


def run_plan(model: str, warmup: int, steps: int, shapes_warm: bool) -> Tuple[int, Optional[List[Any]]]:
    """(warm-up steps, the plan of every step) of a run: `warmup` steps of
    their own shapes then `steps` timed ones; with `shapes_warm` (a model
    whose shapes change) the timed steps' plan twice, the first pass the
    warm-up."""
    if shapes_warm and model in DYN_MODELS:
        timed = step_plan(model, steps)
        return steps, timed + timed
    return warmup, step_plan(model, warmup + steps)


def steps_of(model: str, steps: int, warmup: int, gen_steps: int, gen_warmup: int) -> Tuple[int, int]:
    """(timed steps, warm-up steps) of a run of `model`."""
    return (gen_steps, gen_warmup) if model in GEN_MODELS else (steps, warmup)


def charged_peak_of(x: Dict[str, Any]) -> Tuple[Optional[int], Optional[str]]:
    """xlog's charged peak from a run's stats: peak_held_bytes where the
    library reports it, else peak_outstanding_bytes; (bytes, field name)."""
    for name in ("peak_held_bytes", "peak_outstanding_bytes"):
        if x.get(name) is not None:
            return x[name], name
    return None, None


def run_ratios(run: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """The per-run memory ratios: device/live and, for xlog, charged/device."""
    x = run.get("xlog") or {}
    charged, _ = charged_peak_of(x)
    held = x.get("peak_held_bytes")
    device = run.get("device_peak_bytes")
    # What the device holds for xlog: the device peak less what the process
    # took that no allocator accounts for (lazily loaded kernels, say).
    untracked = run.get("untracked_growth_bytes")
    for_xlog = device - untracked if device and untracked is not None and 0 <= untracked < device else device
    return {
        "device_per_live": ratio(device, run.get("peak_live_bytes")),
        "charged_vs_device": ratio(charged, device) if x else None,
        "charged_vs_xlog_device": ratio(charged, for_xlog) if x else None,
        "held_per_live": ratio(held, run.get("peak_live_bytes")) if x else None,
    }


def aggregate(runs: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """W7 runs -> {model: {allocator: summary}}. Over the repeats of one
    (model, allocator): the median of the per-run median step times (and
    their min and max), the median device peak (and the largest), the
    median peak live bytes, the medians of the per-run ratios, xlog's
    largest charged peak, the total refusals, and the errors of failed or
    skipped runs. Then, per model, each allocator against PyTorch's caching
    allocator and against the smallest device peak of PyTorch's three."""
    groups: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for run in runs:
        if run.get("mode", "w7") != "w7":
            continue
        groups.setdefault((run["model"], run["allocator"]), []).append(run)
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for (model, allocator), group in groups.items():
        ok = [r for r in group if r.get("ok")]
        errors = [r.get("error") or "failed" for r in group if not r.get("ok")]
        per_run_ms = [r.get("median_step_ms") for r in ok if r.get("median_step_ms") is not None]
        ratios = [run_ratios(r) for r in ok]
        summary: Dict[str, Any] = {
            "runs": len(group),
            "ok_runs": len(ok),
            "errors": errors,
            "median_step_ms": median(per_run_ms),
            "step_ms_per_run": per_run_ms,
            "step_ms_min": min(per_run_ms, default=None),
            "step_ms_max": max(per_run_ms, default=None),
            "device_peak_bytes": median(r.get("device_peak_bytes") for r in ok),
            "device_peak_bytes_max": max((r["device_peak_bytes"] for r in ok if r.get("device_peak_bytes") is not None), default=None),
            "peak_live_bytes": median(r.get("peak_live_bytes") for r in ok),
            "device_per_live": median(x["device_per_live"] for x in ratios),
            "untracked_growth_bytes": median(r.get("untracked_growth_bytes") for r in ok),
            "failed_steps": sum(r.get("failed_steps", 0) for r in ok),
            "expandable_in_effect": [r.get("expandable_in_effect") for r in ok if "expandable_in_effect" in r],
        }
        xlog = [r["xlog"] for r in ok if r.get("xlog")]
        if xlog:
            charged = [charged_peak_of(x) for x in xlog]
            summary["charged_peak_bytes"] = max((c for c, _ in charged if c is not None), default=None)
            summary["charged_source"] = next((n for _, n in charged if n), None)
            summary["charged_vs_device"] = median(x["charged_vs_device"] for x in ratios)
            summary["charged_vs_xlog_device"] = median(x["charged_vs_xlog_device"] for x in ratios)
            summary["held_per_live"] = median(x["held_per_live"] for x in ratios)
            summary["peak_held_bytes"] = max((x["peak_held_bytes"] for x in xlog if x.get("peak_held_bytes") is not None), default=None)
            summary["peak_outstanding_bytes"] = max(x.get("peak_outstanding_bytes", 0) for x in xlog)
            summary["reserved_bytes_max"] = max(x.get("reserved_bytes_max", 0) for x in xlog)
            summary["failed_allocations"] = sum(x.get("failed_allocations", 0) for x in xlog)
            summary["cache_hits"] = sum(x.get("cache_hits", 0) for x in xlog)
            summary["cache_misses"] = sum(x.get("cache_misses", 0) for x in xlog)
            summary["outstanding_vs_device_peak"] = ratio(summary["peak_outstanding_bytes"], summary["device_peak_bytes"])
        out.setdefault(model, {})[allocator] = summary
    for model, by_alloc in out.items():
        base = by_alloc.get("caching", {})
        asyn = by_alloc.get("async", {})
        peer, peer_peak = smallest_peer(by_alloc)
        for summary in by_alloc.values():
            summary["step_vs_caching"] = ratio(summary.get("median_step_ms"), base.get("median_step_ms"))
            summary["peak_vs_caching"] = ratio(summary.get("device_peak_bytes"), base.get("device_peak_bytes"))
            summary["peak_vs_async"] = ratio(summary.get("device_peak_bytes"), asyn.get("device_peak_bytes"))
            summary["smallest_peer"] = peer
            summary["peak_vs_smallest_peer"] = ratio(summary.get("device_peak_bytes"), peer_peak)
    return out


def smallest_peer(by_alloc: Dict[str, Dict[str, Any]]) -> Tuple[Optional[str], Optional[float]]:
    """The PyTorch allocator with the smallest (median) device peak of one
    model, and that peak; (None, None) when none has a number."""
    peaks = [(s["device_peak_bytes"], a) for a, s in by_alloc.items()
             if a in TORCH_ALLOCATORS and s.get("device_peak_bytes")]
    if not peaks:
        return None, None
    peak, name = min(peaks)
    return name, peak


def w8_budgets(w7: Dict[str, Dict[str, Dict[str, Any]]], models: Sequence[str]) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """W8's budget of each model: 1.05 x the smallest PyTorch device peak
    measured for it. ({model: {budget_bytes, smallest_peer,
    smallest_peer_peak_bytes}}, [why a model has none])."""
    budgets: Dict[str, Dict[str, Any]] = {}
    skipped: List[str] = []
    for model in models:
        if model not in w7:
            skipped.append(f"{model}: not measured in W7 (--models)")
            continue
        peer, peak = smallest_peer(w7[model])
        if peer is None:
            errors = [e for a in TORCH_ALLOCATORS for e in w7[model].get(a, {}).get("errors", [])]
            why = "; ".join(errors[:1]) or "no PyTorch allocator measured (--allocators)"
            skipped.append(f"{model}: no PyTorch device peak ({one_line(why, 160)})")
            continue
        budgets[model] = {"budget_bytes": w8_budget(int(peak)), "smallest_peer": peer,
                          "smallest_peer_peak_bytes": int(peak)}
    return budgets, skipped


def summarize_w8(runs: Sequence[Dict[str, Any]], w7: Dict[str, Dict[str, Dict[str, Any]]]) -> Optional[List[Dict[str, Any]]]:
    """W8 runs -> one summary per (model, allocator), against the
    unconstrained W7 run of the same model and allocator; None if no W8
    run was made."""
    groups: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for run in runs:
        if run.get("mode") == "w8":
            groups.setdefault((run["model"], run["allocator"]), []).append(run)
    if not groups:
        return None
    out = []
    for (model, allocator), group in groups.items():
        ok = [r for r in group if r.get("ok")]
        unconstrained = w7.get(model, {}).get(allocator, {})
        step = median(r.get("median_step_ms") for r in ok)
        budget = group[0].get("budget_bytes")
        peak = max((r["device_peak_bytes"] for r in ok if r.get("device_peak_bytes") is not None), default=None)
        excess = max((r["max_excess_bytes"] for r in ok if r.get("max_excess_bytes") is not None), default=None)
        charged = [charged_peak_of(r.get("xlog") or {})[0] for r in ok]
        out.append({
            "model": model,
            "allocator": allocator,
            "runs": len(group),
            "ok_runs": len(ok),
            "errors": [r.get("error") or "failed" for r in group if not r.get("ok")],
            "budget_bytes": budget,
            "smallest_peer": group[0].get("smallest_peer"),
            "smallest_peer_peak_bytes": group[0].get("smallest_peer_peak_bytes"),
            "steps_attempted": sum(r.get("steps_attempted", 0) for r in ok),
            "steps_completed": sum(r.get("steps_completed", 0) for r in ok),
            "refusals": sum((r.get("xlog") or {}).get("failed_allocations", 0) for r in ok),
            "failed_steps": sum(r.get("failed_steps", 0) for r in ok),
            "median_step_ms": step,
            "unconstrained_median_step_ms": unconstrained.get("median_step_ms"),
            "step_vs_unconstrained": ratio(step, unconstrained.get("median_step_ms")),
            "device_peak_bytes": peak,
            "max_excess_bytes": excess,
            "samples_over_budget": sum(r.get("samples_over_budget", 0) for r in ok),
            "exceeded": None if excess is None else excess > 0,
            "charged_peak_bytes": max((c for c in charged if c is not None), default=None),
            "untracked_growth_bytes": max((r["untracked_growth_bytes"] for r in ok if r.get("untracked_growth_bytes") is not None), default=None),
        })
    return out


def evaluate_targets(w7: Dict[str, Dict[str, Dict[str, Any]]], w8: Optional[List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Issue 24's W7/W8 targets for each xlog allocator measured:
    [{target, measured, limit, met}], met None when a number is missing."""
    rows: List[Dict[str, Any]] = []

    def add(target: str, measured: Optional[float], limit: float, fmt: str = "{:.3f}", low: Optional[float] = None) -> None:
        shown = fmt.format(limit) if low is None else f"{fmt.format(low)}-{fmt.format(limit)}"
        met = None if measured is None else (measured <= limit and (low is None or measured >= low))
        rows.append({"target": target, "measured": None if measured is None else fmt.format(measured),
                     "limit": shown, "met": met})

    for model in ALL_MODELS:
        for allocator in XLOG_ALLOCATORS:
            x = w7.get(model, {}).get(allocator)
            if x is None:
                continue
            who = f"W7 {model} [{allocator}]"
            add(f"{who}: device peak / smallest PyTorch peak ({x.get('smallest_peer') or '?'})",
                x.get("peak_vs_smallest_peer"), PEAK_VS_SMALLEST_PEER)
            add(f"{who}: step time / caching", x.get("step_vs_caching"), STEP_TIME_VS_CACHING)
            add(f"{who}: device peak / peak live", x.get("device_per_live"), DEVICE_VS_LIVE)
            add(f"{who}: charged peak / device peak for xlog (less untracked)",
                x.get("charged_vs_xlog_device", x.get("charged_vs_device")), CHARGED_VS_DEVICE_HIGH,
                low=CHARGED_VS_DEVICE_LOW)
    for s in w8 or []:
        who = f"W8 {s['model']} [{s['allocator']}]"
        add(f"{who}: refusals", None if not s["ok_runs"] else float(s["refusals"]), 0.0, "{:.0f}")
        completed = None if not s["ok_runs"] else float(s["steps_attempted"] - s["steps_completed"])
        add(f"{who}: steps not completed", completed, 0.0, "{:.0f}")
        excess = s.get("max_excess_bytes")
        add(f"{who}: NVML used - baseline - budget, max (GiB)", None if excess is None else excess / GiB, 0.0)
    return rows


def fmt_gib(n: Optional[float]) -> str:
    return "—" if n is None else f"{n / GiB:.2f}"


def fmt_num(x: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "—" if x is None else f"{x:.{digits}f}{suffix}"


def fmt_range(lo: Optional[float], hi: Optional[float], digits: int = 1) -> str:
    if lo is None or hi is None:
        return "—"
    return f"{lo:.{digits}f}-{hi:.{digits}f}"


def one_line(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


W7_HEADER = (
    "| model | allocator | median step ms | min-max ms | vs caching | device peak GiB | vs smallest PyTorch "
    "| peak live GiB | device/live | xlog charged peak GiB | charged/device | xlog held/live | refusals "
    "| untracked GiB | notes |"
)


def format_markdown(report: Dict[str, Any]) -> str:
    meta = report.get("meta", {})
    w7 = report.get("w7", {})
    w8 = report.get("w8")
    lines = [
        "# W7 / W8: real training and generation, PyTorch's allocators and xlog",
        "",
        f"- device: {meta.get('device', '?')} (driver {meta.get('driver', '?')})",
        f"- date: {meta.get('date', '?')}",
        f"- torch {meta.get('torch', '?')}, torchvision {meta.get('torchvision', '?')}, "
        f"transformers {meta.get('transformers', '?')}, Python {meta.get('python', '?')}",
        f"- library: {meta.get('library', '?')}",
        f"- steps: {meta.get('warmup', '?')} warm-up + {meta.get('steps', '?')} timed per run "
        f"(gen_kv {meta.get('gen_kv_warmup', '?')} + {meta.get('gen_kv_steps', '?')}), "
        f"{meta.get('repeat', '?')} repeat(s); step time = median of a run's steps, then the median over repeats "
        "(min-max: the runs' medians)",
        "- device peak = NVML used (sampled ~1 ms) minus the process's baseline (context, warm-up allocation and "
        "cuBLAS handles, less what the allocator held then); peak live = torch.cuda.max_memory_allocated() or "
        "xlog's peak_live_bytes; charged = xlog's peak_held_bytes (peak_outstanding_bytes without it); "
        "untracked = NVML at the end less the allocator's holding less the baseline",
        "",
        "## W7",
        "",
        W7_HEADER,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for model in ALL_MODELS:
        for allocator in ALLOCATORS:
            s = w7.get(model, {}).get(allocator)
            if s is None:
                continue
            notes = []
            if s["errors"]:
                notes.append(f"{len(s['errors'])} of {s['runs']} run(s) failed: " + one_line(s["errors"][0]))
            if s.get("failed_steps"):
                notes.append(f"{s['failed_steps']} step(s) failed")
            if allocator == "expandable" and False in s.get("expandable_in_effect", []):
                notes.append("**expandable segments not in effect** (PyTorch's snapshot)")
            if s.get("charged_source") == "peak_outstanding_bytes":
                notes.append("charged = peak_outstanding_bytes")
            is_xlog = allocator in XLOG_ALLOCATORS
            lines.append("| " + " | ".join([
                model,
                ALLOCATOR_NAMES[allocator],
                fmt_num(s.get("median_step_ms")),
                fmt_range(s.get("step_ms_min"), s.get("step_ms_max")),
                fmt_num(s.get("step_vs_caching"), 3),
                fmt_gib(s.get("device_peak_bytes")),
                fmt_num(s.get("peak_vs_smallest_peer"), 3),
                fmt_gib(s.get("peak_live_bytes")),
                fmt_num(s.get("device_per_live"), 3),
                fmt_gib(s.get("charged_peak_bytes")) if is_xlog else "",
                fmt_num(s.get("charged_vs_device"), 3) if is_xlog else "",
                fmt_num(s.get("held_per_live"), 3) if is_xlog else "",
                str(s.get("failed_allocations", "")) if is_xlog else "",
                fmt_gib(s.get("untracked_growth_bytes")),
                "; ".join(notes),
            ]) + " |")
    lines += ["", "## W8: changing shapes under XLOG_BUDGET_BYTES = 1.05 x the smallest PyTorch device peak", ""]
    if report.get("w8_skipped"):
        lines += [report["w8_skipped"], ""]
    if not w8:
        lines.append("no W8 run")
    else:
        lines += [
            "| model | allocator | budget GiB | from | steps completed | refusals | median step ms | vs unconstrained "
            "| device peak GiB | max over budget GiB | samples over | above budget | charged peak GiB | untracked GiB | notes |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
        ]
        for s in w8:
            lines.append("| " + " | ".join([
                s["model"],
                ALLOCATOR_NAMES.get(s["allocator"], s["allocator"]),
                fmt_gib(s.get("budget_bytes")),
                f"{s.get('smallest_peer') or '?'} {fmt_gib(s.get('smallest_peer_peak_bytes'))}",
                f"{s['steps_completed']} of {s['steps_attempted']}",
                str(s["refusals"]),
                fmt_num(s.get("median_step_ms")),
                fmt_num(s.get("step_vs_unconstrained"), 3),
                fmt_gib(s.get("device_peak_bytes")),
                fmt_num(None if s.get("max_excess_bytes") is None else s["max_excess_bytes"] / GiB, 3),
                str(s.get("samples_over_budget", 0)),
                {True: "**YES**", False: "no", None: "—"}[s.get("exceeded")],
                fmt_gib(s.get("charged_peak_bytes")),
                fmt_gib(s.get("untracked_growth_bytes")),
                "; ".join(one_line(e) for e in s["errors"][:1]),
            ]) + " |")
    lines += ["", "## Targets (issue 24)", "", "| target | measured | limit | met |", "|---|---:|---:|---|"]
    for t in report.get("targets", []):
        met = {True: "yes", False: "**no**", None: "— (no number)"}[t["met"]]
        lines.append(f"| {t['target']} | {t['measured'] or '—'} | {t['limit']} | {met} |")
    lines.append("")
    lines.append(f"Total {report.get('seconds', 0):.0f} s.")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# The child: one model under one allocator (runs with the GPU)
# ---------------------------------------------------------------------------


def visible_nvml_index() -> int:
    """The NVML index of the first visible device, before CUDA is up."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


class NvmlPeak:
    """Device memory in use (NVML, device-wide), sampled by a thread; with a
    threshold also counts the samples above it."""

    def __init__(self, torch=None, interval_s: float = SAMPLE_INTERVAL_S):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self.handle = self._handle_of_current_device(torch)
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self.threshold: Optional[int] = None
        self.over = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _handle_of_current_device(self, torch):
        nv = self._nvml
        if torch is not None:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            try:
                bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
                return nv.nvmlDeviceGetHandleByPciBusId(bus)
            except Exception:  # noqa: BLE001 - older torch without PCI fields, or another format
                pass
        return nv.nvmlDeviceGetHandleByIndex(visible_nvml_index())

    def used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def name(self) -> str:
        n = self._nvml.nvmlDeviceGetName(self.handle)
        return n.decode() if isinstance(n, bytes) else str(n)

    def _note(self, value: int) -> None:
        self.samples += 1
        if value > self.peak:
            self.peak = value
        if self.threshold is not None and value > self.threshold:
            self.over += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._note(self.used())
            time.sleep(self.interval_s)

    def start(self, threshold: Optional[int] = None) -> None:
        self.threshold = threshold
        self.peak = 0
        self._note(self.used())
        self._thread = threading.Thread(target=self._run, name="nvml-peak", daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._note(self.used())
        return self.peak


# The transformers classes each model is built from (GPT-2's where absent).
TRANSFORMERS_CLASSES = {
    "mlm_dyn": ("BertConfig", "BertForMaskedLM"),
    "bert_serve": ("BertConfig", "BertModel"),
    "t5_dyn": ("T5Config", "T5ForConditionalGeneration"),
    "llama_gen": ("LlamaConfig", "LlamaForCausalLM"),
    "kv_serve": ("LlamaConfig", "LlamaForCausalLM"),
}


def preimport(spec: Dict[str, Any]) -> Dict[str, str]:
    """Import what the run needs, without touching CUDA (done while the
    previous run executes); returns the versions."""
    versions: Dict[str, str] = {}
    import torch

    versions["torch"] = torch.__version__
    if spec["allocator"] in XLOG_ALLOCATORS:
        import xlog_cuda.torch  # noqa: F401
    if spec["model"] in ("resnet50", "cnn_dyn", "det_dyn"):
        import torchvision

        versions["torchvision"] = torchvision.__version__
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import transformers

        versions["transformers"] = transformers.__version__
        # The model's classes (transformers loads them lazily, on first use).
        for name in TRANSFORMERS_CLASSES.get(spec["model"], ("GPT2Config", "GPT2LMHeadModel")):
            getattr(transformers, name)
    import pynvml  # noqa: F401

    return versions


def train_step(torch, opt, loss_of: Callable[[], Any]) -> Any:
    """One training step: the loss under bf16 autocast, backward, the
    optimizer's step, gradients dropped. The loss."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_of()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def generate(torch, model, vocab: int, gen, batch: int, prompt: int, new: int, last_logits_only: bool = False) -> Any:
    """Greedy generation under torch.no_grad: a random prompt of `batch` x
    `prompt` tokens, then `new` tokens one at a time with past_key_values
    (a KV cache that grows every token). The last token, as a float.
    `last_logits_only`: the prompt's logits only for its last position (as
    transformers' own generate does)."""
    with torch.no_grad():
        ids = torch.randint(0, vocab, (batch, prompt), device="cuda", generator=gen)
        keep = {"logits_to_keep": 1} if last_logits_only else {}
        out = model(input_ids=ids, use_cache=True, **keep)
        past = out.past_key_values
        token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        del out, ids
        for _ in range(new - 1):
            out = model(input_ids=token, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            del out
        del past
    return token.float().mean()


# The Llama-style decoders that generate: their shapes, and whether the
# prompt's logits are kept only for its last position.
LLAMA_SHAPES: Dict[str, Dict[str, Any]] = {
    "llama_gen": dict(hidden=1024, intermediate=2816, layers=12, heads=16, kv_heads=4, last_logits_only=False),
    "kv_serve": dict(hidden=2048, intermediate=5632, layers=16, heads=16, kv_heads=16, last_logits_only=True),
}


def llama_generator(torch, plan: Optional[List[Any]], hidden: int, intermediate: int, layers: int, heads: int,
                    kv_heads: int, last_logits_only: bool):
    """A Llama-style decoder in bf16 (vocab 32000) and its step: one
    generation of `plan[i]` (`generate`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=32000,
                         max_position_embeddings=2048)
    model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
    model.eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    return model, None, lambda i: generate(torch, model, config.vocab_size, gen, *plan[i],
                                           last_logits_only=last_logits_only)


def build_workload(torch, model_name: str, plan: Optional[List[Any]]):
    """(model, optimizer or None, step(i) -> a tensor to report)."""
    F = torch.nn.functional
    if model_name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(RESNET_BATCH, 3, RESNET_IMAGE, RESNET_IMAGE, device="cuda")
        y = torch.randint(0, 1000, (RESNET_BATCH,), device="cuda")
        return model, opt, lambda i: train_step(torch, opt, lambda: F.cross_entropy(model(x), y))
    if model_name in ("gpt2", "gpt2_dyn"):
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config()
        config.use_cache = False
        model = GPT2LMHeadModel(config).cuda()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        vocab = config.vocab_size
        gen = torch.Generator(device="cuda").manual_seed(0)

        def step(i: int):
            seq = plan[i] if plan is not None else GPT2_SEQ
            ids = torch.randint(0, vocab, (GPT2_BATCH, seq), device="cuda", generator=gen)
            return train_step(torch, opt, lambda: model(input_ids=ids, labels=ids).loss)

        return model, opt, step
    if model_name == "mlm_dyn":
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig()
        model = BertForMaskedLM(config).cuda()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        vocab = config.vocab_size
        gen = torch.Generator(device="cuda").manual_seed(0)

        def step(i: int):
            seq = plan[i]
            ids = torch.randint(0, vocab, (MLM_BATCH, seq), device="cuda", generator=gen)
            masked = torch.rand((MLM_BATCH, seq), device="cuda", generator=gen) < MLM_MASK_P
            labels = torch.where(masked, ids, torch.full_like(ids, -100))
            inputs = ids.masked_fill(masked, MLM_MASK_ID)
            return train_step(torch, opt, lambda: model(input_ids=inputs, labels=labels).loss)

        return model, opt, step
    if model_name == "gen_kv":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config()
        config.use_cache = True
        model = GPT2LMHeadModel(config).to(device="cuda", dtype=torch.bfloat16)
        model.eval()
        gen = torch.Generator(device="cuda").manual_seed(0)
        return model, None, lambda i: generate(torch, model, config.vocab_size, gen, *plan[i])
    if model_name == "cnn_dyn":
        import torchvision

        model = torchvision.models.efficientnet_b0(weights=None).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator(device="cuda").manual_seed(0)

        def step(i: int):
            batch, side = plan[i]
            x = torch.randn(batch, 3, side, side, device="cuda", generator=gen)
            y = torch.randint(0, 1000, (batch,), device="cuda", generator=gen)
            return train_step(torch, opt, lambda: F.cross_entropy(model(x), y))

        return model, opt, step
    if model_name == "t5_dyn":
        from transformers import T5Config, T5ForConditionalGeneration

        # t5-small's shape; the token ids every T5 checkpoint uses.
        config = T5Config(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        model = T5ForConditionalGeneration(config).cuda()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        vocab = config.vocab_size
        gen = torch.Generator(device="cuda").manual_seed(0)

        def step(i: int):
            src, tgt = plan[i]
            ids = torch.randint(0, vocab, (T5_BATCH, src), device="cuda", generator=gen)
            labels = torch.randint(0, vocab, (T5_BATCH, tgt), device="cuda", generator=gen)
            return train_step(torch, opt, lambda: model(input_ids=ids, labels=labels).loss)

        return model, opt, step
    if model_name in LLAMA_SHAPES:
        return llama_generator(torch, plan, **LLAMA_SHAPES[model_name])
    if model_name == "det_dyn":
        import torchvision

        # Faster R-CNN: the proposals, the boxes each image keeps and the
        # sampled regions change in number every step, besides the images.
        model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None).cuda()
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        gen = torch.Generator(device="cuda").manual_seed(0)

        def step(i: int):
            batch, side, boxes = plan[i]
            model.transform.min_size, model.transform.max_size = (side,), 2 * side
            images, targets = [], []
            for b in range(batch):
                h, w = side, side + (b % 3) * side // 2  # aspect ratios 1, 1.5 and 2
                images.append(torch.rand(3, h, w, device="cuda", generator=gen))
                scale = torch.tensor([w, h], device="cuda", dtype=torch.float32)
                corner = torch.rand(boxes, 2, device="cuda", generator=gen) * scale * 0.6
                size = torch.rand(boxes, 2, device="cuda", generator=gen) * scale * 0.4 + 8
                labels = torch.randint(1, 91, (boxes,), device="cuda", generator=gen)
                targets.append({"boxes": torch.cat([corner, corner + size], dim=1), "labels": labels})
            return train_step(torch, opt, lambda: sum(model(images, targets).values()))

        return model, opt, step
    if model_name == "bert_serve":
        from transformers import BertConfig, BertModel

        # An inference server: each step answers SERVE_REQUESTS requests
        # of their own batch and length, nothing kept between them.
        config = BertConfig()
        model = BertModel(config).to(device="cuda", dtype=torch.bfloat16)
        model.eval()
        gen = torch.Generator(device="cuda").manual_seed(0)

        def step(i: int):
            pooled = []
            with torch.no_grad():
                for batch, seq in zip(plan[i][0::2], plan[i][1::2]):
                    ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda", generator=gen)
                    pooled.append(model(input_ids=ids).pooler_output.float().mean())
            return torch.stack(pooled).mean()

        return model, None, step
    raise ValueError(f"unknown model {model_name!r}")


def allocator_holding(torch, xt) -> Tuple[int, str]:
    """What the allocator holds now: xlog's charged bytes (held_bytes, else
    outstanding_bytes), or torch.cuda.memory_reserved(); (bytes, source)."""
    if xt is not None:
        st = xt.stats(0)
        held = getattr(st, "held_bytes", None)
        if held is not None:
            return int(held), "xlog held_bytes"
        return int(st.outstanding_bytes), "xlog outstanding_bytes"
    try:
        return int(torch.cuda.memory_reserved()), "torch.cuda.memory_reserved"
    except Exception:  # noqa: BLE001
        return 0, "none"


def timed_step(torch, step: Callable[[int], Any], i: int) -> Tuple[float, float, float]:
    """Run `step(i)` between two synchronisations: (wall, host, GPU) ms,
    host being the time until the step is enqueued and GPU the time
    between CUDA events recorded at both ends. A step whose host time is
    close to its wall time is host-bound."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    step(i)
    end.record()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return 1e3 * (t2 - t0), 1e3 * (t1 - t0), start.elapsed_time(end)


def warm_up_cuda(torch) -> None:
    """A warm-up allocation and the math handles (cuBLAS, cuBLASLt), so the
    baseline includes them (GPU_NOTES.md)."""
    torch.zeros(1, device="cuda")
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (a @ a).float().sum().item()
    del a
    torch.cuda.synchronize()


def expandable_in_effect(torch) -> Optional[bool]:
    """Whether PyTorch's segments are expandable ones (None: unknown, e.g. a
    torch whose snapshot does not say)."""
    try:
        segments = torch.cuda.memory._snapshot().get("segments", [])
    except Exception:  # noqa: BLE001
        return None
    flags = [bool(seg["is_expandable"]) for seg in segments if "is_expandable" in seg]
    return any(flags) if flags else None


def run_child(spec: Dict[str, Any], wait_go: Optional[Callable[[], bool]] = None) -> Dict[str, Any]:
    """One model under one allocator; returns the result dict (ok or not).
    With `wait_go`, the imports come first, then wait_go() is called before
    anything touches CUDA (False: cancelled)."""
    started = time.perf_counter()
    res: Dict[str, Any] = {k: spec[k] for k in ("model", "allocator", "mode", "repeat")}
    res.update(ok=False, error=None, pid=os.getpid())
    res["xlog_memory"] = os.environ.get("XLOG_MEMORY", "(unset)")
    res["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset)")
    xt = None
    try:
        res.update(preimport(spec))
        res["import_s"] = time.perf_counter() - started
        if wait_go is not None and not wait_go():
            res["error"] = "cancelled before it started"
            return res
        go = time.perf_counter()
        import pynvml

        pynvml.nvmlInit()
        try:
            idle_handle = pynvml.nvmlDeviceGetHandleByIndex(visible_nvml_index())
            res["idle_used_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(idle_handle).used)
        except Exception as e:  # noqa: BLE001
            res["idle_used_bytes"] = None
            res["idle_problem"] = f"{type(e).__name__}: {e}"
        if spec["allocator"] in XLOG_ALLOCATORS:
            import xlog_cuda.torch as xt  # noqa: F811

            t0 = time.perf_counter()
            xt.enable(backend="cuda")  # budget from XLOG_BUDGET_BYTES (W8) or none
            res["enable_s"] = time.perf_counter() - t0
            info = xt.enable_info()
            res["shim_origin"] = info.get("shim_origin")
            res["shim"] = info.get("shim") or info.get("shim_problem")
        import torch

        torch.manual_seed(0)
        torch.cuda.init()
        warm_up_cuda(torch)
        try:
            res["allocator_backend"] = torch.cuda.memory.get_allocator_backend()
        except Exception as e:  # noqa: BLE001
            res["allocator_backend"] = f"? ({type(e).__name__})"
        expected_backend = {"caching": "native", "expandable": "native", "async": "cudaMallocAsync"}.get(spec["allocator"])
        if expected_backend and res["allocator_backend"] != expected_backend:
            raise RuntimeError(f"allocator backend is {res['allocator_backend']!r}, expected {expected_backend!r}")
        nvml = NvmlPeak(torch)
        res["device"] = nvml.name()
        used = nvml.used()
        holding, source = allocator_holding(torch, xt)
        baseline = used - holding
        res.update(baseline_used_bytes=used, baseline_allocator_bytes=holding, holding_source=source,
                   baseline_bytes=baseline)
        if res.get("idle_used_bytes") is not None:
            res["context_bytes"] = baseline - res["idle_used_bytes"]
        budget = spec.get("budget_bytes")
        res["setup_s"] = time.perf_counter() - go

        warmup, steps = spec["warmup"], spec["steps"]
        warmup, plan = run_plan(spec["model"], warmup, steps, bool(spec.get("shapes_warm")))
        nvml.start(threshold=None if budget is None else baseline + budget)
        model, opt, step = build_workload(torch, spec["model"], plan)
        oom_types: Tuple[type, ...] = tuple(
            t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t
        )
        times: List[float] = []
        losses: List[float] = []
        failed, first_error = 0, None
        reserved_max = 0
        # xlog's counters after each step: what a step's time paid for in
        # driver calls (pages mapped and unmapped) and misses.
        per_step: List[Dict[str, int]] = []
        last = xt.stats(0) if xt is not None else None
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
                if opt is not None:
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
                now = xt.stats(0)
                reserved_max = max(reserved_max, now.reserved_bytes)
                per_step.append({k: getattr(now, k) - getattr(last, k)
                                 for k in ("allocations", "cache_misses", "pages_mapped", "pages_unmapped")})
                last = now
        peak = nvml.stop()
        torch.cuda.synchronize()
        end_used = nvml.used()
        end_holding, _ = allocator_holding(torch, xt)
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
            untracked_growth_bytes=end_used - end_holding - baseline,
            nvml_samples=nvml.samples,
            losses=losses,
        )
        if per_step:
            res["xlog_per_step"] = per_step
        if plan is not None:
            res["plan"] = plan
        if budget is not None:
            res["budget_bytes"] = budget
            res["max_excess_bytes"] = peak - baseline - budget
            res["samples_over_budget"] = nvml.over
            for key in ("smallest_peer", "smallest_peer_peak_bytes"):
                res[key] = spec.get(key)
        if xt is None:
            try:
                res["peak_live_bytes"] = int(torch.cuda.max_memory_allocated())
                res["torch_max_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
                res["peak_live_source"] = "torch.cuda.max_memory_allocated"
            except Exception as e:  # noqa: BLE001
                res["peak_live_source"] = f"none ({type(e).__name__})"
            if spec["allocator"] in ("caching", "expandable"):
                res["expandable_in_effect"] = expandable_in_effect(torch)
        else:
            st = xt.stats(0)
            x = {k: getattr(st, k) for k in st.__dataclass_fields__}
            for name in ("held_bytes", "peak_held_bytes"):  # fields being added: None where absent
                x[name] = getattr(st, name, None)
            x["reserved_bytes_max"] = max(reserved_max, st.reserved_bytes)
            res["xlog"] = x
            res["peak_live_bytes"] = int(st.peak_live_bytes)
            res["peak_live_source"] = "xlog peak_live_bytes"
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


def child_env(allocator: str, budget: Optional[int] = None, trace: Optional[str] = None) -> Dict[str, str]:
    """The environment of one run. `trace`: for xlog's allocators, the path
    of the memory log (XLOG_LOG_PATH) the run writes: a trace for
    `python -m xlog_cuda.replay` (the log's write per row costs step time,
    so traced runs are not timed runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLOG_") or k in ("XLOG_CUDA_LIBRARY", "XLOG_CUDA_CACHE_DIR")}
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        env.pop(name, None)
    conf = TORCH_ALLOC_CONF.get(allocator)
    if conf is not None:
        env["PYTORCH_ALLOC_CONF"] = conf
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if allocator in XLOG_ALLOCATORS:
        env["XLOG_BACKEND"] = "cuda"
        if XLOG_MEMORY[allocator] is not None:
            env["XLOG_MEMORY"] = XLOG_MEMORY[allocator]
        if budget is not None:
            env["XLOG_BUDGET_BYTES"] = str(budget)
        if trace is not None:
            env["XLOG_LOG_PATH"] = trace
    python_dir = os.path.join(REPO, "python")
    env["PYTHONPATH"] = python_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    nvidia = "/usr/local/nvidia/lib64"
    if os.path.isdir(nvidia) and nvidia not in env.get("LD_LIBRARY_PATH", "").split(":"):
        env["LD_LIBRARY_PATH"] = nvidia + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def skip_reason(elapsed: float, estimate: float, budget: float) -> Optional[str]:
    """Why a run is skipped under --time-budget (None: it runs). `estimate`
    is the longest run of the same model so far (0 before the first)."""
    if budget <= 0 or elapsed + estimate <= budget:
        return None
    return f"skipped: time budget ({elapsed:.0f} s spent + about {estimate:.0f} s for this run > {budget:.0f} s)"


class Child:
    """One started run: its process (waiting to go, with prestart), log and
    result paths."""

    def __init__(self, spec: Dict[str, Any], env: Dict[str, str], out_dir: str, wait_go: bool):
        self.spec = spec
        self.tag = f"{spec['mode']}-{spec['model']}-{spec['allocator']}-r{spec['repeat']}"
        self.result_path = os.path.join(out_dir, "runs", self.tag + ".json")
        self.log_path = os.path.join(out_dir, "runs", self.tag + ".log")
        os.makedirs(os.path.dirname(self.result_path), exist_ok=True)
        if os.path.exists(self.result_path):
            os.remove(self.result_path)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec), "--result", self.result_path]
        if wait_go:
            cmd.append("--wait-go")
        self.wait_go = wait_go
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE if wait_go else subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def go(self) -> None:
        if not self.wait_go:
            return
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):  # it ended already (an import failed): its result says why
            pass

    def wait(self, timeout: float) -> Optional[int]:
        try:
            rc: Optional[int] = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        self.log.close()
        return rc

    def cancel(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


class Runner:
    """Runs the children of a phase one at a time; with prestart, the next
    child imports while the current one runs."""

    def __init__(self, out_dir: str, timeout: float, prestart: bool = True, time_budget: float = 0.0):
        self.out_dir = out_dir
        self.timeout = timeout
        self.prestart = prestart
        self.time_budget = time_budget
        self.started = time.monotonic()
        self.durations: Dict[str, float] = {}

    def run_phase(self, items: Sequence[Tuple[Dict[str, Any], Dict[str, str]]]) -> List[Dict[str, Any]]:
        results: List[Dict[str, Any]] = []
        ready: Optional[Child] = None
        for i, (spec, env) in enumerate(items):
            why = skip_reason(time.monotonic() - self.started, self.durations.get(spec["model"], 0.0), self.time_budget)
            if why is not None:
                if ready is not None:
                    ready.cancel()
                    ready = None
                res = {k: spec[k] for k in ("model", "allocator", "mode", "repeat")}
                res.update(ok=False, error=why, skipped=True)
                print(f"w7: {spec['mode']}-{spec['model']}-{spec['allocator']}-r{spec['repeat']}: {why}", flush=True)
                results.append(res)
                continue
            child = ready if ready is not None else Child(spec, env, self.out_dir, self.prestart)
            ready = None
            t0 = time.monotonic()
            child.go()
            if self.prestart and i + 1 < len(items):
                ready = Child(items[i + 1][0], items[i + 1][1], self.out_dir, True)
            rc = child.wait(self.timeout)
            elapsed = time.monotonic() - t0
            self.durations[spec["model"]] = max(self.durations.get(spec["model"], 0.0), elapsed)
            results.append(self._collect(child, rc, elapsed))
        if ready is not None:
            ready.cancel()
        return results

    def _collect(self, child: Child, rc: Optional[int], elapsed: float) -> Dict[str, Any]:
        spec = child.spec
        try:
            with open(child.result_path) as f:
                res = json.load(f)
        except (OSError, ValueError):
            res = {k: spec[k] for k in ("model", "allocator", "mode", "repeat")}
            res["ok"] = False
            with open(child.log_path, errors="replace") as f:
                tail = [l.strip() for l in f.read().splitlines() if l.strip()][-1:]
            if rc is None:
                res["error"] = f"timed out after {self.timeout:.0f} s"
            else:
                res["error"] = f"exit {rc}" + (f": {tail[0][:300]}" if tail else "")
        res["process_s"] = elapsed
        res["log"] = child.log_path
        if res.get("ok"):
            status = (f"{res['median_step_ms']:.2f} ms/step, peak {fmt_gib(res.get('device_peak_bytes'))} GiB, "
                      f"live {fmt_gib(res.get('peak_live_bytes'))} GiB")
            if res.get("budget_bytes") is not None:
                status += (f", budget {fmt_gib(res['budget_bytes'])} GiB, refusals "
                           f"{(res.get('xlog') or {}).get('failed_allocations', '?')}, max excess "
                           f"{res['max_excess_bytes'] / GiB:.3f} GiB")
        else:
            status = f"ERROR {res.get('error')}"
        print(f"w7: {child.tag}: {status} ({elapsed:.0f} s)", flush=True)
        return res


def driver_meta(args) -> Dict[str, Any]:
    meta: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "host": platform.node(),
        "library": os.environ.get("XLOG_CUDA_LIBRARY", "(build trees of this checkout)"),
        "steps": args.steps,
        "warmup": args.warmup,
        "gen_kv_steps": args.gen_kv_steps,
        "gen_kv_warmup": args.gen_kv_warmup,
        "repeat": args.repeat,
        "shapes_warm": args.shapes_warm,
    }
    try:  # NVML only: the driver must not hold a CUDA context
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(visible_nvml_index())
        name = pynvml.nvmlDeviceGetName(h)
        meta["device"] = name.decode() if isinstance(name, bytes) else str(name)
        drv = pynvml.nvmlSystemGetDriverVersion()
        meta["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
        meta["device_total_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
    except Exception as e:  # noqa: BLE001
        meta["device"] = f"? (NVML: {type(e).__name__}: {e})"
    return meta


def make_spec(args, model: str, allocator: str, mode: str, repeat: int, **extra: Any) -> Dict[str, Any]:
    steps, warmup = steps_of(model, args.steps, args.warmup, args.gen_kv_steps, args.gen_kv_warmup)
    spec = {"model": model, "allocator": allocator, "mode": mode, "repeat": repeat, "steps": steps, "warmup": warmup,
            "shapes_warm": args.shapes_warm}
    spec.update(extra)
    return spec


def drive(args) -> int:
    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    meta = driver_meta(args)
    print(f"w7: {meta.get('device')} — models {args.models}, allocators {args.allocators}, "
          f"{args.warmup}+{args.steps} steps (gen_kv {args.gen_kv_warmup}+{args.gen_kv_steps}), repeat {args.repeat}"
          f"{'' if not args.time_budget else f', time budget {args.time_budget:.0f} s'}; output in {out_dir}", flush=True)
    runner = Runner(out_dir, args.timeout, args.prestart, args.time_budget)

    def w7_phase(r: int) -> List[Dict[str, Any]]:
        def trace(m: str, a: str) -> Optional[str]:
            if not args.trace_dir or a not in XLOG_ALLOCATORS:
                return None
            os.makedirs(args.trace_dir, exist_ok=True)
            return os.path.join(args.trace_dir, f"{m}-{a}-r{r}.csv")

        items = [(make_spec(args, m, a, "w7", r), child_env(a, trace=trace(m, a)))
                 for m in args.models for a in args.allocators]
        return runner.run_phase(items)

    runs: List[Dict[str, Any]] = w7_phase(0)

    w8_skipped: Optional[str] = None
    if args.w8:
        budgets, skipped = w8_budgets(aggregate(runs), args.w8_models)
        if skipped:
            w8_skipped = "skipped: " + "; ".join(skipped)
        items = []
        for r in range(args.w8_repeat):
            for model, b in budgets.items():
                for allocator in args.w8_allocators:
                    spec = make_spec(args, model, allocator, "w8", r, **b)
                    items.append((spec, child_env(allocator, b["budget_bytes"])))
        runs += runner.run_phase(items)
    else:
        w8_skipped = "not run (--no-w8)"

    for r in range(1, args.repeat):
        runs += w7_phase(r)

    w7 = aggregate(runs)
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
    # model: {allocator: (median ms per repeat, device peak GiB per repeat)}; peak live is
    # 12.0 GiB for gpt2_dyn, 3.0 for resnet50, 6.0 for the others.
    table = {
        "resnet50": {"caching": ([33.0, 34.0], [3.6, 3.6]), "async": ([35.0, 36.0], [3.4, 3.5]),
                     "expandable": ([33.0, 33.0], [3.2, 3.2]), "xlog": ([32.0, 33.0], [3.1, 3.1]),
                     "xlog_pool": ([32.5, 33.5], [3.3, 3.3])},
        "gpt2_dyn": {"caching": ([30.0, 31.0], [21.0, 21.0]), "async": ([33.0, 34.0], [14.6, 14.6]),
                     "expandable": ([31.0, 32.0], [14.3, 14.3]), "xlog": ([30.0, 30.0], [14.0, 15.0]),
                     "xlog_pool": ([31.0, 31.0], [15.5, 15.5])},
        "mlm_dyn": {"caching": ([20.0, 20.0], [9.0, 9.0]), "async": ([21.0, 21.0], [7.0, 7.0]),
                    "expandable": ([20.0, 20.0], [6.8, 6.8]), "xlog": ([22.0, 23.0], [6.6, 6.6])},
        "gen_kv": {"caching": ([700.0, 710.0], [2.0, 2.0]), "xlog": ([690.0, 700.0], [1.5, 1.5])},
    }
    live = {"resnet50": 3.0, "gpt2_dyn": 12.0, "mlm_dyn": 6.0, "gen_kv": 1.4}
    for model, by_alloc in table.items():
        for allocator, (steps, peaks) in by_alloc.items():
            for r, (ms, gib) in enumerate(zip(steps, peaks)):
                run = {"model": model, "allocator": allocator, "mode": "w7", "repeat": r, "ok": True,
                       "median_step_ms": ms, "device_peak_bytes": int(gib * GiB), "failed_steps": 0,
                       "peak_live_bytes": int(live[model] * GiB), "untracked_growth_bytes": 64 * MiB}
                if allocator in XLOG_ALLOCATORS:
                    x = {"peak_outstanding_bytes": int(gib * 1.05 * GiB), "reserved_bytes_max": int(gib * GiB),
                         "failed_allocations": 0, "cache_hits": 100, "cache_misses": 10}
                    if allocator == "xlog":  # the held figures are the library's new fields
                        x.update(peak_held_bytes=int(gib * 1.02 * GiB), held_bytes=int(gib * GiB))
                    run["xlog"] = x
                if allocator == "expandable":
                    run["expandable_in_effect"] = model != "mlm_dyn"
                runs.append(run)
    runs.append({"model": "resnet50", "allocator": "async", "mode": "w7", "repeat": 2, "ok": False,
                 "error": "timed out after 240 s"})
    return runs


def synthetic_w8_runs(w7: Dict[str, Dict[str, Dict[str, Any]]]) -> List[Dict[str, Any]]:
    budgets, _ = w8_budgets(w7, ["gpt2_dyn", "mlm_dyn"])
    runs = []
    for model, b in budgets.items():
        for allocator, excess in (("xlog", -200 * MiB), ("xlog_pool", 300 * MiB)):
            runs.append({"model": model, "allocator": allocator, "mode": "w8", "repeat": 0, "ok": True,
                         "median_step_ms": 31.0, "device_peak_bytes": b["budget_bytes"] + excess,
                         "budget_bytes": b["budget_bytes"], "max_excess_bytes": excess,
                         "samples_over_budget": 0 if excess < 0 else 17, "steps_attempted": 35,
                         "steps_completed": 35, "failed_steps": 0,
                         "smallest_peer": b["smallest_peer"], "smallest_peer_peak_bytes": b["smallest_peer_peak_bytes"],
                         "xlog": {"failed_allocations": 0, "peak_held_bytes": b["budget_bytes"] - GiB}})
    return runs


def self_test() -> int:
    runs = synthetic_runs()
    w7 = aggregate(runs)
    rn, d, m = w7["resnet50"], w7["gpt2_dyn"], w7["mlm_dyn"]
    assert rn["caching"]["median_step_ms"] == 33.5 and rn["xlog"]["median_step_ms"] == 32.5
    assert (rn["xlog"]["step_ms_min"], rn["xlog"]["step_ms_max"]) == (32.0, 33.0)
    assert abs(rn["xlog"]["step_vs_caching"] - 32.5 / 33.5) < 1e-12
    assert rn["async"]["runs"] == 3 and rn["async"]["ok_runs"] == 2 and rn["async"]["errors"] == ["timed out after 240 s"]
    assert d["xlog"]["device_peak_bytes"] == (int(14.0 * GiB) + int(15.0 * GiB)) / 2
    assert d["xlog"]["device_peak_bytes_max"] == int(15.0 * GiB)
    assert d["xlog"]["smallest_peer"] == "expandable" and rn["xlog"]["smallest_peer"] == "expandable"
    assert abs(d["xlog"]["peak_vs_smallest_peer"] - 14.5 / 14.3) < 1e-6
    assert abs(d["xlog"]["peak_vs_caching"] - 14.5 / 21.0) < 1e-6
    assert abs(d["caching"]["device_per_live"] - 21.0 / 12.0) < 1e-6 and d["caching"].get("charged_vs_device") is None
    assert abs(d["xlog"]["charged_vs_device"] - 1.02) < 1e-6 and d["xlog"]["charged_source"] == "peak_held_bytes"
    assert abs(d["xlog_pool"]["charged_vs_device"] - 1.05) < 1e-6 and d["xlog_pool"]["charged_source"] == "peak_outstanding_bytes"
    assert d["xlog_pool"]["held_per_live"] is None
    # Less the 64 MiB untracked, the device holds less for xlog.
    assert d["xlog"]["charged_vs_xlog_device"] > d["xlog"]["charged_vs_device"]
    assert w7["gen_kv"]["xlog"]["smallest_peer"] == "caching"
    assert w8_budget(100) == 105 and w8_budget(101) == 107  # 106.05 rounds up
    assert w8_budget(8 * GiB) == 8 * GiB + -(-8 * GiB * 5 // 100)
    for bad in (0, -5, 1.5, None, True):
        try:
            w8_budget(bad)  # type: ignore[arg-type]
        except ValueError:
            pass
        else:
            raise AssertionError(f"w8_budget({bad!r}) did not raise")
    lens = dyn_seq_lens(200)
    assert lens == dyn_seq_lens(200) and min(lens) >= DYN_MIN_SEQ and max(lens) <= DYN_MAX_SEQ and len(set(lens)) > 50
    assert dyn_seq_lens(5) == lens[:5] and step_plan("gpt2_dyn", 200) == lens
    mlm = step_plan("mlm_dyn", 200)
    assert min(mlm) >= MLM_MIN_SEQ and max(mlm) <= MLM_MAX_SEQ and len(set(mlm)) > 50 and mlm != lens
    gen = step_plan("gen_kv", 100)
    assert gen == gen_plan(100) and all(1 <= b <= 16 and 16 <= p <= 256 and 64 <= n <= 256 for b, p, n in gen)
    assert len({b for b, _, _ in gen}) > 8 and len({n for _, _, n in gen}) > 30
    assert step_plan("resnet50", 10) is None and step_plan("gpt2", 10) is None
    assert steps_of("gen_kv", 30, 5, 10, 2) == (10, 2) and steps_of("mlm_dyn", 30, 5, 10, 2) == (30, 5)
    cnn = step_plan("cnn_dyn", 100)
    assert cnn == step_plan("cnn_dyn", 100) and all(CNN_MIN_BATCH <= b <= CNN_MAX_BATCH and s in CNN_SIDES for b, s in cnn)
    assert len({s for _, s in cnn}) == len(CNN_SIDES) and len({b for b, _ in cnn}) > 30
    t5 = step_plan("t5_dyn", 100)
    assert all(T5_MIN_SRC <= a <= T5_MAX_SRC and T5_MIN_TGT <= b <= T5_MAX_TGT for a, b in t5) and len(set(t5)) > 90
    llama = step_plan("llama_gen", 100)
    assert all(LLAMA_MIN_BATCH <= b <= LLAMA_MAX_BATCH and LLAMA_MIN_NEW <= n <= LLAMA_MAX_NEW for b, _, n in llama)
    assert steps_of("llama_gen", 30, 5, 10, 2) == (10, 2) and steps_of("t5_dyn", 30, 5, 10, 2) == (30, 5)
    det = step_plan("det_dyn", 100)
    assert all(DET_MIN_BATCH <= b <= DET_MAX_BATCH and s in DET_SIDES and 1 <= n <= DET_MAX_BOXES for b, s, n in det)
    assert len({s for _, s, _ in det}) > 10 and len({n for _, _, n in det}) > 20
    kvs = step_plan("kv_serve", 100)
    assert all(KVS_MIN_BATCH <= b <= KVS_MAX_BATCH and KVS_MIN_PROMPT <= p <= KVS_MAX_PROMPT and KVS_MIN_NEW <= n <= KVS_MAX_NEW
               for b, p, n in kvs) and kvs != llama and steps_of("kv_serve", 30, 5, 10, 2) == (10, 2)
    serve = step_plan("bert_serve", 100)
    assert all(len(r) == 2 * SERVE_REQUESTS for r in serve) and len({r[1] for r in serve}) > 80
    assert all(1 <= b <= SERVE_MAX_BATCH and SERVE_MIN_SEQ <= q <= SERVE_MAX_SEQ for r in serve for b, q in zip(r[0::2], r[1::2]))
    assert set(EXTRA_MODELS) <= set(DYN_MODELS) and not set(EXTRA_MODELS) & set(MODELS)

    budgets, skipped = w8_budgets(w7, ["gpt2_dyn", "mlm_dyn", "gpt2"])
    assert budgets["gpt2_dyn"]["smallest_peer"] == "expandable"
    assert budgets["gpt2_dyn"]["budget_bytes"] == w8_budget(int(14.3 * GiB))
    assert budgets["mlm_dyn"]["budget_bytes"] == w8_budget(int(6.8 * GiB))
    assert skipped == ["gpt2: not measured in W7 (--models)"]
    _, skipped = w8_budgets({"gen_kv": {"xlog": {"device_peak_bytes": 5}}}, ["gen_kv"])
    assert skipped and skipped[0].startswith("gen_kv: no PyTorch device peak")

    w8_runs = synthetic_w8_runs(w7)
    w8 = summarize_w8(runs + w8_runs, w7)
    assert w8 is not None and len(w8) == 4
    s = {(x["model"], x["allocator"]): x for x in w8}
    good, bad = s[("gpt2_dyn", "xlog")], s[("gpt2_dyn", "xlog_pool")]
    assert good["refusals"] == 0 and good["steps_completed"] == 35 and good["exceeded"] is False
    assert bad["exceeded"] is True and bad["samples_over_budget"] == 17 and bad["max_excess_bytes"] == 300 * MiB
    assert abs(good["step_vs_unconstrained"] - 31.0 / 30.0) < 1e-12
    assert summarize_w8(runs, w7) is None
    targets = {t["target"]: t for t in evaluate_targets(w7, w8)}
    assert targets["W7 resnet50 [xlog]: step time / caching"]["met"] is True
    assert targets["W7 mlm_dyn [xlog]: step time / caching"]["met"] is False  # 22.5 vs 20
    assert targets["W7 gpt2_dyn [xlog]: device peak / smallest PyTorch peak (expandable)"]["met"] is False  # 14.5 vs 14.3
    assert targets["W7 resnet50 [xlog]: device peak / smallest PyTorch peak (expandable)"]["met"] is True
    assert targets["W7 gpt2_dyn [xlog]: device peak / peak live"]["met"] is False  # 1.21
    assert targets["W7 gpt2_dyn [xlog]: charged peak / device peak for xlog (less untracked)"]["met"] is True  # 1.02
    assert targets["W7 gpt2_dyn [xlog]: charged peak / device peak for xlog (less untracked)"]["limit"] == "1.000-1.050"
    assert targets["W7 gen_kv [xlog]: device peak / peak live"]["met"] is True  # 1.5 / 1.4 = 1.07
    assert targets["W8 gpt2_dyn [xlog]: refusals"]["met"] is True
    assert targets["W8 gpt2_dyn [xlog]: NVML used - baseline - budget, max (GiB)"]["met"] is True
    assert targets["W8 gpt2_dyn [xlog_pool]: NVML used - baseline - budget, max (GiB)"]["met"] is False
    no_numbers = evaluate_targets({"gpt2": {"xlog": {"step_vs_caching": None}}}, None)
    assert no_numbers[0]["met"] is None and no_numbers[0]["measured"] is None

    report = {"meta": {"device": "NVIDIA H200", "date": "2026-11-27", "torch": "2.11.0+cu130"},
              "w7": w7, "w8": w8, "targets": evaluate_targets(w7, w8), "seconds": 321.0}
    text = format_markdown(report)
    assert "NVIDIA H200" in text and "torch 2.11.0+cu130" in text
    assert "| resnet50 | PyTorch cudaMallocAsync | 35.50 | 35.0-36.0 |" in text
    assert "| gpt2_dyn | PyTorch expandable_segments | 31.50 |" in text
    assert "| gpt2_dyn | xlog (XLOG_MEMORY=pool) |" in text
    assert "1 of 3 run(s) failed: timed out after 240 s" in text
    assert text.count("expandable segments not in effect") == 1
    assert "| 35 of 35 | 0 |" in text and "**YES**" in text and "Total 321 s." in text
    header = [l for l in text.splitlines() if l.startswith("| model | allocator | median")][0]
    w7_rows = [l for l in text.splitlines() if l.startswith("| ") and l.split("|")[2].strip() in ALLOCATOR_NAMES.values()
               and text.index(l) < text.index("## W8")]
    assert w7_rows and {len(l.split("|")) for l in w7_rows} == {len(header.split("|"))}, "every W7 row has the header's columns"
    w8_header = [l for l in text.splitlines() if l.startswith("| model | allocator | budget")][0]
    w8_rows = [l for l in text.splitlines()[text.splitlines().index(w8_header) + 2:] if l.startswith("| ")]
    w8_rows = w8_rows[: len(w8)]
    assert {len(l.split("|")) for l in w8_rows} == {len(w8_header.split("|"))}, "every W8 row has the header's columns"
    text = format_markdown({"meta": {}, "w7": {}, "w8": None, "w8_skipped": "not run (--no-w8)", "targets": []})
    assert "not run (--no-w8)" in text

    env = child_env("async")
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert "XLOG_BACKEND" not in env
    env = child_env("expandable")
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    env = child_env("xlog", budget=12345)
    assert env["XLOG_BUDGET_BYTES"] == "12345" and env["XLOG_BACKEND"] == "cuda" and "XLOG_MEMORY" not in env
    assert "PYTORCH_ALLOC_CONF" not in env and env["PYTHONPATH"].split(os.pathsep)[0] == os.path.join(REPO, "python")
    env = child_env("xlog_pool")
    assert env["XLOG_MEMORY"] == "pool" and "XLOG_BUDGET_BYTES" not in env
    assert skip_reason(100.0, 50.0, 0.0) is None and skip_reason(100.0, 50.0, 150.0) is None
    assert (skip_reason(100.0, 51.0, 150.0) or "").startswith("skipped: time budget")
    print("w7_training self-test: ok")
    return 0


# ---------------------------------------------------------------------------


def parse_args(argv: Optional[List[str]] = None):
    ap = argparse.ArgumentParser(description="W7/W8: real training under PyTorch's allocators and xlog")
    ap.add_argument("--out", help="output directory (results.json, results.md, runs/)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {ALL_MODELS}")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS), help=f"comma-separated, from {ALLOCATORS}")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up steps per run (default 5)")
    ap.add_argument("--shapes-warm", action="store_true",
                    help="warm up on the timed steps' shapes: one untimed pass over them first (models whose shapes change)")
    ap.add_argument("--gen-kv-steps", type=int, default=10, help="timed steps of gen_kv (default 10)")
    ap.add_argument("--gen-kv-warmup", type=int, default=2, help="warm-up steps of gen_kv (default 2)")
    ap.add_argument("--repeat", type=int, default=1, help="repeats of every W7 run (default 1)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per run before it is killed (default 240)")
    ap.add_argument("--time-budget", type=float, default=0.0,
                    help="seconds for the whole benchmark: runs that would end past it are skipped (default 0: none)")
    ap.add_argument("--no-prestart", dest="prestart", action="store_false",
                    help="start each run's process only when its turn comes")
    ap.add_argument("--no-w8", dest="w8", action="store_false", help="skip W8")
    ap.add_argument("--w8-models", default=",".join(W8_MODELS), help=f"comma-separated (default {','.join(W8_MODELS)})")
    ap.add_argument("--w8-allocators", default="xlog", help=f"comma-separated, from {list(XLOG_ALLOCATORS)} (default xlog)")
    ap.add_argument("--w8-repeat", type=int, default=1, help="repeats of every W8 run (default 1)")
    ap.add_argument("--trace-dir", help="xlog runs write their memory log (a replayable trace) here, "
                    "MODEL-ALLOCATOR-rN.csv; the log costs step time, so do not time such runs")
    ap.add_argument("--self-test", action="store_true", help="check the pure-Python parts and exit (no GPU)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--wait-go", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child or args.self_test:
        return args
    args.models = [m for m in args.models.split(",") if m]
    args.allocators = [a for a in args.allocators.split(",") if a]
    args.w8_models = [m for m in args.w8_models.split(",") if m]
    args.w8_allocators = [a for a in args.w8_allocators.split(",") if a]
    bad = ([m for m in args.models + args.w8_models if m not in ALL_MODELS]
           + [a for a in args.allocators if a not in ALLOCATORS]
           + [a for a in args.w8_allocators if a not in XLOG_ALLOCATORS])
    if bad:
        ap.error(f"unknown model(s)/allocator(s) {bad}; models {ALL_MODELS}, allocators {ALLOCATORS}, "
                 f"W8 allocators {list(XLOG_ALLOCATORS)}")
    if min(args.steps, args.gen_kv_steps, args.repeat, args.w8_repeat) < 1 or min(args.warmup, args.gen_kv_warmup) < 0 \
            or args.timeout <= 0 or args.time_budget < 0:
        ap.error("--steps, --gen-kv-steps, --repeat and --w8-repeat must be >= 1, the warm-ups >= 0, "
                 "--timeout > 0, --time-budget >= 0")
    if not args.out:
        ap.error("--out DIR is required")
    return args


def wait_for_go() -> bool:
    """The prestarted child's gate: True once the driver says go, False at
    end of input (the driver cancelled it or ended)."""
    return sys.stdin.readline().strip() == "go"


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.self_test:
        return self_test()
    if args.child:
        res = run_child(json.loads(args.child), wait_for_go if args.wait_go else None)
        if res.get("error") == "cancelled before it started":
            return 0
        with open(args.result, "w") as f:
            json.dump(res, f, indent=2, default=str)
        if not res.get("ok"):
            print(res.get("traceback") or res.get("error"), file=sys.stderr)
        return 0 if res.get("ok") else 1
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
