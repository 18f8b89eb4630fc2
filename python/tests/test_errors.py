"""Every status maps to its exception class, and the library really
produces each one it can produce on the sim backend."""

from __future__ import annotations

import pytest

import xlog_cuda as xc
from xlog_cuda import _errors

from conftest import PAGE

EXPECTED_CLASSES = {
    xc.Status.INVALID_ARGUMENT: xc.InvalidArgumentError,
    xc.Status.OUT_OF_BUDGET: xc.OutOfBudgetError,
    xc.Status.OUT_OF_MEMORY: xc.OutOfMemoryError,
    xc.Status.DRIVER: xc.DriverError,
    xc.Status.STREAM_MISUSE: xc.StreamMisuseError,
    xc.Status.USE_AFTER_FREE: xc.UseAfterFreeError,
    xc.Status.UNSATISFIABLE_DEPENDENCY: xc.UnsatisfiableDependencyError,
    xc.Status.POOL_EXHAUSTED: xc.PoolExhaustedError,
    xc.Status.NO_DEVICE: xc.NoDeviceError,
    xc.Status.INTERNAL: xc.InternalError,
}


def test_status_values():
    assert [int(s) for s in xc.Status] == list(range(11))
    assert set(EXPECTED_CLASSES) == set(xc.Status) - {xc.Status.OK}


@pytest.mark.parametrize("status", sorted(EXPECTED_CLASSES))
def test_error_for_maps_each_status(status):
    err = xc.error_for(status, "the message")
    assert type(err) is EXPECTED_CLASSES[status]
    assert isinstance(err, xc.XlogError)
    assert err.status is status
    assert err.message == "the message"
    assert str(err) == f"[{status.name}] the message"


def test_python_exception_bases():
    # Both refusals are MemoryErrors (as CuPy's and PyTorch's are) and
    # still XlogErrors.
    for refusal in (xc.OutOfMemoryError, xc.OutOfBudgetError):
        assert issubclass(refusal, MemoryError)
        assert issubclass(refusal, xc.XlogError)
    assert issubclass(xc.InvalidArgumentError, ValueError)
    assert issubclass(xc.LibraryNotFoundError, ImportError)
    # No other status is a MemoryError.
    others = [cls for status, cls in EXPECTED_CLASSES.items()
              if status not in (xc.Status.OUT_OF_BUDGET, xc.Status.OUT_OF_MEMORY)]
    assert not [cls for cls in others if issubclass(cls, MemoryError)]


def test_out_of_budget_is_caught_as_a_memory_error(make_runtime):
    rt = make_runtime(budget_bytes=1 << 20)
    with rt.acquire_stream() as s:
        try:
            rt.allocate(2 << 20, s, tag="too-much")
        except MemoryError as e:
            caught = e
        assert isinstance(caught, xc.OutOfBudgetError)
        assert caught.status == xc.Status.OUT_OF_BUDGET
        assert "requested 2097152" in caught.message


def test_unknown_status_keeps_its_number():
    err = xc.error_for(42, "from the future")
    assert type(err) is xc.XlogError
    assert err.status == 42
    assert "status 42" in str(err)


def test_check_ok_does_nothing():
    _errors.check(0)


def test_out_of_budget_names_the_numbers(make_runtime):
    # Whole pages (what the arena maps and charges; the pool hands these
    # sizes out unrounded): the message is the same under either memory.
    rt = make_runtime(budget_bytes=4 * PAGE)
    with rt.acquire_stream() as s:
        first = rt.allocate(3 * PAGE, s)
        with pytest.raises(xc.OutOfBudgetError) as info:
            rt.allocate(3 * PAGE, s, tag="too-much")
        err = info.value
        assert err.status == xc.Status.OUT_OF_BUDGET
        assert err.message == (
            f"xlog_allocate: out of budget: requested {3 * PAGE} bytes, live {3 * PAGE}, cached 0, pending 0, "
            f"limit {4 * PAGE}, remaining {PAGE}"
        )
        assert xc.last_error() == err.message
        st = rt.stats()
        assert (st.failed_allocations, st.live_blocks, st.live_bytes) == (1, 1, 3 * PAGE)
        # A refusal changes nothing: what still fits is still granted.
        rt.allocate(PAGE, s).free()
        first.free()


