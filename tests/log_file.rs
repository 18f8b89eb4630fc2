//! The CSV log as a record a user can rebuild the runtime's memory from
//! (issue 18, item 4): runtimes sharing one path append and never truncate
//! each other; refusals are rows with the reason; memory taken from and
//! given back to the driver is logged, so live, cached and pending bytes
//! rebuilt from the log equal the runtime's own stats. And a record that
//! survives a crash (issue 26, item 1): a process killed right after a
//! refusal, never closing its runtime, leaves every row in the file.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

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
    rt.reap().unwrap(); // retires what completed (retire rows)
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
    a.reap().unwrap();
    let b = Runtime::open(1, &two_devices).unwrap();
    let sb = b.acquire_stream().unwrap();
    let mut mine = vec![];
    for i in 0..200u64 {
        // Interleaved rows from both, each row written as it is made.
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

/// Set (to `MODE|PATH`) in the child process of the crash tests.
const CRASH_CHILD: &str = "XLOG_LOG_FILE_CRASH_CHILD";

/// The child half of the crash tests: three blocks, a refusal by the
/// budget, then the end the parent asked for — `exit` leaves at once
/// (no destructor runs, nothing is closed), `kill` says so on stdout and
/// waits for the parent's SIGKILL.
#[test]
#[ignore = "run by the crash tests below in a child process"]
fn crash_child() {
    let Some(spec) = std::env::var_os(CRASH_CHILD) else { return };
    let spec = spec.into_string().unwrap();
    let (mode, path) = spec.split_once('|').unwrap();
    let rt = Runtime::open(0, &config(Path::new(path), MIB, true, AllocatorKind::Async)).unwrap();
    let s = rt.acquire_stream().unwrap();
    let blocks: Vec<_> = (0..3).map(|i| rt.allocate(256 * KIB, s, &format!("kept {i}")).unwrap()).collect();
    let err = rt.allocate(512 * KIB, s, "refused").unwrap_err();
    assert!(matches!(err, ResourceError::OutOfBudget { .. }), "{err}");
    if mode == "exit" {
        std::process::exit(3);
    }
    println!("refused|{}", blocks.len());
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Run `crash_child` in `mode` and return the log it left and how it ended.
fn crash_log(mode: &str) -> (String, std::process::ExitStatus) {
    let path = temp_path(&format!("crash-{mode}"), "csv");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CRASH_CHILD, format!("{mode}|{}", path.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    if mode == "kill" {
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let ready = stdout.lines().map_while(Result::ok).any(|l| l.contains("refused|3"));
        assert!(ready, "the child ended before its refusal");
        // SIGKILL: nothing of the child's runs after this.
        child.kill().unwrap();
    }
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    (text, status)
}

/// What a crashed child's log must hold: the header, the three blocks'
/// rows (their memory rebuilt from the log), the refusal with its numbers,
/// and nothing of a close.
fn check_crash_log(text: &str, what: &str) {
    let (header, lines) = parse_log(text);
    assert_eq!(header, HEADER, "{what}: {text}");
    let allocated: Vec<&str> = lines.iter().filter(|l| l.action == "allocate").map(|l| l.tag.as_str()).collect();
    assert_eq!(allocated, ["kept 0", "kept 1", "kept 2"], "{what}: {text}");
    let refusals: Vec<&LogLine> = lines.iter().filter(|l| l.action == "allocate failure").collect();
    assert_eq!(refusals.len(), 1, "{what}: the refusal row: {text}");
    assert_eq!((refusals[0].size, refusals[0].tag.as_str()), (512 * KIB, "refused"), "{what}");
    for needle in ["out of budget", "requested 524288", "live 786432", "limit 1048576"] {
        assert!(refusals[0].detail.contains(needle), "{what}: {needle:?} not in {:?}", refusals[0].detail);
    }
    assert!(lines.iter().all(|l| l.action != "leak" && l.action != "free"), "{what}: the runtime was never closed");
    let process = refusals[0].process;
    let mine: Vec<LogLine> = lines.iter().filter(|l| l.process == process).cloned().collect();
    let live: u64 = mine.iter().filter(|l| l.action == "allocate").map(|l| l.size).sum();
    assert_eq!(live, 3 * 256 * KIB, "{what}");
    let reserved: u64 = mine.iter().filter(|l| l.action == "reserve").map(|l| l.size).sum();
    assert!(reserved >= live, "{what}: the driver memory under the blocks is logged: {text}");
}

#[test]
fn the_log_survives_a_sigkill_right_after_a_refusal() {
    let (text, status) = crash_log("kill");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    check_crash_log(&text, "SIGKILL");
}

#[test]
fn the_log_survives_an_exit_without_close() {
    let (text, status) = crash_log("exit");
    assert_eq!(status.code(), Some(3), "{status:?}");
    check_crash_log(&text, "exit(3)");
}

#[test]
fn an_arena_reserve_row_says_where_the_pages_came_from() {
    // Eight 2 MiB blocks create a page each (under the soft cap); every
    // other one freed leaves four idle pages, three of them between live
    // ones. A 12 MiB block fits in none of the holes: it starts at the last
    // (mapped) and misses five pages, which take the held bytes past the
    // soft cap, so the three other idle pages are lent to it and only two
    // created, and its row says so.
    let path = temp_path("arena-reserve", "csv");
    let cfg = Config { arena: true, ..config(&path, 0, true, AllocatorKind::Async) };
    let rt = Runtime::open(0, &cfg).unwrap();
    let s = rt.acquire_stream().unwrap();
    let blocks: Vec<_> = (0..8).map(|_| rt.allocate(2 * MIB, s, "b").unwrap()).collect();
    for b in blocks.iter().skip(1).step_by(2) {
        rt.deallocate(&b.id).unwrap();
    }
    let big = rt.allocate(12 * MIB, s, "big").unwrap();
    let (text, lines) = rows(&path);
    let reserves: Vec<&LogLine> = lines.iter().filter(|l| l.action == "reserve").collect();
    assert!(reserves.len() >= 2, "{text}");
    for r in &reserves {
        assert!(r.detail.contains(" pages created: spare "), "a reserve row without its sources: {r:?}");
        let created: u64 = r.detail.split(' ').next().unwrap().parse().unwrap();
        assert_eq!(created * 2 * MIB, r.size, "the row's bytes are the pages it created: {r:?}");
    }
    assert!(!reserves[0].detail.contains("(passed)"), "the first page is under the cap: {:?}", reserves[0]);
    let last = reserves.last().unwrap();
    assert!(
        last.detail.starts_with("2 of 5 pages created: spare 0 lent 3 recycled 0; soft cap ") && last.detail.ends_with(" (passed)"),
        "the last miss lent the three idle pages: {last:?}"
    );
    for b in blocks.iter().step_by(2).chain([&big]) {
        rt.deallocate(&b.id).unwrap();
    }
    drop(rt);
    let _ = std::fs::remove_file(&path);
}
