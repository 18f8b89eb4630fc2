//! The pool's event slabs: reusable events, all created with timing
//! disabled, taken, shared and returned with integer work (no allocation,
//! no second lock on the hot path).
//!
//! Contract: `Events::record` hands out an event recorded on a stream and
//! held once by the caller; `hold`/`release` count its holders (block
//! uses, sealed batches of pending frees, a call in progress), and the
//! event returns to the free list when the last one lets go. A repeated
//! launch's record may be owed instead of made (`defer`, see
//! `deferred_record.rs`); `settle` makes it before anyone waits on an
//! event of the slab.
//!
//! Each table shard owns a slab (launches within one shard take no other
//! lock); the pool owns one shared slab, locked only when a call needs it
//! (`SharedSlab`). Lock order: a table shard → the shared slab.

use std::sync::{Mutex, MutexGuard};

use crate::resources::lock;
use crate::device::{Device, RawEvent, RawStream};
use crate::resource::ResourceResult;
use crate::resources::deferred_record::DeferredRecord;

/// Index of an event in [`Events`].
pub(crate) type Ev = crate::resources::deferred_record::EventIndex;

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
pub(crate) struct Events {
    slots: Vec<EventSlot>,
    free: Vec<Ev>,
    recorded: u64,
    /// A repeated launch's record owed on a stream (`deferred_record.rs`).
    deferred: DeferredRecord,
}

impl Events {
    /// An event recorded on `stream`, held once by the caller. On failure
    /// nothing changes (a new event stays in the free list for later).
    pub(crate) fn record(&mut self, device: &dyn Device, stream: RawStream) -> ResourceResult<Ev> {
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

    /// Records made so far (`Usage::events_recorded`).
    pub(crate) fn recorded(&self) -> u64 {
        self.recorded
    }

    /// Destroy every event of the slab (the pool is being dropped).
    pub(crate) fn destroy_all(&self, device: &dyn Device) {
        for slot in &self.slots {
            device.destroy_event(slot.raw);
        }
    }

    pub(crate) fn raw(&self, ev: Ev) -> RawEvent {
        self.slots[ev as usize].raw
    }

    pub(crate) fn hold(&mut self, ev: Ev) {
        self.slots[ev as usize].refs += 1;
    }

    pub(crate) fn release(&mut self, ev: Ev) {
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
    pub(crate) fn defer(&mut self, device: &dyn Device, ev: Ev, stream: RawStream) -> ResourceResult<()> {
        if self.deferred.is(ev, stream) {
            return Ok(());
        }
        self.settle(device)?;
        self.deferred.owe(ev, stream);
        Ok(())
    }

    /// Make the owed record, if any, before an event of this slab is waited
    /// on. On failure it stays owed and nothing changed.
    pub(crate) fn settle(&mut self, device: &dyn Device) -> ResourceResult<()> {
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
    pub(crate) fn settle_or_sync(&mut self, device: &dyn Device, only_on: Option<RawStream>) {
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
pub(crate) struct SharedSlab<'a> {
    mutex: &'a Mutex<Events>,
    guard: Option<MutexGuard<'a, Events>>,
}

impl<'a> SharedSlab<'a> {
    pub(crate) fn new(mutex: &'a Mutex<Events>) -> SharedSlab<'a> {
        SharedSlab { mutex, guard: None }
    }

    pub(crate) fn get(&mut self) -> &mut Events {
        let mutex = self.mutex;
        self.guard.get_or_insert_with(|| lock(mutex))
    }
}

/// The slab a use's event lives in: its block's shard (`local`) or the
/// shared one.
pub(crate) fn slab<'b>(local: &'b mut Events, shared: &'b mut SharedSlab<'_>, is_shared: bool) -> &'b mut Events {
    if is_shared {
        shared.get()
    } else {
        local
    }
}
