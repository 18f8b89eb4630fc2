//! Runtime-level behaviour on the sim backend: the stream pool, zero-size
//! blocks, recorded launches (prepare_all / finish_all), close and leak
//! reports, budget pressure and the CSV log.

mod common;

use std::collections::HashSet;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use xlog_cuda::device::sim::FaultKind;
use xlog_cuda::{
    Access, AllocatorKind, Backend, BlockId, BlockState, BlockUse, Config, Generation, ResourceError, Runtime,
    StreamId,
};

fn r(access: Access, block: &BlockId) -> BlockUse {
    BlockUse { block: *block, access }
}

/// Opens `gate` from a helper thread after `after` at the latest, so that a
/// runtime that wrongly blocks on it fails the test instead of hanging it.
/// Sending on (or dropping) the returned sender opens it at once.
fn safety_valve(mut g: Gate, after: Duration) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let _ = rx.recv_timeout(after);
        g.open();
    });
    (tx, h)
}

// ----- stream pool -----

#[test]
fn stream_pool_is_bounded_and_reuses_streams_under_new_ids() {
    let st = Stack::open(StackKind::Async, Opts { stream_pool_size: 3, ..Opts::default() });
    let rt = &st.rt;
    let ids: Vec<StreamId> = (0..3).map(|_| rt.acquire_stream().unwrap()).collect();
    assert!(ids.iter().all(|s| s.0 != 0), "{ids:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids are issued in increasing order: {ids:?}");
    let u = rt.stream_usage();
    assert_eq!((u.capacity, u.in_use, u.created), (3, 3, 3));

    match rt.acquire_stream() {
        Err(e @ ResourceError::PoolExhausted { .. }) => {
            assert_eq!(e, ResourceError::PoolExhausted { capacity: 3 });
            assert!(e.to_string().contains("all 3 pooled streams"), "{e}");
        }
        other => panic!("expected PoolExhausted, got {other:?}"),
    }
    assert_eq!(rt.stream_usage().in_use, 3, "a refused acquire changes nothing");

    let native = rt.native_stream(ids[1]).unwrap();
    rt.release_stream(ids[1]).unwrap();
    assert_eq!(rt.stream_usage().in_use, 2);
    let mut seen: HashSet<StreamId> = ids.iter().copied().collect();
    let mut current = rt.acquire_stream().unwrap();
    assert!(current.0 > ids[2].0, "a new id, never an old one: {current:?}");
    assert!(seen.insert(current));
    assert_eq!(rt.native_stream(current).unwrap(), native, "the released stream is handed out again");
    assert_eq!(rt.stream_usage().created, 3, "no new stream was created");
    assert!(matches!(rt.acquire_stream(), Err(ResourceError::PoolExhausted { capacity: 3 })));

    for _ in 0..5 {
        rt.release_stream(current).unwrap();
        let next = rt.acquire_stream().unwrap();
        assert!(next.0 > current.0, "{next:?} after {current:?}");
        assert!(seen.insert(next), "id {next:?} was reused");
        assert_eq!(rt.native_stream(next).unwrap(), native);
        current = next;
    }
    let u = rt.stream_usage();
    assert_eq!((u.in_use, u.created), (3, 3));
    // Work still runs on the recycled stream.
    let x = rt.allocate(64, current, "x").unwrap();
    host_write_u64(rt, current, x.id.ptr, 99, Duration::ZERO);
    rt.synchronize(current).unwrap();
    assert_eq!(st.sim().read_u64(x.id.ptr).unwrap(), 99);
}

#[test]
fn released_stream_id_is_rejected_everywhere() {
    let st = Stack::open_default(StackKind::Async);
    let rt = &st.rt;
    let s = st.stream();
    let x = rt.allocate(64, s, "x").unwrap();
    // A block outlives its allocation stream's id: the free still works.
    let t = st.stream();
    let y = rt.allocate(128, t, "y").unwrap();
    let old = st.stream();
    rt.release_stream(old).unwrap();
    rt.release_stream(t).unwrap();

    let before = st.snapshot();
    let needle = format!("stream {} was never issued by this runtime or has been released", old.0);
    let needles = [needle.as_str()];
    let uses = [r(Access::Read, &x.id)];
    expect_invalid(rt.allocate(16, old, "z"), &needles, "allocate");
    expect_invalid(rt.release_stream(old), &needles, "second release");
    expect_invalid(rt.enqueue_host(old, Box::new(|| {})), &needles, "enqueue_host");
    expect_invalid(rt.synchronize(old), &needles, "synchronize");
    expect_invalid(rt.native_stream(old), &needles, "native_stream");
    expect_invalid(rt.prepare(&x.id, old, Access::Read), &needles, "prepare");
    expect_invalid(rt.finish(&x.id, old, Access::Write), &needles, "finish");
    expect_invalid(rt.prepare_all(old, &uses), &needles, "prepare_all");
    expect_invalid(rt.finish_all(old, &uses), &needles, "finish_all");
    st.assert_unchanged(&before, 0, "calls on a released stream");
    assert_eq!(rt.stream_usage().in_use, 1);

    assert_eq!(rt.deallocate(&y.id).unwrap().state, BlockState::Cached);
    st.release_all();
    rt.deallocate(&x.id).unwrap();
}

