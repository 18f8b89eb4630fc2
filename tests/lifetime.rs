//! Runtime lifetime through the C ABI (the exported `xlog_*` functions,
//! called as Rust functions):
//!
//! - closing a runtime while other threads are still calling into it: every
//!   call returns a status (never a panic, abort or hang), calls that start
//!   after the close returned fail with XLOG_ERR_INVALID_ARGUMENT, and the
//!   close reports exactly the blocks the threads still held;
//! - the leak report of a close, as printed on stderr (read from a child
//!   process), written to the CSV log and returned by
//!   `xlog_runtime_close_report`, all three naming the same blocks.

use std::ffi::{c_char, c_void, CStr, CString};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use xlog_cuda::ffi::api::*;
use xlog_cuda::ffi::types::*;

/// An `xlog_stats` ready for `xlog_get_stats`: zeroed, with `struct_size`
/// set to `sizeof(xlog_stats)` as the C ABI asks of every caller.
fn sized_stats() -> xlog_stats {
    // SAFETY: xlog_stats is plain integers; all zeros is a valid value.
    let mut s: xlog_stats = unsafe { std::mem::zeroed() };
    s.struct_size = std::mem::size_of::<xlog_stats>() as u32;
    s
}

/// A runtime handle that threads may share: the C ABI makes the handle a
/// token that every call checks, so it is plain data here.
#[derive(Copy, Clone)]
struct Handle(usize);

