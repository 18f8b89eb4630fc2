//! The `DeviceMemoryResource` trait and the value types that flow through it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

pub use crate::error::{ResourceError, ResourceResult};
pub use crate::ids::{Generation, StreamId};
use crate::ids::{PoolKey, RawStream};

/// A stream as resources see it: the public id plus the backend handle the
/// runtime resolved it to. Resources order work on `raw`; two ids can share
/// one raw stream (a pooled stream released and acquired again), and "same
/// stream" is decided on `raw`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StreamRef {
    pub id: StreamId,
    pub raw: RawStream,
}

/// Value handle of a block: what callers hold and hand back. It is checked
/// against the resource's table on every use; a handle whose generation is
/// not live (freed, or never issued) is rejected with `UseAfterFree`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockId {
    pub ptr: u64,
    pub size: u64,
    pub generation: Generation,
    pub alloc_stream: StreamId,
    pub device: i32,
}

impl BlockId {
    /// No block (generation 0 is never issued): a placeholder.
    pub(crate) const NONE: BlockId =
        BlockId { ptr: 0, size: 0, generation: Generation(0), alloc_stream: StreamId(0), device: 0 };
}

/// How a launch touches a block.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    pub fn writes(self) -> bool {
        !matches!(self, Access::Read)
    }
}

/// One block used by a recorded launch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BlockUse {
    pub block: BlockId,
    pub access: Access,
}

impl Default for BlockUse {
    /// A placeholder (a read of the null handle) for fixed-size buffers of
    /// uses; never a live block.
    fn default() -> Self {
        BlockUse {
            block: BlockId { ptr: 0, size: 0, generation: Generation(0), alloc_stream: StreamId(0), device: 0 },
            access: Access::Read,
        }
    }
}

/// Lifecycle of a block: Live → Cached (freed into its stream's cache; the
/// generation is dead, the memory is kept for reuse) or Pending (freed to
/// the driver, GPU not done yet) → Retired. Quarantined is for debug-guard
/// resources that never hand an address out again.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BlockState {
    Live,
    Cached,
    Pending,
    Retired,
    Quarantined,
}

/// Interned allocation tag: 4 bytes in every block record instead of a
/// string. Names live in a process-wide table; tags are meant as a small,
/// repeated vocabulary ("hash_table", "join_output", ...).
///
/// The table is bounded: it keeps the first [`MAX_TAGS`] distinct names of
/// the process (the empty name and the overflow bucket included), and once
/// it is full a name it has not seen is recorded as [`OVERFLOW_TAG_NAME`].
/// So a program that tags by query id or request number uses at most a few
/// hundred KiB for tag names, however long it runs, and its later tags read
/// `(other)` in logs and leak reports.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AllocTag(u32);

/// Most distinct tag names a process keeps, the empty name and
/// [`OVERFLOW_TAG_NAME`] included.
pub const MAX_TAGS: usize = 4096;

// The per-tag counters (`tag_counters`) have one slot per tag index and
// count an index past them in the overflow bucket.
const _: () = assert!(MAX_TAGS == crate::tag_counters::TAG_SLOTS);
const _: () = assert!(AllocTag::OVERFLOW.0 as usize == crate::tag_counters::OVERFLOW_SLOT);

/// What a new tag name is recorded as once the table is full.
pub const OVERFLOW_TAG_NAME: &str = "(other)";

struct TagTable {
    by_name: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

fn tag_table() -> &'static Mutex<TagTable> {
    static TABLE: OnceLock<Mutex<TagTable>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = TagTable { by_name: HashMap::new(), names: Vec::new() };
        for name in ["", OVERFLOW_TAG_NAME] {
            let name: Arc<str> = Arc::from(name);
            table.by_name.insert(name.clone(), table.names.len() as u32);
            table.names.push(name);
        }
        Mutex::new(table)
    })
}

/// Longest tag kept, in bytes of UTF-8; longer names are cut at a
/// character boundary, not refused (documented in the header, README and
/// the Python package: refusing would fail allocations that work today).
pub const MAX_TAG_LEN: usize = 128;

/// Entries a thread's cache of recent names holds before it starts over.
const THREAD_CACHE_ENTRIES: usize = 1024;

impl AllocTag {
    pub const UNTAGGED: AllocTag = AllocTag(0);
    /// The bucket of names that came after the table was full.
    pub const OVERFLOW: AllocTag = AllocTag(1);

    pub fn new(name: &str) -> AllocTag {
        if name.is_empty() {
            return AllocTag::UNTAGGED;
        }
        let mut end = name.len().min(MAX_TAG_LEN);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let name = &name[..end];
        AllocTag::from_bytes(name.as_bytes())
    }

