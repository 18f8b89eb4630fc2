"""xlog_cuda.torch / xlog_cuda.cupy and the interop layer under them.

Neither PyTorch nor CuPy is needed: small stand-in modules put in
sys.modules do what the real ones do with an allocator (PyTorch: dlopen
the library path, look up the two symbols, call them with (size, device,
stream); CuPy: call the C function pointers with (param, size, device) and
free when the memory object dies), so the C hooks are really driven.
Tests that need the real frameworks run them in a subprocess and skip
(exit 77) when they, or a CUDA device, are missing.

Hook runtimes are per device and live for the process, so every test takes
a device ordinal of its own (`dev`). Everything runs on the sim backend.
"""

from __future__ import annotations

import csv
import ctypes
import importlib.util
import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
import types

import pytest

import xlog_cuda as xc
import xlog_cuda.cupy as xcp
import xlog_cuda.interop as xi
import xlog_cuda.torch as xt

from conftest import PAGE, held_for, pool_memory

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_devices = itertools.count(300)

KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture
def dev():
    """A device ordinal no other test has used in this process."""
    return next(_devices)


@pytest.fixture
def lib():
    return xc.load_library()


# ---------------------------------------------------------------------------
# Stand-ins for torch and cupy
# ---------------------------------------------------------------------------

TORCH_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
TORCH_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
CUPY_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
CUPY_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)


def make_fake_torch():
    torch = types.ModuleType("torch")
    state = types.SimpleNamespace(initialized=False, current=None, swaps=0, refuse=None)
    torch._fake = state

    class OutOfMemoryError(RuntimeError):
        pass

    class CUDAPluggableAllocator:
        """Like torch's: dlopen(path) and dlsym the two names."""

        def __init__(self, path, alloc_name, free_name):
            self.path = path
            handle = ctypes.CDLL(path)
            self.alloc_address = ctypes.cast(getattr(handle, alloc_name), ctypes.c_void_p).value
            self.free_address = ctypes.cast(getattr(handle, free_name), ctypes.c_void_p).value
            self.malloc = TORCH_MALLOC(self.alloc_address)
            self.free = TORCH_FREE(self.free_address)

    def change_current_allocator(allocator):
        if state.refuse:
            raise RuntimeError(state.refuse)
        if state.current is not None:
            raise RuntimeError("Can't swap an already initialized allocator")
        state.current = allocator
        state.swaps += 1

    class Device:
        def __init__(self, kind, index):
            self.type, self.index = kind, index

        def __str__(self):
            return f"{self.type}:{self.index}"

    class Storage:
        def __init__(self, ptr):
            self._ptr = ptr

        def data_ptr(self):
            return self._ptr

    class Tensor:
        """nbytes of device memory from the current allocator, on `stream`."""

        def __init__(self, nbytes, device_index, stream=None, kind="cuda"):
            self.device = Device(kind, device_index)
            self.nbytes, self.stream = nbytes, stream
            self.ptr = (state.current.malloc(nbytes, device_index, stream) or 0) if kind == "cuda" else 0x10

        def untyped_storage(self):
            return Storage(self.ptr)

        def free(self):
            state.current.free(self.ptr, self.nbytes, self.device.index, self.stream)

    class Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

    cuda = types.ModuleType("torch.cuda")
    cuda.is_initialized = lambda: state.initialized
    cuda.current_device = lambda: 0
    cuda.Stream = Stream
    cuda.OutOfMemoryError = OutOfMemoryError
    memory = types.ModuleType("torch.cuda.memory")
    memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    memory.change_current_allocator = change_current_allocator
    cuda.memory = memory
    torch.cuda = cuda
    torch.Tensor = Tensor
    torch.OutOfMemoryError = OutOfMemoryError
    return torch