#[test]
fn stream_and_block_from_another_runtime_are_rejected() {
    let a = Stack::open_default(StackKind::BudgetAsync);
    let b = Stack::open_default(StackKind::BudgetAsync);
    let (sa, sb) = (a.stream(), b.stream());
    let xa = a.rt.allocate(256, sa, "mine").unwrap();
    let xb = b.rt.allocate(256, sb, "theirs").unwrap();
    let before = a.snapshot();
    let id = sb.0.to_string();
    let needles = [id.as_str()];
    expect_invalid(a.rt.allocate(64, sb, "x"), &needles, "allocate on a foreign stream");
    expect_invalid(a.rt.synchronize(sb), &needles, "synchronize a foreign stream");
    expect_invalid(a.rt.enqueue_host(sb, Box::new(|| {})), &needles, "enqueue on a foreign stream");
    expect_invalid(a.rt.prepare(&xa.id, sb, Access::Read), &needles, "prepare on a foreign stream");
    expect_invalid(a.rt.release_stream(sb), &needles, "release a foreign stream");
    // A block live in the other runtime is named as its (issue 25), not
    // reported as a use after free.
    let generation = format!("block generation {} ", xb.id.generation);
    let foreign_block = [generation.as_str(), "live block of another runtime of device 0"];
    expect_invalid(a.rt.deallocate(&xb.id), &foreign_block, "free of a foreign block");
    expect_invalid(a.rt.validate(&xb.id), &foreign_block, "validate a foreign block");
    expect_invalid(a.rt.prepare(&xb.id, sa, Access::Read), &foreign_block, "prepare a foreign block");
    a.assert_unchanged(&before, 0, "foreign ids");
    // The other runtime is untouched and still owns both.
    assert_eq!(&*b.rt.validate(&xb.id).unwrap().tag.name(), "theirs");
    b.rt.synchronize(sb).unwrap();
    b.rt.deallocate(&xb.id).unwrap();
    a.rt.deallocate(&xa.id).unwrap();
}

// ----- blocks -----

#[test]
fn zero_size_allocation_is_null_fresh_and_uncharged() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let rt = &st.rt;
    let s = st.stream();
    let earlier = rt.allocate(1, s, "earlier").unwrap();
    rt.deallocate(&earlier.id).unwrap();
    st.release_all();
    let z = rt.allocate(0, s, "nothing").unwrap();
    assert_eq!((z.id.ptr, z.id.size, z.state), (0, 0, BlockState::Live));
    assert!(z.id.generation > earlier.id.generation, "a fresh generation");
    let stats = rt.stats().unwrap();
    assert_eq!((stats.live_bytes, stats.outstanding_bytes, stats.live_blocks), (0, 0, 1));
    assert_eq!(stats.budget_remaining, MIB, "0 bytes charged");
    assert_eq!(st.reserved(), Some(0));
    assert_eq!(st.sim().bytes_in_use(), 0);
    let z2 = rt.allocate(0, s, "nothing").unwrap();
    assert_ne!(z2.id.generation, z.id.generation, "two empty blocks are told apart");
    assert_eq!(rt.deallocate(&z.id).unwrap().state, BlockState::Retired);
    expect_use_after_free(rt.deallocate(&z.id), &z.id, "second free of an empty block");
    assert_eq!(&*rt.validate(&z2.id).unwrap().tag.name(), "nothing");
    rt.deallocate(&z2.id).unwrap();

    let (_, lines) = parse_log(&st.log_text());
    let mine: Vec<_> = lines.iter().filter(|l| l.tag == "nothing").collect();
    assert_eq!(mine.len(), 4, "{mine:?}");
    for l in &mine {
        assert_eq!((l.pointer.as_str(), l.size, l.stream), ("0x0", 0, s.0), "{l:?}");
    }
    assert_eq!(mine.iter().filter(|l| l.action == "allocate").count(), 2);
    assert_eq!(mine.iter().filter(|l| l.action == "free").count(), 2);
}

