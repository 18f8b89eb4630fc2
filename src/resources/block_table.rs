//! `BlockTable`: the live blocks of one allocator's table (all of Direct,
//! one shard of the async pool), by generation, with their per-tag counts
//! and allocation sequence numbers.
//!
//! Contract: `insert` enters a block under a generation the caller took
//! (`Generation::next`, never reused) and counts it; `get` finds a handle's
//! record and checks that every field of the handle matches it (a
//! mismatch is a forged or corrupted handle: `InvalidArgument`), `None`
//! when the generation is not here (the caller says why: `stale`, or a
//! record in another table); `remove` takes a record out and counts the
//! free. What else an allocator keeps per block is its `X` (the pool's
//! use tracking; nothing for Direct).
//!
//! Locks: none; the owner's lock guards the table.

use crate::fast_hash::FastMap;
use crate::resource::{
    AllocTag, BlockId, Generation, LeakedBlock, ResourceError, ResourceResult, StreamId, StreamRef,
};
use crate::tag_counters::{CountSummary, TableCounters};

/// A live block's record.
pub(crate) struct Record<X> {
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

pub(crate) struct BlockTable<X> {
    blocks: FastMap<Generation, Record<X>>,
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
        self.blocks.insert(generation, Record { ptr, size, held, stream, tag, sequence, extra });
        self.counters.allocated(tag.index(), held);
        BlockId { ptr, size, generation, alloc_stream: stream.id, device: ordinal as i32 }
    }

    /// The record of `id`, checked against every field of the handle;
    /// `None` when its generation is not in this table.
    #[inline]
    pub(crate) fn get(&self, id: &BlockId, ordinal: u32) -> Option<ResourceResult<&Record<X>>> {
        let rec = self.blocks.get(&id.generation)?;
        Some(check_matches(id, rec.ptr, rec.size, rec.stream.id, ordinal).map(|()| rec))
    }

    /// The record of `generation`, unchecked (the caller checked its
    /// handle under the same lock).
    #[inline]
    pub(crate) fn get_mut(&mut self, generation: &Generation) -> Option<&mut Record<X>> {
        self.blocks.get_mut(generation)
    }

    /// Take the record of `generation` out, counting the free.
    #[inline]
    pub(crate) fn remove(&mut self, generation: &Generation) -> Option<Record<X>> {
        let rec = self.blocks.remove(generation)?;
        self.counters.freed(rec.tag.index(), rec.held);
        self.deallocations += 1;
        Some(rec)
    }

    pub(crate) fn len(&self) -> u64 {
        self.blocks.len() as u64
    }

    pub(crate) fn allocations(&self) -> u64 {
        self.allocations
    }

    pub(crate) fn deallocations(&self) -> u64 {
        self.deallocations
    }

    /// Every live block, as leak reports and the live-block list show it.
    pub(crate) fn live_blocks(&self, ordinal: u32, out: &mut Vec<LeakedBlock>) {
        out.extend(self.blocks.iter().map(|(g, r)| LeakedBlock {
            id: BlockId { ptr: r.ptr, size: r.size, generation: *g, alloc_stream: r.stream.id, device: ordinal as i32 },
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
