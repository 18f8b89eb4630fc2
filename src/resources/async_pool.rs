//! `AsyncPool`: stream-ordered allocation with per-block cross-stream use
//! tracking, over one of two memories: xlog's arena on the virtual-memory
//! API (`arena/`, the default where the device supports it: allocate and
//! free hand the block's memory to it, which charges the budget where it
//! creates pages), or the driver's pool with a per-stream cache of freed
//! blocks and deferred free/reap (`PoolOptions::arena` off, described
//! below from "Free" on).
//!
//! Tracking: every block keeps its last-write event and one outstanding
//! read event per stream (a later read on the same stream subsumes an
//! earlier one, because the stream runs in order).
//!
//! Free: the allocation stream S first waits on the recorded uses of other
//! streams (with either memory). With the arena, the memory then goes back
//! to it. With the cache on, it goes to S's
//! cache (`stream_cache.rs`): the generation dies, the bytes move from live
//! to cached and stay charged. With the cache off, the free is queued on S
//! and the bytes move to pending, as in the seed.
//!
//! Allocate (the pool): a fitting block of S's own cache (no driver call, no event:
//! stream order is the fence), else one of another stream T's cache with S
//! made to wait on an event recorded on T after the free (a GPU-side wait,
//! never a host wait), else the driver (xlog's own memory pool on CUDA),
//! after the gate (the budget above, if any) has allowed the growth.
//!
//! Pending frees (cache off, trim, pressure) accumulate unsealed per
//! stream; reap seals them with one event per stream and retires a batch
//! once its event has completed.
//!
//! Held memory: `outstanding = live + cached + pending` changes only when
//! the driver hands out memory and when reap sees a free complete, so the
//! hot path (a cache hit, a free into the cache) moves no shared total but
//! the live-bytes counter.
//!
//! Hoarding bound: a miss that would take the held memory (live + cached)
//! past the highest live total seen plus 1/16 first gives the coldest
//! cached blocks back to the driver (this stream's first, on the same
//! stream, so the driver can hand the memory straight to the request).
//! Workloads with stable shapes never miss after warm-up and never trim;
//! workloads whose shapes keep changing stay near their live peak instead
//! of caching every shape they ever saw.
//!
//! Locks and their order: a block table shard (several in ascending index
//! order for launches) → `events`; `pending` → `events`. Cache shards are
//! taken alone. No lock is held across a blocking wait.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::arena::{Arena, HeldBytes};
use super::deferred_record::DeferredRecord;
use super::launch_cache::{self, Remembered, Seen};
use super::logging::CsvLog;
use super::announced_pools::{AnnouncedPools, PoolKey, PoolRelease};
use super::capture_pool::CapturePools;
use super::stream_cache::{size_class, CacheShard, CacheTotals, CachedBlock};
use crate::device::{Device, RawEvent, RawStream};
use crate::fast_hash::FastMap;
use crate::inline_list::InlineList;
use crate::tag_counters::{CountSummary, TableCounters};
use crate::resource::{
    Access, AllocTag, BlockId, BlockState, BlockUse, ChargeGate, DeviceBlock,
    DeviceMemoryResource, Generation, LeakedBlock, ResourceError, ResourceResult, StreamId,
    StreamRef, Trimmed, Usage,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Index of an event in [`Events`].
type Ev = super::deferred_record::EventIndex;

struct EventSlot {
    raw: RawEvent,
    /// Holders: block uses, sealed batches, a call in progress.
    refs: u32,
}

/// Reusable events, all created with timing disabled, kept under the pool's
/// one lock: taking, sharing and returning an event is integer work, with
/// no allocation and no second lock on the hot path. An event goes back to
/// the free list when its last holder lets go.
#[derive(Default)]
struct Events {
    slots: Vec<EventSlot>,
    free: Vec<Ev>,
    recorded: u64,
    /// A repeated launch's record owed on a stream (`deferred_record.rs`).
    deferred: DeferredRecord,
}

impl Events {
    /// An event recorded on `stream`, held once by the caller. On failure
    /// nothing changes (a new event stays in the free list for later).
    fn record(&mut self, device: &dyn Device, stream: RawStream) -> ResourceResult<Ev> {
        let ev = match self.free.pop() {
            Some(ev) => ev,
            None => {
                let raw = device.create_event()?;
                self.slots.push(EventSlot { raw, refs: 0 });
                (self.slots.len() - 1) as Ev
            }
        };
        if let Err(e) = device.record_event(self.slots[ev as usize].raw, stream) {
            self.free.push(ev);
            return Err(e.into());
        }
        self.slots[ev as usize].refs = 1;
        self.recorded += 1;
        Ok(ev)
    }

    fn raw(&self, ev: Ev) -> RawEvent {
        self.slots[ev as usize].raw
    }

    fn hold(&mut self, ev: Ev) {
        self.slots[ev as usize].refs += 1;
    }

    fn release(&mut self, ev: Ev) {
        let slot = &mut self.slots[ev as usize];
        slot.refs -= 1;
        if slot.refs == 0 {
            self.deferred.forget(ev);
            self.free.push(ev);
        }
    }

    /// Owe the record of `ev` (held by a repeated launch's blocks only) on
    /// `stream` instead of making it now (`deferred_record.rs`); another
    /// owed record is made first. No driver call unless that one is.
    fn defer(&mut self, device: &dyn Device, ev: Ev, stream: RawStream) -> ResourceResult<()> {
        if self.deferred.is(ev, stream) {
            return Ok(());
        }
        self.settle(device)?;
        self.deferred.owe(ev, stream);
        Ok(())
    }

    /// Make the owed record, if any, before an event of this slab is waited
    /// on. On failure it stays owed and nothing changed.
    fn settle(&mut self, device: &dyn Device) -> ResourceResult<()> {
        if let Some((ev, stream)) = self.deferred.owed() {
            device.record_event(self.slots[ev as usize].raw, stream)?;
            self.recorded += 1;
            self.deferred.clear();
        }
        Ok(())
    }

    /// `settle` for callers that cannot report a failure, or whose stream
    /// is going away (`only_on`: settle only a record owed there): when
    /// the record fails, the stream is synchronised instead (contract).
    fn settle_or_sync(&mut self, device: &dyn Device, only_on: Option<RawStream>) {
        let Some((_, stream)) = self.deferred.owed() else { return };
        if only_on.is_some_and(|s| s != stream) {
            return;
        }
        if self.settle(device).is_err() {
            let _ = device.synchronize_stream(stream);
            self.deferred.clear();
        }
    }
}

/// The pool's shared event slab, locked only when a call needs it: a
/// launch whose blocks span several shards, the slow paths (fences, sealed
/// frees), and letting go of a use whose event came from it.
struct SharedSlab<'a> {
    mutex: &'a Mutex<Events>,
    guard: Option<MutexGuard<'a, Events>>,
}

impl<'a> SharedSlab<'a> {
    fn new(mutex: &'a Mutex<Events>) -> SharedSlab<'a> {
        SharedSlab { mutex, guard: None }
    }

    fn get(&mut self) -> &mut Events {
        let mutex = self.mutex;
        self.guard.get_or_insert_with(|| lock(mutex))
    }
}

/// The slab a use's event lives in: its block's shard (`local`) or the
/// shared one.
fn slab<'b>(local: &'b mut Events, shared: &'b mut SharedSlab<'_>, is_shared: bool) -> &'b mut Events {
    if is_shared {
        shared.get()
    } else {
        local
    }
}

