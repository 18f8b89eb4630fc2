//! Resources, one per file. Decorators wrap an inner resource.

pub mod announced_pools;
pub mod arena;
pub mod async_pool;
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
pub use logging::LoggingResource;

/// A mutex's guard, poisoning ignored: every lock of this layer guards
/// state that a panicking holder leaves consistent.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
