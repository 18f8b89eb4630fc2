"""Stream-ordered caching from Python: the `cache` and
`pool_release_threshold` config fields and their environment variables,
the `xlog_stats.struct_size` protocol, trim, and the pressure path that
gives cached memory back before refusing. Everything runs on the sim
backend; sizes whose byte counts are asserted are ones the allocator hands
out unrounded (multiples of 4 KiB here)."""

from __future__ import annotations

import ctypes
import itertools

import pytest

import xlog_cuda as xc
import xlog_cuda.interop as xi
from xlog_cuda import _library
from xlog_cuda._config import parse_threshold

from conftest import PAGE, held_for

U64_MAX = (1 << 64) - 1
KiB, MiB = 1 << 10, 1 << 20

_devices = itertools.count(600)


# ---------------------------------------------------------------------------
# Config and environment
# ---------------------------------------------------------------------------


def test_cache_and_threshold_from_env(monkeypatch):
    cfg = xc.Config.from_env()
    assert (cfg.cache, cfg.pool_release_threshold) == (True, U64_MAX)
    monkeypatch.setenv("XLOG_CACHE", "0")
    monkeypatch.setenv("XLOG_POOL_RELEASE_THRESHOLD", "256MiB")
    cfg = xc.Config.from_env()
    assert (cfg.cache, cfg.pool_release_threshold) == (False, 256 * MiB)
    monkeypatch.setenv("XLOG_CACHE", "1")
    monkeypatch.setenv("XLOG_POOL_RELEASE_THRESHOLD", "MAX")
    cfg = xc.Config.from_env()
    assert (cfg.cache, cfg.pool_release_threshold) == (True, U64_MAX)


@pytest.mark.parametrize("name, bad", [("XLOG_CACHE", "yes"), ("XLOG_CACHE", "2"),
                                       ("XLOG_POOL_RELEASE_THRESHOLD", "lots"),
                                       ("XLOG_POOL_RELEASE_THRESHOLD", "-1")])
def test_malformed_cache_environment_names_the_variable(monkeypatch, name, bad):
    monkeypatch.setenv(name, bad)
    with pytest.raises(xc.InvalidArgumentError) as info:
        xc.Config.from_env()
    assert name in info.value.message and bad in info.value.message
    with pytest.raises(xc.InvalidArgumentError, match=name):
        xc.Runtime()


@pytest.mark.parametrize("text", ["max", " Max ", "0", "2GiB", "1.5KiB", "4096", "lots", "", "maxi", "-5", "1e3"])
def test_parse_threshold_agrees_with_the_library(monkeypatch, text):
    monkeypatch.setenv("XLOG_POOL_RELEASE_THRESHOLD", text)
    try:
        expected = xc.Config.from_env().pool_release_threshold
    except xc.InvalidArgumentError:
        expected = None
    try:
        mine = parse_threshold(text)
    except ValueError:
        mine = None
    assert mine == expected


def test_config_fields_are_checked_before_the_library():
    for bad in (2, "yes", None, 1.0):
        with pytest.raises(xc.InvalidArgumentError, match="cache"):
            xc.Config(cache=bad).to_c()
    for bad in (-1, 1 << 64, "lots", 1.5):
        with pytest.raises(xc.InvalidArgumentError, match="pool_release_threshold"):
            xc.Config(pool_release_threshold=bad).to_c()
    assert xc.Config(pool_release_threshold="max").to_c().pool_release_threshold == U64_MAX
    assert xc.Config(pool_release_threshold=0, cache=0).to_c().cache == 0


def test_library_refuses_a_cache_flag_other_than_0_or_1():
    raw = xc.Config(backend="sim").to_c()
    raw.cache = 2
    handle = ctypes.c_void_p()
    status = xc.load_library().xlog_runtime_open(0, ctypes.byref(raw), ctypes.byref(handle))
    assert status == xc.Status.INVALID_ARGUMENT
    assert "cache is 2" in xc.last_error()


