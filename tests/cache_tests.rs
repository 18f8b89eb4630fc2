//! Stream-ordered caching (DESIGN.md "Stream-ordered caching"), on the sim
//! backend: reuse without a driver call, stale handles on reused
//! addresses, cross-stream hand-out ordering, pressure, trim, the hoarding
//! bound, imported streams and the driver pool's creation.

mod common;

use std::time::Duration;

use common::*;
use xlog_cuda::device::sim::SimDevice;
use xlog_cuda::device::FaultKind;
use xlog_cuda::resources::stream_cache::size_class;
use xlog_cuda::{Access, BlockState, Config, ResourceError, Runtime};

#[test]
fn same_stream_reuse_needs_no_driver_call_and_no_event() {
    let st = Stack::open_default(StackKind::BudgetLoggingAsync);
    let (rt, s) = (&st.rt, st.stream());
    let a = rt.allocate(100 * KIB, s, "a").unwrap();
    let in_use = st.sim().bytes_in_use();
    let reserved = st.reserved();
    rt.deallocate(&a.id).unwrap();
    let before = rt.usage();
    for i in 0..100 {
        // Any size of the same class (or up to 9/8 of it) reuses the block.
        let b = rt.allocate(100 * KIB - i, s, "b").unwrap();
        assert_eq!(b.id.ptr, a.id.ptr, "round {i}");
        assert_eq!(b.held, size_class(100 * KIB).unwrap());
        rt.deallocate(&b.id).unwrap();
    }
    let after = rt.usage();
    assert_eq!(after.cache_hits - before.cache_hits, 100);
    assert_eq!(after.cache_misses, before.cache_misses, "no driver allocation");
    assert_eq!(after.events_recorded, before.events_recorded, "a same-stream hit records no event");
    assert_eq!(after.cross_stream_waits, before.cross_stream_waits, "and queues no wait");
    assert_eq!(st.sim().bytes_in_use(), in_use, "device memory unchanged");
    assert_eq!(st.reserved(), reserved, "the budget is not touched by hits");
    st.check_invariant("after 100 hits");
}

#[test]
fn a_stale_handle_to_an_immediately_reused_address_is_rejected() {
    for kind in [StackKind::Async, StackKind::BudgetLoggingAsync] {
        let st = Stack::open_default(kind);
        let (rt, n) = (&st.rt, st.name());
        let (s, t) = (st.stream(), st.stream());
        let old = rt.allocate(4096, s, "old").unwrap();
        rt.deallocate(&old.id).unwrap();
        // No drain, no reap: the cache hands the address straight out.
        let new = rt.allocate(4096, s, "new").unwrap();
        assert_eq!(new.id.ptr, old.id.ptr, "[{n}]");
        assert_ne!(new.id.generation, old.id.generation, "[{n}]");
        st.sim().fill(new.id.ptr, 4096, 0x42).unwrap();
        let before = st.snapshot();
        let what = |op: &str| format!("[{n}] stale {op}");
        expect_use_after_free(rt.deallocate(&old.id), &old.id, &what("free"));
        expect_use_after_free(rt.validate(&old.id), &old.id, &what("validate"));
        for access in [Access::Read, Access::Write, Access::ReadWrite] {
            expect_use_after_free(rt.prepare(&old.id, t, access), &old.id, &what("prepare"));
            expect_use_after_free(rt.finish(&old.id, t, access), &old.id, &what("finish"));
        }
        st.assert_unchanged(&before, 0, "stale calls");
        assert!(st.sim().read(new.id.ptr, 4096).unwrap().iter().all(|&b| b == 0x42), "[{n}] data untouched");
        assert_eq!(rt.validate(&new.id).unwrap().state, BlockState::Live, "[{n}]");
        rt.deallocate(&new.id).unwrap();
        // A block freed into the cache is not freed twice.
        expect_use_after_free(rt.deallocate(&new.id), &new.id, &what("double free of a cached block"));
        st.release_all();
    }
}

