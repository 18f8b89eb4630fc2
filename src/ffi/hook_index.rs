//! The framework hooks' pointer → block index: frameworks free by pointer
//! (PyTorch's free passes a pointer and a stream, CuPy's a pointer alone),
//! so the hooks look the block handle up by its address.
//!
//! Contract:
//! - `insert(block)`: `block.id.ptr` is non-zero and 256-byte aligned (every
//!   block the runtime hands out is) and not in the index already (the
//!   allocator never hands out an address that is still live). Never fails.
//! - `take(ptr)`: removes and returns the block at `ptr`, or `None` when
//!   the index does not hold `ptr` (never inserted, taken already), in
//!   which case nothing changed. Of two threads taking the same pointer at
//!   once, exactly one gets the block.
//! - `add_use(ptr, stream)`: adds `stream` to the block's `used_on` (unless
//!   it is the allocation stream or there already); `false`, changing
//!   nothing, when the index does not hold `ptr`. A `take` of the same
//!   block sees the use or runs before it.
//! - `contains(ptr)`, `len()`: exact while no other thread changes the
//!   index, a snapshot otherwise.
//! - Every method may be called from any number of threads at once.
//!
//! Why not a `Mutex<HashMap>`: the hooks' allocate+free pair is measured
//! against `xlog_allocate` + `xlog_deallocate` (benchmark W10: at most
//! 1.2 times), and a lock, unlock and hash-table update on each side was
//! most of the difference. Here an insert is one compare-and-swap on a
//! slot plus plain stores, a take one compare-and-swap plus loads and a
//! store, and threads that work on different blocks touch different cache
//! lines.
//!
//! How: open addressing without tombstones. A pointer's home slot comes
//! from a multiplicative hash of its address; it lives in one of the
//! `WINDOW` slots from there, so every lookup reads at most `WINDOW` slots
//! and a removed slot simply becomes empty again (no probe chain runs
//! through it). Entries never move while in the index. Each slot's key word
//! holds the pointer and two flag bits (the low bits are free: pointers are
//! 256-byte aligned): `LOCKED` while one thread owns the slot (filling it,
//! taking it or adding a use), `HAS_USES` when the block has entries in the
//! `uses` side table (record_stream is rare; most blocks never get one).
//! A thread owns a slot by one compare-and-swap on its key word and gives
//! it back with one release store, which publishes the payload words it
//! wrote; a thread that meets a slot owned by another for the pointer it
//! wants waits the few instructions until it is given back.
//!
//! Growth: segments of doubling size (`FIRST_SEGMENT_SLOTS` slots, then
//! twice that, ...), each allocated when an insert first finds every slot
//! of its window full in all earlier ones. Lookups go through the
//! segments in order and stop at the first one not allocated. Past the
//! last segment an entry goes to an overflow map under a mutex, which the
//! lookups only look at while it is non-empty: correct at any number of
//! blocks, and only slower far beyond what frameworks hold live.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::fast_hash::FastMap;
use crate::ids::Generation;
use crate::resource::{BlockId, StreamId};

/// A block the hooks handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HookBlock {
    pub id: BlockId,
    /// Streams other than the allocation stream that used the block
    /// (`xlog_torch_record_stream`); their work is fenced at free time.
    pub used_on: Vec<StreamId>,
}

/// Slots a pointer may live in, from its home slot on.
const WINDOW: usize = 8;
/// Segments of doubling size; past them, the overflow map.
const SEGMENTS: usize = 8;
/// Slots of the first segment (32 bytes each): 128 KiB, allocated at once.
/// All segments together hold 255 times this.
pub(crate) const FIRST_SEGMENT_SLOTS: usize = 1 << 12;

/// Key word of an empty slot.
const EMPTY: u64 = 0;
/// Key flag: a thread owns the slot.
const LOCKED: u64 = 1;
/// Key flag: the block has uses in the side table.
const HAS_USES: u64 = 2;
/// The key bits that are flags, not address (pointers are 256-aligned).
const FLAGS: u64 = 0xff;

/// One entry. The payload words are written and read only by the thread
/// owning the slot, ordered by the key word's acquire/release.
#[derive(Default)]
struct Slot {
    key: AtomicU64,
    size: AtomicU64,
    generation: AtomicU64,
    /// Allocation stream (low 32 bits) and device ordinal (high 32 bits).
    stream_device: AtomicU64,
}

impl Slot {
    /// Write `id`'s payload; the caller owns the slot.
    fn fill(&self, id: &BlockId) {
        self.size.store(id.size, Ordering::Relaxed);
        self.generation.store(id.generation.0, Ordering::Relaxed);
        let stream_device = u64::from(id.alloc_stream.0) | (u64::from(id.device as u32) << 32);
        self.stream_device.store(stream_device, Ordering::Relaxed);
    }

