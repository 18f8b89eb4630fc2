//! Test and debug entry points. The library exports them like every other,
//! but they are declared in `include/xlog/testing.h`, not in the public
//! `include/xlog_cuda.h`: build.rs runs cbindgen over this file alone for
//! that header, and leaves every item defined here out of the public one.
//! Everything `pub` in this file is therefore test-only by construction.

#![allow(non_camel_case_types)]

use super::types::*;
use super::{boundary, out_ptr, runtime_of, stream_id, write_out};
use crate::device::sim::{Claim, FaultKind};
use crate::device::CaptureMode;
use crate::error::ResourceError;
use std::ffi::c_void;

/// Fault kinds for `xlog_sim_inject_fault`.
pub type xlog_fault = u32;
pub const XLOG_FAULT_ALLOC: xlog_fault = 1;
pub const XLOG_FAULT_FREE: xlog_fault = 2;
pub const XLOG_FAULT_EVENT_RECORD: xlog_fault = 3;
pub const XLOG_FAULT_STREAM_CREATE: xlog_fault = 4;

/// Sim backend only: make the `nth` call (1 = the next) of kind `fault`
/// fail; 0 disarms. XLOG_ERR_INVALID_ARGUMENT on a CUDA runtime.
#[no_mangle]
pub extern "C" fn xlog_sim_inject_fault(rt: *mut xlog_runtime, fault: xlog_fault, nth: u64) -> xlog_status {
    boundary("xlog_sim_inject_fault", |_| {
        let kind = match fault {
            XLOG_FAULT_ALLOC => FaultKind::Alloc,
            XLOG_FAULT_FREE => FaultKind::Free,
            XLOG_FAULT_EVENT_RECORD => FaultKind::EventRecord,
            XLOG_FAULT_STREAM_CREATE => FaultKind::StreamCreate,
            other => {
                return Err(ResourceError::InvalidArgument(format!(
                    "fault kind {other} is not one of XLOG_FAULT_ALLOC..XLOG_FAULT_STREAM_CREATE (1..4)"
                )))
            }
        };
        let runtime = sim_runtime(rt, "fault injection")?;
        runtime.sim().expect("a sim runtime").inject_fault(kind, nth);
        Ok(())
    })
}

/// Panics inside the boundary, to test that a panic becomes
/// XLOG_ERR_INTERNAL with a message instead of aborting the process.
#[no_mangle]
pub extern "C" fn xlog_debug_panic() -> xlog_status {
    boundary("xlog_debug_panic", |_| panic!("deliberate panic from xlog_debug_panic"))
}

/// Forget the framework hooks of `device` and its configuration, so that a
/// test (or a fuzzer input) starts from a clean slate, and drop the hooks'
/// own reference to their runtime. With no handle from
/// `xlog_interop_runtime` open, that closes it (on CUDA: unless the device's
/// shared runtime has other openers), freeing the blocks the hooks still
/// held; `leaked_blocks` (may be NULL) receives how many. With handles
/// open, the runtime stays open for them and `leaked_blocks` is 0. Refused
/// with XLOG_ERR_STREAM_MISUSE, changing nothing, where that close would be
/// refused: while a stream of the hook runtime takes part in a capture.
#[no_mangle]
pub extern "C" fn xlog_testing_interop_reset(device: i32, leaked_blocks: *mut u64) -> xlog_status {
    boundary("xlog_testing_interop_reset", |call| {
        let leaked = crate::hooks::reset_device(call.hooks(), device)?;
        if out_ptr(leaked_blocks, "leaked_blocks").is_ok() {
            write_out(leaked_blocks, leaked);
        }
        Ok(())
    })
}

/// Sim backend only: declare that the devices of `rt_a` and `rt_b` have no
/// peer capability (what `cuDeviceCanAccessPeer` = 0 means on CUDA), so
/// `xlog_enable_peer_access` between them fails with
/// XLOG_ERR_UNSATISFIABLE_DEPENDENCY. Lasts while both devices live.
/// XLOG_ERR_INVALID_ARGUMENT unless both are open sim runtimes.
#[no_mangle]
pub extern "C" fn xlog_sim_deny_peer_access(rt_a: *mut xlog_runtime, rt_b: *mut xlog_runtime) -> xlog_status {
    boundary("xlog_sim_deny_peer_access", |_| {
        let a = runtime_of(rt_a)?;
        let b = runtime_of(rt_b)?;
        match (a.sim(), b.sim()) {
            (Some(sa), Some(sb)) => {
                crate::device::sim_platform::deny_peer(sa, sb);
                Ok(())
            }
            _ => Err(ResourceError::InvalidArgument(
                "declaring a pair without peer capability needs two runtimes on the sim backend".into(),
            )),
        }
    })
}

