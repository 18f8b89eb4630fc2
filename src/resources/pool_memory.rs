//! `PoolMemory`: the async allocator's alternative memory (`XLOG_MEMORY=pool`,
//! `PoolOptions::arena` off; the default is `arena/`): blocks from the
//! driver's pool (xlog's own memory pool on CUDA), a per-stream cache of
//! freed blocks (`stream_cache.rs`), and pending frees.
//!
//! Contract:
//! - **Cache.** The caches live in the block table's shards (a hit takes
//!   the one lock the block record needs); this module reaches them through
//!   its host (`CacheHost`, implemented by `AsyncPool`). A block cached on
//!   another stream T serves stream S only after S was made to wait on an
//!   event recorded on T after the free (a GPU-side wait, never a host wait).
//! - **Growth.** A miss first applies the hoarding bound, then charges the
//!   gate (the budget, if any) the block's class and asks the driver. A
//!   refusal by the driver gives the whole cache back, reaps and retries;
//!   with `wait_on_pressure` it then waits for pending frees and retries
//!   once more. A plain miss reaps only once the pending bytes pass the
//!   live ones (what it retires depends on how far the GPU got, so the
//!   driver calls then vary from run to run); without that, a workload
//!   that never reaps held and charged pending frees the driver had long
//!   reused (W11: 48 GB charged for a 1.1 GB device peak).
//! - **Hoarding bound.** Before growing by `class` on stream S: cached
//!   blocks S has not reused for `STALE_FREES` frees go back first (on S,
//!   up to the request's size, at most `STALE_RELEASES_PER_MISS`); then,
//!   only if live + cached + the request would pass `HOARD_HARD_FACTOR`
//!   times the highest live total seen, a block of S big enough for the
//!   request and then the coldest blocks (S's first, else the largest of
//!   any stream) go back, down to that peak plus 1/`HOARD_SLACK_DIV`.
//!   Nothing cached goes back while a capture is active (a free queued on a
//!   capturing stream would become part of its graph).
//! - **Pending frees.** A block given back to the driver (cache off, trim,
//!   pressure, the hoarding bound) is queued on its stream and stays held
//!   (pending) until reap sees its free complete. Unsealed frees accumulate
//!   per stream; reap seals them with one event per stream (never on a
//!   capturing stream) and retires a batch once its event has completed;
//!   batches of one stream complete in order.
//! - **Held bytes.** `held` (shared with the pool and the arena) grows when
//!   the driver hands out memory and shrinks only when reap retires a
//!   free, so a cache hit or a free into the cache moves no shared total.
//!
//! Locks: `pending` → `events` (this module's slab, for sealed batches).
//! The table shards (through `CacheHost::with_cache`) are taken alone,
//! never while `pending` is held. No lock is held across a blocking wait.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::budget::HeldBytes;
use super::event_slab::{Ev, Events};
use super::lock;
use super::logging::CsvLog;
use super::stream_cache::{CacheShard, CacheTotals, CachedBlock};
use crate::device::{Device, RawEvent, RawStream};
use crate::fast_hash::FastMap;
use crate::resource::{ChargeGate, ResourceError, ResourceResult, StreamRef, Trimmed};

/// See the hoarding bound in the module docs.
const HOARD_SLACK_DIV: u64 = 16;
const HOARD_HARD_FACTOR: u64 = 2;
const STALE_FREES: u64 = 4096;
const STALE_RELEASES_PER_MISS: usize = 8;

/// What pool memory needs of the allocator that owns it.
pub(crate) trait CacheHost {
    /// How many cache shards there are.
    const SHARDS: usize;
    /// The shard whose cache serves `stream` first.
    fn home(&self, stream: StreamRef) -> usize;
    /// Run `f` on the cache of shard `shard`, under that shard's lock.
    fn with_cache<R>(&self, shard: usize, f: impl FnOnce(&mut CacheShard) -> R) -> R;
    /// Whether a capture is active (or watched for).
    fn capturing(&self) -> bool;
    /// The capture `stream` takes part in (0: none).
    fn stream_capture(&self, stream: RawStream) -> ResourceResult<u64>;
    /// Live device bytes, summed without locks (approximate).
    fn live_bytes(&self) -> u64;
    /// Make `stream` wait on the GPU for everything queued on `owner`.
    fn fence(&self, owner: RawStream, stream: RawStream) -> ResourceResult<()>;
}

