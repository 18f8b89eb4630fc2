//! The exported C functions. Each body is one call to `boundary`, so every
//! entry point shares one panic guard and one error path. Functions are
//! written out literally (no macros) because cbindgen does not expand them.

#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::Mutex;

use super::types::*;
use crate::resource::AllocTag;
use super::{boundary, out_ptr, register_runtime, unregister_runtime, write_out, Entry};
use crate::config::{AllocatorKind, Config};
use crate::device::{Backend, CaptureMode};
use crate::error::ResourceError;
use crate::resource::{Access, BlockId, BlockUse, DeviceBlock, Generation, StreamId};
use crate::runtime::{Runtime, Stats};

/// Most uses one recorded launch may name.
const MAX_USES: usize = 1 << 20;

pub(crate) fn invalid(msg: String) -> ResourceError {
    ResourceError::InvalidArgument(msg)
}

pub(crate) fn stream_id(stream: xlog_stream) -> Result<StreamId, ResourceError> {
    if stream == 0 {
        return Err(invalid("stream 0 is never a valid stream id".into()));
    }
    Ok(StreamId(stream))
}

fn access_of(access: xlog_access) -> Result<Access, ResourceError> {
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
fn block_id(b: &xlog_block) -> BlockId {
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

fn backend_of(value: xlog_backend) -> Result<Backend, ResourceError> {
    match value {
        XLOG_BACKEND_AUTO => Ok(Backend::Auto),
        XLOG_BACKEND_CUDA => Ok(Backend::Cuda),
        XLOG_BACKEND_SIM => Ok(Backend::Sim),
        other => Err(invalid(format!(
            "backend value {other} is not one of XLOG_BACKEND_AUTO (0), XLOG_BACKEND_CUDA (1), XLOG_BACKEND_SIM (2)"
        ))),
    }
}

fn backend_code(b: Backend) -> xlog_backend {
    match b {
        Backend::Auto => XLOG_BACKEND_AUTO,
        Backend::Cuda => XLOG_BACKEND_CUDA,
        Backend::Sim => XLOG_BACKEND_SIM,
    }
}

fn allocator_of(value: xlog_allocator) -> Result<AllocatorKind, ResourceError> {
    match value {
        XLOG_ALLOCATOR_ASYNC => Ok(AllocatorKind::Async),
        XLOG_ALLOCATOR_DIRECT => Ok(AllocatorKind::Direct),
        other => Err(invalid(format!(
            "allocator value {other} is not one of XLOG_ALLOCATOR_ASYNC (0), XLOG_ALLOCATOR_DIRECT (1)"
        ))),
    }
}

/// Keep a C copy of a log path alive for the process, so a config filled
/// from the environment can point at it.
fn interned_path(path: &std::path::Path) -> *const c_char {
    static PATHS: once_cell::sync::Lazy<Mutex<HashMap<PathBuf, CString>>> =
        once_cell::sync::Lazy::new(|| Mutex::new(HashMap::new()));
    use std::os::unix::ffi::OsStrExt;
    let mut paths = PATHS.lock().unwrap_or_else(|p| p.into_inner());
    let c = paths.entry(path.to_path_buf()).or_insert_with(|| {
        CString::new(path.as_os_str().as_bytes()).unwrap_or_else(|_| CString::from(c"<invalid path>"))
    });
    c.as_ptr()
}

fn fill_config(out: &mut xlog_config, cfg: &Config) {
    *out = xlog_config {
        struct_size: std::mem::size_of::<xlog_config>() as u32,
        backend: backend_code(cfg.backend),
        allocator: match cfg.allocator {
            AllocatorKind::Async => XLOG_ALLOCATOR_ASYNC,
            AllocatorKind::Direct => XLOG_ALLOCATOR_DIRECT,
        },
        budget_bytes: cfg.budget_bytes,
        stream_pool_size: cfg.stream_pool_size,
        log_path: cfg.log_path.as_deref().map_or(std::ptr::null(), interned_path),
        sim_capacity_bytes: cfg.sim_capacity_bytes,
        wait_on_pressure: cfg.wait_on_pressure as u8,
        cache: cfg.cache as u8,
        pool_release_threshold: cfg.pool_release_threshold,
        track_call_sites: cfg.track_call_sites as u8,
        sim_devices: cfg.sim_devices,
        memory: if cfg.arena { XLOG_MEMORY_ARENA } else { XLOG_MEMORY_POOL },
    };
}

pub(crate) fn config_of(cfg: *const xlog_config) -> Result<Config, ResourceError> {
    if cfg.is_null() {
        return Config::from_env();
    }
    // SAFETY: non-NULL; the caller guarantees it points at an xlog_config.
    // Every field is plain data or a pointer we only read as a C string.
    let c = unsafe { &*cfg };
    if c.struct_size == 0 {
        let why = match Config::from_env() {
            Err(e) => e.to_string(),
            Ok(_) => "struct_size is 0: initialise the config with xlog_config_init".into(),
        };
        return Err(invalid(format!("config is not usable: {why}")));
    }
    let expected = std::mem::size_of::<xlog_config>() as u32;
    if c.struct_size != expected {
        return Err(invalid(format!(
            "config struct_size is {} but this library's xlog_config is {expected} bytes: \
             initialise it with xlog_config_init from the header matching the library",
            c.struct_size
        )));
    }
    if c.wait_on_pressure > 1 {
        return Err(invalid(format!("wait_on_pressure is {} (must be 0 or 1)", c.wait_on_pressure)));
    }
    if c.cache > 1 {
        return Err(invalid(format!("cache is {} (must be 0 or 1)", c.cache)));
    }
    if c.memory > XLOG_MEMORY_POOL {
        return Err(invalid(format!(
            "memory is {} (must be XLOG_MEMORY_ARENA {XLOG_MEMORY_ARENA} or XLOG_MEMORY_POOL {XLOG_MEMORY_POOL})",
            c.memory
        )));
    }
    if c.track_call_sites > 1 {
        return Err(invalid(format!("track_call_sites is {} (must be 0 or 1)", c.track_call_sites)));
    }
    let log_path = if c.log_path.is_null() {
        None
    } else {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: non-NULL; the caller guarantees a NUL-terminated string.
        let bytes = unsafe { CStr::from_ptr(c.log_path) }.to_bytes();
        if bytes.is_empty() {
            None
        } else {
            Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
        }
    };
    let config = Config {
        backend: backend_of(c.backend)?,
        allocator: allocator_of(c.allocator)?,
        budget_bytes: c.budget_bytes,
        stream_pool_size: c.stream_pool_size,
        log_path,
        sim_capacity_bytes: c.sim_capacity_bytes,
        wait_on_pressure: c.wait_on_pressure == 1,
        cache: c.cache == 1,
        pool_release_threshold: c.pool_release_threshold,
        track_call_sites: c.track_call_sites == 1,
        sim_devices: c.sim_devices,
        arena: c.memory == XLOG_MEMORY_ARENA,
    };
    config.validate()?;
    Ok(config)
}

fn stats_of(s: &Stats) -> xlog_stats {
    xlog_stats {
        struct_size: std::mem::size_of::<xlog_stats>() as u32,
        live_bytes: s.live_bytes,
        pending_bytes: s.pending_bytes,
        outstanding_bytes: s.outstanding_bytes,
        peak_outstanding_bytes: s.peak_outstanding_bytes,
        budget_limit: s.budget_limit,
        budget_remaining: s.budget_remaining,
        live_blocks: s.live_blocks,
        pending_blocks: s.pending_blocks,
        allocations: s.allocations,
        deallocations: s.deallocations,
        failed_allocations: s.failed_allocations,
        cached_bytes: s.cached_bytes,
        cached_blocks: s.cached_blocks,
        cache_hits: s.cache_hits,
        cache_misses: s.cache_misses,
        reserved_bytes: s.reserved_bytes,
        log_lines_lost: s.log_lines_lost,
        peak_live_bytes: s.peak_live_bytes,
        peak_live_blocks: s.peak_live_blocks,
        alloc_retries: s.alloc_retries,
    }
}

/// Size of the first `xlog_stats` layout (through `failed_allocations`):
/// the smallest `struct_size` a caller may pass.
const STATS_V1_SIZE: usize = std::mem::offset_of!(xlog_stats, failed_allocations) + 8;

/// Copy the fields of `stats` that fit in the caller's `struct_size`.
fn write_stats(out: *mut xlog_stats, stats: &xlog_stats) -> Result<(), ResourceError> {
    // SAFETY: `out` was checked non-NULL; the caller guarantees at least
    // `struct_size` writable bytes there, and the leading u32 is readable.
    let declared = unsafe { std::ptr::addr_of!((*out).struct_size).read() } as usize;
    if declared < STATS_V1_SIZE {
        return Err(invalid(format!(
            "stats struct_size is {declared}: set it to sizeof(xlog_stats) ({} with this header) \
             before calling xlog_get_stats (at least {STATS_V1_SIZE})",
            std::mem::size_of::<xlog_stats>()
        )));
    }
    let n = declared.min(std::mem::size_of::<xlog_stats>());
    let mut filled = *stats;
    filled.struct_size = n as u32;
    // SAFETY: both regions are valid for `n` bytes (ours is a whole
    // xlog_stats, n ≤ its size; the caller's holds `declared` ≥ n bytes)
    // and do not overlap (ours is a local).
    unsafe {
        std::ptr::copy_nonoverlapping((&filled as *const xlog_stats).cast::<u8>(), out.cast::<u8>(), n);
    }
    Ok(())
}

// ===================================================================== //
// Library                                                                //
// ===================================================================== //

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
        let msg = call.last_error();
        if !buf.is_null() && cap > 0 {
            let n = msg.len().min(cap - 1);
            // SAFETY: non-NULL, and the caller guarantees `cap` writable
            // bytes at `buf`; we write n + 1 <= cap bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(msg.as_ptr(), buf as *mut u8, n);
                *buf.add(n) = 0;
            }
        }
        Ok(msg.len())
    })
}

