"""Runtime, Block and Stream basics on the sim backend: lifetime, stats,
generations, stale handles, the pool, leak reports."""

from __future__ import annotations

import copy
import os
import re
import threading
import time

import pytest

import xlog_cuda as xc

from conftest import PAGE, held_for

U64_MAX = (1 << 64) - 1


def test_version_is_semver():
    assert re.fullmatch(r"\d+\.\d+\.\d+", xc.version())


def test_open_and_close(make_runtime):
    rt = make_runtime()
    assert rt.backend == "sim"
    assert not rt.closed
    assert rt.handle != 0
    assert rt.close() == xc.LeakReport(blocks=0, bytes=0)
    assert rt.closed
    # Idempotent on the Python side: no second C close, same report.
    assert rt.close() == (0, 0, 0)


def test_context_manager_closes():
    with xc.Runtime(backend="sim") as rt:
        assert rt.stats().allocations == 0
    assert rt.closed
    with pytest.raises(xc.InvalidArgumentError):
        rt.stats()


def test_calls_on_closed_runtime_raise_invalid_argument(make_runtime):
    rt = make_runtime()
    s = rt.acquire_stream()
    b = rt.allocate(512, s)
    rt.close()
    for call in (rt.stats, rt.reap, rt.drain, rt.acquire_stream, s.synchronize, b.validate,
                 lambda: rt.allocate(1, s), lambda: b.prepare(s, xc.Access.READ),
                 lambda: s.enqueue_host(lambda: None)):
        with pytest.raises(xc.InvalidArgumentError) as info:
            call()
        assert info.value.status == xc.Status.INVALID_ARGUMENT
        assert "not open" in info.value.message, info.value.message
        assert xc.last_error() == info.value.message
    # Context exits after close are no-ops: close already freed and released.
    with b, s:
        pass


# Sizes below are multiples of 4 KiB, which every allocator hands out as
# they are (device bytes = requested bytes), so the counters are exact.