    /// The handle in the slot; the caller owns it.
    fn block_id(&self, ptr: u64) -> BlockId {
        let stream_device = self.stream_device.load(Ordering::Relaxed);
        BlockId {
            ptr,
            size: self.size.load(Ordering::Relaxed),
            generation: Generation(self.generation.load(Ordering::Relaxed)),
            alloc_stream: StreamId(stream_device as u32),
            device: (stream_device >> 32) as u32 as i32,
        }
    }
}

pub(crate) struct HookIndex {
    segments: [OnceLock<Box<[Slot]>>; SEGMENTS],
    first_segment_slots: usize,
    /// Streams that used a block (`HookBlock::used_on`) for the blocks whose
    /// slot has `HAS_USES`; touched only by the slot's owner.
    uses: Mutex<FastMap<u64, Vec<StreamId>>>,
    /// Blocks that found no slot in any segment.
    overflow: Mutex<FastMap<u64, HookBlock>>,
    /// `overflow.len()`, readable without the lock (changed under it).
    overflowed: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a slot holds for `ptr`, as seen in its key word.
enum Seen {
    /// Another pointer, or nothing.
    Other,
    /// `ptr`, owned by another thread now.
    Busy,
    /// `ptr`, free to own; the key word as read.
    Ready(u64),
}

fn seen(key: u64, ptr: u64) -> Seen {
    if key & !FLAGS != ptr || key == EMPTY {
        Seen::Other
    } else if key & LOCKED != 0 {
        Seen::Busy
    } else {
        Seen::Ready(key)
    }
}

impl Default for HookIndex {
    fn default() -> Self {
        HookIndex::with_first_segment(FIRST_SEGMENT_SLOTS)
    }
}

impl HookIndex {
    /// An index whose first segment has `slots` slots (a power of two of
    /// at least `WINDOW`; small ones let tests reach the overflow).
    pub(crate) fn with_first_segment(slots: usize) -> HookIndex {
        assert!(slots.is_power_of_two() && slots >= WINDOW, "{slots} slots: a power of two of at least {WINDOW}");
        let index = HookIndex {
            segments: Default::default(),
            first_segment_slots: slots,
            uses: Mutex::default(),
            overflow: Mutex::default(),
            overflowed: AtomicUsize::new(0),
        };
        index.segment(0);
        index
    }

    /// Segment `i`, allocated if it is not yet.
    fn segment(&self, i: usize) -> &[Slot] {
        self.segments[i].get_or_init(|| (0..self.first_segment_slots << i).map(|_| Slot::default()).collect())
    }

    /// The allocated segments, in order.
    fn allocated(&self) -> impl Iterator<Item = &[Slot]> {
        // A segment is allocated only after every one before it (an insert
        // reaches segment i + 1 through `segment(i)`), so the first missing
        // one ends the list.
        self.segments.iter().map_while(|s| s.get().map(|b| &b[..]))
    }

