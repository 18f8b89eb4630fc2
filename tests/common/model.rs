//! A reference model of DESIGN.md's semantics and a harness that runs one
//! operation at a time against a real sim runtime and the model, comparing
//! after every step.
//!
//! The model is deliberately small: the set of handles ever issued (live or
//! not, by generation), live / pending byte and block counts, the budget
//! limit, the stream ids ever issued (live or released) and the pool's
//! size. It predicts the exact status of every call (Ok or the exact error
//! variant with its numbers), and after every step the runtime's stats must
//! equal the model's.
//!
//! Only one thing is nondeterministic on the sim backend: when a pending
//! free retires (the stream worker passes it on its own thread). The model
//! reconciles at the three places where retirement is observed — `reap`
//! (the model moves exactly the bytes reaped, which must not exceed what it
//! holds pending), `drain` (must retire everything pending) and a budget
//! allocation under pressure (which reaps first; the observed drop must be
//! within what was pending). Everywhere else pending bytes must not move.
//!
//! Launches (`prepare_all` → host kernel → `finish_all`) also check data:
//! the kernel fills the blocks it writes with the launch's byte and checks
//! the blocks it reads against the byte the model says the last launch in
//! program order wrote. The tracking exists to make the concurrent run equal
//! the program-order one, so any difference is reported.
//!
//! The stream-ordered cache (cache-on stacks): the model keeps every
//! cached block (pointer, class, stream) that a free put there, and the
//! device under the runtime (`Recorder`) records every block the pool gives
//! back to the driver (hoarding bound, pressure, trim), so the cache is
//! known exactly without knowing the pool's release policy. Each allocation
//! is checked against the hand-out rule (`check_hand_out`: own stream's
//! fitting block first, the smallest fitting class, the most recently
//! cached; else another stream's, with one event and one wait; else a miss
//! with held == size_class(size) and no fitting block cached), each budget
//! refusal for consistency with the state right after it (the request's
//! device bytes really did not fit, the cache was given back first, and
//! with wait_on_pressure no refusal of a request that fits next to the live
//! bytes), each trim against the bytes it reports, and after every
//! operation the budget invariant: reserved == outstanding == live + cached
//! + pending ≤ limit. Live, cached and pending are device bytes.
//!
//! The harness is used by `tests/model.rs` (random sequences, proptest) and
//! `tests/fault_sweep.rs` (a fixed workload with injected faults).
//!
//! On the CUDA backend (`HarnessOpts::backend`, used by the fault sweep when
//! `XLOG_TEST_BACKEND=cuda`) everything above is checked the same way except
//! what only the sim can show: the device's own bytes in use (the CUDA pool
//! keeps freed memory cached) is not compared, launch kernels keep their
//! data in a host shadow (see `DataPlane`), the "too big for the device"
//! size is the GPU's total memory plus one, and a size beyond the device
//! may be refused by the driver as out of memory or as an invalid value
//! (either is accepted, the rollback is checked the same way).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::Union;
use xlog_cuda::device::sim::SimDevice;
use xlog_cuda::device::{Device, DevicePtr, DeviceResult, FaultKind, Faults, HostFn, RawEvent, RawStream};
use xlog_cuda::resource::Usage;
use xlog_cuda::resources::stream_cache::size_class as cache_class;
use xlog_cuda::{
    Access, Backend, BlockId, BlockState, BlockUse, Generation, ResourceError, ResourceResult, Runtime, Stats,
    StreamId,
};

use super::{gate, DataPlane, Gate, Opts, Stack, StackKind};

// ----- the operation language -----

/// How big an allocation is; some classes depend on the state at the time.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SizeClass {
    Zero,
    /// 1..=64 bytes.
    Tiny(u8),
    /// 65..=4096 bytes.
    Small(u16),
    /// 4097..=16384 bytes.
    Medium(u16),
    /// Exactly what the budget has left (limit − outstanding, by the model;
    /// on stacks without a budget, `budget_bytes` − live).
    ExactFit,
    /// One byte more than the budget has left.
    OverByOne,
    /// More than the budget (budget stacks) or the device (others) can hold.
    OverLimit,
    /// `u64::MAX` (true) or `1 << 63` (false): no stack can satisfy it.
    Absurd(bool),
}

/// Which stream id an operation names.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SRef {
    /// The (n mod count)-th live stream, in acquisition order.
    Live(u8),
    /// The (n mod count)-th stream ever issued, possibly released.
    Any(u8),
    /// An id this runtime never issued (0, or one near `u32::MAX`).
    Never(bool),
}

/// How a forged handle differs from the live block it copies.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Forge {
    Ptr,
    Size,
    Stream,
    Device,
}

/// Which block handle an operation names.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HRef {
    /// The (n mod count)-th live block, in allocation order.
    Live(u8),
    /// The (n mod count)-th handle ever issued: stale once freed (a second
    /// free of it is a double free).
    Any(u8),
    /// A live block's handle with one field changed.
    Forged(u8, Forge),
    /// A generation never issued.
    Never(u8),
    /// The most recently allocated block that is still live.
    Newest,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Acc {
    R,
    W,
    RW,
}

impl Acc {
    pub fn access(self) -> Access {
        match self {
            Acc::R => Access::Read,
            Acc::W => Access::Write,
            Acc::RW => Access::ReadWrite,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Alloc(SizeClass, SRef),
    Free(HRef),
    Validate(HRef),
    Prepare(HRef, SRef, Acc),
    Finish(HRef, SRef, Acc),
    PrepareAll(SRef, Vec<(HRef, Acc)>),
    FinishAll(SRef, Vec<(HRef, Acc)>),
    /// prepare_all → a host "kernel" → finish_all; the kernel writes the
    /// byte into every written block and checks every read block.
    Launch(SRef, Vec<(HRef, Acc)>, u8),
    Reap,
    Drain,
    /// `trim(keep)`: keep at most `keep_bytes(n)` cached bytes.
    Trim(u8),
    Acquire,
    Release(SRef),
    /// A host callback that checks it runs in FIFO order on its stream.
    Host(SRef),
    /// Synchronize a stream; every host callback queued on it has run.
    Sync(SRef),
    /// Queue a gate on a stream: it runs nothing further until `Unhold`.
    /// Never generated at random (a later synchronize or drain would wait
    /// forever); fixed workloads use it to make a free's completion wait.
    Hold(SRef),
    /// Open every gate.
    Unhold,
}

// ----- proptest strategies -----

pub fn size_class() -> impl Strategy<Value = SizeClass> {
    prop_oneof![
        1 => Just(SizeClass::Zero),
        4 => any::<u8>().prop_map(SizeClass::Tiny),
        7 => any::<u16>().prop_map(SizeClass::Small),
        4 => any::<u16>().prop_map(SizeClass::Medium),
        1 => Just(SizeClass::ExactFit),
        1 => Just(SizeClass::OverByOne),
        1 => Just(SizeClass::OverLimit),
        1 => any::<bool>().prop_map(SizeClass::Absurd),
    ]
}

pub fn stream_ref() -> impl Strategy<Value = SRef> {
    prop_oneof![
        17 => any::<u8>().prop_map(SRef::Live),
        2 => any::<u8>().prop_map(SRef::Any),
        1 => any::<bool>().prop_map(SRef::Never),
    ]
}

pub fn forge() -> impl Strategy<Value = Forge> {
    prop_oneof![Just(Forge::Ptr), Just(Forge::Size), Just(Forge::Stream), Just(Forge::Device)]
}

pub fn handle_ref() -> impl Strategy<Value = HRef> {
    prop_oneof![
        14 => any::<u8>().prop_map(HRef::Live),
        3 => any::<u8>().prop_map(HRef::Any),
        2 => (any::<u8>(), forge()).prop_map(|(n, f)| HRef::Forged(n, f)),
        1 => any::<u8>().prop_map(HRef::Never),
        2 => Just(HRef::Newest),
    ]
}

pub fn acc() -> impl Strategy<Value = Acc> {
    prop_oneof![Just(Acc::R), Just(Acc::W), Just(Acc::RW)]
}

fn uses(min: usize) -> impl Strategy<Value = Vec<(HRef, Acc)>> {
    prop::collection::vec((handle_ref(), acc()), min..=4)
}

pub fn op() -> impl Strategy<Value = Op> {
    Union::new_weighted(vec![
        (20, (size_class(), stream_ref()).prop_map(|(s, r)| Op::Alloc(s, r)).boxed()),
        (12, handle_ref().prop_map(Op::Free).boxed()),
        (2, handle_ref().prop_map(Op::Validate).boxed()),
        (5, (handle_ref(), stream_ref(), acc()).prop_map(|(h, s, a)| Op::Prepare(h, s, a)).boxed()),
        (5, (handle_ref(), stream_ref(), acc()).prop_map(|(h, s, a)| Op::Finish(h, s, a)).boxed()),
        (3, (stream_ref(), uses(0)).prop_map(|(s, u)| Op::PrepareAll(s, u)).boxed()),
        (3, (stream_ref(), uses(0)).prop_map(|(s, u)| Op::FinishAll(s, u)).boxed()),
        (12, (stream_ref(), uses(1), any::<u8>()).prop_map(|(s, u, v)| Op::Launch(s, u, v)).boxed()),
        (5, Just(Op::Reap).boxed()),
        (2, Just(Op::Drain).boxed()),
        (2, any::<u8>().prop_map(Op::Trim).boxed()),
        (3, Just(Op::Acquire).boxed()),
        (2, stream_ref().prop_map(Op::Release).boxed()),
        (3, stream_ref().prop_map(Op::Host).boxed()),
        (2, stream_ref().prop_map(Op::Sync).boxed()),
    ])
}

// ----- the model -----

/// Bytes the sim heap really takes for a block (it rounds up to 256).
pub fn heap_bytes(size: u64) -> u64 {
    size.div_ceil(256) * 256
}

/// Bytes of a block the launch kernels touch.
const DATA_BYTES: u64 = 64;

const TAGS: [&str; 8] = ["m-a", "m-b", "m-c", "m-d", "m-e", "m-f", "m-g", "m-h"];

#[derive(Clone, Debug)]
struct MBlock {
    id: BlockId,
    /// Device bytes (`DeviceBlock::held` at allocation).
    held: u64,
    tag: &'static str,
    live: bool,
    /// The byte the last launch (in program order) wrote into the block's
    /// first `DATA_BYTES`; None until one did.
    content: Option<u8>,
}

#[derive(Clone, Debug)]
struct MStream {
    id: StreamId,
    /// The device stream behind the id (pooled streams live until close).
    raw: u64,
    live: bool,
    host_enqueued: u64,
}

/// Table shards of the async pool: a block's record, and the cache its
/// memory goes to when freed, live in the shard of its allocation stream id.
/// Only used to compare how warm two cached blocks are: insertion order is
/// kept per shard.
const POOL_SHARDS: u32 = 32;

/// One cached block, as the model knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CEntry {
    ptr: u64,
    /// Device bytes (its size class).
    class: u64,
    /// The device stream whose cache holds it (its allocation stream).
    raw: u64,
    shard: u32,
    /// Insertion order within its shard: larger is warmer.
    seq: u64,
}

/// Largest class a request of class `c` may be served from (9/8 of it).
fn max_fit(c: u64) -> u64 {
    c.saturating_mul(9) / 8
}

/// The largest size whose class is at most `bytes` (a class itself).
fn class_floor(bytes: u64) -> u64 {
    if bytes < 512 {
        return 0;
    }
    let octave = 1u64 << (63 - bytes.leading_zeros());
    let step = (octave / 16).max(512);
    bytes / step * step
}

/// Bytes `Op::Trim(n)` keeps cached.
pub fn keep_bytes(n: u8) -> u64 {
    match n % 4 {
        0 => 0,
        1 => u64::MAX,
        _ => n as u64 * 512,
    }
}

/// What the model says about a handle.
#[derive(Copy, Clone, Debug)]
enum Class {
    Live(usize),
    /// Live generation, but another field differs.
    Mismatch,
    /// Generation not live (freed, or never issued).
    Stale,
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    blocks: Vec<MBlock>,
    by_gen: HashMap<Generation, usize>,
    streams: Vec<MStream>,
    /// Device bytes of the live blocks.
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub pending_bytes: u64,
    pub pending_blocks: u64,
    /// Every cached block (cache-on stacks), in no particular order.
    cache: Vec<CEntry>,
    shard_seq: [u64; POOL_SHARDS as usize],
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Heap bytes of freed blocks whose free the worker may not have run yet
    /// (an upper bound; cleared whenever nothing is pending any more).
    maybe_in_heap: u64,
    pub peak: u64,
    pub allocations: u64,
    pub deallocations: u64,
    pub failed_allocations: u64,
    pooled_in_use: u32,
    created_streams: u32,
    /// Highest generation seen (they increase on this thread).
    max_generation: u64,
    max_stream_id: u32,
}

impl Model {
    fn live_indices(&self) -> Vec<usize> {
        (0..self.blocks.len()).filter(|&i| self.blocks[i].live).collect()
    }

