//! xlog-cuda: a stream-aware device-memory runtime for CUDA.
//!
//! Layers, bottom up: [`device`] (the only code that talks to a driver:
//! CUDA through cudarc, or the host-simulated sim backend), [`resources`]
//! (the `DeviceMemoryResource` stack: budget, logging, async pool, direct),
//! [`stream_pool`], [`runtime`], the framework hooks in `hooks` (PyTorch's
//! and CuPy's allocators over the runtime), and the C ABI in `ffi`.

pub mod call_gate;
pub mod config;
pub mod device;
pub mod error;
pub mod fast_hash;
pub mod ids;
pub mod inline_list;
pub mod resource;
pub mod resources;
pub mod runtime;
pub(crate) mod registry;
pub mod stream_pool;
pub mod tag_counters;
pub mod telemetry;
pub(crate) mod hooks;
pub mod ffi;

pub use config::{AllocatorKind, Config};
pub use device::Backend;
pub use error::{DeviceError, ResourceError, ResourceResult};
pub use resource::{
    Access, AllocTag, BlockId, BlockState, BlockUse, DeviceBlock, DeviceMemoryResource,
    Generation, StreamId, StreamRef,
};
pub use runtime::{CloseReport, Runtime, Stats, UnreleasedStream};

/// Crate version, also returned by `xlog_version()`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
