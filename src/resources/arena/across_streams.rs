//! Memory across streams: a stream that misses takes mapped free space of
//! another stream's region instead of mapping pages, and blocks other
//! streams took are given back (`Arena`'s cross-stream half).
//!
//! Contract:
//! - Before it maps anything, a stream takes a mapped free range of
//!   another stream's region, made to wait on the GPU for that stream's
//!   work up to the frees that made the range free (one stream wait,
//!   never a host wait); so for pages lent from another stream's region.
//! - **Seals.** Once another stream has taken memory of a region, that
//!   region's own frees are *sealed* as they come: an event recorded on
//!   its stream right after the free (at most `SEALS_MAX` kept). A later
//!   taker waits for the oldest seal that covers the frees it needs, not
//!   for everything the owner queued since (an event recorded at the take
//!   would make it queue behind the owner's later work: four streams of a
//!   query engine took each other's memory about four times a query on
//!   W11). Without a seal (a region not shared yet) the wait is for an
//!   event recorded at the take. A region no stream took from for
//!   `SHARED_SEALS` seals is sealed no more. The calls made depend only
//!   on the calls before, never on how far the GPU got.
//! - Freed, such a block is *foreign* to its region (`region.rs`): it waits
//!   behind an event recorded at the free and joins the free ranges once
//!   that event has completed, or when the region's stream needs room and
//!   waits for it on the GPU; the stream that freed it may take it back as
//!   it is. So streams that take turns share their memory without
//!   unmapping it.

use super::region::Region;
use super::{lock, Arena};

/// Seals a shared region keeps at most (`Arena::seal_frees`).
const SEALS_MAX: usize = 16;
/// Seals after which a region no other stream took from is no longer
/// shared.
const SHARED_SEALS: u32 = 4096;
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

    /// After a free into `r` by its own stream: while other streams take
    /// memory of `r` (`shared`), an event recorded now covers every free so
    /// far, so that a stream taking this memory later waits on the GPU for
    /// `r`'s stream up to the free, not for all it queued since
    /// (`order_after_frees`). A region no other stream took from for
    /// `SHARED_SEALS` seals is no longer sealed.
    pub(super) fn seal_frees(&self, r: &mut Region) {
        if !r.shared || r.seals.back().is_some_and(|&(_, seq)| seq >= r.frees()) {
            return;
        }
        r.sealed_since += 1;
        if r.sealed_since > SHARED_SEALS {
            r.shared = false;
            return;
        }
        if r.seals.len() >= SEALS_MAX {
            // The oldest seal goes, asked nothing (the calls made stay the
            // same whatever the GPU's progress); its event may be recorded
            // again at once: a wait already queued on it keeps what it
            // captured.
            if let Some((event, _)) = r.seals.pop_front() {
                lock(&self.spare).events.push(event);
            }
        }
        if let Some(event) = self.record_on(r.stream) {
            r.seals.push_back((event, r.frees()));
        }
    }

    /// Order `stream` after the frees of `r` up to number `freed` (`r`'s own
    /// stream order covers them when `stream` is `r`'s): nothing when none
    /// was freed, else a GPU-side wait for the oldest seal recorded after
    /// them, else for an event recorded on `r`'s stream now (never a host
    /// wait; the calls depend on the calls made before, not on how far the
    /// GPU got). From then on `r`'s frees are sealed as they come
    /// (`seal_frees`). Whether `stream` is ordered after them.
    pub(super) fn order_after_frees(&self, r: &mut Region, freed: u64, stream: RawStream) -> bool {
        if freed == 0 || r.stream == stream {
            return true;
        }
        r.shared = true;
        r.sealed_since = 0;
        match r.seals.iter().find(|&&(_, seq)| seq >= freed) {
            Some(&(event, _)) => self.device.stream_wait_event(stream, event).is_ok(),
            None => self.fence(r.stream, stream),
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
        for region in self.every_region() {
            let mut r = lock(&region);
            // A large block only where large pages are; a small one
            // anywhere (as in its own stream's regions).
            if r.stream == stream || (self.is_large(page) && r.page_bytes != page) {
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
            if !r.all_mapped(addr, len) {
                r.unreserve(addr, len, freed);
                continue;
            }
            // Never used by any block, or its frees complete: nothing to
            // wait for (and no reason to tie this stream to that one's
            // queued work); else a wait up to those frees.
            if self.order_after_frees(&mut r, freed, stream) {
                return Some(addr);
            }
            r.unreserve(addr, len, freed);
            return None;
        }
        None
    }
}
