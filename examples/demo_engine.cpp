// demo_engine — a small "engine" driving a four-stream pipeline through the
// xlog-cuda C ABI with the C++ RAII layer (include/xlog/runtime.hpp).
//
//   producer stream   writes an input block per batch
//   scale stream      reads the input, writes scaled = input * 3 + 1
//   mix stream        reads the input, writes mixed  = rotl(input, 7) ^ K
//   reducer stream    reads scaled and mixed, accumulates a checksum
//
// Every stage is one recorded launch (prepare_all → enqueue → finish_all),
// so the runtime orders the streams: nothing here synchronizes by hand.
// Blocks are freed as soon as the last stage is enqueued; the frees are
// stream-ordered and stay charged to the 64 MiB budget (as pending) until a
// reap retires them. One allocation larger than the budget is made on
// purpose and must be refused with XLOG_ERR_OUT_OF_BUDGET.
//
// Backend: XLOG_BACKEND (auto|cuda|sim; auto = CUDA if present, else sim).
//   sim   the stages are host callbacks that do the arithmetic on the block
//         bytes (sim blocks are host memory); the checksum is verified.
//   cuda  block pointers are device memory, which host callbacks must not
//         touch. If the build provides the device kernels (hook below) the
//         stages run them and the checksum is verified; otherwise the bytes
//         are left alone and only the ordering and the accounting are
//         checked.
// Every backend checks the cross-stream ordering: each stage also enqueues a
// host callback that verifies the stages it depends on have already run.
//
// Two devices: `--peer-device N` runs the mix stage on a stream of device N
// (its own runtime, paired with device 0's by enable_peer_access): the mix
// kernel reads device 0's input and writes device 0's output block through
// peer access, and device 0's runtime orders it like any other stage — the
// recorded launches are the same calls with device N's stream. On sim the
// demo then simulates N + 1 devices.
//
// Exit status: 0 RESULT OK, 1 RESULT MISMATCH, 2 an unexpected library
// error or a bad argument, 77 XLOG_BACKEND=cuda asked for but no CUDA device
// (or no device N, or no peer access to it) (ctest: skipped).

#include <xlog/runtime.hpp>

#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// ---------------------------------------------------------------------------
// CUDA kernel hook. When CMake enables CUDA and examples/demo_kernels.cu
// exists, that file is compiled into xlog_demo and XLOG_DEMO_HAVE_KERNELS is
// defined. It must define these functions. Each enqueues asynchronously on
// `stream` (a cudaStream_t passed as void*) and returns 0 (cudaSuccess) or
// the cudaError_t it got. The arithmetic must match the host reference
// functions below (produce_value, scale_value, mix_value, reduce_term)
// bit for bit, with all sums taken modulo 2^64.
// ---------------------------------------------------------------------------
#if defined(XLOG_DEMO_HAVE_KERNELS)
namespace demo_kernels {
// Set `bytes` bytes at `device_ptr` to zero.
int fill_zero(void* stream, void* device_ptr, std::size_t bytes);
// input[i] = produce_value(batch, i, count) for i < count.
int produce(void* stream, std::uint32_t* input, std::size_t count, std::uint32_t batch);
// output[i] = scale_value(input[i]).
int transform_scale(void* stream, const std::uint32_t* input, std::uint32_t* output, std::size_t count);
// output[i] = mix_value(input[i]).
int transform_mix(void* stream, const std::uint32_t* input, std::uint32_t* output, std::size_t count);
// *accumulator += sum over i of reduce_term(scaled[i], mixed[i], i).
int reduce(void* stream, const std::uint32_t* scaled, const std::uint32_t* mixed, std::size_t count,
           std::uint64_t* accumulator);
// Copy `bytes` bytes from device to host memory, ordered on `stream`.
int copy_to_host(void* stream, void* host_dst, const void* device_src, std::size_t bytes);
}  // namespace demo_kernels
#endif

namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kBudgetBytes = 64 * kMiB;
constexpr std::size_t kBatches = 24;
constexpr std::size_t kElements = 256 * 1024;  // one MiB of uint32 per block
constexpr std::uint64_t kBlockBytes = kElements * sizeof(std::uint32_t);
constexpr std::size_t kReapEvery = 4;          // batches between reaps

