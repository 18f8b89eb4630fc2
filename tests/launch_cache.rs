//! The launch cache (`src/resources/launch_cache.rs`): a thread repeating
//! its last launch (same blocks, all written, same stream) skips the block
//! table. Each test here is a change the cache must notice, checked where
//! the result can be seen on the sim: a stale handle still refused, a wait
//! still queued (a gated stream keeps the waiter blocked), the repeated
//! finish moving the blocks' last write to the newest launch.
//!
//! Each was checked to fail with the cache's invalidation taken out (the
//! shard version not moved by a free, by a finish, or the cached finish not
//! recording its event again). The cached finish now owes that record
//! instead of making it (`src/resources/deferred_record.rs`); the tests at
//! the end check each place that must make it, each shown to fail with
//! that place taken out.

mod common;

use std::time::Duration;

use common::*;
use xlog_cuda::{Access, BlockUse, Runtime, StreamId};

const LEN: u64 = 64;

fn writes(ids: &[xlog_cuda::BlockId]) -> Vec<BlockUse> {
    ids.iter().map(|&block| BlockUse { block, access: Access::Write }).collect()
}

/// Prepare+finish of `uses` on `s`, twice: the second one goes through the
/// cache.
fn launch_twice(rt: &Runtime, s: StreamId, uses: &[BlockUse]) {
    for _ in 0..2 {
        rt.prepare_all(s, uses).unwrap();
        rt.finish_all(s, uses).unwrap();
    }
}

#[test]
fn a_freed_block_is_refused_after_its_launch_was_cached() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s) = (&st.rt, st.stream());
    let b = rt.allocate(LEN, s, "cached").unwrap();
    rt.prepare(&b.id, s, Access::Write).unwrap();
    rt.finish(&b.id, s, Access::Write).unwrap();
    rt.prepare(&b.id, s, Access::Write).unwrap();
    rt.finish(&b.id, s, Access::Write).unwrap();
    rt.deallocate(&b.id).unwrap();
    expect_use_after_free(rt.prepare(&b.id, s, Access::Write), &b.id, "prepare after free");
    expect_use_after_free(rt.finish(&b.id, s, Access::Write), &b.id, "finish after free");
    expect_use_after_free(rt.prepare_all(s, &writes(&[b.id])), &b.id, "prepare_all after free");
}

#[test]
fn a_free_by_another_thread_is_seen_too() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s) = (st.rt.clone(), st.stream());
    let a = rt.allocate(LEN, s, "a").unwrap();
    let b = rt.allocate(LEN, s, "b").unwrap();
    let uses = writes(&[a.id, b.id]);
    launch_twice(&rt, s, &uses);
    let other = rt.clone();
    std::thread::spawn(move || other.deallocate(&b.id).unwrap()).join().unwrap();
    expect_use_after_free(rt.prepare_all(s, &uses), &b.id, "prepare_all of a launch with a freed block");
    expect_use_after_free(rt.finish_all(s, &uses), &b.id, "finish_all of a launch with a freed block");
    rt.deallocate(&a.id).unwrap();
}

/// After the cached launch, another stream reads the block (held behind a
/// gate). Writing it again on the first stream must wait for that read.
#[test]
fn a_read_on_another_stream_makes_the_next_write_wait_for_it() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let b = rt.allocate(LEN, s, "shared").unwrap();
    rt.prepare(&b.id, s, Access::Write).unwrap();
    host_write_u64(rt, s, b.id.ptr, 1, Duration::ZERO);
    rt.finish(&b.id, s, Access::Write).unwrap();
    rt.prepare(&b.id, s, Access::Write).unwrap();
    host_write_u64(rt, s, b.id.ptr, 2, Duration::ZERO);
    rt.finish(&b.id, s, Access::Write).unwrap();

    let mut held = gate(rt, t);
    rt.prepare(&b.id, t, Access::Read).unwrap();
    let read = host_read_u64(rt, t, b.id.ptr, Duration::ZERO);
    rt.finish(&b.id, t, Access::Read).unwrap();

    rt.prepare(&b.id, s, Access::Write).unwrap();
    host_write_u64(rt, s, b.id.ptr, 3, Duration::ZERO);
    let written = marker(rt, s);
    rt.finish(&b.id, s, Access::Write).unwrap();
    assert_blocked(&written, "the write on s while t's read of the block is held");
    held.open();
    assert_eq!(recv(&read, "t's read"), 2, "the read sees the cached launch's write, not the later one");
    recv(&written, "the write after the read");
    rt.synchronize(s).unwrap();
    rt.deallocate(&b.id).unwrap();
}

