//! The inspection side (`telemetry`): the live-block list, per-tag
//! counters, peak reset, call sites and the text summary, through the Rust
//! API on the sim backend, for both allocators and with the cache on and
//! off. (The `(other)` bucket needs a full tag table: tests/telemetry_overflow.rs.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use xlog_cuda::telemetry::CallSite;
use xlog_cuda::{AllocTag, AllocatorKind, Backend, Config, Runtime};

fn open(allocator: AllocatorKind, cache: bool, track_call_sites: bool) -> Arc<Runtime> {
    let config = Config {
        backend: Backend::Sim,
        allocator,
        cache,
        track_call_sites,
        sim_capacity_bytes: 64 << 20,
        arena: false,
        ..Config::default()
    };
    Runtime::open(0, &config).unwrap()
}

fn stacks() -> Vec<(AllocatorKind, bool)> {
    vec![(AllocatorKind::Async, true), (AllocatorKind::Async, false), (AllocatorKind::Direct, false)]
}

#[test]
fn live_list_matches_the_allocations_across_streams_frees_and_the_cache() {
    for (kind, cache) in stacks() {
        let rt = open(kind, cache, false);
        let (s1, s2) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
        let a = rt.allocate(1000, s1, "tl-weights").unwrap();
        let b = rt.allocate(70_000, s2, "tl-activations").unwrap();
        let c = rt.allocate(300, s2, "tl-weights").unwrap();
        let list = rt.live_blocks().unwrap();
        assert_eq!(list.len(), 3, "[{kind:?} cache {cache}] {list:?}");
        // Oldest first, each entry exactly the block handed out.
        for (entry, block, tag) in [(&list[0], &a, "tl-weights"), (&list[1], &b, "tl-activations"), (&list[2], &c, "tl-weights")] {
            assert_eq!(entry.id, block.id, "[{kind:?}]");
            assert_eq!(entry.device_bytes, block.held, "[{kind:?}]");
            assert!(entry.device_bytes >= entry.id.size);
            assert_eq!(&*entry.tag_name, tag);
            assert_eq!(entry.tag, AllocTag::new(tag));
            assert_eq!(entry.call_site, None, "tracking is off");
            assert_eq!(entry.age, None);
        }
        assert_eq!(list[0].id.alloc_stream, s1);
        assert_eq!(list[1].id.alloc_stream, s2);
        // Ages count the allocations of the block's table: per stream in the
        // async pool (a is the only one on s1, b came before c on s2), the
        // whole runtime in Direct.
        let direct = kind == AllocatorKind::Direct;
        assert!(list[1].sequence < list[2].sequence);
        let ages = (list[0].allocations_since, list[1].allocations_since, list[2].allocations_since);
        assert_eq!(ages, if direct { (2, 1, 0) } else { (0, 1, 0) }, "[{kind:?}]");

        // A freed block leaves the list, whether it went to the cache or
        // to the driver; a block that reuses its memory joins as new.
        rt.deallocate(&b.id).unwrap();
        let list = rt.live_blocks().unwrap();
        assert_eq!(list.iter().map(|e| e.id).collect::<Vec<_>>(), vec![a.id, c.id], "[{kind:?}]");
        let stats = rt.stats().unwrap();
        if cache {
            assert_eq!(stats.cached_blocks, 1, "the freed block is cached, not live");
        }
        let d = rt.allocate(70_000, s2, "tl-again").unwrap();
        if cache {
            assert_eq!(d.id.ptr, b.id.ptr, "served from the cache");
        }
        let list = rt.live_blocks().unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(list[2].id, d.id);
        assert_ne!(list[2].id.generation, b.id.generation);
        assert_eq!(list[0].allocations_since, if direct { 3 } else { 0 }, "nothing else was allocated on s1");
        assert_eq!(list[1].allocations_since, 1, "d came after c on s2");
        // The sum of the list is the runtime's live bytes.
        assert_eq!(list.iter().map(|e| e.device_bytes).sum::<u64>(), rt.stats().unwrap().live_bytes);
        for block in [a, c, d] {
            rt.deallocate(&block.id).unwrap();
        }
        assert!(rt.live_blocks().unwrap().is_empty());
        rt.close().unwrap();
    }
}

