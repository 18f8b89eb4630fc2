//! `SizeIndex`: the free ranges of a region ordered by (length, start), for
//! best fit.
//!
//! Contract:
//! - It answers as one ordered set of `(length, start)` pairs would:
//!   `first_fitting(len)` is the smallest pair whose length is at least
//!   `len` (the lowest start among equal lengths), and `fitting(len)` walks
//!   every such pair in that order.
//! - Lengths that are a multiple of `UNIT` up to `SMALL_CLASSES` units (a
//!   block's sizes up to 1 MiB: almost every free range a training step
//!   leaves) sit in one class per length: a sorted vector of starts, and a
//!   bit per class that says it is not empty. Finding the best fit is a
//!   scan of a few words; adding and removing are a binary search in one
//!   short vector, with no tree node allocated, moved or rebalanced (the
//!   tree this replaced spent about 250 instructions an operation, three
//!   or four operations an allocate+free pair).
//! - Every other length sits in an ordered set; a search compares the best
//!   of both.

use std::collections::BTreeSet;

/// The length unit of the classes (the arena's block alignment).
const UNIT: u64 = super::BLOCK_ALIGN;
/// Classes: lengths of 1..=SMALL_CLASSES units (index 0 is unused).
const SMALL_CLASSES: usize = 2048;
const WORDS: usize = (SMALL_CLASSES + 1).div_ceil(64);

pub(crate) struct SizeIndex {
    /// Starts of the ranges of each class, ascending.
    classes: Box<[Vec<u64>]>,
    /// Bit `c` set: class `c` is not empty.
    bits: [u64; WORDS],
    /// Bit `w` set: `bits[w]` is not zero.
    summary: u64,
    /// (length, start) of the ranges of other lengths.
    other: BTreeSet<(u64, u64)>,
    /// How many of `other` are no longer than the longest class (lengths
    /// off the unit; the arena makes none): while none, a fitting class
    /// is the answer without a look at `other`.
    other_short: usize,
}

impl Default for SizeIndex {
    fn default() -> SizeIndex {
        SizeIndex {
            classes: vec![Vec::new(); SMALL_CLASSES + 1].into_boxed_slice(),
            bits: [0; WORDS],
            summary: 0,
            other: BTreeSet::new(),
            other_short: 0,
        }
    }
}

/// Whether `len` is no longer than the longest class.
fn is_short(len: u64) -> bool {
    len <= SMALL_CLASSES as u64 * UNIT
}

/// The class of `len`, if it has one.
fn class_of(len: u64) -> Option<usize> {
    (len % UNIT == 0 && len / UNIT >= 1 && len / UNIT <= SMALL_CLASSES as u64).then_some((len / UNIT) as usize)
}

