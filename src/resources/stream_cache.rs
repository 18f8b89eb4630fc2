//! `StreamCaches`: freed device memory kept per stream for reuse, without a
//! driver call.
//!
//! Contract (DESIGN.md, "Stream-ordered caching"):
//!
//! - A cached block belongs to one stream S: the stream it was allocated
//!   and freed on. Everything that used it on other streams was made to
//!   happen before S's free point (the pool queued those waits at the
//!   free), so any later work on S may reuse the memory with no wait at
//!   all: stream order is the only fence needed. Work on another stream T
//!   must first wait (on the GPU) for an event recorded on S after the free;
//!   [`CacheShard::take_any`] hands a block out together with its stream so
//!   the pool can queue that wait.
//! - Sizes are rounded up to size classes ([`size_class`]): 512-byte steps
//!   up to 8 KiB, then sixteen classes per power of two, so rounding wastes
//!   at most 1/16 of a block. A request takes the smallest cached class that
//!   is at least its own and at most [`MAX_FIT_NUM`]/[`MAX_FIT_DEN`] of it.
//! - Within a class the most recently cached block is reused first (warm in
//!   L2, and it keeps the coldest blocks at the front for release).
//! - Releasing to the driver takes blocks out largest first, coldest first
//!   within a size ([`CacheShard::largest`]), or the coldest of one stream
//!   ([`CacheShard::take_coldest`]).
//!
//! Concurrency: a [`CacheShard`] holds the caches of the streams that map
//! to one shard of the pool's block table and lives under that shard's
//! lock, so threads working on different streams rarely meet on a lock and
//! an allocation takes one lock for its cache and its block record. Byte
//! and block counts and hit/miss counters are per shard, summed on demand.

use crate::device::RawStream;
use crate::fast_hash::FastMap;

/// Granularity of the smallest classes.
pub(crate) const MIN_CLASS_STEP: u64 = 512;
/// Classes per power of two above 8 KiB.
const CLASSES_PER_OCTAVE: u64 = 16;
/// A cached class serves a request when class ≤ request class × 9/8.
pub(crate) const MAX_FIT_NUM: u64 = 9;
pub(crate) const MAX_FIT_DEN: u64 = 8;

/// The bytes a request of `bytes` is rounded up to (0 stays 0; `None` when
/// the rounding would overflow).
pub fn size_class(bytes: u64) -> Option<u64> {
    if bytes == 0 {
        return Some(0);
    }
    let octave_floor = 1u64 << (63 - bytes.leading_zeros());
    let step = (octave_floor / CLASSES_PER_OCTAVE).max(MIN_CLASS_STEP);
    bytes.checked_add(step - 1).map(|b| b / step * step)
}

/// Largest class a request of class `class` may be served from.
fn max_fit(class: u64) -> u64 {
    class.saturating_mul(MAX_FIT_NUM) / MAX_FIT_DEN
}

/// One cached block: its device address and class bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CachedBlock {
    pub ptr: u64,
    pub bytes: u64,
    /// Insertion order within its shard: smaller is colder.
    seq: u64,
}

/// Number of size classes (indices of [`class_index`]).
const CLASS_COUNT: usize = 16 + 51 * CLASSES_PER_OCTAVE as usize;
const BITMAP_WORDS: usize = CLASS_COUNT.div_ceil(64);

/// Dense index of a class (a non-zero value of [`size_class`]): the 512 B
/// steps up to 8 KiB first, then sixteen per power of two.
fn class_index(class: u64) -> usize {
    if class <= 8192 {
        return (class / MIN_CLASS_STEP - 1) as usize;
    }
    let e = 63 - class.leading_zeros() as u64;
    let m = (class - (1 << e)) >> (e - 4);
    (16 + (e - 13) * CLASSES_PER_OCTAVE + m) as usize
}

/// The class of an index (inverse of [`class_index`]).
fn index_class(i: usize) -> u64 {
    let i = i as u64;
    if i < 16 {
        return (i + 1) * MIN_CLASS_STEP;
    }
    let e = 13 + (i - 16) / CLASSES_PER_OCTAVE;
    (1 << e) + (((i - 16) % CLASSES_PER_OCTAVE) << (e - 4))
}