    fn live_streams(&self) -> Vec<usize> {
        (0..self.streams.len()).filter(|&i| self.streams[i].live).collect()
    }

    fn classify(&self, id: &BlockId) -> Class {
        match self.by_gen.get(&id.generation) {
            Some(&i) if self.blocks[i].live => {
                if self.blocks[i].id == *id {
                    Class::Live(i)
                } else {
                    Class::Mismatch
                }
            }
            _ => Class::Stale,
        }
    }

    fn stream_live(&self, id: StreamId) -> bool {
        self.streams.iter().any(|s| s.id == id && s.live)
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cache.iter().map(|e| e.class).sum()
    }

    fn raw_of(&self, id: StreamId) -> u64 {
        self.streams.iter().find(|s| s.id == id).map_or(0, |s| s.raw)
    }

    /// Put a freed block into its stream's cache (the warmest there).
    fn cache_put(&mut self, ptr: u64, class: u64, raw: u64, stream: StreamId) {
        let shard = stream.0 % POOL_SHARDS;
        self.shard_seq[shard as usize] += 1;
        let seq = self.shard_seq[shard as usize];
        self.cache.push(CEntry { ptr, class, raw, shard, seq });
    }

    pub fn live_generations(&self) -> Vec<(Generation, u64, &'static str)> {
        let mut v: Vec<_> =
            self.blocks.iter().filter(|b| b.live).map(|b| (b.id.generation, b.id.size, b.tag)).collect();
        v.sort();
        v
    }
}

/// How the harness opens its runtime.
#[derive(Clone, Debug)]
pub struct HarnessOpts {
    pub backend: Backend,
    pub budget_bytes: u64,
    /// Sim device memory; on CUDA replaced by the GPU's total memory.
    pub capacity_bytes: u64,
    pub wait_on_pressure: bool,
    pub pool_capacity: u32,
    /// Streams acquired when the harness opens.
    pub initial_streams: u32,
}

/// The device under a harness's runtime: every call goes to the sim device
/// below; each stream-ordered free that the device accepted is recorded, so
/// the model learns exactly which cached blocks the pool gave back to the
/// driver (hoarding bound, pressure, trim) without knowing its policy.
pub struct Recorder {
    inner: Arc<dyn Device>,
    frees: Mutex<Vec<(DevicePtr, RawStream)>>,
}

impl Recorder {
    fn take(&self) -> Vec<(DevicePtr, RawStream)> {
        std::mem::take(&mut *lock(&self.frees))
    }
}

impl Device for Recorder {
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    fn ordinal(&self) -> i32 {
        self.inner.ordinal()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
    fn mem_info(&self) -> DeviceResult<(u64, u64)> {
        self.inner.mem_info()
    }
    fn create_stream(&self) -> DeviceResult<RawStream> {
        self.inner.create_stream()
    }
    fn destroy_stream(&self, stream: RawStream) -> DeviceResult<()> {
        self.inner.destroy_stream(stream)
    }
    fn import_stream(&self, native: u64) -> DeviceResult<RawStream> {
        self.inner.import_stream(native)
    }
    fn native_stream(&self, stream: RawStream) -> u64 {
        self.inner.native_stream(stream)
    }
    fn synchronize_stream(&self, stream: RawStream) -> DeviceResult<()> {
        self.inner.synchronize_stream(stream)
    }
    fn enqueue_host(&self, stream: RawStream, f: HostFn) -> DeviceResult<()> {
        self.inner.enqueue_host(stream, f)
    }
    fn alloc_async(&self, bytes: u64, stream: RawStream) -> DeviceResult<DevicePtr> {
        self.inner.alloc_async(bytes, stream)
    }
    fn free_async(&self, ptr: DevicePtr, stream: RawStream) -> DeviceResult<()> {
        self.inner.free_async(ptr, stream)?;
        lock(&self.frees).push((ptr, stream));
        Ok(())
    }
    fn alloc_sync(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        self.inner.alloc_sync(bytes)
    }
    fn free_sync(&self, ptr: DevicePtr) -> DeviceResult<()> {
        self.inner.free_sync(ptr)
    }
    fn use_private_pool(&self, release_threshold: u64) -> DeviceResult<()> {
        self.inner.use_private_pool(release_threshold)
    }
    fn pool_reserved_bytes(&self) -> Option<u64> {
        self.inner.pool_reserved_bytes()
    }
    fn trim_pool(&self) {
        self.inner.trim_pool()
    }
    fn create_event(&self) -> DeviceResult<RawEvent> {
        self.inner.create_event()
    }
    fn destroy_event(&self, event: RawEvent) {
        self.inner.destroy_event(event)
    }
    fn record_event(&self, event: RawEvent, stream: RawStream) -> DeviceResult<()> {
        self.inner.record_event(event, stream)
    }
    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> DeviceResult<()> {
        self.inner.stream_wait_event(stream, event)
    }
    fn event_query(&self, event: RawEvent) -> DeviceResult<bool> {
        self.inner.event_query(event)
    }
    fn event_synchronize(&self, event: RawEvent) -> DeviceResult<()> {
        self.inner.event_synchronize(event)
    }
    fn as_sim(&self) -> Option<&SimDevice> {
        self.inner.as_sim()
    }
    fn faults(&self) -> Option<&Faults> {
        self.inner.faults()
    }
    fn inject_fault(&self, kind: FaultKind, nth: u64) -> DeviceResult<()> {
        self.inner.inject_fault(kind, nth)
    }
}

impl HarnessOpts {
    pub fn for_stack(kind: StackKind) -> HarnessOpts {
        HarnessOpts {
            backend: Backend::Sim,
            budget_bytes: 64 * 1024,
            // Without a budget nothing bounds the live bytes but the device:
            // 60 operations of at most 64 KiB stay far below 16 MiB, so a
            // normal size never meets a full (or fragmented) device.
            capacity_bytes: if kind.has_budget() { 4 << 20 } else { 16 << 20 },
            wait_on_pressure: false,
            pool_capacity: 3,
            initial_streams: 2,
        }
    }
}

/// A fault the harness may see surface once.
#[derive(Clone, Debug)]
pub struct Fired {
    pub step: usize,
    pub op: String,
    pub message: String,
}

/// Counts of what the runs exercised, for the report.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub by_outcome: HashMap<&'static str, u64>,
}

impl Tally {
    fn add(&mut self, what: &'static str) {
        self.add_n(what, 1);
    }

