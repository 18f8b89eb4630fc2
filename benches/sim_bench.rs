//! W6 (issue 6): how the runtime scales with the number of live blocks, on
//! the sim backend (runs on any machine).
//!
//!   cargo bench --bench sim_bench               # the full run (about 20 s)
//!   cargo bench --bench sim_bench -- --quick    # a smoke run
//!   cargo bench --bench sim_bench -- --pool     # on the driver pool, not the arena
//!
//! For 1,000 and then 1,000,000 live 256-byte blocks on one runtime (the
//! default stack: budget + async pool on the arena, logging off) it measures
//!
//! - per-operation cost with that many blocks live: an allocate+free pair
//!   (reaping every 64 pairs, as an engine would), a same-stream
//!   prepare+finish, and a cross-stream prepare+finish; each the median of
//!   15 runs (interleaved between the two live counts), as wall time and as
//!   CPU time of the calling thread. The second is the steadier figure on a
//!   shared machine: it leaves out the time the thread waits descheduled,
//!   and the sim's stream workers (which stand in for the GPU) run on their
//!   own threads. The bare sim device's own pair cost is given alongside;
//! - metadata bytes per live block: the bytes of host heap the runtime
//!   holds per live block, counted by the global allocator of this binary
//!   (requested sizes; the malloc implementation's own per-chunk overhead is
//!   not included). Reported three ways: the whole process (runtime plus the
//!   sim device's allocation map, which on CUDA lives in the driver), the
//!   sim device alone (measured on a bare SimDevice), and their difference,
//!   the runtime's own share. The arena's address space, host heap on sim
//!   and device memory on a GPU, is left out of all three. Plus the extra
//!   bytes once a block has been used through prepare/finish (its
//!   dependency record).
//!
//! Output: a table on stderr and CSV rows in xlog_bench's format on stdout
//! (workload,peer,param,metric,value,ratio_to_raw), where ratio_to_raw is,
//! for the 1M rows, the ratio to the same figure at 1k.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use xlog_cuda::device::sim::SimDevice;
use xlog_cuda::device::{Backend, Device};
use xlog_cuda::{Access, AllocatorKind, BlockId, BlockUse, Config, Runtime, StreamId};

/// Net bytes currently allocated through the global allocator.
static HEAP_BYTES: AtomicI64 = AtomicI64::new(0);

struct CountingAllocator;

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter only observes the sizes.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            HEAP_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            HEAP_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        HEAP_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            HEAP_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn heap_bytes() -> i64 {
    HEAP_BYTES.load(Ordering::Relaxed)
}

const BLOCK_BYTES: u64 = 256;
/// Lazily committed, so only the touched pages cost memory. 1M live
/// 256-byte blocks take 512 MiB in the arena (blocks round up to 512 bytes).
const SIM_CAPACITY: u64 = 1 << 30;
const BUDGET: u64 = 960 << 20;
const REAP_EVERY: usize = 64;
/// Blocks per finish_all when giving every block a dependency record.
const TRACK_CHUNK: usize = 1000;

struct Settings {
    repeats: usize,
    pairs: usize,
    tracking_ops: usize,
    live_counts: Vec<usize>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// `pool`: the driver pool (`--pool`, `XLOG_MEMORY=pool`) instead of the
/// arena.
fn open_runtime(pool: bool) -> Arc<Runtime> {
    let config = Config {
        backend: Backend::Sim,
        allocator: AllocatorKind::Async,
        budget_bytes: BUDGET,
        log_path: None,
        sim_capacity_bytes: SIM_CAPACITY,
        wait_on_pressure: false,
        arena: !pool,
        ..Config::default()
    };
    Runtime::open(0, &config).expect("open a sim runtime")
}

/// CPU time consumed by the calling thread, in microseconds.
fn thread_cpu_us() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-parameter for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}

/// One timed run: (wall, calling-thread CPU) microseconds per op.
#[derive(Copy, Clone, Default)]
struct Cost {
    wall: f64,
    cpu: f64,
}

/// `n` ops of `body`, then `settle` (which waits for the sim's workers).
fn time_run(n: usize, body: &mut dyn FnMut(usize), settle: &mut dyn FnMut()) -> Cost {
    let (t0, c0) = (Instant::now(), thread_cpu_us());
    for i in 0..n {
        body(i);
    }
    settle();
    Cost { wall: t0.elapsed().as_secs_f64() * 1e6 / n as f64, cpu: (thread_cpu_us() - c0) / n as f64 }
}

