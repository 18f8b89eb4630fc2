//! The runtime-level resource suite: the same tests run against every
//! stack (Direct, Async, Budget(Async), Budget(Logging(Async)) and the
//! cache-off pools) on a fresh sim runtime. How the stacks differ is
//! declared once, in `StackProps` (tests/common/mod.rs, next to
//! `StackKind`): the tests read those properties, never the stack's
//! identity, and a test that only makes sense for some stacks is
//! instantiated only for them, in an explicit list below (RMM's `mr_ref`
//! habit, as in tests/resource_mr.rs). `lists_match_the_declared_properties`
//! checks every list against the property it stands for.
//!
//! Test names are `<list>::<stack>::<test>`, and every assertion message
//! starts with the stack's name.
//!
//! Ordering tests observe real data: host callbacks read and write the sim
//! device's memory in stream order. Each one that checks a wait has a
//! negative twin showing that, without the wait, the same scenario sees the
//! wrong data, so the positive tests can fail.

mod common;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;
use xlog_cuda::device::sim::FaultKind;
use xlog_cuda::{
    Access, BlockId, BlockState, BlockUse, Generation, ResourceError, ResourceResult, Runtime, StreamId,
};

/// One `#[test]` per (stack, test) of a list, as `<list>::<stack>::<test>`;
/// `<list>::STACKS` names the list's stacks.
macro_rules! instantiate {
    ($list:ident [$($stack:ident = $kind:ident),+ $(,)?] $tests:tt) => {
        mod $list {
            pub const STACKS: &[super::StackKind] = &[$(super::StackKind::$kind),+];
            $( instantiate!(@stack $stack $kind $tests); )+
        }
    };
    (@stack $stack:ident $kind:ident ($($test:ident),* $(,)?)) => {
        mod $stack {
            $( #[test] fn $test() { super::super::$test(super::super::StackKind::$kind) } )*
        }
    };
}

instantiate!(every [
    direct = Direct,
    async_pool = Async,
    budget_async = BudgetAsync,
    budget_logging_async = BudgetLoggingAsync,
    async_no_cache = AsyncNoCache,
    budget_async_no_cache = BudgetAsyncNoCache,
] (
    zero_size_allocation,
    alignment_is_at_least_256,
    capacity_exhaustion,
    double_free_is_an_error_that_changes_nothing,
    stale_generation_after_address_reuse,
    without_prepare_the_reader_sees_stale_data,
    without_prepare_fan_out_is_misordered,
    without_recorded_reads_a_free_lets_reuse_clobber_readers,
    budget_invariant_after_every_op,
    alloc_fault_rolls_back,
    eight_threads_never_exceed_the_budget,
    bad_input_is_a_typed_error_that_changes_nothing,
));

// `tracks_uses`: prepare/finish order the streams.
instantiate!(tracking [
    async_pool = Async,
    budget_async = BudgetAsync,
    budget_logging_async = BudgetLoggingAsync,
    async_no_cache = AsyncNoCache,
    budget_async_no_cache = BudgetAsyncNoCache,
] (
    write_read_write_ordering_across_streams,
    fan_out_reads_then_write_are_ordered,
    free_waits_for_every_reader,
));

// Not `tracks_uses`: every tracking call is refused.
instantiate!(not_tracking [direct = Direct] (
    tracking_calls_are_refused_and_change_nothing,
    event_record_fault_changes_nothing_without_tracking,
));

// Not `stream_ordered`: a free retires at once.
instantiate!(synchronous [direct = Direct] (
    a_free_retires_at_once,
));

// `frees_to_cache`: a free goes to the per-stream cache.
instantiate!(caching [
    async_pool = Async,
    budget_async = BudgetAsync,
    budget_logging_async = BudgetLoggingAsync,
] (
    cached_bytes_stay_charged_until_trim,
    free_fault_in_trim_keeps_the_block_cached,
    event_record_fault_in_a_cross_stream_hand_out_changes_nothing,
));

// `stream_ordered`, not `frees_to_cache`: a free goes pending until reap.
instantiate!(pending [
    async_no_cache = AsyncNoCache,
    budget_async_no_cache = BudgetAsyncNoCache,
] (
    pending_bytes_stay_charged_until_reap,
    event_record_fault_in_reap_changes_nothing,
));

// Not `frees_to_cache`: a free calls the driver.
instantiate!(freeing_to_driver [
    direct = Direct,
    async_no_cache = AsyncNoCache,
    budget_async_no_cache = BudgetAsyncNoCache,
] (
    free_fault_keeps_the_block_live,
    budget_invariant_after_every_op_and_a_failed_free,
));

// `budget` and `frees_to_cache`: a refusal gives the cache back first.
instantiate!(budget_caching [
    budget_async = BudgetAsync,
    budget_logging_async = BudgetLoggingAsync,
] (
    budget_refusal_releases_the_cache_then_carries_the_numbers,
));

// `budget`, not `frees_to_cache`.
instantiate!(budget_pending [budget_async_no_cache = BudgetAsyncNoCache] (
    budget_refusal_carries_the_numbers,
));

// Not `budget`.
instantiate!(unbudgeted [
    direct = Direct,
    async_pool = Async,
    async_no_cache = AsyncNoCache,
] (
    without_a_budget_the_same_request_fits,
));

// `logs`.
instantiate!(logging [budget_logging_async = BudgetLoggingAsync] (
    alloc_faults_are_logged,
    a_failed_trim_logs_no_free,
));

/// Each list holds exactly the stacks with the property it stands for.
#[test]
fn lists_match_the_declared_properties() {
    let with = |f: fn(&StackProps) -> bool| -> Vec<StackKind> {
        ALL_STACKS.iter().copied().filter(|k| f(&k.props())).collect()
    };
    assert_eq!(every::STACKS, ALL_STACKS);
    assert_eq!(tracking::STACKS, with(|p| p.tracks_uses));
    assert_eq!(not_tracking::STACKS, with(|p| !p.tracks_uses));
    assert_eq!(synchronous::STACKS, with(|p| !p.stream_ordered));
    assert_eq!(caching::STACKS, with(|p| p.frees_to_cache));
    assert_eq!(pending::STACKS, with(|p| p.stream_ordered && !p.frees_to_cache));
    assert_eq!(freeing_to_driver::STACKS, with(|p| !p.frees_to_cache));
    assert_eq!(budget_caching::STACKS, with(|p| p.budget && p.frees_to_cache));
    assert_eq!(budget_pending::STACKS, with(|p| p.budget && !p.frees_to_cache));
    assert_eq!(unbudgeted::STACKS, with(|p| !p.budget));
    assert_eq!(logging::STACKS, with(|p| p.logs));
    // The lists' premises, as the tests rely on them.
    for k in ALL_STACKS {
        let p = k.props();
        assert_eq!(p.freed_state == BlockState::Pending, p.stream_ordered && !p.frees_to_cache, "{p:?}");
        assert_eq!(p.freed_state == BlockState::Cached, p.frees_to_cache, "{p:?}");
    }
}

fn r(access: Access, block: &BlockId) -> BlockUse {
    BlockUse { block: *block, access }
}

/// On a stack without tracking, every prepare/finish form is refused with
/// StreamMisuse and changes nothing.
fn assert_tracking_refused(st: &Stack, block: &BlockId, stream: StreamId) {
    let (rt, n) = (&st.rt, st.name());
    let before = st.snapshot();
    for access in [Access::Read, Access::Write, Access::ReadWrite] {
        expect_stream_misuse(rt.prepare(block, stream, access), &format!("[{n}] prepare {access:?}"));
        expect_stream_misuse(rt.finish(block, stream, access), &format!("[{n}] finish {access:?}"));
    }
    let uses = [r(Access::Read, block)];
    expect_stream_misuse(rt.prepare_all(stream, &uses), &format!("[{n}] prepare_all"));
    expect_stream_misuse(rt.finish_all(stream, &uses), &format!("[{n}] finish_all"));
    st.assert_unchanged(&before, 0, "refused tracking calls");
}

/// A tracking call's declared outcome: where the stack `tracks_uses`,
/// `tracked` judges it; where it does not, it is refused with StreamMisuse
/// (before the handle is looked at).
fn expect_tracking<T: fmt::Debug>(props: &StackProps, r: ResourceResult<T>, what: &str, tracked: impl FnOnce(ResourceResult<T>)) {
    match props.tracks_uses {
        true => tracked(r),
        false => expect_stream_misuse(r, what),
    }
}

/// A tracking call that goes through where the stack tracks uses.
fn expect_tracked<T: fmt::Debug>(props: &StackProps, r: ResourceResult<T>, what: &str) {
    expect_tracking(props, r, what, |r| {
        r.unwrap_or_else(|e| panic!("{what}: {e}"));
    });
}

/// The declared refusal of a request the stack cannot hold: OutOfBudget
/// naming the budget's limit (`limit`), or OutOfMemory from the device.
fn expect_refusal<T: fmt::Debug>(
    props: &StackProps,
    limit: Option<u64>,
    r: ResourceResult<T>,
    requested: u64,
    what: &str,
) -> ResourceError {
    let e = match r {
        Err(e) => e,
        Ok(v) => panic!("{what}: expected a refusal, got {v:?}"),
    };
    let seen = match &e {
        ResourceError::OutOfBudget { requested, limit, .. } => (Refusal::Budget, *requested, Some(*limit)),
        ResourceError::OutOfMemory { requested, .. } => (Refusal::Device, *requested, None),
        other => panic!("{what}: expected a refusal, got {other}"),
    };
    assert_eq!(seen, (props.refusal, requested, limit), "{what}: {e}");
    e
}

// ---------------------------------------------------------------------------

fn zero_size_allocation(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (s, other) = (st.stream(), st.stream());
    let probe = rt.allocate(0, s, "probe").unwrap();
    let a = rt.allocate(0, s, "empty").unwrap();
    let b = rt.allocate(0, other, "empty").unwrap();
    for blk in [&probe, &a, &b] {
        assert_eq!(blk.id.ptr, 0, "[{n}] zero bytes gives a null pointer");
        assert_eq!(blk.id.size, 0, "[{n}]");
        assert_eq!(blk.state, BlockState::Live, "[{n}]");
        assert_ne!(blk.id.generation, Generation(0), "[{n}] generation 0 is never issued");
    }
    assert!(a.id.generation > probe.id.generation, "[{n}] fresh generation");
    assert!(b.id.generation > a.id.generation, "[{n}] fresh generation");
    assert_eq!(&*a.tag.name(), "empty", "[{n}]");
    assert_eq!(b.id.alloc_stream, other, "[{n}]");

    let stats = rt.stats().unwrap();
    assert_eq!(stats.live_bytes, 0, "[{n}] zero-size blocks charge nothing");
    assert_eq!(stats.outstanding_bytes, 0, "[{n}]");
    assert_eq!(stats.live_blocks, 3, "[{n}]");
    assert_eq!(stats.allocations, 3, "[{n}]");
    assert_eq!(st.reserved().unwrap_or(0), 0, "[{n}] nothing reserved");
    assert_eq!(st.sim().bytes_in_use(), 0, "[{n}] no device memory used");
    st.check_invariant("after zero-size allocations");
    assert_eq!(&*rt.validate(&a.id).unwrap().tag.name(), "empty", "[{n}]");

    // Uses on another stream (refused where uses are not tracked: see
    // tracking_calls_are_refused_and_change_nothing) leave a zero-size
    // free nothing to wait for.
    let p = &st.props;
    expect_tracked(p, rt.prepare(&a.id, other, Access::Write), &format!("[{n}] prepare"));
    expect_tracked(p, rt.finish(&a.id, other, Access::Write), &format!("[{n}] finish"));
    expect_tracked(p, rt.prepare(&a.id, s, Access::Read), &format!("[{n}] prepare"));
    expect_tracked(p, rt.finish(&a.id, s, Access::Read), &format!("[{n}] finish"));

    let freed = rt.deallocate(&a.id).unwrap();
    assert_eq!(freed.state, BlockState::Retired, "[{n}] nothing to wait for on a zero-size free");
    assert_eq!(freed.id, a.id, "[{n}]");
    let stats = rt.stats().unwrap();
    assert_eq!((stats.pending_bytes, stats.pending_blocks, stats.live_blocks), (0, 0, 2), "[{n}]");
    let before = st.snapshot();
    expect_use_after_free(rt.deallocate(&a.id), &a.id, &format!("[{n}] double free of a zero-size block"));
    st.assert_unchanged(&before, 0, "double free of a zero-size block");
    rt.deallocate(&b.id).unwrap();
    rt.deallocate(&probe.id).unwrap();
    let stats = rt.stats().unwrap();
    assert_eq!((stats.live_blocks, stats.deallocations, stats.outstanding_bytes), (0, 3, 0), "[{n}]");
    st.check_invariant("end");
}

fn alignment_is_at_least_256(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let s = st.stream();
    let sizes = [1u64, 7, 255, 256, 257, 1000, 4097, 65536, 3];
    let blocks: Vec<_> = sizes.iter().map(|&sz| rt.allocate(sz, s, "aligned").unwrap()).collect();
    for (b, &sz) in blocks.iter().zip(&sizes) {
        assert_ne!(b.id.ptr, 0, "[{n}] {sz} bytes");
        assert_eq!(b.id.ptr % 256, 0, "[{n}] {sz}-byte block at {:#x} is not 256-aligned", b.id.ptr);
        assert_eq!(b.id.size, sz, "[{n}] the handle keeps the requested size");
    }
    let mut spans: Vec<(u64, u64)> = blocks.iter().map(|b| (b.id.ptr, b.id.size)).collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "[{n}] blocks overlap: {w:?}");
    }
    // Each block is real memory of its own: distinct patterns survive.
    let sim = st.sim();
    for (i, b) in blocks.iter().enumerate() {
        sim.fill(b.id.ptr, b.id.size, i as u8 + 1).unwrap();
    }
    for (i, b) in blocks.iter().enumerate() {
        assert!(sim.read(b.id.ptr, b.id.size).unwrap().iter().all(|&x| x == i as u8 + 1), "[{n}] block {i}");
    }
    // Budget and stats count what the device gives: each size rounded up.
    let total: u64 = sizes.iter().map(|&sz| st.props.held_bytes(sz)).sum();
    assert!(total >= sizes.iter().map(|&sz| sz.div_ceil(256) * 256).sum::<u64>(), "[{n}]");
    let stats = rt.stats().unwrap();
    assert_eq!(stats.live_bytes, total, "[{n}] charged the device bytes, not the requested ones");
    assert_eq!(blocks.iter().map(|b| rt.validate(&b.id).unwrap().held).sum::<u64>(), total, "[{n}]");
    assert_eq!(stats.live_blocks, sizes.len() as u64, "[{n}]");
    st.check_invariant("after aligned allocations");
    for b in &blocks {
        rt.deallocate(&b.id).unwrap();
    }
    st.release_all();
    assert_eq!(rt.stats().unwrap().outstanding_bytes, 0, "[{n}]");
    assert_eq!(st.sim().bytes_in_use(), 0, "[{n}]");
}