def make_fake_cupy():
    cupy = types.ModuleType("cupy")
    state = types.SimpleNamespace(allocator=None, device=0)
    cupy._fake = state

    class OutOfMemoryError(MemoryError):
        """Same constructor and message as cupy.cuda.memory.OutOfMemoryError."""

        def __init__(self, size, total, limit=0):
            if limit == 0:
                msg = f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes)."
            else:
                msg = (
                    f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes, "
                    f"limit set to: {limit:,} bytes)."
                )
            super().__init__(msg)

    class CFunctionAllocatorMemory:
        """Like CuPy's: malloc only for size > 0, free on death if ptr != 0;
        the returned pointer is not checked."""

        def __init__(self, size, param, malloc, free, device_id):
            self.size, self.param, self.free_fn, self.device_id = size, param, free, device_id
            self.ptr = 0
            if size > 0:
                self.ptr = malloc(param, size, device_id) or 0

        def __del__(self):
            if self.ptr:
                self.free_fn(self.param, self.ptr, self.device_id)

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem = mem
            self.ptr = mem.ptr + offset if mem.ptr else 0

    class CFunctionAllocator:
        def __init__(self, param, malloc_func, free_func, owner):
            self.param, self.owner = param, owner
            self.malloc_fn = CUPY_MALLOC(malloc_func)
            self.free_fn = CUPY_FREE(free_func)
            self.malloc_address, self.free_address = malloc_func, free_func

        def malloc(self, size):
            mem = CFunctionAllocatorMemory(size, self.param, self.malloc_fn, self.free_fn, state.device)
            return MemoryPointer(mem, 0)

    def alloc(size):
        """cupy.cuda.memory.alloc: what cupy.empty calls."""
        return state.allocator(size)

    cuda = types.ModuleType("cupy.cuda")
    memory = types.ModuleType("cupy.cuda.memory")
    runtime = types.ModuleType("cupy.cuda.runtime")
    memory.OutOfMemoryError = OutOfMemoryError
    memory.CFunctionAllocator = CFunctionAllocator
    memory.alloc = alloc
    runtime.getDevice = lambda: state.device
    cuda.memory, cuda.runtime = memory, runtime
    cuda.set_allocator = lambda fn: setattr(state, "allocator", fn)
    cuda.get_allocator = lambda: state.allocator
    cupy.cuda = cuda
    return cupy


@pytest.fixture
def fake_torch(monkeypatch):
    torch = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(xt, "_state", None)  # "a fresh process" for the torch module
    return torch


@pytest.fixture
def fake_cupy(monkeypatch):
    cupy = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(xcp, "_state", None)
    return cupy


def refusal(hook, requested, live, pending, limit, cached=0):
    remaining = limit - live - cached - pending
    return (
        f"{hook}: out of budget: requested {requested} bytes, live {live}, cached {cached}, "
        f"pending {pending}, limit {limit}, remaining {remaining}"
    )


# Sizes whose exact byte counts are asserted are ones the allocator hands
# out unrounded (multiples of 512 up to 8 KiB, of 1/16 of the power of two
# below them above that), so the numbers do not depend on its size classes.


# ---------------------------------------------------------------------------
# Without the frameworks
# ---------------------------------------------------------------------------


def test_enable_without_the_framework_raises_clearly_and_changes_nothing(monkeypatch, dev):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(xt, "_state", None)
    monkeypatch.setattr(xcp, "_state", None)
    with pytest.raises(xi.FrameworkMissingError, match=r"xlog_cuda.torch.enable needs PyTorch") as info:
        xt.enable(budget="1MiB", backend="sim", device=dev)
    assert isinstance(info.value, ImportError)
    with pytest.raises(xi.FrameworkMissingError, match=r"xlog_cuda.cupy.enable needs CuPy"):
        xcp.enable(budget="1MiB", backend="sim", device=dev)
    with pytest.raises(xi.FrameworkMissingError, match=r"record_stream needs PyTorch"):
        xt.record_stream(object(), 0)
    assert not xt.is_enabled() and not xcp.is_enabled()
    # The hooks of `dev` were not opened: they can still be configured.
    xi.configure(dev, backend="sim", budget_bytes=4096)
    assert xi.stats(dev).budget_limit == 4096


# ---------------------------------------------------------------------------
# xlog_cuda.torch
# ---------------------------------------------------------------------------


