//! Giving memory back: retire completed frees (`xlog_reap`, never blocks),
//! wait for every queued free (`xlog_drain`), and hand cached memory back
//! to the driver (`xlog_trim`). Each reports the bytes it released through
//! an optional out-pointer.

#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use super::types::*;
use super::{boundary, write_out};

/// Retire pending frees whose GPU work has completed. Never blocks.
/// `reclaimed_bytes` (may be NULL) receives the bytes released.
#[no_mangle]
pub extern "C" fn xlog_reap(rt: *mut xlog_runtime, reclaimed_bytes: *mut u64) -> xlog_status {
    boundary("xlog_reap", |call| {
        call.with_runtime(rt, |r| {
            let bytes = r.reap()?;
            if !reclaimed_bytes.is_null() {
                write_out(reclaimed_bytes, bytes);
            }
            Ok(())
        })
    })
}

/// Give cached memory back to the driver until at most `keep_bytes` stay
/// cached (`keep_bytes = 0` empties every stream's cache, like
/// `torch.cuda.empty_cache()`). Waits for those frees to complete, so the
/// budget and `reserved_bytes` drop by what was released. `released_bytes`
/// (may be NULL) receives the cached bytes handed back.
#[no_mangle]
pub extern "C" fn xlog_trim(rt: *mut xlog_runtime, keep_bytes: u64, released_bytes: *mut u64) -> xlog_status {
    boundary("xlog_trim", |call| {
        call.with_runtime(rt, |r| {
            let trimmed = r.trim(keep_bytes)?;
            if !released_bytes.is_null() {
                write_out(released_bytes, trimmed.released);
            }
            Ok(())
        })
    })
}

/// Wait until every free queued so far has completed, then reap.
/// `reclaimed_bytes` (may be NULL) receives the bytes released.
#[no_mangle]
pub extern "C" fn xlog_drain(rt: *mut xlog_runtime, reclaimed_bytes: *mut u64) -> xlog_status {
    boundary("xlog_drain", |call| {
        call.with_runtime(rt, |r| {
            let bytes = r.drain()?;
            if !reclaimed_bytes.is_null() {
                write_out(reclaimed_bytes, bytes);
            }
            Ok(())
        })
    })
}
