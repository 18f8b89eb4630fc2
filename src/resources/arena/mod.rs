//! `Arena`: xlog's own device memory on CUDA's virtual-memory API, the
//! default memory of the async allocator (DESIGN.md "Physical memory").
//!
//! Contract:
//! - **Regions.** Each stream allocates from address space of its own
//!   (`region.rs`): a reservation the size of the device, more when one
//!   fills up. Blocks are carved best fit from the region's free ranges and
//!   coalesce back into them when freed (`ranges.rs`), so memory freed in
//!   one shape serves the next shape: sizes that change do not leave
//!   blocks of every size behind. Block sizes are rounded to 512 bytes.
//! - **Hits.** A block whose granules are all mapped already is a hit: no
//!   driver call, no event, no wait (stream order fences the reuse). When
//!   the best fit is not mapped, mapped space at either end of one of the
//!   next smallest fitting ranges is taken instead (`take_mapped`): a
//!   repeating workload then finds the layout it left and maps nothing.
//! - **Across streams.** Before it maps anything, a stream takes a mapped
//!   free range of another stream's region, made to wait on the GPU for
//!   that stream's work (one event record and one stream wait, never a
//!   host wait). Freed, the block goes back to that region once an event
//!   recorded at the free has completed (`region.rs`, foreign frees), so
//!   streams that take turns share their memory without unmapping it.
//! - **Physical pages.** The device holds exactly the pages the arena
//!   created and has not released: `held` is their bytes, and the budget
//!   (the `ChargeGate`) is charged a page's bytes right before `cuMemCreate`
//!   and uncharged when it is released. Nothing else xlog does on this
//!   path holds device memory, so the charge is the device's number.
//! - **Pages.** A physical page is `PAGE_GRANULES` of the device's mapping
//!   granules (4 MiB on Hopper): each driver call costs per page, not per
//!   byte, so the page is as large as the footprint bound allows.
//! - **Lending.** A page no live block overlaps is idle. Before the arena
//!   creates a page while it holds more than its live peak plus 1/64 (at
//!   least one page), and before any refusal, it *lends* idle pages,
//!   longest idle first: each is mapped a second time where it is needed
//!   (GMLake's stitching, in page units), while its old address stays
//!   mapped and out of use (`region.rs`). The new block's work is ordered
//!   after the frees that made the page idle by the stream itself (the
//!   page's region is the stream's own) or by a GPU-side wait on an event
//!   of the page's stream: no host wait, even while the GPU still runs
//!   those frees, and no unmap (about 16 µs of host time a page). So
//!   what the call frees serves the call. Old addresses are unmapped in
//!   batches once their frees are known complete (a completed event, or
//!   `cuStreamQuery` finding the stream idle) and they outnumber the
//!   pages held, or on trim and close; a page is never released while an
//!   old address still maps it.
//! - **Recycling** (unmap an idle page whose frees are complete, map it
//!   where it is needed) is what is left when lending finds nothing (a
//!   fence that fails). With `wait_on_pressure`, a refusal first
//!   synchronises the streams whose idle pages are still in use.
//! - **Captures.** While a capture is active nothing is unmapped (the
//!   caller says so with `may_unmap`); new pages can still be mapped (the
//!   calls run in relaxed capture mode).
//! - **Trim** releases idle pages (synchronising their streams) until at
//!   most `keep` bytes are held beyond the live blocks; close releases
//!   everything.
//!
//! Locks: `streams` or `regions` (read, write only to add a region) → one
//! region; `spare` alone. No two region locks are ever held together, and
//! the gate is called with no lock held (a refusal reads every lock's
//! state for its message).

mod ranges;
mod region;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use region::{runs, Region};

use super::budget::HeldBytes;
use super::logging::CsvLog;
use crate::device::{Device, PhysHandle, RawEvent, RawStream};
use crate::fast_hash::FastMap;
use crate::resource::{ChargeGate, ResourceError, ResourceResult, StreamRef};