fn capacity_exhaustion(kind: StackKind) {
    // A budget larger than the device, so the device runs out first.
    let st = Stack::open(kind, Opts { capacity_bytes: MIB, budget_bytes: 4 * MIB, ..Opts::default() });
    let (rt, n) = (&st.rt, st.name());
    let s = st.stream();

    let before = st.snapshot();
    match rt.allocate(MIB + 1, s, "too_big") {
        Err(e @ ResourceError::OutOfMemory { .. }) => {
            let ResourceError::OutOfMemory { requested, detail } = &e else { unreachable!() };
            assert_eq!(*requested, MIB + 1, "[{n}]");
            assert!(detail.contains("1048576"), "[{n}] detail names the capacity: {detail}");
            assert!(e.to_string().contains("1048577"), "[{n}] message names the request: {e}");
        }
        other => panic!("[{n}] expected OutOfMemory, got {other:?}"),
    }
    st.assert_unchanged(&before, 1, "oversize allocation");

    let quarter = 256 * KIB;
    let blocks: Vec<_> = (0..4).map(|i| {
        rt.allocate(quarter, s, "quarter").unwrap_or_else(|e| panic!("[{n}] quarter {i}: {e}"))
    }).collect();
    assert_eq!(st.sim().bytes_in_use(), MIB, "[{n}] device full");
    let before = st.snapshot();
    match rt.allocate(256, s, "one_more") {
        Err(ResourceError::OutOfMemory { requested, .. }) => assert_eq!(requested, 256, "[{n}]"),
        other => panic!("[{n}] expected OutOfMemory on a full device, got {other:?}"),
    }
    st.assert_unchanged(&before, 1, "allocation on a full device");

    rt.deallocate(&blocks[1].id).unwrap();
    let drained = rt.drain().unwrap();
    assert_eq!(drained, st.props.pending_after_free(quarter), "[{n}] bytes retired by drain (a cached block stays held)");
    let again = rt.allocate(quarter, s, "refill").unwrap();
    assert_eq!(again.id.ptr, blocks[1].id.ptr, "[{n}] the freed range is reused");
    assert_eq!(rt.stats().unwrap().live_bytes, MIB, "[{n}]");
    st.check_invariant("after refill");
}

