//! `Region`: one stream's reserved address range in the arena, its free
//! ranges and the physical page mapped at each granule.
//!
//! Contract:
//! - Every block carved from a region was allocated on the region's
//!   stream and is freed back into it: stream order alone fences a reuse
//!   of its addresses on that stream, so a hit needs no event and no wait.
//! - A granule (page) is mapped while any live block overlaps it, and may
//!   stay mapped while free; it is *idle* when a free range covers it whole.
//!   An idle page may be unmapped (and its physical memory mapped elsewhere
//!   or released) only once the frees that made it idle are complete on the
//!   GPU: `freed <= done` for its range. `done` advances when an event
//!   recorded after those frees completes, or when the stream has nothing
//!   left to run.
//! - The latest frees wait in a short list (`recent`) before they join the
//!   free ranges: an allocation of the same size takes one back with no
//!   tree search (the steady loop's case). Their pages stay mapped (they
//!   are not idle), and the list is merged into the free ranges before
//!   any other allocation searches them and before anything would map,
//!   unmap or count idle pages (`settle_recent`), so best fit always sees
//!   the coalesced free space and the list never costs memory.
//! - Another stream may take a mapped range of this region (the arena
//!   orders it after this stream's work with an event). Freed, such a
//!   block is *foreign*: it waits, with an event recorded on its stream at
//!   the free (`foreign`), since this region's stream order does not
//!   cover it. It joins the free ranges once that event has completed, or
//!   when this region's stream needs room and waits for the event on the
//!   GPU; the stream that freed it may take it back as it is.
//! - An idle page may be *lent*, whether or not its frees are known
//!   complete: its physical page is mapped a second time elsewhere (the
//!   arena orders the new use after this stream's work), and its granule
//!   here leaves the page table but stays mapped, *dormant*. In place (the
//!   arena's choice, `pages.rs`), the dormant granule stays in the free
//!   ranges, so where the next blocks land does not change; else it is a
//!   hole, out of the free ranges until the arena unmaps it. Either way
//!   memory the GPU is still finishing with serves a new block at once,
//!   with no new physical page, no host wait and no unmap.
//! - A page is in service at one granule at most, and no block is ever
//!   placed over a dormant granule: a block carved over dormant granules
//!   has each resolved before anything is mapped (`resolve_dormant`).
//!   When the page is idle where it serves, it comes back (that granule
//!   turns dormant in its place: no driver call; the region's stream
//!   order fences the reuse; from another region, the arena fences it),
//!   so a step that repeats finds its layout again, the pages trading
//!   places. Otherwise the arena unmaps the dormant mapping (once the frees
//!   before it are complete) and maps another page there. Dormant granules
//!   whose frees are complete are also unmapped in batches
//!   (`dormant_done`); holes then rejoin the free ranges.
//! - The region does no driver call itself: the arena maps, unmaps and
//!   queries, holding the region's lock.

use std::collections::VecDeque;
use std::ops::Range;

use super::ranges::FreeRanges;
use crate::device::{PhysHandle, RawEvent, RawStream};
use crate::fast_hash::FastMap;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dormant {
    pub freed: u64,
    pub handle: PhysHandle,
    /// Out of the free ranges until it is unmapped (a hole: lent while
    /// several streams allocate).
    pub out: bool,
}

pub(crate) struct Region {
    pub stream: RawStream,
    pub base: u64,
    pub len: u64,
    page_bytes: u64,
    pub free: FreeRanges,
    /// The physical page mapped at each granule; `None` where unmapped.
    pages: Vec<Option<PhysHandle>>,
    /// Frees into this region so far: each gets the next number.
    frees: u64,
    /// Frees known complete on the GPU.
    pub done: u64,
    /// Events recorded on the stream after free number `.1`, oldest first.
    pub seals: VecDeque<(RawEvent, u64)>,
    /// The latest frees not yet merged: (address, length, free number),
    /// newest last, at most `RECENT_MAX`.
    recent: Vec<(u64, u64, u64)>,
    /// Blocks another stream took from here and freed: (address, length,
    /// an event recorded on that stream after the free, that stream).
    pub foreign: Vec<(u64, u64, RawEvent, RawStream)>,
    /// Dormant granules: granule → the sequence of the free that made it
    /// idle, and the page it still maps, which serves elsewhere.
    dormant: FastMap<usize, Dormant>,
    /// How many dormant granules of this region map each page.
    aliases: FastMap<PhysHandle, u32>,
    /// The granule where each page in service here is mapped.
    serving: FastMap<PhysHandle, usize>,
}

