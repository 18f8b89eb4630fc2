//! Framework hooks: PyTorch's `CUDAPluggableAllocator` and CuPy's
//! `CFunctionAllocator` call these to allocate through the per-device
//! runtime, so frameworks and engines in one process share one budget, one
//! set of stats and one log.
//!
//! The hook runtime of a device is opened on first use from the environment
//! (`XLOG_BACKEND`, `XLOG_BUDGET_BYTES`, `XLOG_LOG_PATH`), or from the
//! config given earlier to `xlog_interop_configure`. Frameworks free by
//! pointer, so the hooks keep a pointer → block map. Foreign streams are
//! imported on first sight (the stream pool caches them by native handle).

// The C contract of each entry point (valid or NULL pointers) is in its doc
// comment, which is also the header's; no separate `# Safety` section.
#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::resource::AllocTag;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::config::config_of;
use super::types::*;
use super::hook_index::{HookBlock, HookIndex, Reservation};
use super::{boundary, out_ptr, register_runtime, with_hook_thread, write_out};
use crate::config::Config;
use crate::error::ResourceError;
use crate::resource::Access;
use crate::runtime::{check_ordinal, Runtime};

/// Reap after this many hook frees of a device on a thread, so pending
/// bytes do not pile up between budget-pressure reaps.
const REAP_EVERY: u32 = 32;

/// Devices whose frees a thread counts apart (see `HookThread::frees`).
const REAP_DEVICES: usize = 8;

pub(crate) struct Hooks {
    runtime: Arc<Runtime>,
    /// Pointer → block of what the hooks handed out (contract in
    /// `hook_index.rs`).
    blocks: HookIndex,
}

#[derive(Default)]
struct HookTable {
    configs: HashMap<i32, Config>,
    hooks: HashMap<i32, Arc<Hooks>>,
}

fn table() -> MutexGuard<'static, HookTable> {
    static TABLE: once_cell::sync::Lazy<Mutex<HookTable>> = once_cell::sync::Lazy::new(Default::default);
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The hooks of `device`, opening its runtime on first use.
/// Bumped whenever the table's hooks change, so the per-thread copy below
/// is used only while it is still the table's.
static HOOKS_EPOCH: AtomicU64 = AtomicU64::new(0);

/// What the hooks keep per thread. It lives in the boundary's one
/// thread-local (`ffi::FfiThread`): in a shared library every
/// thread-local access is a call into the dynamic loader, and a hook call
/// reaches this and its last-error message with one.
pub(crate) struct HookThread {
    /// The hooks this thread used last: (device, epoch, hooks). Frameworks
    /// call the hooks of one device over and over; this spares them the
    /// process-wide table lock.
    last: RefCell<Option<(i32, u64, Arc<Hooks>)>>,
    /// Hook frees this thread made, per device: (device, frees since the
    /// last reap). Counted here, not in a shared counter, so that a free
    /// writes no cache line another thread's free writes too. Exact for up
    /// to `REAP_DEVICES` devices a thread frees on; beyond, the last entry
    /// is reused and its count starts again.
    frees: [Cell<Option<(i32, u32)>>; REAP_DEVICES],
    /// The index slot this thread kept from its last hook free, for its
    /// next hook allocation (`hook_index.rs`, "Reuse"): always one of the
    /// hooks in `last`, given back before `last` changes.
    reserved: Reservation,
}

impl HookThread {
    pub(crate) const fn new() -> HookThread {
        HookThread {
            last: RefCell::new(None),
            frees: [const { Cell::new(None) }; REAP_DEVICES],
            reserved: Reservation::new(),
        }
    }

    /// Forget the hooks this thread used last, giving back its reserved
    /// slot in them; the caller drops them (outside any borrow).
    fn forget_last(&self) -> Option<(i32, u64, Arc<Hooks>)> {
        let last = self.last.borrow_mut().take();
        if let Some((_, _, h)) = &last {
            h.blocks.release(&self.reserved);
        }
        last
    }

    /// Count a hook free of `device` on this thread: true when it is one
    /// after which to reap (every `REAP_EVERY` of them).
    fn count_free(&self, device: i32) -> bool {
        let mut unused = None;
        for cell in &self.frees {
            match cell.get() {
                Some((d, frees)) if d == device => {
                    let frees = frees + 1;
                    cell.set(Some((d, frees % REAP_EVERY)));
                    return frees == REAP_EVERY;
                }
                None if unused.is_none() => unused = Some(cell),
                _ => {}
            }
        }
        unused.unwrap_or(&self.frees[REAP_DEVICES - 1]).set(Some((device, 1 % REAP_EVERY)));
        REAP_EVERY == 1
    }
}

/// `f` applied to this thread's copy of the open hooks of `device`, if
/// that copy is still current (borrowed: no reference count touched).
#[inline]
fn with_cached_hooks<T>(thread: &HookThread, device: i32, f: impl FnOnce(&Arc<Hooks>) -> T) -> Option<T> {
    let epoch = HOOKS_EPOCH.load(Ordering::Acquire);
    match thread.last.borrow().as_ref() {
        Some((d, e, h)) if *d == device && *e == epoch && !h.runtime.is_closed() => Some(f(h)),
        _ => None,
    }
}

/// This thread's copy of the open hooks of `device`, if still current.
fn cached_hooks(device: i32) -> Option<Arc<Hooks>> {
    with_hook_thread(|t| with_cached_hooks(t, device, Arc::clone))
}

/// The table's open hooks of `device`, if any (none are opened here).
fn table_hooks(device: i32) -> Option<Arc<Hooks>> {
    table().hooks.get(&device).filter(|h| !h.runtime.is_closed()).cloned()
}

fn remember_hooks(thread: &HookThread, device: i32, epoch: u64, h: &Arc<Hooks>) {
    let old = thread.forget_last();
    *thread.last.borrow_mut() = Some((device, epoch, h.clone()));
    drop(old);
}