// ----- recorded launches -----

#[test]
fn prepare_all_validates_every_handle_before_queueing_a_wait() {
    let st = Stack::open_default(StackKind::Async);
    let rt = &st.rt;
    let (a, b) = (st.stream(), st.stream());
    let g1 = rt.allocate(64, a, "g1").unwrap();
    let g2 = rt.allocate(64, a, "g2").unwrap();
    let stale = rt.allocate(64, a, "stale").unwrap();
    rt.deallocate(&stale.id).unwrap();
    rt.drain().unwrap();
    let forged = BlockId { size: 65, ..g2.id };
    for blk in [&g1, &g2] {
        st.sim().fill(blk.id.ptr, 64, 0).unwrap();
    }

    let mut gate_a = gate(rt, a);
    let launch = [r(Access::Write, &g1.id), r(Access::Write, &g2.id)];
    rt.prepare_all(a, &launch).unwrap();
    host_write_u64(rt, a, g1.id.ptr, 7, Duration::ZERO);
    host_write_u64(rt, a, g2.id.ptr, 7, Duration::ZERO);
    rt.finish_all(a, &launch).unwrap();

    let before = st.snapshot();
    for bad in [
        vec![r(Access::Read, &g1.id), r(Access::Read, &stale.id), r(Access::Read, &g2.id)],
        vec![r(Access::Read, &stale.id), r(Access::Write, &g1.id)],
        vec![r(Access::ReadWrite, &g1.id), r(Access::Read, &g2.id), r(Access::Write, &stale.id)],
    ] {
        expect_use_after_free(rt.prepare_all(b, &bad), &stale.id, "prepare_all with a stale handle");
        st.assert_unchanged(&before, 0, "prepare_all with a stale handle");
    }
    expect_invalid(
        rt.prepare_all(b, &[r(Access::Read, &g1.id), r(Access::Read, &forged)]),
        &["size 65", &g2.id.generation.to_string()],
        "prepare_all with a forged handle",
    );
    st.assert_unchanged(&before, 0, "prepare_all with a forged handle");
    assert_eq!(rt.usage().cross_stream_waits, before.usage.cross_stream_waits, "no wait was queued");

    // Had a wait been queued, B would now be stuck behind the gated writer.
    let seen = host_read_u64(rt, b, g1.id.ptr, Duration::ZERO);
    assert_eq!(seen.recv_timeout(Duration::from_secs(3)), Ok(0), "B must not wait after a refused prepare_all");

    // The valid launch queues one wait: both blocks share A's launch event.
    rt.prepare_all(b, &[r(Access::Read, &g1.id), r(Access::Read, &g2.id)]).unwrap();
    assert_eq!(rt.usage().cross_stream_waits, before.usage.cross_stream_waits + 1);
    let seen2 = host_read_u64(rt, b, g2.id.ptr, Duration::ZERO);
    assert_blocked(&seen2, "B must wait for A's launch");
    gate_a.open();
    assert_eq!(recv(&seen2, "B"), 7);
}

#[test]
fn finish_all_validates_every_handle_before_recording() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let rt = &st.rt;
    let (a, b, c) = (st.stream(), st.stream(), st.stream());
    let g1 = rt.allocate(64, a, "g1").unwrap();
    let g2 = rt.allocate(64, a, "g2").unwrap();
    let stale = rt.allocate(64, a, "stale").unwrap();
    rt.deallocate(&stale.id).unwrap();
    // The sim frees on A's worker: let it run so device memory is steady.
    rt.synchronize(a).unwrap();
    st.sim().fill(g1.id.ptr, 64, 0).unwrap();

    let mut gate_a = gate(rt, a);
    rt.prepare(&g1.id, a, Access::Write).unwrap();
    host_write_u64(rt, a, g1.id.ptr, 7, Duration::ZERO);
    rt.finish(&g1.id, a, Access::Write).unwrap();

    let before = st.snapshot();
    let bad = [r(Access::Write, &g1.id), r(Access::Read, &g2.id), r(Access::Read, &stale.id)];
    expect_use_after_free(rt.finish_all(b, &bad), &stale.id, "finish_all with a stale handle");
    st.assert_unchanged(&before, 0, "finish_all with a stale handle");
    assert_eq!(rt.usage().events_recorded, before.usage.events_recorded, "no event was recorded");

    // g1's last write is still A's: a reader on C waits for the gated writer.
    // Had finish_all recorded B's (empty) write, C would read 0 at once.
    rt.prepare(&g1.id, c, Access::Read).unwrap();
    let seen = host_read_u64(rt, c, g1.id.ptr, Duration::ZERO);
    rt.finish(&g1.id, c, Access::Read).unwrap();
    assert_blocked(&seen, "C must still wait for A's write");
    gate_a.open();
    assert_eq!(recv(&seen, "C"), 7);
}