def test_torch_enable_installs_the_hooks_of_this_library(fake_torch, dev):
    xt.enable(budget="6MiB", backend="sim", device=dev)
    assert xt.is_enabled()
    alloc = fake_torch._fake.current
    assert fake_torch._fake.swaps == 1
    assert alloc.path == xc.library_path()
    # torch's dlopen of that path reaches the very functions ctypes loaded,
    # so the process has one copy of the hook state.
    assert alloc.alloc_address == xi.hook_address("xlog_torch_malloc")
    assert alloc.free_address == xi.hook_address("xlog_torch_free")

    st = xt.stats(dev)
    assert (st.budget_limit, st.live_bytes, st.allocations) == (6 * MiB, 0, 0)
    a = fake_torch.Tensor(1024, dev)
    assert xt.stats(dev).live_bytes == 1024
    # 0 bytes: NULL and no block, as from PyTorch's own allocator.
    b = fake_torch.Tensor(0, dev)
    assert a.ptr and b.ptr == 0
    st = xt.stats(dev)
    assert (st.live_blocks, st.allocations, st.live_bytes) == (1, 1, 1024)
    assert xi.live_blocks(dev) == 1
    a.free()
    b.free()  # a free of NULL (PyTorch makes none) changes nothing
    after = xt.stats(dev)
    assert (after.live_bytes, after.live_blocks, after.deallocations, after.failed_allocations) == (0, 0, 1, 0)
    # Freed memory stays cached for the next step (charged) until trimmed:
    # the pool's block, the arena's page.
    assert after.cached_bytes == after.outstanding_bytes == held_for(st.live_bytes)
    if pool_memory():
        assert after.cached_blocks == 1
    assert xt.trim(dev) == held_for(st.live_bytes)
    assert xt.stats(dev).outstanding_bytes == 0


def test_torch_enable_is_idempotent_and_refuses_other_settings(fake_torch, dev):
    xt.enable(budget=MiB, backend="sim", device=dev)
    xt.enable(budget="1MiB", backend="sim", device=dev)  # the same settings: nothing to do
    xt.enable(device=dev)  # nothing given: keeps what is set
    assert fake_torch._fake.swaps == 1
    with pytest.raises(xc.InvalidArgumentError) as info:
        xt.enable(budget="2MiB", device=dev)
    message = info.value.message
    assert "cannot be reconfigured" in message and "budget 2097152 != 1048576" in message
    assert "already set up by xlog_cuda.torch.enable" in message
    with pytest.raises(xc.InvalidArgumentError, match="wait_on_pressure False != True"):
        xt.enable(device=dev, wait_on_pressure=False)
    assert xt.stats(dev).budget_limit == MiB

    # A second device's hooks can be set up later; the allocator stays.
    other = next(_devices)
    xt.enable(budget="5MiB", backend="sim", device=other)
    assert fake_torch._fake.swaps == 1
    assert xt.stats(other).budget_limit == 5 * MiB
    t = fake_torch.Tensor(4096, other)
    assert (xt.stats(other).live_bytes, xt.stats(dev).live_bytes) == (4096, 0)
    t.free()


def test_torch_enable_refuses_after_torch_initialised_cuda(fake_torch, dev):
    fake_torch._fake.initialized = True
    with pytest.raises(RuntimeError, match="already initialised CUDA in this process") as info:
        xt.enable(budget="1MiB", backend="sim", device=dev)
    assert "before any CUDA tensor" in str(info.value)
    assert fake_torch._fake.swaps == 0 and not xt.is_enabled()
    xi.configure(dev, backend="sim")  # nothing was opened for `dev`


def test_torch_enable_reports_torch_refusing_the_swap(fake_torch, dev):
    fake_torch._fake.refuse = "Can't swap an already initialized allocator"
    with pytest.raises(RuntimeError) as info:
        xt.enable(backend="sim", device=dev)
    assert "PyTorch refused to switch to the xlog allocator" in str(info.value)
    assert "Can't swap an already initialized allocator" in str(info.value)
    assert not xt.is_enabled()


