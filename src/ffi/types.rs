//! C-visible types. Enumerations cross the boundary as fixed-width integers
//! with named constants: a caller may pass any value, and an out-of-range
//! value in a Rust enum would be undefined behaviour before we could reject
//! it. Every value is checked on entry.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// Status of every call. Values never change meaning.
pub type xlog_status = i32;
pub const XLOG_OK: xlog_status = 0;
pub const XLOG_ERR_INVALID_ARGUMENT: xlog_status = 1;
pub const XLOG_ERR_OUT_OF_BUDGET: xlog_status = 2;
pub const XLOG_ERR_OUT_OF_MEMORY: xlog_status = 3;
pub const XLOG_ERR_DRIVER: xlog_status = 4;
pub const XLOG_ERR_STREAM_MISUSE: xlog_status = 5;
pub const XLOG_ERR_USE_AFTER_FREE: xlog_status = 6;
pub const XLOG_ERR_UNSATISFIABLE_DEPENDENCY: xlog_status = 7;
pub const XLOG_ERR_POOL_EXHAUSTED: xlog_status = 8;
pub const XLOG_ERR_NO_DEVICE: xlog_status = 9;
pub const XLOG_ERR_INTERNAL: xlog_status = 10;

/// Stream id issued by a runtime. 0 is never valid; ids are never reused.
pub type xlog_stream = u32;

/// How a launch touches a block.
pub type xlog_access = u32;
pub const XLOG_ACCESS_READ: xlog_access = 1;
pub const XLOG_ACCESS_WRITE: xlog_access = 2;
pub const XLOG_ACCESS_READ_WRITE: xlog_access = 3;

/// How a capture begun with `xlog_capture_begin` restricts other threads'
/// CUDA calls (CUDA's `CUstreamCaptureMode`).
pub type xlog_capture_mode = u32;
pub const XLOG_CAPTURE_GLOBAL: xlog_capture_mode = 0;
pub const XLOG_CAPTURE_THREAD_LOCAL: xlog_capture_mode = 1;
pub const XLOG_CAPTURE_RELAXED: xlog_capture_mode = 2;

/// Device backend.
pub type xlog_backend = u32;
/// CUDA when a driver and device are present, else sim.
pub const XLOG_BACKEND_AUTO: xlog_backend = 0;
pub const XLOG_BACKEND_CUDA: xlog_backend = 1;
/// Host-simulated device.
pub const XLOG_BACKEND_SIM: xlog_backend = 2;

/// Allocator at the bottom of the stack.
pub type xlog_allocator = u32;
/// Stream-ordered allocation with block-use tracking (default).
pub const XLOG_ALLOCATOR_ASYNC: xlog_allocator = 0;
/// Synchronous allocation, no tracking (prepare/finish → STREAM_MISUSE).
pub const XLOG_ALLOCATOR_DIRECT: xlog_allocator = 1;

/// Opaque runtime handle. The pointer value is a token checked on every
/// call: a closed or never-opened handle is an error, not a crash.
pub struct xlog_runtime {
    _private: [u8; 0],
}

/// A value handle for a block; copy it freely. Checked by generation on
/// every use: a handle to a freed block is rejected even if its address was
/// reused.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct xlog_block {
    /// Device pointer (host memory on the sim backend); NULL for 0 bytes.
    pub ptr: *mut c_void,
    pub size: u64,
    /// Unique for the life of the process, never reused.
    pub generation: u64,
    /// Allocation stream.
    pub stream: xlog_stream,
    pub device: i32,
}

/// One block used by a recorded launch.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct xlog_use {
    pub block: xlog_block,
    pub access: xlog_access,
}