fn double_free_is_an_error_that_changes_nothing(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let s = st.stream();
    let x = rt.allocate(4096, s, "x").unwrap();
    let y = rt.allocate(8192, s, "y").unwrap();
    let freed = rt.deallocate(&x.id).unwrap();
    assert_eq!(freed.state, st.props.freed_state(4096), "[{n}]");
    assert_eq!(&*freed.tag.name(), "x", "[{n}]");
    rt.synchronize(s).unwrap(); // the device-side free has run; the bytes stay pending until reap

    let before = st.snapshot();
    expect_use_after_free(rt.deallocate(&x.id), &x.id, &format!("[{n}] second free"));
    st.assert_unchanged(&before, 0, "second free while pending");
    rt.drain().unwrap();
    let before = st.snapshot();
    expect_use_after_free(rt.deallocate(&x.id), &x.id, &format!("[{n}] free after retire"));
    st.assert_unchanged(&before, 0, "free after retire");
    assert_eq!(&*rt.validate(&y.id).unwrap().tag.name(), "y", "[{n}] other block untouched");
    assert_eq!(rt.stats().unwrap().live_bytes, 8192, "[{n}]");
    rt.deallocate(&y.id).unwrap();
    expect_use_after_free(rt.deallocate(&y.id), &y.id, &format!("[{n}] second free of y"));
    assert_eq!(rt.stats().unwrap().deallocations, 2, "[{n}] failed frees are not counted");
}

fn stale_generation_after_address_reuse(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (s, other) = (st.stream(), st.stream());
    let old = rt.allocate(8192, s, "old").unwrap();
    rt.deallocate(&old.id).unwrap();
    rt.drain().unwrap();
    let new = rt.allocate(8192, s, "new").unwrap();
    assert_eq!(new.id.ptr, old.id.ptr, "[{n}] the sim must hand the address out again");
    assert!(new.id.generation > old.id.generation, "[{n}]");
    assert_eq!(BlockId { generation: new.id.generation, ..old.id }, new.id, "[{n}] only the generation differs");
    st.sim().fill(new.id.ptr, 8192, 0x3C).unwrap();

    let before = st.snapshot();
    let what = |op: &str| format!("[{n}] stale {op}");
    expect_use_after_free(rt.deallocate(&old.id), &old.id, &what("deallocate"));
    expect_use_after_free(rt.validate(&old.id), &old.id, &what("validate"));
    // Where uses are tracked the stale handle is the error; where they are
    // not, the call is refused first.
    let p = &st.props;
    let stale = |r: ResourceResult<()>, op: &str| {
        expect_tracking(p, r, &what(op), |r| expect_use_after_free(r, &old.id, &what(op)));
    };
    for access in [Access::Read, Access::Write, Access::ReadWrite] {
        stale(rt.prepare(&old.id, other, access), "prepare");
        stale(rt.finish(&old.id, other, access), "finish");
    }
    let uses = [r(Access::Read, &old.id)];
    stale(rt.prepare_all(other, &uses), "prepare_all");
    stale(rt.finish_all(other, &uses), "finish_all");
    st.assert_unchanged(&before, 0, "stale handle calls");
    assert!(st.sim().read(new.id.ptr, 8192).unwrap().iter().all(|&b| b == 0x3C), "[{n}] new block's data untouched");
    let v = rt.validate(&new.id).unwrap();
    assert_eq!((&*v.tag.name(), v.state), ("new", BlockState::Live), "[{n}]");
    rt.deallocate(&new.id).unwrap();
    st.release_all();
    assert_eq!(rt.stats().unwrap().outstanding_bytes, 0, "[{n}]");
}

// ----- cross-stream ordering -----

/// write(A) → read(B) → write(A) → read(B) → read-write(C), each stage
/// checked to be blocked until the stage it depends on is released.
fn write_read_write_ordering_across_streams(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (a, b, c) = (st.stream(), st.stream(), st.stream());
    let x = rt.allocate(64, a, "x").unwrap();
    st.sim().fill(x.id.ptr, 64, 0).unwrap();
    let p = x.id.ptr;

    // Write on A (held back by a gate), read on B.
    let mut gate_a = gate(rt, a);
    rt.prepare(&x.id, a, Access::Write).unwrap();
    host_write_u64(rt, a, p, 0xC0FFEE, Duration::ZERO);
    rt.finish(&x.id, a, Access::Write).unwrap();
    rt.prepare(&x.id, b, Access::Read).unwrap();
    let seen = host_read_u64(rt, b, p, Duration::ZERO);
    rt.finish(&x.id, b, Access::Read).unwrap();
    assert_blocked(&seen, &format!("[{n}] the read on B must wait for the write on A"));
    gate_a.open();
    assert_eq!(recv(&seen, n), 0xC0FFEE, "[{n}] B read before A's write landed");

    // Read on B (held back), then a write on A must wait for it.
    let mut gate_b = gate(rt, b);
    rt.prepare(&x.id, b, Access::Read).unwrap();
    let seen2 = host_read_u64(rt, b, p, Duration::ZERO);
    rt.finish(&x.id, b, Access::Read).unwrap();
    rt.prepare(&x.id, a, Access::Write).unwrap();
    host_write_u64(rt, a, p, 2, Duration::ZERO);
    rt.finish(&x.id, a, Access::Write).unwrap();
    let a_done = marker(rt, a);
    assert_blocked(&a_done, &format!("[{n}] the write on A must wait for the read on B"));
    gate_b.open();
    assert_eq!(recv(&seen2, n), 0xC0FFEE, "[{n}] the write on A clobbered the value before B read it");
    recv(&a_done, n);

    // ReadWrite on C waits for the last write (A) and an outstanding read (B).
    let mut gate_b = gate(rt, b);
    rt.prepare(&x.id, b, Access::Read).unwrap();
    let seen3 = host_read_u64(rt, b, p, Duration::ZERO);
    rt.finish(&x.id, b, Access::Read).unwrap();
    rt.prepare(&x.id, c, Access::ReadWrite).unwrap();
    let d = dev(rt);
    rt.enqueue_host(c, Box::new(move || {
        let sim = d.as_sim().unwrap();
        let v = sim.read_u64(p).unwrap();
        sim.write_u64(p, v + 1).unwrap();
    }))
    .unwrap();
    rt.finish(&x.id, c, Access::ReadWrite).unwrap();
    let c_done = marker(rt, c);
    assert_blocked(&c_done, &format!("[{n}] ReadWrite on C must wait for the read on B"));
    gate_b.open();
    assert_eq!(recv(&seen3, n), 2, "[{n}]");
    recv(&c_done, n);
    assert_eq!(st.sim().read_u64(p).unwrap(), 3, "[{n}] C incremented A's second write");

    // Reads on B then C (both held back); a write on A waits for both, not
    // just the latest.
    let (mut gate_b, mut gate_c) = (gate(rt, b), gate(rt, c));
    let mut reads = Vec::new();
    for rs in [b, c] {
        rt.prepare(&x.id, rs, Access::Read).unwrap();
        reads.push(host_read_u64(rt, rs, p, Duration::ZERO));
        rt.finish(&x.id, rs, Access::Read).unwrap();
    }
    rt.prepare(&x.id, a, Access::Write).unwrap();
    host_write_u64(rt, a, p, 4, Duration::ZERO);
    rt.finish(&x.id, a, Access::Write).unwrap();
    let a_done = marker(rt, a);
    assert_blocked(&a_done, &format!("[{n}] the write on A must wait for both reads"));
    gate_c.open();
    assert_eq!(recv(&reads[1], n), 3, "[{n}]");
    assert_blocked(&a_done, &format!("[{n}] the write on A must still wait for the read on B"));
    gate_b.open();
    assert_eq!(recv(&reads[0], n), 3, "[{n}] the write on A overtook the read on B");
    recv(&a_done, n);
    assert_eq!(st.sim().read_u64(p).unwrap(), 4, "[{n}]");

    rt.deallocate(&x.id).unwrap();
    rt.drain().unwrap();
    st.check_invariant("end");
}

