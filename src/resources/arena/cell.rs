//! `RegionCell`: a region behind its lock, and the block its stream freed
//! last, which the same stream can take back without the lock.
//!
//! Contract:
//! - **The quick slot.** A free into the region by its own stream, when
//!   the slot is empty, parks the block there (one compare-and-swap, no
//!   lock); the next allocation of exactly that size on that stream takes
//!   it back the same way: a steady allocate/free loop touches no lock of
//!   the arena. Anything else goes through the lock as before.
//! - **Seen by everyone who locks.** [`RegionCell::lock`] (and `try_lock`)
//!   first moves a parked block into the region as that stream's latest
//!   free (`Region::release`), so whatever reads the region (carving, best
//!   fit, lending, recycling, trim, close) sees all of its free space,
//!   exactly as if the free had taken the lock. A parked block is memory
//!   of a mapped range no live block uses: its pages stay mapped (nobody
//!   can count them idle while it is out of the free ranges).
//! - **Why reuse needs no fence.** Only the region's own stream parks and
//!   takes (the caller checks, against `owner`, which changes only when
//!   the region passes to another stream), so stream order fences the
//!   reuse, as for any hit in the region (`region.rs`). A parked block's
//!   free number is given when it joins the region, later than the free
//!   itself: a seal recorded in between does not count it complete, which
//!   only delays when its pages may move.
//!
//! Packing: the block's offset in the region and its length, both in
//! `BLOCK_ALIGN` units, in one word (0: empty). Blocks too long or too far
//! into the region for the packing are never parked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::region::Region;
use super::BLOCK_ALIGN;
use crate::device::RawStream;

/// Bits of the packed length (in `BLOCK_ALIGN` units): blocks up to 128 GiB.
const LEN_BITS: u32 = 28;
const LEN_MASK: u64 = (1 << LEN_BITS) - 1;
/// Bits of the packed offset: regions up to 32 TiB.
const OFFSET_BITS: u32 = 64 - LEN_BITS;

pub(crate) struct RegionCell {
    /// The parked block, packed (module docs); 0 when empty.
    parked: AtomicU64,
    /// The region's stream (`Region::stream`), readable with no lock: a
    /// thread's cached region serves it only while it is still the
    /// stream's (`released_streams.rs` gives regions to another).
    owner: AtomicU64,
    base: u64,
    region: Mutex<Region>,
}

impl RegionCell {
    pub fn new(region: Region) -> RegionCell {
        RegionCell {
            parked: AtomicU64::new(0),
            owner: AtomicU64::new(region.stream),
            base: region.base,
            region: Mutex::new(region),
        }
    }

    /// The region's stream, read with no lock.
    #[inline]
    pub fn owner(&self) -> RawStream {
        self.owner.load(Ordering::Acquire)
    }

    /// Give the region (`r`, this cell's, locked) to `stream`: the lock
    /// moved any parked block in (the old stream's free), and from now on
    /// only `stream` parks and takes without the lock.
    pub fn set_owner(&self, r: &mut Region, stream: RawStream) {
        r.stream = stream;
        self.owner.store(stream, Ordering::Release);
    }

    /// The region's base address (fixed: no lock needed).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// `[addr, addr + len)` packed, or `None` where it does not fit the word.
    fn pack(&self, addr: u64, len: u64) -> Option<u64> {
        let (offset, units) = ((addr - self.base) / BLOCK_ALIGN, len / BLOCK_ALIGN);
        (units > 0 && units < 1 << LEN_BITS && offset < 1 << OFFSET_BITS).then_some(offset << LEN_BITS | units)
    }

    fn unpack(&self, word: u64) -> (u64, u64) {
        (self.base + (word >> LEN_BITS) * BLOCK_ALIGN, (word & LEN_MASK) * BLOCK_ALIGN)
    }

    /// Park a block its stream just freed; `false` (nothing changed) when
    /// the slot is taken or the block does not pack.
    #[inline]
    pub fn park(&self, addr: u64, len: u64) -> bool {
        if self.parked.load(Ordering::Relaxed) != 0 {
            return false;
        }
        let Some(word) = self.pack(addr, len) else { return false };
        self.parked.compare_exchange(0, word, Ordering::Release, Ordering::Relaxed).is_ok()
    }

    /// The parked block if it is exactly `len` bytes (a multiple of
    /// `BLOCK_ALIGN`): its address, taken out of the slot.
    #[inline]
    pub fn take_parked(&self, len: u64) -> Option<u64> {
        let word = self.parked.load(Ordering::Relaxed);
        if word == 0 || word & LEN_MASK != len / BLOCK_ALIGN {
            return None;
        }
        self.parked.compare_exchange(word, 0, Ordering::Acquire, Ordering::Relaxed).ok()?;
        Some(self.unpack(word).0)
    }

    /// The region, locked, with any parked block moved into it.
    pub fn lock(&self) -> MutexGuard<'_, Region> {
        let guard = self.region.lock().unwrap_or_else(|p| p.into_inner());
        self.unpark(guard)
    }

    /// `lock` unless another thread holds the lock now (`None`).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, Region>> {
        let guard = match self.region.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(self.unpark(guard))
    }

    fn unpark<'a>(&self, mut r: MutexGuard<'a, Region>) -> MutexGuard<'a, Region> {
        if self.parked.load(Ordering::Relaxed) != 0 {
            let word = self.parked.swap(0, Ordering::Acquire);
            if word != 0 {
                let (addr, len) = self.unpack(word);
                r.release(addr, len);
            }
        }
        r
    }

    /// The parked block, if any: (address, length).
    #[cfg(test)]
    pub fn parked(&self) -> Option<(u64, u64)> {
        let word = self.parked.load(Ordering::Acquire);
        (word != 0).then(|| self.unpack(word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn cell() -> RegionCell {
        RegionCell::new(Region::new(7, 1 << 40, 64 * MIB, 4 * MIB))
    }

    #[test]
    fn a_parked_block_is_taken_back_at_its_size_only() {
        let c = cell();
        let addr = (1 << 40) + 3 * MIB;
        assert!(c.park(addr, 512 * 3));
        assert!(!c.park(addr + MIB, 512), "one block at a time");
        assert_eq!(c.take_parked(512 * 4), None, "another size is not taken");
        assert_eq!(c.take_parked(512 * 3), Some(addr));
        assert_eq!(c.take_parked(512 * 3), None, "taken once");
        assert!(c.park(addr + MIB, 512), "the slot is free again");
    }

    #[test]
    fn locking_moves_the_parked_block_into_the_free_ranges() {
        let c = cell();
        let (addr, _) = c.lock().free.take(8 * MIB).unwrap();
        assert!(c.park(addr, 8 * MIB));
        let mut r = c.lock();
        assert_eq!(c.parked(), None, "the lock took the parked block");
        // It is the region's latest free now: taken back whole at its size.
        assert_eq!(r.take_hit(8 * MIB).map(|(a, _)| a), Some(addr));
        drop(r);
        assert_eq!(c.lock().frees(), 1, "the parked block joined as one free");
    }

    #[test]
    fn blocks_that_do_not_pack_are_never_parked() {
        let c = cell();
        assert!(!c.park(1 << 40, (1 << LEN_BITS) * BLOCK_ALIGN), "too long for the word");
        assert!(c.park(1 << 40, ((1 << LEN_BITS) - 1) * BLOCK_ALIGN));
    }
}
