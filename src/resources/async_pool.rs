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

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::{Device, RawEvent, RawStream};
use crate::fast_hash::FastMap;
use crate::resource::{
    Access, AllocTag, BlockId, BlockState, BlockUse, DeviceBlock, DeviceMemoryResource,
    Generation, LeakedBlock, ResourceError, ResourceResult, StreamId, StreamRef, Usage,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Index of an event in [`Events`].
type Ev = u32;

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
            self.free.push(ev);
        }
    }
}

/// One recorded use: the stream it ran on and the event after it.
#[derive(Copy, Clone)]
struct Use {
    stream: RawStream,
    event: Ev,
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
    fn waits_for(&self, stream: RawStream, access: Access, out: &mut Vec<Ev>) {
        let Some(t) = &self.tracking else { return };
        if let Some(w) = &t.last_write {
            if w.stream != stream {
                out.push(w.event);
            }
        }
        if access.writes() {
            out.extend(t.readers.iter().filter(|r| r.stream != stream).map(|r| r.event));
        }
    }

    /// Record a use after `event`, which this block now holds too.
    fn record_use(&mut self, events: &mut Events, stream: RawStream, access: Access, event: Ev) {
        events.hold(event);
        let t = self.tracking.get_or_insert_with(Default::default);
        let new_use = Use { stream, event };
        if access.writes() {
            if let Some(old) = t.last_write.replace(new_use) {
                events.release(old.event);
            }
            for r in t.readers.drain(..) {
                events.release(r.event);
            }
        } else if let Some(r) = t.readers.iter_mut().find(|r| r.stream == stream) {
            let old = std::mem::replace(r, new_use);
            events.release(old.event);
        } else {
            t.readers.push(new_use);
        }
    }

