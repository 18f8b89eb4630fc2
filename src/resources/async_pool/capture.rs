//! The pool's side of stream capture: which capture a stream takes part
//! in, the rules for waits across a capture's edge, and capture-private
//! memory (held in `capture_pool.rs`, announced pools in
//! `announced_pools.rs`).
//!
//! Contract (DESIGN.md "Stream capture"): an allocation on a capturing
//! stream comes from that capture's private memory (a synchronous
//! allocation charged to the gate when there is none to reuse), since a
//! replay may use it at any time; its free parks the memory there again.
//! The driver is asked which capture a stream is in only while a capture
//! begun through the runtime (or adopted, or announced) is active. Memory
//! of a pool no graph uses any more goes back: arena blocks to their
//! region, a capture's own memory to the driver.
//!
//! Locks: the block table shard of the allocating stream, alone; the
//! capture pools' own lock inside `CapturePools`.

use super::block::WaitList;
use super::{lock, AsyncPool};
use crate::device::RawStream;
use crate::resource::{AllocTag, Captures, ChargeGate, DeviceBlock, ResourceError, ResourceResult, StreamRef};
use crate::resources::announced_pools::{PoolKey, PoolRelease};

impl AsyncPool {
    /// The capture `stream` takes part in (0: none). Asks the driver only
    /// while a capture begun through the runtime (or adopted) is active, or
    /// an announced one is awaited; a capture met for the first time may be
    /// adopted for an announcement then (`announced_pools.rs`).
    #[inline]
    pub(super) fn capture_of(&self, stream: RawStream) -> ResourceResult<u64> {
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
    pub(super) fn release_ready_orphans(&self) -> u64 {
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
    pub(super) fn give_back_captured(&self, ptr: u64, bytes: u64) -> ResourceResult<u64> {
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
    pub(super) fn admit_waits(&self, waiting: u64, waits: &mut WaitList) -> ResourceResult<()> {
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
    pub(super) fn allocate_in_capture(
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
        if let Some(rec) = shard.blocks.get_mut(&block.id) {
            rec.extra.capture = capture;
        }
        Ok(block)
    }
}

impl Captures for AsyncPool {
    fn capture_begun(&self, id: u64) {
        self.captures.begun(id);
    }

    fn capture_ended(&self, id: u64) {
        self.captures.ended(id);
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
}
