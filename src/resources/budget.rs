//! `GlobalDeviceBudget`: one byte limit on the device memory an allocator
//! holds (DESIGN.md "Physical memory": charged where it is taken). It is a
//! policy the allocator consults, handed to it at construction, not a
//! layer of the stack.
//!
//! Contract:
//! - **Charge where memory is taken.** The allocator charges the budget
//!   right before it takes device memory from the driver: the arena a
//!   page before `cuMemCreate`, pool memory a block before the driver
//!   allocation, a capture its private memory, Direct each block. The
//!   charge is one compare-and-swap that succeeds only while
//!   `reserved + bytes <= limit` (the atomic form of "check and reserve
//!   under one lock"); a driver call that fails rolls it back. A cache
//!   hit, or a page the arena already holds, costs the budget nothing.
//! - **Release where memory goes back.** `HeldBytes` (the held total an
//!   allocator shares with its memories) uncharges the budget whenever it
//!   drops: when reap sees a free complete, when trim, pressure or a
//!   released capture pool gives memory back, when the arena releases a
//!   page. Direct, which holds no such total, uncharges each synchronous
//!   free. So `reserved` equals what the allocator holds (live + cached +
//!   pending) at every quiescent moment, and is never lower while a call
//!   is under way (a charge precedes the driver call, a release follows
//!   it): concurrent callers never see room that is not there.
//! - **Pressure.** `allocate` is the allocator's allocation under the
//!   budget: a refusal (the only source of `OutOfBudget` below it is this
//!   budget) first has the allocator relieve pressure (give cached memory
//!   back, reap) and retries; then, with `wait_on_pressure` and only if
//!   the request would fit next to the live bytes, it waits for pending
//!   frees and retries once more; then it refuses with requested, live,
//!   cached, pending, limit and remaining in the error.
//!
//! Locks: none. The refusal message reads the allocator's usage (its
//! locks), so the allocator charges with none of its own locks held.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::resource::{Allocator, ChargeGate, ResourceError, ResourceResult};

pub struct GlobalDeviceBudget {
    limit: u64,
    wait_on_pressure: bool,
    reserved: AtomicU64,
    /// Refusals by this budget answered by relieving pressure and trying
    /// again (`num_alloc_retries` in PyTorch's terms).
    retries: AtomicU64,
}

impl GlobalDeviceBudget {
    pub fn new(limit: u64, wait_on_pressure: bool) -> Self {
        GlobalDeviceBudget { limit, wait_on_pressure, reserved: AtomicU64::new(0), retries: AtomicU64::new(0) }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Refused allocations retried after relieving pressure.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Bytes charged to the budget (live + cached + pending).
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.reserved())
    }

    /// Reserve `bytes` if they fit under the limit; else the reservation
    /// seen (unchanged).
    fn try_reserve(&self, bytes: u64) -> Result<(), u64> {
        let fits = |r: u64| r.checked_add(bytes).filter(|&total| total <= self.limit);
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, fits)
            .map(|_| ())
    }

    /// Give back `bytes` charged earlier.
    pub(crate) fn release(&self, bytes: u64) {
        if bytes > 0 {
            self.reserved.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// The allocation `attempt` of `owner` under this budget, relieving
    /// pressure on a refusal (module docs). `attempt` charges the gate it
    /// is given before it takes device memory.
    #[inline]
    pub(crate) fn allocate<T>(
        &self,
        owner: &dyn Allocator,
        bytes: u64,
        attempt: impl Fn(&dyn ChargeGate) -> ResourceResult<T>,
    ) -> ResourceResult<T> {
        let gate = Charge { budget: self, owner };
        let (mut relieved, mut waited) = (false, false);
        loop {
            let refused = match attempt(&gate) {
                Err(ResourceError::OutOfBudget { live, cached, pending, limit, remaining, requested }) => {
                    (live, cached, pending, limit, remaining, requested)
                }
                other => return other,
            };
            let (live, cached, pending, limit, remaining, requested) = refused;
            // Waiting for frees can only help if the request fits next to
            // the live bytes (`requested` is its device size).
            let could_fit = pending + cached > 0 && live.checked_add(requested).is_some_and(|t| t <= limit);
            let wait = if !relieved {
                relieved = true;
                false
            } else if self.wait_on_pressure && !waited && could_fit {
                waited = true;
                true
            } else {
                // Name the caller's request (the charge was its device size).
                return Err(ResourceError::OutOfBudget { requested: bytes, live, cached, pending, limit, remaining });
            };
            self.retries.fetch_add(1, Ordering::Relaxed);
            owner.relieve_pressure(bytes, wait)?;
        }
    }
}

/// The budget as the gate an allocator charges, naming `owner`'s usage
/// in a refusal.
struct Charge<'a> {
    budget: &'a GlobalDeviceBudget,
    owner: &'a dyn Allocator,
}

impl ChargeGate for Charge<'_> {
    fn try_charge(&self, bytes: u64) -> ResourceResult<()> {
        self.budget.try_reserve(bytes).map_err(|seen| {
            let usage = self.owner.usage();
            ResourceError::OutOfBudget {
                requested: bytes,
                live: usage.live_bytes,
                cached: usage.cached_bytes,
                pending: usage.pending_bytes,
                limit: self.budget.limit,
                remaining: self.budget.limit.saturating_sub(seen),
            }
        })
    }

    fn uncharge(&self, bytes: u64) {
        self.budget.release(bytes);
    }
}

/// Device bytes an allocator holds (live + cached + pending: the arena's
/// pages, capture memory, the driver pool's blocks) and their peak, shared
/// by the allocator and its memories. Every drop uncharges the budget, if
/// any (module docs).
#[derive(Default)]
pub struct HeldBytes {
    now: AtomicU64,
    peak: AtomicU64,
    budget: Option<Arc<GlobalDeviceBudget>>,
}

impl HeldBytes {
    pub fn new(budget: Option<Arc<GlobalDeviceBudget>>) -> HeldBytes {
        HeldBytes { budget, ..HeldBytes::default() }
    }

    /// `bytes` were taken from the driver (after the budget charged them).
    pub fn add(&self, bytes: u64) {
        let now = self.now.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// `bytes` went back to the driver: uncharged.
    pub fn sub(&self, bytes: u64) {
        self.now.fetch_sub(bytes, Ordering::AcqRel);
        if let Some(budget) = &self.budget {
            budget.release(bytes);
        }
    }

    pub fn now(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    pub fn reset_peak(&self) {
        self.peak.store(self.now(), Ordering::Relaxed);
    }

    /// Put the peak back to `before` if it still reads `seen` (memory taken
    /// for a request that was then refused leaves no peak behind).
    pub fn restore_peak(&self, seen: u64, before: u64) {
        let _ = self.peak.compare_exchange(seen, before, Ordering::Relaxed, Ordering::Relaxed);
    }
}
