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
typedef int (*record_fn)(void *, void *);
typedef int (*pool_begin_fn)(int, unsigned long long, unsigned long long, void *);
typedef int (*pool_end_fn)(int, unsigned long long, unsigned long long);
typedef int (*pool_release_fn)(int, unsigned long long, unsigned long long, unsigned long long *);
static pool_begin_fn g_pool_begin;
static pool_end_fn g_pool_end;
static pool_release_fn g_pool_release;
static int g_pools_installed;
static malloc_fn g_malloc;
static free_fn g_free;
static record_fn g_record;
static int g_installed;
void xlog_shim_bind(void *m, void *f, void *message, void *r) {
  (void)message;
  g_malloc = (malloc_fn)m; g_free = (free_fn)f; g_record = (record_fn)r;
}
void *xlog_shim_torch_malloc(long size, int device, void *stream) {
  return g_malloc((size_t)size, device, stream);
}
void xlog_shim_torch_free(void *p, long size, int device, void *stream) {
  if (g_free) g_free(p, (size_t)size, device, stream);
}
#ifdef XLOG_SHIM_RECORD_STREAM
int xlog_shim_has_record_stream(void) { return 1; }
int xlog_shim_install_record_stream(char *why, size_t cap) { (void)why; (void)cap; g_installed = 1; return 1; }
#else
int xlog_shim_has_record_stream(void) { return 0; }
int xlog_shim_install_record_stream(char *why, size_t cap) { if (cap) why[0] = 0; return 0; }
#endif
#ifndef FAKE_OLD_SHIM
void xlog_shim_bind_graph_pools(void *b, void *e, void *r) {
  g_pool_begin = (pool_begin_fn)b; g_pool_end = (pool_end_fn)e; g_pool_release = (pool_release_fn)r;
}
#ifdef XLOG_SHIM_RECORD_STREAM
int xlog_shim_has_graph_pools(void) { return 1; }
int xlog_shim_install_graph_pools(char *why, size_t cap) {
#ifdef FAKE_NO_SETTERS
  const char *m = "this PyTorch's CUDAPluggableAllocator has no set_begin_allocate_to_pool";
  size_t i = 0;
  for (; m[i] && i + 1 < cap; i++) why[i] = m[i];
  if (cap) why[i] = 0;
  return 0;
#else
  (void)why; (void)cap;
  if (!g_pool_begin || !g_pool_end || !g_pool_release) return 0;
  g_pools_installed = 1;
  return 1;
#endif
}
#else
int xlog_shim_has_graph_pools(void) { return 0; }
int xlog_shim_install_graph_pools(char *why, size_t cap) { if (cap) why[0] = 0; return 0; }
#endif
#endif
/* The native allocator (job 4 of the real shim): installed instead of the
   Python CUDAPluggableAllocator. fake_torch_native_* do what PyTorch does
   through it: allocate on a device (-1: not installed), and free with the
   tensor's deleter (the device's) or the raw deleter (the pointer alone). */
typedef void (*free_any_fn)(void *);
static free_any_fn g_free_any;
static int g_native;
#ifdef FAKE_NATIVE
#ifdef XLOG_SHIM_RECORD_STREAM
int xlog_shim_install_native(void *free_any, char *why, size_t cap) {
  (void)why; (void)cap;
  if (!g_malloc || !g_free || !free_any) return 0;
  g_free_any = (free_any_fn)free_any;
  g_native = 1;
  return 1;
}
#else
int xlog_shim_install_native(void *free_any, char *why, size_t cap) {
  const char *m = "the shim was built without PyTorch's CUDA headers";
  size_t i = 0;
  (void)free_any;
  for (; m[i] && i + 1 < cap; i++) why[i] = m[i];
  if (cap) why[i] = 0;
  return 0;
}
#endif
#endif
void *fake_torch_native_alloc(long size, int device, void *stream) {
  if (!g_native) return (void *)-1;
  return xlog_shim_torch_malloc(size, device, stream);
}
int fake_torch_native_free(void *p, int device, int raw) {
  if (!g_native) return -1;
  if (raw) g_free_any(p); else g_free(p, 0, device, 0);
  return 0;
}
/* What CUDAGraph::capture_begin / capture_end / reset do through the hooks
   when set (-1: no hook set, PyTorch does nothing); the begin hook passes
   the stream about to capture, as the real shim does. */
