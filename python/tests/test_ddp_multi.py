"""benches/ddp_multi.py without GPUs: its checks and the step-time
comparison judge results correctly (its own --self-test), and it refuses to
train outside torchrun instead of hanging in init_process_group."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "benches", "ddp_multi.py")


def run(*args: str, env_drop=("RANK", "WORLD_SIZE")) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    return subprocess.run([sys.executable, SCRIPT, *args], env=env, capture_output=True, text=True, timeout=60)


def test_self_test_passes():
    p = run("--self-test")
    assert p.returncode == 0 and "self-test PASS" in p.stdout, p.stdout + p.stderr


def test_outside_torchrun_it_refuses():
    p = run("--steps", "30")
    assert p.returncode == 2 and "torchrun" in p.stderr


def test_bad_arguments_are_refused():
    assert run("--budget", "lots").returncode == 2
    assert run("--steps", "5").returncode == 2
