//! A runtime's counters (`xlog_get_stats`). `xlog_stats` grows at its
//! end: the caller's `struct_size` says how much of it to fill, and any
//! layout from the first (through `failed_allocations`) on is accepted.
//! The inspection calls (live blocks, tags, summary) are in `inspect.rs`.

#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use super::types::*;
use super::{boundary, invalid, out_ptr};
use crate::error::ResourceError;
use crate::runtime::Stats;

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
        pages_mapped: s.pages_mapped,
        pages_unmapped: s.pages_unmapped,
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

/// Current statistics.
#[no_mangle]
pub extern "C" fn xlog_get_stats(rt: *mut xlog_runtime, out: *mut xlog_stats) -> xlog_status {
    boundary("xlog_get_stats", |call| {
        out_ptr(out, "out")?;
        call.with_runtime(rt, |r| write_stats(out, &stats_of(&r.stats()?)))
    })
}
