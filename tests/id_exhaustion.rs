//! The ends of the two process-wide id spaces, reached through the
//! test-only counter starts instead of billions of calls:
//!
//! - stream ids (`uint32_t` in the C ABI) are never reused: once the last
//!   one is issued, acquire and import fail with XLOG_ERR_POOL_EXHAUSTED,
//!   change nothing, and never hand out an id issued before;
//! - sim device instances (which name the device in a native stream
//!   handle) are never reused either: two sim runtimes open at once never
//!   share native handles, however many were opened before, and past the
//!   last instance an open fails with XLOG_ERR_POOL_EXHAUSTED.
//!
//! The counters are process-wide, so this binary holds a single test that
//! does both, in an order that leaves nothing else to run afterwards.

use std::ffi::{c_char, c_void, CString};

use xlog_cuda::device::sim::set_next_instance_for_testing;
use xlog_cuda::ffi::api::*;
use xlog_cuda::ffi::types::*;
use xlog_cuda::stream_pool::set_next_stream_id_for_testing;

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: `buf` has 1024 writable bytes.
    let n = unsafe { xlog_last_error_message(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    buf.truncate(n.min(1023));
    String::from_utf8_lossy(&buf).into_owned()
}

fn open(pool: u32) -> (xlog_status, *mut xlog_runtime) {
    let mut cfg = std::mem::MaybeUninit::<xlog_config>::zeroed();
    // SAFETY: writable storage for one config, fully initialised after.
    let mut cfg = unsafe {
        xlog_config_init(cfg.as_mut_ptr());
        cfg.assume_init()
    };
    cfg.struct_size = std::mem::size_of::<xlog_config>() as u32;
    cfg.backend = XLOG_BACKEND_SIM;
    cfg.budget_bytes = 0;
    cfg.log_path = std::ptr::null();
    cfg.stream_pool_size = pool;
    cfg.sim_capacity_bytes = 8 << 20;
    let mut rt = std::ptr::null_mut();
    // SAFETY: valid config and out-pointer.
    let st = unsafe { xlog_runtime_open(0, &cfg, &mut rt) };
    (st, rt)
}

fn acquire(rt: *mut xlog_runtime) -> (xlog_status, xlog_stream) {
    let mut s = 0;
    (xlog_stream_acquire(rt, &mut s), s)
}

fn native(rt: *mut xlog_runtime, s: xlog_stream) -> u64 {
    let mut out: *mut c_void = std::ptr::null_mut();
    assert_eq!(xlog_stream_native(rt, s, &mut out), XLOG_OK, "{}", last_error());
    out as u64
}

fn stream_ids_are_never_reused() {
    let (st, rt) = open(8);
    assert_eq!(st, XLOG_OK, "{}", last_error());
    let (st, early) = acquire(rt);
    assert_eq!(st, XLOG_OK);

    set_next_stream_id_for_testing(u32::MAX - 2);
    let (st, a) = acquire(rt);
    assert_eq!((st, a), (XLOG_OK, u32::MAX - 2), "{}", last_error());
    let (st, b) = acquire(rt);
    assert_eq!((st, b), (XLOG_OK, u32::MAX - 1), "{}", last_error());
    // u32::MAX is never issued: the space ends here, and stays ended.
    assert_eq!(xlog_stream_release(rt, a), XLOG_OK);
    for attempt in 0..3 {
        let (st, id) = acquire(rt);
        let msg = last_error();
        assert_eq!(st, XLOG_ERR_POOL_EXHAUSTED, "acquire {attempt} after the last id gave id {id}: {msg}");
        assert_eq!(id, 0, "a refused acquire writes no id");
        assert!(msg.contains("never") && msg.contains("reused"), "{msg}");
        let mut imported = 0;
        let st = xlog_stream_import(rt, 0x1234 as *mut c_void, &mut imported);
        assert_eq!((st, imported), (XLOG_ERR_POOL_EXHAUSTED, 0), "import {attempt}: {}", last_error());
    }
    // Nothing changed: the live ids still work, the released one is dead,
    // and no stream was taken from the pool by the refusals.
    let mut blk = xlog_block { ptr: std::ptr::null_mut(), size: 0, generation: 0, stream: 0, device: 0 };
    let tag = CString::new("after-exhaustion").unwrap();
    // SAFETY: live C string and valid out-pointer.
    assert_eq!(unsafe { xlog_allocate(rt, 256, b, tag.as_ptr(), &mut blk) }, XLOG_OK, "{}", last_error());
    assert_eq!(xlog_deallocate(rt, blk), XLOG_OK);
    assert_eq!(xlog_stream_synchronize(rt, early), XLOG_OK);
    assert_eq!(xlog_stream_synchronize(rt, a), XLOG_ERR_INVALID_ARGUMENT, "a released id stays dead");
    assert_eq!(xlog_stream_release(rt, b), XLOG_OK);
    assert_eq!(xlog_stream_release(rt, early), XLOG_OK);
    assert_eq!(xlog_runtime_close(rt), XLOG_OK, "{}", last_error());
    // Leave the counter usable for the rest of this test.
    set_next_stream_id_for_testing(1 << 20);
}

fn sim_instances_never_collide() {
    let (st, first) = open(2);
    assert_eq!(st, XLOG_OK, "{}", last_error());
    let (_, s) = acquire(first);
    let first_native = native(first, s);
    // Handle layout: 16-bit tag, 32-bit instance, 16-bit stream.
    let first_instance = (first_native >> 16) & 0xFFFF_FFFF;

    // Far past 2^24 opens later, the same low 24 bits of the instance.
    set_next_instance_for_testing(first_instance + (1 << 24));
    let (st, second) = open(2);
    assert_eq!(st, XLOG_OK, "{}", last_error());
    let (_, t) = acquire(second);
    let second_native = native(second, t);
    assert_ne!(first_native, second_native, "two live sim runtimes hand out the same native stream handle");
    let mut id = 0;
    let st = xlog_stream_import(first, second_native as *mut c_void, &mut id);
    assert_eq!(st, XLOG_ERR_INVALID_ARGUMENT, "the first runtime accepted the second's stream as its own (id {id})");
    assert!(last_error().contains("another sim device"), "{}", last_error());
    let st = xlog_stream_import(first, first_native as *mut c_void, &mut id);
    assert_eq!(st, XLOG_OK, "its own handle is still accepted: {}", last_error());
    assert_eq!(native(first, id), first_native, "and names the same stream");

    // The last instance is issued once; after it, opens are refused.
    set_next_instance_for_testing(u32::MAX as u64);
    let (st, last) = open(1);
    assert_eq!(st, XLOG_OK, "{}", last_error());
    let (st, refused) = open(1);
    assert_eq!(st, XLOG_ERR_POOL_EXHAUSTED, "{}", last_error());
    assert!(refused.is_null());
    assert!(last_error().contains("never reused"), "{}", last_error());
    for rt in [first, second, last] {
        assert_eq!(xlog_runtime_close(rt), XLOG_OK, "{}", last_error());
    }
}

#[test]
fn id_spaces_end_with_pool_exhausted_and_are_never_reused() {
    stream_ids_are_never_reused();
    sim_instances_never_collide();
}