impl Handle {
    fn rt(self) -> *mut xlog_runtime {
        self.0 as *mut xlog_runtime
    }
}

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: `buf` has 1024 writable bytes.
    let n = unsafe { xlog_last_error_message(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    buf.truncate(n.min(1023));
    String::from_utf8_lossy(&buf).into_owned()
}

fn status_name(s: xlog_status) -> String {
    // SAFETY: never NULL, a static C string.
    unsafe { CStr::from_ptr(xlog_status_name(s)) }.to_string_lossy().into_owned()
}

fn sim_config(allocator: xlog_allocator, budget: u64, pool: u32) -> xlog_config {
    let mut cfg = std::mem::MaybeUninit::<xlog_config>::zeroed();
    // SAFETY: writable storage for one config, fully initialised after.
    let mut cfg = unsafe {
        xlog_config_init(cfg.as_mut_ptr());
        cfg.assume_init()
    };
    cfg.backend = XLOG_BACKEND_SIM;
    cfg.allocator = allocator;
    cfg.budget_bytes = budget;
    cfg.wait_on_pressure = u8::from(budget > 0);
    cfg.stream_pool_size = pool;
    cfg.sim_capacity_bytes = 64 << 20;
    cfg.log_path = std::ptr::null();
    cfg
}

fn open(cfg: &xlog_config) -> Handle {
    let mut rt = std::ptr::null_mut();
    // SAFETY: valid config and out-pointer.
    let st = unsafe { xlog_runtime_open(0, cfg, &mut rt) };
    assert_eq!(st, XLOG_OK, "open: {}", last_error());
    Handle(rt as usize)
}

fn acquire(h: Handle) -> xlog_stream {
    let mut s = 0;
    let st = xlog_stream_acquire(h.rt(), &mut s);
    assert_eq!(st, XLOG_OK, "acquire: {}", last_error());
    s
}

fn allocate(h: Handle, bytes: u64, s: xlog_stream, tag: &str) -> (xlog_status, xlog_block) {
    let tag = CString::new(tag).unwrap();
    let mut b = xlog_block { ptr: std::ptr::null_mut(), size: 0, generation: 0, stream: 0, device: 0 };
    // SAFETY: live C string and valid out-pointer.
    let st = unsafe { xlog_allocate(h.rt(), bytes, s, tag.as_ptr(), &mut b) };
    (st, b)
}

// ===================================================================== //
// Close while other threads call in                                      //
// ===================================================================== //

/// Shared by the threads of one trial.
struct Trial {
    handle: Handle,
    direct: bool,
    close_started: AtomicBool,
    close_done: AtomicBool,
    /// Host callbacks that ran; each also calls `xlog_get_stats` from the
    /// stream worker, racing the close.
    callbacks_run: AtomicU64,
    /// Statuses those callbacks got other than STREAM_MISUSE (every call
    /// from a host callback is refused, before or during the close).
    callback_bad_status: AtomicU64,
}

extern "C" fn callback(user: *mut c_void) {
    // SAFETY: `user` is the `Trial` of the worker that enqueued it, kept
    // alive (an Arc in the test) until after the close, which runs every
    // queued callback before it returns.
    let trial = unsafe { &*(user as *const Trial) };
    let mut stats = sized_stats();
    let st = xlog_get_stats(trial.handle.rt(), &mut stats);
    if st != XLOG_ERR_STREAM_MISUSE {
        trial.callback_bad_status.fetch_add(1, Ordering::SeqCst);
    }
    trial.callbacks_run.fetch_add(1, Ordering::SeqCst);
}

/// What one worker left behind.
#[derive(Default)]
struct WorkerResult {
    /// Blocks it allocated and never freed successfully (close frees them
    /// and must report them as leaks): (generation, size).
    live: Vec<(u64, u64)>,
    callbacks_enqueued: u64,
    calls: u64,
    calls_after_close: u64,
}

impl Trial {
    /// Check one call's status. Before the close every call succeeds or
    /// fails for a reason the worker's own state explains (`also`); once
    /// the close has begun a call may fail with INVALID_ARGUMENT naming the
    /// closed runtime; a call that started after the close returned must.
    fn check(&self, what: &str, started_after_close: bool, st: xlog_status, also: &[xlog_status], r: &mut WorkerResult) {
        r.calls += 1;
        let msg = last_error();
        if started_after_close {
            r.calls_after_close += 1;
            assert_eq!(
                st,
                XLOG_ERR_INVALID_ARGUMENT,
                "{what} after the close returned gave {} ({msg})",
                status_name(st)
            );
        }
        if st == XLOG_OK || also.contains(&st) {
            return;
        }
        assert_eq!(st, XLOG_ERR_INVALID_ARGUMENT, "{what} gave {} ({msg})", status_name(st));
        assert!(
            self.close_started.load(Ordering::SeqCst),
            "{what} failed with INVALID_ARGUMENT before the close began: {msg}"
        );
        assert!(
            msg.contains("has been closed") || msg.contains("is not open"),
            "{what}: INVALID_ARGUMENT during close should name the closed runtime: {msg}"
        );
    }
}

fn worker(trial: Arc<Trial>, own: xlog_stream, seed: u64) -> WorkerResult {
    let h = trial.handle;
    let rt = h.rt();
    let mut r = WorkerResult::default();
    let misuse: &[xlog_status] = if trial.direct { &[XLOG_ERR_STREAM_MISUSE] } else { &[] };
    let mut previous: Option<xlog_block> = None;
    let mut rounds_after_close = 0;
    let mut i = seed;
    while rounds_after_close < 2 {
        let after = trial.close_done.load(Ordering::SeqCst);
        if after {
            rounds_after_close += 1;
        }
        i += 1;
        let bytes = 256 * (1 + i % 8);

        let (st, block) = allocate(h, bytes, own, &format!("worker-{seed}"));
        trial.check("allocate", after, st, &[XLOG_ERR_OUT_OF_BUDGET], &mut r);
        let current = (st == XLOG_OK).then(|| {
            assert_eq!((block.size, block.stream), (bytes, own));
            r.live.push((block.generation, block.size));
            block
        });
        let user = Arc::as_ptr(&trial) as *mut c_void;
        let st = xlog_stream_enqueue_host(rt, own, Some(callback), user);
        trial.check("enqueue_host", after, st, &[], &mut r);
        if st == XLOG_OK {
            r.callbacks_enqueued += 1;
        }
        if let Some(b) = current.or(previous) {
            let st = xlog_prepare(rt, b, own, XLOG_ACCESS_WRITE);
            trial.check("prepare", after, st, misuse, &mut r);
            let st = xlog_finish(rt, b, own, XLOG_ACCESS_WRITE);
            trial.check("finish", after, st, misuse, &mut r);
        }

        let uses: Vec<xlog_use> = [current, previous]
            .into_iter()
            .flatten()
            .map(|block| xlog_use { block, access: XLOG_ACCESS_READ })
            .collect();
        // SAFETY: `uses` holds uses.len() initialised entries.
        let st = unsafe { xlog_prepare_all(rt, own, uses.as_ptr(), uses.len()) };
        trial.check("prepare_all", after, st, misuse, &mut r);
        // SAFETY: as above.
        let st = unsafe { xlog_finish_all(rt, own, uses.as_ptr(), uses.len()) };
        trial.check("finish_all", after, st, misuse, &mut r);
        if let Some(c) = current {
            let st = xlog_block_validate(rt, c);
            trial.check("validate", after, st, &[], &mut r);
        }

        // Free the block of the previous round: the worker keeps at most
        // two live blocks.
        if let Some(p) = previous.take() {
            let st = xlog_deallocate(rt, p);
            trial.check("deallocate", after, st, &[], &mut r);
            if st == XLOG_OK {
                r.live.retain(|x| x.0 != p.generation);
            }
        }
        previous = current;

        let mut reclaimed = 0u64;
        let st = xlog_reap(rt, &mut reclaimed);
        trial.check("reap", after, st, &[], &mut r);
        let mut stats = sized_stats();
        let st = xlog_get_stats(rt, &mut stats);
        trial.check("get_stats", after, st, &[], &mut r);
        if i % 4 == 0 {
            let mut extra = 0;
            let st = xlog_stream_acquire(rt, &mut extra);
            trial.check("stream_acquire", after, st, &[XLOG_ERR_POOL_EXHAUSTED], &mut r);
            if st == XLOG_OK {
                let st = xlog_stream_release(rt, extra);
                trial.check("stream_release", after, st, &[], &mut r);
            }
        }
        if i % 8 == 0 {
            let st = xlog_drain(rt, std::ptr::null_mut());
            trial.check("drain", after, st, &[], &mut r);
        }
        if i % 8 == 4 {
            let st = xlog_stream_synchronize(rt, own);
            trial.check("stream_synchronize", after, st, &[], &mut r);
        }
    }
    r
}

/// One trial: `threads` workers hammer a runtime, the main thread closes
/// it after `delay`. Returns the number of calls the workers made.
fn close_under_load(allocator: xlog_allocator, budget: u64, threads: usize, delay: Duration) -> (u64, u64) {
    let cfg = sim_config(allocator, budget, threads as u32 + 2);
    let h = open(&cfg);
    let trial = Arc::new(Trial {
        handle: h,
        direct: allocator == XLOG_ALLOCATOR_DIRECT,
        close_started: AtomicBool::new(false),
        close_done: AtomicBool::new(false),
        callbacks_run: AtomicU64::new(0),
        callback_bad_status: AtomicU64::new(0),
    });
    let (tx, rx) = mpsc::channel();
    for w in 0..threads {
        let own = acquire(h);
        let (trial, tx) = (trial.clone(), tx.clone());
        thread::Builder::new()
            .name(format!("lifetime-worker-{w}"))
            .spawn(move || {
                let r = worker(trial, own, 1000 * w as u64);
                let _ = tx.send(r);
            })
            .unwrap();
    }
    drop(tx);
    thread::sleep(delay);

    trial.close_started.store(true, Ordering::SeqCst);
    let (mut leaked_blocks, mut leaked_bytes) = (u64::MAX, u64::MAX);
    let st = xlog_runtime_close_report(h.rt(), &mut leaked_blocks, &mut leaked_bytes);
    assert_eq!(st, XLOG_OK, "close under load: {}", last_error());
    trial.close_done.store(true, Ordering::SeqCst);

    // Every worker must finish: a hang here is a deadlock between a call
    // (or a host callback calling in) and the close.
    let mut results = Vec::new();
    for _ in 0..threads {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(r) => results.push(r),
            Err(e) => panic!("a worker did not finish within 30 s of the close ({e}): deadlock"),
        }
    }
    let held: Vec<&(u64, u64)> = results.iter().flat_map(|r| r.live.iter()).collect();
    let held_bytes: u64 = held.iter().map(|b| b.1).sum();
    assert_eq!(
        (leaked_blocks, leaked_bytes),
        (held.len() as u64, held_bytes),
        "close must report exactly the blocks the workers still held"
    );
    let enqueued: u64 = results.iter().map(|r| r.callbacks_enqueued).sum();
    assert_eq!(trial.callbacks_run.load(Ordering::SeqCst), enqueued, "every accepted host callback ran by the close");
    assert_eq!(trial.callback_bad_status.load(Ordering::SeqCst), 0, "callbacks calling in were refused with STREAM_MISUSE");
    assert!(results.iter().all(|r| r.calls_after_close > 0), "every worker made calls after the close");

    // The closed handle stays dead for everyone.
    let (st, _) = allocate(h, 256, 1, "late");
    assert_eq!(st, XLOG_ERR_INVALID_ARGUMENT);
    assert_eq!(xlog_runtime_close(h.rt()), XLOG_ERR_INVALID_ARGUMENT, "a second close is refused");
    let calls = results.iter().map(|r| r.calls).sum();
    let after = results.iter().map(|r| r.calls_after_close).sum();
    (calls, after)
}