def test_runtime_keyword_overrides(make_runtime):
    rt = make_runtime(cache=False, pool_release_threshold="1MiB")
    assert (rt.config.cache, rt.config.pool_release_threshold) == (False, "1MiB")
    with rt.acquire_stream() as s:
        rt.allocate(4096, s).free()
        st = rt.stats()
        assert (st.cached_bytes, st.pending_bytes, st.outstanding_bytes) == (0, 4096, 4096)
        assert rt.drain() == 4096


# ---------------------------------------------------------------------------
# xlog_stats.struct_size
# ---------------------------------------------------------------------------

# The first layout of xlog_stats (through failed_allocations): the smallest
# struct_size the library accepts.
STATS_V1_SIZE = _library.XlogStats.failed_allocations.offset + 8


def _raw_stats(rt, size, fill=0xAB):
    """xlog_get_stats into a buffer of `size` bytes (at least the struct's)
    pre-filled with `fill`, claiming struct_size = `size`."""
    buf = (ctypes.c_uint8 * max(size, ctypes.sizeof(_library.XlogStats)))()
    ctypes.memset(buf, fill, len(buf))
    ctypes.c_uint32.from_buffer(buf).value = size
    status = xc.load_library().xlog_get_stats(rt.handle, ctypes.cast(buf, ctypes.POINTER(_library.XlogStats)))
    return status, buf


def test_stats_without_struct_size_is_refused(rt, stream):
    status, _ = _raw_stats(rt, 0)
    assert status == xc.Status.INVALID_ARGUMENT
    message = xc.last_error()
    assert "struct_size is 0" in message and str(ctypes.sizeof(_library.XlogStats)) in message
    status, _ = _raw_stats(rt, STATS_V1_SIZE - 8)
    assert status == xc.Status.INVALID_ARGUMENT


def test_stats_of_an_older_caller_fill_only_its_fields(rt, stream):
    with rt.allocate(4096, stream):
        status, buf = _raw_stats(rt, STATS_V1_SIZE)
        assert status == xc.Status.OK
        stats = _library.XlogStats.from_buffer(buf)
        assert (stats.struct_size, stats.live_bytes, stats.live_blocks, stats.allocations) == (
            STATS_V1_SIZE, 4096, 1, 1)
        # Nothing past the caller's struct was written.
        assert bytes(buf[STATS_V1_SIZE:]) == b"\xab" * (len(buf) - STATS_V1_SIZE)


def test_stats_of_a_newer_caller_fill_what_the_library_knows(rt, stream):
    mine = ctypes.sizeof(_library.XlogStats)
    with rt.allocate(4096, stream):
        status, buf = _raw_stats(rt, mine + 16)
        assert status == xc.Status.OK
        stats = _library.XlogStats.from_buffer(buf)
        # The library says how much it filled; the caller's extra bytes stay.
        assert (stats.struct_size, stats.live_bytes, stats.reserved_bytes) == (mine, 4096, held_for(4096))
        assert bytes(buf[mine:]) == b"\xab" * 16


def test_stats_new_sets_struct_size():
    raw = _library.XlogStats.new()
    assert raw.struct_size == ctypes.sizeof(_library.XlogStats)
    assert raw.live_bytes == raw.reserved_bytes == 0


# ---------------------------------------------------------------------------
# Cache behaviour
# ---------------------------------------------------------------------------


@pytest.mark.pool_memory
def test_cache_hits_misses_and_cross_stream_reuse(rt):
    with rt.acquire_stream() as a, rt.acquire_stream() as b:
        x = rt.allocate(64 * KiB, a)
        x.free()
        y = rt.allocate(64 * KiB, a)  # own stream's cache
        assert y.ptr == x.ptr
        y.free()
        z = rt.allocate(64 * KiB, b)  # another stream's cache (a GPU-side wait)
        assert z.ptr == x.ptr
        w = rt.allocate(64 * KiB, b)  # nothing cached: the driver
        assert w.ptr != x.ptr
        st = rt.stats()
        assert (st.cache_hits, st.cache_misses, st.allocations) == (2, 2, 4)
        assert (st.live_bytes, st.cached_bytes, st.outstanding_bytes) == (128 * KiB, 0, 128 * KiB)
        z.free()
        w.free()
        assert rt.stats().cached_blocks == 2


