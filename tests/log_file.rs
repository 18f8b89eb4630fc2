//! The CSV log as a record a user can rebuild the runtime's memory from
//! (issue 18, item 4): runtimes sharing one path append and never truncate
//! each other; refusals are rows with the reason; memory taken from and
//! given back to the driver is logged, so live, cached and pending bytes
//! rebuilt from the log equal the runtime's own stats.

mod common;

use std::path::Path;

use common::*;
use xlog_cuda::device::sim::FaultKind;
use xlog_cuda::{AllocatorKind, Backend, Config, ResourceError, Runtime};

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail";

fn config(log: &Path, budget: u64, cache: bool, allocator: AllocatorKind) -> Config {
    Config {
        backend: Backend::Sim,
        allocator,
        budget_bytes: budget,
        log_path: Some(log.to_path_buf()),
        cache,
        sim_capacity_bytes: 64 * MIB,
        // The two-runtime test opens sim devices 0 and 1.
        sim_devices: 2,
        arena: false,
        ..Config::default()
    }
}

/// Live, cached and pending bytes of `device` rebuilt from the log's rows
/// (the sums docs/frameworks.md gives), checking that no running total
/// ever goes below zero.
fn rebuild(lines: &[LogLine], device: i32) -> (u64, u64, u64) {
    let (mut live, mut cached, mut pending) = (0i64, 0i64, 0i64);
    for l in lines.iter().filter(|l| l.device == device && l.process == std::process::id()) {
        let n = l.size as i64;
        match l.action.as_str() {
            "reserve" => cached += n,
            "allocate" => (cached, live) = (cached - n, live + n),
            "free" => (live, cached) = (live - n, cached + n),
            "release" => (cached, pending) = (cached - n, pending + n),
            "retire" => pending -= n,
            "allocate failure" | "leak" => {}
            other => panic!("unknown action {other:?}"),
        }
        assert!(live >= 0 && cached >= 0 && pending >= 0, "negative running total at {l:?}: {live} {cached} {pending}");
    }
    (live as u64, cached as u64, pending as u64)
}

fn rows(path: &Path) -> (String, Vec<LogLine>) {
    parse_log(&std::fs::read_to_string(path).unwrap())
}

fn check_rebuild(rt: &Runtime, path: &Path, device: i32, what: &str) {
    rt.reap().unwrap(); // flushes the log
    let st = rt.stats().unwrap();
    let (_, lines) = rows(path);
    assert_eq!(rebuild(&lines, device), (st.live_bytes, st.cached_bytes, st.pending_bytes), "{what}: {st:?}");
}

