"""Host callbacks and cross-stream ordering through prepare/finish.

On the sim backend each stream is a worker thread, so a missing wait is a
real race: the writer callbacks below sleep before writing, and a reader on
another stream that was not ordered after them would see the old bytes.
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import threading
import time

import pytest

import xlog_cuda as xc
from xlog_cuda import _runtime

from conftest import PYTHON_DIR, held_for

DELAY = 0.2  # long enough that an unordered reader always runs first


def test_callbacks_run_in_stream_order(rt, stream):
    order = []
    for i in range(50):
        stream.enqueue_host(lambda i=i: order.append(i))
    stream.synchronize()
    assert order == list(range(50))


def test_callback_runs_on_a_worker_thread(rt, stream):
    seen = {}
    stream.enqueue_host(lambda: seen.setdefault("thread", threading.current_thread().ident))
    stream.synchronize()
    assert seen["thread"] != threading.main_thread().ident


def test_callback_is_kept_alive_until_it_runs(rt, stream):
    gate = threading.Event()
    ran = []
    base = _runtime.pending_host_callbacks()
    stream.enqueue_host(lambda: gate.wait(10))

    def make():
        payload = list(range(5))
        return lambda: ran.append(sum(payload))

    stream.enqueue_host(make())  # the only reference is the registry's
    gc.collect()
    # The second callback cannot have run: the first blocks the stream.
    assert _runtime.pending_host_callbacks() >= base + 1
    assert ran == []
    gate.set()
    stream.synchronize()
    assert ran == [10]
    assert _runtime.pending_host_callbacks() == base


def test_callback_exception_is_raised_at_synchronize(rt, stream):
    ran = []

    def boom():
        raise KeyError("from the worker")

    stream.enqueue_host(boom)
    stream.enqueue_host(lambda: ran.append("after"))  # the stream keeps going
    with pytest.raises(KeyError, match="from the worker"):
        stream.synchronize()
    assert ran == ["after"]
    stream.synchronize()  # reported once


def test_enqueue_on_released_stream_fails_without_leaking(rt):
    s = rt.acquire_stream()
    s.release()
    before = _runtime.pending_host_callbacks()
    with pytest.raises(xc.InvalidArgumentError) as info:
        s.enqueue_host(lambda: None)
    assert f"stream {s.id}" in info.value.message
    assert _runtime.pending_host_callbacks() == before
    with pytest.raises(xc.InvalidArgumentError):
        s.enqueue_host("not callable")


def test_released_stream_still_runs_queued_work(rt):
    s = rt.acquire_stream()
    done = threading.Event()
    s.enqueue_host(lambda: (time.sleep(0.05), done.set()))
    s.release()
    assert done.wait(10)


def test_write_then_read_across_streams(make_runtime):
    rt = make_runtime()
    with rt.acquire_stream() as a, rt.acquire_stream() as b, rt.allocate(64, a, tag="shared") as blk:
        events = []

        def writer():
            events.append("write-start")
            time.sleep(DELAY)
            blk.write(b"payload!")
            events.append("write-end")

        def reader():
            events.append("read")
            got["data"] = blk.read(8)

        got = {}
        xc.launch(rt, a, [(blk, xc.Access.WRITE)], lambda: a.enqueue_host(writer))
        xc.launch(rt, b, [(blk, xc.Access.READ)], lambda: b.enqueue_host(reader))
        b.synchronize()
        assert got["data"] == b"payload!"
        assert events == ["write-start", "write-end", "read"]
        a.synchronize()


def test_same_ordering_with_single_prepare_finish(make_runtime):
    rt = make_runtime()
    with rt.acquire_stream() as a, rt.acquire_stream() as b, rt.allocate(64, a) as blk:
        got = {}

        def writer():
            time.sleep(DELAY)
            blk.write(b"per-call")

        blk.prepare(a, xc.Access.WRITE)
        a.enqueue_host(writer)
        blk.finish(a, xc.Access.WRITE)
        blk.prepare(b, "read")
        b.enqueue_host(lambda: got.setdefault("data", blk.read(8)))
        blk.finish(b, "read")
        b.synchronize()
        assert got["data"] == b"per-call"


def test_without_prepare_the_reader_races(make_runtime):
    """Control for the tests above: with no recorded dependency the reader
    runs while the writer is still blocked, and sees the old bytes."""
    rt = make_runtime()
    with rt.acquire_stream() as a, rt.acquire_stream() as b, rt.allocate(64, a) as blk:
        release_writer = threading.Event()
        got = {}
        a.enqueue_host(lambda: (release_writer.wait(10), blk.write(b"too late")))
        b.enqueue_host(lambda: got.setdefault("data", blk.read(8)))
        b.synchronize()
        release_writer.set()
        a.synchronize()
        assert got["data"] == bytes(8)
        assert blk.read(8) == b"too late"


def test_writer_waits_for_every_outstanding_reader(make_runtime):
    rt = make_runtime()
    with rt.acquire_stream() as a, rt.acquire_stream() as b, rt.acquire_stream() as c, \
            rt.allocate(64, a) as blk:
        seen = {}

        def slow_reader(name):
            def run():
                time.sleep(DELAY)
                seen[name] = blk.read(2)
            return run

        xc.launch(rt, a, [(blk, xc.Access.WRITE)], lambda: a.enqueue_host(lambda: blk.write(b"v1")))
        xc.launch(rt, b, [(blk, xc.Access.READ)], lambda: b.enqueue_host(slow_reader("b")))
        xc.launch(rt, c, [(blk, xc.Access.READ)], lambda: c.enqueue_host(slow_reader("c")))
        # The second write must wait for both readers (write-after-read).
        xc.launch(rt, a, [(blk, xc.Access.READ_WRITE)], lambda: a.enqueue_host(lambda: blk.write(b"v2")))
        a.synchronize()
        assert seen == {"b": b"v1", "c": b"v1"}
        assert blk.read(2) == b"v2"


def test_free_waits_for_use_on_another_stream(make_runtime):
    rt = make_runtime(cache=False)
    with rt.acquire_stream() as a, rt.acquire_stream() as b:
        blk = rt.allocate(4096, a, tag="read-on-b")
        blk.write(b"old")
        seen = {}

        ptr = blk.ptr

        def reader():
            # Raw access, as a kernel would: the work was enqueued while the
            # block was live, so it may run after the host called free.
            time.sleep(DELAY)
            seen["data"] = ctypes.string_at(ptr, 3)

        xc.launch(rt, b, [(blk, xc.Access.READ)], lambda: b.enqueue_host(reader))
        blk.free()
        assert rt.drain() == 4096
        # drain returned only after the free ran, which waited for the reader.
        assert seen.get("data") == b"old"
        b.synchronize()  # the reader raised nothing
        # And only now may the address be handed out again.
        reuse = rt.allocate(4096, a)
        assert reuse.ptr == blk.ptr
        reuse.free()


@pytest.mark.parametrize("reuse_on", ["same stream", "third stream"])
def test_cached_block_is_reused_only_after_the_other_streams_use(make_runtime, reuse_on):
    """With the cache, a freed block is handed out again at once, with no
    host wait; the next owner's work must still run after every use of the
    old owner's (here a slow reader on b)."""
    rt = make_runtime()
    with rt.acquire_stream() as a, rt.acquire_stream() as b, rt.acquire_stream() as c:
        blk = rt.allocate(4096, a, tag="read-on-b")
        blk.write(b"old")
        seen = {}
        ptr = blk.ptr

        def reader():
            time.sleep(DELAY)
            seen["data"] = ctypes.string_at(ptr, 3)

        xc.launch(rt, b, [(blk, xc.Access.READ)], lambda: b.enqueue_host(reader))
        blk.free()
        target = a if reuse_on == "same stream" else c
        start = time.monotonic()
        reuse = rt.allocate(4096, target, tag="next-owner")
        assert time.monotonic() - start < DELAY / 2, "the hand-out waited on the host"
        assert reuse.ptr == ptr  # the same memory (so the ordering below is tested)
        st = rt.stats()
        # Nothing new from the driver: the pool's cached block, or the
        # arena's page, now live again (the rest of the page idle).
        assert (st.cache_hits, st.live_bytes, st.outstanding_bytes) == (1, 4096, held_for(4096))
        assert st.cached_bytes == held_for(4096) - 4096
        xc.launch(rt, target, [(reuse, xc.Access.WRITE)],
                  lambda: target.enqueue_host(lambda: ctypes.memmove(ptr, b"new", 3)))
        target.synchronize()
        b.synchronize()
        # The reader ran before the next owner's write, though it was slower.
        assert seen.get("data") == b"old"
        assert reuse.read(3) == b"new"
        reuse.free()