/// Frees kept unmerged for same-size reuse.
const RECENT_MAX: usize = 32;
/// Fitting free ranges `take_mapped` looks at.
const MAPPED_CANDIDATES: usize = 16;

impl Region {
    pub fn new(stream: RawStream, base: u64, len: u64, page_bytes: u64) -> Region {
        let mut free = FreeRanges::default();
        free.insert(base, len, 0);
        let pages = vec![None; (len / page_bytes) as usize];
        Region {
            stream,
            base,
            len,
            page_bytes,
            free,
            pages,
            frees: 0,
            done: 0,
            seals: VecDeque::new(),
            recent: Vec::new(),
            foreign: Vec::new(),
            dormant: FastMap::default(),
            aliases: FastMap::default(),
            serving: FastMap::default(),
        }
    }

    /// The granules `[addr, addr + len)` touches.
    pub fn pages_of(&self, addr: u64, len: u64) -> Range<usize> {
        let first = (addr - self.base) / self.page_bytes;
        let last = (addr + len - 1 - self.base) / self.page_bytes;
        first as usize..last as usize + 1
    }

    pub fn page_addr(&self, page: usize) -> u64 {
        self.base + page as u64 * self.page_bytes
    }

    pub fn is_mapped(&self, page: usize) -> bool {
        self.pages[page].is_some()
    }

    /// The granules of `[addr, addr + len)` with nothing mapped.
    pub fn unmapped_in(&self, addr: u64, len: u64) -> Vec<usize> {
        self.pages_of(addr, len).filter(|&p| self.pages[p].is_none()).collect()
    }

    /// Whether every granule of `[addr, addr + len)` is mapped.
    pub fn all_mapped(&self, addr: u64, len: u64) -> bool {
        self.pages[self.pages_of(addr, len)].iter().all(Option::is_some)
    }

    pub fn install(&mut self, page: usize, handle: PhysHandle) {
        debug_assert!(self.pages[page].is_none() && !self.dormant.contains_key(&page));
        self.pages[page] = Some(handle);
        let before = self.serving.insert(handle, page);
        debug_assert!(before.is_none(), "page {handle} in service at two granules");
    }

    /// The handle of an unmapped page taken out of the table.
    pub fn uninstall(&mut self, page: usize) -> PhysHandle {
        let handle = self.pages[page].take().expect("a mapped page");
        self.serving.remove(&handle);
        handle
    }

    /// A block's memory back, as the next free.
    pub fn release(&mut self, addr: u64, len: u64) {
        self.frees += 1;

        if self.recent.len() == RECENT_MAX {
            let (a, l, seq) = self.recent.remove(0);
            self.free.insert(a, l, seq);
        }
        self.recent.push((addr, len, self.frees));
    }

    /// A block's memory back as the next free, merged at once (a foreign
    /// free this stream now waits for).
    pub fn release_merged(&mut self, addr: u64, len: u64) {
        self.frees += 1;
        self.free.insert(addr, len, self.frees);
    }

    /// `len` bytes: a recent free of exactly that size (newest first, all
    /// its pages mapped), else the best fit of the free ranges with every
    /// recent free merged in first. Returns the address and the free
    /// sequence of where it came from.
    pub fn take(&mut self, len: u64) -> Option<(u64, u64)> {
        if let Some(found) = self.take_recent(len) {
            return Some(found);
        }
        // Best fit over space that is not all there would carve larger
        // ranges while the holes that fit sit unmerged, and the layout
        // would drift from step to step (measured on recorded traces:
        // 1.6x the remapping of merging here first).
        self.settle_recent();
        self.free.take(len)
    }

    /// `take` for another stream: a recent free of exactly `len` bytes, else
    /// the best fit of the merged free ranges, the other recent frees left
    /// as they are (they are this stream's same-size reuse).
    pub fn take_for_another(&mut self, len: u64) -> Option<(u64, u64)> {
        self.take_recent(len).or_else(|| self.free.take(len))
    }

