//! `Arena`: xlog's own device memory on CUDA's virtual-memory API, the
//! default memory of the async allocator (DESIGN.md "Physical memory").
//!
//! Contract:
//! - **Regions.** Each stream allocates from address space of its own
//!   (`region.rs`): a reservation the size of the device, more when one
//!   fills up. Blocks are carved best fit from the region's free ranges and
//!   coalesce back into them when freed (`ranges.rs`, with the size
//!   order for best fit in `size_index.rs`), so memory freed in
//!   one shape serves the next shape: sizes that change do not leave
//!   blocks of every size behind. Block sizes are rounded to 512 bytes.
//! - **Hits.** A block whose granules are all mapped already is a hit: no
//!   driver call, no event, no wait (stream order fences the reuse). When
//!   the best fit is not mapped, mapped space at either end of one of the
//!   next smallest fitting ranges is taken instead (`take_mapped`): a
//!   repeating workload then finds the layout it left and maps nothing.
//!   The block a stream freed last waits, parked, at its region's door
//!   (`cell.rs`): an allocation of its size on that stream takes it back
//!   with no lock; anyone who locks the region moves it in first. The
//!   caller counts hits and misses (`Placed::mapped`).
//! - **Two page sizes.** Blocks of `LARGE_BLOCK_PAGES` pages or more
//!   (256 MiB on Hopper) are *large*: they are carved from regions of
//!   their own, mapped in pages of `LARGE_PAGE_PAGES` pages (16 MiB), so a
//!   large block that moves costs an eighth of the driver calls. Pages
//!   are lent and recycled only between regions of their size; a small
//!   block that would map takes mapped room in its stream's large regions
//!   first (a hit), so what large blocks leave serves small ones. Past
//!   the soft cap, idle pages of the other size are released to make room
//!   for new ones, and under pressure a block that cannot get pages of
//!   its size goes to the regions of the other size (`place`), where the
//!   idle pages can be lent to it: the budget and the footprint bound
//!   cover both sizes together.
//! - **Across streams** (`across_streams.rs`): before it maps anything, a
//!   stream takes mapped free space of another stream's region behind a
//!   GPU-side wait, so streams that take turns share their memory; such a
//!   block, freed, joins that region's free ranges at once, the region's
//!   stream made to wait for the freeing stream on the GPU.
//! - **Misses** (`spread_miss.rs`): a small block that must map pages
//!   goes to the region, of any stream, where the fewest of its pages are
//!   missing, behind a GPU-side wait when that region is another
//!   stream's: streams that take turns map a few pages where they would
//!   lend many back and forth, and their blocks share pages as in one
//!   address space.
//! - **Released streams** (`released_streams.rs`): an imported stream's
//!   regions pass, when it is released, to a stream of the arena's own on
//!   which no work runs, so no later call names a stream its owner may have
//!   destroyed; a stream that needs a new region takes over one of those
//!   first.
//! - **Physical pages** (`pages.rs`): the device holds exactly the pages
//!   the arena created and has not released, and the budget is charged a
//!   page's bytes right before `cuMemCreate`. A page is `PAGE_GRANULES`
//!   device granules (2 MiB on Hopper), or a large page. A miss first
//!   takes back the pages it was the old address of, where they are idle
//!   (no driver call: `region.rs`); its other pages come from spare ones,
//!   else (past the live peak plus 1/64, widened up to 1/32 where a layout
//!   lends at its peak) idle pages lent or recycled,
//!   else new ones; trim and pressure give idle pages back.
//! - **Captures.** While a capture is active nothing is unmapped (the
//!   caller says so with `may_unmap`); new pages can still be mapped (the
//!   calls run in relaxed capture mode).
//!
//! Locks: `streams` or `regions` (read; write only to add a region or to
//! pass regions between streams) → one region; `keeper` and `spare`
//! alone. No two region locks are ever held together, and
//! the gate is called with no lock held (a refusal reads every lock's
//! state for its message).

mod across_streams;
mod cell;
mod pages;
mod ranges;
mod region;
mod released_streams;
mod size_index;
mod spread_miss;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use cell::RegionCell;
use pages::Obtained;
use region::{runs, Region};

use super::budget::HeldBytes;
use super::logging::CsvLog;
use crate::device::{Device, PhysHandle, RawEvent, RawStream};
use crate::fast_hash::FastMap;
use crate::resource::{ChargeGate, ResourceError, ResourceResult, StreamRef};

/// Every block's size is a multiple of this (and so is its address).
pub(crate) const BLOCK_ALIGN: u64 = 512;
/// A physical page is this many of the device's mapping granules: one
/// (2 MiB on Hopper), the least the device maps. Driver calls cost per
/// page whatever its size (on an H100, granting access about 33 µs a page
/// and unmapping about 21 µs, for 2 MiB and 16 MiB pages alike; mapping
/// 1-2 µs: BENCHMARKS.md, "eleventh pass"), so pages of two granules, which
/// the arena used until the tenth pass, halve the calls. What they cost
/// was memory at the edges of free ranges, a page partly live on each
/// side, in every stream's regions: an engine on four streams with a live
/// peak of about 50 MiB held 1.27-1.39x it on the GPU (one granule:
/// 1.09-1.15x), and the four-stream W11 pipeline on sim passed 1.10x in
/// 2-4 runs of 24 (one granule: at most 1.076x in four sets of 24). The
/// doubled calls fall on the first steps; a steady state's calls are
/// mostly large pages (below), which keep their size ("tenth pass").
/// Those cost a step its time while it remaps: GPT-2, lending 21 large
/// pages a step, ran 1.070x the caching allocator's step in turns, and
/// 1.019x with a soft cap wide enough to lend none ("eleventh pass"). Since
/// pages lent within a region come back (`region.rs`), its steady state
/// maps none ("twelfth pass").
pub(crate) const PAGE_GRANULES: u64 = 1;
/// Blocks of at least this many pages (256 MiB on Hopper) are *large*:
/// they are carved from regions of their own whose physical pages are
/// `LARGE_PAGE_PAGES` pages each (16 MiB), so mapping, lending or
/// recycling them takes an eighth of the driver calls. Large blocks are
/// where a model at its memory limit moves pages from step to step
/// (GPT-2's logits and their gradients: 84% of the pages it remapped),
/// and small blocks take the mapped room they leave, so the split costs
/// little memory: on the recorded GPT-2 trace 23-29 driver calls a step
/// instead of about 190, at 1.020x its live peak instead of 1.018x
/// (8 MiB: 46 calls, 1.018x; 32 MiB: 11 calls, 1.025x). Smaller
/// thresholds split blocks that a layout shares between sizes (a growing
/// KV cache's 64-128 MiB blocks then hold 1.14x). BENCHMARKS.md, "Physical
/// memory, seventh pass".
pub(crate) const LARGE_BLOCK_PAGES: u64 = 128;
pub(crate) const LARGE_PAGE_PAGES: u64 = 8;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type SharedRegion = Arc<RegionCell>;

