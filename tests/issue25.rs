//! Defects found by trying to break stream capture, the framework hooks and
//! the close report as a hostile caller would (issue 25), on the sim
//! backend, through the C ABI:
//!
//! 1. a stream that captures is never released, closed under, or handed
//!    out again by the pool (pooled, imported, the hook runtime's);
//! 2. negative device ordinals are refused by every interop entry point
//!    the same way `xlog_interop_runtime(-1)` refuses them;
//! 3. unbalanced graph-pool calls (`end` without a `begin`, a release while
//!    every user of the pool still captures) are refused;
//! 5. error messages: a block of another device or another runtime, a
//!    device ordinal past the sim's devices;
//! 6. the close report names the streams never released.

use std::ffi::{c_char, c_void, CString};
use std::path::PathBuf;

use xlog_cuda::ffi::api::*;
use xlog_cuda::ffi::interop::*;
use xlog_cuda::ffi::testing::*;
use xlog_cuda::ffi::types::*;

fn last_error() -> String {
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` has 4096 writable bytes.
    let n = unsafe { xlog_last_error_message(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    buf.truncate(n.min(4095));
    String::from_utf8_lossy(&buf).into_owned()
}

fn sim_config(pool: u32) -> xlog_config {
    let mut cfg = std::mem::MaybeUninit::<xlog_config>::zeroed();
    // SAFETY: writable storage for one config, fully initialised after.
    let mut cfg = unsafe {
        xlog_config_init(cfg.as_mut_ptr());
        cfg.assume_init()
    };
    cfg.backend = XLOG_BACKEND_SIM;
    cfg.budget_bytes = 0;
    cfg.stream_pool_size = pool;
    cfg.sim_capacity_bytes = 16 << 20;
    cfg.log_path = std::ptr::null();
    // Each hook test keeps its hooks apart on a sim ordinal of its own.
    cfg.sim_devices = 8192;
    cfg
}

fn open(pool: u32) -> *mut xlog_runtime {
    open_on(0, &sim_config(pool))
}

fn open_on(device: i32, cfg: &xlog_config) -> *mut xlog_runtime {
    let mut rt = std::ptr::null_mut();
    // SAFETY: a valid config and out-pointer.
    let status = unsafe { xlog_runtime_open(device, cfg, &mut rt) };
    assert_eq!(status, XLOG_OK, "{}", last_error());
    rt
}

fn acquire(rt: *mut xlog_runtime) -> xlog_stream {
    let mut s = 0;
    assert_eq!(xlog_stream_acquire(rt, &mut s), XLOG_OK, "{}", last_error());
    s
}

fn native(rt: *mut xlog_runtime, s: xlog_stream) -> *mut c_void {
    let mut n = std::ptr::null_mut();
    assert_eq!(xlog_stream_native(rt, s, &mut n), XLOG_OK, "{}", last_error());
    n
}

/// End the capture begun on `s` through the runtime: its id.
fn end_capture(rt: *mut xlog_runtime, s: xlog_stream) -> u64 {
    let (mut graph, mut capture) = (std::ptr::null_mut(), 0u64);
    assert_eq!(xlog_capture_end(rt, s, &mut graph, &mut capture), XLOG_OK, "{}", last_error());
    capture
}

fn empty_block() -> xlog_block {
    xlog_block { ptr: std::ptr::null_mut(), size: 0, generation: 0, stream: 0, device: 0 }
}

fn live_blocks(rt: *mut xlog_runtime) -> u64 {
    let mut stats = xlog_stats { struct_size: std::mem::size_of::<xlog_stats>() as u32, ..Default::default() };
    assert_eq!(xlog_get_stats(rt, &mut stats), XLOG_OK, "{}", last_error());
    stats.live_blocks
}

extern "C" fn set_flag(user: *mut c_void) {
    // SAFETY: the tests pass a pointer to an AtomicBool that outlives the stream's work.
    let flag = unsafe { &*(user as *const std::sync::atomic::AtomicBool) };
    flag.store(true, std::sync::atomic::Ordering::SeqCst);
}

// ===================================================================== //
// 1. Streams that capture                                                //
// ===================================================================== //

#[test]
fn releasing_a_capturing_stream_is_refused_and_changes_nothing() {
    // One pooled stream: a release that went through would hand the same
    // native stream to the next acquire.
    let rt = open(1);
    let a = acquire(rt);
    assert_eq!(xlog_capture_begin(rt, a, XLOG_CAPTURE_GLOBAL), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_stream_release(rt, a), XLOG_ERR_STREAM_MISUSE);
    let refusal = last_error();
    let mut b = 0;
    assert_eq!(xlog_stream_acquire(rt, &mut b), XLOG_ERR_POOL_EXHAUSTED, "the stream is still acquired");
    let capture = end_capture(rt, a);
    assert!(
        refusal.contains(&format!("stream {a} ")) && refusal.contains(&format!("capture {capture}")),
        "the refusal names the stream and the capture: {refusal}"
    );

    // Ended, it goes back, and the next acquire gets a stream that runs work.
    assert_eq!(xlog_stream_release(rt, a), XLOG_OK, "{}", last_error());
    let b = acquire(rt);
    let ran = std::sync::atomic::AtomicBool::new(false);
    assert_eq!(xlog_stream_enqueue_host(rt, b, Some(set_flag), &ran as *const _ as *mut c_void), XLOG_OK);
    assert_eq!(xlog_stream_synchronize(rt, b), XLOG_OK, "{}", last_error());
    assert!(ran.load(std::sync::atomic::Ordering::SeqCst), "the callback ran: b does not capture");
    assert_eq!(xlog_capture_begin(rt, b, XLOG_CAPTURE_GLOBAL), XLOG_OK, "{}", last_error());
    end_capture(rt, b);
    assert_eq!(xlog_stream_release(rt, b), XLOG_OK);
    assert_eq!(xlog_runtime_close(rt), XLOG_OK, "{}", last_error());
}

#[test]
fn a_stream_that_joined_a_capture_is_not_released_either() {
    // b joins a's capture by waiting on work captured on a (a fork).
    let rt = open(4);
    let (a, b) = (acquire(rt), acquire(rt));
    let mut block = empty_block();
    // SAFETY: a valid tag and out-pointer.
    assert_eq!(unsafe { xlog_allocate(rt, 4096, a, c"fork".as_ptr(), &mut block) }, XLOG_OK);
    assert_eq!(xlog_capture_begin(rt, a, XLOG_CAPTURE_GLOBAL), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_finish(rt, block, a, XLOG_ACCESS_WRITE), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_prepare(rt, block, b, XLOG_ACCESS_READ), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_stream_release(rt, b), XLOG_ERR_STREAM_MISUSE, "b takes part in the capture");
    assert!(last_error().contains("capture"), "{}", last_error());
    assert_eq!(xlog_finish(rt, block, b, XLOG_ACCESS_READ), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_prepare(rt, block, a, XLOG_ACCESS_WRITE), XLOG_OK, "{}", last_error());
    end_capture(rt, a);
    assert_eq!(xlog_stream_release(rt, b), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_deallocate(rt, block), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_stream_release(rt, a), XLOG_OK);
    assert_eq!(xlog_runtime_close(rt), XLOG_OK, "{}", last_error());
}

#[test]
fn an_idle_stream_captured_behind_the_runtimes_back_is_never_handed_out() {
    let rt = open(2);
    let a = acquire(rt);
    let idle = native(rt, a);
    assert_eq!(xlog_stream_release(rt, a), XLOG_OK);
    // A framework begins a capture on the native stream the pool now keeps
    // idle (it imported that handle earlier, say).
    let mut capture = 0;
    assert_eq!(xlog_sim_stream_begin_capture(rt, idle, &mut capture), XLOG_OK, "{}", last_error());
    let b = acquire(rt);
    assert_ne!(native(rt, b), idle, "the pool handed out a stream that captures");
    assert_eq!(xlog_capture_begin(rt, b, XLOG_CAPTURE_GLOBAL), XLOG_OK, "{}", last_error());
    end_capture(rt, b);
    assert_eq!(xlog_stream_release(rt, b), XLOG_OK);
    let mut graph = 0;
    assert_eq!(xlog_sim_stream_end_capture(rt, idle, &mut graph), XLOG_OK, "{}", last_error());
    // Once it ended, the idle stream is handed out again.
    let (c, d) = (acquire(rt), acquire(rt));
    assert!([native(rt, c), native(rt, d)].contains(&idle), "the stream is back in use once it ended");
    assert_eq!(xlog_runtime_close(rt), XLOG_OK, "{}", last_error());
}

#[test]
fn releasing_a_capturing_imported_stream_is_refused() {
    let rt = open(2);
    let foreign = 0x5100 as *mut c_void;
    let mut f = 0;
    assert_eq!(xlog_stream_import(rt, foreign, &mut f), XLOG_OK, "{}", last_error());
    let mut capture = 0;
    assert_eq!(xlog_sim_stream_begin_capture(rt, foreign, &mut capture), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_stream_release(rt, f), XLOG_ERR_STREAM_MISUSE);
    assert!(last_error().contains(&format!("capture {capture}")), "{}", last_error());
    let mut again = 0;
    assert_eq!(xlog_stream_import(rt, foreign, &mut again), XLOG_OK);
    assert_eq!(again, f, "still imported under the same id: the release changed nothing");
    let mut graph = 0;
    assert_eq!(xlog_sim_stream_end_capture(rt, foreign, &mut graph), XLOG_OK, "the capture was not invalidated: {}", last_error());
    assert_eq!(xlog_stream_release(rt, f), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_runtime_close(rt), XLOG_OK, "{}", last_error());
}

#[test]
fn synchronizing_a_capturing_stream_is_refused_without_invalidating_the_capture() {
    let rt = open(2);
    let a = acquire(rt);
    assert_eq!(xlog_capture_begin(rt, a, XLOG_CAPTURE_GLOBAL), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_stream_synchronize(rt, a), XLOG_ERR_STREAM_MISUSE);
    assert!(last_error().contains("captur"), "{}", last_error());
    end_capture(rt, a);
    assert_eq!(xlog_stream_synchronize(rt, a), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_stream_release(rt, a), XLOG_OK);
    assert_eq!(xlog_runtime_close(rt), XLOG_OK, "{}", last_error());
}

#[test]
fn closing_while_a_stream_captures_is_refused_and_the_handle_stays_open() {
    let rt = open(2);
    let a = acquire(rt);
    let mut block = empty_block();
    // SAFETY: a valid tag and out-pointer.
    assert_eq!(unsafe { xlog_allocate(rt, 4096, a, c"kept".as_ptr(), &mut block) }, XLOG_OK);
    assert_eq!(xlog_capture_begin(rt, a, XLOG_CAPTURE_GLOBAL), XLOG_OK, "{}", last_error());
    let (mut blocks, mut bytes) = (u64::MAX, u64::MAX);
    assert_eq!(xlog_runtime_close_report(rt, &mut blocks, &mut bytes), XLOG_ERR_STREAM_MISUSE);
    let refusal = last_error();
    assert_eq!((blocks, bytes), (u64::MAX, u64::MAX), "nothing reported: nothing was closed");
    assert_eq!(live_blocks(rt), 1, "the handle is still open and nothing was freed");
    let capture = end_capture(rt, a);
    assert!(
        refusal.contains(&format!("stream {a} ")) && refusal.contains(&format!("capture {capture}")),
        "the refusal names the stream and its capture: {refusal}"
    );
    assert_eq!(xlog_deallocate(rt, block), XLOG_OK);
    assert_eq!(xlog_stream_release(rt, a), XLOG_OK);
    assert_eq!(xlog_runtime_close_report(rt, &mut blocks, &mut bytes), XLOG_OK, "{}", last_error());
    assert_eq!((blocks, bytes), (0, 0));
}

#[test]
fn the_hook_runtime_is_not_reset_while_a_framework_capture_runs() {
    let device = 2501;
    let cfg = sim_config(4);
    // SAFETY: a valid config pointer.
    assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK, "{}", last_error());
    let capture_stream = 0x7c00 as *mut c_void;
    let p = xlog_torch_malloc(4096, device, capture_stream);
    assert!(!p.is_null(), "{}", last_error());
    let mut rt = std::ptr::null_mut();
    assert_eq!(xlog_interop_runtime(device, &mut rt), XLOG_OK);
    let mut capture = 0;
    assert_eq!(xlog_sim_stream_begin_capture(rt, capture_stream, &mut capture), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_runtime_close(rt), XLOG_OK, "the hooks hold the runtime: only this handle goes");

    let mut leaked = u64::MAX;
    assert_eq!(xlog_testing_interop_reset(device, &mut leaked), XLOG_ERR_STREAM_MISUSE);
    assert!(last_error().contains(&format!("capture {capture}")), "{}", last_error());
    assert_eq!(xlog_interop_live_blocks(device), 1, "the hooks are still there, with their block");

    assert_eq!(xlog_interop_runtime(device, &mut rt), XLOG_OK);
    let mut graph = 0;
    assert_eq!(xlog_sim_stream_end_capture(rt, capture_stream, &mut graph), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_runtime_close(rt), XLOG_OK);
    assert_eq!(xlog_testing_interop_reset(device, &mut leaked), XLOG_OK, "{}", last_error());
    assert_eq!(leaked, 1);
}

// ===================================================================== //
// 2. Negative device ordinals                                            //
// ===================================================================== //

#[test]
fn every_interop_entry_point_refuses_a_negative_ordinal_alike() {
    let expect = |status: xlog_status, device: i32, call: &str| {
        assert_eq!(status, XLOG_ERR_INVALID_ARGUMENT, "{call}({device}) returned {status}");
        let message = last_error();
        assert!(
            message.starts_with(call) && message.contains(&format!("device ordinal {device} is negative")),
            "{call}: {message}"
        );
    };
    let mut rt = std::ptr::null_mut();
    expect(xlog_interop_runtime(-1, &mut rt), -1, "xlog_interop_runtime");
    let cfg = sim_config(2);
    // SAFETY: a valid config pointer (and NULL, which means the environment).
    expect(unsafe { xlog_interop_configure(-5, &cfg) }, -5, "xlog_interop_configure");
    // SAFETY: as above.
    expect(unsafe { xlog_interop_configure(-5, std::ptr::null()) }, -5, "xlog_interop_configure");
    let mut released = 7;
    expect(xlog_interop_trim(-1, 0, &mut released), -1, "xlog_interop_trim");
    assert_eq!(released, 7, "nothing written");
    let mut leaked = 7;
    expect(xlog_testing_interop_reset(-1, &mut leaked), -1, "xlog_testing_interop_reset");
    assert_eq!(leaked, 7, "nothing written");
    expect(xlog_torch_begin_allocate_to_pool(-2, 1, 0, std::ptr::null_mut()), -2, "xlog_torch_begin_allocate_to_pool");
    expect(xlog_torch_end_allocate_to_pool(-2, 1, 0), -2, "xlog_torch_end_allocate_to_pool");
    expect(xlog_torch_release_pool(-2, 1, 0, std::ptr::null_mut()), -2, "xlog_torch_release_pool");
    let p = 0x1000 as *mut c_void;
    expect(xlog_torch_record_stream(p, -3, std::ptr::null_mut()), -3, "xlog_torch_record_stream");
    // SAFETY: a valid config pointer.
    expect(unsafe { xlog_runtime_open(-1, &cfg, &mut rt) }, -1, "xlog_runtime_open");
    assert!(xlog_torch_malloc(64, -4, std::ptr::null_mut()).is_null());
    assert!(last_error().contains("device ordinal -4 is negative"), "{}", last_error());
}

// ===================================================================== //
// 3. Unbalanced graph-pool calls                                         //
// ===================================================================== //

#[test]
fn an_end_of_allocation_to_a_pool_with_nothing_left_to_end_is_refused() {
    let device = 2502;
    let cfg = sim_config(4);
    // SAFETY: a valid config pointer.
    assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
    assert_eq!(xlog_torch_begin_allocate_to_pool(device, 5, 5, std::ptr::null_mut()), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_torch_end_allocate_to_pool(device, 5, 5), XLOG_OK, "{}", last_error());
    for _ in 0..2 {
        assert_eq!(xlog_torch_end_allocate_to_pool(device, 5, 5), XLOG_ERR_INVALID_ARGUMENT);
        let m = last_error();
        assert!(m.contains("pool (5, 5)") && m.contains(&format!("device {device}")) && m.contains("nothing"), "{m}");
    }
    // The refused ends changed nothing: the one user releases it.
    assert_eq!(xlog_torch_release_pool(device, 5, 5, std::ptr::null_mut()), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_torch_release_pool(device, 5, 5, std::ptr::null_mut()), XLOG_ERR_INVALID_ARGUMENT);
    assert_eq!(xlog_testing_interop_reset(device, std::ptr::null_mut()), XLOG_OK);
}

#[test]
fn the_end_owed_by_a_begin_swept_after_a_failed_capture_is_accepted_once() {
    let device = 2504;
    let cfg = sim_config(4);
    // SAFETY: a valid config pointer.
    assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
    let capture_stream = 0x7d00 as *mut c_void;
    // A begin whose capture failed before it began: PyTorch never ends it.
    // The next begin on that stream sweeps it.
    assert_eq!(xlog_torch_begin_allocate_to_pool(device, 7, 0, capture_stream), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_torch_begin_allocate_to_pool(device, 7, 0, capture_stream), XLOG_OK, "{}", last_error());
    // Two begins, two ends (the swept one's may still come), no third.
    assert_eq!(xlog_torch_end_allocate_to_pool(device, 7, 0), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_torch_end_allocate_to_pool(device, 7, 0), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_torch_end_allocate_to_pool(device, 7, 0), XLOG_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("nothing left to end"), "{}", last_error());
    for _ in 0..2 {
        assert_eq!(xlog_torch_release_pool(device, 7, 0, std::ptr::null_mut()), XLOG_OK, "{}", last_error());
    }
    assert_eq!(xlog_testing_interop_reset(device, std::ptr::null_mut()), XLOG_OK);
}

#[test]
fn a_pool_release_while_every_user_still_captures_is_refused() {
    let device = 2503;
    let cfg = sim_config(4);
    // SAFETY: a valid config pointer.
    assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
    // Two captures into one pool announced, neither ended: no graph of the
    // pool exists yet, so no release can be one's.
    assert_eq!(xlog_torch_begin_allocate_to_pool(device, 6, 0, std::ptr::null_mut()), XLOG_OK);
    assert_eq!(xlog_torch_begin_allocate_to_pool(device, 6, 0, std::ptr::null_mut()), XLOG_OK);
    assert_eq!(xlog_torch_release_pool(device, 6, 0, std::ptr::null_mut()), XLOG_ERR_STREAM_MISUSE);
    let m = last_error();
    assert!(m.contains("pool (6, 0)") && m.contains("2 capture(s) under way"), "{m}");
    // One ends: the graph it made may go while the other still captures
    // (PyTorch destroys a graph of a shared pool while another captures).
    assert_eq!(xlog_torch_end_allocate_to_pool(device, 6, 0), XLOG_OK);
    assert_eq!(xlog_torch_release_pool(device, 6, 0, std::ptr::null_mut()), XLOG_OK, "{}", last_error());
    // Now the one user left still captures: refused again.
    assert_eq!(xlog_torch_release_pool(device, 6, 0, std::ptr::null_mut()), XLOG_ERR_STREAM_MISUSE);
    assert_eq!(xlog_torch_end_allocate_to_pool(device, 6, 0), XLOG_OK);
    assert_eq!(xlog_torch_release_pool(device, 6, 0, std::ptr::null_mut()), XLOG_OK, "{}", last_error());
    assert_eq!(xlog_torch_release_pool(device, 6, 0, std::ptr::null_mut()), XLOG_ERR_INVALID_ARGUMENT);
    assert_eq!(xlog_testing_interop_reset(device, std::ptr::null_mut()), XLOG_OK);
}

// ===================================================================== //
// 5. Messages                                                            //
// ===================================================================== //

#[test]
fn a_block_of_another_device_is_reported_once_without_a_use_after_free_clause() {
    let mut cfg = sim_config(2);
    cfg.sim_devices = 2;
    let (rt0, rt1) = (open_on(0, &cfg), open_on(1, &cfg));
    let s1 = acquire(rt1);
    let mut block = empty_block();
    // SAFETY: a valid tag and out-pointer.
    assert_eq!(unsafe { xlog_allocate(rt1, 4096, s1, c"dev1".as_ptr(), &mut block) }, XLOG_OK);
    let calls: [(&str, &dyn Fn() -> xlog_status); 2] = [
        ("xlog_deallocate", &|| xlog_deallocate(rt0, block)),
        ("xlog_block_validate", &|| xlog_block_validate(rt0, block)),
    ];
    for (call, f) in calls {
        assert_eq!(f(), XLOG_ERR_INVALID_ARGUMENT, "{call}");
        let m = last_error();
        assert!(m.contains("is a block of device 1") && m.contains("runtime of device 0"), "{m}");
        assert!(!m.contains("use after free"), "{call}: the message says two different things: {m}");
    }
    assert_eq!(xlog_deallocate(rt1, block), XLOG_OK);
    assert_eq!(xlog_runtime_close(rt0), XLOG_OK);
    assert_eq!(xlog_runtime_close(rt1), XLOG_OK);
}

#[test]
fn a_block_of_another_runtime_is_an_invalid_argument_naming_it() {
    // Two independent sim runtimes of one device.
    let (a, b) = (open(2), open(2));
    let sa = acquire(a);
    let sb = acquire(b);
    let mut block = empty_block();
    // SAFETY: a valid tag and out-pointer.
    assert_eq!(unsafe { xlog_allocate(a, 4096, sa, c"of a".as_ptr(), &mut block) }, XLOG_OK);
    let calls: [(&str, &dyn Fn() -> xlog_status); 4] = [
        ("xlog_deallocate", &|| xlog_deallocate(b, block)),
        ("xlog_block_validate", &|| xlog_block_validate(b, block)),
        ("xlog_prepare", &|| xlog_prepare(b, block, sb, XLOG_ACCESS_READ)),
        ("xlog_finish", &|| xlog_finish(b, block, sb, XLOG_ACCESS_READ)),
    ];
    for (call, f) in calls {
        assert_eq!(f(), XLOG_ERR_INVALID_ARGUMENT, "{call}: {}", last_error());
        let m = last_error();
        assert!(m.contains("another runtime") && m.contains("device 0"), "{call}: {m}");
        assert!(!m.contains("use after free"), "{call}: {m}");
    }
    let uses = [xlog_use { block, access: XLOG_ACCESS_READ }];
    // SAFETY: one valid use.
    assert_eq!(unsafe { xlog_prepare_all(b, sb, uses.as_ptr(), 1) }, XLOG_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("another runtime"), "{}", last_error());
    assert_eq!(live_blocks(a), 1, "nothing changed in a");
    // Freed for good, the handle is stale everywhere: use after free again.
    assert_eq!(xlog_deallocate(a, block), XLOG_OK);
    assert_eq!(xlog_deallocate(b, block), XLOG_ERR_USE_AFTER_FREE);
    assert_eq!(xlog_deallocate(a, block), XLOG_ERR_USE_AFTER_FREE);
    for rt in [a, b] {
        assert_eq!(xlog_runtime_close(rt), XLOG_OK);
    }
}

#[test]
fn an_ordinal_past_the_sim_devices_says_no_device_once() {
    let mut cfg = sim_config(2);
    cfg.sim_devices = 1;
    let mut rt = std::ptr::null_mut();
    // SAFETY: a valid config and out-pointer.
    assert_eq!(unsafe { xlog_runtime_open(5, &cfg, &mut rt) }, XLOG_ERR_NO_DEVICE);
    let m = last_error();
    assert_eq!(m.matches("no device").count(), 1, "{m}");
    assert!(m.contains("sim device ordinal 5"), "{m}");
}

// ===================================================================== //
// 6. Streams never released, at close                                    //
// ===================================================================== //

fn scratch_log(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xlog-issue25-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("log.csv")
}

#[test]
fn close_names_the_streams_never_released_in_its_report_and_the_log() {
    let path = scratch_log("unreleased");
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let mut cfg = sim_config(4);
    cfg.log_path = c_path.as_ptr();
    let rt = open_on(0, &cfg);
    let (kept, released, also_kept) = (acquire(rt), acquire(rt), acquire(rt));
    assert_eq!(xlog_stream_release(rt, released), XLOG_OK);
    let mut report = xlog_close_report { struct_size: std::mem::size_of::<xlog_close_report>() as u32, ..Default::default() };
    assert_eq!(xlog_runtime_close_detailed(rt, &mut report), XLOG_OK, "{}", last_error());
    assert_eq!((report.leaked_blocks, report.leaked_bytes, report.unreleased_streams), (0, 0, 2));

    let log = std::fs::read_to_string(&path).unwrap();
    let rows: Vec<&str> = log.lines().filter(|l| l.split(',').nth(2) == Some("unreleased stream")).collect();
    let named: Vec<u32> = rows.iter().map(|l| l.split(',').nth(5).unwrap().parse().unwrap()).collect();
    assert_eq!(named, vec![kept, also_kept], "one row per stream, by id: {log}");
}

#[test]
fn close_detailed_refuses_a_report_struct_too_small_and_closes_nothing() {
    let rt = open(2);
    let s = acquire(rt);
    let mut report = xlog_close_report { struct_size: 8, ..Default::default() };
    assert_eq!(xlog_runtime_close_detailed(rt, &mut report), XLOG_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("struct_size is 8"), "{}", last_error());
    assert_eq!(live_blocks(rt), 0, "the handle is still open");
    assert_eq!(xlog_runtime_close_detailed(rt, std::ptr::null_mut()), XLOG_ERR_INVALID_ARGUMENT);
    assert_eq!(live_blocks(rt), 0, "the handle is still open");
    assert_eq!(xlog_stream_release(rt, s), XLOG_OK);
    report.struct_size = std::mem::size_of::<xlog_close_report>() as u32;
    assert_eq!(xlog_runtime_close_detailed(rt, &mut report), XLOG_OK);
    assert_eq!(report.unreleased_streams, 0);
}
