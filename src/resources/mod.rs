//! The allocators (`async_pool/`, `direct.rs`), their memories (`arena/`,
//! `pool_memory.rs`), the budget they charge (`budget.rs`) and the log
//! they report to (`logging.rs`).

use crate::resource;

pub mod announced_pools;
pub mod arena;
pub mod async_pool;
mod block_table;
pub mod budget;
pub(crate) mod capture_pool;
pub mod direct;
mod deferred_record;
mod event_slab;
mod launch_cache;
pub mod logging;
mod pool_memory;
pub mod stream_cache;

pub use async_pool::AsyncPool;
pub use budget::GlobalDeviceBudget;
pub use direct::Direct;

/// A mutex's guard, poisoning ignored: every lock of this layer guards
/// state that a panicking holder leaves consistent.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An allocator's `allocate`: `attempt` (which charges the gate it is
/// given right before it takes device memory) under `budget`, if any, and
/// the outcome reported to `log`, if any: an `allocate` row, or one
/// `allocate failure` row after the budget's retries.
#[inline]
pub(crate) fn allocate_observed(
    owner: &dyn resource::Allocator,
    budget: Option<&GlobalDeviceBudget>,
    log: Option<&logging::CsvLog>,
    bytes: u64,
    stream: resource::StreamRef,
    tag: resource::AllocTag,
    attempt: impl Fn(&dyn resource::ChargeGate) -> resource::ResourceResult<resource::DeviceBlock>,
) -> resource::ResourceResult<resource::DeviceBlock> {
    let result = match budget {
        None => attempt(&resource::NoCharge),
        Some(budget) => budget.allocate(owner, bytes, attempt),
    };
    if let Some(log) = log {
        match &result {
            Ok(block) => log.allocated(block, stream.id.0),
            Err(e) => log.refused(bytes, stream.id.0, tag, &e.to_string()),
        }
    }
    result
}