#[test]
fn close_while_threads_call_in_fails_their_calls_cleanly() {
    let configs = [
        (XLOG_ALLOCATOR_ASYNC, 0u64),
        (XLOG_ALLOCATOR_ASYNC, 6 * 1024), // a budget the workers press against
        (XLOG_ALLOCATOR_DIRECT, 0),
    ];
    let (mut calls, mut after) = (0, 0);
    for trial in 0..36u64 {
        let (allocator, budget) = configs[trial as usize % configs.len()];
        // Close at different points: at once, early, and well into the run.
        let delay = Duration::from_micros([0, 200, 1_000, 3_000, 8_000, 15_000][trial as usize % 6]);
        let (c, a) = close_under_load(allocator, budget, 4, delay);
        calls += c;
        after += a;
    }
    assert!(calls > after && after > 0, "calls {calls}, after close {after}");
}

/// Launch calls (prepare/finish, one block and whole launches) take no
/// call-gate pass: the tracker refuses them under its shard locks once close
/// began, and close takes each of those locks once before tearing anything
/// down. Here threads do nothing but launch calls over each other's blocks
/// (cross-stream waits and event records on every stream) while the main
/// thread closes: each call either succeeds or fails naming the closed
/// runtime, never with a driver error (a stream or event used after close
/// destroyed it), and every call after the close returned fails.
#[test]
fn launch_calls_racing_close_fail_cleanly() {
    for trial in 0..24u64 {
        let threads = 3usize;
        let h = open(&sim_config(XLOG_ALLOCATOR_ASYNC, 0, threads as u32 + 1));
        let streams: Vec<xlog_stream> = (0..threads).map(|_| acquire(h)).collect();
        let blocks: Vec<xlog_block> = streams
            .iter()
            .map(|&s| {
                let (st, b) = allocate(h, 4096, s, "launch");
                assert_eq!(st, XLOG_OK, "{}", last_error());
                b
            })
            .collect();
        let close_done = Arc::new(AtomicBool::new(false));
        let succeeded = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        for w in 0..threads {
            // Blocks travel as plain numbers (a block's pointer is not Send).
            let plain: Vec<(usize, u64, u64, xlog_stream, i32)> =
                blocks.iter().map(|b| (b.ptr as usize, b.size, b.generation, b.stream, b.device)).collect();
            let (close_done, succeeded, own) = (close_done.clone(), succeeded.clone(), streams[w]);
            workers.push(thread::spawn(move || {
                let rt = h.rt();
                let blocks: Vec<xlog_block> = plain
                    .iter()
                    .map(|&(ptr, size, generation, stream, device)| xlog_block {
                        ptr: ptr as *mut c_void,
                        size,
                        generation,
                        stream,
                        device,
                    })
                    .collect();
                let (mut ok, mut after) = (0u64, 0u64);
                for i in 0..u64::MAX {
                    let done = close_done.load(Ordering::SeqCst);
                    let b = blocks[(w + i as usize) % blocks.len()];
                    let access = if i % 3 == 0 { XLOG_ACCESS_WRITE } else { XLOG_ACCESS_READ };
                    let uses: Vec<xlog_use> = blocks.iter().map(|&block| xlog_use { block, access }).collect();
                    // Each call's message is read right after it.
                    let calls: [(&str, &dyn Fn() -> xlog_status); 4] = [
                        ("prepare", &|| xlog_prepare(rt, b, own, access)),
                        ("finish", &|| xlog_finish(rt, b, own, access)),
                        // SAFETY: `uses` holds uses.len() initialised entries.
                        ("prepare_all", &|| unsafe { xlog_prepare_all(rt, own, uses.as_ptr(), uses.len()) }),
                        // SAFETY: as above.
                        ("finish_all", &|| unsafe { xlog_finish_all(rt, own, uses.as_ptr(), uses.len()) }),
                    ];
                    for (what, call) in calls {
                        let st = call();
                        if st == XLOG_OK {
                            assert!(!done, "{what} succeeded after the close returned");
                            ok += 1;
                            succeeded.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        let msg = last_error();
                        assert_eq!(st, XLOG_ERR_INVALID_ARGUMENT, "{what}: {} {msg}", status_name(st));
                        assert!(
                            msg.contains("has been closed") || msg.contains("is not open"),
                            "{what} failed without naming the closed runtime: {msg}"
                        );
                    }
                    if done {
                        after += 1;
                        if after > 2 {
                            break;
                        }
                    }
                }
                ok
            }));
        }
        // Close at once, or once launch calls are running (then a little
        // later each trial).
        if trial % 6 != 0 {
            while succeeded.load(Ordering::Relaxed) == 0 {
                thread::yield_now();
            }
        }
        thread::sleep(Duration::from_micros(100 * (trial % 6)));
        let (mut leaked_blocks, mut leaked_bytes) = (0, 0);
        let st = xlog_runtime_close_report(h.rt(), &mut leaked_blocks, &mut leaked_bytes);
        assert_eq!(st, XLOG_OK, "close: {}", last_error());
        close_done.store(true, Ordering::SeqCst);
        let ok: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(leaked_blocks, threads as u64, "trial {trial}: the launch blocks were still live at the close");
        assert_eq!(ok, succeeded.load(Ordering::Relaxed));
    }
}

/// The same race through the Rust API, which can see the sim device: after
/// the close every byte of device memory is back.
#[test]
fn close_while_threads_call_in_returns_all_device_memory() {
    use xlog_cuda::{Access, AllocatorKind, Backend, Config, Runtime};
    for trial in 0..24u64 {
        let config = Config {
            backend: Backend::Sim,
            allocator: if trial % 2 == 0 { AllocatorKind::Async } else { AllocatorKind::Direct },
            sim_capacity_bytes: 16 << 20,
            stream_pool_size: 8,
            ..Config::default()
        };
        let rt = Runtime::open(0, &config).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for w in 0..3u64 {
            let (rt, stop) = (rt.clone(), stop.clone());
            let s = rt.acquire_stream().unwrap();
            workers.push(thread::spawn(move || {
                let mut held = Vec::new();
                let mut i = w;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let Ok(b) = rt.allocate(512 * (1 + i % 4), s, "held") else { break };
                    let _ = rt.prepare(&b.id, s, Access::Write);
                    let _ = rt.finish(&b.id, s, Access::Write);
                    held.push(b.id);
                    if held.len() > 3 {
                        let old = held.remove(0);
                        if rt.deallocate(&old).is_err() {
                            held.push(old);
                            break;
                        }
                    }
                    let _ = rt.reap();
                }
                held.len()
            }));
        }
        thread::sleep(Duration::from_micros(500 * (trial % 5)));
        let report = rt.close().unwrap();
        stop.store(true, Ordering::SeqCst);
        let still_held: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(report.leaked.len(), still_held, "trial {trial}: close reports exactly the blocks the workers held");
        let sim = rt.sim().unwrap();
        assert_eq!(sim.bytes_in_use(), 0, "trial {trial}: the sim device got every byte back");
        let u = rt.usage();
        assert_eq!((u.live_bytes, u.pending_bytes, u.live_blocks, u.pending_blocks), (0, 0, 0, 0));
    }
}

