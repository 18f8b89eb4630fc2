//! Streams made per query (an engine that creates a stream for each query,
//! imports it, releases it and destroys it), on the sim backend, whose
//! destroyed stream handles are handed out again by later stream creations
//! as CUDA's are. Each query writes its result on its own stream into a
//! block of a long-lived stream, which reads it after the query's stream
//! is gone.

mod common;

use std::time::Duration;

use common::*;
use xlog_cuda::{Access, Backend, Config, Runtime, StreamId};

const MIB: u64 = 1 << 20;

fn on(rt: &Runtime, s: StreamId, block: &xlog_cuda::BlockId, access: Access, f: impl FnOnce()) {
    rt.prepare(block, s, access).unwrap();
    f();
    rt.finish(block, s, access).unwrap();
}

#[test]
fn results_written_on_streams_made_per_query_are_intact() {
    let config = Config { backend: Backend::Sim, sim_capacity_bytes: 256 * MIB, ..Config::default() };
    let rt = &Runtime::open(0, &config).unwrap();
    let device = dev(rt);
    rt.sim().unwrap().reuse_destroyed_stream_handles(true);
    let keep = rt.acquire_stream().unwrap();
    let mut handles = std::collections::HashSet::new();
    let mut reads = Vec::new();
    for q in 0..12u64 {
        let native = device.create_stream().unwrap();
        handles.insert(native);
        let s = rt.import_stream(device.native_stream(native)).unwrap();
        let len = MIB + q * 40 * 1024;
        let input = rt.allocate(len, s, "input").unwrap().id;
        let scratch = rt.allocate(2 * len, s, "scratch").unwrap().id;
        let result = rt.allocate(len, keep, "result").unwrap().id;
        let byte = (q + 1) as u8;
        on(rt, s, &input, Access::Write, || host_fill(rt, s, input.ptr, len, byte, Duration::from_millis(2)));
        on(rt, s, &scratch, Access::Write, || host_fill(rt, s, scratch.ptr, 2 * len, byte, Duration::from_millis(2)));
        on(rt, s, &result, Access::Write, || host_fill(rt, s, result.ptr, len, byte, Duration::from_millis(5)));
        rt.deallocate(&input).unwrap();
        rt.deallocate(&scratch).unwrap();
        rt.release_stream(s).unwrap();
        device.destroy_stream(native).unwrap();
        // A slow read on the long-lived stream; the result is freed at once,
        // so the next query's blocks may take its memory: their writes
        // must wait for this read.
        rt.prepare(&result, keep, Access::Read).unwrap();
        reads.push((q, byte, host_read_bytes(rt, keep, result.ptr, len, Duration::from_millis(20))));
        rt.finish(&result, keep, Access::Read).unwrap();
        rt.deallocate(&result).unwrap();
    }
    for (q, byte, got) in reads {
        let got = got.recv().unwrap();
        let wrong = got.iter().filter(|&&b| b != byte).count();
        assert_eq!(wrong, 0, "query {q}: {wrong} of {} bytes of the result are not {byte}", got.len());
    }
    assert_eq!(handles.len(), 1, "each query's stream had the handle of the one before");
    let u = rt.usage();
    assert_eq!(u.live_bytes, 0);
}

#[test]
fn an_imported_stream_with_live_blocks_on_it_is_not_released() {
    // A block's free is ordered on its allocation stream; the owner of an
    // imported stream may destroy it once xlog lets go. So the release is
    // refused while blocks allocated on it live, naming them, and changes
    // nothing: the stream still works, and once they are freed it goes.
    let config = Config { backend: Backend::Sim, sim_capacity_bytes: 256 * MIB, ..Config::default() };
    let rt = &Runtime::open(0, &config).unwrap();
    let device = dev(rt);
    let native = device.create_stream().unwrap();
    let s = rt.import_stream(device.native_stream(native)).unwrap();
    let a = rt.allocate(MIB, s, "a").unwrap().id;
    let b = rt.allocate(3 * MIB, s, "b").unwrap().id;
    let err = rt.release_stream(s).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, xlog_cuda::ResourceError::StreamMisuse(_)), "{err:?}");
    assert!(msg.contains("2 live block(s) of 4194304 bytes"), "{msg}");
    // Nothing changed: the stream and its blocks are as they were.
    host_fill(rt, s, a.ptr, MIB, 7, Duration::ZERO);
    rt.synchronize(s).unwrap();
    rt.deallocate(&a).unwrap();
    assert!(rt.release_stream(s).unwrap_err().to_string().contains("1 live block(s) of 3145728 bytes"));
    rt.deallocate(&b).unwrap();
    rt.release_stream(s).unwrap();
    device.destroy_stream(native).unwrap();
    assert!(rt.synchronize(s).is_err(), "released");
    assert_eq!(rt.sim().unwrap().destroyed_stream_calls(), 0);
}
