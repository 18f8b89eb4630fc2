"""The OOM shim of xlog_cuda.torch: built once, then loaded from its cache.

PyTorch is not needed. A stand-in `torch` package is written to disk (so
that `from torch.utils import cpp_extension` and subprocesses work as with
the real one): its cpp_extension.load compiles a C stand-in of the shim
with the system C compiler and records every call, and its
CUDAPluggableAllocator dlopens the path it is given and calls the two
symbols, as PyTorch does. So the tests drive the real cache logic, the
real binding of the shim to the library's hooks, and real allocations.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import xlog_cuda as xc
import xlog_cuda.torch as xt

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler to build the stand-in shim")

_devices = itertools.count(700)

SHIM_C = r"""
#include <stddef.h>
typedef void *(*malloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);
static malloc_fn g_malloc;
static free_fn g_free;
void xlog_shim_bind(void *m, void *f) { g_malloc = (malloc_fn)m; g_free = (free_fn)f; }
void *xlog_shim_torch_malloc(long size, int device, void *stream) {
  return g_malloc((size_t)size, device, stream);
}
void xlog_shim_torch_free(void *p, long size, int device, void *stream) {
  if (g_free) g_free(p, (size_t)size, device, stream);
}
"""

FAKE_TORCH = {
    "torch/__init__.py": """
        import os
        __version__ = os.environ.get("FAKE_TORCH_VERSION", "2.99.0+fake")
        class OutOfMemoryError(RuntimeError):
            pass
        from . import cuda
        """,
    "torch/cuda/__init__.py": """
        from . import memory
        OutOfMemoryError = RuntimeError
        def is_initialized():
            return False
        """,
    "torch/cuda/memory.py": """
        import ctypes
        MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
        FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
        current = None
        class CUDAPluggableAllocator:
            def __init__(self, path, alloc_name, free_name):
                self.path = path
                handle = ctypes.CDLL(path)
                self.malloc = MALLOC(ctypes.cast(getattr(handle, alloc_name), ctypes.c_void_p).value)
                self.free = FREE(ctypes.cast(getattr(handle, free_name), ctypes.c_void_p).value)
        def change_current_allocator(allocator):
            global current
            if current is not None:
                raise RuntimeError("Can't swap an already initialized allocator")
            current = allocator
        """,
    "torch/utils/__init__.py": "",
    "torch/utils/cpp_extension.py": """
        import json, os, subprocess
        def load(name, sources, build_directory, is_python_module=True, verbose=False, **kw):
            log = os.environ.get("FAKE_TORCH_BUILD_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(json.dumps({"name": name, "sources": sources, "pid": os.getpid()}) + "\\n")
            if os.environ.get("FAKE_TORCH_BUILD_FAILS"):
                raise RuntimeError("Error building extension 'xlog_torch_oom_shim': ninja: build stopped")
            out = os.path.join(build_directory, name + ".so")
            src = os.path.join(build_directory, "shim.c")
            with open(src, "w") as f:
                f.write(os.environ["FAKE_TORCH_SHIM_C"])
            subprocess.run([os.environ["FAKE_TORCH_CC"], "-shared", "-fPIC", "-O1", src, "-o", out], check=True)
            return out
        """,
}


@pytest.fixture(scope="module")
def fake_torch_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake_torch")
    for rel, text in FAKE_TORCH.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(root)


def _drop_torch_modules():
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        del sys.modules[name]


@pytest.fixture
def shim_env(fake_torch_dir, tmp_path, monkeypatch):
    """The stand-in torch importable in this process, a cache directory of
    this test's own, and a log of every cpp_extension.load call."""
    monkeypatch.syspath_prepend(fake_torch_dir)
    saved = {m: sys.modules[m] for m in list(sys.modules) if m == "torch" or m.startswith("torch.")}
    _drop_torch_modules()
    cache = tmp_path / "cache"
    log = tmp_path / "builds.jsonl"
    monkeypatch.setenv("XLOG_CUDA_CACHE_DIR", str(cache))
    monkeypatch.setenv("FAKE_TORCH_BUILD_LOG", str(log))
    monkeypatch.setenv("FAKE_TORCH_SHIM_C", SHIM_C)
    monkeypatch.setenv("FAKE_TORCH_CC", CC)
    monkeypatch.delenv("FAKE_TORCH_BUILD_FAILS", raising=False)
    monkeypatch.delenv("XLOG_TORCH_OOM_SHIM", raising=False)
    monkeypatch.setattr(xt, "_state", None)
    yield {"cache": str(cache), "log": str(log)}
    _drop_torch_modules()
    sys.modules.update(saved)


def builds(env) -> int:
    try:
        with open(env["log"]) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def fresh_process(monkeypatch):
    """What a new process would see: no torch imported, nothing enabled."""
    _drop_torch_modules()
    monkeypatch.setattr(xt, "_state", None)


# ---------------------------------------------------------------------------
# The cache key and location (no build needed)
# ---------------------------------------------------------------------------


def test_shim_key_changes_with_version_source_and_abi():
    base = xt.shim_key("2.11.0+cu130", b"source", "cxx11abi=True;x86_64;cpython-312")
    assert base == xt.shim_key("2.11.0+cu130", b"source", "cxx11abi=True;x86_64;cpython-312")
    others = {
        xt.shim_key("2.11.1+cu130", b"source", "cxx11abi=True;x86_64;cpython-312"),
        xt.shim_key("2.11.0+cu130", b"source!", "cxx11abi=True;x86_64;cpython-312"),
        xt.shim_key("2.11.0+cu130", b"source", "cxx11abi=False;x86_64;cpython-312"),
        # Field boundaries count: moving bytes between fields is another key.
        xt.shim_key("2.11.0+cu13", b"0source", "cxx11abi=True;x86_64;cpython-312"),
    }
    assert base not in others and len(others) == 4
    assert base.startswith("torch_oom_shim_2_11_0_cu130_")
    assert all(c.isalnum() or c == "_" for c in base)


def test_shim_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("XLOG_CUDA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert xt.shim_cache_dir() == str(tmp_path / "xdg" / "xlog_cuda")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert xt.shim_cache_dir() == str(tmp_path / "home" / ".cache" / "xlog_cuda")
    monkeypatch.setenv("XLOG_CUDA_CACHE_DIR", str(tmp_path / "mine"))
    assert xt.shim_cache_dir() == str(tmp_path / "mine")
    assert xt.shim_path("k") == str(tmp_path / "mine" / "k" / "xlog_torch_oom_shim.so")


# ---------------------------------------------------------------------------
# Build once, then load from the cache
# ---------------------------------------------------------------------------


def test_first_enable_builds_later_ones_load_the_cached_shim(shim_env, monkeypatch):
    dev = next(_devices)
    xt.enable(backend="sim", budget="1MiB", device=dev)
    info = xt.enable_info()
    assert (info["shim_origin"], builds(shim_env)) == ("built", 1)
    shim = info["shim"]
    assert shim.startswith(shim_env["cache"]) and os.path.isfile(shim)
    assert xt.oom_shim() == f"torch.OutOfMemoryError (shim {shim})"
    # No scratch directory or partial file is left next to it.
    assert sorted(os.listdir(os.path.dirname(shim))) == [".lock", "xlog_torch_oom_shim.so"]

    # A new process: the same file, no build, cpp_extension never imported.
    fresh_process(monkeypatch)
    dev2 = next(_devices)
    xt.enable(backend="sim", budget="1MiB", device=dev2)
    info = xt.enable_info()
    assert (info["shim"], info["shim_origin"], builds(shim_env)) == (shim, "cached", 1)
    assert "torch.utils.cpp_extension" not in sys.modules
    assert set(info["seconds"]) == {"hooks", "shim", "allocator", "total"}

    # PyTorch's allocator is the cached shim, bound to this library's hooks:
    # allocations reach the hook runtime and its budget.
    import torch

    alloc = torch.cuda.memory.current
    assert alloc.path == shim
    p = alloc.malloc(4096, dev2, None)
    assert p and xt.stats(dev2).live_bytes == 4096
    assert not alloc.malloc(2 << 20, dev2, None)  # over the budget: the shim sees the refusal
    assert "out of budget" in xc.last_error()
    alloc.free(p, 4096, dev2, None)
    assert xt.stats(dev2).live_bytes == 0


def test_a_new_torch_version_or_shim_source_builds_a_new_entry(shim_env, monkeypatch, tmp_path):
    xt.enable(backend="sim", device=next(_devices))
    first = xt.enable_info()["shim"]

    fresh_process(monkeypatch)
    monkeypatch.setenv("FAKE_TORCH_VERSION", "2.99.1+fake")
    xt.enable(backend="sim", device=next(_devices))
    second = xt.enable_info()["shim"]
    assert second != first and builds(shim_env) == 2 and "2_99_1_fake" in second

    fresh_process(monkeypatch)
    edited = tmp_path / "_torch_oom_shim.cpp"
    edited.write_bytes(open(xt._SHIM_SOURCE, "rb").read() + b"\n// edited\n")
    monkeypatch.setattr(xt, "_SHIM_SOURCE", str(edited))
    xt.enable(backend="sim", device=next(_devices))
    third = xt.enable_info()
    assert third["shim"] not in (first, second) and third["shim_origin"] == "built" and builds(shim_env) == 3


def test_a_cached_shim_that_does_not_load_is_rebuilt(shim_env, monkeypatch):
    xt.enable(backend="sim", device=next(_devices))
    key = os.path.basename(os.path.dirname(xt.enable_info()["shim"]))
    fresh_process(monkeypatch)
    # A damaged entry of the same key in another cache directory (the file
    # this process has mapped is left alone).
    other = shim_env["cache"] + "-damaged"
    damaged = xt.shim_path(key, other)
    os.makedirs(os.path.dirname(damaged))
    with open(damaged, "wb") as f:
        f.write(b"not an ELF file")
    monkeypatch.setenv("XLOG_CUDA_CACHE_DIR", other)
    xt.enable(backend="sim", device=next(_devices))
    info = xt.enable_info()
    assert (info["shim"], info["shim_origin"], builds(shim_env)) == (damaged, "built", 2)
    assert ctypes.CDLL(damaged).xlog_shim_bind  # a loadable library again


def test_a_failed_build_falls_back_with_the_reason_and_caches_nothing(shim_env, monkeypatch):
    monkeypatch.setenv("FAKE_TORCH_BUILD_FAILS", "1")
    with pytest.warns(RuntimeWarning, match="without the OOM shim"):
        xt.enable(backend="sim", device=next(_devices))
    info = xt.enable_info()
    assert info["shim"] is None and "ninja: build stopped" in info["shim_problem"]
    assert xt.oom_shim().startswith("no shim: building it failed: RuntimeError")
    import torch

    assert torch.cuda.memory.current.path == xc.library_path()  # the plain hooks
    entries = os.listdir(shim_env["cache"])
    assert len(entries) == 1
    assert os.listdir(os.path.join(shim_env["cache"], entries[0])) == [".lock"]


def test_shim_can_be_turned_off(shim_env, monkeypatch):
    monkeypatch.setenv("XLOG_TORCH_OOM_SHIM", "0")
    with pytest.warns(RuntimeWarning, match="XLOG_TORCH_OOM_SHIM=0"):
        xt.enable(backend="sim", device=next(_devices))
    assert builds(shim_env) == 0 and xt.enable_info()["shim"] is None


# ---------------------------------------------------------------------------
# Two fresh processes, as on a machine
# ---------------------------------------------------------------------------

PROCESS = """
import json, sys, time
sys.path.insert(0, {python_dir!r})
started = time.perf_counter()
import torch
imported = time.perf_counter()
import xlog_cuda.torch as xt
t0 = time.perf_counter()
xt.enable(backend="sim", budget="1MiB")
enable_s = time.perf_counter() - t0
info = xt.enable_info()
print(json.dumps({{"enable_s": enable_s, "origin": info["shim_origin"], "shim": info["shim"],
                  "cpp_extension_imported": "torch.utils.cpp_extension" in sys.modules,
                  "seconds": info["seconds"]}}))
"""


def test_enable_in_a_second_process_loads_the_shim_without_building(fake_torch_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLOG_") or k == "XLOG_CUDA_LIBRARY"}
    env.setdefault("XLOG_CUDA_LIBRARY", xc.library_path())
    env.update(
        PYTHONPATH=fake_torch_dir,
        XLOG_CUDA_CACHE_DIR=str(tmp_path / "cache"),
        FAKE_TORCH_BUILD_LOG=str(tmp_path / "builds.jsonl"),
        FAKE_TORCH_SHIM_C=SHIM_C,
        FAKE_TORCH_CC=CC,
    )
    runs = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, "-c", PROCESS.format(python_dir=PYTHON_DIR)],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert p.returncode == 0, p.stdout + p.stderr
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert (first["origin"], second["origin"]) == ("built", "cached")
    assert first["shim"] == second["shim"]
    assert first["cpp_extension_imported"] and not second["cpp_extension_imported"]
    with open(tmp_path / "builds.jsonl") as f:
        assert len(f.readlines()) == 1
    # The real target is 0.5 s on the GPU machine (scripts/gpu_frameworks.py
    # measures it there); here the sim's enable() must be far below that.
    assert second["enable_s"] < 0.5, second
