//! `AsyncPool`: stream-ordered allocation with per-block cross-stream use
//! tracking and deferred free/reap.
//!
//! Every block keeps its last-write event and one outstanding read event per
//! stream (a later read on the same stream subsumes an earlier one, because
//! the stream runs in order). A free makes the allocation stream wait on the
//! events of other streams and queues the free there; the bytes move from
//! live to pending. Pending frees of a stream accumulate unsealed; `reap`
//! seals them with one event per stream and retires a batch once its event
//! has completed — one event per batch instead of one per free.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::{Device, RawEvent, RawStream};
use crate::resource::{
    Access, AllocTag, BlockId, BlockState, BlockUse, DeviceBlock, DeviceMemoryResource,
    Generation, LeakedBlock, ResourceError, ResourceResult, StreamId, StreamRef, Usage,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reusable events, all created with timing disabled. An event goes back to
/// the pool when the last block (or batch) holding it lets go.
pub(crate) struct EventPool {
    device: Arc<dyn Device>,
    free: Mutex<Vec<RawEvent>>,
    recorded: AtomicU64,
}

impl EventPool {
    pub(crate) fn new(device: Arc<dyn Device>) -> Arc<EventPool> {
        Arc::new(EventPool { device, free: Mutex::new(Vec::new()), recorded: AtomicU64::new(0) })
    }

    fn take(self: &Arc<Self>) -> ResourceResult<Arc<PooledEvent>> {
        let raw = match lock(&self.free).pop() {
            Some(raw) => raw,
            None => self.device.create_event()?,
        };
        Ok(Arc::new(PooledEvent { raw, pool: self.clone() }))
    }

    /// Take an event and record it on `stream`; on failure the event goes
    /// straight back to the pool.
    fn record(self: &Arc<Self>, stream: RawStream) -> ResourceResult<Arc<PooledEvent>> {
        let event = self.take()?;
        self.device.record_event(event.raw, stream)?;
        self.recorded.fetch_add(1, Ordering::Relaxed);
        Ok(event)
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        for raw in lock(&self.free).drain(..) {
            self.device.destroy_event(raw);
        }
    }
}

pub(crate) struct PooledEvent {
    raw: RawEvent,
    pool: Arc<EventPool>,
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        lock(&self.pool.free).push(self.raw);
    }
}

/// One recorded use: the stream it ran on and the event after it.
#[derive(Clone)]
struct Use {
    stream: RawStream,
    event: Arc<PooledEvent>,
}

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
    stream: StreamRef,
    tag: AllocTag,
    tracking: Option<Box<Tracking>>,
}

impl BlockRecord {
    /// Events `stream` must wait for before an access of kind `access`.
    fn waits_for(&self, stream: RawStream, access: Access, out: &mut Vec<Arc<PooledEvent>>) {
        let Some(t) = &self.tracking else { return };
        if let Some(w) = &t.last_write {
            if w.stream != stream {
                out.push(w.event.clone());
            }
        }
        if access.writes() {
            out.extend(t.readers.iter().filter(|r| r.stream != stream).map(|r| r.event.clone()));
        }
    }

    fn record_use(&mut self, stream: RawStream, access: Access, event: &Arc<PooledEvent>) {
        let t = self.tracking.get_or_insert_with(Default::default);
        let new_use = Use { stream, event: event.clone() };
        if access.writes() {
            t.last_write = Some(new_use);
            t.readers.clear();
        } else if let Some(r) = t.readers.iter_mut().find(|r| r.stream == stream) {
            *r = new_use;
        } else {
            t.readers.push(new_use);
        }
    }
}

#[derive(Default)]
struct StreamPending {
    unsealed_bytes: u64,
    unsealed_blocks: u64,
    sealed: VecDeque<SealedBatch>,
}

struct SealedBatch {
    event: Arc<PooledEvent>,
    bytes: u64,
    blocks: u64,
}

#[derive(Default)]
struct PoolState {
    blocks: HashMap<Generation, BlockRecord>,
    pending: HashMap<RawStream, StreamPending>,
    live_bytes: u64,
    pending_bytes: u64,
    pending_blocks: u64,
    peak_outstanding: u64,
}

impl PoolState {
    fn record(&self, id: &BlockId, ordinal: u32) -> ResourceResult<&BlockRecord> {
        let rec = self.blocks.get(&id.generation).ok_or_else(|| stale(id))?;
        check_matches(id, rec.ptr, rec.size, rec.stream.id, ordinal)?;
        Ok(rec)
    }

