//! The arena (DESIGN.md "Physical memory"), the async allocator's default
//! memory, on the sim backend's model of the virtual-memory API: exact
//! accounting against what the device holds, coalescing, the footprint
//! bound on changing sizes, the pressure path, completion before a page
//! moves, stale handles on reused addresses, trim.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xlog_cuda::device::FaultKind;
use xlog_cuda::{Access, Backend, Config, ResourceError, Runtime, StreamId};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The arena's physical page: one of the sim's 2 MiB mapping granules
/// (Hopper's), `PAGE_GRANULES` in `src/resources/arena/mod.rs`.
const PAGE: u64 = 2 * MIB;
/// Blocks from 256 MiB are large and mapped in pages of 16 MiB
/// (`LARGE_BLOCK_PAGES`, `LARGE_PAGE_PAGES`).
const LARGE_BLOCK: u64 = 128 * PAGE;
const LARGE_PAGE: u64 = 8 * PAGE;

fn open(budget: u64) -> Arc<Runtime> {
    let config = Config { backend: Backend::Sim, budget_bytes: budget, sim_capacity_bytes: 512 * MIB, ..Config::default() };
    assert!(config.arena, "the arena is the default");
    Runtime::open(0, &config).unwrap()
}

/// The device's bytes for xlog (sim physical memory) equal what xlog
/// charges and reports as held, and the budget, if any, is not passed.
fn check_exact(rt: &Runtime, what: &str) {
    let physical = rt.sim().unwrap().physical_bytes();
    let u = rt.usage();
    assert_eq!(u.outstanding_bytes(), physical, "{what}: held vs device");
    assert_eq!(u.live_bytes + u.cached_bytes + u.pending_bytes, physical, "{what}: views add up");
    assert_eq!(physical % PAGE, 0, "{what}: whole pages");
    if let Some(budget) = rt.budget() {
        assert_eq!(budget.reserved(), physical, "{what}: the charge is the device's number");
        assert!(physical <= budget.limit(), "{what}: device {physical} above the limit {}", budget.limit());
    }
}