    fn add_n(&mut self, what: &'static str, n: u64) {
        if n > 0 {
            *self.by_outcome.entry(what).or_default() += n;
        }
    }

    pub fn merge(&mut self, other: &Tally) {
        for (k, v) in &other.by_outcome {
            *self.by_outcome.entry(k).or_default() += v;
        }
    }

    pub fn get(&self, what: &str) -> u64 {
        self.by_outcome.get(what).copied().unwrap_or(0)
    }

    pub fn render(&self) -> String {
        let mut keys: Vec<_> = self.by_outcome.iter().collect();
        keys.sort();
        keys.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    }
}

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Fail the current step with a message (used as `return Err(fail!(...))`).
macro_rules! fail {
    ($($arg:tt)*) => { format!($($arg)*) };
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(format!($($arg)*));
        }
    };
}

macro_rules! ensure_eq {
    ($a:expr, $b:expr, $($arg:tt)*) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{}: {:?} != {:?} ({} vs {})", format!($($arg)*), a, b, stringify!($a), stringify!($b)));
        }
    }};
}

/// The expected error of a call, per the model.
#[derive(Clone, Debug)]
enum Exp {
    UnknownStream(StreamId),
    Mismatch(Generation),
    Stale(BlockId),
    Misuse,
    PoolExhausted(u32),
    OutOfMemory(u64),
    OutOfBudget { requested: u64, live: u64, cached: u64, pending: u64, limit: u64, remaining: u64 },
}

fn check_err<T: std::fmt::Debug>(r: &ResourceResult<T>, exp: &Exp) -> Result<(), String> {
    let err = match r {
        Ok(v) => return Err(fail!("expected {exp:?}, got Ok({v:?})")),
        Err(e) => e,
    };
    let ok = match (exp, err) {
        (Exp::UnknownStream(id), ResourceError::InvalidArgument(m)) => {
            m.contains(&format!("stream {} was never issued by this runtime or has been released", id.0))
        }
        (Exp::Mismatch(g), ResourceError::InvalidArgument(m)) => {
            m.contains(&format!("does not match live block generation {g}"))
        }
        (Exp::Stale(id), ResourceError::UseAfterFree { generation, ptr, .. }) => {
            *generation == id.generation && *ptr == id.ptr
        }
        (Exp::Misuse, ResourceError::StreamMisuse(m)) => m.contains("does not track"),
        (Exp::PoolExhausted(c), ResourceError::PoolExhausted { capacity }) => c == capacity,
        (Exp::OutOfMemory(n), ResourceError::OutOfMemory { requested, .. }) => n == requested,
        (
            Exp::OutOfBudget { requested, live, cached, pending, limit, remaining },
            ResourceError::OutOfBudget {
                requested: r2,
                live: l2,
                cached: c2,
                pending: p2,
                limit: lim2,
                remaining: rem2,
            },
        ) => (requested, live, cached, pending, limit, remaining) == (r2, l2, c2, p2, lim2, rem2),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(fail!("expected {exp:?}, got Err({err:?}) \"{err}\""))
    }
}

/// Where a call may make a device call of each fault kind.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Site {
    Alloc,
    Free,
    /// prepare / prepare_all (a first-use fence), finish / finish_all,
    /// reap and drain (sealing pending frees).
    Event,
    Acquire,
}

/// Both backends word their injected faults alike ("sim allocation of …",
/// "cuda allocation of … (cuMemAllocAsync)").
fn fault_matches(kind: FaultKind, site: Site, message: &str) -> bool {
    match (kind, site) {
        (FaultKind::Alloc, Site::Alloc) => message.contains(" allocation of "),
        (FaultKind::Free, Site::Free) => message.contains(" free of "),
        (FaultKind::EventRecord, Site::Event) => message.contains(" record of event "),
        (FaultKind::StreamCreate, Site::Acquire) => message.contains(" stream creation"),
        _ => false,
    }
}

/// Per-stream FIFO check of host callbacks: (ran so far, violations).
#[derive(Default)]
struct HostLog {
    ran: HashMap<u32, u64>,
    errors: Vec<String>,
}

pub struct Harness {
    pub st: Stack,
    pub kind: StackKind,
    pub opts: HarnessOpts,
    pub m: Model,
    dev: Arc<dyn Device>,
    /// The device calls that gave memory back to the driver.
    recorder: Arc<Recorder>,
    /// Cached blocks handed out or given back while a fault was armed may
    /// have been put back with a new place in the warmth order (or in
    /// another shard): from then on only which blocks are cached is exact.
    order_exact: bool,
    /// Where launch kernels keep block contents.
    data: DataPlane,
    data_errors: Shared<Vec<String>>,
    /// Block reads by kernels that matched program order.
    reads_verified: Arc<AtomicU64>,
    host: Shared<HostLog>,
    fault: Option<FaultKind>,
    pub fired: Option<Fired>,
    pub tally: Tally,
    trace: Vec<String>,
    step_no: usize,
    gates: Vec<Gate>,
}

fn usage_sans_events(u: &Usage) -> Usage {
    Usage { events_recorded: 0, cross_stream_waits: 0, ..*u }
}

impl Harness {
    pub fn open(kind: StackKind, opts: HarnessOpts) -> Result<Harness, String> {
        let stack_opts = Opts {
            backend: opts.backend,
            budget_bytes: opts.budget_bytes,
            capacity_bytes: opts.capacity_bytes,
            wait_on_pressure: opts.wait_on_pressure,
            stream_pool_size: opts.pool_capacity,
        };
        // The runtime over a recording device (see `Recorder`), built
        // directly (on CUDA not through the process-wide registry: the
        // harness is the only opener, see `backend_serial`).
        let log_path = kind.has_logging().then(|| super::temp_path("log", "csv"));
        let cfg = Stack::config(kind, &stack_opts, log_path.clone());
        let inner: Arc<dyn Device> = match opts.backend {
            Backend::Sim => SimDevice::new(0, opts.capacity_bytes).map_err(|e| fail!("sim device: {e}"))?,
            _ => xlog_cuda::device::cuda::CudaDevice::open(0).map_err(|e| fail!("CUDA device 0: {e}"))?,
        };
        let recorder = Arc::new(Recorder { inner, frees: Mutex::default() });
        let rt = Runtime::build(recorder.clone(), &cfg).map_err(|e| fail!("[{kind}] build: {e}"))?;
        ensure_eq!(rt.backend(), opts.backend, "[{kind}] backend");
        ensure_eq!(rt.supports_tracking(), kind.is_async(), "[{kind}] supports_tracking");
        ensure_eq!(rt.budget().is_some(), kind.has_budget(), "[{kind}] budget layer present");
        let limit = kind.has_budget().then_some(opts.budget_bytes);
        let st = Stack { kind, props: kind.props(), rt: Arc::new(rt), log_path, limit };
        let dev = st.rt.device().clone();
        let data = DataPlane::for_runtime(&st.rt);
        let mut opts = opts;
        if st.rt.sim().is_none() {
            // What the device can never hold is what it has, plus one.
            opts.capacity_bytes = dev.mem_info().map_err(|e| fail!("mem_info: {e}"))?.1;
        }
        let mut h = Harness {
            st,
            kind,
            opts: opts.clone(),
            m: Model::default(),
            dev,
            recorder,
            order_exact: true,
            data,
            data_errors: Arc::default(),
            reads_verified: Arc::default(),
            host: Arc::default(),
            fault: None,
            fired: None,
            tally: Tally::default(),
            trace: Vec::new(),
            step_no: 0,
            gates: Vec::new(),
        };
        for _ in 0..opts.initial_streams {
            h.step(&Op::Acquire)?;
        }
        Ok(h)
    }

    pub fn limit(&self) -> Option<u64> {
        self.kind.has_budget().then_some(self.opts.budget_bytes)
    }

    /// Let the harness accept one injected fault of `kind` (armed on the
    /// device, sim or CUDA, to fire at the `nth` call from now).
    pub fn arm_fault(&mut self, kind: FaultKind, nth: u64) {
        self.fault = Some(kind);
        self.order_exact = false;
        self.dev.inject_fault(kind, nth).expect("the device supports fault injection");
    }

    pub fn disarm_fault(&mut self) {
        if let Some(kind) = self.fault.take() {
            self.dev.inject_fault(kind, 0).expect("the device supports fault injection");
        }
    }

    /// The device under the runtime (for probing an armed fault).
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    /// Every step so far with its outcome.
    pub fn trace(&self) -> &[String] {
        &self.trace
    }

    /// The last steps, for failure messages.
    pub fn trace_tail(&self) -> String {
        let start = self.trace.len().saturating_sub(12);
        let mut s = String::new();
        for line in &self.trace[start..] {
            let _ = writeln!(s, "  {line}");
        }
        s
    }

    fn stream_of(&self, r: SRef) -> StreamId {
        match r {
            SRef::Live(n) => {
                let live = self.m.live_streams();
                if live.is_empty() {
                    return self.stream_of(SRef::Any(n));
                }
                self.m.streams[live[n as usize % live.len()]].id
            }
            SRef::Any(n) => {
                if self.m.streams.is_empty() {
                    return self.stream_of(SRef::Never(n % 2 == 0));
                }
                self.m.streams[n as usize % self.m.streams.len()].id
            }
            SRef::Never(zero) => StreamId(if zero { 0 } else { u32::MAX - 2 }),
        }
    }