    fn record_mut(&mut self, id: &BlockId, ordinal: u32) -> ResourceResult<&mut BlockRecord> {
        let rec = self.blocks.get_mut(&id.generation).ok_or_else(|| stale(id))?;
        check_matches(id, rec.ptr, rec.size, rec.stream.id, ordinal)?;
        Ok(rec)
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

pub struct AsyncPool {
    device: Arc<dyn Device>,
    ordinal: u32,
    events: Arc<EventPool>,
    state: Mutex<PoolState>,
    waits: AtomicU64,
}

impl AsyncPool {
    pub fn new(device: Arc<dyn Device>) -> AsyncPool {
        let ordinal = device.ordinal().max(0) as u32;
        AsyncPool {
            events: EventPool::new(device.clone()),
            device,
            ordinal,
            state: Mutex::default(),
            waits: AtomicU64::new(0),
        }
    }

    fn wait_all(&self, stream: RawStream, events: &[Arc<PooledEvent>]) -> ResourceResult<()> {
        for ev in events {
            self.device.stream_wait_event(stream, ev.raw)?;
            self.waits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl DeviceMemoryResource for AsyncPool {
    fn allocate(&self, bytes: u64, stream: StreamRef, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        let generation = Generation::next();
        let ptr = if bytes == 0 { 0 } else { self.device.alloc_async(bytes, stream.raw)? };
        let mut st = lock(&self.state);
        st.blocks.insert(generation, BlockRecord { ptr, size: bytes, stream, tag, tracking: None });
        st.live_bytes += bytes;
        st.peak_outstanding = st.peak_outstanding.max(st.live_bytes + st.pending_bytes);
        let id = BlockId { ptr, size: bytes, generation, alloc_stream: stream.id, device: self.ordinal as i32 };
        Ok(DeviceBlock { id, tag, state: BlockState::Live })
    }

    fn deallocate(&self, id: &BlockId) -> ResourceResult<DeviceBlock> {
        let mut st = lock(&self.state);
        let rec = st.record(id, self.ordinal)?;
        let (stream, tag, size) = (rec.stream.raw, rec.tag, rec.size);
        if size > 0 {
            let mut waits = Vec::new();
            rec.waits_for(stream, Access::Write, &mut waits);
            self.wait_all(stream, &waits)?;
            self.device.free_async(rec.ptr, stream)?;
        }
        st.blocks.remove(&id.generation);
        st.live_bytes -= size;
        let state = if size > 0 {
            st.pending_bytes += size;
            st.pending_blocks += 1;
            let p = st.pending.entry(stream).or_default();
            p.unsealed_bytes += size;
            p.unsealed_blocks += 1;
            BlockState::Pending
        } else {
            BlockState::Retired
        };
        Ok(DeviceBlock { id: *id, tag, state })
    }

    fn device_ordinal(&self) -> u32 {
        self.ordinal
    }

    fn bytes_outstanding(&self) -> u64 {
        let st = lock(&self.state);
        st.live_bytes + st.pending_bytes
    }

    fn usage(&self) -> Usage {
        let st = lock(&self.state);
        Usage {
            live_bytes: st.live_bytes,
            pending_bytes: st.pending_bytes,
            live_blocks: st.blocks.len() as u64,
            pending_blocks: st.pending_blocks,
            peak_outstanding_bytes: st.peak_outstanding,
            cross_stream_waits: self.waits.load(Ordering::Relaxed),
            events_recorded: self.events.recorded.load(Ordering::Relaxed),
        }
    }

    fn validate(&self, id: &BlockId) -> ResourceResult<DeviceBlock> {
        let st = lock(&self.state);
        let rec = st.record(id, self.ordinal)?;
        Ok(DeviceBlock { id: *id, tag: rec.tag, state: BlockState::Live })
    }

    fn live_blocks(&self) -> Vec<LeakedBlock> {
        let st = lock(&self.state);
        st.blocks
            .iter()
            .map(|(g, r)| LeakedBlock {
                id: BlockId { ptr: r.ptr, size: r.size, generation: *g, alloc_stream: r.stream.id, device: self.ordinal as i32 },
                tag: r.tag.name(),
            })
            .collect()
    }

    fn reap_pending(&self) -> ResourceResult<u64> {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let (mut bytes, mut blocks) = (0u64, 0u64);
        let mut first_error = None;
        for (&stream, p) in st.pending.iter_mut() {
            if p.unsealed_blocks > 0 {
                match self.events.record(stream) {
                    Ok(event) => {
                        p.sealed.push_back(SealedBatch { event, bytes: p.unsealed_bytes, blocks: p.unsealed_blocks });
                        p.unsealed_bytes = 0;
                        p.unsealed_blocks = 0;
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            // Batches of one stream complete in order: stop at the first
            // that is still running.
            while let Some(batch) = p.sealed.front() {
                match self.device.event_query(batch.event.raw) {
                    Ok(true) => {
                        bytes += batch.bytes;
                        blocks += batch.blocks;
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
        st.pending.retain(|_, p| p.unsealed_blocks > 0 || !p.sealed.is_empty());
        st.pending_bytes -= bytes;
        st.pending_blocks -= blocks;
        match first_error {
            Some(e) if bytes == 0 => Err(e),
            _ => Ok(bytes),
        }
    }

    fn wait_pending(&self) -> ResourceResult<()> {
        let mut to_wait = Vec::new();
        {
            let mut st = lock(&self.state);
            for (&stream, p) in st.pending.iter_mut() {
                if p.unsealed_blocks > 0 {
                    let event = self.events.record(stream)?;
                    p.sealed.push_back(SealedBatch { event, bytes: p.unsealed_bytes, blocks: p.unsealed_blocks });
                    p.unsealed_bytes = 0;
                    p.unsealed_blocks = 0;
                }
                if let Some(last) = p.sealed.back() {
                    to_wait.push(last.event.clone());
                }
            }
        }
        // Blocking waits happen outside the lock.
        for ev in to_wait {
            self.device.event_synchronize(ev.raw)?;
        }
        Ok(())
    }

    fn supports_block_use_tracking(&self) -> bool {
        true
    }

    fn record_block_use(&self, block: &BlockId, use_stream: StreamRef) -> ResourceResult<()> {
        self.finish_block_use(block, use_stream, Access::Read)
    }

    fn prepare_block_use(&self, block: &BlockId, use_stream: StreamRef, access: Access) -> ResourceResult<()> {
        self.prepare_block_uses(use_stream, &[BlockUse { block: *block, access }])
    }

    fn finish_block_use(&self, block: &BlockId, use_stream: StreamRef, access: Access) -> ResourceResult<()> {
        let mut st = lock(&self.state);
        st.record(block, self.ordinal)?;
        let event = self.events.record(use_stream.raw)?;
        st.record_mut(block, self.ordinal)?.record_use(use_stream.raw, access, &event);
        Ok(())
    }

    fn prepare_block_uses(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
        let mut st = lock(&self.state);
        let mut waits: Vec<Arc<PooledEvent>> = Vec::new();
        // Blocks never used since allocation, now used on another stream:
        // the allocation is ordered on its own stream only (the pool may
        // hand out memory whose previous owner's work is still queued
        // there), so the first foreign use must wait for that stream.
        let mut first_use_streams: Vec<RawStream> = Vec::new();
        for u in uses {
            let rec = st.record(&u.block, self.ordinal)?;
            if rec.tracking.is_none() && rec.size > 0 && rec.stream.raw != stream.raw {
                first_use_streams.push(rec.stream.raw);
            }
        }
        first_use_streams.sort_unstable();
        first_use_streams.dedup();
        // Record every fence before changing any block, so a failed record
        // leaves all state as it was.
        let fences = first_use_streams
            .iter()
            .map(|&s| self.events.record(s).map(|e| (s, e)))
            .collect::<ResourceResult<Vec<_>>>()?;
        for u in uses {
            let rec = st.record_mut(&u.block, self.ordinal)?;
            if rec.tracking.is_none() {
                if let Some((_, fence)) = fences.iter().find(|(s, _)| *s == rec.stream.raw) {
                    // The allocation counts as the block's first write.
                    rec.record_use(rec.stream.raw, Access::Write, fence);
                }
            }
            rec.waits_for(stream.raw, u.access, &mut waits);
        }
        // One wait per distinct event: blocks finished by one launch share it.
        waits.sort_by_key(|e| e.raw);
        waits.dedup_by_key(|e| e.raw);
        self.wait_all(stream.raw, &waits)
    }

    fn finish_block_uses(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
        let mut st = lock(&self.state);
        for u in uses {
            st.record(&u.block, self.ordinal)?;
        }
        if uses.is_empty() {
            return Ok(());
        }
        let event = self.events.record(stream.raw)?;
        for u in uses {
            st.record_mut(&u.block, self.ordinal)?.record_use(stream.raw, u.access, &event);
        }
        Ok(())
    }
}