impl Drop for HookThread {
    fn drop(&mut self) {
        // The thread ends: its reserved slot goes back to the index.
        drop(self.forget_last());
    }
}

fn hooks(device: i32) -> Result<Arc<Hooks>, ResourceError> {
    if let Some(h) = cached_hooks(device) {
        return Ok(h);
    }
    let h = hooks_from_table(device)?;
    // The epoch after the table lookup: a change since then makes the copy
    // stale at once.
    with_hook_thread(|t| remember_hooks(t, device, HOOKS_EPOCH.load(Ordering::Acquire), &h));
    Ok(h)
}

/// Run `f` with the hooks of `device`: borrowed from this thread's copy
/// while it is current (no reference count touched, no table lock), else
/// from the table (opened there on first use when `open`; else an error
/// from `missing` when the device has no open hooks).
fn with_hooks<T>(
    device: i32,
    open: bool,
    missing: impl FnOnce() -> ResourceError,
    f: impl FnOnce(&Hooks) -> Result<T, ResourceError>,
) -> Result<T, ResourceError> {
    with_hook_thread(|t| with_hooks_in(t, device, open, missing, f))
}

/// `with_hooks` through `thread`, this thread's hook state.
#[inline]
fn with_hooks_in<T>(
    thread: &HookThread,
    device: i32,
    open: bool,
    missing: impl FnOnce() -> ResourceError,
    f: impl FnOnce(&Hooks) -> Result<T, ResourceError>,
) -> Result<T, ResourceError> {
    let mut f = Some(f);
    if let Some(result) = with_cached_hooks(thread, device, |h| (f.take().expect("called once"))(h)) {
        return result;
    }
    let h = if open { hooks_from_table(device)? } else { table_hooks(device).ok_or_else(missing)? };
    remember_hooks(thread, device, HOOKS_EPOCH.load(Ordering::Acquire), &h);
    (f.take().expect("called once"))(&h)
}

fn hooks_from_table(device: i32) -> Result<Arc<Hooks>, ResourceError> {
    let mut t = table();
    if let Some(h) = t.hooks.get(&device) {
        if !h.runtime.is_closed() {
            return Ok(h.clone());
        }
    }
    let config = match t.configs.get(&device) {
        Some(c) => c.clone(),
        None => {
            let mut c = Config::from_env()?;
            // Frameworks free eagerly and allocate again at once; waiting for
            // pending frees beats refusing an allocation that would fit.
            c.wait_on_pressure = true;
            c
        }
    };
    let runtime = Runtime::open(device, &config)?;
    let h = Arc::new(Hooks { runtime, blocks: HookIndex::default() });
    t.hooks.insert(device, h.clone());
    HOOKS_EPOCH.fetch_add(1, Ordering::AcqRel);
    Ok(h)
}

/// The hooks of `device` if they have been opened (and not closed since):
/// for the calls that only make sense after an allocation, so that a
/// failing free or record_stream on a device never used opens nothing.
fn opened_hooks(device: i32) -> Option<Arc<Hooks>> {
    cached_hooks(device).or_else(|| table_hooks(device))
}

fn not_a_hook_block(ptr: *mut c_void, device: i32) -> ResourceError {
    ResourceError::InvalidArgument(format!(
        "{ptr:p} on device {device} was not allocated through the xlog framework hooks (or was freed already)"
    ))
}

#[inline]
fn hook_allocate(
    thread: &HookThread,
    size: usize,
    device: i32,
    stream: u64,
    tag: AllocTag,
) -> Result<*mut c_void, ResourceError> {
    with_hooks_in(thread, device, true, || unreachable!("opened on first use"), |h| {
        // Frameworks expect a usable, distinct pointer even for 0 bytes.
        let block = h.runtime.allocate_on_native((size as u64).max(1), stream, tag)?;
        h.blocks.insert_keeping(HookBlock { id: block.id, used_on: Vec::new() }, Some(&thread.reserved));
        Ok(block.id.ptr as usize as *mut c_void)
    })
}

#[inline]
fn hook_free(thread: &HookThread, ptr: *mut c_void, device: i32) -> Result<(), ResourceError> {
    if ptr.is_null() {
        return Ok(());
    }
    with_hooks_in(thread, device, false, || not_a_hook_block(ptr, device), |h| {
        // The index keeps the block until the free succeeds: an error
        // leaves it the hooks' to free later, nothing changed.
        let freed = h.blocks.take_with(ptr as u64, Some(&thread.reserved), |id, used_on| {
            // Fence every stream that used the block: the free then waits
            // for the work queued on them so far (the contract of
            // record_stream).
            for &stream in used_on {
                h.runtime.finish(id, stream, Access::Read)?;
            }
            h.runtime.deallocate(id).map(|_| ())
        });
        freed.ok_or_else(|| not_a_hook_block(ptr, device))??;
        if thread.count_free(device) {
            let _ = h.runtime.reap();
        }
        Ok(())
    })
}

/// Tags of the framework hooks, interned once.
fn framework_tag(name: &'static str) -> AllocTag {
    static TORCH: once_cell::sync::Lazy<AllocTag> = once_cell::sync::Lazy::new(|| AllocTag::new("torch"));
    static CUPY: once_cell::sync::Lazy<AllocTag> = once_cell::sync::Lazy::new(|| AllocTag::new("cupy"));
    match name {
        "torch" => *TORCH,
        "cupy" => *CUPY,
        other => AllocTag::new(other),
    }
}

