//! Physical pages: where a miss's pages come from and where idle pages go
//! (`Arena`'s page supply).
//!
//! Contract:
//! - **Physical pages.** The device holds exactly the pages the arena
//!   created and has not released: `held` is their bytes, and the budget
//!   (the `ChargeGate`) is charged a page's bytes right before `cuMemCreate`
//!   and uncharged when it is released. Nothing else xlog does on this
//!   path holds device memory, so the charge is the device's number.
//! - **Pages.** A physical page is `PAGE_GRANULES` of the device's mapping
//!   granules (2 MiB on Hopper), or `LARGE_PAGE_PAGES` of those (16 MiB) in
//!   the regions of large blocks: each driver call costs per page, not per
//!   byte, so large blocks, where a steady state remaps, get large pages. Spare
//!   pages are kept by size; a miss obtains pages of its region's size,
//!   lent or recycled from regions of that size only. Past the soft cap,
//!   with none of its size to lend or recycle, idle pages of the other
//!   size whose frees are complete are released first (`release_other`;
//!   the frees of the allocating stream's own regions waited for on the
//!   host if they must be, never another stream's), so what the device
//!   holds stays within the cap across both sizes.
//! - **A refusal leaves nothing behind**: pages it created are released;
//!   pages lent to it go spare only once the stream they were fenced on
//!   has run past their frees (a host wait, on a refusal only), since any
//!   stream takes a spare page with no fence.
//! - **Lending.** A page no live block overlaps is idle. Before the arena
//!   creates a page while it holds more than its live peak plus the slack
//!   (1/64 of it, at least one page, widened up to 1/32 by pages lent
//!   at the live peak: `SLACK_DIV`), and before any refusal, it *lends*
//!   idle pages,
//!   longest idle first: each is mapped a second time where it is needed
//!   (GMLake's stitching, in page units), while its old address stays
//!   mapped, out of use until the page comes back to it (a page lent
//!   within its region, `region.rs`). The new block's work is ordered
//!   after the frees that made the page idle by the stream itself (the
//!   page's region is the stream's own) or by a GPU-side wait on an event
//!   of the page's stream: no host wait, even while the GPU still runs
//!   those frees, and no unmap (about 16 µs of host time a page). So
//!   what the call frees serves the call. Old addresses are unmapped in
//!   batches once their frees are known complete (a completed event, or
//!   `cuStreamQuery` finding the stream idle) and their bytes pass the
//!   bytes held (checked when recycling), or 32 times the bytes held
//!   (checked whenever pages are lent: a workload that lending alone
//!   serves never recycles), or on trim and close; a page is never
//!   released while an old address still maps it, and a page about to be
//!   released has its old addresses unmapped first where their frees are
//!   complete (`unmap_old_addresses_of`), so it does not stay spare.
//! - **Recycling** (unmap an idle page whose frees are complete, map it
//!   where it is needed) is what is left when lending finds nothing (a
//!   fence that fails). With `wait_on_pressure`, a refusal first
//!   synchronises the streams whose idle pages are still in use.
//! - **Trim** releases idle pages (synchronising their streams) until at
//!   most `keep` bytes are held beyond the live blocks; close releases
//!   everything.

use std::sync::atomic::Ordering;

use super::region::{runs, Lent, Region};
use super::{lock, Arena};
use crate::device::{PhysHandle, RawStream};
use crate::resource::{ChargeGate, ResourceError, ResourceResult};

/// The bound on old addresses of lent pages that each lend checks, in
/// bytes per byte held (`lent_past`): a mapping of each one, and (for a
/// page lent out of a small-page region) its granule out of the free
/// ranges. A workload that lending alone serves never recycles, and each
/// page lent on from its new place leaves one more: unbounded, they grew
/// to 340 per page held (and a region of address space reserved after
/// another) over 1.6 million allocations of random sizes. Real workloads
/// keep many and gain by it: W11's four-stream engine reached 17 per page
/// on its recorded trace, and unmapping them past the bytes held on each
/// lend made its rounds about 1.33x slower on an H200.
const OLD_ADDRESSES_PER_PAGE: u64 = 32;