/// A write on another stream after the cached launch: the next launch on
/// the first stream must wait for it.
#[test]
fn a_write_on_another_stream_makes_the_next_launch_wait_for_it() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let blocks = [rt.allocate(LEN, s, "x").unwrap().id, rt.allocate(LEN, s, "y").unwrap().id];
    let uses = writes(&blocks);
    launch_twice(rt, s, &uses);

    // From another thread: this thread's cached launch stays its last one.
    let mut held = gate(rt, t);
    let (other, y) = (rt.clone(), blocks[1]);
    std::thread::spawn(move || {
        other.prepare(&y, t, Access::Write).unwrap();
        host_write_u64(&other, t, y.ptr, 7, Duration::ZERO);
        other.finish(&y, t, Access::Write).unwrap();
    })
    .join()
    .unwrap();

    rt.prepare_all(s, &uses).unwrap();
    let read = host_read_u64(rt, s, blocks[1].ptr, Duration::ZERO);
    rt.finish_all(s, &uses).unwrap();
    assert_blocked(&read, "the launch on s while t's write of one of its blocks is held");
    held.open();
    assert_eq!(recv(&read, "s's read"), 7, "s ran after t's write");
    rt.synchronize(s).unwrap();
    for b in blocks {
        rt.deallocate(&b).unwrap();
    }
}

/// The cached finish owes the launch's event record again (no record now,
/// however often the launch repeats): the first use on another stream
/// makes the one owed record, and waits for the newest launch, not for the
/// one that was cached.
#[test]
fn a_repeated_launch_is_what_later_readers_wait_for() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let blocks = [rt.allocate(LEN, s, "p").unwrap().id, rt.allocate(LEN, s, "q").unwrap().id];
    let uses = writes(&blocks);
    launch_twice(rt, s, &uses);
    let recorded = rt.usage().events_recorded;
    for i in 0..50u64 {
        rt.prepare_all(s, &uses).unwrap();
        host_write_u64(rt, s, blocks[0].ptr, i, Duration::ZERO);
        rt.finish_all(s, &uses).unwrap();
    }

    // The repeated launch writes behind a gate.
    let mut held = gate(rt, s);
    rt.prepare_all(s, &uses).unwrap();
    host_write_u64(rt, s, blocks[0].ptr, 42, Duration::ZERO);
    rt.finish_all(s, &uses).unwrap();
    assert_eq!(rt.usage().events_recorded, recorded, "51 cached finishes owe one record and make none");

    rt.prepare(&blocks[0], t, Access::Read).unwrap();
    assert_eq!(rt.usage().events_recorded, recorded + 1, "t's prepare made the owed record");
    let read = host_read_u64(rt, t, blocks[0].ptr, Duration::ZERO);
    rt.finish(&blocks[0], t, Access::Read).unwrap();
    assert_blocked(&read, "t's read while the repeated launch on s is held");
    held.open();
    assert_eq!(recv(&read, "t's read"), 42, "t read after the repeated launch's write");
    rt.synchronize(t).unwrap();
    for b in blocks {
        rt.deallocate(&b).unwrap();
    }
}

/// Reads are never cached: two streams reading a block one stream wrote
/// still do not wait for each other.
#[test]
fn readers_on_two_streams_stay_concurrent() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t, u) = (&st.rt, st.stream(), st.stream(), st.stream());
    let b = rt.allocate(LEN, s, "read twice").unwrap();
    launch_twice(rt, s, &writes(&[b.id]));
    rt.synchronize(s).unwrap();
    let _held = gate(rt, t);
    for _ in 0..2 {
        rt.prepare(&b.id, t, Access::Read).unwrap();
        rt.finish(&b.id, t, Access::Read).unwrap();
    }
    rt.prepare(&b.id, u, Access::Read).unwrap();
    let read = marker(rt, u);
    rt.finish(&b.id, u, Access::Read).unwrap();
    recv(&read, "u's read does not wait for t's held read");
}

