"""The inspection side from Python: Runtime.live_blocks / tag_stats /
reset_peak / memory_summary, call sites (tracebacks and labels), and the
torch-named views in xlog_cuda.torch (memory_stats, memory_summary,
reset_peak_memory_stats) driven through the torch stand-in of
test_frameworks.py. Everything runs on the sim backend."""

from __future__ import annotations

import itertools
import sys

import pytest

import xlog_cuda as xc
import xlog_cuda.interop as xi
import xlog_cuda.torch as xt

from conftest import PAGE, pool_memory
from test_frameworks import make_fake_torch

KiB = 1 << 10
MiB = 1 << 20

# Hook runtimes live for the process: ordinals of their own, above the
# range test_frameworks.py counts through (conftest simulates 1024 devices).
_devices = itertools.count(960)


def test_live_blocks_lists_every_field_oldest_first(make_runtime):
    rt = make_runtime()
    s1, s2 = rt.acquire_stream(), rt.acquire_stream()
    a = rt.allocate(1000, s1, tag="py-a")
    b = rt.allocate(70 * KiB, s2, tag="py-b")
    c = rt.allocate(10, s1)
    live = rt.live_blocks()
    assert [e.generation for e in live] == [a.generation, b.generation, c.generation]
    first = live[0]
    assert (first.ptr, first.size, first.stream, first.device, first.tag) == (a.ptr, 1000, int(s1), 0, "py-a")
    assert first.device_bytes >= 1000
    # Ages count allocations on the block's own stream: c came after a on s1.
    # Age counts allocations on the block's stream group (streams whose ids
    # are 32 apart share one): c came after a on s1, nothing after c.
    assert first.allocations_since >= 1 and live[2].allocations_since == 0
    assert first.sequence < live[2].sequence
    assert live[1].stream == int(s2) and live[1].tag == "py-b"
    assert live[2].tag == ""
    assert first.call_site is None and first.age_s is None, "tracking is off by default"
    assert sum(e.device_bytes for e in live) == rt.stats().live_bytes
    b.free()
    assert [e.generation for e in rt.live_blocks()] == [a.generation, c.generation]
    a.free()
    c.free()
    assert rt.live_blocks() == []


def test_live_blocks_grow_past_the_first_buffer(make_runtime):
    rt = make_runtime()
    s = rt.acquire_stream()
    blocks = [rt.allocate(256, s, tag=f"many-{i % 3}") for i in range(100)]
    live = rt.live_blocks()
    assert len(live) == 100
    assert {e.generation for e in live} == {b.generation for b in blocks}
    for b in blocks:
        b.free()


def test_tag_stats_and_reset_peak(make_runtime):
    rt = make_runtime()
    s = rt.acquire_stream()
    xs = [rt.allocate(4 * KiB, s, tag="py-x") for _ in range(3)]
    y = rt.allocate(100, s, tag="py-y")
    xs[0].free()
    xs[1].free()
    tags = {t.tag: t for t in rt.tag_stats()}
    assert set(tags) == {"py-x", "py-y"}
    held = tags["py-x"].live_bytes
    assert (tags["py-x"].live_blocks, tags["py-x"].allocations, tags["py-x"].frees) == (1, 3, 2)
    assert tags["py-x"].peak_bytes == 3 * held
    assert rt.tag_stats()[0].tag == "py-x", "largest live bytes first"
    st = rt.stats()
    assert (st.peak_live_blocks, st.peak_live_bytes) == (4, 3 * held + tags["py-y"].live_bytes)
    rt.reset_peak()
    st = rt.stats()
    assert (st.peak_live_blocks, st.peak_live_bytes) == (2, st.live_bytes)
    assert st.peak_outstanding_bytes == st.outstanding_bytes
    assert {t.tag: t.peak_bytes for t in rt.tag_stats()}["py-x"] == held
    xs[2].free()
    y.free()


def test_memory_summary_has_the_numbers(make_runtime):
    rt = make_runtime(budget_bytes=8 * MiB)
    s = rt.acquire_stream()
    big = rt.allocate(3 * MiB, s, tag="py-big")
    small = [rt.allocate(1000, s, tag="py-small") for _ in range(4)]
    text = rt.memory_summary()
    st = rt.stats()
    assert text.startswith("xlog memory summary: device 0 (sim)")
    assert f"{st.live_bytes} B" in text
    assert f"{8 * MiB} B" in text, "the budget"
    assert "py-big" in text and "py-small" in text
    assert hex(big.ptr) in text
    row = next(line for line in text.splitlines() if line.strip().startswith("py-small"))
    assert row.split()[1:] == [str(4 * 1024), "4", str(4 * 1024), "4", "0"]
    big.free()
    for b in small:
        b.free()


