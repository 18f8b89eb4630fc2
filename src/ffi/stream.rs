//! Streams: acquired from a runtime's bounded pool, imported from a
//! foreign `cudaStream_t`, released, synchronised, and host callbacks
//! queued on them. Ids are never reused, and a stream that takes part in a
//! capture refuses what would invalidate it (release, synchronize).

#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::c_void;

use super::types::*;
use super::{boundary, invalid, out_ptr, stream_id, write_out};

/// Take a stream from the bounded pool (XLOG_ERR_POOL_EXHAUSTED past
/// `stream_pool_size`). Ids are never reused: once this process has issued
/// every id (1 to UINT32_MAX - 1, over acquires and imports), acquire and
/// import fail with XLOG_ERR_POOL_EXHAUSTED.
#[no_mangle]
pub extern "C" fn xlog_stream_acquire(rt: *mut xlog_runtime, out: *mut xlog_stream) -> xlog_status {
    boundary("xlog_stream_acquire", |call| {
        out_ptr(out, "out")?;
        call.with_runtime(rt, |r| {
            write_out(out, r.acquire_stream()?.0);
            Ok(())
        })
    })
}

/// Give a stream back; its id is invalid afterwards. Queued work still runs.
/// Refused with XLOG_ERR_STREAM_MISUSE, naming the capture and changing
/// nothing, while the stream takes part in a capture (begun on it, or
/// joined by a wait on captured work): end the capture first. The pool
/// never hands out a stream that captures. An imported stream is released
/// only once no block allocated on it is live (each block's free is
/// ordered on its allocation stream, and the stream's owner may destroy it
/// once xlog lets go): refused with XLOG_ERR_STREAM_MISUSE, naming the
/// blocks and their bytes and changing nothing, while some are. Released,
/// it is waited for on the host, and nothing of xlog's is queued on it
/// afterwards.
#[no_mangle]
pub extern "C" fn xlog_stream_release(rt: *mut xlog_runtime, stream: xlog_stream) -> xlog_status {
    boundary("xlog_stream_release", |call| call.with_runtime(rt, |r| r.release_stream(stream_id(stream)?)))
}

/// Adopt a foreign `cudaStream_t` (NULL is the legacy default stream). The
/// same native stream maps to the same id until that id is released.
/// On sim each distinct foreign handle runs a worker thread until the
/// runtime closes, so a runtime imports at most `stream_pool_size` distinct
/// foreign handles (XLOG_ERR_POOL_EXHAUSTED beyond); a handle imported
/// before, or a stream of the runtime itself, can always be imported again.
#[no_mangle]
pub extern "C" fn xlog_stream_import(
    rt: *mut xlog_runtime,
    cuda_stream: *mut c_void,
    out: *mut xlog_stream,
) -> xlog_status {
    boundary("xlog_stream_import", |call| {
        out_ptr(out, "out")?;
        call.with_runtime(rt, |r| {
            write_out(out, r.import_stream(cuda_stream as u64)?.0);
            Ok(())
        })
    })
}

/// The native `cudaStream_t` of a stream (an opaque token on sim).
#[no_mangle]
pub extern "C" fn xlog_stream_native(
    rt: *mut xlog_runtime,
    stream: xlog_stream,
    out_cuda_stream: *mut *mut c_void,
) -> xlog_status {
    boundary("xlog_stream_native", |call| {
        out_ptr(out_cuda_stream, "out_cuda_stream")?;
        call.with_runtime(rt, |r| {
            let native = r.native_stream(stream_id(stream)?)?;
            write_out(out_cuda_stream, native as usize as *mut c_void);
            Ok(())
        })
    })
}

/// Block until all work queued on `stream` has completed. Refused with
/// XLOG_ERR_STREAM_MISUSE, changing nothing, while the stream takes part in
/// a capture (a host wait there would invalidate the capture).
#[no_mangle]
pub extern "C" fn xlog_stream_synchronize(rt: *mut xlog_runtime, stream: xlog_stream) -> xlog_status {
    boundary("xlog_stream_synchronize", |call| call.with_runtime(rt, |r| r.synchronize(stream_id(stream)?)))
}

struct UserData(*mut c_void);
// SAFETY: the pointer is only handed back to the caller's own callback; the
// caller is responsible for what it points at being usable from the thread
// that runs stream callbacks, as with cuLaunchHostFunc.
unsafe impl Send for UserData {}

/// Run `fn(user)` on a host thread once all earlier work on `stream` is
/// done; later work on the stream waits for it (`cuLaunchHostFunc` on CUDA,
/// a worker thread of the stream on sim).
///
/// No xlog call from inside `fn`, on either backend: every entry point that
/// returns a status (on any runtime, including xlog_runtime_open/close and
/// xlog_config_from_env) returns XLOG_ERR_STREAM_MISUSE there, with a
/// message saying why, and changes nothing; the framework hooks refuse too
/// (NULL from the malloc hooks, nothing freed by the free hooks). Only
/// xlog_version, xlog_status_name and xlog_last_error_message work. The
/// reasons: on CUDA a host function must not call the driver at all, and a
/// call that waits for the callback's own stream (drain, close, synchronize,
/// an allocation waiting on budget pressure) would never return. `fn` may
/// touch host memory (on sim, block memory through its pointer) and signal
/// other threads.
///
/// xlog_runtime_close waits for every callback already queued on the
/// runtime's streams, running or not yet started, before it frees anything,
/// so a callback never has a block freed under it; a callback that waits for
/// something done only after the close returns therefore blocks the close.
#[no_mangle]
pub extern "C" fn xlog_stream_enqueue_host(
    rt: *mut xlog_runtime,
    stream: xlog_stream,
    func: xlog_host_fn,
    user: *mut c_void,
) -> xlog_status {
    boundary("xlog_stream_enqueue_host", |call| {
        let f = func.ok_or_else(|| invalid("fn is NULL".into()))?;
        call.with_runtime(rt, |r| {
            let data = UserData(user);
            r.enqueue_host(
                stream_id(stream)?,
                Box::new(move || {
                    let data = data;
                    f(data.0)
                }),
            )
        })
    })
}
