//! Captures a framework begins itself and announces (PyTorch's
//! beginAllocateToPool / endAllocateToPool / releasePool; DESIGN: "Stream
//! capture", `resources/announced_pools.rs`), on the sim backend. Each
//! capture here is begun *directly on the device*, behind the runtime's
//! back, as `cudaStreamBeginCapture` in PyTorch does; the runtime only hears
//! the announcements. The sim invalidates a capture that waits on outside
//! work, so a capture that ends without error was never broken by xlog.

mod common;

use common::*;
use xlog_cuda::device::CaptureMode;
use xlog_cuda::resources::stream_cache::size_class;
use xlog_cuda::{ResourceError, Runtime, StreamId};

const LEN: u64 = 64 * KIB;
const POOL: (u64, u64) = (1, 0);

/// Begin a capture on `s` directly on the device (the runtime is not told).
fn begin_outside(rt: &Runtime, s: StreamId) -> u64 {
    let d = rt.device();
    let raw = d.import_stream(rt.native_stream(s).unwrap()).unwrap();
    d.begin_capture(raw, CaptureMode::Global).unwrap();
    d.capture_of(raw).unwrap().expect("capturing")
}

/// End the capture begun on `s` directly on the device.
fn end_outside(rt: &Runtime, s: StreamId) -> Result<u64, String> {
    let d = rt.device();
    let raw = d.import_stream(rt.native_stream(s).unwrap()).unwrap();
    d.end_capture(raw).map_err(|e| e.to_string())
}

/// A block of LEN cached on a stream of its own: what a capture's cache
/// miss on another stream would take (ordering the capture after an
/// outside event) if xlog did not know the capture.
fn cache_one_elsewhere(st: &Stack) -> (StreamId, u64) {
    let other = st.stream();
    let b = st.rt.allocate(LEN, other, "warm").unwrap();
    st.rt.deallocate(&b.id).unwrap();
    (other, b.id.ptr)
}

#[test]
fn without_an_announcement_a_capture_begun_outside_is_broken_by_a_cache_miss() {
    // The failure the announcements fix (docs/frameworks.md, "CUDA graphs").
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s) = (&st.rt, st.stream());
    cache_one_elsewhere(&st);
    begin_outside(rt, s);
    let r = rt.allocate(LEN, s, "in capture");
    let e = r.expect_err("the miss orders the capture after an event outside it");
    assert!(e.to_string().contains("across the capture boundary"), "{e}");
    let end = end_outside(rt, s);
    assert!(end.as_ref().is_err_and(|m| m.contains("invalidated")), "{end:?}");
    st.check_invariant("after the broken capture");
}

#[test]
fn an_announced_capture_is_adopted_served_from_its_own_memory_and_released() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s) = (&st.rt, st.stream());
    let class = size_class(LEN).unwrap();
    let (_, cached_ptr) = cache_one_elsewhere(&st);
    let before = rt.stats().unwrap();

    rt.announce_capture_pool(POOL, Some(s)).unwrap();
    begin_outside(rt, s);
    let a = rt.allocate(LEN, s, "in capture").unwrap();
    assert_ne!(a.id.ptr, cached_ptr, "not from another stream's cache");
    rt.deallocate(&a.id).unwrap();
    let b = rt.allocate(LEN, s, "in capture, again").unwrap();
    assert_eq!(b.id.ptr, a.id.ptr, "memory freed in the capture is reused by it, in stream order");
    let c = rt.allocate(2 * LEN, s, "a second block").unwrap();
    rt.deallocate(&b.id).unwrap();
    rt.deallocate(&c.id).unwrap();
    let during = rt.stats().unwrap();
    let private = class + size_class(2 * LEN).unwrap();
    assert_eq!(during.outstanding_bytes, before.outstanding_bytes + private, "the capture's memory is charged");
    assert_eq!(st.reserved().unwrap(), during.outstanding_bytes);
    end_outside(rt, s).expect("the capture was not invalidated");
    assert_eq!(rt.end_capture_pool(POOL).unwrap(), 0);

    // Outside the capture the cache serves again; the capture's memory stays the graph's.
    let d = rt.allocate(LEN, s, "after").unwrap();
    assert_ne!(d.id.ptr, a.id.ptr, "a capture block is never handed out outside it");
    rt.deallocate(&d.id).unwrap();
    st.check_invariant("after the capture");

    let released = rt.release_capture_pool(POOL).unwrap();
    assert_eq!(released, private, "the release gives the capture's memory back at once");
    let after = rt.stats().unwrap();
    assert_eq!(after.outstanding_bytes, before.outstanding_bytes, "held bytes are back where they were");
    st.check_invariant("after the release");
    expect_invalid(rt.release_capture_pool(POOL), &["pool (1, 0)", "never announced"], "released twice");
}

