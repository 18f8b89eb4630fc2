//! The C entry points of the inspection side (`telemetry`): the live-block
//! list, per-tag counters, peak reset, the text summary, and call sites.
//!
//! The array calls (`xlog_live_blocks`, `xlog_tag_stats`) fill a caller's
//! buffer: `*count` always receives how many entries there are, at most
//! `cap` are written, and `out == NULL` with `cap == 0` only counts. The
//! caller's `struct_size` (in the first element) is the stride, so an array
//! of an older, shorter struct is filled field by field as far as it goes.

#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_char, CStr};

use super::block::block_of;
use super::types::*;
use super::{boundary, invalid, out_ptr, stream_id, write_out};
use crate::error::ResourceError;
use crate::resource::{AllocTag, DeviceBlock};
use crate::telemetry::{tag_c_name, CallSite, LiveBlock, TagStats};

/// The checks every array call makes: `count` non-NULL, `out` non-NULL
/// when `cap > 0`, and the declared `struct_size` at least `min_size`.
/// Returns the stride (the declared size), or 0 when nothing is to be
/// written.
fn array_stride<T>(out: *mut T, cap: usize, count: *mut usize, what: &str, min_size: usize) -> Result<usize, ResourceError> {
    out_ptr(count, "count")?;
    if cap == 0 {
        return Ok(0);
    }
    if out.is_null() {
        return Err(invalid(format!("out is NULL but cap is {cap} (pass cap = 0 to only count)")));
    }
    // SAFETY: `out` is non-NULL and the caller guarantees it points at
    // `cap` ≥ 1 elements whose leading u32 (struct_size) is readable.
    let declared = unsafe { out.cast::<u32>().read_unaligned() } as usize;
    if declared < min_size {
        return Err(invalid(format!(
            "out[0].struct_size is {declared}: set it to sizeof({what}) ({} with this header) first",
            std::mem::size_of::<T>()
        )));
    }
    Ok(declared)
}

/// Write the first `entries.len().min(cap)` entries at `stride`, each cut
/// to the fields that fit in it, with `struct_size` set to what was written.
fn write_array<T: Copy>(out: *mut T, stride: usize, cap: usize, entries: &[T], set_size: impl Fn(&mut T, u32)) {
    if stride == 0 {
        return;
    }
    let n = stride.min(std::mem::size_of::<T>());
    for (i, entry) in entries.iter().take(cap).enumerate() {
        let mut filled = *entry;
        set_size(&mut filled, n as u32);
        // SAFETY: `i < cap`, and the caller guarantees `cap` elements of
        // `stride` (their declared struct_size) writable bytes at `out`; we
        // write n ≤ stride bytes from a local, so the regions do not overlap.
        unsafe {
            let dst = out.cast::<u8>().add(i * stride);
            std::ptr::copy_nonoverlapping((&filled as *const T).cast::<u8>(), dst, n);
        }
    }
}

fn live_block_of(b: &LiveBlock) -> xlog_live_block {
    let handle = DeviceBlock { id: b.id, tag: b.tag, state: crate::resource::BlockState::Live, held: b.device_bytes };
    xlog_live_block {
        struct_size: std::mem::size_of::<xlog_live_block>() as u32,
        block: block_of(&handle),
        device_bytes: b.device_bytes,
        sequence: b.sequence,
        allocations_since: b.allocations_since,
        age_ns: b.age.map_or(u64::MAX, |a| a.as_nanos().min(u64::MAX as u128 - 1) as u64),
        tag: tag_c_name(b.tag).as_ptr(),
        call_site: b.call_site.map_or(std::ptr::null(), |s| s.c_name().as_ptr()),
    }
}

fn tag_stat_of(t: &TagStats) -> xlog_tag_stat {
    xlog_tag_stat {
        struct_size: std::mem::size_of::<xlog_tag_stat>() as u32,
        tag: tag_c_name(t.tag).as_ptr(),
        live_bytes: t.live_bytes,
        live_blocks: t.live_blocks,
        peak_bytes: t.peak_bytes,
        allocations: t.allocations,
        frees: t.frees,
    }
}

/// The live blocks of `rt`, by generation (allocation order for the
/// blocks of one thread). `*count` receives how many are
/// live; the first `min(*count, cap)` are written to `out`. Set
/// `out[0].struct_size = sizeof(xlog_live_block)` first. `out == NULL` with
/// `cap == 0` only counts. Other threads may allocate between a counting
/// call and a filling one: leave room, and compare `*count` with `cap`.
/// Each entry is consistent on its own (copied under its record's lock).
/// Errors: XLOG_ERR_INVALID_ARGUMENT for a NULL `count`, a NULL `out` with
/// `cap > 0`, or a `struct_size` smaller than this header's
/// `sizeof(xlog_live_block)`.
#[no_mangle]
pub unsafe extern "C" fn xlog_live_blocks(
    rt: *mut xlog_runtime,
    out: *mut xlog_live_block,
    cap: usize,
    count: *mut usize,
) -> xlog_status {
    boundary("xlog_live_blocks", |call| {
        let stride = array_stride(out, cap, count, "xlog_live_block", std::mem::size_of::<xlog_live_block>())?;
        call.with_runtime(rt, |r| {
            let blocks = r.live_blocks()?;
            let entries: Vec<xlog_live_block> = blocks.iter().take(cap).map(live_block_of).collect();
            write_array(out, stride, cap, &entries, |e, n| e.struct_size = n);
            write_out(count, blocks.len());
            Ok(())
        })
    })
}

