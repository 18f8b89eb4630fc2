//! Ordering oracle: random multi-stream launch graphs run through
//! prepare_all / host kernel / finish_all must leave the blocks exactly as a
//! sequential run of the same launches on the host does.
//!
//! A graph is 30 launches over 6 blocks of 64 bytes on 4 streams. Each
//! launch runs on a random stream, reads some blocks and writes (or
//! read-writes) others; its kernel hashes the launch number and everything
//! it reads into what it writes, and sleeps a random 0–2 ms (half before
//! reading, half between reading and writing) so that an unordered pair of
//! launches really overlaps. 200 graphs per stack from fixed seeds.
//!
//! Blocks are filled in their allocation stream's order (an allocation may
//! hand out memory from a cache while its previous owner's reads on other
//! streams are still queued, as CUDA's stream-ordered reuse does), and each
//! graph allocates on the next stream, so with the cache on every block
//! moves between streams through the caches while the previous graph's
//! read-backs may still be queued. A dedicated test holds such a reader
//! with a gate and checks that the next owner's writes (on its own stream
//! and on a third) wait for it, and that the reader sees the old data.
//!
//! The oracle is shown able to fail: with one `prepare` left out (a launch
//! that reads a block a slow launch on another stream writes), the result
//! differs — deterministically, because the slow launch is held until the
//! unprepared one has finished.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use xlog_cuda::{Access, BlockId, BlockUse, Runtime, StreamId};

const STREAMS: usize = 4;
const BLOCKS: usize = 6;
const BLOCK_BYTES: usize = 64;
const LAUNCHES: usize = 30;
const GRAPHS: u64 = 200;

type Bytes = [u8; BLOCK_BYTES];

#[derive(Clone, Debug)]
struct Launch {
    stream: usize,
    /// (block, access), in block order; at least one access writes.
    uses: Vec<(usize, Access)>,
    sleep_before_read: Duration,
    sleep_before_write: Duration,
}

fn random_graph(rng: &mut XorShift, launches: usize) -> Vec<Launch> {
    random_graph_with_repeats(rng, launches, 0)
}

/// As `random_graph`, but with `repeat_percent` percent of the launches
/// after an all-write one the same launch again (same blocks, all written:
/// what the launch cache and its owed records serve), on the same stream
/// three times in four, else on another.
fn random_graph_with_repeats(rng: &mut XorShift, launches: usize, repeat_percent: u64) -> Vec<Launch> {
    let mut previous: Option<Launch> = None;
    (0..launches)
        .map(|_| {
            if let Some(p) = previous.as_ref().filter(|p| p.uses.iter().all(|(_, a)| a.writes())) {
                if rng.below(100) < repeat_percent {
                    let mut again = p.clone();
                    if rng.below(4) == 0 {
                        again.stream = (p.stream + 1 + rng.below(STREAMS as u64 - 1) as usize) % STREAMS;
                    }
                    return again;
                }
            }
            let stream = rng.below(STREAMS as u64) as usize;
            let mut uses: Vec<(usize, Access)> = Vec::new();
            for b in 0..BLOCKS {
                match rng.below(100) {
                    0..=54 => {}
                    55..=79 => uses.push((b, Access::Read)),
                    80..=91 => uses.push((b, Access::Write)),
                    _ => uses.push((b, Access::ReadWrite)),
                }
            }
            if !uses.iter().any(|(_, a)| a.writes()) {
                let b = rng.below(BLOCKS as u64) as usize;
                match uses.iter_mut().find(|(x, _)| *x == b) {
                    Some(u) => u.1 = Access::ReadWrite,
                    None => {
                        uses.push((b, Access::Write));
                        uses.sort_by_key(|u| u.0);
                    }
                }
            }
            if repeat_percent > 0 && rng.below(2) == 0 {
                // Seed repeats: half the fresh launches write all they use.
                for u in uses.iter_mut().filter(|u| !u.1.writes()) {
                    u.1 = Access::ReadWrite;
                }
            }
            let total_us = rng.below(2001);
            let first = rng.below(total_us + 1);
            let launch = Launch {
                stream,
                uses,
                sleep_before_read: Duration::from_micros(first),
                sleep_before_write: Duration::from_micros(total_us - first),
            };
            previous = Some(launch.clone());
            launch
        })
        .collect()
}

