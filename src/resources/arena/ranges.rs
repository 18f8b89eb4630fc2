//! `FreeRanges`: the free address ranges of one arena region, best fit with
//! coalescing.
//!
//! Contract:
//! - Ranges never overlap; two adjacent ranges are always merged into one,
//!   so a freed block joins its free neighbours at once and the region's
//!   free space is as contiguous as its live blocks allow.
//! - `take(len)` hands out the start of the smallest range of at least
//!   `len` bytes (the lowest address among equals); the rest stays free.
//! - Each range carries `freed`: the region's sequence number of the latest
//!   free merged into it (0: never used). The arena unmaps a page only when
//!   the free that made it idle is known complete on the GPU, and a merged
//!   range takes the newest of its parts, so the check stays conservative.
//!
//! Both lookups are `BTreeMap`/`BTreeSet` searches: O(log n) in the number
//! of free ranges, no allocation on a take that splits or a free that
//! merges (beyond the trees' own nodes).

use std::collections::{BTreeMap, BTreeSet};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub len: u64,
    pub freed: u64,
}

#[derive(Default)]
pub(crate) struct FreeRanges {
    by_addr: BTreeMap<u64, Span>,
    by_size: BTreeSet<(u64, u64)>,
    total: u64,
}

impl FreeRanges {
    fn insert_raw(&mut self, addr: u64, span: Span) {
        self.by_addr.insert(addr, span);
        self.by_size.insert((span.len, addr));
        self.total += span.len;
    }

    fn remove_raw(&mut self, addr: u64) -> Span {
        let span = self.by_addr.remove(&addr).expect("a listed free range");
        self.by_size.remove(&(span.len, addr));
        self.total -= span.len;
        span
    }

    /// Add `[addr, addr + len)` (freed as free number `freed`), merged with
    /// the ranges it touches.
    pub fn insert(&mut self, addr: u64, len: u64, freed: u64) {
        debug_assert!(len > 0);
        let (mut start, mut end, mut seq) = (addr, addr + len, freed);
        if let Some((&prev, &span)) = self.by_addr.range(..addr).next_back() {
            debug_assert!(prev + span.len <= addr, "free range [{prev:#x}, +{}) overlaps {addr:#x}", span.len);
            if prev + span.len == addr {
                self.remove_raw(prev);
                start = prev;
                seq = seq.max(span.freed);
            }
        }
        if let Some(&next) = self.by_addr.get(&end) {
            self.remove_raw(end);
            end += next.len;
            seq = seq.max(next.freed);
        }
        debug_assert!(self.by_addr.range(addr..addr + len).next().is_none(), "free range at {addr:#x} freed twice");
        self.insert_raw(start, Span { len: end - start, freed: seq });
    }

    /// The smallest range of at least `len` bytes: its start is taken out
    /// and returned with the range's `freed`.
    pub fn take(&mut self, len: u64) -> Option<(u64, u64)> {
        let &(_, addr) = self.by_size.range((len, 0)..).next()?;
        let span = self.remove_raw(addr);
        if span.len > len {
            self.insert_raw(addr + len, Span { len: span.len - len, freed: span.freed });
        }
        Some((addr, span.freed))
    }

    /// Take `[addr, addr + len)`, which one free range covers whole, out of
    /// the free ranges (what is left of that range on either side stays
    /// free with its `freed`): that range's `freed`, or `None` (changing
    /// nothing) when no free range covers it.
    pub fn withdraw(&mut self, addr: u64, len: u64) -> Option<u64> {
        let (&start, &span) = self.by_addr.range(..=addr).next_back()?;
        if start + span.len < addr + len {
            return None;
        }
        self.remove_raw(start);
        if addr > start {
            self.insert_raw(start, Span { len: addr - start, freed: span.freed });
        }
        let end = addr + len;
        if start + span.len > end {
            self.insert_raw(end, Span { len: start + span.len - end, freed: span.freed });
        }
        Some(span.freed)
    }

    /// The `freed` of the free range that covers `[addr, addr + len)`
    /// whole, if one does.
    pub fn covering(&self, addr: u64, len: u64) -> Option<u64> {
        let (&start, span) = self.by_addr.range(..=addr).next_back()?;
        (start + span.len >= addr + len).then_some(span.freed)
    }

    /// The ranges of at least `len` bytes, smallest first: (start, length).
    pub fn fitting(&self, len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_size.range((len, 0)..).map(|&(size, addr)| (addr, size))
    }

    /// Every range, in address order: (start, span).
    pub fn iter(&self) -> impl Iterator<Item = (u64, Span)> + '_ {
        self.by_addr.iter().map(|(&a, &s)| (a, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_takes_the_smallest_fitting_range() {
        let mut r = FreeRanges::default();
        r.insert(0, 100, 0);
        r.insert(1000, 40, 0);
        r.insert(2000, 60, 0);
        assert_eq!(r.take(50), Some((2000, 0)), "60 is the smallest range of at least 50");
        assert_eq!(r.take(40), Some((1000, 0)));
        assert_eq!(r.take(101), None);
        assert_eq!(r.take(100), Some((0, 0)));
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(2050, Span { len: 10, freed: 0 })], "the rest of the 60-byte range");
    }

    #[test]
    fn withdraw_cuts_a_covered_piece_out_and_keeps_both_sides() {
        let mut r = FreeRanges::default();
        r.insert(0, 1000, 7);
        assert_eq!(r.withdraw(900, 200), None, "not covered whole: nothing changes");
        assert_eq!(r.withdraw(200, 100), Some(7));
        assert_eq!(
            r.iter().collect::<Vec<_>>(),
            vec![(0, Span { len: 200, freed: 7 }), (300, Span { len: 700, freed: 7 })]
        );
        assert_eq!(r.take(700), Some((300, 7)), "the size index follows the cut");
        assert_eq!(r.withdraw(0, 200), Some(7));
        assert_eq!(r.iter().count(), 0);
        r.insert(200, 100, 9);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(200, Span { len: 100, freed: 9 })]);
    }

    #[test]
    fn frees_coalesce_with_both_neighbours_and_keep_the_newest_sequence() {
        let mut r = FreeRanges::default();
        r.insert(0, 300, 0);
        let a = r.take(100).unwrap().0;
        let b = r.take(100).unwrap().0;
        let c = r.take(100).unwrap().0;
        assert_eq!((a, b, c), (0, 100, 200));
        assert_eq!(r.iter().count(), 0);
        r.insert(a, 100, 1);
        r.insert(c, 100, 3);
        assert_eq!(r.iter().count(), 2);
        r.insert(b, 100, 2);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(0, Span { len: 300, freed: 3 })], "the middle free joins both sides");
    }
}