#[test]
fn live_cached_and_pending_rebuilt_from_the_log_match_the_stats() {
    for (cache, allocator) in [(true, AllocatorKind::Async), (false, AllocatorKind::Async), (false, AllocatorKind::Direct)] {
        let path = temp_path("rebuild", "csv");
        let what = format!("cache {cache}, {allocator:?}");
        let rt = Runtime::open(0, &config(&path, 8 * MIB, cache, allocator)).unwrap();
        let (s, t) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
        let a = rt.allocate(300 * KIB, s, "a").unwrap();
        let b = rt.allocate(1000, t, "b").unwrap();
        let c = rt.allocate(2 * MIB, s, "c").unwrap();
        check_rebuild(&rt, &path, 0, &what);
        rt.deallocate(&a.id).unwrap();
        rt.deallocate(&c.id).unwrap();
        check_rebuild(&rt, &path, 0, &format!("{what}, after frees"));
        // A cache hit on the same stream, and one from another stream.
        let d = rt.allocate(2 * MIB, s, "d").unwrap();
        let e = rt.allocate(300 * KIB, t, "e").unwrap();
        check_rebuild(&rt, &path, 0, &format!("{what}, after reuse"));
        rt.deallocate(&d.id).unwrap();
        // Trim gives part of the cache back (release rows, then retire rows).
        let trimmed = rt.trim(100 * KIB).unwrap();
        if cache {
            assert!(trimmed.released >= 2 * MIB, "{what}: {trimmed:?}");
        }
        check_rebuild(&rt, &path, 0, &format!("{what}, after trim"));
        rt.deallocate(&b.id).unwrap();
        rt.deallocate(&e.id).unwrap();
        rt.drain().unwrap();
        check_rebuild(&rt, &path, 0, &format!("{what}, drained"));
        let st = rt.stats().unwrap();
        let (_, lines) = rows(&path);
        let count = |a: &str| lines.iter().filter(|l| l.action == a).count() as u64;
        assert_eq!((count("allocate"), count("free")), (st.allocations, st.deallocations), "{what}");
        if cache {
            assert!(count("release") >= 1 && count("retire") >= 1, "{what}: the trim's rows");
            assert_eq!(st.cache_misses, count("reserve"), "{what}: one reserve row per driver allocation");
        } else {
            assert_eq!(count("release"), st.deallocations, "{what}: every free went to the driver");
        }
        for s in [s, t] {
            rt.release_stream(s).unwrap();
        }
        rt.close().unwrap();
        let (_, lines) = rows(&path);
        assert_eq!(rebuild(&lines, 0), (0, 0, 0), "{what}: closed, everything given back and logged");
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn a_refusal_is_a_row_with_the_numbers() {
    let path = temp_path("refusal", "csv");
    let rt = Runtime::open(0, &config(&path, MIB, true, AllocatorKind::Async)).unwrap();
    let s = rt.acquire_stream().unwrap();
    let keep = rt.allocate(512 * KIB, s, "keep").unwrap();
    let err = rt.allocate(768 * KIB, s, "too big").unwrap_err();
    assert!(matches!(err, ResourceError::OutOfBudget { .. }), "{err}");
    // A driver failure under the budget is one too.
    rt.sim().unwrap().inject_fault(FaultKind::Alloc, 1);
    assert!(matches!(rt.allocate(64 * KIB, s, "faulty"), Err(ResourceError::Driver(_))));
    rt.reap().unwrap();
    let (header, lines) = rows(&path);
    assert_eq!(header, HEADER);
    let failures: Vec<&LogLine> = lines.iter().filter(|l| l.action == "allocate failure").collect();
    assert_eq!(failures.len() as u64, rt.stats().unwrap().failed_allocations);
    let f = failures[0];
    assert_eq!((f.pointer.as_str(), f.size, f.stream, f.tag.as_str()), ("0x0", 768 * KIB, s.0, "too big"));
    for needle in ["out of budget", "requested 786432", "live 524288", "cached 0", "pending 0", "limit 1048576"] {
        assert!(f.detail.contains(needle), "{needle:?} not in {:?}", f.detail);
    }
    assert_eq!((failures[1].size, failures[1].tag.as_str()), (64 * KIB, "faulty"));
    assert!(failures[1].detail.contains("injected"), "{:?}", failures[1].detail);
    rt.deallocate(&keep.id).unwrap();
    rt.release_stream(s).unwrap();
    rt.close().unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn two_runtimes_on_one_path_keep_both_their_rows() {
    let path = temp_path("shared", "csv");
    // Someone else's rows already there are kept too (and get no second header).
    std::fs::write(&path, format!("{HEADER}\n1,00:00:00.000001,allocate,0x10,512,1,earlier,5,1,\n")).unwrap();
    // Two sim devices, as two GPUs of one process would be.
    let two_devices = Config { sim_devices: 2, ..config(&path, 0, true, AllocatorKind::Async) };
    let a = Runtime::open(0, &two_devices).unwrap();
    let sa = a.acquire_stream().unwrap();
    let x = a.allocate(4096, sa, "dev0").unwrap();
    a.reap().unwrap(); // written before the second open
    let b = Runtime::open(1, &two_devices).unwrap();
    let sb = b.acquire_stream().unwrap();
    let mut mine = vec![];
    for i in 0..200u64 {
        // Interleaved rows from both, in batches flushed by reaps.
        let y = b.allocate(512 * (1 + i % 7), sb, "dev1").unwrap();
        let z = a.allocate(1024 * (1 + i % 5), sa, "dev0").unwrap();
        mine.push((y.id, z.id));
        if i % 50 == 0 {
            a.reap().unwrap();
            b.reap().unwrap();
        }
    }
    for (y, z) in mine {
        b.deallocate(&y).unwrap();
        a.deallocate(&z).unwrap();
    }
    a.deallocate(&x.id).unwrap();
    for (rt, s) in [(&a, sa), (&b, sb)] {
        rt.reap().unwrap();
        rt.release_stream(s).unwrap();
    }
    let (sa_stats, sb_stats) = (a.stats().unwrap(), b.stats().unwrap());
    a.close().unwrap();
    b.close().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches("Thread,Time,Action").count(), 1, "one header");
    let (header, lines) = parse_log(&text);
    assert_eq!(header, HEADER);
    assert_eq!(lines[0].tag, "earlier", "the rows already in the file are kept");
    for (device, st, tag) in [(0, sa_stats, "dev0"), (1, sb_stats, "dev1")] {
        let of = |action: &str| {
            lines.iter().filter(|l| l.device == device && l.process == std::process::id() && l.action == action).count() as u64
        };
        assert_eq!((of("allocate"), of("free")), (st.allocations, st.deallocations), "device {device}");
        assert!(lines.iter().filter(|l| l.device == device && l.action == "allocate").all(|l| l.tag == tag));
        assert_eq!(rebuild(&lines, device), (0, 0, 0), "device {device}: closed");
    }
    let _ = std::fs::remove_file(&path);
}
