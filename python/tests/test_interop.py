"""The framework hooks (torch/CuPy entry points) driven through ctypes on
the sim backend. Hook runtimes are per device and live for the process, so
each test uses a device ordinal of its own."""

from __future__ import annotations

import ctypes

import pytest

import xlog_cuda as xc
import xlog_cuda.interop as xi

from conftest import PAGE, pool_memory


@pytest.fixture
def lib():
    return xc.load_library()


def test_torch_hooks_share_one_runtime(lib, capfd):
    dev = 21
    xi.configure(dev, xc.Config(backend="sim", budget_bytes="4MiB", sim_devices=64))
    assert xi.live_blocks(dev) == 0
    p = lib.xlog_torch_malloc(4096, dev, None)
    assert p and p % 256 == 0
    # 0 bytes: NULL and no block, as PyTorch's own allocator answers (a
    # real pointer would make PyTorch copy an empty storage on resize_).
    assert lib.xlog_torch_malloc(0, dev, None) is None
    assert xi.live_blocks(dev) == 1
    lib.xlog_torch_free(None, 0, dev, None)  # what PyTorch never calls; harmless
    q = lib.xlog_torch_malloc(1, dev, None)
    assert q and q != p
    assert xi.live_blocks(dev) == 2

    with xi.runtime(dev) as rt:
        assert rt.backend == "sim"
        st = rt.stats()
        assert (st.live_blocks, st.budget_limit) == (2, 4 << 20)
        assert 4096 + 1 <= st.live_bytes <= 4096 + 4096
        # The hooks' stream ids come from the same runtime.
        with rt.acquire_stream() as s, rt.allocate(1000, s) as blk:
            assert rt.stats().live_blocks == 3
            blk.validate()

    # Closing our handle left the hook runtime open.
    with pytest.raises(xc.InvalidArgumentError) as info:
        xi.configure(dev, xc.Config(backend="sim"))
    assert "already in use" in info.value.message

    assert lib.xlog_torch_malloc(4 << 20, dev, None) is None
    assert "out of budget" in xc.last_error() and "requested 4194304" in xc.last_error()

    lib.xlog_torch_free(p, 4096, dev, None)
    lib.xlog_torch_free(q, 1, dev, None)
    assert xi.live_blocks(dev) == 0
    # The freed blocks wait in the cache, charged, until trimmed.
    with xi.runtime(dev) as rt:
        st = rt.stats()
        assert st.live_bytes == 0 and st.outstanding_bytes == st.cached_bytes + st.pending_bytes
        assert st.cached_bytes > 4096
        if pool_memory():
            assert st.cached_blocks == 2  # the arena counts bytes in its pages, not blocks
        assert xi.trim(dev) == st.cached_bytes
        rt.drain()  # the block of the stream released above, if still pending
        assert (rt.stats().cached_bytes, rt.stats().outstanding_bytes) == (0, 0)
    lib.xlog_torch_free(p, 4096, dev, None)  # double free: reported, not fatal
    assert "not allocated through the xlog framework hooks" in xc.last_error()
    assert "xlog_torch_free" in capfd.readouterr().err


def test_torch_record_stream(lib):
    dev = 22
    xi.configure(dev, backend="sim")
    p = lib.xlog_torch_malloc(256, dev, ctypes.c_void_p(0x1000))
    assert p
    assert lib.xlog_torch_record_stream(p, dev, ctypes.c_void_p(0x2000)) == xc.Status.OK
    status = lib.xlog_torch_record_stream(p + 8, dev, ctypes.c_void_p(0x2000))
    assert status == xc.Status.INVALID_ARGUMENT
    assert "not a live hook allocation" in xc.last_error()
    lib.xlog_torch_free(p, 256, dev, ctypes.c_void_p(0x1000))
    assert xi.live_blocks(dev) == 0
    with xi.runtime(dev) as rt:
        assert rt.stats().deallocations == 1


def test_cupy_hooks(lib):
    dev = 23
    xi.configure(dev, backend="sim")
    p = lib.xlog_cupy_malloc(None, 1 << 16, dev)
    assert p
    assert xi.live_blocks(dev) == 1
    lib.xlog_cupy_free(None, p, dev)
    assert xi.live_blocks(dev) == 0


def test_configure_from_env(monkeypatch, lib):
    dev = 24
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "3MiB")
    xi.configure(dev)
    p = lib.xlog_cupy_malloc(None, 8, dev)
    with xi.runtime(dev) as rt:
        assert rt.backend == "sim"
        assert rt.stats().budget_limit == 3 << 20
    lib.xlog_cupy_free(None, p, dev)


