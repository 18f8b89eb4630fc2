// benches/multi_device_bench.cu — the cost of a cross-device use (issue 15).
//
// A block of device 0, last written on a stream of device 0, is read by a
// stream of device 1. Measured per iteration, in one run, interleaved:
//
//   raw          cuEventRecord(event of device 0, stream of device 0) +
//                cuStreamWaitEvent(stream of device 1, that event): the
//                least the driver needs to order one cross-device use
//   xlog-peer    xlog_prepare + xlog_finish (read) on device 0's runtime with
//                device 1's stream (the bridge path of src/runtime/multi_device.rs)
//   xlog-local   xlog_prepare + xlog_finish (read) with a second stream of
//                device 0 (the single-device path, for reference)
//
// Each figure is the median over --repeats runs of --iters iterations (the
// streams are synchronised between batches of 1,000, outside the timing,
// so queues do not grow). The target of issue 15: xlog-peer <= 1.5 x raw.
//
// Output: one line per peer, then "TARGET PASS|FAIL: ..." comparing
// xlog-peer with raw. Exit 0 when it ran (whatever the target), 77 with
// fewer than two GPUs or without peer access, 1 on an error.
//
// Built with the CUDA tests (cpp_tests/cuda/CMakeLists.txt) as
// xlog_multi_device_bench, so CI compiles it; scripts/gpu-multi runs it.

#include <xlog_cuda.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::printf("ERROR: %s\n", what.c_str());
  std::exit(1);
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorName(e));
}

std::string last_message() {
  size_t n = xlog_last_error_message(nullptr, 0);
  std::string text(n + 1, '\0');
  xlog_last_error_message(&text[0], text.size());
  text.resize(n);
  return text;
}

void xlog_ok(xlog_status s, const char* what) {
  if (s != XLOG_OK) fail(std::string(what) + ": " + xlog_status_name(s) + ": " + last_message());
}

using RecordFn = CUresult (*)(CUevent, CUstream);
using WaitFn = CUresult (*)(CUstream, CUevent, unsigned int);

template <class F>
F driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  cuda_ok(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found), name);
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) fail(std::string("driver entry point ") + name + " not found");
  return reinterpret_cast<F>(fn);
}

xlog_runtime* open_device(int device) {
  xlog_config cfg;
  xlog_config_init(&cfg);
  cfg.struct_size = sizeof cfg;
  cfg.backend = XLOG_BACKEND_CUDA;
  cfg.allocator = XLOG_ALLOCATOR_ASYNC;
  cfg.budget_bytes = 1ull << 30;
  cfg.log_path = nullptr;
  xlog_runtime* rt = nullptr;
  xlog_ok(xlog_runtime_open(device, &cfg, &rt), "xlog_runtime_open");
  return rt;
}

struct Stream {
  xlog_stream id = 0;
  CUstream native = nullptr;
};