def test_launch_returns_fn_result_and_propagates_errors(make_runtime):
    rt = make_runtime()
    with rt.acquire_stream() as s, rt.allocate(64, s) as blk:
        assert xc.launch(rt, s, [(blk, xc.Access.WRITE)], lambda: 42) == 42
        assert xc.launch(rt, s, [], lambda: "no uses") == "no uses"

        def fail():
            raise RuntimeError("enqueue failed")

        with pytest.raises(RuntimeError, match="enqueue failed"):
            xc.launch(rt, s, [(blk, "read")], fail)
        with pytest.raises(xc.InvalidArgumentError):
            xc.launch(rt, s, [(blk,)], lambda: None)
        with pytest.raises(xc.InvalidArgumentError):
            xc.launch(rt, s, [("not a block", xc.Access.READ)], lambda: None)


def test_prepare_all_checks_every_handle_first(make_runtime):
    rt = make_runtime()
    with rt.acquire_stream() as a, rt.acquire_stream() as b:
        good = rt.allocate(64, a)
        stale = rt.allocate(64, a)
        stale.free()
        with pytest.raises(xc.UseAfterFreeError):
            rt.prepare_all(b, [(good, xc.Access.READ), (stale, xc.Access.READ)])
        with pytest.raises(xc.UseAfterFreeError):
            rt.finish_all(b, [(good, xc.Access.WRITE), (stale, xc.Access.READ)])
        with pytest.raises(xc.InvalidArgumentError) as info:
            rt.prepare_all(b, [(good, xc.Access.READ), (good, 9)])
        assert "uses[1]" in info.value.message
        good.free()