/// The scenario above without prepare: the reader sees the old value and a
/// write overtakes a read. Proves the positive test can fail.
fn without_prepare_the_reader_sees_stale_data(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (a, b) = (st.stream(), st.stream());
    let x = rt.allocate(64, a, "x").unwrap();
    let p = x.id.ptr;
    st.sim().fill(p, 64, 0).unwrap();

    let mut gate_a = gate(rt, a);
    host_write_u64(rt, a, p, 0xC0FFEE, Duration::ZERO);
    let seen = host_read_u64(rt, b, p, Duration::ZERO);
    assert_eq!(recv(&seen, n), 0, "[{n}] with no wait the reader runs before the writer");
    gate_a.open();
    rt.synchronize(a).unwrap();

    let mut gate_b = gate(rt, b);
    let seen2 = host_read_u64(rt, b, p, Duration::ZERO);
    host_write_u64(rt, a, p, 2, Duration::ZERO);
    rt.synchronize(a).unwrap(); // A does not wait for B's read
    gate_b.open();
    assert_eq!(recv(&seen2, n), 2, "[{n}] with no wait the write overtakes the read");
    rt.deallocate(&x.id).unwrap();
}

#[derive(Debug, Default)]
struct FanOut {
    /// (who, value seen) in the order the callbacks ran.
    log: Vec<(&'static str, u64)>,
}

/// write(A, sleeps 60 ms) → read(B, sleeps 50 ms) and read(C, sleeps 10 ms)
/// → write(D) → read(E). B is recorded before C and takes longer, so a
/// write that waited only for the latest reader would overtake B. With `tracked` every use goes through
/// prepare/finish; without, nothing orders the streams.
fn fan_out_scenario(st: &Stack, tracked: bool) -> Vec<(&'static str, u64)> {
    let rt = &st.rt;
    let [a, b, c, d, e] = [(); 5].map(|_| st.stream());
    let x = rt.allocate(64, a, "fan").unwrap();
    let p = x.id.ptr;
    st.sim().fill(p, 64, 0).unwrap();
    let out = Arc::new(Mutex::new(FanOut::default()));
    let stage = |stream: StreamId, access: Access, who: &'static str, write: Option<u64>, delay: u64| {
        if tracked {
            rt.prepare(&x.id, stream, access).unwrap();
        }
        let (dv, out) = (dev(rt), out.clone());
        rt.enqueue_host(stream, Box::new(move || {
            thread::sleep(Duration::from_millis(delay));
            let sim = dv.as_sim().unwrap();
            let v = match write {
                Some(v) => {
                    sim.write_u64(p, v).unwrap();
                    v
                }
                None => sim.read_u64(p).unwrap(),
            };
            out.lock().unwrap().log.push((who, v));
        }))
        .unwrap();
        if tracked {
            rt.finish(&x.id, stream, access).unwrap();
        }
    };
    stage(a, Access::Write, "A:write", Some(1), 60);
    stage(b, Access::Read, "B:read", None, 50);
    stage(c, Access::Read, "C:read", None, 10);
    stage(d, Access::Write, "D:write", Some(2), 0);
    stage(e, Access::Read, "E:read", None, 0);
    for s in [a, b, c, d, e] {
        rt.synchronize(s).unwrap();
    }
    rt.deallocate(&x.id).unwrap();
    let log = std::mem::take(&mut out.lock().unwrap().log);
    log
}

fn fan_out_reads_then_write_are_ordered(kind: StackKind) {
    let st = Stack::open_default(kind);
    let n = st.name();
    let log = fan_out_scenario(&st, true);
    let pos = |who: &str| log.iter().position(|(w, _)| *w == who).unwrap_or_else(|| panic!("[{n}] {who} missing: {log:?}"));
    let seen = |who: &str| log[pos(who)].1;
    assert_eq!(pos("A:write"), 0, "[{n}] {log:?}");
    assert_eq!(seen("B:read"), 1, "[{n}] B must see A's write: {log:?}");
    assert_eq!(seen("C:read"), 1, "[{n}] C must see A's write: {log:?}");
    assert!(pos("D:write") > pos("B:read") && pos("D:write") > pos("C:read"), "[{n}] D wrote before both reads: {log:?}");
    assert_eq!(seen("E:read"), 2, "[{n}] E must see D's write: {log:?}");
    assert_eq!(pos("E:read"), 4, "[{n}] {log:?}");
    st.check_invariant("end");
}

fn without_prepare_fan_out_is_misordered(kind: StackKind) {
    let st = Stack::open_default(kind);
    let n = st.name();
    let log = fan_out_scenario(&st, false);
    let find = |who: &str| log.iter().position(|(w, _)| *w == who).unwrap();
    let ordered = log[find("B:read")].1 == 1
        && log[find("C:read")].1 == 1
        && find("D:write") > find("B:read")
        && find("D:write") > find("C:read");
    assert!(!ordered, "[{n}] without waits the scenario should have been misordered: {log:?}");
}

/// Readers on two streams sleep (80 and 20 ms), then read; the block is freed on its
/// allocation stream, the address is handed out again there and
/// overwritten. The readers must still see the original data.
fn free_reuse_scenario(st: &Stack, tracked: bool) -> (Vec<Vec<u8>>, bool) {
    let (rt, n) = (&st.rt, st.name());
    let (s, b, c) = (st.stream(), st.stream(), st.stream());
    let len = 4096;
    let x = rt.allocate(len, s, "shared").unwrap();
    if tracked {
        rt.prepare(&x.id, s, Access::Write).unwrap();
    }
    host_fill(rt, s, x.id.ptr, len, 0xAA, Duration::ZERO);
    if tracked {
        rt.finish(&x.id, s, Access::Write).unwrap();
    } else {
        rt.synchronize(s).unwrap();
    }
    // The slow reader is recorded first, so a free that waited only for the
    // latest reader would let the reuse overtake it.
    let readers: Vec<_> = [(b, 80), (c, 20)]
        .into_iter()
        .map(|(rs, delay)| {
            if tracked {
                rt.prepare(&x.id, rs, Access::Read).unwrap();
            }
            let rx = host_read_bytes(rt, rs, x.id.ptr, len, Duration::from_millis(delay));
            if tracked {
                rt.finish(&x.id, rs, Access::Read).unwrap();
            }
            rx
        })
        .collect();
    rt.deallocate(&x.id).unwrap();
    let mut s_blocked = false;
    if tracked {
        // The allocation stream now waits for both readers.
        let m = marker(rt, s);
        s_blocked = matches!(m.recv_timeout(Duration::from_millis(15)), Err(std::sync::mpsc::RecvTimeoutError::Timeout));
    }
    rt.synchronize(s).unwrap(); // the free has run on S: the range is free again
    let y = rt.allocate(len, s, "reuse").unwrap();
    assert_eq!(y.id.ptr, x.id.ptr, "[{n}] the sim hands the freed address out again");
    if tracked {
        rt.prepare(&y.id, s, Access::Write).unwrap();
    }
    host_fill(rt, s, y.id.ptr, len, 0x55, Duration::ZERO);
    if tracked {
        rt.finish(&y.id, s, Access::Write).unwrap();
    }
    let seen = readers.iter().map(|rx| recv(rx, n)).collect();
    rt.synchronize(s).unwrap();
    assert!(st.sim().read(y.id.ptr, len).unwrap().iter().all(|&v| v == 0x55), "[{n}]");
    rt.deallocate(&y.id).unwrap();
    (seen, s_blocked)
}

fn free_waits_for_every_reader(kind: StackKind) {
    let st = Stack::open_default(kind);
    let n = st.name();
    let (seen, s_blocked) = free_reuse_scenario(&st, true);
    assert!(s_blocked, "[{n}] the allocation stream must wait for the readers after the free");
    for (i, data) in seen.iter().enumerate() {
        assert!(data.iter().all(|&v| v == 0xAA), "[{n}] reader {i} saw the next owner's data: {:?}", &data[..8]);
    }
    st.release_all();
    st.check_invariant("end");
    assert_eq!(st.rt.stats().unwrap().outstanding_bytes, 0, "[{n}]");
}

fn without_recorded_reads_a_free_lets_reuse_clobber_readers(kind: StackKind) {
    let st = Stack::open_default(kind);
    let n = st.name();
    let (seen, _) = free_reuse_scenario(&st, false);
    assert!(
        seen.iter().all(|d| d.iter().all(|&v| v == 0x55)),
        "[{n}] without recorded reads the readers should have seen the new owner's data"
    );
}

// ----- budget -----

fn budget_invariant_after_every_op(kind: StackKind) {
    budget_invariant_scenario(kind, false);
}

