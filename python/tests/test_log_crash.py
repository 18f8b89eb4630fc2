"""The CSV log survives the process (issue 26, item 1).

A child process opens a sim runtime with a log, allocates three blocks, is
refused by the budget and then dies without closing anything: by an
uncaught OutOfBudgetError, or by SIGKILL while it waits. Every row must be
in the file: the three allocations and the refusal with its reason.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import PYTHON_DIR

# The child: `mode` is "raise" (the refusal is not caught) or "kill" (it
# is caught, the child says so and sleeps until it is killed).
CHILD = textwrap.dedent(
    """
    import sys, time
    import xlog_cuda as xc

    mode, path = sys.argv[1], sys.argv[2]
    # Whole 2 MiB pages: the same numbers under either memory.
    rt = xc.Runtime(0, xc.Config(backend="sim"), budget_bytes=8 << 20, log_path=path)
    stream = rt.acquire_stream()
    kept = [rt.allocate(2 << 20, stream, tag=f"kept {i}") for i in range(3)]
    if mode == "raise":
        rt.allocate(4 << 20, stream, tag="refused")
    try:
        rt.allocate(4 << 20, stream, tag="refused")
    except xc.OutOfBudgetError:
        print("refused", flush=True)
    time.sleep(60)
    """
)


def run_child(mode: str, log: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, "-c", CHILD, mode, log]
    if mode == "raise":
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    child = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "refused", f"the child ended before its refusal: {child.stderr.read()}"
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(args, child.returncode, line + out, err)


def check_log(log: str, killed: bool) -> None:
    with open(log, newline="") as f:
        rows = list(csv.DictReader(f))
    allocated = [r["Tag"] for r in rows if r["Action"] == "allocate"]
    assert allocated == ["kept 0", "kept 1", "kept 2"], rows
    refusals = [r for r in rows if r["Action"] == "allocate failure"]
    assert len(refusals) == 1, rows
    refusal = refusals[0]
    assert (refusal["Tag"], int(refusal["Size"])) == ("refused", 4 << 20)
    for needle in ("out of budget", "requested 4194304", "live 6291456", "limit 8388608"):
        assert needle in refusal["Detail"], refusal["Detail"]
    if killed:
        # Nothing ran after the kill: no close, so no leak or free rows.
        assert not [r for r in rows if r["Action"] in ("leak", "free")], rows


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_the_log_keeps_every_row_when_the_process_dies(mode, tmp_path):
    log = str(tmp_path / "crash.csv")
    done = run_child(mode, log)
    if mode == "raise":
        assert done.returncode == 1, done.stderr
        assert "OutOfBudgetError" in done.stderr, done.stderr
    else:
        assert done.returncode == -signal.SIGKILL, done
    check_log(log, killed=mode == "kill")
