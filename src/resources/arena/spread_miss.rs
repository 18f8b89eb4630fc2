//! Where a miss goes: the region, of any stream, where it maps the fewest
//! pages (`Arena`'s placement of a block that must map pages).
//!
//! Contract:
//! - Only for a small block (not one of the large pages' regions) that its
//!   own stream's regions cannot place without mapping (a miss) and that
//!   no region holds mapped whole (`across_streams.rs` looked first), and
//!   never while a capture is active (its caller's `may_unmap`).
//! - Every region of the block's page size is looked at (one another
//!   thread holds is passed over, never waited for): at either end of
//!   each of its `CANDIDATES` smallest fitting free ranges, the placement
//!   that leaves the fewest granules to map, none of them the old address
//!   of a lent page. The block goes there when that is fewer than its own
//!   stream's placement would map.
//! - A placement in another stream's region is ordered after that
//!   stream's work on the GPU (one event record and one stream wait, as
//!   `across_streams.rs` does), unless its range was never used; freed,
//!   the block is foreign to that region like any block another stream
//!   took there (it joins the region's free ranges at once).
//!
//! Why: streams that take turns leave their idle pages and partly used
//! pages in each other's regions. A miss that lent those pages into its
//! own region mapped them a second time and granted access (tens of
//! microseconds a page on the GPU), and the next round lent them back: a
//! process that remapped so ran W11's rounds up to 1.2x slower than
//! raw-max. And each stream's own partial pages add up: a small engine on
//! four streams held the sum of four live peaks each rounded up to pages.
//! Placed where most of its pages are already mapped, in any region, the
//! block maps a few pages instead, and the streams' blocks share pages as
//! they would in one address space (BENCHMARKS.md, "fifteenth pass" for
//! blocks of 16 MiB and more, "sixteenth pass" for every size).

use super::region::Region;
use super::{Arena, Carved, SharedRegion};
use crate::device::RawStream;

/// Fitting free ranges looked at in each region.
const CANDIDATES: usize = 64;

impl Region {
    /// The placement of `len` bytes at either end of one of the smallest
    /// fitting free ranges that maps the fewest granules, none of them the
    /// old address of a lent page: its address and how many of its
    /// granules are not mapped.
    fn fewest_missing(&self, len: u64) -> Option<(u64, usize)> {
        let mut best: Option<(u64, usize)> = None;
        for (start, size) in self.free.fitting(len).take(CANDIDATES) {
            for at in [start, start + size - len] {
                let pages = self.pages_of(at, len);
                if self.lent.iter().any(|l| pages.contains(&l.page)) {
                    continue;
                }
                let missing = pages.filter(|&p| !self.is_mapped(p)).count();
                if best.map_or(true, |(_, fewest)| missing < fewest) {
                    best = Some((at, missing));
                }
            }
        }
        best
    }
}

impl Arena {
    /// A placement of `len` bytes for `stream` in any region of `page`-byte
    /// pages that maps fewer than `own` granules (what its own stream's
    /// placement would map), carved, and fenced after the region's stream
    /// when that is another stream; `None`: there is none (nothing changed).
    pub(super) fn spread_miss(&self, stream: RawStream, len: u64, page: u64, own: usize) -> Option<Carved> {
        let mut best: Option<(SharedRegion, u64, usize)> = None;
        for region in self.regions_of(page) {
            let Some(r) = region.try_lock() else { continue };
            let Some((at, missing)) = r.fewest_missing(len) else { continue };
            if missing < best.as_ref().map_or(own, |b| b.2) {
                drop(r);
                best = Some((region, at, missing));
            }
        }
        let (region, at, _) = best?;
        let mut r = region.lock();
        // Looked at without the lock held since: still free? (What is
        // mapped there is counted again below.)
        let freed = r.free.withdraw(at, len)?;
        let missing = r.unmapped_in(at, len);
        let owner = r.stream;
        drop(r);
        // The fence's driver calls with no lock held, as across_streams.rs
        // does.
        if owner != stream && freed > 0 && !self.fence(owner, stream) {
            region.lock().unreserve(at, len, freed);
            return None;
        }
        Some((region, at, freed, missing))
    }
}