int fake_torch_capture_begin(int device, unsigned long long a, unsigned long long b, void *stream) {
  if (!g_pools_installed) return -1;
  return g_pool_begin(device, a, b, stream);
}
int fake_torch_capture_end(int device, unsigned long long a, unsigned long long b) {
  if (!g_pools_installed) return -1;
  return g_pool_end(device, a, b);
}
int fake_torch_release_pool(int device, unsigned long long a, unsigned long long b, unsigned long long *released) {
  if (!g_pools_installed) return -1;
  return g_pool_release(device, a, b, released);
}
/* What PyTorch's CUDAPluggableAllocator::recordStream does with the hook
   set: call it with the block's pointer and the stream (-1: no hook set,
   PyTorch drops the call). */
int fake_torch_record_stream(void *ptr, void *stream) {
  if (!g_installed || !g_record) return -1;
  return g_record(ptr, stream);
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
        def load(name, sources, build_directory, is_python_module=True, verbose=False, extra_cflags=(),
                 with_cuda=None, **kw):
            log = os.environ.get("FAKE_TORCH_BUILD_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(json.dumps({"name": name, "sources": sources, "pid": os.getpid(),
                                        "with_cuda": bool(with_cuda)}) + "\\n")
            if os.environ.get("FAKE_TORCH_BUILD_FAILS"):
                raise RuntimeError("Error building extension 'xlog_torch_oom_shim': ninja: build stopped")
            if with_cuda and os.environ.get("FAKE_TORCH_NO_CUDA"):
                raise OSError("CUDA_HOME environment variable is not set. Please set it to your CUDA install root.")
            out = os.path.join(build_directory, name + ".so")
            src = os.path.join(build_directory, "shim.c")
            with open(src, "w") as f:
                f.write(os.environ["FAKE_TORCH_SHIM_C"])
            flags = [*extra_cflags, *os.environ.get("FAKE_TORCH_CFLAGS", "").split()]
            subprocess.run([os.environ["FAKE_TORCH_CC"], "-shared", "-fPIC", "-O1", *flags, src, "-o", out],
                           check=True)
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
    monkeypatch.delenv("FAKE_TORCH_NO_CUDA", raising=False)
    monkeypatch.delenv("XLOG_TORCH_OOM_SHIM", raising=False)
    monkeypatch.delenv("FAKE_TORCH_CFLAGS", raising=False)
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
    xt.enable(backend="sim", budget="4MiB", device=dev)  # one page (the arena's unit)
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
    xt.enable(backend="sim", budget="4MiB", device=dev2)
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
    assert not alloc.malloc(4 << 20, dev2, None)  # over the budget: the shim sees the refusal
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
    with pytest.warns(RuntimeWarning, match="without the OOM shim") as got:
        xt.enable(backend="sim", device=next(_devices))
    assert any("Tensor.record_stream does not reach xlog (no shim: building it failed" in str(w.message) for w in got)
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


# ---------------------------------------------------------------------------
# The record-stream hook, and the fallback paths
# ---------------------------------------------------------------------------


def _shim_handle():
    handle = ctypes.CDLL(xt.enable_info()["shim"])
    handle.fake_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    handle.fake_torch_record_stream.restype = ctypes.c_int
    return handle


def test_the_shim_sets_the_record_stream_hook_and_it_reaches_xlog(shim_env):
    """Tensor.record_stream -> PyTorch's record-stream hook -> the shim ->
    xlog_torch_record_stream_hook: the free then waits for the recorded
    stream's work (cache off: the bytes stay pending until it is done)."""
    import threading
    import time

    import xlog_cuda.interop as xi

    dev = next(_devices)
    xt.enable(backend="sim", device=dev, cache=False)
    info = xt.enable_info()
    assert (info["record_stream_hook"], info["record_stream_problem"]) == (True, "")
    with open(shim_env["log"]) as f:
        assert [json.loads(line)["with_cuda"] for line in f] == [True]  # the full shim, one build
    import torch

    alloc = torch.cuda.memory.current
    shim = _shim_handle()
    side = 0x7300
    gate = threading.Event()
    with xi.runtime(dev) as rt:
        rt.import_stream(side).enqueue_host(lambda: gate.wait(10))  # `side` is busy until the gate opens
        try:
            # Control: a block never recorded on `side` is released at once.
            p = alloc.malloc(1024, dev, None)
            alloc.free(p, 1024, dev, None)
            assert rt.drain() == 1024
            p = alloc.malloc(4096, dev, None)
            assert shim.fake_torch_record_stream(p, side) == 0, xc.last_error()
            alloc.free(p, 4096, dev, None)
            time.sleep(0.1)
            assert rt.reap() == 0
            assert rt.stats().pending_bytes == 4096  # held for `side`'s work
        finally:
            gate.set()
        assert rt.drain() == 4096
    # A pointer xlog does not hold: the hook reports it (PyTorch raises it).
    assert shim.fake_torch_record_stream(p, side) == int(xc.Status.INVALID_ARGUMENT)
    assert "not a live hook allocation of any device" in xc.last_error()


