//! Runtime overhead without a device: the runtime and its default stack
//! (Budget(AsyncPool), logging off) over a device whose calls do nothing,
//! so what is timed is our bookkeeping alone — the part the GPU benchmark's
//! ratios to raw cuMemAllocAsync / cuEventRecord are made of.
//!
//!   cargo bench --bench overhead
//!
//! Prints ns per allocate+free pair (reap every 64 pairs, as W1), the
//! same pair with the CSV log on (`--logging-only`: that row alone), per
//! same-stream and cross-stream prepare+finish (as W4), and the pair on
//! 1/4/8 threads, each on its own stream (as W3), and W10's hook pair
//! against the C ABI pair on the hook runtime (`--pairs-only`: the pairs
//! and W10 alone).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use xlog_cuda::device::{Backend, Device, DevicePtr, DeviceResult, HostFn, RawEvent, RawStream};
use xlog_cuda::{Access, Config, Runtime};

/// A device that hands out fresh addresses and does nothing else.
struct NullDevice {
    next: AtomicU64,
}

impl Device for NullDevice {
    fn backend(&self) -> Backend {
        Backend::Sim
    }
    fn ordinal(&self) -> i32 {
        0
    }
    fn name(&self) -> String {
        "null".into()
    }
    fn mem_info(&self) -> DeviceResult<(u64, u64)> {
        Ok((u64::MAX / 2, u64::MAX / 2))
    }
    fn create_stream(&self) -> DeviceResult<RawStream> {
        Ok(self.next.fetch_add(1, Ordering::Relaxed))
    }
    fn destroy_stream(&self, _: RawStream) -> DeviceResult<()> {
        Ok(())
    }
    fn import_stream(&self, native: u64) -> DeviceResult<RawStream> {
        Ok(native)
    }
    fn native_stream(&self, stream: RawStream) -> u64 {
        stream
    }
    fn synchronize_stream(&self, _: RawStream) -> DeviceResult<()> {
        Ok(())
    }
    fn enqueue_host(&self, _: RawStream, f: HostFn) -> DeviceResult<()> {
        f();
        Ok(())
    }
    fn alloc_async(&self, bytes: u64, _: RawStream) -> DeviceResult<DevicePtr> {
        Ok(self.next.fetch_add(bytes.div_ceil(256) * 256, Ordering::Relaxed))
    }
    fn free_async(&self, _: DevicePtr, _: RawStream) -> DeviceResult<()> {
        Ok(())
    }
    fn alloc_sync(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        self.alloc_async(bytes, 0)
    }
    fn free_sync(&self, _: DevicePtr) -> DeviceResult<()> {
        Ok(())
    }
    fn create_event(&self) -> DeviceResult<RawEvent> {
        Ok(self.next.fetch_add(1, Ordering::Relaxed))
    }
    fn destroy_event(&self, _: RawEvent) {}
    fn record_event(&self, _: RawEvent, _: RawStream) -> DeviceResult<()> {
        Ok(())
    }
    fn stream_wait_event(&self, _: RawStream, _: RawEvent) -> DeviceResult<()> {
        Ok(())
    }
    fn event_query(&self, _: RawEvent) -> DeviceResult<bool> {
        Ok(true)
    }
    fn event_synchronize(&self, _: RawEvent) -> DeviceResult<()> {
        Ok(())
    }
    // The arena's calls: address space and pages that cost nothing.
    fn supports_vm(&self) -> bool {
        true
    }
    fn vm_granularity(&self) -> u64 {
        2 << 20
    }
    fn vm_region_bytes(&self) -> u64 {
        1 << 40
    }
    fn vm_reserve(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        Ok(self.next.fetch_add(bytes, Ordering::Relaxed).next_multiple_of(2 << 20))
    }
    fn vm_free(&self, _: DevicePtr, _: u64) -> DeviceResult<()> {
        Ok(())
    }
    fn vm_create(&self, _: u64) -> DeviceResult<u64> {
        Ok(self.next.fetch_add(1, Ordering::Relaxed))
    }
    fn vm_release(&self, _: u64) -> DeviceResult<()> {
        Ok(())
    }
    fn vm_map(&self, _: DevicePtr, _: u64, _: u64) -> DeviceResult<()> {
        Ok(())
    }
    fn vm_set_access(&self, _: DevicePtr, _: u64, _: i32) -> DeviceResult<()> {
        Ok(())
    }
    fn vm_unmap(&self, _: DevicePtr, _: u64) -> DeviceResult<()> {
        Ok(())
    }
    fn stream_query(&self, _: RawStream) -> DeviceResult<bool> {
        Ok(true)
    }
}

