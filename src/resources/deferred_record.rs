//! `deferred_record`: the event record of a repeated launch, made when some
//! other party first needs it instead of at every finish.
//!
//! Why: an engine's loop finishes the same launch on the same stream over
//! and over. Each finish would record the launch's event again
//! (`cuEventRecord`, 0.17–0.33 µs on an H100 host) although nobody waits
//! on it until another stream, a free or a capture needs the blocks. The
//! launch cache (`launch_cache.rs`) already knows such a repeat; this
//! module lets its finish leave the record owed instead.
//!
//! Contract (one slot per table shard's event slab):
//! - `defer(event, stream)`: a finish of the cached launch on `stream` has
//!   just been enqueued, and `event` — held only by that launch's blocks,
//!   whose recorded use it stands for — was last recorded before it. The
//!   record is owed: `event` must be recorded on `stream` before anyone
//!   waits on it. The caller holds the shard lock and no capture is active.
//! - Whoever is about to wait on, or otherwise read, an event of the shard
//!   (a prepare on another stream, a free whose stream must wait for other
//!   streams' uses) first settles the slot under the same lock: the event
//!   is recorded on `stream` then. A record made later than the launch is
//!   still correct (it completes only after the launch did); it can only
//!   make the waiter also wait for work queued on `stream` after the
//!   launch. To keep that rare, the thread that deferred settles right
//!   after the successful prepare of its next launch that is not the same
//!   launch again (`AsyncPool::prepare_with`), before that launch's work
//!   is queued (after its prepare, so a refused call records nothing): a
//!   thread that queues all its work through prepare/finish gets the
//!   record where the launch ended, behind at most the new launch's waits.
//! - When the event's last holder lets go (every block moved on to a newer
//!   use, or was freed), the slot is cleared: nobody can wait on it any
//!   more, and the free event may be taken by an unrelated use, which a
//!   late record must never move.
//! - A capture never sees an owed record: captures begun through the
//!   runtime or announced by a framework settle every slot first, and no
//!   record is deferred while one is active or awaited. A stream that
//!   retires (`retire_stream`) settles its owed records while it still
//!   exists.
//! - A record that fails leaves the slot as it was (the caller reports the
//!   error and changes nothing). Where the caller cannot report it
//!   (retirement, announcements), the stream is synchronised instead: all
//!   the work the record had to cover is then complete, and the event's
//!   older record, which is complete too, is as good.
//! - One slot per shard: deferring another (event, stream) while one is
//!   owed settles the first.

use crate::device::RawStream;

/// Index of an event in its slab.
pub(super) type EventIndex = u32;

/// The owed record of one shard, if any.
#[derive(Default, Copy, Clone, PartialEq, Eq, Debug)]
pub(super) struct DeferredRecord {
    owed: Option<(EventIndex, RawStream)>,
}

impl DeferredRecord {
    /// The owed (event, stream), if any.
    pub fn owed(&self) -> Option<(EventIndex, RawStream)> {
        self.owed
    }

    /// Whether exactly this record is owed already.
    pub fn is(&self, event: EventIndex, stream: RawStream) -> bool {
        self.owed == Some((event, stream))
    }

    /// Owe the record of `event` on `stream` (the slot must be empty: the
    /// caller settled any other first).
    pub fn owe(&mut self, event: EventIndex, stream: RawStream) {
        debug_assert!(self.owed.is_none(), "one owed record per shard");
        self.owed = Some((event, stream));
    }

    /// The record was made (or made unnecessary): nothing is owed.
    pub fn clear(&mut self) {
        self.owed = None;
    }

    /// `event`'s last holder let go: a record owed for it is owed to nobody.
    pub fn forget(&mut self, event: EventIndex) {
        if matches!(self.owed, Some((e, _)) if e == event) {
            self.owed = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owe_settle_and_forget() {
        let mut d = DeferredRecord::default();
        assert_eq!(d.owed(), None);
        d.owe(3, 7);
        assert!(d.is(3, 7));
        assert!(!d.is(3, 8));
        d.forget(4);
        assert_eq!(d.owed(), Some((3, 7)), "another event's release leaves the debt");
        d.forget(3);
        assert_eq!(d.owed(), None, "the event's last holder let go");
        d.owe(5, 1);
        d.clear();
        assert_eq!(d.owed(), None);
    }
}