/// Held bytes may pass the live peak by 1/`SLACK_DIV` (at least
/// `MIN_SLACK_PAGES` page) before idle pages are lent (or recycled)
/// instead of new ones created. A cap tighter than a workload's
/// fragmentation at page grain never lets its layout settle: each step
/// lends the pages of a block freed earlier, that block's old place is
/// then out of use, it lands somewhere new next step and lends again. The
/// ResNet-50 step at 1/256 still mapped 13 pages a step after 80 repeats
/// and crept to 1.044x its live peak (1.034x on the GPU after 13 steps); at
/// 1/64 it maps none from the second repeat, at 1.012x (0.995x expandable
/// segments' device peak on the GPU; BENCHMARKS.md, "Physical memory,
/// fifth pass"). Pages of one granule leave less memory at the edges of
/// the free ranges, so less room for a layout to settle in: at 1/64 the
/// recorded GPT-2 run crept to 1.039x its live peak, lending 28 pages a
/// step; at 1/32 it holds 1.021x and lends 22 (what two-granule pages
/// did at 1/64), and every other recorded trace stays within 0.005 of
/// what it held at 1/64 (mlm_dyn 1.017x against 1.012x; 1/16 would cost
/// more: W11's trace 1.062x against 1.040x). "Physical memory, tenth
/// pass". A cap that makes a layout lend no longer costs a repeating step
/// its time: GPT-2's layout lent 21 large pages a step at 1/32 and 1/16
/// (none from 1/8, where it held 1.074x its live peak, and mlm_dyn
/// 1.078x), each granted again every step on the GPU (about 1 ms of the
/// step, "eleventh pass"); pages lent within a region now come back to
/// their old address with no driver call, and the step maps nothing from
/// its fourth repeat, at 1.027x ("twelfth pass").
///
/// The slack starts at 1/64 and widens up to 1/32 (`MAX_WIDENING_DIV`)
/// by the pages lent while the live bytes are within 1/64 of the live
/// peak (`widen_at_peak`). Lending there means the layout's own
/// fragmentation at its peak needs more room than the slack: a repeating
/// step would lend the same pages at every repetition. Lending below the peak hands on idle pages of shapes
/// past, which is what the slack is for; at a fixed 1/32 those piled up
/// to the cap on every changing-shape model. On an H200 (BENCHMARKS.md,
/// "Physical memory, twenty-first pass"): at a fixed 1/32 a detector
/// with changing image sizes held 1.016x expandable segments' device
/// peak; at a fixed 1/64 it held 0.978-1.002x (and a Llama KV-cache
/// server 0.998x against 1.013x, GPT-2 with changing length 0.942x), but
/// static GPT-2 then remapped 1-37 pages in every step, where at 1/32 it
/// maps none from its ninth. On sim the widening slack keeps the
/// detector's trace at 1.017x its live peak (1/32: 1.030x, 1/64: 1.016x),
/// and static GPT-2 maps 0.5 pages a step in the second half of 30
/// repeats of its H100 step (1/32: none, 1/64: 3.9) and none in that of
/// its 25 recorded H200 steps (1/64: 25.8). Not yet run on a GPU.
const SLACK_DIV: u64 = 64;
/// The slack widens up to 1/`MAX_WIDENING_DIV` of the live peak.
const MAX_WIDENING_DIV: u64 = 32;
const MIN_SLACK_PAGES: u64 = 1;

/// How sure recycling must be that an idle page's frees are complete.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Completion {
    /// Completed events and idle streams only: never a host wait.
    Query,
    /// Synchronise the stream when that is what it takes (trim, and a
    /// refusal with `wait_on_pressure`).
    Wait,
    /// `Wait` for this stream's own regions, `Query` for the others': a
    /// call may wait for its own stream's work, never for another's.
    WaitOwn(RawStream),
}

/// The pages `obtain` found for a stream.
pub(super) struct Obtained {
    pub(super) handles: Vec<PhysHandle>,
    /// How many of them it created (charged to the gate).
    pub(super) created: usize,
    /// Some were lent: only the stream they were obtained for is ordered
    /// after their old frees, so any that end up spare go through
    /// `spare_fenced` with that stream.
    pub(super) lent: bool,
    /// Where the pages came from, for the log's `reserve` row.
    pub(super) sources: Sources,
}