/// Fill `cfg` with defaults, then apply `XLOG_BACKEND`, `XLOG_BUDGET_BYTES`
/// and `XLOG_LOG_PATH`. If one of them is malformed, `cfg->struct_size` is
/// set to 0 (so `xlog_runtime_open` refuses it with the reason) and the
/// message is available from `xlog_last_error_message`.
#[no_mangle]
pub unsafe extern "C" fn xlog_config_init(cfg: *mut xlog_config) {
    boundary(Entry::Library("xlog_config_init"), |_| {
        // SAFETY: same contract as ours: `cfg` is NULL or points at a config.
        let _ = unsafe { xlog_config_from_env(cfg) };
        Ok(())
    })
}

/// `xlog_config_init` that also returns the status: XLOG_OK, or
/// XLOG_ERR_INVALID_ARGUMENT for a NULL `cfg` or a malformed variable.
#[no_mangle]
pub unsafe extern "C" fn xlog_config_from_env(cfg: *mut xlog_config) -> xlog_status {
    boundary("xlog_config_from_env", |_| {
        out_ptr(cfg, "cfg")?;
        let mut out = xlog_config {
            struct_size: 0,
            backend: 0,
            allocator: 0,
            budget_bytes: 0,
            stream_pool_size: 0,
            log_path: std::ptr::null(),
            sim_capacity_bytes: 0,
            wait_on_pressure: 0,
            cache: 0,
            pool_release_threshold: 0,
            track_call_sites: 0,
            sim_devices: 0,
            memory: 0,
        };
        let mut config = Config::default();
        let env = config.apply_env(|name| std::env::var_os(name));
        fill_config(&mut out, &config);
        if env.is_err() {
            out.struct_size = 0;
        }
        write_out(cfg, out);
        env
    })
}

// ===================================================================== //
// Runtime                                                                //
// ===================================================================== //

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

/// Current statistics.
#[no_mangle]
pub extern "C" fn xlog_get_stats(rt: *mut xlog_runtime, out: *mut xlog_stats) -> xlog_status {
    boundary("xlog_get_stats", |call| {
        out_ptr(out, "out")?;
        call.with_runtime(rt, |r| write_stats(out, &stats_of(&r.stats()?)))
    })
}

// ===================================================================== //
// Streams                                                                //
// ===================================================================== //

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
/// never hands out a stream that captures.
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

// ===================================================================== //
// Blocks                                                                 //
// ===================================================================== //

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
        let a = super::runtime_of(rt_a)?;
        let b = super::runtime_of(rt_b)?;
        a.enable_peer_access(&b)
    })
}

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
