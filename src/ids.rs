//! Identifiers shared by every layer: the backend handles the device layer
//! hands out, and the stream ids and block generations the runtime issues.
//!
//! They live here, below both `device` and `resource`/`error`, so that no
//! layer has to import another one that imports it back.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Backend stream handle (a `CUstream` value, or a sim stream index).
pub type RawStream = u64;
/// A framework's name for a graph's memory pool (PyTorch's `MempoolId_t`,
/// a pair of integers); see `resources/announced_pools.rs`.
pub type PoolKey = (u64, u64);
/// Backend event handle (a `CUevent` value, or a sim event index).
pub type RawEvent = u64;
/// Device address (host address of the arena on the sim backend).
pub type DevicePtr = u64;

/// Public stream identifier. Issued process-wide from one counter, so an id
/// is never reused and an id from one runtime is never valid in another.
/// `0` is never issued.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Block generation: unique for the life of the process, never reused.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(pub u64);

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// Generations a thread takes from the process-wide counter at a time, so
/// threads allocating at once do not all hit one cache line.
const GENERATION_BATCH: u64 = 1024;

impl Generation {
    /// A fresh generation. Generation 0 is never issued, so a zeroed handle
    /// is always rejected. Each thread hands out generations from its own
    /// batch of the process-wide counter: unique across the process and
    /// increasing within a thread (not across threads).
    pub fn next() -> Generation {
        thread_local! {
            static BATCH: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
        }
        BATCH.with(|b| {
            let (next, end) = b.get();
            let g = if next < end {
                next
            } else {
                NEXT_GENERATION.fetch_add(GENERATION_BATCH, Ordering::Relaxed)
            };
            let end = if next < end { end } else { g + GENERATION_BATCH };
            b.set((g + 1, end));
            Generation(g)
        })
    }
}

