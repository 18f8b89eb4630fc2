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
//! - Freed, such a block is *foreign* to its region (`region.rs`): it waits
//!   behind an event recorded at the free and joins the free ranges once
//!   that event has completed, or when the region's stream needs room and
//!   waits for it on the GPU; the stream that freed it may take it back as
//!   it is. So streams that take turns share their memory without
//!   unmapping it.

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

    /// Foreign frees of `r` join its free ranges: those whose events have
    /// completed (with `wait`, after waiting for them on the host); with
    /// `owner_waits`, the rest too, `r`'s stream made to wait for each on
    /// the GPU (they then count as frees at this point of that stream).
    pub(super) fn settle_foreign(&self, r: &mut Region, wait: bool, owner_waits: bool) {
        let mut i = 0;
        while i < r.foreign.len() {
            let (addr, len, event, _) = r.foreign[i];
            if wait {
                let _ = self.device.event_synchronize(event);
            }
            if self.device.event_query(event) == Ok(true) {
                r.unreserve(addr, len, 0);
            } else if owner_waits && self.device.stream_wait_event(r.stream, event).is_ok() {
                r.release_merged(addr, len);
            } else {
                i += 1;
                continue;
            }
            r.foreign.swap_remove(i);
            lock(&self.spare).events.push(event);
        }
    }

    /// The smallest foreign free of `r` of at least `len` bytes, `stream`
    /// made to wait for its event: its address. The rest of it stays
    /// foreign behind an event recorded on `stream` after the wait.
    fn take_foreign_in_flight(&self, r: &mut Region, stream: RawStream, len: u64) -> Option<u64> {
        let i = (0..r.foreign.len()).filter(|&i| r.foreign[i].1 >= len).min_by_key(|&i| r.foreign[i].1)?;
        let (addr, flen, event, _) = r.foreign[i];
        self.device.stream_wait_event(stream, event).ok()?;
        if flen > len {
            let rest = self.record_on(stream)?;
            r.foreign.push((addr + len, flen - len, rest, stream));
        }
        r.foreign.swap_remove(i);
        lock(&self.spare).events.push(event);
        Some(addr)
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
            // A block this stream took from here and freed, of the size:
            // back to it as it is (its own stream order fences it).
            if let Some(i) = r.foreign.iter().position(|f| f.3 == stream && f.1 == len) {
                let (addr, _, event, _) = r.foreign.swap_remove(i);
                lock(&self.spare).events.push(event);
                return Some(addr);
            }
            // The owner's recent frees stay where they are: they are its
            // same-size reuse, and merged space suffices here.
            self.settle_foreign(&mut r, false, false);
            // A foreign free still in flight that fits: this stream waits
            // for it on the GPU (it was freed after all its uses); what
            // the block leaves stays foreign, fenced by an event of this
            // stream recorded after that wait.
            if let Some(addr) = self.take_foreign_in_flight(&mut r, stream, len) {
                return Some(addr);
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