/// Runtime configuration. Fill it with `xlog_config_init`, then change
/// fields.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct xlog_config {
    /// Set by `xlog_config_init` to `sizeof(xlog_config)`; 0 marks a config
    /// whose environment defaults were malformed.
    pub struct_size: u32,
    pub backend: xlog_backend,
    pub allocator: xlog_allocator,
    /// 0 = no budget layer.
    pub budget_bytes: u64,
    /// Most streams `xlog_stream_acquire` hands out at once.
    pub stream_pool_size: u32,
    /// NULL = no logging layer; else a CSV file path.
    pub log_path: *const c_char,
    /// Memory of the simulated device.
    pub sim_capacity_bytes: u64,
    /// Wait for pending frees before refusing with OUT_OF_BUDGET or
    /// OUT_OF_MEMORY (0 or 1).
    pub wait_on_pressure: u8,
    /// Reuse freed memory without a driver call (0 or 1; default 1, env
    /// `XLOG_CACHE`): the arena's coalescing ranges, or with
    /// `XLOG_MEMORY_POOL` the per-stream caches. Async allocator only; 0
    /// frees every block to the driver's pool (the seed's behaviour; the
    /// arena needs 1).
    pub cache: u8,
    /// Freed memory (bytes) xlog's driver pool keeps mapped at
    /// synchronisation points; UINT64_MAX (the default, env
    /// `XLOG_POOL_RELEASE_THRESHOLD`, e.g. `max` or `2GiB`) keeps all.
    pub pool_release_threshold: u64,
    /// Record each allocation's call site for `xlog_live_blocks` (0 or 1;
    /// default 0, env `XLOG_TRACK_CALLSITES`). Costs a lock and a map
    /// update per allocation and free when on, nothing when off.
    pub track_call_sites: u8,
    /// Devices the sim backend simulates (default 1, env
    /// `XLOG_SIM_DEVICES`): opening a sim ordinal at or past it fails with
    /// XLOG_ERR_NO_DEVICE. Ignored on CUDA.
    pub sim_devices: u32,
    /// Where the async allocator's memory comes from (env `XLOG_MEMORY`,
    /// `arena` or `pool`): XLOG_MEMORY_ARENA (0, the default), xlog's own
    /// arena on CUDA's virtual-memory API, where the budget charges the
    /// physical pages the device holds; XLOG_MEMORY_POOL (1), the driver's
    /// stream-ordered pool with per-stream caches. Devices without virtual
    /// memory management use the pool.
    pub memory: u8,
}

/// `xlog_config.memory`: xlog's own arena (the default).
pub const XLOG_MEMORY_ARENA: u8 = 0;
/// `xlog_config.memory`: the driver's stream-ordered pool.
pub const XLOG_MEMORY_POOL: u8 = 1;

/// What the last close of a runtime found (`xlog_runtime_close_detailed`).
/// Set `struct_size = sizeof(xlog_close_report)` before the call: the
/// library fills only the fields that fit in it, so later fields can be
/// added without breaking callers built against this header.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct xlog_close_report {
    pub struct_size: u32,
    /// Blocks still live at close (the close freed them).
    pub leaked_blocks: u64,
    /// Their requested bytes.
    pub leaked_bytes: u64,
    /// Pooled streams acquired and never released (the close released
    /// them). Imported streams are not counted: they are the caller's own.
    pub unreleased_streams: u64,
}

