//! Telemetry: what is live, per tag, and a readable summary — the
//! inspection side of a runtime (the role `torch.cuda.memory_stats`,
//! `memory_summary` and memory snapshots play for PyTorch's allocator).
//!
//! Contract:
//! - **Live-block list** ([`LiveBlock`]): every block live at the moment
//!   its resource's record was read, with its tag, requested size, device
//!   bytes, allocation stream, generation, pointer and age (its allocation
//!   sequence number and the allocations made since). With
//!   `Config::track_call_sites` (env `XLOG_TRACK_CALLSITES=1`) also its call
//!   site and its age in time. Each entry is copied under the lock that
//!   guards its record, so it is consistent on its own; while other threads
//!   allocate and free, the list as a whole is not one instant (a block
//!   allocated or freed during the walk may or may not be in it).
//! - **Per-tag counters** ([`TagStats`]): live bytes and blocks, peak
//!   bytes, allocations and frees per interned tag. Tags past the tag
//!   table's bound share the `(other)` bucket, as in logs.
//! - **Peaks** restart from the current values at [`Telemetry::reset_peak`]
//!   (the runtime also restarts the resource's `peak_outstanding_bytes`).
//! - **Summary** ([`summary::format`]): totals, the per-tag table and the
//!   largest live blocks as text.
//!
//! Cost on the hot path: a successful allocation and a free each update
//! two cache lines of atomics (the tag's counters, found by indexing with
//! the interned tag id, and the runtime's totals); no lock, no allocation,
//! no hash lookup. Call-site tracking, when switched on, adds a lock and a
//! map insert or remove per block; when off it costs one branch.
//!
//! Lock order: the resource's block-table locks are taken one at a time
//! while its records are copied and released before this module takes the
//! call-site map's lock; the allocation path takes the call-site lock only
//! after the resource returned. The call-site lock is never held while
//! another lock is taken, so none of these can deadlock.
//!
//! Counting happens in `Runtime` (every allocation and free of a runtime
//! passes through it), so the resources only expose their records
//! (`DeviceMemoryResource::live_blocks`) and their peak reset.

pub mod call_sites;
pub mod counters;
pub mod summary;

use std::sync::Arc;
use std::time::Duration;

pub use call_sites::{tag_c_name, CallSite};
use call_sites::SiteRecords;
use counters::Counters;
pub use counters::TotalCounts;

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
    /// Allocation sequence number in this runtime (1 = its first).
    pub sequence: u64,
    /// Allocations made by the runtime since this one: its age in
    /// allocations.
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

/// The telemetry of one runtime.
pub struct Telemetry {
    counters: Counters,
    sites: Option<SiteRecords>,
}

impl Telemetry {
    pub fn new(track_call_sites: bool) -> Telemetry {
        Telemetry { counters: Counters::default(), sites: track_call_sites.then(SiteRecords::default) }
    }

    pub fn tracks_call_sites(&self) -> bool {
        self.sites.is_some()
    }

    /// `block` was just allocated; `site` is the caller's call site (NONE:
    /// the thread's current one, if any). Only on success.
    #[inline]
    pub fn allocated(&self, block: &DeviceBlock, site: CallSite) {
        self.counters.allocated(block.tag, block.held);
        if let Some(sites) = &self.sites {
            // Every block gets an entry (its age), with or without a site.
            let site = if site.is_none() { CallSite::thread_current() } else { site };
            sites.insert(block.id.generation, site);
        }
    }

    /// `block` (as the resource returned it from the free) was freed.
    #[inline]
    pub fn freed(&self, block: &DeviceBlock) {
        self.counters.freed(block.tag, block.held);
        if let Some(sites) = &self.sites {
            sites.remove(block.id.generation);
        }
    }

    pub fn reset_peak(&self) {
        self.counters.reset_peak();
    }

    pub fn totals(&self) -> TotalCounts {
        self.counters.totals()
    }

    /// Every tag that has allocated, largest live bytes first (ties by
    /// name).
    pub fn tag_stats(&self) -> Vec<TagStats> {
        let mut out: Vec<TagStats> = self
            .counters
            .tags()
            .into_iter()
            .map(|c| TagStats {
                tag: c.tag,
                name: c.tag.name(),
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

    /// The live-block list from the resource's records (oldest first), with
    /// call sites added where tracked. `sequence_now` is the resource's
    /// allocation sequence read before the records.
    pub fn live_blocks(&self, records: Vec<LeakedBlock>, sequence_now: u64) -> Vec<LiveBlock> {
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
                // Blocks allocated after `sequence_now` was read may be in
                // the list too: their age is 0.
                allocations_since: sequence_now.saturating_sub(r.sequence),
                call_site: site.map(|(s, _)| s).filter(|s| !s.is_none()),
                age: site.map(|(_, born)| born.elapsed()),
            })
            .collect();
        out.sort_by_key(|b| b.sequence);
        out
    }
}