def test_without_cuda_headers_the_shim_is_built_without_the_hook_and_says_why(shim_env, monkeypatch):
    monkeypatch.setenv("FAKE_TORCH_NO_CUDA", "1")
    with pytest.warns(RuntimeWarning, match=r"Tensor.record_stream does not reach xlog .*CUDA_HOME") as got:
        xt.enable(backend="sim", budget="1MiB", device=next(_devices))
    assert not any("OOM shim" in str(w.message) for w in got), "the OOM shim itself is in use"
    info = xt.enable_info()
    assert info["shim"] and not info["record_stream_hook"]
    assert "CUDA headers failed: OSError: CUDA_HOME" in info["record_stream_problem"]
    with open(shim_env["log"]) as f:
        assert [json.loads(line)["with_cuda"] for line in f] == [True, False]  # tried once, then OOM-only
    # PyTorch drops Tensor.record_stream (no hook set)...
    import torch

    alloc = torch.cuda.memory.current
    p = alloc.malloc(4096, next(iter(xt.enable_info()["devices"])), None)
    assert _shim_handle().fake_torch_record_stream(p, 0x7400) == -1
    # ...and a later process loads the cached shim without retrying the
    # build, with the same reason.
    fresh_process(monkeypatch)
    with pytest.warns(RuntimeWarning, match="Tensor.record_stream does not reach xlog"):
        xt.enable(backend="sim", device=next(_devices))
    again = xt.enable_info()
    assert again["shim_origin"] == "cached" and builds(shim_env) == 2
    assert again["record_stream_problem"] == info["record_stream_problem"]


def test_fallback_without_the_shim_refusals_are_null_with_the_numbers(shim_env, monkeypatch):
    """XLOG_TORCH_OOM_SHIM=0 (or no compiler): enable() warns about both
    consequences, installs the library's hooks directly, and a refused
    allocation reaches PyTorch as NULL, with the reason (the numbers) in
    xlog_cuda.last_error() and counted in stats(): what docs/frameworks.md
    says."""
    monkeypatch.setenv("XLOG_TORCH_OOM_SHIM", "0")
    dev = next(_devices)
    with pytest.warns(RuntimeWarning) as got:
        xt.enable(backend="sim", budget="4MiB", device=dev)
    texts = [str(w.message) for w in got]
    assert any("without the OOM shim (XLOG_TORCH_OOM_SHIM=0)" in t and "data_ptr() 0" in t for t in texts), texts
    assert any("Tensor.record_stream does not reach xlog (no shim: XLOG_TORCH_OOM_SHIM=0)" in t for t in texts), texts
    assert builds(shim_env) == 0
    assert xt.oom_shim() == "no shim: XLOG_TORCH_OOM_SHIM=0"
    info = xt.enable_info()
    assert info["shim"] is None and info["record_stream_hook"] is False
    import torch

    alloc = torch.cuda.memory.current
    assert alloc.path == xc.library_path()  # the plain hooks
    p = alloc.malloc(2 << 20, dev, None)
    assert p
    assert not alloc.malloc(3 << 20, dev, None)  # refused: NULL
    reason = xc.last_error()
    assert "out of budget" in reason and "requested 3145728 bytes" in reason and "limit 4194304" in reason, reason
    assert xt.stats(dev).failed_allocations == 1
    alloc.free(p, 2 << 20, dev, None)
    # The explicit call still reaches xlog without the hook.
    import xlog_cuda.interop as xi

    q = alloc.malloc(4096, dev, None)
    xi.record_stream(q, dev, 0x7500)
    alloc.free(q, 4096, dev, None)
    with pytest.raises(xc.InvalidArgumentError, match="not a live hook allocation"):
        xi.record_stream(q, dev, 0x7500)


