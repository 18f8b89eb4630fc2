//! Fault injection shared by every backend: fail the Nth subsequent device
//! call of one kind (allocation, free, event record, stream creation, and
//! the arena's page mapping and unmapping).
//!
//! The counters live here, not in a backend, so that the same reliability
//! tests (tests/fault_sweep.rs) can arm the same faults on the sim device
//! and on a real GPU. A backend checks [`Faults::hit`] at the top of each
//! targeted call, *before* it touches the driver or its own state, and on a
//! hit returns [`DeviceError::InjectedFault`](crate::error::DeviceError):
//! an injected failure never changes anything, exactly like a driver call
//! that fails its argument checks.
//!
//! Cost when nothing is armed: one relaxed atomic load per targeted call.
//! The slots are written only by [`Faults::arm`] and by the call that
//! counts down an armed slot, so the cache line stays shared otherwise.

use std::sync::atomic::{AtomicU64, Ordering};

/// Which device operation an injected fault targets.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// `alloc_async` / `alloc_sync` (`cuMemAllocAsync` / `cuMemAlloc`).
    Alloc,
    /// `free_async` / `free_sync` (`cuMemFreeAsync` / `cuMemFree`).
    Free,
    /// `record_event` (`cuEventRecord`).
    EventRecord,
    /// `create_stream` (`cuStreamCreate`); imported streams are not counted.
    StreamCreate,
    /// Creation of xlog's own memory pool (`use_private_pool`).
    PoolCreate,
    /// Mapping physical memory and granting access to it (`vm_map` and
    /// `vm_set_access`: `cuMemMap`, `cuMemSetAccess`). Not in the C ABI's
    /// fault kinds.
    Map,
    /// Unmapping and releasing physical memory (`vm_unmap` and
    /// `vm_release`: `cuMemUnmap`, `cuMemRelease`). Not in the C ABI's
    /// fault kinds.
    Unmap,
}

/// One countdown per fault kind.
#[derive(Debug, Default)]
pub struct Faults {
    /// 0 = disarmed; n = fail the nth call from now.
    alloc: AtomicU64,
    free: AtomicU64,
    event_record: AtomicU64,
    stream_create: AtomicU64,
    pool_create: AtomicU64,
    map: AtomicU64,
    unmap: AtomicU64,
}

impl Faults {
    fn slot(&self, kind: FaultKind) -> &AtomicU64 {
        match kind {
            FaultKind::Alloc => &self.alloc,
            FaultKind::Free => &self.free,
            FaultKind::EventRecord => &self.event_record,
            FaultKind::StreamCreate => &self.stream_create,
            FaultKind::PoolCreate => &self.pool_create,
            FaultKind::Map => &self.map,
            FaultKind::Unmap => &self.unmap,
        }
    }

    /// Fail the `nth` call of `kind` from now (1 = the next one); 0 disarms.
    /// Arming replaces any countdown already running for that kind.
    pub fn arm(&self, kind: FaultKind, nth: u64) {
        self.slot(kind).store(nth, Ordering::Release);
    }

    /// Count one call of `kind`; true if this call is the one to fail. A
    /// fault fires once and the slot is then disarmed. Concurrent callers
    /// each take one step of the countdown, so exactly one of them fires.
    pub fn hit(&self, kind: FaultKind) -> bool {
        let slot = self.slot(kind);
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            if current == 0 {
                return false;
            }
            match slot.compare_exchange_weak(current, current - 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return current == 1,
                Err(actual) => current = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fires_once_on_the_nth_call_per_kind() {
        let f = Faults::default();
        f.arm(FaultKind::Free, 3);
        assert!(!f.hit(FaultKind::Alloc), "other kinds are not counted");
        assert!(!f.hit(FaultKind::Free));
        assert!(!f.hit(FaultKind::Free));
        assert!(f.hit(FaultKind::Free));
        assert!(!f.hit(FaultKind::Free), "a fault fires once");
        f.arm(FaultKind::EventRecord, 1);
        f.arm(FaultKind::EventRecord, 0);
        assert!(!f.hit(FaultKind::EventRecord), "0 disarms");
    }

    #[test]
    fn concurrent_callers_fire_exactly_once() {
        let f = Arc::new(Faults::default());
        f.arm(FaultKind::Alloc, 5000);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let f = f.clone();
                std::thread::spawn(move || (0..1000).filter(|_| f.hit(FaultKind::Alloc)).count())
            })
            .collect();
        let fired: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(fired, 1);
    }
}
