//! `AsyncPool`: the tracking allocator. Stream-ordered allocation with
//! generation-checked handles and per-block cross-stream use tracking,
//! over one of two memories: xlog's arena on the virtual-memory API
//! (`arena/`, the default where the device supports it), or the driver's
//! pool with per-stream caches (`pool_memory.rs`, `PoolOptions::arena`
//! off, `XLOG_MEMORY=pool`).
//!
//! One allocate (`allocate`, under the budget if any: `budget.rs`; then
//! `allocate_charging`), in order:
//! 1. the device size: the size class with the cache on (so freed blocks
//!    can be reused), else the 256-byte granularity; `bytes == 0` takes
//!    no memory and gets a fresh generation;
//! 2. a stream that takes part in a capture gets the capture's private
//!    memory (`capture.rs`);
//! 3. the memory: the arena's `allocate` (which charges the budget per
//!    page it creates), or, with the pool, a block of the stream's own
//!    cache (the hot path: one lock, no driver call, no event), else
//!    `PoolMemory::allocate_miss` (another stream's cached block behind a
//!    GPU-side wait, else the driver, after the budget allowed the growth);
//! 4. the block's record enters the table shard of its stream (`table.rs`)
//!    with a new generation.
//!
//! One free (`free_block`): the allocation stream S first waits on the
//! recorded uses of other streams (`block.rs`); the record leaves the
//! table (its generation dies: every old handle is stale); the memory goes
//! to the capture pool if a capture owns it, else to the arena, else to S's
//! cache (bytes move from live to cached, still held), else, with the cache
//! off, its free is queued on S and the bytes are pending until reap sees
//! it complete.
//!
//! A refusal by the budget is answered here, where it happens: the pool
//! relieves its own pressure (`relieve_pressure`: the arena's idle pages,
//! or the cache given back and reaped; with `wait_on_pressure` a wait for
//! pending frees) before it refuses (`budget.rs`, "Pressure").
//!
//! Tracking (prepare/finish, launches): `tracking.rs`. Held memory
//! (`outstanding = live + cached + pending`, `HeldBytes`) moves only when
//! the memory below takes or releases device memory, and every drop
//! uncharges the budget, so the hot path moves no shared total but its
//! shard's live counter, and the budget's charge is what the pool holds.
//!
//! Locks and their order: a block table shard (several in ascending index
//! order for launches) → the shared event slab `events`. Pool memory's
//! `pending` → its own slab, taken with no shard held. The arena's locks
//! are taken with no shard held. No lock is held across a blocking wait.

mod block;
mod capture;
mod table;
mod tracking;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::block_table::stale;
use table::{shard_index, ShardLive, TableShard, TABLE_SHARDS};

use super::announced_pools::AnnouncedPools;
use super::arena::Arena;
use super::budget::{GlobalDeviceBudget, HeldBytes};
use super::capture_pool::CapturePools;
use super::event_slab::{Events, SharedSlab};
use super::{allocate_observed, lock};
use super::logging::CsvLog;
use super::pool_memory::{CacheHost, PoolMemory};
use super::stream_cache::{size_class, CacheShard, CacheTotals};
use crate::device::{Device, RawStream};
use crate::resource::{
    Access, AllocTag, BlockId, BlockState, ChargeGate, DeviceBlock, DeviceMemoryResource,
    Generation, LeakedBlock, HeldMemory, ResourceError, ResourceResult, StreamId, StreamRef, Trimmed, Usage,
    granular,
};
use crate::tag_counters::CountSummary;
use block::{UseState, WaitList};

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

/// Pool identities for the launch cache (never reused, unlike addresses).
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

pub struct AsyncPool {
    /// This pool's identity in the threads' launch caches.
    id: u64,
    device: Arc<dyn Device>,
    ordinal: u32,
    options: PoolOptions,
    table: Box<[Mutex<TableShard>]>,
    shard_live: Box<[ShardLive]>,
    /// Events not tied to one shard: launches over several shards, fences.
    events: Mutex<Events>,
    /// live + cached + pending: the arena's pages, capture memory, and the
    /// driver pool's blocks (shared with the arena and pool memory).
    held: Arc<HeldBytes>,
    /// xlog's own device memory (`arena/`), where the device supports it
    /// and `PoolOptions::arena` asks for it; else `memory`.
    arena: Option<Arena>,
    /// The driver's pool, the caches' policy and pending frees.
    memory: PoolMemory,
    waits: AtomicU64,
    /// Captures begun through the runtime and their private memory
    /// (`capture_pool.rs`).
    captures: CapturePools,
    /// Set by `close_launches`; read by launch calls under their shard
    /// locks (their close protocol, see `StreamTracking::close_launches`).
    launches_closed: AtomicBool,
    /// Captures a framework begins itself and announces
    /// (`announced_pools.rs`).
    announced: AnnouncedPools,
    /// The limit charged where device memory is taken (`budget.rs`).
    budget: Option<Arc<GlobalDeviceBudget>>,
    /// The runtime's CSV log, if any: the observer of every allocate and
    /// free (the memories report their driver traffic to it too).
    log: Option<Arc<CsvLog>>,
}