#[test]
fn launch_uses_are_ordered_and_finish_all_records_one_event() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let rt = &st.rt;
    let (a, b, c) = (st.stream(), st.stream(), st.stream());
    let x = rt.allocate(64, a, "x").unwrap();
    let y = rt.allocate(64, a, "y").unwrap();
    let z = rt.allocate(64, a, "z").unwrap();
    for blk in [&x, &y, &z] {
        st.sim().fill(blk.id.ptr, 64, 0).unwrap();
    }
    st.sim().write_u64(y.id.ptr, 5).unwrap();

    // Launch on B: x = y (write x, read y), z += 1 (read-write z).
    let launch = [r(Access::Write, &x.id), r(Access::Read, &y.id), r(Access::ReadWrite, &z.id)];
    let mut gate_b = gate(rt, b);
    rt.prepare_all(b, &launch).unwrap();
    let d = dev(rt);
    let (px, py, pz) = (x.id.ptr, y.id.ptr, z.id.ptr);
    rt.enqueue_host(b, Box::new(move || {
        let sim = d.as_sim().unwrap();
        sim.write_u64(px, sim.read_u64(py).unwrap()).unwrap();
        sim.write_u64(pz, sim.read_u64(pz).unwrap() + 1).unwrap();
    }))
    .unwrap();
    let events = rt.usage().events_recorded;
    rt.finish_all(b, &launch).unwrap();
    assert_eq!(rt.usage().events_recorded, events + 1, "one event for the whole launch");

    // C reads x (waits for the launch's write); A overwrites y (waits for the
    // launch's read); C then read-writes z.
    rt.prepare(&x.id, c, Access::Read).unwrap();
    let seen_x = host_read_u64(rt, c, px, Duration::ZERO);
    rt.finish(&x.id, c, Access::Read).unwrap();
    rt.prepare(&y.id, a, Access::Write).unwrap();
    host_write_u64(rt, a, py, 9, Duration::ZERO);
    rt.finish(&y.id, a, Access::Write).unwrap();
    let a_done = marker(rt, a);
    rt.prepare(&z.id, c, Access::ReadWrite).unwrap();
    let seen_z = host_read_u64(rt, c, pz, Duration::ZERO);
    rt.finish(&z.id, c, Access::ReadWrite).unwrap();
    assert_blocked(&seen_x, "C must wait for the launch's write of x");
    assert_blocked(&a_done, "A must wait for the launch's read of y");
    gate_b.open();
    assert_eq!(recv(&seen_x, "x"), 5, "C saw x before the launch wrote it");
    recv(&a_done, "A");
    assert_eq!(recv(&seen_z, "z"), 1);
    rt.synchronize(c).unwrap();
    assert_eq!(st.sim().read_u64(py).unwrap(), 9);
    assert_eq!(st.sim().read_u64(px).unwrap(), 5, "A's write of y came after the launch read it");

    // An empty launch is a no-op.
    let events = rt.usage().events_recorded;
    rt.prepare_all(c, &[]).unwrap();
    rt.finish_all(c, &[]).unwrap();
    assert_eq!(rt.usage().events_recorded, events);
}

// ----- close -----

