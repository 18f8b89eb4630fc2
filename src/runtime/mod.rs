//! `Runtime`: one device, its allocator, its stream pool and its stats.
//!
//! On the CUDA backend the runtime of an ordinal is a process-wide singleton:
//! every open of that ordinal shares it (so frameworks and engines share one
//! budget), and it shuts down when the last opener closes. On the sim
//! backend every open makes an independent runtime, so tests run in
//! parallel.


pub mod multi_device;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::call_gate::{CallGate, Pass};

use crate::config::{AllocatorKind, Config};
use crate::device::cuda::CudaDevice;
use crate::device::sim::SimDevice;
use crate::device::{Backend, CaptureMode, Device, HostFn};
use crate::error::DeviceError;
use crate::resource::{
    Access, AllocTag, BlockId, BlockUse, DeviceBlock, Allocator, LeakedBlock,
    ResourceError, ResourceResult, StreamId, StreamRef, Usage,
};
use crate::resource::Trimmed;
use crate::resources::announced_pools::PoolKey;
use crate::resources::async_pool::PoolOptions;
use crate::resources::logging::CsvLog;
use crate::resources::{AsyncPool, Direct, GlobalDeviceBudget};
use crate::stream_pool::{StreamPool, StreamPoolUsage};
use crate::telemetry::{summary, AllocationSite, CallSite, CountSummary, LiveBlock, TagStats, Telemetry};

pub use crate::telemetry::Stats;

/// A pooled stream acquired and never released, found at close.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UnreleasedStream {
    pub id: StreamId,
    /// Its native handle (`cudaStream_t`; an opaque token on sim).
    pub native: u64,
}

/// What `close` found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Blocks still live at close; they were freed for the caller.
    pub leaked: Vec<LeakedBlock>,
    /// Pooled streams acquired and never released, by id; close released
    /// them. Imported streams are not reported: they are the caller's own
    /// native streams (the framework hooks import theirs and never release
    /// them).
    pub unreleased_streams: Vec<UnreleasedStream>,
    /// True when other openers of a shared (CUDA) runtime remain, so this
    /// close only dropped one reference.
    pub still_shared: bool,
}

/// Refusals and failures; successes are counted by the resources, under
/// the locks they take anyway.
#[derive(Default)]
struct Counters {
    failed_allocations: AtomicU64,
}

pub struct Runtime {
    device: Arc<dyn Device>,
    config: Config,
    /// The allocator (it charges the budget and reports to the log itself).
    allocator: Arc<dyn Allocator>,
    /// The allocator's budget and log, kept for the stats and the close
    /// report (both are the allocator's: it charges one and reports to the
    /// other).
    budget: Option<Arc<GlobalDeviceBudget>>,
    log: Option<Arc<CsvLog>>,
    streams: StreamPool,
    counters: Counters,
    /// Every call but the launch calls holds a pass, close closes the gate
    /// and waits for the calls in flight; calls that start after that fail
    /// fast without waiting (see `call_gate.rs`). Launch calls close through
    /// the allocator (`launch_stream`).
    gate: CallGate,
    telemetry: Telemetry,
    openers: AtomicU32,
    /// Peer runtimes and bridges for their streams (`multi_device.rs`).
    peers: multi_device::PeerLinks,
}

fn cuda_registry() -> &'static Mutex<HashMap<i32, Arc<Runtime>>> {
    static REGISTRY: once_cell::sync::Lazy<Mutex<HashMap<i32, Arc<Runtime>>>> =
        once_cell::sync::Lazy::new(|| Mutex::new(HashMap::new()));
    &REGISTRY
}

fn registry_lock() -> std::sync::MutexGuard<'static, HashMap<i32, Arc<Runtime>>> {
    cuda_registry().lock().unwrap_or_else(|p| p.into_inner())
}

impl Runtime {
    /// One more opener of this runtime (each needs its own `close`). Used by
    /// the framework hooks, which hand their runtime out to callers.
    pub fn share(self: &Arc<Self>) -> ResourceResult<Arc<Self>> {
        refuse_in_host_callback()?;
        let _registry = registry_lock();
        if self.gate.is_closed() {
            return Err(closed_error());
        }
        self.openers.fetch_add(1, Ordering::AcqRel);
        Ok(self.clone())
    }