/// Test support (`xlog_testing_interop_reset`): forget the hooks of
/// `device` and its config, and drop the hooks' own reference to their
/// runtime. If no handle from `xlog_interop_runtime` is open, that closes
/// it, freeing the blocks the hooks still held; returns how many. With
/// handles open the runtime stays open for them (their last close reports
/// the blocks), and this returns 0.
pub(crate) fn reset_device(device: i32) -> Result<u64, ResourceError> {
    check_ordinal(device)?;
    let (hooks, _config) = {
        let mut t = table();
        // A close that would be refused (a stream of the hook runtime
        // captures) is refused before the hooks are forgotten: nothing
        // changes.
        if let Some(h) = t.hooks.get(&device).filter(|h| !h.runtime.is_closed()) {
            h.runtime.check_close_allowed()?;
        }
        HOOKS_EPOCH.fetch_add(1, Ordering::AcqRel);
        (t.hooks.remove(&device), t.configs.remove(&device))
    };
    let mine = with_hook_thread(HookThread::forget_last);
    drop(mine);
    match hooks {
        Some(h) if !h.runtime.is_closed() => Ok(h.runtime.close()?.leaked.len() as u64),
        _ => Ok(0),
    }
}

/// Configure the hook runtime of `device` before its first allocation
/// (`cfg` as for `xlog_runtime_open`; NULL = environment, with
/// wait_on_pressure on, as for hooks never configured). Fails once the
/// hooks of that device have allocated. Like xlog_runtime_open, every hook
/// entry point that takes a device refuses a negative one
/// (XLOG_ERR_INVALID_ARGUMENT, "device ordinal -1 is negative"), changing
/// nothing.
#[no_mangle]
pub unsafe extern "C" fn xlog_interop_configure(device: i32, cfg: *const xlog_config) -> xlog_status {
    boundary("xlog_interop_configure", |_| {
        check_ordinal(device)?;
        let mut config = config_of(cfg)?;
        if cfg.is_null() {
            // NULL means "the environment", exactly as for hooks that were
            // never configured: those wait on pressure too (see `hooks`).
            config.wait_on_pressure = true;
        }
        let mut t = table();
        if let Some(h) = t.hooks.get(&device) {
            if !h.runtime.is_closed() {
                return Err(ResourceError::InvalidArgument(format!(
                    "the framework hooks of device {device} are already in use; configure them before the first allocation"
                )));
            }
        }
        t.hooks.remove(&device);
        HOOKS_EPOCH.fetch_add(1, Ordering::AcqRel);
        t.configs.insert(device, config);
        Ok(())
    })
}

/// A runtime handle to the hook runtime of `device` (opened if needed), for
/// stats, reap and streams. Close it with `xlog_runtime_close`; the hooks
/// keep their own reference.
#[no_mangle]
pub extern "C" fn xlog_interop_runtime(device: i32, out: *mut *mut xlog_runtime) -> xlog_status {
    boundary("xlog_interop_runtime", |_| {
        out_ptr(out, "out")?;
        check_ordinal(device)?;
        let shared = hooks(device)?.runtime.share()?;
        write_out(out, register_runtime(shared));
        Ok(())
    })
}

/// Give the cached memory of `device`'s hook runtime back to the driver
/// until at most `keep_bytes` stay cached (`keep_bytes = 0`: all of it, the
/// role of `torch.cuda.empty_cache()`), as `xlog_trim` does.
/// `released_bytes` (may be NULL) receives the bytes handed back. Hooks
/// never used (or not open) have nothing cached: 0 is reported and they are
/// not opened, so their config can still be set.
#[no_mangle]
pub extern "C" fn xlog_interop_trim(device: i32, keep_bytes: u64, released_bytes: *mut u64) -> xlog_status {
    boundary("xlog_interop_trim", |_| {
        check_ordinal(device)?;
        let open = table().hooks.get(&device).filter(|h| !h.runtime.is_closed()).cloned();
        let released = match open {
            Some(h) => h.runtime.trim(keep_bytes)?.released,
            None => 0,
        };
        if !released_bytes.is_null() {
            super::write_out(released_bytes, released);
        }
        Ok(())
    })
}

/// Blocks the hooks of `device` currently hold (0 if never used, and 0
/// with a message for a negative `device`, or when called from inside a
/// host callback, where it is refused as every xlog call is: see
/// xlog_stream_enqueue_host).
#[no_mangle]
pub extern "C" fn xlog_interop_live_blocks(device: i32) -> u64 {
    boundary("xlog_interop_live_blocks", |_| {
        check_ordinal(device)?;
        Ok(table().hooks.get(&device).map_or(0, |h| h.blocks.len() as u64))
    })
}

/// PyTorch `CUDAPluggableAllocator` malloc. NULL on failure (PyTorch then
/// raises `torch.OutOfMemoryError`); the reason is in
/// `xlog_last_error_message` on this thread.
#[no_mangle]
pub extern "C" fn xlog_torch_malloc(size: usize, device: i32, stream: *mut c_void) -> *mut c_void {
    boundary("xlog_torch_malloc", |call| {
        hook_allocate(call.hooks(), size, device, stream as u64, framework_tag("torch"))
    })
}

/// PyTorch `CUDAPluggableAllocator` free. A pointer the hooks did not hand
/// out (or freed already) changes nothing: the reason is in
/// `xlog_last_error_message` on this thread and on stderr.
#[no_mangle]
pub extern "C" fn xlog_torch_free(ptr: *mut c_void, size: usize, device: i32, stream: *mut c_void) {
    let _ = (size, stream);
    boundary("xlog_torch_free", |call| hook_free(call.hooks(), ptr, device))
}

/// Record that the block at `ptr` is used on `stream` (the role of
/// `Tensor.record_stream`): when it is freed, its allocation stream first
/// waits for all work queued on `stream` up to that moment.
#[no_mangle]
pub extern "C" fn xlog_torch_record_stream(ptr: *mut c_void, device: i32, stream: *mut c_void) -> xlog_status {
    boundary("xlog_torch_record_stream", |_| {
        check_ordinal(device)?;
        let not_live =
            || ResourceError::InvalidArgument(format!("{ptr:p} on device {device} is not a live hook allocation"));
        let h = opened_hooks(device).ok_or_else(not_live)?;
        record_use_on(&h, ptr, stream).map_err(|()| not_live())?
    })
}