#[derive(Default)]
struct StreamCache {
    /// Blocks by class index, coldest first. Emptied classes keep their
    /// storage (a training loop empties and refills the same classes
    /// every step); `occupied` marks the non-empty ones.
    lists: Vec<Vec<CachedBlock>>,
    occupied: [u64; BITMAP_WORDS],
    bytes: u64,
    blocks: u64,
}

impl StreamCache {
    fn is_set(&self, i: usize) -> bool {
        self.occupied[i / 64] & (1 << (i % 64)) != 0
    }

    fn mark(&mut self, i: usize) {
        let (w, bit) = (i / 64, 1u64 << (i % 64));
        if self.lists[i].is_empty() {
            self.occupied[w] &= !bit;
        } else {
            self.occupied[w] |= bit;
        }
    }

    fn push(&mut self, block: CachedBlock) {
        let i = class_index(block.bytes);
        if self.lists.len() <= i {
            self.lists.resize_with(i + 1, Vec::new);
        }
        self.lists[i].push(block);
        self.mark(i);
        self.bytes += block.bytes;
        self.blocks += 1;
    }

    fn take_fit(&mut self, class: u64) -> Option<CachedBlock> {
        let first = class_index(class);
        let limit = max_fit(class);
        // Classes are at least 1/16 apart: 9/8 of a class spans at most
        // the next three indices (one of which may be the unused 16).
        let last = (first + 3).min(self.lists.len().saturating_sub(1));
        let i = (first..=last).find(|&i| self.is_set(i) && index_class(i) <= limit)?;
        let block = self.lists[i].pop()?;
        self.mark(i);
        self.bytes -= block.bytes;
        self.blocks -= 1;
        Some(block)
    }

    /// Indices of the non-empty classes, largest first.
    fn occupied_desc(&self) -> impl Iterator<Item = usize> + '_ {
        (0..BITMAP_WORDS).rev().flat_map(move |w| {
            let mut word = self.occupied[w];
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let bit = 63 - word.leading_zeros() as usize;
                    word &= !(1u64 << bit);
                    w * 64 + bit
                })
            })
        })
    }

    fn largest(&self) -> Option<CachedBlock> {
        self.occupied_desc().next().and_then(|i| self.lists[i].first().copied())
    }

    fn coldest(&self) -> Option<CachedBlock> {
        self.occupied_desc().filter_map(|i| self.lists[i].first().copied()).min_by_key(|b| b.seq)
    }

    /// The coldest block of the smallest class that is at least `class`.
    fn smallest_at_least(&self, class: u64) -> Option<CachedBlock> {
        let first = class_index(class);
        (first..self.lists.len()).find(|&i| self.is_set(i)).and_then(|i| self.lists[i].first().copied())
    }

    /// Remove `block` (found by `largest`/`coldest`: the first of its class).
    fn remove_front(&mut self, block: &CachedBlock) {
        let i = class_index(block.bytes);
        if self.lists.get(i).and_then(|l| l.first()) == Some(block) {
            self.lists[i].remove(0);
            self.mark(i);
            self.bytes -= block.bytes;
            self.blocks -= 1;
        }
    }

    fn drain(self) -> impl Iterator<Item = CachedBlock> {
        self.lists.into_iter().flatten()
    }
}

/// The cached blocks of the streams that map to one shard of the pool's
/// table, kept under that shard's lock (the pool shards by stream, so an
/// allocation or free takes one lock for its block record and its cache).
#[derive(Default)]
pub struct CacheShard {
    streams: FastMap<RawStream, StreamCache>,
    seq: u64,
    bytes: u64,
    blocks: u64,
    hits: u64,
    misses: u64,
}

/// Totals over every stream.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheTotals {
    pub bytes: u64,
    pub blocks: u64,
    pub hits: u64,
    pub misses: u64,
}

impl CacheTotals {
    pub fn add(&mut self, other: &CacheTotals) {
        self.bytes += other.bytes;
        self.blocks += other.blocks;
        self.hits += other.hits;
        self.misses += other.misses;
    }
}

