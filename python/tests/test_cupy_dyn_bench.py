"""benches/cupy_dyn.py without a GPU: its self-test (the step plan, the
summary of runs, the table), its arguments, and that loading it imports
neither CuPy nor the library."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO_ROOT, load_bench, modules_loading_imports

SCRIPT = f"{REPO_ROOT}/benches/cupy_dyn.py"


@pytest.fixture(scope="module")
def bench():
    return load_bench("cupy_dyn")


def test_self_test_passes(bench, capsys):
    bench.self_test()
    assert "cupy_dyn self-test: ok" in capsys.readouterr().out


def test_every_allocator_answers_alike_or_is_flagged(bench):
    runs = [{"allocator": a, "answers": [3.0, 4.0], "device_peak_bytes": p, "median_step_ms": 1.0} for a, p in
            (("default", 300), ("async", 200))]
    runs.append({"allocator": "xlog", "answers": [3.0, 4.1], "device_peak_bytes": 190, "median_step_ms": 1.0,
                 "peak_live_bytes": 150, "charged_peak_bytes": 160})
    s = bench.summarize(runs)
    assert s["allocators"]["async"]["same_answers"] and not s["allocators"]["xlog"]["same_answers"]
    assert s["untracked_bytes"] == 30


@pytest.mark.parametrize("args", [["--allocators", "default,pool", "--out", "o"], ["--steps", "0", "--out", "o"], []])
def test_bad_arguments_are_refused(args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr


def test_loading_it_imports_nothing_heavy():
    assert modules_loading_imports(SCRIPT, ("cupy", "xlog_cuda", "pynvml", "torch")) == []