def test_synchronize_from_own_callback_is_refused(rt, stream):
    result = {}

    def inner():
        try:
            stream.synchronize()
        except xc.XlogError as e:
            result["error"] = e

    stream.enqueue_host(inner)
    stream.synchronize()
    # Every xlog call from a host callback is refused (test_hardening.py).
    assert isinstance(result["error"], xc.StreamMisuseError)
    assert "host callback" in result["error"].message


def test_streams_run_concurrently(make_runtime):
    rt = make_runtime()
    streams = [rt.acquire_stream() for _ in range(4)]
    start = time.monotonic()
    for s in streams:
        s.enqueue_host(lambda: time.sleep(DELAY))
    for s in streams:
        s.synchronize()
    elapsed = time.monotonic() - start
    assert elapsed < 4 * DELAY * 0.9, f"streams ran one after another ({elapsed:.2f}s)"
    for s in streams:
        s.release()


def test_a_capturing_stream_is_not_released_and_its_runtime_not_closed(make_runtime):
    # Issue 25: the library refuses both while the stream captures; the
    # package keeps the stream and the runtime open, as nothing changed.
    from xlog_cuda import _library

    lib = _library.load()
    rt = make_runtime(stream_pool_size=1)
    s = rt.acquire_stream()
    assert lib.xlog_capture_begin(rt.handle, s.id, 0) == 0  # XLOG_CAPTURE_GLOBAL
    with pytest.raises(xc.StreamMisuseError, match=r"takes part in capture \d+"):
        s.release()
    assert not s.released
    with pytest.raises(xc.PoolExhaustedError):
        rt.acquire_stream()  # the one pooled stream is still s
    with pytest.raises(xc.StreamMisuseError, match=rf"stream {s.id} takes part in capture"):
        rt.close()
    assert not rt.closed
    graph, capture = ctypes.c_void_p(), ctypes.c_uint64()
    assert lib.xlog_capture_end(rt.handle, s.id, ctypes.byref(graph), ctypes.byref(capture)) == 0
    s.release()
    assert rt.close().blocks == 0


EXIT_WITH_A_CALLBACK_QUEUED = """
import sys, threading
sys.path.insert(0, {python_dir!r})
import xlog_cuda as xc
rt = xc.Runtime(config=xc.Config(backend="sim"))
stream = rt.acquire_stream()
gate = threading.Event()
stream.enqueue_host(lambda: gate.wait(0.5))  # still waiting when the script ends
print("exiting", flush=True)
"""


def test_an_exit_with_host_callbacks_still_queued_waits_for_them():
    # A script that exits with callbacks still queued on a runtime it never
    # closed: they would start while the interpreter finalizes, and the
    # stream thread Python then ends aborted the process. The exit waits
    # for them instead. (Without the wait, about half of such exits
    # aborted: three tries.)
    code = EXIT_WITH_A_CALLBACK_QUEUED.format(python_dir=PYTHON_DIR)
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"exit status {out.returncode}: {out.stderr[-2000:]}"
        assert out.stdout.strip() == "exiting"
