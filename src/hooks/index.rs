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
//! - `take_keeping` / `insert_keeping` / `release`: as `take` and `insert`
//!   (see "Reuse" below); a `Reservation` is used by one thread only.
//! - `take_with(ptr, keep, free)`: as `take_keeping`, but runs `free` on the
//!   block's handle and uses while it owns the entry, and takes the block
//!   out only when `free` succeeds; when it fails or panics the entry stays
//!   as it was. A take of the same pointer meanwhile waits for the outcome.
//!   The hooks' free goes through it (no `HookBlock` built and moved, no
//!   put-back after a failed free).
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
//! wants waits the few instructions until it is given back, and if it was
//! emptied meanwhile goes on through the window: the owner was freeing an
//! earlier block at that address, which the allocator may have handed out
//! again already (the new block then sits in another slot).
//!
//! Reuse: `take_keeping` / `insert_keeping` with a thread's `Reservation`
//! spare the insert its compare-and-swap. The take leaves the slot it
//! emptied owned by the taking thread (key word `RESERVED`: locked, no
//! pointer, so every other thread passes it by), and that thread's next
//! insert fills it with plain stores when it lies in the new pointer's
//! window. With the stream caches that is the common case: a framework
//! frees a block and allocates the same size again, and gets the same
//! address back. A thread keeps at most one slot per index, gives it back
//! (`release`) before it lets go of the index, and at thread exit.
//!
//! Growth: segments of doubling size (`FIRST_SEGMENT_SLOTS` slots, then
//! twice that, ...), each allocated when an insert first finds every slot
//! of its window full in all earlier ones. Lookups go through the
//! segments in order and stop at the first one not allocated. Past the
//! last segment an entry goes to an overflow map under a mutex, which the
//! lookups only look at while it is non-empty: correct at any number of
//! blocks, and only slower far beyond what frameworks hold live.

use std::cell::Cell;
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
/// Key word of a slot a thread keeps for its next insert (`Reservation`):
/// owned, and holding no pointer, so every other thread passes it by.
const RESERVED: u64 = LOCKED;
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

/// Slots of one segment, and where a pointer's window starts in it.
struct Segment {
    slots: Box<[Slot]>,
    /// 64 - log2(slots.len()): the hash's high bits pick the home slot.
    shift: u32,
}

impl Segment {
    fn new(len: usize) -> Segment {
        Segment { slots: (0..len).map(|_| Slot::default()).collect(), shift: 64 - len.trailing_zeros() }
    }