#[test]
fn blocks_live_at_the_release_give_the_memory_back_when_the_last_is_freed() {
    // PyTorch destroys a graph (releasePool) while its output tensors may
    // still be alive.
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s) = (&st.rt, st.stream());
    let class = size_class(LEN).unwrap();
    let held = rt.stats().unwrap().outstanding_bytes;
    rt.announce_capture_pool(POOL, Some(s)).unwrap();
    begin_outside(rt, s);
    let scratch = rt.allocate(LEN, s, "freed in the capture").unwrap();
    rt.deallocate(&scratch.id).unwrap();
    let out1 = rt.allocate(2 * LEN, s, "output 1").unwrap();
    let out2 = rt.allocate(4 * LEN, s, "output 2").unwrap();
    end_outside(rt, s).unwrap();
    rt.end_capture_pool(POOL).unwrap();
    let total = class + size_class(2 * LEN).unwrap() + size_class(4 * LEN).unwrap();
    assert_eq!(rt.stats().unwrap().outstanding_bytes, held + total);

    assert_eq!(rt.release_capture_pool(POOL).unwrap(), 0, "two blocks are live: nothing goes back yet");
    assert_eq!(rt.stats().unwrap().outstanding_bytes, held + total);
    rt.deallocate(&out1.id).unwrap();
    assert_eq!(rt.stats().unwrap().outstanding_bytes, held + total, "one block is still live");
    st.check_invariant("one output freed");
    let last = rt.deallocate(&out2.id).unwrap();
    assert_eq!(last.held, size_class(4 * LEN).unwrap());
    let after = rt.stats().unwrap();
    assert_eq!(after.outstanding_bytes, held, "the last free gave the whole pool back");
    assert_eq!(after.live_blocks, 0);
    st.check_invariant("the pool given back");
}

#[test]
fn a_pool_shared_by_two_graphs_goes_back_after_both_are_released() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let (rt, s) = (&st.rt, st.stream());
    let held = rt.stats().unwrap().outstanding_bytes;
    let class = size_class(LEN).unwrap();
    for round in 0..2 {
        rt.announce_capture_pool(POOL, Some(s)).unwrap();
        begin_outside(rt, s);
        let b = rt.allocate(LEN, s, "in capture").unwrap();
        rt.deallocate(&b.id).unwrap();
        end_outside(rt, s).unwrap_or_else(|e| panic!("capture {round}: {e}"));
        rt.end_capture_pool(POOL).unwrap();
    }
    assert_eq!(rt.stats().unwrap().outstanding_bytes, held + 2 * class, "each capture has its own memory");
    assert_eq!(rt.release_capture_pool(POOL).unwrap(), 0, "the other graph still uses the pool");
    assert_eq!(rt.release_capture_pool(POOL).unwrap(), 2 * class);
    assert_eq!(rt.stats().unwrap().outstanding_bytes, held);
    st.check_invariant("both released");
}

