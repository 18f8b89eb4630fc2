//! Host time per allocation on a recorded trace: the allocations and
//! frees of an xlog CSV log (plain, not gzip: `zcat` it first) replayed
//! through the runtime on the sim backend, many times over, timing the
//! calls alone.
//!
//!   zcat benches/traces/h100-w7-mlm_dyn.csv.gz > /tmp/t.csv
//!   cargo bench --bench trace_cost -- /tmp/t.csv [repeats] [arena|pool] [scale] [pollute]
//!
//! Defaults: 5 repeats, the arena, sizes divided by 8 (the sim backs its
//! device with host memory; 1 replays the real sizes), nothing polluted.
//! `pollute` MiB of other memory are touched before each call, untimed,
//! as a framework's own work between two allocations evicts the
//! allocator's data from the caches: in a training step a call costs
//! 2-3 times what it costs in a loop (the switch of `benches/w7_ab.py`,
//! BENCHMARKS.md "fourteenth pass"), and `1 8` gives about that here.
//!
//! W1 times one size allocated and freed in a loop, the hot path; a
//! training step allocates ~1,500 blocks of hundreds of sizes, and that
//! path's cost per call is what a host-bound step pays. Prints ns per
//! allocate and per free, averaged over the repeats after the first (the
//! first maps the memory), and the misses.

use std::collections::HashMap;
use std::time::Instant;

use xlog_cuda::{Backend, Config, Runtime, StreamId};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let path = args.first().expect("usage: trace_cost TRACE.csv [repeats] [arena|pool] [scale]");
    let repeats: usize = args.get(1).map_or(5, |r| r.parse().expect("repeats"));
    let memory = args.get(2).map_or("arena", |m| m.as_str());
    // Sizes divided by this (the sim backs its device with host memory).
    let scale: u64 = args.get(3).map_or(8, |s| s.parse().expect("scale"));
    // MiB of other memory touched before every call (untimed): what a
    // framework's own work between two allocations does to the caches.
    let pollute: usize = args.get(4).map_or(0, |s| s.parse().expect("pollute MiB"));
    let mut junk = vec![0u8; pollute << 20];
    let mut stir = move || {
        let mut i = 0;
        while i < junk.len() {
            junk[i] = junk[i].wrapping_add(1);
            i += 64;
        }
        std::hint::black_box(&junk);
    };
    let text = std::fs::read_to_string(path).expect("read the trace");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no {name} column"));
    let (action, pointer, size, stream) = (col("Action"), col("Pointer"), col("Size"), col("Stream"));
    // (true = allocate, pointer, size, stream)
    let mut ops: Vec<(bool, String, u64, String)> = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        match f[action] {
            "allocate" => ops.push((true, f[pointer].into(), (f[size].parse::<u64>().unwrap() / scale).max(1), f[stream].into())),
            "free" => ops.push((false, f[pointer].into(), 0, f[stream].into())),
            _ => {}
        }
    }
    let mut config = Config { backend: Backend::Sim, sim_capacity_bytes: (16u64 << 30) / scale, ..Config::default() };
    if memory == "pool" {
        config.arena = false;
    }
    let rt = Runtime::open(0, &config).unwrap();
    let mut streams: HashMap<String, StreamId> = HashMap::new();
    for (_, _, _, s) in &ops {
        if !streams.contains_key(s) {
            streams.insert(s.clone(), rt.acquire_stream().unwrap());
        }
    }
    let (mut alloc_ns, mut free_ns, mut n_alloc, mut n_free) = (0u128, 0u128, 0u64, 0u64);
    for rep in 0..repeats {
        let mut live = HashMap::new();
        for (is_alloc, ptr, bytes, s) in &ops {
            stir();
            if *is_alloc {
                let t = Instant::now();
                let b = rt.allocate(*bytes, streams[s], "t").unwrap();
                let dt = t.elapsed().as_nanos();
                if rep > 0 {
                    alloc_ns += dt;
                    n_alloc += 1;
                }
                live.insert(ptr.clone(), b.id);
            } else if let Some(id) = live.remove(ptr) {
                let t = Instant::now();
                rt.deallocate(&id).unwrap();
                let dt = t.elapsed().as_nanos();
                if rep > 0 {
                    free_ns += dt;
                    n_free += 1;
                }
            }
        }
        for (_, id) in live {
            rt.deallocate(&id).unwrap();
        }
    }
    let st = rt.stats().unwrap();
    println!(
        "{path} ({memory}): {:.0} ns an allocate, {:.0} ns a free ({} and {} timed), misses {} of {}",
        alloc_ns as f64 / n_alloc.max(1) as f64,
        free_ns as f64 / n_free.max(1) as f64,
        n_alloc,
        n_free,
        st.cache_misses,
        st.allocations
    );
}