/// A block read on stream A, freed (cached on A), then handed to B: work on
/// B must not start before A's reader is done, so the reader never sees the
/// next owner's data.
#[test]
fn a_block_moving_to_another_stream_waits_for_the_free_point() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let (rt, n) = (&st.rt, st.name());
    let (a, b) = (st.stream(), st.stream());
    let len = 8 * KIB;
    let x = rt.allocate(len, a, "x").unwrap();
    host_fill(rt, a, x.id.ptr, len, 0xAA, Duration::ZERO);
    // A slow reader on A, then the free on A.
    let seen = host_read_bytes(rt, a, x.id.ptr, len, Duration::from_millis(400));
    rt.deallocate(&x.id).unwrap();
    let waits = rt.usage().cross_stream_waits;
    let y = rt.allocate(len, b, "y").unwrap();
    assert_eq!(y.id.ptr, x.id.ptr, "[{n}] handed over from A's cache");
    assert_eq!(rt.usage().cross_stream_waits, waits + 1, "[{n}] B waits on an event of A");
    let done = marker(rt, b);
    assert_blocked(&done, &format!("[{n}] B ran before A passed the free"));
    host_fill(rt, b, y.id.ptr, len, 0x55, Duration::ZERO);
    let data = recv(&seen, n);
    assert!(data.iter().all(|&v| v == 0xAA), "[{n}] the reader saw the next owner's data");
    recv(&done, n);
    rt.synchronize(b).unwrap();
    assert!(st.sim().read(y.id.ptr, len).unwrap().iter().all(|&v| v == 0x55), "[{n}]");
    rt.deallocate(&y.id).unwrap();
    st.release_all();
    st.check_invariant("end");
}

/// Cached memory is released before any refusal: a workload that frees
/// everything it allocated never gets refused, whatever sizes it asks for.
#[test]
fn pressure_releases_the_cache_before_refusing() {
    let opts = Opts { budget_bytes: MIB, wait_on_pressure: true, ..Opts::default() };
    let st = Stack::open(StackKind::BudgetLoggingAsync, opts);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let mut rng = XorShift::new(7);
    let mut refusals = 0;
    for round in 0..300 {
        // Up to 3/4 of the budget live at once, in sizes that rarely repeat.
        let stream = if round % 3 == 0 { t } else { s };
        let sizes = [1 + rng.below(384 * KIB), 1 + rng.below(256 * KIB), 1 + rng.below(96 * KIB)];
        let mut live = Vec::new();
        for &size in &sizes {
            match rt.allocate(size, stream, "p") {
                Ok(b) => live.push(b),
                Err(e) => {
                    refusals += 1;
                    eprintln!("round {round}: {e}");
                }
            }
            st.check_invariant("allocate under pressure");
        }
        for b in live {
            rt.deallocate(&b.id).unwrap();
        }
    }
    let stats = rt.stats().unwrap();
    assert_eq!(refusals, 0, "needless refusals: {stats:?}");
    assert_eq!(stats.failed_allocations, 0);
    assert!(stats.cache_hits > 0 && stats.cache_misses > 0, "{stats:?}");
    assert!(stats.peak_outstanding_bytes <= MIB, "{stats:?}");
    st.release_all();
    st.check_invariant("end");
}

#[test]
fn trim_returns_exactly_what_it_reports() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let (rt, s, t) = (&st.rt, st.stream(), st.stream());
    let sizes = [64 * KIB, 128 * KIB, 32 * KIB, 200 * KIB];
    let blocks: Vec<_> = sizes.iter().enumerate().map(|(i, &z)| rt.allocate(z, if i % 2 == 0 { s } else { t }, "t").unwrap()).collect();
    let keep_live = rt.allocate(10 * KIB, s, "live").unwrap();
    for b in &blocks {
        rt.deallocate(&b.id).unwrap();
    }
    let held: Vec<u64> = sizes.iter().map(|&z| size_class(z).unwrap()).collect();
    let cached: u64 = held.iter().sum();
    let before = rt.stats().unwrap();
    assert_eq!((before.cached_bytes, before.cached_blocks), (cached, 4));
    // Keep 100 KiB: the largest blocks go first (200 KiB, then 128 KiB),
    // leaving 64 + 32 KiB.
    let first = rt.trim(100 * KIB).unwrap();
    assert_eq!(first.released, held[3] + held[1]);
    assert_eq!(first.retired, first.released, "trim waits for its frees");
    let mid = rt.stats().unwrap();
    assert_eq!(mid.cached_bytes, before.cached_bytes - first.released);
    assert!(mid.cached_bytes <= 100 * KIB);
    assert_eq!(mid.outstanding_bytes, before.outstanding_bytes - first.retired);
    assert_eq!(st.reserved(), Some(mid.outstanding_bytes), "the budget released what trim retired");
    assert_eq!(mid.live_bytes, size_class(10 * KIB).unwrap(), "live blocks are not touched");
    // Trimming to what is cached already does nothing.
    assert_eq!(rt.trim(mid.cached_bytes).unwrap().released, 0);
    let rest = rt.trim(0).unwrap();
    assert_eq!(rest.released, held[0] + held[2]);
    let end = rt.stats().unwrap();
    assert_eq!((end.cached_bytes, end.cached_blocks, end.pending_bytes), (0, 0, 0));
    assert_eq!(st.sim().bytes_in_use(), size_class(10 * KIB).unwrap());
    st.check_invariant("after trim");
    rt.deallocate(&keep_live.id).unwrap();
}