    /// Open the runtime of `ordinal` with `config`.
    pub fn open(ordinal: i32, config: &Config) -> ResourceResult<Arc<Runtime>> {
        refuse_in_host_callback()?;
        config.validate()?;
        check_ordinal(ordinal)?;
        let rt = match config.backend {
            Backend::Sim => Runtime::open_sim(ordinal, config),
            Backend::Cuda => Runtime::open_cuda(ordinal, config),
            Backend::Auto => match Runtime::open_cuda(ordinal, config) {
                Err(ResourceError::NoDevice(_)) => Runtime::open_sim(ordinal, config),
                other => other,
            },
        }?;
        multi_device::register(&rt);
        Ok(rt)
    }

    fn open_sim(ordinal: i32, config: &Config) -> ResourceResult<Arc<Runtime>> {
        // The device's NoDevice carries its message once ("no device: ...").
        crate::device::sim_platform::check_ordinal(ordinal, config.sim_devices).map_err(ResourceError::from)?;
        let device = SimDevice::new(ordinal, config.sim_capacity_bytes)?;
        // Each imported foreign stream is a sim worker thread: bounded by
        // the pool size, as pooled streams are.
        device.set_foreign_stream_limit(config.stream_pool_size);
        Runtime::build(device, config).map(Arc::new)
    }

    fn open_cuda(ordinal: i32, config: &Config) -> ResourceResult<Arc<Runtime>> {
        let mut registry = registry_lock();
        if let Some(rt) = registry.get(&ordinal) {
            rt.check_compatible(config)?;
            rt.openers.fetch_add(1, Ordering::AcqRel);
            return Ok(rt.clone());
        }
        let device: Arc<dyn Device> = CudaDevice::open(ordinal).map_err(|e| match e {
            DeviceError::NoDevice(m) => ResourceError::NoDevice(m),
            other => other.into(),
        })?;
        let rt = Arc::new(Runtime::build(device, config)?);
        registry.insert(ordinal, rt.clone());
        Ok(rt)
    }

    /// A shared runtime has one budget and one allocator; a second opener that
    /// asks for a different one gets an error instead of a silent surprise.
    fn check_compatible(&self, config: &Config) -> ResourceResult<()> {
        let mine = &self.config;
        if mine.allocator != config.allocator
            || mine.budget_bytes != config.budget_bytes
            || mine.log_path != config.log_path
            || mine.cache != config.cache
            || mine.arena != config.arena
        {
            return Err(ResourceError::InvalidArgument(format!(
                "device {} already has an open runtime (allocator {:?}, budget {} bytes, log {:?}, \
                 cache {}); a second open must ask for the same (asked allocator {:?}, budget {} \
                 bytes, log {:?}, cache {})",
                self.device.ordinal(),
                mine.allocator,
                mine.budget_bytes,
                mine.log_path,
                mine.cache as u8,
                config.allocator,
                config.budget_bytes,
                config.log_path,
                config.cache as u8
            )));
        }
        Ok(())
    }

    /// Build the allocator over `device`, charging the budget (if the
    /// config asks for one) where it takes device memory and reporting to
    /// the log (if the config asks for one).
    pub fn build(device: Arc<dyn Device>, config: &Config) -> ResourceResult<Runtime> {
        // The log first: the base resource writes its driver traffic into it.
        let log = match &config.log_path {
            Some(path) => Some(CsvLog::open(path, device.ordinal())?),
            None => None,
        };
        // The budget is the allocator's: charged where device memory is taken.
        let budget = (config.budget_bytes > 0)
            .then(|| Arc::new(GlobalDeviceBudget::new(config.budget_bytes, config.wait_on_pressure)));
        let allocator: Arc<dyn Allocator> = match config.allocator {
            AllocatorKind::Async => {
                // The driver's pool serves the pool memory, and the arena's
                // place where the device has no virtual memory API; with the
                // arena it is not made (its reserved bytes would read 0).
                if !(config.arena && config.cache && device.supports_vm()) {
                    device.use_private_pool(config.pool_release_threshold)?;
                }
                let options =
                    PoolOptions { cache: config.cache, wait_on_pressure: config.wait_on_pressure, arena: config.arena };
                Arc::new(AsyncPool::with_budget(device.clone(), options, budget.clone()).with_log(log.clone()))
            }
            AllocatorKind::Direct => {
                Arc::new(Direct::new(device.clone()).with_budget(budget.clone()).with_log(log.clone()))
            }
        };
        Ok(Runtime {
            streams: StreamPool::new(device.clone(), config.stream_pool_size),
            device,
            config: config.clone(),
            allocator,
            budget,
            log,
            counters: Counters::default(),
            gate: CallGate::default(),
            telemetry: Telemetry::new(config.track_call_sites),
            openers: AtomicU32::new(1),
            peers: Default::default(),
        })
    }

