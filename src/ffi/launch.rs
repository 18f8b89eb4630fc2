//! Recorded launches: `xlog_prepare_all` / `xlog_finish_all` over every
//! block a kernel touches, each all-or-nothing (every handle and access is
//! checked before anything is queued or recorded), and peer access, which
//! lets a launch on one device's stream use another device's blocks.
//! A launch of up to `INLINE_USES` blocks is converted on the stack.

// The C contract of each entry point (valid or NULL pointers) is in its doc
// comment, which is also the header's; no separate `# Safety` section.
#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use super::block::{access_of, block_id};
use super::types::*;
use super::{boundary, invalid, runtime_of, stream_id};
use crate::error::ResourceError;
use crate::resource::{Access, BlockUse};

/// Most uses one recorded launch may name.
const MAX_USES: usize = 1 << 20;

/// Launches of at most this many uses are converted on the stack: the
/// recorded-launch path allocates nothing per call.
const INLINE_USES: usize = 16;

/// `f` applied to the launch's uses, converted and checked (each access a
/// known value). Written straight into a stack array (an `InlineList` push
/// per use cost about 28 ns on this path: each 40-byte use went through an
/// out-of-line call and back through the stack); a heap buffer past
/// `INLINE_USES`.
fn with_uses<T>(
    uses: *const xlog_use,
    n: usize,
    f: impl FnOnce(&[BlockUse]) -> Result<T, ResourceError>,
) -> Result<T, ResourceError> {
    if n == 0 {
        return f(&[]);
    }
    if uses.is_null() {
        return Err(invalid(format!("uses is NULL but n is {n}")));
    }
    if n > MAX_USES {
        return Err(invalid(format!("n = {n} uses exceeds the limit of {MAX_USES} per launch")));
    }
    // SAFETY: non-NULL, n bounded; the caller guarantees `uses` points at n
    // initialised xlog_use values (plain data, any bit pattern is valid).
    let slice = unsafe { std::slice::from_raw_parts(uses, n) };
    // Every access checked first; then the conversion cannot fail and
    // writes each use in place (no Result per use to move around).
    if let Some((i, u)) = slice.iter().enumerate().find(|(_, u)| access_of(u.access).is_err()) {
        return Err(access_of(u.access).map_err(|e| invalid(format!("uses[{i}]: {e}"))).unwrap_err());
    }
    let access = |u: &xlog_use| match u.access {
        XLOG_ACCESS_READ => Access::Read,
        XLOG_ACCESS_WRITE => Access::Write,
        _ => Access::ReadWrite,
    };
    if n <= INLINE_USES {
        let mut out = [BlockUse::default(); INLINE_USES];
        for (slot, u) in out.iter_mut().zip(slice) {
            slot.block = block_id(&u.block);
            slot.access = access(u);
        }
        f(&out[..n])
    } else {
        let out: Vec<BlockUse> = slice.iter().map(|u| BlockUse { block: block_id(&u.block), access: access(u) }).collect();
        f(&out)
    }
}

/// `xlog_prepare` for every block of a launch. All handles are validated
/// first; on any error nothing is queued.
#[no_mangle]
pub unsafe extern "C" fn xlog_prepare_all(
    rt: *mut xlog_runtime,
    stream: xlog_stream,
    uses: *const xlog_use,
    n: usize,
) -> xlog_status {
    boundary("xlog_prepare_all", |call| {
        with_uses(uses, n, |uses| call.with_runtime(rt, |r| r.prepare_all(stream_id(stream)?, uses)))
    })
}

/// `xlog_finish` for every block of a launch, with one event. All handles
/// are validated first; on any error nothing is recorded.
#[no_mangle]
pub unsafe extern "C" fn xlog_finish_all(
    rt: *mut xlog_runtime,
    stream: xlog_stream,
    uses: *const xlog_use,
    n: usize,
) -> xlog_status {
    boundary("xlog_finish_all", |call| {
        with_uses(uses, n, |uses| call.with_runtime(rt, |r| r.finish_all(stream_id(stream)?, uses)))
    })
}

/// Let the runtimes of two devices use each other's memory: enables peer
/// access both ways (CUDA: `cuCtxEnablePeerAccess` from each device's
/// context), after which a stream of one may be passed to `xlog_prepare`,
/// `xlog_finish`, `xlog_prepare_all` and `xlog_finish_all` of the other for
/// its blocks. Call once per device pair; calling again is XLOG_OK.
/// XLOG_ERR_UNSATISFIABLE_DEPENDENCY, naming both devices, where the pair
/// has no peer access (`cuDeviceCanAccessPeer` reports 0);
/// XLOG_ERR_INVALID_ARGUMENT for NULL or closed handles, two handles of one
/// device, or runtimes of different backends.
#[no_mangle]
pub extern "C" fn xlog_enable_peer_access(rt_a: *mut xlog_runtime, rt_b: *mut xlog_runtime) -> xlog_status {
    boundary("xlog_enable_peer_access", |_| {
        let a = runtime_of(rt_a)?;
        let b = runtime_of(rt_b)?;
        a.enable_peer_access(&b)
    })
}