/// Sim backend only: begin a stream capture on `stream` (a native stream
/// handle, imported like the framework hooks import theirs) directly on the
/// device, as a framework that calls `cudaStreamBeginCapture` itself does:
/// the runtime is not told (unlike `xlog_capture_begin`). `capture_out`
/// (may be NULL) receives the capture's id.
#[no_mangle]
pub extern "C" fn xlog_sim_stream_begin_capture(rt: *mut xlog_runtime, stream: *mut c_void, capture_out: *mut u64) -> xlog_status {
    boundary("xlog_sim_stream_begin_capture", |_| {
        let (runtime, raw) = sim_stream(rt, stream)?;
        let device = runtime.device();
        device.begin_capture(raw, CaptureMode::Global)?;
        let id = device.capture_of(raw)?.unwrap_or(0);
        if !capture_out.is_null() {
            write_out(capture_out, id);
        }
        Ok(())
    })
}

/// Sim backend only: end the capture begun on `stream` directly on the
/// device (`xlog_sim_stream_begin_capture`), as `cudaStreamEndCapture`
/// does: fails (XLOG_ERR_DRIVER) when the capture was invalidated.
/// `graph_out` (may be NULL) receives the graph token.
#[no_mangle]
pub extern "C" fn xlog_sim_stream_end_capture(rt: *mut xlog_runtime, stream: *mut c_void, graph_out: *mut u64) -> xlog_status {
    boundary("xlog_sim_stream_end_capture", |_| {
        let (runtime, raw) = sim_stream(rt, stream)?;
        let graph = runtime.device().end_capture(raw)?;
        if !graph_out.is_null() {
            write_out(graph_out, graph);
        }
        Ok(())
    })
}

/// `xlog_sim_touch`'s `claim`: check only.
pub const XLOG_SIM_TOUCH_CHECK: u32 = 0;
/// The block starts being used: its physical bytes must be in use by no
/// other block.
pub const XLOG_SIM_TOUCH_TAKE: u32 = 1;
/// The block's use ends: it gives back the physical bytes it took.
pub const XLOG_SIM_TOUCH_GIVE: u32 = 2;

/// Sim backend only: queue on `stream`, in its order, a check that the
/// `len` bytes at `ptr` are mapped with access for the device, as a kernel
/// using a block there would need (a GPU faults otherwise). With `claim`
/// TAKE / GIVE the block also takes / gives back the physical bytes behind
/// it: physical memory serving two blocks at once in stream order, or a
/// block remapped while in use, fails the check. Failures are counted:
/// `xlog_sim_touch_faults`.
#[no_mangle]
pub extern "C" fn xlog_sim_touch(rt: *mut xlog_runtime, stream: xlog_stream, ptr: u64, len: u64, claim: u32) -> xlog_status {
    boundary("xlog_sim_touch", |_| {
        let claim = match claim {
            XLOG_SIM_TOUCH_CHECK => Claim::None,
            XLOG_SIM_TOUCH_TAKE => Claim::Take,
            XLOG_SIM_TOUCH_GIVE => Claim::Give,
            other => return Err(ResourceError::InvalidArgument(format!("claim {other} is not XLOG_SIM_TOUCH_CHECK, _TAKE or _GIVE (0..2)"))),
        };
        let runtime = sim_runtime(rt, "xlog_sim_touch")?;
        let check = runtime.sim().expect("a sim runtime").access_check(ptr, len, claim);
        runtime.enqueue_host(stream_id(stream)?, check)
    })
}

/// Sim backend only: `count_out` receives how many `xlog_sim_touch` checks
/// that have run failed. With any, the call fails (XLOG_ERR_DRIVER: a GPU
/// would have faulted) and the error message is the first failure's.
#[no_mangle]
pub extern "C" fn xlog_sim_touch_faults(rt: *mut xlog_runtime, count_out: *mut u64) -> xlog_status {
    boundary("xlog_sim_touch_faults", |_| {
        out_ptr(count_out, "count_out")?;
        let (count, first) = sim_runtime(rt, "xlog_sim_touch_faults")?.sim().expect("a sim runtime").touch_faults();
        write_out(count_out, count);
        match first {
            Some(msg) if count > 0 => Err(ResourceError::Driver(format!("{count} access check(s) failed; the first: {msg}"))),
            _ => Ok(()),
        }
    })
}

/// The runtime of `rt`, which must be on the sim backend for `what`.
fn sim_runtime(rt: *mut xlog_runtime, what: &str) -> Result<std::sync::Arc<crate::runtime::Runtime>, ResourceError> {
    let runtime = runtime_of(rt)?;
    if runtime.sim().is_none() {
        return Err(ResourceError::InvalidArgument(format!("{what} needs a runtime on the sim backend")));
    }
    Ok(runtime)
}

/// The sim runtime of `rt` and the device stream of native handle `stream`.
fn sim_stream(rt: *mut xlog_runtime, stream: *mut c_void) -> Result<(std::sync::Arc<crate::runtime::Runtime>, u64), ResourceError> {
    let runtime = sim_runtime(rt, "capturing behind the runtime's back")?;
    let id = runtime.import_stream(stream as u64)?;
    let native = runtime.native_stream(id)?;
    let raw = runtime.device().import_stream(native)?;
    Ok((runtime, raw))
}