    fn handle_of(&self, r: HRef) -> BlockId {
        let never = |n: u8| BlockId {
            ptr: 0x1000 + 256 * n as u64,
            size: 64,
            generation: Generation(u64::MAX - n as u64),
            alloc_stream: StreamId(1),
            device: 0,
        };
        let live = self.m.live_indices();
        match r {
            HRef::Live(n) if !live.is_empty() => self.m.blocks[live[n as usize % live.len()]].id,
            HRef::Any(n) if !self.m.blocks.is_empty() => self.m.blocks[n as usize % self.m.blocks.len()].id,
            HRef::Forged(n, f) if !live.is_empty() => {
                let id = self.m.blocks[live[n as usize % live.len()]].id;
                match f {
                    Forge::Ptr => BlockId { ptr: id.ptr + 256, ..id },
                    Forge::Size => BlockId { size: id.size + 1, ..id },
                    Forge::Stream => BlockId { alloc_stream: StreamId(u32::MAX - 5), ..id },
                    Forge::Device => BlockId { device: id.device + 3, ..id },
                }
            }
            HRef::Newest if !live.is_empty() => self.m.blocks[live[live.len() - 1]].id,
            HRef::Live(n) | HRef::Any(n) | HRef::Forged(n, _) | HRef::Never(n) => never(n),
            HRef::Newest => never(0),
        }
    }

    fn size_of(&self, c: SizeClass) -> u64 {
        let limit = self.opts.budget_bytes;
        // Pending bytes move when a reap finds a free complete, which is a
        // matter of timing. Only a budget makes "what is left" depend on
        // them; without one the size must not, or the number of device
        // calls a workload makes would vary from run to run (the fault
        // sweep counts them exactly on stacks without a budget). All in
        // device bytes; with the cache on, "exactly what is left" is the
        // largest size class that fits.
        let m = &self.m;
        let outstanding =
            if self.kind.has_budget() { m.live_bytes + m.cached_bytes() + m.pending_bytes } else { m.live_bytes };
        let left = limit.saturating_sub(outstanding);
        let exact = if self.kind.caches() { class_floor(left) } else { left };
        match c {
            SizeClass::Zero => 0,
            SizeClass::Tiny(n) => 1 + n as u64 % 64,
            SizeClass::Small(n) => 65 + n as u64 % 4032,
            SizeClass::Medium(n) => 4097 + n as u64 % 12288,
            SizeClass::ExactFit => exact,
            SizeClass::OverByOne => exact + 1,
            SizeClass::OverLimit => {
                if self.kind.has_budget() {
                    limit + 1
                } else {
                    self.opts.capacity_bytes + 1
                }
            }
            SizeClass::Absurd(true) => u64::MAX,
            SizeClass::Absurd(false) => 1 << 63,
        }
    }

    fn stats(&self) -> Result<Stats, String> {
        self.st.rt.stats().map_err(|e| fail!("stats failed: {e}"))
    }

    /// A fault surfaced by `r`, if any: accepted once, at a site of the
    /// armed kind, with that kind's message; anything else is an error.
    fn take_fault<T>(&mut self, r: &ResourceResult<T>, site: Site, op: &str) -> Result<bool, String> {
        let Err(ResourceError::Driver(msg)) = r else { return Ok(false) };
        ensure!(msg.contains("injected fault"), "driver error that is not an injected fault: {msg}");
        let Some(kind) = self.fault else {
            return Err(fail!("injected fault surfaced with no fault armed: {msg}"));
        };
        ensure!(self.fired.is_none(), "a second injected fault surfaced ({msg}); first was {:?}", self.fired);
        ensure!(fault_matches(kind, site, msg), "injected fault {msg:?} surfaced at a {site:?} site, armed {kind:?}");
        self.fired = Some(Fired { step: self.step_no, op: op.to_string(), message: msg.clone() });
        self.tally.add("injected fault surfaced");
        Ok(true)
    }

    /// Stats, budget and device usage agree with the model.
    pub fn check_state(&self) -> Result<(), String> {
        let m = &self.m;
        let s = self.stats()?;
        let cached = m.cached_bytes();
        ensure_eq!(s.live_bytes, m.live_bytes, "live (device) bytes");
        ensure_eq!(s.live_blocks, m.live_blocks, "live blocks");
        ensure_eq!(s.pending_bytes, m.pending_bytes, "pending bytes");
        ensure_eq!(s.pending_blocks, m.pending_blocks, "pending blocks");
        ensure_eq!((s.cached_bytes, s.cached_blocks), (cached, m.cache.len() as u64), "cached bytes and blocks");
        ensure_eq!((s.cache_hits, s.cache_misses), (m.cache_hits, m.cache_misses), "cache hits and misses");
        if !self.kind.caches() {
            ensure_eq!((cached, m.cache_hits, m.cache_misses), (0, 0, 0), "no cache");
        }
        ensure_eq!(s.outstanding_bytes, m.live_bytes + cached + m.pending_bytes, "outstanding = live + cached + pending");
        ensure_eq!(s.peak_outstanding_bytes, m.peak, "peak outstanding");
        ensure_eq!(s.allocations, m.allocations, "allocations");
        ensure_eq!(s.deallocations, m.deallocations, "deallocations");
        ensure_eq!(s.failed_allocations, m.failed_allocations, "failed allocations");
        if !self.kind.is_async() {
            ensure_eq!(s.pending_bytes, 0, "Direct never has pending bytes");
        }
        // The budget invariant, after every operation.
        match (self.limit(), self.st.rt.budget()) {
            (Some(limit), Some(b)) => {
                let reserved = b.reserved();
                ensure_eq!(reserved, s.outstanding_bytes, "budget reserved == outstanding");
                ensure_eq!(reserved, self.st.rt.usage().outstanding_bytes(), "budget reserved == inner outstanding");
                ensure!(reserved <= limit, "reserved {reserved} > limit {limit}");
                ensure_eq!(s.budget_limit, limit, "budget limit");
                ensure_eq!(s.budget_remaining, limit - reserved, "budget remaining");
            }
            (None, None) => {
                ensure_eq!((s.budget_limit, s.budget_remaining), (0, u64::MAX), "no budget");
            }
            _ => return Err(fail!("budget layer presence disagrees with the stack kind")),
        }
        // The device holds every live and cached block; blocks given to the
        // driver only until their stream's worker runs the free. (Sim only:
        // the CUDA pool keeps freed memory.)
        if let Some(sim) = self.st.rt.sim() {
            ensure_eq!(s.reserved_bytes, s.outstanding_bytes, "sim: reserved bytes are the held bytes");
            let in_use = sim.bytes_in_use();
            let lower = m.live_bytes + cached;
            ensure!(
                in_use >= lower && in_use <= lower + m.maybe_in_heap,
                "sim bytes in use {in_use} outside [{lower}, {}]",
                lower + m.maybe_in_heap
            );
        }
        let u = self.st.rt.stream_usage();
        ensure_eq!(
            (u.capacity, u.in_use, u.created),
            (self.opts.pool_capacity, m.pooled_in_use, m.created_streams),
            "stream pool usage"
        );
        Ok(())
    }

    /// Pending bytes observed to have dropped by a reap the harness did not
    /// call directly (budget pressure): within what was pending.
    fn reconcile_pending(&mut self, s: &Stats) -> Result<(), String> {
        ensure!(
            s.pending_bytes <= self.m.pending_bytes && s.pending_blocks <= self.m.pending_blocks,
            "pending grew on its own: {} B / {} blocks, model {} B / {} blocks",
            s.pending_bytes,
            s.pending_blocks,
            self.m.pending_bytes,
            self.m.pending_blocks
        );
        ensure_eq!(s.pending_bytes == 0, s.pending_blocks == 0, "pending bytes and blocks are zero together");
        if s.pending_bytes < self.m.pending_bytes {
            self.tally.add("pending retired by a reap");
        }
        self.m.pending_bytes = s.pending_bytes;
        self.m.pending_blocks = s.pending_blocks;
        if s.pending_bytes == 0 {
            // Every free has run on its stream: a batch retires only after
            // an event recorded behind its frees completed.
            self.m.maybe_in_heap = 0;
        }
        Ok(())
    }

    /// Run one operation on the runtime and the model and compare. Returns
    /// Err with a description on the first disagreement.
    pub fn step(&mut self, op: &Op) -> Result<(), String> {
        self.step_no += 1;
        let before_usage = self.st.rt.usage();
        let before_pool = self.st.rt.stream_usage();
        let mut note = String::new();
        let r = self.run_op(op, &mut note);
        self.trace.push(format!("#{} {op:?} -> {note}", self.step_no));
        r.map_err(|e| fail!("step #{} {op:?}: {e}\nlast steps:\n{}", self.step_no, self.trace_tail()))?;
        let unaccounted = self.recorder.take();
        ensure!(
            unaccounted.is_empty(),
            "step #{} {op:?}: frees to the driver the model did not expect: {unaccounted:?}\nlast steps:\n{}",
            self.step_no,
            self.trace_tail()
        );
        // Event and wait counters only move on success paths.
        if note.starts_with("err") {
            let after = self.st.rt.usage();
            let allow_events = note.contains("[events]");
            if !allow_events {
                ensure_eq!(after.events_recorded, before_usage.events_recorded, "step #{} {op:?}: a refused call recorded events", self.step_no);
            }
            if !note.contains("[waits]") {
                ensure_eq!(after.cross_stream_waits, before_usage.cross_stream_waits, "step #{} {op:?}: a refused call queued waits", self.step_no);
            }
            if !note.contains("[pending]") {
                ensure_eq!(usage_sans_events(&after), usage_sans_events(&before_usage), "step #{} {op:?}: a refused call changed usage", self.step_no);
            }
            ensure_eq!(self.st.rt.stream_usage(), before_pool, "step #{} {op:?}: a refused call changed the stream pool", self.step_no);
        }
        self.check_state()
            .map_err(|e| fail!("after step #{} {op:?}: {e}\nlast steps:\n{}", self.step_no, self.trace_tail()))
    }