/// Each arena's identity, for the per-thread region cache.
static NEXT_ARENA_ID: AtomicU64 = AtomicU64::new(1);

/// The region this thread allocated from last, so a hit (and the free
/// after it) finds its region without the arena's shared maps: the arena,
/// and the region with its address range. It serves the region's stream
/// (`RegionCell::owner`, which changes only when the region passes to
/// another stream). Regions live as long as their arena, and a new arena
/// has a new id, so an entry is never used for another arena's memory.
struct HotRegion {
    arena: u64,
    base: u64,
    len: u64,
    region: SharedRegion,
}

thread_local! {
    static HOT_REGION: std::cell::RefCell<Option<HotRegion>> = const { std::cell::RefCell::new(None) };
}

/// A range carved for a block: its region, address, the range's free
/// sequence (to put it back as it was) and the granules still to map.
type Carved = (SharedRegion, u64, u64, Vec<usize>);


/// Where `Arena::allocate` put a block.
#[derive(Copy, Clone, Debug)]
pub struct Placed {
    pub addr: u64,
    /// Pages were mapped for it (a miss); else it fit in memory already
    /// mapped (a hit). The pool counts both, under its table shard's lock.
    pub mapped: bool,
}

/// What the arena counts, for the pool's `usage`.
#[derive(Copy, Clone, Debug, Default)]
pub struct ArenaUsage {
    /// Bytes of live blocks (rounded).
    pub live: u64,
    pub peak_live: u64,
    /// Pages unmapped from one place and mapped in another.
    pub recycled_pages: u64,
    /// Idle pages mapped a second time where they were needed before their
    /// frees were complete (lending).
    pub lent_pages: u64,
    /// Pages mapped (one driver call each) and unmapped so far.
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
}

pub struct Arena {
    id: u64,
    device: Arc<dyn Device>,
    /// Bytes of one physical page (`PAGE_GRANULES` device granules); a
    /// region's address space is cut in slots of this size ("granules" in
    /// `region.rs`), each mapped to one page or to nothing.
    page_bytes: u64,
    /// Bytes of a large page (`LARGE_PAGE_PAGES` pages), and the size from
    /// which a block is large.
    large_page_bytes: u64,
    large_block_bytes: u64,
    region_bytes: u64,
    wait_on_pressure: bool,
    held: Arc<HeldBytes>,
    /// Each stream's regions with their page size, newest last.
    streams: RwLock<FastMap<RawStream, Vec<(u64, SharedRegion)>>>,
    /// Every region by base address, with its length and page size.
    regions: RwLock<BTreeMap<u64, (u64, u64, SharedRegion)>>,
    /// Physical pages created and not mapped anywhere (charged, held).
    spare: Mutex<Spare>,
    live: AtomicU64,
    peak_live: AtomicU64,
    recycled: AtomicU64,
    lent: AtomicU64,
    /// Bytes of the old addresses of lent pages still mapped.
    lent_now: AtomicU64,
    /// Bytes the soft cap has been widened by (`pages.rs`, `SLACK_DIV`):
    /// pages lent at or near the live peak.
    widened: AtomicU64,
    /// Pages mapped and unmapped so far (the stats' remapping cost).
    mapped: AtomicU64,
    unmapped: AtomicU64,
    /// Other devices that use this memory: every mapping grants them access.
    peers: Mutex<Vec<i32>>,
    /// The runtime's CSV log: `reserve` rows for pages created, `release`
    /// and `retire` rows for pages given back.
    log: Option<Arc<CsvLog>>,
    /// The stream of the regions released streams left
    /// (`released_streams.rs`), created at the first release.
    keeper: Mutex<Option<RawStream>>,
}

#[derive(Default)]
struct Spare {
    pages: Vec<PhysHandle>,
    large: Vec<PhysHandle>,
    events: Vec<RawEvent>,
}

impl Spare {
    /// The spare pages of `page_bytes`: small or large.
    fn of(&mut self, large: bool) -> &mut Vec<PhysHandle> {
        if large {
            &mut self.large
        } else {
            &mut self.pages
        }
    }
}

