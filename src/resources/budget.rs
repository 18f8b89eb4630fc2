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
//! Under pressure an allocation that does not fit first reaps, then, with
//! `wait_on_pressure`, waits for pending frees to finish and reaps again,
//! and only then refuses with the numbers in the error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::resource::{
    forward_to_inner, AllocTag, BlockId, DeviceBlock, DeviceMemoryResource, ResourceError,
    ResourceResult, StreamRef,
};

pub struct GlobalDeviceBudget {
    inner: Arc<dyn DeviceMemoryResource>,
    limit: u64,
    wait_on_pressure: bool,
    reserved: AtomicU64,
}

impl GlobalDeviceBudget {
    pub fn new(inner: Arc<dyn DeviceMemoryResource>, limit: u64, wait_on_pressure: bool) -> Self {
        let reserved = inner.bytes_outstanding();
        GlobalDeviceBudget { inner, limit, wait_on_pressure, reserved: AtomicU64::new(reserved) }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged to the budget (live + pending).
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

    /// Reap and release what the inner retired.
    fn reap_and_release(&self) -> ResourceResult<u64> {
        let retired = self.inner.reap_pending()?;
        self.release(retired);
        Ok(retired)
    }

    /// The refusal of `bytes` when the reservation stood at `seen`.
    fn refusal(&self, bytes: u64, seen: u64) -> ResourceError {
        let usage = self.inner.usage();
        ResourceError::OutOfBudget {
            requested: bytes,
            live: usage.live_bytes,
            pending: usage.pending_bytes,
            limit: self.limit,
            remaining: self.limit.saturating_sub(seen),
        }
    }
}

impl DeviceMemoryResource for GlobalDeviceBudget {
    fn allocate(&self, bytes: u64, stream: StreamRef, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        let mut waited = false;
        loop {
            let mut reserved = self.try_reserve(bytes);
            if reserved.is_err() {
                // Pressure: give back what has already completed.
                let _ = self.reap_and_release();
                reserved = self.try_reserve(bytes);
            }
            match reserved {
                Ok(()) => {
                    return match self.inner.allocate(bytes, stream, tag) {
                        Ok(block) => Ok(block),
                        Err(e) => {
                            self.release(bytes);
                            Err(e)
                        }
                    };
                }
                Err(seen) => {
                    let pending = self.inner.usage().pending_bytes;
                    // Waiting can only help if the pending bytes would make room.
                    let could_fit = seen
                        .saturating_sub(pending)
                        .checked_add(bytes)
                        .is_some_and(|total| total <= self.limit);
                    if !self.wait_on_pressure || waited || pending == 0 || !could_fit {
                        return Err(self.refusal(bytes, seen));
                    }
                    self.inner.wait_pending()?;
                    waited = true;
                }
            }
        }
    }

    fn deallocate(&self, block: &BlockId) -> ResourceResult<DeviceBlock> {
        let (result, released) = self.inner.deallocate_released(block);
        self.release(released);
        result
    }

    fn reap_pending(&self) -> ResourceResult<u64> {
        self.reap_and_release()
    }

    forward_to_inner!();
}
