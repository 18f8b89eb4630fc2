//! CUDA backend: the [`Device`] trait over the raw driver API
//! (`cudarc::driver::sys`), loaded at run time.
//!
//! This file is the only place in the crate (besides the C boundary) that
//! holds `unsafe` code. Every block says why it is sound.
//!
//! Loading: cudarc panics when `libcuda` or one of its entry points is
//! missing, so before the first driver call we (1) check that the library
//! can be opened at all, (2) look up every entry point this file uses, and
//! (3) run `cuInit`, all inside `catch_unwind`. Any failure there is reported
//! as [`DeviceError::NoDevice`]; after it succeeds no call below can panic.
//!
//! Contexts: each [`CudaDevice`] retains the device's primary context (the
//! one the CUDA runtime, PyTorch and CuPy use too) and makes it current on
//! the calling thread before every call that depends on the current context.
//! The check asks the driver (`cuCtxGetCurrent`, a thread-local read inside
//! the driver) rather than a cache of our own, so a caller that switched
//! devices in between (`cudaSetDevice` from a framework on the same thread)
//! can never make us allocate on the wrong device.
//!
//! Handles: a `RawStream`/`RawEvent` is the `CUstream`/`CUevent` pointer
//! value as a `u64`; stream 0 is the legacy default stream of the context.
//!
//! Fault injection (for the reliability tests on a GPU): allocation, free,
//! event record and stream creation first ask the shared [`Faults`]
//! counters, and an armed fault fails the call before the driver sees it,
//! with the same [`DeviceError::InjectedFault`] the sim backend returns.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult};

use super::faults::{FaultKind, Faults};
use super::{Backend, CaptureMode, Device, DevicePtr, DeviceResult, HostCallbackScope, HostFn, PhysHandle, RawEvent, RawStream};
use crate::error::DeviceError;

/// Every driver entry point this file calls. They are looked up once,
/// before the first call, so that a driver too old to have one is reported
/// as an error instead of a panic inside cudarc.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuLaunchHostFunc",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
    "cuMemAllocFromPoolAsync",
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
];

/// Special stream handles that name a default stream rather than an owned
/// one (`0`, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`): never destroyed.
const DEFAULT_STREAM_HANDLES: [u64; 3] = [0, 1, 2];

/// Longest device name the driver is asked for (its own limit is 256).
const NAME_CAPACITY: usize = 256;

// ---------------------------------------------------------------------------
// Result mapping
// ---------------------------------------------------------------------------

/// Map a driver result to `Ok(())` or a [`DeviceError::Driver`] naming the
/// call, the numeric code and the driver's name for it.
fn check(call: &'static str, r: CUresult) -> DeviceResult<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DeviceError::Driver { call, code: code_of(r), name: error_name(r) })
    }
}

/// Numeric value of a driver result.
fn code_of(r: CUresult) -> i32 {
    r as u32 as i32
}