/// `xlog_torch_record_stream` with the signature of PyTorch's
/// record-stream hook (`CUDAPluggableAllocator::set_record_stream_fn`:
/// a pointer and a stream, no device): the block is looked up in the hooks
/// of every device opened so far (device pointers are unique within a
/// process). The OOM shim of `xlog_cuda.torch` installs it, so that
/// `Tensor.record_stream` and PyTorch's own calls reach xlog.
#[no_mangle]
pub extern "C" fn xlog_torch_record_stream_hook(ptr: *mut c_void, stream: *mut c_void) -> xlog_status {
    boundary("xlog_torch_record_stream_hook", |_| {
        let not_live = || {
            ResourceError::InvalidArgument(format!(
                "{ptr:p} is not a live hook allocation of any device (freed already, or not allocated through the xlog framework hooks)"
            ))
        };
        if ptr.is_null() {
            return Err(not_live());
        }
        let opened: Vec<Arc<Hooks>> = table().hooks.values().filter(|h| !h.runtime.is_closed()).cloned().collect();
        for h in opened {
            if let Ok(result) = record_use_on(&h, ptr, stream) {
                return result;
            }
        }
        Err(not_live())
    })
}

/// Add `stream` to the streams that used the hook block at `ptr` in `h`:
/// `Err(())` when `h` does not hold `ptr` (nothing changed, no stream
/// imported), else the import's result.
fn record_use_on(h: &Hooks, ptr: *mut c_void, stream: *mut c_void) -> Result<Result<(), ResourceError>, ()> {
    if !h.blocks.contains(ptr as u64) {
        return Err(());
    }
    let sid = match h.runtime.import_stream(stream as u64) {
        Ok(sid) => sid,
        Err(e) => return Ok(Err(e)),
    };
    // False when another thread freed the block since the lookup above.
    if !h.blocks.add_use(ptr as u64, sid) {
        return Err(());
    }
    Ok(Ok(()))
}

// ----- CUDA graphs: captures PyTorch begins itself, announced -----
//
// PyTorch's `CUDAGraph::capture_begin` calls the allocator's
// `beginAllocateToPool(device, pool, filter)` just before it begins
// capturing, `capture_end` calls `endAllocateToPool(device, pool)` just
// after, and destroying the graph calls `releasePool(device, pool)`. The OOM
// shim of `xlog_cuda.torch` sets the pluggable allocator's three hooks to
// the entry points below (docs/frameworks.md, "CUDA graphs"), so the hook
// runtime adopts the capture as if it had begun it through
// `xlog_capture_begin` (`resources/announced_pools.rs`).

fn pool_key(pool_id_0: u64, pool_id_1: u64) -> (u64, u64) {
    (pool_id_0, pool_id_1)
}

fn no_hooks_for_pool(device: i32, pool: (u64, u64)) -> ResourceError {
    ResourceError::InvalidArgument(format!(
        "pool ({}, {}) was never announced on device {device}: its framework hooks are not open",
        pool.0, pool.1
    ))
}

/// PyTorch's `beginAllocateToPool`: a capture into the graph pool
/// (`pool_id_0`, `pool_id_1`) (PyTorch's `MempoolId_t`) is about to begin on
/// `capture_stream` (NULL: not known; captures never run on the legacy
/// default stream). Until `xlog_torch_end_allocate_to_pool` of that pool,
/// the hook runtime of `device` asks the driver which capture each stream
/// it serves takes part in, and adopts the capture begun on
/// `capture_stream`: allocations in it come from the capture's private
/// memory, frees inside it stay there, and nothing in it waits on work
/// outside it (the rules of `xlog_capture_begin`, docs/design.md "Stream
/// capture"). A pool may be announced again by further captures (a pool
/// shared by several graphs); each announcement is one user of the pool.
/// Opens the hook runtime of `device` if needed. Pool (0, 0) is
/// XLOG_ERR_INVALID_ARGUMENT.
#[no_mangle]
pub extern "C" fn xlog_torch_begin_allocate_to_pool(
    device: i32,
    pool_id_0: u64,
    pool_id_1: u64,
    capture_stream: *mut c_void,
) -> xlog_status {
    boundary("xlog_torch_begin_allocate_to_pool", |_| {
        let pool = pool_key(pool_id_0, pool_id_1);
        // Before anything opens or imports.
        check_ordinal(device)?;
        crate::runtime::check_pool(pool)?;
        with_hooks(device, true, || unreachable!("opened on first use"), |h| {
            let origin = match capture_stream as u64 {
                0 => None,
                native => Some(h.runtime.import_stream(native)?),
            };
            h.runtime.announce_capture_pool(pool, origin)
        })
    })
}

/// PyTorch's `endAllocateToPool`, after the capture into the pool ended:
/// one announcement of the pool stops, and its capture ends for the hook
/// runtime (its memory stays the pool's). Each begin is ended once:
/// XLOG_ERR_INVALID_ARGUMENT, changing nothing, for a pool never announced
/// on `device`, or one with nothing left to end (every begin of it ended
/// already). The end of a begin whose capture failed and was swept by a
/// later begin (see xlog_torch_begin_allocate_to_pool) is XLOG_OK and ends
/// nothing.
#[no_mangle]
pub extern "C" fn xlog_torch_end_allocate_to_pool(device: i32, pool_id_0: u64, pool_id_1: u64) -> xlog_status {
    boundary("xlog_torch_end_allocate_to_pool", |_| {
        check_ordinal(device)?;
        let pool = pool_key(pool_id_0, pool_id_1);
        with_hooks(device, false, || no_hooks_for_pool(device, pool), |h| {
            h.runtime.end_capture_pool(pool).map(|_| ())
        })
    })
}