    /// The tag of a name given as bytes (a C string's); invalid UTF-8 is
    /// replaced. Repeating the last name this thread gave costs a compare.
    pub fn from_bytes(name: &[u8]) -> AllocTag {
        thread_local! {
            /// The last name this thread gave, as given: callers mostly
            /// repeat one.
            static LAST: std::cell::RefCell<(Vec<u8>, u32)> = const { std::cell::RefCell::new((Vec::new(), 0)) };
        }
        if name.is_empty() {
            return AllocTag::UNTAGGED;
        }
        if let Some(id) = LAST.with(|l| {
            let l = l.borrow();
            (l.1 != 0 && l.0 == name).then_some(l.1)
        }) {
            return AllocTag(id);
        }
        let text = String::from_utf8_lossy(name);
        let mut end = text.len().min(MAX_TAG_LEN);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let tag = AllocTag::lookup(&text[..end]);
        LAST.with(|l| {
            let mut l = l.borrow_mut();
            l.0.clear();
            l.0.extend_from_slice(name);
            l.1 = tag.0;
        });
        tag
    }

    /// `new` past the one-entry cache: the per-thread table, then the
    /// process-wide one.
    fn lookup(name: &str) -> AllocTag {
        thread_local! {
            static CACHE: std::cell::RefCell<crate::fast_hash::FastMap<Box<str>, u32>> =
                std::cell::RefCell::new(Default::default());
        }
        if let Some(id) = CACHE.with(|c| c.borrow().get(name).copied()) {
            return AllocTag(id);
        }
        let id = {
            let mut table = tag_table().lock().unwrap_or_else(|p| p.into_inner());
            match table.by_name.get(name) {
                Some(&id) => id,
                None if table.names.len() >= MAX_TAGS => AllocTag::OVERFLOW.0,
                None => {
                    let id = table.names.len() as u32;
                    let arc: Arc<str> = Arc::from(name);
                    table.names.push(arc.clone());
                    table.by_name.insert(arc, id);
                    id
                }
            }
        };
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            // Bound the per-thread cache too; the global table stays
            // authoritative.
            if c.len() >= THREAD_CACHE_ENTRIES {
                c.clear();
            }
            c.insert(name.into(), id);
        });
        AllocTag(id)
    }

    /// Index of the tag in the process-wide table (below [`MAX_TAGS`]):
    /// what per-tag counters are indexed by.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The tag at `index` of the process-wide table (the inverse of
    /// `index`, for code that keeps per-tag arrays).
    pub(crate) fn from_index(index: usize) -> AllocTag {
        AllocTag(index as u32)
    }

    pub fn name(self) -> Arc<str> {
        let table = tag_table().lock().unwrap_or_else(|p| p.into_inner());
        table.names.get(self.0 as usize).cloned().unwrap_or_else(|| Arc::from("?"))
    }

    /// Distinct names the process-wide table holds (at most [`MAX_TAGS`]).
    pub fn interned() -> usize {
        tag_table().lock().unwrap_or_else(|p| p.into_inner()).names.len()
    }
}

impl fmt::Display for AllocTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// A block as the resource describes it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeviceBlock {
    pub id: BlockId,
    pub tag: AllocTag,
    pub state: BlockState,
    /// Device bytes the block takes: its size rounded up to what the
    /// allocator really hands out (a size class, or the driver's
    /// granularity). This is what budgets, stats and the log count.
    pub held: u64,
}

impl DeviceBlock {
    pub fn bytes(&self) -> u64 {
        self.id.size
    }
}

/// Byte and block counts of a resource. All byte counts are device bytes
/// (sizes rounded up as `DeviceBlock::held`).
/// `outstanding = live + cached + pending`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub live_bytes: u64,
    pub pending_bytes: u64,
    pub live_blocks: u64,
    pub pending_blocks: u64,
    /// Freed blocks kept in the per-stream caches for reuse.
    pub cached_bytes: u64,
    pub cached_blocks: u64,
    /// Allocations served from a cache, and those that went to the driver.
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub peak_outstanding_bytes: u64,
    /// Cross-stream waits queued by prepare, deallocate and cross-stream
    /// cache hand-outs (tracking only).
    pub cross_stream_waits: u64,
    /// Events recorded by finish and reap (tracking only).
    pub events_recorded: u64,
    /// Successful allocations and frees (counted where the resource keeps
    /// its block records, so the hot path adds no shared counter).
    pub allocations: u64,
    pub deallocations: u64,
    /// Driver refusals answered by giving the cache back (and, with
    /// wait_on_pressure, waiting) and trying again.
    pub alloc_retries: u64,
    /// The highest live total, where the resource follows it exactly
    /// across streams (the arena); 0 where it does not (the runtime then
    /// bounds it from the per-shard counts).
    pub peak_live_bytes: u64,
    /// Physical pages mapped (one `cuMemMap` each) and unmapped by the
    /// arena since the runtime opened: in a loop that repeats they should
    /// stop growing, and every one costs step time on a GPU (tens of
    /// microseconds of driver calls a page). 0 without the arena.
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
}