impl SizeIndex {
    pub fn insert(&mut self, len: u64, start: u64) {
        let Some(c) = class_of(len) else {
            if self.other.insert((len, start)) && is_short(len) {
                self.other_short += 1;
            }
            return;
        };
        let starts = &mut self.classes[c];
        let at = starts.partition_point(|&s| s < start);
        debug_assert!(starts.get(at) != Some(&start), "range at {start:#x} listed twice");
        starts.insert(at, start);
        self.bits[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
    }

    /// Remove the pair; whether it was there.
    pub fn remove(&mut self, len: u64, start: u64) -> bool {
        let Some(c) = class_of(len) else {
            let removed = self.other.remove(&(len, start));
            if removed && is_short(len) {
                self.other_short -= 1;
            }
            return removed;
        };
        let Ok(at) = self.classes[c].binary_search(&start) else { return false };
        self.remove_at(c, at);
        true
    }

    /// Remove the `at`-th start of class `c`.
    fn remove_at(&mut self, c: usize, at: usize) {
        let starts = &mut self.classes[c];
        starts.remove(at);
        if starts.is_empty() {
            self.bits[c / 64] &= !(1 << (c % 64));
            if self.bits[c / 64] == 0 {
                self.summary &= !(1 << (c / 64));
            }
        }
    }

    /// `first_fitting`, taken out of the index.
    pub fn take_first_fitting(&mut self, len: u64) -> Option<(u64, u64)> {
        let (size, start) = self.first_fitting(len)?;
        match class_of(size) {
            // A class's first start is the lowest.
            Some(c) => self.remove_at(c, 0),
            None => {
                self.remove(size, start);
            }
        }
        Some((size, start))
    }

    /// The first non-empty class at or after `c`.
    fn next_class(&self, c: usize) -> Option<usize> {
        if c > SMALL_CLASSES {
            return None;
        }
        let w = c / 64;
        let here = self.bits[w] & (!0u64 << (c % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let later = if w + 1 >= 64 { 0 } else { self.summary & (!0u64 << (w + 1)) };
        (later != 0).then(|| {
            let w = later.trailing_zeros() as usize;
            w * 64 + self.bits[w].trailing_zeros() as usize
        })
    }

    /// The smallest class that holds ranges of at least `len` bytes.
    fn first_class_for(len: u64) -> usize {
        (len.div_ceil(UNIT).max(1)).min(SMALL_CLASSES as u64 + 1) as usize
    }

    /// The smallest (length, start) with a length of at least `len`.
    pub fn first_fitting(&self, len: u64) -> Option<(u64, u64)> {
        let small = self.next_class(Self::first_class_for(len)).map(|c| (c as u64 * UNIT, self.classes[c][0]));
        if small.is_some() && self.other_short == 0 {
            // Every other length is longer than any class.
            return small;
        }
        let other = self.other.range((len, 0)..).next().copied();
        match (small, other) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Every (length, start) with a length of at least `len`, in order.
    pub fn fitting(&self, len: u64) -> Fitting<'_> {
        Fitting { index: self, class: self.next_class(Self::first_class_for(len)), at: 0, other: self.other.range((len, 0)..).peekable() }
    }
}

/// `SizeIndex::fitting`: the classes and the other lengths merged in
/// order.
pub(crate) struct Fitting<'a> {
    index: &'a SizeIndex,
    /// The class being walked, and the position in it.
    class: Option<usize>,
    at: usize,
    other: std::iter::Peekable<std::collections::btree_set::Range<'a, (u64, u64)>>,
}

impl Iterator for Fitting<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        let small = self.class.map(|c| (c as u64 * UNIT, self.index.classes[c][self.at]));
        let other = self.other.peek().map(|&&p| p);
        match (small, other) {
            (Some(a), Some(b)) if b < a => self.other.next().copied(),
            (Some(a), _) => {
                let c = self.class.expect("a class is being walked");
                self.at += 1;
                if self.at == self.index.classes[c].len() {
                    self.class = self.index.next_class(c + 1);
                    self.at = 0;
                }
                Some(a)
            }
            (None, _) => self.other.next().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_as_one_ordered_set_would() {
        // Class lengths, lengths past the classes and lengths off the
        // unit, added and removed at random: every answer equals a plain
        // ordered set's.
        let mut next = super::super::tests::below(0x1234_5678_9abc_def1);
        let mut index = SizeIndex::default();
        let mut model: BTreeSet<(u64, u64)> = BTreeSet::new();
        for call in 0..20_000 {
            let len = match next(4) {
                0 => (1 + next(8)) * UNIT,
                1 => (1 + next(SMALL_CLASSES as u64 + 40)) * UNIT,
                2 => 1 + next(4 * UNIT),
                _ => (SMALL_CLASSES as u64 - 3 + next(8)) * UNIT,
            };
            let start = next(64) * (1 << 20);
            if next(3) > 0 {
                if model.insert((len, start)) {
                    index.insert(len, start);
                }
            } else {
                let listed = model.iter().nth(next(model.len() as u64 + 1) as usize).copied();
                let (l, s) = listed.unwrap_or((len, start));
                assert_eq!(index.remove(l, s), model.remove(&(l, s)), "call {call}: remove ({l}, {s:#x})");
            }
            let want = next(SMALL_CLASSES as u64 * UNIT + 64 * UNIT);
            let best = model.range((want, 0)..).next().copied();
            assert_eq!(index.first_fitting(want), best, "call {call}: first_fitting({want})");
            if next(8) == 0 {
                assert_eq!(index.take_first_fitting(want), best, "call {call}: take_first_fitting({want})");
                if let Some(pair) = best {
                    model.remove(&pair);
                }
            }
            if call % 97 == 0 {
                assert!(index.fitting(want).eq(model.range((want, 0)..).copied()), "call {call}: fitting({want})");
                assert!(index.fitting(0).eq(model.iter().copied()), "call {call}: every pair");
            }
        }
    }
}