    /// The newest recent free of exactly `len` bytes, taken off the list.
    fn take_recent(&mut self, len: u64) -> Option<(u64, u64)> {
        let i = self.recent.iter().rposition(|&(_, l, _)| l == len)?;
        let (addr, _, seq) = self.recent.remove(i);
        Some((addr, seq))
    }

    /// `len` bytes of free space whose granules are all mapped, when the
    /// best fit is not: the first of the `MAPPED_CANDIDATES` smallest
    /// fitting ranges with a mapped placement at its start or its end.
    /// Taking mapped space where it exists keeps a repeating workload from
    /// moving pages (each move shifts where the next blocks fit). The
    /// address and the range's free sequence.
    pub fn take_mapped(&mut self, len: u64) -> Option<(u64, u64)> {
        let found = self.free.fitting(len).take(MAPPED_CANDIDATES).find_map(|(start, size)| {
            [start, start + size - len].into_iter().find(|&at| self.all_mapped(at, len))
        })?;
        let freed = self.free.withdraw(found, len).expect("a fitting free range covers it");
        Some((found, freed))
    }

    /// Merge the recent frees into the free ranges (before a miss, a
    /// recycle or a trim: only merged free space can coalesce or be idle).
    /// Whether there were any.
    pub fn settle_recent(&mut self) -> bool {
        let any = !self.recent.is_empty();
        for (a, l, seq) in self.recent.drain(..) {
            self.free.insert(a, l, seq);
        }
        any
    }

    /// Memory carved for an allocation that then failed: back as it was
    /// (never used, so no new free).
    pub fn unreserve(&mut self, addr: u64, len: u64, freed: u64) {
        self.free.insert(addr, len, freed);
    }

    pub fn frees(&self) -> u64 {
        self.frees
    }

    /// Every free so far is complete on the GPU.
    pub fn all_done(&mut self) {
        self.done = self.frees;
    }