@pytest.mark.parametrize(
    "budget, expected",
    [(123456, 123456), ("1.5MiB", 3 * MiB // 2), ("8GiB", 8 << 30), ("2KB", 2000), (0, 0)],
)
def test_budget_accepts_bytes_and_size_strings(fake_torch, dev, budget, expected):
    xt.enable(budget=budget, backend="sim", device=dev)
    assert xt.stats(dev).budget_limit == expected


@pytest.mark.parametrize("budget", ["12 parsecs", "-5", -1, True, 1.5, "1.1B"])
def test_bad_budget_is_refused_before_anything_changes(fake_torch, dev, budget):
    with pytest.raises(xc.InvalidArgumentError, match="budget"):
        xt.enable(budget=budget, backend="sim", device=dev)
    assert fake_torch._fake.swaps == 0
    xi.configure(dev, backend="sim")  # still unopened


def test_config_error_surfaces_at_enable_not_as_null_later(fake_torch, dev, tmp_path):
    bad = tmp_path / "no" / "such" / "dir" / "log.csv"
    with pytest.raises(xc.InvalidArgumentError, match="cannot create log file"):
        xt.enable(backend="sim", log_path=bad, device=dev)
    assert fake_torch._fake.swaps == 0 and not xt.is_enabled()


def test_enable_from_environment_and_csv_log(fake_torch, dev, monkeypatch, tmp_path):
    log = tmp_path / "hooks.csv"
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "5MiB")
    monkeypatch.setenv("XLOG_LOG_PATH", str(log))
    xt.enable(device=dev)
    assert xt.stats(dev).budget_limit == 5 * MiB
    a = fake_torch.Tensor(1024, dev)
    b = fake_torch.Tensor(3072, dev, stream=0x3000)  # a foreign stream, imported on sight
    a.free()
    b.free()
    xi.drain(dev)  # retires the frees and flushes the log
    rows = list(csv.reader(log.open()))
    assert rows[0] == ["Thread", "Time", "Action", "Pointer", "Size", "Stream", "Tag", "Device", "Process", "Detail"]
    # The caller's events (the driver's reserve rows are xlog's own).
    actions = [(r[2], int(r[3], 16), int(r[4]), r[6]) for r in rows[1:] if r[2] in ("allocate", "free")]
    # A reserve row for each driver allocation (the pool's blocks, the
    # arena's pages): together what the runtime holds, nothing released yet.
    reserved = [int(r[4]) for r in rows[1:] if r[2] == "reserve"]
    assert reserved and sum(reserved) == xt.stats(dev).outstanding_bytes > 0
    assert actions == [
        ("allocate", a.ptr, 1024, "torch"),
        ("allocate", b.ptr, 3072, "torch"),
        ("free", a.ptr, 1024, "torch"),
        ("free", b.ptr, 3072, "torch"),
    ]
    streams = {int(r[5]) for r in rows[1:]}
    assert len(streams) == 2  # the legacy default stream and the imported one


def test_arguments_override_the_environment(fake_torch, dev, monkeypatch):
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "5MiB")
    xt.enable(budget="1MiB", device=dev)
    st = xt.stats(dev)
    assert st.budget_limit == MiB
    with xi.runtime(dev) as rt:
        assert rt.backend == "sim"


def test_malformed_environment_is_an_error_naming_the_variable(fake_torch, dev, monkeypatch):
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "lots")
    with pytest.raises(xc.InvalidArgumentError, match='XLOG_BUDGET_BYTES="lots" is malformed'):
        xt.enable(device=dev)
    assert fake_torch._fake.swaps == 0 and not xt.is_enabled()


def test_refusal_returns_null_with_the_numbers_and_recovers(fake_torch, dev):
    # A budget of two pages; two pages less 1 MiB live leave 1 MiB: 2 MiB
    # does not fit (the arena's idle 1 MiB in its second page is too small
    # as well).
    budget, first, second = 2 * PAGE, 2 * PAGE - MiB, 2 * MiB
    xt.enable(budget=budget, backend="sim", device=dev)
    alloc = fake_torch._fake.current
    a = alloc.malloc(first, dev, None)
    assert a
    held = xt.stats(dev).outstanding_bytes
    assert held == held_for(first, pages=2)
    assert alloc.malloc(second, dev, None) is None  # NULL: PyTorch's signal of failure
    assert xc.last_error() == refusal("xlog_torch_malloc", second, first, 0, budget, cached=held - first)
    st = xt.stats(dev)
    assert (st.failed_allocations, st.live_bytes, st.allocations) == (1, first, 1)
    alloc.free(a, first, dev, None)
    assert xt.stats(dev).cached_bytes == held
    # Fits once the first block is gone: its memory (the pool's cached
    # block, handed back to the driver; the arena's idle pages) serves the
    # allocation instead of it being refused.
    b = alloc.malloc(second, dev, None)
    assert b and xc.last_error() == ""
    st = xt.stats(dev)
    assert (st.failed_allocations, st.live_bytes) == (1, second)
    assert st.outstanding_bytes == st.live_bytes + st.cached_bytes + st.pending_bytes <= budget
    if pool_memory():
        assert st.cached_bytes == 0
    alloc.free(b, second, dev, None)
    assert xi.live_blocks(dev) == 0


