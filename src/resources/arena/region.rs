//! `Region`: one stream's reserved address range in the arena, its free
//! ranges and the physical page mapped at each granule.
//!
//! Contract:
//! - A block the region's stream carves from it is freed back into it:
//!   stream order alone fences a reuse of its addresses on that stream,
//!   so a hit needs no event and no wait (blocks of other streams: below).
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
//! - Another stream may take a range of this region: mapped space
//!   (`across_streams.rs`), or for a miss where the fewest of its pages
//!   are missing (`spread_miss.rs`; the arena maps the rest for it). The arena orders it after this stream's work with an event.
//!   Freed, such a block is *foreign*: since this region's stream order
//!   does not cover it, the arena makes this region's stream wait on the
//!   GPU for the freeing stream's work, then it joins the free ranges as
//!   this stream's next free (`release_merged`).
//! - An idle page may be *lent*, whether or not its frees are known
//!   complete: its physical page is mapped a second time elsewhere (the
//!   arena orders the new use after this stream's work), and its granule
//!   here leaves the page table (`lent`), still mapped but never handed
//!   out as it is, until the arena unmaps it after those frees are
//!   complete (`lent_done`). So memory the GPU is still finishing with
//!   serves a new block at once, with no new physical page, no host wait
//!   and no unmap. A page lent to another region takes its granule out of
//!   the free ranges until then. A page lent within the region leaves its
//!   granule free: a block later carved over it takes the page back
//!   (`move_back`, no driver call) while the page's new place is idle (its
//!   granule there becomes the lent one), else the arena unmaps the old
//!   address first, but only once the frees that made it idle are
//!   complete: while the GPU may still run work there, the old address
//!   leaves the free ranges instead until `lent_done` gives it to the
//!   arena to unmap (no address is unmapped under running work: that is an
//!   illegal-address fault). A step that lends the same pages to and fro (the
//!   fixed-shape GPT-2 step, 21 large pages a step) so settles with both
//!   places mapped and maps nothing more.
//! - The region does no driver call itself: the arena maps, unmaps and
//!   queries, holding the region's lock.

use std::collections::VecDeque;
use std::ops::Range;

use super::ranges::FreeRanges;
use crate::device::{PhysHandle, RawEvent, RawStream};
use crate::fast_hash::FastMap;

pub(crate) struct Region {
    pub stream: RawStream,
    pub base: u64,
    pub len: u64,
    /// Bytes of one granule and of the physical page mapped there: the
    /// arena's page, or its large page in a region of large blocks.
    pub page_bytes: u64,
    pub free: FreeRanges,
    /// The physical page mapped at each granule; `None` where unmapped.
    pages: Vec<Option<PhysHandle>>,
    /// The granule each installed page is at (`pages` inverted), so the
    /// old address of a lent page finds where the page is now.
    at: FastMap<PhysHandle, usize>,
    /// One past the highest granule ever mapped: no page is mapped from
    /// here on, so scans for mapped pages stop here (a region reserves
    /// the whole device, tens of thousands of granules, and its last free
    /// range, mostly never mapped, reaches to its end).
    mapped_end: usize,
    /// Frees into this region so far: each gets the next number.
    frees: u64,
    /// Frees known complete on the GPU.
    pub done: u64,
    /// Events recorded on the stream after free number `.1`, oldest first.
    pub seals: VecDeque<(RawEvent, u64)>,
    /// The latest frees not yet merged: (address, length, free number),
    /// newest last, at most `RECENT_MAX`.
    recent: Vec<(u64, u64, u64)>,
    /// Granules whose page was lent while still mapped here, out of the
    /// page table until the arena unmaps the old address or the page comes
    /// back (`move_back`).
    pub lent: Vec<Lent>,
}

