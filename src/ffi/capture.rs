//! Stream capture into CUDA graphs begun through xlog: begin, end (the
//! graph and the capture's id), and the release of a capture's private
//! memory once its graphs are gone. The rules a capture imposes are in
//! docs/design.md, "Stream capture"; captures a framework begins itself are
//! announced through the hooks (`interop.rs`).

#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::c_void;

use super::types::*;
use super::{boundary, invalid, out_ptr, stream_id, write_out};
use crate::device::CaptureMode;
use crate::error::ResourceError;

fn capture_mode_of(mode: xlog_capture_mode) -> Result<CaptureMode, ResourceError> {
    match mode {
        XLOG_CAPTURE_GLOBAL => Ok(CaptureMode::Global),
        XLOG_CAPTURE_THREAD_LOCAL => Ok(CaptureMode::ThreadLocal),
        XLOG_CAPTURE_RELAXED => Ok(CaptureMode::Relaxed),
        other => Err(invalid(format!(
            "capture mode {other} is not one of XLOG_CAPTURE_GLOBAL (0), XLOG_CAPTURE_THREAD_LOCAL (1), XLOG_CAPTURE_RELAXED (2)"
        ))),
    }
}

/// Begin capturing `stream` into a CUDA graph (`cuStreamBeginCapture` on its
/// native stream). Until `xlog_capture_end`, blocks allocated on streams of
/// the capture come from the capture's own memory (their addresses stay
/// valid for every replay), prepare/finish there become graph dependencies,
/// and no xlog call queues a free, seals a batch or queries an event on a
/// capturing stream: xlog never invalidates the capture. A dependency the
/// graph cannot express (work outside the capture still running, or work
/// of another capture) is refused with XLOG_ERR_STREAM_MISUSE naming the
/// capture, and nothing changes. See docs/design.md, "Stream capture".
#[no_mangle]
pub extern "C" fn xlog_capture_begin(rt: *mut xlog_runtime, stream: xlog_stream, mode: xlog_capture_mode) -> xlog_status {
    boundary("xlog_capture_begin", |call| {
        let mode = capture_mode_of(mode)?;
        call.with_runtime(rt, |r| r.begin_capture(stream_id(stream)?, mode).map(|_| ()))
    })
}

/// End the capture begun on `stream`. `graph_out` receives the captured
/// graph (`CUgraph` on CUDA: the caller instantiates, launches and destroys
/// it; an opaque token on sim), `capture_out` (may be NULL) the capture id
/// for `xlog_capture_release`. Order each launch of the graph with
/// `xlog_prepare_all` / `xlog_finish_all` on the launch stream.
#[no_mangle]
pub extern "C" fn xlog_capture_end(
    rt: *mut xlog_runtime,
    stream: xlog_stream,
    graph_out: *mut *mut c_void,
    capture_out: *mut u64,
) -> xlog_status {
    boundary("xlog_capture_end", |call| {
        out_ptr(graph_out, "graph_out")?;
        call.with_runtime(rt, |r| {
            let (graph, id) = r.end_capture(stream_id(stream)?)?;
            write_out(graph_out, graph as usize as *mut c_void);
            if !capture_out.is_null() {
                write_out(capture_out, id);
            }
            Ok(())
        })
    })
}

/// After every graph made from capture `capture` has been destroyed: give
/// the capture's memory back to the driver (and the budget).
/// `released_bytes` (may be NULL) receives how much. Refused with
/// XLOG_ERR_STREAM_MISUSE, changing nothing, while the capture is still
/// capturing or blocks allocated in it are live. Close releases every
/// capture's memory.
#[no_mangle]
pub extern "C" fn xlog_capture_release(rt: *mut xlog_runtime, capture: u64, released_bytes: *mut u64) -> xlog_status {
    boundary("xlog_capture_release", |call| {
        call.with_runtime(rt, |r| {
            let bytes = r.release_capture(capture)?;
            if !released_bytes.is_null() {
                write_out(released_bytes, bytes);
            }
            Ok(())
        })
    })
}