impl Arena {
    /// An arena on `device`, or `None` where it has no virtual memory
    /// management.
    pub fn new(device: Arc<dyn Device>, held: Arc<HeldBytes>, wait_on_pressure: bool) -> Option<Arena> {
        if !device.supports_vm() {
            return None;
        }
        let page_bytes = device.vm_granularity() * PAGE_GRANULES;
        let large_page_bytes = page_bytes * LARGE_PAGE_PAGES;
        let region_bytes = device.vm_region_bytes().max(large_page_bytes).div_ceil(large_page_bytes) * large_page_bytes;
        Some(Arena {
            id: NEXT_ARENA_ID.fetch_add(1, Ordering::Relaxed),
            device,
            page_bytes,
            large_page_bytes,
            large_block_bytes: page_bytes * LARGE_BLOCK_PAGES,
            region_bytes,
            wait_on_pressure,
            held,
            streams: RwLock::default(),
            regions: RwLock::default(),
            spare: Mutex::default(),
            live: AtomicU64::new(0),
            peak_live: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            lent: AtomicU64::new(0),
            lent_now: AtomicU64::new(0),
            widened: AtomicU64::new(0),
            mapped: AtomicU64::new(0),
            unmapped: AtomicU64::new(0),
            peers: Mutex::default(),
            log: None,
            keeper: Mutex::default(),
        })
    }

    pub fn set_log(&mut self, log: Option<Arc<CsvLog>>) {
        self.log = log;
    }

    /// The bytes a request of `bytes` takes (`None` on overflow).
    pub fn block_bytes(bytes: u64) -> Option<u64> {
        bytes.checked_add(BLOCK_ALIGN - 1).map(|b| b / BLOCK_ALIGN * BLOCK_ALIGN)
    }

    pub fn usage(&self) -> ArenaUsage {
        ArenaUsage {
            live: self.live.load(Ordering::Acquire),
            peak_live: self.peak_live.load(Ordering::Relaxed),
            recycled_pages: self.recycled.load(Ordering::Relaxed),
            lent_pages: self.lent.load(Ordering::Relaxed),
            pages_mapped: self.mapped.load(Ordering::Relaxed),
            pages_unmapped: self.unmapped.load(Ordering::Relaxed),
        }
    }

    pub fn reset_peak(&self) {
        self.peak_live.store(self.live.load(Ordering::Acquire), Ordering::Relaxed);
    }

    /// Whether `ptr` lies in one of the arena's regions.
    pub fn contains(&self, ptr: u64) -> bool {
        self.region_of(ptr).is_some()
    }

    /// The page size of the regions a block of `len` bytes is carved from.
    fn page_for(&self, len: u64) -> u64 {
        if len >= self.large_block_bytes {
            self.large_page_bytes
        } else {
            self.page_bytes
        }
    }

    /// Whether `page_bytes` is the large page.
    fn is_large(&self, page_bytes: u64) -> bool {
        page_bytes != self.page_bytes
    }

    /// The page size other than `page`.
    fn other_page(&self, page: u64) -> u64 {
        if self.is_large(page) {
            self.page_bytes
        } else {
            self.large_page_bytes
        }
    }

    fn region_of(&self, ptr: u64) -> Option<SharedRegion> {
        let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
        let (&base, (len, _, r)) = regions.range(..=ptr).next_back()?;
        (ptr < base + len).then(|| r.clone())
    }

    /// A block of `len` bytes (a multiple of `BLOCK_ALIGN`) on `stream`.
    /// `may_unmap` is false while a capture is active.
    pub fn allocate(&self, len: u64, stream: StreamRef, gate: &dyn ChargeGate, may_unmap: bool) -> ResourceResult<Placed> {
        let (stream_id, stream) = (stream.id.0, stream.raw);
        debug_assert!(len > 0 && len % BLOCK_ALIGN == 0);
        if let Some(addr) = self.hot_hit(stream, len) {
            self.count_live(len);
            return Ok(Placed { addr, mapped: false });
        }
        let page = self.page_for(len);
        let other = self.other_page(page);
        let in_other = || -> ResourceResult<Placed> {
            let placed = self.place(len, other, stream_id, stream, gate, may_unmap, true)?;
            Ok(placed.expect("a block placed as a fallback is placed or refused"))
        };
        match self.place(len, page, stream_id, stream, gate, may_unmap, false) {
            Ok(Some(addr)) => Ok(addr),
            // Past the soft cap with too few idle pages of its size: where
            // idle pages of the other size can be lent to it.
            Ok(None) => in_other(),
            // Under pressure, the same.
            Err(refused @ (ResourceError::OutOfBudget { .. } | ResourceError::OutOfMemory { .. })) if may_unmap => {
                in_other().map_err(|_| refused)
            }
            Err(e) => Err(e),
        }
    }

