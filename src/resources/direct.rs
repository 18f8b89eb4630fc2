//! `Direct`: synchronous allocate/free (`cuMemAlloc`/`cuMemFree`) and no
//! block-use tracking. prepare/finish keep the trait's StreamMisuse default:
//! a free here is immediate and cannot wait for uses on other streams, so
//! callers must order their streams themselves.

use std::sync::{Arc, Mutex, MutexGuard};

use super::block_table::{stale, BlockTable, Record};
use super::allocate_observed;
use super::budget::GlobalDeviceBudget;
use crate::device::Device;
use crate::tag_counters::CountSummary;
use crate::resource::{
    AllocTag, BlockId, BlockState, Captures, ChargeGate, DeviceBlock, DeviceMemoryResource, HeldMemory, StreamTracking, Generation,
    LeakedBlock, ResourceResult, StreamRef, Usage,
};

#[derive(Default)]
struct DirectState {
    blocks: BlockTable<()>,
    live_bytes: u64,
    peak: u64,
}

pub struct Direct {
    device: Arc<dyn Device>,
    ordinal: u32,
    state: Mutex<DirectState>,
    /// The runtime's CSV log, if any: the observer of every allocate and
    /// free (`allocate`, `reserve`; `free`, `release`, `retire`).
    log: Option<Arc<super::logging::CsvLog>>,
    /// The limit each block is charged to before it is taken.
    budget: Option<Arc<GlobalDeviceBudget>>,
}

impl Direct {
    pub fn new(device: Arc<dyn Device>) -> Direct {
        let ordinal = device.ordinal().max(0) as u32;
        Direct { device, ordinal, state: Mutex::default(), log: None, budget: None }
    }

    /// Charge every block to `budget` (`budget.rs`).
    pub fn with_budget(mut self, budget: Option<Arc<GlobalDeviceBudget>>) -> Direct {
        self.budget = budget;
        self
    }

    /// Report every allocate and free to `log`.
    pub fn with_log(mut self, log: Option<Arc<super::logging::CsvLog>>) -> Direct {
        self.log = log;
        self
    }

    fn lock(&self) -> MutexGuard<'_, DirectState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record<'a>(&self, st: &'a DirectState, id: &BlockId) -> ResourceResult<&'a Record<()>> {
        st.blocks.get(id, self.ordinal).unwrap_or_else(|| Err(stale(id)))
    }

    /// One allocate, charging `gate` right before it takes device memory.
    fn allocate_charging(
        &self,
        bytes: u64,
        stream: StreamRef,
        tag: AllocTag,
        gate: &dyn ChargeGate,
    ) -> ResourceResult<DeviceBlock> {
        let generation = Generation::next();
        let Some(held) = crate::resource::granular(bytes) else {
            return Err(super::async_pool::too_big(bytes, gate));
        };
        let ptr = if bytes == 0 {
            0
        } else {
            gate.try_charge(held)?;
            match self.device.alloc_sync(bytes) {
                Ok(ptr) => {
                    if let Some(log) = &self.log {
                        log.reserved(ptr, held, stream.id.0, "");
                    }
                    ptr
                }
                Err(e) => {
                    gate.uncharge(held);
                    return Err(e.into());
                }
            }
        };
        let mut st = self.lock();
        let id = st.blocks.insert(generation, ptr, bytes, held, stream, tag, (), self.ordinal);
        st.live_bytes += held;
        st.peak = st.peak.max(st.live_bytes);
        Ok(DeviceBlock { id, tag, state: BlockState::Live, held })
    }

    /// The synchronous free.
    fn free(&self, id: &BlockId) -> ResourceResult<DeviceBlock> {
        let mut st = self.lock();
        let rec = self.record(&st, id)?;
        let (ptr, size, held, tag) = (rec.ptr, rec.size, rec.held, rec.tag);
        if size > 0 {
            self.device.free_sync(ptr)?;
        }
        st.blocks.remove(id);
        st.live_bytes -= held;
        Ok(DeviceBlock { id: *id, tag, state: BlockState::Retired, held })
    }
}

impl DeviceMemoryResource for Direct {
    fn allocate(&self, bytes: u64, stream: StreamRef, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        let (budget, log) = (self.budget.as_deref(), self.log.as_deref());
        allocate_observed(self, budget, log, bytes, stream, tag, |gate| self.allocate_charging(bytes, stream, tag, gate))
    }

    fn deallocate(&self, id: &BlockId) -> ResourceResult<DeviceBlock> {
        let result = self.free(id);
        if let Ok(freed) = &result {
            // A synchronous free gives the whole block back at once.
            if let Some(budget) = &self.budget {
                budget.release(freed.held);
            }
            if let Some(log) = &self.log {
                log.freed(freed);
            }
        }
        result
    }

    fn validate(&self, id: &BlockId) -> ResourceResult<DeviceBlock> {
        let st = self.lock();
        let rec = self.record(&st, id)?;
        Ok(DeviceBlock { id: *id, tag: rec.tag, state: BlockState::Live, held: rec.held })
    }

    fn usage(&self) -> Usage {
        let st = self.lock();
        Usage {
            live_bytes: st.live_bytes,
            pending_bytes: 0,
            live_blocks: st.blocks.len(),
            pending_blocks: 0,
            peak_outstanding_bytes: st.peak,
            allocations: st.blocks.allocations(),
            deallocations: st.blocks.deallocations(),
            ..Usage::default()
        }
    }

    fn device_ordinal(&self) -> u32 {
        self.ordinal
    }

    fn bytes_outstanding(&self) -> u64 {
        self.lock().live_bytes
    }
}

impl HeldMemory for Direct {
    fn live_blocks(&self) -> Vec<LeakedBlock> {
        let mut out = Vec::new();
        self.lock().blocks.live_blocks(self.ordinal, &mut out);
        out
    }

    fn reset_peak(&self) {
        let mut st = self.lock();
        st.peak = st.live_bytes;
        st.blocks.reset_peak();
    }

    fn count_tags(&self, out: &mut CountSummary) {
        self.lock().blocks.count_tags(out);
    }
}

/// Direct tracks no uses: every tracking call is refused with StreamMisuse
/// (the trait's defaults).
impl StreamTracking for Direct {}

impl Captures for Direct {}
