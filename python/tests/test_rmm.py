"""xlog_cuda.rmm: xlog as RMM's device resource from Python (issue 26 item 2).

The module's pure-Python parts run everywhere. The rest needs RMM (the
rmm-cu13 wheel) and a CUDA device, and skips without them, saying which;
scripts/gpu-ecosystem runs it on the GPU machine with RMM's wheels carried.
"""

from __future__ import annotations

import pytest

import xlog_cuda.rmm as xrmm
from xlog_cuda import OutOfBudgetError, OutOfMemoryError
from xlog_cuda._errors import InternalError

MiB = 1 << 20
BUDGET = 256 * MiB


class _ProtocolStream:
    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def test_stream_handle_reads_the_cuda_stream_protocol():
    assert xrmm._stream_handle(None) == 0
    assert xrmm._stream_handle(_ProtocolStream(0xABC0)) == 0xABC0
    with pytest.raises(TypeError, match="RMM Stream"):
        xrmm._stream_handle(object())


def test_refusals_are_memory_errors_by_their_message():
    budget = xrmm._refusal("out of budget: requested 10 bytes, live 0, limit 4", 10)
    assert isinstance(budget, OutOfBudgetError) and isinstance(budget, MemoryError)
    device = xrmm._refusal("out of device memory: requested 10 bytes: driver said no", 10)
    assert isinstance(device, OutOfMemoryError) and isinstance(device, MemoryError)
    other = xrmm._refusal("invalid device 7", 10)
    assert isinstance(other, InternalError) and not isinstance(other, MemoryError)
    assert "no message" in str(xrmm._refusal("", 10))


@pytest.fixture(scope="module")
def rmm_on_xlog():
    rmm = pytest.importorskip("rmm", reason="RMM (rmm-cu13) is not installed")
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as e:  # noqa: BLE001 - any failure to see a device is a skip here
        pytest.skip(f"no CUDA device: {e}")
    mr = xrmm.enable(budget=BUDGET, backend="cuda")
    yield rmm, mr
    xrmm.disable()


def test_enable_makes_xlog_rmms_resource(rmm_on_xlog):
    rmm, mr = rmm_on_xlog
    assert xrmm.is_enabled()
    assert rmm.mr.get_current_device_resource() is mr
    assert xrmm.enable() is mr  # idempotent


def test_device_buffers_come_from_xlog_and_hold_data(rmm_on_xlog):
    rmm, _ = rmm_on_xlog
    before = xrmm.stats()
    payload = bytes(range(256)) * (4 * MiB // 256)
    buf = rmm.DeviceBuffer.to_device(payload)
    during = xrmm.stats()
    assert during.live_bytes - before.live_bytes >= len(payload)
    assert during.allocations > before.allocations
    assert buf.tobytes() == payload
    del buf
    after = xrmm.stats()
    assert after.live_bytes == before.live_bytes


def test_free_on_another_stream_and_cupy_through_rmm(rmm_on_xlog):
    rmm, _ = rmm_on_xlog
    cupy = pytest.importorskip("cupy")
    from rmm.allocators.cupy import rmm_cupy_allocator
    from rmm.pylibrmm.stream import Stream

    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        before = xrmm.stats().allocations
        side = cupy.cuda.Stream(non_blocking=True)
        with side:
            a = cupy.arange(1 << 20, dtype=cupy.int64)
            total = int((a * 3).sum())
        side.synchronize()
        assert total == 3 * ((1 << 20) * ((1 << 20) - 1) // 2)
        assert xrmm.stats().allocations > before
        del a
        # A buffer made on one RMM stream and freed on another.
        s1, s2 = Stream(), Stream()
        buf = rmm.DeviceBuffer(size=MiB, stream=s1)
        live = xrmm.stats().live_bytes
        buf_ptr = buf.ptr
        assert buf_ptr != 0
        del buf  # DeviceBuffer frees on its own stream; call the pair directly too
        hooks = rmm.mr.get_current_device_resource().xlog_hooks
        ptr = hooks.allocate(MiB, s1)
        hooks.deallocate(ptr, MiB, s2)
        s2.synchronize()
        assert xrmm.stats().live_bytes < live
    finally:
        cupy.cuda.set_allocator(previous)


def test_over_budget_is_a_memory_error_with_xlogs_numbers(rmm_on_xlog):
    rmm, _ = rmm_on_xlog
    failed = xrmm.stats().failed_allocations
    with pytest.raises(MemoryError) as info:
        rmm.DeviceBuffer(size=BUDGET + 64 * MiB)
    assert "out of budget" in str(info.value)
    assert str(BUDGET) in str(info.value)
    assert xrmm.stats().failed_allocations == failed + 1
    # The resource still serves after a refusal.
    ok = rmm.DeviceBuffer(size=MiB)
    assert ok.size == MiB
