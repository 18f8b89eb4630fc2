//! The `Device` trait: the only place that talks to a driver. Everything
//! above it (resources, stream pool, runtime) is backend-independent.
//!
//! Handles are plain integers so that no layer above needs `unsafe`: on CUDA
//! a `RawStream`/`RawEvent` is the `CUstream`/`CUevent` pointer value, on the
//! sim backend an index into the sim's own tables.

use crate::error::DeviceError;
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod cuda;
pub mod faults;
pub mod sim;
pub(crate) mod sim_capture;
pub mod sim_platform;
pub(crate) mod sim_vm;

pub use crate::ids::{DevicePtr, RawEvent, RawStream};

/// The granularity the driver hands memory out in (`cuMemAlloc`,
/// `cuMemAllocAsync`; the sim models it): every block's address is a
/// multiple of it, and a block taken in these units holds
/// `bytes.div_ceil(GRANULARITY) * GRANULARITY` of the device.
pub(crate) const GRANULARITY: u64 = 256;

/// A physical memory allocation of the virtual-memory API
/// (`CUmemGenericAllocationHandle` on CUDA, an id on sim).
pub type PhysHandle = u64;
pub use faults::{FaultKind, Faults};

/// How a capture restricts other threads' calls (CUDA's
/// `CUstreamCaptureMode`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    Global,
    ThreadLocal,
    Relaxed,
}

/// Host work queued in stream order.
pub type HostFn = Box<dyn FnOnce() + Send + 'static>;

thread_local! {
    static IN_HOST_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is running a host callback queued with
/// [`Device::enqueue_host`] (`xlog_stream_enqueue_host`).
///
/// The runtime and the C boundary refuse every call made from there with
/// `StreamMisuse`, on both backends alike: on CUDA a host function must not
/// call the driver at all (`cuLaunchHostFunc`'s rule), and on sim a wait
/// for work queued behind the running callback would never return. One rule
/// on both backends means code tested on sim does not break on a GPU.
pub fn in_host_callback() -> bool {
    // Every call asks this; while no thread anywhere runs a callback the
    // answer is no without touching the thread-local (in a shared library
    // each thread-local access is a call into the dynamic loader). A thread
    // inside a callback raised the count before running it, so it always
    // sees it raised and looks at its own flag.
    if CALLBACKS_RUNNING.load(Ordering::Relaxed) == 0 {
        return false;
    }
    IN_HOST_CALLBACK.with(|flag| flag.get())
}

/// Host callbacks running now, on any thread.
static CALLBACKS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Marks the current thread as running a host callback until dropped. Each
/// backend holds one around every callback it runs (the sim's stream worker,
/// the CUDA host trampoline); dropping it restores the previous state, also
/// when the callback panics.
pub struct HostCallbackScope {
    previous: bool,
}

impl HostCallbackScope {
    pub fn enter() -> HostCallbackScope {
        CALLBACKS_RUNNING.fetch_add(1, Ordering::SeqCst);
        HostCallbackScope { previous: IN_HOST_CALLBACK.with(|flag| flag.replace(true)) }
    }
}

impl Drop for HostCallbackScope {
    fn drop(&mut self) {
        IN_HOST_CALLBACK.with(|flag| flag.set(self.previous));
        CALLBACKS_RUNNING.fetch_sub(1, Ordering::SeqCst);
    }
}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// Which backend a device (or a requested runtime) uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// CUDA when a driver and device are present, else sim.
    Auto,
    Cuda,
    Sim,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Cuda => "cuda",
            Backend::Sim => "sim",
        }
    }
}

/// Everything the resources need from a GPU. Implementations are
/// thread-safe; a call may come from any thread.
pub trait Device: Send + Sync {
    fn backend(&self) -> Backend;
    fn ordinal(&self) -> i32;
    /// Human-readable device name ("NVIDIA H100 80GB HBM3", "sim").
    fn name(&self) -> String;
    /// (free, total) device memory in bytes.
    fn mem_info(&self) -> DeviceResult<(u64, u64)>;

    /// Create an owned, non-blocking stream.
    fn create_stream(&self) -> DeviceResult<RawStream>;
    /// Destroy a stream made by `create_stream` (never an imported one).
    fn destroy_stream(&self, stream: RawStream) -> DeviceResult<()>;
    /// Adopt a foreign native stream (a `cudaStream_t`; 0 is the legacy
    /// default stream). Not owned: never destroyed by us.
    fn import_stream(&self, native: u64) -> DeviceResult<RawStream>;
    /// Native handle of a stream (what `xlog_stream_native` returns).
    fn native_stream(&self, stream: RawStream) -> u64;
    /// Block the calling thread until all work queued on `stream` is done.
    fn synchronize_stream(&self, stream: RawStream) -> DeviceResult<()>;
    /// Run `f` on the host once all earlier work on `stream` is done; later
    /// work on `stream` waits for it. `f` must not call into the driver.
    fn enqueue_host(&self, stream: RawStream, f: HostFn) -> DeviceResult<()>;

