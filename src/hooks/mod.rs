//! The framework hooks: a layer above the runtime that lets PyTorch
//! (`CUDAPluggableAllocator`) and CuPy (`CFunctionAllocator`) allocate
//! through the per-device runtime, so frameworks and engines in one process
//! share one budget, one set of stats and one log. The C entry points that
//! frameworks call are in `ffi/interop.rs`; everything they do is here, in
//! safe code that knows nothing of C.
//!
//! Contract:
//! - The hook runtime of a device is opened on its first allocation (or
//!   `shared_runtime`, or `begin_allocate_to_pool`), from the config given
//!   to `configure` before that, else from the environment with
//!   `wait_on_pressure` on (`environment_config`). `configure` is refused
//!   once the device's hooks are open. Calls that only make sense after an
//!   allocation (free, record_stream, the pool end and release, trim,
//!   live_blocks) never open anything.
//! - Frameworks free by pointer: each device's hooks keep a pointer → block
//!   index (`index.rs`). A free of a pointer the hooks do not hold changes
//!   nothing; a free that fails leaves the block to the hooks, as it was.
//! - Foreign streams (native handles) are imported on first sight (the
//!   stream pool keeps them by native handle).
//! - A block recorded on other streams (`record_stream`) is fenced on each
//!   of them at its free: the free waits for the work queued there so far.
//! - Each thread reaps after every `REAP_EVERY` of its frees on a device.
//! - Per thread (`HookThread`, kept by the caller: the C boundary holds it
//!   in its one thread-local) the hooks of the device used last are kept,
//!   so the calls of a framework on one device take no lock.

pub(crate) mod index;

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;

use crate::config::Config;
use crate::error::ResourceError;
use crate::ids::PoolKey;
use crate::registry::{Memo, Registry};
use crate::resource::{Access, AllocTag};
use crate::runtime::{check_ordinal, check_pool, Runtime};
use index::{HookBlock, HookIndex, Reservation};

/// Reap after this many hook frees of a device on a thread, so pending
/// bytes do not pile up between budget-pressure reaps.
const REAP_EVERY: u32 = 32;

/// Devices whose frees a thread counts apart (see `HookThread::frees`).
const REAP_DEVICES: usize = 8;

/// The frameworks whose allocations the hooks tag.
#[derive(Clone, Copy)]
pub(crate) enum Framework {
    Torch,
    Cupy,
}

impl Framework {
    /// The tag of the framework's blocks, interned once.
    fn tag(self) -> AllocTag {
        static TORCH: once_cell::sync::Lazy<AllocTag> = once_cell::sync::Lazy::new(|| AllocTag::new("torch"));
        static CUPY: once_cell::sync::Lazy<AllocTag> = once_cell::sync::Lazy::new(|| AllocTag::new("cupy"));
        match self {
            Framework::Torch => *TORCH,
            Framework::Cupy => *CUPY,
        }
    }
}

pub(crate) struct Hooks {
    pub(crate) runtime: Arc<Runtime>,
    /// Pointer → block of what the hooks handed out (contract in
    /// `index.rs`).
    pub(crate) blocks: HookIndex,
}

#[derive(Default)]
struct HookTable {
    configs: HashMap<i32, Config>,
    hooks: HashMap<i32, Arc<Hooks>>,
}

/// The hooks and configs of every device (`registry.rs`: the epoch moves
/// whenever a device's hooks are replaced or forgotten, so the per-thread
/// copy below is used only while it is still the table's).
fn table() -> &'static Registry<HookTable> {
    static TABLE: Registry<HookTable> = Registry::new(HookTable::default);
    &TABLE
}

/// What the hooks keep per thread. The caller keeps it: the C boundary
/// holds it in its one thread-local (`ffi::FfiThread`), since in a shared
/// library every thread-local access is a call into the dynamic loader,
/// and a hook call reaches this and its last-error message with one.
pub(crate) struct HookThread {
    /// The hooks this thread used last, by device. Frameworks call the
    /// hooks of one device over and over; this spares them the
    /// process-wide table lock.
    last: Memo<i32, Arc<Hooks>, 1>,
    /// Hook frees this thread made, per device: (device, frees since the
    /// last reap). Counted here, not in a shared counter, so that a free
    /// writes no cache line another thread's free writes too. Exact for up
    /// to `REAP_DEVICES` devices a thread frees on; beyond, the last entry
    /// is reused and its count starts again.
    frees: [Cell<Option<(i32, u32)>>; REAP_DEVICES],
    /// The index slot this thread kept from its last hook free, for its
    /// next hook allocation (`index.rs`, "Reuse"): always one of the
    /// hooks in `last`, given back before `last` changes.
    reserved: Reservation,
}

