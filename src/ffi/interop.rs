//! The C entry points of the framework hooks (`crate::hooks`, where what
//! they do is specified): PyTorch's `CUDAPluggableAllocator` and CuPy's
//! `CFunctionAllocator` call the malloc and free hooks; the configure,
//! runtime, trim and live-block calls and the capture-pool calls serve the
//! Python side (`xlog_cuda.torch`, `xlog_cuda.cupy`). Each converts its C
//! arguments (native pointers and streams become addresses), checks the
//! device ordinal where it takes one, and calls the hooks layer with this
//! thread's hook state from the boundary. The malloc hooks return NULL and
//! the free hooks nothing on failure, with the reason in
//! `xlog_last_error_message` (and, for the frees, on stderr).

// The C contract of each entry point (valid or NULL pointers) is in its doc
// comment, which is also the header's; no separate `# Safety` section.
#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::c_void;

use super::config::config_of;
use super::types::*;
use super::{boundary, out_ptr, register_runtime, write_out};
use crate::hooks::{self, Framework};
use crate::runtime::check_ordinal;

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
        // NULL means "the environment", exactly as for hooks that were
        // never configured: those wait on pressure too.
        let config = if cfg.is_null() { hooks::environment_config()? } else { config_of(cfg)? };
        hooks::configure(device, config)
    })
}

/// A runtime handle to the hook runtime of `device` (opened if needed), for
/// stats, reap and streams. Close it with `xlog_runtime_close`; the hooks
/// keep their own reference.
#[no_mangle]
pub extern "C" fn xlog_interop_runtime(device: i32, out: *mut *mut xlog_runtime) -> xlog_status {
    boundary("xlog_interop_runtime", |call| {
        out_ptr(out, "out")?;
        check_ordinal(device)?;
        let shared = hooks::shared_runtime(call.hooks(), device)?;
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
        let released = hooks::trim(device, keep_bytes)?;
        if !released_bytes.is_null() {
            write_out(released_bytes, released);
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
        Ok(hooks::live_blocks(device))
    })
}

/// PyTorch `CUDAPluggableAllocator` malloc. NULL on failure (PyTorch then
/// raises `torch.OutOfMemoryError`); the reason is in
/// `xlog_last_error_message` on this thread. 0 bytes is NULL with no
/// block and no error, as PyTorch's own allocator answers: PyTorch's
/// storage resize copies the old contents whenever the old pointer is not
/// NULL, so a real pointer for an empty tensor cost a copy call for
/// nothing (3 to 5 a step of a BERT masked-LM's embeddings).
#[no_mangle]
pub extern "C" fn xlog_torch_malloc(size: usize, device: i32, stream: *mut c_void) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    boundary("xlog_torch_malloc", |call| {
        let ptr = hooks::allocate(call.hooks(), size, device, stream as u64, Framework::Torch)?;
        Ok(ptr as usize as *mut c_void)
    })
}

/// PyTorch `CUDAPluggableAllocator` free. A pointer the hooks did not hand
/// out (or freed already) changes nothing: the reason is in
/// `xlog_last_error_message` on this thread and on stderr.
#[no_mangle]
pub extern "C" fn xlog_torch_free(ptr: *mut c_void, size: usize, device: i32, stream: *mut c_void) {
    let _ = (size, stream);
    boundary("xlog_torch_free", |call| hooks::free(call.hooks(), ptr as u64, device))
}

/// `xlog_torch_free` for a caller that knows only the pointer: the block
/// is looked up in the hooks of every device opened so far (device
/// pointers are unique within a process). The OOM shim of
/// `xlog_cuda.torch` gives it to PyTorch as the deleter of raw
/// allocations (`raw_delete`, `raw_deleter`), which are not told the
/// device. NULL frees nothing. A pointer no hooks hold changes nothing:
/// the reason is in `xlog_last_error_message` on this thread and on
/// stderr.
#[no_mangle]
pub extern "C" fn xlog_torch_free_any_device(ptr: *mut c_void) {
    boundary("xlog_torch_free_any_device", |call| hooks::free_any_device(call.hooks(), ptr as u64))
}