def test_record_stream_fences_the_free_on_the_other_stream(fake_torch, dev):
    xt.enable(backend="sim", device=dev, cache=False)
    other = 0x7000  # a foreign native stream, as torch.cuda.Stream().cuda_stream
    gate = threading.Event()
    with xi.runtime(dev) as rt:
        # The same native handle maps to the same stream id as in the hooks.
        busy = rt.import_stream(other)
        busy.enqueue_host(lambda: gate.wait(10))  # `other` is busy until the gate opens
        try:
            # Control: without record_stream the free does not wait for `other`.
            plain = fake_torch.Tensor(1024, dev)
            plain.free()
            assert rt.drain() == 1024

            t = fake_torch.Tensor(4096, dev)
            xt.record_stream(t, fake_torch.cuda.Stream(other))
            t.free()
            time.sleep(0.1)
            assert rt.reap() == 0
            st = rt.stats()
            assert (st.live_bytes, st.pending_bytes) == (0, 4096)  # held for `other`'s work
        finally:
            gate.set()
        assert rt.drain() == 4096
        assert rt.stats().pending_bytes == 0


def test_record_stream_fences_the_next_owner_of_a_cached_block(fake_torch, dev):
    """With the cache the freed block is handed out again at once, but the
    next owner's work on the allocation stream runs only after the work
    queued on the recorded stream."""
    xt.enable(backend="sim", device=dev)
    other = 0x7200
    gate = threading.Event()
    order = []
    with xi.runtime(dev) as rt:
        busy = rt.import_stream(other)
        busy.enqueue_host(lambda: (gate.wait(10), order.append("other's work")))
        home = rt.import_stream(0)  # the hooks' stream for a NULL cudaStream_t
        try:
            t = fake_torch.Tensor(4096, dev)
            xt.record_stream(t, fake_torch.cuda.Stream(other))
            t.free()
            assert rt.stats().cached_bytes == held_for(4096)  # cached, not waiting on the host
            start = time.monotonic()
            again = fake_torch.Tensor(4096, dev)  # the next owner, served from the cache
            assert time.monotonic() - start < 0.5
            assert rt.stats().cache_hits == 1 and rt.stats().outstanding_bytes == held_for(4096)
            if pool_memory():
                assert again.ptr == t.ptr
            home.enqueue_host(lambda: order.append("next owner's work"))
            time.sleep(0.1)
            assert order == []  # held behind `other`
        finally:
            gate.set()
        home.synchronize()
        assert order == ["other's work", "next owner's work"]
        again.free()


def test_record_stream_arguments(fake_torch, dev):
    xt.enable(backend="sim", device=dev)
    t = fake_torch.Tensor(256, dev)
    xt.record_stream(t, 0x7100)  # a raw cudaStream_t int is accepted
    xt.record_stream(t, 0)  # its own (legacy default) stream: nothing to fence
    with pytest.raises(TypeError, match="torch.Tensor"):
        xt.record_stream(object(), 0)
    with pytest.raises(TypeError, match="torch.cuda.Stream"):
        xt.record_stream(t, "stream")
    cpu = fake_torch.Tensor(16, None, kind="cpu")
    with pytest.raises(xc.InvalidArgumentError, match="needs a CUDA tensor"):
        xt.record_stream(cpu, 0)
    t.free()
    with pytest.raises(xc.InvalidArgumentError, match="not a live hook allocation"):
        xt.record_stream(t, 0x7100)  # freed already


# ---------------------------------------------------------------------------
# xlog_cuda.cupy
# ---------------------------------------------------------------------------