impl Usage {
    pub fn outstanding_bytes(&self) -> u64 {
        self.live_bytes + self.cached_bytes + self.pending_bytes
    }
}

/// `bytes` rounded up to the driver's granularity
/// ([`crate::device::GRANULARITY`]); `None` past `u64::MAX`.
pub(crate) fn granular(bytes: u64) -> Option<u64> {
    use crate::device::GRANULARITY;
    bytes.div_ceil(GRANULARITY).checked_mul(GRANULARITY)
}

/// Permission to take new memory from the driver: an allocator under a
/// budget charges it right before it takes device memory (`budget.rs`), so
/// a caching allocator asks only when it really grows (a cache hit is
/// already paid for).
pub trait ChargeGate: Sync {
    /// Charge `bytes`, or refuse (with the error to report) when they do
    /// not fit.
    fn try_charge(&self, bytes: u64) -> ResourceResult<()>;
    /// Give back `bytes` charged earlier: a rolled-back charge, or memory
    /// the resource has returned to the driver and seen released.
    fn uncharge(&self, bytes: u64);
}

/// The gate of a stack without a budget: everything fits.
pub struct NoCharge;

impl ChargeGate for NoCharge {
    fn try_charge(&self, _bytes: u64) -> ResourceResult<()> {
        Ok(())
    }
    fn uncharge(&self, _bytes: u64) {}
}

/// What `trim` did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Cached bytes handed back to the driver.
    pub released: u64,
    /// How far `bytes_outstanding` dropped (frees seen complete), which a
    /// budget above releases.
    pub retired: u64,
}

/// A live block as `live_blocks` reports it (leak reports at close, the
/// live-block list of `telemetry`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeakedBlock {
    pub id: BlockId,
    pub tag: Arc<str>,
    /// The interned tag (`tag` is its name).
    pub tag_id: AllocTag,
    /// Device bytes (as `DeviceBlock::held`).
    pub held: u64,
    /// Allocation number in the block table that holds the record (the
    /// async pool has one table per group of streams, its shard; Direct
    /// one): 1 for the table's first allocation, zero-byte blocks included.
    /// Counted under the table's lock, so it costs no shared counter.
    pub sequence: u64,
    /// Allocations the same table made after this one: the block's age in
    /// allocations on its stream (and the streams sharing its shard).
    pub allocations_since: u64,
}

fn no_tracking(what: &str) -> ResourceError {
    ResourceError::StreamMisuse(format!(
        "{what}: this resource stack does not track cross-stream block use \
         (Direct allocator); order streams yourself or open the runtime with \
         the async allocator"
    ))
}

/// The narrow resource: what every allocator does (`AsyncPool`, `Direct`).
/// An allocator charges its budget (`budget.rs`) and reports to its log
/// (`logging.rs`) itself; there are no decorators. Implementations are
/// thread-safe.
pub trait DeviceMemoryResource: Send + Sync {
    /// Allocate `bytes` ordered on `stream`. Zero bytes succeeds with a null
    /// pointer and a fresh generation. Pointers are aligned to ≥ 256 bytes.
    /// Under a budget, new device memory is charged before it is taken
    /// (`budget.rs`).
    fn allocate(&self, bytes: u64, stream: StreamRef, tag: AllocTag) -> ResourceResult<DeviceBlock>;

    /// Return a block. Its allocation stream is authoritative for ordering:
    /// a tracking resource first makes it wait for every recorded use on
    /// other streams. Returns the block as it was, with its new state.
    /// A stale or doubled handle is an error that changes nothing.
    fn deallocate(&self, block: &BlockId) -> ResourceResult<DeviceBlock>;

    /// Check that `block` names a live block; return its description.
    fn validate(&self, block: &BlockId) -> ResourceResult<DeviceBlock>;

    /// Byte and block counts.
    fn usage(&self) -> Usage;

    /// CUDA ordinal (or sim ordinal) the resource serves.
    fn device_ordinal(&self) -> u32;