impl CacheShard {
    /// Keep `ptr` (of class `bytes`) for reuse on `stream`.
    pub fn put(&mut self, stream: RawStream, ptr: u64, bytes: u64) {
        self.seq += 1;
        let seq = self.seq;
        self.bytes += bytes;
        self.blocks += 1;
        self.streams.entry(stream).or_default().push(CachedBlock { ptr, bytes, seq });
    }

    fn took(&mut self, b: &CachedBlock) {
        self.bytes -= b.bytes;
        self.blocks -= 1;
    }

    /// A block of `stream`'s own cache that fits a request of class
    /// `class` (counted as a hit).
    pub fn take_own(&mut self, stream: RawStream, class: u64) -> Option<CachedBlock> {
        let found = self.streams.get_mut(&stream).and_then(|c| c.take_fit(class))?;
        self.took(&found);
        self.hits += 1;
        Some(found)
    }

    /// A fitting block of any stream here, preferring `stream`'s own, with
    /// the stream it belongs to (counted as a hit).
    pub fn take_any(&mut self, stream: RawStream, class: u64) -> Option<(RawStream, CachedBlock)> {
        if self.blocks == 0 {
            return None;
        }
        let found = match self.streams.get_mut(&stream).and_then(|c| c.take_fit(class)) {
            Some(b) => (stream, b),
            None => self.streams.iter_mut().find_map(|(s, c)| c.take_fit(class).map(|b| (*s, b)))?,
        };
        self.took(&found.1);
        self.hits += 1;
        Some(found)
    }

    /// Put back a block taken by `take_own`/`take_any` whose hand-out
    /// failed, and undo the hit it counted.
    pub fn put_back(&mut self, stream: RawStream, block: CachedBlock) {
        self.put(stream, block.ptr, block.bytes);
        self.hits = self.hits.saturating_sub(1);
    }

    /// Count a request served outside `take_own`/`take_any`: a hit (the
    /// arena placed it in memory already mapped), else a miss (no cache
    /// could serve it).
    pub fn note(&mut self, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }

    /// The largest block here (coldest among equals), not taken.
    pub fn largest(&self) -> Option<(RawStream, CachedBlock)> {
        let mut best: Option<(RawStream, CachedBlock)> = None;
        for (s, c) in &self.streams {
            if let Some(b) = c.largest() {
                if best.as_ref().map_or(true, |(_, cur)| b.bytes > cur.bytes || (b.bytes == cur.bytes && b.seq < cur.seq)) {
                    best = Some((*s, b));
                }
            }
        }
        best
    }

    /// Take out a block found by `largest` or `coldest`; false if it is no
    /// longer there.
    pub fn remove(&mut self, stream: RawStream, block: &CachedBlock) -> bool {
        let Some(cache) = self.streams.get_mut(&stream) else { return false };
        let before = cache.blocks;
        cache.remove_front(block);
        if cache.blocks < before {
            self.took(block);
            return true;
        }
        false
    }

    /// The coldest block cached on `stream` here, taken out.
    pub fn take_coldest(&mut self, stream: RawStream) -> Option<CachedBlock> {
        let block = self.streams.get(&stream)?.coldest()?;
        self.remove(stream, &block).then_some(block)
    }

    /// The coldest block cached on `stream` here if it has sat there for
    /// more than `min_age` frees into this shard, taken out.
    pub fn take_stale(&mut self, stream: RawStream, min_age: u64) -> Option<CachedBlock> {
        let block = self.streams.get(&stream)?.coldest()?;
        if self.seq.saturating_sub(block.seq) <= min_age {
            return None;
        }
        self.remove(stream, &block).then_some(block)
    }

    /// The coldest block cached on `stream` here of the smallest class that
    /// is at least `class`, taken out: given back to the driver, it holds a
    /// request of `class` on that stream by itself.
    pub fn take_room_for(&mut self, stream: RawStream, class: u64) -> Option<CachedBlock> {
        let block = self.streams.get(&stream)?.smallest_at_least(class)?;
        self.remove(stream, &block).then_some(block)
    }

    /// Every block cached on `stream` here, taken out (the stream is going
    /// away).
    pub fn take_stream(&mut self, stream: RawStream) -> Vec<CachedBlock> {
        let Some(cache) = self.streams.remove(&stream) else { return Vec::new() };
        self.bytes -= cache.bytes;
        self.blocks -= cache.blocks;
        cache.drain().collect()
    }

