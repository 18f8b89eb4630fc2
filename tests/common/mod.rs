//! Helpers shared by the integration tests: every resource stack on a fresh
//! sim runtime, stream-ordered host probes (gates, readers, writers), state
//! snapshots for "changes nothing" checks, and a tiny deterministic RNG.
//!
//! The reliability tests that also run on a GPU (tests/stress.rs,
//! tests/fault_sweep.rs) pick their backend with [`test_backend`] from
//! `XLOG_TEST_BACKEND` (sim by default) and reach block contents through a
//! [`DataPlane`]; every other test stays on the sim backend.

#![allow(dead_code)]

/// Reference model of the runtime's semantics and a step-by-step harness
/// (used by tests/model.rs and tests/fault_sweep.rs).
pub mod model;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use xlog_cuda::device::sim::SimDevice;
use xlog_cuda::device::Device;
use xlog_cuda::resource::Usage;
use xlog_cuda::{
    AllocatorKind, Backend, BlockId, BlockState, Config, ResourceError, ResourceResult, Runtime, Stats,
    StreamId,
};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;

/// How long a stream that must be blocked is watched before we conclude it
/// really is blocked. A correct runtime keeps it blocked forever, so this
/// only bounds how quickly a broken one is caught.
pub const SHORT: Duration = Duration::from_millis(100);
/// Upper bound for work that must complete (only reached when it is broken).
pub const LONG: Duration = Duration::from_secs(10);

/// The resource stacks every shared test runs against.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum StackKind {
    /// Synchronous allocate/free, no tracking, no budget.
    Direct,
    /// Stream-ordered pool with tracking, no budget.
    Async,
    /// Budget over the async pool.
    BudgetAsync,
    /// Budget over logging over the async pool (the recommended stack).
    BudgetLoggingAsync,
    /// The async pool with its cache off (every free goes to the driver).
    AsyncNoCache,
    /// Budget over the async pool with its cache off.
    BudgetAsyncNoCache,
}

pub const ALL_STACKS: [StackKind; 6] = [
    StackKind::Direct,
    StackKind::Async,
    StackKind::BudgetAsync,
    StackKind::BudgetLoggingAsync,
    StackKind::AsyncNoCache,
    StackKind::BudgetAsyncNoCache,
];

/// What refuses a request larger than what is left.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The budget layer, before the device is asked (`OutOfBudget`).
    Budget,
    /// The device itself (`OutOfMemory`).
    Device,
}

/// What a stack is declared to do. Every difference between the stacks that
/// a shared test may observe is one of these: the tests read them (or are
/// instantiated only for the stacks whose properties they need), never the
/// stack's identity. Declared once, in [`StackKind::props`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StackProps {
    pub name: &'static str,
    /// The stream-ordered pool (`AllocatorKind::Async`); else Direct, whose
    /// frees are synchronous (never pending).
    pub stream_ordered: bool,
    /// prepare/finish record and wait on cross-stream uses; else every
    /// form is refused with StreamMisuse (before the handle is looked at)
    /// and changes nothing.
    pub tracks_uses: bool,
    /// A free goes to the per-stream cache (no driver call; the driver's
    /// free comes at trim or under pressure).
    pub frees_to_cache: bool,
    /// The state a free leaves a block that held memory in (a zero-size
    /// block always retires at once).
    pub freed_state: BlockState,
    /// A budget layer charges every held byte (limit: `Opts::budget_bytes`).
    pub budget: bool,
    /// A CSV log of allocator events.
    pub logs: bool,
    /// A block holds its size class (the cache's), else its size rounded up
    /// to 256 bytes.
    pub held_rounds_to_size_class: bool,
    /// The driver is asked for the held bytes (the pool), else for the
    /// requested ones (Direct).
    pub driver_sees_held_bytes: bool,
    /// What refuses a request larger than what is left.
    pub refusal: Refusal,
}

impl StackProps {
    /// Device bytes a block of `size` holds on this stack.
    pub fn held_bytes(&self, size: u64) -> u64 {
        if self.held_rounds_to_size_class {
            xlog_cuda::resources::stream_cache::size_class(size).expect("size fits")
        } else {
            size.div_ceil(256) * 256
        }
    }

