#!/usr/bin/env python3
"""benches/w12_shared_gpu.py — W12 (issue 24): two processes share one GPU,
each with half of a budget, each running a changing-size workload through
xlog that fits its half. Neither may be refused, and the device total must
stay under the two budgets plus the two processes' contexts.

Each process (a child of this driver, XLOG_BUDGET_BYTES = budget / 2):

  torch  (default) PyTorch through xlog_cuda.torch.enable(): every step frees
         each live tensor with probability 1/2, then allocates tensors of
         random sizes (log-uniform, --min-size .. half x fill / 6) up to a
         random target in [0.3, 1] x (half x --fill) of live bytes, writes
         each new one (fill_) and reads one (sum), then synchronizes;
  capi   the same sizes as xlog blocks through the C ABI (xlog_cuda.Runtime,
         allocate/free on one stream, synchronized every step): no PyTorch.

Live bytes never exceed half x --fill (default 0.7): the workload fits its
half with room for rounding (2 MiB pages) and fragmentation.

Measurement (NVML in the driver, which holds no CUDA context): the device's
used memory before any child ("idle"); then the children start one after
the other and each, once its CUDA context, warm-up allocation (torch:
cuBLAS handles too) are made, says READY with what xlog charges it then; its
baseline is the growth of the device's used memory since the previous
reading, less that charge. Then both are told to go at once, and a thread
samples the device's used memory about every millisecond while they run
(--seconds each). The limit is idle + both baselines + both budgets.

Pass: both processes finished, 0 refusals in each (caught errors, and
xlog's failed_allocations), and the device total peak at or under the
limit.

Output (--out DIR): results.json, results.md, and p0.log / p1.log (each
child's output). Exit status 0 when it ran (pass or fail: see results.md),
1 when it could not run, 2 on bad arguments.

    XLOG_CUDA_LIBRARY=/path/libxlog_cuda.so python3 benches/w12_shared_gpu.py --out OUT
        [--budget 16GiB] [--seconds 30] [--workload torch|capi] [--fill 0.7]
        [--memory pool] [--timeout 240]

    python3 benches/w12_shared_gpu.py --self-test    # the pure parts, no GPU
    python3 benches/w12_shared_gpu.py --out O --backend sim --workload capi --seconds 2
        # the orchestration on the sim backend (no GPU, no NVML)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import queue
import random
import re
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10

WORKLOADS = ("torch", "capi")
DEFAULT_BUDGET = 16 * GiB
DEFAULT_FILL = 0.7
MIN_SIZE = 256 * KiB
SIZE_ALIGN = 512
SEED = 12
PROCESSES = 2


# ---------------------------------------------------------------------------
# Pure parts (no GPU): sizes, the workload's plan, the verdict, the table
# ---------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": KiB, "kb": KiB, "kib": KiB, "m": MiB, "mb": MiB, "mib": MiB,
          "g": GiB, "gb": GiB, "gib": GiB, "t": GiB << 10, "tb": GiB << 10, "tib": GiB << 10}


def parse_size(text: str) -> int:
    """'16GiB', '800MiB', '12345' -> bytes (binary units; K/M/G/T and
    KB/MB/GB/TB mean the same here)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 16GiB, 800MiB, 12345)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1 or value != value:
        raise ValueError(f"size must be at least 1 byte: {text!r}")
    return int(value)