impl HookThread {
    pub(crate) const fn new() -> HookThread {
        HookThread {
            last: Memo::new(),
            frees: [const { Cell::new(None) }; REAP_DEVICES],
            reserved: Reservation::new(),
        }
    }

    /// Forget the hooks this thread used last, giving back its reserved
    /// slot in them; the caller drops them (outside any borrow).
    fn forget_last(&self) -> Vec<Arc<Hooks>> {
        let last = self.last.forget(|_| true);
        for h in &last {
            h.blocks.release(&self.reserved);
        }
        last
    }

    /// Make `h`, at `epoch`, the hooks this thread used last, giving back
    /// the reserved slot in the ones it used before.
    fn remember(&self, device: i32, epoch: u64, h: &Arc<Hooks>) {
        // While the hooks used last are borrowed (a hook call inside a hook
        // call's use of them) they stay, reserved slot and all.
        if let Ok(Some(old)) = self.last.remember(device, epoch, h.clone()) {
            old.blocks.release(&self.reserved);
        }
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

impl Drop for HookThread {
    fn drop(&mut self) {
        // The thread ends: its reserved slot goes back to the index.
        drop(self.forget_last());
    }
}

/// `f` applied to this thread's copy of the open hooks of `device`, if
/// that copy is still current (borrowed: no reference count touched).
#[inline]
fn with_cached_hooks<T>(thread: &HookThread, device: i32, f: impl FnOnce(&Arc<Hooks>) -> T) -> Option<T> {
    let h = thread.last.get(device, table().epoch())?;
    (!h.runtime.is_closed()).then(|| f(&h))
}

/// The table's open hooks of `device`, if any (none are opened here), and
/// the epoch they were read at.
fn table_hooks(device: i32) -> Option<(Arc<Hooks>, u64)> {
    let t = table().read();
    let h = t.hooks.get(&device).filter(|h| !h.runtime.is_closed()).cloned()?;
    Some((h, table().epoch()))
}

/// The hooks of `device`, opening its runtime on first use.
pub(crate) fn hooks(thread: &HookThread, device: i32) -> Result<Arc<Hooks>, ResourceError> {
    if let Some(h) = with_cached_hooks(thread, device, Arc::clone) {
        return Ok(h);
    }
    let (h, epoch) = hooks_from_table(device)?;
    thread.remember(device, epoch, &h);
    Ok(h)
}

/// Run `f` with the hooks of `device`: borrowed from this thread's copy
/// while it is current (no reference count touched, no table lock), else
/// from the table (opened there on first use when `open`; else an error
/// from `missing` when the device has no open hooks).
#[inline]
fn with_hooks<T>(
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
    let (h, epoch) = if open { hooks_from_table(device)? } else { table_hooks(device).ok_or_else(missing)? };
    thread.remember(device, epoch, &h);
    (f.take().expect("called once"))(&h)
}

/// The config of hooks never configured (and of `configure` with no
/// config): the environment's, waiting on pressure. Frameworks free
/// eagerly and allocate again at once; waiting for pending frees beats
/// refusing an allocation that would fit.
pub(crate) fn environment_config() -> Result<Config, ResourceError> {
    let mut c = Config::from_env()?;
    c.wait_on_pressure = true;
    Ok(c)
}

/// The open hooks of `device`, opened now if need be, and the epoch they
/// were read at. Under the table's write lock, so that two threads never
/// open one device's hooks twice.
fn hooks_from_table(device: i32) -> Result<(Arc<Hooks>, u64), ResourceError> {
    if let Some(found) = table_hooks(device) {
        return Ok(found);
    }
    let mut t = table().write();
    if let Some(h) = t.hooks.get(&device) {
        if !h.runtime.is_closed() {
            return Ok((h.clone(), table().epoch()));
        }
    }
    let config = match t.configs.get(&device) {
        Some(c) => c.clone(),
        None => environment_config()?,
    };
    let runtime = Runtime::open(device, &config)?;
    let h = Arc::new(Hooks { runtime, blocks: HookIndex::default() });
    // Replaces closed hooks, if any.
    table().invalidate(&mut t);
    t.hooks.insert(device, h.clone());
    Ok((h, table().epoch()))
}

/// The hooks of `device` if they have been opened (and not closed since):
/// for the calls that only make sense after an allocation, so that a
/// failing free or record_stream on a device never used opens nothing.
fn opened_hooks(thread: &HookThread, device: i32) -> Option<Arc<Hooks>> {
    with_cached_hooks(thread, device, Arc::clone).or_else(|| table_hooks(device).map(|(h, _)| h))
}

fn not_a_hook_block(ptr: u64, device: i32) -> ResourceError {
    ResourceError::InvalidArgument(format!(
        "{ptr:#x} on device {device} was not allocated through the xlog framework hooks (or was freed already)"
    ))
}

/// Allocate `size` bytes on `device`, ordered on the native stream
/// `stream`, for `framework`: the block's address.
#[inline]
pub(crate) fn allocate(
    thread: &HookThread,
    size: usize,
    device: i32,
    stream: u64,
    framework: Framework,
) -> Result<u64, ResourceError> {
    with_hooks(thread, device, true, || unreachable!("opened on first use"), |h| {
        // CuPy expects a usable, distinct pointer even for 0 bytes
        // (PyTorch's hook answers 0 bytes with NULL before this).
        let block = h.runtime.allocate_on_native((size as u64).max(1), stream, framework.tag())?;
        h.blocks.insert_keeping(HookBlock { id: block.id, used_on: Vec::new() }, Some(&thread.reserved));
        Ok(block.id.ptr)
    })
}

/// Free the hook block at `ptr` on `device` (0: nothing to free).
#[inline]
pub(crate) fn free(thread: &HookThread, ptr: u64, device: i32) -> Result<(), ResourceError> {
    if ptr == 0 {
        return Ok(());
    }
    with_hooks(thread, device, false, || not_a_hook_block(ptr, device), |h| {
        // The index keeps the block until the free succeeds: an error
        // leaves it the hooks' to free later, nothing changed.
        let freed = h.blocks.take_with(ptr, Some(&thread.reserved), |id, used_on| {
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

/// `free` on whichever open device's hooks hold `ptr` (device pointers
/// are unique within a process): for a deleter that is given only the
/// pointer (PyTorch's `raw_deleter`, `raw_delete`). 0: nothing to free.
pub(crate) fn free_any_device(thread: &HookThread, ptr: u64) -> Result<(), ResourceError> {
    if ptr == 0 {
        return Ok(());
    }
    let holder = table().read().hooks.iter().find(|(_, h)| !h.runtime.is_closed() && h.blocks.contains(ptr)).map(|(&d, _)| d);
    match holder {
        Some(device) => free(thread, ptr, device),
        None => Err(not_live_on_any_device(ptr)),
    }
}

fn not_live_on_any_device(ptr: u64) -> ResourceError {
    ResourceError::InvalidArgument(format!(
        "{ptr:#x} is not a live hook allocation of any device (freed already, or not allocated through the xlog framework hooks)"
    ))
}

/// Test support (`xlog_testing_interop_reset`): forget the hooks of
/// `device` and its config, and drop the hooks' own reference to their
/// runtime. If no handle from `xlog_interop_runtime` is open, that closes
/// it, freeing the blocks the hooks still held; returns how many. With
/// handles open the runtime stays open for them (their last close reports
/// the blocks), and this returns 0.
pub(crate) fn reset_device(thread: &HookThread, device: i32) -> Result<u64, ResourceError> {
    check_ordinal(device)?;
    let (hooks, _config) = {
        let mut t = table().write();
        // A close that would be refused (a stream of the hook runtime
        // captures) is refused before the hooks are forgotten: nothing
        // changes.
        if let Some(h) = t.hooks.get(&device).filter(|h| !h.runtime.is_closed()) {
            h.runtime.check_close_allowed()?;
        }
        table().invalidate(&mut t);
        (t.hooks.remove(&device), t.configs.remove(&device))
    };
    drop(thread.forget_last());
    match hooks {
        Some(h) if !h.runtime.is_closed() => Ok(h.runtime.close()?.leaked.len() as u64),
        _ => Ok(0),
    }
}

/// Set the config the hook runtime of `device` opens with; refused once
/// it is open.
pub(crate) fn configure(device: i32, config: Config) -> Result<(), ResourceError> {
    let mut t = table().write();
    if let Some(h) = t.hooks.get(&device) {
        if !h.runtime.is_closed() {
            return Err(ResourceError::InvalidArgument(format!(
                "the framework hooks of device {device} are already in use; configure them before the first allocation"
            )));
        }
    }
    t.hooks.remove(&device);
    table().invalidate(&mut t);
    t.configs.insert(device, config);
    Ok(())
}

/// Another reference to the hook runtime of `device` (opened if needed),
/// for a handle of its own.
pub(crate) fn shared_runtime(thread: &HookThread, device: i32) -> Result<Arc<Runtime>, ResourceError> {
    hooks(thread, device)?.runtime.share()
}

/// `Runtime::trim` on the hook runtime of `device`: the bytes handed back,
/// 0 (opening nothing) where the hooks are not open.
pub(crate) fn trim(device: i32, keep_bytes: u64) -> Result<u64, ResourceError> {
    match table_hooks(device) {
        Some((h, _)) => Ok(h.runtime.trim(keep_bytes)?.released),
        None => Ok(0),
    }
}

/// Blocks the hooks of `device` hold (0 if never used).
pub(crate) fn live_blocks(device: i32) -> u64 {
    table().read().hooks.get(&device).map_or(0, |h| h.blocks.len() as u64)
}

/// Record that the hook block at `ptr` on `device` is used on the native
/// stream `stream`.
pub(crate) fn record_stream(thread: &HookThread, device: i32, ptr: u64, stream: u64) -> Result<(), ResourceError> {
    let not_live = || ResourceError::InvalidArgument(format!("{ptr:#x} on device {device} is not a live hook allocation"));
    let h = opened_hooks(thread, device).ok_or_else(not_live)?;
    record_use_on(&h, ptr, stream).map_err(|()| not_live())?
}

/// `record_stream` on whichever open device's hooks hold `ptr` (device
/// pointers are unique within a process).
pub(crate) fn record_stream_any_device(ptr: u64, stream: u64) -> Result<(), ResourceError> {
    if ptr == 0 {
        return Err(not_live_on_any_device(ptr));
    }
    let opened: Vec<Arc<Hooks>> = table().read().hooks.values().filter(|h| !h.runtime.is_closed()).cloned().collect();
    for h in opened {
        if let Ok(result) = record_use_on(&h, ptr, stream) {
            return result;
        }
    }
    Err(not_live_on_any_device(ptr))
}

/// Add `stream` to the streams that used the hook block at `ptr` in `h`:
/// `Err(())` when `h` does not hold `ptr` (nothing changed, no stream
/// imported), else the import's result.
fn record_use_on(h: &Hooks, ptr: u64, stream: u64) -> Result<Result<(), ResourceError>, ()> {
    if !h.blocks.contains(ptr) {
        return Err(());
    }
    let sid = match h.runtime.import_stream(stream) {
        Ok(sid) => sid,
        Err(e) => return Ok(Err(e)),
    };
    // False when another thread freed the block since the lookup above.
    if !h.blocks.add_use(ptr, sid) {
        return Err(());
    }
    Ok(Ok(()))
}

// ----- CUDA graphs: captures PyTorch begins itself, announced -----
//
// PyTorch's `CUDAGraph::capture_begin` calls the allocator's
// `beginAllocateToPool(device, pool, filter)` just before it begins
// capturing, `capture_end` calls `endAllocateToPool(device, pool)` just
// after, and destroying the graph calls `releasePool(device, pool)`. The
// hook runtime adopts the capture as if it had begun it through
// `xlog_capture_begin` (`resources/announced_pools.rs`).

fn no_hooks_for_pool(device: i32, pool: PoolKey) -> ResourceError {
    ResourceError::InvalidArgument(format!(
        "pool ({}, {}) was never announced on device {device}: its framework hooks are not open",
        pool.0, pool.1
    ))
}

/// A capture into `pool` is about to begin on the native stream
/// `capture_stream` (0: not known). Opens the hooks of `device` if needed,
/// but not for pool (0, 0), which is refused first.
pub(crate) fn begin_allocate_to_pool(
    thread: &HookThread,
    device: i32,
    pool: PoolKey,
    capture_stream: u64,
) -> Result<(), ResourceError> {
    // Before anything opens or imports.
    check_pool(pool)?;
    with_hooks(thread, device, true, || unreachable!("opened on first use"), |h| {
        let origin = match capture_stream {
            0 => None,
            native => Some(h.runtime.import_stream(native)?),
        };
        h.runtime.announce_capture_pool(pool, origin)
    })
}

/// One announcement of `pool` ends.
pub(crate) fn end_allocate_to_pool(thread: &HookThread, device: i32, pool: PoolKey) -> Result<(), ResourceError> {
    with_hooks(thread, device, false, || no_hooks_for_pool(device, pool), |h| {
        h.runtime.end_capture_pool(pool).map(|_| ())
    })
}

/// One user of `pool` is gone: the bytes given back now.
pub(crate) fn release_pool(thread: &HookThread, device: i32, pool: PoolKey) -> Result<u64, ResourceError> {
    with_hooks(thread, device, false, || no_hooks_for_pool(device, pool), |h| h.runtime.release_capture_pool(pool))
}

/// For tests: whether `device` has hooks in the table, and its config.
#[cfg(test)]
pub(crate) fn table_entry(device: i32) -> (bool, Option<Config>) {
    let t = table().read();
    (t.hooks.contains_key(&device), t.configs.get(&device).cloned())
}