def test_live_blocks_of_unused_device():
    assert xi.live_blocks(99) == 0


def test_a_negative_device_is_refused_like_the_runtime_refuses_it(lib):
    # Issue 25: configure, trim and the testing reset took -5 and -1.
    for refused in (
        lambda: xi.configure(-5, backend="sim"),
        lambda: xi.configure(-5),
        lambda: xi.trim(-1),
        lambda: xi.runtime(-1),
        lambda: xc._errors.call(lib.xlog_testing_interop_reset, -1, None),
    ):
        with pytest.raises(xc.InvalidArgumentError, match=r"device ordinal -\d is negative"):
            refused()


def test_trim_of_unused_hooks_is_zero_and_leaves_them_unopened(lib):
    dev = 26
    assert xi.trim(dev) == 0
    released = ctypes.c_uint64(123)
    assert lib.xlog_interop_trim(dev, 0, ctypes.byref(released)) == xc.Status.OK
    assert released.value == 0
    assert lib.xlog_interop_trim(dev, 0, None) == xc.Status.OK
    # Not opened: the hooks can still be configured.
    xi.configure(dev, backend="sim", budget_bytes="1MiB")
    with pytest.raises(xc.InvalidArgumentError, match="keep_bytes"):
        xi.trim(dev, -1)


@pytest.mark.pool_memory  # whole cached blocks, the larger first
def test_trim_keeps_at_most_keep_bytes_cached(lib):
    dev = 27
    xi.configure(dev, backend="sim")
    # 64 KiB and 256 KiB: sizes the allocator hands out unrounded.
    small, big = lib.xlog_torch_malloc(64 << 10, dev, None), lib.xlog_torch_malloc(256 << 10, dev, None)
    lib.xlog_torch_free(small, 64 << 10, dev, None)
    lib.xlog_torch_free(big, 256 << 10, dev, None)
    assert xi.stats(dev).cached_bytes == 320 << 10
    assert xi.trim(dev, keep_bytes=320 << 10) == 0
    assert xi.trim(dev, keep_bytes=100 << 10) == 256 << 10  # the larger block goes first
    st = xi.stats(dev)
    assert (st.cached_bytes, st.cached_blocks, st.outstanding_bytes) == (64 << 10, 1, 64 << 10)
    assert xi.trim(dev) == 64 << 10
    assert xi.stats(dev).outstanding_bytes == 0


def test_trim_keeps_at_most_keep_bytes_idle_in_the_arena(lib):
    # The arena's twin: trim releases whole idle pages until at most
    # keep_bytes are held beyond the live blocks.
    dev = 28
    page = PAGE
    xi.configure(dev, backend="sim", memory="arena")
    live = lib.xlog_torch_malloc(64 << 10, dev, None)
    spans = lib.xlog_torch_malloc(2 * page, dev, None)  # past the first page
    st = xi.stats(dev)
    assert st.outstanding_bytes % page == 0 and st.outstanding_bytes >= 2 * page + (64 << 10)
    lib.xlog_torch_free(spans, 2 * page, dev, None)
    held = xi.stats(dev).outstanding_bytes
    assert xi.stats(dev).cached_bytes == held - (64 << 10)
    assert xi.trim(dev, keep_bytes=held) == 0
    released = xi.trim(dev, keep_bytes=page)
    st = xi.stats(dev)
    assert released > 0 and released % page == 0 and st.outstanding_bytes == held - released
    assert st.cached_bytes <= page and st.outstanding_bytes >= page  # the live block's page stays
    assert xi.trim(dev) == st.outstanding_bytes - page
    assert xi.stats(dev).outstanding_bytes == page
    lib.xlog_torch_free(live, 64 << 10, dev, None)
    assert xi.trim(dev) == page
    assert xi.stats(dev).outstanding_bytes == 0



def test_free_hooks_clear_the_last_error_on_success(lib):
    dev = 25
    xi.configure(dev, backend="sim")
    p = lib.xlog_torch_malloc(64, dev, None)
    q = lib.xlog_cupy_malloc(None, 64, dev)
    assert p and q
    lib.xlog_torch_free(p + 1, 64, dev, None)  # fails: sets the message
    assert xc.last_error()
    lib.xlog_torch_free(p, 64, dev, None)  # succeeds
    torch_after = xc.last_error()
    lib.xlog_torch_free(p + 1, 64, dev, None)
    lib.xlog_cupy_free(None, q, dev)  # succeeds
    cupy_after = xc.last_error()
    assert xi.live_blocks(dev) == 0
    assert (torch_after, cupy_after) == ("", "")