// ===================================================================== //
// Leak reports                                                           //
// ===================================================================== //

const CHILD_ENV: &str = "XLOG_LIFETIME_LEAK_CHILD_LOG";

/// The child half of `close_reports_each_leak_on_stderr_in_the_log_and_the_report`:
/// runs only in a child process that the parent starts with `CHILD_ENV`
/// set to the log path; prints what it allocated and what close reported.
#[test]
#[ignore = "run by close_reports_each_leak_on_stderr_in_the_log_and_the_report in a child process"]
fn leak_report_child() {
    let Some(log) = std::env::var_os(CHILD_ENV) else { return };
    let log = CString::new(log.to_str().unwrap()).unwrap();
    // Room for a 2 MiB page on each of the two streams.
    let mut cfg = sim_config(XLOG_ALLOCATOR_ASYNC, 8 << 20, 4);
    cfg.log_path = log.as_ptr();
    let h = open(&cfg);
    let (s, t) = (acquire(h), acquire(h));
    // Neither stream is released: the close names both too.
    for stream in [s, t] {
        let mut native = std::ptr::null_mut();
        assert_eq!(xlog_stream_native(h.rt(), stream, &mut native), XLOG_OK);
        println!("stream|{stream}|{:#x}", native as u64);
    }
    for (tag, bytes, stream) in [("hash_table", 1000, s), ("join,output \"x\"", 4096, t), ("empty", 0, s)] {
        let (st, b) = allocate(h, bytes, stream, tag);
        assert_eq!(st, XLOG_OK);
        println!("block|{tag}|{}|{}|{:#x}|{}", b.size, b.generation, b.ptr as u64, b.stream);
    }
    let (st, freed) = allocate(h, 512, t, "freed");
    assert_eq!(st, XLOG_OK);
    assert_eq!(xlog_deallocate(h.rt(), freed), XLOG_OK);
    let (mut blocks, mut bytes) = (0u64, 0u64);
    assert_eq!(xlog_runtime_close_report(h.rt(), &mut blocks, &mut bytes), XLOG_OK);
    println!("report|{blocks}|{bytes}");

    // A runtime closed with nothing live prints nothing.
    let h = open(&sim_config(XLOG_ALLOCATOR_DIRECT, 0, 1));
    let s = acquire(h);
    let (st, b) = allocate(h, 256, s, "returned");
    assert_eq!(st, XLOG_OK);
    assert_eq!(xlog_deallocate(h.rt(), b), XLOG_OK);
    assert_eq!(xlog_stream_release(h.rt(), s), XLOG_OK);
    let (mut blocks, mut bytes) = (9u64, 9u64);
    assert_eq!(xlog_runtime_close_report(h.rt(), &mut blocks, &mut bytes), XLOG_OK);
    println!("report|{blocks}|{bytes}");
}

