//! W11's shape on the sim backend, for looking at the arena's footprint
//! when four threads share four streams: held / live peak per run.
//!
//!   cargo bench --bench sim_engine -- [runs] [queries]
//!
//! Each of four threads drives one stream as W11 does (benches/w11_engine.cu):
//! per query it builds a dim table on the next stream (two columns, a sort
//! with its temporary storage, the sorted pair), then on its own stream
//! the fact columns, a probe that reads the sorted dim (declared with
//! prepare/finish, so xlog orders the cross-stream read and the dim's free),
//! a scan, a host read of the join size (a stream synchronisation), the
//! join at that size, a sort and a reduce, each CUB call's temporary
//! storage allocated and freed around it. Sizes are drawn per query
//! log-uniformly (fact rows 2^16-2^23, dim rows 2^14-2^21, as W11's
//! defaults); kernels are host callbacks that sleep in proportion to the
//! bytes they touch, so frees are still running when the next allocations
//! come, as on a GPU. Prints, per run, the held and live peaks and their
//! ratio, the pages mapped, and the worst run.
//!
//! Timing on sim is the host's thread scheduling, not a GPU's: a run is
//! not a replay of a GPU run, and two runs of one seed differ. What it is
//! for: finding layouts that hold more than the footprint bound, and
//! seeing what held them.

use std::sync::Arc;
use std::time::Duration;

use xlog_cuda::{Access, Backend, BlockUse, Config, DeviceBlock, Runtime, StreamId};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Rows drawn log-uniformly from [2^lo, 2^hi].
    fn log_uniform(&mut self, lo: u32, hi: u32) -> u64 {
        let bits = lo as f64 + (hi - lo) as f64 * self.unit();
        bits.exp2() as u64
    }
}

/// A kernel over `bytes` on `stream`: a host callback that sleeps about
/// 1 µs per 4 MiB (with a floor), so the stream runs behind the host.
fn kernel(rt: &Runtime, stream: StreamId, bytes: u64) {
    let micros = 20 + bytes / (4 << 20);
    rt.enqueue_host(stream, Box::new(move || std::thread::sleep(Duration::from_micros(micros)))).unwrap();
}

fn uses(blocks: &[(&DeviceBlock, Access)]) -> Vec<BlockUse> {
    blocks.iter().map(|(b, access)| BlockUse { block: b.id, access: *access }).collect()
}

/// A launch: prepare, the kernel, finish.
fn launch(rt: &Runtime, stream: StreamId, blocks: &[(&DeviceBlock, Access)]) {
    let list = uses(blocks);
    rt.prepare_all(stream, &list).unwrap();
    kernel(rt, stream, blocks.iter().map(|(b, _)| b.id.size).sum());
    rt.finish_all(stream, &list).unwrap();
}

/// A CUB call: its temporary storage (`temp` bytes) allocated, used with
/// `blocks`, freed.
fn with_temp(rt: &Runtime, stream: StreamId, temp: u64, blocks: &[(&DeviceBlock, Access)]) {
    let t = rt.allocate(temp, stream, "temp").unwrap();
    let mut all = blocks.to_vec();
    all.push((&t, Access::Write));
    launch(rt, stream, &all);
    rt.deallocate(&t.id).unwrap();
}

