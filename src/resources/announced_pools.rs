//! `AnnouncedPools`: captures that a framework begins itself and announces
//! to xlog around them (PyTorch's `CUDAPluggableAllocator` hooks
//! `beginAllocateToPool` / `endAllocateToPool` / `releasePool`, reaching the
//! runtime through `xlog_torch_*_pool`).
//!
//! Contract (DESIGN: "Stream capture", "Captures announced by a framework"):
//! - A *pool* is the framework's name for a graph's memory (PyTorch's
//!   `MempoolId_t`, a pair of integers). `begin(pool, origin)` says that a
//!   capture into that pool is about to begin on stream `origin` (None:
//!   not known). From then until `end(pool)`, the announcement *watches*:
//!   the capture pools count it as active, so the allocator asks the
//!   driver which capture each stream it touches takes part in (the hot
//!   path pays one atomic load only while no capture and no announcement
//!   is under way).
//! - `adopt(capture, ...)`: the allocator met a stream in a capture it does
//!   not know. A watching announcement whose origin stream takes part in
//!   that very capture claims it (the latest such begin, when several do);
//!   with no origin known, the capture goes to the only watching
//!   announcement without one, if there is exactly one. The adopted capture
//!   is then active in the capture pools exactly as one begun through
//!   `xlog_capture_begin` (same rules, its memory from its private pool),
//!   and belongs to the announcement's pool. A capture no announcement
//!   claims is left alone (what the allocator did before).
//! - `end(pool)` (after the framework ended the capture): one begin of that
//!   pool stops watching, and its capture ends in the capture pools. Each
//!   begin is ended once: an `end` with no begin of the pool left to end
//!   (every begin ended already, or none made) is refused and changes
//!   nothing. A begin swept (below) still owes its end, which the sweep
//!   cannot know will never come: that end is accepted and ends nothing.
//! - Each `begin` is one user of the pool (pools may be shared by several
//!   graphs); `release(pool)` drops one, and when the last is gone the
//!   pool's captures are handed back to the caller, which orphans them in
//!   the capture pools: their memory goes back to the driver once their
//!   blocks are free. A release is a graph of the pool going away, so one
//!   needs an ended begin among the users: while every user still watches
//!   (no graph of the pool can exist yet), `release` is refused and
//!   changes nothing. Users whose begin ended may go while other captures
//!   into the pool run (PyTorch destroys one graph of a shared pool while
//!   it captures another). Of a pool never announced, refused.
//! - A begin whose capture is over without an `end` (the framework's
//!   capture failed: PyTorch then never calls `endAllocateToPool` nor
//!   `releasePool`) would watch for ever; `begin` sweeps such begins first:
//!   one whose adopted capture the driver no longer reports, and one that
//!   never met its capture whose origin is the new begin's origin and is
//!   not capturing. Their captures end; their memory stays with the pool
//!   (released with it, or at close).
//!
//! Lock order: this module's lock, then the capture pools' lock (never the
//! other way). The driver is asked (`capture_of`, never blocking) under
//! this lock, only when a capture is first met or a begin is swept.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::capture_pool::CapturePools;
use crate::device::{Device, RawStream};
use crate::error::ResourceError;
use crate::fast_hash::FastMap;
use crate::resource::ResourceResult;

pub use crate::ids::PoolKey;

/// One `begin` not yet ended.
struct Begin {
    /// The stream the capture is begun on, if known.
    origin: Option<RawStream>,
    /// Order of the begins (the latest claims a capture first).
    sequence: u64,
    /// The capture it adopted (0: none yet) and a stream seen in it.
    capture: u64,
    seen_on: RawStream,
}

#[derive(Default)]
struct Announced {
    /// Begins not yet released (the pool's users).
    users: u32,
    /// Begins not yet ended: they watch.
    watching: Vec<Begin>,
    /// Begins swept whose `end` has not come (it may never: contract).
    swept: u32,
    /// Every capture adopted for this pool.
    captures: Vec<u64>,
}

/// What `release` did.
#[derive(Debug, PartialEq, Eq)]
pub enum PoolRelease {
    /// Other users of the pool remain (this many).
    StillUsed(u32),
    /// The last user is gone: these captures are to be orphaned.
    Last(Vec<u64>),
}

#[derive(Default)]
pub(crate) struct AnnouncedPools {
    pools: Mutex<FastMap<PoolKey, Announced>>,
    /// The capture adopted last (0: none): met again, no lock is taken.
    last_adopted: AtomicU64,
    sequence: AtomicU64,
}

fn lock(m: &Mutex<FastMap<PoolKey, Announced>>) -> std::sync::MutexGuard<'_, FastMap<PoolKey, Announced>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn name(pool: PoolKey) -> String {
    format!("pool ({}, {})", pool.0, pool.1)
}

/// Whether the driver still reports `capture` on `stream`. A failed query
/// counts as over: the stream cannot be part of a capture we could serve.
fn still_capturing(device: &dyn Device, stream: RawStream, capture: u64) -> bool {
    matches!(device.capture_of(stream), Ok(Some(c)) if c == capture)
}

