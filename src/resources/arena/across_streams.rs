//! Memory across streams: a stream that misses takes mapped free space of
//! another stream's region instead of mapping pages, and blocks other
//! streams took are given back (`Arena`'s cross-stream half).
//!
//! Contract:
//! - Before it maps anything, a stream takes mapped free space of another
//!   stream's region (that stream's recent free of the size, else mapped
//!   space at either end of one of its smallest fitting free ranges, as
//!   a hit in its own region would), made to wait on the GPU for that
//!   stream's work (one event record and one stream wait, never a host
//!   wait). A region another thread holds at that moment is passed over,
//!   never waited for.
//! - Freed, such a block is *foreign* to its region (`region.rs`): it
//!   joins the region's free ranges at once, as a free of the region's
//!   stream, that stream made to wait on the GPU for the freeing stream's
//!   work (`free_foreign`). So it coalesces with its neighbours, its pages
//!   can be idle, and every stream sees it, as in one address space
//!   shared by all streams. It used to wait apart, behind an event, until
//!   that event completed or the region's stream needed room: on a query
//!   engine's four streams, with the GPU behind the host, such blocks then
//!   sat out of use while the same memory was mapped again elsewhere (the
//!   recorded W11 trace at a sixteenth of its sizes held 1.81x its live
//!   peak with every miss placed in any region, 1.18x now; BENCHMARKS.md,
//!   "sixteenth pass"). What it costs: the region's stream waits on the
//!   GPU for the freeing stream's work up to the free.

use super::region::Region;
use super::{lock, Arena};
use crate::device::{RawEvent, RawStream};

impl Arena {
    /// An event recorded on `stream` now (from the spare list).
    pub(super) fn record_on(&self, stream: RawStream) -> Option<RawEvent> {
        let event = lock(&self.spare).events.pop().map_or_else(|| self.device.create_event(), Ok).ok()?;
        match self.device.record_event(event, stream) {
            Ok(()) => Some(event),
            Err(_) => {
                lock(&self.spare).events.push(event);
                None
            }
        }
    }

    /// Make `stream` wait on the GPU for the work queued on `owner` so far
    /// (one event record and one stream wait, never a host wait): whether
    /// it does.
    pub(super) fn fence(&self, owner: RawStream, stream: RawStream) -> bool {
        let Some(event) = self.record_on(owner) else { return false };
        let waited = self.device.stream_wait_event(stream, event);
        lock(&self.spare).events.push(event);
        waited.is_ok()
    }

    /// A block `other` took from `r`'s region, freed on `other` (every use
    /// of it happens before this point of `other`): back into the free
    /// ranges at once, as `r`'s stream's next free, that stream made to
    /// wait on the GPU for `other`'s work so far (`fence`), so anything
    /// later carved there is ordered after those uses. Where the driver
    /// fails the fence, the host waits for `other` instead (if that fails
    /// too, the range stays out of use).
    pub(super) fn free_foreign(&self, r: &mut Region, addr: u64, len: u64, other: RawStream) {
        if self.fence(other, r.stream) {
            r.release_merged(addr, len);
        } else if self.device.synchronize_stream(other).is_ok() {
            r.unreserve(addr, len, 0);
        }
    }

    /// A fully mapped range of `len` bytes in another stream's region
    /// (of `page`-byte pages for a large block),
    /// with `stream` made to wait (on the GPU) for that stream's work so
    /// far: its address, or `None`.
    pub(super) fn take_from_another_stream(&self, stream: RawStream, len: u64, page: u64) -> Option<u64> {
        // A large block only where large pages are; a small one anywhere
        // (as in its own stream's regions).
        let candidates = if self.is_large(page) { self.regions_of(page) } else { self.every_region() };
        for region in candidates {
            // A region another thread holds now is passed over: its owner
            // may be mapping or unmapping pages there (driver calls of
            // tens of microseconds a page), and waiting for that would
            // cost more than the pages this saves (on W11's four streams,
            // most of this call's time was that wait).
            let Some(mut r) = region.try_lock() else { continue };
            if r.stream == stream {
                continue;
            }
            let Some((addr, freed)) = r.take_for_another(len) else { continue };
            debug_assert!(r.all_mapped(addr, len), "another stream takes mapped space only");
            if freed == 0 {
                // Never used by any block: nothing to wait for (and no
                // reason to tie this stream to that one's queued work).
                return Some(addr);
            }
            // The range is out of the free ranges: the fence's driver
            // calls need no lock (the owner's next hit may need it).
            let owner = r.stream;
            drop(r);
            if self.fence(owner, stream) {
                return Some(addr);
            }
            region.lock().unreserve(addr, len, freed);
            return None;
        }
        None
    }
}