    /// Live plus cached plus pending (freed, not yet retired) bytes: what
    /// the resource holds from the driver.
    fn bytes_outstanding(&self) -> u64;
}

/// The memory an allocator holds beyond its live blocks: reaping,
/// waiting, trimming, pressure, and what is live (telemetry). A resource
/// without a cache or pending frees keeps the defaults.
pub trait HeldMemory: Send + Sync {
    /// Live blocks (leak reports at close, the live-block list). Each
    /// record is copied under the lock that guards it, so it is consistent
    /// on its own; the list as a whole is not one instant when other threads
    /// allocate meanwhile.
    fn live_blocks(&self) -> Vec<LeakedBlock>;

    /// Restart every peak (`peak_outstanding_bytes`, the counters of
    /// `count_tags`) from its current value.
    fn reset_peak(&self) {}

    /// Add the per-tag and total counts of this resource's blocks to `out`
    /// (`telemetry::counters`); a resource that keeps none adds nothing.
    fn count_tags(&self, _out: &mut crate::tag_counters::CountSummary) {}

    /// Retire pending frees whose GPU work has completed, without blocking.
    /// Returns the bytes retired, which is exactly how much
    /// `bytes_outstanding` dropped (a budget above releases that much). A
    /// synchronous resource has nothing to do.
    fn reap_pending(&self) -> ResourceResult<u64> {
        Ok(0)
    }

    /// Block until every free queued so far has completed on the GPU. Does
    /// not retire anything itself (the caller reaps afterwards), so a budget
    /// can wait without holding its lock.
    fn wait_pending(&self) -> ResourceResult<()> {
        Ok(())
    }

    /// Hand cached memory back to the driver, largest and coldest blocks
    /// first, until at most `keep_bytes` stay cached; wait for those frees
    /// and retire them. A resource without a cache has nothing to do.
    fn trim(&self, _keep_bytes: u64) -> ResourceResult<Trimmed> {
        Ok(Trimmed::default())
    }

    /// Pressure: an allocation of `need` bytes did not fit. Give at least
    /// `need` cached bytes back to the driver (largest first, every
    /// stream), with `wait` block until pending frees complete, and retire
    /// what completed. Returns the bytes retired (the drop of
    /// `bytes_outstanding`).
    fn relieve_pressure(&self, _need: u64, wait: bool) -> ResourceResult<u64> {
        if wait {
            self.wait_pending()?;
        }
        self.reap_pending()
    }

    /// The live blocks allocated on `stream` whose frees will be ordered
    /// on it: how many, and their bytes. A resource whose frees are
    /// synchronous (Direct) has none.
    fn live_on_stream(&self, _stream: StreamId) -> (u64, u64) {
        (0, 0)
    }

    /// `stream` is going away (an imported stream released): nothing may
    /// be queued on it later, so its cached blocks go back to the driver
    /// now. Returns the bytes retired.
    fn retire_stream(&self, _stream: RawStream) -> ResourceResult<u64> {
        Ok(0)
    }

    // Block-use tracking. The defaults refuse with StreamMisuse instead of
    // succeeding quietly: a launch builder that saw `Ok` from a resource
    // which does not really track uses would queue work on another stream,
    // free the block on its allocation stream, and hit exactly the
    // cross-stream use-after-free these calls exist to prevent. An explicit
    // error is the only honest answer from a resource that cannot keep the
    // promise; only resources that really record events override them.

    /// Device `ordinal` now has peer access to this resource's device:
    /// memory the resource maps itself (the arena's pages) must be made
    /// accessible to it, now and in every later mapping (`cuMemSetAccess`;
    /// `cuCtxEnablePeerAccess` does not cover virtual-memory mappings).
    fn grant_peer(&self, _ordinal: i32) -> ResourceResult<()> {
        Ok(())
    }
}

/// Cross-stream block-use tracking (prepare/finish, DESIGN.md
/// "Semantics"), implemented by the tracking allocator (`AsyncPool`).
pub trait StreamTracking: Send + Sync {
    // The defaults refuse with StreamMisuse instead of succeeding quietly:
    // a launch builder that saw `Ok` from a resource which does not really
    // track uses would queue work on another stream, free the block on its
    // allocation stream, and hit exactly the cross-stream use-after-free
    // these calls exist to prevent. An explicit error is the only honest
    // answer from a resource that cannot keep the promise; only resources
    // that really record events override them.

    /// Whether this stack really tracks cross-stream uses. Launch paths ask
    /// before queueing work so they can fail before anything is enqueued.
    fn supports_block_use_tracking(&self) -> bool {
        false
    }