/// One recorded use: the stream it ran on and the event after it. The
/// block holds a reference on the event, so while its shard is locked the
/// event cannot be re-recorded and `raw` can be waited on without any
/// events lock.
#[derive(Copy, Clone)]
struct Use {
    stream: RawStream,
    event: Ev,
    raw: RawEvent,
    /// The capture the event was recorded in (0: none).
    capture: u64,
    /// The event is in the pool's shared slab, not in the block's shard.
    shared: bool,
}

/// Events one call waits for (a launch rarely needs more than a few), each
/// with the capture it was recorded in (0: none).
type WaitList = InlineList<(RawEvent, u64), 16>;

/// Dependency state, allocated only for blocks that were ever used through
/// prepare/finish, to keep untracked records small.
#[derive(Default)]
struct Tracking {
    last_write: Option<Use>,
    readers: Vec<Use>,
}

struct BlockRecord {
    ptr: u64,
    size: u64,
    /// Device bytes (the size class).
    held: u64,
    stream: StreamRef,
    tag: AllocTag,
    /// Allocation sequence number (see `LeakedBlock::sequence`).
    sequence: u64,
    tracking: Option<Box<Tracking>>,
    /// The capture whose private memory this block is (0: none).
    capture: u64,
}

impl BlockRecord {
    /// Events `stream` must wait for before an access of kind `access`.
    fn waits_for(&self, stream: RawStream, access: Access, out: &mut WaitList) {
        // Blocks finished by one launch share its event: an event equal to
        // the last one listed is not listed again (sort_dedup catches the
        // rest), so a launch's list stays short.
        for u in self.foreign_uses(stream, access) {
            let item = (u.raw, u.capture);
            if out.as_slice().last() != Some(&item) {
                out.push(item);
            }
        }
    }

    /// The recorded uses a use of kind `access` on `stream` must wait for:
    /// the last write if another stream made it, and for a write every
    /// other stream's read.
    fn foreign_uses(&self, stream: RawStream, access: Access) -> impl Iterator<Item = &Use> {
        let t = self.tracking.as_deref();
        let write = t.and_then(|t| t.last_write.as_ref());
        let reads = t.filter(|_| access.writes()).map_or(&[][..], |t| &t.readers[..]);
        write.into_iter().chain(reads).filter(move |u| u.stream != stream)
    }

    /// Record `new_use` (its event held by the caller), which this block
    /// now holds too. `local` is the slab of this block's shard.
    fn record_use(&mut self, local: &mut Events, shared: &mut SharedSlab<'_>, access: Access, new_use: Use) {
        slab(local, shared, new_use.shared).hold(new_use.event);
        let t = self.tracking.get_or_insert_with(Default::default);
        let stream = new_use.stream;
        if access.writes() {
            if let Some(old) = t.last_write.replace(new_use) {
                slab(local, shared, old.shared).release(old.event);
            }
            for r in t.readers.drain(..) {
                slab(local, shared, r.shared).release(r.event);
            }
        } else if let Some(r) = t.readers.iter_mut().find(|r| r.stream == stream) {
            let old = std::mem::replace(r, new_use);
            slab(local, shared, old.shared).release(old.event);
        } else {
            t.readers.push(new_use);
        }
    }

    /// Let go of every event the block holds (it is being freed).
    fn release_tracking(&mut self, local: &mut Events, shared: &mut SharedSlab<'_>) {
        if let Some(t) = self.tracking.take() {
            for u in t.last_write.iter().chain(t.readers.iter()) {
                slab(local, shared, u.shared).release(u.event);
            }
        }
    }

    /// Whether every recorded use of the block was outside any capture.
    fn outside_captures(&self) -> bool {
        let Some(t) = &self.tracking else { return true };
        t.last_write.iter().chain(t.readers.iter()).all(|u| u.capture == 0)
    }

    /// Queue on `stream` the waits a use of kind `access` needs (no capture
    /// active, no use recorded in one): (how many were queued, the first
    /// error). Waits queued before a failing one are harmless (they only
    /// delay the stream).
    fn queue_waits(&self, device: &dyn Device, stream: RawStream, access: Access) -> (u64, ResourceResult<()>) {
        let mut queued = 0;
        for u in self.foreign_uses(stream, access) {
            if let Err(e) = device.stream_wait_event(stream, u.raw) {
                return (queued, Err(e.into()));
            }
            queued += 1;
        }
        (queued, Ok(()))
    }

    /// Whether a use of kind `access` on `stream` has nothing to wait for
    /// (the launch path's common case: no list to build).
    fn nothing_to_wait(&self, stream: RawStream, access: Access) -> bool {
        self.foreign_uses(stream, access).next().is_none()
    }
}

#[derive(Default)]
struct StreamPending {
    unsealed_bytes: u64,
    unsealed_blocks: u64,
    sealed: VecDeque<SealedBatch>,
}

struct SealedBatch {
    event: Ev,
    bytes: u64,
    blocks: u64,
}

#[derive(Default)]
struct PendingFrees {
    streams: FastMap<RawStream, StreamPending>,
    blocks: u64,
}

/// Shards of the pool's state. A block's record and the cache its memory
/// goes to when freed live in the shard of its allocation stream id, so an
/// allocation or a free takes one lock, and threads on different streams
/// (stream ids are handed out in sequence) rarely share one.
const TABLE_SHARDS: usize = 32;

#[derive(Default)]
struct TableShard {
    blocks: FastMap<Generation, BlockRecord>,
    /// Events of the uses recorded by launches whose blocks all live in
    /// this shard: such a launch takes no lock but this shard's.
    events: Events,
    /// Per-tag and total counts of this shard's blocks (`telemetry`).
    counters: TableCounters,
    cache: CacheShard,
    allocations: u64,
    deallocations: u64,
}

/// Live device bytes of one shard and its version, on a cache line of
/// their own. Written only while holding that shard's lock (plain stores:
/// no read-modify-write on the hot path), read without it: live by the
/// hoarding bound, the version by the launch cache (`launch_cache.rs`).
#[repr(align(64))]
#[derive(Default)]
struct ShardLive {
    live: AtomicU64,
    /// Moves with every change of a block's liveness or recorded uses.
    version: AtomicU64,
}

impl ShardLive {
    /// Only under the lock of the shard this counts.
    fn add(&self, delta: i64) {
        let now = self.live.load(Ordering::Relaxed);
        self.live.store(now.wrapping_add_signed(delta), Ordering::Relaxed);
    }

    /// Only under the lock of this shard: a block's liveness or uses
    /// changed. Returns the new version.
    fn touched(&self) -> u64 {
        let v = self.version.load(Ordering::Relaxed) + 1;
        self.version.store(v, Ordering::Release);
        v
    }

    fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
}

/// Pool identities for the launch cache (never reused, unlike addresses).
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

fn shard_index(stream: StreamId) -> usize {
    stream.0 as usize % TABLE_SHARDS
}

/// Every shard index, `home` first.
fn shards_from(home: usize) -> impl Iterator<Item = usize> {
    std::iter::once(home).chain((0..TABLE_SHARDS).filter(move |&i| i != home))
}

impl TableShard {
    /// The record of a handle whose shard this is; `None` when the
    /// generation is not here (the caller then works out why, see
    /// `AsyncPool::not_live`).
    fn record(&self, id: &BlockId, ordinal: u32) -> Option<ResourceResult<&BlockRecord>> {
        record_in(&self.blocks, id, ordinal)
    }
}