    fn run_op(&mut self, op: &Op, note: &mut String) -> Result<(), String> {
        match op {
            Op::Alloc(c, s) => self.op_alloc(*c, *s, note),
            Op::Free(h) => self.op_free(*h, note),
            Op::Validate(h) => self.op_validate(*h, note),
            Op::Prepare(h, s, a) => self.op_single(true, *h, *s, *a, note),
            Op::Finish(h, s, a) => self.op_single(false, *h, *s, *a, note),
            Op::PrepareAll(s, u) => self.op_all(true, true, *s, u, note).map(|_| ()),
            Op::FinishAll(s, u) => self.op_all(false, true, *s, u, note).map(|_| ()),
            Op::Launch(s, u, v) => self.op_launch(*s, u, *v, note),
            Op::Reap => self.op_reap(note),
            Op::Drain => self.op_drain(note),
            Op::Trim(n) => self.op_trim(*n, note),
            Op::Acquire => self.op_acquire(note),
            Op::Release(s) => self.op_release(*s, note),
            Op::Host(s) => self.op_host(*s, note),
            Op::Sync(s) => self.op_sync(*s, note),
            Op::Hold(s) => {
                let stream = self.stream_of(*s);
                if !self.m.stream_live(stream) {
                    *note = "err unknown stream".into();
                    return check_err(&self.st.rt.enqueue_host(stream, Box::new(|| {})), &Exp::UnknownStream(stream));
                }
                self.gates.push(gate(&self.st.rt, stream));
                *note = format!("ok holding {stream}");
                Ok(())
            }
            Op::Unhold => {
                for mut g in self.gates.drain(..) {
                    g.open();
                }
                *note = "ok".into();
                Ok(())
            }
        }
    }

    /// Account for every block the pool gave back to the driver during the
    /// last call (recorded by the device): each must be a block the model
    /// has cached, freed on its own stream; it moves to pending.
    fn apply_releases(&mut self) -> Result<Vec<CEntry>, String> {
        let mut out = Vec::new();
        for (ptr, raw) in self.recorder.take() {
            ensure!(self.kind.caches(), "a free to the driver ({ptr:#x}) outside a deallocate, with no cache");
            let Some(i) = self.m.cache.iter().position(|e| e.ptr == ptr) else {
                return Err(fail!("the pool gave {ptr:#x} back to the driver, but the model has no such cached block"));
            };
            let e = self.m.cache.swap_remove(i);
            ensure_eq!(e.raw, raw, "a cached block goes back to the driver on the stream it was freed on");
            self.m.pending_bytes += e.class;
            self.m.pending_blocks += 1;
            self.m.maybe_in_heap += e.class;
            out.push(e);
        }
        self.tally.add_n("cached block released to the driver", out.len() as u64);
        Ok(out)
    }

    /// A cache hit for `size` bytes on `stream` (device stream `raw`)
    /// handed out `b`: check it against the hand-out rule and the model's
    /// cache as it was before the call, and take the block out.
    ///
    /// The rule (DESIGN.md "Stream-ordered caching"): a fitting block of
    /// the stream's own cache first (no event, no wait); else one of
    /// another stream's cache, with one event recorded on that stream and
    /// one wait queued. Fitting: class at least the request's and at most
    /// 9/8 of it; the smallest fitting class of the cache it comes from;
    /// within a class the most recently cached.
    fn check_hand_out(
        &mut self,
        b: &xlog_cuda::DeviceBlock,
        size: u64,
        stream: StreamId,
        raw: u64,
        before: &Usage,
    ) -> Result<(), String> {
        let c = cache_class(size).ok_or("a hit for a size without a class")?;
        let Some(pos) = self.m.cache.iter().position(|e| e.ptr == b.id.ptr) else {
            return Err(fail!("cache hit for {size} B at {:#x}, which the model does not have cached", b.id.ptr));
        };
        let e = self.m.cache[pos].clone();
        ensure_eq!(b.held, e.class, "a hit holds its cached block's class");
        ensure!(e.class >= c && e.class <= max_fit(c), "cached class {} does not fit a request of class {c}", e.class);
        let fits = |x: &&CEntry| x.class >= c && x.class <= max_fit(c);
        let home = stream.0 % POOL_SHARDS;
        let own: Vec<&CEntry> = self.m.cache.iter().filter(fits).filter(|x| x.raw == raw).collect();
        if own.iter().any(|x| x.shard == home) {
            ensure_eq!(
                e.raw,
                raw,
                "the stream's own cache has a fitting block ({:?}), yet one of stream {}'s was handed out",
                own,
                e.raw
            );
        } else if !own.is_empty() && e.raw != raw {
            // Known deviation (reported): a pooled stream released and
            // acquired again gets a new id but keeps its device stream;
            // blocks it cached under the old id sit in the old id's shard,
            // which the pool searches only after the new id's shard (and
            // lower shards), so another stream's block may be handed out
            // first, with a needless event and wait. Correct, not optimal.
            self.tally.add("own cached block passed over (re-acquired stream)");
        } else {
            ensure_eq!(e.raw == raw, !own.is_empty(), "own-stream entry iff the stream has fitting ones");
        }
        // The cache it came from: its stream's blocks in its shard.
        let from: Vec<&CEntry> =
            self.m.cache.iter().filter(fits).filter(|x| x.raw == e.raw && x.shard == e.shard).collect();
        // (A fault may have put a block back into another shard, with a new
        // place in the order: then only membership and fit are checked.)
        if self.order_exact {
            let smallest = from.iter().map(|x| x.class).min().unwrap_or(0);
            ensure_eq!(e.class, smallest, "the smallest fitting class of the cache it comes from");
            let warmest =
                from.iter().filter(|x| x.class == e.class && x.shard == e.shard).map(|x| x.seq).max().unwrap_or(0);
            ensure_eq!(e.seq, warmest, "the most recently cached block of its class");
        }
        let after = self.st.rt.usage();
        let fence = (after.events_recorded - before.events_recorded, after.cross_stream_waits - before.cross_stream_waits);
        if e.raw == raw {
            ensure_eq!(fence, (0, 0), "an own-stream hit records no event and queues no wait");
            self.tally.add("cache hit (own stream)");
        } else {
            ensure_eq!(fence, (1, 1), "a cross-stream hit: one event on the owner, one wait on the new stream");
            self.tally.add("cache hit (another stream)");
        }
        self.m.cache.swap_remove(pos);
        Ok(())
    }

