//! `launch_cache`: the last launch each thread finished, so that the same
//! launch on the same stream again (the steady state of an engine's loop)
//! skips the block table.
//!
//! Contract:
//! - A thread remembers (`remember`) a launch it has just finished through
//!   the locked path when, after it, every block of the launch has that
//!   launch as its last write and no reader: the launch wrote each block,
//!   on one stream, outside any capture, and the blocks all live in one
//!   table shard. It remembers the pool, the stream, the handles in order,
//!   the shard, the shard's version after the finish, and the launch's
//!   event (held by those blocks only).
//! - A shard's version moves with every change of a block's liveness or
//!   recorded uses in it (free, every recorded use), under the shard lock
//!   (`AsyncPool::touched`). So while it has not moved, each block of the
//!   remembered launch is still live, its handle still matches, and its
//!   only recorded use is that launch on that stream.
//! - `prepare` of the same blocks (same pool, handles in order, any
//!   access) on that stream then has nothing to wait for: one atomic load
//!   of the version says so, without a lock or a lookup. It touches no
//!   stream or event, so it is safe without the close protocol's lock (the
//!   pool still refuses it once launches are closed).
//! - `prepare` of the same blocks on another stream needs exactly one
//!   wait, for the remembered event (each block's only recorded use), when
//!   no capture is active: it is queued under the shard lock (where the
//!   event cannot be recycled), with the version checked there, and no
//!   block looked up. Its `finish` there takes the full path but does not
//!   check the handles again (they were checked when the launch was
//!   remembered, and the unchanged version says they still hold).
//! - `finish` of the same launch, under the shard lock and with the
//!   version unchanged, records the remembered event again on the stream
//!   instead of taking a new one: the blocks' state (last write = that
//!   event on that stream, no readers) is what a full finish would leave,
//!   and no other holder of the event exists to see it move. Reads are not
//!   cached: recording a read into the write's event would make later
//!   readers on other streams wait for this read.
//!   Since `deferred_record.rs`, that record is owed rather than made: the
//!   finish marks it owed in the shard's slab (no driver call), and this
//!   thread remembers that it owes it (`owes`). Its next prepare that is
//!   not this launch again settles it once that prepare succeeded
//!   (`Seen::Other::owed_in`), before that launch's work is queued.
//! - `finish` of the same blocks, every use a write, on another stream
//!   (after its `prepare` waited for the remembered event): the blocks'
//!   last write moves to that stream with the same event, whose record
//!   there is owed too; the shard's version moves and this thread
//!   remembers the new stream and version (`moved_to`). No event is taken
//!   and none released.
//! - Anything else (another launch, a read, a capture active anywhere, a
//!   moved version) takes the locked path, which decides as before.

use std::cell::RefCell;

use crate::device::RawStream;
use crate::resource::{BlockId, BlockUse};

/// Launches of more blocks than this are not remembered.
pub(super) const MAX_BLOCKS: usize = 8;

/// What a hit hands back: the shard, the version seen, the event, and
/// whether this thread owes the event's record (`deferred_record.rs`).
#[derive(Copy, Clone)]
pub(super) struct Remembered {
    pub shard: usize,
    pub version: u64,
    pub event: u32,
    pub owed: bool,
}

/// What `lookup` saw.
pub(super) enum Seen {
    /// The remembered launch: the stream it ran on last, and what was
    /// remembered (its version still to be checked).
    Same(RawStream, Remembered),
    /// Another launch; `owed_in`: the shard where this thread owes a record
    /// for the pool asked about.
    Other { owed_in: Option<usize> },
}

struct Stash {
    /// 0: nothing remembered (pool ids start at 1).
    pool: u64,
    stream: RawStream,
    len: usize,
    blocks: [BlockId; MAX_BLOCKS],
    at: Remembered,
}

thread_local! {
    static LAST: RefCell<Stash> = const {
        RefCell::new(Stash {
            pool: 0,
            stream: 0,
            len: 0,
            blocks: [BlockId::NONE; MAX_BLOCKS],
            at: Remembered { shard: 0, version: 0, event: 0, owed: false },
        })
    };
}

/// Whether `uses` names the remembered launch's blocks in the same order
/// (any access): what a prepare or a finish needs.
pub(super) fn lookup(pool: u64, uses: &[BlockUse]) -> Seen {
    LAST.with(|last| {
        let s = last.borrow();
        if s.pool != pool {
            return Seen::Other { owed_in: None };
        }
        let same = s.len == uses.len() && uses.iter().zip(&s.blocks[..s.len]).all(|(u, b)| u.block == *b);
        if same {
            Seen::Same(s.stream, s.at)
        } else {
            Seen::Other { owed_in: s.at.owed.then_some(s.at.shard) }
        }
    })
}

/// The remembered launch's record is now owed (a finish deferred it).
pub(super) fn owes() {
    LAST.with(|last| last.borrow_mut().at.owed = true);
}

/// The remembered launch ran again on `stream`, which its blocks' last
/// write moved to, leaving the shard at `version`; its record there is
/// owed.
pub(super) fn moved_to(stream: RawStream, version: u64) {
    LAST.with(|last| {
        let mut s = last.borrow_mut();
        s.stream = stream;
        s.at.version = version;
        s.at.owed = true;
    });
}

/// This thread owes no record any more (it settled its shard's).
pub(super) fn paid() {
    LAST.with(|last| last.borrow_mut().at.owed = false);
}

/// Remember the launch `uses` just finished on `stream` (see the contract
/// for when a caller may). A launch of more than `MAX_BLOCKS` blocks is
/// not remembered; whatever was stays (its shard's version says whether it
/// is still good). Written in place: only the launch's own handles move.
pub(super) fn remember(pool: u64, stream: RawStream, uses: &[BlockUse], at: Remembered) {
    if uses.is_empty() || uses.len() > MAX_BLOCKS {
        return;
    }
    LAST.with(|last| {
        let mut s = last.borrow_mut();
        for (slot, u) in s.blocks.iter_mut().zip(uses) {
            *slot = u.block;
        }
        s.pool = pool;
        s.stream = stream;
        s.len = uses.len();
        s.at = at;
    });
}