/// One runtime with `live` blocks live (plus a bare sim device with as many
/// allocations, for the sim's own share of cost and memory).
struct State {
    live: usize,
    rt: Arc<Runtime>,
    a: StreamId,
    b: StreamId,
    blocks: Vec<BlockId>,
    total_bytes_per_block: f64,
    sim: Arc<SimDevice>,
    sim_stream: u64,
    sim_ptrs: Vec<u64>,
    sim_bytes_per_block: f64,
}

impl State {
    fn new(live: usize, pool: bool) -> State {
        let rt = open_runtime(pool);
        let a: StreamId = rt.acquire_stream().expect("stream a");
        let b: StreamId = rt.acquire_stream().expect("stream b");
        // Warm the stream workers, the event pool and the tag table before
        // the heap baseline, so that only per-block state is counted.
        let warm = rt.allocate(BLOCK_BYTES, a, "w6").expect("warm-up allocate").id;
        rt.prepare(&warm, b, Access::Write).expect("warm-up prepare");
        rt.finish(&warm, b, Access::Write).expect("warm-up finish");
        rt.deallocate(&warm).expect("warm-up free");
        rt.drain().expect("warm-up drain");

        let mut blocks: Vec<BlockId> = Vec::with_capacity(live);
        // The arena's address space is host heap on sim (device memory on a
        // GPU): left out, as the bare sim device's preallocated heap is.
        let backing = || rt.sim().map_or(0, |s| s.vm_backing_bytes()) as i64;
        let (before, backing_before) = (heap_bytes(), backing());
        for _ in 0..live {
            blocks.push(rt.allocate(BLOCK_BYTES, a, "w6").expect("allocate background block").id);
        }
        rt.synchronize(a).expect("sync");
        let grown = heap_bytes() - before - (backing() - backing_before);
        let total_bytes_per_block = grown as f64 / live as f64;

        let sim = SimDevice::new(0, SIM_CAPACITY).expect("sim device");
        let sim_stream = sim.create_stream().expect("sim stream");
        let mut sim_ptrs = Vec::with_capacity(live);
        let before = heap_bytes();
        for _ in 0..live {
            sim_ptrs.push(sim.alloc_async(BLOCK_BYTES, sim_stream).expect("sim alloc"));
        }
        let sim_bytes_per_block = (heap_bytes() - before) as f64 / live as f64;
        State { live, rt, a, b, blocks, total_bytes_per_block, sim, sim_stream, sim_ptrs, sim_bytes_per_block }
    }

    fn settle(&self) {
        self.rt.synchronize(self.a).expect("sync a");
        self.rt.synchronize(self.b).expect("sync b");
        self.rt.reap().expect("reap");
        self.sim.synchronize_stream(self.sim_stream).expect("sim sync");
    }

    /// Cost per op of one timed run of workload `which`.
    fn run(&self, which: Op, n: usize) -> Cost {
        let rt = &self.rt;
        let (a, b) = (self.a, self.b);
        let probe = self.blocks[self.live / 2];
        let mut body: Box<dyn FnMut(usize) + '_> = match which {
            Op::Pair => Box::new(move |i| {
                let id = rt.allocate(BLOCK_BYTES, a, "w6").expect("allocate").id;
                rt.deallocate(&id).expect("free");
                if (i + 1) % REAP_EVERY == 0 {
                    rt.reap().expect("reap");
                }
            }),
            Op::SameStream => Box::new(move |_| {
                rt.prepare(&probe, a, Access::Write).expect("prepare");
                rt.finish(&probe, a, Access::Write).expect("finish");
            }),
            Op::CrossStream => Box::new(move |i| {
                let stream = if i % 2 == 1 { b } else { a };
                rt.prepare(&probe, stream, Access::Write).expect("prepare");
                rt.finish(&probe, stream, Access::Write).expect("finish");
            }),
            Op::SimPair => {
                let sim = &self.sim;
                let stream = self.sim_stream;
                Box::new(move |_| {
                    let p = sim.alloc_async(BLOCK_BYTES, stream).expect("sim alloc");
                    sim.free_async(p, stream).expect("sim free");
                })
            }
        };
        time_run(n, &mut *body, &mut || self.settle())
    }

    /// Extra heap bytes per block once every block has a dependency record:
    /// finish_all over chunks, so the blocks of a chunk share one event as a
    /// launch's blocks would.
    fn tracked_extra_bytes_per_block(&self) -> f64 {
        self.settle();
        let mut uses: Vec<BlockUse> = Vec::with_capacity(TRACK_CHUNK);
        let before = heap_bytes();
        for chunk in self.blocks.chunks(TRACK_CHUNK) {
            uses.clear();
            uses.extend(chunk.iter().map(|&block| BlockUse { block, access: Access::Write }));
            self.rt.finish_all(self.a, &uses).expect("finish_all");
        }
        self.settle();
        (heap_bytes() - before) as f64 / self.live as f64
    }

    fn close(self) {
        for id in &self.blocks {
            self.rt.deallocate(id).expect("free background block");
        }
        self.rt.drain().expect("drain");
        self.rt.release_stream(self.a).expect("release a");
        self.rt.release_stream(self.b).expect("release b");
        let report = self.rt.close().expect("close");
        assert!(report.leaked.is_empty(), "the benchmark leaked blocks");
        for p in self.sim_ptrs {
            self.sim.free_async(p, self.sim_stream).expect("sim free");
        }
        self.sim.synchronize_stream(self.sim_stream).expect("sim sync");
        self.sim.destroy_stream(self.sim_stream).expect("sim destroy stream");
    }
}

