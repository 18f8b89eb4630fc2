//! Stream capture through the runtime (DESIGN: "Stream capture"), on the
//! sim backend, whose streams model CUDA's capture rules (a capture that
//! waits on outside work, queries a captured event, or queues a
//! stream-ordered free is invalidated, and its end then fails). Each test
//! ends its captures and checks they were not invalidated.

mod common;

use std::sync::mpsc;

use common::*;
use xlog_cuda::device::CaptureMode;
use xlog_cuda::resources::stream_cache::size_class;
use xlog_cuda::{Access, ResourceError, Runtime, StreamId};

const LEN: u64 = 64 * KIB;

fn misuse<T: std::fmt::Debug>(r: Result<T, ResourceError>, what: &str) -> String {
    match r {
        Err(ResourceError::StreamMisuse(m)) => m,
        other => panic!("{what}: expected StreamMisuse, got {other:?}"),
    }
}

/// Hold `stream` until the returned sender is dropped or sent to.
fn gate(rt: &Runtime, stream: StreamId) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    rt.enqueue_host(stream, Box::new(move || {
        let _ = rx.recv();
    }))
    .unwrap();
    tx
}

#[test]
fn allocations_in_a_capture_come_from_its_own_memory_until_released() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s) = (&st.rt, st.stream());
    let class = size_class(LEN).unwrap();
    // A cached block of this size on `s`, which a capture must not take.
    let warm = rt.allocate(LEN, s, "warm").unwrap();
    rt.deallocate(&warm.id).unwrap();
    let reserved = st.reserved().unwrap();

    let id = rt.begin_capture(s, CaptureMode::Global).unwrap();
    let b = rt.allocate(LEN, s, "in capture").unwrap();
    assert_ne!(b.id.ptr, warm.id.ptr, "a capture's block does not come from the stream cache");
    assert_eq!(st.reserved().unwrap(), reserved + class, "capture memory is charged");
    rt.deallocate(&b.id).unwrap();
    let c = rt.allocate(LEN, s, "again in capture").unwrap();
    assert_eq!(c.id.ptr, b.id.ptr, "memory freed in the capture is reused by it, in stream order");
    let (graph, ended) = rt.end_capture(s).expect("the capture was not invalidated");
    assert_eq!(ended, id);
    assert_ne!(graph, 0);

    let d = rt.allocate(LEN, s, "after").unwrap();
    assert_eq!(d.id.ptr, warm.id.ptr, "outside the capture the cache serves again");
    rt.deallocate(&c.id).unwrap();
    let e = rt.allocate(LEN, s, "after, again").unwrap();
    assert_ne!(e.id.ptr, c.id.ptr, "a capture block freed later stays the graph's: never handed out outside");
    let stats = rt.stats().unwrap();
    assert!(stats.cached_bytes >= class, "the capture's free memory counts as cached: {stats:?}");

    assert_eq!(rt.release_capture(id).unwrap(), class, "release gives the capture's memory back");
    let m = misuse(rt.release_capture(id), "second release");
    assert!(m.contains("released already"), "{m}");
    rt.deallocate(&d.id).unwrap();
    rt.deallocate(&e.id).unwrap();
    st.check_invariant("after release");
    st.release_all();
}

#[test]
fn release_is_refused_while_the_capture_runs_or_has_live_blocks() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let (rt, s) = (&st.rt, st.stream());
    let id = rt.begin_capture(s, CaptureMode::Global).unwrap();
    let b = rt.allocate(LEN, s, "b").unwrap();
    let m = misuse(rt.release_capture(id), "release while capturing");
    assert!(m.contains(&format!("capture {id}")) && m.contains("still capturing"), "{m}");
    rt.end_capture(s).unwrap();
    let before = st.reserved().unwrap();
    let m = misuse(rt.release_capture(id), "release with a live block");
    assert!(m.contains("1 live block"), "{m}");
    assert_eq!(st.reserved().unwrap(), before, "a refused release changes nothing");
    assert!(rt.validate(&b.id).is_ok(), "the block is still live");
    rt.deallocate(&b.id).unwrap();
    assert_eq!(rt.release_capture(id).unwrap(), size_class(LEN).unwrap());
    st.check_invariant("released");
    st.release_all();
}

/// Reap, trim, drain-free paths and frees of ordinary blocks while a stream
/// captures: none may seal, free or query on the capturing stream (the sim
/// would invalidate the capture, and its end would fail).
#[test]
fn reap_trim_and_frees_never_break_a_capture() {
    for kind in [StackKind::AsyncNoCache, StackKind::BudgetLoggingAsync] {
        let st = Stack::open_default(kind);
        let (rt, n) = (&st.rt, st.name());
        let (s, t) = (st.stream(), st.stream());
        // Frees queued on `s` before the capture, not sealed yet (cache off)
        // or cached (cache on).
        let before_capture = rt.allocate(LEN, s, "before").unwrap();
        rt.deallocate(&before_capture.id).unwrap();
        let ordinary = rt.allocate(LEN, s, "ordinary").unwrap();
        let id = rt.begin_capture(s, CaptureMode::Global).unwrap();
        rt.reap().unwrap();
        rt.trim(0).unwrap();
        // An ordinary block freed while its stream captures: parked.
        rt.deallocate(&ordinary.id).unwrap();
        let other = rt.allocate(LEN, t, "other stream").unwrap();
        rt.deallocate(&other.id).unwrap();
        rt.reap().unwrap();
        rt.end_capture(s).unwrap_or_else(|e| panic!("[{n}] the capture was invalidated: {e}"));
        rt.drain().unwrap();
        let again = rt.allocate(LEN, s, "after").unwrap();
        assert_ne!(again.id.ptr, ordinary.id.ptr, "[{n}] a block freed during the capture stays parked");
        rt.deallocate(&again.id).unwrap();
        assert!(rt.release_capture(id).unwrap() > 0, "[{n}] the parked block is released with the capture");
        rt.drain().unwrap();
        st.check_invariant(&format!("[{n}] after the capture"));
        st.release_all();
    }
}