#[test]
fn per_tag_counters_count_bytes_blocks_peaks_allocations_and_frees() {
    for (kind, cache) in stacks() {
        let rt = open(kind, cache, false);
        let s = rt.acquire_stream().unwrap();
        let x: Vec<_> = (0..3).map(|_| rt.allocate(4096, s, "tc-x").unwrap()).collect();
        let y = rt.allocate(100, s, "tc-y").unwrap();
        let untagged = rt.allocate(512, s, "").unwrap();
        rt.deallocate(&x[0].id).unwrap();
        rt.deallocate(&x[1].id).unwrap();
        let z = rt.allocate(4096, s, "tc-x").unwrap();
        let tags: HashMap<String, _> = rt.tag_stats().unwrap().into_iter().map(|t| (t.name.to_string(), t)).collect();
        assert_eq!(tags.len(), 3, "[{kind:?}] {tags:?}");
        let held_x = x[0].held;
        let tx = &tags["tc-x"];
        assert_eq!((tx.allocations, tx.frees, tx.live_blocks), (4, 2, 2), "[{kind:?}]");
        assert_eq!(tx.live_bytes, 2 * held_x);
        assert_eq!(tx.peak_bytes, 3 * held_x, "three were live at once");
        let ty = &tags["tc-y"];
        assert_eq!((ty.allocations, ty.frees, ty.live_blocks, ty.live_bytes, ty.peak_bytes), (1, 0, 1, y.held, y.held));
        assert_eq!(tags[""].live_bytes, untagged.held);
        // Largest live bytes first.
        let order: Vec<_> = rt.tag_stats().unwrap().into_iter().map(|t| t.name.to_string()).collect();
        assert_eq!(order[0], "tc-x");
        // The per-tag live bytes add up to the runtime's.
        let stats = rt.stats().unwrap();
        assert_eq!(tags.values().map(|t| t.live_bytes).sum::<u64>(), stats.live_bytes);
        assert_eq!(stats.peak_live_blocks, 5, "x0 x1 x2 y untagged");
        assert_eq!(stats.peak_live_bytes, 3 * held_x + y.held + untagged.held);
        for b in [&x[2], &y, &untagged, &z] {
            rt.deallocate(&b.id).unwrap();
        }
        let tx = rt.tag_stats().unwrap().into_iter().find(|t| &*t.name == "tc-x").unwrap();
        assert_eq!((tx.live_blocks, tx.live_bytes, tx.frees), (0, 0, 4));
        rt.close().unwrap();
    }
}

#[test]
fn reset_peak_restarts_every_peak_from_the_current_value() {
    for (kind, cache) in stacks() {
        let rt = open(kind, cache, false);
        let s = rt.acquire_stream().unwrap();
        let blocks: Vec<_> = (0..4).map(|_| rt.allocate(1 << 16, s, "rp").unwrap()).collect();
        for b in &blocks[1..] {
            rt.deallocate(&b.id).unwrap();
        }
        rt.drain().unwrap();
        let held = blocks[0].held;
        let before = rt.stats().unwrap();
        assert_eq!(before.peak_live_bytes, 4 * held);
        assert_eq!(before.peak_live_blocks, 4);
        assert!(before.peak_outstanding_bytes >= 4 * held);
        let tag = |rt: &Runtime| rt.tag_stats().unwrap().into_iter().find(|t| &*t.name == "rp").unwrap();
        assert_eq!(tag(&rt).peak_bytes, 4 * held);

        rt.reset_peak().unwrap();
        let after = rt.stats().unwrap();
        assert_eq!(after.peak_live_bytes, held, "[{kind:?} cache {cache}]");
        assert_eq!(after.peak_live_blocks, 1);
        assert_eq!(after.peak_outstanding_bytes, after.outstanding_bytes, "[{kind:?} cache {cache}]");
        assert_eq!(tag(&rt).peak_bytes, held);
        // And they grow again from there.
        let again = rt.allocate(1 << 16, s, "rp").unwrap();
        assert_eq!(rt.stats().unwrap().peak_live_bytes, 2 * held);
        assert_eq!(tag(&rt).peak_bytes, 2 * held);
        rt.deallocate(&again.id).unwrap();
        rt.deallocate(&blocks[0].id).unwrap();
        rt.close().unwrap();
    }
}