#[test]
fn close_frees_live_blocks_and_reports_leaks() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let rt = &st.rt;
    let (s, t) = (st.stream(), st.stream());
    let ht = rt.allocate(1000, s, "hash_table").unwrap();
    let jo = rt.allocate(4096, t, "join_output").unwrap();
    let tmp = rt.allocate(512, s, "temp").unwrap();
    let empty = rt.allocate(0, s, "empty").unwrap();
    rt.deallocate(&tmp.id).unwrap(); // still pending at close
    // Work still queued on a stream at close is waited for.
    host_write_u64(rt, t, jo.id.ptr, 1, Duration::from_millis(20));

    let report = rt.close().unwrap();
    assert!(!report.still_shared);
    let mut leaked: Vec<(String, u64, BlockId)> =
        report.leaked.iter().map(|b| (b.tag.to_string(), b.id.size, b.id)).collect();
    leaked.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        leaked,
        vec![
            ("empty".to_string(), 0, empty.id),
            ("hash_table".to_string(), 1000, ht.id),
            ("join_output".to_string(), 4096, jo.id),
        ]
    );
    assert!(rt.is_closed());
    let u = rt.usage();
    assert_eq!((u.live_bytes, u.pending_bytes, u.live_blocks, u.pending_blocks), (0, 0, 0, 0));
    assert_eq!(st.reserved(), Some(0), "the budget got everything back");
    assert_eq!(st.sim().bytes_in_use(), 0, "the device got everything back");

    let (_, lines) = parse_log(&st.log_text());
    let mut leaks: Vec<(String, u64, String)> = lines
        .iter()
        .filter(|l| l.action == "leak")
        .map(|l| (l.tag.clone(), l.size, l.pointer.clone()))
        .collect();
    leaks.sort();
    assert_eq!(
        leaks,
        vec![
            ("empty".to_string(), 0, "0x0".to_string()),
            ("hash_table".to_string(), 1000, format!("{:#x}", ht.id.ptr)),
            ("join_output".to_string(), 4096, format!("{:#x}", jo.id.ptr)),
        ]
    );
    assert_eq!(lines.iter().filter(|l| l.action == "free").count(), 4, "temp, then the three leaks");
}

#[test]
fn close_on_direct_reports_and_frees_leaks() {
    let st = Stack::open_default(StackKind::Direct);
    let rt = &st.rt;
    let s = st.stream();
    let a = rt.allocate(3000, s, "leaky").unwrap();
    let b = rt.allocate(100, s, "freed").unwrap();
    rt.deallocate(&b.id).unwrap();
    let report = rt.close().unwrap();
    assert_eq!(report.leaked.len(), 1);
    assert_eq!((&*report.leaked[0].tag, report.leaked[0].id), ("leaky", a.id));
    assert_eq!(st.sim().bytes_in_use(), 0);
    assert_eq!(rt.usage().live_bytes, 0);
}

#[test]
fn calls_after_close_fail() {
    for kind in [StackKind::Direct, StackKind::BudgetLoggingAsync] {
        let st = Stack::open_default(kind);
        let rt = &st.rt;
        let s = st.stream();
        let x = rt.allocate(64, s, "x").unwrap();
        rt.close().unwrap();
        let what = |op: &str| format!("[{kind}] {op} after close");
        let closed = ["the runtime has been closed"];
        let uses = [r(Access::Read, &x.id)];
        expect_invalid(rt.allocate(64, s, "y"), &closed, &what("allocate"));
        expect_invalid(rt.deallocate(&x.id), &closed, &what("deallocate"));
        expect_invalid(rt.validate(&x.id), &closed, &what("validate"));
        expect_invalid(rt.prepare(&x.id, s, Access::Read), &closed, &what("prepare"));
        expect_invalid(rt.finish(&x.id, s, Access::Read), &closed, &what("finish"));
        expect_invalid(rt.prepare_all(s, &uses), &closed, &what("prepare_all"));
        expect_invalid(rt.finish_all(s, &uses), &closed, &what("finish_all"));
        expect_invalid(rt.acquire_stream(), &closed, &what("acquire_stream"));
        expect_invalid(rt.release_stream(s), &closed, &what("release_stream"));
        expect_invalid(rt.import_stream(0x1234), &closed, &what("import_stream"));
        expect_invalid(rt.native_stream(s), &closed, &what("native_stream"));
        expect_invalid(rt.synchronize(s), &closed, &what("synchronize"));
        expect_invalid(rt.enqueue_host(s, Box::new(|| {})), &closed, &what("enqueue_host"));
        expect_invalid(rt.reap(), &closed, &what("reap"));
        expect_invalid(rt.drain(), &closed, &what("drain"));
        expect_invalid(rt.stats(), &closed, &what("stats"));
        expect_invalid(rt.close(), &closed, &what("close"));
    }
}

