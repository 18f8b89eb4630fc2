"""benches/w7_turns.py without a GPU: its pure parts (the turn order and
the ratios) give the right numbers, and where PyTorch is missing the
driver still ends, with each model an error row in the outputs it writes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, load_bench

SCRIPT = os.path.join(REPO_ROOT, "benches", "w7_turns.py")


@pytest.fixture(scope="module")
def turns():
    return load_bench("w7_turns")


def test_self_test_passes():
    p = subprocess.run([sys.executable, SCRIPT, "--self-test"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ok" in p.stdout


def test_every_allocator_goes_first_equally_often(turns):
    for n in (2, 3):
        firsts = [turns.turn_order(n, k)[0] for k in range(6 * n)]
        assert sorted(set(firsts)) == list(range(n))
        assert all(firsts.count(i) == 6 for i in range(n))
        assert all(sorted(turns.turn_order(n, k)) == list(range(n)) for k in range(6))


def test_ratios_are_taken_step_by_step_against_the_first_allocator(turns):
    times = {"caching": [[10.0, 40.0]], "xlog": [[12.0, 36.0]], "expandable": [[10.0, 40.0]]}
    s = turns.summarize(times, "caching")
    assert s["expandable"]["ratio_of_totals"] == 1.0
    assert s["xlog"]["ratio_of_totals"] == pytest.approx(48.0 / 50.0)
    assert s["xlog"]["median_step_ratio"] == pytest.approx((1.2 + 0.9) / 2)
    assert s["xlog"]["pass_ratios"] == [pytest.approx(0.96)]


def test_bad_arguments_are_refused():
    for args in (["--models", "nope"], ["--allocators", "caching"], ["--passes", "0"], ["--allocators", "caching,foo"]):
        p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (args, p.stderr)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="PyTorch is installed: this would run on the GPU")
def test_without_torch_each_model_is_an_error_row(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--models", "gpt2_dyn", "--passes", "1", "--steps", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    report = json.loads((out / "results.json").read_text())
    (row,) = report["models"]
    assert row["model"] == "gpt2_dyn" and row["ok"] is False and "child ended" in row["error"]
    assert "| gpt2_dyn | ERROR |" in (out / "results.md").read_text()
