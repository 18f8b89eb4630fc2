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
//!   [`StreamCaches::take_other`] hands such a block out together with its
//!   stream so the pool can queue that wait.
//! - Sizes are rounded up to size classes ([`size_class`]): 512-byte steps
//!   up to 8 KiB, then sixteen classes per power of two, so rounding wastes
//!   at most 1/16 of a block. A request takes the smallest cached class that
//!   is at least its own and at most [`MAX_FIT_NUM`]/[`MAX_FIT_DEN`] of it.
//! - Within a class the most recently cached block is reused first (warm in
//!   L2, and it keeps the coldest blocks at the front for release).
//! - Releasing to the driver takes blocks out largest first, coldest first
//!   within a size ([`StreamCaches::take_largest`]), or the coldest of one
//!   stream ([`StreamCaches::take_coldest`]).
//!
//! Concurrency: streams are spread over a fixed set of shards, each behind
//! its own lock, so threads working on different streams rarely meet on a
//! lock; no lock here is held while calling a driver. Byte and block counts
//! and hit/miss counters live in the shards and are summed on demand.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::device::RawStream;
use crate::fast_hash::FastMap;

/// Granularity of the smallest classes.
pub(crate) const MIN_CLASS_STEP: u64 = 512;
/// Classes per power of two above 8 KiB.
const CLASSES_PER_OCTAVE: u64 = 16;
/// A cached class serves a request when class ≤ request class × 9/8.
pub(crate) const MAX_FIT_NUM: u64 = 9;
pub(crate) const MAX_FIT_DEN: u64 = 8;

const SHARDS: usize = 16;

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

#[derive(Default)]
struct StreamCache {
    /// Class bytes → blocks, coldest first. Emptied classes stay (a
    /// training loop empties and refills the same classes every step).
    classes: BTreeMap<u64, Vec<CachedBlock>>,
    bytes: u64,
    blocks: u64,
}

impl StreamCache {
    fn take_fit(&mut self, class: u64) -> Option<CachedBlock> {
        let (_, list) = self.classes.range_mut(class..=max_fit(class)).find(|(_, v)| !v.is_empty())?;
        let block = list.pop()?;
        self.bytes -= block.bytes;
        self.blocks -= 1;
        Some(block)
    }

    fn largest(&self) -> Option<CachedBlock> {
        self.classes.values().rev().find_map(|v| v.first().copied())
    }

    fn coldest(&self) -> Option<CachedBlock> {
        self.classes.values().filter_map(|v| v.first().copied()).min_by_key(|b| b.seq)
    }

    /// Remove `block` (found by `largest`/`coldest`: the first of its class).
    fn remove_front(&mut self, block: &CachedBlock) {
        if let Some(list) = self.classes.get_mut(&block.bytes) {
            if list.first() == Some(block) {
                list.remove(0);
                self.bytes -= block.bytes;
                self.blocks -= 1;
            }
        }
    }
}