    /// Bytes the driver is asked for when a block of `size` is allocated.
    pub fn driver_bytes(&self, size: u64) -> u64 {
        if self.driver_sees_held_bytes { self.held_bytes(size) } else { size }
    }

    /// State of a block of `size` right after a successful free.
    pub fn freed_state(&self, size: u64) -> BlockState {
        if size == 0 { BlockState::Retired } else { self.freed_state }
    }

    /// Bytes a free of `size` leaves pending (retired by a later reap/drain).
    pub fn pending_after_free(&self, size: u64) -> u64 {
        if self.freed_state(size) == BlockState::Pending { self.held_bytes(size) } else { 0 }
    }
}

impl StackKind {
    /// The declared properties of each stack: the one place that says how
    /// the stacks differ.
    pub const fn props(self) -> StackProps {
        use BlockState::{Cached, Pending, Retired};
        let (name, stream_ordered, frees_to_cache, budget, logs) = match self {
            StackKind::Direct => ("Direct", false, false, false, false),
            StackKind::Async => ("Async", true, true, false, false),
            StackKind::BudgetAsync => ("Budget(Async)", true, true, true, false),
            StackKind::BudgetLoggingAsync => ("Budget(Logging(Async))", true, true, true, true),
            StackKind::AsyncNoCache => ("Async[cache off]", true, false, false, false),
            StackKind::BudgetAsyncNoCache => ("Budget(Async[cache off])", true, false, true, false),
        };
        StackProps {
            name,
            stream_ordered,
            tracks_uses: stream_ordered,
            frees_to_cache,
            freed_state: match (stream_ordered, frees_to_cache) {
                (false, _) => Retired,
                (true, true) => Cached,
                (true, false) => Pending,
            },
            budget,
            logs,
            held_rounds_to_size_class: frees_to_cache,
            driver_sees_held_bytes: stream_ordered,
            refusal: if budget { Refusal::Budget } else { Refusal::Device },
        }
    }

    pub fn name(self) -> &'static str {
        self.props().name
    }

    pub fn has_budget(self) -> bool {
        self.props().budget
    }

    /// Freed blocks go to the per-stream cache (Cached), not the driver.
    pub fn caches(self) -> bool {
        self.props().frees_to_cache
    }

    /// Device bytes a block of `size` takes on this stack.
    pub fn held_bytes(self, size: u64) -> u64 {
        self.props().held_bytes(size)
    }

    /// State of a block right after a successful free.
    pub fn freed_state(self, size: u64) -> BlockState {
        self.props().freed_state(size)
    }

    pub fn has_logging(self) -> bool {
        self.props().logs
    }

    /// Stream-ordered (frees go pending) and tracking cross-stream uses.
    pub fn is_async(self) -> bool {
        self.props().stream_ordered
    }
}

impl fmt::Display for StackKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Knobs a test may change; everything else is the library default.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Sim unless a test asks for [`test_backend`].
    pub backend: Backend,
    /// Used only by the stacks that have a budget layer.
    pub budget_bytes: u64,
    pub capacity_bytes: u64,
    pub wait_on_pressure: bool,
    pub stream_pool_size: u32,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            backend: Backend::Sim,
            budget_bytes: MIB,
            capacity_bytes: 4 * MIB,
            wait_on_pressure: false,
            stream_pool_size: 16,
        }
    }
}

