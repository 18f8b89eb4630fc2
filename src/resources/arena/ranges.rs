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
//! The address index is a `BTreeMap` keyed by each range's *end*: a take
//! carves a range's start, and a free usually merges into the range after
//! it, and both then change only the start, which is the entry's value
//! (updated in place, no node moved). The size index is `SizeIndex`
//! (`size_index.rs`): one sorted vector per length up to 1 MiB, longer
//! lengths in sorted vectors per eighth of an octave, each kind with a
//! bitmap of the vectors in use, so best fit and its updates touch no tree
//! node. Both are O(log n) in the number of free ranges of a length or
//! bucket (O(1) to find the fitting one), with no allocation on a take that
//! splits or a free that merges (beyond the vectors' and the tree's own
//! growth). `carve` takes a placement out of a range the caller found with
//! `fitting`, with no second search.

use std::collections::BTreeMap;

use super::size_index::SizeIndex;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub len: u64,
    pub freed: u64,
}

/// A free range in the address index: its start and `freed` (the key is
/// its end).
#[derive(Copy, Clone, Debug)]
struct Piece {
    start: u64,
    freed: u64,
}

#[derive(Default)]
pub(crate) struct FreeRanges {
    /// end -> the range ending there.
    by_end: BTreeMap<u64, Piece>,
    /// (length, start) of every range, for best fit.
    by_size: SizeIndex,
}

impl FreeRanges {
    /// The range that covers `[addr, addr + len)` whole: (start, end,
    /// freed).
    fn covering_range(&self, addr: u64, len: u64) -> Option<(u64, u64, u64)> {
        let (&end, piece) = self.by_end.range(addr + len..).next()?;
        (piece.start <= addr).then_some((piece.start, end, piece.freed))
    }

    /// Add `[addr, addr + len)` (freed as free number `freed`), merged with
    /// the ranges it touches.
    pub fn insert(&mut self, addr: u64, len: u64, freed: u64) {
        debug_assert!(len > 0);
        let end = addr + len;
        debug_assert!(
            self.by_end.range(addr + 1..).next().map_or(true, |(_, p)| p.start >= end),
            "free range at {addr:#x} (+{len}) overlaps a free range"
        );
        // The range ending where this one starts, taken out of the index.
        let before = self.by_end.remove(&addr);
        if let Some(p) = before {
            self.by_size.remove(addr - p.start, p.start);
        }
        let start = before.map_or(addr, |p| p.start);
        let seq = before.map_or(freed, |p| p.freed.max(freed));
        // The range starting where this one ends: extended down in place.
        if let Some((&next_end, next)) = self.by_end.range_mut(end + 1..).next() {
            if next.start == end {
                self.by_size.remove(next_end - end, end);
                next.start = start;
                next.freed = next.freed.max(seq);
                self.by_size.insert(next_end - start, start);
                return;
            }
        }
        self.by_end.insert(end, Piece { start, freed: seq });
        self.by_size.insert(end - start, start);
    }

    /// The smallest range of at least `len` bytes: its start is taken out
    /// and returned with the range's `freed`.
    pub fn take(&mut self, len: u64) -> Option<(u64, u64)> {
        let (start, size) = self.fitting(len).next()?;
        Some((start, self.carve(start, size, start, len)))
    }

    /// Take `[addr, addr + len)`, which one free range covers whole, out of
    /// the free ranges (what is left of that range on either side stays
    /// free with its `freed`): that range's `freed`, or `None` (changing
    /// nothing) when no free range covers it.
    pub fn withdraw(&mut self, addr: u64, len: u64) -> Option<u64> {
        let (start, end, _) = self.covering_range(addr, len)?;
        Some(self.carve(start, end - start, addr, len))
    }

    /// Take `[at, at + len)` out of the free range `[start, start + size)`,
    /// a range `fitting` listed, which covers it whole (what is left of it
    /// on either side stays free with its `freed`): that range's `freed`.
    pub fn carve(&mut self, start: u64, size: u64, at: u64, len: u64) -> u64 {
        let (end, cut) = (start + size, at + len);
        debug_assert!(start <= at && cut <= end, "[{at:#x}, +{len}) is not within [{start:#x}, +{size})");
        self.by_size.remove(size, start);
        let freed = if end > cut {
            let piece = self.by_end.get_mut(&end).expect("a listed free range");
            piece.start = cut;
            self.by_size.insert(end - cut, cut);
            piece.freed
        } else {
            self.by_end.remove(&end).expect("a listed free range").freed
        };
        if at > start {
            self.by_end.insert(at, Piece { start, freed });
            self.by_size.insert(at - start, start);
        }
        freed
    }