def test_cupy_refusal_raises_cupy_out_of_memory_with_our_reason(fake_cupy, dev):
    fake_cupy._fake.device = dev
    # Two pages; two pages less 512 KiB live leave 512 KiB (idle, in the
    # arena): 800 KiB does not fit.
    xcp.enable(budget=2 * PAGE, backend="sim", device=dev)
    assert xcp.is_enabled()
    allocator = fake_cupy.cuda.get_allocator().xlog_allocator
    assert allocator.malloc_address == xi.hook_address("xlog_cupy_malloc")
    assert allocator.free_address == xi.hook_address("xlog_cupy_free")

    live = 2 * PAGE - 512 * KiB
    m = fake_cupy.cuda.memory.alloc(live)
    assert m.ptr
    held = xcp.stats(dev).outstanding_bytes
    with pytest.raises(fake_cupy.cuda.memory.OutOfMemoryError) as info:
        fake_cupy.cuda.memory.alloc(800 * KiB)
    reason = refusal("xlog_cupy_malloc", 800 * KiB, live, 0, 2 * PAGE, cached=held - live)
    assert str(info.value) == (
        f"Out of memory allocating 819,200 bytes (allocated so far: {live:,} bytes, "
        f"limit set to: {2 * PAGE:,} bytes). [xlog: {reason}]"
    )
    assert info.value.xlog_message == reason
    assert xcp.stats(dev).failed_allocations == 1

    empty = fake_cupy.cuda.memory.alloc(0)  # CuPy does not call malloc for 0 bytes
    assert empty.ptr == 0
    del m  # CuPy frees when the memory object dies
    again = fake_cupy.cuda.memory.alloc(800 * KiB)
    assert again.ptr
    assert xcp.stats(dev).live_bytes == 800 * KiB
    del again
    assert xi.live_blocks(dev) == 0


def test_cupy_enable_is_idempotent_and_restores_itself(fake_cupy, dev):
    fake_cupy._fake.device = dev
    xcp.enable(backend="sim", device=dev)
    ours = fake_cupy.cuda.get_allocator()
    xcp.enable(backend="sim", device=dev)
    assert fake_cupy.cuda.get_allocator() is ours
    fake_cupy.cuda.set_allocator(lambda size: None)  # someone else's allocator
    xcp.enable(device=dev)
    assert fake_cupy.cuda.get_allocator() is ours


def test_torch_and_cupy_share_one_budget_and_one_set_of_stats(fake_torch, fake_cupy, dev):
    fake_cupy._fake.device = dev
    xt.enable(budget="4MiB", backend="sim", device=dev)
    xcp.enable(device=dev)  # joins the hooks torch set up
    with pytest.raises(xc.InvalidArgumentError, match="cannot be reconfigured"):
        xcp.enable(budget="8MiB", device=dev)

    tensors = [fake_torch.Tensor(n, dev) for n in (1000, 0, 4096)]  # 0 bytes: NULL, no block
    arrays = [fake_cupy.cuda.memory.alloc(n) for n in (12345, 7)]
    st = xt.stats(dev)
    assert st == xcp.stats(dev)
    held = st.live_bytes  # device bytes: each request rounded up to its allocator size
    assert 1000 + 4096 + 12345 + 7 <= held <= 1024 + 4096 + 12800 + 512
    assert (st.live_blocks, st.allocations, st.budget_limit) == (4, 4, 4 * MiB)
    assert xi.live_blocks(dev) == 4

    alloc = fake_torch._fake.current
    idle = st.outstanding_bytes - held  # the rest of the arena's page (the pool: 0)
    assert alloc.malloc(4 * MiB, dev, None) is None  # counted against both frameworks' bytes
    assert xc.last_error() == refusal("xlog_torch_malloc", 4 * MiB, held, 0, 4 * MiB, cached=idle)
    # One byte more than the budget leaves beside the live bytes.
    with pytest.raises(fake_cupy.cuda.memory.OutOfMemoryError, match="xlog_cupy_malloc: out of budget"):
        fake_cupy.cuda.memory.alloc(4 * MiB - held + 1)
    assert xt.stats(dev).failed_allocations == 2

    for t in tensors:
        t.free()
    del arrays[:]
    st = xt.stats(dev)
    assert (st.live_bytes, st.live_blocks, st.deallocations) == (0, 0, 4)
    # One cache for both frameworks: either module's trim empties it.
    assert st.cached_bytes == st.outstanding_bytes == held + idle
    assert xcp.trim(dev, keep_bytes=4096) + xt.trim(dev) == held + idle
    assert xt.stats(dev).outstanding_bytes == 0


# ---------------------------------------------------------------------------
# The interop layer
# ---------------------------------------------------------------------------


def _block_the_default_stream(rt, gate):
    s = rt.import_stream(0)  # the hooks' stream for a NULL cudaStream_t
    s.enqueue_host(lambda: gate.wait(10))