/// The cached launch's blocks used on another stream (the alternating
/// pattern: one stream writes, the other then reads or writes the same
/// blocks): that stream must wait for the launch, which is held behind a
/// gate here. Both for a read and for a write.
#[test]
fn the_same_blocks_on_another_stream_wait_for_the_cached_launch() {
    for access in [Access::Read, Access::Write] {
        let st = Stack::open_default(StackKind::BudgetLoggingAsync);
        let (rt, s, t) = (&st.rt, st.stream(), st.stream());
        let blocks = [rt.allocate(LEN, s, "m").unwrap().id, rt.allocate(LEN, s, "n").unwrap().id];
        let uses = writes(&blocks);
        rt.prepare_all(s, &uses).unwrap();
        rt.finish_all(s, &uses).unwrap();
        let mut held = gate(rt, s);
        rt.prepare_all(s, &uses).unwrap();
        host_write_u64(rt, s, blocks[1].ptr, 9, Duration::ZERO);
        rt.finish_all(s, &uses).unwrap();

        let other: Vec<BlockUse> = blocks.iter().map(|&block| BlockUse { block, access }).collect();
        let waits = rt.usage().cross_stream_waits;
        rt.prepare_all(t, &other).unwrap();
        assert_eq!(rt.usage().cross_stream_waits, waits + 1, "{access:?}: one wait, for the launch's one event");
        let read = host_read_u64(rt, t, blocks[1].ptr, Duration::ZERO);
        rt.finish_all(t, &other).unwrap();
        assert_blocked(&read, &format!("{access:?} on t while the launch on s is held"));
        held.open();
        assert_eq!(recv(&read, "t's read"), 9, "{access:?}: t ran after s's launch");
        rt.synchronize(t).unwrap();
        for b in blocks {
            rt.deallocate(&b).unwrap();
        }
    }
}

// ---------------------------------------------------------------------------
// Owed records (`deferred_record.rs`)
// ---------------------------------------------------------------------------

/// The thread moves on to another launch on the same stream: the record it
/// owes is made before that launch's work is queued, so a later reader of
/// the first launch's block does not wait for the second launch.
#[test]
fn the_owed_record_stands_where_the_repeated_launch_ended() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let x = rt.allocate(LEN, s, "x").unwrap().id;
    let y = rt.allocate(LEN, s, "y").unwrap().id;
    launch_twice(rt, s, &writes(&[x]));
    // Another launch on s, whose work is held behind a gate.
    rt.prepare_all(s, &writes(&[y])).unwrap();
    let mut held = gate(rt, s);
    rt.finish_all(s, &writes(&[y])).unwrap();
    // A reader of x on t waits for x's launch only.
    rt.prepare(&x, t, Access::Read).unwrap();
    let read = marker(rt, t);
    rt.finish(&x, t, Access::Read).unwrap();
    recv(&read, "t's read of x does not wait for the held launch of y");
    held.open();
    rt.synchronize(s).unwrap();
    rt.synchronize(t).unwrap();
    rt.deallocate(&x).unwrap();
    rt.deallocate(&y).unwrap();
}

