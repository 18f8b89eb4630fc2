//! `SizeIndex`: the free ranges of a region ordered by (length, start), for
//! best fit.
//!
//! Contract:
//! - It answers as one ordered set of `(length, start)` pairs would:
//!   `fitting(len)` walks every pair whose length is at least `len` in
//!   that order, so its first is the best fit (the lowest start among
//!   equal lengths).
//! - Lengths that are a multiple of `UNIT` up to `SMALL_CLASSES` units (a
//!   block's sizes up to 1 MiB: almost every free range a training step
//!   leaves) sit in one class per length: a sorted vector of starts, and a
//!   bit per class that says it is not empty. Finding the best fit is a
//!   scan of a few words; adding and removing are a binary search in one
//!   short vector, with no tree node allocated, moved or rebalanced (the
//!   tree this replaced spent about 250 instructions an operation, three
//!   or four operations an allocate+free pair).
//! - Every other length (longer ranges: the free space past the blocks,
//!   the holes large blocks leave) sits in `Long`: buckets of lengths
//!   between two powers of two cut in `LONG_STEPS`, each a sorted vector of
//!   (length, start), with a bit per non-empty bucket. A search reads the
//!   bits, one bucket's header and a binary search in its (short) vector:
//!   a few cache lines, where the ordered set this replaced walked three or
//!   four tree nodes of two or three lines each, for every search, removal
//!   and insertion (in a training step the allocator's data is out of the
//!   caches at each call: BENCHMARKS.md, "fourteenth pass"). A search
//!   compares the best of both kinds; while no other length is as short
//!   as a class (the arena makes none), a fitting class is the answer and
//!   `Long` is not read.

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
    other: Long,
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
            other: Long::default(),
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
            if self.other.insert(len, start) && is_short(len) {
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
            let removed = self.other.remove(len, start);
            if removed && is_short(len) {
                self.other_short -= 1;
            }
            return removed;
        };
        let starts = &mut self.classes[c];
        let Ok(at) = starts.binary_search(&start) else { return false };
        starts.remove(at);
        if starts.is_empty() {
            self.bits[c / 64] &= !(1 << (c % 64));
            if self.bits[c / 64] == 0 {
                self.summary &= !(1 << (c / 64));
            }
        }
        true
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

    /// Every (length, start) with a length of at least `len`, in order.
    pub fn fitting(&self, len: u64) -> Fitting<'_> {
        Fitting { index: self, class: self.next_class(Self::first_class_for(len)), at: 0, len, other: None }
    }
}

/// `SizeIndex::fitting`: the classes and the other lengths merged in
/// order.
pub(crate) struct Fitting<'a> {
    index: &'a SizeIndex,
    /// The class being walked, and the position in it.
    class: Option<usize>,
    at: usize,
    /// The length asked for, and the walk of `Long` from it: found only
    /// once needed (a class answers first while `other_short` is 0).
    len: u64,
    other: Option<LongCursor>,
}

impl Fitting<'_> {
    /// The next pair of `Long` in the walk, not taken.
    fn other_peek(&mut self) -> Option<(u64, u64)> {
        let (long, len) = (&self.index.other, self.len);
        let cursor = self.other.get_or_insert_with(|| long.cursor_from(len));
        long.at(cursor)
    }

    /// Past the pair `other_peek` gave.
    fn advance_other(&mut self) {
        if let Some(cursor) = &mut self.other {
            self.index.other.advance(cursor);
        }
    }
}

impl Iterator for Fitting<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        let small = self.class.map(|c| (c as u64 * UNIT, self.index.classes[c][self.at]));
        // While no other length is as short as a class, every class comes
        // before `Long`.
        let other = if small.is_some() && self.index.other_short == 0 { None } else { self.other_peek() };
        match (small, other) {
            (Some(a), Some(b)) if b < a => {
                self.advance_other();
                Some(b)
            }
            (Some(a), _) => {
                let c = self.class.expect("a class is being walked");
                self.at += 1;
                if self.at == self.index.classes[c].len() {
                    self.class = self.index.next_class(c + 1);
                    self.at = 0;
                }
                Some(a)
            }
            (None, b) => {
                self.advance_other();
                b
            }
        }
    }
}

/// Buckets of `Long` in each octave of lengths.
const LONG_STEPS: usize = 8;
const LONG_BUCKETS: usize = 64 * LONG_STEPS;
const LONG_WORDS: usize = LONG_BUCKETS / 64;

/// An ordered set of (length, start) pairs, bucketed by length: bucket
/// `b` holds the lengths of one eighth of an octave (`bucket_of`, which
/// grows with the length), its pairs sorted.
pub(crate) struct Long {
    buckets: Box<[Vec<(u64, u64)>]>,
    bits: [u64; LONG_WORDS],
}

impl Default for Long {
    fn default() -> Long {
        Long { buckets: vec![Vec::new(); LONG_BUCKETS].into_boxed_slice(), bits: [0; LONG_WORDS] }
    }
}

