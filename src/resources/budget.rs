//! `GlobalDeviceBudget`: one byte limit over everything that flows through it.
//!
//! Accounting: `reserved` equals `inner.bytes_outstanding()` (live + pending)
//! at every quiescent moment, and never exceeds the limit:
//!
//! - allocate reserves `bytes` first — one compare-and-swap that succeeds
//!   only while `reserved + bytes <= limit`, the atomic form of "check and
//!   reserve under one lock" — then calls the inner resource and rolls the
//!   reservation back if that fails;
//! - deallocate and reap release exactly the drop in the inner's
//!   outstanding bytes that the inner reports for that call
//!   (`deallocate_released`, `reap_pending`). A synchronous inner drops by
//!   the block size on free; a stream-ordered one does not move on free (the
//!   bytes become pending and stay charged, because the GPU may still be
//!   using them) and drops only when reap retires completed frees. One rule
//!   covers both.
//!
//! Between the inner call and the release the reservation can only be
//! higher than what the inner holds, never lower, so concurrent callers
//! never see room that is not there. No lock is held across the inner call,
//! so the budget adds two atomic operations to an allocate+free pair
//! instead of a second lock.
//!
//! The budget is the inner's gate (`ChargeGate`): the inner asks it only
//! when it takes new memory from the driver, so a cache hit costs the
//! budget nothing (its bytes were charged when they first came from the
//! driver, and stay charged while cached).
//!
//! Under pressure an allocation that does not fit first has the inner give
//! cached memory back to the driver and reap, then, with
//! `wait_on_pressure`, wait for pending frees to finish and reap again, and
//! only then refuses with requested, live, cached, pending and limit in the
//! error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::device::RawStream;
use crate::resources::announced_pools::PoolKey;
use crate::resource::{
    forward_to_inner, AllocTag, BlockId, ChargeGate, DeviceBlock, DeviceMemoryResource,
    ResourceError, ResourceResult, StreamRef, Trimmed,
};

pub struct GlobalDeviceBudget {
    inner: Arc<dyn DeviceMemoryResource>,
    limit: u64,
    wait_on_pressure: bool,
    reserved: AtomicU64,
    /// Refusals by this budget answered by relieving pressure and trying
    /// again (`num_alloc_retries` in PyTorch's terms).
    retries: AtomicU64,
}

