//! The launch cache (`src/resources/launch_cache.rs`): a thread repeating
//! its last launch (same blocks, all written, same stream) skips the block
//! table. Each test here is a change the cache must notice, checked where
//! the result can be seen on the sim: a stale handle still refused, a wait
//! still queued (a gated stream keeps the waiter blocked), the repeated
//! finish moving the blocks' last write to the newest launch.
//!
//! Each was checked to fail with the cache's invalidation taken out (the
//! shard version not moved by a free, by a finish, or the cached finish not
//! recording its event again).

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

/// The cached finish records the launch's event again: a reader on another
/// stream waits for the newest launch, not for the one that was cached.
#[test]
fn a_repeated_launch_is_what_later_readers_wait_for() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let blocks = [rt.allocate(LEN, s, "p").unwrap().id, rt.allocate(LEN, s, "q").unwrap().id];
    let uses = writes(&blocks);
    launch_twice(rt, s, &uses);
    let recorded = rt.usage().events_recorded;

    // The repeated launch writes behind a gate.
    let mut held = gate(rt, s);
    rt.prepare_all(s, &uses).unwrap();
    host_write_u64(rt, s, blocks[0].ptr, 42, Duration::ZERO);
    rt.finish_all(s, &uses).unwrap();
    assert_eq!(rt.usage().events_recorded, recorded + 1, "the cached finish records one event");

    rt.prepare(&blocks[0], t, Access::Read).unwrap();
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