/// A position in `Long`'s walk: a bucket and an index in it.
pub(crate) struct LongCursor {
    bucket: Option<usize>,
    at: usize,
}

/// The bucket of `len`: its octave (the top bit) and the next three bits.
fn bucket_of(len: u64) -> usize {
    if len < LONG_STEPS as u64 {
        return len as usize;
    }
    let top = 63 - len.leading_zeros() as usize;
    let steps = LONG_STEPS.trailing_zeros() as usize;
    let sub = ((len >> (top - steps)) as usize) & (LONG_STEPS - 1);
    top * LONG_STEPS + sub
}

impl Long {
    /// Add the pair; whether it was not there already.
    fn insert(&mut self, len: u64, start: u64) -> bool {
        let b = bucket_of(len);
        let pairs = &mut self.buckets[b];
        let Err(at) = pairs.binary_search(&(len, start)) else { return false };
        pairs.insert(at, (len, start));
        self.bits[b / 64] |= 1 << (b % 64);
        true
    }

    /// Remove the pair; whether it was there.
    fn remove(&mut self, len: u64, start: u64) -> bool {
        let b = bucket_of(len);
        let pairs = &mut self.buckets[b];
        let Ok(at) = pairs.binary_search(&(len, start)) else { return false };
        pairs.remove(at);
        if pairs.is_empty() {
            self.bits[b / 64] &= !(1 << (b % 64));
        }
        true
    }

    /// The first non-empty bucket at or after `b`.
    fn next_bucket(&self, b: usize) -> Option<usize> {
        let mut w = b / 64;
        let mut word = self.bits.get(w)? & (!0u64 << (b % 64));
        loop {
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
            w += 1;
            word = *self.bits.get(w)?;
        }
    }

    /// Where the walk of pairs of a length of at least `len` begins.
    fn cursor_from(&self, len: u64) -> LongCursor {
        let b = bucket_of(len);
        let at = self.buckets[b].partition_point(|&(l, _)| l < len);
        if at < self.buckets[b].len() {
            return LongCursor { bucket: Some(b), at };
        }
        LongCursor { bucket: self.next_bucket(b + 1), at: 0 }
    }

    fn at(&self, cursor: &LongCursor) -> Option<(u64, u64)> {
        cursor.bucket.map(|b| self.buckets[b][cursor.at])
    }

    fn advance(&self, cursor: &mut LongCursor) {
        let Some(b) = cursor.bucket else { return };
        cursor.at += 1;
        if cursor.at == self.buckets[b].len() {
            *cursor = LongCursor { bucket: self.next_bucket(b + 1), at: 0 };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn long_buckets_grow_with_the_length() {
        let mut last = 0;
        for len in (1..5000u64).chain((1..4000).map(|i| i * 977 + (1 << 20))).chain([u64::MAX / 3, u64::MAX]) {
            let b = bucket_of(len);
            assert!(b >= last && b < LONG_BUCKETS, "bucket_of({len}) = {b} after {last}");
            last = b;
        }
        assert_eq!(bucket_of(1 << 20), bucket_of((1 << 20) + (1 << 16) / 2), "one eighth of an octave a bucket");
        assert_ne!(bucket_of(1 << 20), bucket_of((1 << 20) + (1 << 17)));
    }

    #[test]
    fn answers_as_one_ordered_set_would() {
        // Class lengths, lengths past the classes (up to 2^45) and lengths
        // off the unit (these in the first half only, so that the second
        // half runs while none is as short as a class), added and removed
        // at random: every answer equals a plain ordered set's.
        let mut next = super::super::tests::below(0x1234_5678_9abc_def1);
        let mut index = SizeIndex::default();
        let mut model: BTreeSet<(u64, u64)> = BTreeSet::new();
        for call in 0..20_000 {
            let len = match next(6) {
                0 => (1 + next(8)) * UNIT,
                1 => (1 + next(SMALL_CLASSES as u64 + 40)) * UNIT,
                2 if call < 10_000 => 1 + next(4 * UNIT),
                3 => (1 + next(1 << 28)) * UNIT,
                4 => 1 + next(1 << 45),
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
            let want = match next(3) {
                0 => next(1 << 44),
                _ => next(SMALL_CLASSES as u64 * UNIT + 64 * UNIT),
            };
            let best = model.range((want, 0)..).next().copied();
            assert_eq!(index.fitting(want).next(), best, "call {call}: the best fit for {want}");
            if next(8) == 0 {
                if let Some((l, s)) = best {
                    assert!(index.remove(l, s), "call {call}: the best fit for {want} is listed");
                    model.remove(&(l, s));
                }
            }
            if call % 97 == 0 {
                assert!(index.fitting(want).eq(model.range((want, 0)..).copied()), "call {call}: fitting({want})");
                assert!(index.fitting(0).eq(model.iter().copied()), "call {call}: every pair");
            }
        }
    }
}
