//! Stream tracking of the pool's blocks: prepare (the waits a use needs)
//! and finish (the event recorded after it), one block or a launch's list,
//! with the launch cache (`launch_cache.rs`) and deferred records
//! (`deferred_record.rs`) on the repeated-launch path.
//!
//! Contract (DESIGN.md "Semantics"): prepare queues on the use's stream a
//! GPU-side wait for each recorded use it must follow (`block.rs`), after
//! the capture rules (`capture.rs`) admitted them; a block used for the
//! first time on a stream other than its allocation stream first gets a
//! fence recorded on that allocation stream. On any error nothing changes
//! (waits already queued only delay the stream). finish records one event
//! for the whole call (from the shard's slab when every block lives in one
//! shard, else from the shared slab) and records it as each block's use.
//! Every call is refused once `close_launches` ran.
//!
//! Locks: the table shards a call touches, in ascending index order (taken
//! once, through `launch_shard`/`lock_shards`), → the shared slab. No lock
//! is held across a blocking wait (none happens here).

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::block::{Use, WaitList};
use super::table::{shard_index, LockedShards, TableShard, TABLE_SHARDS};
use super::{lock, AsyncPool};
use crate::device::{RawEvent, RawStream};
use crate::inline_list::InlineList;
use crate::resource::{Access, BlockId, BlockUse, ResourceError, ResourceResult, StreamId, StreamRef, StreamTracking};
use crate::resources::event_slab::{Ev, Events, SharedSlab};
use crate::resources::launch_cache::{self, Remembered, Seen};

impl AsyncPool {
    pub(super) fn launch_open(&self) -> ResourceResult<()> {
        if self.launches_closed.load(Ordering::Acquire) {
            return Err(ResourceError::runtime_closed());
        }
        Ok(())
    }