/// The held peak stays within the arena's bound: the live peak in pages,
/// plus the widest slack (1/32) and two pages.
fn check_footprint(rt: &Runtime, what: &str) {
    let stats = rt.stats().unwrap();
    let bound = (stats.peak_live_bytes.div_ceil(PAGE) * 33 / 32 + 2) * PAGE;
    assert!(
        stats.peak_outstanding_bytes <= bound,
        "{what}: held peak {} vs live peak {} (bound {bound})",
        stats.peak_outstanding_bytes,
        stats.peak_live_bytes
    );
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn the_charge_is_exactly_what_the_device_holds() {
    let rt = open(256 * MIB);
    let (s, t) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let mut rng = Rng(7);
    let mut live = Vec::new();
    for i in 0..400 {
        if live.len() < 24 && rng.below(3) != 0 {
            let bytes = 1 + rng.below(3 * MIB);
            let stream = if rng.below(2) == 0 { s } else { t };
            live.push(rt.allocate(bytes, stream, "x").unwrap());
        } else if !live.is_empty() {
            let b = live.swap_remove(rng.below(live.len() as u64) as usize);
            rt.deallocate(&b.id).unwrap();
        }
        check_exact(&rt, &format!("op {i}"));
    }
    for b in live {
        rt.deallocate(&b.id).unwrap();
    }
    rt.trim(0).unwrap();
    check_exact(&rt, "after trim");
    assert_eq!(rt.sim().unwrap().physical_bytes(), 0, "trim gives every idle page back");
}

#[test]
fn freed_blocks_coalesce_and_serve_another_shape_without_new_memory() {
    let rt = open(0);
    let s = rt.acquire_stream().unwrap();
    let blocks: Vec<_> = (0..6).map(|_| rt.allocate(MIB, s, "small").unwrap()).collect();
    let held = rt.usage().outstanding_bytes();
    assert_eq!(held, (6 * MIB).div_ceil(PAGE) * PAGE, "six 1 MiB blocks pack into whole pages, none left half used");
    for b in &blocks {
        rt.deallocate(&b.id).unwrap();
    }
    let misses = rt.usage().cache_misses;
    let big = rt.allocate(6 * MIB, s, "big").unwrap();
    assert_eq!(big.id.ptr, blocks[0].id.ptr, "the coalesced range starts where the first block did");
    assert_eq!(rt.usage().outstanding_bytes(), held, "no new memory for the new shape");
    assert_eq!(rt.usage().cache_misses, misses, "a hit: every page was mapped");
    rt.deallocate(&big.id).unwrap();
}

#[test]
fn changing_sizes_stay_near_the_live_peak() {
    // A training-like loop on one stream: each step allocates activations
    // whose sizes scale with a new sequence length, frees them in reverse,
    // with a few long-lived blocks in between.
    let rt = open(0);
    let s = rt.acquire_stream().unwrap();
    let mut rng = Rng(11);
    let weights: Vec<_> = (0..8).map(|i| rt.allocate(300 * KIB + i * 4 * KIB, s, "weights").unwrap()).collect();
    let mut peak_held = 0;
    for _step in 0..300 {
        let len = 64 + rng.below(960);
        let mut acts = Vec::new();
        for layer in 0..12 {
            acts.push(rt.allocate(len * (16 + layer) * KIB / 16, s, "act").unwrap());
            if layer % 3 == 0 {
                let tmp = rt.allocate(len * 3 * KIB, s, "tmp").unwrap();
                rt.deallocate(&tmp.id).unwrap();
            }
        }
        peak_held = peak_held.max(rt.usage().outstanding_bytes());
        while let Some(b) = acts.pop() {
            rt.deallocate(&b.id).unwrap();
        }
        check_exact(&rt, "step");
    }
    check_footprint(&rt, "changing sizes");
    for b in weights {
        rt.deallocate(&b.id).unwrap();
    }
}

#[test]
fn idle_memory_is_never_refused_sizes_that_change_each_step() {
    // Issue 24's first pressure case: three blocks of (step % 7 + 1) MiB,
    // a pause, the frees; a 64 MiB budget; default config.
    for attempt in 0..50 {
        let rt = open(64 * MIB);
        let s = rt.acquire_stream().unwrap();
        for step in 0..10u64 {
            let bytes = (step % 7 + 1) * MIB;
            let blocks: Vec<_> = (0..3)
                .map(|i| rt.allocate(bytes, s, "step").unwrap_or_else(|e| panic!("attempt {attempt} step {step} block {i}: {e}")))
                .collect();
            std::thread::sleep(Duration::from_micros(200));
            for b in blocks {
                rt.deallocate(&b.id).unwrap();
            }
            check_exact(&rt, "step");
        }
    }
}

#[test]
fn a_refusal_never_stands_while_the_call_could_use_what_it_frees() {
    // Issue 24's second pressure case: 8 MiB budget, 24 x 256 KiB allocated
    // and freed, then 6 MiB.
    for attempt in 0..50 {
        let rt = open(8 * MIB);
        let s = rt.acquire_stream().unwrap();
        let blocks: Vec<_> = (0..24).map(|_| rt.allocate(256 * KIB, s, "small").unwrap()).collect();
        for b in blocks {
            rt.deallocate(&b.id).unwrap();
        }
        let big = rt.allocate(6 * MIB, s, "big").unwrap_or_else(|e| panic!("attempt {attempt}: {e}"));
        check_exact(&rt, "after the big block");
        rt.deallocate(&big.id).unwrap();
    }
}

#[test]
fn another_streams_idle_pages_are_lent_behind_a_gpu_wait() {
    // Three pages of budget. Stream a frees two pages that are not
    // adjacent (x and z, around y) behind a host callback that holds the
    // stream. Stream b needs two contiguous pages: no mapped range anywhere
    // fits, and a's frees are still running, so the pages cannot be
    // unmapped and moved. They are lent: mapped a second time for b, with
    // b made to wait on the GPU for a's work: no refusal, no new page and
    // no host wait (the allocation returns while a is still held), and
    // b's work runs only after a's.
    let rt = open(3 * PAGE);
    let (a, b) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let [x, y, z] = ["x", "y", "z"].map(|tag| rt.allocate(PAGE, a, tag).unwrap());
    assert_eq!((y.id.ptr - x.id.ptr, z.id.ptr - y.id.ptr), (PAGE, PAGE));
    let gate = Arc::new(AtomicBool::new(false));
    let g = gate.clone();
    rt.enqueue_host(
        a,
        Box::new(move || {
            while !g.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }),
    )
    .unwrap();
    rt.deallocate(&x.id).unwrap();
    rt.deallocate(&z.id).unwrap();
    let w = rt.allocate(2 * PAGE, b, "w").unwrap_or_else(|e| panic!("refused while a's idle pages could be lent: {e}"));
    let a_was_done = !gate.load(Ordering::Acquire);
    assert!(a_was_done, "the allocation did not wait for stream a on the host");
    assert_eq!(rt.usage().outstanding_bytes(), 3 * PAGE, "a's two idle pages, lent: no new page");
    assert!(w.id.ptr != x.id.ptr && w.id.ptr != z.id.ptr, "the pages are mapped at a new address for b");
    check_exact(&rt, "after the lending");
    // b's work is ordered after a's (the gate) by a GPU-side wait.
    let b_saw_gate = Arc::new(AtomicBool::new(false));
    let (g, seen) = (gate.clone(), b_saw_gate.clone());
    rt.enqueue_host(b, Box::new(move || seen.store(g.load(Ordering::Acquire), Ordering::Release))).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    gate.store(true, Ordering::Release);
    rt.synchronize(b).unwrap();
    assert!(b_saw_gate.load(Ordering::Acquire), "b's work ran before a's had finished");
    // a's old addresses never served anything meanwhile; once a is done
    // they are unmapped (recycling) and the budget still holds exactly.
    rt.synchronize(a).unwrap();
    rt.deallocate(&w.id).unwrap();
    rt.deallocate(&y.id).unwrap();
    let again = rt.allocate(3 * PAGE, a, "all").unwrap_or_else(|e| panic!("the three pages, idle and complete: {e}"));
    assert_eq!(rt.usage().outstanding_bytes(), 3 * PAGE);
    check_exact(&rt, "after the old addresses were given up");
    rt.deallocate(&again.id).unwrap();
}

#[test]
fn with_wait_on_pressure_the_refusal_waits_for_the_other_stream_instead() {
    let config = Config {
        backend: Backend::Sim,
        budget_bytes: PAGE,
        wait_on_pressure: true,
        sim_capacity_bytes: 64 * MIB,
        ..Config::default()
    };
    let rt = Runtime::open(0, &config).unwrap();
    let (a, b) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let x = rt.allocate(PAGE, a, "x").unwrap();
    rt.enqueue_host(a, Box::new(|| std::thread::sleep(Duration::from_millis(30)))).unwrap();
    rt.deallocate(&x.id).unwrap();
    let y = rt.allocate(PAGE, b, "y").unwrap();
    check_exact(&rt, "after the wait");
    rt.deallocate(&y.id).unwrap();
}

#[test]
fn a_stale_handle_to_a_reused_arena_address_is_rejected() {
    let rt = open(0);
    let (s, t) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let old = rt.allocate(4096, s, "old").unwrap();
    rt.deallocate(&old.id).unwrap();
    let new = rt.allocate(4096, s, "new").unwrap();
    assert_eq!(new.id.ptr, old.id.ptr, "the address is reused at once");
    assert_ne!(new.id.generation, old.id.generation);
    for r in [rt.deallocate(&old.id).map(|_| ()), rt.prepare(&old.id, t, Access::Read)] {
        assert!(matches!(r, Err(ResourceError::UseAfterFree { .. })), "{r:?}");
    }
    rt.sim().unwrap().fill(new.id.ptr, 4096, 7).unwrap();
    assert_eq!(rt.sim().unwrap().read(new.id.ptr + 4095, 1).unwrap(), vec![7]);
    rt.deallocate(&new.id).unwrap();
}

/// Four threads, each on a stream of its own, `ops` steps each: allocate
/// `size(rng)` bytes (while fewer than `max_live` are live) or free a
/// random live block; the device never holds more than `limit` meanwhile.
/// The refusals, all threads together.
fn four_threads(rt: &Arc<Runtime>, limit: u64, seed: u64, ops: usize, max_live: usize, size: fn(&mut Rng) -> u64) -> u64 {
    let handles: Vec<_> = (0..4u64)
        .map(|k| {
            let rt = rt.clone();
            std::thread::spawn(move || {
                let s: StreamId = rt.acquire_stream().unwrap();
                let mut rng = Rng(seed + k);
                let (mut live, mut refused) = (Vec::new(), 0);
                for _ in 0..ops {
                    if live.len() < max_live && rng.below(2) == 0 {
                        match rt.allocate(size(&mut rng), s, "t") {
                            Ok(b) => live.push(b),
                            Err(ResourceError::OutOfBudget { .. }) => refused += 1,
                            Err(e) => panic!("{e}"),
                        }
                    } else if !live.is_empty() {
                        let b = live.swap_remove(rng.below(live.len() as u64) as usize);
                        rt.deallocate(&b.id).unwrap();
                    }
                    assert!(rt.sim().unwrap().physical_bytes() <= limit);
                }
                for b in live {
                    rt.deallocate(&b.id).unwrap();
                }
                rt.synchronize(s).unwrap();
                refused
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

#[test]
fn the_device_never_holds_more_than_the_budget_under_four_threads() {
    let limit = 48 * MIB;
    let rt = open(limit);
    four_threads(&rt, limit, 100, 400, 6, |rng| 1 + rng.below(4 * MIB));
    check_exact(&rt, "after the threads");
}

#[test]
fn idle_pages_of_one_stream_serve_another_so_phases_share_memory() {
    // Two streams that take turns (a query engine's stages, say): each
    // peaks at about 40 MiB in its turn. Without moving idle pages the
    // device would hold both peaks; with them, about one.
    let rt = open(0);
    let streams = [rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap()];
    let mut rng = Rng(5);
    for round in 0..40 {
        let s = streams[round % 2];
        let blocks: Vec<_> = (0..8).map(|_| rt.allocate(4 * MIB + rng.below(MIB), s, "stage").unwrap()).collect();
        for b in blocks {
            rt.deallocate(&b.id).unwrap();
        }
        check_exact(&rt, "round");
    }
    check_footprint(&rt, "the streams' idle pages were not shared");
    assert!(rt.usage().cache_misses > 2);
}

/// Slow work queued on `s` (a host callback of 40 ms): the flag it sets
/// when done.
fn slow_work(rt: &Runtime, s: StreamId) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    rt.enqueue_host(
        s,
        Box::new(move || {
            std::thread::sleep(Duration::from_millis(40));
            flag.store(true, Ordering::Release);
        }),
    )
    .unwrap();
    done
}

/// Whether work queued on `s` now runs after what set `done` (it reads
/// the flag when it runs; `s` is synchronised).
fn runs_after(rt: &Runtime, s: StreamId, done: &Arc<AtomicBool>) -> bool {
    let seen = Arc::new(AtomicBool::new(false));
    let (flag, seen2) = (done.clone(), seen.clone());
    rt.enqueue_host(s, Box::new(move || seen2.store(flag.load(Ordering::Acquire), Ordering::Release))).unwrap();
    rt.synchronize(s).unwrap();
    seen.load(Ordering::Acquire)
}

#[test]
fn another_stream_takes_mapped_memory_after_the_owners_work_on_the_gpu() {
    // Stream a's block is freed behind slow work on a; stream b allocates
    // the same size: it gets a's mapped memory (no new page, no host wait)
    // and its work runs only after a's.
    let rt = open(0);
    let (a, b) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let x = rt.allocate(4 * MIB, a, "x").unwrap();
    let held = rt.usage().outstanding_bytes();
    let done_on_a = slow_work(&rt, a);
    rt.deallocate(&x.id).unwrap();
    let y = rt.allocate(4 * MIB, b, "y").unwrap();
    assert_eq!(y.id.ptr, x.id.ptr, "b took a's mapped range");
    assert_eq!(rt.usage().outstanding_bytes(), held, "no new memory");
    assert!(runs_after(&rt, b, &done_on_a), "b's work ran before a's finished: the hand-out was not fenced");
    // Freed on b, the range goes back to a's region once b's free is
    // complete: a reuses it without new memory.
    rt.deallocate(&y.id).unwrap();
    rt.synchronize(b).unwrap();
    let z = rt.allocate(4 * MIB, a, "z").unwrap();
    assert_eq!(z.id.ptr, x.id.ptr);
    assert_eq!(rt.usage().outstanding_bytes(), held);
    check_exact(&rt, "after the round trip");
    rt.deallocate(&z.id).unwrap();
}

#[test]
fn another_stream_takes_mapped_space_past_a_best_fit_that_is_not_mapped() {
    // Stream a's region holds a free 5 MiB range whose middle pages were
    // trimmed (the best fit for 4.5 MiB, not mapped) and a free 8 MiB
    // range still mapped. Stream b's 4.5 MiB block takes the mapped one:
    // no new page, where taking the best fit only would have missed.
    let rt = open(0);
    let (a, b) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let p = rt.allocate(8 * MIB, a, "p").unwrap();
    let q = rt.allocate(MIB, a, "q").unwrap();
    let r = rt.allocate(5 * MIB, a, "r").unwrap();
    let s = rt.allocate(MIB, a, "s").unwrap();
    assert_eq!((q.id.ptr, r.id.ptr, s.id.ptr), (p.id.ptr + 8 * MIB, p.id.ptr + 9 * MIB, p.id.ptr + 14 * MIB), "carved in order");
    rt.deallocate(&r.id).unwrap();
    rt.trim(0).unwrap();
    rt.deallocate(&p.id).unwrap();
    // Another size on a merges p's free into the free ranges (its recent
    // list holds it until then); it lands in r's old range, on q's page.
    let t = rt.allocate(256 * KIB, a, "t").unwrap();
    assert_eq!(t.id.ptr, r.id.ptr, "a's own hit");
    let held = rt.usage().outstanding_bytes();
    let misses = rt.usage().cache_misses;
    let y = rt.allocate(4 * MIB + 512 * KIB, b, "y").unwrap();
    assert_eq!(y.id.ptr, p.id.ptr, "b took a's mapped 8 MiB range");
    assert_eq!(rt.usage().outstanding_bytes(), held, "no new page");
    assert_eq!(rt.usage().cache_misses, misses, "a hit");
    check_exact(&rt, "after b's block");
    for x in [q, s, t, y] {
        rt.deallocate(&x.id).unwrap();
    }
    check_exact(&rt, "all freed");
}

#[test]
fn a_big_miss_goes_where_most_of_its_pages_are_mapped_after_that_streams_work() {
    // Stream a's region has 29 MiB of mapped free space followed by
    // address space never mapped. Stream b's 33 MiB block fits no mapped
    // range, and b's own region would map all 17 of its pages: it goes
    // to a's region, after a's 29 MiB, and maps the 2 pages missing there
    // (spread_miss.rs), its work ordered after a's on the GPU.
    let rt = open(0);
    let (a, b) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let x = rt.allocate(30 * MIB, a, "x").unwrap();
    let done_on_a = slow_work(&rt, a);
    rt.deallocate(&x.id).unwrap();
    // Another size on a merges x's free (its recent list holds it until
    // then) and takes the first MiB.
    let y = rt.allocate(MIB, a, "y").unwrap();
    assert_eq!(y.id.ptr, x.id.ptr);
    let (held, misses) = (rt.usage().outstanding_bytes(), rt.usage().cache_misses);
    let z = rt.allocate(33 * MIB, b, "z").unwrap();
    assert_eq!(z.id.ptr, x.id.ptr + MIB, "b's block went to a's mapped space");
    assert_eq!(rt.usage().outstanding_bytes(), held + 2 * PAGE, "two pages mapped, not 17");
    assert_eq!(rt.usage().cache_misses, misses + 1);
    assert!(runs_after(&rt, b, &done_on_a), "b's work ran before a's finished: the placement was not fenced");
    check_exact(&rt, "after b's block");
    check_footprint(&rt, "b's block");
    for blk in [y, z] {
        rt.deallocate(&blk.id).unwrap();
    }
    check_exact(&rt, "all freed");
}

#[test]
fn a_block_freed_in_another_streams_region_coalesces_there_at_once() {
    // b takes the upper half of a's mapped 8 MiB and frees it behind slow
    // work on b, the GPU still busy: the range joins a's free ranges at
    // once and coalesces with a's free 2 MiB below it (across_streams.rs),
    // so a third stream's 6 MiB block takes the whole with no new page and
    // no host wait, its work ordered after b's.
    let rt = open(0);
    let (a, b, c) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let x1 = rt.allocate(4 * MIB, a, "x1").unwrap();
    let x2 = rt.allocate(4 * MIB, a, "x2").unwrap();
    assert_eq!(x2.id.ptr, x1.id.ptr + 4 * MIB);
    rt.deallocate(&x1.id).unwrap();
    rt.deallocate(&x2.id).unwrap();
    rt.synchronize(a).unwrap();
    let y = rt.allocate(4 * MIB, b, "y").unwrap();
    assert_eq!(y.id.ptr, x2.id.ptr, "b took a's recent free of its size");
    let w = rt.allocate(2 * MIB, a, "w").unwrap();
    assert_eq!(w.id.ptr, x1.id.ptr, "a's 2 MiB block took the front of x1");
    let done_on_b = slow_work(&rt, b);
    rt.deallocate(&y.id).unwrap();
    let (held, misses) = (rt.usage().outstanding_bytes(), rt.usage().cache_misses);
    let z = rt.allocate(6 * MIB, c, "z").unwrap();
    assert_eq!(z.id.ptr, x1.id.ptr + 2 * MIB, "c's block spans a's free 2 MiB and b's freed 4 MiB");
    assert_eq!(rt.usage().outstanding_bytes(), held, "no page mapped");
    assert_eq!(rt.usage().cache_misses, misses, "a hit");
    assert!(runs_after(&rt, c, &done_on_b), "c's work ran before b's finished: the free was not fenced");
    check_exact(&rt, "after z");
    for blk in [w, z] {
        rt.deallocate(&blk.id).unwrap();
    }
    check_exact(&rt, "all freed");
}

#[test]
fn streams_that_take_turns_share_partly_used_pages() {
    // Four streams each keep one live block of 1.5 MiB. In regions of their
    // own they would hold four pages (each stream's partial page); placed
    // where the fewest pages are missing, in any stream's region, they
    // share pages: three.
    let rt = open(0);
    let streams: Vec<_> = (0..4).map(|_| rt.acquire_stream().unwrap()).collect();
    let blocks: Vec<_> = streams.iter().map(|&s| rt.allocate(3 * MIB / 2, s, "b").unwrap()).collect();
    assert_eq!(rt.usage().outstanding_bytes(), 3 * PAGE, "four 1.5 MiB blocks on four streams");
    check_exact(&rt, "four streams");
    for b in blocks {
        rt.deallocate(&b.id).unwrap();
    }
    check_exact(&rt, "all freed");
}

/// A stream of the sim device's own, imported into `rt` (as an engine
/// imports the streams it makes): the runtime's id and the raw handle the
/// caller destroys once it has released the id.
fn import_new_stream(rt: &Runtime) -> (StreamId, u64) {
    let device = rt.device().clone();
    let raw = device.create_stream().unwrap();
    (rt.import_stream(device.native_stream(raw)).unwrap(), raw)
}

/// Release the imported `s`, then destroy its stream (`import_new_stream`).
fn release_and_destroy(rt: &Runtime, (s, raw): (StreamId, u64)) {
    rt.release_stream(s).unwrap();
    rt.device().destroy_stream(raw).unwrap();
}

#[test]
fn a_block_freed_into_a_released_streams_region_is_fenced_for_the_next_stream() {
    // b takes mapped space of imported stream s's region; s is released and
    // destroyed; b frees its block behind slow work. The region outlives
    // s: the block joins its free ranges, and c's block of the size takes
    // it with no new page, its work ordered after b's. No driver call ever
    // names the destroyed stream (on CUDA each would be undefined: the
    // handle may be another stream's by then).
    let rt = open(0);
    let sim = rt.sim().unwrap();
    let s = import_new_stream(&rt);
    let x = rt.allocate(4 * MIB, s.0, "x").unwrap();
    rt.deallocate(&x.id).unwrap();
    let b = rt.acquire_stream().unwrap();
    let y = rt.allocate(4 * MIB, b, "y").unwrap();
    assert_eq!(y.id.ptr, x.id.ptr, "b took s's mapped range");
    release_and_destroy(&rt, s);
    let done_on_b = slow_work(&rt, b);
    rt.deallocate(&y.id).unwrap();
    let held = rt.usage().outstanding_bytes();
    let c = rt.acquire_stream().unwrap();
    let z = rt.allocate(4 * MIB, c, "z").unwrap();
    assert_eq!(z.id.ptr, x.id.ptr, "c took the range b freed into the released stream's region");
    assert_eq!(rt.usage().outstanding_bytes(), held, "no page mapped");
    assert!(runs_after(&rt, c, &done_on_b), "c's work ran before b's finished: the free was not fenced");
    assert_eq!(sim.destroyed_stream_calls(), 0, "a driver call named the destroyed stream");
    rt.deallocate(&z.id).unwrap();
    check_exact(&rt, "all freed");
}

#[test]
fn streams_made_per_query_reuse_the_memory_and_address_space_of_released_ones() {
    // An engine that makes a stream per query: import, allocate a block a
    // little larger each time (small ones, and large ones of their own
    // regions), free, release, destroy. Each query's stream takes over the
    // address space the released ones left (no new reservation once the
    // first query of each kind made one), its mapped memory serves them,
    // and no driver call names a destroyed stream.
    let rt = open(0);
    let sim = rt.sim().unwrap();
    let mut reservations = 0;
    for i in 0..8u64 {
        let s = import_new_stream(&rt);
        let small = rt.allocate(4 * MIB + i * MIB / 2, s.0, "small").unwrap();
        let large = rt.allocate(LARGE_BLOCK + i * LARGE_PAGE, s.0, "large").unwrap();
        rt.deallocate(&small.id).unwrap();
        rt.deallocate(&large.id).unwrap();
        release_and_destroy(&rt, s);
        if i == 0 {
            reservations = sim.reservations();
        }
        assert_eq!(sim.reservations(), reservations, "query {i} reserved address space of its own");
        check_exact(&rt, "after a query");
        check_footprint(&rt, "after a query");
    }
    assert_eq!(sim.destroyed_stream_calls(), 0, "a driver call named a destroyed stream");
}

#[test]
fn another_streams_small_allocation_leaves_a_streams_recent_free_to_it() {
    // The case cuda_free_while_reading_test checks on a GPU: X freed on a,
    // an unrelated small block on d, then Y of X's size on a reuses X's
    // address (a's same-size reuse is not taken by a hand-out to d).
    let rt = open(0);
    let (a, d) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let x = rt.allocate(MIB, a, "x").unwrap();
    rt.deallocate(&x.id).unwrap();
    let scratch = rt.allocate(256, d, "unrelated").unwrap();
    let y = rt.allocate(MIB, a, "y").unwrap();
    assert_eq!(y.id.ptr, x.id.ptr);
    assert_ne!(scratch.id.ptr, x.id.ptr);
    rt.deallocate(&scratch.id).unwrap();
    rt.deallocate(&y.id).unwrap();
}

#[test]
fn peer_access_reaches_every_mapping_present_and_future() {
    // cuCtxEnablePeerAccess does not cover virtual-memory mappings: the
    // arena grants the peer access to each page itself.
    let config = |budget| Config { backend: Backend::Sim, sim_devices: 2, sim_capacity_bytes: 64 * MIB, budget_bytes: budget, ..Config::default() };
    let (rt0, rt1) = (Runtime::open(0, &config(0)).unwrap(), Runtime::open(1, &config(0)).unwrap());
    let s = rt0.acquire_stream().unwrap();
    let before = rt0.allocate(MIB, s, "before").unwrap();
    assert_eq!(rt0.sim().unwrap().access_of(before.id.ptr), vec![0]);
    rt0.enable_peer_access(&rt1).unwrap();
    assert_eq!(rt0.sim().unwrap().access_of(before.id.ptr), vec![0, 1], "an existing page");
    let after = rt0.allocate(8 * MIB, s, "after").unwrap();
    assert_eq!(rt0.sim().unwrap().access_of(after.id.ptr + 7 * MIB), vec![0, 1], "a page mapped later");
    rt0.deallocate(&before.id).unwrap();
    rt0.deallocate(&after.id).unwrap();
}

#[test]
fn two_arenas_on_one_thread_keep_their_regions_apart() {
    // The arena remembers, per thread, the region it allocated from last;
    // two runtimes used in turn from one thread (whose streams may have the
    // same native values) must never take or free in each other's memory.
    let (one, two) = (open(0), open(0));
    let (s1, s2) = (one.acquire_stream().unwrap(), two.acquire_stream().unwrap());
    for round in 0..50u64 {
        let size = (round % 5 + 1) * 300 * KIB;
        let a = one.allocate(size, s1, "one").unwrap();
        let b = two.allocate(size, s2, "two").unwrap();
        assert_ne!(a.id.ptr, b.id.ptr, "round {round}: one address in two arenas");
        one.sim().unwrap().fill(a.id.ptr, size, 1).unwrap();
        two.sim().unwrap().fill(b.id.ptr, size, 2).unwrap();
        assert_eq!(one.sim().unwrap().read(a.id.ptr + size - 1, 1).unwrap(), vec![1]);
        two.deallocate(&b.id).unwrap();
        one.deallocate(&a.id).unwrap();
        check_exact(&one, "first runtime");
        check_exact(&two, "second runtime");
    }
    assert_eq!((one.usage().live_bytes, two.usage().live_bytes), (0, 0));
}

#[test]
fn the_stats_count_every_page_mapped_and_unmapped() {
    let rt = open(0);
    let s = rt.acquire_stream().unwrap();
    let st = rt.stats().unwrap();
    assert_eq!((st.pages_mapped, st.pages_unmapped), (0, 0));
    let a = rt.allocate(5 * MIB, s, "a").unwrap();
    let st = rt.stats().unwrap();
    let pages = (5 * MIB).div_ceil(PAGE);
    assert_eq!(st.pages_mapped, pages, "5 MiB from a fresh region spans whole pages");
    assert_eq!(st.pages_mapped * PAGE, st.outstanding_bytes, "every page held was mapped once");
    rt.deallocate(&a.id).unwrap();
    // The same shape again: a hit, nothing mapped.
    for _ in 0..10 {
        let b = rt.allocate(5 * MIB, s, "b").unwrap();
        rt.deallocate(&b.id).unwrap();
    }
    assert_eq!(rt.stats().unwrap().pages_mapped, pages, "a repeating shape maps nothing more");
    rt.trim(0).unwrap();
    let st = rt.stats().unwrap();
    assert_eq!(st.pages_unmapped, pages, "trim unmapped every idle page");
    assert_eq!(st.outstanding_bytes, 0);
    rt.release_stream(s).unwrap();
}

#[test]
fn large_blocks_map_large_pages_and_small_blocks_use_the_room_they_leave() {
    let rt = open(0);
    let s = rt.acquire_stream().unwrap();
    let big = rt.allocate(LARGE_BLOCK, s, "logits").unwrap();
    let st = rt.stats().unwrap();
    assert_eq!(st.pages_mapped, LARGE_BLOCK / LARGE_PAGE, "one driver call per 16 MiB");
    assert_eq!(st.outstanding_bytes, LARGE_BLOCK);
    check_exact(&rt, "a large block");
    let small = rt.allocate(PAGE - 1, s, "small").unwrap();
    assert_eq!(rt.stats().unwrap().pages_mapped, LARGE_BLOCK / LARGE_PAGE + 1, "a small block maps a small page");
    rt.deallocate(&big.id).unwrap();
    // The large block's mapped room serves small blocks: no page more.
    let blocks: Vec<_> = (0..80).map(|_| rt.allocate(3 * MIB, s, "activations").unwrap()).collect();
    let st = rt.stats().unwrap();
    assert_eq!(st.pages_mapped, LARGE_BLOCK / LARGE_PAGE + 1, "small blocks took the large block's mapped room");
    assert_eq!(st.outstanding_bytes, LARGE_BLOCK + PAGE);
    check_exact(&rt, "small blocks in the large block's room");
    for b in blocks.iter().chain([&small]) {
        rt.deallocate(&b.id).unwrap();
    }
    rt.trim(0).unwrap();
    check_exact(&rt, "after trim");
    assert_eq!(rt.sim().unwrap().physical_bytes(), 0, "trim gives large and small pages back");
    rt.release_stream(s).unwrap();
}

/// Stream `a` held by a host callback until the returned hold is let go
/// (or dropped, so a failing assertion does not leave the stream stuck):
/// the frees queued on it meanwhile are not complete.
struct Hold {
    gate: Arc<AtomicBool>,
    /// The callback has returned: the stream ran on.
    over: Arc<AtomicBool>,
}

impl Hold {
    /// At most 10 s: a test that waits for the stream on the host fails
    /// its `still_held` check instead of hanging.
    fn on(rt: &Runtime, a: StreamId) -> Hold {
        Hold::at_most(rt, a, Duration::from_secs(10))
    }

    /// A hold that gives up after `limit`, so that a host wait for the
    /// stream inside xlog ends (as it would on a GPU) instead of waiting
    /// for the test to let go.
    fn at_most(rt: &Runtime, a: StreamId, limit: Duration) -> Hold {
        let (gate, over) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (g, o) = (gate.clone(), over.clone());
        let start = std::time::Instant::now();
        rt.enqueue_host(
            a,
            Box::new(move || {
                while !g.load(Ordering::Acquire) && start.elapsed() < limit {
                    std::thread::sleep(Duration::from_millis(1));
                }
                o.store(true, Ordering::Release);
            }),
        )
        .unwrap();
        Hold { gate, over }
    }

    fn still_held(&self) -> bool {
        !self.over.load(Ordering::Acquire)
    }

    /// Whether work queued on `stream` now runs only after the held
    /// stream's callback is over (waits for `stream` on the host).
    fn over_before_work_on(&self, rt: &Runtime, stream: StreamId) -> bool {
        let (over, saw) = (self.over.clone(), Arc::new(AtomicBool::new(false)));
        let seen = saw.clone();
        rt.enqueue_host(stream, Box::new(move || seen.store(over.load(Ordering::Acquire), Ordering::Release))).unwrap();
        rt.synchronize(stream).unwrap();
        saw.load(Ordering::Acquire)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.gate.store(true, Ordering::Release);
    }
}

#[test]
fn under_pressure_a_large_block_takes_small_idle_pages_and_a_small_block_large_ones() {
    // The whole budget is idle in pages of one size whose frees are still
    // running on stream a; stream b asks for a block of the other size.
    // Neither is refused, neither waits on the host: the block goes where
    // the idle pages are, and they are lent to it behind a GPU-side wait.
    for (first, then) in [(PAGE, LARGE_BLOCK), (LARGE_BLOCK, PAGE)] {
        let rt = open(LARGE_BLOCK);
        let (a, b) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
        let blocks: Vec<_> = (0..LARGE_BLOCK / first).map(|_| rt.allocate(first, a, "first").unwrap()).collect();
        assert_eq!(rt.usage().outstanding_bytes(), LARGE_BLOCK, "the budget is held");
        let hold = Hold::on(&rt, a);
        for x in &blocks {
            rt.deallocate(&x.id).unwrap();
        }
        let y = rt.allocate(then, b, "then").unwrap_or_else(|e| panic!("{first} then {then}: refused while idle pages could be lent: {e}"));
        assert!(hold.still_held(), "no host wait for stream a");
        assert_eq!(rt.usage().outstanding_bytes(), LARGE_BLOCK, "{first} then {then}: no page more");
        check_exact(&rt, "after the lending");
        drop(hold);
        rt.synchronize(a).unwrap();
        rt.deallocate(&y.id).unwrap();
        rt.synchronize(b).unwrap();
        rt.trim(0).unwrap();
        check_exact(&rt, "after trim");
        assert_eq!(rt.sim().unwrap().physical_bytes(), 0, "every page given back, lent ones too");
    }
}

#[test]
fn pages_lent_to_a_refused_call_are_complete_before_another_stream_gets_them() {
    // Two pages of budget, both held by stream a; x is freed while a still
    // runs. Stream b asks for three pages: x's page is lent to it (b waits
    // for a on the GPU), no page can be created, and the call is refused.
    // The lent page goes back to the spare pages, which any stream takes
    // with no fence, so it must not get there before a's work is done: a
    // block that stream c then gets on it runs only after a's work.
    let rt = open(2 * PAGE);
    let (a, b, c) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let [x, y] = ["x", "y"].map(|tag| rt.allocate(PAGE, a, tag).unwrap());
    let hold = Hold::at_most(&rt, a, Duration::from_millis(300));
    rt.deallocate(&x.id).unwrap();
    let refused = rt.allocate(3 * PAGE, b, "too much");
    assert!(matches!(refused, Err(ResourceError::OutOfBudget { .. })), "{refused:?}");
    check_exact(&rt, "after the refusal");
    let z = rt.allocate(PAGE, c, "z").unwrap();
    assert!(hold.over_before_work_on(&rt, c), "c's block on x's page ran while a's work (before x's free) still ran");
    drop(hold);
    rt.synchronize(a).unwrap();
    for blk in [z, y] {
        rt.deallocate(&blk.id).unwrap();
    }
    check_exact(&rt, "at the end");
}

#[test]
fn pages_lent_to_a_call_whose_map_fails_are_complete_before_another_stream_gets_them() {
    // Three pages of budget, all held by stream a; x and z (not adjacent)
    // are freed while a still runs. Stream b asks for two pages: no mapped
    // range fits, so both pages are lent to it (b waits for a on the GPU),
    // and the second map fails. The page it did not map goes to the spare
    // pages, which any stream takes with no fence: not before a's work is
    // done. b then takes the page it did map for a block of its own, and
    // stream c gets the spare page; c's work must run after a's.
    let rt = open(3 * PAGE);
    let (a, b, c) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let [x, y, z] = ["x", "y", "z"].map(|tag| rt.allocate(PAGE, a, tag).unwrap());
    let hold = Hold::at_most(&rt, a, Duration::from_millis(300));
    rt.deallocate(&x.id).unwrap();
    rt.deallocate(&z.id).unwrap();
    rt.sim().unwrap().inject_fault(FaultKind::Map, 2);
    let failed = rt.allocate(2 * PAGE, b, "half mapped");
    assert!(matches!(&failed, Err(ResourceError::Driver(m)) if m.contains("injected fault")), "{failed:?}");
    assert_eq!(rt.usage().outstanding_bytes(), 3 * PAGE, "no page was created: b's were a's idle ones, lent");
    check_exact(&rt, "after the failed map");
    let v = rt.allocate(PAGE, b, "v").unwrap();
    let w = rt.allocate(PAGE, c, "w").unwrap();
    assert!(hold.over_before_work_on(&rt, c), "c's block on a lent page ran while a's work (before x's and z's frees) still ran");
    drop(hold);
    rt.synchronize(a).unwrap();
    rt.synchronize(b).unwrap();
    for blk in [v, w, y] {
        rt.deallocate(&blk.id).unwrap();
    }
    check_exact(&rt, "at the end");
}

#[test]
fn large_and_small_blocks_on_four_threads_never_pass_the_budget() {
    // Both page sizes under one budget, four threads each on a stream of
    // its own, sizes from 64 KiB to 400 MiB (one in four large): the
    // streams share memory through lending and the other size's regions.
    // The device never holds more than the limit, the charge is what it
    // holds, and one trim gives everything back.
    let limit = 1536 * MIB;
    let config = Config { backend: Backend::Sim, budget_bytes: limit, sim_capacity_bytes: 4 << 30, ..Config::default() };
    let rt = Runtime::open(0, &config).unwrap();
    let refused = four_threads(&rt, limit, 300, 300, 4, |rng| {
        if rng.below(4) == 0 {
            256 * MIB + rng.below(144 * MIB)
        } else {
            64 * KIB + rng.below(48 * MIB)
        }
    });
    let st = rt.stats().unwrap();
    assert!(st.allocations > refused, "{} allocations, {refused} refused: the threads mostly got memory", st.allocations);
    assert!(st.peak_outstanding_bytes <= limit);
    check_exact(&rt, "after the threads");
    rt.trim(0).unwrap();
    // One trim: the old addresses of pages lent between the threads'
    // regions no longer keep pages from being released (before, one run
    // in about ten left some for a second trim).
    assert_eq!(rt.sim().unwrap().physical_bytes(), 0, "trim gives every page of both sizes back");
}

#[test]
fn random_sizes_large_and_small_stay_near_the_live_peak() {
    // W12's workload on one stream: each step frees about half of the live
    // blocks, then allocates sizes log-uniform from 256 KiB to 900 MiB up
    // to a live target that changes each step. Large blocks (256 MiB and
    // up, 16 MiB pages) and small ones (2 MiB pages) take turns in the
    // same memory: idle pages of one size make room for the other, so the
    // two sizes together stay within the footprint bound (each size
    // creating past it while the other sits idle held 1.058x here).
    let config = Config { backend: Backend::Sim, sim_capacity_bytes: 8 << 30, ..Config::default() };
    let rt = Runtime::open(0, &config).unwrap();
    let s = rt.acquire_stream().unwrap();
    let cap = 5600 * MIB;
    let (low, high) = ((256 * KIB) as f64, (900 * MIB) as f64);
    let mut rng = Rng(0x5eed);
    let mut live: Vec<(xlog_cuda::DeviceBlock, u64)> = Vec::new();
    let unit = |rng: &mut Rng| rng.below(1 << 20) as f64 / (1u64 << 20) as f64;
    // The stream runs a step behind the host, as a GPU does: the frees of
    // a step are not complete while the next step allocates (unless xlog
    // waits for them).
    let mut behind: Option<Hold> = None;
    for step in 0..300 {
        let hold = Hold::at_most(&rt, s, Duration::from_millis(50));
        let mut kept = 0;
        let mut i = 0;
        while i < live.len() {
            if rng.below(2) == 0 {
                let (b, _) = live.swap_remove(i);
                rt.deallocate(&b.id).unwrap();
            } else {
                kept += live[i].1;
                i += 1;
            }
        }
        let target = (cap as f64 * (0.3 + 0.7 * unit(&mut rng))) as u64;
        loop {
            let size = ((low.ln() + (high.ln() - low.ln()) * unit(&mut rng)).exp() as u64).max(512);
            if kept + size > target {
                break;
            }
            live.push((rt.allocate(size, s, "w12").unwrap_or_else(|e| panic!("step {step}: {e}")), size));
            kept += size;
        }
        behind = Some(hold);
    }
    drop(behind);
    rt.synchronize(s).unwrap();
    check_exact(&rt, "after the steps");
    let st = rt.stats().unwrap();
    let ratio = st.peak_outstanding_bytes as f64 / st.peak_live_bytes as f64;
    // The soft cap is the live peak plus a slack of 1/64 to 1/32 (it
    // widens where the layout lends at its peak); at a fixed 1/32 this held
    // 1.029x in most runs, 1.041x in about one of five, when the frees of
    // the step before are still running at the peak (pages of two granules
    // and a cap of 1/64 gave 1.023x; BENCHMARKS.md "Physical memory, tenth
    // pass").
    assert!(ratio <= 1.05, "held peak {} is {ratio:.3}x the live peak {}", st.peak_outstanding_bytes, st.peak_live_bytes);
    for (b, _) in live {
        rt.deallocate(&b.id).unwrap();
    }
    rt.release_stream(s).unwrap();
}

#[test]
fn the_pool_maps_no_pages_of_its_own() {
    let config = Config { backend: Backend::Sim, arena: false, sim_capacity_bytes: 512 * MIB, ..Config::default() };
    let rt = Runtime::open(0, &config).unwrap();
    let s = rt.acquire_stream().unwrap();
    let b = rt.allocate(5 * MIB, s, "b").unwrap();
    rt.deallocate(&b.id).unwrap();
    rt.trim(0).unwrap();
    let st = rt.stats().unwrap();
    assert_eq!((st.pages_mapped, st.pages_unmapped), (0, 0), "the driver's pool maps for itself");
    rt.release_stream(s).unwrap();
}