    fn op_alloc(&mut self, c: SizeClass, sr: SRef, note: &mut String) -> Result<(), String> {
        let stream = self.stream_of(sr);
        let size = self.size_of(c);
        let tag = TAGS[(self.m.allocations + self.m.failed_allocations) as usize % TAGS.len()];
        let before = self.st.rt.usage();
        let r = self.st.rt.allocate(size, stream, tag);
        if !self.m.stream_live(stream) {
            *note = format!("err unknown stream {stream}");
            self.tally.add("unknown stream");
            return check_err(&r, &Exp::UnknownStream(stream));
        }
        let s = self.stats()?;
        let caches = self.kind.caches();
        let raw = self.m.raw_of(stream);
        // Device bytes of a block fresh from the driver (None: too big to
        // have any).
        let fresh: Option<u64> = if size == 0 {
            Some(0)
        } else if caches {
            cache_class(size)
        } else {
            heap_bytes_checked(size)
        };
        // Cached blocks that fit the request, before the call.
        let fitting: Vec<CEntry> = match fresh {
            Some(f) if f > 0 && caches => {
                self.m.cache.iter().filter(|e| e.class >= f && e.class <= max_fit(f)).cloned().collect()
            }
            _ => Vec::new(),
        };
        let hits = s.cache_hits - self.m.cache_hits;
        let misses = s.cache_misses - self.m.cache_misses;
        ensure!(hits + misses <= 1, "one allocation counted {hits} hits and {misses} misses");
        if hits == 1 {
            let b = r.as_ref().map_err(|e| fail!("a cache hit, yet the allocation failed: {e:?}"))?;
            self.check_hand_out(b, size, stream, raw, &before)?;
        }
        self.m.cache_hits = s.cache_hits;
        self.m.cache_misses = s.cache_misses;
        let released = self.apply_releases()?;
        let released_bytes: u64 = released.iter().map(|e| e.class).sum();
        if hits == 1 || size == 0 {
            ensure!(released.is_empty(), "a cache hit or a zero-byte allocation gave memory back");
            ensure_eq!(s.pending_bytes, self.m.pending_bytes, "a cache hit or a zero-byte allocation must not reap");
        } else {
            // A miss reaps when pending frees pile up, and pressure reaps.
            self.reconcile_pending(&s)?;
        }
        // What a refused allocation may still have done: reap (events,
        // pending), and with the cache give blocks back to the driver and
        // (a failed cross-stream hand-out) queue a wait.
        let tags = if caches {
            " [events][pending][waits]"
        } else if self.kind.is_async() {
            " [events][pending]"
        } else {
            ""
        };
        let live = self.m.live_bytes;
        if let Some(limit) = self.limit() {
            if let Err(ResourceError::OutOfBudget { requested, live: l, cached, pending, limit: lim, remaining }) = &r {
                // Consistent with the state right after the refusal, and
                // the request's device bytes really did not fit.
                ensure_eq!((*requested, *lim), (size, limit), "refusal names the request and the limit");
                ensure_eq!(
                    (*l, *cached, *pending),
                    (s.live_bytes, s.cached_bytes, s.pending_bytes),
                    "refusal's live / cached / pending are the state after it"
                );
                ensure_eq!(*remaining, limit - s.outstanding_bytes, "refusal's remaining");
                ensure!(
                    fresh.map_or(true, |h| s.outstanding_bytes.checked_add(h).map_or(true, |t| t > limit)),
                    "refused {size} B ({fresh:?} device bytes) with {remaining} remaining"
                );
                ensure!(fitting.is_empty(), "refused {size} B although cached blocks fit: {fitting:?}");
                // The cache goes back to the driver before any refusal.
                ensure!(
                    s.cached_bytes == 0 || released_bytes >= size.min(self.m.cached_bytes() + released_bytes),
                    "refused {size} B with {} B still cached, after releasing only {released_bytes} B",
                    s.cached_bytes
                );
                let could_fit = fresh.is_some_and(|h| live.checked_add(h).is_some_and(|t| t <= limit));
                ensure!(
                    !(self.opts.wait_on_pressure && could_fit),
                    "needless refusal: wait_on_pressure, and live {live} + {fresh:?} fits the limit {limit}, \
                     yet {size} B was refused (cached {cached}, pending {pending})"
                );
                if *pending > 0 && could_fit {
                    self.tally.add("refused while freed bytes were still pending");
                }
                self.m.failed_allocations += 1;
                self.tally.add("out of budget");
                *note = format!("err out of budget {size}{tags}");
                return Ok(());
            }
            let fits = fresh.is_some_and(|h| {
                live.checked_add(self.m.pending_bytes + self.m.cached_bytes())
                    .and_then(|t| t.checked_add(h))
                    .is_some_and(|t| t <= limit)
            });
            if !caches && !fits {
                // Cache off: the outcome is predicted exactly (the state
                // after the call is the state of the final refusal).
                let pending = self.m.pending_bytes;
                let could_fit = fresh.is_some_and(|h| live.checked_add(h).is_some_and(|t| t <= limit));
                if self.opts.wait_on_pressure && could_fit && self.take_fault(&r, Site::Event, "allocate (waiting)")? {
                    self.m.failed_allocations += 1;
                    *note = format!("err injected event fault while waiting{tags}");
                    return Ok(());
                }
                ensure!(
                    !(self.opts.wait_on_pressure && could_fit),
                    "wait_on_pressure: live {live} + {fresh:?} fits the limit {limit} once pending frees finish, \
                     yet {pending} bytes are still pending after the call"
                );
                self.m.failed_allocations += 1;
                self.tally.add("out of budget");
                *note = format!("err out of budget {size}{tags}");
                return check_err(
                    &r,
                    &Exp::OutOfBudget { requested: size, live, cached: 0, pending, limit, remaining: limit - live - pending },
                );
            }
        }
        let device_refuses = size > 0 && fresh.map_or(true, |b| b > self.opts.capacity_bytes);
        if device_refuses && self.st.rt.sim().is_none() {
            // The CUDA driver may refuse a size beyond the device as an
            // invalid value instead of out of memory; either is a refusal
            // that must change nothing (checked after the step).
            if let Err(ResourceError::Driver(msg)) = &r {
                if !msg.contains("injected fault") {
                    ensure!(msg.contains("cuMemAlloc"), "allocate {size}: unexpected driver error {msg}");
                    self.m.failed_allocations += 1;
                    self.tally.add("out of memory");
                    *note = format!("err driver refused {size}: {msg}{tags}");
                    return Ok(());
                }
            }
        }
        let site = match self.fault {
            Some(FaultKind::EventRecord) => Site::Event,
            Some(FaultKind::Free) => Site::Free,
            _ => Site::Alloc,
        };
        if self.take_fault(&r, site, "allocate")? {
            ensure!(size > 0, "a zero-byte allocation reached the device");
            match site {
                // Only the cache gives memory back inside an allocation.
                Site::Free => ensure!(caches, "a free fault surfaced from an allocation without a cache"),
                // A cross-stream hand-out's event, or a reap under pressure.
                Site::Event => ensure!(self.kind.is_async(), "an event fault from Direct"),
                _ => {}
            }
            self.m.failed_allocations += 1;
            *note = format!("err injected {site:?} fault {size}{tags}");
            return Ok(());
        }
        if device_refuses {
            self.m.failed_allocations += 1;
            self.tally.add("out of memory");
            if caches && fresh.is_some() && self.fault != Some(FaultKind::Free) {
                // The driver's refusal first gives the whole cache back
                // (best effort: a failed free leaves the rest cached).
                ensure_eq!(s.cached_bytes, 0, "the cache is given back before an out-of-memory refusal");
            }
            *note = format!("err out of memory {size}{tags}");
            return check_err(&r, &Exp::OutOfMemory(size));
        }
        let b = r.map_err(|e| fail!("allocate {size} on {stream}: expected Ok, got {e:?}"))?;
        ensure_eq!(b.id.size, size, "block size");
        ensure_eq!(b.id.alloc_stream, stream, "allocation stream");
        ensure_eq!(b.id.device, 0, "device");
        ensure_eq!(b.state, BlockState::Live, "state");
        ensure_eq!(&*b.tag.name(), tag, "tag");
        ensure!(b.id.ptr % 256 == 0, "pointer {:#x} not 256-aligned", b.id.ptr);
        ensure_eq!(b.id.ptr == 0, size == 0, "null pointer exactly for zero bytes ({:#x})", b.id.ptr);
        ensure!(
            b.id.generation.0 > self.m.max_generation,
            "generation {} not fresh (max so far {})",
            b.id.generation,
            self.m.max_generation
        );
        if hits == 0 {
            // From the driver: its class (cache on) or its size rounded to
            // the device's granularity.
            ensure_eq!(Some(b.held), fresh, "device bytes of a block fresh from the driver");
            if caches && size > 0 {
                ensure_eq!(misses, 1, "an allocation from the driver counts a miss");
                ensure!(fitting.is_empty(), "the driver was asked although cached blocks fit: {fitting:?}");
                self.tally.add("cache miss");
            }
            for e in &self.m.cache {
                let overlap = b.id.ptr < e.ptr + e.class && e.ptr < b.id.ptr + b.held;
                ensure!(!overlap, "new block {:?} overlaps cached block {e:?}", b.id);
            }
        }
        if size > 0 {
            for o in self.m.blocks.iter().filter(|o| o.live && o.id.size > 0) {
                let overlap = b.id.ptr < o.id.ptr + o.held && o.id.ptr < b.id.ptr + b.held;
                ensure!(!overlap, "new block {:?} overlaps live block {:?}", b.id, o.id);
            }
        }
        self.m.max_generation = b.id.generation.0;
        self.m.by_gen.insert(b.id.generation, self.m.blocks.len());
        self.m.blocks.push(MBlock { id: b.id, held: b.held, tag, live: true, content: None });
        self.m.live_bytes += b.held;
        self.m.live_blocks += 1;
        self.m.allocations += 1;
        let outstanding = self.m.live_bytes + self.m.cached_bytes() + self.m.pending_bytes;
        self.m.peak = self.m.peak.max(outstanding);
        self.tally.add(if size == 0 { "allocate zero" } else { "allocate" });
        *note = format!("ok {size} B ({} held) gen {} at {:#x} {note}", b.held, b.id.generation, b.id.ptr);
        Ok(())
    }

    fn op_free(&mut self, hr: HRef, note: &mut String) -> Result<(), String> {
        let id = self.handle_of(hr);
        let r = self.st.rt.deallocate(&id);
        match self.m.classify(&id) {
            Class::Stale => {
                *note = "err stale".into();
                self.tally.add("stale or double free");
                check_err(&r, &Exp::Stale(id))
            }
            Class::Mismatch => {
                *note = "err forged".into();
                self.tally.add("forged handle");
                check_err(&r, &Exp::Mismatch(id.generation))
            }
            Class::Live(i) => {
                if self.take_fault(&r, Site::Free, "deallocate")? {
                    ensure!(id.size > 0, "a zero-byte free reached the device");
                    ensure!(!self.kind.caches(), "a free into the cache called the driver");
                    // The waits for other streams' uses were queued before
                    // the free itself failed; they only delay the stream.
                    *note = "err injected free fault [waits]".into();
                    return Ok(());
                }
                let b = r.map_err(|e| fail!("free of live {id:?}: {e:?}"))?;
                let held = self.m.blocks[i].held;
                let raw = self.m.raw_of(id.alloc_stream);
                ensure_eq!(b.id, id, "freed block id");
                ensure_eq!(b.held, held, "freed block's device bytes");
                ensure_eq!(&*b.tag.name(), self.m.blocks[i].tag, "freed block tag");
                let state = self.kind.freed_state(id.size);
                ensure_eq!(b.state, state, "freed block state");
                let to_driver = self.recorder.take();
                if state == BlockState::Pending {
                    ensure_eq!(to_driver, vec![(id.ptr, raw)], "a free with the cache off goes to the driver on its stream");
                } else {
                    ensure!(to_driver.is_empty(), "a free with state {state:?} called the driver: {to_driver:?}");
                }
                let m = &mut self.m;
                m.blocks[i].live = false;
                m.live_bytes -= held;
                m.live_blocks -= 1;
                m.deallocations += 1;
                match state {
                    BlockState::Pending => {
                        m.pending_bytes += held;
                        m.pending_blocks += 1;
                        m.maybe_in_heap += held;
                    }
                    BlockState::Cached => m.cache_put(id.ptr, held, raw, id.alloc_stream),
                    _ => {}
                }
                self.tally.add("free");
                *note = format!("ok freed gen {} ({state:?})", id.generation);
                Ok(())
            }
        }
    }