def test_python_call_sites_are_traceback_summaries(make_runtime):
    rt = make_runtime(track_call_sites=True)
    assert rt.tracks_call_sites
    s = rt.acquire_stream()

    def load_weights():
        return rt.allocate(64, s, tag="cs")

    a = load_weights()
    b = rt.allocate(64, s, tag="cs", call_site="explicit site")
    with xc.call_site("outer label"):
        with xc.call_site("inner label"):
            # A Python allocation records its traceback: the label is for
            # allocations Python does not see (the framework hooks).
            c = rt.allocate(64, s, tag="cs")
    sites = {e.generation: e for e in rt.live_blocks()}
    site_a = sites[a.generation].call_site
    assert site_a.startswith("test_inspect.py:"), site_a
    assert "in load_weights <- test_inspect.py:" in site_a
    assert "in test_python_call_sites_are_traceback_summaries" in site_a
    assert sites[b.generation].call_site == "explicit site"
    assert "in test_python_call_sites_are_traceback_summaries" in sites[c.generation].call_site
    assert all(e.age_s is not None and e.age_s >= 0 for e in sites.values())
    assert "explicit site" in rt.memory_summary()
    for blk in (a, b, c):
        blk.free()


def test_call_sites_follow_the_environment(monkeypatch):
    monkeypatch.setenv("XLOG_TRACK_CALLSITES", "1")
    assert xc.Config.from_env().track_call_sites is True
    with xc.Runtime(0, backend="sim") as rt:
        assert rt.tracks_call_sites
        b = rt.allocate(64, rt.acquire_stream())
        assert rt.live_blocks()[0].call_site.startswith("test_inspect.py:")
        b.free()
    monkeypatch.setenv("XLOG_TRACK_CALLSITES", "maybe")
    with pytest.raises(xc.InvalidArgumentError, match="XLOG_TRACK_CALLSITES"):
        xc.Config.from_env()


# The stand-in has no __version__, so enable() warns that the C++ shim is
# not in use; that is beside the point here.
pytestmark = pytest.mark.filterwarnings("ignore:xlog_cuda.torch.enable.:RuntimeWarning")


@pytest.fixture
def fake_torch(monkeypatch):
    torch = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(xt, "_state", None)
    return torch


def test_torch_memory_stats_uses_pytorch_key_names(fake_torch, monkeypatch):
    dev = next(_devices)
    monkeypatch.setenv("XLOG_TRACK_CALLSITES", "1")
    xt.enable(budget="4MiB", backend="sim", device=dev)
    with xc.call_site("encoder"):
        a = fake_torch.Tensor(1000, dev)
        b = fake_torch.Tensor(300 * KiB, dev)
    c = fake_torch.Tensor(5000, dev)
    st = xt.stats(dev)
    ms = xt.memory_stats(dev)
    assert ms["allocated_bytes.all.current"] == st.live_bytes > 300 * KiB
    assert ms["active_bytes.all.current"] == st.live_bytes
    assert ms["allocation.all.current"] == ms["active.all.current"] == 3
    assert ms["allocation.all.allocated"] == 3 and ms["allocation.all.freed"] == 0
    assert ms["reserved_bytes.all.current"] == st.outstanding_bytes
    assert ms["requested_bytes.all.current"] == 1000 + 300 * KiB + 5000
    assert ms["inactive_split_bytes.all.current"] == 0
    assert ms["num_ooms"] == 0 and ms["num_alloc_retries"] == 0
    # A driver allocation each (the pool), one page for all three (the arena).
    assert ms["num_device_alloc"] == st.cache_misses == (3 if pool_memory() else 1)
    peak = ms["allocated_bytes.all.peak"]
    assert peak == st.live_bytes
    b.free()
    after = xt.memory_stats(dev)
    assert after["allocated_bytes.all.peak"] == peak, "the peak stays"
    assert after["allocated_bytes.all.current"] < peak
    assert after["allocation.all.freed"] == 1 and after["allocation.all.peak"] == 3
    xt.reset_peak_memory_stats(dev)
    reset = xt.memory_stats(dev)
    assert reset["allocated_bytes.all.peak"] == reset["allocated_bytes.all.current"]
    assert reset["allocation.all.peak"] == 2
    assert reset["reserved_bytes.all.peak"] == reset["reserved_bytes.all.current"]
    # The hooks' blocks carry the label set around the code that made them.
    sites = {blk.ptr: blk.call_site for blk in xt.live_blocks(dev)}
    assert sites[a.ptr] == "encoder" and sites[c.ptr] is None
    assert any(t.live_blocks == 2 for t in xt.tag_stats(dev))
    text = xt.memory_summary(dev)
    assert "encoder" in text and f"{reset['allocated_bytes.all.current']} B" in text
    a.free()
    c.free()


