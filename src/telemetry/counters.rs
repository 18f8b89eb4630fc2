//! Per-tag and whole-runtime allocation counters (see the module docs of
//! `telemetry` for the contract).
//!
//! Every counter is an atomic updated on the allocation and free paths, so
//! nothing here takes a lock. A tag's counters are found by the tag's index
//! in the process-wide tag table (bounded by `MAX_TAGS`): a chunk of 64
//! tags is allocated the first time one of them is counted, and from then
//! on finding a tag's counters is an index and one load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::resource::{AllocTag, MAX_TAGS};

/// Tags per lazily allocated chunk.
const CHUNK: usize = 64;
const CHUNKS: usize = MAX_TAGS.div_ceil(CHUNK);

/// Raise `peak` to `now` if it is lower. A plain load first: in a steady
/// state the peak is not passed, and the load leaves the line shared.
#[inline]
fn raise(peak: &AtomicU64, now: u64) {
    if now > peak.load(Ordering::Relaxed) {
        peak.fetch_max(now, Ordering::Relaxed);
    }
}

/// A current value and its high-water mark.
#[derive(Default)]
struct Gauge {
    current: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    #[inline]
    fn add(&self, n: u64) {
        let now = self.current.fetch_add(n, Ordering::Relaxed).wrapping_add(n);
        raise(&self.peak, now);
    }

    #[inline]
    fn sub(&self, n: u64) {
        self.current.fetch_sub(n, Ordering::Relaxed);
    }

    fn reset_peak(&self) {
        self.peak.store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    fn read(&self) -> (u64, u64) {
        let current = self.current.load(Ordering::Relaxed);
        // A reader may see the current value before the peak catches up.
        (current, self.peak.load(Ordering::Relaxed).max(current))
    }
}

/// One tag's counters, on a cache line of its own so that threads
/// allocating under different tags do not share one.
#[repr(align(64))]
#[derive(Default)]
struct TagCell {
    live_bytes: Gauge,
    allocations: AtomicU64,
    frees: AtomicU64,
}

/// Whole-runtime counters, on their own cache line.
#[repr(align(64))]
#[derive(Default)]
struct TotalCell {
    live_bytes: Gauge,
    live_blocks: Gauge,
}

/// Counters of one tag, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagCounts {
    pub tag: AllocTag,
    /// Device bytes of the tag's live blocks.
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// Highest `live_bytes` since the runtime opened or the last
    /// `reset_peak`.
    pub peak_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
}

/// Whole-runtime counters, as read.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TotalCounts {
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub live_blocks: u64,
    pub peak_live_blocks: u64,
}

/// The counters of one runtime.
pub struct Counters {
    totals: TotalCell,
    chunks: Box<[OnceLock<Box<[TagCell]>>]>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters { totals: TotalCell::default(), chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect() }
    }
}

impl Counters {
    #[inline]
    fn cell(&self, tag: AllocTag) -> &TagCell {
        // Tag indices are below MAX_TAGS (the table is bounded); clamp so a
        // bad index lands in the overflow bucket instead of panicking.
        let index = if tag.index() < MAX_TAGS { tag.index() } else { AllocTag::OVERFLOW.index() };
        let chunk = self.chunks[index / CHUNK].get_or_init(|| (0..CHUNK).map(|_| TagCell::default()).collect());
        &chunk[index % CHUNK]
    }

    /// A block of `held` device bytes under `tag` became live.
    #[inline]
    pub fn allocated(&self, tag: AllocTag, held: u64) {
        let cell = self.cell(tag);
        cell.allocations.fetch_add(1, Ordering::Relaxed);
        cell.live_bytes.add(held);
        self.totals.live_bytes.add(held);
        self.totals.live_blocks.add(1);
    }

    /// A block counted by `allocated` was freed.
    #[inline]
    pub fn freed(&self, tag: AllocTag, held: u64) {
        let cell = self.cell(tag);
        cell.live_bytes.sub(held);
        cell.frees.fetch_add(1, Ordering::Release);
        self.totals.live_bytes.sub(held);
        self.totals.live_blocks.sub(1);
    }

    /// Every peak restarts from its current value.
    pub fn reset_peak(&self) {
        self.totals.live_bytes.reset_peak();
        self.totals.live_blocks.reset_peak();
        for chunk in self.chunks.iter().filter_map(|c| c.get()) {
            for cell in chunk.iter() {
                cell.live_bytes.reset_peak();
            }
        }
    }

    pub fn totals(&self) -> TotalCounts {
        let (live_bytes, peak_live_bytes) = self.totals.live_bytes.read();
        let (live_blocks, peak_live_blocks) = self.totals.live_blocks.read();
        TotalCounts { live_bytes, peak_live_bytes, live_blocks, peak_live_blocks }
    }

    /// Every tag that has counted an allocation, by tag index.
    pub fn tags(&self) -> Vec<TagCounts> {
        let mut out = Vec::new();
        for (c, chunk) in self.chunks.iter().enumerate() {
            let Some(chunk) = chunk.get() else { continue };
            for (i, cell) in chunk.iter().enumerate() {
                // Frees first: a free is counted after its allocation, so
                // read this way `allocations >= frees` always holds.
                let frees = cell.frees.load(Ordering::Acquire);
                let allocations = cell.allocations.load(Ordering::Acquire);
                if allocations == 0 {
                    continue;
                }
                let (live_bytes, peak_bytes) = cell.live_bytes.read();
                out.push(TagCounts {
                    tag: AllocTag::from_index(c * CHUNK + i),
                    live_bytes,
                    live_blocks: allocations.saturating_sub(frees),
                    peak_bytes,
                    allocations,
                    frees,
                });
            }
        }
        out
    }
}
