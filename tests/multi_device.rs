//! Several devices in one process, on the sim backend (docs/design.md
//! "Several devices"): a runtime per device with its own budget and stats,
//! blocks of one device used by streams of another once peer access is
//! enabled, frees that wait for the other device's readers, and handles
//! that are refused by the wrong device's runtime.
//!
//! Host callbacks stand in for kernels: they read and write block memory
//! (host memory on sim) in stream order, and gates hold a stream back so a
//! test can show that an ordering really holds (the wrong order would be
//! observed without it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use xlog_cuda::{Access, BlockUse, Config, ResourceError, Runtime, StreamId};

const MIB: u64 = 1 << 20;

fn config(devices: u32, budget: u64) -> Config {
    Config {
        backend: xlog_cuda::Backend::Sim,
        sim_capacity_bytes: 64 * MIB,
        budget_bytes: budget,
        sim_devices: devices,
        arena: false,
        ..Config::default()
    }
}

/// Runtimes of sim devices 0 and 1 with peer access enabled.
fn pair(budget: u64) -> (Arc<Runtime>, Arc<Runtime>) {
    let cfg = config(2, budget);
    let d0 = Runtime::open(0, &cfg).expect("open sim device 0");
    let d1 = Runtime::open(1, &cfg).expect("open sim device 1");
    d0.enable_peer_access(&d1).expect("enable peer access");
    (d0, d1)
}

/// A flag a host callback spins on until the test opens it.
#[derive(Clone, Default)]
struct Gate(Arc<AtomicBool>);

impl Gate {
    fn open(&self) {
        self.0.store(true, Ordering::Release);
    }
    fn wait(&self) {
        while !self.0.load(Ordering::Acquire) {
            thread::sleep(Duration::from_millis(1));
        }
    }
}

fn read_u64(rt: &Runtime, ptr: u64) -> u64 {
    rt.sim().expect("sim runtime").read_u64(ptr).expect("read sim memory")
}

fn write_u64(rt: &Runtime, ptr: u64, value: u64) {
    rt.sim().expect("sim runtime").write_u64(ptr, value).expect("write sim memory")
}

/// Queue on `stream` of `rt` a callback that waits for `gate`, then
/// stores `value` at `ptr` (memory of `owner`).
fn gated_write(rt: &Runtime, stream: StreamId, gate: &Gate, owner: &Arc<Runtime>, ptr: u64, value: u64) {
    let (gate, owner) = (gate.clone(), owner.clone());
    rt.enqueue_host(stream, Box::new(move || {
        gate.wait();
        write_u64(&owner, ptr, value);
    }))
    .unwrap();
}

/// Queue on `stream` of `rt` a callback that waits for `gate`, then reads
/// `ptr` (memory of `owner`) into `seen`.
fn gated_read(rt: &Runtime, stream: StreamId, gate: &Gate, owner: &Arc<Runtime>, ptr: u64, seen: &Arc<AtomicU64>) {
    let (gate, owner, seen) = (gate.clone(), owner.clone(), seen.clone());
    rt.enqueue_host(stream, Box::new(move || {
        gate.wait();
        seen.store(read_u64(&owner, ptr), Ordering::Release);
    }))
    .unwrap();
}

