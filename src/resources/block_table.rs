//! `BlockTable`: the live blocks of one allocator's table (all of Direct,
//! one shard of the async pool), with their per-tag counts and allocation
//! sequence numbers.
//!
//! Contract: `insert` enters a block under a generation the caller took
//! (`Generation::next`, never reused) and counts it; `get` finds a handle's
//! record and checks that every field of the handle matches it (a
//! mismatch is a forged or corrupted handle: `InvalidArgument`), `None`
//! when the generation is not here (the caller says why: `stale`, or a
//! record in another table); `get_mut` and `remove` (which counts the
//! free) take a handle already checked. What else an allocator keeps per
//! block is its `X` (the pool's use tracking; nothing for Direct).
//!
//! Records are found by the block's address (two live blocks never share
//! one; 0-byte blocks, all at address 0, by their generation), and the
//! generation in the record must match the handle's. An allocator hands a
//! freed address out again at once, so a steady allocate/free loop finds
//! the same entry warm in cache however many blocks are live (keyed by
//! generation, each allocation went to a new, cold bucket: W6's pair at a
//! million live blocks cost 2-3x the pair at a thousand). A handle not
//! found at its address costs a scan of the table, to tell a forged
//! address (a live generation) from a stale handle: an error path.
//!
//! Locks: none; the owner's lock guards the table.

use std::collections::hash_map::Entry;

use crate::fast_hash::FastMap;
use crate::resource::{
    AllocTag, BlockId, Generation, LeakedBlock, ResourceError, ResourceResult, StreamId, StreamRef,
};
use crate::tag_counters::{CountSummary, TableCounters};

/// A live block's record.
pub(crate) struct Record<X> {
    pub(crate) generation: Generation,
    pub(crate) ptr: u64,
    pub(crate) size: u64,
    /// Device bytes (a size class, the arena's block size, or the driver's
    /// granularity).
    pub(crate) held: u64,
    pub(crate) stream: StreamRef,
    pub(crate) tag: AllocTag,
    /// Allocation sequence number (see `LeakedBlock::sequence`).
    pub(crate) sequence: u64,
    /// What the allocator keeps besides.
    pub(crate) extra: X,
}

/// Where a block's record lives: its address, which the allocator hands
/// out again as soon as the block is freed (so a steady loop finds the
/// same entry warm in cache), or for a 0-byte block (address 0, any
/// number of them live) its generation, made odd: device addresses are
/// aligned (256 bytes at least), so the two never meet. Rotated so that
/// the address's always-zero low bits go to the top: the table's hash
/// (`fast_hash`, a multiply) keeps low bits low, and the buckets come from
/// them.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
struct Key(u64);

impl Key {
    #[inline]
    fn of(ptr: u64, generation: Generation) -> Key {
        // (A handle's address may be anything: a forged odd one finds no
        // record, or a 0-byte block's, whose generation and address then
        // fail the handle's check.)
        let word = if ptr != 0 { ptr } else { generation.0 << 1 | 1 };
        Key(word.rotate_right(8))
    }
}

pub(crate) struct BlockTable<X> {
    blocks: FastMap<Key, Record<X>>,
    /// Per-tag and total counts of the table's blocks (`telemetry`).
    counters: TableCounters,
    allocations: u64,
    deallocations: u64,
}

impl<X> Default for BlockTable<X> {
    fn default() -> Self {
        BlockTable {
            blocks: FastMap::default(),
            counters: TableCounters::default(),
            allocations: 0,
            deallocations: 0,
        }
    }
}

impl<X> BlockTable<X> {
    /// Enter a block handed out under `generation`; its handle.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert(
        &mut self,
        generation: Generation,
        ptr: u64,
        size: u64,
        held: u64,
        stream: StreamRef,
        tag: AllocTag,
        extra: X,
        ordinal: u32,
    ) -> BlockId {
        self.allocations += 1;
        let sequence = self.allocations;
        debug_assert!(ptr % 2 == 0, "a block address is aligned: {ptr:#x}");
        let old = self.blocks.insert(Key::of(ptr, generation), Record { generation, ptr, size, held, stream, tag, sequence, extra });
        debug_assert!(old.is_none(), "two live blocks at {ptr:#x}");
        self.counters.allocated(tag.index(), held);
        BlockId { ptr, size, generation, alloc_stream: stream.id, device: ordinal as i32 }
    }

    /// The record of `id`, checked against every field of the handle;
    /// `None` when its generation is not in this table.
    #[inline]
    pub(crate) fn get(&self, id: &BlockId, ordinal: u32) -> Option<ResourceResult<&Record<X>>> {
        let rec = match self.blocks.get(&Key::of(id.ptr, id.generation)) {
            Some(rec) if rec.generation == id.generation => rec,
            // Not at the handle's address: a freed block (the address may
            // hold another by now), or a handle whose address is wrong.
            _ => self.blocks.values().find(|rec| rec.generation == id.generation)?,
        };
        Some(check_matches(id, rec.ptr, rec.size, rec.stream.id, ordinal).map(|()| rec))
    }

    /// The record of `id`, unchecked (the caller checked the handle under
    /// the same lock).
    #[inline]
    pub(crate) fn get_mut(&mut self, id: &BlockId) -> Option<&mut Record<X>> {
        self.blocks.get_mut(&Key::of(id.ptr, id.generation)).filter(|rec| rec.generation == id.generation)
    }

    /// Take the record of `id` (checked) out, counting the free.
    #[inline]
    pub(crate) fn remove(&mut self, id: &BlockId) -> Option<Record<X>> {
        let Entry::Occupied(entry) = self.blocks.entry(Key::of(id.ptr, id.generation)) else { return None };
        if entry.get().generation != id.generation {
            return None;
        }
        let rec = entry.remove();
        self.counters.freed(rec.tag.index(), rec.held);
        self.deallocations += 1;
        Some(rec)
    }

    pub(crate) fn len(&self) -> u64 {
        self.blocks.len() as u64
    }

    /// The live blocks of device memory allocated on `stream` (a block of
    /// 0 bytes holds none, and its free touches no stream): how many, and
    /// their bytes.
    pub(crate) fn on_stream(&self, stream: StreamId) -> (u64, u64) {
        self.blocks
            .values()
            .filter(|r| r.stream.id == stream && r.held > 0)
            .fold((0, 0), |(n, bytes), r| (n + 1, bytes + r.size))
    }

    pub(crate) fn allocations(&self) -> u64 {
        self.allocations
    }

    pub(crate) fn deallocations(&self) -> u64 {
        self.deallocations
    }

    /// Every live block, as leak reports and the live-block list show it.
    pub(crate) fn live_blocks(&self, ordinal: u32, out: &mut Vec<LeakedBlock>) {
        out.extend(self.blocks.values().map(|r| LeakedBlock {
            id: BlockId { ptr: r.ptr, size: r.size, generation: r.generation, alloc_stream: r.stream.id, device: ordinal as i32 },
            tag: r.tag.name(),
            tag_id: r.tag,
            held: r.held,
            sequence: r.sequence,
            allocations_since: self.allocations - r.sequence,
        }));
    }

    pub(crate) fn reset_peak(&mut self) {
        self.counters.reset_peak();
    }

    pub(crate) fn count_tags(&self, out: &mut CountSummary) {
        self.counters.add_to(out);
    }
}