@pytest.mark.parametrize("how", ["setup_hooks", "configure_null", "unconfigured"])
def test_allocation_waits_for_pending_frees_under_pressure(lib, dev, monkeypatch, how):
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "1MiB")
    monkeypatch.setenv("XLOG_CACHE", "0")  # every free goes to the driver (pending)
    if how == "setup_hooks":
        xi.setup_hooks(dev)
    elif how == "configure_null":
        xi.configure(dev)  # NULL config: the environment, waiting on pressure
    a = lib.xlog_torch_malloc(704 * KiB, dev, None)
    assert a
    gate = threading.Event()
    with xi.runtime(dev) as rt:
        _block_the_default_stream(rt, gate)
        lib.xlog_torch_free(a, 704 * KiB, dev, None)
        assert rt.stats().pending_bytes == 704 * KiB  # queued behind the blocked stream
        opener = threading.Timer(0.3, gate.set)
        opener.start()
        start = time.monotonic()
        b = lib.xlog_torch_malloc(704 * KiB, dev, None)
        waited = time.monotonic() - start
        opener.join()
        assert b, xc.last_error()
        assert waited >= 0.25
        lib.xlog_torch_free(b, 704 * KiB, dev, None)


def test_without_wait_on_pressure_pending_frees_refuse_at_once(lib, dev):
    xi.setup_hooks(dev, budget="1MiB", backend="sim", wait_on_pressure=False, cache=False)
    a = lib.xlog_torch_malloc(704 * KiB, dev, None)
    gate = threading.Event()
    with xi.runtime(dev) as rt:
        _block_the_default_stream(rt, gate)
        lib.xlog_torch_free(a, 704 * KiB, dev, None)
        try:
            assert lib.xlog_torch_malloc(704 * KiB, dev, None) is None
            assert xc.last_error() == refusal("xlog_torch_malloc", 704 * KiB, 0, 704 * KiB, MiB)
        finally:
            gate.set()
        assert rt.drain() == 704 * KiB
    b = lib.xlog_torch_malloc(704 * KiB, dev, None)
    assert b
    lib.xlog_torch_free(b, 704 * KiB, dev, None)


def test_cached_block_goes_to_another_stream_without_a_host_wait(lib, dev):
    """Cache on: a block freed on a busy stream is handed to an allocation
    on another stream at once; that stream waits on the GPU (here: the sim
    worker), not the caller."""
    xi.setup_hooks(dev, budget=2 * PAGE, backend="sim")
    a = lib.xlog_torch_malloc(704 * KiB, dev, None)
    gate = threading.Event()
    order = []
    with xi.runtime(dev) as rt:
        _block_the_default_stream(rt, gate)
        rt.import_stream(0).enqueue_host(lambda: order.append("old owner"))
        lib.xlog_torch_free(a, 704 * KiB, dev, None)
        try:
            start = time.monotonic()
            b = lib.xlog_torch_malloc(704 * KiB, dev, ctypes.c_void_p(0x3100))
            assert time.monotonic() - start < 0.5
            assert b == a, xc.last_error()
            st = rt.stats()
            assert (st.cache_hits, st.failed_allocations, st.pending_bytes) == (1, 0, 0)
            rt.import_stream(0x3100).enqueue_host(lambda: order.append("new owner"))
            time.sleep(0.1)
            assert order == []
        finally:
            gate.set()
        rt.import_stream(0x3100).synchronize()
        assert order == ["old owner", "new owner"]
    lib.xlog_torch_free(b, 704 * KiB, dev, ctypes.c_void_p(0x3100))


def test_setup_hooks_joins_hooks_already_opened_from_the_environment(lib, dev, monkeypatch):
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    p = lib.xlog_cupy_malloc(None, 64, dev)  # opens the hooks from the environment
    xi.setup_hooks(dev)  # no settings asked for: accepted as they are
    with pytest.raises(xc.InvalidArgumentError) as info:
        xi.setup_hooks(dev, budget="1MiB")
    message = info.value.message
    assert message.startswith(f"setup_hooks: xlog_interop_configure: invalid argument: the framework hooks of device {dev} are already in use")
    assert "set them up before that" in message
    lib.xlog_cupy_free(None, p, dev)