Stream acquire(xlog_runtime* rt) {
  Stream s;
  xlog_ok(xlog_stream_acquire(rt, &s.id), "xlog_stream_acquire");
  void* native = nullptr;
  xlog_ok(xlog_stream_native(rt, s.id, &native), "xlog_stream_native");
  s.native = static_cast<CUstream>(native);
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  long iters = 20000, repeats = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atol(argv[++i]);
    } else if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::atol(argv[++i]);
    } else {
      std::printf("usage: %s [--iters N] [--repeats N]\n", argv[0]);
      return 1;
    }
  }
  if (iters < 1000 || repeats < 1) fail("--iters must be >= 1000 and --repeats >= 1");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) {
    std::printf("SKIP: needs 2 CUDA devices, found %d\n", count);
    return 77;
  }
  int can01 = 0, can10 = 0;
  cuda_ok(cudaDeviceCanAccessPeer(&can01, 0, 1), "cudaDeviceCanAccessPeer");
  cuda_ok(cudaDeviceCanAccessPeer(&can10, 1, 0), "cudaDeviceCanAccessPeer");
  if (!can01 || !can10) {
    std::printf("SKIP: devices 0 and 1 have no peer access\n");
    return 77;
  }
  const RecordFn record = driver_entry<RecordFn>("cuEventRecord");
  const WaitFn wait = driver_entry<WaitFn>("cuStreamWaitEvent");

  xlog_runtime* d0 = open_device(0);
  xlog_runtime* d1 = open_device(1);
  xlog_ok(xlog_enable_peer_access(d0, d1), "xlog_enable_peer_access");
  const Stream s0 = acquire(d0), s0b = acquire(d0), s1 = acquire(d1);

  // The raw baseline's event, on device 0 (timing off, as xlog's are).
  cuda_ok(cudaSetDevice(0), "cudaSetDevice(0)");
  cudaEvent_t raw_event = nullptr;
  cuda_ok(cudaEventCreateWithFlags(&raw_event, cudaEventDisableTiming), "cudaEventCreateWithFlags");

  // The block, last written on device 0's stream.
  xlog_block block{};
  xlog_ok(xlog_allocate(d0, 1 << 20, s0.id, "bench", &block), "xlog_allocate");
  xlog_ok(xlog_prepare(d0, block, s0.id, XLOG_ACCESS_WRITE), "xlog_prepare(write)");
  xlog_ok(xlog_finish(d0, block, s0.id, XLOG_ACCESS_WRITE), "xlog_finish(write)");

  auto sync_all = [&] {
    xlog_ok(xlog_stream_synchronize(d0, s0.id), "sync s0");
    xlog_ok(xlog_stream_synchronize(d0, s0b.id), "sync s0b");
    xlog_ok(xlog_stream_synchronize(d1, s1.id), "sync s1");
  };
  using clock = std::chrono::steady_clock;
  constexpr long kBatch = 1000;
  auto timed = [&](auto&& one) {
    double total_ns = 0;
    for (long done = 0; done < iters; done += kBatch) {
      sync_all();
      const auto start = clock::now();
      for (long i = 0; i < kBatch; ++i) one();
      total_ns += std::chrono::duration<double, std::nano>(clock::now() - start).count();
    }
    sync_all();
    return total_ns / static_cast<double>(iters) / 1000.0;  // us per iteration
  };

  auto raw_one = [&] {
    if (record(raw_event, s0.native) != CUDA_SUCCESS) fail("cuEventRecord");
    if (wait(s1.native, raw_event, 0) != CUDA_SUCCESS) fail("cuStreamWaitEvent");
  };
  auto peer_one = [&] {
    if (xlog_prepare(d0, block, s1.id, XLOG_ACCESS_READ) != XLOG_OK) fail("xlog_prepare(peer): " + last_message());
    if (xlog_finish(d0, block, s1.id, XLOG_ACCESS_READ) != XLOG_OK) fail("xlog_finish(peer): " + last_message());
  };
  auto local_one = [&] {
    if (xlog_prepare(d0, block, s0b.id, XLOG_ACCESS_READ) != XLOG_OK) fail("xlog_prepare(local): " + last_message());
    if (xlog_finish(d0, block, s0b.id, XLOG_ACCESS_READ) != XLOG_OK) fail("xlog_finish(local): " + last_message());
  };
  // Warm up: the bridge is made on the first peer use.
  for (int i = 0; i < 100; ++i) {
    raw_one();
    peer_one();
    local_one();
  }
  sync_all();

  std::vector<double> raw, peer, local;
  for (long r = 0; r < repeats; ++r) {
    raw.push_back(timed(raw_one));
    peer.push_back(timed(peer_one));
    local.push_back(timed(local_one));
  }
  const double raw_us = median(raw), peer_us = median(peer), local_us = median(local);
  std::printf("raw        cuEventRecord+cuStreamWaitEvent across devices  %.3f us\n", raw_us);
  std::printf("xlog-peer  prepare+finish, block of device 0, stream of 1  %.3f us  (%.2fx raw)\n", peer_us, peer_us / raw_us);
  std::printf("xlog-local prepare+finish, two streams of device 0         %.3f us  (%.2fx raw)\n", local_us, local_us / raw_us);
  const bool met = peer_us <= 1.5 * raw_us;
  std::printf("TARGET %s: cross-device prepare+finish %.3f us <= 1.5 x raw %.3f us\n", met ? "PASS" : "FAIL", peer_us, raw_us);

  xlog_ok(xlog_deallocate(d0, block), "xlog_deallocate");
  cuda_ok(cudaSetDevice(0), "cudaSetDevice(0)");
  cuda_ok(cudaEventDestroy(raw_event), "cudaEventDestroy");
  xlog_ok(xlog_stream_release(d0, s0.id), "release");
  xlog_ok(xlog_stream_release(d0, s0b.id), "release");
  xlog_ok(xlog_stream_release(d1, s1.id), "release");
  xlog_ok(xlog_runtime_close(d0), "close d0");
  xlog_ok(xlog_runtime_close(d1), "close d1");
  return 0;
}