/// The largest block `activation_step` allocates.
const LARGEST_ACTIVATION: u64 = 1024 * 12 * KIB;

/// A "step" of a model with a random sequence length in [64, 1024): a few
/// activations whose sizes scale with it, all freed at the end of the
/// step. The stats while they were live.
fn activation_step(rt: &Runtime, s: xlog_cuda::StreamId, rng: &mut XorShift) -> xlog_cuda::Stats {
    let seq = 64 + rng.below(960);
    let blocks: Vec<_> = [3 * KIB, 12 * KIB, 768].iter().map(|&per| rt.allocate(seq * per, s, "act").unwrap()).collect();
    let stats = rt.stats().unwrap();
    for b in blocks {
        rt.deallocate(&b.id).unwrap();
    }
    stats
}

/// Sizes that keep changing: the memory xlog keeps (live + cached) stays
/// near the live peak instead of growing with every shape ever seen. (What
/// it gave back may still be pending while the stream catches up; the sim,
/// unlike CUDA, cannot reuse a queued free before it runs, hence
/// `wait_on_pressure` for the device's own limit.)
#[test]
fn changing_shapes_do_not_hoard() {
    let opts = Opts { capacity_bytes: 256 * MIB, wait_on_pressure: true, ..Opts::default() };
    let st = Stack::open(StackKind::Async, opts);
    let (rt, s) = (&st.rt, st.stream());
    let mut rng = XorShift::new(11);
    let (mut peak_live, mut peak_kept) = (0u64, 0u64);
    for _step in 0..200 {
        let stats = activation_step(rt, s, &mut rng);
        peak_live = peak_live.max(stats.live_bytes);
        peak_kept = peak_kept.max(stats.live_bytes + stats.cached_bytes);
    }
    let stats = rt.stats().unwrap();
    let largest = size_class(LARGEST_ACTIVATION).unwrap();
    // The hard cap: twice the live peak (plus the request that crossed it).
    let bound = 2 * peak_live + largest;
    assert!(peak_kept <= bound, "live + cached peaked at {peak_kept}, live at {peak_live} (bound {bound}): {stats:?}");
    assert!(stats.cache_hits > 0, "{stats:?}");
    st.release_all();
}

/// The blocks the hoarding bound gives back are pending until their frees
/// complete; with nothing calling reap, a miss retires the completed ones
/// once pending passes the live bytes, so what xlog holds (and charges)
/// stays near what the device holds for it instead of growing with every
/// shape given back (W11 under `XLOG_MEMORY=pool` once charged 48 GB for a
/// 1.1 GB device peak).
#[test]
fn pending_frees_are_retired_on_a_miss_without_reap() {
    let opts = Opts { capacity_bytes: 4096 * MIB, ..Opts::default() };
    let st = Stack::open(StackKind::Async, opts);
    let (rt, s) = (&st.rt, st.stream());
    let mut rng = XorShift::new(7);
    let (mut peak_live, mut peak_held) = (0u64, 0u64);
    for _step in 0..300 {
        let stats = activation_step(rt, s, &mut rng);
        peak_live = peak_live.max(stats.live_bytes);
        peak_held = peak_held.max(stats.outstanding_bytes);
        // The GPU keeps up: every free queued so far has run.
        rt.synchronize(s).unwrap();
    }
    let stats = rt.stats().unwrap();
    let largest = size_class(LARGEST_ACTIVATION).unwrap();
    let bound = 3 * peak_live + 2 * largest;
    assert!(peak_held <= bound, "held peaked at {peak_held}, live at {peak_live} (bound {bound}): {stats:?}");
    st.release_all();
}

