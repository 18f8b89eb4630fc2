//! The library itself: its version, the names of status codes, and this
//! thread's last error message. These three touch no runtime: they work
//! anywhere, from inside a host callback too, and leave the last error as
//! it is (`Entry::Library`), so the message of a failed call can still be
//! read after them.

// The C contract of each entry point (valid or NULL pointers) is in its doc
// comment, which is also the header's; no separate `# Safety` section.
#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_char, CStr};

use super::types::*;
use super::{boundary, Entry};

/// Library version, "MAJOR.MINOR.PATCH". Never NULL.
#[no_mangle]
pub extern "C" fn xlog_version() -> *const c_char {
    static VERSION: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"unknown",
    };
    boundary(Entry::Library("xlog_version"), |_| Ok(VERSION.as_ptr()))
}

/// Name of a status code ("XLOG_ERR_OUT_OF_BUDGET"); "XLOG_STATUS_UNKNOWN"
/// for a value that is none. Never NULL.
#[no_mangle]
pub extern "C" fn xlog_status_name(status: xlog_status) -> *const c_char {
    boundary(Entry::Library("xlog_status_name"), |_| Ok(super::status_name(status).as_ptr()))
}

/// Copy this thread's last error message (from the most recent failed call
/// on this thread; empty after a call that succeeded) into `buf`, NUL
/// terminated and cut to `cap - 1` bytes. Returns the full message length
/// (without the NUL), so a call with `buf == NULL` or `cap == 0` sizes it.
#[no_mangle]
pub unsafe extern "C" fn xlog_last_error_message(buf: *mut c_char, cap: usize) -> usize {
    boundary(Entry::Library("xlog_last_error_message"), |call| {
        Ok(call.with_last_error(|msg| {
            if !buf.is_null() && cap > 0 {
                let n = msg.len().min(cap - 1);
                // SAFETY: non-NULL, and the caller guarantees `cap` writable
                // bytes at `buf`; we write n + 1 <= cap bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(msg.as_ptr(), buf as *mut u8, n);
                    *buf.add(n) = 0;
                }
            }
            msg.len()
        }))
    })
}
