"""benches/w7_training.py without a GPU: it imports without torch, parses
its arguments, and its pure parts (aggregation, the W8 budget, targets,
the markdown table, the child environments) give the right numbers. The
driver is also run end to end where PyTorch is missing: every run must come
back as an error row, and the outputs must still be written."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "benches", "w7_training.py")


@pytest.fixture(scope="module")
def w7():
    spec = importlib.util.spec_from_file_location("w7_training", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_importing_it_imports_neither_torch_nor_the_library(w7):
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('w7', {SCRIPT!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(sorted(n for n in ('torch', 'xlog_cuda', 'pynvml', 'transformers') if n in sys.modules))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
    assert w7.MODELS == ["resnet50", "gpt2", "gpt2_dyn"]
    assert w7.ALLOCATORS == ["caching", "async", "xlog"]


def test_self_test_passes(w7, capsys):
    assert w7.self_test() == 0
    assert "self-test: ok" in capsys.readouterr().out


def test_arguments(w7):
    args = w7.parse_args(["--out", "/tmp/o", "--models", "gpt2", "--allocators", "xlog,caching", "--steps", "7",
                          "--repeat", "2", "--no-w8"])
    assert (args.models, args.allocators, args.steps, args.warmup, args.repeat, args.w8) == (
        ["gpt2"], ["xlog", "caching"], 7, 5, 2, False)
    defaults = w7.parse_args(["--out", "o"])
    assert (defaults.models, defaults.allocators, defaults.steps, defaults.repeat, defaults.w8) == (
        w7.MODELS, w7.ALLOCATORS, 30, 1, True)
    for bad in (["--out", "o", "--models", "bert"], ["--out", "o", "--steps", "0"], ["--models", "gpt2"]):
        with pytest.raises(SystemExit) as info:
            w7.parse_args(bad)
        assert info.value.code == 2


def test_w8_budget_is_1_1_times_the_peak_rounded_up(w7):
    assert w7.w8_budget(1000) == 1100
    assert w7.w8_budget(1001) == 1102  # 1101.1 -> 1102
    peak = 8_123_456_789
    assert w7.w8_budget(peak) == -(-peak * 11 // 10) and w7.w8_budget(peak) >= 1.1 * peak
    with pytest.raises(ValueError):
        w7.w8_budget(0)


def test_aggregate_takes_medians_and_keeps_errors(w7):
    runs = [
        {"model": "gpt2", "allocator": "caching", "mode": "w7", "repeat": r, "ok": True,
         "median_step_ms": ms, "device_peak_bytes": peak}
        for r, (ms, peak) in enumerate([(40.0, 100), (44.0, 120), (50.0, 110)])
    ] + [
        {"model": "gpt2", "allocator": "xlog", "mode": "w7", "repeat": 0, "ok": True, "median_step_ms": 42.0,
         "device_peak_bytes": 90, "xlog": {"peak_outstanding_bytes": 99, "reserved_bytes_max": 90,
                                            "failed_allocations": 1}},
        {"model": "gpt2", "allocator": "xlog", "mode": "w7", "repeat": 1, "ok": False, "error": "exit 1: boom"},
        {"model": "gpt2", "allocator": "xlog", "mode": "w8", "repeat": 0, "ok": True, "median_step_ms": 1.0},
    ]
    out = w7.aggregate(runs)
    caching, xlog = out["gpt2"]["caching"], out["gpt2"]["xlog"]
    assert (caching["median_step_ms"], caching["device_peak_bytes"], caching["device_peak_bytes_max"]) == (44.0, 110, 120)
    assert (xlog["runs"], xlog["ok_runs"], xlog["errors"]) == (2, 1, ["exit 1: boom"])
    assert xlog["step_vs_caching"] == 42.0 / 44.0 and xlog["peak_vs_caching"] == 90 / 110
    assert xlog["peak_vs_async"] is None  # no async run
    assert xlog["outstanding_vs_device_peak"] == 99 / 90 and xlog["failed_allocations"] == 1
    table = w7.format_markdown({"meta": {}, "w7": out, "w8": None, "targets": w7.evaluate_targets(out, None)})
    assert "| gpt2 | xlog (enable()) | 42.00 | 0.955 |" in table
    assert "1 of 2 run(s) failed: exit 1: boom" in table
    targets = {t["target"]: t["met"] for t in w7.evaluate_targets(out, None)}
    assert targets["W7 gpt2: xlog step time / caching"] is True
    assert targets["W7 gpt2: xlog device peak / cudaMallocAsync's"] is None
    assert targets["W7 gpt2: xlog peak outstanding / its device peak"] is True  # 1.1 exactly


def test_dynamic_lengths_are_seeded_and_in_range(w7):
    a, b = w7.dyn_seq_lens(100), w7.dyn_seq_lens(100)
    assert a == b and all(64 <= n <= 1024 for n in a) and len(set(a)) > 30
    assert w7.dyn_seq_lens(100, seed=7) != a


def test_child_environments(w7, monkeypatch):
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "1GiB")  # a stray setting must not reach the runs
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    caching = w7.child_env("caching")
    assert "XLOG_BUDGET_BYTES" not in caching and "PYTORCH_CUDA_ALLOC_CONF" not in caching
    asyn = w7.child_env("async")
    assert asyn["PYTORCH_ALLOC_CONF"] == "backend:cudaMallocAsync"
    xlog = w7.child_env("xlog", budget=5)
    assert (xlog["XLOG_BUDGET_BYTES"], xlog["XLOG_BACKEND"]) == ("5", "cuda")
    assert "XLOG_BUDGET_BYTES" not in w7.child_env("xlog")


def test_driver_reports_failed_runs_instead_of_crashing(tmp_path):
    """Here PyTorch is missing (or there is no GPU): every run fails, and
    the report still comes out, with the reasons."""
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is importable here: the runs would try the GPU")
    out = tmp_path / "w7"
    p = subprocess.run(
        [sys.executable, SCRIPT, "--out", str(out), "--models", "gpt2", "--allocators", "caching,xlog",
         "--steps", "1", "--warmup", "0", "--timeout", "60"],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((out / "results.json").read_text())
    assert [r["ok"] for r in report["runs"]] == [False, False]
    assert all("torch" in r["error"] for r in report["runs"])
    assert report["w8"] is None and report["w8_skipped"].startswith("skipped")
    md = (out / "results.md").read_text()
    assert "| gpt2 | PyTorch caching |" in md and "run(s) failed" in md