fn mix(h: u64, x: u64) -> u64 {
    let mut z = (h ^ x).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The kernel of launch `index`: from what it read (in use order), the
/// contents of every block it writes.
fn kernel(index: usize, uses: &[(usize, Access)], read: &[(usize, Bytes)]) -> Vec<(usize, Bytes)> {
    let mut h = mix(0x00A1_1CE5, index as u64);
    for (b, bytes) in read {
        h = mix(h, *b as u64);
        for chunk in bytes.chunks(8) {
            h = mix(h, u64::from_le_bytes(chunk.try_into().unwrap()));
        }
    }
    uses.iter()
        .filter(|(_, a)| a.writes())
        .map(|&(b, _)| {
            let mut out = [0u8; BLOCK_BYTES];
            for (i, chunk) in out.chunks_mut(8).enumerate() {
                chunk.copy_from_slice(&mix(h, (b * 64 + i) as u64).to_le_bytes());
            }
            (b, out)
        })
        .collect()
}

fn initial_contents(seed: u64) -> Vec<Bytes> {
    (0..BLOCKS)
        .map(|b| {
            let mut out = [0u8; BLOCK_BYTES];
            for (i, chunk) in out.chunks_mut(8).enumerate() {
                chunk.copy_from_slice(&mix(seed, (b * 8 + i) as u64).to_le_bytes());
            }
            out
        })
        .collect()
}

/// The launches run one after another on the host.
fn sequential(init: &[Bytes], graph: &[Launch]) -> Vec<Bytes> {
    let mut blocks = init.to_vec();
    for (i, l) in graph.iter().enumerate() {
        let read: Vec<(usize, Bytes)> =
            l.uses.iter().filter(|(_, a)| *a != Access::Write).map(|&(b, _)| (b, blocks[b])).collect();
        for (b, out) in kernel(i, &l.uses, &read) {
            blocks[b] = out;
        }
    }
    blocks
}

/// How a run deviates from the correct protocol (for the negative tests).
#[derive(Default)]
struct Sabotage {
    /// Launch whose prepare_all is left out.
    skip_prepare: Option<usize>,
    /// (held, releaser): the held launch's kernel waits until the
    /// releaser's kernel has finished (at most 5 s).
    hold_until: Option<(usize, usize)>,
}

struct RunResult {
    contents: Vec<Bytes>,
    /// The held launch gave up waiting for its releaser.
    hold_timed_out: bool,
}

/// Read-backs queued but not collected yet.
struct Readback {
    rx: Receiver<(usize, Vec<u8>)>,
    blocks: usize,
    timed_out: Arc<AtomicBool>,
}

impl Readback {
    fn collect(self) -> RunResult {
        let mut contents = vec![[0u8; BLOCK_BYTES]; self.blocks];
        for _ in 0..self.blocks {
            let (b, bytes) = self.rx.recv_timeout(Duration::from_secs(30)).expect("read-back never ran");
            contents[b] = bytes.try_into().unwrap();
        }
        RunResult { contents, hold_timed_out: self.timed_out.load(Ordering::Acquire) }
    }
}

/// Hooks a kernel may carry (for the negative tests).
#[derive(Default)]
struct Hooks {
    /// Wait for this before running (at most 5 s; a timeout is recorded).
    hold: Option<Receiver<()>>,
    /// Signal this after running.
    release: Option<Sender<()>>,
    timed_out: Option<Arc<AtomicBool>>,
}

/// Submit launch `index` on `stream`: prepare_all (unless `prepare` is
/// false), the kernel as a host callback, finish_all.
fn submit(rt: &Runtime, stream: StreamId, index: usize, l: &Launch, blocks: &[BlockId], prepare: bool, hooks: Hooks) {
    let uses: Vec<BlockUse> = l.uses.iter().map(|&(b, a)| BlockUse { block: blocks[b], access: a }).collect();
    if prepare {
        rt.prepare_all(stream, &uses).unwrap();
    }
    let dev = dev(rt);
    let ptrs: Vec<u64> = blocks.iter().map(|b| b.ptr).collect();
    let l = l.clone();
    rt.enqueue_host(
        stream,
        Box::new(move || {
            if let Some(rx) = hooks.hold {
                if rx.recv_timeout(Duration::from_secs(5)).is_err() {
                    if let Some(flag) = &hooks.timed_out {
                        flag.store(true, Ordering::Release);
                    }
                }
            }
            let sim = dev.as_sim().unwrap();
            std::thread::sleep(l.sleep_before_read);
            let read: Vec<(usize, Bytes)> = l
                .uses
                .iter()
                .filter(|(_, a)| *a != Access::Write)
                .map(|&(b, _)| (b, sim.read(ptrs[b], BLOCK_BYTES as u64).unwrap().try_into().unwrap()))
                .collect();
            std::thread::sleep(l.sleep_before_write);
            for (b, out) in kernel(index, &l.uses, &read) {
                sim.write(ptrs[b], &out).unwrap();
            }
            if let Some(tx) = hooks.release {
                let _ = tx.send(());
            }
        }),
    )
    .unwrap();
    rt.finish_all(stream, &uses).unwrap();
}

/// Allocate the blocks on `alloc_stream` and fill them with `init`.
///
/// The fill is queued on the allocation stream, not done from the host at
/// once: an allocation is stream-ordered, and its memory may come straight
/// from a cache (this stream's, or another's with a GPU-side wait queued
/// behind the previous owner's free) while the previous owner's reads on
/// other streams are still queued. Only work in the allocation stream's
/// order is safe, exactly as with CUDA's stream-ordered reuse.
fn allocate_blocks(rt: &Runtime, alloc_stream: StreamId, init: &[Bytes]) -> Vec<BlockId> {
    init.iter()
        .map(|bytes| {
            let id = rt.allocate(BLOCK_BYTES as u64, alloc_stream, "oracle").unwrap().id;
            let (dev, bytes) = (dev(rt), *bytes);
            rt.enqueue_host(alloc_stream, Box::new(move || dev.as_sim().unwrap().write(id.ptr, &bytes).unwrap()))
                .unwrap();
            id
        })
        .collect()
}

/// Queue a tracked read launch for every block on some stream, then free
/// the blocks (the frees must wait for the reads). Nothing is synchronized:
/// the next graph's blocks may reuse the addresses as soon as the frees
/// pass their stream, while these reads are still queued.
fn read_back_and_free(rt: &Runtime, streams: &[StreamId], blocks: &[BlockId]) -> Receiver<(usize, Vec<u8>)> {
    let (tx, rx) = mpsc::channel::<(usize, Vec<u8>)>();
    let dev = dev(rt);
    for (b, id) in blocks.iter().enumerate() {
        let stream = streams[b % streams.len()];
        let uses = [BlockUse { block: *id, access: Access::Read }];
        rt.prepare_all(stream, &uses).unwrap();
        let (tx, dev, ptr) = (tx.clone(), dev.clone(), id.ptr);
        rt.enqueue_host(
            stream,
            Box::new(move || {
                let _ = tx.send((b, dev.as_sim().unwrap().read(ptr, BLOCK_BYTES as u64).unwrap()));
            }),
        )
        .unwrap();
        rt.finish_all(stream, &uses).unwrap();
    }
    for id in blocks {
        rt.deallocate(id).unwrap();
    }
    rx
}

/// Submit a whole graph: allocate, every launch, the read-backs, the frees.
fn run_graph(
    rt: &Runtime,
    streams: &[StreamId],
    alloc_stream: StreamId,
    init: &[Bytes],
    graph: &[Launch],
    sabotage: &Sabotage,
) -> Readback {
    let blocks = allocate_blocks(rt, alloc_stream, init);
    if sabotage.skip_prepare.is_some() {
        // The unprepared launch must differ only by the wait it lacks, not
        // also by running before the initial fill (queued on the allocation
        // stream, which only a prepare orders it after).
        rt.synchronize(alloc_stream).unwrap();
    }
    let timed_out = Arc::new(AtomicBool::new(false));
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (mut release_tx, mut release_rx) = (Some(release_tx), Some(release_rx));
    for (i, l) in graph.iter().enumerate() {
        let mut hooks = Hooks::default();
        if let Some((held, releaser)) = sabotage.hold_until {
            if held == i {
                hooks.hold = release_rx.take();
                hooks.timed_out = Some(timed_out.clone());
            }
            if releaser == i {
                hooks.release = release_tx.take();
            }
        }
        submit(rt, streams[l.stream], i, l, &blocks, sabotage.skip_prepare != Some(i), hooks);
    }
    drop((release_tx, release_rx));
    Readback { rx: read_back_and_free(rt, streams, &blocks), blocks: blocks.len(), timed_out }
}

fn differing_blocks(a: &[Bytes], b: &[Bytes]) -> Vec<usize> {
    (0..BLOCKS).filter(|&i| a[i] != b[i]).collect()
}

fn random_graphs_match_sequential_execution(kind: StackKind, base_seed: u64) {
    random_graphs_match(kind, base_seed, 0, GRAPHS);
}

/// `random_graphs_match_sequential_execution` over `graphs` graphs with
/// `repeat_percent` (see `random_graph_with_repeats`).
fn random_graphs_match(kind: StackKind, base_seed: u64, repeat_percent: u64, graphs: u64) {
    // A budget of 16 graphs' worth of blocks: frees are never reaped by
    // hand, so the budget hits pressure and waits for pending frees.
    let opts = Opts { budget_bytes: 16 * 384, capacity_bytes: 4 * MIB, wait_on_pressure: true, ..Opts::default() };
    let st = Stack::open(kind, opts);
    let rt = &st.rt;
    let streams: Vec<StreamId> = (0..STREAMS).map(|_| st.stream()).collect();
    let started = Instant::now();
    let mut cross_stream_edges = 0u64;
    // Two graphs are in flight at a time: a graph's read-backs are collected
    // only after the next graph has been submitted, so its blocks (which may
    // reuse the freed addresses) are written while the reads may still be
    // queued — only the frees' waits keep them apart.
    let check = |(g, seed, graph, expected, rb): (u64, u64, Vec<Launch>, Vec<Bytes>, Readback)| {
        let got = rb.collect();
        let diff = differing_blocks(&expected, &got.contents);
        assert!(
            diff.is_empty(),
            "[{kind}] graph {g} (seed {seed}): blocks {diff:?} differ from the sequential run\ngraph: {graph:#?}"
        );
    };
    let mut in_flight = None;
    let recorded_before = rt.usage().events_recorded;
    let mut launches_run = 0u64;
    let mut same_stream_repeats = 0u64;
    for g in 0..graphs {
        let seed = base_seed + g;
        let mut rng = XorShift::new(seed);
        let graph = random_graph_with_repeats(&mut rng, LAUNCHES, repeat_percent);
        launches_run += graph.len() as u64;
        same_stream_repeats +=
            graph.windows(2).filter(|w| w[0].stream == w[1].stream && w[0].uses == w[1].uses).count() as u64;
        let init = initial_contents(seed);
        let expected = sequential(&init, &graph);
        let waits_before = rt.usage().cross_stream_waits;
        let rb = run_graph(rt, &streams, streams[g as usize % STREAMS], &init, &graph, &Sabotage::default());
        cross_stream_edges += rt.usage().cross_stream_waits - waits_before;
        if let Some(previous) = in_flight.replace((g, seed, graph, expected, rb)) {
            check(previous);
        }
        st.check_invariant(&format!("after graph {g}"));
    }
    check(in_flight.take().unwrap());
    let pending = rt.stats().unwrap().pending_bytes;
    assert_eq!(rt.drain().unwrap(), pending, "[{kind}] drain retires every pending free");
    st.check_invariant("drained");
    let stats = rt.stats().unwrap();
    assert_eq!((stats.live_bytes, stats.pending_bytes, stats.live_blocks), (0, 0, 0), "[{kind}] {stats:?}");
    assert_eq!(stats.outstanding_bytes, stats.cached_bytes, "[{kind}] only the cache is left: {stats:?}");
    st.release_all();
    st.check_invariant("trimmed and drained");
    assert_eq!(rt.stats().unwrap().outstanding_bytes, 0, "[{kind}]");
    assert_eq!(stats.allocations, graphs * BLOCKS as u64, "[{kind}]");
    assert_eq!(stats.failed_allocations, 0, "[{kind}] wait_on_pressure makes room for every graph");
    if let Some(limit) = st.limit {
        assert!(stats.peak_outstanding_bytes <= limit, "[{kind}] {stats:?}");
        if !kind.caches() {
            assert!(graphs * BLOCKS as u64 * kind.held_bytes(BLOCK_BYTES as u64) > limit, "the budget must come under pressure");
        }
    }
    if kind.caches() {
        // Each graph allocates on the next stream: after the first, every
        // block comes out of the previous graph's allocation stream's
        // cache (a cross-stream hand-out) while that graph's read-backs on
        // other streams may still be queued.
        assert_eq!(stats.cache_hits + stats.cache_misses, stats.allocations, "[{kind}] {stats:?}");
        assert_eq!(stats.cache_misses, BLOCKS as u64, "[{kind}] only the first graph misses: {stats:?}");
    } else {
        assert_eq!((stats.cache_hits, stats.cache_misses), (0, 0), "[{kind}] {stats:?}");
    }
    assert!(cross_stream_edges > graphs * 10, "[{kind}] the graphs must have cross-stream dependencies: {cross_stream_edges}");
    let recorded = rt.usage().events_recorded - recorded_before;
    if repeat_percent > 0 {
        // The graphs must really repeat launches on their stream (each such
        // finish owes its record instead of making it).
        assert!(same_stream_repeats > graphs * 5, "[{kind}] only {same_stream_repeats} same-stream repeats");
    }
    println!(
        "[{kind}] {graphs} graphs x {LAUNCHES} launches on {STREAMS} streams ({repeat_percent}% repeats): all match; \
         {cross_stream_edges} cross-stream waits; {recorded} events for {launches_run} launches \
         ({same_stream_repeats} repeated on their stream); {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn random_graphs_match_sequential_execution_recommended_stack() {
    random_graphs_match_sequential_execution(StackKind::BudgetLoggingAsync, 0x0AC1_E000);
}

/// The same with most launches repeated (the launch cache's hits, owed
/// records made by the next prepare on another stream, the next other
/// launch, or a free).
#[test]
fn random_graphs_with_repeated_launches_match_sequential_execution() {
    random_graphs_match(StackKind::BudgetLoggingAsync, 0x0AC1_C000, 70, GRAPHS);
}

#[test]
fn random_graphs_match_sequential_execution_async() {
    random_graphs_match_sequential_execution(StackKind::Async, 0x0AC1_F000);
}

#[test]
fn random_graphs_match_sequential_execution_budget_async_cache_off() {
    random_graphs_match_sequential_execution(StackKind::BudgetAsyncNoCache, 0x0AC1_D000);
}

/// How the previous owner of a block reads it before freeing it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum PreviousReader {
    /// prepare_all / kernel / finish_all: the free waits for the read.
    Tracked,
    /// The kernel is queued with no prepare / finish (the sabotage): the
    /// runtime cannot know the block is still being read.
    Untracked,
}

/// One hand-over through the caches: block X is written on stream A, read
/// on stream B by a kernel held back by a gate, and freed on A; then a
/// block of the same size is allocated on stream C — it is X's memory, from
/// A's cache — and its new owner writes it at once, in C's order, and then
/// again from a launch on stream D (its first foreign use). The reader on
/// B must see what A wrote, never the next owner's data, and the next
/// owner's writes must wait for the reader.
fn hand_over(kind: StackKind, reader: PreviousReader) -> (Bytes, bool) {
    let st = Stack::open_default(kind);
    let rt = &st.rt;
    let [a, b, c, d]: [StreamId; 4] = std::array::from_fn(|_| st.stream());
    let old = initial_contents(11)[0];
    let new = initial_contents(12)[0];
    let x = allocate_blocks(rt, a, &[old])[0];
    let use_x = [BlockUse { block: x, access: Access::Read }];
    let mut held = gate(rt, b);
    if reader == PreviousReader::Tracked {
        rt.prepare_all(b, &use_x).unwrap();
    }
    let seen = host_read_bytes(rt, b, x.ptr, BLOCK_BYTES as u64, Duration::ZERO);
    if reader == PreviousReader::Tracked {
        rt.finish_all(b, &use_x).unwrap();
    }
    let freed = rt.deallocate(&x).unwrap();
    assert_eq!(freed.state, kind.freed_state(BLOCK_BYTES as u64), "[{kind}]");
    let hits = rt.stats().unwrap().cache_hits;
    let waits = rt.usage().cross_stream_waits;
    let y = rt.allocate(BLOCK_BYTES as u64, c, "next owner").unwrap().id;
    let from_cache = y.ptr == x.ptr;
    if kind.caches() {
        assert!(from_cache, "[{kind}] the next allocation of the size takes X's memory from A's cache");
        assert_eq!(rt.stats().unwrap().cache_hits, hits + 1, "[{kind}] a cache hit");
        assert_eq!(rt.usage().cross_stream_waits, waits + 1, "[{kind}] C waits (on the GPU) for A's free");
        expect_use_after_free(rt.validate(&x), &x, "X's handle after its memory went to a new owner");
    }
    // The next owner writes at once on its own stream, then from stream D.
    host_fill(rt, c, y.ptr, BLOCK_BYTES as u64, 0xC0, Duration::ZERO);
    let c_wrote = marker(rt, c);
    let use_y = [BlockUse { block: y, access: Access::Write }];
    rt.prepare_all(d, &use_y).unwrap();
    let (dv, new_bytes) = (dev(rt), new);
    rt.enqueue_host(d, Box::new(move || dv.as_sim().unwrap().write(y.ptr, &new_bytes).unwrap())).unwrap();
    rt.finish_all(d, &use_y).unwrap();
    let d_wrote = marker(rt, d);
    let blocked = reader == PreviousReader::Tracked && from_cache;
    if blocked {
        assert_blocked(&c_wrote, &format!("[{kind}] the next owner's write on C waits for the reader on B"));
        assert_blocked(&d_wrote, &format!("[{kind}] the next owner's write on D waits for the reader on B"));
    } else {
        // Nothing orders the next owner after the untracked reader (or the
        // memory is not X's): its writes run while the reader is held.
        recv(&c_wrote, "the next owner's write on C");
        recv(&d_wrote, "the next owner's write on D");
    }
    held.open();
    let got: Bytes = recv(&seen, "the previous owner's read").try_into().unwrap();
    if blocked {
        recv(&c_wrote, "C, once the reader ran");
        recv(&d_wrote, "D, once the reader ran");
    }
    let rb = rt.sim().unwrap().read(y.ptr, BLOCK_BYTES as u64).unwrap();
    assert_eq!(rb, new.to_vec(), "[{kind}] the next owner's last write (on D, after C's) stands");
    rt.deallocate(&y).unwrap();
    st.release_all();
    st.check_invariant("end");
    if reader == PreviousReader::Tracked {
        assert_eq!(got, old, "[{kind}] the previous owner's reader saw the next owner's data");
    }
    (got, from_cache)
}

#[test]
fn blocks_moving_between_streams_through_the_caches_never_show_the_next_owners_data() {
    for kind in [StackKind::Async, StackKind::BudgetAsync, StackKind::BudgetLoggingAsync, StackKind::AsyncNoCache] {
        let (got, _) = hand_over(kind, PreviousReader::Tracked);
        assert_eq!(got, initial_contents(11)[0], "[{kind}]");
    }
}

/// The same hand-over with the previous owner's read left untracked: the
/// free cannot wait for it, so the next owner's write (on C, right after the
/// cache hand-out) lands first and the reader sees it. This shows the
/// check above can fail.
#[test]
fn oracle_catches_an_untracked_reader_of_a_block_handed_over_through_the_cache() {
    for kind in [StackKind::Async, StackKind::BudgetLoggingAsync] {
        let (got, from_cache) = hand_over(kind, PreviousReader::Untracked);
        assert!(from_cache, "[{kind}]");
        assert_ne!(got, initial_contents(11)[0], "[{kind}] the untracked reader must see the next owner's data");
        assert_eq!(got, initial_contents(12)[0], "[{kind}] exactly the next owner's last write");
    }
}

/// Two launches: 0 writes X on stream A (held back by a gate), 1 reads X
/// and writes Y on stream B. With the prepare, launch 1 waits for launch 0;
/// without it, launch 1 runs first and Y is computed from the old X —
/// exactly that value, not just a different one.
#[test]
fn oracle_catches_a_missing_prepare_deterministically() {
    let zero = Duration::ZERO;
    let graph = vec![
        Launch { stream: 0, uses: vec![(0, Access::Write)], sleep_before_read: zero, sleep_before_write: zero },
        Launch {
            stream: 1,
            uses: vec![(0, Access::Read), (1, Access::Write)],
            sleep_before_read: zero,
            sleep_before_write: zero,
        },
    ];
    let init = initial_contents(7);
    let expected = sequential(&init, &graph);
    // What launch 1 computes when it reads X before launch 0 wrote it.
    let racy_y = kernel(1, &graph[1].uses, &[(0, init[0])])[0].1;
    assert_ne!(racy_y, expected[1], "the scenario must be able to tell the orders apart");

    for prepare in [true, false] {
        let st = Stack::open_default(StackKind::BudgetAsync);
        let rt = &st.rt;
        let streams: Vec<StreamId> = (0..2).map(|_| st.stream()).collect();
        let blocks = allocate_blocks(rt, streams[0], &init[..2]);
        // The fill ran: without its prepare, launch 1 differs only by the
        // wait for launch 0.
        rt.synchronize(streams[0]).unwrap();
        let mut held = gate(rt, streams[0]);
        submit(rt, streams[0], 0, &graph[0], &blocks, true, Hooks::default());
        submit(rt, streams[1], 1, &graph[1], &blocks, prepare, Hooks::default());
        let launch1_done = marker(rt, streams[1]);
        if prepare {
            assert_blocked(&launch1_done, "with prepare, launch 1 waits for the held launch 0");
        } else {
            recv(&launch1_done, "without prepare, launch 1 runs while launch 0 is held");
        }
        held.open();
        let rx = read_back_and_free(rt, &streams, &blocks);
        let got = Readback { rx, blocks: 2, timed_out: Arc::default() }.collect().contents;
        if prepare {
            assert_eq!(got, expected[..2].to_vec(), "with every prepare the oracle agrees");
        } else {
            assert_eq!(got[0], expected[0], "X ends as launch 0 wrote it");
            assert_eq!(got[1], racy_y, "launch 1 read X before launch 0 wrote it");
            assert_ne!(got[1], expected[1], "the oracle reports the missing wait");
        }
        rt.drain().unwrap();
        st.check_invariant("end");
    }
}

/// In random graphs: pick a launch j that is the first on its stream and
/// reads a block whose last writer i ran on another stream; cut the graph
/// after j, hold i until j has finished and leave out j's prepare. The
/// oracle must report a difference every time.
#[test]
fn oracle_catches_a_missing_prepare_in_random_graphs() {
    let mut caught = 0;
    let mut seed = 0xB00C_0000u64;
    while caught < 20 {
        seed += 1;
        assert!(seed < 0xB00C_0000 + 10_000, "too few graphs had a suitable pair");
        let mut rng = XorShift::new(seed);
        let graph = random_graph(&mut rng, LAUNCHES);
        let Some((i, j)) = find_unprepared_pair(&graph) else { continue };
        let graph = &graph[..=j];
        let init = initial_contents(seed);
        let expected = sequential(&init, graph);
        let st = Stack::open_default(StackKind::BudgetAsync);
        let streams: Vec<StreamId> = (0..STREAMS).map(|_| st.stream()).collect();
        let sabotage = Sabotage { skip_prepare: Some(j), hold_until: Some((i, j)) };
        let got = run_graph(&st.rt, &streams, streams[0], &init, graph, &sabotage).collect();
        assert!(!got.hold_timed_out, "seed {seed}: launch {j} did not run while launch {i} was held");
        let diff = differing_blocks(&expected, &got.contents);
        let written_by_j: Vec<usize> = graph[j].uses.iter().filter(|(_, a)| a.writes()).map(|u| u.0).collect();
        assert!(
            diff.iter().any(|b| written_by_j.contains(b)),
            "seed {seed}: launch {j} read a block before launch {i} wrote it, yet the blocks it wrote \
             ({written_by_j:?}) match the sequential run (differing: {diff:?})"
        );
        st.rt.drain().unwrap();
        st.check_invariant("end");
        caught += 1;
    }
}

/// (i, j): j is the first launch on its stream and reads a block whose last
/// writer before j is i, on another stream.
fn find_unprepared_pair(graph: &[Launch]) -> Option<(usize, usize)> {
    for j in 0..graph.len() {
        let stream = graph[j].stream;
        if graph[..j].iter().any(|l| l.stream == stream) {
            continue;
        }
        for &(b, a) in &graph[j].uses {
            if a == Access::Write {
                continue;
            }
            let last_writer = (0..j).rev().find(|&k| graph[k].uses.iter().any(|&(x, a)| x == b && a.writes()));
            if let Some(i) = last_writer {
                if graph[i].stream != stream {
                    return Some((i, j));
                }
            }
        }
    }
    None
}