/// The same blocks, launched on two streams in turn (each prepare waits for
/// the other stream's launch): no event is taken for a finish, each
/// prepare makes the other stream's owed record and waits for it, and a
/// third stream's reader waits for the last launch.
#[test]
fn launches_alternating_between_streams_stay_ordered() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t, u) = (&st.rt, st.stream(), st.stream(), st.stream());
    let blocks = [rt.allocate(LEN, s, "p").unwrap().id, rt.allocate(LEN, s, "q").unwrap().id];
    let uses = writes(&blocks);
    launch_twice(rt, s, &uses);
    let before = rt.usage();
    // Each launch reads what the previous one (on the other stream) wrote,
    // after a delay, and writes it plus one: a missing wait shows as a
    // wrong count.
    rt.synchronize(s).unwrap();
    let data = DataPlane::for_runtime(rt);
    data.write_u64(blocks[0].ptr, 0).unwrap();
    for round in 0..20u64 {
        let on = if round % 2 == 0 { t } else { s };
        rt.prepare_all(on, &uses).unwrap();
        let seen = host_read_u64(rt, on, blocks[0].ptr, Duration::from_millis(1));
        host_write_u64(rt, on, blocks[0].ptr, round + 1, Duration::ZERO);
        rt.finish_all(on, &uses).unwrap();
        assert_eq!(recv(&seen, "the launch's read"), round, "round {round} saw the previous round's write");
    }
    let after = rt.usage();
    assert_eq!(after.events_recorded - before.events_recorded, 20, "one record per switch, made by the next prepare");
    rt.prepare_all(t, &uses).unwrap();
    host_write_u64(rt, t, blocks[0].ptr, 1000, Duration::from_millis(20));
    rt.finish_all(t, &uses).unwrap();
    rt.prepare(&blocks[0], u, Access::Read).unwrap();
    let read = host_read_u64(rt, u, blocks[0].ptr, Duration::ZERO);
    rt.finish(&blocks[0], u, Access::Read).unwrap();
    assert_eq!(recv(&read, "u's read"), 1000, "u waited for the last launch, on t");
    rt.synchronize(u).unwrap();
    for b in blocks {
        rt.deallocate(&b).unwrap();
    }
}

/// A block written by a repeated launch on another stream than its own is
/// freed: its allocation stream waits for the newest launch (the free
/// makes the owed record first).
#[test]
fn a_free_waits_for_the_owed_record() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let b = rt.allocate(LEN, t, "freed").unwrap().id;
    launch_twice(rt, s, &writes(&[b]));
    let mut held = gate(rt, s);
    rt.prepare(&b, s, Access::Write).unwrap();
    rt.finish(&b, s, Access::Write).unwrap();
    rt.deallocate(&b).unwrap();
    let after_free = marker(rt, t);
    assert_blocked(&after_free, "t's work after the free while the newest launch on s is held");
    held.open();
    recv(&after_free, "t's work after the free");
    rt.synchronize(t).unwrap();
}

/// An imported stream released while it owes a record makes it first (its
/// owner may destroy it right after): another stream's later use still
/// works and waits for that stream's launch.
#[test]
fn a_released_imported_stream_makes_its_owed_record_first() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let device = dev(rt);
    let native = device.create_stream().unwrap();
    let gone = rt.import_stream(device.native_stream(native)).unwrap();
    let b = rt.allocate(LEN, s, "outlives its writer").unwrap().id;
    launch_twice(rt, gone, &writes(&[b]));
    rt.prepare(&b, gone, Access::Write).unwrap();
    host_write_u64(rt, gone, b.ptr, 5, Duration::from_millis(10));
    rt.finish(&b, gone, Access::Write).unwrap();
    let recorded = rt.usage().events_recorded;
    rt.release_stream(gone).unwrap();
    assert_eq!(rt.usage().events_recorded, recorded + 1, "the release made the owed record");
    device.destroy_stream(native).unwrap();
    rt.prepare(&b, t, Access::Read).unwrap();
    let read = host_read_u64(rt, t, b.ptr, Duration::ZERO);
    rt.finish(&b, t, Access::Read).unwrap();
    assert_eq!(recv(&read, "t's read"), 5);
    rt.synchronize(t).unwrap();
    rt.deallocate(&b).unwrap();
}