@pytest.mark.pool_memory
def test_a_failed_trim_changes_nothing(rt, stream):
    a, b = rt.allocate(4096, stream), rt.allocate(8192, stream)
    a.free()
    b.free()
    before = rt.stats()
    assert before.cached_bytes == 12288
    rt.sim_inject_fault(xc.Fault.FREE, 1)  # the driver refuses the first free
    with pytest.raises(xc.DriverError, match="injected fault"):
        rt.trim()
    assert rt.stats() == before
    assert rt.trim() == 12288
    assert rt.stats().outstanding_bytes == 0


@pytest.mark.parametrize("sizes", [(2560 * KiB, 1536 * KiB, 4 * MiB), (3200 * KiB, 3584 * KiB, 3200 * KiB)])
def test_pressure_gives_the_cache_back_before_refusing(make_runtime, sizes):
    """Under a 4 MiB budget (two arena pages), memory that only sits in the
    caches (the pool) or in idle pages (the arena) is handed back for an
    allocation that needs it: no refusal."""
    rt = make_runtime(budget_bytes=2 * PAGE, wait_on_pressure=True)
    with rt.acquire_stream() as a, rt.acquire_stream() as b, rt.acquire_stream() as c:
        for _ in range(5):
            first = rt.allocate(sizes[0], a)
            first.free()
            second = rt.allocate(sizes[1], b)
            second.free()
            third = rt.allocate(sizes[2], c)
            third.free()
        st = rt.stats()
        assert st.failed_allocations == 0
        assert st.outstanding_bytes <= 2 * PAGE and st.peak_outstanding_bytes <= 2 * PAGE
        assert st.outstanding_bytes == st.cached_bytes + st.pending_bytes


# ---------------------------------------------------------------------------
# Hook configuration
# ---------------------------------------------------------------------------


def test_hook_config_takes_cache_settings_over_the_environment(monkeypatch):
    monkeypatch.setenv("XLOG_CACHE", "0")
    monkeypatch.setenv("XLOG_POOL_RELEASE_THRESHOLD", "1GiB")
    c = xi.hook_config()
    assert (c.cache, c.pool_release_threshold) == (False, 1 << 30)
    c = xi.hook_config(cache=True, pool_release_threshold="max")
    assert (c.cache, c.pool_release_threshold) == (True, U64_MAX)
    with pytest.raises(xc.InvalidArgumentError, match="cache must be a bool"):
        xi.hook_config(cache=1)
    with pytest.raises(xc.InvalidArgumentError, match="pool_release_threshold"):
        xi.hook_config(pool_release_threshold="lots")


def test_setup_hooks_without_cache_and_conflicts():
    dev = next(_devices)
    lib = xc.load_library()
    xi.setup_hooks(dev, backend="sim", cache=False, pool_release_threshold="64MiB")
    p = lib.xlog_torch_malloc(8192, dev, None)
    lib.xlog_torch_free(p, 8192, dev, None)
    st = xi.stats(dev)
    assert (st.cached_bytes, st.pending_bytes, st.cache_hits) == (0, 8192, 0)
    assert xi.drain(dev) == 8192
    assert xi.trim(dev) == 0
    xi.setup_hooks(dev, cache=False)  # the same: accepted
    xi.setup_hooks(dev)  # nothing asked: accepted
    with pytest.raises(xc.InvalidArgumentError, match="cache True != False"):
        xi.setup_hooks(dev, cache=True)
    with pytest.raises(xc.InvalidArgumentError, match=f"pool_release_threshold {U64_MAX} != {64 * MiB}"):
        xi.setup_hooks(dev, pool_release_threshold="max")


def test_hooks_read_xlog_cache_from_the_environment(monkeypatch):
    dev = next(_devices)
    lib = xc.load_library()
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    monkeypatch.setenv("XLOG_CACHE", "0")
    p = lib.xlog_cupy_malloc(None, 4096, dev)  # opens the hooks from the environment
    lib.xlog_cupy_free(None, p, dev)
    st = xi.stats(dev)
    assert (st.cached_bytes, st.pending_bytes) == (0, 4096)
    assert xi.drain(dev) == 4096
