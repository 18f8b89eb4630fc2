"""benches/w7_ab.py without a GPU: its self-test (the report's ratios and
counters), and the arms it accepts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, load_bench

SCRIPT = os.path.join(REPO_ROOT, "benches", "w7_ab.py")


@pytest.fixture(scope="module")
def ab():
    return load_bench("w7_ab")


def test_self_test_passes():
    p = subprocess.run([sys.executable, SCRIPT, "--self-test"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ok" in p.stdout


def test_arms_name_their_allocator(ab):
    args = ab.parse_args(["--arms", "caching,xlog,caching#2", "--models", "mlm_dyn"])
    assert [ab.allocator_of(a) for a in args.arms] == ["caching", "xlog", "caching"]
    assert [ab.MODES[ab.allocator_of(a)] for a in args.arms] == [0, 1, 0]


@pytest.mark.parametrize("arms", ["caching", "caching,caching", "caching,expandable"])
def test_bad_arms_are_refused(ab, arms):
    with pytest.raises(SystemExit) as e:
        ab.parse_args(["--arms", arms])
    assert e.value.code == 2


def test_a_failed_model_is_a_row_of_its_own(ab):
    report = {"meta": {"arms": ["caching", "xlog"], "steps": 1, "passes": 1},
              "models": [{"model": "gpt2", "ok": False, "error": "RuntimeError: no GPU"}]}
    text = ab.format_markdown(report)
    assert "| gpt2 | failed: RuntimeError: no GPU |" in text
