"""benches/w12_shared_gpu.py without a GPU: its self-test (sizes, the
workload's plan, baselines, the verdict, the table), its arguments, and the
two-process orchestration on the sim backend (READY, go, results) where a
library that matches this checkout can be loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, load_bench, modules_loading_imports

SCRIPT = f"{REPO_ROOT}/benches/w12_shared_gpu.py"


@pytest.fixture(scope="module")
def w12():
    return load_bench("w12_shared_gpu")


def test_self_test_passes(w12, capsys):
    assert w12.self_test() == 0
    assert "self-test: ok" in capsys.readouterr().out


def test_self_test_from_the_command_line_imports_nothing_heavy():
    p = subprocess.run([sys.executable, SCRIPT, "--self-test"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "w12_shared_gpu self-test: ok" in p.stdout, p.stdout + p.stderr
    assert modules_loading_imports(SCRIPT, ("torch", "xlog_cuda", "pynvml")) == []


def test_arguments(w12):
    args = w12.parse_args(["--out", "o", "--budget", "8GiB", "--seconds", "5", "--memory", "pool"])
    assert (args.budget, args.seconds, args.memory, args.workload, args.backend, args.fill) == (
        8 << 30, 5.0, "pool", "torch", "cuda", 0.7)
    assert args.min_size == 256 << 10
    for bad in (["--budget", "8GiB"], ["--out", "o", "--budget", "lots"], ["--out", "o", "--fill", "0"],
                ["--out", "o", "--backend", "sim"], ["--out", "o", "--seconds", "0"], ["--out", "o", "--budget", "1"]):
        with pytest.raises(SystemExit) as info:
            w12.parse_args(bad)
        assert info.value.code == 2


def test_the_plan_never_exceeds_the_cap_and_is_seeded(w12):
    cap = w12.live_cap(4 << 30, 0.7)
    a = w12.simulate_plan(11, cap, 500)
    assert a == w12.simulate_plan(11, cap, 500) and a["peak_live"] <= cap and a["peak_live"] > 0.8 * cap


def _sim_library_works() -> bool:
    try:
        import xlog_cuda as xc

        with xc.Runtime(0, backend="sim"):
            return True
    except Exception:  # noqa: BLE001 - no library, or one built from another checkout
        return False


def test_two_processes_on_sim(tmp_path):
    """The orchestration end to end on sim: both processes get ready, go,
    run and report; there are no NVML figures, so the device is not checked.
    (Refusals are reported, not asserted: issue 24's pressure path decides them.)"""
    if not _sim_library_works():
        pytest.skip("no libxlog_cuda matching this checkout to run on sim")
    out = tmp_path / "w12"
    p = subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--backend", "sim", "--workload", "capi",
                        "--seconds", "1", "--budget", "512MiB", "--timeout", "60"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((out / "results.json").read_text())
    procs = report["processes"]
    assert [q["ok"] for q in procs] == [True, True], procs
    assert all(q["steps"] > 0 and q["allocations"] > 0 and q["peak_live_bytes"] <= 256 << 20 for q in procs)
    assert report["budgets"] == [256 << 20, 256 << 20] and report["verdict"]["device_checked"] is False
    assert all(isinstance(q["refusals"], int) for q in procs)
    md = (out / "results.md").read_text()
    assert "| p0 | 0.250 |" in md and "| p1 | 0.250 |" in md and "W12: " in md
    assert (out / "p0.log").exists() and (out / "p1.log").exists()
