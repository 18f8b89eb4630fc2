//! Telemetry: what is live, per tag, and a readable summary — the
//! inspection side of a runtime (the role `torch.cuda.memory_stats`,
//! `memory_summary` and memory snapshots play for PyTorch's allocator).
//!
//! Contract:
//! - **Live-block list** ([`LiveBlock`]): every block live at the moment
//!   its resource's record was read, with its tag, requested size, device
//!   bytes, allocation stream, generation, pointer and age (its allocation
//!   number on its stream and the allocations made there since). With
//!   `Config::track_call_sites` (env `XLOG_TRACK_CALLSITES=1`) also its call
//!   site and its age in time. Each entry is copied under the lock that
//!   guards its record, so it is consistent on its own; while other threads
//!   allocate and free, the list as a whole is not one instant (a block
//!   allocated or freed during the walk may or may not be in it).
//! - **Per-tag counters** ([`TagStats`]): live bytes and blocks, peak
//!   bytes, allocations and frees per interned tag, and the live bytes and
//!   blocks of the whole runtime with their peaks. Tags past the tag
//!   table's bound share the `(other)` bucket, as in logs. Current values
//!   and counts are exact; peaks are exact while one stream allocates and
//!   an upper bound otherwise ([`counters`] says why).
//! - **Peaks** restart from the current values at `reset_peak` (the
//!   resource's `peak_outstanding_bytes` with them).
//! - **Summary** ([`summary::format`]): totals, the per-tag table and the
//!   largest live blocks as text.
//!
//! Cost on the hot path: the allocator counts each allocation and free in
//! the block table it already holds locked for the block's record
//! ([`counters::TableCounters`]): a few plain integer updates, found by
//! indexing with the interned tag id; no atomic, no extra lock, no hash
//! lookup, nothing shared between threads allocating on different streams.
//! Call-site tracking, when switched on, adds a lock and a map insert or
//! remove per block in the runtime; when off it costs one branch.
//!
//! Lock order: the resource's block-table locks are taken one at a time
//! while its records are copied and released before this module takes the
//! call-site map's lock; the allocation path takes the call-site lock only
//! after the resource returned. The call-site lock is never held while
//! another lock is taken, so none of these can deadlock.
//!
//! The allocators expose what this module needs through
//! `HeldMemory`: their records (`live_blocks`), their counters
//! (`count_tags`) and the peak reset (`reset_peak`).

pub mod call_sites;
pub use crate::tag_counters as counters;
pub mod summary;

use std::sync::Arc;
use std::time::Duration;

pub use call_sites::{tag_c_name, AllocationSite, CallSite};
use call_sites::SiteRecords;
pub use counters::{CountSummary, TotalCounts};

use crate::resource::{AllocTag, BlockId, DeviceBlock, LeakedBlock};

/// A live block as the live-block list reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// The block's handle: pointer, requested size, generation, allocation
    /// stream, device.
    pub id: BlockId,
    pub tag: AllocTag,
    pub tag_name: Arc<str>,
    /// Device bytes the block takes (its size class or granularity).
    pub device_bytes: u64,
    /// Allocation number on its stream (`LeakedBlock::sequence`: the
    /// streams of one pool shard share the count).
    pub sequence: u64,
    /// Allocations made on its stream (and its shard's) since this one: its
    /// age in allocations.
    pub allocations_since: u64,
    /// Where it was allocated (call-site tracking only, and only when the
    /// caller or the thread gave one).
    pub call_site: Option<CallSite>,
    /// Time since allocation (call-site tracking only).
    pub age: Option<Duration>,
}

/// Counters of one tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagStats {
    pub tag: AllocTag,
    pub name: Arc<str>,
    /// Device bytes of the tag's live blocks.
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// Highest `live_bytes` since the runtime opened or the last reset.
    pub peak_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
}

/// The runtime's part: call sites (when tracked) and the views built from
/// the resource's records and counters.
pub struct Telemetry {
    sites: Option<SiteRecords>,
}

