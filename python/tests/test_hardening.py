"""What a Python user trips over (issues 17.1, 17.8, 18.1): calls from host
callbacks, objects that are dropped instead of closed or freed, exceptions
raised while leaving a `with` block, and argument types."""

from __future__ import annotations

import ctypes
import gc
import threading
import warnings

import pytest

import xlog_cuda as xc
from xlog_cuda import _library

KiB = 1 << 10
MiB = 1 << 20


def _handle_is_open(handle: int) -> bool:
    raw = _library.XlogStats.new()
    return _library.load().xlog_get_stats(handle, ctypes.byref(raw)) == 0


# ---- calls from host callbacks ---------------------------------------------


def test_calls_from_a_host_callback_are_refused_and_change_nothing(rt, stream):
    blk = rt.allocate(4 * KiB, stream, tag="held")
    stale = rt.allocate(64, stream, tag="stale")
    stale.free()
    rt.drain()
    before = rt.stats()
    seen = {}

    def body():
        for name, fn in [
            ("allocate", lambda: rt.allocate(256, stream)),
            ("free", blk.copy().free),
            ("drain", rt.drain),
            ("stats", rt.stats),
            ("synchronize", stream.synchronize),
            ("acquire", rt.acquire_stream),
            ("close", rt.close),
        ]:
            try:
                fn()
                seen[name] = None
            except xc.XlogError as e:
                seen[name] = e
        # Host memory is fine (sim): write and read the block. A freed one
        # is still refused, from what the package knows (the library cannot
        # be asked from here).
        blk.write(b"from the callback")
        seen["read"] = blk.read(17)
        try:
            stale.read(1)
        except xc.UseAfterFreeError as e:
            seen["stale"] = e

    stream.enqueue_host(body)
    stream.synchronize()
    for name in ("allocate", "free", "drain", "stats", "synchronize", "acquire", "close"):
        assert isinstance(seen[name], xc.StreamMisuseError), (name, seen[name])
        assert "host callback" in seen[name].message
    assert seen["read"] == b"from the callback"
    assert isinstance(seen.get("stale"), xc.UseAfterFreeError)
    assert not rt.closed and rt.stats() == before
    blk.validate()
    blk.free()


def test_drain_from_a_callback_with_a_free_queued_behind_it_does_not_hang(rt, stream):
    # Issue 17.1: the drain waited for the free, which waits for the
    # callback. Now it is refused at once.
    blk = rt.allocate(64 * KiB, stream)
    held = rt.stats().outstanding_bytes  # the block (the pool), its page (the arena)
    assert held >= 64 * KiB
    gate = threading.Event()
    errors = []

    def body():
        gate.wait(10)
        try:
            rt.drain()
        except xc.XlogError as e:
            errors.append(e)

    stream.enqueue_host(body)
    blk.free()  # queued on the stream behind the callback
    gate.set()
    done = threading.Event()
    threading.Thread(target=lambda: (stream.synchronize(), done.set()), daemon=True).start()
    assert done.wait(20), "the stream never got past the callback: deadlock"
    assert len(errors) == 1 and isinstance(errors[0], xc.StreamMisuseError)
    # The free went to the cache (the arena: its idle page) or pending
    # (cache off): drain then trim give back all that was held either way.
    assert rt.drain() + rt.trim() == held
    assert rt.stats().outstanding_bytes == 0


# ---- objects nobody closes or frees ------------------------------------------


def test_a_dropped_runtime_is_closed_with_a_resource_warning():
    rt = xc.Runtime(0, xc.Config(backend="sim"))
    handle = rt.handle
    s = rt.acquire_stream()
    del s
    assert _handle_is_open(handle)
    with pytest.warns(ResourceWarning, match="unclosed"):
        del rt
        gc.collect()
    assert not _handle_is_open(handle), "the collected Runtime left its C runtime open"


def test_a_closed_runtime_gives_no_warning_when_dropped():
    rt = xc.Runtime(0, xc.Config(backend="sim"))
    rt.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del rt
        gc.collect()


def test_blocks_are_freed_when_collected(make_runtime):
    # Issue 18.1: 1,000 allocations of 256 KiB under a 4 MiB budget (two
    # arena pages), each dropped by rebinding the name, as a Python user
    # writes it.
    rt = make_runtime(budget_bytes="4MiB", wait_on_pressure=True)
    with rt.acquire_stream() as s:
        for _ in range(1000):
            b = rt.allocate(256 * KiB, s)
        st = rt.stats()
        assert (st.live_blocks, st.allocations, st.deallocations) == (1, 1000, 999)
        assert st.failed_allocations == 0
        del b
        rt.drain()
        assert rt.stats().live_blocks == 0


def test_a_block_lives_while_any_copy_does(rt, stream):
    blk = rt.allocate(256, stream)
    other = blk.copy()
    del blk
    gc.collect()
    other.validate()  # still live: a copy holds it
    assert rt.stats().live_blocks == 1
    del other
    assert rt.stats().live_blocks == 0


def test_a_block_collected_after_its_runtime_closed_is_harmless(make_runtime):
    rt = make_runtime()
    s = rt.acquire_stream()
    blk = rt.allocate(1024, s)
    assert rt.close() == xc.LeakReport(1, 1024, streams=1)  # s was never released either
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del blk
        gc.collect()
    # And nothing is left queued that would touch the closed runtime.
    other = make_runtime()
    assert other.stats().live_blocks == 0


def test_a_block_collected_inside_a_callback_is_freed_afterwards(rt, stream):
    holder = [rt.allocate(4 * KiB, stream)]

    def body():
        holder.clear()  # the last reference goes inside the callback

    stream.enqueue_host(body)
    stream.synchronize()
    assert holder == []
    st = rt.stats()  # the deferred free runs before this call
    assert (st.live_blocks, st.deallocations) == (0, 1)


# ---- with blocks keep the body's exception ------------------------------------


def test_a_failing_free_on_with_exit_keeps_the_body_exception(rt, stream):
    with pytest.raises(ValueError, match="from the body") as info:
        with rt.allocate(256, stream) as blk:
            blk.copy().free()  # the exit's free will fail
            raise ValueError("from the body")
    notes = getattr(info.value, "__notes__", [])
    assert any("freeing" in n and "UseAfterFreeError" in n for n in notes), notes
    # Without an exception in the body, the exit's failure is raised.
    with pytest.raises(xc.UseAfterFreeError):
        with rt.allocate(256, stream) as blk:
            blk.copy().free()


def test_a_failing_release_on_with_exit_keeps_the_body_exception(rt):
    with pytest.raises(KeyError) as info:
        with rt.acquire_stream() as s:
            xc.Stream(rt, s.id).release()  # the exit's release will fail
            raise KeyError("body")
    assert any("releasing" in n for n in getattr(info.value, "__notes__", []))


def test_a_failing_close_on_with_exit_keeps_the_body_exception():
    with pytest.raises(RuntimeError, match="body") as info:
        with xc.Runtime(0, xc.Config(backend="sim")) as rt:
            assert _library.load().xlog_runtime_close(rt.handle) == 0  # behind its back
            raise RuntimeError("body")
    assert any("closing" in n for n in getattr(info.value, "__notes__", []))


# ---- argument types ----------------------------------------------------------


@pytest.mark.parametrize("tag", [123, 1.5, None, ["a"]])
def test_a_tag_that_is_not_a_str_says_so(rt, stream, tag):
    with pytest.raises(xc.InvalidArgumentError, match="tag must be a str") as info:
        rt.allocate(16, stream, tag=tag)
    assert type(tag).__name__ in info.value.message
    assert rt.stats().failed_allocations == 0