/// PyTorch's `releasePool`: a graph that used the pool is being destroyed.
/// When the last user of the pool is gone, the memory of its captures goes
/// back to the driver (and the budget): at once for what is free, and for
/// blocks still live (a graph's output tensors) when the last of them is
/// freed. `released_bytes` (may be NULL) receives the bytes given back by
/// this call. XLOG_ERR_INVALID_ARGUMENT for a pool never announced on
/// `device` (or released by its last user already);
/// XLOG_ERR_STREAM_MISUSE while every user of the pool is a capture still
/// announced (not ended), since no graph of the pool exists then: a user
/// whose capture ended may release while another capture into the pool
/// runs (PyTorch destroys one graph of a shared pool while it captures
/// another), the last user only once no capture into the pool is under
/// way. Both refusals change nothing.
#[no_mangle]
pub extern "C" fn xlog_torch_release_pool(
    device: i32,
    pool_id_0: u64,
    pool_id_1: u64,
    released_bytes: *mut u64,
) -> xlog_status {
    boundary("xlog_torch_release_pool", |_| {
        check_ordinal(device)?;
        let pool = pool_key(pool_id_0, pool_id_1);
        let released = with_hooks(device, false, || no_hooks_for_pool(device, pool), |h| {
            h.runtime.release_capture_pool(pool)
        })?;
        if !released_bytes.is_null() {
            write_out(released_bytes, released);
        }
        Ok(())
    })
}

/// CuPy `CFunctionAllocator` malloc: `void* (*)(void* param, size_t, int)`.
/// CuPy does not pass a stream: blocks are ordered on the legacy default
/// stream, which CuPy's (blocking) streams synchronise with.
#[no_mangle]
pub extern "C" fn xlog_cupy_malloc(param: *mut c_void, size: usize, device: i32) -> *mut c_void {
    let _ = param;
    boundary("xlog_cupy_malloc", |call| {
        hook_allocate(call.hooks(), size, device, 0, framework_tag("cupy"))
    })
}