impl AnnouncedPools {
    /// A capture into `pool` is about to begin on `origin`.
    pub fn begin(&self, pool: PoolKey, origin: Option<RawStream>, device: &dyn Device, captures: &CapturePools) {
        let mut pools = lock(&self.pools);
        // Sweep begins left behind by failed captures (contract).
        for announced in pools.values_mut() {
            let before = announced.watching.len();
            announced.watching.retain(|b| {
                let over = if b.capture != 0 {
                    !still_capturing(device, b.seen_on, b.capture)
                } else {
                    b.origin.is_some()
                        && b.origin == origin
                        && matches!(device.capture_of(b.origin.expect("checked")), Ok(None))
                };
                if over {
                    if b.capture != 0 {
                        captures.ended(b.capture);
                    }
                    captures.unwatch();
                }
                !over
            });
            announced.swept += (before - announced.watching.len()) as u32;
        }
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed) + 1;
        let announced = pools.entry(pool).or_default();
        announced.users += 1;
        announced.watching.push(Begin { origin, sequence, capture: 0, seen_on: 0 });
        captures.watch();
    }

    /// The allocator met `stream` in `capture`, which is not one of its
    /// own: a watching begin claims it if it is its capture (contract).
    /// Cheap when `capture` is the one adopted last.
    pub fn adopt(&self, capture: u64, stream: RawStream, device: &dyn Device, captures: &CapturePools) {
        if self.last_adopted.load(Ordering::Acquire) == capture {
            return;
        }
        let mut pools = lock(&self.pools);
        if pools.values().any(|a| a.captures.contains(&capture)) {
            self.last_adopted.store(capture, Ordering::Release);
            return;
        }
        // (pool, index in watching, sequence) of the best claim.
        let mut best: Option<(PoolKey, usize, u64)> = None;
        let mut unknown_origin: Vec<(PoolKey, usize)> = Vec::new();
        for (key, announced) in pools.iter() {
            for (i, b) in announced.watching.iter().enumerate() {
                if b.capture != 0 {
                    continue;
                }
                match b.origin {
                    Some(origin) => {
                        if still_capturing(device, origin, capture) && best.map_or(true, |(_, _, s)| b.sequence > s) {
                            best = Some((*key, i, b.sequence));
                        }
                    }
                    None => unknown_origin.push((*key, i)),
                }
            }
        }
        let claim = match best {
            Some((key, i, _)) => Some((key, i)),
            None if unknown_origin.len() == 1 => Some(unknown_origin[0]),
            None => None,
        };
        let Some((key, i)) = claim else { return };
        let announced = pools.get_mut(&key).expect("found above");
        let b = &mut announced.watching[i];
        b.capture = capture;
        b.seen_on = b.origin.unwrap_or(stream);
        announced.captures.push(capture);
        captures.begun(capture);
        self.last_adopted.store(capture, Ordering::Release);
    }

    /// The framework ended a capture into `pool`: one of its begins stops
    /// watching (one whose capture is over, if the driver tells), and its
    /// capture ends.
    pub fn end(&self, pool: PoolKey, device: &dyn Device, captures: &CapturePools) -> ResourceResult<()> {
        let ordinal = device.ordinal();
        let mut pools = lock(&self.pools);
        let Some(announced) = pools.get_mut(&pool) else {
            return Err(ResourceError::InvalidArgument(format!(
                "{} was never announced on device {ordinal} (an end of allocation to a pool without its begin), or it was released already",
                name(pool)
            )));
        };
        let over = |b: &Begin| {
            if b.capture != 0 {
                !still_capturing(device, b.seen_on, b.capture)
            } else {
                b.origin.map_or(true, |o| matches!(device.capture_of(o), Ok(None)))
            }
        };
        let i = match announced.watching.iter().position(over) {
            Some(i) => i,
            // No watching begin is over: the end of a swept begin, which
            // ended its capture already.
            None if announced.swept > 0 => {
                announced.swept -= 1;
                return Ok(());
            }
            None if !announced.watching.is_empty() => 0,
            None => {
                return Err(ResourceError::InvalidArgument(format!(
                    "{} on device {ordinal} has nothing left to end: each of its {} begin(s) not yet \
                     released was ended already (an end of allocation to a pool without a begin)",
                    name(pool),
                    announced.users
                )))
            }
        };
        let b = announced.watching.remove(i);
        if b.capture != 0 {
            captures.ended(b.capture);
        }
        captures.unwatch();
        Ok(())
    }

    /// One user of `pool` lets go of it (contract).
    pub fn release(&self, pool: PoolKey, ordinal: i32) -> ResourceResult<PoolRelease> {
        let mut pools = lock(&self.pools);
        let Some(announced) = pools.get_mut(&pool) else {
            return Err(ResourceError::InvalidArgument(format!(
                "{} was never announced on device {ordinal}, or its last user released it already",
                name(pool)
            )));
        };
        // Each watching begin is a user: a release needs one more.
        if announced.users as usize <= announced.watching.len() {
            return Err(ResourceError::StreamMisuse(format!(
                "{} on device {ordinal} still has {} capture(s) under way and no other user: a release \
                 is a graph of the pool going away, and none has been made yet; end the allocation \
                 to it (endAllocateToPool) before releasing it",
                name(pool),
                announced.watching.len()
            )));
        }
        if announced.users > 1 {
            announced.users -= 1;
            return Ok(PoolRelease::StillUsed(announced.users));
        }
        let announced = pools.remove(&pool).expect("looked up above");
        Ok(PoolRelease::Last(announced.captures))
    }
}