#[test]
fn close_of_a_shared_runtime_drops_one_reference() {
    let st = Stack::open_default(StackKind::Async);
    let rt = &st.rt;
    let second = rt.share().unwrap();
    let s = st.stream();
    let x = rt.allocate(512, s, "kept").unwrap();
    let first = rt.close().unwrap();
    assert!(first.still_shared);
    assert!(first.leaked.is_empty());
    assert!(!rt.is_closed());
    assert_eq!(&*second.validate(&x.id).unwrap().tag.name(), "kept", "still open for the other opener");
    let last = second.close().unwrap();
    assert!(!last.still_shared);
    assert_eq!(last.leaked.len(), 1);
    assert_eq!(last.leaked[0].id, x.id);
    expect_invalid(rt.close(), &["closed"], "a third close");
    expect_invalid(rt.share().map(|_| ()), &["closed"], "share after close");
}

// ----- budget pressure -----

#[test]
fn budget_refusal_message_names_requested_live_pending_limit() {
    // Cache off: the freed block goes pending (with the cache it would be
    // cached and reused; see the cache tests below).
    let st = Stack::open(StackKind::BudgetAsyncNoCache, Opts { budget_bytes: 1_024_000, ..Opts::default() });
    let rt = &st.rt;
    let s = st.stream();
    let mut g = gate(rt, s);
    let _a = rt.allocate(409_600, s, "a").unwrap();
    let b = rt.allocate(102_400, s, "b").unwrap();
    rt.deallocate(&b.id).unwrap();
    let err = rt.allocate(600_000, s, "c").unwrap_err();
    assert_eq!(
        err.to_string(),
        "out of budget: requested 600000 bytes, live 409600, cached 0, pending 102400, limit 1024000, remaining 512000"
    );
    assert_eq!(rt.stats().unwrap().failed_allocations, 1);
    // Exactly at the limit still fits.
    let fits = rt.allocate(512_000, s, "d").unwrap();
    assert_eq!(st.reserved(), Some(1_024_000));
    // One byte takes 256 device bytes, and the budget charges those.
    let err = rt.allocate(1, s, "e").unwrap_err();
    assert_eq!(
        err,
        ResourceError::OutOfBudget { requested: 1, live: 921_600, cached: 0, pending: 102_400, limit: 1_024_000, remaining: 0 }
    );
    g.open();
    rt.deallocate(&fits.id).unwrap();
}

/// Fill the budget, free on a stream that is busy with a sleeping host
/// callback, and ask again before the free has run.
fn pressure_after_free(wait_on_pressure: bool) -> (Stack, Result<u64, ResourceError>, Duration) {
    let st = Stack::open(StackKind::BudgetAsyncNoCache, Opts { wait_on_pressure, ..Opts::default() });
    let (rt, s, t) = (st.rt.clone(), st.stream(), st.stream());
    let x = rt.allocate(768 * KIB, s, "x").unwrap();
    rt.enqueue_host(s, Box::new(|| thread::sleep(Duration::from_millis(200)))).unwrap();
    rt.deallocate(&x.id).unwrap();
    let t0 = Instant::now();
    let result = rt.allocate(512 * KIB, t, "y").map(|b| b.id.size);
    (st, result, t0.elapsed())
}

#[test]
fn without_wait_on_pressure_pending_frees_cause_a_refusal() {
    let (st, result, _) = pressure_after_free(false);
    assert_eq!(
        result,
        Err(ResourceError::OutOfBudget {
            requested: 512 * KIB,
            live: 0,
            cached: 0,
            pending: 768 * KIB,
            limit: MIB,
            remaining: 256 * KIB
        })
    );
    st.check_invariant("refused");
    assert_eq!(st.rt.drain().unwrap(), 768 * KIB);
    let t = st.stream();
    st.rt.allocate(512 * KIB, t, "y").unwrap();
    st.check_invariant("after drain");
}

#[test]
fn wait_on_pressure_waits_for_pending_frees() {
    let (st, result, elapsed) = pressure_after_free(true);
    assert_eq!(result, Ok(512 * KIB));
    assert!(elapsed >= Duration::from_millis(100), "it must have waited for the free: {elapsed:?}");
    let stats = st.rt.stats().unwrap();
    assert_eq!((stats.live_bytes, stats.pending_bytes, stats.failed_allocations), (512 * KIB, 0, 0));
    assert_eq!(st.reserved(), Some(512 * KIB));
    st.check_invariant("after waiting");
}