impl Telemetry {
    pub fn new(track_call_sites: bool) -> Telemetry {
        Telemetry { sites: track_call_sites.then(SiteRecords::default) }
    }

    #[inline]
    pub fn tracks_call_sites(&self) -> bool {
        self.sites.is_some()
    }

    /// `block` was just allocated; `site` is the caller's call site (NONE:
    /// the thread's current one, if any). Only on success.
    #[inline]
    pub fn allocated(&self, block: &DeviceBlock, site: CallSite) {
        if let Some(sites) = &self.sites {
            // Every block gets an entry (its age), with or without a site.
            let site = if site.is_none() { CallSite::thread_current() } else { site };
            sites.insert(block.id.generation, site);
        }
    }

    /// `block` (as the resource returned it from the free) was freed.
    #[inline]
    pub fn freed(&self, block: &DeviceBlock) {
        if let Some(sites) = &self.sites {
            sites.remove(block.id.generation);
        }
    }

    /// Every tag that has allocated, largest live bytes first (ties by
    /// name).
    pub fn tag_stats(counts: &CountSummary) -> Vec<TagStats> {
        let mut out: Vec<TagStats> = counts
            .tags
            .iter()
            .map(|c| TagStats {
                tag: AllocTag::from_index(c.tag),
                name: AllocTag::from_index(c.tag).name(),
                live_bytes: c.live_bytes,
                live_blocks: c.live_blocks,
                peak_bytes: c.peak_bytes,
                allocations: c.allocations,
                frees: c.frees,
            })
            .collect();
        out.sort_by(|a, b| b.live_bytes.cmp(&a.live_bytes).then_with(|| a.name.cmp(&b.name)));
        out
    }

    /// The live-block list from the resource's records, by generation
    /// (allocation order for the blocks of one thread), with call sites
    /// added where tracked.
    pub fn live_blocks(&self, records: Vec<LeakedBlock>) -> Vec<LiveBlock> {
        let sites = match &self.sites {
            Some(s) => s.lookup_all(records.iter().map(|r| r.id.generation)),
            None => vec![None; records.len()],
        };
        let mut out: Vec<LiveBlock> = records
            .into_iter()
            .zip(sites)
            .map(|(r, site)| LiveBlock {
                id: r.id,
                tag: r.tag_id,
                tag_name: r.tag,
                device_bytes: r.held,
                sequence: r.sequence,
                allocations_since: r.allocations_since,
                call_site: site.map(|(s, _)| s).filter(|s| !s.is_none()),
                age: site.map(|(_, born)| born.elapsed()),
            })
            .collect();
        out.sort_by_key(|b| b.id.generation);
        out
    }
}

/// Counters and byte totals of a runtime (mirrors `xlog_stats`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub live_bytes: u64,
    pub pending_bytes: u64,
    pub outstanding_bytes: u64,
    pub peak_outstanding_bytes: u64,
    /// 0 when the runtime has no budget layer.
    pub budget_limit: u64,
    /// `u64::MAX` when the runtime has no budget layer.
    pub budget_remaining: u64,
    pub live_blocks: u64,
    pub pending_blocks: u64,
    pub allocations: u64,
    pub deallocations: u64,
    pub failed_allocations: u64,
    pub cached_bytes: u64,
    pub cached_blocks: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// What the driver's pool holds for this runtime (CUDA:
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` of xlog's own pool); on sim,
    /// or without a pool, the bytes xlog holds (`outstanding_bytes`).
    pub reserved_bytes: u64,
    /// CSV log lines that could not be written (0 without a log).
    pub log_lines_lost: u64,
    /// Highest `live_bytes` and `live_blocks` since the runtime opened or
    /// the last `reset_peak` (counted by `telemetry`).
    pub peak_live_bytes: u64,
    pub peak_live_blocks: u64,
    /// Refused allocations tried again after relieving pressure (by the
    /// pool after a driver refusal, by the budget after its own).
    pub alloc_retries: u64,
    /// Pages the arena has mapped and unmapped since the runtime opened
    /// (0 with `memory = pool`): what remapping costs on a GPU.
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
}