@pytest.mark.pool_memory  # a retry: the pool hands a cached block back and tries again
def test_torch_memory_stats_counts_retries_and_refusals(fake_torch):
    dev = next(_devices)
    xt.enable(budget="1MiB", backend="sim", device=dev)
    a = fake_torch.Tensor(600 * KiB, dev)
    a.free()
    b = fake_torch.Tensor(900 * KiB, dev)  # the cached block goes back first
    assert xt.memory_stats(dev)["num_alloc_retries"] >= 1
    refused = fake_torch.Tensor(2 * MiB, dev)  # past the budget: the hook returns NULL
    assert refused.ptr == 0
    assert xt.memory_stats(dev)["num_ooms"] == 1
    b.free()


def test_torch_memory_stats_counts_refusals(fake_torch):
    # Whole pages: the same under either memory.
    dev = next(_devices)
    xt.enable(budget=2 * PAGE, backend="sim", device=dev)
    a = fake_torch.Tensor(PAGE, dev)
    refused = fake_torch.Tensor(2 * PAGE, dev)  # past the budget: the hook returns NULL
    assert refused.ptr == 0
    ms = xt.memory_stats(dev)
    assert ms["num_ooms"] == 1
    assert ms["allocated_bytes.all.current"] == PAGE
    assert ms["reserved_bytes.all.current"] <= 2 * PAGE
    a.free()
    b = fake_torch.Tensor(2 * PAGE, dev)  # fits once `a` is gone
    assert b.ptr != 0 and xt.memory_stats(dev)["num_ooms"] == 1
    b.free()


def test_memory_stats_of_maps_every_key_from_stats():
    st = xc.Stats(
        live_bytes=10,
        pending_bytes=1,
        outstanding_bytes=20,
        peak_outstanding_bytes=30,
        budget_limit=0,
        budget_remaining=0,
        live_blocks=2,
        pending_blocks=1,
        allocations=7,
        deallocations=5,
        failed_allocations=3,
        cached_bytes=9,
        cached_blocks=4,
        cache_hits=6,
        cache_misses=8,
        reserved_bytes=99,
        log_lines_lost=0,
        peak_live_bytes=15,
        peak_live_blocks=6,
        alloc_retries=11,
    )
    ms = xt.memory_stats_of(st, requested_bytes=12)
    assert ms == {
        "active.all.allocated": 7,
        "active.all.current": 2,
        "active.all.freed": 5,
        "active.all.peak": 6,
        "active_bytes.all.current": 10,
        "active_bytes.all.peak": 15,
        "allocated_bytes.all.current": 10,
        "allocated_bytes.all.peak": 15,
        "allocation.all.allocated": 7,
        "allocation.all.current": 2,
        "allocation.all.freed": 5,
        "allocation.all.peak": 6,
        "inactive_split.all.current": 0,
        "inactive_split_bytes.all.current": 0,
        "num_alloc_retries": 11,
        "num_device_alloc": 8,
        "num_ooms": 3,
        "requested_bytes.all.current": 12,
        "reserved_bytes.all.current": 20,
        "reserved_bytes.all.peak": 30,
        "segment.all.current": 7,
    }
    assert "requested_bytes.all.current" not in xt.memory_stats_of(st)


def test_interop_inspection_of_the_hook_runtime():
    dev = next(_devices)
    xi.configure(dev, xc.Config(backend="sim", sim_devices=1024))
    with xi.runtime(dev) as rt:
        blk = rt.allocate(4096, rt.acquire_stream(), tag="via-handle")
        assert [e.tag for e in xi.live_block_list(dev)] == ["via-handle"]
        assert [t.tag for t in xi.tag_stats(dev)] == ["via-handle"]
        assert "via-handle" in xi.memory_summary(dev)
        xi.reset_peak(dev)
        blk.free()