# ---------------------------------------------------------------------------
# CUDA graphs: the graph-pool hooks
# ---------------------------------------------------------------------------


def _pool_calls(handle):
    handle.fake_torch_capture_begin.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p]
    handle.fake_torch_capture_end.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    handle.fake_torch_release_pool.argtypes = [
        ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64),
    ]
    for name in ("fake_torch_capture_begin", "fake_torch_capture_end", "fake_torch_release_pool"):
        getattr(handle, name).restype = ctypes.c_int
    return handle


def test_the_shim_sets_the_graph_pool_hooks_and_a_capture_reaches_xlog(shim_env):
    """torch.cuda.graph -> CUDAGraph::capture_begin -> beginAllocateToPool
    -> the shim -> xlog_torch_begin_allocate_to_pool; then the capture
    (begun on the sim device behind xlog's back, as PyTorch does),
    allocations inside it, capture_end -> endAllocateToPool, and the
    graph's destruction -> releasePool. The capture is adopted: a miss in
    it does not take the block cached on another stream (which would break
    the capture), and the release gives its memory back."""
    import xlog_cuda.interop as xi

    dev = next(_devices)
    xt.enable(backend="sim", device=dev)
    info = xt.enable_info()
    assert (info["graph_pools_hook"], info["graph_pools_problem"]) == (True, ""), info
    import torch

    alloc = torch.cuda.memory.current
    shim = _pool_calls(_shim_handle())
    lib = xc.load_library()
    side, capture_stream = 0x7500, 0x7600
    warm = alloc.malloc(256 << 10, dev, side)
    alloc.free(warm, 256 << 10, dev, side)
    with xi.runtime(dev) as rt:
        held = rt.stats().outstanding_bytes
        assert shim.fake_torch_capture_begin(dev, 11, 0, capture_stream) == 0, xc.last_error()
        capture = ctypes.c_uint64()
        assert lib.xlog_sim_stream_begin_capture(rt._handle, capture_stream, ctypes.byref(capture)) == 0, xc.last_error()
        scratch = alloc.malloc(256 << 10, dev, capture_stream)
        assert scratch and scratch != warm, xc.last_error()
        alloc.free(scratch, 256 << 10, dev, capture_stream)
        out = alloc.malloc(4096, dev, capture_stream)
        assert out, xc.last_error()
        graph = ctypes.c_uint64()
        assert lib.xlog_sim_stream_end_capture(rt._handle, capture_stream, ctypes.byref(graph)) == 0, (
            f"capture {capture.value} was broken: {xc.last_error()}"
        )
        assert shim.fake_torch_capture_end(dev, 11, 0) == 0, xc.last_error()
        charged = rt.stats().outstanding_bytes - held
        assert charged >= (256 << 10) + 4096, "the capture's memory is charged"
        released = ctypes.c_uint64(1)
        assert shim.fake_torch_release_pool(dev, 11, 0, ctypes.byref(released)) == 0, xc.last_error()
        assert released.value == 0, "the graph's output is still live"
        alloc.free(out, 4096, dev, capture_stream)
        assert rt.stats().outstanding_bytes == held, "its free gave the graph's memory back"
        # A pool never announced: the hook reports it (the real shim prints it).
        assert shim.fake_torch_release_pool(dev, 12, 0, ctypes.byref(released)) == int(xc.Status.INVALID_ARGUMENT)
        assert "pool (12, 0) was never announced" in xc.last_error()


