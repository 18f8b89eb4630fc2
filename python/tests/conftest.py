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


# The memory under test. XLOG_MEMORY is deliberately not in XLOG_ENV: ctest
# runs this suite on xlog's default memory (the arena; XLOG_MEMORY unset)
# and again under XLOG_MEMORY=pool, and the tests hold under either. A test
# about the driver pool's own mechanics (per-stream caches of whole blocks,
# pending frees, reap, byte-exact cached counts) carries
# @pytest.mark.pool_memory: it runs with XLOG_MEMORY=pool whatever the
# environment says (subprocesses included).
PAGE = 2 << 20  # the arena maps and charges device memory in 2 MiB pages (one granule, Hopper's and the sim's)


def load_bench(name: str):
    """The script benches/NAME.py as a module (its directory importable, as
    when it runs: the benches import one another)."""
    import importlib.util

    path = os.path.join(REPO_ROOT, "benches", f"{name}.py")
    if os.path.dirname(path) not in sys.path:
        sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def modules_loading_imports(script: str, names) -> list:
    """Which of `names` a fresh interpreter has imported once it has loaded
    `script` as a module (not run it): the benches' promise that loading
    them, as their self-tests do, needs no framework and no library."""
    import ast
    import subprocess

    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('bench', {script!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"print(sorted(n for n in {tuple(names)!r} if n in sys.modules))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return ast.literal_eval(p.stdout.strip())


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "pool_memory: the test is about the driver pool's mechanics; it runs with XLOG_MEMORY=pool")


def pool_memory() -> bool:
    """Whether runtimes opened now get the driver pool (else the arena)."""
    return xc.Config().memory == "pool"


def held_for(live: int, pages: int = 1) -> int:
    """What a runtime holds for `live` bytes of blocks that all fit in
    `pages` arena pages while the pool keeps no other block: the pool holds
    the blocks, the arena the pages they were carved from."""
    return live if pool_memory() else pages * PAGE


@pytest.fixture(autouse=True)
def _clean_xlog_env(monkeypatch, request):
    """Tests start without the XLOG_* defaults a developer may have set.

    The framework-hook tests keep their hook state apart by giving each test
    a sim device ordinal of its own (up to about 800), so the sim backend is
    told to simulate that many devices.
    """
    for name in XLOG_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XLOG_SIM_DEVICES", "1024")
    if request.node.get_closest_marker("pool_memory") is not None:
        monkeypatch.setenv("XLOG_MEMORY", "pool")


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