    /// Stream-ordered allocation (`cuMemAllocAsync`).
    fn alloc_async(&self, bytes: u64, stream: RawStream) -> DeviceResult<DevicePtr>;
    /// Stream-ordered free (`cuMemFreeAsync`): the memory is reusable once
    /// `stream` reaches this point.
    fn free_async(&self, ptr: DevicePtr, stream: RawStream) -> DeviceResult<()>;
    /// Synchronous allocation (`cuMemAlloc`).
    fn alloc_sync(&self, bytes: u64) -> DeviceResult<DevicePtr>;
    /// Synchronous free (`cuMemFree`).
    fn free_sync(&self, ptr: DevicePtr) -> DeviceResult<()>;

    /// Route `alloc_async` through a memory pool of xlog's own (on CUDA,
    /// `cuMemPoolCreate`; the device's default pool, which other libraries
    /// share, is left as it is), keeping up to `release_threshold` bytes of
    /// freed memory mapped at synchronisation points (`u64::MAX` = keep
    /// all). Idempotent; the sim backend has nothing to create but counts
    /// the call for fault injection.
    fn use_private_pool(&self, release_threshold: u64) -> DeviceResult<()> {
        let _ = release_threshold;
        if self.faults().is_some_and(|f| f.hit(FaultKind::PoolCreate)) {
            return Err(DeviceError::InjectedFault(format!(
                "{} memory pool creation on device {}",
                self.backend().name(),
                self.ordinal()
            )));
        }
        Ok(())
    }

    /// Bytes the driver's pool holds for us (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`),
    /// or `None` where there is no such pool (sim, or no pool created).
    fn pool_reserved_bytes(&self) -> Option<u64> {
        None
    }

    /// Ask the driver's pool to unmap the free memory it keeps
    /// (`cuMemPoolTrimTo(pool, 0)`); no-op without a pool.
    fn trim_pool(&self) {}

    // ----- virtual memory (the arena, `resources/arena/`) -----

