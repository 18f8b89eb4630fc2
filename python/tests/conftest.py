"""Shared fixtures. Every test runs on the sim backend.

The package is imported from this checkout (python/), whether or not
PYTHONPATH is set; the library is found through $XLOG_CUDA_LIBRARY (ctest
sets it) or the build trees (target/release after `cargo build --release`).
"""

from __future__ import annotations

import os
import sys

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(PYTHON_DIR)
HEADER = os.path.join(REPO_ROOT, "include", "xlog_cuda.h")
TESTING_HEADER = os.path.join(REPO_ROOT, "include", "xlog", "testing.h")

if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

import xlog_cuda as xc  # noqa: E402

XLOG_ENV = (
    "XLOG_BACKEND",
    "XLOG_BUDGET_BYTES",
    "XLOG_LOG_PATH",
    "XLOG_CACHE",
    "XLOG_POOL_RELEASE_THRESHOLD",
    "XLOG_TRACK_CALLSITES",
)


@pytest.fixture(autouse=True)
def _clean_xlog_env(monkeypatch):
    """Tests start without the XLOG_* defaults a developer may have set.

    The framework-hook tests keep their hook state apart by giving each test
    a sim device ordinal of its own (up to about 800), so the sim backend is
    told to simulate that many devices.
    """
    for name in XLOG_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XLOG_SIM_DEVICES", "1024")


@pytest.fixture
def make_runtime():
    """Open sim runtimes (keyword overrides of Config) and close them after."""
    opened = []

    def make(**overrides):
        rt = xc.Runtime(0, xc.Config(backend="sim"), **overrides)
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        rt.close()


@pytest.fixture
def rt(make_runtime):
    return make_runtime()


@pytest.fixture
def stream(rt):
    with rt.acquire_stream() as s:
        yield s