/// `TableShard::record` over the shard's block map alone (for a caller
/// that also needs the shard's slab).
fn record_in<'a>(
    blocks: &'a FastMap<Generation, BlockRecord>,
    id: &BlockId,
    ordinal: u32,
) -> Option<ResourceResult<&'a BlockRecord>> {
    let rec = blocks.get(&id.generation)?;
    Some(check_matches(id, rec.ptr, rec.size, rec.stream.id, ordinal).map(|()| rec))
}

/// The table shards a launch touches, locked in ascending index order. A
/// launch whose blocks all come from one shard (one allocation stream, the
/// common case) takes one lock and no allocation.
enum LockedShards<'a> {
    One(usize, MutexGuard<'a, TableShard>),
    Many(Vec<(usize, MutexGuard<'a, TableShard>)>),
}

impl LockedShards<'_> {
    /// The indices of the locked shards.
    fn indices(&self) -> InlineList<usize, 8> {
        let mut out = InlineList::new();
        match self {
            LockedShards::One(i, _) => out.push(*i),
            LockedShards::Many(list) => list.iter().for_each(|(i, _)| out.push(*i)),
        }
        out
    }

    /// Make the records owed in the locked shards (`deferred_record.rs`):
    /// their events are about to be waited on.
    fn settle(&mut self, device: &dyn Device) -> ResourceResult<()> {
        match self {
            LockedShards::One(_, g) => g.events.settle(device),
            LockedShards::Many(list) => list.iter_mut().try_for_each(|(_, g)| g.events.settle(device)),
        }
    }

    fn get(&mut self, id: &BlockId) -> &mut TableShard {
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

/// Behaviour switches of an [`AsyncPool`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    /// Keep freed blocks per stream for reuse (DESIGN.md "Stream-ordered
    /// caching"); off = every free goes to the driver, as in the seed.
    pub cache: bool,
    /// When the driver refuses memory: after giving the cache back, also
    /// wait for pending frees before failing.
    pub wait_on_pressure: bool,
    /// Take memory from xlog's own arena on the virtual-memory API
    /// (`arena/`, DESIGN.md "Physical memory") where the device supports
    /// it; off = the driver's pool with per-stream caches. Needs `cache`
    /// (off restores the seed's free-to-driver behaviour exactly).
    pub arena: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions { cache: true, wait_on_pressure: false, arena: true }
    }
}

/// Device granularity a block takes with the cache off (the alignment
/// every allocation gets).
const UNCACHED_GRANULARITY: u64 = 256;

/// The hoarding bound: a miss first gives back (up to the request's size,
/// at most `STALE_RELEASES_PER_MISS` blocks) cached blocks its stream has
/// not reused for `STALE_FREES` frees; past `HOARD_HARD_FACTOR` times the
/// live peak it gives back the coldest whatever their age, down to the
/// live peak plus 1/`HOARD_SLACK_DIV`.
const HOARD_SLACK_DIV: u64 = 16;
const HOARD_HARD_FACTOR: u64 = 2;
const STALE_FREES: u64 = 4096;
const STALE_RELEASES_PER_MISS: usize = 8;

pub struct AsyncPool {
    /// This pool's identity in the threads' launch caches.
    id: u64,
    device: Arc<dyn Device>,
    ordinal: u32,
    options: PoolOptions,
    table: Box<[Mutex<TableShard>]>,
    shard_live: Box<[ShardLive]>,
    /// Events not tied to one shard: launches over several shards, fences,
    /// sealed batches of pending frees.
    events: Mutex<Events>,
    pending: Mutex<PendingFrees>,
    /// live + cached + pending: the arena's pages, capture memory, and the
    /// driver pool's blocks (shared with the arena).
    held: Arc<HeldBytes>,
    pending_bytes: AtomicU64,
    /// xlog's own device memory (`arena/`), where the device supports it
    /// and `PoolOptions::arena` asks for it; else the driver's pool with the
    /// stream caches.
    arena: Option<Arena>,
    /// Highest live total seen at a miss (the hoarding bound's base).
    peak_live: AtomicU64,
    waits: AtomicU64,
    /// The runtime's CSV log, if any: `reserve`, `release` (from the
    /// cache) and `retire` rows.
    log: Option<Arc<CsvLog>>,
    /// Driver refusals retried after giving the cache back.
    retries: AtomicU64,
    /// Captures begun through the runtime and their private memory
    /// (`capture_pool.rs`).
    captures: CapturePools,
    /// Set by `close_launches`; read by launch calls under their shard
    /// locks (their close protocol, see `DeviceMemoryResource::close_launches`).
    launches_closed: AtomicBool,
    /// Captures a framework begins itself and announces
    /// (`announced_pools.rs`).
    announced: AnnouncedPools,
}


impl AsyncPool {
    pub fn new(device: Arc<dyn Device>) -> AsyncPool {
        AsyncPool::with_options(device, PoolOptions::default())
    }

    pub fn with_options(device: Arc<dyn Device>, options: PoolOptions) -> AsyncPool {
        let ordinal = device.ordinal().max(0) as u32;
        let held = Arc::new(HeldBytes::default());
        let arena = if options.arena && options.cache {
            Arena::new(device.clone(), held.clone(), options.wait_on_pressure)
        } else {
            None
        };
        AsyncPool {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            device,
            ordinal,
            options,
            table: (0..TABLE_SHARDS).map(|_| Mutex::default()).collect(),
            shard_live: (0..TABLE_SHARDS).map(|_| ShardLive::default()).collect(),
            events: Mutex::default(),
            pending: Mutex::default(),
            held,
            pending_bytes: AtomicU64::new(0),
            arena,
            peak_live: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            log: None,
            retries: AtomicU64::new(0),
            captures: CapturePools::default(),
            launches_closed: AtomicBool::new(false),
            announced: AnnouncedPools::default(),
        }
    }

    /// Write the driver traffic (`reserve`, `release`, `retire`) into `log`.
    pub fn with_log(mut self, log: Option<Arc<CsvLog>>) -> AsyncPool {
        if let Some(arena) = &mut self.arena {
            arena.set_log(log.clone());
        }
        self.log = log;
        self
    }

    pub fn options(&self) -> PoolOptions {
        self.options
    }

    fn shard(&self, stream: StreamId) -> MutexGuard<'_, TableShard> {
        lock(&self.table[shard_index(stream)])
    }

    /// A launch call's shard: refused once `close_launches` ran. Everything
    /// a launch call does with a stream or an event happens while it holds
    /// this lock, so close, which takes every shard lock once after setting
    /// the flag, never tears down what a launch call still uses.
    fn launch_shard(&self, stream: StreamId) -> ResourceResult<MutexGuard<'_, TableShard>> {
        self.launch_shard_at(shard_index(stream))
    }

    fn launch_shard_at(&self, shard: usize) -> ResourceResult<MutexGuard<'_, TableShard>> {
        let guard = lock(&self.table[shard]);
        self.launch_open()?;
        Ok(guard)
    }

    /// This thread's last launch (`launch_cache.rs`), when `uses` names its
    /// blocks and nothing changed in their shard since: the stream it ran
    /// on and what was remembered. Otherwise the shard where this thread
    /// owes a record, if it does (`deferred_record.rs`).
    fn remembered(&self, uses: &[BlockUse]) -> Result<(RawStream, Remembered), Option<usize>> {
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
    fn pay_owed_record(&self, shard: usize) {
        launch_cache::paid();
        if let Ok(mut guard) = self.launch_shard_at(shard) {
            let _ = guard.events.settle(&*self.device);
        }
    }

    /// A prepare: the launch cache's when it applies, else `uncached`;
    /// after a successful uncached one, the record this thread owes for
    /// its previous launch is made (a refused call records nothing).
    fn prepare_with(
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
    fn cached_prepare(&self, stream: RawStream, uses: &[BlockUse]) -> Result<ResourceResult<()>, Option<usize>> {
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
    fn cached_finish(
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
                .get_mut(&u.block.generation)
                .and_then(|rec| rec.tracking.as_mut())
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
    fn remember_launch(&self, shard: usize, stream: RawStream, uses: &[BlockUse], event: Ev, capture: u64, version: u64) {
        if capture == 0 && uses.iter().all(|u| u.access.writes()) {
            launch_cache::remember(self.id, stream, uses, Remembered { shard, version, event, owed: false });
        }
    }

    /// Make every owed record (`deferred_record.rs`); the first failure
    /// is returned, its record still owed.
    fn settle_all(&self) -> ResourceResult<()> {
        self.table.iter().try_for_each(|shard| lock(shard).events.settle(&*self.device))
    }

    fn launch_open(&self) -> ResourceResult<()> {
        if self.launches_closed.load(Ordering::Acquire) {
            return Err(ResourceError::runtime_closed());
        }
        Ok(())
    }

    /// Why a handle was not found in its shard: a live generation under
    /// another stream (a forged or corrupted handle), or a dead one. Takes
    /// the shard locks one at a time; call it holding none.
    fn not_live(&self, id: &BlockId) -> ResourceError {
        for shard in self.table.iter() {
            if let Some(Err(e)) = lock(shard).record(id, self.ordinal) {
                return e;
            }
        }
        stale(id)
    }

    /// Live device bytes, summed over the shards without their locks.
    fn live_now(&self) -> u64 {
        // A sum taken while blocks move is approximate, which is all the
        // hoarding bound needs.
        self.shard_live.iter().map(|l| l.live.load(Ordering::Relaxed)).sum()
    }

    /// Totals of every shard's cache.
    fn cache_totals(&self) -> CacheTotals {
        let mut t = CacheTotals::default();
        for shard in self.table.iter() {
            t.add(&lock(shard).cache.totals());
        }
        t
    }

    /// The largest cached block of any stream, taken out of its cache,
    /// with the stream and the shard it was cached in.
    fn take_largest(&self) -> Option<(RawStream, CachedBlock, usize)> {
        loop {
            let mut best: Option<(usize, RawStream, CachedBlock)> = None;
            for (i, shard) in self.table.iter().enumerate() {
                if let Some((s, b)) = lock(shard).cache.largest() {
                    if best.as_ref().map_or(true, |(_, _, cur)| b.bytes > cur.bytes) {
                        best = Some((i, s, b));
                    }
                }
            }
            let (i, stream, block) = best?;
            // Another thread may have taken it meanwhile: look again then.
            if lock(&self.table[i]).cache.remove(stream, &block) {
                return Some((stream, block, i));
            }
        }
    }

    /// The coldest block cached on `stream` (in any shard), taken out.
    fn take_coldest(&self, stream: RawStream, home: usize) -> Option<(CachedBlock, usize)> {
        shards_from(home).find_map(|i| lock(&self.table[i]).cache.take_coldest(stream).map(|b| (b, i)))
    }

    /// Queue on `stream` a wait for each event (already deduplicated). The
    /// caller holds the shard lock of the blocks that hold these events.
    fn wait_all(&self, stream: RawStream, list: &[(RawEvent, u64)]) -> ResourceResult<()> {
        for &(ev, _) in list {
            self.device.stream_wait_event(stream, ev)?;
            self.waits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Seal `p`'s unsealed frees (on `stream`) with one event.
    fn seal(&self, events: &mut Events, stream: RawStream, p: &mut StreamPending) -> ResourceResult<()> {
        // Never on a capturing stream: the event would be part of the graph,
        // and reap could not query it. Its frees wait for the capture's end.
        if p.unsealed_blocks > 0 && self.capture_of(stream)? != 0 {
            return Ok(());
        }
        if p.unsealed_blocks > 0 {
            let event = events.record(&*self.device, stream)?;
            p.sealed.push_back(SealedBatch { event, bytes: p.unsealed_bytes, blocks: p.unsealed_blocks });
            p.unsealed_bytes = 0;
            p.unsealed_blocks = 0;
        }
        Ok(())
    }

    /// The capture `stream` takes part in (0: none). Asks the driver only
    /// while a capture begun through the runtime (or adopted) is active, or
    /// an announced one is awaited; a capture met for the first time may be
    /// adopted for an announcement then (`announced_pools.rs`).
    #[inline]
    fn capture_of(&self, stream: RawStream) -> ResourceResult<u64> {
        if !self.captures.any_active() {
            return Ok(0);
        }
        let capture = self.device.capture_of(stream)?.unwrap_or(0);
        if capture != 0 {
            self.announced.adopt(capture, stream, &*self.device, &self.captures);
        }
        Ok(capture)
    }

    /// Give back the memory of released announced pools whose blocks are
    /// all free (`CapturePools::take_ready_orphans`). Never while a capture
    /// is active or awaited: the synchronous free would wait for the device.
    /// Returns the bytes given back.
    fn release_ready_orphans(&self) -> u64 {
        if self.captures.any_active() {
            return 0;
        }
        let mut released = 0;
        for (_, blocks) in self.captures.take_ready_orphans() {
            for (ptr, bytes) in blocks {
                // A failed free leaves the bytes held (and charged): a
                // leak xlog reports in the stats rather than a double free.
                released += self.give_back_captured(ptr, bytes).unwrap_or(0);
            }
        }
        released
    }

    /// Memory of a capture pool no graph uses any more: an arena block goes
    /// back to its region (still held), a capture's own memory to the
    /// driver. Returns the bytes the device no longer holds.
    fn give_back_captured(&self, ptr: u64, bytes: u64) -> ResourceResult<u64> {
        if let Some(arena) = self.arena.as_ref().filter(|a| a.contains(ptr)) {
            arena.free(ptr, bytes, None);
            return Ok(0);
        }
        self.device.free_sync(ptr)?;
        self.held.sub(bytes);
        Ok(bytes)
    }

    /// Apply the capture rules to the events a stream of capture `waiting`
    /// (0: none) is about to wait for (DESIGN: "Stream capture"):
    /// - outside work, for a capturing stream: dropped once complete (the
    ///   graph's replays run later), refused while it runs (a capture cannot
    ///   wait on work outside it);
    /// - work of an active capture, for a non-capturing stream: kept, last
    ///   (the stream joins that capture: CUDA's fork); for a stream of
    ///   another capture: refused;
    /// - work of an ended capture: dropped (a graph's replays are ordered
    ///   by the stream that launches it).
    fn admit_waits(&self, waiting: u64, waits: &mut WaitList) -> ResourceResult<()> {
        if waiting == 0 && waits.as_slice().iter().all(|&(_, c)| c == 0) {
            return Ok(());
        }
        let mut outside = WaitList::new();
        let mut captured = WaitList::new();
        for &(ev, c) in waits.as_slice() {
            if c == waiting {
                if c == 0 {
                    outside.push((ev, c));
                } else {
                    captured.push((ev, c));
                }
            } else if c == 0 {
                if !self.device.event_query(ev)? {
                    return Err(ResourceError::StreamMisuse(format!(
                        "a stream of capture {waiting} cannot wait on work queued outside the capture \
                         that has not completed (a capture cannot depend on work outside it): \
                         synchronize that work before beginning the capture"
                    )));
                }
            } else if self.captures.is_active(c) {
                if waiting != 0 {
                    return Err(ResourceError::StreamMisuse(format!(
                        "the block was last used inside capture {c}, still capturing; a stream of \
                         capture {waiting} cannot wait on another capture's work"
                    )));
                }
                captured.push((ev, c));
            }
        }
        for &w in captured.as_slice() {
            outside.push(w);
        }
        *waits = outside;
        Ok(())
    }

    /// A block for `bytes` (`class` device bytes) on `stream`, which
    /// takes part in capture `capture`: from that capture's private memory.
    fn allocate_in_capture(
        &self,
        bytes: u64,
        class: u64,
        stream: StreamRef,
        tag: AllocTag,
        gate: &dyn ChargeGate,
        capture: u64,
    ) -> ResourceResult<DeviceBlock> {
        let ptr = match self.captures.take(capture, stream.raw, class) {
            Some(ptr) => ptr,
            None => {
                gate.try_charge(class)?;
                let ptr = self.device.alloc_sync(class).map_err(|e| {
                    gate.uncharge(class);
                    match ResourceError::from(e) {
                        ResourceError::OutOfMemory { detail, .. } => ResourceError::OutOfMemory { requested: bytes, detail },
                        other => other,
                    }
                })?;
                self.held.add(class);
                self.captures.add_live(capture);
                ptr
            }
        };
        let mut shard = self.shard(stream.id);
        let block = self.register_in(&mut shard, ptr, bytes, class, stream, tag);
        if let Some(rec) = shard.blocks.get_mut(&block.id.generation) {
            rec.capture = capture;
        }
        Ok(block)
    }

    /// Enter a block just handed out (by a cache or the driver) in `shard`,
    /// the shard of its stream.
    fn register_in(
        &self,
        shard: &mut TableShard,
        ptr: u64,
        bytes: u64,
        held: u64,
        stream: StreamRef,
        tag: AllocTag,
    ) -> DeviceBlock {
        let generation = Generation::next();
        let sequence = shard.allocations + 1;
        shard.blocks.insert(generation, BlockRecord { ptr, size: bytes, held, stream, tag, sequence, tracking: None, capture: 0 });
        self.shard_live[shard_index(stream.id)].add(held as i64);
        shard.counters.allocated(tag.index(), held);
        shard.allocations += 1;
        let id = BlockId { ptr, size: bytes, generation, alloc_stream: stream.id, device: self.ordinal as i32 };
        DeviceBlock { id, tag, state: BlockState::Live, held }
    }

    /// Queue the free of `ptr` (`bytes` held) on `stream`; the bytes become
    /// pending (still held) until reap sees the free complete.
    fn free_to_driver(&self, stream: RawStream, ptr: u64, bytes: u64) -> ResourceResult<()> {
        let mut pending = lock(&self.pending);
        self.device.free_async(ptr, stream)?;
        let p = pending.streams.entry(stream).or_default();
        p.unsealed_bytes += bytes;
        p.unsealed_blocks += 1;
        pending.blocks += 1;
        self.pending_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Give a block taken out of the cache back to the driver; on failure
    /// it goes back into the cache, unchanged.
    fn release_cached(&self, stream: RawStream, block: CachedBlock, home: usize) -> ResourceResult<u64> {
        match self.free_to_driver(stream, block.ptr, block.bytes) {
            Ok(()) => {
                if let Some(log) = &self.log {
                    log.released(block.ptr, block.bytes);
                }
                Ok(block.bytes)
            }
            Err(e) => {
                lock(&self.table[home]).cache.put(stream, block.ptr, block.bytes);
                Err(e)
            }
        }
    }

    /// Give cached blocks back, largest and coldest first, until `need`
    /// bytes went back or the cache is empty. Returns the bytes released.
    fn release_largest(&self, need: u64) -> ResourceResult<u64> {
        // While a capture is active nothing cached goes back to the driver:
        // a free queued on a capturing stream would become part of a graph.
        if self.captures.any_active() {
            return Ok(0);
        }
        let mut released = 0;
        while released < need {
            let Some((stream, block, shard)) = self.take_largest() else { break };
            released += self.release_cached(stream, block, shard)?;
        }
        Ok(released)
    }

    /// Retire completed pending frees; the bytes leave `held`.
    fn reap_now(&self) -> ResourceResult<u64> {
        if self.pending_bytes.load(Ordering::Acquire) == 0 {
            return Ok(0);
        }
        let mut pending = lock(&self.pending);
        let pending = &mut *pending;
        let mut events = lock(&self.events);
        let (mut bytes, mut blocks) = (0u64, 0u64);
        let mut first_error = None;
        for (&stream, p) in pending.streams.iter_mut() {
            if let Err(e) = self.seal(&mut events, stream, p) {
                first_error.get_or_insert(e);
            }
            // Batches of one stream complete in order: stop at the first
            // that is still running.
            while let Some(batch) = p.sealed.front() {
                match self.device.event_query(events.raw(batch.event)) {
                    Ok(true) => {
                        bytes += batch.bytes;
                        blocks += batch.blocks;
                        events.release(batch.event);
                        p.sealed.pop_front();
                    }
                    Ok(false) => break,
                    Err(e) => {
                        first_error.get_or_insert(e.into());
                        break;
                    }
                }
            }
        }
        pending.streams.retain(|_, p| p.unsealed_blocks > 0 || !p.sealed.is_empty());
        pending.blocks -= blocks;
        self.pending_bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.held.sub(bytes);
        if bytes > 0 {
            if let Some(log) = &self.log {
                log.retired(bytes, blocks);
            }
        }
        match first_error {
            Some(e) if bytes == 0 => Err(e),
            _ => Ok(bytes),
        }
    }

    /// Reap, telling the gate what left.
    fn reap_into(&self, gate: &dyn ChargeGate) {
        if let Ok(bytes) = self.reap_now() {
            gate.uncharge(bytes);
        }
    }

    /// The hoarding bound (module docs): before growing by `class` on
    /// `stream`, give back cold cached blocks if held would pass the live
    /// peak plus slack.
    fn bound_hoard(&self, class: u64, stream: StreamRef) {
        if self.captures.any_active() {
            return; // see release_largest
        }
        let home = shard_index(stream.id);
        // Blocks this stream has not reused for a while go back first, up
        // to the request's size: a steady loop reuses its whole cache every
        // step and keeps it; shapes that stopped coming are released (on
        // this stream, so the driver's pool can serve this very request
        // from them).
        let mut released = 0;
        for _ in 0..STALE_RELEASES_PER_MISS {
            if released >= class {
                break;
            }
            let Some(block) = lock(&self.table[home]).cache.take_stale(stream.raw, STALE_FREES) else { break };
            match self.release_cached(stream.raw, block, home) {
                Ok(bytes) => released += bytes,
                Err(_) => return,
            }
        }
        let live = self.live_now();
        let want = live.saturating_add(class);
        let peak_live = self.peak_live.fetch_max(want, Ordering::Relaxed).max(want);
        let soft_cap = peak_live.saturating_add(peak_live / HOARD_SLACK_DIV);
        let hard_cap = peak_live.saturating_mul(HOARD_HARD_FACTOR);
        let held = self.held.now();
        let pending = self.pending_bytes.load(Ordering::Acquire);
        let in_use = held.saturating_sub(pending).saturating_add(class);
        if in_use <= hard_cap {
            return;
        }
        let mut excess = in_use - soft_cap;
        // Past the hard cap: first a block of this stream big enough for
        // the request on its own (given back on this stream, the driver's
        // pool carves the request out of that very memory instead of
        // growing), then the coldest.
        if let Some(block) = lock(&self.table[home]).cache.take_room_for(stream.raw, class) {
            match self.release_cached(stream.raw, block, home) {
                Ok(bytes) => excess = excess.saturating_sub(bytes),
                Err(_) => return,
            }
        }
        while excess > 0 {
            let taken = match self.take_coldest(stream.raw, home) {
                Some((b, shard)) => Some((stream.raw, b, shard)),
                None => self.take_largest(),
            };
            let Some((owner, block, shard)) = taken else { break };
            match self.release_cached(owner, block, shard) {
                Ok(bytes) => excess = excess.saturating_sub(bytes),
                Err(_) => break,
            }
        }
    }

    /// New memory from the driver, charged to the gate first. A refusal by
    /// the driver gives the whole cache back and retries; with
    /// `wait_on_pressure` it then waits for pending frees and retries once
    /// more.
    fn allocate_new(&self, class: u64, stream: StreamRef, gate: &dyn ChargeGate) -> ResourceResult<u64> {
        // No reap here: what it retires depends on how far the GPU got, and
        // a miss would then make a different number of driver calls from
        // run to run. The runtime's reap (which engines and the hooks call
        // regularly) and the pressure paths retire pending frees.
        if self.options.cache {
            self.bound_hoard(class, stream);
        }
        let stream_id = stream.id;
        let stream = stream.raw;
        gate.try_charge(class)?;
        let mut result = self.device.alloc_async(class, stream);
        for wait in [false, true] {
            let out_of_memory = matches!(result, Err(crate::error::DeviceError::OutOfMemory { .. }));
            if !out_of_memory || (wait && !self.options.wait_on_pressure) {
                break;
            }
            self.retries.fetch_add(1, Ordering::Relaxed);
            let _ = self.release_largest(u64::MAX);
            if wait {
                let _ = self.wait_pending();
            }
            self.reap_into(gate);
            result = self.device.alloc_async(class, stream);
        }
        let ptr = result.map_err(|e| {
            gate.uncharge(class);
            ResourceError::from(e)
        })?;
        self.held.add(class);
        if let Some(log) = &self.log {
            log.reserved(ptr, class, stream_id.0);
        }
        Ok(ptr)
    }

    /// A fitting block cached on another stream (this stream's own shard
    /// first, then the others), with `stream` ordered after its free on the
    /// stream it came from (no wait when that is `stream` itself under
    /// another id).
    fn take_from_another_stream(&self, stream: StreamRef, class: u64) -> ResourceResult<Option<CachedBlock>> {
        for i in shards_from(shard_index(stream.id)) {
            let found = lock(&self.table[i]).cache.take_any(stream.raw, class);
            let Some((owner, block)) = found else { continue };
            if owner == stream.raw {
                return Ok(Some(block));
            }
            // The fence would be recorded inside a capture and make this
            // stream join it (a fork never joined back): not from there.
            if self.captures.any_active() && self.capture_of(owner)? != 0 {
                lock(&self.table[i]).cache.put_back(owner, block);
                continue;
            }
            return match self.fence_after(owner, stream.raw) {
                Ok(()) => Ok(Some(block)),
                Err(e) => {
                    lock(&self.table[i]).cache.put_back(owner, block);
                    Err(e)
                }
            };
        }
        Ok(None)
    }

    /// prepare's slow path: blocks used for the first time on a stream
    /// other than their allocation stream. One event is recorded on each of
    /// those allocation streams (all of them, and the capture rules applied
    /// to them, before any block changes, so a failure leaves every block as
    /// it was); it counts as the block's first write, and `stream` (of
    /// capture `capture`, 0: none) waits for it.
    fn fence_first_uses(
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
            let rec = blocks.get_mut(&u.block.generation).expect("validated by prepare");
            if rec.tracking.is_some() {
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
    fn fence_after(&self, owner: RawStream, stream: RawStream) -> ResourceResult<()> {
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
    fn lock_shards(&self, uses: &[BlockUse]) -> ResourceResult<LockedShards<'_>> {
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
}

/// A request whose device size does not even fit in 64 bits: the gate
/// refuses it (a budget names it), else it is out of memory.
pub(crate) fn too_big(bytes: u64, gate: &dyn ChargeGate) -> ResourceError {
    match gate.try_charge(u64::MAX) {
        Err(e) => e,
        Ok(()) => {
            gate.uncharge(u64::MAX);
            ResourceError::OutOfMemory { requested: bytes, detail: "the request is larger than any device can hold".into() }
        }
    }
}

impl Drop for AsyncPool {
    fn drop(&mut self) {
        let shared = self.events.get_mut().unwrap_or_else(|p| p.into_inner());
        for slot in &shared.slots {
            self.device.destroy_event(slot.raw);
        }
        for shard in self.table.iter_mut() {
            let shard = shard.get_mut().unwrap_or_else(|p| p.into_inner());
            for slot in &shard.events.slots {
                self.device.destroy_event(slot.raw);
            }
        }
    }
}

impl DeviceMemoryResource for AsyncPool {
    fn allocate_gated(
        &self,
        bytes: u64,
        stream: StreamRef,
        tag: AllocTag,
        gate: &dyn ChargeGate,
    ) -> ResourceResult<DeviceBlock> {
        if bytes == 0 {
            return Ok(self.register_in(&mut self.shard(stream.id), 0, 0, 0, stream, tag));
        }
        // Cached blocks are rounded to size classes so that they can be
        // reused; without the cache a block takes the device's granularity.
        let rounded = if self.options.cache {
            size_class(bytes)
        } else {
            bytes.div_ceil(UNCACHED_GRANULARITY).checked_mul(UNCACHED_GRANULARITY)
        };
        let Some(class) = rounded else { return Err(too_big(bytes, gate)) };
        let capture = self.capture_of(stream.raw)?;
        if capture != 0 {
            return self.allocate_in_capture(bytes, class, stream, tag, gate, capture);
        }
        if let Some(arena) = &self.arena {
            let Some(len) = Arena::block_bytes(bytes) else { return Err(too_big(bytes, gate)) };
            let ptr = arena.allocate(len, stream, gate, !self.captures.any_active()).map_err(|e| match e {
                ResourceError::OutOfMemory { detail, .. } => ResourceError::OutOfMemory { requested: bytes, detail },
                other => other,
            })?;
            return Ok(self.register_in(&mut self.shard(stream.id), ptr, bytes, len, stream, tag));
        }
        if self.options.cache {
            // The hot path: one lock for the cache and the block record.
            let mut shard = self.shard(stream.id);
            let shard = &mut *shard;
            if let Some(block) = shard.cache.take_own(stream.raw, class) {
                return Ok(self.register_in(shard, block.ptr, bytes, block.bytes, stream, tag));
            }
        }
        if self.options.cache {
            if let Some(block) = self.take_from_another_stream(stream, class)? {
                return Ok(self.register_in(&mut self.shard(stream.id), block.ptr, bytes, block.bytes, stream, tag));
            }
        }
        let ptr = self.allocate_new(class, stream, gate).map_err(|e| match e {
            // Name the caller's request; the detail has the device's numbers.
            ResourceError::OutOfMemory { detail, .. } => ResourceError::OutOfMemory { requested: bytes, detail },
            other => other,
        })?;
        let mut shard = self.shard(stream.id);
        if self.options.cache {
            shard.cache.note_miss();
        }
        Ok(self.register_in(&mut shard, ptr, bytes, class, stream, tag))
    }

    fn deallocate(&self, id: &BlockId) -> ResourceResult<DeviceBlock> {
        self.deallocate_released(id).0
    }

    fn deallocate_released(&self, id: &BlockId) -> (ResourceResult<DeviceBlock>, u64) {
        // A free never lowers the held bytes: the memory goes to the cache
        // or to pending, both still held. Only reap (and trim) retire; and
        // the free of the last live block of a released announced pool,
        // which gives that pool's memory back.
        self.free_block(id)
    }

    fn device_ordinal(&self) -> u32 {
        self.ordinal
    }

    fn bytes_outstanding(&self) -> u64 {
        self.held.now()
    }

    fn usage(&self) -> Usage {
        let (mut live_blocks, mut allocations, mut deallocations, mut recorded) = (0, 0, 0, 0);
        let mut cache = CacheTotals::default();
        for shard in self.table.iter() {
            let shard = lock(shard);
            live_blocks += shard.blocks.len() as u64;
            allocations += shard.allocations;
            deallocations += shard.deallocations;
            recorded += shard.events.recorded;
            cache.add(&shard.cache.totals());
        }
        let pending_blocks = lock(&self.pending).blocks;
        recorded += lock(&self.events).recorded;
        // One consistent sum: while other threads move blocks between live
        // and cached, live is what the held total leaves (so live + cached +
        // pending is always exactly the held bytes the budget charges).
        // (A block moving from the cache to pending between the two reads
        // would be seen twice: cached is capped by what held leaves.)
        let held = self.held.now();
        let pending = self.pending_bytes.load(Ordering::Acquire).min(held);
        let (mut hits, mut misses, mut peak_live) = (cache.hits, cache.misses, 0);
        let cached = match &self.arena {
            // Everything held that no live block uses: free space of mapped
            // pages, spare pages and the captures' free memory.
            Some(arena) => {
                let a = arena.usage();
                hits += a.hits;
                misses += a.misses;
                peak_live = a.peak_live;
                held - pending - self.live_now().min(held - pending)
            }
            None => (cache.bytes + self.captures.free_bytes()).min(held - pending),
        };
        Usage {
            live_bytes: held - pending - cached,
            pending_bytes: pending,
            live_blocks,
            pending_blocks,
            cached_bytes: cached,
            cached_blocks: cache.blocks,
            cache_hits: hits,
            cache_misses: misses,
            peak_outstanding_bytes: self.held.peak(),
            cross_stream_waits: self.waits.load(Ordering::Relaxed),
            events_recorded: recorded,
            allocations,
            deallocations,
            alloc_retries: self.retries.load(Ordering::Relaxed),
            peak_live_bytes: peak_live,
        }
    }

    fn validate(&self, id: &BlockId) -> ResourceResult<DeviceBlock> {
        let shard = self.shard(id.alloc_stream);
        match shard.record(id, self.ordinal) {
            Some(rec) => rec.map(|rec| DeviceBlock { id: *id, tag: rec.tag, state: BlockState::Live, held: rec.held }),
            None => {
                drop(shard);
                Err(self.not_live(id))
            }
        }
    }

    fn live_blocks(&self) -> Vec<LeakedBlock> {
        let mut out = Vec::new();
        for shard in self.table.iter() {
            let shard = lock(shard);
            out.extend(shard.blocks.iter().map(|(g, r)| LeakedBlock {
                id: BlockId { ptr: r.ptr, size: r.size, generation: *g, alloc_stream: r.stream.id, device: self.ordinal as i32 },
                tag: r.tag.name(),
                tag_id: r.tag,
                held: r.held,
                sequence: r.sequence,
                allocations_since: shard.allocations - r.sequence,
            }));
        }
        out
    }

    fn reset_peak(&self) {
        for shard in self.table.iter() {
            lock(shard).counters.reset_peak();
        }
        self.held.reset_peak();
        if let Some(arena) = &self.arena {
            arena.reset_peak();
        }
    }

    fn count_tags(&self, out: &mut CountSummary) {
        for shard in self.table.iter() {
            lock(shard).counters.add_to(out);
        }
    }

    fn reap_pending(&self) -> ResourceResult<u64> {
        self.reap_now()
    }

    fn wait_pending(&self) -> ResourceResult<()> {
        let mut to_wait: Vec<(Ev, RawEvent)> = Vec::new();
        {
            let mut pending = lock(&self.pending);
            let mut events = lock(&self.events);
            for (&stream, p) in pending.streams.iter_mut() {
                self.seal(&mut events, stream, p)?;
                if let Some(last) = p.sealed.back() {
                    to_wait.push((last.event, events.raw(last.event)));
                }
            }
            // Held while we wait, so no one re-records them meanwhile.
            for &(ev, _) in &to_wait {
                events.hold(ev);
            }
        }
        // Blocking waits happen outside the locks.
        let mut result = Ok(());
        for &(_, raw) in &to_wait {
            if let Err(e) = self.device.event_synchronize(raw) {
                result = Err(e.into());
                break;
            }
        }
        let mut events = lock(&self.events);
        for &(ev, _) in &to_wait {
            events.release(ev);
        }
        result
    }

    /// On an error after some blocks went back (a failed event record
    /// while waiting), those stay pending: still counted and charged, and
    /// retired by a later reap; the rest stays cached.
    fn trim(&self, keep_bytes: u64) -> ResourceResult<Trimmed> {
        if let Some(arena) = &self.arena {
            let orphans = self.release_ready_orphans();
            let released = arena.trim(keep_bytes, !self.captures.any_active());
            return Ok(Trimmed { released, retired: released + orphans });
        }
        let cached = self.cache_totals().bytes;
        let released = self.release_largest(cached.saturating_sub(keep_bytes))?;
        if released > 0 {
            self.wait_pending()?;
        }
        let retired = self.reap_now()? + self.release_ready_orphans();
        self.device.trim_pool();
        Ok(Trimmed { released, retired })
    }

    fn relieve_pressure(&self, need: u64, wait: bool) -> ResourceResult<u64> {
        if let Some(arena) = &self.arena {
            return Ok(arena.relieve(need, wait, !self.captures.any_active()) + self.release_ready_orphans());
        }
        // A failed release is the caller's error (the block stays cached);
        // a reap that fails only retires less, and the refusal says so.
        self.release_largest(need)?;
        if wait {
            self.wait_pending()?;
        }
        Ok(self.reap_now().unwrap_or(0))
    }

    fn retire_stream(&self, stream: RawStream) -> ResourceResult<u64> {
        let mut first_error = None;
        if let Some(arena) = &self.arena {
            if let Err(e) = arena.retire_stream(stream) {
                first_error = Some(e);
            }
        }
        for home in 0..TABLE_SHARDS {
            let mut shard = lock(&self.table[home]);
            // A record owed on this stream is made while the stream exists.
            shard.events.settle_or_sync(&*self.device, Some(stream));
            let blocks = shard.cache.take_stream(stream);
            drop(shard);
            for block in blocks {
                if let Err(e) = self.release_cached(stream, block, home) {
                    first_error.get_or_insert(e);
                }
            }
        }
        // Seal what is pending there while the stream still exists.
        {
            let mut pending = lock(&self.pending);
            if let Some(p) = pending.streams.get_mut(&stream) {
                let mut events = lock(&self.events);
                if let Err(e) = self.seal(&mut events, stream, p) {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => self.reap_now(),
        }
    }

    fn supports_block_use_tracking(&self) -> bool {
        true
    }

    fn grant_peer(&self, ordinal: i32) -> ResourceResult<()> {
        match &self.arena {
            Some(arena) => arena.grant_peer(ordinal),
            None => Ok(()),
        }
    }

    fn close_launches(&self) {
        self.launches_closed.store(true, Ordering::SeqCst);
        for shard in self.table.iter() {
            drop(lock(shard));
        }
    }

    fn capture_beginning(&self) -> ResourceResult<()> {
        // No record is deferred from here on (the watch makes captures
        // look active); the owed ones are made before the capture begins.
        self.captures.watch();
        let settled = self.settle_all();
        if settled.is_err() {
            self.captures.unwatch();
        }
        settled
    }

    fn capture_begin_done(&self) {
        self.captures.unwatch();
    }

    fn capture_begun(&self, id: u64) {
        self.captures.begun(id);
    }

    fn capture_ended(&self, id: u64) {
        self.captures.ended(id);
    }

    fn pool_announced(&self, pool: PoolKey, origin: Option<RawStream>) {
        // The announcement watches from here on: no record is deferred
        // any more, and the owed ones are made before the framework begins
        // its capture (it announces first).
        self.announced.begin(pool, origin, &*self.device, &self.captures);
        for shard in self.table.iter() {
            lock(shard).events.settle_or_sync(&*self.device, None);
        }
    }

    fn pool_ended(&self, pool: PoolKey) -> ResourceResult<u64> {
        self.announced.end(pool, &*self.device, &self.captures)?;
        Ok(self.release_ready_orphans())
    }

    fn release_pool(&self, pool: PoolKey) -> ResourceResult<u64> {
        if let PoolRelease::Last(captures) = self.announced.release(pool, self.ordinal as i32)? {
            for capture in captures {
                self.captures.orphan(capture);
            }
        }
        Ok(self.release_ready_orphans())
    }

    fn release_capture(&self, id: Option<u64>) -> ResourceResult<u64> {
        let blocks = match id {
            Some(id) => self.captures.take_for_release(id).map_err(ResourceError::StreamMisuse)?,
            None => self.captures.take_all(),
        };
        // The graphs are gone (the caller's promise), and these are
        // synchronous frees: the bytes leave `held` at once.
        let mut released = 0;
        let mut first_error = None;
        for (ptr, bytes) in blocks {
            match self.give_back_captured(ptr, bytes) {
                Ok(n) => released += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if released == 0 => Err(e),
            _ => Ok(released),
        }
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
}

impl AsyncPool {
    /// One block's prepare without the launch cache.
    fn prepare_one_uncached(&self, block: &BlockId, use_stream: StreamRef, access: Access) -> ResourceResult<()> {
        // The launch path's common case, one lock and no list: a block whose
        // recorded uses are all on this stream needs no wait.
        {
            let mut shard = self.launch_shard(block.alloc_stream)?;
            let TableShard { blocks, events, .. } = &mut *shard;
            match record_in(blocks, block, self.ordinal) {
                Some(Ok(rec)) => {
                    let first_foreign_use = rec.tracking.is_none() && rec.size > 0 && rec.stream.raw != use_stream.raw;
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

    fn finish_one(&self, block: &BlockId, use_stream: StreamRef, access: Access) -> ResourceResult<()> {
        let uses = [BlockUse { block: *block, access }];
        let home = shard_index(block.alloc_stream);
        let mut guard = self.launch_shard(block.alloc_stream)?;
        let remembered = self.remembered(&uses).ok().filter(|(_, r)| r.shard == home);
        if let Some(done) = self.cached_finish(remembered, home, &mut guard, use_stream.raw, &uses) {
            return done;
        }
        let TableShard { blocks, events, .. } = &mut *guard;
        let capture = self.capture_of(use_stream.raw)?;
        let rec = match blocks.get_mut(&block.generation) {
            Some(rec) => {
                check_matches(block, rec.ptr, rec.size, rec.stream.id, self.ordinal)?;
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

    fn prepare_uncached(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
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
            if rec.tracking.is_none() {
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

    fn finish_many(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
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
                    let rec = blocks.get_mut(&u.block.generation).expect("validated above");
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
                    let rec = blocks.get_mut(&u.block.generation).expect("validated above");
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

impl AsyncPool {
    /// The free path: waits for other streams' uses, then the cache or the
    /// driver. On any error nothing changed (waits already queued are
    /// harmless: they only delay the stream).
    /// Returns the bytes given back to the driver by the free: those of a
    /// released announced pool whose last live block this was.
    fn free_block(&self, id: &BlockId) -> (ResourceResult<DeviceBlock>, u64) {
        let mut orphan_ready = false;
        let result = self.free_block_inner(id, &mut orphan_ready);
        let released = if orphan_ready { self.release_ready_orphans() } else { 0 };
        (result, released)
    }

    fn free_block_inner(&self, id: &BlockId, orphan_ready: &mut bool) -> ResourceResult<DeviceBlock> {
        let mut guard = self.shard(id.alloc_stream);
        let shard = &mut *guard;
        let rec = match shard.record(id, self.ordinal) {
            Some(rec) => rec?,
            None => {
                drop(guard);
                return Err(self.not_live(id));
            }
        };
        let (stream, tag, held, ptr, own_capture) = (rec.stream.raw, rec.tag, rec.held, rec.ptr, rec.capture);
        // Memory of a capture, or freed while its stream captures, goes to
        // that capture's pool (`capture_pool.rs`): a replay may use it.
        let capture = self.capture_of(stream)?;
        let parked_in = if own_capture != 0 { own_capture } else { capture };
        if held > 0 {
            if rec.tracking.is_some() {
                let mut waits = WaitList::new();
                rec.waits_for(stream, Access::Write, &mut waits);
                if !waits.is_empty() {
                    shard.events.settle(&*self.device)?;
                }
                waits.sort_dedup();
                self.admit_waits(capture, &mut waits)?;
                self.wait_all(stream, waits.as_slice())?;
            }
            if !self.options.cache && parked_in == 0 && self.arena.is_none() {
                self.free_to_driver(stream, ptr, held)?;
            }
        }
        if let Some(mut rec) = shard.blocks.remove(&id.generation) {
            if rec.tracking.is_some() {
                rec.release_tracking(&mut shard.events, &mut SharedSlab::new(&self.events));
            }
        }
        let meta = &self.shard_live[shard_index(id.alloc_stream)];
        meta.add(-(held as i64));
        meta.touched();
        shard.counters.freed(tag.index(), held);
        shard.deallocations += 1;
        let state = if held == 0 {
            BlockState::Retired
        } else if parked_in != 0 {
            *orphan_ready = self.captures.put(parked_in, stream, ptr, held, own_capture != 0);
            BlockState::Cached
        } else if let Some(arena) = &self.arena {
            drop(guard);
            arena.free(ptr, held, Some(stream));
            return Ok(DeviceBlock { id: *id, tag, state: BlockState::Cached, held });
        } else if self.options.cache {
            shard.cache.put(stream, ptr, held);
            BlockState::Cached
        } else {
            BlockState::Pending
        };
        drop(guard);
        Ok(DeviceBlock { id: *id, tag, state, held })
    }
}