#[test]
fn concurrent_announcements_adopt_the_capture_of_their_own_stream() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let rt = &st.rt;
    let (a, b) = (st.stream(), st.stream());
    let (pool_a, pool_b) = ((7, 0), (0, 9));
    let held = rt.stats().unwrap().outstanding_bytes;
    rt.announce_capture_pool(pool_a, Some(a)).unwrap();
    rt.announce_capture_pool(pool_b, Some(b)).unwrap();
    begin_outside(rt, b);
    begin_outside(rt, a);
    // b's capture is met first: it must go to pool_b, not to the first announced.
    let on_b = rt.allocate(4 * LEN, b, "b").unwrap();
    let on_a = rt.allocate(LEN, a, "a").unwrap();
    rt.deallocate(&on_a.id).unwrap();
    rt.deallocate(&on_b.id).unwrap();
    end_outside(rt, a).unwrap();
    rt.end_capture_pool(pool_a).unwrap();
    end_outside(rt, b).unwrap();
    rt.end_capture_pool(pool_b).unwrap();
    assert_eq!(rt.release_capture_pool(pool_a).unwrap(), size_class(LEN).unwrap(), "pool_a had a's memory only");
    assert_eq!(rt.release_capture_pool(pool_b).unwrap(), size_class(4 * LEN).unwrap());
    assert_eq!(rt.stats().unwrap().outstanding_bytes, held);
}

#[test]
fn refusals_name_the_pool_and_change_nothing() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let (rt, s) = (&st.rt, st.stream());
    expect_invalid(rt.announce_capture_pool((0, 0), Some(s)), &["pool (0, 0)"], "pool (0, 0)");
    expect_invalid(rt.end_capture_pool((3, 4)), &["pool (3, 4)", "never announced on device 0"], "end of an unknown pool");
    expect_invalid(rt.release_capture_pool((3, 4)), &["pool (3, 4)", "never announced"], "release of an unknown pool");
    expect_invalid(rt.announce_capture_pool(POOL, Some(StreamId(999_999))), &["999999"], "unknown origin stream");

    rt.announce_capture_pool(POOL, Some(s)).unwrap();
    begin_outside(rt, s);
    let b = rt.allocate(LEN, s, "in capture").unwrap();
    rt.deallocate(&b.id).unwrap();
    let before = st.snapshot();
    match rt.release_capture_pool(POOL) {
        Err(ResourceError::StreamMisuse(m)) => assert!(m.contains("pool (1, 0) on device 0") && m.contains("under way"), "{m}"),
        other => panic!("release while capturing: {other:?}"),
    }
    st.assert_unchanged(&before, 0, "a refused release");
    end_outside(rt, s).unwrap();
    rt.end_capture_pool(POOL).unwrap();
    assert_eq!(rt.release_capture_pool(POOL).unwrap(), size_class(LEN).unwrap(), "still releasable after the refusal");
    st.check_invariant("end");
}

#[test]
fn a_failed_capture_that_never_ends_is_swept_by_the_next_announcement() {
    // PyTorch calls neither endAllocateToPool nor releasePool after a
    // capture that failed; left watching, the announcement would keep every
    // cached block from going back to the driver (as any active capture does).
    let st = Stack::open_default(StackKind::BudgetAsync);
    let (rt, s) = (&st.rt, st.stream());
    let (other, _) = cache_one_elsewhere(&st);

    rt.announce_capture_pool((5, 0), Some(s)).unwrap();
    begin_outside(rt, s);
    let inside = rt.allocate(LEN, s, "adopted").unwrap();
    // The capture fails (here: the framework's own wait across its boundary).
    let d = rt.device();
    let raw = d.import_stream(rt.native_stream(s).unwrap()).unwrap();
    let ev = d.create_event().unwrap();
    d.record_event(ev, d.import_stream(rt.native_stream(other).unwrap()).unwrap()).unwrap();
    assert!(d.stream_wait_event(raw, ev).is_err());
    assert!(end_outside(rt, s).is_err(), "the capture failed");
    assert_eq!(rt.trim(0).unwrap().released, 0, "the stale announcement still holds the cache");

    // The next capture on that stream sweeps it.
    rt.announce_capture_pool((6, 0), Some(s)).unwrap();
    begin_outside(rt, s);
    let b = rt.allocate(LEN, s, "next capture").unwrap();
    rt.deallocate(&b.id).unwrap();
    end_outside(rt, s).expect("the next capture works");
    rt.end_capture_pool((6, 0)).unwrap();
    assert!(rt.trim(0).unwrap().released >= size_class(LEN).unwrap(), "nothing is active any more: the cache goes back");
    // The failed capture's block is still the pool's; freed, it stays held
    // (PyTorch never releases that pool) and close gives it back.
    rt.deallocate(&inside.id).unwrap();
    d.destroy_event(ev);
    st.check_invariant("after the sweep");
    let report = rt.close().unwrap();
    assert!(report.leaked.is_empty());
}