/// Every block's size is a multiple of this (and so is its address).
pub(crate) const BLOCK_ALIGN: u64 = 512;
/// A physical page is this many of the device's mapping granules (2 MiB on
/// Hopper): 4 MiB. Every driver call on a page (`cuMemCreate`, `cuMemMap`,
/// `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`) costs about the same
/// whatever its size, up to hundreds of MiB (measured on an H100: about
/// 26 µs to map and grant a page, 16 µs to unmap it, 10 µs each to
/// create and release it). Two granules halve the calls any remapping
/// needs, at the price of at most one more granule held at the edges of
/// the free ranges: every recorded trace stays within 1.09x its live peak
/// on sim (four granules would not: the four-stream W11 trace holds 1.15x).
/// BENCHMARKS.md, "Physical memory, fourth pass".
pub(crate) const PAGE_GRANULES: u64 = 2;
/// Held bytes may pass the live peak by 1/`SLACK_DIV` (at least
/// `MIN_SLACK_PAGES` page) before idle pages are lent (or recycled)
/// instead of new ones created. A cap tighter than a workload's
/// fragmentation at page grain never lets its layout settle: each step
/// lends the pages of a block freed earlier, that block's old place is
/// then out of use, it lands somewhere new next step and lends again. The
/// ResNet-50 step at 1/256 still mapped 13 pages a step after 80 repeats
/// and crept to 1.044x its live peak (1.034x on the GPU after 13 steps); at
/// 1/64 it maps none from the second repeat, at 1.012x (0.995x expandable
/// segments' device peak on the GPU). BENCHMARKS.md, "Physical memory,
/// fifth pass".
const SLACK_DIV: u64 = 64;
const MIN_SLACK_PAGES: u64 = 1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type SharedRegion = Arc<Mutex<Region>>;

/// Each arena's identity, for the per-thread region cache.
static NEXT_ARENA_ID: AtomicU64 = AtomicU64::new(1);

/// The region this thread allocated from last, so a hit (and the free
/// after it) finds its region without the arena's shared maps: the arena,
/// the stream, and the region with its address range. Regions live as long
/// as their arena, and a new arena has a new id, so an entry is never
/// used for another arena's memory.
struct HotRegion {
    arena: u64,
    stream: RawStream,
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

/// How sure recycling must be that an idle page's frees are complete.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Completion {
    /// Completed events and idle streams only: never a host wait.
    Query,
    /// Synchronise the stream when that is what it takes (trim, and a
    /// refusal with `wait_on_pressure`).
    Wait,
}

/// What the arena counts, for the pool's `usage`.
#[derive(Copy, Clone, Debug, Default)]
pub struct ArenaUsage {
    /// Bytes of live blocks (rounded).
    pub live: u64,
    pub peak_live: u64,
    pub hits: u64,
    pub misses: u64,
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
    region_bytes: u64,
    wait_on_pressure: bool,
    held: Arc<HeldBytes>,
    /// Each stream's regions, newest last.
    streams: RwLock<FastMap<RawStream, Vec<Arc<Mutex<Region>>>>>,
    /// Every region by base address, with its length.
    regions: RwLock<BTreeMap<u64, (u64, SharedRegion)>>,
    /// Physical pages created and not mapped anywhere (charged, held).
    spare: Mutex<Spare>,
    live: AtomicU64,
    peak_live: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    recycled: AtomicU64,
    lent: AtomicU64,
    /// Old addresses of lent pages still mapped.
    lent_now: AtomicU64,
    /// Pages mapped and unmapped so far (the stats' remapping cost).
    mapped: AtomicU64,
    unmapped: AtomicU64,
    /// Other devices that use this memory: every mapping grants them access.
    peers: Mutex<Vec<i32>>,
    /// The runtime's CSV log: `reserve` rows for pages created, `release`
    /// and `retire` rows for pages given back.
    log: Option<Arc<CsvLog>>,
}

#[derive(Default)]
struct Spare {
    pages: Vec<PhysHandle>,
    events: Vec<RawEvent>,
}