    /// The `freed` of the free range that covers `[addr, addr + len)`
    /// whole, if one does.
    pub fn covering(&self, addr: u64, len: u64) -> Option<u64> {
        self.covering_range(addr, len).map(|(_, _, freed)| freed)
    }

    /// The ranges of at least `len` bytes, smallest first: (start, length).
    pub fn fitting(&self, len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_size.fitting(len).map(|(size, addr)| (addr, size))
    }

    /// Every range, in address order: (start, span).
    pub fn iter(&self) -> impl Iterator<Item = (u64, Span)> + '_ {
        self.by_end.iter().map(|(&end, p)| (p.start, Span { len: end - p.start, freed: p.freed }))
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

    /// The model: one cell per unit, `Some(freed)` where free. Free cells
    /// form maximal runs; a run's `freed` is the newest of its frees.
    fn model_ranges(cells: &[Option<u64>]) -> Vec<(u64, Span)> {
        let mut out: Vec<(u64, Span)> = Vec::new();
        for (i, c) in cells.iter().enumerate() {
            if let Some(f) = *c {
                match out.last_mut() {
                    Some((start, span)) if *start + span.len == i as u64 => {
                        span.len += 1;
                        span.freed = span.freed.max(f);
                    }
                    _ => out.push((i as u64, Span { len: 1, freed: f })),
                }
            }
        }
        out
    }

    #[test]
    fn random_operations_match_a_cell_by_cell_model() {
        // Inserts, takes, withdraws and covering queries at random over
        // 512 units: after every call the ranges are the model's maximal
        // free runs (merged, with the newest `freed`), a take is the model's
        // best fit (the smallest fitting run, the lowest address among
        // equals), and withdraw / covering answer as the model does.
        let mut next = super::super::tests::below(0x2545_f491_4f6c_dd1d);
        const UNITS: usize = 512;
        let mut r = FreeRanges::default();
        let mut cells: Vec<Option<u64>> = vec![None; UNITS];
        let mut seq = 0;
        for call in 0..20_000 {
            let before = model_ranges(&cells);
            match next(4) {
                0 | 1 => {
                    // Free a run of used cells.
                    let at = next(UNITS as u64) as usize;
                    let len = (1 + next(24) as usize).min(UNITS - at);
                    if cells[at..at + len].iter().all(Option::is_none) {
                        seq += 1;
                        r.insert(at as u64, len as u64, seq);
                        cells[at..at + len].iter_mut().for_each(|c| *c = Some(seq));
                    }
                }
                2 => {
                    let len = 1 + next(40);
                    let want = before.iter().filter(|(_, s)| s.len >= len).min_by_key(|(a, s)| (s.len, *a)).copied();
                    let got = r.take(len);
                    assert_eq!(got, want.map(|(a, s)| (a, s.freed)), "call {call}: take({len})");
                    if let Some((a, freed)) = got {
                        // The rest of the range keeps the whole range's freed.
                        let span = want.unwrap().1;
                        cells[a as usize..(a + span.len) as usize].iter_mut().for_each(|c| *c = Some(freed));
                        cells[a as usize..(a + len) as usize].iter_mut().for_each(|c| *c = None);
                    }
                }
                _ => {
                    let at = next(UNITS as u64);
                    let len = (1 + next(16)).min(UNITS as u64 - at);
                    let want = before.iter().find(|(a, s)| *a <= at && a + s.len >= at + len).map(|(_, s)| s.freed);
                    assert_eq!(r.covering(at, len), want, "call {call}: covering({at}, {len})");
                    if next(2) == 0 {
                        assert_eq!(r.withdraw(at, len), want, "call {call}: withdraw({at}, {len})");
                        if want.is_some() {
                            // The pieces left keep the whole range's freed.
                            let (start, span) = *before.iter().find(|(a, s)| *a <= at && a + s.len >= at + len).unwrap();
                            cells[start as usize..(start + span.len) as usize].iter_mut().for_each(|c| *c = Some(span.freed));
                            cells[at as usize..(at + len) as usize].iter_mut().for_each(|c| *c = None);
                        }
                    }
                }
            }
            assert_eq!(r.iter().collect::<Vec<_>>(), model_ranges(&cells), "call {call}");
            let mut sizes: Vec<(u64, u64)> = r.fitting(1).collect();
            let mut want: Vec<(u64, u64)> = model_ranges(&cells).iter().map(|(a, s)| (*a, s.len)).collect();
            sizes.sort_unstable();
            want.sort_unstable();
            assert_eq!(sizes, want, "call {call}: the size index");
        }
    }
}
