//! The pool's block table, sharded by allocation stream id.
//!
//! Contract: a block's record, the events of launches whose blocks all
//! live in one shard, and the cache its memory goes to when freed (pool
//! memory) live in the shard of its allocation stream id (`shard_index`),
//! so an allocation or a free takes one lock, and threads on different
//! streams (ids are handed out in sequence) rarely share one. `ShardLive`
//! keeps each shard's live bytes and a version readable without the lock.
//! A launch over blocks of several shards locks them in ascending index
//! order (`LockedShards`).
//!
//! Lock order: shards in ascending index order → the shared event slab.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::MutexGuard;

use super::block::{BlockRecord, UseState};
use crate::resources::event_slab::Events;
use crate::device::Device;
use crate::inline_list::InlineList;
use crate::resource::{BlockId, ResourceResult, StreamId};
use crate::resources::block_table::BlockTable;
use crate::resources::stream_cache::CacheShard;

/// Shards of the pool's state. A block's record and the cache its memory
/// goes to when freed live in the shard of its allocation stream id, so an
/// allocation or a free takes one lock, and threads on different streams
/// (stream ids are handed out in sequence) rarely share one.
pub(super) const TABLE_SHARDS: usize = 32;

#[derive(Default)]
pub(super) struct TableShard {
    pub(super) blocks: BlockTable<UseState>,
    /// Events of the uses recorded by launches whose blocks all live in
    /// this shard: such a launch takes no lock but this shard's.
    pub(super) events: Events,
    pub(super) cache: CacheShard,
}

/// Live device bytes of one shard and its version, on a cache line of
/// their own. Written only while holding that shard's lock (plain stores:
/// no read-modify-write on the hot path), read without it: live by the
/// hoarding bound, the version by the launch cache (`launch_cache.rs`).
#[repr(align(64))]
#[derive(Default)]
pub(super) struct ShardLive {
    live: AtomicU64,
    /// Moves with every change of a block's liveness or recorded uses.
    version: AtomicU64,
}

impl ShardLive {
    /// Only under the lock of the shard this counts.
    pub(super) fn add(&self, delta: i64) {
        let now = self.live.load(Ordering::Relaxed);
        self.live.store(now.wrapping_add_signed(delta), Ordering::Relaxed);
    }

    /// Only under the lock of this shard: a block's liveness or uses
    /// changed. Returns the new version.
    pub(super) fn touched(&self) -> u64 {
        let v = self.version.load(Ordering::Relaxed) + 1;
        self.version.store(v, Ordering::Release);
        v
    }

    /// Read without the lock (approximate while blocks move).
    pub(super) fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    pub(super) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
}

pub(super) fn shard_index(stream: StreamId) -> usize {
    stream.0 as usize % TABLE_SHARDS
}


impl TableShard {
    /// The record of a handle whose shard this is; `None` when the
    /// generation is not here (the caller then works out why, see
    /// `AsyncPool::not_live`).
    pub(super) fn record(&self, id: &BlockId, ordinal: u32) -> Option<ResourceResult<&BlockRecord>> {
        self.blocks.get(id, ordinal)
    }
}

/// The table shards a launch touches, locked in ascending index order. A
/// launch whose blocks all come from one shard (one allocation stream, the
/// common case) takes one lock and no allocation.
pub(super) enum LockedShards<'a> {
    One(usize, MutexGuard<'a, TableShard>),
    Many(Vec<(usize, MutexGuard<'a, TableShard>)>),
}

impl LockedShards<'_> {
    /// The indices of the locked shards.
    pub(super) fn indices(&self) -> InlineList<usize, 8> {
        let mut out = InlineList::new();
        match self {
            LockedShards::One(i, _) => out.push(*i),
            LockedShards::Many(list) => list.iter().for_each(|(i, _)| out.push(*i)),
        }
        out
    }

    /// Make the records owed in the locked shards (`deferred_record.rs`):
    /// their events are about to be waited on.
    pub(super) fn settle(&mut self, device: &dyn Device) -> ResourceResult<()> {
        match self {
            LockedShards::One(_, g) => g.events.settle(device),
            LockedShards::Many(list) => list.iter_mut().try_for_each(|(_, g)| g.events.settle(device)),
        }
    }

    pub(super) fn get(&mut self, id: &BlockId) -> &mut TableShard {
        let want = shard_index(id.alloc_stream);
        match self {
            LockedShards::One(i, g) => {
                debug_assert_eq!(*i, want);
                g
            }
            LockedShards::Many(list) => {
                let k = list.binary_search_by_key(&want, |(i, _)| *i).expect("shard locked by lock_shards");
                &mut list[k].1
            }
        }
    }
}