#[test]
fn wait_on_pressure_does_not_wait_when_pending_frees_cannot_help() {
    let st = Stack::open(StackKind::BudgetAsyncNoCache, Opts { wait_on_pressure: true, ..Opts::default() });
    let rt = &st.rt;
    let s = st.stream();
    let _keep = rt.allocate(768 * KIB, s, "keep").unwrap();
    let g = gate(rt, s);
    let small = rt.allocate(128 * KIB, s, "small").unwrap();
    rt.deallocate(&small.id).unwrap();
    let (open_now, valve) = safety_valve(g, Duration::from_secs(3));
    let t0 = Instant::now();
    let err = rt.allocate(512 * KIB, s, "big").unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2), "refused only after {:?}", t0.elapsed());
    assert_eq!(
        err,
        ResourceError::OutOfBudget {
            requested: 512 * KIB,
            live: 768 * KIB,
            cached: 0,
            pending: 128 * KIB,
            limit: MIB,
            remaining: 128 * KIB
        }
    );
    drop(open_now);
    valve.join().unwrap();
    assert_eq!(rt.drain().unwrap(), 128 * KIB);
    st.check_invariant("end");
}

#[test]
fn pressure_reaps_completed_frees_before_refusing() {
    let st = Stack::open_default(StackKind::BudgetAsyncNoCache); // wait_on_pressure off
    let rt = &st.rt;
    let s = st.stream();
    let x = rt.allocate(768 * KIB, s, "x").unwrap();
    rt.deallocate(&x.id).unwrap();
    rt.reap().unwrap(); // seals the free behind an event
    rt.synchronize(s).unwrap(); // ... which has now completed
    let released = st.reserved().unwrap();
    assert!(released == 0 || released == 768 * KIB, "{released}");
    let y = rt.allocate(512 * KIB, s, "y").unwrap();
    assert_eq!(y.id.size, 512 * KIB);
    let stats = rt.stats().unwrap();
    assert_eq!((stats.pending_bytes, stats.live_bytes, stats.failed_allocations), (0, 512 * KIB, 0));
    st.check_invariant("after reaping under pressure");
}

// ----- logging -----

#[test]
fn logging_csv_has_rmm_header_and_tagged_lines() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let rt = &st.rt;
    let (s, t) = (st.stream(), st.stream());
    let a = rt.allocate(1000, s, "hash_table").unwrap();
    let odd_tag = "a,b \"q\"";
    let b = rt.allocate(256, t, odd_tag).unwrap();
    rt.deallocate(&a.id).unwrap();
    rt.deallocate(&b.id).unwrap();
    // A size no cached block fits, so the driver is asked (and fails).
    st.sim().inject_fault(FaultKind::Alloc, 1);
    assert!(matches!(rt.allocate(5000, s, "boom"), Err(ResourceError::Driver(_))));
    // Refused by the budget: logged by the runtime, once, with the reason.
    assert!(matches!(rt.allocate(2 * MIB, s, "refused"), Err(ResourceError::OutOfBudget { .. })));

    let text = st.log_text();
    assert!(text.contains("\"a,b \"\"q\"\"\""), "a tag with CSV metacharacters is quoted: {text}");
    let (header, lines) = parse_log(&text);
    assert_eq!(header, "Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail");
    // RMM's actions only (xlog's reserve/release/retire rows are filtered
    // out as docs/frameworks.md says).
    let got: Vec<(&str, String, u64, u32, &str)> = lines
        .iter()
        .filter(|l| ["allocate", "free", "allocate failure"].contains(&l.action.as_str()))
        .map(|l| (l.action.as_str(), l.pointer.clone(), l.size, l.stream, l.tag.as_str()))
        .collect();
    assert_eq!(
        got,
        // Sizes are device bytes (size classes); a failure logs the request.
        vec![
            ("allocate", format!("{:#x}", a.id.ptr), 1024, s.0, "hash_table"),
            ("allocate", format!("{:#x}", b.id.ptr), 512, t.0, odd_tag),
            ("free", format!("{:#x}", a.id.ptr), 1024, s.0, "hash_table"),
            ("free", format!("{:#x}", b.id.ptr), 512, t.0, odd_tag),
            ("allocate failure", "0x0".to_string(), 5000, s.0, "boom"),
            ("allocate failure", "0x0".to_string(), 2 * MIB, s.0, "refused"),
        ]
    );
    let refused = lines.iter().find(|l| l.tag == "refused").unwrap();
    assert!(refused.detail.contains("out of budget") && refused.detail.contains("requested 2097152"), "{refused:?}");
    let reserves: Vec<u64> = lines.iter().filter(|l| l.action == "reserve").map(|l| l.size).collect();
    assert_eq!(reserves, vec![1024, 512], "the two blocks came from the driver");
    assert!(lines.iter().all(|l| l.device == 0 && l.process == std::process::id()));
    for l in &lines {
        assert!(l.thread.parse::<u64>().is_ok(), "thread {:?}", l.thread);
        let tb = l.time.as_bytes();
        assert!(
            tb.len() == 15 && tb[2] == b':' && tb[5] == b':' && tb[8] == b'.'
                && l.time.chars().filter(|c| c.is_ascii_digit()).count() == 12,
            "time {:?} is not HH:MM:SS.micros",
            l.time
        );
    }
}

