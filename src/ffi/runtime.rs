//! A runtime's life: open (a handle registered in the boundary's handle
//! table), the three closes, and its backend. A close unregisters the
//! handle first, so no other call can reach a runtime being closed; a close
//! the runtime refuses before it changed anything (a stream takes part in
//! a capture) puts the handle back, and the caller's handle stays open.

// The C contract of each entry point (valid or NULL pointers) is in its doc
// comment, which is also the header's; no separate `# Safety` section.
#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use super::config::{backend_code, config_of};
use super::types::*;
use super::{boundary, invalid, out_ptr, register_runtime, unregister_runtime, write_out};
use crate::error::ResourceError;
use crate::runtime::Runtime;

/// Open the runtime of device `device`: a CUDA ordinal, or on sim an
/// ordinal below the number of devices the sim backend simulates
/// (`cfg->sim_devices`, from `XLOG_SIM_DEVICES`, default 1); an ordinal at
/// or past it is XLOG_ERR_NO_DEVICE, a negative one
/// XLOG_ERR_INVALID_ARGUMENT. `cfg` may be NULL for defaults plus
/// environment. On CUDA, opens of one ordinal share one runtime (and one
/// budget); each open needs a close.
#[no_mangle]
pub unsafe extern "C" fn xlog_runtime_open(
    device: i32,
    cfg: *const xlog_config,
    out: *mut *mut xlog_runtime,
) -> xlog_status {
    boundary("xlog_runtime_open", |_| {
        out_ptr(out, "out")?;
        let config = config_of(cfg)?;
        let rt = Runtime::open(device, &config)?;
        write_out(out, register_runtime(rt));
        Ok(())
    })
}

/// Close a runtime handle. The last close of a runtime waits for the work
/// already queued on its streams (host callbacks included), frees blocks
/// still live (each reported on stderr and in the log as a leak), waits for
/// pending frees and destroys its streams. The handle is invalid afterwards
/// even if an error is returned, except when the close is refused
/// (XLOG_ERR_STREAM_MISUSE, nothing changed, the handle stays open): from
/// inside a host callback, or, for the last close of a runtime, while one of
/// its streams takes part in a capture (close would wait for that stream,
/// which invalidates the capture): end the capture, then close.
#[no_mangle]
pub extern "C" fn xlog_runtime_close(rt: *mut xlog_runtime) -> xlog_status {
    boundary("xlog_runtime_close", |_| close_runtime(rt).map(|_| ()))
}

/// `xlog_runtime_close` that also reports how many blocks and bytes were
/// still live (leaked) at close. Either out-pointer may be NULL.
/// `xlog_runtime_close_detailed` also counts the streams never released.
#[no_mangle]
pub extern "C" fn xlog_runtime_close_report(
    rt: *mut xlog_runtime,
    leaked_blocks: *mut u64,
    leaked_bytes: *mut u64,
) -> xlog_status {
    boundary("xlog_runtime_close_report", |_| {
        let report = close_runtime(rt)?;
        if !leaked_blocks.is_null() {
            write_out(leaked_blocks, report.leaked_blocks);
        }
        if !leaked_bytes.is_null() {
            write_out(leaked_bytes, report.leaked_bytes);
        }
        Ok(())
    })
}

/// `xlog_runtime_close` that fills `out` with what the last close found:
/// the blocks still live (freed by the close, each named on stderr and in
/// the log as a `leak`) and the pooled streams acquired and never released
/// (released by the close, each named on stderr and in the log as an
/// `unreleased stream`). A close that only drops one reference of a shared
/// (CUDA) runtime reports zeros. Set `out->struct_size` first; `out` NULL
/// or a `struct_size` smaller than the first layout is
/// XLOG_ERR_INVALID_ARGUMENT and closes nothing.
#[no_mangle]
pub extern "C" fn xlog_runtime_close_detailed(rt: *mut xlog_runtime, out: *mut xlog_close_report) -> xlog_status {
    boundary("xlog_runtime_close_detailed", |_| {
        out_ptr(out, "out")?;
        let declared = declared_report_size(out);
        let full = std::mem::size_of::<xlog_close_report>();
        if declared < full {
            return Err(invalid(format!(
                "close report struct_size is {declared}: set it to sizeof(xlog_close_report) ({full} with \
                 this header) before calling xlog_runtime_close_detailed; the runtime was not closed"
            )));
        }
        let report = close_runtime(rt)?;
        write_out(out, xlog_close_report { struct_size: full as u32, ..report });
        Ok(())
    })
}

/// The `struct_size` a caller set in its close report.
fn declared_report_size(out: *mut xlog_close_report) -> usize {
    // SAFETY: `out` was checked non-NULL; the caller guarantees its leading
    // u32 is readable (the same contract as xlog_get_stats).
    unsafe { std::ptr::addr_of!((*out).struct_size).read() as usize }
}

/// The close of every close entry point (inside the caller's boundary, so
/// messages name the entry point called): the last close's counts.
fn close_runtime(rt: *mut xlog_runtime) -> Result<xlog_close_report, ResourceError> {
    // A refusal (a stream captures) leaves the handle open: checked before
    // the handle goes, and again by the close itself, which can only refuse
    // before it changed anything (a capture begun in between): the handle
    // then comes back.
    super::runtime_of(rt)?.check_close_allowed()?;
    let runtime = unregister_runtime(rt)?;
    let report = match runtime.close() {
        Err(e) if !runtime.is_closed() => {
            super::reregister_runtime(rt, runtime);
            return Err(e);
        }
        other => other?,
    };
    Ok(xlog_close_report {
        struct_size: std::mem::size_of::<xlog_close_report>() as u32,
        leaked_blocks: report.leaked.len() as u64,
        leaked_bytes: report.leaked.iter().map(|b| b.id.size).sum(),
        unreleased_streams: report.unreleased_streams.len() as u64,
    })
}

/// The backend a runtime runs on (XLOG_BACKEND_CUDA or XLOG_BACKEND_SIM).
#[no_mangle]
pub extern "C" fn xlog_runtime_backend(rt: *mut xlog_runtime, out: *mut xlog_backend) -> xlog_status {
    boundary("xlog_runtime_backend", |call| {
        out_ptr(out, "out")?;
        call.with_runtime(rt, |r| {
            write_out(out, backend_code(r.backend()));
            Ok(())
        })
    })
}