/// CuPy `CFunctionAllocator` free: `void (*)(void* param, void* ptr, int)`.
#[no_mangle]
pub extern "C" fn xlog_cupy_free(param: *mut c_void, ptr: *mut c_void, device: i32) {
    let _ = param;
    boundary("xlog_cupy_free", |call| hook_free(call.hooks(), ptr, device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::api::{xlog_config_init, xlog_get_stats, xlog_runtime_close};

    fn sim_config(budget: u64) -> xlog_config {
        let mut cfg = std::mem::MaybeUninit::<xlog_config>::zeroed();
        // SAFETY: xlog_config_init fully initialises the struct it is given.
        let mut cfg = unsafe {
            xlog_config_init(cfg.as_mut_ptr());
            cfg.assume_init()
        };
        cfg.backend = XLOG_BACKEND_SIM;
        cfg.budget_bytes = budget;
        cfg.sim_capacity_bytes = 1 << 26;
        cfg.wait_on_pressure = 1;
        // These tests count bytes through the driver pool's mechanics.
        cfg.memory = XLOG_MEMORY_POOL;
        // Each test keeps its hooks apart on a sim ordinal of its own.
        cfg.sim_devices = 8192;
        cfg
    }

    fn last_error() -> String {
        crate::ffi::with_last_error(|m| m.to_string())
    }

    #[test]
    fn torch_hooks_share_one_budget_and_refuse_with_null() {
        let device = 7001;
        let cfg = sim_config(1 << 20);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
        let a = xlog_torch_malloc(600 << 10, device, std::ptr::null_mut());
        assert!(!a.is_null(), "{}", last_error());
        let b = xlog_cupy_malloc(std::ptr::null_mut(), 300 << 10, device);
        assert!(!b.is_null(), "{}", last_error());
        assert_eq!(xlog_interop_live_blocks(device), 2);

        // Over the shared budget: NULL, and the message carries the numbers.
        let c = xlog_torch_malloc(200 << 10, device, std::ptr::null_mut());
        assert!(c.is_null());
        let msg = last_error();
        assert!(msg.contains("requested 204800") && msg.contains("limit 1048576"), "{msg}");

        let mut rt = std::ptr::null_mut();
        assert_eq!(xlog_interop_runtime(device, &mut rt), XLOG_OK);
        let mut stats = xlog_stats { struct_size: std::mem::size_of::<xlog_stats>() as u32, ..Default::default() };
        assert_eq!(xlog_get_stats(rt, &mut stats), XLOG_OK);
        // Device bytes: each request rounded up to its size class.
        let class = |b| crate::resources::stream_cache::size_class(b).unwrap();
        assert_eq!(stats.live_bytes, class(600 << 10) + class(300 << 10));
        assert_eq!(stats.failed_allocations, 1);

        // Freeing makes room again (the freed block is cached and reused).
        xlog_torch_free(a, 600 << 10, device, std::ptr::null_mut());
        let d = xlog_torch_malloc(600 << 10, device, std::ptr::null_mut());
        assert!(!d.is_null(), "{}", last_error());
        xlog_torch_free(d, 600 << 10, device, std::ptr::null_mut());
        xlog_cupy_free(std::ptr::null_mut(), b, device);
        assert_eq!(xlog_interop_live_blocks(device), 0);

        // A pointer the hooks never handed out is reported, not freed.
        xlog_torch_free(0x1234 as *mut c_void, 8, device, std::ptr::null_mut());
        assert!(last_error().contains("not allocated through the xlog framework hooks"));

        // Configuring after first use is refused.
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_ERR_INVALID_ARGUMENT);
        assert_eq!(xlog_runtime_close(rt), XLOG_OK);
        // The hooks' own reference keeps the runtime open.
        let e = xlog_torch_malloc(64, device, std::ptr::null_mut());
        assert!(!e.is_null(), "{}", last_error());
        xlog_torch_free(e, 64, device, std::ptr::null_mut());
    }

    #[test]
    fn a_double_free_and_a_foreign_pointer_change_nothing() {
        let device = 7011;
        let cfg = sim_config(0);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
        let keep = xlog_torch_malloc(4096, device, std::ptr::null_mut());
        let p = xlog_torch_malloc(8192, device, std::ptr::null_mut());
        assert!(!keep.is_null() && !p.is_null(), "{}", last_error());
        xlog_torch_free(p, 8192, device, std::ptr::null_mut());
        let h = hooks(device).unwrap();
        let before = (h.runtime.stats().unwrap(), xlog_interop_live_blocks(device));
        // Freed already (its slot is this thread's reserved one now), an
        // address inside a live block, and one never handed out.
        for bogus in [p, keep.wrapping_byte_add(256), 0x7777_0000 as *mut c_void] {
            xlog_torch_free(bogus, 8192, device, std::ptr::null_mut());
            assert!(last_error().contains("not allocated through the xlog framework hooks"), "{}", last_error());
            xlog_cupy_free(std::ptr::null_mut(), bogus, device);
            assert!(last_error().contains("not allocated through the xlog framework hooks"), "{}", last_error());
        }
        let after = (h.runtime.stats().unwrap(), xlog_interop_live_blocks(device));
        assert_eq!((after.0.live_blocks, after.0.deallocations, after.1), (before.0.live_blocks, before.0.deallocations, before.1));
        xlog_torch_free(keep, 4096, device, std::ptr::null_mut());
        assert_eq!(xlog_interop_live_blocks(device), 0);
    }

    #[test]
    fn hook_blocks_allocated_on_one_thread_are_freed_on_others() {
        let device = 7012;
        let cfg = sim_config(0);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
        let threads = 4usize;
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..threads).map(|_| std::sync::mpsc::channel::<usize>()).unzip();
        std::thread::scope(|s| {
            for (t, receiver) in receivers.into_iter().enumerate() {
                let next = senders[(t + 1) % threads].clone();
                s.spawn(move || {
                    // Each thread its own foreign stream, as PyTorch's.
                    let stream = (0x9000 + 0x100 * t) as *mut c_void;
                    for i in 0..300usize {
                        let p = xlog_torch_malloc(256 << (i % 5), device, stream);
                        assert!(!p.is_null(), "{}", last_error());
                        let _ = next.send(p as usize);
                        while let Ok(theirs) = receiver.try_recv() {
                            xlog_torch_free(theirs as *mut c_void, 0, device, std::ptr::null_mut());
                            assert_eq!(last_error(), "", "freeing {theirs:#x}");
                        }
                    }
                    drop(next);
                    // What is still on the way here comes until every
                    // sender is gone.
                    for theirs in receiver {
                        xlog_torch_free(theirs as *mut c_void, 0, device, std::ptr::null_mut());
                        assert_eq!(last_error(), "", "freeing {theirs:#x}");
                    }
                });
            }
            drop(senders);
        });
        assert_eq!(xlog_interop_live_blocks(device), 0);
        assert_eq!(hooks(device).unwrap().runtime.stats().unwrap().live_blocks, 0);
    }

    #[test]
    fn record_stream_fences_the_free() {
        let device = 7002;
        let cfg = sim_config(0);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
        let p = xlog_torch_malloc(4096, device, std::ptr::null_mut());
        assert!(!p.is_null());
        let other = 0x5000 as *mut c_void; // a foreign native stream
        assert_eq!(xlog_torch_record_stream(p, device, other), XLOG_OK);
        let h = hooks(device).unwrap();
        let waits_before = h.runtime.usage().cross_stream_waits;
        xlog_torch_free(p, 4096, device, std::ptr::null_mut());
        assert_eq!(h.runtime.usage().cross_stream_waits, waits_before + 1, "the free waited on the other stream");
        assert_eq!(xlog_torch_record_stream(p, device, other), XLOG_ERR_INVALID_ARGUMENT);
    }

    #[test]
    fn the_record_stream_hook_finds_the_device_and_fences_the_free() {
        // Two devices in use; the hook (no device argument, as PyTorch's
        // set_record_stream_fn calls it) finds the one holding the pointer.
        let (d1, d2) = (7007, 7008);
        for d in [d1, d2] {
            let cfg = sim_config(0);
            // SAFETY: a valid config pointer.
            assert_eq!(unsafe { xlog_interop_configure(d, &cfg) }, XLOG_OK);
        }
        let a = xlog_torch_malloc(4096, d1, std::ptr::null_mut());
        let b = xlog_torch_malloc(8192, d2, std::ptr::null_mut());
        assert!(!a.is_null() && !b.is_null(), "{}", last_error());
        let side = 0x7000 as *mut c_void;
        let (h1, h2) = (hooks(d1).unwrap(), hooks(d2).unwrap());
        let imported = (h1.runtime.stream_usage().imported, h2.runtime.stream_usage().imported);
        assert_eq!(xlog_torch_record_stream_hook(b, side), XLOG_OK, "{}", last_error());
        assert_eq!(h2.runtime.stream_usage().imported, imported.1 + 1, "the side stream was imported on the block's device");
        assert_eq!(h1.runtime.stream_usage().imported, imported.0, "and not on the other one");
        let waits = (h1.runtime.usage().cross_stream_waits, h2.runtime.usage().cross_stream_waits);
        xlog_torch_free(a, 4096, d1, std::ptr::null_mut());
        xlog_torch_free(b, 8192, d2, std::ptr::null_mut());
        assert_eq!(h1.runtime.usage().cross_stream_waits, waits.0, "a's free waited on nothing");
        assert_eq!(h2.runtime.usage().cross_stream_waits, waits.1 + 1, "b's free waited on the side stream");
        // Freed, NULL, or never a hook block: an error naming the pointer, nothing imported.
        assert_eq!(xlog_torch_record_stream_hook(b, side), XLOG_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("not a live hook allocation of any device"), "{}", last_error());
        assert_eq!(xlog_torch_record_stream_hook(std::ptr::null_mut(), side), XLOG_ERR_INVALID_ARGUMENT);
        assert_eq!(xlog_torch_record_stream_hook(0x1234 as *mut c_void, 0x7100 as *mut c_void), XLOG_ERR_INVALID_ARGUMENT);
        assert_eq!(
            (h1.runtime.stream_usage().imported, h2.runtime.stream_usage().imported),
            (imported.0, imported.1 + 1),
            "the failed calls imported nothing"
        );
    }

    #[test]
    fn interop_trim_empties_the_hook_cache_and_never_opens_the_hooks() {
        let device = 7006;
        let mut released = u64::MAX;
        // Never used: nothing to trim, and the hooks stay unopened.
        assert_eq!(xlog_interop_trim(device, 0, &mut released), XLOG_OK);
        assert_eq!(released, 0);
        assert!(!table().hooks.contains_key(&device));
        let cfg = sim_config(0);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK, "still configurable");

        let a = xlog_torch_malloc(64 << 10, device, std::ptr::null_mut());
        let b = xlog_torch_malloc(256 << 10, device, std::ptr::null_mut());
        assert!(!a.is_null() && !b.is_null(), "{}", last_error());
        xlog_torch_free(a, 64 << 10, device, std::ptr::null_mut());
        xlog_torch_free(b, 256 << 10, device, std::ptr::null_mut());
        let h = hooks(device).unwrap();
        let cached = h.runtime.stats().unwrap().cached_bytes;
        assert!(cached >= (64 << 10) + (256 << 10), "the frees went to the cache: {cached}");

        // Keep 100 KiB: at least the 256 KiB block goes, and what stays fits.
        assert_eq!(xlog_interop_trim(device, 100 << 10, &mut released), XLOG_OK);
        let after = h.runtime.stats().unwrap();
        assert_eq!(after.cached_bytes, cached - released);
        assert!(released >= 256 << 10 && after.cached_bytes <= 100 << 10, "{released} {after:?}");
        // Everything, with a NULL out-pointer.
        assert_eq!(xlog_interop_trim(device, 0, std::ptr::null_mut()), XLOG_OK);
        let empty = h.runtime.stats().unwrap();
        assert_eq!((empty.cached_bytes, empty.outstanding_bytes), (0, 0));
    }

    #[test]
    fn a_failing_free_or_record_stream_on_an_unused_device_opens_nothing() {
        let device = 7004;
        let bogus = 0x1234 as *mut c_void;
        xlog_torch_free(bogus, 64, device, std::ptr::null_mut());
        assert!(last_error().contains("not allocated through the xlog framework hooks"), "{}", last_error());
        xlog_cupy_free(std::ptr::null_mut(), bogus, device);
        assert!(last_error().contains("not allocated through the xlog framework hooks"), "{}", last_error());
        assert_eq!(xlog_torch_record_stream(bogus, device, 0x5000 as *mut c_void), XLOG_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("not a live hook allocation"), "{}", last_error());
        assert!(!table().hooks.contains_key(&device), "a failing call opened the hook runtime of device {device}");
        assert_eq!(xlog_interop_live_blocks(device), 0);
        // So the device can still be configured before its first allocation.
        let cfg = sim_config(1 << 20);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK, "{}", last_error());
        let p = xlog_torch_malloc(4096, device, std::ptr::null_mut());
        assert!(!p.is_null(), "{}", last_error());
        // On a device in use, a record_stream of a pointer it does not hold
        // imports nothing either.
        let h = hooks(device).unwrap();
        let imported = h.runtime.stream_usage().imported;
        assert_eq!(xlog_torch_record_stream(bogus, device, 0x6000 as *mut c_void), XLOG_ERR_INVALID_ARGUMENT);
        assert_eq!(h.runtime.stream_usage().imported, imported);
        xlog_torch_free(p, 4096, device, std::ptr::null_mut());
        assert_eq!(xlog_interop_live_blocks(device), 0);
    }

    #[test]
    fn testing_reset_frees_what_the_hooks_held_and_forgets_the_config() {
        use crate::ffi::testing::xlog_testing_interop_reset;
        let device = 7005;
        let cfg = sim_config(1 << 20);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
        let (a, b) = (xlog_torch_malloc(4096, device, std::ptr::null_mut()), xlog_cupy_malloc(std::ptr::null_mut(), 64, device));
        assert!(!a.is_null() && !b.is_null(), "{}", last_error());
        let mut leaked = u64::MAX;
        assert_eq!(xlog_testing_interop_reset(device, &mut leaked), XLOG_OK, "{}", last_error());
        assert_eq!(leaked, 2);
        assert_eq!(xlog_interop_live_blocks(device), 0);
        assert!(!table().hooks.contains_key(&device) && !table().configs.contains_key(&device));
        // Configurable again, as a device never used.
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
        // With a handle open, the runtime stays open for it.
        let p = xlog_torch_malloc(64, device, std::ptr::null_mut());
        let mut rt = std::ptr::null_mut();
        assert_eq!(xlog_interop_runtime(device, &mut rt), XLOG_OK);
        assert_eq!(xlog_testing_interop_reset(device, &mut leaked), XLOG_OK);
        assert_eq!(leaked, 0);
        let mut stats = xlog_stats { struct_size: std::mem::size_of::<xlog_stats>() as u32, ..Default::default() };
        assert_eq!(xlog_get_stats(rt, &mut stats), XLOG_OK);
        assert_eq!(stats.live_blocks, 1, "the block is the handle's runtime's until it closes");
        assert_eq!(xlog_runtime_close(rt), XLOG_OK);
        xlog_torch_free(p, 64, device, std::ptr::null_mut());
        assert!(last_error().contains("not allocated through the xlog framework hooks"));
        assert_eq!(xlog_testing_interop_reset(device, std::ptr::null_mut()), XLOG_OK, "NULL out, nothing to reset");
    }

    #[test]
    fn announced_torch_capture_is_adopted_and_its_pool_released_through_the_c_abi() {
        use crate::ffi::testing::{xlog_sim_stream_begin_capture, xlog_sim_stream_end_capture};
        let device = 7009;
        let cfg = sim_config(1 << 24);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
        let (side, capture_stream) = (0x7a00 as *mut c_void, 0x7b00 as *mut c_void);
        // A block cached on another stream: the capture's miss must not take it.
        let warm = xlog_torch_malloc(64 << 10, device, side);
        assert!(!warm.is_null(), "{}", last_error());
        xlog_torch_free(warm, 64 << 10, device, side);
        let mut rt = std::ptr::null_mut();
        assert_eq!(xlog_interop_runtime(device, &mut rt), XLOG_OK);
        let held = || {
            let mut stats = xlog_stats { struct_size: std::mem::size_of::<xlog_stats>() as u32, ..Default::default() };
            assert_eq!(xlog_get_stats(rt, &mut stats), XLOG_OK);
            stats.outstanding_bytes
        };
        let before = held();

        // What CUDAGraph::capture_begin / capture_end / reset do, in order.
        assert_eq!(xlog_torch_begin_allocate_to_pool(device, 3, 0, capture_stream), XLOG_OK, "{}", last_error());
        let mut capture = 0;
        assert_eq!(xlog_sim_stream_begin_capture(rt, capture_stream, &mut capture), XLOG_OK, "{}", last_error());
        assert_ne!(capture, 0);
        let scratch = xlog_torch_malloc(64 << 10, device, capture_stream);
        assert!(!scratch.is_null(), "{}", last_error());
        assert_ne!(scratch, warm, "not the other stream's cached block");
        xlog_torch_free(scratch, 64 << 10, device, capture_stream);
        let output = xlog_torch_malloc(4096, device, capture_stream);
        assert!(!output.is_null(), "{}", last_error());
        let mut graph = 0;
        assert_eq!(xlog_sim_stream_end_capture(rt, capture_stream, &mut graph), XLOG_OK, "{}", last_error());
        assert_eq!(xlog_torch_end_allocate_to_pool(device, 3, 0), XLOG_OK, "{}", last_error());
        let class = |b| crate::resources::stream_cache::size_class(b).unwrap();
        assert_eq!(held(), before + class(64 << 10) + class(4096), "the capture's memory is charged");

        // The graph goes before its output tensor: nothing back yet, all of it at the free.
        let mut released = u64::MAX;
        assert_eq!(xlog_torch_release_pool(device, 3, 0, &mut released), XLOG_OK, "{}", last_error());
        assert_eq!(released, 0);
        xlog_torch_free(output, 4096, device, capture_stream);
        assert_eq!(held(), before, "the last free gave the pool back");

        // Refusals name the pool and the device; nothing changes.
        assert_eq!(xlog_torch_release_pool(device, 3, 0, &mut released), XLOG_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("xlog_torch_release_pool: invalid argument: pool (3, 0) was never announced on device 7009"), "{}", last_error());
        assert_eq!(xlog_torch_end_allocate_to_pool(device, 8, 8), XLOG_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("pool (8, 8)"), "{}", last_error());
        assert_eq!(xlog_torch_begin_allocate_to_pool(device, 0, 0, capture_stream), XLOG_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("pool (0, 0)"), "{}", last_error());
        assert_eq!(xlog_torch_begin_allocate_to_pool(device, 4, 0, capture_stream), XLOG_OK);
        assert_eq!(xlog_torch_release_pool(device, 4, 0, std::ptr::null_mut()), XLOG_ERR_STREAM_MISUSE);
        assert!(last_error().contains("pool (4, 0) on device 7009 still has 1 capture(s) under way"), "{}", last_error());
        assert_eq!(xlog_torch_end_allocate_to_pool(device, 4, 0), XLOG_OK);
        assert_eq!(xlog_torch_release_pool(device, 4, 0, std::ptr::null_mut()), XLOG_OK);
        assert_eq!(held(), before);
        assert_eq!(xlog_runtime_close(rt), XLOG_OK);
    }

    #[test]
    fn pool_calls_on_a_device_never_used_open_nothing() {
        let device = 7010;
        assert_eq!(xlog_torch_end_allocate_to_pool(device, 1, 0), XLOG_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("device 7010"), "{}", last_error());
        assert_eq!(xlog_torch_release_pool(device, 1, 0, std::ptr::null_mut()), XLOG_ERR_INVALID_ARGUMENT);
        assert_eq!(xlog_torch_begin_allocate_to_pool(device, 0, 0, std::ptr::null_mut()), XLOG_ERR_INVALID_ARGUMENT);
        assert!(!table().hooks.contains_key(&device), "a refused pool call opened the hooks of device {device}");
    }

    #[test]
    fn configure_null_waits_on_pressure_like_the_unconfigured_hooks() {
        let device = 7003;
        // SAFETY: NULL is allowed and means "from the environment".
        let status = unsafe { xlog_interop_configure(device, std::ptr::null()) };
        if status != XLOG_OK {
            // Only a malformed XLOG_* variable in the test environment can fail here.
            assert!(last_error().contains("environment variable"), "{}", last_error());
            return;
        }
        assert!(table().configs[&device].wait_on_pressure);
        let mut explicit = sim_config(0);
        explicit.wait_on_pressure = 0;
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &explicit) }, XLOG_OK);
        assert!(!table().configs[&device].wait_on_pressure, "an explicit config is kept as given");
    }
}