    /// Attach an event from `use_stream` to `block` (a read use).
    fn record_block_use(&self, _block: &BlockId, _use_stream: StreamRef) -> ResourceResult<()> {
        Err(no_tracking("record_block_use"))
    }

    /// Before work on `use_stream` touches `block`: queue the waits it needs.
    /// Read waits for the last write from another stream; Write/ReadWrite
    /// also waits for every outstanding read from other streams.
    fn prepare_block_use(
        &self,
        _block: &BlockId,
        _use_stream: StreamRef,
        _access: Access,
    ) -> ResourceResult<()> {
        Err(no_tracking("prepare_block_use"))
    }

    /// After work was enqueued on `use_stream`: record one event. Read joins
    /// the readers; Write/ReadWrite becomes the last write and clears readers.
    fn finish_block_use(
        &self,
        _block: &BlockId,
        _use_stream: StreamRef,
        _access: Access,
    ) -> ResourceResult<()> {
        Err(no_tracking("finish_block_use"))
    }

    /// `prepare_block_use` for a whole launch; every handle is validated
    /// before anything is queued.
    fn prepare_block_uses(&self, _stream: StreamRef, _uses: &[BlockUse]) -> ResourceResult<()> {
        Err(no_tracking("prepare_all"))
    }

    /// `finish_block_use` for a whole launch with one event; every handle is
    /// validated before anything is recorded.
    fn finish_block_uses(&self, _stream: StreamRef, _uses: &[BlockUse]) -> ResourceResult<()> {
        Err(no_tracking("finish_all"))
    }

    /// The runtime is closing: every later prepare/finish must fail with
    /// `ResourceError::runtime_closed`, and when this returns no such call
    /// may still be running. Launch calls take no call-gate pass (two
    /// atomic read-modify-writes per call saved): a resource that tracks
    /// uses checks a flag under the lock its launch calls hold, sets it
    /// here, then takes and drops each such lock once. A resource without
    /// tracking refuses launch calls anyway and has nothing to do.
    fn close_launches(&self) {}
}

/// Stream capture (DESIGN.md "Stream capture"): the allocator's capture
/// pools and announced pools. A resource without them keeps the defaults.
pub trait Captures: Send + Sync {
    /// A capture begun through the runtime (`capture_begun`) or ended
    /// (`capture_ended`); see `resources/capture_pool.rs`. A resource
    /// without capture pools has nothing to do.
    fn capture_begun(&self, _id: u64) {}

    fn capture_ended(&self, _id: u64) {}

    /// A capture is about to begin through the runtime: from here until
    /// `capture_begin_done` nothing may be left for a capture to see (the
    /// pool makes the event records it owes, `deferred_record.rs`). On an
    /// error the capture is not begun and nothing changed.
    fn capture_beginning(&self) -> ResourceResult<()> {
        Ok(())
    }

    /// The capture began (`capture_begun` was called) or failed to.
    fn capture_begin_done(&self) {}

    /// Captures a framework begins itself and announces
    /// (`resources/announced_pools.rs`): one into `pool` is about to begin
    /// on `origin` (None: not known). A resource without capture pools has
    /// nothing to do.
    fn pool_announced(&self, _pool: PoolKey, _origin: Option<RawStream>) {}

    /// The framework ended a capture into `pool`. Returns the bytes given
    /// back meanwhile (memory of released pools that became free), exactly
    /// the drop of `bytes_outstanding`.
    fn pool_ended(&self, _pool: PoolKey) -> ResourceResult<u64> {
        Ok(0)
    }

    /// One user of `pool` released it; once the last has, its captures'
    /// memory goes back as soon as none of their blocks is live. Returns
    /// the bytes given back now, exactly the drop of `bytes_outstanding`.
    fn release_pool(&self, _pool: PoolKey) -> ResourceResult<u64> {
        Ok(0)
    }

    /// Give captures' private memory back to the driver: capture `id`'s
    /// (refused while it captures or has live blocks), or with `None`
    /// every capture's free memory (close). Returns the bytes given back,
    /// exactly the drop of `bytes_outstanding`.
    fn release_capture(&self, _id: Option<u64>) -> ResourceResult<u64> {
        Ok(0)
    }
}

/// An allocator as the runtime holds it: one object, every role.
pub trait Allocator: DeviceMemoryResource + HeldMemory + StreamTracking + Captures {}

impl<T: DeviceMemoryResource + HeldMemory + StreamTracking + Captures> Allocator for T {}