    /// A launch call's shard: refused once `close_launches` ran. Everything
    /// a launch call does with a stream or an event happens while it holds
    /// this lock, so close, which takes every shard lock once after setting
    /// the flag, never tears down what a launch call still uses.
    pub(super) fn launch_shard(&self, stream: StreamId) -> ResourceResult<MutexGuard<'_, TableShard>> {
        self.launch_shard_at(shard_index(stream))
    }

    pub(super) fn launch_shard_at(&self, shard: usize) -> ResourceResult<MutexGuard<'_, TableShard>> {
        let guard = lock(&self.table[shard]);
        self.launch_open()?;
        Ok(guard)
    }

    /// This thread's last launch (`launch_cache.rs`), when `uses` names its
    /// blocks and nothing changed in their shard since: the stream it ran
    /// on and what was remembered. Otherwise the shard where this thread
    /// owes a record, if it does (`deferred_record.rs`).
    pub(super) fn remembered(&self, uses: &[BlockUse]) -> Result<(RawStream, Remembered), Option<usize>> {
        match launch_cache::lookup(self.id, uses) {
            Seen::Same(ran_on, r) if self.shard_live[r.shard].version() == r.version => Ok((ran_on, r)),
            Seen::Same(_, r) => Err(r.owed.then_some(r.shard)),
            Seen::Other { owed_in } => Err(owed_in),
        }
    }

    /// This thread moves on to another launch: the record it owes in
    /// `shard` is made now, before that launch's work is queued, so that
    /// it stands exactly where the repeated launch ended. A failure leaves
    /// it owed; whoever needs it then settles it and reports.
    pub(super) fn pay_owed_record(&self, shard: usize) {
        launch_cache::paid();
        if let Ok(mut guard) = self.launch_shard_at(shard) {
            let _ = guard.events.settle(&*self.device);
        }
    }

    /// A prepare: the launch cache's when it applies, else `uncached`;
    /// after a successful uncached one, the record this thread owes for
    /// its previous launch is made (a refused call records nothing).
    pub(super) fn prepare_with(
        &self,
        stream: RawStream,
        uses: &[BlockUse],
        uncached: impl FnOnce() -> ResourceResult<()>,
    ) -> ResourceResult<()> {
        match self.cached_prepare(stream, uses) {
            Ok(done) => done,
            Err(owed_in) => {
                uncached()?;
                if let Some(shard) = owed_in {
                    self.pay_owed_record(shard);
                }
                Ok(())
            }
        }
    }

    /// The launch cache's prepare: on the remembered launch's stream
    /// nothing to wait for (no lock); on another, the one wait for its
    /// event, queued under the shard lock (the version checked again
    /// there, the event's owed record made first). `Err`: take the full
    /// path, with the shard where this thread owes a record, if any.
    pub(super) fn cached_prepare(&self, stream: RawStream, uses: &[BlockUse]) -> Result<ResourceResult<()>, Option<usize>> {
        let (ran_on, r) = self.remembered(uses)?;
        if ran_on == stream {
            return Ok(self.launch_open());
        }
        let owed_in = r.owed.then_some(r.shard);
        if self.captures.any_active() {
            return Err(owed_in);
        }
        let mut guard = match self.launch_shard_at(r.shard) {
            Ok(guard) => guard,
            Err(e) => return Ok(Err(e)),
        };
        if self.shard_live[r.shard].version() != r.version {
            return Err(owed_in);
        }
        let events = &mut guard.events;
        if let Err(e) = events.settle(&*self.device) {
            return Ok(Err(e));
        }
        let waited = self.device.stream_wait_event(stream, events.raw(r.event));
        drop(guard);
        Ok(match waited {
            Ok(()) => {
                self.waits.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(e.into()),
        })
    }

    /// The launch cache's finish, holding the lock of the launch's shard
    /// `home`, given `remembered` read under that lock, when `uses` is that
    /// launch again with every use a write and no capture active. On its
    /// stream: the event's record is owed, not made. On another stream:
    /// the blocks' last write moves there with the same event, its record
    /// there owed. `None`: take the full path.
    pub(super) fn cached_finish(
        &self,
        remembered: Option<(RawStream, Remembered)>,
        home: usize,
        shard: &mut TableShard,
        stream: RawStream,
        uses: &[BlockUse],
    ) -> Option<ResourceResult<()>> {
        let (ran_on, r) = remembered?;
        if !uses.iter().all(|u| u.access.writes()) || self.captures.any_active() {
            return None;
        }
        let TableShard { blocks, events, .. } = shard;
        if let Err(e) = events.defer(&*self.device, r.event, stream) {
            return Some(Err(e));
        }
        if ran_on == stream {
            if !r.owed {
                launch_cache::owes();
            }
            return Some(Ok(()));
        }
        // The unchanged version says each block is live, its handle
        // matches, and its only use is the launch on `ran_on` with this
        // event: only the stream moves.
        for u in uses {
            let last_write = blocks
                .get_mut(&u.block)
                .and_then(|rec| rec.extra.tracking.as_mut())
                .and_then(|t| t.last_write.as_mut())
                .expect("launch cache: the unchanged version keeps the launch's blocks and uses");
            last_write.stream = stream;
        }
        launch_cache::moved_to(stream, self.shard_live[home].touched());
        Some(Ok(()))
    }

    /// After a full finish of `uses` on `stream` in shard `shard` with
    /// `event` (held by these blocks only), which moved the shard to
    /// `version`: remember it when the launch cache may (every use a
    /// write, outside any capture).
    pub(super) fn remember_launch(&self, shard: usize, stream: RawStream, uses: &[BlockUse], event: Ev, capture: u64, version: u64) {
        if capture == 0 && uses.iter().all(|u| u.access.writes()) {
            launch_cache::remember(self.id, stream, uses, Remembered { shard, version, event, owed: false });
        }
    }

    /// Make every owed record (`deferred_record.rs`); the first failure
    /// is returned, its record still owed.
    pub(super) fn settle_all(&self) -> ResourceResult<()> {
        self.table.iter().try_for_each(|shard| lock(shard).events.settle(&*self.device))
    }

    /// Queue on `stream` a wait for each event (already deduplicated). The
    /// caller holds the shard lock of the blocks that hold these events.
    pub(super) fn wait_all(&self, stream: RawStream, list: &[(RawEvent, u64)]) -> ResourceResult<()> {
        for &(ev, _) in list {
            self.device.stream_wait_event(stream, ev)?;
            self.waits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// prepare's slow path: blocks used for the first time on a stream
    /// other than their allocation stream. One event is recorded on each of
    /// those allocation streams (all of them, and the capture rules applied
    /// to them, before any block changes, so a failure leaves every block as
    /// it was); it counts as the block's first write, and `stream` (of
    /// capture `capture`, 0: none) waits for it.
    pub(super) fn fence_first_uses(
        &self,
        shards: &mut LockedShards<'_>,
        capture: u64,
        uses: &[BlockUse],
        first_use_streams: &mut InlineList<RawStream, 8>,
        waits: &mut WaitList,
    ) -> ResourceResult<()> {
        first_use_streams.sort_dedup();
        let mut captures_of: InlineList<u64, 8> = InlineList::new();
        for &s in first_use_streams.as_slice() {
            captures_of.push(self.capture_of(s)?);
        }
        // Fences come from the shared slab: their blocks may span shards.
        let mut shared = SharedSlab::new(&self.events);
        let mut fences: InlineList<(RawStream, Ev), 8> = InlineList::new();
        let mut fence_waits = WaitList::new();
        let release = |events: &mut Events, fences: &InlineList<(RawStream, Ev), 8>| {
            for &(_, ev) in fences.as_slice() {
                events.release(ev);
            }
        };
        for (k, &s) in first_use_streams.as_slice().iter().enumerate() {
            let events = shared.get();
            match events.record(&*self.device, s) {
                Ok(ev) => {
                    fences.push((s, ev));
                    fence_waits.push((events.raw(ev), captures_of.as_slice()[k]));
                }
                Err(e) => {
                    release(events, &fences);
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.admit_waits(capture, &mut fence_waits) {
            release(shared.get(), &fences);
            return Err(e);
        }
        for u in uses {
            let TableShard { blocks, events: local, .. } = shards.get(&u.block);
            let rec = blocks.get_mut(&u.block).expect("validated by prepare");
            if rec.extra.tracking.is_some() {
                continue;
            }
            let alloc_stream = rec.stream.raw;
            if let Some(k) = fences.as_slice().iter().position(|(s, _)| *s == alloc_stream) {
                let event = fences.as_slice()[k].1;
                let raw = shared.get().raw(event);
                let fence = Use { stream: alloc_stream, event, raw, capture: captures_of.as_slice()[k], shared: true };
                rec.record_use(local, &mut shared, Access::Write, fence);
            }
        }
        release(shared.get(), &fences);
        // Outside work first: a stream that waits on a capture's event joins
        // that capture, and may then wait on nothing outside it.
        let mut all = WaitList::new();
        for &w in waits.as_slice().iter().chain(fence_waits.as_slice()) {
            if w.1 == 0 {
                all.push(w);
            }
        }
        for &w in waits.as_slice().iter().chain(fence_waits.as_slice()) {
            if w.1 != 0 {
                all.push(w);
            }
        }
        *waits = all;
        Ok(())
    }

    /// Make `stream` wait (on the GPU) for everything queued on `owner` so
    /// far: one event recorded on `owner`, one wait.
    pub(super) fn fence_after(&self, owner: RawStream, stream: RawStream) -> ResourceResult<()> {
        let mut events = lock(&self.events);
        let ev = events.record(&*self.device, owner)?;
        let waited = self.device.stream_wait_event(stream, events.raw(ev));
        events.release(ev);
        waited?;
        self.waits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Lock the table shards that `uses` touch, in ascending order; refused
    /// once `close_launches` ran (see `launch_shard`).
    pub(super) fn lock_shards(&self, uses: &[BlockUse]) -> ResourceResult<LockedShards<'_>> {
        let mut mask = 0u64;
        for u in uses {
            mask |= 1 << shard_index(u.block.alloc_stream);
        }
        let locked = if mask.count_ones() <= 1 {
            let i = mask.trailing_zeros() as usize % TABLE_SHARDS;
            LockedShards::One(i, lock(&self.table[i]))
        } else {
            let mut list = Vec::with_capacity(mask.count_ones() as usize);
            while mask != 0 {
                let i = mask.trailing_zeros() as usize;
                list.push((i, lock(&self.table[i])));
                mask &= mask - 1;
            }
            LockedShards::Many(list)
        };
        self.launch_open()?;
        Ok(locked)
    }

    /// One block's prepare without the launch cache.
    pub(super) fn prepare_one_uncached(&self, block: &BlockId, use_stream: StreamRef, access: Access) -> ResourceResult<()> {
        // The launch path's common case, one lock and no list: a block whose
        // recorded uses are all on this stream needs no wait.
        {
            let mut shard = self.launch_shard(block.alloc_stream)?;
            let TableShard { blocks, events, .. } = &mut *shard;
            match blocks.get(block, self.ordinal) {
                Some(Ok(rec)) => {
                    let first_foreign_use = rec.extra.tracking.is_none() && rec.size > 0 && rec.stream.raw != use_stream.raw;
                    if !first_foreign_use {
                        if rec.nothing_to_wait(use_stream.raw, access) {
                            return Ok(());
                        }
                        // Uses recorded outside any capture, none active:
                        // the waits are queued here, under this one lock,
                        // without a list (one block's uses never share an
                        // event). Anything about captures takes the full
                        // path, which applies their rules.
                        if !self.captures.any_active() && rec.outside_captures() {
                            events.settle(&*self.device)?;
                            let waited = rec.queue_waits(&*self.device, use_stream.raw, access);
                            self.waits.fetch_add(waited.0, Ordering::Relaxed);
                            return waited.1;
                        }
                    }
                }
                Some(Err(e)) => return Err(e),
                None => {
                    drop(shard);
                    return Err(self.not_live(block));
                }
            }
        }
        self.prepare_uncached(use_stream, &[BlockUse { block: *block, access }])
    }

    pub(super) fn finish_one(&self, block: &BlockId, use_stream: StreamRef, access: Access) -> ResourceResult<()> {
        let uses = [BlockUse { block: *block, access }];
        let home = shard_index(block.alloc_stream);
        let mut guard = self.launch_shard(block.alloc_stream)?;
        let remembered = self.remembered(&uses).ok().filter(|(_, r)| r.shard == home);
        if let Some(done) = self.cached_finish(remembered, home, &mut guard, use_stream.raw, &uses) {
            return done;
        }
        let TableShard { blocks, events, .. } = &mut *guard;
        let capture = self.capture_of(use_stream.raw)?;
        let rec = match blocks.get_mut(block) {
            Some(rec) => {
                crate::resources::block_table::check_matches(block, rec.ptr, rec.size, rec.stream.id, self.ordinal)?;
                rec
            }
            None => {
                drop(guard);
                return Err(self.not_live(block));
            }
        };
        // The event comes from this shard's slab: no second lock.
        let event = events.record(&*self.device, use_stream.raw)?;
        let raw = events.raw(event);
        let new_use = Use { stream: use_stream.raw, event, raw, capture, shared: false };
        rec.record_use(events, &mut SharedSlab::new(&self.events), access, new_use);
        events.release(event);
        let version = self.shard_live[home].touched();
        self.remember_launch(home, use_stream.raw, &uses, event, capture, version);
        Ok(())
    }

    pub(super) fn prepare_uncached(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
        let mut shards = self.lock_shards(uses)?;
        let capture = self.capture_of(stream.raw)?;
        // Blocks never used since allocation, now used on another stream:
        // the allocation is ordered on its own stream only (the memory may
        // come from a cache or pool whose previous owner's work is still
        // queued there), so the first foreign use must wait for that stream.
        let mut first_use_streams: InlineList<RawStream, 8> = InlineList::new();
        let mut waits = WaitList::new();
        for u in uses {
            let rec = match shards.get(&u.block).record(&u.block, self.ordinal) {
                Some(rec) => rec?,
                None => {
                    drop(shards);
                    return Err(self.not_live(&u.block));
                }
            };
            if rec.extra.tracking.is_none() {
                if rec.size > 0 && rec.stream.raw != stream.raw {
                    first_use_streams.push(rec.stream.raw);
                }
            } else {
                rec.waits_for(stream.raw, u.access, &mut waits);
            }
        }
        // One wait per distinct event: blocks finished by one launch share it.
        waits.sort_dedup();
        if !waits.is_empty() {
            shards.settle(&*self.device)?;
        }
        // The capture rules may refuse: before anything changes.
        self.admit_waits(capture, &mut waits)?;
        if !first_use_streams.is_empty() {
            self.fence_first_uses(&mut shards, capture, uses, &mut first_use_streams, &mut waits)?;
            for &i in shards.indices().as_slice() {
                self.shard_live[i].touched();
            }
        }
        self.wait_all(stream.raw, waits.as_slice())
    }

    pub(super) fn finish_many(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
        match uses {
            [] => return Ok(()),
            [u] => return self.finish_one(&u.block, stream, u.access),
            _ => {}
        }
        let mut shards = self.lock_shards(uses)?;
        // This thread's last launch over the same blocks, nothing changed
        // since (`launch_cache.rs`): its handles were checked then and are
        // still live and matching, so they are not checked again here.
        let mut checked = false;
        if let LockedShards::One(home, guard) = &mut shards {
            let remembered = self.remembered(uses).ok().filter(|(_, r)| r.shard == *home);
            if let Some(done) = self.cached_finish(remembered, *home, guard, stream.raw, uses) {
                return done;
            }
            checked = remembered.is_some();
        }
        let capture = self.capture_of(stream.raw)?;
        for u in uses.iter().filter(|_| !checked) {
            match shards.get(&u.block).record(&u.block, self.ordinal) {
                Some(rec) => {
                    rec?;
                }
                None => {
                    drop(shards);
                    return Err(self.not_live(&u.block));
                }
            }
        }
        // One event for the whole launch: from the shard's slab when every
        // block lives in one shard, else from the shared one.
        let mut shared = SharedSlab::new(&self.events);
        match &mut shards {
            LockedShards::One(home, guard) => {
                let home = *home;
                let TableShard { blocks, events, .. } = &mut **guard;
                let event = events.record(&*self.device, stream.raw)?;
                let raw = events.raw(event);
                let new_use = Use { stream: stream.raw, event, raw, capture, shared: false };
                for u in uses {
                    let rec = blocks.get_mut(&u.block).expect("validated above");
                    rec.record_use(events, &mut shared, u.access, new_use);
                }
                events.release(event);
                let version = self.shard_live[home].touched();
                self.remember_launch(home, stream.raw, uses, event, capture, version);
            }
            LockedShards::Many(_) => {
                let events = shared.get();
                let event = events.record(&*self.device, stream.raw)?;
                let new_use = Use { stream: stream.raw, event, raw: events.raw(event), capture, shared: true };
                for u in uses {
                    let TableShard { blocks, events: local, .. } = shards.get(&u.block);
                    let rec = blocks.get_mut(&u.block).expect("validated above");
                    rec.record_use(local, &mut shared, u.access, new_use);
                }
                shared.get().release(event);
                for &i in shards.indices().as_slice() {
                    self.shard_live[i].touched();
                }
            }
        }
        Ok(())
    }
}

impl StreamTracking for AsyncPool {
    fn supports_block_use_tracking(&self) -> bool {
        true
    }

    fn record_block_use(&self, block: &BlockId, use_stream: StreamRef) -> ResourceResult<()> {
        self.finish_block_use(block, use_stream, Access::Read)
    }

    fn prepare_block_use(&self, block: &BlockId, use_stream: StreamRef, access: Access) -> ResourceResult<()> {
        let uses = [BlockUse { block: *block, access }];
        self.prepare_with(use_stream.raw, &uses, || self.prepare_one_uncached(block, use_stream, access))
    }

    fn finish_block_use(&self, block: &BlockId, use_stream: StreamRef, access: Access) -> ResourceResult<()> {
        self.finish_one(block, use_stream, access)
    }

    fn prepare_block_uses(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
        self.prepare_with(stream.raw, uses, || self.prepare_uncached(stream, uses))
    }

    fn finish_block_uses(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
        self.finish_many(stream, uses)
    }

    fn close_launches(&self) {
        self.launches_closed.store(true, Ordering::SeqCst);
        for shard in self.table.iter() {
            drop(lock(shard));
        }
    }
}