// --- The pipeline's arithmetic (host reference; kernels must match) --------

std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
std::uint32_t produce_value(std::uint32_t batch, std::size_t i, std::size_t count) {
  return mix32(static_cast<std::uint32_t>(batch * count + i));
}
std::uint32_t scale_value(std::uint32_t x) { return x * 3U + 1U; }
std::uint32_t mix_value(std::uint32_t x) { return ((x << 7) | (x >> 25)) ^ 0x9e3779b9U; }
// The index weight makes a shifted or stale element change the sum.
std::uint64_t reduce_term(std::uint32_t scaled, std::uint32_t mixed, std::size_t i) {
  return std::uint64_t{scaled} * (std::uint64_t{i} + 1) + std::uint64_t{mixed};
}

std::uint64_t expected_checksum() {
  std::uint64_t sum = 0;
  for (std::size_t batch = 0; batch < kBatches; ++batch) {
    for (std::size_t i = 0; i < kElements; ++i) {
      const std::uint32_t input = produce_value(static_cast<std::uint32_t>(batch), i, kElements);
      sum += reduce_term(scale_value(input), mix_value(input), i);
    }
  }
  return sum;
}

// --- Where the stage work runs ---------------------------------------------

enum class DataPath {
  host_callbacks,  // sim: host callbacks compute on the block bytes
  device_kernels,  // cuda with the kernel hook: kernels compute
  ordering_only,   // cuda without kernels: bytes untouched
};

const char* data_path_name(DataPath path) {
  switch (path) {
    case DataPath::host_callbacks: return "host callbacks on block memory";
    case DataPath::device_kernels: return "CUDA kernels";
    case DataPath::ordering_only: return "none (no device kernels built): ordering and accounting only";
  }
  return "?";
}

#if defined(XLOG_DEMO_HAVE_KERNELS)
void check_cuda(int code, const char* what) {
  if (code != 0) throw std::runtime_error(std::string(what) + " failed with cudaError " + std::to_string(code));
}
#endif

// --- Cross-stream ordering bookkeeping, checked from host callbacks ---------

enum StageBit : std::uint32_t { kProduced = 1, kScaled = 2, kMixed = 4, kReduced = 8 };

// Outlives the Runtime (declared before it in main), so callbacks still
// queued during an error unwind never see a dead object.
struct Ordering {
  std::array<std::atomic<std::uint32_t>, kBatches> stages{};
  std::atomic<std::uint64_t> violations{0};