def test_wait_on_pressure_waits_for_pending_frees(make_runtime):
    rt = make_runtime(budget_bytes=2 * PAGE, wait_on_pressure=True)
    with rt.acquire_stream() as s:
        for _ in range(20):
            # Each allocation only fits once the previous block's memory is
            # free again (the pool: its free completed; the arena: its range
            # back in the stream's mapped pages); nothing is refused.
            rt.allocate(3200 * 1024, s).free()
        st = rt.stats()
        assert st.failed_allocations == 0
        assert st.peak_outstanding_bytes <= 2 * PAGE


def test_out_of_memory_is_a_memory_error(make_runtime):
    rt = make_runtime(sim_capacity_bytes="1MiB")
    with rt.acquire_stream() as s:
        with pytest.raises(MemoryError) as info:
            rt.allocate(2 << 20, s)
        assert isinstance(info.value, xc.OutOfMemoryError)
        assert info.value.status == xc.Status.OUT_OF_MEMORY
        assert "requested 2097152" in info.value.message
        assert rt.stats().failed_allocations == 1


def test_injected_faults_are_driver_errors(make_runtime):
    # Without the cache every free reaches the driver (the cache's own
    # driver calls are covered in test_cache.py).
    rt = make_runtime(cache=False)
    s = rt.acquire_stream()
    rt.sim_inject_fault(xc.Fault.ALLOC, 2)
    a = rt.allocate(256, s)
    with pytest.raises(xc.DriverError) as info:
        rt.allocate(256, s)
    assert "injected fault" in info.value.message
    c = rt.allocate(256, s)  # fires once

    rt.sim_inject_fault("stream_create", 1)
    with pytest.raises(xc.DriverError):
        rt.acquire_stream()

    rt.sim_inject_fault(xc.Fault.EVENT_RECORD, 1)
    with pytest.raises(xc.DriverError):
        a.finish(s, xc.Access.WRITE)

    rt.sim_inject_fault(xc.Fault.FREE, 1)
    with pytest.raises(xc.DriverError):
        a.free()
    assert not a.freed
    a.validate()  # a failed free changes nothing
    a.free()

    rt.sim_inject_fault(xc.Fault.ALLOC, 1)
    rt.sim_inject_fault(xc.Fault.ALLOC, 0)  # disarmed
    rt.allocate(256, s).free()
    c.free()
    with pytest.raises(xc.InvalidArgumentError) as info:
        rt.sim_inject_fault(9, 1)
    assert "fault kind 9" in info.value.message
    s.release()


def test_direct_allocator_refuses_tracking(make_runtime):
    rt = make_runtime(allocator="direct")
    with rt.acquire_stream() as s, rt.allocate(1024, s) as blk:
        with pytest.raises(xc.StreamMisuseError) as info:
            blk.prepare(s, xc.Access.READ)
        assert "Direct allocator" in info.value.message
        with pytest.raises(xc.StreamMisuseError):
            blk.finish(s, "write")
        called = []
        with pytest.raises(xc.StreamMisuseError):
            xc.launch(rt, s, [(blk, xc.Access.READ_WRITE)], lambda: called.append(1))
        assert called == []
    # Direct frees synchronously: nothing pending.
    st = rt.stats()
    assert (st.live_bytes, st.pending_bytes, st.deallocations) == (0, 0, 1)


def test_invalid_access_value_reaches_the_library(rt, stream):
    with rt.allocate(64, stream) as blk:
        with pytest.raises(xc.InvalidArgumentError) as info:
            blk.prepare(stream, 7)
        assert "access value 7" in info.value.message
        assert xc.last_error() == info.value.message
        with pytest.raises(xc.InvalidArgumentError):
            blk.prepare(stream, "sideways")