    /// The home slot of `ptr`.
    #[inline]
    fn home(&self, ptr: u64) -> usize {
        // Multiplicative hashing: the high bits of the product mix every bit
        // of the address (blocks of one pool are close together).
        ((ptr >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The indices of the `WINDOW` slots of `ptr`, home slot first.
    #[inline]
    fn window(&self, ptr: u64) -> impl Iterator<Item = usize> {
        let (home, mask) = (self.home(ptr), self.slots.len() - 1);
        (0..WINDOW).map(move |j| (home + j) & mask)
    }

    /// Whether slot `i` is in `ptr`'s window.
    #[inline]
    fn in_window(&self, ptr: u64, i: usize) -> bool {
        i.wrapping_sub(self.home(ptr)) & (self.slots.len() - 1) < WINDOW
    }

    /// Own an empty slot of `ptr`'s window for filling, if there is one.
    #[inline]
    fn claim(&self, ptr: u64) -> Option<&Slot> {
        self.window(ptr).map(|i| &self.slots[i]).find(|slot| {
            slot.key.load(Ordering::Relaxed) == EMPTY
                && slot.key.compare_exchange(EMPTY, ptr | LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
        })
    }

    /// Own the slot of `ptr`'s window that holds it, if any: its index and
    /// its key word (without `LOCKED`). Only the owner changes the slot; it
    /// gives it back with a store to the key word.
    #[inline]
    fn own(&self, ptr: u64) -> Option<(usize, u64)> {
        for i in self.window(ptr) {
            let slot = &self.slots[i];
            let key = slot.key.load(Ordering::Acquire);
            if key & !FLAGS != ptr {
                continue;
            }
            if key & LOCKED == 0
                && slot.key.compare_exchange(key, key | LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return Some((i, key));
            }
            if let Some(key) = own_contended(slot, ptr) {
                return Some((i, key));
            }
            // That entry went while we waited: the free of an earlier block
            // at the address, which the allocator may already have handed
            // out again (and the new block may sit further on).
        }
        None
    }

    fn holds(&self, ptr: u64) -> bool {
        self.window(ptr).any(|i| self.slots[i].key.load(Ordering::Acquire) & !FLAGS == ptr)
    }

    /// Slots holding a block (or being filled with one); not the empty and
    /// the reserved ones.
    fn len(&self) -> usize {
        self.slots.iter().filter(|slot| slot.key.load(Ordering::Acquire) & !FLAGS != 0).count()
    }
}

/// `Segment::own` for a slot holding `ptr` that another thread owns now
/// (or took from under us): wait until it is given back, then own it if it
/// still holds `ptr`. Owners hold a slot for a few instructions (and at
/// most the `uses` lock), so this spins a little, then yields.
#[cold]
fn own_contended(slot: &Slot, ptr: u64) -> Option<u64> {
    let mut spins = 0u32;
    loop {
        let key = slot.key.load(Ordering::Acquire);
        if key & !FLAGS != ptr || key == EMPTY {
            return None;
        }
        if key & LOCKED == 0 {
            if slot.key.compare_exchange(key, key | LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Some(key);
            }
            continue;
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

pub(crate) struct HookIndex {
    /// This index's identity, for the reservations (`Reservation`).
    unique: u64,
    /// Segment 0, allocated with the index: nearly every entry lives here.
    first: Segment,
    /// Segments 1.., each allocated when first needed.
    more: [OnceLock<Segment>; SEGMENTS - 1],
    /// Streams that used a block (`HookBlock::used_on`) for the blocks whose
    /// slot has `HAS_USES`; touched only by the slot's owner.
    uses: Mutex<FastMap<u64, Vec<StreamId>>>,
    /// Blocks that found no slot in any segment.
    overflow: Mutex<FastMap<u64, HookBlock>>,
    /// `overflow.len()`, readable without the lock (changed under it).
    overflowed: AtomicUsize,
}

/// The slot of the first segment a thread kept from its last take for its
/// next insert (see "Reuse" in the module docs), with the index it belongs
/// to. Lives in a thread-local: the owner is the only thread that touches
/// a reserved slot, and gives it back with `HookIndex::release` (or by
/// using it) before it lets go of the index.
pub(crate) struct Reservation {
    slot: Cell<Option<(u64, usize)>>,
}

impl Reservation {
    pub(crate) const fn new() -> Reservation {
        Reservation { slot: Cell::new(None) }
    }

    /// Whether this holds no slot, or one of index `unique`.
    fn index_is(&self, unique: u64) -> bool {
        match self.slot.get() {
            Some((index, _)) => index == unique,
            None => true,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `ptr` can be a block address at all (non-zero, 256-aligned).
fn is_block_address(ptr: u64) -> bool {
    ptr != 0 && ptr & FLAGS == 0
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
        static NEXT_INDEX: AtomicU64 = AtomicU64::new(1);
        HookIndex {
            unique: NEXT_INDEX.fetch_add(1, Ordering::Relaxed),
            first: Segment::new(slots),
            more: Default::default(),
            uses: Mutex::default(),
            overflow: Mutex::default(),
            overflowed: AtomicUsize::new(0),
        }
    }

    /// The segments allocated so far, in order.
    fn segments(&self) -> impl Iterator<Item = &Segment> {
        // Segment i + 1 is allocated only by an insert that went through
        // segment i (`insert_beyond_first`), so the first missing one ends
        // the list.
        std::iter::once(&self.first).chain(self.more.iter().map_while(|s| s.get()))
    }

    #[cfg(test)]
    pub(crate) fn insert(&self, block: HookBlock) {
        self.insert_keeping(block, None)
    }

    /// `insert`; with `keep`, into the caller's reserved slot without a
    /// compare-and-swap when that slot is in the pointer's window (the
    /// common case: the allocation got the address the caller freed last).
    /// A reserved slot elsewhere is given back.
    #[inline]
    pub(crate) fn insert_keeping(&self, block: HookBlock, keep: Option<&Reservation>) {
        let ptr = block.id.ptr;
        debug_assert!(is_block_address(ptr), "{ptr:#x} is not a block address");
        if let Some(keep) = keep {
            if let Some((index, i)) = keep.slot.get() {
                if index == self.unique {
                    keep.slot.set(None);
                    let slot = &self.first.slots[i];
                    if self.first.in_window(ptr, i) {
                        return self.fill(slot, block);
                    }
                    slot.key.store(EMPTY, Ordering::Release);
                }
            }
        }
        match self.first.claim(ptr) {
            Some(slot) => self.fill(slot, block),
            None => self.insert_beyond_first(block),
        }
    }

    /// Write `block` into `slot`, which the caller owns (claimed or
    /// reserved), and give the slot back.
    #[inline(always)]
    fn fill(&self, slot: &Slot, block: HookBlock) {
        slot.fill(&block.id);
        let mut key = block.id.ptr;
        if !block.used_on.is_empty() {
            lock(&self.uses).insert(key, block.used_on);
            key |= HAS_USES;
        }
        slot.key.store(key, Ordering::Release);
    }

    #[cold]
    fn insert_beyond_first(&self, block: HookBlock) {
        let ptr = block.id.ptr;
        for (i, more) in self.more.iter().enumerate() {
            let segment = more.get_or_init(|| Segment::new(self.first.slots.len() << (i + 1)));
            if let Some(slot) = segment.claim(ptr) {
                return self.fill(slot, block);
            }
        }
        let mut overflow = lock(&self.overflow);
        overflow.insert(ptr, block);
        self.overflowed.store(overflow.len(), Ordering::Release);
    }

    /// Own the slot that holds `ptr`, in whichever segment: the slot, its
    /// index in the first segment (`None` for a later one) and its key word.
    #[inline]
    fn own(&self, ptr: u64) -> Option<(&Slot, Option<usize>, u64)> {
        if !is_block_address(ptr) {
            return None; // (0 would match every empty slot)
        }
        if let Some((i, key)) = self.first.own(ptr) {
            return Some((&self.first.slots[i], Some(i), key));
        }
        self.own_beyond_first(ptr)
    }

    #[cold]
    fn own_beyond_first(&self, ptr: u64) -> Option<(&Slot, Option<usize>, u64)> {
        self.more
            .iter()
            .map_while(|s| s.get())
            .find_map(|segment| segment.own(ptr).map(|(i, key)| (&segment.slots[i], None, key)))
    }

    #[cfg(test)]
    pub(crate) fn take(&self, ptr: u64) -> Option<HookBlock> {
        self.take_keeping(ptr, None)
    }

    /// `take`; with `keep`, the emptied slot (when in the first segment)
    /// becomes the caller's reserved slot instead of an empty one, and the
    /// slot `keep` held before, if any, becomes empty.
    #[cfg(test)]
    pub(crate) fn take_keeping(&self, ptr: u64, keep: Option<&Reservation>) -> Option<HookBlock> {
        let taken = self.take_with(ptr, keep, |id, used_on| {
            Ok::<_, std::convert::Infallible>(HookBlock { id: *id, used_on: used_on.to_vec() })
        });
        taken.map(|r| r.unwrap_or_else(|never| match never {}))
    }

    /// Run `free` on the block at `ptr` and its uses while owning its
    /// entry, and take the block out only if `free` succeeds (as
    /// `take_keeping`, reservation included). `None` when the index does not
    /// hold `ptr`. When `free` fails (or panics) the entry stays exactly as
    /// it was, so a failed free changes nothing here either; a second
    /// thread taking the same pointer meanwhile waits for the outcome (and
    /// finds the block gone, or takes it itself).
    ///
    /// Why a closure rather than `take` and an `insert` on failure: the
    /// block's handle is read out of the slot straight into what `free`
    /// borrows, with no `HookBlock` (handle and `Vec`) built and moved
    /// through the callers' frames, and no window in which a racing free
    /// of the same pointer is told the block is not the hooks'.
    #[inline]
    pub(crate) fn take_with<T, E>(
        &self,
        ptr: u64,
        keep: Option<&Reservation>,
        free: impl FnOnce(&BlockId, &[StreamId]) -> Result<T, E>,
    ) -> Option<Result<T, E>> {
        let Some((slot, first_index, key)) = self.own(ptr) else {
            return self.take_overflowed_with(ptr, free);
        };
        /// Gives the slot back as it was, unless disarmed: on a failed or
        /// panicking `free`.
        struct Unchanged<'a> {
            slot: &'a Slot,
            key: u64,
        }
        impl Drop for Unchanged<'_> {
            fn drop(&mut self) {
                self.slot.key.store(self.key, Ordering::Release);
            }
        }
        let unchanged = Unchanged { slot, key };
        let id = slot.block_id(ptr);
        let result = if key & HAS_USES != 0 { self.free_with_uses(ptr, &id, free) } else { free(&id, &[]) };
        if result.is_err() {
            return Some(result);
        }
        std::mem::forget(unchanged);
        if key & HAS_USES != 0 {
            self.forget_uses(ptr);
        }
        match (keep, first_index) {
            (Some(keep), Some(i)) if keep.index_is(self.unique) => {
                if let Some(old) = keep.slot.replace(Some((self.unique, i))) {
                    self.first.slots[old.1].key.store(EMPTY, Ordering::Release);
                }
                slot.key.store(RESERVED, Ordering::Release);
            }
            _ => slot.key.store(EMPTY, Ordering::Release),
        }
        Some(result)
    }

    /// `free` with the uses of the block at `ptr`, whose slot the caller
    /// owns (so no one changes them meanwhile).
    #[cold]
    fn free_with_uses<T, E>(
        &self,
        ptr: u64,
        id: &BlockId,
        free: impl FnOnce(&BlockId, &[StreamId]) -> Result<T, E>,
    ) -> Result<T, E> {
        let used_on = lock(&self.uses).get(&ptr).cloned().unwrap_or_default();
        free(id, &used_on)
    }

    /// Give back the slot `keep` holds in this index, if any.
    pub(crate) fn release(&self, keep: &Reservation) {
        if let Some((index, i)) = keep.slot.get() {
            if index == self.unique {
                keep.slot.set(None);
                self.first.slots[i].key.store(EMPTY, Ordering::Release);
            }
        }
    }

    #[cold]
    fn forget_uses(&self, ptr: u64) {
        lock(&self.uses).remove(&ptr);
    }

    /// `take_with` for a block in the overflow map: `free` runs under the
    /// map's lock (the overflow is far beyond what frameworks hold live).
    #[cold]
    fn take_overflowed_with<T, E>(
        &self,
        ptr: u64,
        free: impl FnOnce(&BlockId, &[StreamId]) -> Result<T, E>,
    ) -> Option<Result<T, E>> {
        if self.overflowed.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut overflow = lock(&self.overflow);
        let block = overflow.get(&ptr)?;
        let result = free(&block.id, &block.used_on);
        if result.is_ok() {
            overflow.remove(&ptr);
            self.overflowed.store(overflow.len(), Ordering::Release);
        }
        Some(result)
    }

    pub(crate) fn add_use(&self, ptr: u64, stream: StreamId) -> bool {
        if let Some((slot, _, key)) = self.own(ptr) {
            let mut key = key;
            if stream != slot.block_id(ptr).alloc_stream {
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
        if !is_block_address(ptr) {
            return false;
        }
        self.segments().any(|segment| segment.holds(ptr))
            || (self.overflowed.load(Ordering::Acquire) != 0 && lock(&self.overflow).contains_key(&ptr))
    }

    pub(crate) fn len(&self) -> usize {
        self.segments().map(Segment::len).sum::<usize>() + self.overflowed.load(Ordering::Acquire)
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
    fn a_take_waiting_on_the_free_of_an_earlier_block_at_the_address_finds_the_new_one() {
        // The hooks' free holds the entry while the runtime frees the block;
        // the allocator may hand the address out again before the entry is
        // emptied, and the new block goes into another slot of the window.
        // A take of it that waited for the old entry must go on looking.
        let index = Arc::new(HookIndex::default());
        let p = 0x30_0000;
        index.insert(block(p, 1));
        let result = index.take_with(p, None, |_, _| {
            index.insert(block(p, 2)); // the address reused at once
            let other = Arc::clone(&index);
            let taker = std::thread::spawn(move || other.take(p));
            // Let it meet the old entry, still owned here, and wait on it.
            std::thread::sleep(std::time::Duration::from_millis(50));
            Ok::<_, ()>(taker)
        });
        let taker = result.expect("the first block was there").expect("its free succeeded");
        let taken = taker.join().unwrap();
        assert_eq!(taken.map(|b| b.id.generation), Some(Generation(2)), "the new block, not 'not a hook block'");
        assert!(!index.contains(p));
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
    fn take_with_keeps_the_entry_when_the_free_fails_or_panics() {
        let index = HookIndex::default();
        let keep = Reservation::new();
        let b = block(0x20_0000, 5);
        index.insert(b.clone());
        assert!(index.add_use(b.id.ptr, StreamId(9)));
        let failed = index.take_with(b.id.ptr, Some(&keep), |id, used_on| {
            assert_eq!((*id, used_on), (b.id, &[StreamId(9)][..]), "the handle and its uses");
            Err::<(), _>("refused")
        });
        assert_eq!(failed, Some(Err("refused")));
        assert_eq!(keep.slot.get(), None, "a failed free reserves nothing");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            index.take_with(b.id.ptr, Some(&keep), |_, _| -> Result<(), ()> { panic!("deliberate") })
        }));
        assert!(panicked.is_err());
        assert!(index.contains(b.id.ptr) && index.len() == 1, "still there, unlocked");
        assert_eq!(index.take_with(b.id.ptr, Some(&keep), |_, _| Ok::<_, ()>(7)), Some(Ok(7)));
        assert!(!index.contains(b.id.ptr) && lock(&index.uses).is_empty());
        assert_eq!(index.take_with(b.id.ptr, Some(&keep), |_, _| Ok::<_, ()>(8)), None, "taken once");
        index.release(&keep);

        // The same for a block in the overflow map.
        let small = HookIndex::with_first_segment(WINDOW);
        let ptrs: Vec<u64> = (1..=3000u64).map(|i| i << 8).collect();
        for (i, &p) in ptrs.iter().enumerate() {
            small.insert(block(p, i as u64 + 1));
        }
        let overflowed = small.overflowed.load(Ordering::Relaxed);
        assert!(overflowed > 0);
        let in_overflow = *ptrs.iter().rev().find(|p| lock(&small.overflow).contains_key(p)).unwrap();
        assert_eq!(small.take_with(in_overflow, None, |_, _| Err::<(), _>(())), Some(Err(())));
        assert_eq!(small.len(), 3000);
        assert_eq!(small.take_with(in_overflow, None, |id, _| Ok::<_, ()>(id.ptr)), Some(Ok(in_overflow)));
        assert_eq!(small.len(), 2999);
        assert!(!small.contains(in_overflow));
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
    fn a_reserved_slot_is_reused_by_its_thread_and_invisible_to_others() {
        let index = HookIndex::with_first_segment(WINDOW);
        let keep = Reservation::new();
        let p = 0x4000_0000u64;
        index.insert_keeping(block(p, 1), Some(&keep));
        assert_eq!(keep.slot.get(), None, "an insert reserves nothing");
        index.take_keeping(p, Some(&keep)).unwrap();
        let (owner, reserved) = keep.slot.get().expect("the take kept its slot");
        assert_eq!(owner, index.unique);
        assert_eq!(index.first.slots[reserved].key.load(Ordering::Relaxed), RESERVED);
        // Reserved is neither a block nor free: not counted, not found, not
        // claimed by another insert (the 7 others fill the segment's other
        // slots, the 8th goes to the next segment).
        assert_eq!(index.len(), 0);
        assert!(!index.contains(p) && index.take(p).is_none());
        let others: Vec<u64> = (1..=8u64).map(|i| p + (i << 8)).collect();
        for (i, &q) in others.iter().enumerate() {
            index.insert(block(q, 10 + i as u64));
        }
        assert_eq!(index.first.slots[reserved].key.load(Ordering::Relaxed), RESERVED, "no one else filled it");
        assert!(index.more[0].get().is_some(), "the eighth went on");
        // The same address again fills the reserved slot.
        index.insert_keeping(block(p, 2), Some(&keep));
        assert_eq!(keep.slot.get(), None);
        assert_eq!(index.first.slots[reserved].key.load(Ordering::Relaxed), p);
        assert_eq!(index.take(p).unwrap().id.generation, Generation(2));
        // A take keeps its newest slot and gives the older one back.
        index.take_keeping(others[0], Some(&keep)).unwrap();
        let first = keep.slot.get().unwrap().1;
        index.take_keeping(others[1], Some(&keep)).unwrap();
        assert_eq!(index.first.slots[first].key.load(Ordering::Relaxed), EMPTY);
        let second = keep.slot.get().unwrap().1;
        // A reservation of another index is left alone (its owner gives
        // it back there), and this index keeps nothing for it.
        let other = HookIndex::with_first_segment(WINDOW);
        other.insert(block(p, 3));
        assert!(other.take_keeping(p, Some(&keep)).is_some());
        assert_eq!(keep.slot.get(), Some((index.unique, second)));
        assert_eq!(other.len(), 0);
        other.release(&keep);
        assert_eq!(keep.slot.get(), Some((index.unique, second)), "not the other index's to release");
        index.release(&keep);
        assert_eq!(keep.slot.get(), None);
        assert_eq!(index.first.slots[second].key.load(Ordering::Relaxed), EMPTY);
        assert_eq!(index.len(), 6);
    }

    #[test]
    fn threads_with_reservations_free_each_others_blocks() {
        // Blocks handed from thread to thread (allocated on one, freed on
        // the next), each thread with its own reservation.
        let index = HookIndex::with_first_segment(64);
        let threads = 4u64;
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..threads).map(|_| std::sync::mpsc::channel::<u64>()).unzip();
        std::thread::scope(|s| {
            for (t, receiver) in receivers.into_iter().enumerate() {
                let (index, next) = (&index, senders[(t + 1) % threads as usize].clone());
                s.spawn(move || {
                    let keep = Reservation::new();
                    for r in 0..2_000u64 {
                        let ptr = (((t as u64) << 32) | (r % 97 + 1)) << 8;
                        // Still live from the last lap: free it here first.
                        if index.take_keeping(ptr, Some(&keep)).is_some() {
                            continue;
                        }
                        index.insert_keeping(block(ptr, r + 1), Some(&keep));
                        let _ = next.send(ptr); // (the next thread may be done)
                        while let Ok(theirs) = receiver.try_recv() {
                            // Freed by its owner meanwhile, or freed here.
                            let _ = index.take_keeping(theirs, Some(&keep));
                        }
                    }
                    drop(next);
                    index.release(&keep);
                });
            }
            drop(senders);
        });
        // Whatever is left was inserted once and never taken: take it now.
        let left = index.len();
        let mut found = 0;
        for t in 0..threads {
            for i in 1..=97u64 {
                found += usize::from(index.take(((t << 32) | i) << 8).is_some());
            }
        }
        assert_eq!(found, left);
        assert_eq!(index.len(), 0);
        assert!(index.first.slots.iter().all(|s| s.key.load(Ordering::Relaxed) == EMPTY), "a reservation leaked");
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