#[derive(Copy, Clone, PartialEq)]
enum Op {
    Pair,
    SameStream,
    CrossStream,
    SimPair,
}

struct Figures {
    live: usize,
    pair_us: Cost,
    same_stream_us: Cost,
    cross_stream_us: Cost,
    sim_pair_us: Cost,
    total_bytes_per_block: f64,
    sim_bytes_per_block: f64,
    tracked_extra_bytes_per_block: f64,
}

/// Every op timed on every state, the runs interleaved (repeat outer, state
/// inner) so that a slow patch of the machine hits all states alike.
fn measure_all(states: &[State], s: &Settings) -> Vec<Figures> {
    let ops = [(Op::Pair, s.pairs), (Op::SameStream, s.tracking_ops), (Op::CrossStream, s.tracking_ops), (Op::SimPair, s.pairs)];
    let mut samples: Vec<Vec<Vec<Cost>>> = vec![vec![Vec::new(); ops.len()]; states.len()];
    for (k, &(op, n)) in ops.iter().enumerate() {
        for state in states {
            state.run(op, (n / 10).max(100)); // warm-up
        }
        for _ in 0..s.repeats {
            for (j, state) in states.iter().enumerate() {
                samples[j][k].push(state.run(op, n));
            }
        }
    }
    states
        .iter()
        .zip(samples)
        .map(|(state, per_op)| Figures {
            live: state.live,
            pair_us: median_cost(&per_op[0]),
            same_stream_us: median_cost(&per_op[1]),
            cross_stream_us: median_cost(&per_op[2]),
            sim_pair_us: median_cost(&per_op[3]),
            total_bytes_per_block: state.total_bytes_per_block,
            sim_bytes_per_block: state.sim_bytes_per_block,
            tracked_extra_bytes_per_block: state.tracked_extra_bytes_per_block(),
        })
        .collect()
}

fn median_cost(samples: &[Cost]) -> Cost {
    Cost {
        wall: median(samples.iter().map(|c| c.wall).collect()),
        cpu: median(samples.iter().map(|c| c.cpu).collect()),
    }
}

fn label(live: usize) -> String {
    if live >= 1_000_000 && live % 1_000_000 == 0 {
        format!("{}M_live", live / 1_000_000)
    } else if live >= 1000 && live % 1000 == 0 {
        format!("{}k_live", live / 1000)
    } else {
        format!("{live}_live")
    }
}