/// The scenario above with a failed driver free in the middle, where a free
/// calls the driver (with the cache it makes no driver call: see
/// free_fault_in_trim_keeps_the_block_cached).
fn budget_invariant_after_every_op_and_a_failed_free(kind: StackKind) {
    budget_invariant_scenario(kind, true);
}

/// Allocations, uses, frees, refusals and faults, with the budget invariant
/// and the live bytes checked after each; `failed_free` adds a free that
/// fails in the driver.
fn budget_invariant_scenario(kind: StackKind, failed_free: bool) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (s, t) = (st.stream(), st.stream());
    let p = &st.props;
    let h = |size: u64| p.held_bytes(size);
    let check = |what: &str, live: u64| {
        st.check_invariant(what);
        assert_eq!(rt.usage().live_bytes, live, "[{n}] {what}: live bytes");
    };
    check("open", 0);
    let a = rt.allocate(1000, s, "a").unwrap();
    check("allocate 1000", h(1000));
    let z = rt.allocate(0, s, "z").unwrap();
    check("allocate 0", h(1000));
    let b = rt.allocate(300 * KIB, t, "b").unwrap();
    check("allocate 300 KiB", h(1000) + h(300 * KIB));
    expect_tracked(p, rt.prepare(&a.id, t, Access::Write), &format!("[{n}] prepare"));
    check("prepare", h(1000) + h(300 * KIB));
    expect_tracked(p, rt.finish(&a.id, t, Access::Write), &format!("[{n}] finish"));
    check("finish", h(1000) + h(300 * KIB));
    let uses = [r(Access::Read, &a.id), r(Access::ReadWrite, &b.id)];
    expect_tracked(p, rt.prepare_all(s, &uses), &format!("[{n}] prepare_all"));
    expect_tracked(p, rt.finish_all(s, &uses), &format!("[{n}] finish_all"));
    check("launch", h(1000) + h(300 * KIB));
    rt.deallocate(&a.id).unwrap();
    check("free a", h(300 * KIB));
    assert!(matches!(rt.deallocate(&a.id), Err(ResourceError::UseAfterFree { .. })), "[{n}]");
    check("double free", h(300 * KIB));
    expect_refusal(p, st.limit, rt.allocate(8 * MIB, s, "huge"), 8 * MIB, &format!("[{n}] 8 MiB"));
    check("refused allocation", h(300 * KIB));
    st.sim().inject_fault(FaultKind::Alloc, 1);
    expect_injected(rt.allocate(2000, s, "faulty"), &[], &format!("[{n}] alloc fault"));
    check("failed allocation", h(300 * KIB));
    if failed_free {
        st.sim().inject_fault(FaultKind::Free, 1);
        expect_injected(rt.deallocate(&b.id), &[], &format!("[{n}] free fault"));
        check("failed free", h(300 * KIB));
    }
    rt.reap().unwrap();
    check("reap", h(300 * KIB));
    let c = rt.allocate(700 * KIB, t, "c").unwrap();
    check("allocate 700 KiB", h(300 * KIB) + h(700 * KIB));
    rt.deallocate(&b.id).unwrap();
    check("free b", h(700 * KIB));
    rt.deallocate(&z.id).unwrap();
    check("free z", h(700 * KIB));
    rt.deallocate(&c.id).unwrap();
    check("free c", 0);
    rt.drain().unwrap();
    check("drain", 0);
    st.release_all();
    check("trim", 0);
    assert_eq!(rt.usage().outstanding_bytes(), 0, "[{n}]");
    assert_eq!(st.reserved().unwrap_or(0), 0, "[{n}]");
}

/// 512 KiB kept and 256 KiB freed (pending where frees are stream-ordered:
/// S is gated), then another 512 KiB asked for: over the 1 MiB budget of
/// the budget stacks. `refused` checks the refusal against the snapshot
/// taken just before it; then S is released and the request fits.
fn budget_refusal_scenario(kind: StackKind, refused: impl FnOnce(&Stack, &Snapshot)) {
    let st = Stack::open_default(kind); // 1 MiB budget on the budget stacks
    let (rt, n) = (&st.rt, st.name());
    let s = st.stream();
    let mut g = gate(rt, s);
    let keep = rt.allocate(512 * KIB, s, "keep").unwrap();
    let gone = rt.allocate(256 * KIB, s, "gone").unwrap();
    rt.deallocate(&gone.id).unwrap(); // pending on async stacks: S is gated
    let before = st.snapshot();
    let err = rt.allocate(512 * KIB, s, "more").unwrap_err();
    assert_eq!(
        err,
        ResourceError::OutOfBudget {
            requested: 512 * KIB,
            live: 512 * KIB,
            cached: 0,
            pending: 256 * KIB,
            limit: MIB,
            remaining: 256 * KIB,
        },
        "[{n}]"
    );
    let msg = err.to_string();
    for needle in ["requested 524288", "live 524288", "cached 0", "pending 262144", "limit 1048576", "remaining 262144"] {
        assert!(msg.contains(needle), "[{n}] {msg:?} lacks {needle:?}");
    }
    refused(&st, &before);
    g.open();
    assert_eq!(rt.drain().unwrap(), 256 * KIB, "[{n}]");
    let more = rt.allocate(512 * KIB, s, "more").unwrap();
    st.check_invariant("after the pending free retired");
    assert_eq!(st.reserved(), Some(MIB), "[{n}]");
    rt.deallocate(&more.id).unwrap();
    rt.deallocate(&keep.id).unwrap();
}

fn budget_refusal_carries_the_numbers(kind: StackKind) {
    budget_refusal_scenario(kind, |st, before| {
        // The refusal reaped first (sealing the pending free), nothing else.
        st.assert_unchanged_but_reaped(before, 1, "refused allocation");
    });
}

fn budget_refusal_releases_the_cache_then_carries_the_numbers(kind: StackKind) {
    budget_refusal_scenario(kind, |st, before| {
        // The freed block was cached; under pressure it went back to the
        // driver before the refusal (pending now, S being gated), and that
        // is the only change.
        let n = st.name();
        assert_eq!(before.stats.cached_bytes, 256 * KIB, "[{n}]");
        let now = st.snapshot();
        assert_eq!((now.stats.cached_bytes, now.stats.pending_bytes), (0, 256 * KIB), "[{n}]");
        assert_eq!(now.stats.outstanding_bytes, before.stats.outstanding_bytes, "[{n}]");
        assert_eq!(now.stats.failed_allocations, before.stats.failed_allocations + 1, "[{n}]");
        st.check_invariant("refused after releasing the cache");
    });
}

/// The budget stacks' refusal scenario on a stack without a budget.
fn without_a_budget_the_same_request_fits(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let s = st.stream();
    let mut g = gate(rt, s);
    let _keep = rt.allocate(512 * KIB, s, "keep").unwrap();
    let gone = rt.allocate(256 * KIB, s, "gone").unwrap();
    rt.deallocate(&gone.id).unwrap();
    let b = rt.allocate(512 * KIB, s, "more").unwrap_or_else(|e| panic!("[{n}] no budget, so 512 KiB must fit: {e}"));
    assert_eq!(rt.stats().unwrap().budget_limit, 0, "[{n}]");
    rt.deallocate(&b.id).unwrap();
    g.open();
}

/// A block of 64 KiB freed on a gated stream S.
fn free_on_gated_stream(st: &Stack) -> (StreamId, Gate, u64, xlog_cuda::DeviceBlock) {
    let rt = &st.rt;
    let s = st.stream();
    let size = 64 * KIB;
    let g = gate(rt, s);
    let x = rt.allocate(size, s, "x").unwrap();
    let freed = rt.deallocate(&x.id).unwrap();
    (s, g, size, freed)
}

fn a_free_retires_at_once(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (_, mut g, _, freed) = free_on_gated_stream(&st);
    let stats = rt.stats().unwrap();
    assert_eq!(freed.state, BlockState::Retired, "[{n}]");
    assert_eq!((stats.live_bytes, stats.pending_bytes, stats.outstanding_bytes), (0, 0, 0), "[{n}]");
    assert_eq!(rt.reap().unwrap(), 0, "[{n}] nothing pending on Direct");
    g.open();
}

