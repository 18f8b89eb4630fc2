//! Error types: one enum per layer. [`DeviceError`] is what a backend
//! reports; [`ResourceError`] is what resources and the runtime report, and
//! what the C boundary maps onto `xlog_status`.

use crate::ids::{Generation, StreamId};

/// Failure reported by a device backend (`src/device/`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("device out of memory: requested {requested} bytes, {detail}")]
    OutOfMemory { requested: u64, detail: String },
    #[error("driver call {call} failed with {code} ({name})")]
    Driver { call: &'static str, code: i32, name: String },
    #[error("no device: {0}")]
    NoDevice(String),
    #[error("invalid device request: {0}")]
    Invalid(String),
    #[error("injected fault: {0}")]
    InjectedFault(String),
    /// A bounded backend resource is used up (sim worker threads for
    /// imported streams, sim device instances).
    #[error("exhausted: {0}")]
    Exhausted(String),
}

/// Failure reported by a resource or the runtime. Every variant names the
/// values involved so that a log line is enough to diagnose it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error(
        "out of budget: requested {requested} bytes, live {live}, cached {cached}, \
         pending {pending}, limit {limit}, remaining {remaining}"
    )]
    OutOfBudget { requested: u64, live: u64, cached: u64, pending: u64, limit: u64, remaining: u64 },
    #[error("out of device memory: requested {requested} bytes: {detail}")]
    OutOfMemory { requested: u64, detail: String },
    #[error("driver error: {0}")]
    Driver(String),
    #[error("stream misuse: {0}")]
    StreamMisuse(String),
    #[error("use after free: block generation {generation} at {ptr:#x} is not live ({detail})")]
    UseAfterFree { generation: Generation, ptr: u64, detail: String },
    #[error("unsatisfiable dependency: {0}")]
    UnsatisfiableDependency(String),
    #[error("stream pool exhausted: all {capacity} pooled streams are acquired")]
    PoolExhausted { capacity: u32 },
    /// Another bounded supply is used up: stream ids (never reused), or
    /// streams a backend can import. Reported as XLOG_ERR_POOL_EXHAUSTED.
    #[error("exhausted: {0}")]
    Exhausted(String),
    #[error("no device: {0}")]
    NoDevice(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ResourceError {
    /// Every call on a runtime after its close began.
    pub fn runtime_closed() -> Self {
        ResourceError::InvalidArgument("the runtime has been closed".into())
    }

    /// The refusal of every call made from inside a host callback (see
    /// [`crate::device::in_host_callback`]); the call changes nothing.
    pub fn in_host_callback() -> Self {
        ResourceError::StreamMisuse(
            "called from inside an xlog host callback (xlog_stream_enqueue_host), where no xlog \
             call is allowed: on CUDA a host function must not call the driver, and a wait from \
             it for its own stream would never return; nothing was changed. Make the call before \
             enqueueing the callback, or from another thread"
                .into(),
        )
    }

    pub(crate) fn unknown_stream(id: StreamId) -> Self {
        ResourceError::InvalidArgument(format!(
            "stream {} was never issued by this runtime or has been released",
            id.0
        ))
    }
}

impl From<DeviceError> for ResourceError {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::OutOfMemory { requested, detail } => {
                ResourceError::OutOfMemory { requested, detail }
            }
            DeviceError::NoDevice(m) => ResourceError::NoDevice(m),
            DeviceError::Invalid(m) => ResourceError::InvalidArgument(m),
            DeviceError::Exhausted(m) => ResourceError::Exhausted(m),
            other => ResourceError::Driver(other.to_string()),
        }
    }
}

pub type ResourceResult<T> = Result<T, ResourceError>;