/// A unique file name in the system temp dir.
pub fn temp_path(what: &str, ext: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "xlog-cuda-test-{}-{}-{what}.{ext}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// One stack on its own fresh runtime (sim unless `Opts::backend` says
/// otherwise). The log file (if any) is removed when the stack is dropped.
pub struct Stack {
    pub kind: StackKind,
    /// `kind.props()`: what the tests read.
    pub props: StackProps,
    pub rt: Arc<Runtime>,
    pub log_path: Option<PathBuf>,
    pub limit: Option<u64>,
}

impl Stack {
    pub fn config(kind: StackKind, opts: &Opts, log_path: Option<PathBuf>) -> Config {
        Config {
            backend: opts.backend,
            allocator: if kind.is_async() { AllocatorKind::Async } else { AllocatorKind::Direct },
            budget_bytes: if kind.has_budget() { opts.budget_bytes } else { 0 },
            stream_pool_size: opts.stream_pool_size,
            log_path,
            sim_capacity_bytes: opts.capacity_bytes,
            wait_on_pressure: opts.wait_on_pressure,
            cache: kind.caches(),
            pool_release_threshold: u64::MAX,
            track_call_sites: false,
            sim_devices: 1,
            // These stacks test the driver pool's mechanics (caches,
            // pending frees, reap); the arena has its own suite
            // (tests/arena.rs).
            arena: false,
        }
    }

    pub fn open(kind: StackKind, opts: Opts) -> Stack {
        let log_path = kind.has_logging().then(|| temp_path("log", "csv"));
        let cfg = Stack::config(kind, &opts, log_path.clone());
        let rt = Runtime::open(0, &cfg).unwrap_or_else(|e| panic!("[{kind}] open failed: {e}"));
        assert_eq!(rt.backend(), opts.backend, "[{kind}]");
        assert_eq!(rt.supports_tracking(), kind.props().tracks_uses, "[{kind}] supports_tracking");
        assert_eq!(rt.budget().is_some(), kind.has_budget(), "[{kind}] budget layer present");
        Stack { kind, props: kind.props(), rt, log_path, limit: kind.has_budget().then_some(opts.budget_bytes) }
    }

    pub fn open_default(kind: StackKind) -> Stack {
        Stack::open(kind, Opts::default())
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    pub fn sim(&self) -> &SimDevice {
        self.rt.sim().expect("sim backend")
    }

    pub fn stream(&self) -> StreamId {
        self.rt.acquire_stream().unwrap_or_else(|e| panic!("[{}] acquire_stream: {e}", self.name()))
    }

    pub fn reserved(&self) -> Option<u64> {
        self.rt.budget().map(|b| b.reserved())
    }

    /// The budget invariant (`reserved == inner outstanding`) and the stats
    /// that follow from it, or the no-budget defaults.
    pub fn check_invariant(&self, what: &str) {
        let n = self.name();
        let usage = self.rt.usage();
        let stats = self.rt.stats().unwrap_or_else(|e| panic!("[{n}] {what}: stats: {e}"));
        assert_eq!(
            stats.outstanding_bytes,
            stats.live_bytes + stats.cached_bytes + stats.pending_bytes,
            "[{n}] {what}"
        );
        if !self.props.frees_to_cache {
            assert_eq!((stats.cached_bytes, stats.cached_blocks), (0, 0), "[{n}] {what}: no cache");
        }
        if self.rt.sim().is_some() {
            assert_eq!(stats.reserved_bytes, stats.outstanding_bytes, "[{n}] {what}: sim reserved = held");
        }
        assert_eq!(stats.outstanding_bytes, usage.outstanding_bytes(), "[{n}] {what}");
        if !self.props.stream_ordered {
            assert_eq!(usage.pending_bytes, 0, "[{n}] {what}: Direct never has pending bytes");
        }
        match (self.rt.budget(), self.limit) {
            (Some(b), Some(limit)) => {
                let reserved = b.reserved();
                assert_eq!(
                    reserved,
                    usage.outstanding_bytes(),
                    "[{n}] {what}: budget reserved != inner outstanding ({usage:?})"
                );
                assert!(reserved <= limit, "[{n}] {what}: reserved {reserved} > limit {limit}");
                assert_eq!(stats.budget_limit, limit, "[{n}] {what}");
                assert_eq!(stats.budget_remaining, limit - reserved, "[{n}] {what}");
            }
            (None, None) => {
                assert_eq!(stats.budget_limit, 0, "[{n}] {what}");
                assert_eq!(stats.budget_remaining, u64::MAX, "[{n}] {what}");
            }
            other => panic!("[{n}] {what}: budget layer and limit disagree: {:?}", other.1),
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            usage: self.rt.usage(),
            stats: self.rt.stats().expect("stats"),
            reserved: self.reserved(),
            sim_in_use: self.sim().bytes_in_use(),
        }
    }

    /// Nothing changed since `before` (no bytes, blocks, waits or events),
    /// except `failed` more failed allocations were counted.
    pub fn assert_unchanged(&self, before: &Snapshot, failed: u64, what: &str) {
        self.assert_unchanged_inner(before, failed, false, what);
    }

    /// As `assert_unchanged`, but events recorded by a reap (a refusal reaps
    /// under pressure, which seals pending frees) are allowed.
    pub fn assert_unchanged_but_reaped(&self, before: &Snapshot, failed: u64, what: &str) {
        self.assert_unchanged_inner(before, failed, true, what);
    }

    fn assert_unchanged_inner(&self, before: &Snapshot, failed: u64, reaped: bool, what: &str) {
        let n = self.name();
        let now = self.snapshot();
        let mut usage = now.usage;
        // A refusal by the driver is retried once the cache is given back:
        // the retry counter is telemetry of that attempt, not state.
        assert!(usage.alloc_retries >= before.usage.alloc_retries, "[{n}] {what}");
        usage.alloc_retries = before.usage.alloc_retries;
        if reaped {
            assert!(usage.events_recorded >= before.usage.events_recorded, "[{n}] {what}");
            usage.events_recorded = before.usage.events_recorded;
        }
        assert_eq!(usage, before.usage, "[{n}] {what}: usage changed");
        assert_eq!(now.reserved, before.reserved, "[{n}] {what}: budget reservation changed");
        assert_eq!(now.sim_in_use, before.sim_in_use, "[{n}] {what}: device memory changed");
        assert!(now.stats.alloc_retries >= before.stats.alloc_retries, "[{n}] {what}");
        let expected = Stats {
            failed_allocations: before.stats.failed_allocations + failed,
            alloc_retries: now.stats.alloc_retries,
            ..before.stats
        };
        assert_eq!(now.stats, expected, "[{n}] {what}: stats changed");
        self.check_invariant(what);
    }

    /// Give everything freed back to the driver and wait for it: trim the
    /// caches, then drain. Afterwards only live blocks are outstanding.
    pub fn release_all(&self) {
        let n = self.name();
        self.rt.trim(0).unwrap_or_else(|e| panic!("[{n}] trim: {e}"));
        self.rt.drain().unwrap_or_else(|e| panic!("[{n}] drain: {e}"));
        let stats = self.rt.stats().unwrap();
        assert_eq!((stats.cached_bytes, stats.pending_bytes), (0, 0), "[{n}] after trim + drain");
    }

    /// The CSV log so far (reap flushes the logging layer).
    pub fn log_text(&self) -> String {
        let path = self.log_path.as_ref().expect("stack has a log");
        if !self.rt.is_closed() {
            let _ = self.rt.reap();
        }
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // A CUDA runtime is a process-wide singleton held by the registry
        // until its last close: close it here (a test that failed half way
        // included) so the next test opens a fresh one with its own stack.
        if self.rt.sim().is_none() && !self.rt.is_closed() {
            let _ = self.rt.close();
        }
        if let Some(p) = &self.log_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[derive(Clone, Debug)]
pub struct Snapshot {
    pub usage: Usage,
    pub stats: Stats,
    pub reserved: Option<u64>,
    pub sim_in_use: u64,
}

// ----- expected errors -----

/// `r` must be `UseAfterFree` naming exactly `id`'s generation and pointer.
pub fn expect_use_after_free<T: fmt::Debug>(r: ResourceResult<T>, id: &BlockId, what: &str) {
    match r {
        Err(e @ ResourceError::UseAfterFree { .. }) => {
            let ResourceError::UseAfterFree { generation, ptr, .. } = &e else { unreachable!() };
            assert_eq!(*generation, id.generation, "{what}: {e}");
            assert_eq!(*ptr, id.ptr, "{what}: {e}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("generation {}", id.generation)), "{what}: {msg}");
            assert!(msg.contains(&format!("{:#x}", id.ptr)), "{what}: {msg}");
        }
        other => panic!("{what}: expected UseAfterFree, got {other:?}"),
    }
}

/// `r` must be `StreamMisuse` (tracking asked of a stack without it).
pub fn expect_stream_misuse<T: fmt::Debug>(r: ResourceResult<T>, what: &str) {
    match r {
        Err(ResourceError::StreamMisuse(msg)) => {
            assert!(msg.contains("does not track"), "{what}: {msg}");
        }
        other => panic!("{what}: expected StreamMisuse, got {other:?}"),
    }
}

/// `r` must be `InvalidArgument` whose message contains every needle.
pub fn expect_invalid<T: fmt::Debug>(r: ResourceResult<T>, needles: &[&str], what: &str) {
    match r {
        Err(ResourceError::InvalidArgument(msg)) => {
            for n in needles {
                assert!(msg.contains(n), "{what}: message {msg:?} lacks {n:?}");
            }
        }
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

/// `r` must be `Driver` caused by an injected sim fault.
pub fn expect_injected<T: fmt::Debug>(r: ResourceResult<T>, needles: &[&str], what: &str) {
    match r {
        Err(ResourceError::Driver(msg)) => {
            assert!(msg.contains("injected fault"), "{what}: {msg}");
            for n in needles {
                assert!(msg.contains(n), "{what}: message {msg:?} lacks {n:?}");
            }
        }
        other => panic!("{what}: expected an injected Driver error, got {other:?}"),
    }
}

// ----- stream-ordered host probes -----

/// Device handle for 'static host callbacks.
pub fn dev(rt: &Runtime) -> Arc<dyn Device> {
    rt.device().clone()
}

fn sim_of(d: &Arc<dyn Device>) -> &SimDevice {
    d.as_sim().expect("sim backend")
}

/// Blocks its stream until opened or dropped.
pub struct Gate(Option<Sender<()>>);

impl Gate {
    pub fn open(&mut self) {
        self.0.take();
    }
}

/// Queue a callback on `stream` that blocks until the returned gate opens.
/// Dropping the gate (a failing test unwinding) opens it too, so no worker
/// is left stuck.
pub fn gate(rt: &Runtime, stream: StreamId) -> Gate {
    let (tx, rx) = mpsc::channel::<()>();
    rt.enqueue_host(stream, Box::new(move || {
        let _ = rx.recv();
    }))
    .unwrap();
    Gate(Some(tx))
}

/// In stream order: sleep `delay`, then write `value` at `ptr`.
pub fn host_write_u64(rt: &Runtime, stream: StreamId, ptr: u64, value: u64, delay: Duration) {
    let d = dev(rt);
    rt.enqueue_host(stream, Box::new(move || {
        std::thread::sleep(delay);
        sim_of(&d).write_u64(ptr, value).unwrap();
    }))
    .unwrap();
}

/// In stream order: sleep `delay`, then read the u64 at `ptr` and send it.
pub fn host_read_u64(rt: &Runtime, stream: StreamId, ptr: u64, delay: Duration) -> Receiver<u64> {
    let (tx, rx) = mpsc::channel();
    let d = dev(rt);
    rt.enqueue_host(stream, Box::new(move || {
        std::thread::sleep(delay);
        let _ = tx.send(sim_of(&d).read_u64(ptr).unwrap());
    }))
    .unwrap();
    rx
}

/// In stream order: sleep `delay`, then fill `len` bytes at `ptr`.
pub fn host_fill(rt: &Runtime, stream: StreamId, ptr: u64, len: u64, byte: u8, delay: Duration) {
    let d = dev(rt);
    rt.enqueue_host(stream, Box::new(move || {
        std::thread::sleep(delay);
        sim_of(&d).fill(ptr, len, byte).unwrap();
    }))
    .unwrap();
}

/// In stream order: sleep `delay`, then copy `len` bytes at `ptr` out.
pub fn host_read_bytes(rt: &Runtime, stream: StreamId, ptr: u64, len: u64, delay: Duration) -> Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    let d = dev(rt);
    rt.enqueue_host(stream, Box::new(move || {
        std::thread::sleep(delay);
        let _ = tx.send(sim_of(&d).read(ptr, len).unwrap());
    }))
    .unwrap();
    rx
}

/// Fires once everything queued on `stream` so far has run.
pub fn marker(rt: &Runtime, stream: StreamId) -> Receiver<()> {
    let (tx, rx) = mpsc::channel();
    rt.enqueue_host(stream, Box::new(move || {
        let _ = tx.send(());
    }))
    .unwrap();
    rx
}

/// The receiver must stay silent for `SHORT` (its stream is blocked).
pub fn assert_blocked<T: fmt::Debug>(rx: &Receiver<T>, what: &str) {
    match rx.recv_timeout(SHORT) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        other => panic!("{what}: expected the stream to be blocked, but got {other:?}"),
    }
}

/// The receiver's value, waiting at most `LONG`.
pub fn recv<T>(rx: &Receiver<T>, what: &str) -> T {
    rx.recv_timeout(LONG).unwrap_or_else(|e| panic!("{what}: no result from the stream ({e})"))
}

// ----- backend selection (tests that can run on a GPU) -----

/// The backend `XLOG_TEST_BACKEND` asks for: `sim` (the default) or `cuda`.
///
/// A CUDA run that finds no usable GPU is an error, never a quiet pass: this
/// panics with the reason (driver missing, no device, `cuInit` failing), so
/// a misconfigured GPU machine cannot report green without having tested.
pub fn test_backend() -> Backend {
    static CHOSEN: OnceLock<Result<Backend, String>> = OnceLock::new();
    static KEEP_CONTEXT: OnceLock<Arc<xlog_cuda::device::cuda::CudaDevice>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        let requested = std::env::var("XLOG_TEST_BACKEND").unwrap_or_default();
        match requested.trim().to_ascii_lowercase().as_str() {
            "" | "sim" => Ok(Backend::Sim),
            "cuda" => match xlog_cuda::device::cuda::device_count() {
                Ok(n) if n > 0 => {
                    let device = xlog_cuda::device::cuda::CudaDevice::open(0)
                        .map_err(|e| format!("the driver reports {n} devices, but device 0 does not open: {e}"))?;
                    println!(
                        "XLOG_TEST_BACKEND=cuda: running on the CUDA backend, device 0 of {n}: {}",
                        device.name()
                    );
                    // Keep device 0's primary context retained for the whole
                    // process: the sweeps open and close a runtime thousands
                    // of times, and the last release would destroy the
                    // context (and its memory pool) every time.
                    KEEP_CONTEXT.get_or_init(|| device);
                    Ok(Backend::Cuda)
                }
                Ok(n) => Err(format!("the driver reports {n} CUDA devices")),
                Err(e) => Err(e.to_string()),
            }
            .map_err(|why| {
                format!(
                    "XLOG_TEST_BACKEND=cuda, but no GPU is usable here ({why}). A requested CUDA run \
                     without a GPU is an error, not a skip; unset XLOG_TEST_BACKEND to run on the sim backend"
                )
            }),
            other => Err(format!("XLOG_TEST_BACKEND={other:?} is not a backend (expected sim or cuda)")),
        }
    });
    match chosen {
        Ok(b) => *b,
        Err(message) => panic!("{message}"),
    }
}

/// Serializes tests that open a CUDA runtime: on CUDA the runtime of an
/// ordinal is one process-wide singleton, and a second open with another
/// stack or budget is refused, so two such tests cannot overlap. On sim
/// (independent runtimes) nothing is held and tests run in parallel.
pub fn backend_serial(backend: Backend) -> Option<MutexGuard<'static, ()>> {
    static SERIAL: Mutex<()> = Mutex::new(());
    (backend != Backend::Sim).then(|| SERIAL.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Where host "kernels" (stream-ordered host callbacks) read and write the
/// contents of blocks.
///
/// - Sim: the sim device's real memory, as before.
/// - CUDA: a host callback (`cuLaunchHostFunc`) may neither touch device
///   memory nor call the driver, so the contents live in a host-side shadow
///   keyed by device address. Only host callbacks read and write it, and
///   those run in stream order on the real GPU streams, so it checks the
///   same thing the sim memory does: a missing or wrong cross-stream wait
///   shows up as a reader seeing a value other than the last writer's.
///   (What it cannot see is a GPU kernel touching freed memory; that is
///   what compute-sanitizer memcheck over the CUDA kernel tests is for.)
#[derive(Clone)]
pub enum DataPlane {
    Sim(Arc<dyn Device>),
    Shadow(Arc<Mutex<HashMap<u64, u8>>>),
}

impl DataPlane {
    pub fn for_runtime(rt: &Runtime) -> DataPlane {
        if rt.sim().is_some() {
            DataPlane::Sim(rt.device().clone())
        } else {
            DataPlane::Shadow(Arc::default())
        }
    }

    pub fn describe(&self) -> &'static str {
        match self {
            DataPlane::Sim(_) => "sim device memory",
            DataPlane::Shadow(_) => "host shadow of device memory, written and read by stream-ordered host callbacks",
        }
    }

    fn shadow(m: &Mutex<HashMap<u64, u8>>) -> MutexGuard<'_, HashMap<u64, u8>> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn fill(&self, ptr: u64, len: u64, byte: u8) -> Result<(), String> {
        match self {
            DataPlane::Sim(d) => sim_of(d).fill(ptr, len, byte).map_err(|e| e.to_string()),
            DataPlane::Shadow(m) => {
                let mut mem = DataPlane::shadow(m);
                for a in ptr..ptr + len {
                    mem.insert(a, byte);
                }
                Ok(())
            }
        }
    }

    /// Bytes never written read as 0 on the shadow (the model never checks
    /// a block before a launch wrote it).
    pub fn read(&self, ptr: u64, len: u64) -> Result<Vec<u8>, String> {
        match self {
            DataPlane::Sim(d) => sim_of(d).read(ptr, len).map_err(|e| e.to_string()),
            DataPlane::Shadow(m) => {
                let mem = DataPlane::shadow(m);
                Ok((ptr..ptr + len).map(|a| mem.get(&a).copied().unwrap_or(0)).collect())
            }
        }
    }

    pub fn write_u64(&self, ptr: u64, value: u64) -> Result<(), String> {
        match self {
            DataPlane::Sim(d) => sim_of(d).write_u64(ptr, value).map_err(|e| e.to_string()),
            DataPlane::Shadow(m) => {
                let mut mem = DataPlane::shadow(m);
                for (a, b) in (ptr..).zip(value.to_le_bytes()) {
                    mem.insert(a, b);
                }
                Ok(())
            }
        }
    }

    pub fn read_u64(&self, ptr: u64) -> Result<u64, String> {
        let bytes = self.read(ptr, 8)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }
}

// ----- misc -----

/// xorshift64*: deterministic per seed, no dependency.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One parsed CSV log line (fields after the header; the tag unquoted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub thread: String,
    pub time: String,
    pub action: String,
    pub pointer: String,
    pub size: u64,
    pub stream: u32,
    pub tag: String,
    pub device: i32,
    pub process: u32,
    pub detail: String,
}

/// Split one CSV record; a quoted field may hold commas and doubled quotes.
pub fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            ('"', true) => quoted = false,
            ('"', false) if cur.is_empty() => quoted = true,
            (',', false) => fields.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

pub fn parse_log(text: &str) -> (String, Vec<LogLine>) {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default().to_string();
    let records = lines
        .map(|l| {
            let f = csv_fields(l);
            assert_eq!(f.len(), 10, "log line {l:?} has {} fields", f.len());
            LogLine {
                thread: f[0].clone(),
                time: f[1].clone(),
                action: f[2].clone(),
                pointer: f[3].clone(),
                size: f[4].parse().unwrap_or_else(|_| panic!("size in {l:?}")),
                stream: f[5].parse().unwrap_or_else(|_| panic!("stream in {l:?}")),
                tag: f[6].clone(),
                device: f[7].parse().unwrap_or_else(|_| panic!("device in {l:?}")),
                process: f[8].parse().unwrap_or_else(|_| panic!("process in {l:?}")),
                detail: f[9].clone(),
            }
        })
        .collect();
    (header, records)
}