fn expect_invalid_naming<T: std::fmt::Debug>(r: Result<T, ResourceError>, needles: &[&str], what: &str) {
    match r {
        Err(ResourceError::InvalidArgument(m)) => {
            for n in needles {
                assert!(m.contains(n), "{what}: message lacks {n:?}: {m}");
            }
        }
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

fn expect_unsatisfiable_naming<T: std::fmt::Debug>(r: Result<T, ResourceError>, needles: &[&str], what: &str) {
    match r {
        Err(ResourceError::UnsatisfiableDependency(m)) => {
            for n in needles {
                assert!(m.contains(n), "{what}: message lacks {n:?}: {m}");
            }
        }
        other => panic!("{what}: expected UnsatisfiableDependency, got {other:?}"),
    }
}

#[test]
fn ordinals_past_the_sim_device_count_are_no_device() {
    let one = config(1, 0);
    let d0 = Runtime::open(0, &one).unwrap();
    match Runtime::open(1, &one).map(|_| ()) {
        Err(ResourceError::NoDevice(m)) => assert!(m.contains("has 1 device(s)"), "{m}"),
        other => panic!("ordinal 1 of 1 sim device: {other:?}"),
    }
    let two = config(2, 0);
    let d1 = Runtime::open(1, &two).unwrap();
    match Runtime::open(2, &two).map(|_| ()) {
        Err(ResourceError::NoDevice(m)) => assert!(m.contains("ordinal 2") && m.contains("has 2 device(s)"), "{m}"),
        other => panic!("ordinal 2 of 2 sim devices: {other:?}"),
    }
    assert!(matches!(Runtime::open(-1, &two).map(|_| ()), Err(ResourceError::InvalidArgument(_))));
    assert_eq!((d0.device().ordinal(), d1.device().ordinal()), (0, 1));
    d0.close().unwrap();
    d1.close().unwrap();
}

#[test]
fn a_block_of_device_0_is_written_on_device_0_and_read_on_devices_1_and_0_in_order() {
    let (d0, d1) = pair(0);
    let (s0, s0b) = (d0.acquire_stream().unwrap(), d0.acquire_stream().unwrap());
    let s1 = d1.acquire_stream().unwrap();
    let x = d0.allocate(4096, s0, "x").unwrap().id;
    write_u64(&d0, x.ptr, 1);

    // The writer on device 0 is held back: readers that did not wait for
    // it would read 1.
    let writer_gate = Gate::default();
    d0.prepare(&x, s0, Access::Write).unwrap();
    gated_write(&d0, s0, &writer_gate, &d0, x.ptr, 42);
    d0.finish(&x, s0, Access::Write).unwrap();

    let open = Gate::default();
    open.open();
    let (seen1, seen0) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    // Device 1's stream, on device 0's runtime (the block's).
    d0.prepare(&x, s1, Access::Read).unwrap();
    gated_read(&d1, s1, &open, &d0, x.ptr, &seen1);
    d0.finish(&x, s1, Access::Read).unwrap();
    d0.prepare(&x, s0b, Access::Read).unwrap();
    gated_read(&d0, s0b, &open, &d0, x.ptr, &seen0);
    d0.finish(&x, s0b, Access::Read).unwrap();

    thread::sleep(Duration::from_millis(30));
    assert_eq!(seen1.load(Ordering::Acquire), 0, "device 1 read before device 0's write ran");
    writer_gate.open();
    d1.synchronize(s1).unwrap();
    d0.synchronize(s0b).unwrap();
    assert_eq!(seen1.load(Ordering::Acquire), 42, "device 1's read did not see device 0's write");
    assert_eq!(seen0.load(Ordering::Acquire), 42);
    assert_eq!(d0.peer_bridges(), 1, "one bridge for device 1's stream");
    d0.deallocate(&x).unwrap();
    assert!(d0.close().unwrap().leaked.is_empty());
    assert!(d1.close().unwrap().leaked.is_empty());
}

#[test]
fn the_same_launch_without_prepare_races_so_the_ordering_test_can_fail() {
    let (d0, d1) = pair(0);
    let s0 = d0.acquire_stream().unwrap();
    let s1 = d1.acquire_stream().unwrap();
    let x = d0.allocate(4096, s0, "x").unwrap().id;
    write_u64(&d0, x.ptr, 1);
    let writer_gate = Gate::default();
    gated_write(&d0, s0, &writer_gate, &d0, x.ptr, 42);
    let open = Gate::default();
    open.open();
    let seen = Arc::new(AtomicU64::new(0));
    gated_read(&d1, s1, &open, &d0, x.ptr, &seen);
    d1.synchronize(s1).unwrap();
    assert_eq!(seen.load(Ordering::Acquire), 1, "without prepare device 1 reads the old value");
    writer_gate.open();
    d0.synchronize(s0).unwrap();
    d0.deallocate(&x).unwrap();
    d0.close().unwrap();
    d1.close().unwrap();
}

#[test]
fn a_free_on_device_0_waits_for_device_1_still_reading() {
    for cache in [true, false] {
        let (d0, d1) = {
            let cfg = Config { cache, ..config(2, 0) };
            let d0 = Runtime::open(0, &cfg).unwrap();
            let d1 = Runtime::open(1, &cfg).unwrap();
            d0.enable_peer_access(&d1).unwrap();
            (d0, d1)
        };
        let s0 = d0.acquire_stream().unwrap();
        let s1 = d1.acquire_stream().unwrap();
        let x = d0.allocate(1 << 16, s0, "x").unwrap().id;
        write_u64(&d0, x.ptr, 7);

        // Device 1 reads x, held back by a gate.
        let reader_gate = Gate::default();
        let seen = Arc::new(AtomicU64::new(0));
        d0.prepare(&x, s1, Access::Read).unwrap();
        gated_read(&d1, s1, &reader_gate, &d0, x.ptr, &seen);
        d0.finish(&x, s1, Access::Read).unwrap();

        // Device 0 frees x while the read is still queued.
        d0.deallocate(&x).unwrap();
        if cache {
            // The cache hands the same memory straight back on the
            // allocation stream; its new owner's write must wait for the
            // read, since the free made the stream wait for it.
            let y = d0.allocate(1 << 16, s0, "y").unwrap().id;
            assert_eq!(y.ptr, x.ptr, "the cache reuses x's memory");
            let wrote = Arc::new(AtomicBool::new(false));
            let (owner, flag) = (d0.clone(), wrote.clone());
            d0.enqueue_host(s0, Box::new(move || {
                write_u64(&owner, y.ptr, 99);
                flag.store(true, Ordering::Release);
            }))
            .unwrap();
            thread::sleep(Duration::from_millis(40));
            assert!(!wrote.load(Ordering::Acquire), "x's next owner wrote while device 1 still read x");
            reader_gate.open();
            d0.synchronize(s0).unwrap();
            assert_eq!(seen.load(Ordering::Acquire), 7, "device 1 read the next owner's data");
            d0.deallocate(&y).unwrap();
        } else {
            // Freed to the driver: the memory stays held until the read is
            // done, so nothing can be reaped yet.
            thread::sleep(Duration::from_millis(40));
            assert_eq!(d0.reap().unwrap(), 0, "the free completed while device 1 still read");
            assert!(d0.stats().unwrap().pending_bytes > 0);
            reader_gate.open();
            d0.drain().unwrap();
            assert_eq!(d0.stats().unwrap().pending_bytes, 0);
            assert_eq!(seen.load(Ordering::Acquire), 7);
        }
        d1.synchronize(s1).unwrap();
        d0.close().unwrap();
        d1.close().unwrap();
    }
}

#[test]
fn a_write_on_device_1_orders_later_reads_and_writes_on_device_0() {
    let (d0, d1) = pair(0);
    let s0 = d0.acquire_stream().unwrap();
    let s1 = d1.acquire_stream().unwrap();
    let x = d0.allocate(4096, s0, "x").unwrap().id;
    write_u64(&d0, x.ptr, 1);
    let writer_gate = Gate::default();
    // prepare_all / finish_all with two blocks, written from device 1.
    let y = d0.allocate(4096, s0, "y").unwrap().id;
    let uses = [BlockUse { block: x, access: Access::Write }, BlockUse { block: y, access: Access::Read }];
    d0.prepare_all(s1, &uses).unwrap();
    gated_write(&d1, s1, &writer_gate, &d0, x.ptr, 5);
    d0.finish_all(s1, &uses).unwrap();
    let open = Gate::default();
    open.open();
    let seen = Arc::new(AtomicU64::new(0));
    d0.prepare(&x, s0, Access::Read).unwrap();
    gated_read(&d0, s0, &open, &d0, x.ptr, &seen);
    d0.finish(&x, s0, Access::Read).unwrap();
    thread::sleep(Duration::from_millis(30));
    assert_eq!(seen.load(Ordering::Acquire), 0, "device 0 read before device 1's write");
    writer_gate.open();
    d0.synchronize(s0).unwrap();
    assert_eq!(seen.load(Ordering::Acquire), 5);
    d0.deallocate(&x).unwrap();
    d0.deallocate(&y).unwrap();
    d0.close().unwrap();
    d1.close().unwrap();
}

#[test]
fn budgets_and_stats_are_per_device() {
    let cfg0 = config(2, MIB);
    let cfg1 = config(2, 4 * MIB);
    let d0 = Runtime::open(0, &cfg0).unwrap();
    let d1 = Runtime::open(1, &cfg1).unwrap();
    d0.enable_peer_access(&d1).unwrap();
    let (s0, s1) = (d0.acquire_stream().unwrap(), d1.acquire_stream().unwrap());
    let a = d0.allocate(MIB, s0, "a").unwrap().id;
    match d0.allocate(MIB, s0, "over") {
        Err(ResourceError::OutOfBudget { limit, .. }) => assert_eq!(limit, MIB),
        other => panic!("device 0 over its budget: {other:?}"),
    }
    // Device 1's budget does not see device 0's bytes.
    let b = d1.allocate(3 * MIB, s1, "b").unwrap().id;
    let (st0, st1) = (d0.stats().unwrap(), d1.stats().unwrap());
    assert_eq!((st0.budget_limit, st1.budget_limit), (MIB, 4 * MIB));
    assert_eq!((st0.live_bytes, st1.live_bytes), (MIB, 3 * MIB));
    assert_eq!((st0.allocations, st1.allocations), (1, 1));
    assert_eq!((st0.failed_allocations, st1.failed_allocations), (1, 0));
    assert_eq!((st0.budget_remaining, st1.budget_remaining), (0, MIB));
    // A cross-device use moves no bytes between the devices.
    d0.prepare(&a, s1, Access::Read).unwrap();
    d0.finish(&a, s1, Access::Read).unwrap();
    assert_eq!(d1.stats().unwrap().live_bytes, 3 * MIB);
    d0.deallocate(&a).unwrap();
    d1.deallocate(&b).unwrap();
    d0.close().unwrap();
    d1.close().unwrap();
}

#[test]
fn handles_of_one_device_are_refused_by_the_other_naming_both() {
    let (d0, d1) = pair(0);
    let (s0, s1) = (d0.acquire_stream().unwrap(), d1.acquire_stream().unwrap());
    let x = d0.allocate(4096, s0, "x").unwrap().id;
    let needles = ["device 0", "device 1"];
    expect_invalid_naming(d1.validate(&x), &needles, "validate on device 1");
    expect_invalid_naming(d1.deallocate(&x), &needles, "deallocate on device 1");
    expect_invalid_naming(d1.prepare(&x, s1, Access::Read), &needles, "prepare on device 1");
    expect_invalid_naming(d1.finish(&x, s1, Access::Read), &needles, "finish on device 1");
    let uses = [BlockUse { block: x, access: Access::Read }];
    expect_invalid_naming(d1.prepare_all(s1, &uses), &needles, "prepare_all on device 1");
    expect_invalid_naming(d1.finish_all(s0, &uses), &needles, "finish_all on device 1 with device 0's stream");
    // Nothing changed: x is still live on device 0.
    d0.validate(&x).unwrap();
    assert_eq!(d1.stats().unwrap().deallocations, 0);

    // Once freed, device 0 calls it stale; device 1 still says whose it was.
    d0.deallocate(&x).unwrap();
    assert!(matches!(d0.validate(&x), Err(ResourceError::UseAfterFree { .. })));
    assert!(matches!(d0.prepare(&x, s1, Access::Read), Err(ResourceError::UseAfterFree { .. })));
    assert!(matches!(d0.finish(&x, s1, Access::Read), Err(ResourceError::UseAfterFree { .. })));
    expect_invalid_naming(d1.validate(&x), &needles, "stale handle of device 0 on device 1");
    d0.close().unwrap();
    d1.close().unwrap();
}

#[test]
fn streams_of_a_device_without_peer_access_are_unsatisfiable() {
    let cfg = config(2, 0);
    let d0 = Runtime::open(0, &cfg).unwrap();
    let d1 = Runtime::open(1, &cfg).unwrap();
    let (s0, s1) = (d0.acquire_stream().unwrap(), d1.acquire_stream().unwrap());
    let x = d0.allocate(4096, s0, "x").unwrap().id;
    let needles = ["device 0", "device 1", "peer access"];
    // Peer access not enabled yet.
    expect_unsatisfiable_naming(d0.prepare(&x, s1, Access::Read), &needles, "prepare before enable");
    expect_unsatisfiable_naming(d0.finish(&x, s1, Access::Read), &needles, "finish before enable");
    // A pair the hardware cannot connect.
    xlog_cuda::device::sim_platform::deny_peer(d0.sim().unwrap(), d1.sim().unwrap());
    expect_unsatisfiable_naming(d0.enable_peer_access(&d1), &needles, "enable on a pair without peer capability");
    expect_unsatisfiable_naming(d1.enable_peer_access(&d0), &needles, "enable the other way");
    let uses = [BlockUse { block: x, access: Access::Write }];
    expect_unsatisfiable_naming(d0.prepare_all(s1, &uses), &needles, "prepare_all without peer access");
    // Nothing was queued or recorded.
    assert_eq!(d0.peer_bridges(), 0);
    assert_eq!(d0.usage().cross_stream_waits, 0);
    // A stream no runtime knows keeps the single-device error.
    assert!(matches!(d0.prepare(&x, StreamId(u32::MAX - 7), Access::Read), Err(ResourceError::InvalidArgument(_))));
    d0.deallocate(&x).unwrap();
    d0.close().unwrap();
    d1.close().unwrap();
}

#[test]
fn enabling_peer_access_is_idempotent_and_needs_two_devices() {
    let cfg = config(3, 0);
    let d0 = Runtime::open(0, &cfg).unwrap();
    let d1 = Runtime::open(1, &cfg).unwrap();
    let also_0 = Runtime::open(0, &cfg).unwrap();
    d0.enable_peer_access(&d1).unwrap();
    d1.enable_peer_access(&d0).unwrap();
    d0.enable_peer_access(&d1).unwrap();
    expect_invalid_naming(d0.enable_peer_access(&d0), &["device 0"], "a runtime with itself");
    expect_invalid_naming(d0.enable_peer_access(&also_0), &["device 0"], "two runtimes of one device");
    // Peer access is per pair: device 2 is not a peer of device 0.
    let d2 = Runtime::open(2, &cfg).unwrap();
    let s2 = d2.acquire_stream().unwrap();
    let s0 = d0.acquire_stream().unwrap();
    let x = d0.allocate(256, s0, "x").unwrap().id;
    expect_unsatisfiable_naming(d0.prepare(&x, s2, Access::Read), &["device 2", "device 0"], "unpaired device 2");
    // A closed peer is gone: its streams are unknown again.
    let s1 = d1.acquire_stream().unwrap();
    d0.prepare(&x, s1, Access::Read).unwrap();
    d0.finish(&x, s1, Access::Read).unwrap();
    d1.close().unwrap();
    assert!(d0.prepare(&x, s1, Access::Read).is_err());
    assert!(d0.enable_peer_access(&d1).is_err(), "a closed runtime cannot become a peer");
    d0.deallocate(&x).unwrap();
    d0.close().unwrap();
    also_0.close().unwrap();
    d2.close().unwrap();
}

#[test]
fn closing_the_blocks_device_first_waits_for_the_peer_and_leaves_it_working() {
    let (d0, d1) = pair(0);
    let s0 = d0.acquire_stream().unwrap();
    let s1 = d1.acquire_stream().unwrap();
    let x = d0.allocate(4096, s0, "x").unwrap().id;
    let gate = Gate::default();
    let seen = Arc::new(AtomicU64::new(0));
    write_u64(&d0, x.ptr, 3);
    d0.prepare(&x, s1, Access::Read).unwrap();
    gated_read(&d1, s1, &gate, &d0, x.ptr, &seen);
    d0.finish(&x, s1, Access::Read).unwrap();
    let opener = {
        let gate = gate.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(40));
            gate.open();
        })
    };
    // x leaks: close frees it, which waits for device 1's read.
    let report = d0.close().unwrap();
    assert_eq!(report.leaked.len(), 1);
    assert_eq!(seen.load(Ordering::Acquire), 3, "device 0 closed before device 1's read of its block");
    opener.join().unwrap();
    // Device 1 is untouched and keeps working.
    let y = d1.allocate(4096, s1, "y").unwrap().id;
    d1.deallocate(&y).unwrap();
    d1.synchronize(s1).unwrap();
    d1.close().unwrap();
}