  // A stage of `batch` has started: everything in `needed` must be done.
  void expect(std::size_t batch, std::uint32_t needed) {
    if ((stages[batch].load(std::memory_order_acquire) & needed) != needed) {
      violations.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void mark(std::size_t batch, std::uint32_t bit) { stages[batch].fetch_or(bit, std::memory_order_acq_rel); }
};

struct Report {
  std::uint64_t checksum = 0;
  std::uint64_t expected = 0;
  bool checksum_checked = false;
  std::uint64_t budget_refusals = 0;
  std::string refusal_message;
  xlog::Stats stats_before_drain{};
  xlog::Stats final_stats{};
  std::uint64_t reaped_by_reap = 0;
  std::uint64_t reaped_by_drain = 0;
  std::uint64_t released_by_trim = 0;
  std::uint64_t freed_bytes = 0;
  std::uint64_t failed_allocations_delta = 0;
  xlog::CloseReport close{};
};

// Runs the whole pipeline on `rt`; fills `report`. Throws xlog::Error on an
// unexpected library failure.
// With `peer` (a runtime of another device, paired with `rt`), the mix stage
// runs on a stream of that device; every block stays on `rt`'s device.
void run_pipeline(xlog::Runtime& rt, xlog::Runtime* peer, DataPath path, Ordering& ordering, Report& report) {
  xlog::Stream producer = rt.acquire_stream();
  xlog::Stream scaler = rt.acquire_stream();
  xlog::Stream mixer = peer != nullptr ? peer->acquire_stream() : rt.acquire_stream();
  xlog::Stream reducer = rt.acquire_stream();

  // The reducer's running checksum lives in a device block of its own.
  xlog::Block accumulator = rt.allocate(sizeof(std::uint64_t), reducer, "reducer-accumulator");
  report.freed_bytes += accumulator.size();
  xlog::launch(rt, reducer, {xlog::write(accumulator)}, [&](const xlog::Stream& on) {
    if (path == DataPath::host_callbacks) {
      on.enqueue_host([p = accumulator.data<std::uint64_t>()] { *p = 0; });
    }
#if defined(XLOG_DEMO_HAVE_KERNELS)
    if (path == DataPath::device_kernels) {
      check_cuda(demo_kernels::fill_zero(on.native(), accumulator.get(), sizeof(std::uint64_t)), "fill_zero");
    }
#endif
  });

  for (std::size_t batch = 0; batch < kBatches; ++batch) {
    const auto batch32 = static_cast<std::uint32_t>(batch);

    // Stage 1 — producer writes the input.
    xlog::Block input = rt.allocate(kBlockBytes, producer, "input");
    xlog::launch(rt, producer, {xlog::write(input)}, [&](const xlog::Stream& on) {
      if (path == DataPath::host_callbacks) {
        on.enqueue_host([p = input.data<std::uint32_t>(), batch32] {
          for (std::size_t i = 0; i < kElements; ++i) p[i] = produce_value(batch32, i, kElements);
        });
      }
#if defined(XLOG_DEMO_HAVE_KERNELS)
      if (path == DataPath::device_kernels) {
        check_cuda(demo_kernels::produce(on.native(), input.data<std::uint32_t>(), kElements, batch32), "produce");
      }
#endif
      on.enqueue_host([&ordering, batch] { ordering.mark(batch, kProduced); });
    });

    // Stages 2a and 2b — two transforms on their own streams read the input.
    xlog::Block scaled = rt.allocate(kBlockBytes, scaler, "scaled");
    xlog::launch(rt, scaler, {xlog::read(input), xlog::write(scaled)}, [&](const xlog::Stream& on) {
      on.enqueue_host([&ordering, batch] { ordering.expect(batch, kProduced); });
      if (path == DataPath::host_callbacks) {
        on.enqueue_host([in = input.data<const std::uint32_t>(), out = scaled.data<std::uint32_t>()] {
          for (std::size_t i = 0; i < kElements; ++i) out[i] = scale_value(in[i]);
        });
      }
#if defined(XLOG_DEMO_HAVE_KERNELS)
      if (path == DataPath::device_kernels) {
        check_cuda(demo_kernels::transform_scale(on.native(), input.data<const std::uint32_t>(),
                                                 scaled.data<std::uint32_t>(), kElements),
                   "transform_scale");
      }
#endif
      on.enqueue_host([&ordering, batch] { ordering.mark(batch, kScaled); });
    });

    // A block is allocated on a stream of its own device: with the mixer on
    // the peer device, the producer's stream (its first use on the mixer
    // then waits for the allocation, as any first use on another stream).
    xlog::Block mixed = rt.allocate(kBlockBytes, peer != nullptr ? producer : mixer, "mixed");
    xlog::launch(rt, mixer, {xlog::read(input), xlog::write(mixed)}, [&](const xlog::Stream& on) {
      on.enqueue_host([&ordering, batch] { ordering.expect(batch, kProduced); });
      if (path == DataPath::host_callbacks) {
        on.enqueue_host([in = input.data<const std::uint32_t>(), out = mixed.data<std::uint32_t>()] {
          for (std::size_t i = 0; i < kElements; ++i) out[i] = mix_value(in[i]);
        });
      }
#if defined(XLOG_DEMO_HAVE_KERNELS)
      if (path == DataPath::device_kernels) {
        check_cuda(demo_kernels::transform_mix(on.native(), input.data<const std::uint32_t>(),
                                               mixed.data<std::uint32_t>(), kElements),
                   "transform_mix");
      }
#endif
      on.enqueue_host([&ordering, batch] { ordering.mark(batch, kMixed); });
    });

    // Stage 3 — the reducer reads both outputs into the running checksum.
    xlog::launch(rt, reducer, {xlog::read(scaled), xlog::read(mixed), xlog::read_write(accumulator)},
                 [&](const xlog::Stream& on) {
                   on.enqueue_host([&ordering, batch] { ordering.expect(batch, kProduced | kScaled | kMixed); });
                   if (path == DataPath::host_callbacks) {
                     on.enqueue_host([a = scaled.data<const std::uint32_t>(), b = mixed.data<const std::uint32_t>(),
                                      acc = accumulator.data<std::uint64_t>()] {
                       std::uint64_t sum = 0;
                       for (std::size_t i = 0; i < kElements; ++i) sum += reduce_term(a[i], b[i], i);
                       *acc += sum;
                     });
                   }
#if defined(XLOG_DEMO_HAVE_KERNELS)
                   if (path == DataPath::device_kernels) {
                     check_cuda(demo_kernels::reduce(on.native(), scaled.data<const std::uint32_t>(),
                                                     mixed.data<const std::uint32_t>(), kElements,
                                                     accumulator.data<std::uint64_t>()),
                                "reduce");
                   }
#endif
                   on.enqueue_host([&ordering, batch] { ordering.mark(batch, kReduced); });
                 });

    // Free everything of this batch now. The frees are stream-ordered: the
    // input's free waits for both transforms, the outputs' for the reducer.
    // The host never waits here.
    report.freed_bytes += input.size() + scaled.size() + mixed.size();
    input.reset();
    scaled.reset();
    mixed.reset();

    // Retire whatever has completed, without blocking. The host usually
    // runs ahead of the streams, so these often find nothing done yet; when
    // the budget fills up, the budget layer reaps (and, with
    // wait_on_pressure, waits) by itself — the report shows both.
    if ((batch + 1) % kReapEvery == 0) report.reaped_by_reap += rt.reap();

    // Half way through, ask for more than the whole budget: this must be
    // refused at once (waiting for pending frees could not make room).
    if (batch == kBatches / 2) {
      const std::uint64_t failed_before = rt.stats().failed_allocations;
      try {
        xlog::Block too_big = rt.allocate(kBudgetBytes + kMiB, producer, "deliberately-over-budget");
        std::printf("error: a %" PRIu64 "-byte allocation over a %" PRIu64 "-byte budget succeeded\n",
                    too_big.size(), kBudgetBytes);
      } catch (const xlog::Error& e) {
        if (e.status() != XLOG_ERR_OUT_OF_BUDGET) throw;
        ++report.budget_refusals;
        report.refusal_message = e.message();
      }
      report.failed_allocations_delta = rt.stats().failed_allocations - failed_before;
    }
  }

  // Read the checksum back in stream order, then wait for every stream.
  std::uint64_t checksum = 0;
  xlog::launch(rt, reducer, {xlog::read(accumulator)}, [&](const xlog::Stream& on) {
    if (path == DataPath::host_callbacks) {
      on.enqueue_host([&checksum, p = accumulator.data<const std::uint64_t>()] { checksum = *p; });
    }
#if defined(XLOG_DEMO_HAVE_KERNELS)
    if (path == DataPath::device_kernels) {
      check_cuda(demo_kernels::copy_to_host(on.native(), &checksum, accumulator.get(), sizeof checksum),
                 "copy_to_host");
    }
#endif
  });
  for (const xlog::Stream* s : {&producer, &scaler, &mixer, &reducer}) s->synchronize();
  report.checksum = checksum;
  report.checksum_checked = path != DataPath::ordering_only;

  report.stats_before_drain = rt.stats();
  accumulator.reset();
  // Freed blocks wait in their streams' caches (still charged to the
  // budget) for the next allocation; trim hands them back to the driver.
  report.released_by_trim = rt.trim();
  report.reaped_by_drain = rt.drain();
  report.final_stats = rt.stats();
}

void print_report(const xlog::Runtime& rt, int peer_device, DataPath path, const Report& r) {
  const xlog::Stats& s = r.final_stats;
  const std::uint64_t reaped = r.reaped_by_reap + r.reaped_by_drain + r.released_by_trim;
  std::printf("xlog demo engine — libxlog_cuda %s\n", xlog::version());
  std::printf("  backend                  %s\n", xlog::backend_name(rt.backend()));
  if (peer_device >= 0) {
    std::printf("  device                   0 (the mix stage on a stream of device %d)\n", peer_device);
  } else {
    std::printf("  device                   0\n");
  }
  std::printf("  stage work               %s\n", data_path_name(path));
  std::printf("  pipeline                 %zu batches x 3 blocks of %" PRIu64 " bytes on 4 streams\n", kBatches,
              kBlockBytes);
  std::printf("  budget                   %" PRIu64 " bytes\n", s.budget_limit);
  std::printf("  allocations              %" PRIu64 " (failed %" PRIu64 "), deallocations %" PRIu64 "\n",
              s.allocations, s.failed_allocations, s.deallocations);
  std::printf("  peak outstanding         %" PRIu64 " bytes\n", s.peak_outstanding_bytes);
  std::printf("  pending before drain     %" PRIu64 " bytes in %" PRIu64 " blocks\n",
              r.stats_before_drain.pending_bytes, r.stats_before_drain.pending_blocks);
  std::printf("  reaped by reap()         %" PRIu64 " bytes\n", r.reaped_by_reap);
  std::printf("  reaped by drain()        %" PRIu64 " bytes\n", r.reaped_by_drain);
  std::printf("  cached before trim       %" PRIu64 " bytes in %" PRIu64 " blocks (cache hits %" PRIu64 ")\n",
              r.stats_before_drain.cached_bytes, r.stats_before_drain.cached_blocks, s.cache_hits);
  std::printf("  released by trim()       %" PRIu64 " bytes\n", r.released_by_trim);
  std::printf("  reclaimed under pressure %" PRIu64 " bytes (by the budget layer's own reaps)\n",
              r.freed_bytes >= reaped ? r.freed_bytes - reaped : 0);
  std::printf("  live / pending at end    %" PRIu64 " / %" PRIu64 " bytes\n", s.live_bytes, s.pending_bytes);
  std::printf("  budget refusals          %" PRIu64 "%s%s\n", r.budget_refusals,
              r.refusal_message.empty() ? "" : ": ", r.refusal_message.c_str());
  if (r.checksum_checked) {
    std::printf("  checksum                 %016" PRIx64 " (expected %016" PRIx64 ")\n", r.checksum, r.expected);
  } else {
    std::printf("  checksum                 not computed (no device kernels in this build)\n");
  }
}

// Every check of the run; prints each failure and returns whether all hold.
bool verify(const Report& r, const Ordering& ordering) {
  bool ok = true;
  auto require = [&ok](bool condition, const std::string& what) {
    if (!condition) {
      std::printf("  MISMATCH: %s\n", what.c_str());
      ok = false;
    }
  };
  const xlog::Stats& s = r.final_stats;
  const std::uint64_t blocks = 3 * kBatches + 1;
  if (r.checksum_checked) require(r.checksum == r.expected, "checksum differs from the host reference");
  require(ordering.violations.load() == 0,
          std::to_string(ordering.violations.load()) + " stage(s) ran before the stages they read from");
  for (std::size_t batch = 0; batch < kBatches; ++batch) {
    const std::uint32_t all = kProduced | kScaled | kMixed | kReduced;
    require(ordering.stages[batch].load() == all, "batch " + std::to_string(batch) + " did not run every stage");
  }
  require(r.budget_refusals == 1, "the over-budget allocation was not refused with XLOG_ERR_OUT_OF_BUDGET");
  require(r.failed_allocations_delta == 1, "failed_allocations grew by " +
                                               std::to_string(r.failed_allocations_delta) + ", expected 1");
  require(s.allocations == blocks, "allocations " + std::to_string(s.allocations) + ", expected " +
                                       std::to_string(blocks));
  require(s.deallocations == blocks, "deallocations " + std::to_string(s.deallocations) + ", expected " +
                                         std::to_string(blocks));
  require(s.failed_allocations == 1, "failed_allocations " + std::to_string(s.failed_allocations) + ", expected 1");
  require(s.live_bytes == 0 && s.live_blocks == 0, "blocks still live after the pipeline");
  require(s.pending_bytes == 0 && s.pending_blocks == 0, "frees still pending after drain()");
  require(s.budget_limit == kBudgetBytes, "budget limit " + std::to_string(s.budget_limit));
  require(s.budget_remaining == kBudgetBytes, "budget not fully returned: " + std::to_string(s.budget_remaining) +
                                                  " of " + std::to_string(kBudgetBytes) + " bytes remaining");
  require(s.peak_outstanding_bytes <= kBudgetBytes, "peak outstanding bytes exceeded the budget");
  require(s.peak_outstanding_bytes >= 3 * kBlockBytes, "peak outstanding bytes below one batch's worth");
  require(r.reaped_by_reap + r.reaped_by_drain + r.released_by_trim <= r.freed_bytes,
          "reaped more bytes than were freed");
  require(s.cached_bytes == 0 && s.cached_blocks == 0, "blocks still cached after trim()");
  require(r.close.leaked_blocks == 0 && r.close.leaked_bytes == 0, "the runtime reported leaks at close");
  return ok;
}

bool cuda_requested() {
  const char* backend = std::getenv("XLOG_BACKEND");
  return backend != nullptr && std::strcmp(backend, "cuda") == 0;
}

}  // namespace

int main(int argc, char** argv) {
  int peer_device = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--peer-device") == 0 && i + 1 < argc) {
      char* end = nullptr;
      const long value = std::strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || value < 1 || value > 63) {
        std::printf("error: --peer-device wants a device ordinal from 1 to 63, got %s\n", argv[i]);
        return 2;
      }
      peer_device = static_cast<int>(value);
    } else {
      std::printf("usage: %s [--peer-device N]\n", argv[0]);
      return 2;
    }
  }
  Ordering ordering;  // outlives the runtimes: see Ordering
  Report report;
  try {
    xlog::Config config;  // XLOG_BACKEND etc. from the environment
    config.budget_bytes(kBudgetBytes).wait_on_pressure(true);
    if (peer_device >= 0) config.sim_devices(static_cast<std::uint32_t>(peer_device) + 1);

    std::unique_ptr<xlog::Runtime> rt;
    try {
      rt = std::make_unique<xlog::Runtime>(config, 0);
    } catch (const xlog::Error& e) {
      if (e.status() == XLOG_ERR_NO_DEVICE && cuda_requested()) {
        std::printf("SKIP: XLOG_BACKEND=cuda but no CUDA device is usable: %s\n", e.message().c_str());
        return 77;
      }
      throw;
    }

    DataPath path = DataPath::host_callbacks;
    if (rt->backend() == XLOG_BACKEND_CUDA) {
#if defined(XLOG_DEMO_HAVE_KERNELS)
      path = DataPath::device_kernels;
#else
      path = DataPath::ordering_only;
#endif
    }

    // The second device's runtime, paired with the first.
    std::unique_ptr<xlog::Runtime> peer;
    if (peer_device >= 0) {
      try {
        peer = std::make_unique<xlog::Runtime>(config, peer_device);
        rt->enable_peer_access(*peer);
      } catch (const xlog::Error& e) {
        const bool unavailable = e.status() == XLOG_ERR_NO_DEVICE || e.status() == XLOG_ERR_UNSATISFIABLE_DEPENDENCY;
        if (unavailable && rt->backend() == XLOG_BACKEND_CUDA) {
          std::printf("SKIP: --peer-device %d: %s\n", peer_device, e.message().c_str());
          return 77;
        }
        throw;
      }
    }

    report.expected = expected_checksum();
    run_pipeline(*rt, peer.get(), path, ordering, report);
    print_report(*rt, peer_device, path, report);
    report.close = rt->close();

    bool ok = verify(report, ordering);
    if (peer) {
      const xlog::Stats peer_stats = peer->stats();
      const xlog::CloseReport peer_close = peer->close();
      std::printf("  device %d                 %" PRIu64 " allocations, closed with %" PRIu64 " leaked blocks\n",
                  peer_device, peer_stats.allocations, peer_close.leaked_blocks);
      if (peer_stats.allocations != 0 || peer_close.leaked_blocks != 0) {
        std::printf("  MISMATCH: device %d's runtime allocated or leaked blocks (every block is device 0's)\n",
                    peer_device);
        ok = false;
      }
    }
    std::printf("RESULT %s\n", ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const xlog::Error& e) {
    std::printf("error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 2;
  }
}
