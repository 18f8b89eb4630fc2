"""Two sim devices from Python: one Runtime per device, peer access, a
block of device 0 used by a stream of device 1 (ordered, and its free
waits for that use), and the errors of the multi-device rules."""

from __future__ import annotations

import threading
import time

import pytest

import xlog_cuda as xc

from conftest import PAGE


@pytest.fixture
def devices():
    cfg = xc.Config(backend="sim", sim_devices=2, sim_capacity_bytes="64MiB")
    # Whole pages (what the arena maps and charges).
    d0 = xc.Runtime(0, cfg, budget_bytes=PAGE)
    d1 = xc.Runtime(1, cfg, budget_bytes=4 * PAGE)
    yield d0, d1
    d0.close()
    d1.close()


def test_ordinal_past_the_sim_device_count_is_no_device():
    with pytest.raises(xc.NoDeviceError) as info:
        xc.Runtime(2, xc.Config(backend="sim", sim_devices=2))
    assert "2 device(s)" in info.value.message


def test_device_1_reads_device_0s_block_in_order(devices):
    d0, d1 = devices
    d0.enable_peer_access(d1)
    d0.enable_peer_access(d1)  # once per pair; again is fine
    s0, s1 = d0.acquire_stream(), d1.acquire_stream()
    x = d0.allocate(4096, s0, "x")
    x.write(b"\x01" * 8)
    gate = threading.Event()
    x.prepare(s0, "write")
    s0.enqueue_host(lambda: (gate.wait(5), x.write(b"\x2a" * 8)))
    x.finish(s0, "write")
    seen = []
    x.prepare(s1, "read")  # device 1's stream, on the block's runtime
    s1.enqueue_host(lambda: seen.append(x.read(8)))
    x.finish(s1, "read")
    time.sleep(0.03)
    assert seen == [], "device 1 read before device 0's write"
    gate.set()
    s1.synchronize()
    assert seen == [b"\x2a" * 8]
    x.free()


def test_budgets_and_stats_are_per_device(devices):
    d0, d1 = devices
    s0, s1 = d0.acquire_stream(), d1.acquire_stream()
    a = d0.allocate(PAGE, s0)
    with pytest.raises(xc.OutOfBudgetError):
        d0.allocate(PAGE, s0)
    b = d1.allocate(3 * PAGE, s1)
    st0, st1 = d0.stats(), d1.stats()
    assert (st0.live_bytes, st1.live_bytes) == (PAGE, 3 * PAGE)
    assert (st0.budget_limit, st1.budget_limit) == (PAGE, 4 * PAGE)
    assert (st0.budget_remaining, st1.budget_remaining) == (0, PAGE)
    assert (st0.failed_allocations, st1.failed_allocations) == (1, 0)
    a.free()
    b.free()


def test_multi_device_errors_name_both_devices(devices):
    d0, d1 = devices
    s0, s1 = d0.acquire_stream(), d1.acquire_stream()
    x = d0.allocate(256, s0)
    with pytest.raises(xc.UnsatisfiableDependencyError) as info:
        x.prepare(s1, "read")  # no peer access yet
    assert "device 0" in info.value.message and "device 1" in info.value.message
    lib = xc.load_library()
    xc._errors.call(lib.xlog_sim_deny_peer_access, d0.handle, d1.handle)
    with pytest.raises(xc.UnsatisfiableDependencyError):
        d0.enable_peer_access(d1)
    with pytest.raises(xc.InvalidArgumentError) as info:
        d1.prepare_all(s1, [(x, "read")])  # device 0's block on device 1's runtime
    assert "device 0" in info.value.message and "device 1" in info.value.message
    x.free()