    fn op_trim(&mut self, n: u8, note: &mut String) -> Result<(), String> {
        let keep = keep_bytes(n);
        let r = self.st.rt.trim(keep);
        let site = if self.fault == Some(FaultKind::Free) { Site::Free } else { Site::Event };
        if self.take_fault(&r, site, "trim")? {
            ensure!(self.kind.is_async(), "Direct's trim reached the device");
            self.apply_releases()?;
            let s = self.stats()?;
            self.reconcile_pending(&s)?;
            *note = "err injected fault in trim [events][pending][waits]".into();
            return Ok(());
        }
        let t = r.map_err(|e| fail!("trim({keep}): {e:?}"))?;
        let pending_before = self.m.pending_bytes;
        let released = self.apply_releases()?;
        let released_bytes: u64 = released.iter().map(|e| e.class).sum();
        ensure_eq!(t.released, released_bytes, "trim reports exactly the bytes it gave the driver");
        let cached = self.m.cached_bytes();
        ensure!(cached <= keep, "{cached} B still cached after trim({keep})");
        // Largest first: nothing left is larger than what went back.
        if let (Some(min_gone), Some(max_left)) =
            (released.iter().map(|e| e.class).min(), self.m.cache.iter().map(|e| e.class).max())
        {
            ensure!(min_gone >= max_left, "trim gave back a {min_gone} B block and kept a {max_left} B one");
        }
        let s = self.stats()?;
        if released_bytes > 0 {
            ensure_eq!(t.retired, pending_before + released_bytes, "trim waits for its frees and retires all pending");
        }
        ensure!(t.retired <= self.m.pending_bytes, "trim retired {} B, only {} pending", t.retired, self.m.pending_bytes);
        ensure_eq!(s.pending_bytes, self.m.pending_bytes - t.retired, "pending after trim moves by exactly what it retired");
        self.reconcile_pending(&s)?;
        self.tally.add(if released_bytes > 0 { "trim (released)" } else { "trim (nothing)" });
        *note = format!("ok trim({keep}) released {released_bytes} retired {}", t.retired);
        Ok(())
    }

    fn op_validate(&mut self, hr: HRef, note: &mut String) -> Result<(), String> {
        let id = self.handle_of(hr);
        let r = self.st.rt.validate(&id);
        match self.m.classify(&id) {
            Class::Stale => {
                *note = "err stale".into();
                check_err(&r, &Exp::Stale(id))
            }
            Class::Mismatch => {
                *note = "err forged".into();
                check_err(&r, &Exp::Mismatch(id.generation))
            }
            Class::Live(i) => {
                let b = r.map_err(|e| fail!("validate of live {id:?}: {e:?}"))?;
                ensure_eq!((b.id, b.state), (id, BlockState::Live), "validate");
                ensure_eq!(&*b.tag.name(), self.m.blocks[i].tag, "validate tag");
                *note = "ok".into();
                Ok(())
            }
        }
    }

    /// The expected error of a tracking call on `stream` over `ids`, if any,
    /// in the runtime's order: the stream, then the stack, then each handle.
    fn tracking_error(&self, stream: StreamId, ids: &[BlockId]) -> Option<Exp> {
        if !self.m.stream_live(stream) {
            return Some(Exp::UnknownStream(stream));
        }
        if !self.kind.is_async() {
            return Some(Exp::Misuse);
        }
        ids.iter().find_map(|id| match self.m.classify(id) {
            Class::Live(_) => None,
            Class::Mismatch => Some(Exp::Mismatch(id.generation)),
            Class::Stale => Some(Exp::Stale(*id)),
        })
    }

    fn tally_error(&mut self, e: &Exp) {
        self.tally.add(match e {
            Exp::UnknownStream(_) => "unknown stream",
            Exp::Mismatch(_) => "forged handle",
            Exp::Stale(_) => "stale handle",
            Exp::Misuse => "tracking refused (Direct)",
            Exp::PoolExhausted(_) => "pool exhausted",
            Exp::OutOfMemory(_) => "out of memory",
            Exp::OutOfBudget { .. } => "out of budget",
        });
    }

    fn op_single(&mut self, prepare: bool, hr: HRef, sr: SRef, a: Acc, note: &mut String) -> Result<(), String> {
        let (id, stream) = (self.handle_of(hr), self.stream_of(sr));
        if !prepare && a != Acc::R && self.tracking_error(stream, &[id]).is_none() {
            self.quiesce()?;
        }
        let r = if prepare {
            self.st.rt.prepare(&id, stream, a.access())
        } else {
            self.st.rt.finish(&id, stream, a.access())
        };
        if let Some(e) = self.tracking_error(stream, &[id]) {
            *note = format!("err {e:?}");
            self.tally_error(&e);
            return check_err(&r, &e);
        }
        if self.take_fault(&r, Site::Event, if prepare { "prepare" } else { "finish" })? {
            // A prepare may have recorded a first-use fence before failing.
            *note = "err injected event fault [events]".into();
            return Ok(());
        }
        r.map_err(|e| fail!("tracking call on live block: {e:?}"))?;
        self.tally.add(if prepare { "prepare" } else { "finish" });
        *note = "ok".into();
        Ok(())
    }

    /// prepare_all or finish_all; Ok(true) when the call succeeded.
    fn op_all(
        &mut self,
        prepare: bool,
        standalone: bool,
        sr: SRef,
        u: &[(HRef, Acc)],
        note: &mut String,
    ) -> Result<bool, String> {
        let stream = self.stream_of(sr);
        let ids: Vec<BlockId> = u.iter().map(|(h, _)| self.handle_of(*h)).collect();
        let writes = u.iter().any(|(_, a)| *a != Acc::R);
        if standalone && !prepare && writes && self.tracking_error(stream, &ids).is_none() {
            self.quiesce()?;
        }
        let uses: Vec<BlockUse> =
            ids.iter().zip(u).map(|(id, (_, a))| BlockUse { block: *id, access: a.access() }).collect();
        let r = if prepare { self.st.rt.prepare_all(stream, &uses) } else { self.st.rt.finish_all(stream, &uses) };
        if let Some(e) = self.tracking_error(stream, &ids) {
            *note = format!("err {e:?}");
            self.tally_error(&e);
            check_err(&r, &e)?;
            return Ok(false);
        }
        if self.take_fault(&r, Site::Event, if prepare { "prepare_all" } else { "finish_all" })? {
            // prepare_all records every first-use fence before touching a
            // block; those recorded before the failing one count as events.
            *note = "err injected event fault [events]".into();
            return Ok(false);
        }
        r.map_err(|e| fail!("{} over live blocks: {e:?}", if prepare { "prepare_all" } else { "finish_all" }))?;
        self.tally.add(if prepare { "prepare_all" } else { "finish_all" });
        *note = "ok".into();
        Ok(true)
    }