impl AsyncPool {
    pub fn new(device: Arc<dyn Device>) -> AsyncPool {
        AsyncPool::with_options(device, PoolOptions::default())
    }

    pub fn with_options(device: Arc<dyn Device>, options: PoolOptions) -> AsyncPool {
        AsyncPool::with_budget(device, options, None)
    }

    /// A pool whose device memory is charged to `budget` where it is taken
    /// (`budget.rs`).
    pub fn with_budget(device: Arc<dyn Device>, options: PoolOptions, budget: Option<Arc<GlobalDeviceBudget>>) -> AsyncPool {
        let ordinal = device.ordinal().max(0) as u32;
        let held = Arc::new(HeldBytes::new(budget.clone()));
        let arena = if options.arena && options.cache {
            Arena::new(device.clone(), held.clone(), options.wait_on_pressure)
        } else {
            None
        };
        let memory = PoolMemory::new(device.clone(), held.clone(), options.cache, options.wait_on_pressure);
        AsyncPool {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            device,
            ordinal,
            options,
            table: (0..TABLE_SHARDS).map(|_| Mutex::default()).collect(),
            shard_live: (0..TABLE_SHARDS).map(|_| ShardLive::default()).collect(),
            events: Mutex::default(),
            memory,
            held,
            arena,
            waits: AtomicU64::new(0),
            captures: CapturePools::default(),
            launches_closed: AtomicBool::new(false),
            announced: AnnouncedPools::default(),
            budget,
            log: None,
        }
    }

    /// Report every allocate and free, and the driver traffic (`reserve`,
    /// `release`, `retire`), to `log`.
    pub fn with_log(mut self, log: Option<Arc<CsvLog>>) -> AsyncPool {
        if let Some(arena) = &mut self.arena {
            arena.set_log(log.clone());
        }
        self.memory.set_log(log.clone());
        self.log = log;
        self
    }

    pub fn options(&self) -> PoolOptions {
        self.options
    }

    fn shard(&self, stream: StreamId) -> MutexGuard<'_, TableShard> {
        lock(&self.table[shard_index(stream)])
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
        self.shard_live.iter().map(|l| l.live()).sum()
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
        let id = shard.blocks.insert(Generation::next(), ptr, bytes, held, stream, tag, UseState::default(), self.ordinal);
        self.shard_live[shard_index(stream.id)].add(held as i64);
        DeviceBlock { id, tag, state: BlockState::Live, held }
    }

    /// One allocate (module docs), charging `gate` right before it takes
    /// device memory.
    #[inline]
    fn allocate_charging(
        &self,
        bytes: u64,
        stream: StreamRef,
        tag: AllocTag,
        gate: &dyn ChargeGate,
    ) -> ResourceResult<DeviceBlock> {
        if bytes == 0 {
            return Ok(self.register_in(&mut self.shard(stream.id), 0, 0, 0, stream, tag));
        }
        let Some(class) = self.class_of(bytes) else { return Err(too_big(bytes, gate)) };
        let capture = self.capture_of(stream.raw)?;
        if capture != 0 {
            return self.allocate_in_capture(bytes, class, stream, tag, gate, capture);
        }
        if let Some(arena) = &self.arena {
            let Some(len) = Arena::block_bytes(bytes) else { return Err(too_big(bytes, gate)) };
            let may_unmap = !self.captures.any_active();
            let placed = arena.allocate(len, stream, gate, may_unmap).map_err(naming_request(bytes))?;
            // Hits and misses counted with the record, under one lock.
            let mut shard = self.shard(stream.id);
            shard.cache.note(!placed.mapped);
            return Ok(self.register_in(&mut shard, placed.addr, bytes, len, stream, tag));
        }
        if self.options.cache {
            // The hot path: one lock for the cache and the block record.
            let mut shard = self.shard(stream.id);
            if let Some(block) = shard.cache.take_own(stream.raw, class) {
                return Ok(self.register_in(&mut shard, block.ptr, bytes, block.bytes, stream, tag));
            }
        }
        let (ptr, held) = self.memory.allocate_miss(self, class, stream, gate).map_err(naming_request(bytes))?;
        Ok(self.register_in(&mut self.shard(stream.id), ptr, bytes, held, stream, tag))
    }

    /// The device bytes a request of `bytes` takes in the pool's own
    /// accounting (the capture pools use it too): a size class with the
    /// cache on, else the granularity. `None`: it fits in no device.
    fn class_of(&self, bytes: u64) -> Option<u64> {
        if self.options.cache {
            size_class(bytes)
        } else {
            granular(bytes)
        }
    }
}