    /// The `WINDOW` slots of `ptr` in `segment`, home slot first.
    fn window(segment: &[Slot], ptr: u64) -> impl Iterator<Item = &Slot> {
        let bits = segment.len().trailing_zeros();
        // Multiplicative hashing: the high bits of the product mix every bit
        // of the address (blocks of one pool are close together).
        let home = ((ptr >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize;
        let mask = segment.len() - 1;
        (0..WINDOW).map(move |j| &segment[(home + j) & mask])
    }

    pub(crate) fn insert(&self, block: HookBlock) {
        let ptr = block.id.ptr;
        debug_assert!(ptr != 0 && ptr & FLAGS == 0, "{ptr:#x} is not a block address");
        for i in 0..SEGMENTS {
            for slot in Self::window(self.segment(i), ptr) {
                if slot.key.load(Ordering::Relaxed) != EMPTY
                    || slot.key.compare_exchange(EMPTY, ptr | LOCKED, Ordering::Acquire, Ordering::Relaxed).is_err()
                {
                    continue;
                }
                slot.fill(&block.id);
                let mut key = ptr;
                if !block.used_on.is_empty() {
                    lock(&self.uses).insert(ptr, block.used_on);
                    key |= HAS_USES;
                }
                slot.key.store(key, Ordering::Release);
                return;
            }
        }
        let mut overflow = lock(&self.overflow);
        overflow.insert(ptr, block);
        self.overflowed.store(overflow.len(), Ordering::Release);
    }

    /// Own the slot that holds `ptr`, if any: the slot and the key word it
    /// had (flags clear of `LOCKED`). Only the owner may change the slot;
    /// it gives it back with a store to its key word.
    fn own(&self, ptr: u64) -> Option<(&Slot, u64)> {
        if ptr == 0 || ptr & FLAGS != 0 {
            return None; // never a block address
        }
        for segment in self.allocated() {
            for slot in Self::window(segment, ptr) {
                let mut spins = 0u32;
                loop {
                    match seen(slot.key.load(Ordering::Acquire), ptr) {
                        Seen::Other => break,
                        Seen::Ready(key) => {
                            if slot.key.compare_exchange(key, key | LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                                return Some((slot, key));
                            }
                        }
                        Seen::Busy => {
                            // Owners hold a slot for a few instructions (and
                            // at most the `uses` lock): wait, then look again.
                            spins += 1;
                            if spins < 64 {
                                std::hint::spin_loop();
                            } else {
                                std::thread::yield_now();
                            }
                        }
                    }
                }
            }
        }
        None
    }

    pub(crate) fn take(&self, ptr: u64) -> Option<HookBlock> {
        if let Some((slot, key)) = self.own(ptr) {
            let id = slot.block_id(ptr);
            let used_on = if key & HAS_USES != 0 { lock(&self.uses).remove(&ptr).unwrap_or_default() } else { Vec::new() };
            slot.key.store(EMPTY, Ordering::Release);
            return Some(HookBlock { id, used_on });
        }
        self.take_overflowed(ptr)
    }

    fn take_overflowed(&self, ptr: u64) -> Option<HookBlock> {
        if self.overflowed.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut overflow = lock(&self.overflow);
        let block = overflow.remove(&ptr)?;
        self.overflowed.store(overflow.len(), Ordering::Release);
        Some(block)
    }

    pub(crate) fn add_use(&self, ptr: u64, stream: StreamId) -> bool {
        if let Some((slot, key)) = self.own(ptr) {
            let alloc_stream = slot.block_id(ptr).alloc_stream;
            let mut key = key;
            if stream != alloc_stream {
                let mut uses = lock(&self.uses);
                let used_on = uses.entry(ptr).or_default();
                if !used_on.contains(&stream) {
                    used_on.push(stream);
                }
                key |= HAS_USES;
            }
            slot.key.store(key, Ordering::Release);
            return true;
        }
        if self.overflowed.load(Ordering::Acquire) == 0 {
            return false;
        }
        match lock(&self.overflow).get_mut(&ptr) {
            Some(block) => {
                if stream != block.id.alloc_stream && !block.used_on.contains(&stream) {
                    block.used_on.push(stream);
                }
                true
            }
            None => false,
        }
    }

    pub(crate) fn contains(&self, ptr: u64) -> bool {
        if ptr == 0 || ptr & FLAGS != 0 {
            return false;
        }
        let in_segments = self.allocated().any(|segment| {
            Self::window(segment, ptr).any(|slot| !matches!(seen(slot.key.load(Ordering::Acquire), ptr), Seen::Other))
        });
        in_segments || (self.overflowed.load(Ordering::Acquire) != 0 && lock(&self.overflow).contains_key(&ptr))
    }

    pub(crate) fn len(&self) -> usize {
        let in_segments: usize = self
            .allocated()
            .map(|segment| segment.iter().filter(|slot| slot.key.load(Ordering::Acquire) != EMPTY).count())
            .sum();
        in_segments + self.overflowed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    fn block(ptr: u64, generation: u64) -> HookBlock {
        HookBlock {
            id: BlockId { ptr, size: ptr / 256, generation: Generation(generation), alloc_stream: StreamId(7), device: -3 },
            used_on: Vec::new(),
        }
    }

    #[test]
    fn insert_take_and_refusals() {
        let index = HookIndex::default();
        let b = block(0x7f00_0000_1000, 42);
        index.insert(b.clone());
        assert!(index.contains(b.id.ptr));
        assert_eq!(index.len(), 1);
        assert_eq!(index.take(b.id.ptr), Some(b.clone()), "the whole handle comes back");
        // Taken already (a double free), never inserted, not even a block
        // address: refused, nothing changes.
        assert_eq!(index.take(b.id.ptr), None);
        assert_eq!(index.take(0x7f00_0000_2000), None);
        assert_eq!(index.take(0), None);
        assert_eq!(index.take(0x7f00_0000_1001), None);
        assert!(!index.add_use(b.id.ptr, StreamId(9)));
        assert!(!index.contains(b.id.ptr));
        assert_eq!(index.len(), 0);
        // The address handed out again is a new block.
        let again = block(b.id.ptr, 43);
        index.insert(again.clone());
        assert_eq!(index.take(b.id.ptr), Some(again));
    }

    #[test]
    fn uses_are_kept_until_the_take_and_the_allocation_stream_is_not_one() {
        let index = HookIndex::default();
        let b = block(0x10_0000, 1);
        index.insert(b.clone());
        assert!(index.add_use(b.id.ptr, StreamId(9)));
        assert!(index.add_use(b.id.ptr, StreamId(9)), "twice is once");
        assert!(index.add_use(b.id.ptr, b.id.alloc_stream), "the allocation stream needs no fence");
        assert!(index.add_use(b.id.ptr, StreamId(11)));
        let taken = index.take(b.id.ptr).unwrap();
        assert_eq!((taken.id, taken.used_on.clone()), (b.id, vec![StreamId(9), StreamId(11)]));
        assert!(lock(&index.uses).is_empty(), "the side table forgets the taken block");
        // Put back (a failed free) with its uses, and taken again.
        index.insert(taken.clone());
        assert_eq!(index.take(b.id.ptr), Some(taken));
        // A block that never had uses gets none from an earlier one.
        index.insert(block(b.id.ptr, 2));
        assert_eq!(index.take(b.id.ptr).unwrap().used_on, Vec::new());
    }

    #[test]
    fn more_blocks_than_the_segments_hold_go_to_the_overflow_and_back() {
        // 8 slots, then 16, ... 1024: 2040 slots; 3000 blocks cannot fit.
        let index = HookIndex::with_first_segment(WINDOW);
        let ptrs: Vec<u64> = (1..=3000u64).map(|i| i << 8).collect();
        for (i, &p) in ptrs.iter().enumerate() {
            index.insert(block(p, i as u64 + 1));
        }
        assert!(index.overflowed.load(Ordering::Relaxed) >= 3000 - 2040);
        assert_eq!(index.len(), 3000);
        for &p in ptrs.iter().step_by(3) {
            assert!(index.add_use(p, StreamId(99)), "{p:#x}");
        }
        assert!(!index.contains(3001 << 8) && index.take(3001 << 8).is_none(), "a foreign pointer is refused");
        for (i, &p) in ptrs.iter().enumerate() {
            let taken = index.take(p).unwrap_or_else(|| panic!("{p:#x} lost"));
            assert_eq!(taken.id, block(p, i as u64 + 1).id);
            assert_eq!(taken.used_on, if i % 3 == 0 { vec![StreamId(99)] } else { vec![] }, "{p:#x}");
            assert_eq!(index.take(p), None, "{p:#x} taken twice");
        }
        assert_eq!(index.len(), 0);
        assert_eq!(index.overflowed.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn threads_inserting_and_taking_at_once_lose_and_duplicate_nothing() {
        // A small first segment so that threads meet in windows, segments
        // and the overflow.
        let index = Arc::new(HookIndex::with_first_segment(64));
        let threads = 8u64;
        let rounds = 2_000u64;
        std::thread::scope(|s| {
            for t in 0..threads {
                let index = &index;
                s.spawn(move || {
                    let mut live = Vec::new();
                    for r in 0..rounds {
                        // Each thread's own addresses, reused round after round.
                        let ptr = ((t << 32) | ((r % 300) + 1)) << 8;
                        if let Some(b) = index.take(ptr) {
                            assert_eq!(b.id.ptr, ptr);
                            live.retain(|&p| p != ptr);
                        } else {
                            index.insert(block(ptr, r + 1));
                            live.push(ptr);
                        }
                    }
                    for ptr in live {
                        assert!(index.take(ptr).is_some(), "{ptr:#x} lost");
                    }
                });
            }
        });
        assert_eq!(index.len(), 0);
    }

    #[test]
    fn of_threads_taking_one_block_at_once_exactly_one_gets_it() {
        let index = HookIndex::default();
        let winners = AtomicU32::new(0);
        for round in 1..=200u64 {
            let ptr = round << 12;
            index.insert(block(ptr, round));
            winners.store(0, Ordering::Relaxed);
            std::thread::scope(|s| {
                for t in 0..4 {
                    let (index, winners) = (&index, &winners);
                    s.spawn(move || {
                        // Some threads record a use meanwhile (record_stream
                        // racing the free): never a second owner.
                        if t % 2 == 1 {
                            index.add_use(ptr, StreamId(100 + t));
                        }
                        if index.take(ptr).is_some() {
                            winners.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            assert_eq!(winners.load(Ordering::Relaxed), 1, "round {round}");
            assert!(lock(&index.uses).is_empty(), "a use outlived its block");
        }
        assert_eq!(index.len(), 0);
    }
}