/// The driver's symbolic name for a result (`CUDA_ERROR_OUT_OF_MEMORY`).
/// Only called once the driver is loaded and its symbols were checked.
fn error_name(r: CUresult) -> String {
    let mut text: *const c_char = ptr::null();
    // SAFETY: `cuGetErrorName` only writes a pointer into `text`, a local
    // out-parameter that lives for the whole call. Callers reach this only
    // after `symbols_then_init` found every entry point, so it cannot panic.
    let got = unsafe { sys::cuGetErrorName(r, &mut text) };
    if got != CUresult::CUDA_SUCCESS || text.is_null() {
        return format!("unknown CUDA error {}", code_of(r));
    }
    // SAFETY: on success the driver points `text` at a static, NUL-terminated
    // string that it never frees; we copy it out immediately.
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

/// A `NoDevice` error for driver-level failures during discovery.
fn no_device_from(call: &'static str, r: CUresult) -> DeviceError {
    DeviceError::NoDevice(format!(
        "{call} failed with {} ({}): no usable CUDA driver/device",
        code_of(r),
        error_name(r)
    ))
}

// ---------------------------------------------------------------------------
// Driver loading
// ---------------------------------------------------------------------------

/// Load the driver library, check its entry points and run `cuInit`, once
/// per process. `Err` carries a human-readable reason.
fn driver() -> Result<(), String> {
    static STATE: OnceLock<Result<(), String>> = OnceLock::new();
    STATE.get_or_init(load_and_init).clone()
}

fn load_and_init() -> Result<(), String> {
    if !library_present() {
        return Err("the CUDA driver library (libcuda.so / libcuda.so.1) could not be \
                    loaded; is the NVIDIA driver installed and on LD_LIBRARY_PATH?"
            .to_string());
    }
    match panic::catch_unwind(symbols_then_init) {
        Ok(result) => result,
        Err(payload) => Err(format!(
            "the CUDA driver could not be initialised: {}",
            panic_message(payload.as_ref())
        )),
    }
}

/// Whether any of cudarc's candidate names for the driver library opens.
fn library_present() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on a fixed list of
    // library names and closes what it opened; loading the NVIDIA driver
    // library runs nothing but its own initialisers. A panic (impossible in
    // practice) is caught and counts as "absent".
    panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Look up every entry point, then `cuInit(0)`. Runs under `catch_unwind`.
fn symbols_then_init() -> Result<(), String> {
    // SAFETY: `culib` opens the driver library (we checked above that one of
    // its candidate names opens) and keeps it loaded for the whole process.
    let lib = unsafe { sys::culib() };
    for name in REQUIRED_SYMBOLS {
        // SAFETY: the symbol is only looked up, never called through this
        // type; `get` does not dereference it.
        let found = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok();
        if !found {
            return Err(format!(
                "the CUDA driver lacks entry point {name}; a driver for CUDA 12.x or \
                 newer is required"
            ));
        }
    }
    // SAFETY: cuInit takes a flags word (must be 0) and no pointers.
    let r = unsafe { sys::cuInit(0) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(format!("cuInit failed with {} ({})", code_of(r), error_name(r)));
    }
    Ok(())
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Number of CUDA devices the driver reports. `Err(NoDevice)` when the
/// driver cannot be loaded or initialised (including `cuInit` reporting
/// `CUDA_ERROR_NO_DEVICE`); `Ok(0)` is possible in principle.
pub fn device_count() -> Result<i32, DeviceError> {
    driver().map_err(DeviceError::NoDevice)?;
    let mut count: c_int = 0;
    // SAFETY: `count` is a local out-parameter; the driver is initialised.
    let r = unsafe { sys::cuDeviceGetCount(&mut count) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(no_device_from("cuDeviceGetCount", r));
    }
    Ok(count)
}

/// Whether the driver loads and reports at least one device. Never panics.
pub fn cuda_available() -> bool {
    matches!(device_count(), Ok(n) if n > 0)
}

// ---------------------------------------------------------------------------
// Handle conversions (u64 <-> driver pointer types)
// ---------------------------------------------------------------------------

fn as_stream(raw: RawStream) -> sys::CUstream {
    raw as usize as sys::CUstream
}

fn as_event(raw: RawEvent) -> sys::CUevent {
    raw as usize as sys::CUevent
}

fn to_usize(bytes: u64) -> DeviceResult<usize> {
    usize::try_from(bytes).map_err(|_| {
        DeviceError::Invalid(format!("{bytes} bytes does not fit this platform's size type"))
    })
}

// ---------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------

/// One CUDA device with its retained primary context.
///
/// Only plain integers are stored (the context pointer as a `u64`), so the
/// type is `Send + Sync`; the driver itself is thread-safe.
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: i32,
    device: sys::CUdevice,
    /// The retained primary context (`CUcontext` pointer value).
    context: u64,
    name: String,
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`: `cuMemAllocAsync` works.
    pools_supported: bool,
    /// Injected-fault countdowns (tests only; disarmed by default).
    faults: Faults,
    /// xlog's own memory pool (`CUmemoryPool` value), once
    /// `use_private_pool` made it; `alloc_async` draws from it.
    pool: OnceLock<u64>,
    /// Virtual memory management: the mapping granularity, 0 where the
    /// device does not support it.
    vm_granularity: u64,
    /// Total device memory (the size of one stream's arena region).
    total_bytes: u64,
}

// Compile-time proof of the `Send + Sync` requirement of the `Device` trait.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CudaDevice>();
};

impl CudaDevice {
    /// Open device `ordinal`: load the driver if needed, retain the device's
    /// primary context. A missing driver, no devices or an ordinal out of
    /// range is [`DeviceError::NoDevice`]; this never panics.
    pub fn open(ordinal: i32) -> Result<Arc<CudaDevice>, DeviceError> {
        let count = device_count().map_err(|e| match e {
            DeviceError::NoDevice(m) => {
                DeviceError::NoDevice(format!("cannot open CUDA device {ordinal}: {m}"))
            }
            other => other,
        })?;
        if ordinal < 0 || ordinal >= count {
            return Err(DeviceError::NoDevice(format!(
                "CUDA device ordinal {ordinal} is out of range: the driver reports \
                 {count} device(s)"
            )));
        }
        let device = get_device(ordinal)?;
        let name = device_name(device)?;
        let pools_supported = pools_supported(device)?;
        let vm_granularity = vm_granularity(device, ordinal)?;
        let total_bytes = total_memory(device)?;
        let context = retain_primary(device)?;
        Ok(Arc::new(CudaDevice {
            ordinal,
            device,
            context,
            name,
            pools_supported,
            faults: Faults::default(),
            pool: OnceLock::new(),
            vm_granularity,
            total_bytes,
        }))
    }

    /// Whether the device supports stream-ordered allocation
    /// (`cuMemAllocAsync`). When false, `alloc_async` reports `Invalid`.
    pub fn memory_pools_supported(&self) -> bool {
        self.pools_supported
    }

    fn context(&self) -> sys::CUcontext {
        self.context as usize as sys::CUcontext
    }

    /// `bind`, for calls that take a stream: a created stream carries its
    /// context, so only the default-stream handles (0, `CU_STREAM_LEGACY`,
    /// `CU_STREAM_PER_THREAD`), which resolve in the current context, need
    /// ours current. Measured on an H100: `cuEventRecord` and
    /// `cuStreamWaitEvent` on a created stream succeed from a thread with no
    /// current context; the check costs about 10 ns a call.
    fn bind_for(&self, stream: RawStream) -> DeviceResult<()> {
        if stream <= 2 {
            self.bind()
        } else {
            Ok(())
        }
    }

    /// Make our primary context current on this thread if it is not.
    fn bind(&self) -> DeviceResult<()> {
        let mut current: sys::CUcontext = ptr::null_mut();
        // SAFETY: `current` is a local out-parameter; the driver is loaded
        // (a `CudaDevice` exists only after `driver()` succeeded).
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut current) })?;
        if current as usize as u64 == self.context {
            return Ok(());
        }
        // SAFETY: `self.context` is the primary context we retained in
        // `open` and release only in `Drop`, so it is valid while `self` is.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.context()) })
    }

    /// `OutOfMemory` with the device's free/total memory when available.
    fn out_of_memory(&self, requested: u64, call: &str) -> DeviceError {
        let detail = match self.mem_info() {
            Ok((free, total)) => format!(
                "{call}: device {} ({}) has {free} of {total} bytes free",
                self.ordinal, self.name
            ),
            Err(e) => format!(
                "{call}: device {} ({}); free/total unavailable: {e}",
                self.ordinal, self.name
            ),
        };
        DeviceError::OutOfMemory { requested, detail }
    }

    /// Map an allocation result: OOM becomes `OutOfMemory`.
    fn alloc_result(&self, call: &'static str, r: CUresult, bytes: u64) -> DeviceResult<()> {
        if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(self.out_of_memory(bytes, call));
        }
        check(call, r)
    }
}

fn get_device(ordinal: i32) -> DeviceResult<sys::CUdevice> {
    let mut device: sys::CUdevice = 0;
    // SAFETY: `device` is a local out-parameter; `ordinal` was range-checked
    // against cuDeviceGetCount.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, ordinal) })?;
    Ok(device)
}

fn device_name(device: sys::CUdevice) -> DeviceResult<String> {
    let mut buf = [0 as c_char; NAME_CAPACITY];
    // SAFETY: the driver writes at most `NAME_CAPACITY` bytes (the length we
    // pass) into `buf`, which is that long, including the terminating NUL.
    let r = unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), NAME_CAPACITY as c_int, device) };
    check("cuDeviceGetName", r)?;
    // Read up to the first NUL without trusting the driver to have written
    // one: the slice bounds the scan.
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn pools_supported(device: sys::CUdevice) -> DeviceResult<bool> {
    let mut value: c_int = 0;
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
    // SAFETY: `value` is a local out-parameter; `device` came from cuDeviceGet.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut value, attr, device) })?;
    Ok(value != 0)
}

/// Pinned device memory on `ordinal`: the properties of every physical
/// allocation the arena makes.
fn device_allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    // SAFETY: CUmemAllocationProp is plain data (enums, ints, a null
    // pointer, flag bytes); all-zero is its documented default, which we
    // then fill in.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop
}

/// The mapping granularity of `device`, 0 when it has no virtual memory
/// management.
fn vm_granularity(device: sys::CUdevice, ordinal: i32) -> DeviceResult<u64> {
    let mut value: c_int = 0;
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED;
    // SAFETY: `value` is a local out-parameter; `device` came from cuDeviceGet.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut value, attr, device) })?;
    if value == 0 {
        return Ok(0);
    }
    let prop = device_allocation_prop(ordinal);
    let mut granularity: usize = 0;
    let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: `granularity` is a local out-parameter, `prop` a fully
    // initialised local.
    check("cuMemGetAllocationGranularity", unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, flag) })?;
    Ok(granularity as u64)
}

fn total_memory(device: sys::CUdevice) -> DeviceResult<u64> {
    let mut bytes: usize = 0;
    // SAFETY: `bytes` is a local out-parameter; `device` came from cuDeviceGet.
    check("cuDeviceTotalMem_v2", unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, device) })?;
    Ok(bytes as u64)
}

fn retain_primary(device: sys::CUdevice) -> DeviceResult<u64> {
    let mut context: sys::CUcontext = ptr::null_mut();
    // SAFETY: `context` is a local out-parameter; `device` came from
    // cuDeviceGet. The matching release is in `CudaDevice::drop`, which runs
    // exactly once because the context is stored in a `CudaDevice` right
    // after this returns and nothing fallible happens in between.
    check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, device) })?;
    Ok(context as usize as u64)
}

/// Set one 64-bit attribute of a memory pool.
fn set_pool_u64(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute, value: u64) -> DeviceResult<()> {
    let mut v: u64 = value;
    // SAFETY: `pool` is a live pool we created; the u64-valued attributes
    // (thresholds, high-water marks) take a pointer to a cuuint64_t, which
    // `v` is for the duration of the call.
    check("cuMemPoolSetAttribute", unsafe {
        sys::cuMemPoolSetAttribute(pool, attr, (&mut v as *mut u64).cast::<c_void>())
    })
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Some(&pool) = self.pool.get() {
            // SAFETY: the pool is ours and nothing allocates from it once
            // the device is dropped; the driver releases it when its last
            // outstanding allocation or queued free is done.
            let _ = unsafe { sys::cuMemPoolDestroy(pool as usize as sys::CUmemoryPool) };
        }
        // SAFETY: balances the single retain made in `open`. The result is
        // ignored: at process exit the driver may already be deinitialised
        // (CUDA_ERROR_DEINITIALIZED), and there is nothing to do about it.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// Relaxed stream-capture mode for this thread while alive, then the mode
/// it had. Queries and host waits are "potentially unsafe" calls under
/// stream capture: made in the default (global) mode while any thread
/// captures, they fail and invalidate that capture (measured on an H100:
/// `cuEventQuery` of an ordinary event during a capture returned
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and left the capture
/// invalidated). xlog's reap and waits never touch a capture's work, so
/// they run relaxed and a capture is never broken by them.
struct RelaxedCapture {
    /// The mode to restore; `None` when the exchange failed (nothing to undo).
    previous: Option<sys::CUstreamCaptureMode>,
}

impl RelaxedCapture {
    fn enter() -> RelaxedCapture {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a local in/out value; the driver is loaded (only
        // a `CudaDevice` method calls this).
        let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        RelaxedCapture { previous: (r == CUresult::CUDA_SUCCESS).then_some(mode) }
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut mode) = self.previous {
            // SAFETY: as in `enter`.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

/// Driver-side entry point of `enqueue_host`: takes back the boxed closure
/// and runs it. A panic is caught here and never unwinds into the driver
/// (even if it did, Rust aborts rather than unwinding through `extern "C"`).
extern "C" fn host_trampoline(user: *mut c_void) {
    // SAFETY: `user` is the pointer `enqueue_host` got from
    // `Box::into_raw(Box<HostFn>)`, handed to the driver by a successful
    // cuLaunchHostFunc; the driver calls this exactly once per launch, so
    // the box is reclaimed exactly once.
    let f = unsafe { Box::from_raw(user.cast::<HostFn>()) };
    // Calls into xlog from here are refused (see `in_host_callback`): the
    // driver forbids CUDA calls from a host function.
    let in_callback = HostCallbackScope::enter();
    let outcome = panic::catch_unwind(AssertUnwindSafe(move || (*f)()));
    drop(in_callback);
    if let Err(payload) = outcome {
        eprintln!(
            "xlog-cuda: a host callback panicked (contained): {}",
            panic_message(payload.as_ref())
        );
        // Dropping the payload could itself panic; keep that inside too.
        let _ = panic::catch_unwind(AssertUnwindSafe(move || drop(payload)));
    }
}

impl Device for CudaDevice {
    fn backend(&self) -> Backend {
        Backend::Cuda
    }

    fn ordinal(&self) -> i32 {
        self.ordinal
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn mem_info(&self) -> DeviceResult<(u64, u64)> {
        // Not stream-ordered: never invalidate a capture (see RelaxedCapture).
        let _relaxed = RelaxedCapture::enter();
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are local out-parameters; our context is current.
        check("cuMemGetInfo_v2", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    fn create_stream(&self) -> DeviceResult<RawStream> {
        // Not stream-ordered: never invalidate a capture (see RelaxedCapture).
        let _relaxed = RelaxedCapture::enter();
        if self.faults.hit(FaultKind::StreamCreate) {
            return Err(DeviceError::InjectedFault("cuda stream creation (cuStreamCreate)".into()));
        }
        self.bind()?;
        let mut stream: sys::CUstream = ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
        // SAFETY: `stream` is a local out-parameter; our context is current,
        // so the stream belongs to this device.
        check("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut stream, flags) })?;
        Ok(stream as usize as u64)
    }

    fn destroy_stream(&self, stream: RawStream) -> DeviceResult<()> {
        // Not stream-ordered: never invalidate a capture (see RelaxedCapture).
        let _relaxed = RelaxedCapture::enter();
        if DEFAULT_STREAM_HANDLES.contains(&stream) {
            return Err(DeviceError::Invalid(format!(
                "stream handle {stream:#x} is a default stream and cannot be destroyed"
            )));
        }
        self.bind()?;
        // SAFETY: the caller passes a handle from `create_stream` that it has
        // not destroyed yet (trait contract); the driver validates the rest.
        check("cuStreamDestroy_v2", unsafe { sys::cuStreamDestroy_v2(as_stream(stream)) })
    }

    fn import_stream(&self, native: u64) -> DeviceResult<RawStream> {
        Ok(native)
    }

    fn native_stream(&self, stream: RawStream) -> u64 {
        stream
    }

    fn synchronize_stream(&self, stream: RawStream) -> DeviceResult<()> {
        self.bind()?;
        let _relaxed = RelaxedCapture::enter();
        // SAFETY: `stream` is a live stream handle or a default-stream
        // handle, resolved in our (current) context.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(as_stream(stream)) })
    }

    fn enqueue_host(&self, stream: RawStream, f: HostFn) -> DeviceResult<()> {
        self.bind()?;
        let user = Box::into_raw(Box::new(f)).cast::<c_void>();
        // SAFETY: `host_trampoline` matches `CUhostFn` and never unwinds;
        // `user` is a valid, uniquely owned box pointer that the trampoline
        // reclaims when the driver runs it.
        let r = unsafe { sys::cuLaunchHostFunc(as_stream(stream), Some(host_trampoline), user) };
        if r != CUresult::CUDA_SUCCESS {
            // SAFETY: the launch failed, so the driver did not take `user`
            // and will never call the trampoline with it; we still own the
            // box and free it here exactly once.
            drop(unsafe { Box::from_raw(user.cast::<HostFn>()) });
        }
        check("cuLaunchHostFunc", r)
    }

    fn use_private_pool(&self, release_threshold: u64) -> DeviceResult<()> {
        if self.pool.get().is_some() || !self.pools_supported {
            // No pool support: alloc_async reports that on first use.
            return Ok(());
        }
        if self.faults.hit(FaultKind::PoolCreate) {
            return Err(DeviceError::InjectedFault(format!(
                "cuda memory pool creation on device {} (cuMemPoolCreate)",
                self.ordinal
            )));
        }
        self.bind()?;
        // SAFETY: CUmemPoolProps is plain data (enums, ints, a null pointer,
        // reserved bytes); all-zero is its documented "unset" state, which
        // we then fill in.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = self.ordinal;
        let mut pool: sys::CUmemoryPool = ptr::null_mut();
        // SAFETY: `pool` is a local out-parameter and `props` a fully
        // initialised local; our context is current.
        check("cuMemPoolCreate", unsafe { sys::cuMemPoolCreate(&mut pool, &props) })?;
        let threshold = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        if let Err(e) = set_pool_u64(pool, threshold, release_threshold) {
            // SAFETY: the pool was created above and nothing allocated from it.
            let _ = unsafe { sys::cuMemPoolDestroy(pool) };
            return Err(e);
        }
        if self.pool.set(pool as usize as u64).is_err() {
            // Another thread made one first: keep theirs.
            // SAFETY: as above, ours is unused.
            let _ = unsafe { sys::cuMemPoolDestroy(pool) };
        }
        Ok(())
    }

    fn pool_reserved_bytes(&self) -> Option<u64> {
        // Not stream-ordered: never invalidate a capture (see RelaxedCapture).
        let _relaxed = RelaxedCapture::enter();
        let pool = *self.pool.get()?;
        let mut value: u64 = 0;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT;
        // SAFETY: `pool` is our live pool; the attribute is a cuuint64_t
        // written to the local `value`.
        let r = unsafe {
            sys::cuMemPoolGetAttribute(pool as usize as sys::CUmemoryPool, attr, (&mut value as *mut u64).cast::<c_void>())
        };
        (r == CUresult::CUDA_SUCCESS).then_some(value)
    }

    fn trim_pool(&self) {
        // Not stream-ordered: never invalidate a capture (see RelaxedCapture).
        let _relaxed = RelaxedCapture::enter();
        if let Some(&pool) = self.pool.get() {
            // SAFETY: `pool` is our live pool; trimming only unmaps memory
            // the pool holds unused. A failure leaves the memory mapped.
            let _ = unsafe { sys::cuMemPoolTrimTo(pool as usize as sys::CUmemoryPool, 0) };
        }
    }

    fn alloc_async(&self, bytes: u64, stream: RawStream) -> DeviceResult<DevicePtr> {
        if bytes == 0 {
            return Err(DeviceError::Invalid("alloc_async of 0 bytes".to_string()));
        }
        if !self.pools_supported {
            return Err(DeviceError::Invalid(format!(
                "device {} ({}) does not support stream-ordered allocation \
                 (cuMemAllocAsync); use the direct allocator",
                self.ordinal, self.name
            )));
        }
        let size = to_usize(bytes)?;
        if self.faults.hit(FaultKind::Alloc) {
            return Err(DeviceError::InjectedFault(format!("cuda allocation of {bytes} bytes (cuMemAllocAsync)")));
        }
        self.bind()?;
        let mut dptr: sys::CUdeviceptr = 0;
        if let Some(&pool) = self.pool.get() {
            // SAFETY: `dptr` is a local out-parameter; `pool` is our live
            // pool; `stream` is a stream of our context (or a default-stream
            // handle); our context is current.
            let r = unsafe {
                sys::cuMemAllocFromPoolAsync(&mut dptr, size, pool as usize as sys::CUmemoryPool, as_stream(stream))
            };
            self.alloc_result("cuMemAllocFromPoolAsync", r, bytes)?;
            return Ok(dptr);
        }
        // SAFETY: `dptr` is a local out-parameter; `stream` is a stream of
        // our context (or a default-stream handle); our context is current.
        let r = unsafe { sys::cuMemAllocAsync(&mut dptr, size, as_stream(stream)) };
        self.alloc_result("cuMemAllocAsync", r, bytes)?;
        Ok(dptr)
    }

    fn free_async(&self, ptr: DevicePtr, stream: RawStream) -> DeviceResult<()> {
        if self.faults.hit(FaultKind::Free) {
            return Err(DeviceError::InjectedFault(format!("cuda free of {ptr:#x} (cuMemFreeAsync)")));
        }
        self.bind()?;
        // SAFETY: `ptr` is an address from `alloc_async` not yet freed
        // (resources guarantee this via generation checks); the driver only
        // queues the release on `stream`, it does not touch host memory.
        check("cuMemFreeAsync", unsafe { sys::cuMemFreeAsync(ptr, as_stream(stream)) })
    }

    fn alloc_sync(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        if bytes == 0 {
            return Err(DeviceError::Invalid("alloc_sync of 0 bytes".to_string()));
        }
        let size = to_usize(bytes)?;
        if self.faults.hit(FaultKind::Alloc) {
            return Err(DeviceError::InjectedFault(format!("cuda allocation of {bytes} bytes (cuMemAlloc)")));
        }
        self.bind()?;
        // Capture pools allocate with this while a capture is in progress.
        let _relaxed = RelaxedCapture::enter();
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `dptr` is a local out-parameter; our context is current.
        let r = unsafe { sys::cuMemAlloc_v2(&mut dptr, size) };
        self.alloc_result("cuMemAlloc_v2", r, bytes)?;
        Ok(dptr)
    }

    fn free_sync(&self, ptr: DevicePtr) -> DeviceResult<()> {
        if self.faults.hit(FaultKind::Free) {
            return Err(DeviceError::InjectedFault(format!("cuda free of {ptr:#x} (cuMemFree)")));
        }
        self.bind()?;
        let _relaxed = RelaxedCapture::enter();
        // SAFETY: `ptr` is an address from `alloc_sync` not yet freed; the
        // driver validates it and touches no host memory.
        check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(ptr) })
    }

    // The virtual-memory calls are synchronous and not stream-ordered: they
    // run relaxed, so a capture on another thread is never broken by them
    // (see RelaxedCapture). The arena never unmaps while a capture is active.

    fn supports_vm(&self) -> bool {
        self.vm_granularity > 0
    }

    fn vm_granularity(&self) -> u64 {
        self.vm_granularity
    }

    fn vm_region_bytes(&self) -> u64 {
        match self.vm_granularity {
            0 => 0,
            g => self.total_bytes.div_ceil(g) * g,
        }
    }

    fn vm_reserve(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        let size = to_usize(bytes)?;
        let _relaxed = RelaxedCapture::enter();
        self.bind()?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: `base` is a local out-parameter; our context is current;
        // the alignment is the device's granularity.
        let r = unsafe { sys::cuMemAddressReserve(&mut base, size, self.vm_granularity as usize, 0, 0) };
        self.alloc_result("cuMemAddressReserve", r, bytes)?;
        Ok(base)
    }

    fn vm_free(&self, base: DevicePtr, bytes: u64) -> DeviceResult<()> {
        let size = to_usize(bytes)?;
        let _relaxed = RelaxedCapture::enter();
        self.bind()?;
        // SAFETY: `base`/`bytes` name a reservation of ours with nothing
        // mapped (the arena unmaps first); the driver checks the range.
        check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(base, size) })
    }

    fn vm_create(&self, bytes: u64) -> DeviceResult<PhysHandle> {
        let size = to_usize(bytes)?;
        if self.faults.hit(FaultKind::Alloc) {
            return Err(DeviceError::InjectedFault(format!("cuda physical allocation of {bytes} bytes (cuMemCreate)")));
        }
        let _relaxed = RelaxedCapture::enter();
        self.bind()?;
        let prop = device_allocation_prop(self.ordinal);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a local out-parameter and `prop` a fully
        // initialised local; our context is current.
        let r = unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) };
        self.alloc_result("cuMemCreate", r, bytes)?;
        Ok(handle)
    }

    fn vm_release(&self, handle: PhysHandle) -> DeviceResult<()> {
        if self.faults.hit(FaultKind::Unmap) {
            return Err(DeviceError::InjectedFault(format!("cuda release of physical allocation {handle:#x} (cuMemRelease)")));
        }
        let _relaxed = RelaxedCapture::enter();
        self.bind()?;
        // SAFETY: `handle` came from cuMemCreate and is no longer mapped
        // (the arena unmaps first); it is released once.
        check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
    }

    fn vm_map(&self, va: DevicePtr, bytes: u64, handle: PhysHandle) -> DeviceResult<()> {
        let size = to_usize(bytes)?;
        if self.faults.hit(FaultKind::Map) {
            return Err(DeviceError::InjectedFault(format!("cuda map of {bytes} bytes at {va:#x} (cuMemMap)")));
        }
        let _relaxed = RelaxedCapture::enter();
        self.bind()?;
        // SAFETY: `va` is a granularity-aligned, unmapped address inside one
        // of our reservations and `handle` an unmapped allocation of exactly
        // `bytes`; the driver validates both and touches no host memory.
        check("cuMemMap", unsafe { sys::cuMemMap(va, size, 0, handle, 0) })
    }

    fn vm_set_access(&self, va: DevicePtr, bytes: u64, ordinal: i32) -> DeviceResult<()> {
        let size = to_usize(bytes)?;
        if self.faults.hit(FaultKind::Map) {
            return Err(DeviceError::InjectedFault(format!("cuda access grant of {bytes} bytes at {va:#x} (cuMemSetAccess)")));
        }
        let _relaxed = RelaxedCapture::enter();
        self.bind()?;
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `[va, va + bytes)` is mapped (the arena maps first) and
        // `desc` is one fully initialised local descriptor.
        check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(va, size, &desc, 1) })
    }

    fn vm_unmap(&self, va: DevicePtr, bytes: u64) -> DeviceResult<()> {
        let size = to_usize(bytes)?;
        if self.faults.hit(FaultKind::Unmap) {
            return Err(DeviceError::InjectedFault(format!("cuda unmap of {bytes} bytes at {va:#x} (cuMemUnmap)")));
        }
        let _relaxed = RelaxedCapture::enter();
        self.bind()?;
        // SAFETY: the range covers whole mappings of ours, and the arena
        // unmaps only once the GPU has finished every use of it.
        check("cuMemUnmap", unsafe { sys::cuMemUnmap(va, size) })
    }

    fn stream_query(&self, stream: RawStream) -> DeviceResult<bool> {
        let _relaxed = RelaxedCapture::enter();
        self.bind_for(stream)?;
        // SAFETY: `stream` is a stream of our context (or a default-stream
        // handle); the query only reads its state.
        match unsafe { sys::cuStreamQuery(as_stream(stream)) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check("cuStreamQuery", r).map(|()| false),
        }
    }

    fn create_event(&self) -> DeviceResult<RawEvent> {
        // Not stream-ordered: never invalidate a capture (see RelaxedCapture).
        let _relaxed = RelaxedCapture::enter();
        self.bind()?;
        let mut event: sys::CUevent = ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
        // SAFETY: `event` is a local out-parameter; our context is current.
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut event, flags) })?;
        Ok(event as usize as u64)
    }

    fn destroy_event(&self, event: RawEvent) {
        // Not stream-ordered: never invalidate a capture (see RelaxedCapture).
        let _relaxed = RelaxedCapture::enter();
        // SAFETY: the caller passes an event from `create_event` that it
        // does not use again (trait contract). The driver defers the real
        // release until outstanding work on the event is done. Errors are
        // not reportable through this signature and change nothing.
        let _ = unsafe { sys::cuEventDestroy_v2(as_event(event)) };
    }

    fn record_event(&self, event: RawEvent, stream: RawStream) -> DeviceResult<()> {
        if self.faults.hit(FaultKind::EventRecord) {
            return Err(DeviceError::InjectedFault(format!("cuda record of event {event:#x} (cuEventRecord)")));
        }
        self.bind_for(stream)?;
        // SAFETY: `event` and `stream` are live handles of our context (or a
        // default-stream handle, resolved in our current context).
        check("cuEventRecord", unsafe { sys::cuEventRecord(as_event(event), as_stream(stream)) })
    }

    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> DeviceResult<()> {
        self.bind_for(stream)?;
        // SAFETY: as in `record_event`; flags must be 0.
        let r = unsafe { sys::cuStreamWaitEvent(as_stream(stream), as_event(event), 0) };
        check("cuStreamWaitEvent", r)
    }

    fn event_query(&self, event: RawEvent) -> DeviceResult<bool> {
        // No bind: the event carries its context. This is the reap hot path.
        let _relaxed = RelaxedCapture::enter();
        // SAFETY: `event` is a live handle from `create_event`.
        let r = unsafe { sys::cuEventQuery(as_event(event)) };
        match r {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check("cuEventQuery", other).map(|()| false),
        }
    }

    fn event_synchronize(&self, event: RawEvent) -> DeviceResult<()> {
        // SAFETY: `event` is a live handle from `create_event`; the event
        // carries its own context, so none needs to be current.
        let _relaxed = RelaxedCapture::enter();
        check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(as_event(event)) })
    }

    fn faults(&self) -> Option<&Faults> {
        Some(&self.faults)
    }

    fn begin_capture(&self, stream: RawStream, mode: CaptureMode) -> DeviceResult<()> {
        self.bind_for(stream)?;
        let mode = match mode {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // SAFETY: `stream` is a live stream handle of our context.
        check("cuStreamBeginCapture_v2", unsafe { sys::cuStreamBeginCapture_v2(as_stream(stream), mode) })
    }

    fn end_capture(&self, stream: RawStream) -> DeviceResult<u64> {
        self.bind_for(stream)?;
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: `stream` is a live stream handle; `graph` a local out-value.
        check("cuStreamEndCapture", unsafe { sys::cuStreamEndCapture(as_stream(stream), &mut graph) })?;
        Ok(graph as usize as u64)
    }

    fn capture_of(&self, stream: RawStream) -> DeviceResult<Option<u64>> {
        self.bind_for(stream)?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: sys::cuuint64_t = 0;
        // SAFETY: `stream` is a live stream handle (or a default-stream
        // handle, resolved in our current context); `status` and `id` are
        // local out-values.
        let r = unsafe {
            sys::cuStreamGetCaptureInfo_v2(
                as_stream(stream),
                &mut status,
                &mut id,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        check("cuStreamGetCaptureInfo_v2", r)?;
        Ok(match status {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => None,
            _ => Some(id),
        })
    }

    fn as_cuda(&self) -> Option<&CudaDevice> {
        Some(self)
    }

    fn can_access_peer(&self, peer: &dyn Device) -> DeviceResult<bool> {
        let Some(peer) = peer.as_cuda() else { return Ok(false) };
        if peer.device == self.device {
            return Ok(false);
        }
        let mut can: c_int = 0;
        // SAFETY: `can` is a local out-parameter; both device handles came
        // from `cuDeviceGet` (the driver is loaded).
        check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.device, peer.device) })?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, peer: &dyn Device) -> DeviceResult<()> {
        let Some(other) = peer.as_cuda() else {
            return Err(DeviceError::Invalid(format!(
                "CUDA device {} cannot enable peer access to the {} device {}",
                self.ordinal,
                peer.backend().name(),
                peer.ordinal()
            )));
        };
        if !self.can_access_peer(peer)? {
            return Err(DeviceError::Invalid(format!(
                "CUDA device {} ({}) cannot access the memory of device {} ({}): \
                 cuDeviceCanAccessPeer reports 0",
                self.ordinal, self.name, other.ordinal, other.name
            )));
        }
        self.bind()?;
        // SAFETY: our context is current; `other.context()` is the primary
        // context `other` retained and keeps while it lives (we borrow it
        // for this call); flags must be 0.
        let r = unsafe { sys::cuCtxEnablePeerAccess(other.context(), 0) };
        match r {
            // Enabling twice is not an error for us: the call is idempotent.
            CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            other_result => check("cuCtxEnablePeerAccess", other_result),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Mutex};
    use std::time::Duration;

    /// Device 0, or `None` after printing why the GPU tests are skipped.
    fn gpu() -> Option<Arc<CudaDevice>> {
        if !cuda_available() {
            let reason = match device_count() {
                Err(e) => e.to_string(),
                Ok(n) => format!("driver reports {n} devices"),
            };
            println!("skipped: no CUDA driver/device ({reason})");
            return None;
        }
        Some(CudaDevice::open(0).expect("open(0) with a device present"))
    }

    /// A host callback that blocks its stream until the returned sender
    /// fires (or 10 s pass, so a failing test cannot hang forever).
    fn gate(dev: &CudaDevice, stream: RawStream) -> mpsc::Sender<()> {
        let (tx, rx) = mpsc::channel::<()>();
        let wait = move || {
            let _ = rx.recv_timeout(Duration::from_secs(10));
        };
        dev.enqueue_host(stream, Box::new(wait)).unwrap();
        tx
    }

    #[test]
    fn open_never_panics_and_reports_no_device_when_absent() {
        let result = CudaDevice::open(0);
        if cuda_available() {
            assert!(result.is_ok(), "{result:?}");
        } else {
            match result {
                Err(DeviceError::NoDevice(m)) => println!("open(0) without CUDA: {m}"),
                other => panic!("expected NoDevice, got {other:?}"),
            }
        }
    }

    #[test]
    fn ordinal_out_of_range_is_no_device() {
        for ordinal in [999, -1] {
            match CudaDevice::open(ordinal) {
                Err(DeviceError::NoDevice(m)) => println!("open({ordinal}): {m}"),
                other => panic!("expected NoDevice for {ordinal}, got {other:?}"),
            }
        }
    }

    #[test]
    fn device_identity_and_memory() {
        let Some(dev) = gpu() else { return };
        assert_eq!(dev.backend(), Backend::Cuda);
        assert_eq!(dev.ordinal(), 0);
        assert!(!dev.name().is_empty());
        let (free, total) = dev.mem_info().unwrap();
        assert!(total > 0 && free <= total, "free {free} total {total}");
        assert!(dev.memory_pools_supported());
        println!("device 0: {} ({free}/{total} bytes free)", dev.name());
    }

    #[test]
    fn stream_create_destroy() {
        let Some(dev) = gpu() else { return };
        let s = dev.create_stream().unwrap();
        assert_ne!(s, 0);
        assert_eq!(dev.native_stream(s), s);
        assert_eq!(dev.import_stream(s).unwrap(), s);
        dev.synchronize_stream(s).unwrap();
        dev.destroy_stream(s).unwrap();
        assert!(matches!(dev.destroy_stream(0), Err(DeviceError::Invalid(_))));
        assert_eq!(dev.import_stream(0).unwrap(), 0);
        dev.synchronize_stream(0).unwrap();
    }

    #[test]
    fn alloc_free_roundtrip_aligned() {
        let Some(dev) = gpu() else { return };
        let s = dev.create_stream().unwrap();
        for bytes in [1u64, 255, 256, 1000, 1 << 20] {
            let p = dev.alloc_async(bytes, s).unwrap();
            assert_ne!(p, 0);
            assert_eq!(p % 256, 0, "{bytes} bytes at {p:#x}");
            dev.free_async(p, s).unwrap();
        }
        let p = dev.alloc_async(4096, 0).unwrap();
        dev.free_async(p, 0).unwrap();
        let p = dev.alloc_sync(4096).unwrap();
        assert_eq!(p % 256, 0);
        dev.free_sync(p).unwrap();
        assert!(matches!(dev.alloc_async(0, s), Err(DeviceError::Invalid(_))));
        assert!(matches!(dev.alloc_sync(0), Err(DeviceError::Invalid(_))));
        dev.synchronize_stream(s).unwrap();
        dev.destroy_stream(s).unwrap();
    }

    #[test]
    fn event_record_query_synchronize() {
        let Some(dev) = gpu() else { return };
        let s = dev.create_stream().unwrap();
        let e = dev.create_event().unwrap();
        assert!(dev.event_query(e).unwrap(), "a never-recorded event is complete");
        let release = gate(&dev, s);
        dev.record_event(e, s).unwrap();
        assert!(!dev.event_query(e).unwrap(), "event behind a blocked callback");
        release.send(()).unwrap();
        dev.event_synchronize(e).unwrap();
        assert!(dev.event_query(e).unwrap());
        dev.destroy_event(e);
        dev.destroy_stream(s).unwrap();
    }

    #[test]
    fn stream_wait_event_orders_streams() {
        let Some(dev) = gpu() else { return };
        let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
        let e = dev.create_event().unwrap();
        let a_done = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(AtomicBool::new(false));
        let release = gate(&dev, a);
        let flag = a_done.clone();
        dev.enqueue_host(a, Box::new(move || flag.store(true, Ordering::SeqCst))).unwrap();
        dev.record_event(e, a).unwrap();
        dev.stream_wait_event(b, e).unwrap();
        let (flag, out) = (a_done.clone(), seen.clone());
        let check_order = move || out.store(flag.load(Ordering::SeqCst), Ordering::SeqCst);
        dev.enqueue_host(b, Box::new(check_order)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        release.send(()).unwrap();
        dev.synchronize_stream(b).unwrap();
        assert!(seen.load(Ordering::SeqCst), "b ran before a's work completed");
        dev.destroy_event(e);
        dev.destroy_stream(a).unwrap();
        dev.destroy_stream(b).unwrap();
    }

    #[test]
    fn enqueue_host_runs_in_order() {
        let Some(dev) = gpu() else { return };
        let s = dev.create_stream().unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let order = Arc::new(Mutex::new(Vec::new()));
        for i in 0..8 {
            let order = order.clone();
            dev.enqueue_host(s, Box::new(move || order.lock().unwrap().push(i))).unwrap();
        }
        let flag = done.clone();
        dev.enqueue_host(s, Box::new(move || flag.store(true, Ordering::SeqCst))).unwrap();
        dev.synchronize_stream(s).unwrap();
        assert!(done.load(Ordering::SeqCst));
        assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
        dev.destroy_stream(s).unwrap();
    }

    #[test]
    fn host_callback_panic_is_contained() {
        let Some(dev) = gpu() else { return };
        let s = dev.create_stream().unwrap();
        dev.enqueue_host(s, Box::new(|| panic!("deliberate test panic"))).unwrap();
        let after = Arc::new(AtomicBool::new(false));
        let flag = after.clone();
        dev.enqueue_host(s, Box::new(move || flag.store(true, Ordering::SeqCst))).unwrap();
        dev.synchronize_stream(s).unwrap();
        assert!(after.load(Ordering::SeqCst));
        dev.destroy_stream(s).unwrap();
    }

    #[test]
    fn absurd_allocation_is_out_of_memory() {
        let Some(dev) = gpu() else { return };
        let s = dev.create_stream().unwrap();
        let huge = 1u64 << 50;
        match dev.alloc_async(huge, s) {
            Err(DeviceError::OutOfMemory { requested, detail }) => {
                assert_eq!(requested, huge);
                println!("async OOM: {detail}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        match dev.alloc_sync(huge) {
            Err(DeviceError::OutOfMemory { requested, .. }) => assert_eq!(requested, huge),
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        // The device is still usable afterwards (OOM is not sticky).
        let p = dev.alloc_async(256, s).unwrap();
        dev.free_async(p, s).unwrap();
        dev.synchronize_stream(s).unwrap();
        dev.destroy_stream(s).unwrap();
    }

    #[test]
    fn usable_from_fresh_threads() {
        let Some(dev) = gpu() else { return };
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let dev = dev.clone();
                std::thread::spawn(move || {
                    let s = dev.create_stream().unwrap();
                    for _ in 0..100 {
                        let p = dev.alloc_async(1 << 16, s).unwrap();
                        dev.free_async(p, s).unwrap();
                    }
                    dev.synchronize_stream(s).unwrap();
                    dev.destroy_stream(s).unwrap();
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    }

    #[test]
    fn driver_errors_are_named() {
        let Some(dev) = gpu() else { return };
        // An address the driver never handed out: rejected by table lookup.
        match dev.free_sync(0x10) {
            Err(DeviceError::Driver { call, code, name }) => {
                assert_eq!(call, "cuMemFree_v2");
                assert_ne!(code, 0);
                assert!(name.starts_with("CUDA_ERROR_"), "{name}");
                println!("bogus free: {code} {name}");
            }
            other => panic!("expected a driver error, got {other:?}"),
        }
    }

    #[test]
    fn injected_faults_fail_before_the_driver() {
        let Some(dev) = gpu() else { return };
        let s = dev.create_stream().unwrap();
        let injected = |r: DeviceResult<()>, what: &str| match r {
            Err(DeviceError::InjectedFault(m)) => assert!(m.starts_with("cuda "), "{what}: {m}"),
            other => panic!("{what}: expected an injected fault, got {other:?}"),
        };
        dev.inject_fault(FaultKind::Alloc, 2).unwrap();
        let p = dev.alloc_async(256, s).unwrap();
        injected(dev.alloc_async(256, s).map(|_| ()), "second alloc_async");
        dev.inject_fault(FaultKind::Free, 1).unwrap();
        injected(dev.free_async(p, s), "free_async");
        dev.free_async(p, s).unwrap();
        dev.inject_fault(FaultKind::Alloc, 1).unwrap();
        injected(dev.alloc_sync(256).map(|_| ()), "alloc_sync");
        let e = dev.create_event().unwrap();
        dev.inject_fault(FaultKind::EventRecord, 1).unwrap();
        injected(dev.record_event(e, s), "record_event");
        dev.record_event(e, s).unwrap();
        dev.inject_fault(FaultKind::StreamCreate, 1).unwrap();
        injected(dev.create_stream().map(|_| ()), "create_stream");
        dev.synchronize_stream(s).unwrap();
        dev.destroy_event(e);
        dev.destroy_stream(s).unwrap();
    }

    /// Rough cost of one alloc/free pair through this backend (context
    /// check included). Run with `--ignored --nocapture` on a GPU machine.
    #[test]
    #[ignore]
    fn bench_alloc_free_pair() {
        let Some(dev) = gpu() else { return };
        let s = dev.create_stream().unwrap();
        let rounds = 200_000u32;
        for _ in 0..1000 {
            let p = dev.alloc_async(256, s).unwrap();
            dev.free_async(p, s).unwrap();
        }
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            let p = dev.alloc_async(256, s).unwrap();
            dev.free_async(p, s).unwrap();
        }
        let pair = start.elapsed() / rounds;
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            dev.bind().unwrap();
        }
        let bind = start.elapsed() / rounds;
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            let mut p: sys::CUdeviceptr = 0;
            // SAFETY: local out-parameter; our context is current (bound
            // above on this thread); `s` is a live stream of it.
            let r = unsafe { sys::cuMemAllocAsync(&mut p, 256, as_stream(s)) };
            assert_eq!(r, CUresult::CUDA_SUCCESS);
            // SAFETY: `p` was just allocated on `s` and is freed once.
            let r = unsafe { sys::cuMemFreeAsync(p, as_stream(s)) };
            assert_eq!(r, CUresult::CUDA_SUCCESS);
        }
        let raw = start.elapsed() / rounds;
        println!("alloc_async+free_async pair: {pair:?}; raw driver pair: {raw:?}; context check: {bind:?}");
        dev.synchronize_stream(s).unwrap();
        dev.destroy_stream(s).unwrap();
    }
}