def test_stats_track_allocate_free_reap_drain_without_the_cache(make_runtime):
    """cache=False: the seed's behaviour, a free goes to the driver (pending)."""
    rt = make_runtime(cache=False)
    stream = rt.acquire_stream()
    s0 = rt.stats()
    assert s0 == xc.Stats(0, 0, 0, 0, 0, U64_MAX, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    a = rt.allocate(4096, stream, tag="a")
    b = rt.allocate(12288, stream, tag="b")
    s1 = rt.stats()
    assert (s1.live_bytes, s1.live_blocks, s1.pending_bytes, s1.pending_blocks) == (16384, 2, 0, 0)
    assert (s1.outstanding_bytes, s1.peak_outstanding_bytes, s1.allocations) == (16384, 16384, 2)
    assert (s1.cached_bytes, s1.cache_hits, s1.reserved_bytes) == (0, 0, 16384)

    a.free()
    s2 = rt.stats()
    # Freed bytes stay outstanding (pending) until a reap sees the free done.
    assert (s2.live_bytes, s2.live_blocks, s2.pending_bytes, s2.pending_blocks) == (12288, 1, 4096, 1)
    assert (s2.outstanding_bytes, s2.deallocations, s2.cached_bytes) == (16384, 1, 0)

    # reap never blocks; the first one seals the batch. Poll until it retires.
    reclaimed, deadline = 0, time.monotonic() + 10
    while reclaimed == 0 and time.monotonic() < deadline:
        reclaimed = rt.reap()
        if reclaimed == 0:
            time.sleep(0.001)
    assert reclaimed == 4096
    s3 = rt.stats()
    assert (s3.pending_bytes, s3.pending_blocks, s3.outstanding_bytes) == (0, 0, 12288)
    assert rt.reap() == 0

    b.free()
    assert rt.stats().cached_bytes == 0
    assert rt.drain() == 12288
    assert rt.trim() == 0  # nothing is ever cached
    s4 = rt.stats()
    assert (s4.live_bytes, s4.pending_bytes, s4.outstanding_bytes, s4.live_blocks) == (0, 0, 0, 0)
    assert (s4.peak_outstanding_bytes, s4.allocations, s4.deallocations, s4.failed_allocations) == (16384, 2, 2, 0)
    assert (s4.cache_hits, s4.cache_misses, s4.cached_blocks) == (0, 0, 0)
    assert rt.drain() == 0


@pytest.mark.pool_memory
def test_stats_track_allocate_free_reuse_trim_with_the_cache(rt, stream):
    """The pool: a free goes to its stream's cache and stays charged;
    trim hands it back to the driver."""
    s0 = rt.stats()
    assert s0 == xc.Stats(0, 0, 0, 0, 0, U64_MAX, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    a = rt.allocate(4096, stream, tag="a")
    b = rt.allocate(12288, stream, tag="b")
    s1 = rt.stats()
    assert (s1.live_bytes, s1.outstanding_bytes, s1.cache_hits, s1.cache_misses) == (16384, 16384, 0, 2)

    a.free()
    b.free()
    s2 = rt.stats()
    assert (s2.live_bytes, s2.pending_bytes, s2.cached_bytes, s2.cached_blocks) == (0, 0, 16384, 2)
    # Cached memory is still held from the driver: outstanding = live + cached + pending.
    assert (s2.outstanding_bytes, s2.reserved_bytes, s2.deallocations) == (16384, 16384, 2)
    assert rt.drain() == 0  # nothing was handed to the driver

    # The same size on the same stream comes back from the cache: same
    # memory, a new generation, and the old handle is stale.
    c = rt.allocate(4096, stream, tag="c")
    assert c.ptr == a.ptr and c.generation > b.generation
    with pytest.raises(xc.UseAfterFreeError):
        a.copy().validate()
    s3 = rt.stats()
    assert (s3.cache_hits, s3.cache_misses, s3.allocations) == (1, 2, 3)
    assert (s3.live_bytes, s3.cached_bytes, s3.outstanding_bytes) == (4096, 12288, 16384)

    # trim(keep) releases until at most `keep` stays cached, and returns
    # exactly what left the cache.
    assert rt.trim(keep_bytes=12288) == 0
    assert rt.trim(keep_bytes=4096) == 12288
    s4 = rt.stats()
    assert (s4.cached_bytes, s4.cached_blocks, s4.outstanding_bytes, s4.pending_bytes) == (0, 0, 4096, 0)
    assert s4.reserved_bytes == 4096
    c.free()
    assert rt.trim() == 4096
    s5 = rt.stats()
    assert (s5.live_bytes, s5.cached_bytes, s5.pending_bytes, s5.outstanding_bytes) == (0, 0, 0, 0)
    assert (s5.peak_outstanding_bytes, s5.allocations, s5.deallocations) == (16384, 3, 3)
    assert rt.trim() == 0


def test_trim_arguments_and_closed_runtime(make_runtime):
    rt = make_runtime()
    for bad in (-1, 1 << 64, 1.5, "0", True):
        with pytest.raises(xc.InvalidArgumentError, match="keep_bytes"):
            rt.trim(bad)
    assert rt.trim(U64_MAX) == 0
    rt.close()
    with pytest.raises(xc.InvalidArgumentError, match="not open"):
        rt.trim()


def test_stats_track_allocate_free_reuse_trim_in_the_arena(make_runtime):
    """The arena (the default memory): blocks are carved from 2 MiB pages it
    maps and charges; a free leaves the page mapped (idle, still charged),
    the next block is carved from it without a driver call, and trim
    unmaps only pages no live block lies in."""
    rt = make_runtime(memory="arena", budget_bytes=4 * PAGE)
    with rt.acquire_stream() as stream:
        a = rt.allocate(4096, stream, tag="a")
        b = rt.allocate(12288, stream, tag="b")
        s1 = rt.stats()
        assert (s1.live_bytes, s1.outstanding_bytes, s1.cache_hits, s1.cache_misses) == (16384, PAGE, 1, 1)
        assert (s1.cached_bytes, s1.reserved_bytes, s1.budget_remaining) == (PAGE - 16384, PAGE, 3 * PAGE)
        assert (s1.pages_mapped, s1.pages_unmapped) == (1, 0)

        a.free()
        b.free()
        s2 = rt.stats()
        assert (s2.live_bytes, s2.pending_bytes, s2.cached_bytes, s2.outstanding_bytes) == (0, 0, PAGE, PAGE)
        assert (s2.deallocations, s2.budget_remaining) == (2, 3 * PAGE)
        assert rt.drain() == 0 and rt.reap() == 0  # nothing was handed to the driver

        # The next block comes from the mapped page: a new generation, and
        # the old handles are stale.
        c = rt.allocate(4096, stream, tag="c")
        assert c.generation > b.generation
        with pytest.raises(xc.UseAfterFreeError):
            a.copy().validate()
        s3 = rt.stats()
        assert (s3.cache_hits, s3.cache_misses, s3.allocations) == (2, 1, 3)
        assert (s3.live_bytes, s3.cached_bytes, s3.outstanding_bytes) == (4096, PAGE - 4096, PAGE)

        # The page holds a live block: trim cannot release it, whatever keep.
        assert rt.trim(keep_bytes=PAGE) == 0
        assert rt.trim() == 0
        assert rt.stats().outstanding_bytes == PAGE
        c.free()
        assert rt.trim() == PAGE
        s4 = rt.stats()
        assert (s4.outstanding_bytes, s4.cached_bytes, s4.reserved_bytes, s4.budget_remaining) == (0, 0, 0, 4 * PAGE)
        assert s4.peak_outstanding_bytes == PAGE
        assert (s4.pages_mapped, s4.pages_unmapped) == (1, 1), "one page mapped for all three blocks, unmapped by trim"


def test_budget_stats(make_runtime):
    rt = make_runtime(budget_bytes="4MiB")
    held = held_for(4096)  # the block (the pool), its page (the arena)
    with rt.acquire_stream() as s:
        with rt.allocate(4096, s):
            st = rt.stats()
            assert (st.budget_limit, st.budget_remaining) == (4 << 20, (4 << 20) - held)
        # Freed memory that stays held is still charged; trim gives it back.
        assert rt.stats().budget_remaining == (4 << 20) - held
        assert rt.trim() == held
        assert rt.stats().budget_remaining == 4 << 20


def test_block_fields_alignment_and_generations(rt, stream):
    blocks = [rt.allocate(n, stream, tag=f"t{n}") for n in (1, 255, 256, 4097)]
    for blk, n in zip(blocks, (1, 255, 256, 4097)):
        assert blk.size == n
        assert blk.ptr != 0 and blk.ptr % 256 == 0
        assert blk.stream == stream.id
        assert blk.device == 0
        blk.validate()
    gens = [b.generation for b in blocks]
    assert len(set(gens)) == 4 and gens == sorted(gens)
    h = blocks[0].handle
    assert (h.ptr, h.size, h.generation, h.stream) == (blocks[0].ptr, 1, gens[0], stream.id)
    for blk in blocks:
        blk.free()


def test_zero_byte_block(rt, stream):
    with rt.allocate(0, stream) as z:
        assert (z.ptr, z.size) == (0, 0)
        assert z.generation > 0
        z.validate()
        assert z.read() == b""
        assert rt.stats().live_blocks == 1
    st = rt.stats()
    assert (st.live_blocks, st.pending_blocks, st.deallocations) == (0, 0, 1)


def test_device_ordinal_is_carried(make_runtime):
    rt = make_runtime()
    rt3 = xc.Runtime(3, xc.Config(backend="sim", sim_devices=4))
    try:
        with rt3.acquire_stream() as s, rt3.allocate(64, s) as b:
            assert b.device == 3
            # A handle of one device is refused by another's runtime,
            # which names both devices.
            with pytest.raises(xc.InvalidArgumentError) as info:
                rt.deallocate(b)
            assert "device 3" in info.value.message and "device 0" in info.value.message
    finally:
        rt3.close()


def test_free_is_idempotent_but_a_copied_handle_is_not(rt, stream):
    blk = rt.allocate(4096, stream)
    alias = copy.copy(blk)
    assert alias is not blk and alias.generation == blk.generation
    blk.free()
    blk.free()  # no-op on the Python side
    assert blk.freed
    with pytest.raises(xc.UseAfterFreeError) as info:
        alias.free()
    assert str(blk.generation) in info.value.message
    assert not alias.freed
    st = rt.stats()
    assert (st.deallocations, st.live_blocks) == (1, 0)


def test_stale_handle_after_address_reuse(rt, stream):
    old = rt.allocate(4096, stream, tag="old")
    old.write(b"old data")
    old.free()
    rt.drain()  # the free has run: the sim reuses the address eagerly
    new = rt.allocate(4096, stream, tag="new")
    assert new.ptr == old.ptr, "sim backend should reuse the freed address"
    assert new.generation != old.generation
    new.write(b"new data")

    for call in (old.validate, lambda: old.prepare(stream, xc.Access.READ),
                 lambda: old.finish(stream, xc.Access.WRITE), lambda: rt.deallocate(old),
                 old.read, lambda: old.write(b"clobber")):
        with pytest.raises(xc.UseAfterFreeError) as info:
            call()
        assert info.value.status == xc.Status.USE_AFTER_FREE
        assert f"generation {old.generation}" in info.value.message
    with pytest.raises(xc.UseAfterFreeError):
        xc.launch(rt, stream, [(old, xc.Access.READ)], lambda: pytest.fail("launch ran fn"))

    # Nothing of that touched the new block.
    new.validate()
    assert new.read(8) == b"new data"
    assert rt.stats().live_blocks == 1
    new.free()


def test_forged_handle_is_invalid_argument(rt, stream):
    blk = rt.allocate(512, stream)
    forged = blk.copy()
    forged._raw.size = 1024
    with pytest.raises(xc.InvalidArgumentError) as info:
        forged.validate()
    assert "does not match" in info.value.message
    blk.free()


def test_pool_exhausted_and_ids_never_reused(make_runtime):
    rt = make_runtime(stream_pool_size=2)
    a, b = rt.acquire_stream(), rt.acquire_stream()
    assert a.id != b.id and 0 not in (a.id, b.id)
    with pytest.raises(xc.PoolExhaustedError) as info:
        rt.acquire_stream()
    assert info.value.status == xc.Status.POOL_EXHAUSTED
    assert "all 2 pooled streams" in info.value.message
    assert xc.last_error() == info.value.message
    a.release()
    a.release()  # no-op
    c = rt.acquire_stream()
    assert c.id not in (a.id, b.id)
    # The released id is dead.
    with pytest.raises(xc.InvalidArgumentError):
        rt.allocate(16, a.id)
    with pytest.raises(xc.InvalidArgumentError):
        a.synchronize()
    b.release()
    c.release()


def test_stream_ids_are_validated(rt):
    with pytest.raises(xc.InvalidArgumentError) as info:
        rt.allocate(16, 0)
    assert "stream 0" in info.value.message
    with pytest.raises(xc.InvalidArgumentError) as info:
        rt.allocate(16, 999_999)
    assert "999999" in info.value.message


def test_import_stream_maps_native_handles(rt):
    s1 = rt.import_stream(0x1234)
    s2 = rt.import_stream(0x1234)
    assert s1.id == s2.id
    other = rt.import_stream(0x5678)
    assert other.id != s1.id
    with rt.allocate(64, s1) as blk:
        assert blk.stream == s1.id
    s1.release()
    s3 = rt.import_stream(0x1234)
    assert s3.id not in (s1.id, other.id)
    legacy = rt.import_stream(None)
    assert legacy.id == rt.import_stream(0).id
    for s in (s3, other, legacy):
        s.release()


def test_native_of_pooled_stream_round_trips(rt, stream):
    native = stream.native
    assert native != 0
    imported = rt.import_stream(native)
    assert imported.id != stream.id
    assert imported.native == native  # same sim stream underneath
    imported.release()


def test_leak_report_on_close(make_runtime, capfd):
    rt = make_runtime()
    s = rt.acquire_stream()
    # Held: a Block nobody holds is freed when collected.
    held = [rt.allocate(100, s, tag="leak-a"), rt.allocate(200, s, tag="leak-b"), rt.allocate(0, s, tag="leak-empty")]
    rt.allocate(50, s, tag="freed").free()
    # s is never released either: the report names it (issue 25).
    assert rt.close() == xc.LeakReport(blocks=3, bytes=300, streams=1)
    del held
    err = capfd.readouterr().err
    assert 'tag="leak-a" size=100' in err and 'tag="leak-b" size=200' in err
    assert "freed" not in err
    assert f"1 stream(s) acquired and never released (ids {s.id})" in err
    assert f"unreleased stream {s.id} native=" in err


def test_close_names_the_streams_never_released_in_the_log(make_runtime, tmp_path):
    log = tmp_path / "log.csv"
    rt = make_runtime(log_path=str(log))
    kept, released = rt.acquire_stream(), rt.acquire_stream()
    released.release()
    with rt.import_stream(0x5400):  # imported: the caller's own, never counted
        pass
    rt.import_stream(0x5500)
    native = kept.native
    assert rt.close() == xc.LeakReport(blocks=0, bytes=0, streams=1)
    rows = [line.split(",") for line in log.read_text().splitlines()[1:]]
    named = [(r[5], r[9]) for r in rows if r[2] == "unreleased stream"]
    assert len(named) == 1 and named[0][0] == str(kept.id), named
    assert named[0][1].startswith(f"native {native:#x}"), named


def test_allocate_arguments_are_checked_before_the_call(rt, stream):
    for bad in (-1, 1 << 64, 1.5, "10"):
        with pytest.raises(xc.InvalidArgumentError):
            rt.allocate(bad, stream)
    with pytest.raises(xc.InvalidArgumentError):
        rt.allocate(16, stream, tag="a\0b")
    assert rt.stats().failed_allocations == 0  # none reached the library


def test_tag_is_used_in_log(make_runtime, tmp_path):
    log = tmp_path / "xlog.csv"
    rt = make_runtime(log_path=str(log))
    with rt.acquire_stream() as s:
        blk = rt.allocate(4096, s, tag="weights,v2")
        ptr = blk.ptr
        blk.free()
    rt.close()
    lines = log.read_text().splitlines()
    assert lines[0] == "Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail"
    actions = [line.split(",")[2] for line in lines[1:]]
    # Taken from the driver, handed out, freed into the cache, and at close
    # given back to the driver and retired.
    assert actions == ["reserve", "allocate", "free", "release", "retire"]
    assert f"{ptr:#x},4096" in lines[2] and f'"weights,v2",0,{os.getpid()},' in lines[2]


def test_read_write_bounds(rt, stream):
    with rt.allocate(16, stream) as blk:
        blk.write(b"0123456789abcdef")
        assert blk.read() == b"0123456789abcdef"
        assert blk.read(4, offset=10) == b"abcd"
        blk.write(bytearray(b"XY"), offset=14)
        assert blk.read(offset=12) == b"cdXY"
        with pytest.raises(xc.InvalidArgumentError):
            blk.write(b"x" * 17)
        with pytest.raises(xc.InvalidArgumentError):
            blk.read(1, offset=16)
        with pytest.raises(xc.InvalidArgumentError):
            blk.read(-1)


def test_fresh_sim_memory_is_zeroed(rt, stream):
    with rt.allocate(1024, stream) as blk:
        assert blk.read() == bytes(1024)


def test_last_error_is_per_thread(rt, stream):
    with pytest.raises(xc.PoolExhaustedError):
        small = xc.Runtime(backend="sim", stream_pool_size=1)
        try:
            small.acquire_stream()
            small.acquire_stream()
        finally:
            small.close()
    # close() succeeded last on this thread: the message is cleared.
    assert xc.last_error() == ""
    seen = {}

    def other_thread():
        try:
            rt.allocate(1, 0)
        except xc.InvalidArgumentError:
            pass
        seen["other"] = xc.last_error()

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert "stream 0" in seen["other"]
    assert xc.last_error() == ""


def test_readme_example_runs(capsys):
    import os

    from conftest import PYTHON_DIR

    with open(os.path.join(PYTHON_DIR, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    from conftest import held_for

    assert f"cached_bytes={held_for(4096)}," in capsys.readouterr().out


def test_sim_native_token_of_another_runtime_is_not_aliased(make_runtime):
    r1, r2 = make_runtime(), make_runtime()
    s, t = r1.acquire_stream(), r2.acquire_stream()
    assert s.native != t.native
    with pytest.raises(xc.InvalidArgumentError):
        r2.import_stream(s.native)