/// Every shard index, `home` first.
fn shards_from<H: CacheHost>(home: usize) -> impl Iterator<Item = usize> {
    std::iter::once(home).chain((0..H::SHARDS).filter(move |&i| i != home))
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

pub(crate) struct PoolMemory {
    device: Arc<dyn Device>,
    cache: bool,
    wait_on_pressure: bool,
    pending: Mutex<PendingFrees>,
    /// Events of sealed batches of pending frees.
    events: Mutex<Events>,
    pending_bytes: AtomicU64,
    /// live + cached + pending, shared with the allocator and the arena.
    held: Arc<HeldBytes>,
    /// Highest live total seen at a miss (the hoarding bound's base).
    peak_live: AtomicU64,
    /// Driver refusals retried after giving the cache back.
    retries: AtomicU64,
    /// The runtime's CSV log, if any: `reserve`, `release` (from the
    /// cache) and `retire` rows.
    log: Option<Arc<CsvLog>>,
}

impl PoolMemory {
    pub(crate) fn new(device: Arc<dyn Device>, held: Arc<HeldBytes>, cache: bool, wait_on_pressure: bool) -> PoolMemory {
        PoolMemory {
            device,
            cache,
            wait_on_pressure,
            pending: Mutex::default(),
            events: Mutex::default(),
            pending_bytes: AtomicU64::new(0),
            held,
            peak_live: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            log: None,
        }
    }

    pub(crate) fn set_log(&mut self, log: Option<Arc<CsvLog>>) {
        self.log = log;
    }

    /// Bytes freed to the driver whose free reap has not yet seen complete.
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.pending_bytes.load(Ordering::Acquire)
    }

    pub(crate) fn pending_blocks(&self) -> u64 {
        lock(&self.pending).blocks
    }

    pub(crate) fn events_recorded(&self) -> u64 {
        lock(&self.events).recorded()
    }

    pub(crate) fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Totals of every shard's cache.
    pub(crate) fn cache_totals<H: CacheHost>(&self, host: &H) -> CacheTotals {
        let mut t = CacheTotals::default();
        for i in 0..H::SHARDS {
            t.add(&host.with_cache(i, |c| c.totals()));
        }
        t
    }

    /// A block for `class` bytes on `stream` that is not in its own cache:
    /// another stream's cached block, else new memory from the driver.
    /// Returns the address and the block's device bytes.
    pub(crate) fn allocate_miss<H: CacheHost>(
        &self,
        host: &H,
        class: u64,
        stream: StreamRef,
        gate: &dyn ChargeGate,
    ) -> ResourceResult<(u64, u64)> {
        if self.cache {
            if let Some(block) = self.take_from_another_stream(host, stream, class)? {
                return Ok((block.ptr, block.bytes));
            }
        }
        // Frees the driver has run are memory it reuses at once: once the
        // pending bytes pass the live ones, retire those (no host wait) so
        // that the held bytes, and the charge, stop counting them. (The
        // driver pool may still keep that memory reserved: this memory's
        // charge is not the device's number; the arena's is.)
        if self.pending_bytes() > host.live_bytes() {
            let _ = self.reap(host);
        }
        let ptr = self.allocate_new(host, class, stream, gate)?;
        if self.cache {
            host.with_cache(host.home(stream), |c| c.note(false));
        }
        Ok((ptr, class))
    }

    /// The largest cached block of any stream, taken out of its cache,
    /// with the stream and the shard it was cached in.
    fn take_largest<H: CacheHost>(&self, host: &H) -> Option<(RawStream, CachedBlock, usize)> {
        loop {
            let mut best: Option<(usize, RawStream, CachedBlock)> = None;
            for i in 0..H::SHARDS {
                if let Some((s, b)) = host.with_cache(i, |c| c.largest()) {
                    if best.as_ref().map_or(true, |(_, _, cur)| b.bytes > cur.bytes) {
                        best = Some((i, s, b));
                    }
                }
            }
            let (i, stream, block) = best?;
            // Another thread may have taken it meanwhile: look again then.
            if host.with_cache(i, |c| c.remove(stream, &block)) {
                return Some((stream, block, i));
            }
        }
    }

    /// The coldest block cached on `stream` (in any shard), taken out.
    fn take_coldest<H: CacheHost>(&self, host: &H, stream: RawStream, home: usize) -> Option<(CachedBlock, usize)> {
        shards_from::<H>(home).find_map(|i| host.with_cache(i, |c| c.take_coldest(stream)).map(|b| (b, i)))
    }

    /// Seal `p`'s unsealed frees (on `stream`) with one event.
    fn seal<H: CacheHost>(&self, host: &H, events: &mut Events, stream: RawStream, p: &mut StreamPending) -> ResourceResult<()> {
        // Never on a capturing stream: the event would be part of the graph,
        // and reap could not query it. Its frees wait for the capture's end.
        if p.unsealed_blocks > 0 && host.stream_capture(stream)? != 0 {
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

    /// Queue the free of `ptr` (`bytes` held) on `stream`; the bytes become
    /// pending (still held) until reap sees the free complete.
    pub(crate) fn free_to_driver(&self, stream: RawStream, ptr: u64, bytes: u64) -> ResourceResult<()> {
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
    pub(crate) fn release_cached<H: CacheHost>(
        &self,
        host: &H,
        stream: RawStream,
        block: CachedBlock,
        home: usize,
    ) -> ResourceResult<u64> {
        match self.free_to_driver(stream, block.ptr, block.bytes) {
            Ok(()) => {
                if let Some(log) = &self.log {
                    log.released(block.ptr, block.bytes);
                }
                Ok(block.bytes)
            }
            Err(e) => {
                host.with_cache(home, |c| c.put(stream, block.ptr, block.bytes));
                Err(e)
            }
        }
    }

    /// Give cached blocks back, largest and coldest first, until `need`
    /// bytes went back or the cache is empty. Returns the bytes released.
    fn release_largest<H: CacheHost>(&self, host: &H, need: u64) -> ResourceResult<u64> {
        // While a capture is active nothing cached goes back to the driver:
        // a free queued on a capturing stream would become part of a graph.
        if host.capturing() {
            return Ok(0);
        }
        let mut released = 0;
        while released < need {
            let Some((stream, block, shard)) = self.take_largest(host) else { break };
            released += self.release_cached(host, stream, block, shard)?;
        }
        Ok(released)
    }

    /// Retire completed pending frees; the bytes leave `held`.
    pub(crate) fn reap<H: CacheHost>(&self, host: &H) -> ResourceResult<u64> {
        if self.pending_bytes.load(Ordering::Acquire) == 0 {
            return Ok(0);
        }
        let mut pending = lock(&self.pending);
        let pending = &mut *pending;
        let mut events = lock(&self.events);
        let (mut bytes, mut blocks) = (0u64, 0u64);
        let mut first_error = None;
        for (&stream, p) in pending.streams.iter_mut() {
            if let Err(e) = self.seal(host, &mut events, stream, p) {
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

    /// Block until every pending free so far has completed (they stay
    /// pending until the next reap).
    pub(crate) fn wait_pending<H: CacheHost>(&self, host: &H) -> ResourceResult<()> {
        let mut to_wait: Vec<(Ev, RawEvent)> = Vec::new();
        {
            let mut pending = lock(&self.pending);
            let mut events = lock(&self.events);
            for (&stream, p) in pending.streams.iter_mut() {
                self.seal(host, &mut events, stream, p)?;
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

    /// Seal what is pending on `stream` while the stream still exists.
    pub(crate) fn seal_stream<H: CacheHost>(&self, host: &H, stream: RawStream) -> ResourceResult<()> {
        let mut pending = lock(&self.pending);
        match pending.streams.get_mut(&stream) {
            Some(p) => self.seal(host, &mut lock(&self.events), stream, p),
            None => Ok(()),
        }
    }

    /// Give cached memory back until at most `keep_bytes` stay cached, wait
    /// for those frees and reap. `retired` excludes the host's own memory.
    pub(crate) fn trim<H: CacheHost>(&self, host: &H, keep_bytes: u64) -> ResourceResult<Trimmed> {
        let cached = self.cache_totals(host).bytes;
        let released = self.release_largest(host, cached.saturating_sub(keep_bytes))?;
        if released > 0 {
            self.wait_pending(host)?;
        }
        let retired = self.reap(host)?;
        Ok(Trimmed { released, retired })
    }

    /// Pressure: give back `need` bytes of cache, with `wait` wait for
    /// pending frees, and reap. A failed release is the caller's error (the
    /// block stays cached); a reap that fails only retires less.
    pub(crate) fn relieve<H: CacheHost>(&self, host: &H, need: u64, wait: bool) -> ResourceResult<u64> {
        self.release_largest(host, need)?;
        if wait {
            self.wait_pending(host)?;
        }
        Ok(self.reap(host).unwrap_or(0))
    }

    /// The hoarding bound (module docs): before growing by `class` on
    /// `stream`, give back cold cached blocks if held would pass the live
    /// peak plus slack.
    fn bound_hoard<H: CacheHost>(&self, host: &H, class: u64, stream: StreamRef) {
        if host.capturing() {
            return; // see release_largest
        }
        let home = host.home(stream);
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
            let Some(block) = host.with_cache(home, |c| c.take_stale(stream.raw, STALE_FREES)) else { break };
            match self.release_cached(host, stream.raw, block, home) {
                Ok(bytes) => released += bytes,
                Err(_) => return,
            }
        }
        let live = host.live_bytes();
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
        if let Some(block) = host.with_cache(home, |c| c.take_room_for(stream.raw, class)) {
            match self.release_cached(host, stream.raw, block, home) {
                Ok(bytes) => excess = excess.saturating_sub(bytes),
                Err(_) => return,
            }
        }
        while excess > 0 {
            let taken = match self.take_coldest(host, stream.raw, home) {
                Some((b, shard)) => Some((stream.raw, b, shard)),
                None => self.take_largest(host),
            };
            let Some((owner, block, shard)) = taken else { break };
            match self.release_cached(host, owner, block, shard) {
                Ok(bytes) => excess = excess.saturating_sub(bytes),
                Err(_) => break,
            }
        }
    }

    /// New memory from the driver, charged to the gate first (module docs,
    /// "Growth").
    fn allocate_new<H: CacheHost>(&self, host: &H, class: u64, stream: StreamRef, gate: &dyn ChargeGate) -> ResourceResult<u64> {
        if self.cache {
            self.bound_hoard(host, class, stream);
        }
        let stream_id = stream.id;
        let stream = stream.raw;
        gate.try_charge(class)?;
        let mut result = self.device.alloc_async(class, stream);
        for wait in [false, true] {
            let out_of_memory = matches!(result, Err(crate::error::DeviceError::OutOfMemory { .. }));
            if !out_of_memory || (wait && !self.wait_on_pressure) {
                break;
            }
            self.retries.fetch_add(1, Ordering::Relaxed);
            let _ = self.release_largest(host, u64::MAX);
            if wait {
                let _ = self.wait_pending(host);
            }
            let _ = self.reap(host);
            result = self.device.alloc_async(class, stream);
        }
        let ptr = result.map_err(|e| {
            gate.uncharge(class);
            ResourceError::from(e)
        })?;
        self.held.add(class);
        if let Some(log) = &self.log {
            log.reserved(ptr, class, stream_id.0, "");
        }
        Ok(ptr)
    }

    /// A fitting block cached on another stream (this stream's own shard
    /// first, then the others), with `stream` ordered after its free on the
    /// stream it came from (no wait when that is `stream` itself under
    /// another id).
    fn take_from_another_stream<H: CacheHost>(
        &self,
        host: &H,
        stream: StreamRef,
        class: u64,
    ) -> ResourceResult<Option<CachedBlock>> {
        for i in shards_from::<H>(host.home(stream)) {
            let found = host.with_cache(i, |c| c.take_any(stream.raw, class));
            let Some((owner, block)) = found else { continue };
            if owner == stream.raw {
                return Ok(Some(block));
            }
            // The fence would be recorded inside a capture and make this
            // stream join it (a fork never joined back): not from there.
            if host.capturing() && host.stream_capture(owner)? != 0 {
                host.with_cache(i, |c| c.put_back(owner, block));
                continue;
            }
            return match host.fence(owner, stream.raw) {
                Ok(()) => Ok(Some(block)),
                Err(e) => {
                    host.with_cache(i, |c| c.put_back(owner, block));
                    Err(e)
                }
            };
        }
        Ok(None)
    }
}

impl Drop for PoolMemory {
    fn drop(&mut self) {
        self.events.get_mut().unwrap_or_else(|p| p.into_inner()).destroy_all(&*self.device);
    }
}