fn cached_bytes_stay_charged_until_trim(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (_, mut g, size, freed) = free_on_gated_stream(&st);
    let stats = rt.stats().unwrap();
    // Cached: still held from the driver, so still charged, and reap
    // has nothing to retire; trim hands it back.
    assert_eq!(freed.state, BlockState::Cached, "[{n}]");
    assert_eq!((stats.live_bytes, stats.cached_bytes, stats.cached_blocks, stats.pending_bytes), (0, size, 1, 0), "[{n}]");
    assert_eq!(stats.outstanding_bytes, size, "[{n}] cached bytes are still outstanding");
    assert_eq!(st.reserved(), st.limit.map(|_| size), "[{n}] cached bytes stay charged (where a budget is)");
    assert_eq!(rt.reap().unwrap(), 0, "[{n}] nothing pending");
    assert_eq!(st.sim().bytes_in_use(), size, "[{n}] device memory still held");
    g.open();
    let trimmed = rt.trim(0).unwrap();
    assert_eq!((trimmed.released, trimmed.retired), (size, size), "[{n}]");
    let stats = rt.stats().unwrap();
    assert_eq!((stats.cached_bytes, stats.pending_bytes, stats.outstanding_bytes), (0, 0, 0), "[{n}]");
    assert_eq!(st.sim().bytes_in_use(), 0, "[{n}] the device has it back");
    st.check_invariant("trimmed");
}