    /// Let go of every event the block holds (it is being freed).
    fn release_tracking(&mut self, events: &mut Events) {
        if let Some(t) = self.tracking.take() {
            for u in t.last_write.iter().chain(t.readers.iter()) {
                events.release(u.event);
            }
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
    event: Ev,
    bytes: u64,
    blocks: u64,
}

#[derive(Default)]
struct PoolState {
    blocks: FastMap<Generation, BlockRecord>,
    pending: FastMap<RawStream, StreamPending>,
    events: Events,
    live_bytes: u64,
    pending_bytes: u64,
    pending_blocks: u64,
    peak_outstanding: u64,
    waits: u64,
}

impl PoolState {
    fn record(&self, id: &BlockId, ordinal: u32) -> ResourceResult<&BlockRecord> {
        let rec = self.blocks.get(&id.generation).ok_or_else(|| stale(id))?;
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
    state: Mutex<PoolState>,
}

impl AsyncPool {
    pub fn new(device: Arc<dyn Device>) -> AsyncPool {
        let ordinal = device.ordinal().max(0) as u32;
        AsyncPool { device, ordinal, state: Mutex::default() }
    }

    /// Queue on `stream` a wait for each event (already deduplicated).
    fn wait_all(&self, st: &mut PoolState, stream: RawStream, events: &[Ev]) -> ResourceResult<()> {
        for &ev in events {
            self.device.stream_wait_event(stream, st.events.raw(ev))?;
            st.waits += 1;
        }
        Ok(())
    }

    /// Seal `p`'s unsealed frees (on `stream`) with one event.
    fn seal(&self, events: &mut Events, stream: RawStream, p: &mut StreamPending) -> ResourceResult<()> {
        if p.unsealed_blocks > 0 {
            let event = events.record(&*self.device, stream)?;
            p.sealed.push_back(SealedBatch { event, bytes: p.unsealed_bytes, blocks: p.unsealed_blocks });
            p.unsealed_bytes = 0;
            p.unsealed_blocks = 0;
        }
        Ok(())
    }
}

impl Drop for AsyncPool {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for slot in &st.events.slots {
            self.device.destroy_event(slot.raw);
        }
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
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let rec = st.record(id, self.ordinal)?;
        let (stream, tag, size, ptr) = (rec.stream.raw, rec.tag, rec.size, rec.ptr);
        if size > 0 {
            let mut waits = Vec::new();
            rec.waits_for(stream, Access::Write, &mut waits);
            waits.sort_unstable();
            waits.dedup();
            self.wait_all(st, stream, &waits)?;
            self.device.free_async(ptr, stream)?;
        }
        if let Some(mut rec) = st.blocks.remove(&id.generation) {
            rec.release_tracking(&mut st.events);
        }
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

    fn deallocate_released(&self, id: &BlockId) -> (ResourceResult<DeviceBlock>, u64) {
        // A free moves bytes from live to pending: outstanding never drops
        // here, only in reap.
        (self.deallocate(id), 0)
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
            cross_stream_waits: st.waits,
            events_recorded: st.events.recorded,
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
            if let Err(e) = self.seal(&mut st.events, stream, p) {
                first_error.get_or_insert(e);
            }
            // Batches of one stream complete in order: stop at the first
            // that is still running.
            while let Some(batch) = p.sealed.front() {
                match self.device.event_query(st.events.raw(batch.event)) {
                    Ok(true) => {
                        bytes += batch.bytes;
                        blocks += batch.blocks;
                        st.events.release(batch.event);
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
        let mut to_wait: Vec<(Ev, RawEvent)> = Vec::new();
        {
            let mut guard = lock(&self.state);
            let st = &mut *guard;
            let mut result = Ok(());
            for (&stream, p) in st.pending.iter_mut() {
                if let Err(e) = self.seal(&mut st.events, stream, p) {
                    result = Err(e);
                    break;
                }
                if let Some(last) = p.sealed.back() {
                    to_wait.push((last.event, st.events.raw(last.event)));
                }
            }
            result?;
            // Held while we wait, so no one re-records them meanwhile.
            for &(ev, _) in &to_wait {
                st.events.hold(ev);
            }
        }
        // Blocking waits happen outside the lock.
        let mut result = Ok(());
        for &(_, raw) in &to_wait {
            if let Err(e) = self.device.event_synchronize(raw) {
                result = Err(e.into());
                break;
            }
        }
        let mut st = lock(&self.state);
        for &(ev, _) in &to_wait {
            st.events.release(ev);
        }
        result
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
        self.finish_block_uses(use_stream, &[BlockUse { block: *block, access }])
    }

    fn prepare_block_uses(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
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
        // Record every fence before changing any block, so a failed record
        // leaves all state as it was.
        let mut fences: Vec<(RawStream, Ev)> = Vec::new();
        if !first_use_streams.is_empty() {
            first_use_streams.sort_unstable();
            first_use_streams.dedup();
            for &s in &first_use_streams {
                match st.events.record(&*self.device, s) {
                    Ok(ev) => fences.push((s, ev)),
                    Err(e) => {
                        for &(_, ev) in &fences {
                            st.events.release(ev);
                        }
                        return Err(e);
                    }
                }
            }
        }
        let mut waits: Vec<Ev> = Vec::new();
        for u in uses {
            let rec = st.blocks.get_mut(&u.block.generation).expect("validated above");
            if rec.tracking.is_none() {
                if let Some(&(_, fence)) = fences.iter().find(|(s, _)| *s == rec.stream.raw) {
                    // The allocation counts as the block's first write.
                    let alloc_stream = rec.stream.raw;
                    rec.record_use(&mut st.events, alloc_stream, Access::Write, fence);
                }
            }
            rec.waits_for(stream.raw, u.access, &mut waits);
        }
        for &(_, ev) in &fences {
            st.events.release(ev);
        }
        // One wait per distinct event: blocks finished by one launch share it.
        if waits.len() > 1 {
            waits.sort_unstable();
            waits.dedup();
        }
        self.wait_all(st, stream.raw, &waits)
    }

    fn finish_block_uses(&self, stream: StreamRef, uses: &[BlockUse]) -> ResourceResult<()> {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        for u in uses {
            st.record(&u.block, self.ordinal)?;
        }
        if uses.is_empty() {
            return Ok(());
        }
        let event = st.events.record(&*self.device, stream.raw)?;
        for u in uses {
            let rec = st.blocks.get_mut(&u.block.generation).expect("validated above");
            rec.record_use(&mut st.events, stream.raw, u.access, event);
        }
        st.events.release(event);
        Ok(())
    }
}
