//! Drives the runtime through a small multi-stream pipeline and prints what
//! happened: allocations, cross-stream waits inserted, pending and reaped
//! bytes, and a budget refusal. Runs on the GPU when one is present (the
//! stages are then empty host callbacks), else on the sim backend where the
//! stages really read and write the blocks.
//!
//!     cargo run --release --example demo

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use xlog_cuda::device::Backend;
use xlog_cuda::{Access, BlockUse, Config, ResourceError, Runtime};

const BLOCK: u64 = 1 << 20;
const ROUNDS: u64 = 8;

fn main() -> Result<(), ResourceError> {
    let mut config = Config::from_env()?;
    config.budget_bytes = config.budget_bytes.max(16 * BLOCK);
    config.wait_on_pressure = true;
    let rt = Runtime::open(0, &config)?;
    println!("xlog-cuda {} demo on {} ({})", xlog_cuda::VERSION, rt.backend().name(), rt.device().name());

    let (producer, left, right, reducer) =
        (rt.acquire_stream()?, rt.acquire_stream()?, rt.acquire_stream()?, rt.acquire_stream()?);
    let checksum = Arc::new(AtomicU64::new(0));
    let on_sim = rt.backend() == Backend::Sim;

    for round in 0..ROUNDS {
        let input = rt.allocate(BLOCK, producer, "input")?.id;
        let out_left = rt.allocate(BLOCK, left, "left")?.id;
        let out_right = rt.allocate(BLOCK, right, "right")?.id;

        // Stage 1: producer writes the input.
        let stage = [BlockUse { block: input, access: Access::Write }];
        rt.prepare_all(producer, &stage)?;
        let dev = rt.device().clone();
        rt.enqueue_host(producer, Box::new(move || {
            if let Some(sim) = dev.as_sim() {
                sim.fill(input.ptr, BLOCK, (round + 1) as u8).expect("fill input");
            }
        }))?;
        rt.finish_all(producer, &stage)?;

        // Stage 2: two transforms read the input on their own streams.
        for (stream, out, factor) in [(left, out_left, 2u8), (right, out_right, 3u8)] {
            let uses = [
                BlockUse { block: input, access: Access::Read },
                BlockUse { block: out, access: Access::Write },
            ];
            rt.prepare_all(stream, &uses)?;
            let dev = rt.device().clone();
            rt.enqueue_host(stream, Box::new(move || {
                if let Some(sim) = dev.as_sim() {
                    let data = sim.read(input.ptr, BLOCK).expect("read input");
                    let out_bytes: Vec<u8> = data.iter().map(|b| b.wrapping_mul(factor)).collect();
                    sim.write(out.ptr, &out_bytes).expect("write output");
                }
            }))?;
            rt.finish_all(stream, &uses)?;
        }

        // Stage 3: the reducer reads both outputs.
        let uses = [
            BlockUse { block: out_left, access: Access::Read },
            BlockUse { block: out_right, access: Access::Read },
        ];
        rt.prepare_all(reducer, &uses)?;
        let (dev, sum) = (rt.device().clone(), checksum.clone());
        rt.enqueue_host(reducer, Box::new(move || {
            if let Some(sim) = dev.as_sim() {
                let a = sim.read(out_left.ptr, BLOCK).expect("read left");
                let b = sim.read(out_right.ptr, BLOCK).expect("read right");
                let total: u64 = a.iter().chain(b.iter()).map(|&x| x as u64).sum();
                sum.fetch_add(total, Ordering::Relaxed);
            }
        }))?;
        rt.finish_all(reducer, &uses)?;

        // Free everything now: each free waits for the other streams' uses.
        for block in [input, out_left, out_right] {
            rt.deallocate(&block)?;
        }
        let reaped = rt.reap()?;
        let s = rt.stats()?;
        println!(
            "round {round}: live {} B, pending {} B, reaped {reaped} B, budget remaining {} B",
            s.live_bytes, s.pending_bytes, s.budget_remaining
        );
    }

    // An allocation bigger than the whole budget is refused with the numbers.
    match rt.allocate(config.budget_bytes + 1, producer, "too_big") {
        Err(e @ ResourceError::OutOfBudget { .. }) => println!("budget refusal: {e}"),
        other => println!("unexpected: {other:?}"),
    }

    rt.synchronize(reducer)?;
    let drained = rt.drain()?;
    let s = rt.stats()?;
    let u = rt.usage();
    println!("drained {drained} B at the end");
    println!(
        "allocations {}, deallocations {}, refused {}, peak outstanding {} B, outstanding now {} B",
        s.allocations, s.deallocations, s.failed_allocations, s.peak_outstanding_bytes, s.outstanding_bytes
    );
    println!("cross-stream waits inserted {}, events recorded {}", u.cross_stream_waits, u.events_recorded);
    if on_sim {
        let expected: u64 = (0..ROUNDS).map(|r| ((r + 1) * 2 % 256 + (r + 1) * 3 % 256) * BLOCK).sum();
        let got = checksum.load(Ordering::Relaxed);
        println!("checksum {got} (expected {expected}): {}", if got == expected { "RESULT OK" } else { "RESULT MISMATCH" });
        if got != expected {
            std::process::exit(1);
        }
    }
    rt.close()?;
    Ok(())
}
