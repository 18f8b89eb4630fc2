//! The pool's per-block use state (`UseState`, kept in its `BlockTable`
//! records) and its use tracking: the last write and one
//! outstanding read per stream, each a `Use` holding an event of a slab.
//!
//! Contract (DESIGN.md "Semantics"): a read waits for the last write if
//! another stream made it; a write also waits for every other stream's
//! read; same-stream edges are skipped (a stream runs in order). Recording
//! a write replaces the last write and drops the readers; recording a read
//! replaces that stream's earlier read. The record holds one reference on
//! each event it lists, so while its table shard is locked an event cannot
//! be re-recorded and may be waited on without the slab's lock.
//!
//! Locks: none of its own; callers hold the block's table shard (and take
//! the shared slab through `SharedSlab` after it).

use crate::resources::event_slab::{slab, Ev, Events, SharedSlab};
use crate::device::{Device, RawEvent, RawStream};
use crate::inline_list::InlineList;
use crate::resource::{Access, ResourceResult};
use crate::resources::block_table::Record;

/// One recorded use: the stream it ran on and the event after it. The
/// block holds a reference on the event, so while its shard is locked the
/// event cannot be re-recorded and `raw` can be waited on without any
/// events lock.
#[derive(Copy, Clone)]
pub(super) struct Use {
    pub(super) stream: RawStream,
    pub(super) event: Ev,
    pub(super) raw: RawEvent,
    /// The capture the event was recorded in (0: none).
    pub(super) capture: u64,
    /// The event is in the pool's shared slab, not in the block's shard.
    pub(super) shared: bool,
}

/// Events one call waits for (a launch rarely needs more than a few), each
/// with the capture it was recorded in (0: none).
pub(super) type WaitList = InlineList<(RawEvent, u64), 16>;

/// Dependency state, allocated only for blocks that were ever used through
/// prepare/finish, to keep untracked records small.
#[derive(Default)]
pub(super) struct Tracking {
    pub(super) last_write: Option<Use>,
    pub(super) readers: Vec<Use>,
}

/// What the pool keeps per block besides the table's record.
#[derive(Default)]
pub(super) struct UseState {
    pub(super) tracking: Option<Box<Tracking>>,
    /// The capture whose private memory this block is (0: none).
    pub(super) capture: u64,
}

/// A block of the pool's table.
pub(super) type BlockRecord = Record<UseState>;

impl Record<UseState> {
    /// Events `stream` must wait for before an access of kind `access`.
    pub(super) fn waits_for(&self, stream: RawStream, access: Access, out: &mut WaitList) {
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
    pub(super) fn foreign_uses(&self, stream: RawStream, access: Access) -> impl Iterator<Item = &Use> {
        let t = self.extra.tracking.as_deref();
        let write = t.and_then(|t| t.last_write.as_ref());
        let reads = t.filter(|_| access.writes()).map_or(&[][..], |t| &t.readers[..]);
        write.into_iter().chain(reads).filter(move |u| u.stream != stream)
    }

    /// Record `new_use` (its event held by the caller), which this block
    /// now holds too. `local` is the slab of this block's shard.
    pub(super) fn record_use(&mut self, local: &mut Events, shared: &mut SharedSlab<'_>, access: Access, new_use: Use) {
        slab(local, shared, new_use.shared).hold(new_use.event);
        let t = self.extra.tracking.get_or_insert_with(Default::default);
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
    pub(super) fn release_tracking(&mut self, local: &mut Events, shared: &mut SharedSlab<'_>) {
        if let Some(t) = self.extra.tracking.take() {
            for u in t.last_write.iter().chain(t.readers.iter()) {
                slab(local, shared, u.shared).release(u.event);
            }
        }
    }

    /// Whether every recorded use of the block was outside any capture.
    pub(super) fn outside_captures(&self) -> bool {
        let Some(t) = &self.extra.tracking else { return true };
        t.last_write.iter().chain(t.readers.iter()).all(|u| u.capture == 0)
    }

    /// Queue on `stream` the waits a use of kind `access` needs (no capture
    /// active, no use recorded in one): (how many were queued, the first
    /// error). Waits queued before a failing one are harmless (they only
    /// delay the stream).
    pub(super) fn queue_waits(&self, device: &dyn Device, stream: RawStream, access: Access) -> (u64, ResourceResult<()>) {
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
    pub(super) fn nothing_to_wait(&self, stream: RawStream, access: Access) -> bool {
        self.foreign_uses(stream, access).next().is_none()
    }
}