#[derive(Default)]
struct Shard {
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

pub struct StreamCaches {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for StreamCaches {
    fn default() -> Self {
        StreamCaches { shards: (0..SHARDS).map(|_| Mutex::default()).collect() }
    }
}

fn shard_of(stream: RawStream) -> usize {
    // Stream handles are pointers (CUDA) or small indices (sim): mix the
    // bits so both spread over the shards.
    (stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 59) as usize % SHARDS
}

impl StreamCaches {
    fn lock(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `ptr` (of class `bytes`) for reuse on `stream`.
    pub fn put(&self, stream: RawStream, ptr: u64, bytes: u64) {
        let mut shard = self.lock(shard_of(stream));
        shard.seq += 1;
        let seq = shard.seq;
        shard.bytes += bytes;
        shard.blocks += 1;
        let cache = shard.streams.entry(stream).or_default();
        cache.classes.entry(bytes).or_default().push(CachedBlock { ptr, bytes, seq });
        cache.bytes += bytes;
        cache.blocks += 1;
    }

    /// A block of `stream`'s own cache that fits a request of class
    /// `class` (counted as a hit).
    pub fn take_own(&self, stream: RawStream, class: u64) -> Option<CachedBlock> {
        let mut shard = self.lock(shard_of(stream));
        let found = shard.streams.get_mut(&stream).and_then(|c| c.take_fit(class));
        if let Some(b) = found {
            shard.bytes -= b.bytes;
            shard.blocks -= 1;
            shard.hits += 1;
        }
        found
    }

    /// Count a request that no cache could serve.
    pub fn note_miss(&self, stream: RawStream) {
        self.lock(shard_of(stream)).misses += 1;
    }

    /// A fitting block cached on a stream other than `stream`, with the
    /// stream it belongs to (the caller orders `stream` after it). Counted
    /// as a hit.
    pub fn take_other(&self, stream: RawStream, class: u64) -> Option<(RawStream, CachedBlock)> {
        for i in 0..SHARDS {
            let mut shard = self.lock(i);
            if shard.blocks == 0 {
                continue;
            }
            let found = shard
                .streams
                .iter_mut()
                .filter(|(s, _)| **s != stream)
                .find_map(|(s, c)| c.take_fit(class).map(|b| (*s, b)));
            if let Some((owner, b)) = found {
                shard.bytes -= b.bytes;
                shard.blocks -= 1;
                shard.hits += 1;
                return Some((owner, b));
            }
        }
        None
    }

    /// Put back a block taken by `take_own`/`take_other` whose hand-out
    /// failed, and undo the hit it counted.
    pub fn put_back(&self, stream: RawStream, block: CachedBlock) {
        self.put(stream, block.ptr, block.bytes);
        let mut shard = self.lock(shard_of(stream));
        shard.hits = shard.hits.saturating_sub(1);
    }

    /// The largest cached block of any stream (coldest among equals), taken
    /// out of the cache.
    pub fn take_largest(&self) -> Option<(RawStream, CachedBlock)> {
        loop {
            let mut best: Option<(usize, RawStream, CachedBlock)> = None;
            for i in 0..SHARDS {
                let shard = self.lock(i);
                for (s, c) in shard.streams.iter() {
                    if let Some(b) = c.largest() {
                        let better = match &best {
                            None => true,
                            Some((_, _, cur)) => b.bytes > cur.bytes,
                        };
                        if better {
                            best = Some((i, *s, b));
                        }
                    }
                }
            }
            let (i, stream, block) = best?;
            // Another thread may have taken it meanwhile: look again then.
            let mut shard = self.lock(i);
            let Some(cache) = shard.streams.get_mut(&stream) else { continue };
            let before = cache.blocks;
            cache.remove_front(&block);
            if cache.blocks < before {
                shard.bytes -= block.bytes;
                shard.blocks -= 1;
                return Some((stream, block));
            }
        }
    }

    /// The coldest cached block of `stream`, taken out of the cache.
    pub fn take_coldest(&self, stream: RawStream) -> Option<CachedBlock> {
        let mut shard = self.lock(shard_of(stream));
        let cache = shard.streams.get_mut(&stream)?;
        let block = cache.coldest()?;
        cache.remove_front(&block);
        shard.bytes -= block.bytes;
        shard.blocks -= 1;
        Some(block)
    }

    /// Every block cached on `stream`, taken out (the stream is going away).
    pub fn take_stream(&self, stream: RawStream) -> Vec<CachedBlock> {
        let mut shard = self.lock(shard_of(stream));
        let Some(cache) = shard.streams.remove(&stream) else { return Vec::new() };
        shard.bytes -= cache.bytes;
        shard.blocks -= cache.blocks;
        cache.classes.into_values().flatten().collect()
    }

    /// Bytes cached on `stream`.
    pub fn stream_bytes(&self, stream: RawStream) -> u64 {
        let shard = self.lock(shard_of(stream));
        shard.streams.get(&stream).map_or(0, |c| c.bytes)
    }

    pub fn totals(&self) -> CacheTotals {
        let mut t = CacheTotals::default();
        for i in 0..SHARDS {
            let shard = self.lock(i);
            t.bytes += shard.bytes;
            t.blocks += shard.blocks;
            t.hits += shard.hits;
            t.misses += shard.misses;
        }
        t
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
    fn own_stream_fit_prefers_the_smallest_fitting_class_and_the_warmest_block() {
        let c = StreamCaches::default();
        c.put(7, 0x1000, 4096);
        c.put(7, 0x2000, 4096);
        c.put(7, 0x3000, 8192);
        assert_eq!(c.take_own(7, 4096).map(|b| b.ptr), Some(0x2000), "warmest of the class");
        assert_eq!(c.take_own(7, 4096).map(|b| b.ptr), Some(0x1000));
        assert_eq!(c.take_own(7, 4096), None, "8 KiB is more than 9/8 of 4 KiB");
        c.note_miss(7);
        assert_eq!(c.take_own(8, 8192), None, "another stream's block is not taken by take_own");
        let t = c.totals();
        assert_eq!((t.bytes, t.blocks, t.hits, t.misses), (8192, 1, 2, 1));
        assert_eq!(c.take_other(8, 8192).map(|(s, b)| (s, b.ptr)), Some((7, 0x3000)));
        assert_eq!(c.totals().bytes, 0);
    }

    #[test]
    fn release_order_is_largest_then_coldest() {
        let c = StreamCaches::default();
        c.put(1, 0xa, 1024);
        c.put(2, 0xb, 65536);
        c.put(3, 0xc, 65536);
        c.put(1, 0xd, 2048);
        let (s, b) = c.take_largest().unwrap();
        assert_eq!(b.bytes, 65536);
        assert!(s == 2 || s == 3);
        assert_eq!(c.take_largest().unwrap().1.bytes, 65536);
        assert_eq!(c.take_coldest(1).map(|b| b.ptr), Some(0xa));
        assert_eq!(c.take_stream(1).iter().map(|b| b.ptr).collect::<Vec<_>>(), vec![0xd]);
        assert_eq!(c.take_largest(), None);
        assert_eq!(c.totals(), CacheTotals { bytes: 0, blocks: 0, hits: 0, misses: 0 });
    }
}