    /// `allocate` past the hot region: a block of `len` bytes in `stream`'s
    /// regions of `page`-byte pages (or mapped space elsewhere), its
    /// missing pages obtained and mapped. `None` (only when not a
    /// `fallback` already): the block would take the held bytes past the
    /// soft cap, too few idle pages of this size could serve it, and idle
    /// pages of the other size could; nothing changed.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        len: u64,
        page: u64,
        stream_id: u32,
        stream: RawStream,
        gate: &dyn ChargeGate,
        may_unmap: bool,
        fallback: bool,
    ) -> ResourceResult<Option<Placed>> {
        let mut carved = self.carve(stream, len, page, may_unmap);
        let missing_here = carved.as_ref().map_or(usize::MAX, |c| c.3.len());
        if may_unmap && missing_here > 0 {
            // A miss here. What was carved goes back if placed elsewhere.
            let put_back = |carved: Option<Carved>| {
                if let Some((region, addr, freed, _)) = carved {
                    region.lock().unreserve(addr, len, freed);
                }
            };
            // A mapped range of another stream first (across_streams.rs).
            if let Some(addr) = self.take_from_another_stream(stream, len, page) {
                put_back(carved);
                self.count_live(len);
                return Ok(Some(Placed { addr, mapped: false }));
            }
            // A small block: where the fewest of its pages are missing, in
            // any stream's region (spread_miss.rs).
            if !self.is_large(page) {
                if let Some(spread) = self.spread_miss(stream, len, page, missing_here) {
                    put_back(carved.replace(spread));
                }
            }
        }
        let (region, addr, freed, missing) = match carved.take() {
            Some(found) => found,
            None => self.carve_in_new_region(stream, len, page)?,
        };
        let (live, peak_before) = self.count_live(len);
        if missing.is_empty() {
            return Ok(Some(Placed { addr, mapped: false }));
        }
        if !fallback && may_unmap && self.other_size_serves(page, missing.len(), len) {
            region.lock().unreserve(addr, len, freed);
            self.uncount_live(len, live, peak_before);
            return Ok(None);
        }
        let mapped = self.obtain(missing.len(), page, stream, region.base(), gate, may_unmap).and_then(|pages| {
            let (created, sources) = (pages.created, pages.sources);
            self.map_pages(&region, &missing, pages, stream)?;
            if let (Some(log), true) = (&self.log, created > 0) {
                let why = format!("{} of {} pages created: {sources}", created, missing.len());
                log.reserved(region.lock().page_addr(missing[0]), created as u64 * page, stream_id, &why);
            }
            Ok(())
        });
        if let Err(e) = mapped {
            region.lock().unreserve(addr, len, freed);
            self.uncount_live(len, live, peak_before);
            return Err(e);
        }
        // A miss is an allocation the driver's mapping served (a refused
        // one is no allocation: the stats count it as failed, not missed).
        Ok(Some(Placed { addr, mapped: true }))
    }

    /// Undo `count_live` for a block that was not placed after all: its
    /// bytes leave the live total and the peak (unless another allocation
    /// has raised it since).
    fn uncount_live(&self, len: u64, live: u64, peak_before: u64) {
        self.live.fetch_sub(len, Ordering::AcqRel);
        let _ = self.peak_live.compare_exchange(live, peak_before, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// A hit in the region this thread used last for `stream`: the block
    /// parked there if it is of the size (no lock, `cell.rs`), else a
    /// mapped range of `len` bytes under the lock; `None` (nothing
    /// changed) when there is none.
    fn hot_hit(&self, stream: RawStream, len: u64) -> Option<u64> {
        if len >= self.large_block_bytes {
            return None;
        }
        HOT_REGION.with(|hot| {
            let hot = hot.borrow();
            let hot = hot.as_ref().filter(|h| h.arena == self.id && h.region.owner() == stream)?;
            hot.region.take_parked(len).or_else(|| hot.region.lock().take_hit(len).map(|(addr, _)| addr))
        })
    }

    /// Remember `region` (locked as `r`) as the one this thread allocates
    /// from on its stream.
    fn make_hot(&self, region: &SharedRegion, r: &Region) {
        if self.is_large(r.page_bytes) {
            return;
        }
        HOT_REGION.with(|hot| {
            *hot.borrow_mut() = Some(HotRegion { arena: self.id, base: r.base, len: r.len, region: region.clone() });
        });
    }

    /// `len` more live bytes: the live total and the peak before it.
    ///
    /// A block that needs pages is counted here, at its request, before
    /// they are mapped: the live peak (the stats' and the soft cap's) is
    /// the peak of requested bytes, what an allocator that never waits
    /// would see. Counting it once placed was tried: on the GPU, where its
    /// maps take hundreds of microseconds while other threads free, W11's
    /// live peak then read 10-20% lower (BENCHMARKS.md, "ninth pass"); so
    /// the live peak may pass the held peak by what was requested then.
    fn count_live(&self, len: u64) -> (u64, u64) {
        let live = self.live.fetch_add(len, Ordering::AcqRel) + len;
        // A read first: in a steady loop the peak is not passed, and a
        // plain load costs less than a read-modify-write.
        let peak = self.peak_live.load(Ordering::Relaxed);
        if live <= peak {
            return (live, peak);
        }
        (live, self.peak_live.fetch_max(live, Ordering::Relaxed))
    }

    /// The memory of a block freed on `stream`, its allocation stream
    /// (every use of it was made to happen before this point of that
    /// stream); `None`: no work uses it any more (a released capture's).
    pub fn free(&self, ptr: u64, len: u64, stream: Option<RawStream>) {
        // The thread's hot region when it holds `ptr` (no shared map, no
        // reference count), else the arena's map. A free by the region's
        // own stream is parked there when the slot is empty (no lock).
        let freed_hot = HOT_REGION.with(|hot| match hot.borrow().as_ref() {
            Some(h) if h.arena == self.id && ptr >= h.base && ptr < h.base + h.len => {
                if stream != Some(h.region.owner()) || !h.region.park(ptr, len) {
                    self.free_in(&mut h.region.lock(), ptr, len, stream);
                }
                true
            }
            _ => false,
        });
        if !freed_hot {
            let region = self.region_of(ptr).expect("an arena block's region outlives the block");
            self.free_in(&mut region.lock(), ptr, len, stream);
        }
        self.live.fetch_sub(len, Ordering::AcqRel);
    }

    /// `free`'s work in the block's region `r`.
    fn free_in(&self, r: &mut Region, ptr: u64, len: u64, stream: Option<RawStream>) {
        match stream.filter(|&s| s != r.stream) {
            None => r.release(ptr, len),
            Some(other) => self.free_foreign(r, ptr, len, other),
        }
    }

    /// A fitting free range in one of `stream`'s regions of `page`-byte
    /// pages: the region, the address, the range's free sequence, and the
    /// granules to map.
    fn carve(&self, stream: RawStream, len: u64, page: u64, may_unmap: bool) -> Option<Carved> {
        let streams = self.streams.read().unwrap_or_else(|p| p.into_inner());
        let all = streams.get(&stream)?;
        let regions = || all.iter().filter(move |(p, _)| *p == page).map(|(_, r)| r);
        // A hit first: a recent free of the size, the best fit if it is
        // mapped, else mapped space in another fitting range.
        for region in regions() {
            let mut r = region.lock();
            if let Some((addr, freed)) = r.take_hit(len) {
                self.make_hot(region, &r);
                return Some((region.clone(), addr, freed, Vec::new()));
            }
        }
        // A small block takes mapped room the large blocks left (so a
        // layout with large pages holds what one without them would).
        if !self.is_large(page) {
            for (_, region) in all.iter().filter(|(p, _)| self.is_large(*p)) {
                let mut r = region.lock();
                r.settle_recent();
                if let Some((addr, freed)) = r.take_mapped(len) {
                    return Some((region.clone(), addr, freed, Vec::new()));
                }
            }
        }
        // Then with the recent frees merged (they may coalesce into room):
        // the best fit, mapped or not.
        for region in regions() {
            let mut r = region.lock();
            r.settle_recent();
            if let Some((addr, freed)) = r.take_mapped(len) {
                self.make_hot(region, &r);
                return Some((region.clone(), addr, freed, Vec::new()));
            }
            if !r.lent.is_empty() {
                // Which old addresses of lent pages the GPU is done with:
                // only those may be unmapped for this block.
                self.learn_completed(&mut r);
            }
            if let Some((addr, freed, missing, in_use)) = r.take_moving_back(len, !may_unmap) {
                if !self.unmap_old_addresses(&mut r, &in_use) {
                    r.unreserve(addr, len, freed);
                    continue;
                }
                self.make_hot(region, &r);
                return Some((region.clone(), addr, freed, missing));
            }
        }
        None
    }

    /// Unmap the old addresses `pages` of lent pages in use elsewhere, so
    /// the block carved over them can map pages there (one call per run):
    /// only addresses whose frees are complete (`take_moving_back`).
    /// Whether all were unmapped.
    fn unmap_old_addresses(&self, r: &mut Region, pages: &[usize]) -> bool {
        for (first, n) in runs(pages) {
            if !self.unmap_old_run(r, first, n) {
                return false;
            }
            (first..first + n).for_each(|p| r.forget_lent(p));
        }
        true
    }

    fn carve_in_new_region(&self, stream: RawStream, len: u64, page: u64) -> ResourceResult<Carved> {
        if let Some(carved) = self.take_over_released(stream, len, page) {
            self.make_hot(&carved.0, &carved.0.lock());
            return Ok(carved);
        }
        let bytes = len
            .checked_add(page - 1)
            .map(|b| b / page * page)
            .map(|b| b.max(self.region_bytes))
            .ok_or_else(|| ResourceError::OutOfMemory { requested: len, detail: "the request is larger than any device can hold".into() })?;
        let base = self.device.vm_reserve(bytes)?;
        let mut region = Region::new(stream, base, bytes, page);
        let (addr, freed) = region.free.take(len).expect("a new region fits its first block");
        let missing = region.unmapped_in(addr, len);
        let region = Arc::new(RegionCell::new(region));
        self.make_hot(&region, &region.lock());
        self.regions.write().unwrap_or_else(|p| p.into_inner()).insert(base, (bytes, page, region.clone()));
        self.streams.write().unwrap_or_else(|p| p.into_inner()).entry(stream).or_default().push((page, region.clone()));
        Ok((region, addr, freed, missing))
    }

    /// Map the pages obtained for `stream` at the granules `pages` of
    /// `region` (those another thread has not mapped meanwhile) and grant
    /// access; pages left over, or not mapped because of an error, go to
    /// the spare list (`spare_fenced`: lent ones after `stream`, the one
    /// ordered after their old frees, which is not the region's stream
    /// when a miss went to another stream's region, spread_miss.rs).
    fn map_pages(&self, region: &RegionCell, pages: &[usize], obtained: Obtained, stream: RawStream) -> ResourceResult<()> {
        let mut r = region.lock();
        let (page_bytes, large) = (r.page_bytes, self.is_large(r.page_bytes));
        let fenced_on = obtained.lent.then_some(stream);
        let mut handles = obtained.handles.into_iter();
        let mut newly = Vec::with_capacity(pages.len());
        let mut unused = Vec::new();
        let mut result = Ok(());
        for &page in pages {
            if r.is_mapped(page) {
                continue;
            }
            let handle = handles.next().expect("one handle per missing page");
            if let Err(e) = self.device.vm_map(r.page_addr(page), page_bytes, handle) {
                unused.push(handle);
                result = Err(e.into());
                break;
            }
            r.install(page, handle);
            newly.push(page);
        }
        unused.extend(handles);
        self.mapped.fetch_add(newly.len() as u64, Ordering::Relaxed);
        let peers = lock(&self.peers).clone();
        let ordinal = self.device.ordinal();
        for (first, count) in runs(&newly) {
            let (va, bytes) = (r.page_addr(first), count as u64 * page_bytes);
            let granted =
                std::iter::once(&ordinal).chain(peers.iter()).try_for_each(|&device| self.device.vm_set_access(va, bytes, device));
            if let Err(e) = granted {
                result = result.and(Err(e.into()));
                // A page mapped without access would fault under the next
                // block placed on it: unmapped again, and spare. (Should
                // even the unmap fail, the pages stay mapped here.)
                if let Some(pages) = self.unmap_run(&mut r, first, count) {
                    unused.extend(pages);
                }
            }
        }
        drop(r);
        self.spare_fenced(unused, large, fenced_on);
        result
    }

    /// Unmap the `n` granules of `r` from `first` (one driver call) and take
    /// their pages out of its page table: the pages, or `None` when the
    /// unmap failed (they stay mapped and installed).
    fn unmap_run(&self, r: &mut Region, first: usize, n: usize) -> Option<Vec<PhysHandle>> {
        self.device.vm_unmap(r.page_addr(first), n as u64 * r.page_bytes).ok()?;
        self.unmapped.fetch_add(n as u64, Ordering::Relaxed);
        Some((first..first + n).map(|p| r.uninstall(p)).collect())
    }

    fn every_region(&self) -> Vec<SharedRegion> {
        self.regions.read().unwrap_or_else(|p| p.into_inner()).values().map(|(_, _, r)| r.clone()).collect()
    }

    /// The regions of `page`-byte pages, in address order, found without
    /// their locks (another thread may hold one for its driver calls).
    fn regions_of(&self, page: u64) -> Vec<SharedRegion> {
        let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
        regions.values().filter(|(_, p, _)| *p == page).map(|(_, _, r)| r.clone()).collect()
    }

    /// Let device `ordinal` use every mapping, present and future.
    pub fn grant_peer(&self, ordinal: i32) -> ResourceResult<()> {
        {
            let mut peers = lock(&self.peers);
            if peers.contains(&ordinal) {
                return Ok(());
            }
            peers.push(ordinal);
        }
        for region in self.every_region() {
            let r = region.lock();
            // The old addresses of lent pages too: still mapped, and a
            // page lent within its region may come back to one.
            let mut pages = r.mapped_pages();
            pages.extend(r.lent.iter().map(|l| l.page));
            pages.sort_unstable();
            for (first, n) in runs(&pages) {
                self.device.vm_set_access(r.page_addr(first), n as u64 * r.page_bytes, ordinal)?;
            }
        }
        Ok(())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // Close waited for every stream; unmap and release everything.
        let regions = std::mem::take(&mut *self.regions.write().unwrap_or_else(|p| p.into_inner()));
        let mut released = 0;
        for (_, (_, _, region)) in regions.iter() {
            let mut r = region.lock();
            let lent: Vec<usize> = r.lent.drain(..).map(|l| l.page).collect();
            for page in lent {
                let _ = self.device.vm_unmap(r.page_addr(page), r.page_bytes);
            }
        }
        for (_, (_, _, region)) in regions {
            let mut r = region.lock();
            for (first, n) in runs(&r.mapped_pages()) {
                if self.device.vm_unmap(r.page_addr(first), n as u64 * r.page_bytes).is_ok() {
                    for p in first..first + n {
                        let handle = r.uninstall(p);
                        if self.device.vm_release(handle).is_ok() {
                            released += r.page_bytes;
                        }
                    }
                }
            }
            let _ = self.device.vm_free(r.base, r.len);
            for (event, _) in r.seals.drain(..) {
                self.device.destroy_event(event);
            }
        }
        let spare = std::mem::take(&mut *lock(&self.spare));
        let pages = spare.pages.into_iter().map(|h| (h, self.page_bytes));
        for (handle, bytes) in pages.chain(spare.large.into_iter().map(|h| (h, self.large_page_bytes))) {
            if self.device.vm_release(handle).is_ok() {
                released += bytes;
            }
        }
        for event in spare.events {
            self.device.destroy_event(event);
        }
        self.held.sub(released.min(self.held.now()));
        self.destroy_keeper();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{Claim, SimDevice};
    use crate::ids::StreamId;
    use crate::resource::NoCharge;
    use std::collections::HashSet;

    const MIB: u64 = 1 << 20;

    impl Arena {
        /// No physical page is installed at two granules (two live blocks
        /// could then share memory), none installed is also spare, and the
        /// old address of a page lent within its region is free.
        fn audit(&self) {
            let mut installed = HashSet::new();
            for region in self.every_region() {
                let r = region.lock();
                for p in r.mapped_pages() {
                    let h = r.handle_at(p).unwrap();
                    assert!(installed.insert(h), "page {h} installed twice (granule {p} of region {:#x})", r.base);
                }
                for l in r.lent.iter().filter(|l| l.free) {
                    assert!(r.free.covering(r.page_addr(l.page), r.page_bytes).is_some(), "lent granule {} not free", l.page);
                }
            }
            let spare = lock(&self.spare);
            assert!(spare.pages.iter().chain(&spare.large).all(|h| !installed.contains(h)), "a spare page is installed");
        }
    }

    /// One step of GPT-2's large blocks (the logits and their gradients,
    /// MiB): freed in the middle, a 392 MiB hole stays between live
    /// 785 MiB blocks at the step's peak, more than the soft cap allows.
    fn step(arena: &Arena, s: StreamRef) {
        let alloc = |mib: u64| arena.allocate(mib * MIB, s, &NoCharge, true).unwrap().addr;
        let free = |addr: u64, mib: u64| arena.free(addr, mib * MIB, Some(s.raw));
        let a = alloc(392);
        let l1 = alloc(785);
        let l2 = alloc(785);
        free(l1, 785);
        free(a, 392);
        let l3 = alloc(785);
        let l4 = alloc(785);
        arena.audit();
        free(l3, 785);
        free(l2, 785);
        let a2 = alloc(392);
        free(l4, 785);
        free(a2, 392);
    }

    /// A xorshift sequence from `seed`: each call, a number below `n`.
    pub(super) fn below(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// An arena on a sim device (16 GiB) and one stream of it.
    pub(super) fn sim_arena() -> (Arc<SimDevice>, Arena, StreamRef) {
        let sim = SimDevice::new(0, 16 << 30).unwrap();
        let raw = sim.create_stream().unwrap();
        let device: Arc<dyn Device> = sim.clone();
        let arena = Arena::new(device, Arc::new(HeldBytes::new(None)), false).unwrap();
        (sim, arena, StreamRef { id: StreamId(1), raw })
    }

    #[test]
    fn pages_lent_within_a_region_come_back_so_a_repeating_layout_settles() {
        let (sim, arena, s) = sim_arena();
        let mut maps = Vec::new();
        for _ in 0..12 {
            let before = arena.usage().pages_mapped;
            step(&arena, s);
            sim.synchronize_stream(s.raw).unwrap();
            arena.audit();
            maps.push(arena.usage().pages_mapped - before);
        }
        let u = arena.usage();
        assert!(u.lent_pages > 0, "the soft cap made it lend: {maps:?}");
        assert_eq!(maps[6..], [0; 6], "pages mapped per step: {maps:?}");
        let held = arena.held.peak() as f64 / u.peak_live as f64;
        assert!(held <= 1.04, "held {held:.3}x the live peak");
    }

    /// How a random walk of allocations and frees goes (`random_walk`).
    struct Walk {
        seed: u64,
        max_live: usize,
        /// A block's size from the walk's random numbers.
        len: fn(&mut dyn FnMut(u64) -> u64) -> u64,
        /// 1 in this many calls, the GPU catches up; 1 in `trim_every`,
        /// a trim to nothing.
        sync_every: u64,
        trim_every: u64,
    }

    /// Hold `raw`: what is queued after this waits until the sender is
    /// dropped, or 50 ms have passed (so a wait inside the arena cannot
    /// deadlock).
    fn hold(sim: &SimDevice, raw: RawStream) -> std::sync::mpsc::Sender<()> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        sim.enqueue_host(raw, Box::new(move || {
            let _ = rx.recv_timeout(std::time::Duration::from_millis(50));
        }))
        .unwrap();
        tx
    }

    /// 3000 allocations and frees on one stream in a random order as
    /// `walk` says; after every call no page is installed at two addresses
    /// and what the arena holds is exactly what the device holds. `after`
    /// sees the arena after each call. The blocks left live.
    fn random_walk(sim: &SimDevice, arena: &Arena, s: StreamRef, walk: Walk, mut after: impl FnMut(&Arena)) -> Vec<(u64, u64)> {
        let mut next = below(walk.seed);
        let mut live: Vec<(u64, u64)> = Vec::new();
        // The GPU holds the stream between catch-ups (so frees stay
        // incomplete), and each block's use is checked in stream order:
        // mapped, and its physical bytes no other block's meanwhile
        // (`SimDevice::access_check`).
        let check = |addr: u64, len: u64, claim: Claim| {
            sim.enqueue_host(s.raw, sim.access_check(addr, len, claim)).unwrap();
        };
        let mut gate = Some(hold(sim, s.raw));
        for i in 0..3000 {
            if live.len() < walk.max_live && (live.is_empty() || next(3) > 0) {
                let len = (walk.len)(&mut next);
                let placed = arena.allocate(len, s, &NoCharge, true).unwrap();
                check(placed.addr, len, Claim::Take);
                live.push((placed.addr, len));
            } else {
                let (addr, len) = live.swap_remove(next(live.len() as u64) as usize);
                check(addr, len, Claim::Give);
                arena.free(addr, len, Some(s.raw));
            }
            if next(walk.sync_every) == 0 {
                drop(gate.take());
                sim.synchronize_stream(s.raw).unwrap();
                gate = Some(hold(sim, s.raw));
            }
            if next(walk.trim_every) == 0 {
                arena.trim(0, true);
            }
            arena.audit();
            assert_eq!(arena.held.now(), sim.physical_bytes(), "call {i}: held vs the device");
            after(arena);
        }
        drop(gate);
        sim.synchronize_stream(s.raw).unwrap();
        let (faults, first) = sim.touch_faults();
        assert_eq!(faults, 0, "a block was used where nothing was mapped, or shared physical memory: {first:?}");
        live
    }

    #[test]
    fn random_blocks_of_any_size_are_never_unmapped_under_work_still_queued() {
        // Sizes from 512 bytes to 256 MiB, up to 40 live, the stream held
        // between catch-ups: every block's use, checked in stream order,
        // finds it mapped and its physical bytes its own.
        let (sim, arena, s) = sim_arena();
        let len: fn(&mut dyn FnMut(u64) -> u64) -> u64 = |next| (1 + next(1 << 19)) * 512;
        let walk = Walk { seed: 0x1234_5679, max_live: 40, len, sync_every: 9, trim_every: 500 };
        random_walk(&sim, &arena, s, walk, |_| {});
        let u = arena.usage();
        assert!(u.lent_pages > 0, "pages were lent while frees ran: {u:?}");
    }

    #[test]
    fn streams_that_take_turns_never_use_memory_another_stream_still_runs_on() {
        // Three streams, each held behind the host between catch-ups, take
        // each other's mapped space and pages (behind GPU-side waits) and
        // lend and recycle them: every block's use, checked in its stream's
        // order, finds it mapped and its physical bytes its own.
        let (sim, arena, first) = sim_arena();
        let mut streams = vec![first];
        for id in 2..=3 {
            streams.push(StreamRef { id: StreamId(id), raw: sim.create_stream().unwrap() });
        }
        let check = |s: StreamRef, addr: u64, len: u64, claim: Claim| {
            sim.enqueue_host(s.raw, sim.access_check(addr, len, claim)).unwrap();
        };
        let mut gates: Vec<_> = streams.iter().map(|s| Some(hold(&sim, s.raw))).collect();
        let mut next = below(0x5151_7e57);
        let mut live: Vec<(u64, u64, StreamRef)> = Vec::new();
        for i in 0..1000 {
            if live.len() < 24 && (live.is_empty() || next(3) > 0) {
                let s = streams[next(3) as usize];
                let len = (1 + next(1 << 17)) * 512;
                let placed = arena.allocate(len, s, &NoCharge, true).unwrap();
                check(s, placed.addr, len, Claim::Take);
                live.push((placed.addr, len, s));
            } else {
                let (addr, len, s) = live.swap_remove(next(live.len() as u64) as usize);
                check(s, addr, len, Claim::Give);
                arena.free(addr, len, Some(s.raw));
            }
            let k = next(8) as usize;
            if k < 3 {
                drop(gates[k].take());
                sim.synchronize_stream(streams[k].raw).unwrap();
                gates[k] = Some(hold(&sim, streams[k].raw));
            }
            arena.audit();
            assert_eq!(arena.held.now(), sim.physical_bytes(), "call {i}: held vs the device");
        }
        drop(gates);
        for s in &streams {
            sim.synchronize_stream(s.raw).unwrap();
        }
        let (faults, first) = sim.touch_faults();
        assert_eq!(faults, 0, "a block was used where nothing was mapped, or shared physical memory: {first:?}");
        let u = arena.usage();
        assert!(u.lent_pages > 0, "pages were lent: {u:?}");
    }

    #[test]
    fn random_large_blocks_never_share_a_page_while_pages_move_back() {
        // Blocks of 256 MiB to 1 GiB (large pages), the GPU lagging or
        // caught up at random, a trim now and then: pages are lent, moved
        // back, their old addresses unmapped.
        let (sim, arena, s) = sim_arena();
        let walk = Walk { seed: 0x9e37_79b9_7f4a_7c15, max_live: 8, len: |next| (256 + next(769)) * MIB, sync_every: 5, trim_every: 200 };
        let mut moved_back_runs = 0;
        random_walk(&sim, &arena, s, walk, |arena| {
            let lent_here = arena.every_region().iter().any(|r| r.lock().lent.iter().any(|l| l.free));
            moved_back_runs += usize::from(lent_here);
        });
        assert!(moved_back_runs > 0, "pages were lent within the region");
        assert!(arena.usage().lent_pages > 0);
    }

    #[test]
    fn small_pages_lent_earlier_are_released_when_large_ones_are_needed() {
        // A's pages are lent to C (past the soft cap), C is freed and its
        // frees complete: the pages are idle at C's place and their old
        // addresses at A's still map them. A large block then needs pages
        // past the cap: the small idle pages are recycled to make room,
        // and their old addresses must go too, or they stay spare (held,
        // charged, serving nothing) beside the new large pages.
        let (sim, arena, s) = sim_arena();
        let alloc = |mib: u64| arena.allocate(mib * MIB, s, &NoCharge, true).unwrap().addr;
        let free = |addr: u64, mib: u64| arena.free(addr, mib * MIB, Some(s.raw));
        let a = alloc(64);
        let b = alloc(32);
        free(a, 64);
        let c = alloc(96);
        assert!(arena.usage().lent_pages >= 32, "A's pages were lent to C: {:?}", arena.usage());
        free(c, 96);
        free(b, 32);
        sim.synchronize_stream(s.raw).unwrap();
        let large = alloc(256);
        arena.audit();
        assert_eq!(arena.held.now(), 256 * MIB, "only the large block's pages are held");
        assert_eq!(sim.physical_bytes(), arena.held.now());
        assert!(lock(&arena.spare).pages.is_empty(), "no small page is left spare");
        free(large, 256);
    }

    #[test]
    fn random_blocks_of_both_page_sizes_keep_the_held_bytes_those_of_the_device() {
        // Small (1-64 MiB) and large (256-640 MiB) blocks: pages are lent,
        // recycled, released for the other size and their old addresses
        // unmapped; a trim to nothing at the end leaves nothing.
        let (sim, arena, s) = sim_arena();
        let len: fn(&mut dyn FnMut(u64) -> u64) -> u64 =
            |next| if next(4) == 0 { (256 + next(385)) * MIB } else { (1 + next(64)) * MIB };
        let walk = Walk { seed: 0x2545_f491_4f6c_dd1d, max_live: 10, len, sync_every: 4, trim_every: 300 };
        let live = random_walk(&sim, &arena, s, walk, |_| {});
        let u = arena.usage();
        assert!(u.lent_pages > 0 && u.recycled_pages > 0, "pages were lent and recycled: {u:?}");
        for (addr, len) in live {
            arena.free(addr, len, Some(s.raw));
        }
        arena.trim(0, true);
        assert_eq!((arena.held.now(), sim.physical_bytes()), (0, 0), "a trim to nothing leaves nothing");
    }

    #[test]
    fn a_peer_granted_while_pages_are_lent_reaches_their_old_addresses() {
        let (sim, arena, s) = sim_arena();
        // Every address the arena maps, installed or the old address of a
        // lent page (where the page may come back), is the peer's too.
        let check = |when: &str| {
            let mut lent = 0;
            for region in arena.every_region() {
                let r = region.lock();
                lent += r.lent.len();
                for p in r.mapped_pages().into_iter().chain(r.lent.iter().map(|l| l.page)) {
                    assert_eq!(sim.access_of(r.page_addr(p)), vec![0, 1], "{when}: granule {p} of region {:#x}", r.base);
                }
            }
            lent
        };
        for _ in 0..2 {
            step(&arena, s);
        }
        arena.grant_peer(1).unwrap();
        assert!(check("granted") > 0, "old addresses of lent pages existed when the peer came");
        for i in 0..4 {
            step(&arena, s);
            check(&format!("step {i} after"));
        }
    }
}
