//! Resources, one per file. Decorators wrap an inner resource.

pub mod announced_pools;
pub mod arena;
pub mod async_pool;
pub mod budget;
pub(crate) mod capture_pool;
pub mod direct;
mod deferred_record;
mod launch_cache;
pub mod logging;
pub mod stream_cache;

pub use async_pool::AsyncPool;
pub use budget::GlobalDeviceBudget;
pub use direct::Direct;
pub use logging::LoggingResource;