    /// Whether the virtual-memory calls below work on this device
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`).
    fn supports_vm(&self) -> bool {
        false
    }

    /// The mapping granularity: the size of every physical allocation and
    /// mapping (`cuMemGetAllocationGranularity`, minimum; 2 MiB on Hopper).
    fn vm_granularity(&self) -> u64 {
        0
    }

    /// How much address space the arena reserves for one stream's region
    /// (a multiple of the granularity; a larger request gets a region of
    /// its own size). Address space costs no memory.
    fn vm_region_bytes(&self) -> u64 {
        0
    }

    /// Reserve `bytes` of address space, aligned to the granularity
    /// (`cuMemAddressReserve`). Nothing is mapped.
    fn vm_reserve(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        let _ = bytes;
        Err(self.vm_unsupported("cuMemAddressReserve"))
    }

    /// Give back a reservation made by `vm_reserve`, unmapped
    /// (`cuMemAddressFree`).
    fn vm_free(&self, base: DevicePtr, bytes: u64) -> DeviceResult<()> {
        let _ = (base, bytes);
        Err(self.vm_unsupported("cuMemAddressFree"))
    }

    /// Create `bytes` (a multiple of the granularity) of physical device
    /// memory (`cuMemCreate`): from here on the device holds it.
    fn vm_create(&self, bytes: u64) -> DeviceResult<PhysHandle> {
        let _ = bytes;
        Err(self.vm_unsupported("cuMemCreate"))
    }

    /// Release physical memory no longer mapped anywhere (`cuMemRelease`).
    fn vm_release(&self, handle: PhysHandle) -> DeviceResult<()> {
        let _ = handle;
        Err(self.vm_unsupported("cuMemRelease"))
    }

    /// Map all of `handle` (`bytes`) at `va`, inside a reservation
    /// (`cuMemMap`). Not accessible until `vm_set_access`.
    fn vm_map(&self, va: DevicePtr, bytes: u64, handle: PhysHandle) -> DeviceResult<()> {
        let _ = (va, bytes, handle);
        Err(self.vm_unsupported("cuMemMap"))
    }

    /// Let work on device `ordinal` read and write the mapped range
    /// (`cuMemSetAccess`); this device, and each peer that uses the memory.
    fn vm_set_access(&self, va: DevicePtr, bytes: u64, ordinal: i32) -> DeviceResult<()> {
        let _ = (va, bytes, ordinal);
        Err(self.vm_unsupported("cuMemSetAccess"))
    }

    /// Unmap whole mappings covering `[va, va + bytes)` (`cuMemUnmap`).
    /// Synchronous: no work queued on the device may still use the range.
    fn vm_unmap(&self, va: DevicePtr, bytes: u64) -> DeviceResult<()> {
        let _ = (va, bytes);
        Err(self.vm_unsupported("cuMemUnmap"))
    }

    /// Whether every piece of work queued on `stream` so far has completed
    /// (`cuStreamQuery`). Never blocks; `false` when it cannot tell.
    fn stream_query(&self, stream: RawStream) -> DeviceResult<bool> {
        let _ = stream;
        Ok(false)
    }

    /// The error of a virtual-memory call this device does not support.
    fn vm_unsupported(&self, call: &str) -> DeviceError {
        DeviceError::Invalid(format!(
            "the {} device {} does not support virtual memory management ({call})",
            self.backend().name(),
            self.ordinal()
        ))
    }

    /// Create an event with timing disabled (cheap to record and query).
    fn create_event(&self) -> DeviceResult<RawEvent>;
    fn destroy_event(&self, event: RawEvent);
    /// Capture the work queued on `stream` so far.
    fn record_event(&self, event: RawEvent, stream: RawStream) -> DeviceResult<()>;
    /// Make future work on `stream` wait for the event's latest record.
    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> DeviceResult<()>;
    /// Whether the event's latest record has completed. Never blocks.
    fn event_query(&self, event: RawEvent) -> DeviceResult<bool>;
    /// Block until the event's latest record has completed.
    fn event_synchronize(&self, event: RawEvent) -> DeviceResult<()>;

    /// The sim device behind this trait object, for tests that read and
    /// write simulated device memory.
    fn as_sim(&self) -> Option<&sim::SimDevice> {
        None
    }

    /// Begin stream capture (a CUDA graph) on `stream` in `mode`
    /// (`cuStreamBeginCapture_v2`). Backends without graphs refuse.
    fn begin_capture(&self, stream: RawStream, mode: CaptureMode) -> DeviceResult<()> {
        let _ = (stream, mode);
        Err(DeviceError::Invalid(format!("the {} device does not support stream capture", self.backend().name())))
    }

    /// End the capture begun on `stream`: the captured graph's handle
    /// (`CUgraph` on CUDA; an opaque token on sim).
    fn end_capture(&self, stream: RawStream) -> DeviceResult<u64> {
        let _ = stream;
        Err(DeviceError::Invalid(format!("the {} device does not support stream capture", self.backend().name())))
    }

    /// The id of the capture `stream` takes part in (begun on it, or joined
    /// through an event wait), `None` when it is not capturing.
    fn capture_of(&self, stream: RawStream) -> DeviceResult<Option<u64>> {
        let _ = stream;
        Ok(None)
    }

    /// Whether work on this device can access `peer`'s memory
    /// (`cuDeviceCanAccessPeer`). A device is not its own peer.
    fn can_access_peer(&self, peer: &dyn Device) -> DeviceResult<bool> {
        let _ = peer;
        Ok(false)
    }

    /// Let work on this device access `peer`'s memory
    /// (`cuCtxEnablePeerAccess` from this device's context). Idempotent;
    /// an error where the pair has no peer capability.
    fn enable_peer_access(&self, peer: &dyn Device) -> DeviceResult<()> {
        Err(DeviceError::Invalid(format!(
            "the {} device {} cannot enable peer access to device {}",
            self.backend().name(),
            self.ordinal(),
            peer.ordinal()
        )))
    }

    /// The CUDA device behind this trait object (peer access needs the
    /// other device's context).
    fn as_cuda(&self) -> Option<&cuda::CudaDevice> {
        None
    }

    /// This device's fault-injection counters, if it has any (both built-in
    /// backends do; a stand-in device for benchmarks need not).
    fn faults(&self) -> Option<&Faults> {
        None
    }

    /// Fail the `nth` call of `kind` from now (1 = the next one); 0 disarms.
    /// For reliability tests on any backend (see `faults.rs`).
    fn inject_fault(&self, kind: FaultKind, nth: u64) -> DeviceResult<()> {
        match self.faults() {
            Some(faults) => {
                faults.arm(kind, nth);
                Ok(())
            }
            None => Err(DeviceError::Invalid(format!(
                "the {} device {:?} does not support fault injection",
                self.backend().name(),
                self.name()
            ))),
        }
    }
}