impl Arena {
    /// An arena on `device`, or `None` where it has no virtual memory
    /// management.
    pub fn new(device: Arc<dyn Device>, held: Arc<HeldBytes>, wait_on_pressure: bool) -> Option<Arena> {
        if !device.supports_vm() {
            return None;
        }
        let page_bytes = device.vm_granularity() * PAGE_GRANULES;
        let region_bytes = device.vm_region_bytes().max(page_bytes).div_ceil(page_bytes) * page_bytes;
        Some(Arena {
            id: NEXT_ARENA_ID.fetch_add(1, Ordering::Relaxed),
            device,
            page_bytes,
            region_bytes,
            wait_on_pressure,
            held,
            streams: RwLock::default(),
            regions: RwLock::default(),
            spare: Mutex::default(),
            live: AtomicU64::new(0),
            peak_live: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            lent: AtomicU64::new(0),
            lent_now: AtomicU64::new(0),
            mapped: AtomicU64::new(0),
            unmapped: AtomicU64::new(0),
            peers: Mutex::default(),
            log: None,
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
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
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

    fn region_of(&self, ptr: u64) -> Option<Arc<Mutex<Region>>> {
        let regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
        let (&base, (len, r)) = regions.range(..=ptr).next_back()?;
        (ptr < base + len).then(|| r.clone())
    }

    /// A block of `len` bytes (a multiple of `BLOCK_ALIGN`) on `stream`:
    /// its address. `may_unmap` is false while a capture is active.
    pub fn allocate(&self, len: u64, stream: StreamRef, gate: &dyn ChargeGate, may_unmap: bool) -> ResourceResult<u64> {
        let (stream_id, stream) = (stream.id.0, stream.raw);
        debug_assert!(len > 0 && len % BLOCK_ALIGN == 0);
        if let Some(addr) = self.hot_hit(stream, len) {
            self.count_live(len);
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(addr);
        }
        let mut carved = self.carve(stream, len);
        if may_unmap && carved.as_ref().map_or(true, |c| !c.3.is_empty()) {
            // A miss here: a mapped range of another stream first.
            if let Some(addr) = self.take_from_another_stream(stream, len) {
                if let Some((region, addr, freed, _)) = carved {
                    lock(&region).unreserve(addr, len, freed);
                }
                self.count_live(len);
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(addr);
            }
        }
        let (region, addr, freed, missing) = match carved.take() {
            Some(found) => found,
            None => self.carve_in_new_region(stream, len)?,
        };
        let (live, peak_before) = self.count_live(len);
        if missing.is_empty() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(addr);
        }
        let mapped = self.obtain(missing.len(), stream, gate, may_unmap).and_then(|(handles, created)| {
            self.map_pages(&region, &missing, handles)?;
            if let (Some(log), true) = (&self.log, created > 0) {
                log.reserved(lock(&region).page_addr(missing[0]), created as u64 * self.page_bytes, stream_id);
            }
            Ok(())
        });
        if let Err(e) = mapped {
            lock(&region).unreserve(addr, len, freed);
            self.live.fetch_sub(len, Ordering::AcqRel);
            // A refused block was never live: its bytes leave the peak
            // (unless another allocation has raised it since).
            let _ = self.peak_live.compare_exchange(live, peak_before, Ordering::Relaxed, Ordering::Relaxed);
            return Err(e);
        }
        // A miss is an allocation the driver's mapping served (a refused
        // one is no allocation: the stats count it as failed, not missed).
        self.misses.fetch_add(1, Ordering::Relaxed);
        Ok(addr)
    }

    /// A hit in the region this thread used last for `stream`: a mapped
    /// range of `len` bytes, or `None` (nothing changed).
    fn hot_hit(&self, stream: RawStream, len: u64) -> Option<u64> {
        HOT_REGION.with(|hot| {
            let hot = hot.borrow();
            let hot = hot.as_ref().filter(|h| h.arena == self.id && h.stream == stream)?;
            let mut r = lock(&hot.region);
            let (addr, freed) = r.take(len)?;
            if r.all_mapped(addr, len) {
                return Some(addr);
            }
            r.unreserve(addr, len, freed);
            None
        })
    }

    /// Remember `region` (locked as `r`) as the one this thread allocates
    /// from on `stream`.
    fn make_hot(&self, stream: RawStream, region: &SharedRegion, r: &Region) {
        HOT_REGION.with(|hot| {
            *hot.borrow_mut() = Some(HotRegion { arena: self.id, stream, base: r.base, len: r.len, region: region.clone() });
        });
    }

    /// `len` more live bytes: the live total and the peak before it.
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
        // reference count), else the arena's map.
        let freed_hot = HOT_REGION.with(|hot| match hot.borrow().as_ref() {
            Some(h) if h.arena == self.id && ptr >= h.base && ptr < h.base + h.len => {
                self.free_in(&mut lock(&h.region), ptr, len, stream);
                true
            }
            _ => false,
        });
        if !freed_hot {
            let region = self.region_of(ptr).expect("an arena block's region outlives the block");
            self.free_in(&mut lock(&region), ptr, len, stream);
        }
        self.live.fetch_sub(len, Ordering::AcqRel);
    }

    /// `free`'s work in the block's region `r`.
    fn free_in(&self, r: &mut Region, ptr: u64, len: u64, stream: Option<RawStream>) {
        match stream.filter(|&s| s != r.stream) {
            None => r.release(ptr, len),
            Some(other) => match self.record_on(other) {
                Some(event) => r.foreign.push((ptr, len, event, other)),
                // No event: wait for that stream instead (a failing
                // driver); if even that fails, leave the range out.
                None => {
                    if self.device.synchronize_stream(other).is_ok() {
                        r.unreserve(ptr, len, 0);
                    }
                }
            },
        }
    }

    /// An event recorded on `stream` now (from the spare list).
    fn record_on(&self, stream: RawStream) -> Option<RawEvent> {
        let event = lock(&self.spare).events.pop().map_or_else(|| self.device.create_event(), Ok).ok()?;
        match self.device.record_event(event, stream) {
            Ok(()) => Some(event),
            Err(_) => {
                lock(&self.spare).events.push(event);
                None
            }
        }
    }

    /// Foreign frees of `r` join its free ranges: those whose events have
    /// completed (with `wait`, after waiting for them on the host); with
    /// `owner_waits`, the rest too, `r`'s stream made to wait for each on
    /// the GPU (they then count as frees at this point of that stream).
    fn settle_foreign(&self, r: &mut Region, wait: bool, owner_waits: bool) {
        let mut i = 0;
        while i < r.foreign.len() {
            let (addr, len, event, _) = r.foreign[i];
            if wait {
                let _ = self.device.event_synchronize(event);
            }
            if self.device.event_query(event) == Ok(true) {
                r.unreserve(addr, len, 0);
            } else if owner_waits && self.device.stream_wait_event(r.stream, event).is_ok() {
                r.release_merged(addr, len);
            } else {
                i += 1;
                continue;
            }
            r.foreign.swap_remove(i);
            lock(&self.spare).events.push(event);
        }
    }

    /// The smallest foreign free of `r` of at least `len` bytes, `stream`
    /// made to wait for its event: its address. The rest of it stays
    /// foreign behind an event recorded on `stream` after the wait.
    fn take_foreign_in_flight(&self, r: &mut Region, stream: RawStream, len: u64) -> Option<u64> {
        let i = (0..r.foreign.len()).filter(|&i| r.foreign[i].1 >= len).min_by_key(|&i| r.foreign[i].1)?;
        let (addr, flen, event, _) = r.foreign[i];
        self.device.stream_wait_event(stream, event).ok()?;
        if flen > len {
            let rest = self.record_on(stream)?;
            r.foreign.push((addr + len, flen - len, rest, stream));
        }
        r.foreign.swap_remove(i);
        lock(&self.spare).events.push(event);
        Some(addr)
    }

    /// A fully mapped range of `len` bytes in another stream's region,
    /// with `stream` made to wait (on the GPU) for that stream's work so
    /// far: its address, or `None`.
    fn take_from_another_stream(&self, stream: RawStream, len: u64) -> Option<u64> {
        for region in self.every_region() {
            let mut r = lock(&region);
            if r.stream == stream {
                continue;
            }
            // A block this stream took from here and freed, of the size:
            // back to it as it is (its own stream order fences it).
            if let Some(i) = r.foreign.iter().position(|f| f.3 == stream && f.1 == len) {
                let (addr, _, event, _) = r.foreign.swap_remove(i);
                lock(&self.spare).events.push(event);
                return Some(addr);
            }
            // The owner's recent frees stay where they are: they are its
            // same-size reuse, and merged space suffices here.
            self.settle_foreign(&mut r, false, false);
            // A foreign free still in flight that fits: this stream waits
            // for it on the GPU (it was freed after all its uses); what
            // the block leaves stays foreign, fenced by an event of this
            // stream recorded after that wait.
            if let Some(addr) = self.take_foreign_in_flight(&mut r, stream, len) {
                return Some(addr);
            }
            let Some((addr, freed)) = r.take_for_another(len) else { continue };
            if !r.all_mapped(addr, len) {
                r.unreserve(addr, len, freed);
                continue;
            }
            if freed == 0 {
                // Never used by any block: nothing to wait for (and no
                // reason to tie this stream to that one's queued work).
                return Some(addr);
            }
            let fenced = self.record_on(r.stream).map(|event| {
                let waited = self.device.stream_wait_event(stream, event);
                lock(&self.spare).events.push(event);
                waited.is_ok()
            });
            if fenced == Some(true) {
                return Some(addr);
            }
            r.unreserve(addr, len, freed);
            return None;
        }
        None
    }

    /// A fitting free range in one of `stream`'s regions: the region, the
    /// address, the range's free sequence, and the granules to map.
    fn carve(&self, stream: RawStream, len: u64) -> Option<Carved> {
        let streams = self.streams.read().unwrap_or_else(|p| p.into_inner());
        let regions = streams.get(&stream)?;
        // A hit first: a recent free of the size, the best fit if it is
        // mapped, else mapped space in another fitting range.
        for region in regions {
            let mut r = lock(region);
            let mut hit = None;
            if let Some((addr, freed)) = r.take(len) {
                if r.all_mapped(addr, len) {
                    hit = Some((addr, freed));
                } else {
                    r.unreserve(addr, len, freed);
                    hit = r.take_mapped(len);
                }
            }
            if let Some((addr, freed)) = hit {
                self.make_hot(stream, region, &r);
                return Some((region.clone(), addr, freed, Vec::new()));
            }
        }
        // Then with the recent frees merged (they may coalesce into room):
        // the best fit, mapped or not.
        for region in regions {
            let mut r = lock(region);
            r.settle_recent();
            self.settle_foreign(&mut r, false, true);
            if let Some((addr, freed)) = r.take_mapped(len) {
                self.make_hot(stream, region, &r);
                return Some((region.clone(), addr, freed, Vec::new()));
            }
            if let Some((addr, freed)) = r.take(len) {
                let missing = r.unmapped_in(addr, len);
                self.make_hot(stream, region, &r);
                return Some((region.clone(), addr, freed, missing));
            }
        }
        None
    }

    fn carve_in_new_region(&self, stream: RawStream, len: u64) -> ResourceResult<Carved> {
        let bytes = len
            .checked_add(self.page_bytes - 1)
            .map(|b| b / self.page_bytes * self.page_bytes)
            .map(|b| b.max(self.region_bytes))
            .ok_or_else(|| ResourceError::OutOfMemory { requested: len, detail: "the request is larger than any device can hold".into() })?;
        let base = self.device.vm_reserve(bytes)?;
        let mut region = Region::new(stream, base, bytes, self.page_bytes);
        let (addr, freed) = region.free.take(len).expect("a new region fits its first block");
        let missing = region.unmapped_in(addr, len);
        let region = Arc::new(Mutex::new(region));
        self.make_hot(stream, &region, &lock(&region));
        self.regions.write().unwrap_or_else(|p| p.into_inner()).insert(base, (bytes, region.clone()));
        self.streams.write().unwrap_or_else(|p| p.into_inner()).entry(stream).or_default().push(region.clone());
        Ok((region, addr, freed, missing))
    }

    /// Map `handles` at the granules `pages` of `region` (those another
    /// thread has not mapped meanwhile) and grant access; handles left over,
    /// or not mapped because of an error, go to the spare list.
    fn map_pages(&self, region: &Mutex<Region>, pages: &[usize], handles: Vec<PhysHandle>) -> ResourceResult<()> {
        let mut r = lock(region);
        let mut handles = handles.into_iter();
        let mut newly = Vec::with_capacity(pages.len());
        let mut result = Ok(());
        for &page in pages {
            if r.is_mapped(page) {
                continue;
            }
            let handle = handles.next().expect("one handle per missing page");
            if let Err(e) = self.device.vm_map(r.page_addr(page), self.page_bytes, handle) {
                lock(&self.spare).pages.push(handle);
                result = Err(e.into());
                break;
            }
            r.install(page, handle);
            newly.push(page);
        }
        lock(&self.spare).pages.extend(handles);
        self.mapped.fetch_add(newly.len() as u64, Ordering::Relaxed);
        let peers = lock(&self.peers).clone();
        let ordinal = self.device.ordinal();
        for (first, count) in runs(&newly) {
            let (va, bytes) = (r.page_addr(first), count as u64 * self.page_bytes);
            let granted =
                std::iter::once(&ordinal).chain(peers.iter()).try_for_each(|&device| self.device.vm_set_access(va, bytes, device));
            if let Err(e) = granted {
                result = result.and(Err(e.into()));
                // A page mapped without access would fault under the next
                // block placed on it: unmapped again, and spare. (Should
                // even the unmap fail, the pages stay mapped here.)
                if let Some(pages) = self.unmap_run(&mut r, first, count) {
                    lock(&self.spare).pages.extend(pages);
                }
            }
        }
        result
    }

    /// `count` physical pages for `stream`: spare ones first; then, past the
    /// soft cap, recycled idle ones, then lent ones; then new ones charged
    /// to `gate`. Under pressure (the gate or the device refuses) idle pages
    /// are recycled or lent before the refusal stands.
    fn obtain(
        &self,
        count: usize,
        stream: RawStream,
        gate: &dyn ChargeGate,
        may_unmap: bool,
    ) -> ResourceResult<(Vec<PhysHandle>, usize)> {
        let held_peak_before = self.held.peak();
        // Pages from spare or recycled, and pages this call created.
        let mut made = Vec::new();
        let mut got = {
            let mut spare = lock(&self.spare);
            let keep = spare.pages.len().saturating_sub(count);
            spare.pages.split_off(keep)
        };
        if got.len() < count && may_unmap && self.over_soft_cap(count - got.len()) {
            got.extend(self.lend(count - got.len(), stream));
            if got.len() < count {
                got.extend(self.recycle(count - got.len(), Completion::Query));
            }
        }
        while got.len() + made.len() < count {
            match self.create(gate) {
                Ok(handle) => made.push(handle),
                Err(refused @ (ResourceError::OutOfBudget { .. } | ResourceError::OutOfMemory { .. })) if may_unmap => {
                    let missing = count - got.len() - made.len();
                    let mut more = self.lend(missing, stream);
                    if more.is_empty() {
                        more = self.recycle(missing, Completion::Query);
                    }
                    if more.is_empty() && self.wait_on_pressure {
                        more = self.recycle(missing, Completion::Wait);
                    }
                    if more.is_empty() {
                        // A refusal leaves nothing behind: the pages this
                        // call created go back to the driver (and out of
                        // the held peak), the others back to spare.
                        lock(&self.spare).pages.extend(got);
                        self.unmake(made, held_peak_before);
                        // The refusal names the state it leaves, not the
                        // pages made meanwhile: asked again, the gate refuses
                        // with the numbers of now (kept as it was should the
                        // pages fit after all, freed meanwhile).
                        let pages = count as u64 * self.page_bytes;
                        return Err(match gate.try_charge(pages) {
                            Err(now) => now,
                            Ok(()) => {
                                gate.uncharge(pages);
                                refused
                            }
                        });
                    }
                    got.extend(more);
                }
                Err(e) => {
                    let mut spare = lock(&self.spare);
                    spare.pages.extend(got);
                    spare.pages.extend(made);
                    return Err(e);
                }
            }
        }
        let created = made.len();
        got.extend(made);
        Ok((got, created))
    }

    /// Give back pages `obtain` created for a request it then refused:
    /// released, which uncharges them (`HeldBytes::sub`; a page the driver
    /// will not release stays spare, held and charged), and the held peak
    /// as it was before.
    fn unmake(&self, made: Vec<PhysHandle>, held_peak_before: u64) {
        let peak = self.held.peak();
        for handle in made {
            match self.device.vm_release(handle) {
                Ok(()) => self.held.sub(self.page_bytes),
                Err(_) => lock(&self.spare).pages.push(handle),
            }
        }
        self.held.restore_peak(peak, held_peak_before.max(self.held.now()));
    }

    /// Whether `pages` more would take the held bytes past the live peak
    /// plus the slack.
    fn over_soft_cap(&self, pages: usize) -> bool {
        let peak_pages = self.peak_live.load(Ordering::Relaxed).div_ceil(self.page_bytes);
        let cap = (peak_pages + (peak_pages / SLACK_DIV).max(MIN_SLACK_PAGES)) * self.page_bytes;
        self.held.now() + pages as u64 * self.page_bytes > cap
    }

    /// One new physical page, charged first.
    fn create(&self, gate: &dyn ChargeGate) -> ResourceResult<PhysHandle> {
        gate.try_charge(self.page_bytes)?;
        match self.device.vm_create(self.page_bytes) {
            Ok(handle) => {
                self.held.add(self.page_bytes);
                Ok(handle)
            }
            Err(e) => {
                gate.uncharge(self.page_bytes);
                Err(e.into())
            }
        }
    }

    /// Unmap the `n` granules of `r` from `first` (one driver call) and take
    /// their pages out of its page table: the pages, or `None` when the
    /// unmap failed (they stay mapped and installed).
    fn unmap_run(&self, r: &mut Region, first: usize, n: usize) -> Option<Vec<PhysHandle>> {
        self.device.vm_unmap(r.page_addr(first), n as u64 * self.page_bytes).ok()?;
        self.unmapped.fetch_add(n as u64, Ordering::Relaxed);
        Some((first..first + n).map(|p| r.uninstall(p)).collect())
    }

    fn every_region(&self) -> Vec<Arc<Mutex<Region>>> {
        self.regions.read().unwrap_or_else(|p| p.into_inner()).values().map(|(_, r)| r.clone()).collect()
    }

    /// Up to `count` idle pages whose frees are complete (as sure as
    /// `completion` asks), unmapped and taken out of their regions.
    fn recycle(&self, count: usize, completion: Completion) -> Vec<PhysHandle> {
        let mut got = Vec::new();
        for region in self.every_region() {
            if got.len() >= count {
                break;
            }
            let mut r = lock(&region);
            r.settle_recent();
            self.settle_foreign(&mut r, completion == Completion::Wait, false);
            self.refresh(&mut r, completion);
            if completion == Completion::Wait || self.too_many_lent() {
                self.unmap_lent(&mut r);
            }
            let idle = r.idle_pages(count - got.len());
            for (first, n) in runs(&idle) {
                got.extend(self.unmap_run(&mut r, first, n).into_iter().flatten());
            }
        }
        self.recycled.fetch_add(got.len() as u64, Ordering::Relaxed);
        got
    }

    /// Up to `count` idle pages, lent to `stream` (region.rs), whether or
    /// not their frees are complete: `stream` is made to wait on the GPU
    /// for the work of every other stream whose pages it gets (the stream's
    /// own order covers its own). A region whose fence fails lends nothing.
    fn lend(&self, count: usize, stream: RawStream) -> Vec<PhysHandle> {
        let mut got = Vec::new();
        for region in self.every_region() {
            if got.len() >= count {
                break;
            }
            let mut r = lock(&region);
            r.settle_recent();
            // Blocks other streams took from here and freed join the free
            // ranges behind a GPU-side wait of this region's stream, so the
            // fence below covers them too.
            self.settle_foreign(&mut r, false, true);
            let before = r.lent.len();
            let pages = r.lend_pages(count - got.len());
            if pages.is_empty() {
                continue;
            }
            if r.stream != stream {
                let fenced = self.record_on(r.stream).map(|event| {
                    let waited = self.device.stream_wait_event(stream, event);
                    lock(&self.spare).events.push(event);
                    waited.is_ok()
                });
                if fenced != Some(true) {
                    r.take_back_lent(before);
                    continue;
                }
            }
            got.extend(pages);
        }
        self.lent.fetch_add(got.len() as u64, Ordering::Relaxed);
        self.lent_now.fetch_add(got.len() as u64, Ordering::Relaxed);
        got
    }

    /// Whether the old addresses of lent pages add up to more than the
    /// pages held: time to unmap those whose frees are complete. Until then
    /// they cost no memory (the pages are the same) and no call; each
    /// unmap costs host time per page, so they go in batches.
    fn too_many_lent(&self) -> bool {
        self.lent_now.load(Ordering::Relaxed) > self.held.now() / self.page_bytes
    }

    /// Unmap the old addresses of `r`'s lent pages whose frees are now
    /// known complete: free address space again.
    fn unmap_lent(&self, r: &mut Region) {
        let mut done = r.lent_done();
        if done.is_empty() {
            return;
        }
        // One unmap per run of adjacent granules: a lent block's pages go
        // together.
        done.sort_unstable_by_key(|&(page, _, _)| page);
        let pages: Vec<usize> = done.iter().map(|&(page, _, _)| page).collect();
        let mut at = 0;
        for (first, n) in runs(&pages) {
            let run = &done[at..at + n];
            at += n;
            let (addr, bytes) = (r.page_addr(first), n as u64 * self.page_bytes);
            if self.device.vm_unmap(addr, bytes).is_ok() {
                self.lent_now.fetch_sub(n as u64, Ordering::Relaxed);
                self.unmapped.fetch_add(n as u64, Ordering::Relaxed);
                for &(page, freed, _) in run {
                    r.unreserve(r.page_addr(page), self.page_bytes, freed);
                }
            } else {
                // Still mapped: keep them out of use (and their pages out of
                // a release) until a later try.
                for &(page, freed, handle) in run {
                    r.lent_again(page, freed, handle);
                }
            }
        }
    }

    /// Whether an old address of some region still maps `handle`.
    fn still_lent(&self, handle: PhysHandle) -> bool {
        self.every_region().iter().any(|region| lock(region).lent.iter().any(|&(_, _, h)| h == handle))
    }

    /// Learn how far the GPU got through `region`'s frees: completed seal
    /// events, an idle stream, or (with `Completion::Wait`) a synchronise.
    /// Frees still running get a seal, so a later call can tell.
    fn refresh(&self, r: &mut Region, completion: Completion) {
        while let Some(&(event, seq)) = r.seals.front() {
            if self.device.event_query(event) != Ok(true) {
                break;
            }
            r.done = r.done.max(seq);
            r.seals.pop_front();
            lock(&self.spare).events.push(event);
        }
        if r.done == r.frees() {
            return;
        }
        let finished = match completion {
            Completion::Query => self.device.stream_query(r.stream) == Ok(true),
            Completion::Wait => self.device.synchronize_stream(r.stream).is_ok(),
        };
        if finished {
            r.all_done();
            return;
        }
        if r.seals.back().map_or(true, |&(_, seq)| seq < r.frees()) {
            let event = lock(&self.spare).events.pop().map_or_else(|| self.device.create_event(), Ok);
            if let Ok(event) = event {
                match self.device.record_event(event, r.stream) {
                    Ok(()) => r.seals.push_back((event, r.frees())),
                    Err(_) => lock(&self.spare).events.push(event),
                }
            }
        }
    }

    /// Release idle pages and spare ones to the device until at most `keep`
    /// bytes are held beyond the live blocks (synchronising streams as
    /// needed, unless a capture is active). Returns the bytes released.
    pub fn trim(&self, keep: u64, may_unmap: bool) -> u64 {
        let excess = self.held.now().saturating_sub(self.live.load(Ordering::Acquire)).saturating_sub(keep);
        self.give_back(excess.div_ceil(self.page_bytes) as usize, Completion::Wait, may_unmap)
    }

    /// Give idle memory back for a caller outside the arena that needs
    /// `need` bytes under the same budget (`wait`: synchronise streams).
    pub fn relieve(&self, need: u64, wait: bool, may_unmap: bool) -> u64 {
        let completion = if wait { Completion::Wait } else { Completion::Query };
        self.give_back(need.div_ceil(self.page_bytes) as usize, completion, may_unmap)
    }

    /// Release `pages` pages to the device: spare ones first, then idle
    /// ones whose frees are complete (as sure as `completion` asks). The
    /// bytes released.
    fn give_back(&self, pages: usize, completion: Completion, may_unmap: bool) -> u64 {
        let mut released = self.release_spare(pages);
        let left = pages.saturating_sub((released / self.page_bytes) as usize);
        if may_unmap && left > 0 {
            let idle = self.recycle(left, completion);
            lock(&self.spare).pages.extend(idle);
            released += self.release_spare(usize::MAX);
        }
        released
    }

    /// Release up to `count` spare pages; the bytes released.
    fn release_spare(&self, count: usize) -> u64 {
        let pages = {
            let mut spare = lock(&self.spare);
            let keep = spare.pages.len().saturating_sub(count);
            spare.pages.split_off(keep)
        };
        let mut released = 0;
        for handle in pages {
            if self.still_lent(handle) {
                // Its old address still maps it: releasing it now would
                // not free the memory (the budget would count it gone).
                lock(&self.spare).pages.push(handle);
                continue;
            }
            match self.device.vm_release(handle) {
                Ok(()) => {
                    self.held.sub(self.page_bytes);
                    released += self.page_bytes;
                }
                Err(_) => lock(&self.spare).pages.push(handle),
            }
        }
        if let (Some(log), true) = (&self.log, released > 0) {
            // Released at once: no pending time between the two rows.
            log.released(0, released);
            log.retired(released, released / self.page_bytes);
        }
        released
    }

    /// `stream` is going away: every free into its regions must be known
    /// complete while the stream still exists (the regions stay, all their
    /// memory reusable by whatever stream later gets the same handle).
    pub fn retire_stream(&self, stream: RawStream) -> ResourceResult<()> {
        let regions = self.streams.read().unwrap_or_else(|p| p.into_inner()).get(&stream).cloned().unwrap_or_default();
        if regions.is_empty() {
            return Ok(());
        }
        self.device.synchronize_stream(stream)?;
        for region in regions {
            let mut r = lock(&region);
            r.all_done();
            let seals: Vec<RawEvent> = r.seals.drain(..).map(|(e, _)| e).collect();
            lock(&self.spare).events.extend(seals);
        }
        Ok(())
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
            let r = lock(&region);
            for (first, n) in runs(&r.mapped_pages()) {
                self.device.vm_set_access(r.page_addr(first), n as u64 * self.page_bytes, ordinal)?;
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
        for (_, (_, region)) in regions.iter() {
            let mut r = lock(region);
            let lent: Vec<usize> = r.lent.drain(..).map(|(page, _, _)| page).collect();
            for page in lent {
                let _ = self.device.vm_unmap(r.page_addr(page), self.page_bytes);
            }
        }
        for (_, (_, region)) in regions {
            let mut r = lock(&region);
            for (first, n) in runs(&r.mapped_pages()) {
                if self.device.vm_unmap(r.page_addr(first), n as u64 * self.page_bytes).is_ok() {
                    for p in first..first + n {
                        let handle = r.uninstall(p);
                        if self.device.vm_release(handle).is_ok() {
                            released += self.page_bytes;
                        }
                    }
                }
            }
            let _ = self.device.vm_free(r.base, r.len);
            for (event, _) in r.seals.drain(..) {
                self.device.destroy_event(event);
            }
            for (_, _, event, _) in r.foreign.drain(..) {
                self.device.destroy_event(event);
            }
        }
        let spare = std::mem::take(&mut *lock(&self.spare));
        for handle in spare.pages {
            if self.device.vm_release(handle).is_ok() {
                released += self.page_bytes;
            }
        }
        for event in spare.events {
            self.device.destroy_event(event);
        }
        self.held.sub(released.min(self.held.now()));
    }
}