/// Record that the block at `ptr` is used on `stream` (the role of
/// `Tensor.record_stream`): when it is freed, its allocation stream first
/// waits for all work queued on `stream` up to that moment.
#[no_mangle]
pub extern "C" fn xlog_torch_record_stream(ptr: *mut c_void, device: i32, stream: *mut c_void) -> xlog_status {
    boundary("xlog_torch_record_stream", |call| {
        check_ordinal(device)?;
        hooks::record_stream(call.hooks(), device, ptr as u64, stream as u64)
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
    boundary("xlog_torch_record_stream_hook", |_| hooks::record_stream_any_device(ptr as u64, stream as u64))
}

// ----- CUDA graphs: captures PyTorch begins itself, announced -----
//
// The OOM shim of `xlog_cuda.torch` sets the pluggable allocator's three
// pool hooks to the entry points below (docs/frameworks.md, "CUDA
// graphs"); `crate::hooks` says what the hook runtime does with them.


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
    boundary("xlog_torch_begin_allocate_to_pool", |call| {
        // Before anything opens or imports.
        check_ordinal(device)?;
        hooks::begin_allocate_to_pool(call.hooks(), device, (pool_id_0, pool_id_1), capture_stream as u64)
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
    boundary("xlog_torch_end_allocate_to_pool", |call| {
        check_ordinal(device)?;
        hooks::end_allocate_to_pool(call.hooks(), device, (pool_id_0, pool_id_1))
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
    boundary("xlog_torch_release_pool", |call| {
        check_ordinal(device)?;
        let released = hooks::release_pool(call.hooks(), device, (pool_id_0, pool_id_1))?;
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
        let ptr = hooks::allocate(call.hooks(), size, device, 0, Framework::Cupy)?;
        Ok(ptr as usize as *mut c_void)
    })
}

/// CuPy `CFunctionAllocator` free: `void (*)(void* param, void* ptr, int)`.
#[no_mangle]
pub extern "C" fn xlog_cupy_free(param: *mut c_void, ptr: *mut c_void, device: i32) {
    let _ = param;
    boundary("xlog_cupy_free", |call| hooks::free(call.hooks(), ptr as u64, device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::api::{xlog_config_init, xlog_get_stats, xlog_runtime_close};
    use crate::hooks::Hooks;
    use std::sync::Arc;

    /// The hooks of `device`, opened if needed, through this thread's hook
    /// state as the entry points reach them.
    fn open_hooks(device: i32) -> Result<Arc<Hooks>, crate::error::ResourceError> {
        crate::ffi::FFI.with(|t| hooks::hooks(&t.hooks, device))
    }

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
        let h = open_hooks(device).unwrap();
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
    fn old_addresses_of_lent_pages_stay_bounded_when_lending_serves_the_misses() {
        // PyTorch's pattern with sizes that never repeat: a ring of 64
        // blocks of random sizes (512 B to 128 MiB, mostly small) on one
        // stream, the oldest freed as each new one comes. Past the soft
        // cap, lending serves the misses, and each page lent on from the
        // place it was lent to leaves one more old address, mapped: only
        // recycling unmapped them, and nothing recycles here. Before the
        // hard bound they grew with each pair (110,000 mappings of 320
        // pages held after 1.6 million pairs), each pair slower.
        let device = 7015;
        let mut cfg = sim_config(0);
        cfg.memory = XLOG_MEMORY_ARENA;
        // A device of 1 GiB: the live peak is 640 MiB.
        cfg.sim_capacity_bytes = 1 << 30;
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK);
        let stream = 0x1000 as *mut c_void;
        let mut seed = 12345u64;
        let sizes: Vec<usize> = (0..4096)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let r = seed >> 33;
                let exp = 9 + (r % 24).min(r % 18);
                (1usize << exp) + (r as usize >> 8) % (1usize << exp)
            })
            .collect();
        let mut ring = [std::ptr::null_mut::<c_void>(); 64];
        for i in 0..400_000usize {
            if !ring[i % 64].is_null() {
                xlog_torch_free(ring[i % 64], 0, device, stream);
            }
            ring[i % 64] = xlog_torch_malloc(sizes[i % sizes.len()], device, stream);
            assert!(!ring[i % 64].is_null(), "{}", last_error());
        }
        let mut rt = std::ptr::null_mut();
        assert_eq!(xlog_interop_runtime(device, &mut rt), XLOG_OK);
        let mut stats = xlog_stats { struct_size: std::mem::size_of::<xlog_stats>() as u32, ..Default::default() };
        assert_eq!(xlog_get_stats(rt, &mut stats), XLOG_OK);
        assert_eq!(xlog_runtime_close(rt), XLOG_OK);
        // Every mapping is of a page held, in pages of 2 MiB or more: the
        // installed ones, and old addresses up to 32 times the bytes held
        // (plus one lend), not one more each time.
        let mappings = stats.pages_mapped - stats.pages_unmapped;
        let held_pages = stats.reserved_bytes / (2 << 20);
        assert!(stats.pages_mapped > 40 * held_pages, "pages were lent: {stats:?}");
        assert!(mappings <= 33 * held_pages + 64, "{mappings} mappings of {held_pages} pages held: {stats:?}");
        for p in ring {
            xlog_torch_free(p, 0, device, stream);
        }
        assert_eq!(xlog_interop_live_blocks(device), 0);
    }

    #[test]
    fn a_pointer_alone_is_freed_on_the_device_that_holds_it() {
        let (d1, d2) = (7013, 7014);
        let cfg = sim_config(0);
        for d in [d1, d2] {
            // SAFETY: a valid config pointer.
            assert_eq!(unsafe { xlog_interop_configure(d, &cfg) }, XLOG_OK);
        }
        let a = xlog_torch_malloc(4096, d1, std::ptr::null_mut());
        let b = xlog_torch_malloc(8192, d2, std::ptr::null_mut());
        assert!(!a.is_null() && !b.is_null(), "{}", last_error());
        xlog_torch_free_any_device(b);
        assert_eq!(last_error(), "");
        assert_eq!((xlog_interop_live_blocks(d1), xlog_interop_live_blocks(d2)), (1, 0));
        // Freed already, and never handed out: reported, nothing changed.
        for bogus in [b, 0x7777_0000 as *mut c_void] {
            xlog_torch_free_any_device(bogus);
            assert!(last_error().contains("not a live hook allocation of any device"), "{}", last_error());
        }
        assert_eq!((xlog_interop_live_blocks(d1), xlog_interop_live_blocks(d2)), (1, 0));
        xlog_torch_free_any_device(std::ptr::null_mut());
        assert_eq!(last_error(), "");
        xlog_torch_free_any_device(a);
        assert_eq!((xlog_interop_live_blocks(d1), xlog_interop_live_blocks(d2)), (0, 0));
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
        assert_eq!(open_hooks(device).unwrap().runtime.stats().unwrap().live_blocks, 0);
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
        let h = open_hooks(device).unwrap();
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
        let (h1, h2) = (open_hooks(d1).unwrap(), open_hooks(d2).unwrap());
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
        assert!(!hooks::table_entry(device).0);
        let cfg = sim_config(0);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK, "still configurable");

        let a = xlog_torch_malloc(64 << 10, device, std::ptr::null_mut());
        let b = xlog_torch_malloc(256 << 10, device, std::ptr::null_mut());
        assert!(!a.is_null() && !b.is_null(), "{}", last_error());
        xlog_torch_free(a, 64 << 10, device, std::ptr::null_mut());
        xlog_torch_free(b, 256 << 10, device, std::ptr::null_mut());
        let h = open_hooks(device).unwrap();
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
        assert!(!hooks::table_entry(device).0, "a failing call opened the hook runtime of device {device}");
        assert_eq!(xlog_interop_live_blocks(device), 0);
        // So the device can still be configured before its first allocation.
        let cfg = sim_config(1 << 20);
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &cfg) }, XLOG_OK, "{}", last_error());
        let p = xlog_torch_malloc(4096, device, std::ptr::null_mut());
        assert!(!p.is_null(), "{}", last_error());
        // On a device in use, a record_stream of a pointer it does not hold
        // imports nothing either.
        let h = open_hooks(device).unwrap();
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
        assert!(hooks::table_entry(device) == (false, None));
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
        assert!(!hooks::table_entry(device).0, "a refused pool call opened the hooks of device {device}");
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
        assert!(hooks::table_entry(device).1.unwrap().wait_on_pressure);
        let mut explicit = sim_config(0);
        explicit.wait_on_pressure = 0;
        // SAFETY: a valid config pointer.
        assert_eq!(unsafe { xlog_interop_configure(device, &explicit) }, XLOG_OK);
        assert!(!hooks::table_entry(device).1.unwrap().wait_on_pressure, "an explicit config is kept as given");
    }
}