fn runtime() -> Arc<Runtime> {
    runtime_with(Config { budget_bytes: 1 << 40, ..Config::default() })
}

fn runtime_with(config: Config) -> Arc<Runtime> {
    let device: Arc<dyn Device> = Arc::new(NullDevice { next: AtomicU64::new(1 << 20) });
    Arc::new(Runtime::build(device, &config).expect("runtime"))
}

/// The W1 pair with the CSV log on (an `allocate` and a `free` row per
/// pair), written to a fresh file under the temp directory: what a log
/// that reaches the file before each call returns costs, next to the
/// pair with logging off. Returns (logging off, logging on) ns per pair,
/// the median of rounds that alternate the two.
fn pairs_logging_off_on(per_round: u64, rounds: usize) -> (f64, f64) {
    let path = std::env::temp_dir().join(format!("xlog-overhead-{}.csv", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let off = runtime();
    let on = runtime_with(Config { budget_bytes: 1 << 40, log_path: Some(path.clone()), ..Config::default() });
    let (mut off_ns, mut on_ns) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        off_ns.push(pairs(&off, per_round));
        on_ns.push(pairs(&on, per_round));
    }
    drop(on);
    let _ = std::fs::remove_file(&path);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    (median(&mut off_ns), median(&mut on_ns))
}

fn pairs(rt: &Runtime, n: u64) -> f64 {
    let s = rt.acquire_stream().unwrap();
    let t0 = Instant::now();
    for i in 0..n {
        let b = rt.allocate(1 << 20, s, "w1").unwrap();
        rt.deallocate(&b.id).unwrap();
        if i % 64 == 63 {
            rt.reap().unwrap();
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    rt.release_stream(s).unwrap();
    ns
}

/// The same pair through the C ABI (xlog_allocate / xlog_deallocate) on a
/// sim runtime: after the first, every allocation is a cache hit, so no
/// device work is timed either.
/// A C-ABI config for the sim backend with a 1 GiB budget.
fn sim_config() -> xlog_cuda::ffi::types::xlog_config {
    use xlog_cuda::ffi::api::*;
    use xlog_cuda::ffi::types::*;
    let mut cfg = std::mem::MaybeUninit::<xlog_config>::uninit();
    // SAFETY: xlog_config_init fills the whole struct.
    let mut cfg = unsafe {
        xlog_config_init(cfg.as_mut_ptr());
        cfg.assume_init()
    };
    cfg.backend = XLOG_BACKEND_SIM;
    cfg.budget_bytes = 1 << 30;
    cfg
}

fn c_abi_pairs(n: u64) -> f64 {
    use xlog_cuda::ffi::api::*;
    use xlog_cuda::ffi::types::*;
    let cfg = sim_config();
    let mut rt = std::ptr::null_mut();
    // SAFETY: valid pointers to locals.
    assert_eq!(unsafe { xlog_runtime_open(0, &cfg, &mut rt) }, XLOG_OK);
    let mut s = 0;
    assert_eq!(xlog_stream_acquire(rt, &mut s), XLOG_OK);
    let tag = c"w1";
    let mut block = std::mem::MaybeUninit::<xlog_block>::uninit();
    let t0 = Instant::now();
    for i in 0..n {
        // SAFETY: valid runtime, tag and out-pointer.
        let st = unsafe { xlog_allocate(rt, 1 << 20, s, tag.as_ptr(), block.as_mut_ptr()) };
        assert_eq!(st, XLOG_OK);
        // SAFETY: written by the successful call above.
        assert_eq!(xlog_deallocate(rt, unsafe { block.assume_init() }), XLOG_OK);
        if i % 64 == 63 {
            xlog_reap(rt, std::ptr::null_mut());
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    assert_eq!(xlog_runtime_close(rt), XLOG_OK);
    ns
}

/// W10 of the GPU benchmark on this CPU: an allocate+free pair through
/// the framework hooks (`xlog_torch_malloc` / `xlog_torch_free`) against
/// the same pair through `xlog_allocate` / `xlog_deallocate`, on the same
/// runtime (the hook runtime of device 0) and the same imported native
/// stream, 1 MiB blocks, as `benches/xlog_bench.cpp` does on the GPU.
///
/// The hook runtime is opened by the hooks themselves (`Runtime::open`),
/// so it cannot sit on the null device above; it runs on the sim backend
/// instead. That keeps the ratio meaningful: after the first pair every
/// allocation of both loops is a cache hit on the same stream (no device
/// call, no event, no wait), so both loops time bookkeeping only, and
/// everything the hook pair does beyond the plain pair (its stream
/// adoption, its pointer → block index, its reap cadence) is what the
/// difference is made of. The two loops alternate in rounds and each
/// reports its median round, so a noisy neighbour moves both alike.
///
/// Returns (hook ns per pair, xlog_allocate ns per pair).
fn hook_vs_abi_pairs(per_round: u64, rounds: usize) -> (f64, f64) {
    use xlog_cuda::ffi::api::*;
    use xlog_cuda::ffi::interop::*;
    use xlog_cuda::ffi::types::*;
    let mut cfg = sim_config();
    cfg.wait_on_pressure = 1;
    // SAFETY: a valid config pointer. (Fails, harmlessly, once the hooks
    // of device 0 are in use: the second call of this function.)
    let _ = unsafe { xlog_interop_configure(0, &cfg) };
    let mut rt = std::ptr::null_mut();
    assert_eq!(xlog_interop_runtime(0, &mut rt), XLOG_OK);
    // A foreign native stream, as PyTorch passes its current stream.
    let native = 0x5000 as *mut std::ffi::c_void;
    let mut s = 0;
    assert_eq!(xlog_stream_import(rt, native, &mut s), XLOG_OK);
    let bytes = 1u64 << 20;
    let tag = c"hookbench";
    let mut block = std::mem::MaybeUninit::<xlog_block>::uninit();
    let (mut hook, mut abi) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t0 = Instant::now();
        for _ in 0..per_round {
            // SAFETY: valid runtime, tag and out-pointer.
            let st = unsafe { xlog_allocate(rt, bytes, s, tag.as_ptr(), block.as_mut_ptr()) };
            assert_eq!(st, XLOG_OK);
            // SAFETY: written by the successful call above.
            assert_eq!(xlog_deallocate(rt, unsafe { block.assume_init() }), XLOG_OK);
        }
        abi.push(t0.elapsed().as_nanos() as f64 / per_round as f64);
        let t0 = Instant::now();
        for _ in 0..per_round {
            let p = xlog_torch_malloc(bytes as usize, 0, native);
            assert!(!p.is_null());
            xlog_torch_free(p, bytes as usize, 0, native);
        }
        hook.push(t0.elapsed().as_nanos() as f64 / per_round as f64);
    }
    assert_eq!(xlog_interop_live_blocks(0), 0);
    assert_eq!(xlog_runtime_close(rt), XLOG_OK);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    (median(&mut hook), median(&mut abi))
}

/// W2's trace (allocation probability 1 - live/1000, sizes uniform in
/// [1, 4 MiB]) on the null device: ns per operation and the cache's hit
/// rate, which decides how often a real device would be called.
fn replay(rt: &Runtime, ops: u64) {
    let s = rt.acquire_stream().unwrap();
    let mut rng = 0x2026_1122_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut live: Vec<xlog_cuda::BlockId> = Vec::new();
    let before = rt.stats().unwrap();
    let t0 = Instant::now();
    for _ in 0..ops {
        let p_alloc = 1.0 - live.len() as f64 / 1000.0;
        if live.is_empty() || (live.len() < 1000 && (next() % 1_000_000) as f64 / 1e6 < p_alloc) {
            live.push(rt.allocate(1 + next() % (4 << 20), s, "w2").unwrap().id);
        } else {
            let j = (next() % live.len() as u64) as usize;
            rt.deallocate(&live.swap_remove(j)).unwrap();
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / ops as f64;
    let st = rt.stats().unwrap();
    let (hits, misses) = (st.cache_hits - before.cache_hits, st.cache_misses - before.cache_misses);
    println!(
        "W2 replay: {ns:7.1} ns/op, hit rate {:.3}, live {} MiB, cached {} MiB, peak held {} MiB",
        hits as f64 / (hits + misses) as f64,
        st.live_bytes >> 20,
        st.cached_bytes >> 20,
        st.peak_outstanding_bytes >> 20
    );
    for id in live {
        rt.deallocate(&id).unwrap();
    }
    rt.release_stream(s).unwrap();
}

fn main() {
    let n = 2_000_000u64;
    if std::env::args().any(|a| a == "--w10-only") {
        // For profilers: W10's two loops alone.
        for _ in 0..5 {
            let (hook, abi) = hook_vs_abi_pairs(n / 20, 11);
            println!("W10 xlog_allocate pair {abi:7.1} ns, hook pair {hook:7.1} ns, ratio {:.2}", hook / abi);
        }
        return;
    }
    if std::env::args().any(|a| a == "--pairs-arena-only") {
        // For profilers: W1's pair on the arena alone.
        let arena = runtime();
        for _ in 0..5 {
            println!("allocate+free pair: arena {:7.1} ns", pairs(&arena, n / 2));
        }
        return;
    }
    if std::env::args().any(|a| a == "--pairs-arena-pool") {
        // W1's pair on the arena (the default) and on the driver pool.
        let pool = runtime_with(Config { budget_bytes: 1 << 40, arena: false, ..Config::default() });
        let arena = runtime();
        for _ in 0..3 {
            println!("allocate+free pair: arena {:7.1} ns, pool {:7.1} ns", pairs(&arena, n / 4), pairs(&pool, n / 4));
        }
        return;
    }
    if std::env::args().any(|a| a == "--logging-only") {
        // The pair with the log off and on, alone.
        pairs_logging_off_on(n / 100, 3);
        let (off, on) = pairs_logging_off_on(n / 20, 11);
        println!("allocate+free pair, logging off: {off:7.1} ns");
        println!("allocate+free pair, logging on:  {on:7.1} ns  (+{:.1} ns)", on - off);
        return;
    }
    if std::env::args().any(|a| a == "--replay") {
        let rt = runtime();
        replay(&rt, 20_000);
        replay(&rt, 200_000);
        return;
    }
    let rt = runtime();
    if std::env::args().any(|a| a == "--w4-only") {
        // For profilers: the same-stream launch loop alone (XLOG_W4_ITERS
        // iterations, default 20 million).
        let iters: u64 = std::env::var("XLOG_W4_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(10 * n);
        let a = rt.acquire_stream().unwrap();
        let blk = rt.allocate(256, a, "w4").unwrap();
        let t0 = Instant::now();
        for _ in 0..iters {
            rt.prepare(&blk.id, a, Access::Write).unwrap();
            rt.finish(&blk.id, a, Access::Write).unwrap();
        }
        println!("same-stream prepare+finish:    {:7.1} ns", t0.elapsed().as_nanos() as f64 / iters as f64);
        return;
    }
    if std::env::args().any(|a| a == "--w4-all-only") {
        // For profilers: prepare_all+finish_all of 8 blocks, streams in turn.
        let iters: u64 = std::env::var("XLOG_W4_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(n);
        let (a, b) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
        let uses: Vec<xlog_cuda::BlockUse> = (0..8)
            .map(|_| xlog_cuda::BlockUse { block: rt.allocate(4096, a, "w4").unwrap().id, access: Access::Write })
            .collect();
        let t0 = Instant::now();
        for i in 0..iters {
            let s = if i % 2 == 0 { a } else { b };
            rt.prepare_all(s, &uses).unwrap();
            rt.finish_all(s, &uses).unwrap();
        }
        println!("prepare_all+finish_all(8):     {:7.1} ns", t0.elapsed().as_nanos() as f64 / iters as f64);
        return;
    }
    pairs(&rt, n / 10);
    println!("allocate+free pair:            {:7.1} ns", pairs(&rt, n));
    let pool = runtime_with(Config { budget_bytes: 1 << 40, arena: false, ..Config::default() });
    pairs(&pool, n / 10);
    println!("  the same, XLOG_MEMORY=pool:  {:7.1} ns", pairs(&pool, n));
    pairs_logging_off_on(n / 100, 3);
    let (off, on) = pairs_logging_off_on(n / 20, 11);
    println!("pair, logging off / on:        {off:7.1} ns / {on:7.1} ns (log +{:.1} ns)", on - off);
    c_abi_pairs(n / 10);
    println!("pair through the C ABI:        {:7.1} ns", c_abi_pairs(n));
    hook_vs_abi_pairs(n / 20, 2);
    let (hook, abi) = hook_vs_abi_pairs(n / 20, 21);
    println!("W10 xlog_allocate pair (hooks' runtime): {abi:7.1} ns");
    println!("W10 torch hook pair (same runtime):      {hook:7.1} ns  ratio {:.2} (target <= 1.2)", hook / abi);
    if std::env::args().any(|a| a == "--pairs-only") {
        return;
    }

    let (a, b) = (rt.acquire_stream().unwrap(), rt.acquire_stream().unwrap());
    let blk = rt.allocate(256, a, "w4").unwrap();
    let t0 = Instant::now();
    for _ in 0..n {
        rt.prepare(&blk.id, a, Access::Write).unwrap();
        rt.finish(&blk.id, a, Access::Write).unwrap();
    }
    println!("same-stream prepare+finish:    {:7.1} ns", t0.elapsed().as_nanos() as f64 / n as f64);
    let t0 = Instant::now();
    for i in 0..n {
        let s = if i % 2 == 0 { a } else { b };
        rt.prepare(&blk.id, s, Access::Write).unwrap();
        rt.finish(&blk.id, s, Access::Write).unwrap();
    }
    println!("cross-stream prepare+finish:   {:7.1} ns", t0.elapsed().as_nanos() as f64 / n as f64);
    let uses: Vec<xlog_cuda::BlockUse> = (0..8)
        .map(|_| xlog_cuda::BlockUse { block: rt.allocate(4096, a, "w4").unwrap().id, access: Access::Write })
        .collect();
    let t0 = Instant::now();
    for i in 0..n / 4 {
        let s = if i % 2 == 0 { a } else { b };
        rt.prepare_all(s, &uses).unwrap();
        rt.finish_all(s, &uses).unwrap();
    }
    println!("prepare_all+finish_all(8):     {:7.1} ns", t0.elapsed().as_nanos() as f64 / (n / 4) as f64);
    for u in &uses {
        rt.deallocate(&u.block).unwrap();
    }
    rt.deallocate(&blk.id).unwrap();
    rt.drain().unwrap();

    for threads in [1u64, 4, 8] {
        let per = n / 4;
        let t0 = Instant::now();
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(|| pairs(&rt, per));
            }
        });
        let agg = (threads * per) as f64 / t0.elapsed().as_nanos() as f64 * 1000.0;
        println!("pairs on {threads} threads: {agg:7.2} pairs/us aggregate");
    }
}