pub(crate) fn stale(id: &BlockId) -> ResourceError {
    ResourceError::UseAfterFree {
        generation: id.generation,
        ptr: id.ptr,
        detail: "the block was freed, or the generation was never issued by this runtime".into(),
    }
}

/// A handle whose generation is live must also agree on everything else; a
/// mismatch means the caller forged or corrupted it.
pub(crate) fn check_matches(
    id: &BlockId,
    ptr: u64,
    size: u64,
    stream: StreamId,
    ordinal: u32,
) -> ResourceResult<()> {
    if id.ptr != ptr || id.size != size || id.alloc_stream != stream || id.device != ordinal as i32 {
        return Err(ResourceError::InvalidArgument(format!(
            "block handle (ptr {:#x}, size {}, stream {}, device {}) does not match live block \
             generation {} (ptr {ptr:#x}, size {size}, stream {stream}, device {ordinal})",
            id.ptr, id.size, id.alloc_stream, id.device, id.generation
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(blocks: &[(u64, u64)]) -> (BlockTable<()>, Vec<BlockId>) {
        let mut t = BlockTable::default();
        let stream = StreamRef { id: StreamId(1), raw: 1 };
        let ids = blocks.iter().map(|&(ptr, g)| t.insert(Generation(g), ptr, ptr / 2, ptr / 2, stream, AllocTag::UNTAGGED, (), 0)).collect();
        (t, ids)
    }

    #[test]
    fn a_freed_blocks_handle_is_not_the_new_block_at_its_address() {
        let (mut t, ids) = table_with(&[(0x1000, 1)]);
        assert!(t.remove(&ids[0]).is_some());
        let stream = StreamRef { id: StreamId(1), raw: 1 };
        let again = t.insert(Generation(2), 0x1000, 0x800, 0x800, stream, AllocTag::UNTAGGED, (), 0);
        assert!(t.get(&ids[0], 0).is_none(), "the old generation is not here: stale, not the new block");
        assert!(t.get_mut(&ids[0]).is_none() && t.remove(&ids[0]).is_none());
        assert_eq!(t.get(&again, 0).unwrap().unwrap().generation, Generation(2));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_live_generation_with_a_wrong_address_is_a_mismatch_not_a_stale_handle() {
        let (t, ids) = table_with(&[(0x1000, 1), (0x2000, 2)]);
        let mut forged = ids[0];
        forged.ptr = 0x2000; // another live block's address
        assert!(matches!(t.get(&forged, 0), Some(Err(ResourceError::InvalidArgument(_)))));
        forged.ptr = 0x9000; // no block's address
        assert!(matches!(t.get(&forged, 0), Some(Err(ResourceError::InvalidArgument(_)))));
        forged.ptr = 0x0058_d58f_8f8f; // odd: no block's address can be
        assert!(matches!(t.get(&forged, 0), Some(Err(ResourceError::InvalidArgument(_)))));
        let (zeros, zero_ids) = table_with(&[(0, 5)]);
        let mut odd = zero_ids[0];
        odd.ptr = 5 << 1 | 1; // the 0-byte block's key, before rotation
        assert!(matches!(zeros.get(&odd, 0), Some(Err(ResourceError::InvalidArgument(_)))), "found, and refused");
    }

    #[test]
    fn zero_byte_blocks_share_address_zero() {
        let (mut t, ids) = table_with(&[(0, 1), (0, 2), (0x1000, 3)]);
        assert_eq!(t.len(), 3);
        for id in &ids {
            assert_eq!(t.get(id, 0).unwrap().unwrap().generation, id.generation);
        }
        assert!(t.remove(&ids[1]).is_some());
        assert!(t.get(&ids[1], 0).is_none());
        assert!(t.get(&ids[0], 0).unwrap().is_ok(), "the other 0-byte block stays");
    }
}