#[test]
fn a_capture_cannot_wait_on_outside_work_that_still_runs() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let blk = rt.allocate(LEN, t, "written outside").unwrap();
    let open = gate(rt, t);
    rt.finish(&blk.id, t, Access::Write).unwrap();
    rt.begin_capture(s, CaptureMode::Global).unwrap();
    let before = st.snapshot();
    let m = misuse(rt.prepare(&blk.id, s, Access::Read), "prepare on the capture");
    assert!(m.contains("capture") && m.contains("outside"), "{m}");
    st.assert_unchanged(&before, 0, "a refused prepare");
    rt.end_capture(s).expect("the refusal left the capture intact");
    drop(open);
    rt.synchronize(t).unwrap();
    // Completed outside work: nothing to wait for inside the capture.
    let id = rt.begin_capture(s, CaptureMode::Global).unwrap();
    rt.prepare(&blk.id, s, Access::Read).unwrap();
    rt.finish(&blk.id, s, Access::Read).unwrap();
    rt.end_capture(s).expect("no dependency across the capture boundary");
    // The capture's use is forgotten once it ended: the free needs no wait.
    rt.deallocate(&blk.id).unwrap();
    rt.release_capture(id).unwrap();
    st.release_all();
}

#[test]
fn streams_fork_into_a_capture_through_prepare_and_join_back() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, r, t) = (&st.rt, st.stream(), st.stream(), st.stream());
    let a = rt.allocate(LEN, s, "a").unwrap();
    rt.finish(&a.id, s, Access::Write).unwrap();
    rt.synchronize(s).unwrap();
    // Warm r's cache: a block r allocates inside the capture must not be it.
    let warm = rt.allocate(LEN, r, "warm").unwrap();
    rt.deallocate(&warm.id).unwrap();

    let id = rt.begin_capture(s, CaptureMode::Global).unwrap();
    rt.prepare(&a.id, s, Access::Write).unwrap();
    rt.finish(&a.id, s, Access::Write).unwrap();
    // r waits on the captured write: it joins the capture (a fork).
    rt.prepare(&a.id, r, Access::Read).unwrap();
    let tmp = rt.allocate(LEN, r, "forked").unwrap();
    assert_ne!(tmp.id.ptr, warm.id.ptr, "a forked stream allocates from the capture's memory");
    rt.finish(&a.id, r, Access::Read).unwrap();
    rt.deallocate(&tmp.id).unwrap();
    // s waits for r's read (the join), then the capture ends.
    rt.prepare(&a.id, s, Access::Write).unwrap();
    rt.finish(&a.id, s, Access::Write).unwrap();
    rt.end_capture(s).expect("the fork was joined");
    // After the end the captured uses are gone: a plain stream may use a.
    rt.prepare(&a.id, t, Access::ReadWrite).unwrap();
    rt.finish(&a.id, t, Access::ReadWrite).unwrap();
    rt.deallocate(&a.id).unwrap();
    rt.release_capture(id).unwrap();
    st.release_all();
}

#[test]
fn a_stream_of_one_capture_cannot_wait_on_another_capture() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, u) = (&st.rt, st.stream(), st.stream());
    let a = rt.allocate(LEN, s, "a").unwrap();
    rt.synchronize(s).unwrap();
    let first = rt.begin_capture(s, CaptureMode::Relaxed).unwrap();
    rt.finish(&a.id, s, Access::Write).unwrap();
    let second = rt.begin_capture(u, CaptureMode::Relaxed).unwrap();
    assert_ne!(first, second);
    let m = misuse(rt.prepare(&a.id, u, Access::Read), "cross-capture prepare");
    assert!(m.contains(&format!("capture {first}")), "{m}");
    rt.end_capture(u).expect("the refusal left the second capture intact");
    rt.end_capture(s).expect("and the first");
    rt.deallocate(&a.id).unwrap();
    for id in [first, second] {
        rt.release_capture(id).unwrap();
    }
    st.release_all();
}

#[test]
fn ending_a_stream_that_does_not_capture_is_an_error() {
    let st = Stack::open_default(StackKind::Async);
    let (rt, s) = (&st.rt, st.stream());
    let m = misuse(rt.end_capture(s), "end without begin");
    assert!(m.contains("not capturing"), "{m}");
    st.release_all();
}