#[test]
fn summary_shows_the_totals_the_tags_and_the_largest_blocks() {
    let rt = open(AllocatorKind::Async, true, true);
    let s = rt.acquire_stream().unwrap();
    let big = rt.allocate_at(3 << 20, s, AllocTag::new("sum-big"), CallSite::new("model.py:17")).unwrap();
    let small: Vec<_> = (0..12).map(|_| rt.allocate(1000, s, "sum-small").unwrap()).collect();
    let freed = rt.allocate(5000, s, "sum-freed").unwrap();
    rt.deallocate(&freed.id).unwrap();
    let stats = rt.stats().unwrap();
    let text = rt.memory_summary(5).unwrap();
    for needle in [
        format!("live {:>16} B", stats.live_bytes).replace("live ", "live       "),
        format!("{} blocks", stats.live_blocks),
        format!("cached     {:>16} B", stats.cached_bytes),
        format!("held peak  {:>16} B", stats.peak_outstanding_bytes),
        "budget".to_string(),
        "sum-big".to_string(),
        "sum-small".to_string(),
        "sum-freed".to_string(),
        "model.py:17".to_string(),
        format!("{:#x}", big.id.ptr),
        "largest live blocks (5 of 13)".to_string(),
    ] {
        assert!(text.contains(&needle), "summary lacks {needle:?}:\n{text}");
    }
    // The per-tag row of sum-small: 12 live blocks, 12 allocations, 0 frees.
    let row = text.lines().find(|l| l.trim_start().starts_with("sum-small")).unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1].parse::<u64>().unwrap(), 12 * small[0].held, "{row}");
    assert_eq!(&cols[2..], &["12", &(12 * small[0].held).to_string(), "12", "0"], "{row}");
    let row = text.lines().find(|l| l.trim_start().starts_with("sum-freed")).unwrap();
    assert_eq!(row.split_whitespace().collect::<Vec<_>>()[1..], ["0", "0", &freed.held.to_string(), "1", "1"]);
    // The largest block is listed first, with its numbers.
    let first = text.lines().skip_while(|l| !l.starts_with("largest")).nth(2).unwrap();
    let cols: Vec<&str> = first.split_whitespace().collect();
    assert_eq!(cols[0], big.held.to_string(), "{first}");
    assert_eq!(cols[1], (3u64 << 20).to_string());
    assert_eq!(cols[4], big.id.generation.0.to_string());
    // Five block rows and no more.
    assert_eq!(text.lines().skip_while(|l| !l.starts_with("largest")).count(), 2 + 5);

    // With a budget the limit is there too.
    let budgeted = Runtime::open(0, &Config { backend: Backend::Sim, budget_bytes: 7 << 20, arena: false, ..Config::default() }).unwrap();
    let text = budgeted.memory_summary(10).unwrap();
    assert!(text.contains(&format!("budget     {:>16} B", 7u64 << 20)), "{text}");
    budgeted.close().unwrap();
    rt.close().unwrap();
}

#[test]
fn call_sites_are_recorded_only_when_tracking_is_on() {
    let rt = open(AllocatorKind::Async, true, true);
    assert!(rt.tracks_call_sites());
    let s = rt.acquire_stream().unwrap();
    let explicit = rt.allocate_at(64, s, AllocTag::new("cs"), CallSite::new("engine.c:99")).unwrap();
    let none = rt.allocate(64, s, "cs").unwrap();
    CallSite::set_thread_current(CallSite::new("phase: warmup"));
    let labelled = rt.allocate(64, s, "cs").unwrap();
    let explicit_wins = rt.allocate_at(64, s, AllocTag::new("cs"), CallSite::new("engine.c:100")).unwrap();
    CallSite::set_thread_current(CallSite::NONE);
    let list = rt.live_blocks().unwrap();
    let site = |id| list.iter().find(|e| e.id == id).unwrap().call_site.map(|s| s.name());
    assert_eq!(site(explicit.id).as_deref(), Some("engine.c:99"));
    assert_eq!(site(none.id), None);
    assert_eq!(site(labelled.id).as_deref(), Some("phase: warmup"));
    assert_eq!(site(explicit_wins.id).as_deref(), Some("engine.c:100"));
    assert!(list.iter().all(|e| e.age.is_some()), "tracked runtimes know each block's age in time");
    // A freed block's record goes with it; its generation is not reported again.
    rt.deallocate(&explicit.id).unwrap();
    assert!(rt.live_blocks().unwrap().iter().all(|e| e.id != explicit.id));

    let off = open(AllocatorKind::Async, true, false);
    let s = off.acquire_stream().unwrap();
    CallSite::set_thread_current(CallSite::new("ignored"));
    off.allocate_at(64, s, AllocTag::new("cs"), CallSite::new("engine.c:1")).unwrap();
    CallSite::set_thread_current(CallSite::NONE);
    let list = off.live_blocks().unwrap();
    assert_eq!((list[0].call_site, list[0].age), (None, None));
    off.close().unwrap();
    rt.close().unwrap();
}

#[test]
fn the_tracking_switch_comes_from_the_environment() {
    let mut c = Config::default();
    c.apply_env(|n| (n == "XLOG_TRACK_CALLSITES").then_some("1")).unwrap();
    assert!(c.track_call_sites);
    c.apply_env(|n| (n == "XLOG_TRACK_CALLSITES").then_some("0")).unwrap();
    assert!(!c.track_call_sites);
    let e = c.apply_env(|n| (n == "XLOG_TRACK_CALLSITES").then_some("yes")).unwrap_err();
    assert!(e.to_string().contains("XLOG_TRACK_CALLSITES"), "{e}");
    assert!(!Config::default().track_call_sites, "off by default");
}