def half_budgets(total: int, processes: int = PROCESSES) -> List[int]:
    """Each process's XLOG_BUDGET_BYTES: the total split evenly (rounded down)."""
    if total < processes:
        raise ValueError(f"budget {total} too small for {processes} processes")
    return [total // processes] * processes


def live_cap(budget: int, fill: float) -> int:
    """The most live bytes a process holds at once: its budget x fill."""
    if not 0 < fill <= 1:
        raise ValueError(f"fill must be in (0, 1], got {fill}")
    return int(budget * fill)


def max_size(cap: int) -> int:
    return max(MIN_SIZE, cap // 6)


def draw_size(rng: random.Random, low: int, high: int) -> int:
    """Log-uniform in [low, high], a multiple of SIZE_ALIGN."""
    size = int(math.exp(rng.uniform(math.log(low), math.log(high))))
    return max(SIZE_ALIGN, min(high, size) // SIZE_ALIGN * SIZE_ALIGN)


def plan_step(rng: random.Random, live: Sequence[int], cap: int, low: int = MIN_SIZE) -> Tuple[List[int], List[int]]:
    """One step of the workload given the sizes live now: (indices into
    `live` to free, sizes to allocate). Each live block is freed with
    probability 1/2; then new sizes are drawn until the live total would
    reach a target drawn in [0.3, 1] x cap (never above cap)."""
    frees = [i for i in range(len(live)) if rng.random() < 0.5]
    kept = sum(live) - sum(live[i] for i in frees)
    target = int(cap * rng.uniform(0.3, 1.0))
    high = max_size(cap)
    new: List[int] = []
    for _ in range(64):
        size = draw_size(rng, low, high)
        if kept + size > target:
            break
        new.append(size)
        kept += size
    return frees, new


def simulate_plan(seed: int, cap: int, steps: int) -> Dict[str, Any]:
    """The plan of `steps` steps without a GPU: the peak of live bytes, the
    distinct sizes, the allocations (for the self-test and a dry look)."""
    rng = random.Random(seed)
    live: List[int] = []
    peak, sizes, allocations = 0, set(), 0
    for _ in range(steps):
        frees, new = plan_step(rng, live, cap)
        live = [s for i, s in enumerate(live) if i not in set(frees)] + new
        peak = max(peak, sum(live))
        sizes.update(new)
        allocations += len(new)
    return {"peak_live": peak, "distinct_sizes": len(sizes), "allocations": allocations}


def baselines_from(idle: Optional[int], readings: Sequence[Optional[int]], charges: Sequence[Optional[int]]) -> List[Optional[int]]:
    """Each process's context baseline: the device's used memory after it
    said READY less the reading before it (idle for the first), less what
    xlog charged it then."""
    out: List[Optional[int]] = []
    before = idle
    for reading, charge in zip(readings, charges):
        if before is None or reading is None:
            out.append(None)
        else:
            out.append(reading - before - (charge or 0))
        before = reading
    return out


def verdict(processes: Sequence[Dict[str, Any]], idle: Optional[int], baselines: Sequence[Optional[int]],
            budgets: Sequence[int], device_peak: Optional[int]) -> Dict[str, Any]:
    """The pass/fail of W12 and its numbers. The device check is None (not
    made) without NVML figures."""
    refusals = [p.get("refusals") for p in processes]
    finished = all(p.get("ok") for p in processes) and len(processes) == len(budgets)
    no_refusals = finished and all(r == 0 for r in refusals)
    limit = None
    if idle is not None and baselines and all(b is not None for b in baselines):
        limit = idle + sum(baselines) + sum(budgets)  # type: ignore[arg-type]
    device_ok = None if limit is None or device_peak is None else device_peak <= limit
    failures = []
    if not finished:
        failures.append("a process did not finish: " + "; ".join(
            f"p{i}: {p.get('error') or 'no result'}" for i, p in enumerate(processes) if not p.get("ok")))
    if finished and not no_refusals:
        failures.append("refusals " + ", ".join(f"p{i} {r}" for i, r in enumerate(refusals)))
    if device_ok is False:
        failures.append(f"device total peak {device_peak / GiB:.3f} GiB above the limit {limit / GiB:.3f} GiB")  # type: ignore[operator]
    passed = finished and no_refusals and device_ok is not False
    return {
        "pass": passed,
        "device_checked": device_ok is not None,
        "finished": finished,
        "refusals": refusals,
        "limit_bytes": limit,
        "device_peak_bytes": device_peak,
        "device_peak_above_idle_bytes": None if device_peak is None or idle is None else device_peak - idle,
        "margin_bytes": None if limit is None or device_peak is None else limit - device_peak,
        "failures": failures,
    }


def fmt_gib(n: Optional[float]) -> str:
    return "—" if n is None else f"{n / GiB:.3f}"


def one_line(text: Any, limit: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_markdown(report: Dict[str, Any]) -> str:
    meta, v = report.get("meta", {}), report.get("verdict", {})
    procs = report.get("processes", [])
    min_size = "?" if meta.get("min_size") is None else f"{meta['min_size'] / KiB:.0f} KiB"
    lines = [
        "# W12: two processes share one GPU, each with half of a budget",
        "",
        f"- device: {meta.get('device', '?')} (driver {meta.get('driver', '?')}), date {meta.get('date', '?')}",
        f"- library: {meta.get('library', '?')}; XLOG_MEMORY {meta.get('memory') or '(default)'}; "
        f"backend {meta.get('backend', '?')}",
        f"- workload: {meta.get('workload', '?')}, {meta.get('seconds', '?')} s per process, live bytes at most "
        f"{meta.get('fill', '?')} x its budget, sizes log-uniform from "
        f"{min_size} to a sixth of that",
        f"- budget {fmt_gib(meta.get('budget_bytes'))} GiB in all: "
        + ", ".join(f"p{i} {fmt_gib(b)} GiB" for i, b in enumerate(report.get("budgets", []))),
        "",
        "| process | budget GiB | context baseline GiB | steps | allocations | refusals | peak live GiB "
        "| xlog charged peak GiB | charged/budget | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for i, p in enumerate(procs):
        budget = (report.get("budgets") or [None] * len(procs))[i]
        base = (report.get("baselines") or [None] * len(procs))[i]
        charged = p.get("charged_peak_bytes")
        notes = []
        if not p.get("ok"):
            notes.append(one_line(p.get("error") or "no result"))
        if p.get("first_refusal"):
            notes.append("first refusal: " + one_line(p["first_refusal"]))
        if p.get("charged_source") == "peak_outstanding_bytes":
            notes.append("charged = peak_outstanding_bytes")
        lines.append("| " + " | ".join([
            f"p{i}", fmt_gib(budget), fmt_gib(base), str(p.get("steps", "—")), str(p.get("allocations", "—")),
            str(p.get("refusals", "—")), fmt_gib(p.get("peak_live_bytes")), fmt_gib(charged),
            "—" if charged is None or not budget else f"{charged / budget:.3f}", "; ".join(notes),
        ]) + " |")
    lines += [
        "",
        "| device idle GiB | limit GiB (idle + baselines + budgets) | device total peak GiB | above idle GiB "
        "| margin GiB | samples over limit | samples |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        "| " + " | ".join([
            fmt_gib(report.get("idle_used_bytes")), fmt_gib(v.get("limit_bytes")), fmt_gib(v.get("device_peak_bytes")),
            fmt_gib(v.get("device_peak_above_idle_bytes")), fmt_gib(v.get("margin_bytes")),
            "—" if report.get("samples_over_limit") is None else str(report["samples_over_limit"]),
            "—" if report.get("samples") is None else str(report["samples"]),
        ]) + " |",
        "",
    ]
    if v.get("pass"):
        tail = "" if v.get("device_checked") else " (refusals only: no NVML figures, the device total was not checked)"
        lines.append(f"**W12: PASS**{tail}: 0 refusals in each process"
                     + (", device total within the two budgets plus the two contexts" if v.get("device_checked") else ""))
    else:
        lines.append("**W12: FAIL**: " + "; ".join(v.get("failures") or ["?"]))
    lines += ["", f"Total {report.get('seconds', 0):.0f} s."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# The child: one process of the two (runs with the GPU, or on sim)
# ---------------------------------------------------------------------------


def charged_now(st) -> int:
    held = getattr(st, "held_bytes", None)
    return int(held if held is not None else st.outstanding_bytes)


def charged_peak(st) -> Tuple[int, str]:
    held = getattr(st, "peak_held_bytes", None)
    if held is not None:
        return int(held), "peak_held_bytes"
    return int(st.peak_outstanding_bytes), "peak_outstanding_bytes"


class TorchWorkload:
    """Tensors through xlog_cuda.torch.enable()."""

    def __init__(self, backend: str):
        import xlog_cuda.torch as xt

        xt.enable(backend=backend)
        import torch

        self.torch, self.xt = torch, xt
        self.oom = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                     getattr(torch.cuda, "OutOfMemoryError", None)) if t)
        torch.zeros(1, device="cuda")
        a = torch.randn(256, 256, device="cuda")
        (a @ a).sum().item()
        del a
        torch.cuda.synchronize()
        self.live: List[Any] = []

    def stats(self):
        return self.xt.stats(0)

    def allocate(self, size: int, k: int) -> Any:
        t = self.torch.empty(size, dtype=self.torch.uint8, device="cuda")
        t.fill_(k & 0xFF)
        return t

    def touch(self, block: Any) -> None:
        block[: 1 << 20].sum()

    def free(self, block: Any) -> None:
        del block

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def refused(self, e: BaseException) -> bool:
        return isinstance(e, self.oom)


class CapiWorkload:
    """Blocks through the C ABI (xlog_cuda.Runtime)."""

    def __init__(self, backend: str):
        import xlog_cuda as xc

        self.xc = xc
        self.rt = xc.Runtime(0, backend=backend)  # the rest (budget, memory) from the environment
        self.stream = self.rt.acquire_stream()
        b = self.rt.allocate(1 << 20, self.stream, tag="w12-warmup")
        b.free()
        self.stream.synchronize()

    def stats(self):
        return self.rt.stats()

    def allocate(self, size: int, k: int) -> Any:
        return self.rt.allocate(size, self.stream, tag="w12")

    def touch(self, block: Any) -> None:
        pass

    def free(self, block: Any) -> None:
        block.free()

    def sync(self) -> None:
        self.stream.synchronize()

    def refused(self, e: BaseException) -> bool:
        return isinstance(e, (self.xc.OutOfBudgetError, self.xc.OutOfMemoryError))

    def close(self) -> None:
        self.stream.release()
        self.rt.close()


def run_child(index: int, workload: str, backend: str, seconds: float, fill: float, seed: int,
              min_size: int) -> Dict[str, Any]:
    """One process: set up, say READY (stdout) with its charge, wait for go
    (stdin), run the workload for `seconds`, return the result."""
    res: Dict[str, Any] = {"index": index, "pid": os.getpid(), "ok": False, "error": None, "workload": workload,
                           "xlog_memory": os.environ.get("XLOG_MEMORY", "(unset)")}
    try:
        budget = int(os.environ.get("XLOG_BUDGET_BYTES", "0"))
        res["budget_bytes"] = budget
        cap = live_cap(budget, fill) if budget else 1 * GiB
        t0 = time.perf_counter()
        w = TorchWorkload(backend) if workload == "torch" else CapiWorkload(backend)
        res["setup_s"] = time.perf_counter() - t0
        st = w.stats()
        res["charged_at_ready"] = charged_now(st)
        print("READY " + json.dumps({"charged": res["charged_at_ready"], "pid": os.getpid()}), flush=True)
        if sys.stdin.readline().strip() != "go":
            res["error"] = "not told to go"
            return res
        rng = random.Random(seed * 1000 + index)
        live: List[Tuple[int, Any]] = []
        steps = allocations = refusals = 0
        first_refusal = None
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            frees, new = plan_step(rng, [s for s, _ in live], cap, min_size)
            gone = set(frees)
            for i in frees:
                w.free(live[i][1])
            live = [pair for i, pair in enumerate(live) if i not in gone]
            for size in new:
                try:
                    live.append((size, w.allocate(size, steps)))
                    allocations += 1
                except BaseException as e:  # noqa: BLE001 - a refusal is counted, anything else ends the run
                    if not w.refused(e):
                        raise
                    refusals += 1
                    first_refusal = first_refusal or f"step {steps}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    break
            if live:
                w.touch(live[rng.randrange(len(live))][1])
            w.sync()
            steps += 1
        for _, block in live:
            w.free(block)
        live = []
        w.sync()
        st = w.stats()
        peak, source = charged_peak(st)
        res.update(ok=True, steps=steps, allocations=allocations, refusals=max(refusals, int(st.failed_allocations)),
                   caught_refusals=refusals, failed_allocations=int(st.failed_allocations), first_refusal=first_refusal,
                   peak_live_bytes=int(st.peak_live_bytes), charged_peak_bytes=peak, charged_source=source,
                   seconds=time.perf_counter() - started, live_cap_bytes=cap,
                   stats={k: getattr(st, k) for k in getattr(st, "__dataclass_fields__", {})})
        if isinstance(w, CapiWorkload):
            w.close()
    except BaseException as e:  # noqa: BLE001 - reported in the table
        res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        res["traceback"] = traceback.format_exc()[-4000:]
    return res


# ---------------------------------------------------------------------------
# The driver (no CUDA context: NVML readings are device-wide)
# ---------------------------------------------------------------------------


def device_memory() -> Any:
    """NVML's used memory of the device, sampled by a thread when started:
    W7's sampler (`w7_training.NvmlPeak`), here with no CUDA context."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from w7_training import NvmlPeak

    return NvmlPeak()


def device_meta(nvml: Any) -> Dict[str, Any]:
    """The device's name, the driver version and the device's total memory."""
    nv = nvml._nvml
    name, drv = nv.nvmlDeviceGetName(nvml.handle), nv.nvmlSystemGetDriverVersion()
    return {"device": name.decode() if isinstance(name, bytes) else str(name),
            "driver": drv.decode() if isinstance(drv, bytes) else str(drv),
            "device_total_bytes": int(nv.nvmlDeviceGetMemoryInfo(nvml.handle).total)}


def child_env(budget: int, backend: str, memory: Optional[str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLOG_") or k in ("XLOG_CUDA_LIBRARY", "XLOG_CUDA_CACHE_DIR")}
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(name, None)
    env["XLOG_BACKEND"] = backend
    env["XLOG_BUDGET_BYTES"] = str(budget)
    if memory:
        env["XLOG_MEMORY"] = memory
    python_dir = os.path.join(REPO, "python")
    env["PYTHONPATH"] = python_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    nvidia = "/usr/local/nvidia/lib64"
    if os.path.isdir(nvidia) and nvidia not in env.get("LD_LIBRARY_PATH", "").split(":"):
        env["LD_LIBRARY_PATH"] = nvidia + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


class Proc:
    """A child process: READY read from its stdout (the rest goes to its
    log with its stderr), go written to its stdin."""

    def __init__(self, index: int, args, budget: int, out_dir: str):
        self.index = index
        self.result_path = os.path.join(out_dir, f"p{index}.json")
        self.log_path = os.path.join(out_dir, f"p{index}.log")
        if os.path.exists(self.result_path):
            os.remove(self.result_path)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(index), "--result", self.result_path,
               "--workload", args.workload, "--backend", args.backend, "--seconds", str(args.seconds),
               "--fill", str(args.fill), "--seed", str(args.seed), "--min-size", str(args.min_size)]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, env=child_env(budget, args.backend, args.memory), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_ready(self, timeout: float) -> Optional[Dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith("READY "):
                return json.loads(line[6:])
            self.log.write(line)

    def go(self) -> None:
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def finish(self, timeout: float) -> Dict[str, Any]:
        try:
            rc: Optional[int] = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        self._reader.join(timeout=5)
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line:
                self.log.write(line)
        self.log.close()
        try:
            with open(self.result_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            with open(self.log_path, errors="replace") as f:
                tail = [l.strip() for l in f.read().splitlines() if l.strip()][-1:]
            why = f"timed out after {timeout:.0f} s" if rc is None else f"exit {rc}" + (f": {tail[0][:300]}" if tail else "")
            return {"index": self.index, "ok": False, "error": why}

    def cancel(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def drive(args) -> int:
    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    budgets = half_budgets(args.budget)
    meta: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(), "host": platform.node(),
        "library": os.environ.get("XLOG_CUDA_LIBRARY", "(build trees of this checkout)"),
        "memory": args.memory, "backend": args.backend, "workload": args.workload, "seconds": args.seconds,
        "fill": args.fill, "min_size": args.min_size, "budget_bytes": args.budget,
    }
    nvml: Optional[Any] = None
    if args.backend == "cuda":
        try:
            nvml = device_memory()
            meta.update(device_meta(nvml))
        except Exception as e:  # noqa: BLE001
            why = f"NVML is needed on CUDA: {type(e).__name__}: {e}"
            print(f"w12: {why}", file=sys.stderr)
            write_report(out_dir, {"meta": meta, "budgets": budgets, "processes": [],
                                   "verdict": {"pass": False, "failures": [why]},
                                   "seconds": time.monotonic() - started})
            return 1
    idle = nvml.used() if nvml else None
    print(f"w12: {meta.get('device', args.backend)}: budget {fmt_gib(args.budget)} GiB in all, "
          f"{args.workload} workload, {args.seconds} s; device idle at {fmt_gib(idle)} GiB", flush=True)
    procs: List[Proc] = []
    readings: List[Optional[int]] = []
    charges: List[Optional[int]] = []
    results: List[Dict[str, Any]] = []
    failed_start = None
    for i, budget in enumerate(budgets):
        p = Proc(i, args, budget, out_dir)
        procs.append(p)
        ready = p.wait_ready(args.timeout)
        if ready is None:
            failed_start = i
            break
        time.sleep(0.3)  # let the device's figure settle
        readings.append(nvml.used() if nvml else None)
        charges.append(int(ready.get("charged", 0)))
        print(f"w12: p{i} ready (pid {ready.get('pid')}), device at {fmt_gib(readings[-1])} GiB, "
              f"charged {fmt_gib(charges[-1])} GiB", flush=True)
    baselines = baselines_from(idle, readings, charges)
    limit = None if idle is None or len(baselines) < len(budgets) or None in baselines else \
        idle + sum(b for b in baselines if b is not None) + sum(budgets)
    if failed_start is not None:
        for p in procs:
            if p.index != failed_start:
                p.cancel()
        results = [{"index": p.index, "ok": False, "error": "not started: p%d never became ready" % failed_start}
                   for p in procs if p.index != failed_start]
        results.insert(failed_start, procs[failed_start].finish(5.0))
        device_peak = None
    else:
        if nvml:
            nvml.start(limit)
        for p in procs:
            p.go()
        results = [p.finish(args.seconds + args.timeout) for p in procs]
        device_peak = nvml.stop() if nvml else None
    v = verdict(results, idle, baselines, budgets, device_peak)
    report = {
        "meta": meta, "budgets": budgets, "idle_used_bytes": idle, "readings": readings, "charges_at_ready": charges,
        "baselines": baselines, "processes": results, "verdict": v,
        "samples": nvml.samples if nvml else None, "samples_over_limit": nvml.over if nvml else None,
        "seconds": time.monotonic() - started,
    }
    write_report(out_dir, report)
    return 0


def write_report(out_dir: str, report: Dict[str, Any]) -> None:
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    text = format_markdown(report)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    print("\n" + text, flush=True)


# ---------------------------------------------------------------------------
# Self-test of the pure parts (no GPU)
# ---------------------------------------------------------------------------


def self_test() -> int:
    assert parse_size("16GiB") == 16 * GiB and parse_size("800MiB") == 800 * MiB and parse_size("12345") == 12345
    assert parse_size("1.5G") == 3 * GiB // 2 and parse_size(" 2 kb ") == 2048
    for bad in ("", "lots", "-1GiB", "0", "3 parsecs"):
        try:
            parse_size(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"parse_size({bad!r}) did not raise")
    assert half_budgets(16 * GiB) == [8 * GiB, 8 * GiB] and half_budgets(11) == [5, 5]
    assert live_cap(8 * GiB, 0.7) == int(8 * GiB * 0.7)
    for bad in (0.0, 1.5):
        try:
            live_cap(GiB, bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"live_cap(fill={bad}) did not raise")

    rng = random.Random(1)
    sizes = [draw_size(rng, MIN_SIZE, 64 * MiB) for _ in range(2000)]
    assert min(sizes) >= MIN_SIZE - SIZE_ALIGN and max(sizes) <= 64 * MiB and all(s % SIZE_ALIGN == 0 for s in sizes)
    assert sum(s < 4 * MiB for s in sizes) > 400 and sum(s > 16 * MiB for s in sizes) > 300  # log-uniform
    assert len({s % (2 * MiB) for s in sizes}) > 1000  # not page multiples: rounding and fragmentation show

    cap = live_cap(8 * GiB, 0.7)
    rng = random.Random(7)
    live: List[int] = []
    peak = 0
    totals = []
    for _ in range(3000):
        frees, new = plan_step(rng, live, cap)
        assert all(0 <= i < len(live) for i in frees) and len(set(frees)) == len(frees)
        live = [s for i, s in enumerate(live) if i not in set(frees)] + new
        total = sum(live)
        assert total <= cap, (total, cap)
        peak = max(peak, total)
        totals.append(total)
    assert peak > 0.9 * cap and min(totals[10:]) < 0.5 * cap, "live bytes swing across the cap"
    a, b = simulate_plan(3, cap, 200), simulate_plan(3, cap, 200)
    assert a == b and a["peak_live"] <= cap and a["distinct_sizes"] > 500 and a["allocations"] > 500
    assert simulate_plan(4, cap, 200) != a

    assert baselines_from(1000, [3000, 5500], [100, 200]) == [1900, 2300]
    assert baselines_from(None, [None, None], [0, 0]) == [None, None]
    ok = [{"ok": True, "refusals": 0}, {"ok": True, "refusals": 0}]
    v = verdict(ok, 1000, [1900, 2300], [4000, 4000], 12000)
    assert v["pass"] and v["limit_bytes"] == 13200 and v["margin_bytes"] == 1200 and v["device_peak_above_idle_bytes"] == 11000
    v = verdict(ok, 1000, [1900, 2300], [4000, 4000], 13201)
    assert not v["pass"] and "above the limit" in v["failures"][0]
    v = verdict([{"ok": True, "refusals": 2}, {"ok": True, "refusals": 0}], 1000, [1, 1], [4000, 4000], 2000)
    assert not v["pass"] and v["failures"] == ["refusals p0 2, p1 0"]
    v = verdict([{"ok": False, "error": "timed out after 9 s"}, {"ok": True, "refusals": 0}], None, [None, None], [1, 1], None)
    assert not v["pass"] and v["failures"][0].startswith("a process did not finish: p0: timed out")
    v = verdict(ok, None, [None, None], [4000, 4000], None)
    assert v["pass"] and not v["device_checked"] and v["limit_bytes"] is None

    procs = [{"ok": True, "steps": 900, "allocations": 5000, "refusals": 0, "peak_live_bytes": 5 * GiB,
              "charged_peak_bytes": 6 * GiB, "charged_source": "peak_held_bytes"},
             {"ok": True, "steps": 880, "allocations": 4900, "refusals": 1, "first_refusal": "step 3: OutOfMemoryError: x",
              "peak_live_bytes": 5 * GiB, "charged_peak_bytes": 7 * GiB, "charged_source": "peak_outstanding_bytes"}]
    report = {"meta": {"device": "NVIDIA H200", "workload": "torch", "seconds": 30, "fill": 0.7, "min_size": MIN_SIZE,
                       "budget_bytes": 16 * GiB},
              "budgets": [8 * GiB, 8 * GiB], "baselines": [GiB, GiB], "idle_used_bytes": GiB // 2,
              "processes": procs, "verdict": verdict(procs, GiB // 2, [GiB, GiB], [8 * GiB] * 2, 17 * GiB),
              "samples": 30000, "samples_over_limit": 0, "seconds": 75.0}
    text = format_markdown(report)
    assert "| p0 | 8.000 | 1.000 | 900 | 5000 | 0 | 5.000 | 6.000 | 0.750 |" in text
    assert "first refusal: step 3" in text and "charged = peak_outstanding_bytes" in text
    assert "| 0.500 | 18.500 | 17.000 | 16.500 | 1.500 | 0 | 30000 |" in text
    assert "**W12: FAIL**: refusals p0 0, p1 1" in text and "Total 75 s." in text
    report["processes"][1].update(refusals=0, first_refusal=None)
    report["verdict"] = verdict(procs, GiB // 2, [GiB, GiB], [8 * GiB] * 2, 17 * GiB)
    assert "**W12: PASS**: 0 refusals in each process, device total within" in format_markdown(report)

    env = child_env(5 * GiB, "cuda", "pool")
    assert (env["XLOG_BUDGET_BYTES"], env["XLOG_BACKEND"], env["XLOG_MEMORY"]) == (str(5 * GiB), "cuda", "pool")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == os.path.join(REPO, "python")
    assert "XLOG_MEMORY" not in child_env(1, "sim", None)
    print("w12_shared_gpu self-test: ok")
    return 0


# ---------------------------------------------------------------------------


def parse_args(argv: Optional[List[str]] = None):
    ap = argparse.ArgumentParser(description="W12: two processes share one GPU, each with half of a budget")
    ap.add_argument("--out", help="output directory (results.json, results.md, p0.log, p1.log)")
    ap.add_argument("--budget", default="16GiB", help="the budget of both processes together (default 16GiB)")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds each process runs its workload (default 30)")
    ap.add_argument("--workload", default="torch", choices=WORKLOADS, help="torch (default) or capi")
    ap.add_argument("--fill", type=float, default=DEFAULT_FILL, help="live bytes at most this x the budget (default 0.7)")
    ap.add_argument("--min-size", default=str(MIN_SIZE), help="smallest allocation (default 256KiB)")
    ap.add_argument("--memory", default=None, help="XLOG_MEMORY for both processes (default: the library's)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "sim"),
                    help="cuda (default); sim checks the orchestration without a GPU (capi only, no NVML)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds for a process to get ready or to end after its run")
    ap.add_argument("--self-test", action="store_true", help="check the pure parts and exit (no GPU)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.self_test:
        return args
    try:
        args.budget = parse_size(args.budget)
        args.min_size = parse_size(args.min_size)
        half_budgets(args.budget)
        live_cap(args.budget, args.fill)
    except ValueError as e:
        ap.error(str(e))
    if args.seconds <= 0 or args.timeout <= 0:
        ap.error("--seconds and --timeout must be > 0")
    if args.backend == "sim" and args.workload != "capi":
        ap.error("--backend sim needs --workload capi")
    if args.child is None and not args.out:
        ap.error("--out DIR is required")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.self_test:
        return self_test()
    if args.child is not None:
        res = run_child(args.child, args.workload, args.backend, args.seconds, args.fill, args.seed, args.min_size)
        with open(args.result, "w") as f:
            json.dump(res, f, indent=2, default=str)
        if not res.get("ok"):
            print(res.get("traceback") or res.get("error"), file=sys.stderr)
        return 0 if res.get("ok") else 1
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