// ----- configuration -----

#[test]
fn open_rejects_bad_config_with_the_values() {
    let sim = |f: fn(&mut Config)| {
        let mut c = Config { backend: Backend::Sim, ..Config::default() };
        f(&mut c);
        c
    };
    expect_invalid(Runtime::open(0, &sim(|c| c.stream_pool_size = 0)).map(|_| ()), &["stream_pool_size"], "pool size 0");
    expect_invalid(Runtime::open(0, &sim(|c| c.sim_capacity_bytes = 0)).map(|_| ()), &["sim_capacity_bytes"], "capacity 0");
    expect_invalid(Runtime::open(-1, &sim(|_| {})).map(|_| ()), &["-1"], "negative ordinal");
    let dir = temp_path("missing-dir", "d");
    let path = dir.join("log.csv");
    let cfg = Config { log_path: Some(path.clone()), ..sim(|c| c.allocator = AllocatorKind::Direct) };
    expect_invalid(Runtime::open(0, &cfg).map(|_| ()), &[&path.display().to_string()], "log in a missing directory");
    // Sim runtimes are independent: one open does not see another's blocks.
    let a = Runtime::open(0, &sim(|_| {})).unwrap();
    let b = Runtime::open(0, &sim(|_| {})).unwrap();
    let s = a.acquire_stream().unwrap();
    let x = a.allocate(64, s, "x").unwrap();
    assert!(matches!(b.validate(&x.id), Err(ResourceError::InvalidArgument(m)) if m.contains("another runtime")));
    assert_eq!(b.usage().live_blocks, 0);
    a.deallocate(&x.id).unwrap();
    assert!(matches!(b.validate(&x.id), Err(ResourceError::UseAfterFree { .. })), "freed: live nowhere");
    assert_ne!(Generation(0), x.id.generation);
    a.close().unwrap();
    b.close().unwrap();
}

#[test]
fn host_callbacks_run_in_stream_order() {
    let st = Stack::open_default(StackKind::Async);
    let rt = &st.rt;
    let s = st.stream();
    let (tx, rx) = mpsc::channel();
    for i in 0..20u32 {
        let tx = tx.clone();
        rt.enqueue_host(s, Box::new(move || {
            if i % 5 == 0 {
                thread::sleep(Duration::from_millis(2));
            }
            tx.send(i).unwrap();
        }))
        .unwrap();
    }
    rt.synchronize(s).unwrap();
    let order: Vec<u32> = rx.try_iter().collect();
    assert_eq!(order, (0..20).collect::<Vec<_>>());
}

/// The first use of a block on a stream other than its allocation stream
/// waits for the allocation stream: on a stream-ordered pool the memory may
/// still be in use by work queued there before the allocation.
#[test]
fn first_foreign_use_waits_for_the_allocation_stream() {
    let st = Stack::open_default(StackKind::Async);
    let rt = &st.rt;
    let (a, b) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let mut g = gate(rt, a);
    let block = rt.allocate(4096, a, "fresh").unwrap().id;
    let waits_before = rt.usage().cross_stream_waits;
    rt.prepare(&block, b, Access::Write).unwrap();
    assert_eq!(rt.usage().cross_stream_waits, waits_before + 1, "one fence on the allocation stream");
    let done = marker(rt, b);
    assert_blocked(&done, "b's first use of a fresh block waits for a");
    g.open();
    recv(&done, "b runs once a has passed the allocation");
    rt.finish(&block, b, Access::Write).unwrap();
    // Same-stream use of a fresh block needs no wait at all.
    let other = rt.allocate(4096, b, "same").unwrap().id;
    let waits = rt.usage().cross_stream_waits;
    rt.prepare(&other, b, Access::Write).unwrap();
    assert_eq!(rt.usage().cross_stream_waits, waits);
}