/// Snapshots taken while other threads allocate and free: every entry is a
/// block some thread really had live with exactly those fields, the
/// counters settle to zero, and nothing deadlocks (snapshots, summaries and
/// peak resets run against the shard locks of the allocating threads).
#[test]
fn snapshots_under_concurrent_allocation_are_consistent_per_block() {
    for track in [false, true] {
        let rt = open(AllocatorKind::Async, true, track);
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for w in 0..3u64 {
            let (rt, stop) = (rt.clone(), stop.clone());
            workers.push(std::thread::spawn(move || {
                let s = rt.acquire_stream().unwrap();
                let tag = format!("cc-{w}");
                let mut seen = Vec::new();
                let mut live = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) || i < 200 {
                    let size = 256 + (i * 977 + w * 13) % 20_000;
                    let b = rt.allocate_at(size, s, AllocTag::new(&tag), CallSite::new(&format!("w{w}"))).unwrap();
                    seen.push(b);
                    live.push(b);
                    if live.len() > 8 {
                        let old = live.remove((i % 8) as usize);
                        rt.deallocate(&old.id).unwrap();
                    }
                    i += 1;
                }
                for b in live {
                    rt.deallocate(&b.id).unwrap();
                }
                seen
            }));
        }
        let mut snapshots = Vec::new();
        let started = std::time::Instant::now();
        let mut round = 0;
        while round < 200 || (snapshots.iter().all(|s: &Vec<_>| s.is_empty()) && started.elapsed().as_secs() < 30) {
            round += 1;
            snapshots.push(rt.live_blocks().unwrap());
            if round % 10 == 0 {
                rt.reset_peak().unwrap();
                assert!(rt.memory_summary(3).unwrap().contains("per tag"));
                rt.tag_stats().unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
        let mut all = HashMap::new();
        for w in workers {
            for b in w.join().unwrap() {
                all.insert(b.id.generation, b);
            }
        }
        let mut entries = 0;
        for snap in &snapshots {
            for e in snap {
                let b = all.get(&e.id.generation).expect("every listed block was allocated by a worker");
                assert_eq!(e.id, b.id);
                assert_eq!(e.device_bytes, b.held);
                assert_eq!(e.tag, b.tag);
                if track {
                    let site = e.call_site.map(|s| s.name());
                    assert!(site.is_none() || site.as_deref() == Some(&format!("w{}", &e.tag_name[3..])[..]));
                }
                entries += 1;
            }
        }
        assert!(entries > 0, "the snapshots saw blocks");
        assert!(rt.live_blocks().unwrap().is_empty());
        let tags = rt.tag_stats().unwrap();
        assert_eq!(tags.len(), 3);
        assert!(tags.iter().all(|t| t.live_bytes == 0 && t.live_blocks == 0 && t.allocations == t.frees));
        assert_eq!(tags.iter().map(|t| t.allocations).sum::<u64>(), all.len() as u64);
        rt.close().unwrap();
    }
}

#[test]
fn blocks_leaked_at_close_are_counted_as_freed() {
    let rt = open(AllocatorKind::Async, true, true);
    let s = rt.acquire_stream().unwrap();
    rt.allocate(4096, s, "leak").unwrap();
    let live = rt.live_blocks().unwrap();
    assert_eq!(live.len(), 1);
    let report = rt.close().unwrap();
    assert_eq!(report.leaked.len(), 1);
    assert_eq!(report.leaked[0].held, live[0].device_bytes);
    assert_eq!(report.leaked[0].sequence, live[0].sequence);
    assert!(rt.live_blocks().is_err(), "a closed runtime refuses");
}

#[test]
fn retries_after_relieving_pressure_are_counted() {
    // wait_on_pressure: the retry waits for the cache's free to complete
    // (without it, whether the retry fits depends on how far the stream got).
    let config = Config { backend: Backend::Sim, budget_bytes: 1 << 20, wait_on_pressure: true, arena: false, ..Config::default() };
    let rt = Runtime::open(0, &config).unwrap();
    let s = rt.acquire_stream().unwrap();
    let a = rt.allocate(600 << 10, s, "retry").unwrap();
    rt.deallocate(&a.id).unwrap();
    assert_eq!(rt.stats().unwrap().alloc_retries, 0);
    // The cached 600 KiB block does not fit this size: the budget refuses,
    // the cache goes back to the driver, and the second try fits.
    let b = rt.allocate(900 << 10, s, "retry").unwrap();
    let stats = rt.stats().unwrap();
    // One retry after giving the cache back; a second after waiting for
    // its free when the first came too early.
    assert!((1..=2).contains(&stats.alloc_retries), "{stats:?}");
    assert_eq!(stats.failed_allocations, 0);
    rt.deallocate(&b.id).unwrap();
    rt.close().unwrap();
}