fn query(rt: &Runtime, rng: &mut Rng, a: StreamId, b: StreamId) {
    use Access::{Read, Write};
    let fact = rng.log_uniform(16, 23);
    let dim = rng.log_uniform(14, 21);
    let joined = fact * 4 / 5 * (rng.next() % 8 + 1) / 8;
    let alloc = |bytes: u64, s: StreamId| rt.allocate(bytes.max(4), s, "q").unwrap();
    let free = |blk: DeviceBlock| rt.deallocate(&blk.id).unwrap();
    // dim on A
    let (dk, da) = (alloc(4 * dim, a), alloc(4 * dim, a));
    launch(rt, a, &[(&dk, Write), (&da, Write)]);
    let (dks, das) = (alloc(4 * dim, a), alloc(4 * dim, a));
    with_temp(rt, a, 8 * dim + 4096, &[(&dk, Read), (&da, Read), (&dks, Write), (&das, Write)]);
    free(dk);
    free(da);
    // fact on B, the probe reads the sorted dim
    let (fk, fv) = (alloc(4 * fact, b), alloc(4 * fact, b));
    launch(rt, b, &[(&fk, Write), (&fv, Write)]);
    let (flag, mattr) = (alloc(4 * fact, b), alloc(4 * fact, b));
    launch(rt, b, &[(&fk, Read), (&dks, Read), (&das, Read), (&flag, Write), (&mattr, Write)]);
    free(fk);
    free(dks);
    free(das);
    let pos = alloc(4 * fact, b);
    with_temp(rt, b, fact / 64 + 4096, &[(&flag, Read), (&pos, Write)]);
    let result = alloc(64, b);
    launch(rt, b, &[(&flag, Read), (&pos, Read), (&result, Write)]);
    // the host reads the join size back
    rt.synchronize(b).unwrap();
    if joined > 0 {
        let (ja, jv) = (alloc(4 * joined, b), alloc(8 * joined, b));
        launch(rt, b, &[(&flag, Read), (&pos, Read), (&mattr, Read), (&fv, Read), (&ja, Write), (&jv, Write)]);
        free(flag);
        free(pos);
        free(mattr);
        free(fv);
        let (sa, sv) = (alloc(4 * joined, b), alloc(8 * joined, b));
        with_temp(rt, b, 12 * joined + 4096, &[(&ja, Read), (&jv, Read), (&sa, Write), (&sv, Write)]);
        free(ja);
        free(jv);
        let groups = (rng.next() % 4096 + 16).min(joined);
        let (ga, gs) = (alloc(4 * groups, b), alloc(8 * groups, b));
        with_temp(rt, b, 12 * joined / 8 + 4096, &[(&sa, Read), (&sv, Read), (&ga, Write), (&gs, Write)]);
        free(sa);
        free(sv);
        launch(rt, b, &[(&ga, Read), (&gs, Read), (&result, Write)]);
        free(ga);
        free(gs);
    } else {
        free(flag);
        free(pos);
        free(mattr);
        free(fv);
    }
    launch(rt, b, &[(&result, Read)]);
    free(result);
}

/// One run: four threads, `queries` queries each. (held peak, live peak,
/// pages mapped).
fn run(seed: u64, queries: usize) -> (u64, u64, u64) {
    let config = Config { backend: Backend::Sim, sim_capacity_bytes: 8 << 30, ..Config::default() };
    let rt = Runtime::open(0, &config).unwrap();
    let streams: Vec<StreamId> = (0..4).map(|_| rt.acquire_stream().unwrap()).collect();
    let threads: Vec<_> = (0..4)
        .map(|lane| {
            let (rt, streams) = (Arc::clone(&rt), streams.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(seed ^ (lane as u64).wrapping_mul(0x517c_c1b7_2722_0a95));
                let (a, b) = (streams[(lane + 1) % 4], streams[lane]);
                for _ in 0..queries {
                    query(&rt, &mut rng, a, b);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for &s in &streams {
        rt.synchronize(s).unwrap();
    }
    let st = rt.stats().unwrap();
    (st.peak_outstanding_bytes, st.peak_live_bytes, st.pages_mapped)
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let runs = args.first().copied().unwrap_or(8);
    let queries = args.get(1).copied().unwrap_or(64) as usize;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut worst = (0.0, 0);
    for seed in 1..=runs {
        let (held, live, mapped) = run(seed, queries);
        let ratio = held as f64 / live.max(1) as f64;
        println!("run {seed:3}: held {:8.1} MiB, live peak {:8.1} MiB, held / live {ratio:.3}, pages mapped {mapped}", mib(held), mib(live));
        if ratio > worst.0 {
            worst = (ratio, seed);
        }
    }
    println!("worst: {:.3} (run {})", worst.0, worst.1);
}