    /// The mapped pages that `[start, start + len)` covers whole.
    fn mapped_pages_within(&self, start: u64, len: u64) -> impl Iterator<Item = usize> + '_ {
        let first = (start - self.base).div_ceil(self.page_bytes) as usize;
        let end = ((start + len - self.base) / self.page_bytes) as usize;
        (first..end).filter(|&p| self.pages[p].is_some())
    }

    /// Mapped pages that free ranges cover whole and whose frees are
    /// complete: at most `max`, in address order.
    pub fn idle_pages(&self, max: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for (start, span) in self.free.iter() {
            if out.len() >= max {
                break;
            }
            if span.freed > self.done {
                continue;
            }
            out.extend(self.mapped_pages_within(start, span.len).take(max - out.len()));
        }
        out
    }

    /// Lend up to `max` idle pages, longest idle first: each leaves the
    /// page table and turns its granule dormant, `in_place` in the free
    /// ranges (pages no dormant granule maps first: each lend adds an
    /// address to its page, and a page with fewer is less often wanted in
    /// two places at once), else out of them, a hole. The (granule, page)
    /// pairs.
    pub fn lend_pages(&mut self, max: usize, in_place: bool) -> Vec<(usize, PhysHandle)> {
        // The longest-idle space first: in a workload that repeats, what
        // was freed last is what the next step allocates again.
        let mut ranges: Vec<(u64, super::ranges::Span)> = self.free.iter().collect();
        ranges.sort_by_key(|&(_, span)| span.freed);
        let mut candidates: Vec<(usize, u64)> = Vec::new();
        let orders: &[bool] = if in_place { &[false, true] } else { &[false] };
        for &aliased in orders {
            for &(start, span) in &ranges {
                let wanted = max - candidates.len();
                if wanted == 0 {
                    break;
                }
                let pages = self.mapped_pages_within(start, span.len);
                let pick = pages.filter(|&p| !in_place || self.pages[p].is_some_and(|h| self.aliases.contains_key(&h)) == aliased);
                let pick: Vec<(usize, u64)> = pick.take(wanted).map(|p| (p, span.freed)).collect();
                candidates.extend(pick);
            }
        }
        candidates
            .into_iter()
            .map(|(page, freed)| {
                let handle = self.uninstall(page);
                if !in_place {
                    self.free.withdraw(self.page_addr(page), self.page_bytes).expect("an idle page is free whole");
                }
                self.add_dormant(page, Dormant { freed, handle, out: !in_place });
                (page, handle)
            })
            .collect()
    }

    fn add_dormant(&mut self, page: usize, d: Dormant) {
        let before = self.dormant.insert(page, d);
        debug_assert!(before.is_none(), "granule {page} dormant twice");
        *self.aliases.entry(d.handle).or_insert(0) += 1;
    }

    fn remove_dormant(&mut self, page: usize) -> Option<Dormant> {
        let d = self.dormant.remove(&page)?;
        match self.aliases.get_mut(&d.handle) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.aliases.remove(&d.handle);
            }
        }
        Some(d)
    }

    /// Whether a dormant granule here maps `handle`.
    pub fn is_aliased(&self, handle: PhysHandle) -> bool {
        self.aliases.contains_key(&handle)
    }

    /// Dormant granules whose frees are now complete, taken off the list.
    /// The caller unmaps each (and gives those `out` of the free ranges
    /// back with `unreserve`), or lists it again with `dormant_again`.
    pub fn dormant_done(&mut self) -> Vec<(usize, Dormant)> {
        let done = self.done;
        let finished: Vec<usize> = self.dormant.iter().filter(|(_, d)| d.freed <= done).map(|(&g, _)| g).collect();
        finished.into_iter().map(|g| (g, self.remove_dormant(g).expect("listed"))).collect()
    }

    /// Every dormant granule, taken off the list (close): (granule, page).
    pub fn take_all_dormant(&mut self) -> Vec<(usize, PhysHandle)> {
        self.aliases.clear();
        self.dormant.drain().map(|(g, d)| (g, d.handle)).collect()
    }

    /// Undo `lend_pages` for `lent` (the arena could not fence them): in
    /// service here again, as they were.
    pub fn take_back_lent(&mut self, lent: &[(usize, PhysHandle)]) {
        for &(page, handle) in lent {
            let d = self.remove_dormant(page).expect("lent just now");
            if d.out {
                self.free.insert(self.page_addr(page), self.page_bytes, d.freed);
            }
            self.install(page, handle);
        }
    }

    /// A dormant granule `dormant_done` returned whose mapping could not be
    /// unmapped: back on the list.
    pub fn dormant_again(&mut self, page: usize, d: Dormant) {
        self.add_dormant(page, d);
    }

    /// Give the carve `[addr, addr + len)` (free sequence `freed`) back and
    /// make the dormant granules `blocked` (from `resolve_dormant`) holes,
    /// out of the free ranges until unmapped, so the next carve lands
    /// elsewhere (while a capture is active, when nothing may be unmapped).
    /// A granule part of which another carve holds meanwhile stays as it is
    /// (that carve resolves it).
    pub fn hole_out(&mut self, addr: u64, len: u64, freed: u64, blocked: Vec<(usize, Dormant)>) {
        self.free.insert(addr, len, freed);
        for (page, d) in blocked {
            let out = self.idle_since(page).is_some();
            if out {
                self.free.withdraw(self.page_addr(page), self.page_bytes).expect("an idle granule is free whole");
            }
            self.add_dormant(page, Dormant { out, ..d });
        }
    }

    /// The granules `missing` of a block just carved here, before anything
    /// is mapped for it: each dormant one whose page is idle where it serves
    /// in this region takes the page back (that granule turns dormant: no
    /// driver call; the stream's own order fences the reuse). Returns the
    /// granules still to map, and the dormant ones among them that must be
    /// unmapped first, taken off the list.
    pub fn resolve_dormant(&mut self, missing: Vec<usize>) -> (Vec<usize>, Vec<(usize, Dormant)>) {
        let mut still = Vec::with_capacity(missing.len());
        let mut unmap = Vec::new();
        for m in missing {
            let Some(&d) = self.dormant.get(&m) else {
                still.push(m);
                continue;
            };
            match self.serving.get(&d.handle).copied().and_then(|g| self.idle_since(g).map(|freed| (g, freed))) {
                Some((g, freed)) => {
                    self.uninstall(g);
                    self.add_dormant(g, Dormant { freed, handle: d.handle, out: false });
                    self.remove_dormant(m);
                    self.install(m, d.handle);
                }
                None => {
                    self.remove_dormant(m);
                    unmap.push((m, d));
                    still.push(m);
                }
            }
        }
        (still, unmap)
    }

    /// Whether `handle` is in service here.
    pub fn serves(&self, handle: PhysHandle) -> bool {
        self.serving.contains_key(&handle)
    }

    /// `handle`, in service here and idle, leaves for another region's
    /// dormant granule: its granule here turns dormant. The granule, or
    /// `None` (not here, or not idle).
    pub fn give_up_idle(&mut self, handle: PhysHandle) -> Option<usize> {
        let g = *self.serving.get(&handle)?;
        let freed = self.idle_since(g)?;
        self.uninstall(g);
        self.add_dormant(g, Dormant { freed, handle, out: false });
        Some(g)
    }

    /// When a free range covers granule `page` whole: that range's free
    /// sequence.
    fn idle_since(&self, page: usize) -> Option<u64> {
        let addr = self.page_addr(page);
        let (start, span) = self.free.covering(addr)?;
        (start + span.len >= addr + self.page_bytes).then_some(span.freed)
    }

    /// Every mapped page, in address order (close).
    pub fn mapped_pages(&self) -> Vec<usize> {
        (0..self.pages.len()).filter(|&p| self.pages[p].is_some()).collect()
    }
}