impl GlobalDeviceBudget {
    pub fn new(inner: Arc<dyn DeviceMemoryResource>, limit: u64, wait_on_pressure: bool) -> Self {
        let reserved = inner.bytes_outstanding();
        GlobalDeviceBudget { inner, limit, wait_on_pressure, reserved: AtomicU64::new(reserved), retries: AtomicU64::new(0) }
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

    fn release(&self, bytes: u64) {
        if bytes > 0 {
            self.reserved.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// The refusal of `bytes` when the reservation stood at `seen`.
    fn refusal(&self, bytes: u64, seen: u64) -> ResourceError {
        let usage = self.inner.usage();
        ResourceError::OutOfBudget {
            requested: bytes,
            live: usage.live_bytes,
            cached: usage.cached_bytes,
            pending: usage.pending_bytes,
            limit: self.limit,
            remaining: self.limit.saturating_sub(seen),
        }
    }
}

impl ChargeGate for GlobalDeviceBudget {
    fn try_charge(&self, bytes: u64) -> ResourceResult<()> {
        self.try_reserve(bytes).map_err(|seen| self.refusal(bytes, seen))
    }

    fn uncharge(&self, bytes: u64) {
        self.release(bytes);
    }
}

impl DeviceMemoryResource for GlobalDeviceBudget {
    fn allocate_gated(
        &self,
        bytes: u64,
        stream: StreamRef,
        tag: AllocTag,
        gate: &dyn ChargeGate,
    ) -> ResourceResult<DeviceBlock> {
        // A budget under another gate: both must allow the growth.
        let both = Both { first: self, second: gate };
        self.allocate_under(bytes, stream, tag, &both)
    }

    fn allocate(&self, bytes: u64, stream: StreamRef, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        self.allocate_under(bytes, stream, tag, self)
    }

    fn deallocate(&self, block: &BlockId) -> ResourceResult<DeviceBlock> {
        self.deallocate_released(block).0
    }

    fn deallocate_released(&self, block: &BlockId) -> (ResourceResult<DeviceBlock>, u64) {
        let (result, released) = self.inner.deallocate_released(block);
        self.release(released);
        (result, released)
    }

    fn reap_pending(&self) -> ResourceResult<u64> {
        let retired = self.inner.reap_pending()?;
        self.release(retired);
        Ok(retired)
    }

    fn trim(&self, keep_bytes: u64) -> ResourceResult<Trimmed> {
        let t = self.inner.trim(keep_bytes)?;
        self.release(t.retired);
        Ok(t)
    }

    fn relieve_pressure(&self, need: u64, wait: bool) -> ResourceResult<u64> {
        let retired = self.inner.relieve_pressure(need, wait)?;
        self.release(retired);
        Ok(retired)
    }

    fn retire_stream(&self, stream: RawStream) -> ResourceResult<u64> {
        let retired = self.inner.retire_stream(stream)?;
        self.release(retired);
        Ok(retired)
    }

    fn release_capture(&self, id: Option<u64>) -> ResourceResult<u64> {
        let released = self.inner.release_capture(id)?;
        self.release(released);
        Ok(released)
    }

    fn pool_ended(&self, pool: PoolKey) -> ResourceResult<u64> {
        let released = self.inner.pool_ended(pool)?;
        self.release(released);
        Ok(released)
    }

    fn release_pool(&self, pool: PoolKey) -> ResourceResult<u64> {
        let released = self.inner.release_pool(pool)?;
        self.release(released);
        Ok(released)
    }

    forward_to_inner!();
}

impl GlobalDeviceBudget {
    /// Allocate through the inner with `gate`; on a refusal by this budget,
    /// relieve pressure (give the cache back, reap; then, with
    /// `wait_on_pressure`, wait and reap) and try again.
    fn allocate_under(
        &self,
        bytes: u64,
        stream: StreamRef,
        tag: AllocTag,
        gate: &dyn ChargeGate,
    ) -> ResourceResult<DeviceBlock> {
        let (mut relieved, mut waited) = (false, false);
        loop {
            match self.inner.allocate_gated(bytes, stream, tag, gate) {
                Err(refused @ ResourceError::OutOfBudget { .. }) if self.is_mine(&refused) => {
                    // Waiting for frees can only help if the request fits
                    // next to the live bytes (`requested` is its device size).
                    let could_fit = match &refused {
                        ResourceError::OutOfBudget { requested, live, pending, cached, limit, .. } => {
                            pending + cached > 0 && live.checked_add(*requested).is_some_and(|t| t <= *limit)
                        }
                        _ => false,
                    };
                    let wait = if !relieved {
                        relieved = true;
                        false
                    } else if self.wait_on_pressure && !waited && could_fit {
                        waited = true;
                        true
                    } else {
                        // Name the caller's request (the charge was its
                        // device size).
                        return Err(match refused {
                            ResourceError::OutOfBudget { live, cached, pending, limit, remaining, .. } => {
                                ResourceError::OutOfBudget { requested: bytes, live, cached, pending, limit, remaining }
                            }
                            other => other,
                        });
                    };
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    let retired = self.inner.relieve_pressure(bytes, wait)?;
                    self.release(retired);
                }
                other => return other,
            }
        }
    }

    /// Whether a refusal came from this budget (not one below it).
    fn is_mine(&self, e: &ResourceError) -> bool {
        matches!(e, ResourceError::OutOfBudget { limit, .. } if *limit == self.limit)
    }
}

/// Two gates in a row (a budget under another budget): charge the first,
/// then the second, rolling the first back if the second refuses.
struct Both<'a> {
    first: &'a GlobalDeviceBudget,
    second: &'a dyn ChargeGate,
}

impl ChargeGate for Both<'_> {
    fn try_charge(&self, bytes: u64) -> ResourceResult<()> {
        self.first.try_charge(bytes)?;
        if let Err(e) = self.second.try_charge(bytes) {
            self.first.uncharge(bytes);
            return Err(e);
        }
        Ok(())
    }

    fn uncharge(&self, bytes: u64) {
        self.first.uncharge(bytes);
        self.second.uncharge(bytes);
    }
}