/// A steady loop whose freed blocks do not fit its next requests (a
/// forward pass's activations, then a backward pass's other sizes) keeps
/// its whole cache: after the first step every allocation is a hit, though
/// what it holds is well past its live peak.
#[test]
fn a_steady_loop_keeps_its_cache() {
    let opts = Opts { capacity_bytes: 64 * MIB, ..Opts::default() };
    let st = Stack::open(StackKind::Async, opts);
    let (rt, s) = (&st.rt, st.stream());
    let (forward, backward) = ([3 * MIB, 5 * MIB, 2 * MIB], [4 * MIB + 1, 6 * MIB + 1, MIB + 1]);
    let mut misses_after_warmup = 0;
    for step in 0..50 {
        let before = rt.stats().unwrap().cache_misses;
        let acts: Vec<_> = forward.iter().map(|&z| rt.allocate(z, s, "act").unwrap()).collect();
        for a in acts {
            rt.deallocate(&a.id).unwrap();
        }
        let grads: Vec<_> = backward.iter().map(|&z| rt.allocate(z, s, "grad").unwrap()).collect();
        for g in grads {
            rt.deallocate(&g.id).unwrap();
        }
        if step > 0 {
            misses_after_warmup += rt.stats().unwrap().cache_misses - before;
        }
    }
    let stats = rt.stats().unwrap();
    assert_eq!(misses_after_warmup, 0, "{stats:?}");
    assert!(stats.cached_bytes > size_class(6 * MIB + 1).unwrap() * 2, "both phases' blocks stay cached: {stats:?}");
    st.release_all();
}

#[test]
fn releasing_an_imported_stream_gives_its_cache_back() {
    let st = Stack::open_default(StackKind::BudgetAsync);
    let rt = &st.rt;
    let own = st.stream();
    let native = rt.native_stream(own).unwrap();
    // The same native stream imported under a second id, then released.
    let imported = rt.import_stream(native).unwrap();
    let x = rt.allocate(64 * KIB, imported, "x").unwrap();
    rt.deallocate(&x.id).unwrap();
    assert_eq!(rt.stats().unwrap().cached_bytes, 64 * KIB);
    rt.release_stream(imported).unwrap();
    rt.drain().unwrap();
    let stats = rt.stats().unwrap();
    assert_eq!((stats.cached_bytes, stats.pending_bytes, stats.outstanding_bytes), (0, 0, 0), "{stats:?}");
    assert_eq!(st.reserved(), Some(0));
    st.check_invariant("after release");
}

#[test]
fn cache_off_frees_to_the_driver_as_the_seed_did() {
    let st = Stack::open_default(StackKind::BudgetAsyncNoCache);
    let (rt, s) = (&st.rt, st.stream());
    let x = rt.allocate(4096, s, "x").unwrap();
    assert_eq!(rt.deallocate(&x.id).unwrap().state, BlockState::Pending);
    let stats = rt.stats().unwrap();
    assert_eq!((stats.cached_bytes, stats.pending_bytes, stats.cache_hits, stats.cache_misses), (0, 4096, 0, 0));
    assert_eq!(rt.trim(0).unwrap().released, 0, "nothing to trim");
    assert_eq!(rt.drain().unwrap(), 4096);
}

#[test]
fn a_failing_pool_creation_fails_the_open_and_leaves_nothing_behind() {
    let device = SimDevice::new(0, 4 * MIB).unwrap();
    device.inject_fault(FaultKind::PoolCreate, 1);
    let cfg = Config { backend: xlog_cuda::Backend::Sim, budget_bytes: MIB, arena: false, ..Config::default() };
    match Runtime::build(device.clone(), &cfg) {
        Err(ResourceError::Driver(m)) => assert!(m.contains("memory pool creation"), "{m}"),
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("the open must fail"),
    }
    assert_eq!(device.bytes_in_use(), 0);
    // The next open works.
    let rt = std::sync::Arc::new(Runtime::build(device.clone(), &cfg).unwrap());
    let s = rt.acquire_stream().unwrap();
    let b = rt.allocate(1000, s, "after").unwrap();
    rt.deallocate(&b.id).unwrap();
    rt.close().unwrap();
    assert_eq!(device.bytes_in_use(), 0, "close trims the cache");
}