    fn enter(&self) -> ResourceResult<Pass<'_>> {
        refuse_in_host_callback()?;
        // Never blocks: a host callback that calls in while close waits for
        // that callback's stream must fail, not deadlock.
        self.gate.enter().ok_or_else(closed_error)
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub fn backend(&self) -> Backend {
        self.device.backend()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The sim device, when this runtime runs on the sim backend.
    pub fn sim(&self) -> Option<&SimDevice> {
        self.device.as_sim()
    }

    pub fn is_closed(&self) -> bool {
        self.gate.is_closed()
    }

    /// The allocator (for tests of its invariants).
    pub fn resource(&self) -> &Arc<dyn Allocator> {
        &self.allocator
    }

    pub fn budget(&self) -> Option<&Arc<GlobalDeviceBudget>> {
        self.budget.as_ref()
    }

    pub fn supports_tracking(&self) -> bool {
        self.allocator.supports_block_use_tracking()
    }

    // ----- streams -----

    pub fn acquire_stream(&self) -> ResourceResult<StreamId> {
        let _g = self.enter()?;
        self.streams.acquire()
    }

    /// Give stream `id` back. Refused with `StreamMisuse`, changing
    /// nothing, while the stream takes part in a capture: the pool would
    /// hand a capturing stream out again, and the capture could never be
    /// ended through its id.
    pub fn release_stream(&self, id: StreamId) -> ResourceResult<()> {
        let _g = self.enter()?;
        let s = self.streams.resolve(id)?;
        // Before an imported stream is retired: that queues work on it.
        self.streams.refuse_if_capturing(id, s.raw, "releasing it")?;
        if self.streams.is_imported(id) {
            // The owner may destroy an imported stream once we let go of it:
            // nothing of ours may stay queued for it, and no later free may
            // be ordered on it.
            let (blocks, bytes) = self.allocator.live_on_stream(id);
            if blocks > 0 {
                return Err(ResourceError::StreamMisuse(format!(
                    "stream {id} (imported) still has {blocks} live block(s) of {bytes} bytes allocated on it: \
                     their frees are ordered on it, and its owner may destroy it once it is released; free \
                     them first (nothing changed)"
                )));
            }
            self.allocator.retire_stream(s.raw)?;
        }
        self.streams.release(id)
    }

    pub fn import_stream(&self, native: u64) -> ResourceResult<StreamId> {
        let _g = self.enter()?;
        self.streams.import(native)
    }

    pub fn native_stream(&self, id: StreamId) -> ResourceResult<u64> {
        let _g = self.enter()?;
        self.streams.native(id)
    }

    pub fn synchronize(&self, id: StreamId) -> ResourceResult<()> {
        // The wait holds a pass of the call gate, so close (which waits
        // for it) cannot destroy the stream under it; calls that start
        // meanwhile do not wait behind it (see `enter`).
        let _g = self.enter()?;
        let raw = self.streams.resolve(id)?.raw;
        // A host wait on a capturing stream fails and invalidates the
        // capture (CUDA's rule, modelled by the sim): refused first, so the
        // failed call changes nothing.
        self.streams.refuse_if_capturing(id, raw, "synchronizing it")?;
        Ok(self.device.synchronize_stream(raw)?)
    }

    /// Run `f` on the host in stream order (a worker on sim, a host node on
    /// CUDA, where `f` must not call the CUDA API).
    pub fn enqueue_host(&self, id: StreamId, f: HostFn) -> ResourceResult<()> {
        let _g = self.enter()?;
        let s = self.streams.resolve(id)?;
        Ok(self.device.enqueue_host(s.raw, f)?)
    }

    pub fn stream_usage(&self) -> StreamPoolUsage {
        self.streams.usage()
    }

    // ----- blocks -----

    pub fn allocate(&self, bytes: u64, stream: StreamId, tag: &str) -> ResourceResult<DeviceBlock> {
        self.allocate_tagged(bytes, stream, AllocTag::new(tag))
    }

    /// `allocate` with the tag already interned.
    #[inline]
    pub fn allocate_tagged(&self, bytes: u64, stream: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        self.allocate_at(bytes, stream, tag, CallSite::NONE)
    }

    /// `allocate_tagged` recording `site` as the call site when the runtime
    /// tracks call sites (`Config::track_call_sites`; NONE: this thread's
    /// current site, see `CallSite::set_thread_current`).
    #[inline]
    pub fn allocate_at(&self, bytes: u64, stream: StreamId, tag: AllocTag, site: CallSite) -> ResourceResult<DeviceBlock> {
        let _g = self.enter()?;
        self.allocate_entered(bytes, stream, tag, site)
    }

    /// The framework hooks' allocation: adopt the foreign stream `native`
    /// and allocate on it with one pass of the call gate (two calls'
    /// worth of entering otherwise) and one stream lookup (the import
    /// hands back the resolved stream).
    pub fn allocate_on_native(&self, bytes: u64, native: u64, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        let _g = self.enter()?;
        let stream = self.streams.import_resolved(native)?;
        self.allocate_resolved(bytes, stream, tag, CallSite::NONE)
    }

    /// `allocate_at` for a caller holding a pass.
    #[inline]
    fn allocate_entered(&self, bytes: u64, stream: StreamId, tag: AllocTag, site: CallSite) -> ResourceResult<DeviceBlock> {
        let s = self.streams.resolve(stream)?;
        self.allocate_resolved(bytes, s, tag, site)
    }

    /// `allocate_entered` on a stream already resolved.
    #[inline]
    fn allocate_resolved(&self, bytes: u64, s: StreamRef, tag: AllocTag, site: CallSite) -> ResourceResult<DeviceBlock> {
        let tracks = self.telemetry.tracks_call_sites();
        // Tracked: the site (given, or this thread's label) is known to the
        // log while the allocator allocates, for the `allocate` row's
        // Detail.
        let site = if tracks && site.is_none() { CallSite::thread_current() } else { site };
        let result = if tracks {
            let _site = AllocationSite::enter(site);
            self.allocator.allocate(bytes, s, tag)
        } else {
            self.allocator.allocate(bytes, s, tag)
        };
        match &result {
            Ok(b) => {
                if tracks {
                    self.telemetry.allocated(b, site);
                }
                result
            }
            Err(_) => {
                let Err(e) = result else { unreachable!() };
                self.counters.failed_allocations.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    pub fn deallocate(&self, block: &BlockId) -> ResourceResult<DeviceBlock> {
        let _g = self.enter()?;
        let result = self.allocator.deallocate(block);
        match &result {
            Ok(freed) => {
                if self.telemetry.tracks_call_sites() {
                    self.telemetry.freed(freed);
                }
                result
            }
            Err(_) => result.map_err(|e| multi_device::explain_block_error(self, block, e)),
        }
    }

    /// Check that `block` is live here.
    pub fn validate(&self, block: &BlockId) -> ResourceResult<DeviceBlock> {
        let _g = self.enter()?;
        self.allocator.validate(block).map_err(|e| multi_device::explain_block_error(self, block, e))
    }

    // ----- several devices (multi_device.rs) -----

    /// Give this runtime and `peer` (a runtime of another device) access
    /// to each other's memory, and let streams of each use blocks of the
    /// other through `prepare`/`finish`. Idempotent.
    pub fn enable_peer_access(self: &Arc<Self>, peer: &Arc<Runtime>) -> ResourceResult<()> {
        let _g = self.enter()?;
        let _peer_guard = peer.enter()?;
        multi_device::enable_peer_access(self, peer)
    }

    pub(crate) fn peers(&self) -> &multi_device::PeerLinks {
        &self.peers
    }

    /// Streams of peer devices this runtime has made bridges for.
    pub fn peer_bridges(&self) -> usize {
        self.peers.bridge_count()
    }

    /// Whether `id` is a live stream of this runtime (never blocks on a
    /// close: a closing runtime knows no streams).
    pub(crate) fn knows_stream(&self, id: StreamId) -> bool {
        match self.enter() {
            Ok(_g) => self.streams.resolve(id).is_ok(),
            Err(_) => false,
        }
    }

    /// Whether `block` is live in this runtime (never blocks on a close: a
    /// closing runtime holds none). For naming the owner of a block another
    /// runtime was given.
    pub(crate) fn holds_block(&self, block: &BlockId) -> bool {
        match self.enter() {
            Ok(_g) => self.allocator.validate(block).is_ok(),
            Err(_) => false,
        }
    }

    /// Run `f` on stream `id` of this runtime, holding the runtime open
    /// meanwhile (a peer's cross-device use).
    pub(crate) fn with_stream<R>(
        &self,
        id: StreamId,
        f: impl FnOnce(StreamRef) -> ResourceResult<R>,
    ) -> ResourceResult<R> {
        let _g = self.enter()?;
        f(self.streams.resolve(id)?)
    }

    /// The entry of a launch call (prepare/finish): no call-gate pass, whose
    /// two atomic read-modify-writes would be a good part of the call. The
    /// allocator refuses launch calls once close has begun and close waits
    /// for those in flight (`StreamTracking::close_launches`); this
    /// check only makes a call after close fail early. A stream this
    /// runtime does not know goes the multi-device way, with a pass.
    fn launch_stream(&self, stream: StreamId) -> ResourceResult<Result<StreamRef, ResourceError>> {
        refuse_in_host_callback()?;
        if self.gate.is_closed() {
            return Err(closed_error());
        }
        Ok(self.streams.resolve(stream))
    }

    pub fn prepare(&self, block: &BlockId, stream: StreamId, access: Access) -> ResourceResult<()> {
        let uses = [BlockUse { block: *block, access }];
        self.launch_call(stream, &uses, multi_device::prepare_all, |a, s| a.prepare_block_use(block, s, access))
    }

    pub fn finish(&self, block: &BlockId, stream: StreamId, access: Access) -> ResourceResult<()> {
        let uses = [BlockUse { block: *block, access }];
        self.launch_call(stream, &uses, multi_device::finish_all, |a, s| a.finish_block_use(block, s, access))
    }

    /// Prepare every block of a launch; all handles are checked first and on
    /// any error nothing is queued.
    pub fn prepare_all(&self, stream: StreamId, uses: &[BlockUse]) -> ResourceResult<()> {
        self.launch_call(stream, uses, multi_device::prepare_all, |a, s| a.prepare_block_uses(s, uses))
    }

    /// Record a launch's uses with one event; all handles are checked first.
    pub fn finish_all(&self, stream: StreamId, uses: &[BlockUse]) -> ResourceResult<()> {
        self.launch_call(stream, uses, multi_device::finish_all, |a, s| a.finish_block_uses(s, uses))
    }

    /// The one body of the four launch calls: `call` on the allocator for a
    /// stream of this runtime; a stream it does not know goes the
    /// multi-device way (`peer`: it may be one of a peer device), with a
    /// pass. Errors name the block they are about (`explain_uses_error`).
    #[inline]
    fn launch_call(
        &self,
        stream: StreamId,
        uses: &[BlockUse],
        peer: fn(&Runtime, StreamId, &[BlockUse], ResourceError) -> ResourceResult<()>,
        call: impl FnOnce(&dyn Allocator, StreamRef) -> ResourceResult<()>,
    ) -> ResourceResult<()> {
        let explain = |e| multi_device::explain_uses_error(self, uses, e);
        match self.launch_stream(stream)? {
            Ok(s) => call(&*self.allocator, s).map_err(explain),
            Err(e) => {
                let _g = self.enter()?;
                peer(self, stream, uses, e).map_err(explain)
            }
        }
    }

    // ----- stream capture (DESIGN: "Stream capture") -----

    /// Begin capturing `stream` into a CUDA graph; returns the capture id.
    /// While a capture begun here is active, the pool applies the capture
    /// rules to every stream that takes part in one.
    pub fn begin_capture(&self, stream: StreamId, mode: CaptureMode) -> ResourceResult<u64> {
        let _g = self.enter()?;
        let s = self.streams.resolve(stream)?;
        self.allocator.capture_beginning()?;
        let begun = self.device.begin_capture(s.raw, mode).map_err(ResourceError::from).and_then(|()| {
            self.device.capture_of(s.raw)?.ok_or_else(|| {
                ResourceError::Internal(format!("stream {stream} began capturing but the driver reports no capture"))
            })
        });
        if let Ok(id) = begun {
            self.allocator.capture_begun(id);
        }
        self.allocator.capture_begin_done();
        begun
    }

    /// End the capture begun on `stream`: (the graph, the capture id).
    pub fn end_capture(&self, stream: StreamId) -> ResourceResult<(u64, u64)> {
        let _g = self.enter()?;
        let s = self.streams.resolve(stream)?;
        let id = self
            .device
            .capture_of(s.raw)?
            .ok_or_else(|| ResourceError::StreamMisuse(format!("stream {stream} is not capturing")))?;
        let graph = self.device.end_capture(s.raw);
        // A capture the driver invalidated ends with the error; one ended on
        // the wrong stream goes on.
        if self.device.capture_of(s.raw)?.is_none() {
            self.allocator.capture_ended(id);
        }
        Ok((graph?, id))
    }

    /// Give capture `id`'s private memory back (after its graphs are
    /// destroyed); refused while it captures or has live blocks.
    pub fn release_capture(&self, id: u64) -> ResourceResult<u64> {
        let _g = self.enter()?;
        self.allocator.release_capture(Some(id))
    }

    // ----- captures announced by a framework (resources/announced_pools.rs) -----

    /// A framework is about to begin a capture into its pool `pool` on
    /// `origin` (None: not known); see `announced_pools.rs`. Pool (0, 0) is
    /// no pool and is refused.
    pub fn announce_capture_pool(&self, pool: PoolKey, origin: Option<StreamId>) -> ResourceResult<()> {
        let _g = self.enter()?;
        check_pool(pool)?;
        let origin = match origin {
            Some(id) => Some(self.streams.resolve(id)?.raw),
            None => None,
        };
        self.allocator.pool_announced(pool, origin);
        Ok(())
    }

    /// The framework ended a capture into `pool`. Returns the bytes given
    /// back meanwhile (released pools whose blocks became free).
    pub fn end_capture_pool(&self, pool: PoolKey) -> ResourceResult<u64> {
        let _g = self.enter()?;
        check_pool(pool)?;
        self.allocator.pool_ended(pool)
    }

    /// One user of `pool` (a graph) is gone; after the last, the memory of
    /// its captures goes back as soon as none of their blocks is live.
    /// Returns the bytes given back now.
    pub fn release_capture_pool(&self, pool: PoolKey) -> ResourceResult<u64> {
        let _g = self.enter()?;
        check_pool(pool)?;
        self.allocator.release_pool(pool)
    }

    /// Retire completed frees; never blocks. Returns the bytes released.
    pub fn reap(&self) -> ResourceResult<u64> {
        let _g = self.enter()?;
        self.allocator.reap_pending()
    }

    /// Give cached memory back to the driver until at most `keep_bytes`
    /// stay cached (the role of `torch.cuda.empty_cache()`): waits for
    /// those frees, retires them and asks the driver's pool to unmap what
    /// it no longer needs.
    pub fn trim(&self, keep_bytes: u64) -> ResourceResult<Trimmed> {
        let _g = self.enter()?;
        self.allocator.trim(keep_bytes)
    }

    /// Block until every queued free has completed, then reap.
    pub fn drain(&self) -> ResourceResult<u64> {
        // As in `synchronize`: the wait holds a pass of the call gate so
        // close cannot destroy the streams it waits on.
        let _g = self.enter()?;
        self.allocator.wait_pending()?;
        self.allocator.reap_pending()
    }

    pub fn usage(&self) -> Usage {
        self.allocator.usage()
    }

    pub fn stats(&self) -> ResourceResult<Stats> {
        let _g = self.enter()?;
        Ok(self.stats_now())
    }

    // ----- inspection (see `telemetry`) -----

    /// Whether this runtime records call sites (`Config::track_call_sites`).
    pub fn tracks_call_sites(&self) -> bool {
        self.telemetry.tracks_call_sites()
    }

    /// Every live block, oldest first.
    pub fn live_blocks(&self) -> ResourceResult<Vec<LiveBlock>> {
        let _g = self.enter()?;
        Ok(self.live_blocks_now())
    }

    fn live_blocks_now(&self) -> Vec<LiveBlock> {
        self.telemetry.live_blocks(self.allocator.live_blocks())
    }

    /// Counters per tag, largest live bytes first.
    pub fn tag_stats(&self) -> ResourceResult<Vec<TagStats>> {
        let _g = self.enter()?;
        Ok(Telemetry::tag_stats(&self.counts()))
    }

    fn counts(&self) -> CountSummary {
        let mut counts = CountSummary::default();
        self.allocator.count_tags(&mut counts);
        counts
    }

    /// Restart every peak (`peak_outstanding_bytes`, the live peaks, the
    /// per-tag peaks) from its current value.
    pub fn reset_peak(&self) -> ResourceResult<()> {
        let _g = self.enter()?;
        self.allocator.reset_peak();
        Ok(())
    }

    /// The text summary: totals, per-tag table, the `top_n` largest live
    /// blocks.
    pub fn memory_summary(&self, top_n: usize) -> ResourceResult<String> {
        let _g = self.enter()?;
        let counts = self.counts();
        let stats = self.stats_with(&counts);
        let tags = Telemetry::tag_stats(&counts);
        let blocks = self.live_blocks_now();
        let backend = match self.backend() {
            Backend::Cuda => "cuda",
            Backend::Sim => "sim",
            Backend::Auto => "auto",
        };
        let mut counts_totals = counts.totals;
        counts_totals.peak_live_bytes = stats.peak_live_bytes;
        Ok(summary::format(&summary::SummaryInput {
            device: self.device.ordinal(),
            backend,
            stats: &stats,
            totals: counts_totals,
            tags: &tags,
            blocks: &blocks,
            top_n,
        }))
    }

    fn stats_now(&self) -> Stats {
        self.stats_with(&self.counts())
    }

    fn stats_with(&self, counts: &CountSummary) -> Stats {
        let u = self.allocator.usage();
        let totals = counts.totals;
        let (limit, remaining) = match &self.budget {
            Some(b) => (b.limit(), b.remaining()),
            None => (0, u64::MAX),
        };
        Stats {
            live_bytes: u.live_bytes,
            pending_bytes: u.pending_bytes,
            outstanding_bytes: u.outstanding_bytes(),
            peak_outstanding_bytes: u.peak_outstanding_bytes,
            budget_limit: limit,
            budget_remaining: remaining,
            live_blocks: u.live_blocks,
            pending_blocks: u.pending_blocks,
            allocations: u.allocations,
            deallocations: u.deallocations,
            failed_allocations: self.counters.failed_allocations.load(Ordering::Relaxed),
            cached_bytes: u.cached_bytes,
            cached_blocks: u.cached_blocks,
            cache_hits: u.cache_hits,
            cache_misses: u.cache_misses,
            reserved_bytes: self.device.pool_reserved_bytes().unwrap_or_else(|| u.outstanding_bytes()),
            log_lines_lost: self.log.as_ref().map_or(0, |log| log.lines_lost()),
            // The summed peak is an upper bound when several streams
            // allocate (`telemetry::counters`); live bytes never exceed the
            // held bytes, so their peak is capped by the held peak too.
            peak_live_bytes: match u.peak_live_bytes {
                0 => totals.peak_live_bytes.min(u.peak_outstanding_bytes.max(totals.live_bytes)),
                exact => exact,
            },
            peak_live_blocks: totals.peak_live_blocks,
            alloc_retries: u.alloc_retries + self.budget.as_ref().map_or(0, |b| b.retries()),
            pages_mapped: u.pages_mapped,
            pages_unmapped: u.pages_unmapped,
        }
    }

    // ----- lifetime -----

    /// `StreamMisuse`, naming the stream and its capture, when the next
    /// close would be the last one (it shuts the runtime down) and one of
    /// the runtime's streams takes part in a capture. Nothing changes.
    pub fn check_close_allowed(&self) -> ResourceResult<()> {
        refuse_in_host_callback()?;
        let _registry = registry_lock();
        self.refuse_last_close_while_capturing()
    }

    /// `check_close_allowed` under the registry lock (which serialises
    /// opens and closes, so the openers count is exact here).
    fn refuse_last_close_while_capturing(&self) -> ResourceResult<()> {
        if self.gate.is_closed() || self.openers.load(Ordering::Acquire) > 1 {
            return Ok(());
        }
        match self.streams.first_capturing()? {
            None => Ok(()),
            Some((stream, capture)) => Err(ResourceError::StreamMisuse(format!(
                "the runtime of device {} cannot close while {stream} takes part in capture {capture}: \
                 close waits for the work queued on its streams, which would invalidate the capture, \
                 and destroys them under it; end the capture first (xlog_capture_end, or the \
                 framework's own end of capture); nothing was changed, the runtime stays open",
                self.device.ordinal()
            ))),
        }
    }

    /// Close one opener's reference. The last close waits for the work
    /// already queued on its streams (host callbacks included), then frees
    /// what is still live (reporting each block as a leak on stderr and in
    /// the log), names the pooled streams never released (stderr and the
    /// log, `CloseReport::unreleased_streams`),
    /// waits for pending frees, and destroys the pool's streams. Calls made
    /// after it fail with an error. Refused, changing nothing, from inside
    /// a host callback, and (the last close) while a stream of the runtime
    /// takes part in a capture: waiting for that stream would invalidate
    /// the capture (`check_close_allowed`).
    pub fn close(self: &Arc<Self>) -> ResourceResult<CloseReport> {
        // From a host callback close would wait for the callback's own
        // stream (and on CUDA call the driver): refused, nothing changes.
        refuse_in_host_callback()?;
        {
            // The registry lock also serialises opens and closes of shared
            // runtimes, so an open never revives a runtime being shut down.
            let mut registry = registry_lock();
            if self.gate.is_closed() {
                return Err(closed_error());
            }
            self.refuse_last_close_while_capturing()?;
            if self.openers.fetch_sub(1, Ordering::AcqRel) > 1 {
                return Ok(CloseReport { still_shared: true, ..CloseReport::default() });
            }
            let ordinal = self.device.ordinal();
            if registry.get(&ordinal).is_some_and(|rt| Arc::ptr_eq(rt, self)) {
                registry.remove(&ordinal);
            }
        }
        // Later calls fail; the calls in flight are waited for (launch
        // calls, which take no pass, through the allocator's own protocol).
        if !self.gate.close() {
            return Err(closed_error());
        }
        self.allocator.close_launches();
        // First let every host callback already queued or running finish:
        // a callback may still touch any block (a sim callback writes block
        // memory through its pointer), so nothing is freed before they are
        // done. Callbacks cannot call back in (refused, see `enter`), so
        // this wait cannot deadlock on the close itself.
        for raw in self.streams.all_raw() {
            let _ = self.device.synchronize_stream(raw);
        }
        let leaked = self.allocator.live_blocks();
        if !leaked.is_empty() {
            let total: u64 = leaked.iter().map(|b| b.id.size).sum();
            eprintln!(
                "xlog: runtime on device {} closed with {} live block(s), {} bytes; freeing them:",
                self.device.ordinal(),
                leaked.len(),
                total
            );
        }
        let mut first_error: Option<ResourceError> = None;
        for block in &leaked {
            eprintln!(
                "xlog:   leaked block tag={:?} size={} generation={} ptr={:#x}",
                block.tag, block.id.size, block.id.generation, block.id.ptr
            );
            if let Some(log) = &self.log {
                log.leaked(block);
            }
            match self.allocator.deallocate(&block.id) {
                Ok(freed) => self.telemetry.freed(&freed),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        // Streams are named as blocks are: a stream acquired and never
        // released is a leak of the caller's too (an engine that loses
        // its streams exhausts the pool).
        let unreleased_streams: Vec<UnreleasedStream> =
            self.streams.acquired().into_iter().map(|(id, native)| UnreleasedStream { id, native }).collect();
        if !unreleased_streams.is_empty() {
            let ids: Vec<String> = unreleased_streams.iter().map(|s| s.id.to_string()).collect();
            eprintln!(
                "xlog: runtime on device {} closed with {} stream(s) acquired and never released (ids {}); releasing them:",
                self.device.ordinal(),
                unreleased_streams.len(),
                ids.join(", ")
            );
        }
        for stream in &unreleased_streams {
            eprintln!("xlog:   unreleased stream {} native={:#x}", stream.id, stream.native);
            if let Some(log) = &self.log {
                log.unreleased_stream(stream.id.0, stream.native);
            }
        }
        // Everything cached goes back to the driver (trim waits for it),
        // and the captures' private memory.
        if let Err(e) = self.allocator.trim(0) {
            first_error.get_or_insert(e);
        }
        if let Err(e) = self.allocator.release_capture(None) {
            first_error.get_or_insert(e);
        }
        if let Err(e) = self.allocator.wait_pending() {
            first_error.get_or_insert(e);
        }
        if let Err(e) = self.allocator.reap_pending() {
            first_error.get_or_insert(e);
        }
        for raw in self.streams.all_raw() {
            let _ = self.device.synchronize_stream(raw);
        }
        self.peers.shutdown(&self.device);
        if let Err(e) = self.streams.shutdown() {
            first_error.get_or_insert(e);
        }
        if let Some(log) = &self.log {
            log.flush();
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(CloseReport { leaked, unreleased_streams, still_shared: false }),
        }
    }
}

/// Every runtime call made from inside a host callback is refused with
/// `StreamMisuse` and changes nothing (see `device::in_host_callback`).
fn refuse_in_host_callback() -> ResourceResult<()> {
    if crate::device::in_host_callback() {
        return Err(ResourceError::in_host_callback());
    }
    Ok(())
}

/// The one check of a device ordinal given by a caller: every entry point
/// that takes one (open, and the framework hooks' calls, which name their
/// device on every call) refuses a negative ordinal with the same message
/// before anything opens or changes.
pub fn check_ordinal(ordinal: i32) -> ResourceResult<()> {
    if ordinal < 0 {
        return Err(ResourceError::InvalidArgument(format!("device ordinal {ordinal} is negative")));
    }
    Ok(())
}

pub(crate) fn check_pool(pool: PoolKey) -> ResourceResult<()> {
    if pool == (0, 0) {
        return Err(ResourceError::InvalidArgument(
            "pool (0, 0) names no pool (a framework's graph pools have a non-zero id)".into(),
        ));
    }
    Ok(())
}

fn closed_error() -> ResourceError {
    ResourceError::runtime_closed()
}