/// A refusal names the caller's request; the detail has the device's numbers.
fn naming_request(bytes: u64) -> impl Fn(ResourceError) -> ResourceError {
    move |e| match e {
        ResourceError::OutOfMemory { detail, .. } => ResourceError::OutOfMemory { requested: bytes, detail },
        other => other,
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

impl CacheHost for AsyncPool {
    const SHARDS: usize = TABLE_SHARDS;

    fn home(&self, stream: StreamRef) -> usize {
        shard_index(stream.id)
    }

    fn with_cache<R>(&self, shard: usize, f: impl FnOnce(&mut CacheShard) -> R) -> R {
        f(&mut lock(&self.table[shard]).cache)
    }

    fn capturing(&self) -> bool {
        self.captures.any_active()
    }

    fn stream_capture(&self, stream: RawStream) -> ResourceResult<u64> {
        self.capture_of(stream)
    }

    fn live_bytes(&self) -> u64 {
        self.live_now()
    }

    fn fence(&self, owner: RawStream, stream: RawStream) -> ResourceResult<()> {
        self.fence_after(owner, stream)
    }
}

impl Drop for AsyncPool {
    fn drop(&mut self) {
        self.events.get_mut().unwrap_or_else(|p| p.into_inner()).destroy_all(&*self.device);
        for shard in self.table.iter_mut() {
            shard.get_mut().unwrap_or_else(|p| p.into_inner()).events.destroy_all(&*self.device);
        }
    }
}

impl DeviceMemoryResource for AsyncPool {
    fn allocate(&self, bytes: u64, stream: StreamRef, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        let (budget, log) = (self.budget.as_deref(), self.log.as_deref());
        allocate_observed(self, budget, log, bytes, stream, tag, |gate| self.allocate_charging(bytes, stream, tag, gate))
    }

    fn deallocate(&self, id: &BlockId) -> ResourceResult<DeviceBlock> {
        // A free never lowers the held bytes: the memory goes to the cache
        // or to pending, both still held. Only reap (and trim) retire; and
        // the free of the last live block of a released announced pool,
        // which gives that pool's memory back (uncharged as it goes).
        // The result is handed back as it came (re-wrapping it costs the
        // free path a few nanoseconds, measured).
        let result = self.free_block(id);
        if let (Some(log), Ok(freed)) = (&self.log, &result) {
            log.freed(freed);
        }
        result
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

    fn usage(&self) -> Usage {
        let (mut live_blocks, mut allocations, mut deallocations, mut recorded) = (0, 0, 0, 0);
        let mut cache = CacheTotals::default();
        for shard in self.table.iter() {
            let shard = lock(shard);
            live_blocks += shard.blocks.len();
            allocations += shard.blocks.allocations();
            deallocations += shard.blocks.deallocations();
            recorded += shard.events.recorded();
            cache.add(&shard.cache.totals());
        }
        let pending_blocks = self.memory.pending_blocks();
        recorded += self.events.lock().unwrap_or_else(|p| p.into_inner()).recorded() + self.memory.events_recorded();
        // One consistent sum: while other threads move blocks between live
        // and cached, live is what the held total leaves (so live + cached +
        // pending is always exactly the held bytes the budget charges).
        // (A block moving from the cache to pending between the two reads
        // would be seen twice: cached is capped by what held leaves.)
        let held = self.held.now();
        let pending = self.memory.pending_bytes().min(held);
        let (hits, misses, mut peak_live) = (cache.hits, cache.misses, 0);
        let (mut pages_mapped, mut pages_unmapped) = (0, 0);
        let cached = match &self.arena {
            // Everything held that no live block uses: free space of mapped
            // pages, spare pages and the captures' free memory.
            Some(arena) => {
                let a = arena.usage();
                peak_live = a.peak_live;
                (pages_mapped, pages_unmapped) = (a.pages_mapped, a.pages_unmapped);
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
            alloc_retries: self.memory.retries(),
            peak_live_bytes: peak_live,
            pages_mapped,
            pages_unmapped,
        }
    }

    fn device_ordinal(&self) -> u32 {
        self.ordinal
    }

    fn bytes_outstanding(&self) -> u64 {
        self.held.now()
    }
}

impl HeldMemory for AsyncPool {
    fn live_on_stream(&self, stream: StreamId) -> (u64, u64) {
        self.shard(stream).blocks.on_stream(stream)
    }

    fn live_blocks(&self) -> Vec<LeakedBlock> {
        let mut out = Vec::new();
        for shard in self.table.iter() {
            let shard = lock(shard);
            shard.blocks.live_blocks(self.ordinal, &mut out);
        }
        out
    }

    fn reset_peak(&self) {
        for shard in self.table.iter() {
            lock(shard).blocks.reset_peak();
        }
        self.held.reset_peak();
        if let Some(arena) = &self.arena {
            arena.reset_peak();
        }
    }

    fn count_tags(&self, out: &mut CountSummary) {
        for shard in self.table.iter() {
            lock(shard).blocks.count_tags(out);
        }
    }

    fn reap_pending(&self) -> ResourceResult<u64> {
        self.memory.reap(self)
    }

    fn wait_pending(&self) -> ResourceResult<()> {
        self.memory.wait_pending(self)
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
        let trimmed = self.memory.trim(self, keep_bytes)?;
        let retired = trimmed.retired + self.release_ready_orphans();
        self.device.trim_pool();
        Ok(Trimmed { released: trimmed.released, retired })
    }

    fn relieve_pressure(&self, need: u64, wait: bool) -> ResourceResult<u64> {
        if let Some(arena) = &self.arena {
            return Ok(arena.relieve(need, wait, !self.captures.any_active()) + self.release_ready_orphans());
        }
        self.memory.relieve(self, need, wait)
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
                if let Err(e) = self.memory.release_cached(self, stream, block, home) {
                    first_error.get_or_insert(e);
                }
            }
        }
        // Seal what is pending there while the stream still exists.
        if let Err(e) = self.memory.seal_stream(self, stream) {
            first_error.get_or_insert(e);
        }
        match first_error {
            Some(e) => Err(e),
            // The reap retires other streams' frees too: its failure is not
            // this release's (it only retires less; the next reap retries).
            None => Ok(self.memory.reap(self).unwrap_or(0)),
        }
    }

    fn grant_peer(&self, ordinal: i32) -> ResourceResult<()> {
        match &self.arena {
            Some(arena) => arena.grant_peer(ordinal),
            None => Ok(()),
        }
    }
}

impl AsyncPool {
    /// The free path: waits for other streams' uses, then the cache or the
    /// driver. On any error nothing changed (waits already queued are
    /// harmless: they only delay the stream).
    /// Returns the bytes given back to the driver by the free: those of a
    /// released announced pool whose last live block this was.
    fn free_block(&self, id: &BlockId) -> ResourceResult<DeviceBlock> {
        let mut orphan_ready = false;
        let result = self.free_block_inner(id, &mut orphan_ready);
        if orphan_ready {
            self.release_ready_orphans();
        }
        result
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
        let (stream, tag, held, ptr, own_capture) = (rec.stream.raw, rec.tag, rec.held, rec.ptr, rec.extra.capture);
        // Memory of a capture, or freed while its stream captures, goes to
        // that capture's pool (`capture_pool.rs`): a replay may use it.
        let capture = self.capture_of(stream)?;
        let parked_in = if own_capture != 0 { own_capture } else { capture };
        if held > 0 {
            if rec.extra.tracking.is_some() {
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
                self.memory.free_to_driver(stream, ptr, held)?;
            }
        }
        if let Some(mut rec) = shard.blocks.remove(id) {
            if rec.extra.tracking.is_some() {
                rec.release_tracking(&mut shard.events, &mut SharedSlab::new(&self.events));
            }
        }
        let meta = &self.shard_live[shard_index(id.alloc_stream)];
        meta.add(-(held as i64));
        meta.touched();
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
