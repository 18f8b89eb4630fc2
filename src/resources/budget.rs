//! `GlobalDeviceBudget`: one byte limit over everything that flows through it.
//!
//! Accounting: `reserved` equals `inner.bytes_outstanding()` (live + pending)
//! at every quiescent moment. Every allocate, deallocate and reap runs under
//! one lock with the inner call inside it, so no other budget operation can
//! move the inner's outstanding bytes between our two samples:
//!
//! - allocate checks `reserved + bytes <= limit`, reserves first, calls the
//!   inner resource and rolls the reservation back if it fails;
//! - deallocate and reap release exactly the drop they observe in the
//!   inner's outstanding bytes. A synchronous inner drops by the block size
//!   on free; a stream-ordered one does not move on free (the bytes become
//!   pending and stay charged, because the GPU may still be using them) and
//!   drops only when reap retires completed frees. One rule covers both.
//!
//! Under pressure an allocation that does not fit first reaps, then, with
//! `wait_on_pressure`, waits (without the lock) for pending frees to finish
//! and reaps again, and only then refuses with the numbers in the error.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::resource::{
    forward_to_inner, AllocTag, BlockId, DeviceBlock, DeviceMemoryResource, ResourceError,
    ResourceResult, StreamRef,
};

pub struct GlobalDeviceBudget {
    inner: Arc<dyn DeviceMemoryResource>,
    limit: u64,
    wait_on_pressure: bool,
    reserved: Mutex<u64>,
}

impl GlobalDeviceBudget {
    pub fn new(inner: Arc<dyn DeviceMemoryResource>, limit: u64, wait_on_pressure: bool) -> Self {
        let reserved = inner.bytes_outstanding();
        GlobalDeviceBudget { inner, limit, wait_on_pressure, reserved: Mutex::new(reserved) }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged to the budget (live + pending).
    pub fn reserved(&self) -> u64 {
        *self.lock()
    }

    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.reserved())
    }

    fn lock(&self) -> MutexGuard<'_, u64> {
        self.reserved.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reap under the lock and release what the inner really dropped.
    fn reap_locked(&self, reserved: &mut u64) -> ResourceResult<u64> {
        let before = self.inner.bytes_outstanding();
        let result = self.inner.reap_pending();
        let released = before - self.inner.bytes_outstanding();
        *reserved -= released;
        result.map(|_| released)
    }

    fn refusal(&self, bytes: u64, reserved: u64) -> ResourceError {
        let usage = self.inner.usage();
        ResourceError::OutOfBudget {
            requested: bytes,
            live: usage.live_bytes,
            pending: usage.pending_bytes,
            limit: self.limit,
            remaining: self.limit.saturating_sub(reserved),
        }
    }
}

impl DeviceMemoryResource for GlobalDeviceBudget {
    fn allocate(&self, bytes: u64, stream: StreamRef, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        let mut waited = false;
        loop {
            let mut reserved = self.lock();
            let fits = |r: u64| r.checked_add(bytes).is_some_and(|total| total <= self.limit);
            if !fits(*reserved) {
                // Pressure: give back what has already completed.
                let _ = self.reap_locked(&mut reserved);
            }
            if fits(*reserved) {
                *reserved += bytes;
                return match self.inner.allocate(bytes, stream, tag) {
                    Ok(block) => Ok(block),
                    Err(e) => {
                        *reserved -= bytes;
                        Err(e)
                    }
                };
            }
            let pending = self.inner.usage().pending_bytes;
            // Waiting can only help if the pending bytes would make room.
            let could_fit = fits(reserved.saturating_sub(pending));
            if !self.wait_on_pressure || waited || pending == 0 || !could_fit {
                return Err(self.refusal(bytes, *reserved));
            }
            drop(reserved);
            self.inner.wait_pending()?;
            waited = true;
        }
    }

    fn deallocate(&self, block: &BlockId) -> ResourceResult<DeviceBlock> {
        let mut reserved = self.lock();
        let (result, released) = self.inner.deallocate_released(block);
        *reserved -= released;
        result
    }

    fn reap_pending(&self) -> ResourceResult<u64> {
        let mut reserved = self.lock();
        self.reap_locked(&mut reserved)
    }

    forward_to_inner!();
}