/// Consecutive runs of sorted page indices: (first, count).
pub(crate) fn runs(pages: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some((first, count)) if *first + *count == p => *count += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 21;

    #[test]
    fn idle_pages_need_whole_free_granules_and_completed_frees() {
        let mut r = Region::new(1, 0x1000_0000, 8 * G, G);
        let (a, _) = r.free.take(3 * G).unwrap();
        for p in r.unmapped_in(a, 3 * G) {
            r.install(p, p as u64 + 100);
        }
        let (b, _) = r.free.take(G / 2).unwrap();
        assert_eq!(b, a + 3 * G);
        for p in r.unmapped_in(b, G / 2) {
            r.install(p, p as u64 + 100);
        }
        r.release(a, 3 * G);
        assert!(r.idle_pages(10).is_empty(), "a recent free is not merged yet");
        assert!(r.settle_recent());
        assert!(r.idle_pages(10).is_empty(), "the free is not known complete yet");
        r.all_done();
        assert_eq!(r.idle_pages(10), vec![0, 1, 2], "page 3 still holds the live half-page block");
        assert_eq!(r.idle_pages(2), vec![0, 1]);
        r.release(b, G / 2);
        r.settle_recent();
        assert!(r.idle_pages(10).is_empty(), "the merged range takes the newer, incomplete free");
        r.all_done();
        assert_eq!(r.idle_pages(10), vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_recent_free_serves_the_same_size_and_merges_before_anything_else() {
        let mut r = Region::new(1, 0, 4 * G, G);
        let (a, _) = r.take(1000).unwrap();
        let (b, _) = r.take(1000).unwrap();
        assert_eq!((a, b), (0, 1000));
        r.release(a, 1000);
        assert_eq!(r.take(1000), Some((a, 1)), "the same size comes back from the recent list");
        r.release(a, 1000);
        r.release(b, 1000);
        assert_eq!(r.take(1500), Some((0, 3)), "another size merges the recent frees first: best fit from 0");
        assert!(!r.settle_recent(), "nothing left unmerged");
        r.release(0, 1500);
        assert_eq!(r.take(1500), Some((0, 4)), "the same size comes back unmerged");
        r.release(0, 1500);
        assert!(r.settle_recent());
        assert_eq!(r.take(4 * G), Some((0, 5)), "merged, the frees are one range from 0");
    }

    /// A region of four granules with a two-granule block at 0 freed and
    /// merged (its pages 100 and 101), its free not known complete.
    fn freed_block() -> Region {
        let mut r = Region::new(1, 0, 4 * G, G);
        let (a, _) = r.take(2 * G).unwrap();
        for p in r.unmapped_in(a, 2 * G) {
            r.install(p, p as u64 + 100);
        }
        r.release(a, 2 * G);
        r.settle_recent();
        r
    }

    fn free(r: &Region) -> Vec<(u64, u64)> {
        r.free.iter().map(|(a, s)| (a, s.len)).collect()
    }

    #[test]
    fn a_page_lent_as_a_hole_leaves_the_free_ranges_until_unmapped() {
        let mut r = freed_block();
        assert!(r.idle_pages(4).is_empty(), "not complete: recycling cannot take them");
        assert_eq!(r.lend_pages(1, false), vec![(0, 100)], "lending can");
        assert!(!r.is_mapped(0) && r.is_mapped(1));
        assert_eq!(free(&r), vec![(G, 3 * G)], "the hole is out of the free ranges");
        assert!(r.is_aliased(100), "its old address still maps the page");
        assert!(r.dormant_done().is_empty(), "its free is still running");
        r.all_done();
        assert_eq!(r.dormant_done(), vec![(0, Dormant { freed: 1, handle: 100, out: true })]);
        assert!(!r.is_aliased(100));
        r.unreserve(0, G, 1);
        assert_eq!(free(&r), vec![(0, 4 * G)], "unmapped and given back, it is free address space again");
        assert_eq!(r.unmapped_in(0, 2 * G), vec![0], "and unmapped");
    }

    #[test]
    fn a_page_lent_in_place_leaves_its_granule_free_and_dormant() {
        let mut r = freed_block();
        assert_eq!(r.lend_pages(1, true), vec![(0, 100)]);
        assert_eq!(free(&r), vec![(0, 4 * G)], "the free ranges do not change");
        assert!(!r.is_mapped(0) && r.is_aliased(100));
        // Serving elsewhere now (another region, say): carved over, the
        // dormant granule is to be unmapped first, then mapped anew.
        let (a, freed) = r.take(2 * G).unwrap();
        assert_eq!(a, 0);
        let (still, unmap) = r.resolve_dormant(r.unmapped_in(a, 2 * G));
        assert_eq!(still, vec![0]);
        assert_eq!(unmap, vec![(0, Dormant { freed: 1, handle: 100, out: false })]);
        assert!(!r.is_aliased(100), "taken off the list: the caller unmaps it");
        r.unreserve(a, 2 * G, freed);
    }

    #[test]
    fn a_dormant_granule_takes_its_page_back_where_it_is_idle() {
        let mut r = freed_block();
        let lent = r.lend_pages(1, true);
        assert_eq!(lent, vec![(0, 100)]);
        // The page serves a block at granule 3 of this region (the arena
        // maps it there)...
        r.free.withdraw(3 * G, G).unwrap();
        r.install(3, 100);
        // ...a block carved over granule 0 while it is live cannot have it:
        let freed = r.free.withdraw(0, G).unwrap();
        let (still, unmap) = r.resolve_dormant(vec![0]);
        assert_eq!((still, unmap.len()), (vec![0], 1), "busy: unmap granule 0 first");
        r.dormant_again(0, unmap[0].1);
        r.unreserve(0, G, freed);
        // Once the block at granule 3 is freed, the page comes back to
        // granule 0 with no driver call, and granule 3 turns dormant.
        r.release(3 * G, G);
        r.settle_recent();
        r.free.withdraw(0, G).unwrap();
        let (still, unmap) = r.resolve_dormant(vec![0]);
        assert!(still.is_empty() && unmap.is_empty());
        assert!(r.is_mapped(0) && !r.is_mapped(3));
        assert!(r.is_aliased(100), "granule 3 is the dormant one now");
        assert!(r.idle_since(3).is_some(), "and free");
    }

    #[test]
    fn a_page_idle_here_can_leave_for_another_region() {
        let mut r = freed_block();
        assert_eq!(r.give_up_idle(999), None, "not in service here");
        assert_eq!(r.give_up_idle(101), Some(1));
        assert!(!r.is_mapped(1) && r.is_aliased(101) && !r.serves(101));
        r.take_back_lent(&[(1, 101)]);
        assert!(r.is_mapped(1) && !r.is_aliased(101) && r.serves(101));
        let (a, _) = r.take(G / 2).unwrap();
        assert_eq!(a, 0);
        assert_eq!(r.give_up_idle(100), None, "a live block overlaps it");
    }

    #[test]
    fn runs_group_consecutive_pages() {
        assert_eq!(runs(&[1, 2, 3, 7, 9, 10]), vec![(1, 3), (7, 1), (9, 2)]);
        assert!(runs(&[]).is_empty());
    }
}