/// The old address of a lent page.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lent {
    pub page: usize,
    /// The sequence of the free that made it idle.
    pub freed: u64,
    pub handle: PhysHandle,
    /// Whether the granule stayed in the free ranges: the page was lent
    /// within this region, so it may come back (`move_back`). A page lent
    /// to another region takes its granule out of them until the old
    /// address is unmapped.
    pub free: bool,
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
            at: FastMap::default(),
            mapped_end: 0,
            frees: 0,
            done: 0,
            seals: VecDeque::new(),
            recent: Vec::new(),
            lent: Vec::new(),
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
        debug_assert!(self.pages[page].is_none());
        self.pages[page] = Some(handle);
        self.at.insert(handle, page);
        self.mapped_end = self.mapped_end.max(page + 1);
    }

    /// The handle of an unmapped page taken out of the table.
    pub fn uninstall(&mut self, page: usize) -> PhysHandle {
        let handle = self.pages[page].take().expect("a mapped page");
        self.at.remove(&handle);
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
        self.take_recent(len).or_else(|| self.take_merged(len))
    }

    /// `take` when the block must be mapped whole (a hit): a recent free
    /// (mapped: its pages were never idle) as it is, else, every recent
    /// free merged in first, the best fit if all its granules are mapped,
    /// else mapped space in one of the next fitting ranges (`take_mapped`,
    /// whose first candidate is the best fit). `None` changes nothing but
    /// the merging.
    pub fn take_hit(&mut self, len: u64) -> Option<(u64, u64)> {
        if let Some(found) = self.take_recent(len) {
            return Some(found);
        }
        // Merged first for the reason `take_merged` gives.
        self.settle_recent();
        self.take_mapped(len)
    }

    /// The best fit of the free ranges, every recent free merged in first.
    fn take_merged(&mut self, len: u64) -> Option<(u64, u64)> {
        // Best fit over space that is not all there would carve larger
        // ranges while the holes that fit sit unmerged, and the layout
        // would drift from step to step (measured on recorded traces:
        // 1.6x the remapping of merging here first).
        self.settle_recent();
        self.free.take(len)
    }

    /// Mapped space for another stream: a recent free of exactly `len`
    /// bytes (mapped: its pages were never idle), else mapped space at
    /// either end of one of the fitting ranges (`take_mapped`), the other
    /// recent frees left as they are (they are this stream's same-size
    /// reuse). Not the best fit alone: at a query engine's sizes the
    /// smallest fitting range is mostly not all mapped while a larger one
    /// is, and every such miss lent pages from one stream's region to
    /// another's, round after round (W11's recorded trace: 14-21% fewer
    /// pages mapped; BENCHMARKS.md, "fifteenth pass").
    pub fn take_for_another(&mut self, len: u64) -> Option<(u64, u64)> {
        self.take_recent(len).or_else(|| self.take_mapped(len))
    }

    /// The newest recent free of exactly `len` bytes, taken off the list.
    fn take_recent(&mut self, len: u64) -> Option<(u64, u64)> {
        let i = self.recent.iter().rposition(|&(_, l, _)| l == len)?;
        let (addr, _, seq) = self.recent.remove(i);
        Some((addr, seq))
    }

    /// `len` bytes of free space whose granules are all mapped: the first of
    /// the `MAPPED_CANDIDATES` smallest fitting ranges with a mapped
    /// placement at its start (the first one's start is the best fit) or
    /// its end.
    /// Taking mapped space where it exists keeps a repeating workload from
    /// moving pages (each move shifts where the next blocks fit). The
    /// address and the range's free sequence.
    pub fn take_mapped(&mut self, len: u64) -> Option<(u64, u64)> {
        let (start, size, at) = self.free.fitting(len).take(MAPPED_CANDIDATES).find_map(|(start, size)| {
            [start, start + size - len].into_iter().find(|&at| self.all_mapped(at, len)).map(|at| (start, size, at))
        })?;
        Some((at, self.free.carve(start, size, at, len)))
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
        (first..end.min(self.mapped_end)).filter(|&p| self.pages[p].is_some())
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

    /// How many idle pages `lend_pages` could take, counted up to `max`.
    pub fn lendable(&self, max: usize) -> usize {
        let mut n = 0;
        for (start, span) in self.free.iter() {
            if n >= max {
                break;
            }
            n += self.mapped_pages_within(start, span.len).take(max - n).count();
        }
        n
    }

    /// Lend up to `max` idle pages, longest idle first, to this region
    /// (`here`) or another: each leaves the page table and is listed in
    /// `lent` until the arena unmaps its old address or (lent here) the
    /// page comes back (`move_back`); a page lent elsewhere also takes its
    /// granule out of the free ranges. The pages.
    pub fn lend_pages(&mut self, max: usize, here: bool) -> Vec<PhysHandle> {
        // The longest-idle space first: in a workload that repeats, what
        // was freed last is what the next step allocates again.
        let mut ranges: Vec<(u64, super::ranges::Span)> = self.free.iter().collect();
        ranges.sort_by_key(|&(_, span)| span.freed);
        let mut candidates = Vec::new();
        for (start, span) in ranges {
            if candidates.len() >= max {
                break;
            }
            candidates.extend(self.mapped_pages_within(start, span.len).take(max - candidates.len()));
        }
        let mut out = Vec::with_capacity(candidates.len());
        for page in candidates {
            let addr = self.page_addr(page);
            let freed = if here { self.free.covering(addr, self.page_bytes) } else { self.free.withdraw(addr, self.page_bytes) };
            let freed = freed.expect("an idle page is free whole");
            let handle = self.uninstall(page);
            self.lent.push(Lent { page, freed, handle, free: here });
            out.push(handle);
        }
        out
    }

    /// `take`, with lent pages moved back into the block where they can
    /// (`move_back`): the address, the free sequence, the granules still
    /// to map, and which of those are old addresses of lent pages in use
    /// elsewhere whose frees are known complete (the caller unmaps them
    /// first). An old address whose frees are not known complete, or any
    /// with `withhold_all`, instead leaves the free ranges (until the arena
    /// unmaps it, `lent_done`) and the search goes on: the GPU may still
    /// run work of the block freed there, and unmapping an address under
    /// running work is an illegal-address fault.
    pub fn take_moving_back(&mut self, len: u64, withhold_all: bool) -> Option<(u64, u64, Vec<usize>, Vec<usize>)> {
        loop {
            let (addr, freed) = self.take(len)?;
            let missing = self.unmapped_in(addr, len);
            if self.lent.is_empty() {
                return Some((addr, freed, missing, Vec::new()));
            }
            let mut still = Vec::with_capacity(missing.len());
            let mut in_use = Vec::new();
            for page in missing {
                match self.move_back(page) {
                    Some(true) => {}
                    Some(false) => {
                        in_use.push(page);
                        still.push(page);
                    }
                    None => still.push(page),
                }
            }
            let running: Vec<usize> = in_use.iter().copied().filter(|&p| withhold_all || !self.lent_complete(p)).collect();
            if running.is_empty() {
                return Some((addr, freed, still, in_use));
            }
            self.unreserve(addr, len, freed);
            for page in running {
                self.withhold(page);
            }
        }
    }

    /// Whether the old address `page` of a lent page is out of use on the
    /// GPU: the frees that made it idle are complete.
    fn lent_complete(&self, page: usize) -> bool {
        self.lent.iter().any(|l| l.page == page && l.freed <= self.done)
    }

    /// `page`, a granule of a block just carved, is the old address of a
    /// lent page (`None`: it is not). When that page's granule here is
    /// idle, the page moves back with no driver call (both addresses map
    /// it): this granule is installed again and the other one becomes the
    /// lent one (`Some(true)`). Otherwise the page is in use (`Some(false)`).
    /// So a layout that lends the same pages back and forth from step to
    /// step maps nothing once both places are mapped.
    fn move_back(&mut self, page: usize) -> Option<bool> {
        let i = self.lent.iter().position(|l| l.page == page)?;
        let handle = self.lent[i].handle;
        let Some(&now) = self.at.get(&handle) else { return Some(false) };
        let Some(freed) = self.free.covering(self.page_addr(now), self.page_bytes) else { return Some(false) };
        self.lent.swap_remove(i);
        self.uninstall(now);
        self.lent.push(Lent { page: now, freed, handle, free: true });
        self.install(page, handle);
        Some(true)
    }

    /// The old address of a lent page is unmapped: off the list (its
    /// granule stays where it is, free or carved).
    pub fn forget_lent(&mut self, page: usize) {
        self.lent.retain(|l| l.page != page);
    }

    /// The lent granule `page`, free, leaves the free ranges until its old
    /// address is unmapped (its page is in use elsewhere).
    fn withhold(&mut self, page: usize) {
        let addr = self.page_addr(page);
        if let Some(l) = self.lent.iter_mut().find(|l| l.page == page && l.free) {
            self.free.withdraw(addr, self.page_bytes).expect("a lent granule kept free is free");
            l.free = false;
        }
    }

    /// Lent granules whose frees are now complete (and which `which`
    /// picks), taken off the list. The caller unmaps each, then gives back
    /// with `unreserve` those not `free` (free address space, nothing
    /// mapped).
    pub fn lent_done(&mut self, which: impl Fn(&Lent) -> bool) -> Vec<Lent> {
        let done = self.done;
        let (finished, running) = std::mem::take(&mut self.lent).into_iter().partition(|l| l.freed <= done && which(l));
        self.lent = running;
        finished
    }

    /// Undo the lending of every page lent after the first `keep` entries
    /// of `lent` (the arena could not fence them): mapped and free here
    /// again, as they were.
    pub fn take_back_lent(&mut self, keep: usize) {
        for l in self.lent.split_off(keep) {
            self.install(l.page, l.handle);
            if !l.free {
                let addr = self.page_addr(l.page);
                self.free.insert(addr, self.page_bytes, l.freed);
            }
        }
    }

    /// A lent granule `lent_done` returned whose old address could not be
    /// unmapped: back on the list.
    pub fn lent_again(&mut self, lent: Lent) {
        self.lent.push(lent);
    }

    /// The page installed at granule `page`, if any.
    #[cfg(test)]
    pub fn handle_at(&self, page: usize) -> Option<PhysHandle> {
        self.pages[page]
    }

    /// Every mapped page, in address order (close).
    pub fn mapped_pages(&self) -> Vec<usize> {
        (0..self.mapped_end).filter(|&p| self.pages[p].is_some()).collect()
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

    #[test]
    fn a_page_lent_to_another_region_leaves_the_free_ranges_until_its_frees_are_done() {
        let mut r = Region::new(1, 0, 4 * G, G);
        let (a, _) = r.take(2 * G).unwrap();
        for p in r.unmapped_in(a, 2 * G) {
            r.install(p, p as u64 + 100);
        }
        r.release(a, 2 * G);
        r.settle_recent();
        assert!(r.idle_pages(4).is_empty(), "not complete: recycling cannot take them");
        assert_eq!(r.lend_pages(1, false), vec![100], "lending can");
        assert!(!r.is_mapped(0) && r.is_mapped(1));
        let free = |r: &Region| r.free.iter().map(|(a, s)| (a, s.len)).collect::<Vec<_>>();
        assert_eq!(free(&r), vec![(G, 3 * G)], "the lent granule is out of the free ranges");
        assert!(r.lent_done(|_| true).is_empty(), "its free is still running");
        r.all_done();
        assert_eq!(r.lent_done(|_| true), vec![Lent { page: 0, freed: 1, handle: 100, free: false }]);
        assert!(r.lent.is_empty());
        r.unreserve(0, G, 1);
        assert_eq!(free(&r), vec![(0, 4 * G)], "given back, it is free address space again");
        assert_eq!(r.unmapped_in(0, 2 * G), vec![0], "and unmapped");
    }

    /// A region with granules `0..n` mapped (page `100 + p` at granule
    /// `p`) and free.
    fn mapped_and_free(n: usize) -> Region {
        let mut r = Region::new(1, 0, 16 * G, G);
        let (a, _) = r.take(n as u64 * G).unwrap();
        for p in r.unmapped_in(a, n as u64 * G) {
            r.install(p, p as u64 + 100);
        }
        r.release(a, n as u64 * G);
        r.settle_recent();
        r
    }

    #[test]
    fn a_page_lent_within_its_region_moves_back_when_the_old_place_is_carved_again() {
        // Granule 0's page lent to granule 4 of this region (as the arena
        // maps it there: installed), where a block is live.
        let lent_to_4 = || {
            let mut r = mapped_and_free(2);
            assert_eq!(r.lend_pages(1, true), vec![100]);
            r.free.withdraw(4 * G, G).unwrap();
            r.install(4, 100);
            r
        };
        let free = |r: &Region| r.free.iter().map(|(a, s)| (a, s.len)).collect::<Vec<_>>();
        let mut r = lent_to_4();
        assert_eq!(free(&r), vec![(0, 4 * G), (5 * G, 11 * G)], "the old address stays free");
        // Granule 0 cannot have its page back. The free that made it idle
        // is not known complete: the GPU may still use the old address, so
        // it is not for unmapping; withheld, the search goes on past it.
        let (a, _, missing, in_use) = r.take_moving_back(2 * G, false).unwrap();
        assert_eq!((a, missing, in_use), (G, vec![2], Vec::<usize>::new()), "withheld while its free runs");
        assert!(!free(&r).iter().any(|&(s, _)| s == 0), "granule 0 left the free ranges");
        // Complete: the old address is in the way, for the caller to unmap.
        let mut r = lent_to_4();
        r.all_done();
        let (a, _, missing, in_use) = r.take_moving_back(2 * G, false).unwrap();
        assert_eq!((a, missing, in_use), (0, vec![0], vec![0]), "the old address is in the way, its page in use");
        r.unreserve(a, 2 * G, 1);
        let (a, _, missing, in_use) = r.take_moving_back(2 * G, true).unwrap();
        assert_eq!((a, missing, in_use), (G, vec![2], Vec::<usize>::new()), "withhold_all: withheld even so");
        assert!(!free(&r).iter().any(|&(s, _)| s == 0), "granule 0 left the free ranges");
        r.unreserve(a, 2 * G, 1);
        r.forget_lent(0);
        r.unreserve(0, G, 1);
        // Lent again and freed at granule 4: the page moves back at once.
        let mut r = mapped_and_free(2);
        r.lend_pages(1, true);
        r.free.withdraw(4 * G, G).unwrap();
        r.install(4, 100);
        r.unreserve(4 * G, G, 2);
        let (a, _, missing, in_use) = r.take_moving_back(2 * G, false).unwrap();
        assert_eq!((a, missing, in_use), (0, Vec::<usize>::new(), Vec::<usize>::new()), "nothing to map");
        assert!(r.is_mapped(0) && r.is_mapped(1) && !r.is_mapped(4), "the page is at granule 0 again");
        assert_eq!(r.lent, vec![Lent { page: 4, freed: 2, handle: 100, free: true }], "granule 4 is its old address now");
        // And forth again: a block over granule 4 takes it back.
        r.release(0, 2 * G);
        r.settle_recent();
        r.free.withdraw(G, 3 * G).unwrap();
        let (a, _, missing, _) = r.take_moving_back(2 * G, false).unwrap();
        assert_eq!((a, missing), (4 * G, vec![5]), "granule 0 is idle: its page moves to 4, 5 is still to map");
        assert!(r.is_mapped(4) && !r.is_mapped(0));
    }

    #[test]
    fn scans_for_mapped_pages_reach_the_highest_granule_ever_mapped() {
        let mut r = Region::new(1, 0, 64 * G, G);
        let (a, _) = r.take(G).unwrap();
        r.install(0, 100);
        // A block at the far end of the region: its granule is found by
        // every scan, however far past the others it lies.
        let far = 62 * G;
        r.free.withdraw(far, 2 * G).unwrap();
        for p in r.unmapped_in(far, 2 * G) {
            r.install(p, p as u64 + 100);
        }
        assert_eq!(r.mapped_pages(), vec![0, 62, 63]);
        r.release(a, G);
        r.release(far, 2 * G);
        r.settle_recent();
        r.all_done();
        assert_eq!(r.idle_pages(10), vec![0, 62, 63]);
        assert_eq!(r.lendable(10), 3);
        // Unmapped again, the scans find nothing (the end stays where it was).
        for p in [0, 62, 63] {
            r.uninstall(p);
        }
        assert!(r.idle_pages(10).is_empty() && r.mapped_pages().is_empty());
    }

    #[test]
    fn runs_group_consecutive_pages() {
        assert_eq!(runs(&[1, 2, 3, 7, 9, 10]), vec![(1, 3), (7, 1), (9, 2)]);
        assert!(runs(&[]).is_empty());
    }
}