    fn op_launch(&mut self, sr: SRef, u: &[(HRef, Acc)], value: u8, note: &mut String) -> Result<(), String> {
        if !self.op_all(true, false, sr, u, note)? {
            return Ok(());
        }
        let stream = self.stream_of(sr);
        // What the kernel must see and do, from the model, in program order.
        let mut reads = Vec::new();
        let mut writes = Vec::new();
        for (h, a) in u {
            let id = self.handle_of(*h);
            let Class::Live(i) = self.m.classify(&id) else {
                return Err(fail!("prepare_all accepted a handle the model says is not live: {id:?}"));
            };
            if id.size == 0 {
                continue;
            }
            let len = id.size.min(DATA_BYTES);
            if *a != Acc::W {
                if let Some(expected) = self.m.blocks[i].content {
                    reads.push((id, len, expected));
                }
            }
            if *a != Acc::R {
                writes.push((i, id.ptr, len));
            }
        }
        let data = self.data.clone();
        let errors = self.data_errors.clone();
        let verified = self.reads_verified.clone();
        let step = self.step_no;
        let write_ranges: Vec<(u64, u64)> = writes.iter().map(|&(_, p, l)| (p, l)).collect();
        let kernel = Box::new(move || {
            for (id, len, expected) in &reads {
                match data.read(id.ptr, *len) {
                    Ok(bytes) if bytes.iter().all(|b| b == expected) => {
                        verified.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(bytes) => lock(&errors).push(format!(
                        "launch at step #{step} read generation {} at {:#x}: expected all {expected:#04x}, found {:?}",
                        id.generation,
                        id.ptr,
                        &bytes[..bytes.len().min(8)]
                    )),
                    Err(e) => lock(&errors).push(format!("launch at step #{step}: read failed: {e}")),
                }
            }
            for (ptr, len) in &write_ranges {
                if let Err(e) = data.fill(*ptr, *len, value) {
                    lock(&errors).push(format!("launch at step #{step}: write failed: {e}"));
                }
            }
        });
        self.st.rt.enqueue_host(stream, kernel).map_err(|e| fail!("enqueue_host after prepare_all: {e:?}"))?;
        let mut finish_note = String::new();
        let finished = self.op_all(false, false, sr, u, &mut finish_note)?;
        if !finished {
            // finish_all fails only with an injected fault; the kernel is
            // queued but not recorded, so do what a careful caller does:
            // wait for it before anything else touches its blocks.
            ensure!(self.fired.is_some(), "finish_all failed after prepare_all succeeded: {finish_note}");
            self.st.rt.synchronize(stream).map_err(|e| fail!("synchronize after failed finish_all: {e:?}"))?;
            *note = format!("ok launched, finish_all: {finish_note} (stream synchronized)");
        } else {
            *note = "ok launched".into();
        }
        for (i, _, _) in writes {
            self.m.blocks[i].content = Some(value);
        }
        self.tally.add("launch");
        Ok(())
    }

    fn op_reap(&mut self, note: &mut String) -> Result<(), String> {
        let r = self.st.rt.reap();
        if self.take_fault(&r, Site::Event, "reap")? {
            *note = "err injected event fault [events]".into();
            return Ok(());
        }
        let bytes = r.map_err(|e| fail!("reap: {e:?}"))?;
        ensure!(bytes <= self.m.pending_bytes, "reap retired {bytes} bytes, only {} pending", self.m.pending_bytes);
        if !self.kind.is_async() {
            ensure_eq!(bytes, 0, "Direct has nothing to reap");
        }
        let s = self.stats()?;
        ensure_eq!(s.pending_bytes, self.m.pending_bytes - bytes, "pending after reap moves by exactly the bytes reaped");
        self.reconcile_pending(&s)?;
        self.tally.add(if bytes > 0 { "reap (bytes)" } else { "reap (nothing)" });
        *note = format!("ok reaped {bytes}");
        Ok(())
    }

    fn op_drain(&mut self, note: &mut String) -> Result<(), String> {
        let r = self.st.rt.drain();
        if self.take_fault(&r, Site::Event, "drain")? {
            *note = "err injected event fault [events]".into();
            return Ok(());
        }
        let bytes = r.map_err(|e| fail!("drain: {e:?}"))?;
        ensure_eq!(bytes, self.m.pending_bytes, "drain retires everything pending");
        self.m.pending_bytes = 0;
        self.m.pending_blocks = 0;
        self.m.maybe_in_heap = 0;
        self.tally.add("drain");
        *note = format!("ok drained {bytes}");
        Ok(())
    }

    fn op_acquire(&mut self, note: &mut String) -> Result<(), String> {
        let r = self.st.rt.acquire_stream();
        let cap = self.opts.pool_capacity;
        if self.m.pooled_in_use == cap {
            *note = "err pool exhausted".into();
            self.tally.add("pool exhausted");
            return check_err(&r, &Exp::PoolExhausted(cap));
        }
        let creates = self.m.created_streams == self.m.pooled_in_use;
        if creates && self.take_fault(&r, Site::Acquire, "acquire")? {
            *note = "err injected stream fault".into();
            return Ok(());
        }
        let id = r.map_err(|e| fail!("acquire with {} of {cap} in use: {e:?}", self.m.pooled_in_use))?;
        ensure!(id.0 > self.m.max_stream_id, "stream id {id} not fresh (max so far {})", self.m.max_stream_id);
        self.m.max_stream_id = id.0;
        let native = self.st.rt.native_stream(id).map_err(|e| fail!("native of stream {id}: {e:?}"))?;
        // A sim-tagged native handle maps back to its stream without creating
        // one; on CUDA the native handle is the raw one.
        let raw = self.dev.import_stream(native).map_err(|e| fail!("raw of stream {id}: {e}"))?;
        self.m.streams.push(MStream { id, raw, live: true, host_enqueued: 0 });
        self.m.pooled_in_use += 1;
        if creates {
            self.m.created_streams += 1;
        }
        self.tally.add("acquire");
        *note = format!("ok stream {id}");
        Ok(())
    }

    fn op_release(&mut self, sr: SRef, note: &mut String) -> Result<(), String> {
        let stream = self.stream_of(sr);
        let r = self.st.rt.release_stream(stream);
        match self.m.streams.iter_mut().find(|s| s.id == stream && s.live) {
            None => {
                *note = "err unknown stream".into();
                self.tally.add("unknown stream");
                check_err(&r, &Exp::UnknownStream(stream))
            }
            Some(s) => {
                r.map_err(|e| fail!("release of live stream {stream}: {e:?}"))?;
                s.live = false;
                self.m.pooled_in_use -= 1;
                self.tally.add("release");
                *note = format!("ok released {stream}");
                Ok(())
            }
        }
    }

    fn op_host(&mut self, sr: SRef, note: &mut String) -> Result<(), String> {
        let stream = self.stream_of(sr);
        let seq = self.m.streams.iter().find(|s| s.id == stream).map_or(0, |s| s.host_enqueued);
        let host = self.host.clone();
        let r = self.st.rt.enqueue_host(
            stream,
            Box::new(move || {
                let mut log = lock(&host);
                let ran = log.ran.entry(stream.0).or_default();
                if *ran != seq {
                    let msg = format!("host callback #{seq} on stream {stream} ran after {ran} others");
                    log.errors.push(msg);
                } else {
                    *ran += 1;
                }
            }),
        );
        if !self.m.stream_live(stream) {
            *note = "err unknown stream".into();
            self.tally.add("unknown stream");
            return check_err(&r, &Exp::UnknownStream(stream));
        }
        r.map_err(|e| fail!("enqueue_host on live stream {stream}: {e:?}"))?;
        if let Some(s) = self.m.streams.iter_mut().find(|s| s.id == stream) {
            s.host_enqueued += 1;
        }
        self.tally.add("host callback");
        *note = "ok".into();
        Ok(())
    }

    fn op_sync(&mut self, sr: SRef, note: &mut String) -> Result<(), String> {
        let stream = self.stream_of(sr);
        let r = self.st.rt.synchronize(stream);
        if !self.m.stream_live(stream) {
            *note = "err unknown stream".into();
            self.tally.add("unknown stream");
            return check_err(&r, &Exp::UnknownStream(stream));
        }
        r.map_err(|e| fail!("synchronize live stream {stream}: {e:?}"))?;
        let expected = self.m.streams.iter().find(|s| s.id == stream).map_or(0, |s| s.host_enqueued);
        let ran = lock(&self.host).ran.get(&stream.0).copied().unwrap_or(0);
        ensure_eq!(ran, expected, "host callbacks run on stream {stream} after synchronize");
        self.tally.add("synchronize");
        *note = "ok".into();
        Ok(())
    }

    /// Wait until every stream has run all its queued work.
    ///
    /// A finish with a write access that no prepare preceded breaks the
    /// caller's side of the contract: it replaces the block's last write
    /// and drops its readers, so later users (and the free) stop waiting for
    /// kernels that may still be running. The runtime cannot tell, so the
    /// model cannot predict data after it. Such a call is still made (its
    /// status and bookkeeping are checked), but only once nothing is in
    /// flight, which makes forgetting the old events harmless.
    fn quiesce(&self) -> Result<(), String> {
        // Every stream of this runtime came from its pool, and a pooled
        // stream (released or not) lives until close.
        let mut raws: Vec<u64> = self.m.streams.iter().map(|s| s.raw).collect();
        raws.sort_unstable();
        raws.dedup();
        for raw in raws {
            self.dev.synchronize_stream(raw).map_err(|e| fail!("quiesce: stream {raw}: {e}"))?;
        }
        Ok(())
    }

    /// The device stream behind the first stream the harness acquired.
    pub fn first_raw_stream(&self) -> Option<u64> {
        self.m.streams.first().map(|s| s.raw)
    }

    /// Errors found by kernels and host callbacks so far.
    pub fn async_errors(&self) -> Vec<String> {
        let mut v = lock(&self.data_errors).clone();
        v.extend(lock(&self.host).errors.iter().cloned());
        v
    }

    /// Free everything still live (each must succeed), trim the caches,
    /// then drain: nothing may be left outstanding, charged or held by the
    /// device.
    pub fn free_all_and_drain(&mut self) -> Result<(), String> {
        for _ in 0..self.m.live_indices().len() {
            // Always the first live block: the others move up as it goes.
            self.step(&Op::Free(HRef::Live(0)))?;
        }
        self.step(&Op::Trim(0))?;
        self.step(&Op::Drain)?;
        let s = self.stats()?;
        ensure_eq!(
            (s.live_bytes, s.pending_bytes, s.cached_bytes, s.outstanding_bytes, s.live_blocks, s.pending_blocks),
            (0, 0, 0, 0, 0, 0),
            "after freeing everything, trimming and draining"
        );
        if let Some(sim) = self.st.rt.sim() {
            ensure_eq!(sim.bytes_in_use(), 0, "device bytes in use after drain");
        }
        if let Some(limit) = self.limit() {
            ensure_eq!(s.budget_remaining, limit, "the whole budget is back");
        }
        Ok(())
    }

    /// Close the runtime: the leak report must name exactly the model's
    /// live blocks, every host callback must have run in order, and no
    /// kernel may have seen data other than program order predicts.
    pub fn close(mut self) -> Result<Tally, String> {
        for mut g in self.gates.drain(..) {
            g.open();
        }
        let expected = self.m.live_generations();
        let report = self.st.rt.close().map_err(|e| fail!("close: {e:?}"))?;
        let mut leaked: Vec<(Generation, u64, String)> =
            report.leaked.iter().map(|b| (b.id.generation, b.id.size, b.tag.to_string())).collect();
        leaked.sort();
        let expected: Vec<(Generation, u64, String)> =
            expected.into_iter().map(|(g, s, t)| (g, s, t.to_string())).collect();
        ensure_eq!(leaked, expected, "leak report at close");
        ensure!(!report.still_shared, "the harness is the runtime's only opener (CUDA tests run one at a time)");
        // Close synchronized every stream: all queued host work has run.
        let log = lock(&self.host);
        for s in &self.m.streams {
            let ran = log.ran.get(&s.id.0).copied().unwrap_or(0);
            ensure_eq!(ran, s.host_enqueued, "host callbacks run on stream {} by close", s.id);
        }
        drop(log);
        let errors = self.async_errors();
        ensure!(errors.is_empty(), "{} data / ordering errors, first: {:?}", errors.len(), &errors[..errors.len().min(5)]);
        match self.st.rt.stats() {
            Err(ResourceError::InvalidArgument(m)) if m.contains("closed") => {}
            other => return Err(fail!("stats after close: {other:?}")),
        }
        let mut tally = std::mem::take(&mut self.tally);
        tally.add_n("kernel reads verified", self.reads_verified.load(Ordering::Relaxed));
        Ok(tally)
    }
}

impl Drop for Harness {
    /// Open the gates before the runtime goes: dropping the sim device joins
    /// its stream workers, and a worker held by a gate would never finish.
    fn drop(&mut self) {
        for mut g in self.gates.drain(..) {
            g.open();
        }
    }
}

fn heap_bytes_checked(size: u64) -> Option<u64> {
    size.checked_add(255).map(|s| s / 256 * 256)
}

/// Upper bound for waiting on something a correct runtime finishes quickly.
pub const PATIENCE: Duration = Duration::from_secs(10);