def test_hook_config_reads_the_environment_under_the_arguments(monkeypatch, tmp_path):
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "3MiB")
    monkeypatch.setenv("XLOG_LOG_PATH", str(tmp_path / "a.csv"))
    c = xi.hook_config()
    assert (c.backend, c.budget_bytes, c.log_path, c.wait_on_pressure) == ("sim", 3 * MiB, str(tmp_path / "a.csv"), True)
    c = xi.hook_config(budget="1KiB", log_path=tmp_path / "b.csv", backend="cuda", wait_on_pressure=False)
    assert (c.backend, c.budget_bytes, c.wait_on_pressure) == ("cuda", 1024, False)
    assert os.fspath(c.log_path) == str(tmp_path / "b.csv")
    with pytest.raises(xc.InvalidArgumentError, match="backend 'gpu2'"):
        xi.hook_config(backend="gpu2")
    with pytest.raises(xc.InvalidArgumentError, match="wait_on_pressure"):
        xi.hook_config(wait_on_pressure=1)


def test_log_is_flushed_at_interpreter_exit(tmp_path):
    """Hook runtimes are never closed; without the exit reap the lines that
    are still buffered would be lost."""
    log = tmp_path / "exit.csv"
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {PYTHON_DIR!r})
        import xlog_cuda as xc, xlog_cuda.interop as xi
        xi.setup_hooks(5, backend="sim", log_path={str(log)!r})
        lib = xc.load_library()
        ptrs = [lib.xlog_torch_malloc(512 * (i + 1), 5, None) for i in range(3)]
        for i, p in enumerate(ptrs):
            lib.xlog_torch_free(p, 512 * (i + 1), 5, None)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLOG_") or k == "XLOG_CUDA_LIBRARY"}
    env.setdefault("XLOG_CUDA_LIBRARY", xc.library_path())
    env["XLOG_SIM_DEVICES"] = "8"  # the hooks above use sim device 5
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    rows = list(csv.reader(log.open()))
    assert rows[0][:3] == ["Thread", "Time", "Action"]
    assert [(r[2], r[4]) for r in rows[1:] if r[2] in ("allocate", "free")] == [
        ("allocate", "512"),
        ("allocate", "1024"),
        ("allocate", "1536"),
        ("free", "512"),
        ("free", "1024"),
        ("free", "1536"),
    ]


# ---------------------------------------------------------------------------
# The real frameworks (GPU machine only)
# ---------------------------------------------------------------------------

REAL_TORCH = """
import sys
sys.path.insert(0, {python_dir!r})
import torch
if not torch.cuda.is_available():
    print("no CUDA device for PyTorch"); sys.exit(77)
import xlog_cuda, xlog_cuda.torch as xt, xlog_cuda.interop as xi
xt.enable(budget="1GiB")
x = torch.ones(1 << 20, device="cuda")          # 4 MiB
base = xt.stats()
assert base.live_bytes >= 4 << 20, base
y = torch.empty(12345, dtype=torch.uint8, device="cuda")
grew = xt.stats().live_bytes - base.live_bytes   # device bytes: the size class
assert 12345 <= grew <= 12345 + 12345 // 16 + 512, grew
assert float(x.sum()) == float(1 << 20)
del x, y
torch.cuda.synchronize()
xi.drain()
print("ok", xt.stats())
"""

REAL_CUPY = """
import sys
sys.path.insert(0, {python_dir!r})
import cupy
if cupy.cuda.runtime.getDeviceCount() == 0:
    print("no CUDA device for CuPy"); sys.exit(77)
import xlog_cuda.cupy as xcp, xlog_cuda.interop as xi
xcp.enable(budget="64MiB")
base = xcp.stats().live_bytes
a = cupy.arange(1000, dtype=cupy.float64)
assert 8000 <= xcp.stats().live_bytes - base <= 8000 + 8000 // 16 + 512, xcp.stats()
assert int(a.sum()) == 499500
try:
    cupy.empty(65 << 20, dtype=cupy.uint8)
except cupy.cuda.memory.OutOfMemoryError as e:
    assert "[xlog: xlog_cupy_malloc: out of budget" in str(e), str(e)
else:
    raise AssertionError("no OutOfMemoryError over the budget")
del a
xi.drain()
print("ok", xcp.stats())
"""


@pytest.mark.parametrize("framework, code", [("torch", REAL_TORCH), ("cupy", REAL_CUPY)])
def test_real_framework_in_a_subprocess(framework, code):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not importable here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLOG_") or k == "XLOG_CUDA_LIBRARY"}
    env.setdefault("XLOG_CUDA_LIBRARY", xc.library_path())
    proc = subprocess.run(
        [sys.executable, "-c", code.format(python_dir=PYTHON_DIR)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode == 77:
        pytest.skip(proc.stdout.strip() or f"{framework}: no CUDA device")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok"), proc.stdout