#[test]
fn many_threads_use_blocks_across_two_devices() {
    let (d0, d1) = pair(0);
    let mut workers = Vec::new();
    for t in 0..4u64 {
        let (d0, d1) = (d0.clone(), d1.clone());
        workers.push(thread::spawn(move || {
            let s0 = d0.acquire_stream().unwrap();
            let s1 = d1.acquire_stream().unwrap();
            for i in 0..200u64 {
                let x = d0.allocate(4096, s0, "x").unwrap().id;
                d0.prepare(&x, s0, Access::Write).unwrap();
                let owner = d0.clone();
                d0.enqueue_host(s0, Box::new(move || write_u64(&owner, x.ptr, t * 1000 + i))).unwrap();
                d0.finish(&x, s0, Access::Write).unwrap();
                let seen = Arc::new(AtomicU64::new(0));
                d0.prepare(&x, s1, Access::Read).unwrap();
                let (owner, s) = (d0.clone(), seen.clone());
                d1.enqueue_host(s1, Box::new(move || s.store(read_u64(&owner, x.ptr), Ordering::Release))).unwrap();
                d0.finish(&x, s1, Access::Read).unwrap();
                d0.deallocate(&x).unwrap();
                if i % 50 == 49 {
                    d1.synchronize(s1).unwrap();
                    assert_eq!(seen.load(Ordering::Acquire), t * 1000 + i);
                }
            }
            d1.synchronize(s1).unwrap();
        }));
    }
    for w in workers {
        w.join().unwrap();
    }
    let st = d0.stats().unwrap();
    assert_eq!((st.allocations, st.deallocations, st.live_blocks), (800, 800, 0));
    assert_eq!(d1.stats().unwrap().allocations, 0);
    d0.close().unwrap();
    d1.close().unwrap();
}