/// A capture begun through the runtime never sees an owed record: it is
/// made before the capture begins, and none is owed while it runs.
#[test]
fn a_capture_begins_after_the_owed_records_are_made() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let b = rt.allocate(LEN, s, "before capture").unwrap().id;
    launch_twice(rt, s, &writes(&[b]));
    rt.prepare(&b, s, Access::Write).unwrap();
    rt.finish(&b, s, Access::Write).unwrap();
    let recorded = rt.usage().events_recorded;
    let capture = rt.begin_capture(t, xlog_cuda::device::CaptureMode::Global).unwrap();
    assert_eq!(rt.usage().events_recorded, recorded + 1, "begin_capture made the owed record first");
    // While the capture runs, the repeated launch records its event again.
    rt.prepare(&b, s, Access::Write).unwrap();
    rt.finish(&b, s, Access::Write).unwrap();
    assert_eq!(rt.usage().events_recorded, recorded + 2, "no record is owed while a capture is active");
    let (graph, id) = rt.end_capture(t).unwrap();
    assert_eq!(id, capture);
    let _ = graph;
    rt.synchronize(s).unwrap();
    rt.deallocate(&b).unwrap();
}

/// The event of an owed record is let go by every block (a later launch on
/// another stream wrote them all) and taken by an unrelated use: the debt
/// is gone with it, and that use's readers still wait for that use.
#[test]
fn an_owed_record_dies_with_its_event() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t, u, v) = (&st.rt, st.stream(), st.stream(), st.stream(), st.stream());
    let x = rt.allocate(LEN, s, "x").unwrap().id;
    let y = rt.allocate(LEN, s, "y").unwrap().id;
    launch_twice(rt, s, &writes(&[x]));
    // Another thread (whose launch cache knows nothing, and which owes
    // nothing), with no prepare that would wait for x and so make the
    // record: x written again on s by a launch with y read, so x's last
    // write moves to a new event and the owed one is let go; then y's
    // finish of a write on u behind a gate takes an event, likely the one
    // let go.
    let mut held = gate(rt, u);
    let other = st.rt.clone();
    std::thread::spawn(move || {
        let mixed = [BlockUse { block: x, access: Access::Write }, BlockUse { block: y, access: Access::Read }];
        other.prepare_all(s, &mixed).unwrap();
        other.finish_all(s, &mixed).unwrap();
        other.synchronize(s).unwrap();
        host_write_u64(&other, u, y.ptr, 3, Duration::ZERO);
        other.finish(&y, u, Access::Write).unwrap();
    })
    .join()
    .unwrap();
    rt.prepare(&y, v, Access::Read).unwrap();
    let read = host_read_u64(rt, v, y.ptr, Duration::ZERO);
    rt.finish(&y, v, Access::Read).unwrap();
    assert_blocked(&read, "v's read of y while u's write is held");
    held.open();
    assert_eq!(recv(&read, "v's read"), 3);
    for s in [s, t, u, v] {
        rt.synchronize(s).unwrap();
    }
    rt.deallocate(&x).unwrap();
    rt.deallocate(&y).unwrap();
}

/// Another thread's launch of several blocks, one of them written by this
/// thread's repeated launch (record owed): its prepare makes the record,
/// and waits for the newest launch.
#[test]
fn another_threads_launch_waits_for_the_newest_repeat() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let x = rt.allocate(LEN, s, "x").unwrap().id;
    let y = rt.allocate(LEN, t, "y").unwrap().id;
    launch_twice(rt, s, &writes(&[x]));
    let mut held = gate(rt, s);
    rt.prepare(&x, s, Access::Write).unwrap();
    host_write_u64(rt, s, x.ptr, 7, Duration::ZERO);
    rt.finish(&x, s, Access::Write).unwrap();
    let other = st.rt.clone();
    let read = std::thread::spawn(move || {
        let reads = [BlockUse { block: x, access: Access::Read }, BlockUse { block: y, access: Access::Read }];
        other.prepare_all(t, &reads).unwrap();
        let read = host_read_u64(&other, t, x.ptr, Duration::ZERO);
        other.finish_all(t, &reads).unwrap();
        read
    })
    .join()
    .unwrap();
    assert_blocked(&read, "t's launch while the newest repeat on s is held");
    held.open();
    assert_eq!(recv(&read, "t's read"), 7);
    rt.synchronize(t).unwrap();
    rt.deallocate(&x).unwrap();
    rt.deallocate(&y).unwrap();
}
