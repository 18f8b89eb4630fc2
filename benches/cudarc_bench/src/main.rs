//! W1 for cudarc: allocate+free pairs at 256 B, 1 MiB and 64 MiB on one
//! stream, the median of repeated runs, printed as xlog_bench CSV rows
//! (`workload,peer,param,metric,value,ratio_to_raw`; the ratio is left empty
//! here and filled in by benches/report.py against xlog_bench's raw row).
//!
//! Peers:
//!   cudarc             `CudaStream::alloc::<u8>` + drop of the `CudaSlice`,
//!                      with cudarc's default event tracking (two events are
//!                      created per allocation and waited for at drop, since
//!                      the context has more than one stream)
//!   cudarc-notracking  the same after `disable_event_tracking()`
//!   cudarc-sys         `cuMemAllocAsync` / `cuMemFreeAsync` through cudarc's
//!                      dynamically loaded bindings: this process's own raw
//!                      baseline, to compare across the two processes
//!
//! Usage: cudarc_bench [--pairs N] [--repeats N] [--quick]
//! Exit status 77 when there is no driver or no device.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};

const SIZES: [(usize, &str); 3] = [(256, "256B"), (1 << 20, "1MiB"), (64 << 20, "64MiB")];

#[derive(Clone, Copy, PartialEq)]
enum Peer {
    Tracking,
    NoTracking,
    Sys,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Tracking => "cudarc",
            Peer::NoTracking => "cudarc-notracking",
            Peer::Sys => "cudarc-sys",
        }
    }
}

/// Microseconds per allocate+free pair over `pairs` pairs (after a warm-up),
/// including the final stream synchronisation.
fn pairs_us(stream: &Arc<CudaStream>, peer: Peer, bytes: usize, pairs: usize) -> Result<f64, DriverError> {
    let run = |n: usize| -> Result<(), DriverError> {
        for _ in 0..n {
            if peer == Peer::Sys {
                // SAFETY: the pointer comes from cuMemAllocAsync on this
                // stream and is freed exactly once, on the same stream.
                unsafe {
                    let ptr = result::malloc_async(stream.cu_stream(), bytes)?;
                    result::free_async(ptr, stream.cu_stream())?;
                }
            } else {
                // SAFETY: the slice is never read; uninitialised memory is
                // only unsafe to read.
                let slice = unsafe { stream.alloc::<u8>(bytes)? };
                drop(slice);
            }
        }
        stream.synchronize()
    };
    run((pairs / 10).max(64))?;
    let t0 = Instant::now();
    run(pairs)?;
    Ok(t0.elapsed().as_secs_f64() * 1e6 / pairs as f64)
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

fn main() {
    let mut pairs = 2000usize;
    let mut repeats = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |what: &str| -> usize {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                eprintln!("cudarc_bench: {what} needs a number");
                std::process::exit(1)
            })
        };
        match arg.as_str() {
            "--pairs" => pairs = number("--pairs"),
            "--repeats" => repeats = number("--repeats"),
            "--quick" => {
                pairs = 200;
                repeats = 3;
            }
            _ => {
                eprintln!("usage: cudarc_bench [--pairs N] [--repeats N] [--quick]");
                std::process::exit(1);
            }
        }
    }

    // SAFETY: only probes whether libcuda can be loaded (cudarc panics on
    // first use otherwise).
    if !unsafe { sys::is_culib_present() } {
        println!("cudarc_bench: no GPU: libcuda.so could not be loaded");
        std::process::exit(77);
    }
    let ctx = match CudaContext::new(0) {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("cudarc_bench: no GPU: {e:?}");
            std::process::exit(77);
        }
    };
    if !ctx.has_async_alloc() {
        eprintln!("cudarc_bench: device 0 has no stream-ordered allocation");
        std::process::exit(1);
    }
    // A stream of its own, as an engine would use: the context is then in
    // multi-stream mode, where cudarc's event tracking is active.
    let stream = ctx.new_stream().unwrap_or_else(|e| {
        eprintln!("cudarc_bench: new_stream: {e:?}");
        std::process::exit(1)
    });

    for (bytes, label) in SIZES {
        let mut samples: Vec<(Peer, Vec<f64>)> =
            [Peer::Tracking, Peer::NoTracking, Peer::Sys].iter().map(|&p| (p, Vec::new())).collect();
        for _ in 0..repeats {
            for (peer, v) in samples.iter_mut() {
                // SAFETY: event tracking is switched only between runs, with
                // no slice alive, as cudarc requires.
                unsafe {
                    if *peer == Peer::NoTracking {
                        ctx.disable_event_tracking();
                    } else {
                        ctx.enable_event_tracking();
                    }
                }
                match pairs_us(&stream, *peer, bytes, pairs) {
                    Ok(us) => v.push(us),
                    Err(e) => {
                        println!("W1,{},{label},ERROR,{e:?},", peer.name());
                        std::process::exit(1);
                    }
                }
            }
        }
        for (peer, v) in samples {
            println!("W1,{},{label},us_per_pair,{:.6},", peer.name(), median(v));
        }
    }
}