@pytest.mark.parametrize(
    "cflags, reason",
    [
        ("-DFAKE_OLD_SHIM", "the shim has no graph-pool hooks"),
        ("-DFAKE_NO_SETTERS", "has no set_begin_allocate_to_pool"),
    ],
)
def test_without_the_graph_pool_hooks_enable_warns_and_says_why(shim_env, monkeypatch, cflags, reason):
    """Fail soft: a shim without the hooks, or a PyTorch whose pluggable
    allocator lacks the setters: enable() still works (OOM error and
    record_stream intact), warns that captures do not reach xlog, and
    enable_info() says why."""
    monkeypatch.setenv("FAKE_TORCH_CFLAGS", cflags)
    with pytest.warns(RuntimeWarning, match="torch.cuda.graph capture does not reach xlog") as got:
        xt.enable(backend="sim", device=next(_devices))
    assert not any("OOM shim" in str(w.message) or "record_stream" in str(w.message) for w in got)
    info = xt.enable_info()
    assert info["shim"] and info["record_stream_hook"]
    assert not info["graph_pools_hook"] and reason in info["graph_pools_problem"], info
    assert _pool_calls(_shim_handle()).fake_torch_capture_begin(0, 1, 0, 0x7700) == -1, "PyTorch calls nothing"



# ---------------------------------------------------------------------------
# The native allocator (the shim's job 4)
# ---------------------------------------------------------------------------


def _native_calls(shim):
    handle = ctypes.CDLL(shim)
    handle.fake_torch_native_alloc.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p]
    handle.fake_torch_native_alloc.restype = ctypes.c_void_p
    handle.fake_torch_native_free.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    handle.fake_torch_native_free.restype = ctypes.c_int
    return handle


def test_the_native_allocator_replaces_the_pluggable_one_and_frees_by_pointer(shim_env, monkeypatch):
    monkeypatch.setenv("FAKE_TORCH_CFLAGS", "-DFAKE_NATIVE")
    dev = next(_devices)
    xt.enable(backend="sim", budget="4MiB", device=dev)
    info = xt.enable_info()
    assert (info["allocator"], info["allocator_problem"]) == ("native", "")
    assert info["record_stream_hook"] and info["graph_pools_hook"]
    import torch

    # PyTorch's Python-level swap was not used: the shim installed its own.
    assert torch.cuda.memory.current is None
    native = _native_calls(info["shim"])
    a = native.fake_torch_native_alloc(4096, dev, None)
    b = native.fake_torch_native_alloc(8192, dev, None)
    assert a and b and a != ctypes.c_void_p(-1).value
    assert xt.stats(dev).live_bytes == 4096 + 8192
    # A tensor's deleter knows its device; a raw deleter only the pointer.
    assert native.fake_torch_native_free(a, dev, 0) == 0
    assert native.fake_torch_native_free(b, 0, 1) == 0
    assert xt.stats(dev).live_bytes == 0 and xc.last_error() == ""


def test_the_pluggable_allocator_is_used_where_native_is_not_possible(shim_env, monkeypatch):
    # The stand-in without the entry point: an older shim.
    xt.enable(backend="sim", device=next(_devices))
    info = xt.enable_info()
    assert info["allocator"] == "pluggable" and "no native allocator" in info["allocator_problem"]
    import torch

    assert torch.cuda.memory.current.path == info["shim"]

    # Asked for by name: pluggable, even where native would work.
    fresh_process(monkeypatch)
    monkeypatch.setenv("FAKE_TORCH_CFLAGS", "-DFAKE_NATIVE")
    monkeypatch.setenv("XLOG_TORCH_ALLOCATOR", "pluggable")
    xt.enable(backend="sim", device=next(_devices))
    info = xt.enable_info()
    assert (info["allocator"], info["allocator_problem"]) == ("pluggable", "XLOG_TORCH_ALLOCATOR=pluggable")

    # Anything else is refused before anything changes.
    fresh_process(monkeypatch)
    monkeypatch.setenv("XLOG_TORCH_ALLOCATOR", "caching")
    with pytest.raises(xc.InvalidArgumentError, match="XLOG_TORCH_ALLOCATOR='caching' is not one of native, pluggable"):
        xt.enable(backend="sim", device=next(_devices))
    assert not xt.is_enabled()


def test_without_cuda_headers_the_native_allocator_says_why(shim_env, monkeypatch):
    monkeypatch.setenv("FAKE_TORCH_CFLAGS", "-DFAKE_NATIVE")
    monkeypatch.setenv("FAKE_TORCH_NO_CUDA", "1")
    with pytest.warns(RuntimeWarning):
        xt.enable(backend="sim", device=next(_devices))
    info = xt.enable_info()
    assert info["allocator"] == "pluggable"
    assert "without PyTorch's CUDA headers" in info["allocator_problem"]