fn pending_bytes_stay_charged_until_reap(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (s, mut g, size, freed) = free_on_gated_stream(&st);
    let stats = rt.stats().unwrap();
    assert_eq!(freed.state, BlockState::Pending, "[{n}]");
    assert_eq!((stats.live_bytes, stats.pending_bytes, stats.pending_blocks), (0, size, 1), "[{n}]");
    assert_eq!(stats.outstanding_bytes, size, "[{n}] pending bytes are still outstanding");
    st.check_invariant("pending");
    assert_eq!(st.reserved(), st.limit.map(|_| size), "[{n}] pending bytes stay charged (where a budget is)");
    // The stream has not reached the free: reap retires nothing and does not block.
    assert_eq!(rt.reap().unwrap(), 0, "[{n}] reap before the free ran");
    assert_eq!(rt.stats().unwrap().pending_bytes, size, "[{n}]");
    assert_eq!(st.sim().bytes_in_use(), size, "[{n}] device memory still held");
    g.open();
    rt.synchronize(s).unwrap();
    assert_eq!(st.sim().bytes_in_use(), 0, "[{n}] the device released it");
    let stats = rt.stats().unwrap();
    assert_eq!((stats.pending_bytes, stats.pending_blocks), (size, 1), "[{n}] still pending until reap");
    st.check_invariant("freed on the device, not yet reaped");
    assert_eq!(st.reserved(), st.limit.map(|_| size), "[{n}] still charged until reap (where a budget is)");
    assert_eq!(rt.drain().unwrap(), size, "[{n}]");
    let stats = rt.stats().unwrap();
    assert_eq!((stats.pending_bytes, stats.pending_blocks, stats.outstanding_bytes), (0, 0, 0), "[{n}]");
    st.check_invariant("reaped");

    // A non-blocking reap retires the free once the stream has passed it.
    let y = rt.allocate(size, s, "y").unwrap();
    rt.deallocate(&y.id).unwrap();
    let mut total = 0;
    for _ in 0..2000 {
        total += rt.reap().unwrap();
        if total > 0 {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(total, size, "[{n}] reap retired the completed free");
    st.check_invariant("reaped by polling");
}

// ----- fault injection -----

fn alloc_fault_rolls_back(kind: StackKind) {
    alloc_fault_scenario(kind);
}

fn alloc_faults_are_logged(kind: StackKind) {
    let st = alloc_fault_scenario(kind);
    let n = st.name();
    let (_, lines) = parse_log(&st.log_text());
    let failures: Vec<_> = lines.iter().filter(|l| l.action == "allocate failure").collect();
    assert_eq!(failures.len(), 2, "[{n}] {failures:?}");
    assert_eq!((failures[0].size, failures[0].tag.as_str()), (65536, "faulty"), "[{n}]");
    assert_eq!((failures[1].size, failures[1].tag.as_str()), (3000, "a3"), "[{n}]");
}

/// Injected allocation faults, each rolled back; the stack is handed back
/// with everything freed and released.
fn alloc_fault_scenario(kind: StackKind) -> Stack {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let s = st.stream();
    let keep = rt.allocate(4096, s, "keep").unwrap();
    let before = st.snapshot();
    st.sim().inject_fault(FaultKind::Alloc, 1);
    expect_injected(rt.allocate(64 * KIB, s, "faulty"), &["65536"], &format!("[{n}] first allocation"));
    st.assert_unchanged(&before, 1, "injected allocation fault");

    // Fail the third of the next allocations; the others go through.
    st.sim().inject_fault(FaultKind::Alloc, 3);
    let a1 = rt.allocate(1000, s, "a1").unwrap();
    let a2 = rt.allocate(2000, s, "a2").unwrap();
    let before = st.snapshot();
    // The async pool asks the driver for the device size, Direct for the request.
    let device_bytes = st.props.driver_bytes(3000).to_string();
    expect_injected(rt.allocate(3000, s, "a3"), &[&device_bytes], &format!("[{n}] third allocation"));
    st.assert_unchanged(&before, 1, "third allocation");
    let a4 = rt.allocate(4000, s, "a4").unwrap();
    let h = |size| st.props.held_bytes(size);
    assert_eq!(rt.usage().live_bytes, h(4096) + h(1000) + h(2000) + h(4000), "[{n}]");
    st.check_invariant("after faults");
    assert_eq!(rt.stats().unwrap().failed_allocations, 2, "[{n}]");
    for b in [&keep, &a1, &a2, &a4] {
        rt.deallocate(&b.id).unwrap();
    }
    st.release_all();
    st.check_invariant("drained");
    assert_eq!(rt.usage().outstanding_bytes(), 0, "[{n}]");
    assert_eq!(st.sim().bytes_in_use(), 0, "[{n}]");
    st
}

/// A 64 KiB block filled with 0x77 on S, and another stream T.
fn victim(st: &Stack) -> (StreamId, StreamId, BlockId) {
    let rt = &st.rt;
    let (s, t) = (st.stream(), st.stream());
    let x = rt.allocate(64 * KIB, s, "victim").unwrap();
    st.sim().fill(x.id.ptr, 64 * KIB, 0x77).unwrap();
    (s, t, x.id)
}

fn free_fault_keeps_the_block_live(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (_, t, x) = victim(&st);
    let before = st.snapshot();
    st.sim().inject_fault(FaultKind::Free, 1);
    expect_injected(rt.deallocate(&x), &[&format!("{:#x}", x.ptr)], &format!("[{n}] free"));
    st.assert_unchanged(&before, 0, "injected free fault");
    let v = rt.validate(&x).unwrap();
    assert_eq!((v.state, &*v.tag.name()), (BlockState::Live, "victim"), "[{n}] block stays live");
    assert!(st.sim().read(x.ptr, 64 * KIB).unwrap().iter().all(|&b| b == 0x77), "[{n}] data intact");
    expect_tracked(&st.props, rt.prepare(&x, t, Access::Read), &format!("[{n}] prepare"));
    expect_tracked(&st.props, rt.finish(&x, t, Access::Read), &format!("[{n}] finish"));
    let freed = rt.deallocate(&x).unwrap();
    assert_eq!(freed.state, st.props.freed_state(64 * KIB), "[{n}]");
    rt.drain().unwrap();
    st.check_invariant("freed later");
    let stats = rt.stats().unwrap();
    assert_eq!((stats.outstanding_bytes, stats.deallocations), (0, 1), "[{n}]");
    assert_eq!(st.sim().bytes_in_use(), 0, "[{n}]");
}

fn free_fault_in_trim_keeps_the_block_cached(kind: StackKind) {
    free_fault_in_trim_scenario(kind);
}

fn a_failed_trim_logs_no_free(kind: StackKind) {
    let st = free_fault_in_trim_scenario(kind);
    let n = st.name();
    let (_, lines) = parse_log(&st.log_text());
    let count = |action: &str| lines.iter().filter(|l| l.action == action).count();
    assert_eq!(count("free"), 2, "[{n}] the victim's and the reuse's frees, into the cache");
    assert_eq!(count("release"), 1, "[{n}] only the trim that worked gave the block back");
}

/// A free into the cache makes no driver call; the driver's free comes at
/// trim (or under pressure), and failing there loses nothing. The stack is
/// handed back with everything released.
fn free_fault_in_trim_scenario(kind: StackKind) -> Stack {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (_, t, x) = victim(&st);
    let freed = rt.deallocate(&x).unwrap();
    assert_eq!(freed.state, BlockState::Cached, "[{n}]");
    let before = st.snapshot();
    st.sim().inject_fault(FaultKind::Free, 1);
    expect_injected(rt.trim(0), &[&format!("{:#x}", x.ptr)], &format!("[{n}] trim"));
    st.assert_unchanged(&before, 0, "injected free fault in trim");
    assert!(st.sim().read(x.ptr, 64 * KIB).unwrap().iter().all(|&b| b == 0x77), "[{n}] memory kept");
    let y = rt.allocate(64 * KIB, t, "reuse").unwrap();
    assert_eq!(y.id.ptr, x.ptr, "[{n}] the block is still cached and handed out");
    rt.deallocate(&y.id).unwrap();
    st.release_all();
    assert_eq!(rt.stats().unwrap().outstanding_bytes, 0, "[{n}]");
    assert_eq!(st.sim().bytes_in_use(), 0, "[{n}]");
    st
}

/// Where nothing is tracked, an armed event-record fault meets no record:
/// the refused calls, the free and reap go through it untouched.
fn event_record_fault_changes_nothing_without_tracking(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (a, b) = (st.stream(), st.stream());
    let x = rt.allocate(64, a, "x").unwrap();
    st.sim().fill(x.id.ptr, 64, 0).unwrap();
    st.sim().inject_fault(FaultKind::EventRecord, 1);
    assert_tracking_refused(&st, &x.id, b);
    rt.deallocate(&x.id).unwrap();
    assert_eq!(rt.reap().unwrap(), 0, "[{n}]");
    st.sim().inject_fault(FaultKind::EventRecord, 0);
}

/// Where uses are not tracked, every form of prepare/finish is refused with
/// StreamMisuse and changes nothing, whatever the handle: zero-size, 64 and
/// 4096 bytes (the blocks of the tracking-only tests), stale or live.
fn tracking_calls_are_refused_and_change_nothing(kind: StackKind) {
    let st = Stack::open_default(kind);
    let rt = &st.rt;
    let (s, other) = (st.stream(), st.stream());
    for size in [0, 64, 4096] {
        let x = rt.allocate(size, s, "x").unwrap();
        assert_tracking_refused(&st, &x.id, other);
        rt.deallocate(&x.id).unwrap();
    }
    let old = rt.allocate(8192, s, "old").unwrap();
    rt.deallocate(&old.id).unwrap();
    rt.drain().unwrap();
    let new = rt.allocate(8192, s, "new").unwrap();
    assert_eq!(new.id.ptr, old.id.ptr, "[{}] the address is handed out again", st.name());
    assert_tracking_refused(&st, &old.id, other);
    assert_tracking_refused(&st, &new.id, other);
    rt.deallocate(&new.id).unwrap();
    st.check_invariant("end");
}

/// x (64 bytes) written on a gated stream A; a finish on B fails on an
/// injected event-record fault and changes nothing: A's write is still the
/// last one, and a reader on C waits for it. Returns (x, A, C).
fn event_record_fault_in_finish(st: &Stack) -> (BlockId, StreamId, StreamId) {
    let (rt, n) = (&st.rt, st.name());
    let (a, b, c) = (st.stream(), st.stream(), st.stream());
    let x = rt.allocate(64, a, "x").unwrap();
    let p = x.id.ptr;
    st.sim().fill(p, 64, 0).unwrap();
    let mut gate_a = gate(rt, a);
    rt.prepare(&x.id, a, Access::Write).unwrap();
    host_write_u64(rt, a, p, 7, Duration::ZERO);
    rt.finish(&x.id, a, Access::Write).unwrap();

    let before = st.snapshot();
    // From a thread whose launch cache knows nothing: this thread's would
    // take x's launch on B as its own repeated on another stream, whose
    // finish owes its record instead of making one (tests/launch_cache.rs).
    std::thread::scope(|scope| {
        scope.spawn(|| {
            st.sim().inject_fault(FaultKind::EventRecord, 1);
            expect_injected(rt.finish(&x.id, b, Access::Write), &[], &format!("[{n}] finish"));
            st.assert_unchanged(&before, 0, "failed finish");
            st.sim().inject_fault(FaultKind::EventRecord, 1);
            expect_injected(rt.finish_all(b, &[r(Access::Write, &x.id)]), &[], &format!("[{n}] finish_all"));
            st.assert_unchanged(&before, 0, "failed finish_all");
        });
    });

    // A's write is still the last write: a reader on C must wait for it.
    rt.prepare(&x.id, c, Access::Read).unwrap();
    let seen = host_read_u64(rt, c, p, Duration::ZERO);
    rt.finish(&x.id, c, Access::Read).unwrap();
    assert_blocked(&seen, &format!("[{n}] the failed finish replaced the last write"));
    gate_a.open();
    assert_eq!(recv(&seen, n), 7, "[{n}]");
    (x.id, a, c)
}

fn event_record_fault_in_a_cross_stream_hand_out_changes_nothing(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (x, a, c) = event_record_fault_in_finish(&st);
    let p = x.ptr;
    // The freed block is cached on A; handing it to C needs an event
    // recorded on A. A fault there fails the allocation and changes
    // nothing: the block stays cached on A.
    rt.deallocate(&x).unwrap();
    rt.synchronize(a).unwrap();
    let before = st.snapshot();
    st.sim().inject_fault(FaultKind::EventRecord, 1);
    expect_injected(rt.allocate(64, c, "y"), &[], &format!("[{n}] cross-stream hand-out"));
    st.assert_unchanged(&before, 1, "failed cross-stream hand-out");
    let y = rt.allocate(64, c, "y").unwrap();
    assert_eq!(y.id.ptr, p, "[{n}] handed out once the record works");
    assert_eq!(rt.stats().unwrap().cache_hits, 1, "[{n}]");
    rt.deallocate(&y.id).unwrap();
    st.release_all();
    assert_eq!(rt.usage().outstanding_bytes(), 0, "[{n}]");
}

fn event_record_fault_in_reap_changes_nothing(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (x, a, _) = event_record_fault_in_finish(&st);
    // A fault while reap seals the pending frees: nothing retired, still charged.
    rt.deallocate(&x).unwrap();
    rt.synchronize(a).unwrap();
    let before = st.snapshot();
    st.sim().inject_fault(FaultKind::EventRecord, 1);
    expect_injected(rt.reap(), &[], &format!("[{n}] reap"));
    st.assert_unchanged(&before, 0, "failed reap");
    assert_eq!(rt.stats().unwrap().pending_bytes, st.props.held_bytes(64), "[{n}]");
    assert_eq!(rt.drain().unwrap(), st.props.held_bytes(64), "[{n}] the runtime recovers");
    st.check_invariant("end");
    assert_eq!(rt.usage().outstanding_bytes(), 0, "[{n}]");
}

// ----- concurrency -----

#[derive(Default, Debug)]
struct WorkerCounts {
    allocs: u64,
    frees: u64,
    refusals: u64,
    device_full: u64,
}

fn worker(rt: Arc<Runtime>, props: StackProps, limit: Option<u64>, seed: u64) -> WorkerCounts {
    let n = props.name;
    let s = rt.acquire_stream().unwrap();
    let mut rng = XorShift::new(seed);
    let mut held: Vec<BlockId> = Vec::new();
    let mut counts = WorkerCounts::default();
    for i in 0..300 {
        let roll = rng.below(10);
        if held.len() < 4 && roll < 6 {
            let size = 1 + rng.below(192 * KIB);
            match rt.allocate(size, s, "mt") {
                Ok(b) => {
                    assert_eq!(b.id.ptr % 256, 0, "[{n}]");
                    counts.allocs += 1;
                    if roll == 0 {
                        expect_tracked(&props, rt.prepare(&b.id, s, Access::Write), &format!("[{n}] prepare"));
                        expect_tracked(&props, rt.finish(&b.id, s, Access::Write), &format!("[{n}] finish"));
                    }
                    held.push(b.id);
                }
                Err(e) => {
                    // The declared refusal. Without a budget the sim device
                    // itself can fill up: its frees land only when each
                    // stream's worker gets there, and 8 allocating threads
                    // can outrun them.
                    let what = format!("[{n}] thread {seed}: allocate {size}");
                    match expect_refusal(&props, limit, Err::<(), _>(e), size, &what) {
                        ResourceError::OutOfBudget { .. } => counts.refusals += 1,
                        _ => counts.device_full += 1,
                    }
                    // Back off: give a block back and let this stream catch up.
                    if let Some(id) = held.pop() {
                        rt.deallocate(&id).unwrap();
                        counts.frees += 1;
                    }
                    rt.synchronize(s).unwrap();
                }
            }
        } else if !held.is_empty() {
            let id = held.swap_remove(rng.below(held.len() as u64) as usize);
            rt.deallocate(&id).unwrap();
            counts.frees += 1;
        }
        if i % 16 == 0 {
            rt.reap().unwrap();
        }
    }
    for id in held {
        rt.deallocate(&id).unwrap();
        counts.frees += 1;
    }
    rt.release_stream(s).unwrap();
    counts
}

fn eight_threads_never_exceed_the_budget(kind: StackKind) {
    let opts = Opts { budget_bytes: MIB, capacity_bytes: 16 * MIB, ..Opts::default() };
    let st = Stack::open(kind, opts);
    let n = st.name();
    let rt = st.rt.clone();
    // With a budget, live + pending never exceeds it. Without one, pending
    // bytes are bookkeeping only (the device may already have them back), so
    // what is bounded is the live bytes and the device's own usage.
    let (limit, capacity) = (MIB, 16 * MIB);
    let (props, has_budget, budget_limit) = (st.props, st.props.budget, st.limit);
    // What the observer bounds: outstanding bytes by the budget's limit
    // where there is one, else live bytes by the device's capacity.
    let bound = budget_limit.unwrap_or(capacity);
    let done = Arc::new(AtomicBool::new(false));
    let observer = {
        let (rt, done) = (rt.clone(), done.clone());
        thread::spawn(move || {
            let (mut max, mut samples) = (0u64, 0u64);
            while !done.load(Ordering::Acquire) {
                let s = rt.stats().unwrap();
                let in_use = rt.sim().unwrap().bytes_in_use();
                assert!(in_use <= capacity, "[{n}] device use {in_use} > capacity {capacity}");
                let bounded = if has_budget { s.outstanding_bytes } else { s.live_bytes };
                assert!(bounded <= bound, "[{n}] {bounded} > {bound}: {s:?}");
                if let Some(b) = rt.budget() {
                    assert!(b.reserved() <= limit, "[{n}] reserved {} > limit {limit}", b.reserved());
                }
                max = max.max(bounded);
                samples += 1;
                thread::sleep(Duration::from_micros(50));
            }
            (max, samples)
        })
    };
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let rt = rt.clone();
            thread::spawn(move || worker(rt, props, budget_limit, 0xB0D6E7 + t))
        })
        .collect();
    let mut total = WorkerCounts::default();
    let mut panicked = None;
    for w in workers {
        match w.join() {
            Ok(c) => {
                total.allocs += c.allocs;
                total.frees += c.frees;
                total.refusals += c.refusals;
                total.device_full += c.device_full;
            }
            Err(p) => panicked = Some(p),
        }
    }
    done.store(true, Ordering::Release);
    let observed = observer.join();
    if let Some(p) = panicked {
        std::panic::resume_unwind(p);
    }
    let (max, samples) = observed.unwrap_or_else(|p| std::panic::resume_unwind(p));
    assert!(samples > 0, "[{n}]");
    assert!(max <= bound, "[{n}]");
    assert!(total.allocs >= 400, "[{n}] too few allocations went through: {total:?}");
    // Demand exceeds the budget: some allocations must be refused, exactly
    // where there is one, and the budget keeps the device from filling up.
    assert_eq!(total.refusals > 0, has_budget, "[{n}] refusals: {total:?}");
    assert!(!has_budget || total.device_full == 0, "[{n}] the budget keeps the device from filling up: {total:?}");
    let peak = rt.stats().unwrap().peak_outstanding_bytes;
    assert!(!has_budget || peak <= limit, "[{n}] peak outstanding {peak} > limit {limit}");
    st.release_all();
    let stats = rt.stats().unwrap();
    assert_eq!(stats.outstanding_bytes, 0, "[{n}] {stats:?}");
    assert_eq!((stats.live_blocks, stats.pending_blocks), (0, 0), "[{n}]");
    assert_eq!(stats.allocations, total.allocs, "[{n}]");
    assert_eq!(stats.deallocations, total.frees, "[{n}]");
    assert_eq!(total.allocs, total.frees, "[{n}]");
    assert_eq!(stats.failed_allocations, total.refusals + total.device_full, "[{n}]");
    assert_eq!(st.sim().bytes_in_use(), 0, "[{n}]");
    st.check_invariant("after drain");
}