#[test]
fn close_reports_each_leak_on_stderr_in_the_log_and_the_report() {
    let dir = std::env::temp_dir().join(format!("xlog-lifetime-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("leaks.csv");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "leak_report_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &log)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed\nstdout:\n{stdout}\nstderr:\n{stderr}");

    // (tag, size, generation, ptr, stream) of each block the child leaked.
    // (libtest may print "test leak_report_child ... " before the first.)
    let after = |marker: &'static str| move |l: &str| l.find(marker).map(|i| l[i + marker.len()..].to_string());
    let blocks: Vec<Vec<String>> = stdout
        .lines()
        .filter_map(after("block|"))
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect();
    let reports: Vec<String> = stdout.lines().filter_map(after("report|")).collect();
    let streams: Vec<Vec<String>> = stdout
        .lines()
        .filter_map(after("stream|"))
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect();
    assert_eq!(blocks.len(), 3, "child stdout:\n{stdout}");
    assert_eq!(streams.len(), 2, "child stdout:\n{stdout}");
    assert_eq!(reports, ["3|5096", "0|0"], "close_report counts: 3 blocks of 1000 + 4096 + 0 bytes, then none");

    // stderr: one summary line for the leaky runtime, then one line per
    // block with its tag (quoted), size, generation and pointer.
    let xlog_lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("xlog:")).collect();
    assert_eq!(
        xlog_lines.first().copied(),
        Some("xlog: runtime on device 0 closed with 3 live block(s), 5096 bytes; freeing them:"),
        "stderr:\n{stderr}"
    );
    // Then the streams never released: a summary naming their ids, and a
    // line per stream with its native handle.
    let mut expected: Vec<String> = blocks
        .iter()
        .map(|b| format!("xlog:   leaked block tag={:?} size={} generation={} ptr={}", b[0], b[1], b[2], b[3]))
        .collect();
    expected.push(format!(
        "xlog: runtime on device 0 closed with 2 stream(s) acquired and never released (ids {}, {}); releasing them:",
        streams[0][0], streams[1][0]
    ));
    expected.extend(streams.iter().map(|s| format!("xlog:   unreleased stream {} native={}", s[0], s[1])));
    let mut got: Vec<String> = xlog_lines[1..].iter().map(|l| l.to_string()).collect();
    expected.sort();
    got.sort();
    assert_eq!(got, expected, "the freed block is not reported and the leak-free runtime prints nothing");

    // The CSV log: one "leak" line per block, with pointer, size, stream
    // and the tag (quoted where it holds a comma or a quote).
    let csv = std::fs::read_to_string(&log).unwrap();
    let mut leak_lines: Vec<String> = csv
        .lines()
        .filter(|l| l.split(',').nth(2) == Some("leak"))
        // Pointer..Tag: after the third comma, before the last three
        // columns (Device, Process and an empty Detail).
        .map(|l| l.rsplitn(4, ',').nth(3).unwrap().splitn(4, ',').nth(3).unwrap().to_string())
        .collect();
    let mut expected_csv: Vec<String> = blocks
        .iter()
        .map(|b| {
            let tag = if b[0].contains([',', '"']) { format!("\"{}\"", b[0].replace('"', "\"\"")) } else { b[0].clone() };
            format!("{},{},{},{tag}", b[3], b[1], b[4])
        })
        .collect();
    leak_lines.sort();
    expected_csv.sort();
    assert_eq!(leak_lines, expected_csv, "log:\n{csv}");
    // And one "unreleased stream" line per stream: its id, its native handle.
    let stream_lines: Vec<(String, String)> = csv
        .lines()
        .filter(|l| l.split(',').nth(2) == Some("unreleased stream"))
        .map(|l| {
            let fields: Vec<&str> = l.split(',').collect();
            (fields[5].to_string(), fields[9].to_string())
        })
        .collect();
    let expected_streams: Vec<(String, String)> =
        streams.iter().map(|s| (s[0].clone(), format!("native {}", s[1]))).collect();
    assert_eq!(stream_lines, expected_streams, "log:\n{csv}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ===================================================================== //
// Calls that block, and callbacks that call in, racing the close         //
// ===================================================================== //

struct Spinner {
    handle: Handle,
    stop: AtomicBool,
    calls: AtomicU64,
    /// Calls that were not refused with STREAM_MISUSE.
    bad: AtomicU64,
}

/// A host callback that keeps calling into the runtime until the test
/// stops it; every call must be refused (a host callback may not call in).
extern "C" fn spinning_callback(user: *mut c_void) {
    // SAFETY: `user` is a `Spinner` the test keeps alive past the close.
    let sp = unsafe { &*(user as *const Spinner) };
    while !sp.stop.load(Ordering::SeqCst) {
        let mut stats = sized_stats();
        let st = xlog_get_stats(sp.handle.rt(), &mut stats);
        let mut reclaimed = 0;
        let drained = xlog_drain(sp.handle.rt(), &mut reclaimed);
        sp.calls.fetch_add(1, Ordering::SeqCst);
        if st != XLOG_ERR_STREAM_MISUSE || drained != XLOG_ERR_STREAM_MISUSE {
            sp.bad.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Close on another thread; panic if it does not return in time.
fn close_with_watchdog(h: Handle, what: &str) -> xlog_status {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(xlog_runtime_close(h.rt()));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(st) => st,
        Err(_) => panic!("{what}: xlog_runtime_close did not return within 20 s: deadlock"),
    }
}

/// Callbacks that keep calling in while another thread closes: every call
/// of theirs is refused, and the close waits for the running callbacks
/// (they may still touch block memory) instead of deadlocking with them.
#[test]
fn close_while_host_callbacks_call_in_does_not_deadlock() {
    for trial in 0..50u64 {
        let h = open(&sim_config(XLOG_ALLOCATOR_ASYNC, 0, 4));
        let spinners: Vec<Arc<Spinner>> = (0..2)
            .map(|_| {
                Arc::new(Spinner { handle: h, stop: AtomicBool::new(false), calls: AtomicU64::new(0), bad: AtomicU64::new(0) })
            })
            .collect();
        for sp in &spinners {
            let s = acquire(h);
            let (st, _) = allocate(h, 4096, s, "spinner-block");
            assert_eq!(st, XLOG_OK);
            let user = Arc::as_ptr(sp) as *mut c_void;
            assert_eq!(xlog_stream_enqueue_host(h.rt(), s, Some(spinning_callback), user), XLOG_OK);
        }
        while spinners.iter().any(|sp| sp.calls.load(Ordering::SeqCst) == 0) {
            thread::yield_now();
        }
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let (mut blocks, mut bytes) = (0u64, 0u64);
            let st = xlog_runtime_close_report(h.rt(), &mut blocks, &mut bytes);
            let _ = tx.send((st, blocks));
        });
        thread::sleep(Duration::from_micros(200 + 100 * (trial % 10)));
        assert!(rx.try_recv().is_err(), "trial {trial}: the close returned while callbacks were still running");
        for sp in &spinners {
            sp.stop.store(true, Ordering::SeqCst);
        }
        let (st, leaked) = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("trial {trial}: the close did not return within 20 s of the callbacks ending: deadlock"));
        assert_eq!(st, XLOG_OK, "{}", last_error());
        assert_eq!(leaked, 2, "trial {trial}: the close freed both blocks after the callbacks");
        for sp in &spinners {
            assert_eq!(sp.bad.load(Ordering::SeqCst), 0, "trial {trial}: a call from a callback was not refused");
        }
    }
}

#[test]
fn close_while_threads_wait_on_streams_does_not_deadlock() {
    for trial in 0..100u64 {
        let h = open(&sim_config(XLOG_ALLOCATOR_ASYNC, 0, 8));
        let stop = Arc::new(AtomicBool::new(false));
        let mut waiters = Vec::new();
        for w in 0..3u64 {
            let s = acquire(h);
            let stop = stop.clone();
            waiters.push(thread::spawn(move || {
                let mut bad = Vec::new();
                let mut i = w;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let (st, b) = allocate(h, 256, s, "waiter");
                    if st == XLOG_OK {
                        let _ = xlog_deallocate(h.rt(), b);
                    }
                    let st = if i % 2 == 0 { xlog_stream_synchronize(h.rt(), s) } else { xlog_drain(h.rt(), std::ptr::null_mut()) };
                    if st != XLOG_OK && st != XLOG_ERR_INVALID_ARGUMENT {
                        bad.push(format!("{} {}", status_name(st), last_error()));
                    }
                    if st == XLOG_ERR_INVALID_ARGUMENT {
                        break;
                    }
                }
                bad
            }));
        }
        thread::sleep(Duration::from_micros(100 * (trial % 20)));
        let st = close_with_watchdog(h, &format!("trial {trial}"));
        assert_eq!(st, XLOG_OK, "{}", last_error());
        let (tx, rx) = mpsc::channel();
        let stop2 = stop.clone();
        thread::spawn(move || {
            let out: Vec<Vec<String>> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
            let _ = tx.send(out);
        });
        let out = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| {
            stop2.store(true, Ordering::SeqCst);
            panic!("trial {trial}: a thread in xlog_stream_synchronize / xlog_drain never returned after the close: deadlock")
        });
        for bad in out {
            assert!(bad.is_empty(), "trial {trial}: {bad:?}");
        }
    }
}