/// Runtime statistics. Byte counts are device bytes (sizes rounded up to
/// what the allocator really hands out).
///
/// Set `struct_size = sizeof(xlog_stats)` before calling `xlog_get_stats`:
/// the library fills only the fields that fit in `struct_size`, so a caller
/// built against an older, shorter header keeps working.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct xlog_stats {
    /// Set by the caller to `sizeof(xlog_stats)`.
    pub struct_size: u32,
    pub live_bytes: u64,
    /// Freed to the driver, the GPU not yet seen past the free.
    pub pending_bytes: u64,
    /// live + cached + pending: what xlog holds from the driver, and what
    /// the budget charges (with the arena: the bytes of its mapped and
    /// spare pages, exactly what the device holds for xlog).
    pub outstanding_bytes: u64,
    pub peak_outstanding_bytes: u64,
    /// 0 without a budget layer.
    pub budget_limit: u64,
    /// UINT64_MAX without a budget layer.
    pub budget_remaining: u64,
    pub live_blocks: u64,
    pub pending_blocks: u64,
    pub allocations: u64,
    pub deallocations: u64,
    pub failed_allocations: u64,
    /// Freed blocks kept in the per-stream caches for reuse.
    pub cached_bytes: u64,
    pub cached_blocks: u64,
    /// Allocations served from a cache / from the driver.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Memory the driver's pool holds for xlog on CUDA with
    /// `XLOG_MEMORY_POOL` (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`); with
    /// the arena and on sim, outstanding_bytes (the arena's pages are
    /// exactly what the device holds).
    pub reserved_bytes: u64,
    /// CSV log lines that could not be written (full disk, /dev/full, a
    /// FIFO nobody reads); 0 without a log. The first loss is also reported
    /// once on stderr.
    pub log_lines_lost: u64,
    /// Highest live_bytes / live_blocks since the runtime opened or the
    /// last `xlog_reset_peak`.
    pub peak_live_bytes: u64,
    pub peak_live_blocks: u64,
    /// Refused allocations tried again after relieving pressure (the cache
    /// given back, pending frees reaped or waited for).
    pub alloc_retries: u64,
    /// Physical pages the arena has mapped (one cuMemMap each) and
    /// unmapped since the runtime opened; 0 with XLOG_MEMORY_POOL. In a
    /// loop of repeating shapes they should stop growing: each page mapped
    /// or unmapped costs host time (tens of microseconds on a GPU).
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
}

/// Host callback run in stream order.
pub type xlog_host_fn = Option<extern "C" fn(user: *mut c_void)>;

/// Version of this header; `xlog_version()` gives the library's at run time.
pub const XLOG_VERSION_MAJOR: u32 = 0;
pub const XLOG_VERSION_MINOR: u32 = 1;
pub const XLOG_VERSION_PATCH: u32 = 0;

/// Largest live blocks `xlog_memory_summary` lists.
pub const XLOG_SUMMARY_TOP_BLOCKS: u32 = 10;

/// One live block, as `xlog_live_blocks` reports it.
///
/// Set `struct_size = sizeof(xlog_live_block)` in the first element of the
/// array you pass: the library writes each element at that stride and fills
/// only the fields that fit, so a caller built against an older, shorter
/// header keeps working.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct xlog_live_block {
    /// Set by the caller (first element) to `sizeof(xlog_live_block)`.
    pub struct_size: u32,
    /// The block's handle (pointer, requested size, generation, allocation
    /// stream, device): usable with every block call while it is live.
    pub block: xlog_block,
    /// Device bytes the block takes (its size class or granularity).
    pub device_bytes: u64,
    /// Allocation number on the block's stream (1 = the first; streams of
    /// one internal table shard share the count, as ids 32 apart do).
    pub sequence: u64,
    /// Allocations made on that stream (and its shard) after this one: the
    /// block's age in allocations.
    pub allocations_since: u64,
    /// Nanoseconds since the allocation when the runtime tracks call sites,
    /// else UINT64_MAX.
    pub age_ns: u64,
    /// Tag name; never NULL ("" for untagged). Valid for the life of the
    /// process.
    pub tag: *const c_char,
    /// Call site (what `xlog_allocate_at` or `xlog_set_call_site` gave);
    /// NULL when none was recorded. Valid for the life of the process.
    pub call_site: *const c_char,
}

/// Counters of one tag, as `xlog_tag_stats` reports them. Same
/// `struct_size` rule as `xlog_live_block`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct xlog_tag_stat {
    /// Set by the caller (first element) to `sizeof(xlog_tag_stat)`.
    pub struct_size: u32,
    /// Tag name; never NULL ("" for untagged, "(other)" for the bucket of
    /// tags past the tag table's bound). Valid for the life of the process.
    pub tag: *const c_char,
    /// Device bytes of the tag's live blocks.
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// Highest live_bytes since the runtime opened or `xlog_reset_peak`.
    pub peak_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
}