    pub fn totals(&self) -> CacheTotals {
        CacheTotals { bytes: self.bytes, blocks: self.blocks, hits: self.hits, misses: self.misses }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_a_sixteenth_above_8_kib() {
        assert_eq!(size_class(0), Some(0));
        assert_eq!(size_class(1), Some(512));
        assert_eq!(size_class(512), Some(512));
        assert_eq!(size_class(513), Some(1024));
        assert_eq!(size_class(8192), Some(8192));
        assert_eq!(size_class(8193), Some(8192 + 512));
        assert_eq!(size_class(1 << 20), Some(1 << 20));
        assert_eq!(size_class((1 << 20) + 1), Some((1 << 20) + (1 << 16)));
        assert_eq!(size_class(u64::MAX), None);
        for bytes in [1u64, 700, 5000, 9000, 65_537, 1 << 24, 3 << 29, (1 << 40) + 12345] {
            let c = size_class(bytes).unwrap();
            assert!(c >= bytes && c % MIN_CLASS_STEP == 0);
            assert!((c - bytes) * 16 <= c.max(8192 * 16), "{bytes} -> {c}");
            assert_eq!(size_class(c), Some(c), "a class is its own class");
        }
    }

    #[test]
    fn class_indices_are_dense_and_invertible() {
        let mut seen = std::collections::HashSet::new();
        let mut bytes = 1u64;
        while bytes < (1u64 << 62) {
            let c = size_class(bytes).unwrap();
            let i = class_index(c);
            assert!(i < CLASS_COUNT, "{c} -> {i}");
            assert_eq!(index_class(i), c, "{bytes} -> class {c} -> index {i}");
            seen.insert(i);
            bytes = c + 1;
        }
        assert!(!seen.contains(&16), "index 16 is the unused alias of 8 KiB");
        let top = (1u64 << 63) + 15 * (1u64 << 59);
        assert_eq!(size_class(top), Some(top), "the largest class");
        assert_eq!(class_index(top), CLASS_COUNT - 1);
    }

    #[test]
    fn own_stream_fit_prefers_the_smallest_fitting_class_and_the_warmest_block() {
        let mut c = CacheShard::default();
        c.put(7, 0x1000, 4096);
        c.put(7, 0x2000, 4096);
        c.put(7, 0x3000, 8192);
        assert_eq!(c.take_own(7, 4096).map(|b| b.ptr), Some(0x2000), "warmest of the class");
        assert_eq!(c.take_own(7, 4096).map(|b| b.ptr), Some(0x1000));
        assert_eq!(c.take_own(7, 4096), None, "8 KiB is more than 9/8 of 4 KiB");
        c.note(false);
        assert_eq!(c.take_own(8, 8192), None, "another stream's block is not taken by take_own");
        let t = c.totals();
        assert_eq!((t.bytes, t.blocks, t.hits, t.misses), (8192, 1, 2, 1));
        assert_eq!(c.take_any(8, 8192).map(|(s, b)| (s, b.ptr)), Some((7, 0x3000)));
        assert_eq!(c.totals().bytes, 0);
    }

    #[test]
    fn release_order_is_largest_then_coldest() {
        let mut c = CacheShard::default();
        c.put(1, 0xa, 1024);
        c.put(2, 0xb, 65536);
        c.put(3, 0xc, 65536);
        c.put(1, 0xd, 2048);
        let (s, b) = c.largest().unwrap();
        assert_eq!((s, b.ptr), (2, 0xb), "the coldest of the largest");
        assert!(c.remove(s, &b));
        assert!(!c.remove(s, &b), "already gone");
        assert_eq!(c.largest().unwrap().1.ptr, 0xc);
        assert_eq!(c.take_coldest(1).map(|b| b.ptr), Some(0xa));
        assert_eq!(c.take_stream(1).iter().map(|b| b.ptr).collect::<Vec<_>>(), vec![0xd]);
        assert_eq!(c.take_stream(3).len(), 1);
        assert_eq!(c.largest(), None);
        assert_eq!(c.totals(), CacheTotals { bytes: 0, blocks: 0, hits: 0, misses: 0 });
    }
}