/// Counters of every tag `rt` has allocated under, largest live bytes
/// first; the same buffer rules as `xlog_live_blocks` (set
/// `out[0].struct_size = sizeof(xlog_tag_stat)`).
#[no_mangle]
pub unsafe extern "C" fn xlog_tag_stats(
    rt: *mut xlog_runtime,
    out: *mut xlog_tag_stat,
    cap: usize,
    count: *mut usize,
) -> xlog_status {
    boundary("xlog_tag_stats", |call| {
        let stride = array_stride(out, cap, count, "xlog_tag_stat", std::mem::size_of::<xlog_tag_stat>())?;
        call.with_runtime(rt, |r| {
            let tags = r.tag_stats()?;
            let entries: Vec<xlog_tag_stat> = tags.iter().take(cap).map(tag_stat_of).collect();
            write_array(out, stride, cap, &entries, |e, n| e.struct_size = n);
            write_out(count, tags.len());
            Ok(())
        })
    })
}

/// Restart every peak from its current value: `peak_outstanding_bytes`,
/// `peak_live_bytes`, `peak_live_blocks` and each tag's `peak_bytes` (the
/// role of `torch.cuda.reset_peak_memory_stats`).
#[no_mangle]
pub extern "C" fn xlog_reset_peak(rt: *mut xlog_runtime) -> xlog_status {
    boundary("xlog_reset_peak", |call| call.with_runtime(rt, |r| r.reset_peak()))
}

/// A readable memory summary of `rt`: totals (live, cached, pending, held,
/// reserved, peaks, budget), the per-tag table and the 10 largest live
/// blocks. Like snprintf: writes at most `cap - 1` bytes and a NUL (cut at
/// a UTF-8 character boundary), and `*needed` receives the size the whole
/// text needs, NUL included; `buf == NULL` with `cap == 0` only sizes it.
/// Errors: XLOG_ERR_INVALID_ARGUMENT for a NULL `needed` or a NULL `buf`
/// with `cap > 0`.
#[no_mangle]
pub unsafe extern "C" fn xlog_memory_summary(
    rt: *mut xlog_runtime,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> xlog_status {
    boundary("xlog_memory_summary", |call| {
        out_ptr(needed, "needed")?;
        if buf.is_null() && cap > 0 {
            return Err(invalid(format!("buf is NULL but cap is {cap} (pass cap = 0 to only size it)")));
        }
        call.with_runtime(rt, |r| {
            let text = r.memory_summary(XLOG_SUMMARY_TOP_BLOCKS as usize)?;
            if cap > 0 {
                let mut n = text.len().min(cap - 1);
                while !text.is_char_boundary(n) {
                    n -= 1;
                }
                // SAFETY: non-NULL, and the caller guarantees `cap` writable
                // bytes at `buf`; we write n + 1 ≤ cap bytes from our string.
                unsafe {
                    std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                    *buf.add(n) = 0;
                }
            }
            write_out(needed, text.len() + 1);
            Ok(())
        })
    })
}

fn text_arg<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        return &[];
    }
    // SAFETY: non-NULL; the caller guarantees a NUL-terminated string that
    // stays valid for this call.
    unsafe { CStr::from_ptr(p) }.to_bytes()
}

/// `xlog_allocate` that also records `call_site` (may be NULL; e.g.
/// "file.c:42" or a function name) as the block's call site when the
/// runtime tracks call sites (`xlog_config.track_call_sites`,
/// `XLOG_TRACK_CALLSITES=1`); without tracking it is `xlog_allocate`.
/// Texts are interned process-wide (at most 4096 distinct, later ones read
/// "(other)"; at most 1024 bytes kept).
#[no_mangle]
pub unsafe extern "C" fn xlog_allocate_at(
    rt: *mut xlog_runtime,
    bytes: u64,
    stream: xlog_stream,
    tag: *const c_char,
    call_site: *const c_char,
    out: *mut xlog_block,
) -> xlog_status {
    boundary("xlog_allocate_at", |call| {
        out_ptr(out, "out")?;
        let tag = AllocTag::from_bytes(text_arg(tag));
        call.with_runtime(rt, |r| {
            let site = if r.tracks_call_sites() {
                CallSite::new(&String::from_utf8_lossy(text_arg(call_site)))
            } else {
                CallSite::NONE
            };
            let block = r.allocate_at(bytes, stream_id(stream)?, tag, site)?;
            write_out(out, block_of(&block));
            Ok(())
        })
    })
}

/// Label this thread's next allocations (on every runtime that tracks call
/// sites) with `call_site` until it is set again; NULL or "" clears it. An
/// explicit `xlog_allocate_at` site wins. This is how allocations made
/// through the framework hooks get a call site: set it around the code
/// that allocates.
#[no_mangle]
pub unsafe extern "C" fn xlog_set_call_site(call_site: *const c_char) -> xlog_status {
    boundary("xlog_set_call_site", |_| {
        let text = String::from_utf8_lossy(text_arg(call_site));
        CallSite::set_thread_current(CallSite::new(&text));
        Ok(())
    })
}