fn main() {
    // `cargo bench` passes --bench; anything else we do not know is ignored.
    let quick = std::env::args().any(|a| a == "--quick");
    let pool = std::env::args().any(|a| a == "--pool");
    let s = if quick {
        Settings { repeats: 3, pairs: 5_000, tracking_ops: 5_000, live_counts: vec![1_000, 100_000] }
    } else {
        Settings { repeats: 15, pairs: 30_000, tracking_ops: 30_000, live_counts: vec![1_000, 1_000_000] }
    };
    let states: Vec<State> = s
        .live_counts
        .iter()
        .map(|&live| {
            eprintln!("sim_bench: making {live} live blocks of {BLOCK_BYTES} bytes ...");
            State::new(live, pool)
        })
        .collect();
    eprintln!("sim_bench: timing ({} repeats, interleaved) ...", s.repeats);
    let figures = measure_all(&states, &s);
    for state in states {
        state.close();
    }

    let base = &figures[0];
    println!("workload,peer,param,metric,value,ratio_to_raw");
    for f in &figures {
        let ratio = |v: f64, b: f64| if std::ptr::eq(f, base) { String::new() } else { format!("{:.3}", v / b) };
        let runtime_bytes = f.total_bytes_per_block - f.sim_bytes_per_block;
        let base_runtime = base.total_bytes_per_block - base.sim_bytes_per_block;
        let rows = [
            ("us_per_pair", f.pair_us.wall, base.pair_us.wall),
            ("us_per_prepare_finish_same_stream", f.same_stream_us.wall, base.same_stream_us.wall),
            ("us_per_prepare_finish_cross_stream", f.cross_stream_us.wall, base.cross_stream_us.wall),
            ("us_per_pair_sim_device_alone", f.sim_pair_us.wall, base.sim_pair_us.wall),
            ("cpu_us_per_pair", f.pair_us.cpu, base.pair_us.cpu),
            ("cpu_us_per_prepare_finish_same_stream", f.same_stream_us.cpu, base.same_stream_us.cpu),
            ("cpu_us_per_prepare_finish_cross_stream", f.cross_stream_us.cpu, base.cross_stream_us.cpu),
            ("cpu_us_per_pair_sim_device_alone", f.sim_pair_us.cpu, base.sim_pair_us.cpu),
            ("bytes_per_live_block_runtime", runtime_bytes, base_runtime),
            ("bytes_per_live_block_with_sim_map", f.total_bytes_per_block, base.total_bytes_per_block),
            ("bytes_per_live_block_sim_map_alone", f.sim_bytes_per_block, base.sim_bytes_per_block),
            ("bytes_per_tracked_block_extra", f.tracked_extra_bytes_per_block, base.tracked_extra_bytes_per_block),
        ];
        for (metric, v, b) in rows {
            println!("W6,xlog-sim,{},{metric},{v:.4},{}", label(f.live), ratio(v, b));
        }
    }

    eprintln!();
    let last = figures.last().unwrap();
    eprintln!(
        "{:<40} {:>10} {:>10} {:>7}   {:>10} {:>10} {:>7}",
        "W6 (sim, 256-byte blocks)",
        "wall",
        "",
        "",
        "thread CPU",
        "",
        ""
    );
    eprintln!(
        "{:<40} {:>10} {:>10} {:>7}   {:>10} {:>10} {:>7}",
        "us per op",
        label(base.live),
        label(last.live),
        "ratio",
        label(base.live),
        label(last.live),
        "ratio"
    );
    let line = |name: &str, a: Cost, b: Cost| {
        eprintln!(
            "{name:<40} {:>10.3} {:>10.3} {:>7.3}   {:>10.3} {:>10.3} {:>7.3}",
            a.wall,
            b.wall,
            b.wall / a.wall,
            a.cpu,
            b.cpu,
            b.cpu / a.cpu
        )
    };
    line("allocate+free pair", base.pair_us, last.pair_us);
    line("  the bare sim device's own pair", base.sim_pair_us, last.sim_pair_us);
    line("prepare+finish, same stream", base.same_stream_us, last.same_stream_us);
    line("prepare+finish, cross stream", base.cross_stream_us, last.cross_stream_us);
    eprintln!();
    eprintln!("{:<40} {:>10} {:>10} {:>7}", "bytes per live block", label(base.live), label(last.live), "ratio");
    let bytes = |name: &str, a: f64, b: f64| eprintln!("{name:<40} {a:>10.1} {b:>10.1} {:>7.3}", b / a);
    bytes(
        "runtime",
        base.total_bytes_per_block - base.sim_bytes_per_block,
        last.total_bytes_per_block - last.sim_bytes_per_block,
    );
    bytes("sim allocation map (the driver's on CUDA)", base.sim_bytes_per_block, last.sim_bytes_per_block);
    bytes("extra once tracked (prepare/finish)", base.tracked_extra_bytes_per_block, last.tracked_extra_bytes_per_block);
}
