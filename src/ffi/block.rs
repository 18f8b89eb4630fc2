//! Blocks one at a time: allocate, deallocate, validate, and the
//! prepare/finish pair around work that touches one block on a stream.
//! An `xlog_block` is a value handle: every call checks its generation
//! against the live block first, so a stale or forged handle is an error
//! and changes nothing. These are the hot calls: each makes one
//! thread-local access (the boundary's `Call`) and, on a runtime this
//! thread used last, takes no lock to find it.

// The C contract of each entry point (valid or NULL pointers) is in its doc
// comment, which is also the header's; no separate `# Safety` section.
#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_char, c_void, CStr};

use super::types::*;
use super::{boundary, invalid, out_ptr, stream_id, write_out};
use crate::error::ResourceError;
use crate::resource::{Access, AllocTag, BlockId, DeviceBlock, Generation, StreamId};

pub(super) fn access_of(access: xlog_access) -> Result<Access, ResourceError> {
    match access {
        XLOG_ACCESS_READ => Ok(Access::Read),
        XLOG_ACCESS_WRITE => Ok(Access::Write),
        XLOG_ACCESS_READ_WRITE => Ok(Access::ReadWrite),
        other => Err(invalid(format!(
            "access value {other} is not one of XLOG_ACCESS_READ (1), XLOG_ACCESS_WRITE (2), XLOG_ACCESS_READ_WRITE (3)"
        ))),
    }
}

#[inline]
pub(super) fn block_id(b: &xlog_block) -> BlockId {
    BlockId {
        ptr: b.ptr as u64,
        size: b.size,
        generation: Generation(b.generation),
        alloc_stream: StreamId(b.stream),
        device: b.device,
    }
}

pub(crate) fn block_of(d: &DeviceBlock) -> xlog_block {
    xlog_block {
        ptr: d.id.ptr as usize as *mut c_void,
        size: d.id.size,
        generation: d.id.generation.0,
        stream: d.id.alloc_stream.0,
        device: d.id.device,
    }
}

/// Allocate `bytes` ordered on `stream`, aligned to at least 256 bytes.
/// Zero bytes succeeds with `ptr == NULL`. `tag` (may be NULL) names the
/// caller in the log, leak reports and errors. A tag is kept to its first
/// 128 bytes (cut at a UTF-8 character boundary; invalid UTF-8 is replaced
/// by U+FFFD first): longer tags are cut, not refused, and tags that agree
/// in their first 128 bytes are one tag.
#[no_mangle]
pub unsafe extern "C" fn xlog_allocate(
    rt: *mut xlog_runtime,
    bytes: u64,
    stream: xlog_stream,
    tag: *const c_char,
    out: *mut xlog_block,
) -> xlog_status {
    boundary("xlog_allocate", |call| {
        out_ptr(out, "out")?;
        let tag = if tag.is_null() {
            AllocTag::UNTAGGED
        } else {
            // SAFETY: non-NULL; the caller guarantees a NUL-terminated string.
            AllocTag::from_bytes(unsafe { CStr::from_ptr(tag) }.to_bytes())
        };
        call.with_runtime(rt, |r| {
            let block = r.allocate_tagged(bytes, stream_id(stream)?, tag)?;
            write_out(out, block_of(&block));
            Ok(())
        })
    })
}

/// Free a block: its allocation stream waits for every recorded use on
/// other streams; then the memory goes to that stream's cache (the default;
/// reused by the next fitting allocation) or, with the cache off, its free
/// is queued there. Either way the handle is dead at once, and the bytes
/// stay charged to the budget (as cached or pending) until they are handed
/// back to the driver and `xlog_reap` sees that complete.
#[no_mangle]
pub extern "C" fn xlog_deallocate(rt: *mut xlog_runtime, block: xlog_block) -> xlog_status {
    boundary("xlog_deallocate", |call| {
        call.with_runtime(rt, |r| r.deallocate(&block_id(&block)).map(|_| ()))
    })
}

/// XLOG_OK if `block` is live in this runtime, else the reason, as every
/// block call reports it: XLOG_ERR_INVALID_ARGUMENT for a block of another
/// device (naming both devices) or one live in another open runtime (on
/// sim every open makes its own runtime; the message names its device);
/// XLOG_ERR_USE_AFTER_FREE for a handle no open runtime holds (freed, or
/// never issued).
#[no_mangle]
pub extern "C" fn xlog_block_validate(rt: *mut xlog_runtime, block: xlog_block) -> xlog_status {
    boundary("xlog_block_validate", |call| {
        call.with_runtime(rt, |r| r.validate(&block_id(&block)).map(|_| ()))
    })
}

/// Before enqueueing work on `stream` that touches `block`: queue the waits
/// it needs.
#[no_mangle]
pub extern "C" fn xlog_prepare(
    rt: *mut xlog_runtime,
    block: xlog_block,
    stream: xlog_stream,
    access: xlog_access,
) -> xlog_status {
    boundary("xlog_prepare", |call| {
        let access = access_of(access)?;
        call.with_runtime(rt, |r| r.prepare(&block_id(&block), stream_id(stream)?, access))
    })
}

/// After enqueueing work on `stream` that touched `block`: record it.
#[no_mangle]
pub extern "C" fn xlog_finish(
    rt: *mut xlog_runtime,
    block: xlog_block,
    stream: xlog_stream,
    access: xlog_access,
) -> xlog_status {
    boundary("xlog_finish", |call| {
        let access = access_of(access)?;
        call.with_runtime(rt, |r| r.finish(&block_id(&block), stream_id(stream)?, access))
    })
}