#[test]
fn a_failed_capture_that_never_reached_xlog_is_swept_by_the_next_on_its_stream() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let (rt, s) = (&st.rt, st.stream());
    let cached = rt.allocate(LEN, s, "to cache").unwrap();
    rt.deallocate(&cached.id).unwrap();
    rt.announce_capture_pool((5, 0), Some(s)).unwrap();
    begin_outside(rt, s);
    end_outside(rt, s).unwrap(); // and PyTorch failed before endAllocateToPool
    assert_eq!(rt.trim(0).unwrap().released, 0, "the stale announcement still holds the cache");
    // An announcement on another stream does not sweep it (it may be
    // about to begin its capture).
    let other = st.stream();
    rt.announce_capture_pool((6, 0), Some(other)).unwrap();
    rt.end_capture_pool((6, 0)).unwrap();
    rt.release_capture_pool((6, 0)).unwrap();
    assert_eq!(rt.trim(0).unwrap().released, 0);
    rt.announce_capture_pool((7, 0), Some(s)).unwrap();
    rt.end_capture_pool((7, 0)).unwrap();
    assert_eq!(rt.trim(0).unwrap().released, size_class(LEN).unwrap(), "swept: the cache goes back");
    // The swept pool ends and releases without complaint.
    rt.end_capture_pool((5, 0)).unwrap();
    rt.release_capture_pool((5, 0)).unwrap();
    st.check_invariant("end");
}

#[test]
fn without_a_known_origin_the_only_announcement_adopts_the_capture() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let (rt, s) = (&st.rt, st.stream());
    cache_one_elsewhere(&st);
    rt.announce_capture_pool(POOL, None).unwrap();
    begin_outside(rt, s);
    let b = rt.allocate(LEN, s, "in capture").unwrap();
    rt.deallocate(&b.id).unwrap();
    end_outside(rt, s).expect("adopted: no outside wait");
    rt.end_capture_pool(POOL).unwrap();
    assert_eq!(rt.release_capture_pool(POOL).unwrap(), size_class(LEN).unwrap());
}

#[test]
fn another_stream_never_takes_a_block_cached_on_the_capturing_stream() {
    // Its fence would be recorded inside the capture, and the other stream
    // would join the capture (on CUDA the end then fails: unjoined work).
    let st = Stack::open_default(StackKind::BudgetAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let cached = rt.allocate(LEN, s, "cached on the capture stream").unwrap();
    rt.deallocate(&cached.id).unwrap();
    rt.announce_capture_pool(POOL, Some(s)).unwrap();
    begin_outside(rt, s);
    let inside = rt.allocate(2 * LEN, s, "adopts the capture").unwrap();
    let on_t = rt.allocate(LEN, t, "elsewhere, meanwhile").unwrap();
    assert_ne!(on_t.id.ptr, cached.id.ptr, "not the capturing stream's cached block");
    let d = rt.device();
    let raw_t = d.import_stream(rt.native_stream(t).unwrap()).unwrap();
    assert_eq!(d.capture_of(raw_t).unwrap(), None, "t did not join the capture");
    rt.deallocate(&inside.id).unwrap();
    end_outside(rt, s).unwrap();
    rt.end_capture_pool(POOL).unwrap();
    rt.release_capture_pool(POOL).unwrap();
    rt.deallocate(&on_t.id).unwrap();
    st.check_invariant("end");
}