/// Where a miss's pages came from, and the soft cap it met: the `Detail`
/// of the log's `reserve` row, so a log tells why pages were created (past
/// the cap: no page was idle).
#[derive(Copy, Clone, Debug, Default)]
pub(super) struct Sources {
    pub spare: usize,
    pub lent: usize,
    pub recycled: usize,
    /// Whether the held bytes would pass the soft cap without lending.
    pub past_cap: bool,
    /// The soft cap then, in bytes.
    pub cap: u64,
}

impl std::fmt::Display for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "spare {} lent {} recycled {}; soft cap {} bytes{}",
            self.spare,
            self.lent,
            self.recycled,
            self.cap,
            if self.past_cap { " (passed)" } else { "" }
        )
    }
}

impl Arena {
    /// `count` physical pages for `stream`: spare ones first; then, past the
    /// soft cap, lent idle ones, then recycled ones; then new ones charged
    /// to `gate`. Under pressure (the gate or the device refuses) idle pages
    /// are recycled or lent before the refusal stands.
    pub(super) fn obtain(
        &self,
        count: usize,
        page: u64,
        stream: RawStream,
        to: u64,
        gate: &dyn ChargeGate,
        may_unmap: bool,
    ) -> ResourceResult<Obtained> {
        let held_peak_before = self.held.peak();
        let large = self.is_large(page);
        // Pages from spare or recycled, and pages this call created.
        let mut made = Vec::new();
        let mut got = {
            let mut spare = lock(&self.spare);
            let list = spare.of(large);
            let keep = list.len().saturating_sub(count);
            list.split_off(keep)
        };
        let mut sources = Sources { spare: got.len(), cap: self.soft_cap(), ..Sources::default() };
        // Whether `got` holds lent pages: only `stream` is ordered after
        // their frees (on the GPU), so they may not go spare as they are.
        let mut lent_any = false;
        if got.len() < count && may_unmap && self.over_soft_cap((count - got.len()) as u64 * page) {
            sources.past_cap = true;
            let lent = self.lend(count - got.len(), page, stream, to);
            lent_any |= !lent.is_empty();
            sources.lent = lent.len();
            self.widen_at_peak(lent.len() as u64 * page);
            got.extend(lent);
            if got.len() < count {
                let recycled = self.recycle(count - got.len(), page, Completion::Query);
                sources.recycled = recycled.len();
                got.extend(recycled);
            }
            if got.len() < count {
                // Still past the cap: idle pages of the other size make
                // room for the new ones, the frees of this stream's own
                // waited for on the host if they must be (the two sizes
                // never hold more than the cap together; a layout that
                // settles waits only while it settles: GPT-2's steps 2-8
                // on the recorded trace).
                let need = (count - got.len()) as u64 * page;
                let released = self.release_other(page, need, Completion::Query);
                if released < need && self.over_soft_cap(need) {
                    self.release_other(page, need - released, Completion::WaitOwn(stream));
                }
            }
        }
        while got.len() + made.len() < count {
            match self.create(gate, page) {
                Ok(handle) => made.push(handle),
                Err(refused @ (ResourceError::OutOfBudget { .. } | ResourceError::OutOfMemory { .. })) if may_unmap => {
                    let missing = count - got.len() - made.len();
                    let mut more = self.lend(missing, page, stream, to);
                    lent_any |= !more.is_empty();
                    if more.is_empty() {
                        more = self.recycle(missing, page, Completion::Query);
                    }
                    if more.is_empty() && self.release_other(page, missing as u64 * page, Completion::Query) > 0 {
                        continue;
                    }
                    if more.is_empty() && self.wait_on_pressure {
                        more = self.recycle(missing, page, Completion::Wait);
                        if more.is_empty() && self.release_other(page, missing as u64 * page, Completion::Wait) > 0 {
                            continue;
                        }
                    }
                    if more.is_empty() {
                        // A refusal leaves nothing behind: the pages this
                        // call created go back to the driver (and out of
                        // the held peak), the others back to spare.
                        self.spare_fenced(got, large, lent_any.then_some(stream));
                        self.unmake(made, page, held_peak_before);
                        // The refusal names the state it leaves, not the
                        // pages made meanwhile: asked again, the gate refuses
                        // with the numbers of now (kept as it was should the
                        // pages fit after all, freed meanwhile).
                        let pages = count as u64 * page;
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
                    self.spare_fenced(got, large, lent_any.then_some(stream));
                    lock(&self.spare).of(large).extend(made);
                    return Err(e);
                }
            }
        }
        let created = made.len();
        got.extend(made);
        Ok(Obtained { handles: got, created, lent: lent_any, sources })
    }

    /// Put `pages` on the spare list, where any stream may take one with
    /// no fence. Pages lent to `fenced_on` (the one stream ordered after
    /// their old frees) first have that stream's work complete: a host
    /// wait, on the paths where obtained pages go unused (a refusal, a
    /// failed map, another thread having mapped a granule meanwhile).
    /// Should the wait fail, the device has failed too.
    pub(super) fn spare_fenced(&self, pages: Vec<PhysHandle>, large: bool, fenced_on: Option<RawStream>) {
        if pages.is_empty() {
            return;
        }
        if let Some(stream) = fenced_on {
            let _ = self.device.synchronize_stream(stream);
        }
        lock(&self.spare).of(large).extend(pages);
    }

    /// Give back pages `obtain` created for a request it then refused:
    /// released, which uncharges them (`HeldBytes::sub`; a page the driver
    /// will not release stays spare, held and charged), and the held peak
    /// as it was before.
    fn unmake(&self, made: Vec<PhysHandle>, page: u64, held_peak_before: u64) {
        let peak = self.held.peak();
        for handle in made {
            match self.device.vm_release(handle) {
                Ok(()) => self.held.sub(page),
                Err(_) => lock(&self.spare).of(self.is_large(page)).push(handle),
            }
        }
        self.held.restore_peak(peak, held_peak_before.max(self.held.now()));
    }

    /// Whether `bytes` more would take the held bytes past the live peak
    /// plus the slack.
    fn over_soft_cap(&self, bytes: u64) -> bool {
        self.held.now() + bytes > self.soft_cap()
    }

    /// The live peak plus the slack, in whole pages: 1/`SLACK_DIV` of the
    /// peak (at least `MIN_SLACK_PAGES`) and what it has been widened by,
    /// up to 1/`MAX_WIDENING_DIV` in all.
    fn soft_cap(&self) -> u64 {
        let peak_pages = self.peak_live.load(Ordering::Relaxed).div_ceil(self.page_bytes);
        let base = (peak_pages / SLACK_DIV).max(MIN_SLACK_PAGES);
        let room = (peak_pages / MAX_WIDENING_DIV).saturating_sub(base);
        let widened = self.widened.load(Ordering::Relaxed).div_ceil(self.page_bytes).min(room);
        (peak_pages + base + widened) * self.page_bytes
    }

    /// Widen the slack by `lent` bytes, lent for a miss where the live
    /// bytes (the missing block counted, `count_live`) are within
    /// 1/`SLACK_DIV` of the live peak: the layout needs that room at its
    /// peak.
    fn widen_at_peak(&self, lent: u64) {
        if lent == 0 {
            return;
        }
        let peak = self.peak_live.load(Ordering::Relaxed);
        if self.live.load(Ordering::Relaxed) >= peak - peak / SLACK_DIV {
            self.widened.fetch_add(lent, Ordering::Relaxed);
        }
    }

    /// Whether a block of `len` bytes that misses `count` pages of `page`
    /// bytes should go to the regions of the other size: it would take the
    /// held bytes past the soft cap, spare and idle pages of its size fall
    /// short, and idle pages of the other size would cover it. Creating
    /// pages past the cap while the other size sits idle would let the two
    /// sizes together hold more than the footprint bound (both sizes' peaks).
    pub(super) fn other_size_serves(&self, page: u64, count: usize, len: u64) -> bool {
        if !self.over_soft_cap(count as u64 * page) {
            return false;
        }
        // The other size first: with no regions of that size (most
        // workloads have blocks of one size only) this visits no region.
        let other = self.other_page(page);
        let wanted = len.div_ceil(other) as usize;
        if self.lendable(other, wanted) < wanted {
            return false;
        }
        let spare = lock(&self.spare).of(self.is_large(page)).len();
        spare + self.lendable(page, count - spare.min(count)) < count
    }

    /// Idle pages of `page` bytes (mapped, covered whole by free ranges)
    /// that lending could take, counted up to `max`.
    fn lendable(&self, page: u64, max: usize) -> usize {
        let mut n = 0;
        for region in self.regions_of(page) {
            if n >= max {
                break;
            }
            let mut r = region.lock();
            r.settle_recent();
            n += r.lendable(max - n);
        }
        n
    }

    /// One new physical page of `page` bytes, charged first.
    fn create(&self, gate: &dyn ChargeGate, page: u64) -> ResourceResult<PhysHandle> {
        gate.try_charge(page)?;
        match self.device.vm_create(page) {
            Ok(handle) => {
                self.held.add(page);
                Ok(handle)
            }
            Err(e) => {
                gate.uncharge(page);
                Err(e.into())
            }
        }
    }

    /// Up to `count` pages, taken region by region by `take` (the region
    /// locked, its recent frees merged, and how many are still wanted).
    fn gather(&self, count: usize, page: u64, mut take: impl FnMut(&mut Region, usize) -> Vec<PhysHandle>) -> Vec<PhysHandle> {
        let mut got = Vec::new();
        for region in self.regions_of(page) {
            if got.len() >= count {
                break;
            }
            let mut r = region.lock();
            r.settle_recent();
            got.extend(take(&mut r, count - got.len()));
        }
        got
    }

    /// Up to `count` idle pages whose frees are complete (as sure as
    /// `completion` asks), unmapped and taken out of their regions.
    fn recycle(&self, count: usize, page: u64, completion: Completion) -> Vec<PhysHandle> {
        let got = self.gather(count, page, |r, wanted| {
            self.refresh(r, completion);
            if completion == Completion::Wait || self.lent_past(1) {
                self.unmap_lent(r);
            }
            let idle = r.idle_pages(wanted);
            runs(&idle).into_iter().filter_map(|(first, n)| self.unmap_run(r, first, n)).flatten().collect()
        });
        self.recycled.fetch_add(got.len() as u64, Ordering::Relaxed);
        got
    }

    /// Up to `count` idle pages, lent to `stream` (region.rs), whether or
    /// not their frees are complete: `stream` is made to wait on the GPU
    /// for the work of every other stream whose pages it gets (the stream's
    /// own order covers its own). A region whose fence fails lends nothing.
    fn lend(&self, count: usize, page: u64, stream: RawStream, to: u64) -> Vec<PhysHandle> {
        let got = self.gather(count, page, |r, wanted| {
            // Past the hard bound on old addresses, those whose frees are
            // complete are unmapped here too, not only when recycling:
            // where lending alone serves the misses, nothing recycles.
            if self.lent_past(OLD_ADDRESSES_PER_PAGE) {
                self.refresh(r, Completion::Query);
                self.unmap_lent(r);
            }
            let before = r.lent.len();
            let pages = r.lend_pages(wanted, r.base == to && self.is_large(page));
            if !pages.is_empty() && r.stream != stream && !self.fence(r.stream, stream) {
                r.take_back_lent(before);
                return Vec::new();
            }
            pages
        });
        self.lent.fetch_add(got.len() as u64, Ordering::Relaxed);
        self.lent_now.fetch_add(got.len() as u64 * page, Ordering::Relaxed);
        got
    }

    /// Release idle pages of the size other than `page` (spare ones first,
    /// then those whose frees are complete as sure as `completion` asks)
    /// until `bytes` are released or none is left: room for pages of
    /// `page`. The bytes released.
    fn release_other(&self, page: u64, bytes: u64, completion: Completion) -> u64 {
        self.release_idle(self.other_page(page), bytes, completion)
    }

    /// Release pages of `page` bytes until at least `bytes` are released
    /// or none is left: spare ones first, then idle ones whose frees are
    /// complete (as sure as `completion` asks). The bytes released.
    fn release_idle(&self, page: u64, bytes: u64, completion: Completion) -> u64 {
        let count = bytes.div_ceil(page) as usize;
        let mut released = self.release_spare(count, page);
        let left = count.saturating_sub((released / page) as usize);
        if left > 0 {
            let idle = self.recycle(left, page, completion);
            lock(&self.spare).of(self.is_large(page)).extend(idle);
            released += self.release_spare(left, page);
        }
        released
    }

    /// Whether the old addresses of lent pages add up to more than `times`
    /// the bytes held: time to unmap those whose frees are complete. Until
    /// then they cost no memory (the pages are the same) and no call; each
    /// unmap costs host time per page, so they go in batches. Recycling
    /// unmaps them past once the bytes held, lending past
    /// `OLD_ADDRESSES_PER_PAGE` times.
    fn lent_past(&self, times: u64) -> bool {
        self.lent_now.load(Ordering::Relaxed) > self.held.now().saturating_mul(times)
    }

    /// Unmap the old addresses of `r`'s lent pages whose frees are now
    /// known complete: free address space again.
    fn unmap_lent(&self, r: &mut Region) {
        self.unmap_lent_of(r, |_| true);
    }

    /// `unmap_lent` for the old addresses `which` picks.
    fn unmap_lent_of(&self, r: &mut Region, which: impl Fn(&Lent) -> bool) {
        let mut done = r.lent_done(which);
        if done.is_empty() {
            return;
        }
        // One unmap per run of adjacent granules: a lent block's pages go
        // together.
        done.sort_unstable_by_key(|l| l.page);
        let pages: Vec<usize> = done.iter().map(|l| l.page).collect();
        let mut at = 0;
        for (first, n) in runs(&pages) {
            let run = &done[at..at + n];
            at += n;
            if self.unmap_old_run(r, first, n) {
                for l in run.iter().filter(|l| !l.free) {
                    r.unreserve(r.page_addr(l.page), r.page_bytes, l.freed);
                }
            } else {
                // Still mapped: keep them out of use (and their pages out of
                // a release) until a later try.
                for &l in run {
                    r.lent_again(l);
                }
            }
        }
    }

    /// Unmap the `n` old addresses of lent pages in `r` from granule
    /// `first` (one driver call), counted; whether the driver did. The
    /// caller takes them off the `lent` list.
    pub(super) fn unmap_old_run(&self, r: &Region, first: usize, n: usize) -> bool {
        let bytes = n as u64 * r.page_bytes;
        if self.device.vm_unmap(r.page_addr(first), bytes).is_err() {
            return false;
        }
        self.lent_now.fetch_sub(bytes, Ordering::Relaxed);
        self.unmapped.fetch_add(n as u64, Ordering::Relaxed);
        true
    }

    /// Unmap the old addresses (in the regions of `page`-byte pages) that
    /// still map one of `handles`, where the frees that made them idle are
    /// known complete (a completed event or an idle stream: no host wait).
    /// Recycling unmaps a page's current address only: an address it was
    /// lent from earlier can still map it, and until that goes the page
    /// cannot be released. Spare pages so held (84 MiB of a Llama decoder's
    /// 1.85 GiB, while it created pages of the other size past the soft
    /// cap) are what this returns to the device.
    fn unmap_old_addresses_of(&self, page: u64, handles: &[PhysHandle]) {
        for region in self.regions_of(page) {
            let mut r = region.lock();
            if r.lent.iter().any(|l| handles.contains(&l.handle)) {
                self.refresh(&mut r, Completion::Query);
                self.unmap_lent_of(&mut r, |l| handles.contains(&l.handle));
            }
        }
    }

    /// Whether an old address of some region still maps `handle`.
    fn still_lent(&self, handle: PhysHandle) -> bool {
        self.every_region().iter().any(|region| region.lock().lent.iter().any(|l| l.handle == handle))
    }

    /// `refresh` with no host wait: completed seal events, an idle stream.
    pub(super) fn learn_completed(&self, r: &mut Region) {
        self.refresh(r, Completion::Query);
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
            Completion::WaitOwn(own) if own == r.stream => self.device.synchronize_stream(r.stream).is_ok(),
            Completion::WaitOwn(_) => self.device.stream_query(r.stream) == Ok(true),
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
        self.give_back(excess, Completion::Wait, may_unmap)
    }

    /// Give idle memory back for a caller outside the arena that needs
    /// `need` bytes under the same budget (`wait`: synchronise streams).
    pub fn relieve(&self, need: u64, wait: bool, may_unmap: bool) -> u64 {
        let completion = if wait { Completion::Wait } else { Completion::Query };
        self.give_back(need, completion, may_unmap)
    }

    /// Release at least `bytes` to the device where there is that much:
    /// spare pages first, then idle ones whose frees are complete (as sure
    /// as `completion` asks), large pages before small ones. The bytes
    /// released.
    fn give_back(&self, bytes: u64, completion: Completion, may_unmap: bool) -> u64 {
        if may_unmap {
            // Old addresses of lent pages first, in every region: a page
            // one still maps cannot be released (recycling below visits
            // only the regions it needs).
            for region in self.every_region() {
                let mut r = region.lock();
                self.refresh(&mut r, completion);
                self.unmap_lent(&mut r);
            }
        }
        let mut released = 0;
        for page in [self.large_page_bytes, self.page_bytes] {
            released += self.release_spare(bytes.saturating_sub(released).div_ceil(page) as usize, page);
        }
        if may_unmap {
            for page in [self.large_page_bytes, self.page_bytes] {
                released += self.release_idle(page, bytes.saturating_sub(released), completion);
            }
        }
        released
    }

    /// Release up to `count` spare pages of `page` bytes; the bytes
    /// released.
    fn release_spare(&self, count: usize, page: u64) -> u64 {
        let large = self.is_large(page);
        let pages = {
            let mut spare = lock(&self.spare);
            let list = spare.of(large);
            let keep = list.len().saturating_sub(count);
            list.split_off(keep)
        };
        // A page an old address still maps is released only once that
        // address is unmapped (releasing it before would not free the
        // memory, and the budget would count it gone): such addresses are
        // unmapped here where their frees are complete.
        let lent: Vec<PhysHandle> = pages.iter().copied().filter(|&h| self.still_lent(h)).collect();
        if !lent.is_empty() {
            self.unmap_old_addresses_of(page, &lent);
        }
        let mut released = 0;
        for handle in pages {
            if lent.contains(&handle) && self.still_lent(handle) {
                lock(&self.spare).of(large).push(handle);
                continue;
            }
            match self.device.vm_release(handle) {
                Ok(()) => {
                    self.held.sub(page);
                    released += page;
                }
                Err(_) => lock(&self.spare).of(large).push(handle),
            }
        }
        if let (Some(log), true) = (&self.log, released > 0) {
            // Released at once: no pending time between the two rows.
            log.released(0, released);
            log.retired(released, released / page);
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::super::tests::sim_arena;

    #[test]
    fn the_slack_widens_only_by_pages_lent_at_the_live_peak_and_to_a_32nd_at_most() {
        let (_sim, arena, _s) = sim_arena();
        let page = arena.page_bytes;
        let pages = |n: u64| n * page;
        arena.peak_live.store(pages(1024), Ordering::Relaxed);
        assert_eq!(arena.soft_cap(), pages(1024 + 16), "the live peak plus 1/64");
        // Lent well below the peak: idle pages of shapes past, no widening.
        arena.live.store(pages(900), Ordering::Relaxed);
        arena.widen_at_peak(pages(8));
        assert_eq!(arena.soft_cap(), pages(1024 + 16), "lent below the peak");
        // Lent within 1/64 of the peak: the layout needs the room there.
        arena.live.store(pages(1009), Ordering::Relaxed);
        arena.widen_at_peak(pages(8));
        assert_eq!(arena.soft_cap(), pages(1024 + 16 + 8), "lent at the peak");
        arena.live.store(pages(1024), Ordering::Relaxed);
        arena.widen_at_peak(pages(100));
        assert_eq!(arena.soft_cap(), pages(1024 + 32), "never past the live peak plus 1/32");
        // A tiny peak still gets one page of slack, and no widening room.
        let (_sim, small, _s) = sim_arena();
        small.peak_live.store(pages(10), Ordering::Relaxed);
        small.live.store(pages(10), Ordering::Relaxed);
        small.widen_at_peak(pages(4));
        assert_eq!(small.soft_cap(), pages(11), "one page");
    }
}
