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

from conftest import REPO_ROOT, load_bench, modules_loading_imports

SCRIPT = os.path.join(REPO_ROOT, "benches", "w7_training.py")


@pytest.fixture(scope="module")
def w7():
    return load_bench("w7_training")


def test_importing_it_imports_neither_torch_nor_the_library(w7):
    assert modules_loading_imports(SCRIPT, ("torch", "xlog_cuda", "pynvml", "transformers")) == []
    assert w7.MODELS == ["resnet50", "gpt2", "gpt2_dyn", "mlm_dyn", "gen_kv"]
    assert w7.ALLOCATORS == ["caching", "async", "expandable", "xlog", "xlog_pool"]


def test_self_test_passes(w7, capsys):
    assert w7.self_test() == 0
    assert "self-test: ok" in capsys.readouterr().out


def test_self_test_from_the_command_line():
    p = subprocess.run([sys.executable, SCRIPT, "--self-test"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "self-test: ok" in p.stdout, p.stdout + p.stderr


def test_arguments(w7):
    args = w7.parse_args(["--out", "/tmp/o", "--models", "gpt2", "--allocators", "xlog,caching", "--steps", "7",
                          "--repeat", "2", "--no-w8"])
    assert (args.models, args.allocators, args.steps, args.warmup, args.repeat, args.w8) == (
        ["gpt2"], ["xlog", "caching"], 7, 5, 2, False)
    defaults = w7.parse_args(["--out", "o"])
    assert (defaults.models, defaults.allocators, defaults.steps, defaults.repeat, defaults.w8) == (
        w7.MODELS, w7.ALLOCATORS, 30, 1, True)
    assert (defaults.w8_models, defaults.w8_allocators, defaults.w8_repeat) == (["gpt2_dyn", "mlm_dyn", "gen_kv"], ["xlog"], 1)
    assert (defaults.gen_kv_steps, defaults.gen_kv_warmup, defaults.time_budget, defaults.prestart) == (10, 2, 0.0, True)
    more = w7.parse_args(["--out", "o", "--w8-allocators", "xlog,xlog_pool", "--w8-models", "gpt2_dyn",
                          "--time-budget", "400", "--no-prestart", "--gen-kv-steps", "4"])
    assert (more.w8_allocators, more.w8_models, more.time_budget, more.prestart, more.gen_kv_steps) == (
        ["xlog", "xlog_pool"], ["gpt2_dyn"], 400.0, False, 4)
    extra = w7.parse_args(["--out", "o", "--models", "cnn_dyn,t5_dyn,llama_gen,det_dyn,bert_serve,kv_serve"])
    assert extra.models == w7.EXTRA_MODELS and not set(w7.EXTRA_MODELS) & set(defaults.models)
    for bad in (["--out", "o", "--models", "bert"], ["--out", "o", "--steps", "0"], ["--models", "gpt2"],
                ["--out", "o", "--w8-allocators", "caching"], ["--out", "o", "--gen-kv-steps", "0"],
                ["--out", "o", "--time-budget", "-1"], ["--out", "o", "--w8-models", "llama"]):
        with pytest.raises(SystemExit) as info:
            w7.parse_args(bad)
        assert info.value.code == 2


def test_w8_budget_is_1_05_times_the_peak_rounded_up(w7):
    assert w7.w8_budget(1000) == 1050
    assert w7.w8_budget(1001) == 1052  # 1051.05 -> 1052
    peak = 14_300_000_001
    assert w7.w8_budget(peak) == -(-peak * 105 // 100) and w7.w8_budget(peak) >= 1.05 * peak
    with pytest.raises(ValueError):
        w7.w8_budget(0)


def test_w8_budget_comes_from_the_smallest_pytorch_peak(w7):
    w7_agg = {
        "gpt2_dyn": {"caching": {"device_peak_bytes": 21_000}, "async": {"device_peak_bytes": 14_600},
                     "expandable": {"device_peak_bytes": 14_300}, "xlog": {"device_peak_bytes": 9_000}},
        "mlm_dyn": {"caching": {"device_peak_bytes": None, "errors": ["exit 1: boom"]},
                    "xlog": {"device_peak_bytes": 5}},
        "gen_kv": {"async": {"device_peak_bytes": 2_000}},
    }
    budgets, skipped = w7.w8_budgets(w7_agg, ["gpt2_dyn", "mlm_dyn", "gen_kv", "resnet50"])
    assert budgets == {
        "gpt2_dyn": {"budget_bytes": 15_015, "smallest_peer": "expandable", "smallest_peer_peak_bytes": 14_300},
        "gen_kv": {"budget_bytes": 2_100, "smallest_peer": "async", "smallest_peer_peak_bytes": 2_000},
    }
    assert skipped == ["mlm_dyn: no PyTorch device peak (exit 1: boom)", "resnet50: not measured in W7 (--models)"]


def test_aggregate_takes_medians_and_keeps_errors(w7):
    runs = [
        {"model": "gpt2", "allocator": "caching", "mode": "w7", "repeat": r, "ok": True,
         "median_step_ms": ms, "device_peak_bytes": peak, "peak_live_bytes": 80}
        for r, (ms, peak) in enumerate([(40.0, 100), (44.0, 120), (50.0, 110)])
    ] + [
        {"model": "gpt2", "allocator": "expandable", "mode": "w7", "repeat": 0, "ok": True,
         "median_step_ms": 45.0, "device_peak_bytes": 95, "peak_live_bytes": 80},
        {"model": "gpt2", "allocator": "xlog", "mode": "w7", "repeat": 0, "ok": True, "median_step_ms": 42.0,
         "device_peak_bytes": 90, "peak_live_bytes": 85,
         "xlog": {"peak_outstanding_bytes": 99, "reserved_bytes_max": 90, "failed_allocations": 1}},
        {"model": "gpt2", "allocator": "xlog", "mode": "w7", "repeat": 1, "ok": False, "error": "exit 1: boom"},
        {"model": "gpt2", "allocator": "xlog", "mode": "w8", "repeat": 0, "ok": True, "median_step_ms": 1.0},
    ]
    out = w7.aggregate(runs)
    caching, xlog = out["gpt2"]["caching"], out["gpt2"]["xlog"]
    assert (caching["median_step_ms"], caching["device_peak_bytes"], caching["device_peak_bytes_max"]) == (44.0, 110, 120)
    assert (caching["step_ms_min"], caching["step_ms_max"], caching["device_per_live"]) == (40.0, 50.0, 110 / 80)
    assert (xlog["runs"], xlog["ok_runs"], xlog["errors"]) == (2, 1, ["exit 1: boom"])
    assert xlog["step_vs_caching"] == 42.0 / 44.0 and xlog["peak_vs_caching"] == 90 / 110
    assert xlog["smallest_peer"] == "expandable" and xlog["peak_vs_smallest_peer"] == 90 / 95
    assert xlog["peak_vs_async"] is None  # no async run
    assert xlog["charged_peak_bytes"] == 99 and xlog["charged_source"] == "peak_outstanding_bytes"
    assert xlog["charged_vs_device"] == 99 / 90 and xlog["device_per_live"] == 90 / 85
    assert xlog["outstanding_vs_device_peak"] == 99 / 90 and xlog["failed_allocations"] == 1
    table = w7.format_markdown({"meta": {}, "w7": out, "w8": None, "targets": w7.evaluate_targets(out, None)})
    assert "| gpt2 | xlog (default: arena) | 42.00 | 42.0-42.0 | 0.955 |" in table
    assert "1 of 2 run(s) failed: exit 1: boom" in table
    targets = {t["target"]: t["met"] for t in w7.evaluate_targets(out, None)}
    assert targets["W7 gpt2 [xlog]: step time / caching"] is True
    assert targets["W7 gpt2 [xlog]: device peak / smallest PyTorch peak (expandable)"] is True
    assert targets["W7 gpt2 [xlog]: device peak / peak live"] is True  # 1.059
    assert targets["W7 gpt2 [xlog]: charged peak / device peak for xlog (less untracked)"] is False  # 1.1 > 1.05


def test_charged_peak_prefers_the_held_figure(w7):
    assert w7.charged_peak_of({"peak_held_bytes": 7, "peak_outstanding_bytes": 9}) == (7, "peak_held_bytes")
    assert w7.charged_peak_of({"peak_held_bytes": None, "peak_outstanding_bytes": 9}) == (9, "peak_outstanding_bytes")
    assert w7.charged_peak_of({}) == (None, None)
    r = w7.run_ratios({"device_peak_bytes": 100, "peak_live_bytes": 80, "xlog": {"peak_held_bytes": 102}})
    assert r == {"device_per_live": 1.25, "charged_vs_device": 1.02, "charged_vs_xlog_device": 1.02,
                 "held_per_live": 102 / 80}
    # Memory no allocator accounts for is not the device's memory for xlog.
    r = w7.run_ratios({"device_peak_bytes": 100, "peak_live_bytes": 80, "untracked_growth_bytes": 4,
                       "xlog": {"peak_held_bytes": 96}})
    assert r["charged_vs_device"] == 0.96 and r["charged_vs_xlog_device"] == 1.0
    assert w7.run_ratios({"device_peak_bytes": 100, "peak_live_bytes": None})["device_per_live"] is None


def test_w8_summary_reports_excess_over_the_budget(w7):
    runs = [
        {"model": "gpt2_dyn", "allocator": "xlog", "mode": "w8", "repeat": r, "ok": True, "median_step_ms": 200.0,
         "device_peak_bytes": 1000 + excess, "budget_bytes": 1000, "max_excess_bytes": excess,
         "samples_over_budget": over, "steps_attempted": 20, "steps_completed": 19, "failed_steps": 1,
         "smallest_peer": "async", "smallest_peer_peak_bytes": 952, "xlog": {"failed_allocations": 2}}
        for r, (excess, over) in enumerate([(-10, 0), (5, 3)])
    ]
    [s] = w7.summarize_w8(runs, {"gpt2_dyn": {"xlog": {"median_step_ms": 190.0}}})
    assert (s["refusals"], s["steps_completed"], s["steps_attempted"], s["failed_steps"]) == (4, 38, 40, 2)
    assert (s["max_excess_bytes"], s["samples_over_budget"], s["exceeded"], s["device_peak_bytes"]) == (5, 3, True, 1005)
    assert s["step_vs_unconstrained"] == 200.0 / 190.0 and s["smallest_peer"] == "async"
    targets = {t["target"]: t["met"] for t in w7.evaluate_targets({}, [s])}
    assert targets == {"W8 gpt2_dyn [xlog]: refusals": False, "W8 gpt2_dyn [xlog]: steps not completed": False,
                       "W8 gpt2_dyn [xlog]: NVML used - baseline - budget, max (GiB)": False}
    md = w7.format_markdown({"meta": {}, "w7": {}, "w8": [s], "targets": []})
    assert "| gpt2_dyn | xlog (default: arena) | 0.00 | async 0.00 | 38 of 40 | 4 |" in md and "**YES**" in md


def test_changing_shapes_are_seeded_and_in_range(w7):
    a, b = w7.dyn_seq_lens(100), w7.dyn_seq_lens(100)
    assert a == b and all(64 <= n <= 1024 for n in a) and len(set(a)) > 30
    assert w7.dyn_seq_lens(100, seed=7) != a
    mlm = w7.step_plan("mlm_dyn", 100)
    assert mlm == w7.step_plan("mlm_dyn", 100) and all(32 <= n <= 512 for n in mlm) and len(set(mlm)) > 30
    gen = w7.step_plan("gen_kv", 50)
    assert gen == w7.gen_plan(50) and w7.gen_plan(10) == gen[:10]
    assert all(1 <= b <= 16 and 16 <= p <= 256 and 64 <= n <= 256 for b, p, n in gen)


def test_shapes_warm_runs_the_timed_plan_twice_the_first_pass_untimed(w7):
    warmup, plan = w7.run_plan("mlm_dyn", 4, 8, shapes_warm=True)
    timed = w7.step_plan("mlm_dyn", 8)
    assert warmup == 8 and plan == timed + timed and len(set(timed)) > 1
    assert w7.run_plan("mlm_dyn", 4, 8, shapes_warm=False) == (4, w7.step_plan("mlm_dyn", 12))
    # A model of one shape keeps its own warm-up.
    assert w7.run_plan("gpt2", 4, 8, shapes_warm=True) == (4, None)


def test_child_environments(w7, monkeypatch):
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "1GiB")  # a stray setting must not reach the runs
    monkeypatch.setenv("XLOG_MEMORY", "pool")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    caching = w7.child_env("caching")
    assert "XLOG_BUDGET_BYTES" not in caching and "PYTORCH_CUDA_ALLOC_CONF" not in caching
    asyn = w7.child_env("async")
    assert asyn["PYTORCH_ALLOC_CONF"] == "backend:cudaMallocAsync"
    expandable = w7.child_env("expandable")
    assert expandable["PYTORCH_CUDA_ALLOC_CONF"] == expandable["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert "XLOG_BACKEND" not in expandable
    xlog = w7.child_env("xlog", budget=5)
    assert (xlog["XLOG_BUDGET_BYTES"], xlog["XLOG_BACKEND"]) == ("5", "cuda")
    assert "XLOG_MEMORY" not in xlog  # the library's default
    assert "XLOG_BUDGET_BYTES" not in w7.child_env("xlog")
    pool = w7.child_env("xlog_pool", budget=7)
    assert (pool["XLOG_MEMORY"], pool["XLOG_BUDGET_BYTES"], pool["XLOG_BACKEND"]) == ("pool", "7", "cuda")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in pool


def test_time_budget(w7):
    assert w7.skip_reason(10.0, 0.0, 0.0) is None
    assert w7.skip_reason(10.0, 20.0, 30.0) is None
    assert w7.skip_reason(10.0, 21.0, 30.0).startswith("skipped: time budget (10 s spent + about 21 s")


def test_driver_reports_failed_runs_instead_of_crashing(tmp_path):
    """Here PyTorch is missing (or there is no GPU): every run fails, and
    the report still comes out, with the reasons."""
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is importable here: the runs would try the GPU")
    out = tmp_path / "w7"
    p = subprocess.run(
        [sys.executable, SCRIPT, "--out", str(out), "--models", "gpt2,gpt2_dyn", "--allocators", "caching,xlog",
         "--steps", "1", "--warmup", "0", "--timeout", "60"],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((out / "results.json").read_text())
    assert [r["ok"] for r in report["runs"]] == [False] * 4
    assert all("torch" in r["error"] for r in report["runs"])
    assert report["w8"] is None and report["w8_skipped"].startswith("skipped")
    assert "gpt2_dyn: no PyTorch device peak" in report["w8_skipped"]
    md = (out / "results.md").read_text()
    assert "| gpt2 | PyTorch caching |" in md and "run(s) failed" in md


FAKE_MODULES = {
    # Enough of torch, transformers and pynvml for a child to import them and
    # then fail once told to go: NVML is "missing" on this machine.
    "torch/__init__.py": "__version__ = '0.fake'\n",
    "transformers/__init__.py": "__version__ = '0.fake'\nclass GPT2Config: pass\nclass GPT2LMHeadModel: pass\n"
                                "class BertConfig: pass\nclass BertForMaskedLM: pass\n",
    "pynvml/__init__.py": "import os, time\n"
                          "def nvmlInit():\n"
                          "    time.sleep(float(os.environ.get('FAKE_NVML_SLEEP', '0')))\n"
                          "    raise RuntimeError('fake NVML: no GPU here')\n",
}


def test_prestarted_children_wait_for_go_and_skips_cancel_them(tmp_path, monkeypatch):
    """With fake modules the children import, wait for go, then fail: each
    run's row has the error from after go; under a time budget the runs
    past it are skipped and their prestarted processes cancelled (no
    result of theirs)."""
    fake = tmp_path / "fake"
    for rel, text in FAKE_MODULES.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(fake), FAKE_NVML_SLEEP="1.5")
    out = tmp_path / "w7"
    p = subprocess.run(
        [sys.executable, SCRIPT, "--out", str(out), "--models", "gpt2_dyn,mlm_dyn", "--allocators", "caching,expandable",
         "--steps", "1", "--warmup", "0", "--timeout", "60", "--no-w8", "--time-budget", "2"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((out / "results.json").read_text())
    runs = report["runs"]
    assert len(runs) == 4 and not any(r["ok"] for r in runs)
    assert runs[0]["error"] == "RuntimeError: fake NVML: no GPU here", runs[0]
    assert runs[0]["torch"] == "0.fake" and runs[0]["alloc_conf"] == "(unset)"
    skipped = [r for r in runs if r.get("skipped")]
    assert skipped and all(r["error"].startswith("skipped: time budget") for r in skipped)
    for r in skipped:  # cancelled before go: no result file
        assert not (out / "runs" / f"w7-{r['model']}-{r['allocator']}-r0.json").exists()
    ran = [r for r in runs if not r.get("skipped")]
    assert all(r["error"] == "RuntimeError: fake NVML: no GPU here" for r in ran)
    expandable = [r for r in ran if r["allocator"] == "expandable"]
    assert all(r["alloc_conf"] == "expandable_segments:True" for r in expandable)