def test_no_device_on_cuda_without_a_gpu():
    try:
        rt = xc.Runtime(backend="cuda")
    except xc.NoDeviceError as e:
        assert e.status == xc.Status.NO_DEVICE
        assert e.message.startswith("xlog_runtime_open: no device")
        return
    rt.close()
    pytest.skip("a CUDA device is present: NO_DEVICE cannot be provoked here")


def test_panic_becomes_internal_error():
    status = xc.load_library().xlog_debug_panic()
    assert status == xc.Status.INTERNAL
    with pytest.raises(xc.InternalError) as info:
        _errors.check(status)
    assert "deliberate panic" in info.value.message


def test_bad_config_values_are_refused_by_the_library():
    with pytest.raises(xc.InvalidArgumentError) as info:
        xc.Runtime(backend="sim", stream_pool_size=0)
    assert "stream_pool_size must be at least 1" in info.value.message
    with pytest.raises(xc.InvalidArgumentError) as info:
        xc.Runtime(backend="sim", sim_capacity_bytes=0)
    assert "sim_capacity_bytes" in info.value.message
    with pytest.raises(xc.InvalidArgumentError) as info:
        xc.Runtime(config=xc.Config(backend=7))
    assert "backend value 7" in info.value.message
    with pytest.raises(xc.InvalidArgumentError) as info:
        xc.Runtime(backend="sim", allocator=5)
    assert "allocator value 5" in info.value.message
    with pytest.raises(xc.InvalidArgumentError) as info:
        xc.Runtime(-1, backend="sim")
    assert "negative" in info.value.message


def test_bad_config_values_are_refused_in_python():
    for overrides in ({"backend": "tpu"}, {"allocator": "slab"}, {"budget_bytes": -1},
                      {"budget_bytes": "12xyz"}, {"stream_pool_size": 1 << 32},
                      {"wait_on_pressure": 2}, {"log_path": "a\0b"}):
        with pytest.raises(xc.InvalidArgumentError):
            xc.Runtime(**{"backend": "sim", **overrides})
    with pytest.raises(TypeError):
        xc.Runtime(backend="sim", no_such_field=1)


def test_last_error_message_sizes_and_truncates(rt):
    import ctypes

    with pytest.raises(xc.InvalidArgumentError) as info:
        rt.allocate(1, 0)
    full = info.value.message.encode()
    lib = xc.load_library()
    assert lib.xlog_last_error_message(None, 0) == len(full)
    buf = ctypes.create_string_buffer(b"\xff" * 8)
    assert lib.xlog_last_error_message(buf, 6) == len(full)
    assert buf.raw[:6] == full[:5] + b"\0"
    assert buf.raw[6:8] == b"\xff\xff"  # nothing written past cap


def test_a_tag_or_call_site_that_is_not_text_is_an_invalid_argument(make_runtime, stream):
    # Issue 25: a lone surrogate raised a raw UnicodeEncodeError.
    rt = stream.runtime
    with pytest.raises(xc.InvalidArgumentError, match="tag .* is not valid text"):
        rt.allocate(64, stream, tag="bad\ud800tag")
    with pytest.raises(xc.InvalidArgumentError, match="call_site text .* is not valid text"):
        xc.call_site("site\udfff")
    tracked = make_runtime(track_call_sites=True)
    with tracked.acquire_stream() as s:
        with pytest.raises(xc.InvalidArgumentError, match="call_site .* is not valid text"):
            tracked.allocate(64, s, tag="ok", call_site="x\ud800")
        assert tracked.stats().live_blocks == 0


def test_a_tag_past_128_bytes_is_cut_at_a_character_boundary(rt, stream):
    # Documented (header, README, Runtime.allocate): cut, not refused.
    long_tag = "é" * 100  # 200 bytes of UTF-8
    with rt.allocate(64, stream, tag=long_tag):
        (kept,) = [b.tag for b in rt.live_blocks()]
    assert kept == "é" * 64 and len(kept.encode()) == 128