// ----- bad input -----

fn bad_input_is_a_typed_error_that_changes_nothing(kind: StackKind) {
    let st = Stack::open_default(kind);
    let (rt, n) = (&st.rt, st.name());
    let (s, t) = (st.stream(), st.stream());
    let x = rt.allocate(4096, s, "x").unwrap();
    st.sim().fill(x.id.ptr, 4096, 0x5A).unwrap();
    let before = st.snapshot();
    let gen = x.id.generation.to_string();

    // Forged handles: a live generation with other fields that do not match.
    let bad_ptr = x.id.ptr + 256;
    let forged = [
        (BlockId { ptr: bad_ptr, ..x.id }, format!("{bad_ptr:#x}")),
        (BlockId { size: 4097, ..x.id }, "size 4097".to_string()),
        (BlockId { alloc_stream: StreamId(u32::MAX - 7), ..x.id }, format!("stream {}", u32::MAX - 7)),
        (BlockId { device: 5, ..x.id }, "device 5".to_string()),
    ];
    for (f, needle) in &forged {
        let what = format!("[{n}] forged {f:?}");
        let needles = [needle.as_str(), gen.as_str()];
        expect_invalid(rt.deallocate(f), &needles, &what);
        expect_invalid(rt.validate(f), &needles, &what);
        // (Where uses are not tracked the call is refused before the handle is looked at.)
        let p = &st.props;
        let invalid = |r: ResourceResult<()>| expect_tracking(p, r, &what, |r| expect_invalid(r, &needles, &what));
        invalid(rt.prepare(f, t, Access::Read));
        invalid(rt.finish(f, t, Access::Write));
        invalid(rt.prepare_all(t, &[r(Access::Read, &x.id), r(Access::Read, f)]));
        invalid(rt.finish_all(t, &[r(Access::Read, &x.id), r(Access::Write, f)]));
    }

    // Generations never issued.
    let zeroed = BlockId { ptr: 0, size: 0, generation: Generation(0), alloc_stream: s, device: 0 };
    let future = BlockId { generation: Generation(u64::MAX), ..x.id };
    for id in [zeroed, future] {
        expect_use_after_free(rt.deallocate(&id), &id, &format!("[{n}] never issued"));
        expect_use_after_free(rt.validate(&id), &id, &format!("[{n}] never issued"));
    }

    // Stream ids never issued.
    for bad in [StreamId(0), StreamId(u32::MAX - 1)] {
        let id = bad.0.to_string();
        let needles = [id.as_str()];
        let what = format!("[{n}] stream {bad}");
        expect_invalid(rt.allocate(16, bad, "x"), &needles, &what);
        expect_invalid(rt.enqueue_host(bad, Box::new(|| {})), &needles, &what);
        expect_invalid(rt.synchronize(bad), &needles, &what);
        expect_invalid(rt.native_stream(bad), &needles, &what);
        expect_invalid(rt.release_stream(bad), &needles, &what);
        expect_invalid(rt.prepare(&x.id, bad, Access::Read), &needles, &what);
        expect_invalid(rt.finish(&x.id, bad, Access::Read), &needles, &what);
        expect_invalid(rt.prepare_all(bad, &[r(Access::Read, &x.id)]), &needles, &what);
        expect_invalid(rt.finish_all(bad, &[r(Access::Read, &x.id)]), &needles, &what);
    }
    st.assert_unchanged(&before, 0, "bad handles and streams");

    // A size no stack can satisfy.
    let e = expect_refusal(&st.props, st.limit, rt.allocate(u64::MAX, s, "absurd"), u64::MAX, &format!("[{n}] u64::MAX bytes"));
    assert!(e.to_string().contains(&u64::MAX.to_string()), "[{n}] {e}");
    st.assert_unchanged(&before, 1, "absurd allocation");

    let v = rt.validate(&x.id).unwrap();
    assert_eq!((v.state, &*v.tag.name()), (BlockState::Live, "x"), "[{n}]");
    assert!(st.sim().read(x.id.ptr, 4096).unwrap().iter().all(|&b| b == 0x5A), "[{n}] data untouched");
    rt.deallocate(&x.id).unwrap();
    rt.drain().unwrap();
    st.check_invariant("end");
}
