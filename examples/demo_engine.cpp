// demo_engine — a small "engine" driving a four-stream pipeline through the
// xlog-cuda C ABI with the C++ RAII layer (include/xlog/runtime.hpp), and
// telling in plain words what xlog did for it:
//
//   what xlog ordered   producer stream   writes an input block per batch
//                       scale stream      reads the input, writes scaled = input * 3 + 1
//                       mix stream        reads the input, writes mixed  = rotl(input, 7) ^ K
//                       reducer stream    reads scaled and mixed, accumulates a checksum
//     Every stage is one recorded launch (prepare_all → enqueue → finish_all),
//     so the runtime orders the streams: nothing here synchronizes by hand.
//     Blocks are freed as soon as the last stage is enqueued; each free is
//     stream-ordered (it waits for the block's readers on the GPU).
//   what xlog caught    a kept copy of a freed block's handle, used again, is
//     refused (XLOG_ERR_USE_AFTER_FREE); a block freed by the host while a
//     slow reader on another stream still reads it is not reused before the
//     read ends (the reader's checksum and a flag prove it).
//   what the budget did one allocation larger than the 64 MiB budget is
//     refused with its numbers (XLOG_ERR_OUT_OF_BUDGET); no block changes
//     (cached memory may be given back first, as before any refusal).
//   held versus live    the peak of the blocks' bytes against the peak of the
//     device memory xlog held (the arena maps whole 2 MiB pages).
//   the memory log      written to XLOG_LOG_PATH, else --log PATH, else
//     xlog-demo-log.csv in the working directory; the demo prints the
//     command that turns it into the HTML report (scripts/demo runs it).
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
// The story's key lines are checked by cmake/XlogDemoStory.cmake (ctest
// demo_engine*): change them together.
//
// Exit status: 0 RESULT OK, 1 RESULT MISMATCH, 2 an unexpected library
// error or a bad argument, 77 XLOG_BACKEND=cuda asked for but no CUDA device
// (or no device N, or no peer access to it) (ctest: skipped).

#include <xlog/runtime.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

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

// --- What the run saw, for the story and for verify() ------------------------

// One allocation over the whole budget, made on purpose half way through.
struct Refusal {
  std::uint64_t refusals = 0;       // XLOG_ERR_OUT_OF_BUDGET caught (must be 1)
  std::string message;              // the library's message, with its numbers
  xlog::Stats before{};             // stats right before the request
  xlog::Stats after{};              // and right after the refusal
};

// A copy of a freed block's handle, used again.
struct StaleHandle {
  bool refused = false;             // the use was refused with USE_AFTER_FREE
  std::string message;
  bool memory_reused = false;       // the next block got the freed block's address
};

// A block freed by the host while another stream was still reading it.
struct RacedFree {
  bool writer_after_reader = false;  // the next block's first write came after the read
  bool memory_reused = false;        // the next block got the freed block's address
  bool checksum_checked = false;
  std::uint64_t checksum = 0;        // what the reader summed
  std::uint64_t expected = 0;        // the host reference
};

struct Report {
  std::uint64_t checksum = 0;
  std::uint64_t expected = 0;
  bool checksum_checked = false;
  std::uint64_t frees_while_in_use = 0;  // blocks freed right after their work was enqueued
  Refusal refusal;
  xlog::Stats after_pipeline{};          // every stream synchronized, accumulator still live
  StaleHandle stale;
  RacedFree race;
  std::uint64_t held_before_trim = 0;
  std::uint64_t released_by_trim = 0;
  xlog::Stats final_stats{};
  xlog::CloseReport close{};
};

constexpr std::uint32_t kRaceBatch = 1000;        // the raced block's contents: produce_value(1000, i)
constexpr unsigned kRaceReadMillis = 50;          // how long the racing reader takes

// The sum the racing reader must see: reduce_term over the block read twice.
std::uint64_t race_checksum() {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < kElements; ++i) {
    const std::uint32_t v = produce_value(kRaceBatch, i, kElements);
    sum += reduce_term(v, v, i);
  }
  return sum;
}

// Runs the whole pipeline on `rt`; fills `report`. Throws xlog::Error on an
// unexpected library failure.
// With `peer` (a runtime of another device, paired with `rt`), the mix stage
// runs on a stream of that device; every block stays on `rt`'s device.
void run_pipeline(xlog::Runtime& rt, xlog::Runtime* peer, DataPath path, Ordering& ordering, Report& report,
                  const xlog::Stream& producer, const xlog::Stream& scaler, const xlog::Stream& mixer,
                  const xlog::Stream& reducer) {
  // The reducer's running checksum lives in a device block of its own.
  xlog::Block accumulator = rt.allocate(sizeof(std::uint64_t), reducer, "reducer-accumulator");
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

    // Free everything of this batch now, while the streams may still be
    // using it. The frees are stream-ordered: the input's free waits for
    // both transforms, the outputs' for the reducer. The host never waits.
    input.reset();
    scaled.reset();
    mixed.reset();
    report.frees_while_in_use += 3;

    // Half way through, ask for more than the whole budget: this must be
    // refused, changing no block and no peak.
    if (batch == kBatches / 2) {
      report.refusal.before = rt.stats();
      try {
        xlog::Block too_big = rt.allocate(kBudgetBytes + kMiB, producer, "deliberately-over-budget");
        std::printf("error: a %" PRIu64 "-byte allocation over a %" PRIu64 "-byte budget succeeded\n",
                    too_big.size(), kBudgetBytes);
      } catch (const xlog::Error& e) {
        if (e.status() != XLOG_ERR_OUT_OF_BUDGET) throw;
        ++report.refusal.refusals;
        report.refusal.message = e.what();
      }
      report.refusal.after = rt.stats();
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
  report.after_pipeline = rt.stats();
}

// A copy of a block's handle outlives the block: xlog checks the handle's
// generation on every use, so the copy is refused even though a new block
// now sits at the same address.
void catch_stale_handle(xlog::Runtime& rt, const xlog::Stream& stream, StaleHandle& out) {
  xlog::Block block = rt.allocate(kBlockBytes, stream, "stale-demo");
  const xlog_block stale_copy = block.handle();  // a plain value: copies are easy to keep by mistake
  block.reset();
  xlog::Block next = rt.allocate(kBlockBytes, stream, "stale-demo-next");
  out.memory_reused = next.get() == stale_copy.ptr;
  try {
    xlog::launch(rt, stream, {xlog::write(stale_copy)}, [] {});
  } catch (const xlog::Error& e) {
    if (e.status() != XLOG_ERR_USE_AFTER_FREE) throw;
    out.refused = true;
    out.message = e.what();
  }
  next.reset();
  stream.synchronize();
}

// The host frees a block while another stream is still reading it, then
// allocates the same size on the block's stream and overwrites the new
// block. The free is stream-ordered, so the overwrite must wait for the
// reader; the reader's checksum proves what it saw.
void catch_raced_free(xlog::Runtime& rt, DataPath path, const xlog::Stream& owner, const xlog::Stream& reader,
                      RacedFree& out) {
  std::atomic<bool> read_done{false};
  std::atomic<bool> writer_after_reader{false};
  std::uint64_t checksum = 0;

  xlog::Block sum = rt.allocate(sizeof(std::uint64_t), reader, "race-reader-sum");
  xlog::Block block = rt.allocate(kBlockBytes, owner, "raced-block");
  xlog::launch(rt, owner, {xlog::write(block)}, [&](const xlog::Stream& on) {
    if (path == DataPath::host_callbacks) {
      on.enqueue_host([p = block.data<std::uint32_t>()] {
        for (std::size_t i = 0; i < kElements; ++i) p[i] = produce_value(kRaceBatch, i, kElements);
      });
    }
#if defined(XLOG_DEMO_HAVE_KERNELS)
    if (path == DataPath::device_kernels) {
      check_cuda(demo_kernels::produce(on.native(), block.data<std::uint32_t>(), kElements, kRaceBatch), "produce");
    }
#endif
  });
  // The reader is slow: it starts with a pause, then sums the block.
  xlog::launch(rt, reader, {xlog::read(block), xlog::write(sum)}, [&](const xlog::Stream& on) {
    on.enqueue_host([] { std::this_thread::sleep_for(std::chrono::milliseconds(kRaceReadMillis)); });
    if (path == DataPath::host_callbacks) {
      on.enqueue_host([p = block.data<const std::uint32_t>(), acc = sum.data<std::uint64_t>()] {
        std::uint64_t total = 0;
        for (std::size_t i = 0; i < kElements; ++i) total += reduce_term(p[i], p[i], i);
        *acc = total;
      });
    }
#if defined(XLOG_DEMO_HAVE_KERNELS)
    if (path == DataPath::device_kernels) {
      check_cuda(demo_kernels::fill_zero(on.native(), sum.get(), sizeof(std::uint64_t)), "fill_zero");
      check_cuda(demo_kernels::reduce(on.native(), block.data<const std::uint32_t>(),
                                      block.data<const std::uint32_t>(), kElements, sum.data<std::uint64_t>()),
                 "reduce");
    }
#endif
    on.enqueue_host([&read_done] { read_done.store(true); });
  });

  // The host frees the block at once: the reader has most likely not even
  // started. Then the same size again on the block's own stream, written.
  const void* freed_at = block.get();
  block.reset();
  xlog::Block next = rt.allocate(kBlockBytes, owner, "after-the-race");
  out.memory_reused = next.get() == freed_at;
  xlog::launch(rt, owner, {xlog::write(next)}, [&](const xlog::Stream& on) {
    on.enqueue_host([&] { writer_after_reader.store(read_done.load()); });
    if (path == DataPath::host_callbacks) {
      on.enqueue_host([p = next.data<std::uint32_t>()] { std::memset(p, 0, kBlockBytes); });
    }
#if defined(XLOG_DEMO_HAVE_KERNELS)
    if (path == DataPath::device_kernels) {
      check_cuda(demo_kernels::fill_zero(on.native(), next.get(), kBlockBytes), "fill_zero");
    }
#endif
  });
  xlog::launch(rt, reader, {xlog::read(sum)}, [&](const xlog::Stream& on) {
    if (path == DataPath::host_callbacks) {
      on.enqueue_host([&checksum, p = sum.data<const std::uint64_t>()] { checksum = *p; });
    }
#if defined(XLOG_DEMO_HAVE_KERNELS)
    if (path == DataPath::device_kernels) {
      check_cuda(demo_kernels::copy_to_host(on.native(), &checksum, sum.get(), sizeof checksum), "copy_to_host");
    }
#endif
  });
  owner.synchronize();
  reader.synchronize();
  next.reset();
  sum.reset();
  owner.synchronize();
  reader.synchronize();
  out.writer_after_reader = writer_after_reader.load();
  out.checksum = checksum;
  out.expected = race_checksum();
  out.checksum_checked = path != DataPath::ordering_only;
}

// --- Printing: every number comes with what it means -------------------------

// "3 MiB", "3 MiB + 512 bytes", "8 bytes": exact, and readable.
std::string bytes_text(std::uint64_t bytes) {
  const std::uint64_t mib = bytes / kMiB;
  const std::uint64_t rest = bytes % kMiB;
  if (mib == 0 && rest < kMiB - 4096) return std::to_string(rest) + (rest == 1 ? " byte" : " bytes");
  if (rest >= kMiB - 4096) return std::to_string(mib + 1) + " MiB - " + std::to_string(kMiB - rest) + " bytes";
  std::string text = std::to_string(mib) + " MiB";
  if (rest != 0) text += " + " + std::to_string(rest) + " bytes";
  return text;
}

constexpr std::uint64_t kPageBytes = 2 * kMiB;  // the arena's page: one 2 MiB VM granule (Hopper's, and the sim's)

std::string held_text(std::uint64_t bytes) {
  std::string text = bytes_text(bytes);
  if (bytes != 0 && bytes % kPageBytes == 0) {
    const std::uint64_t pages = bytes / kPageBytes;
    text += " (" + std::to_string(pages) + (pages == 1 ? " page" : " pages") + " of 2 MiB)";
  }
  return text;
}

void print_story(const xlog::Runtime& rt, int peer_device, DataPath path, const Ordering& ordering, const Report& r) {
  std::printf("xlog demo engine (libxlog_cuda %s) on the %s backend, device 0%s\n", xlog::version(),
              xlog::backend_name(rt.backend()),
              peer_device >= 0 ? (", the mix stage on device " + std::to_string(peer_device)).c_str() : "");
  std::printf("  %zu batches on 4 streams: a producer writes a %s input, a scale and a mix stream read it and\n",
              kBatches, bytes_text(kBlockBytes).c_str());
  std::printf("  write %s each, a reducer sums both; budget %s. Stage work: %s.\n", bytes_text(kBlockBytes).c_str(),
              bytes_text(kBudgetBytes).c_str(), data_path_name(path));

  std::printf("What xlog ordered\n");
  std::printf("  Each stage names the blocks it reads and writes (prepare_all before, finish_all after); the\n"
              "  engine never waits by hand. %zu stages read blocks written on other streams: %" PRIu64
              " of them started early.\n",
              3 * kBatches, ordering.violations.load());
  std::printf("  The engine freed each batch's blocks right after enqueueing the work (%" PRIu64
              " frees, host never\n  waited); each free waited on the GPU for the block's last reader.\n",
              r.frees_while_in_use);
  if (r.checksum_checked) {
    std::printf("  Checksum %016" PRIx64 " %s the host reference: every read saw what was written.\n", r.checksum,
                r.checksum == r.expected ? "matches" : "DIFFERS FROM");
  } else {
    std::printf("  No checksum: this build has no device kernels, so only the ordering was checked.\n");
  }

  std::printf("What xlog caught\n");
  std::printf("  Stale handle: a kept copy of a freed block's handle, used again, was %s:\n",
              r.stale.refused ? "refused" : "NOT refused");
  std::printf("    %s\n", r.stale.message.c_str());
  if (r.stale.memory_reused) {
    std::printf("    A new block already had that memory: the stale write would have landed in it.\n");
  }
  std::printf("  Read racing a free: the host freed a block while another stream was still reading it (%u ms).\n",
              kRaceReadMillis);
  std::printf("    The free %s for the reader: the next block%s was written %s the read ended",
              r.race.writer_after_reader ? "waited" : "DID NOT WAIT",
              r.race.memory_reused ? ", in the same memory," : "", r.race.writer_after_reader ? "after" : "BEFORE");
  if (r.race.checksum_checked) {
    std::printf(", and the\n    reader saw the data intact (its checksum %s the host reference).\n",
                r.race.checksum == r.race.expected ? "matches" : "DIFFERS FROM");
  } else {
    std::printf(".\n");
  }

  const Refusal& f = r.refusal;
  std::printf("What the budget did\n");
  std::printf("  A %s request under the %s budget was refused:\n", bytes_text(kBudgetBytes + kMiB).c_str(),
              bytes_text(kBudgetBytes).c_str());
  std::printf("    %s\n", f.message.c_str());
  std::printf("    (asked %s; live: %s in the engine's blocks; cached: %s mapped that no block uses;\n"
              "    limit %s; remaining: %s of the budget not charged)\n",
              bytes_text(kBudgetBytes + kMiB).c_str(), bytes_text(f.after.live_bytes).c_str(),
              bytes_text(f.after.cached_bytes).c_str(), bytes_text(kBudgetBytes).c_str(),
              bytes_text(f.after.budget_remaining).c_str());
  const bool blocks_unchanged = f.before.live_bytes == f.after.live_bytes &&
                                f.before.live_blocks == f.after.live_blocks &&
                                f.before.allocations == f.after.allocations;
  const char* verdict = !blocks_unchanged                                       ? "SOMETHING CHANGED"
                        : f.before.outstanding_bytes == f.after.outstanding_bytes ? "Nothing changed"
                                                                                  : "No block changed";
  std::printf("  %s: %" PRIu64 " live block%s (%s) before and after; failed allocations %" PRIu64 " -> %" PRIu64
              ".\n",
              verdict, f.after.live_blocks, f.after.live_blocks == 1 ? "" : "s", bytes_text(f.after.live_bytes).c_str(),
              f.before.failed_allocations, f.after.failed_allocations);
  if (f.before.outstanding_bytes != f.after.outstanding_bytes) {
    std::printf("  Before refusing, xlog gave back the cached memory it could (as before any refusal):\n"
                "  held went from %s to %s, what the live block%s still use%s.\n",
                bytes_text(f.before.outstanding_bytes).c_str(), held_text(f.after.outstanding_bytes).c_str(),
                f.after.live_blocks == 1 ? "" : "s", f.after.live_blocks == 1 ? "s" : "");
  }
  // Retries by the pipeline's own allocations (the refusal's are not theirs).
  const std::uint64_t retries = r.after_pipeline.alloc_retries - (f.after.alloc_retries - f.before.alloc_retries);
  if (retries != 0) {
    std::printf("  %" PRIu64 " allocation%s found the budget full of freed memory the streams still used, and waited\n"
                "  for them (wait_on_pressure) instead of failing.\n",
                retries, retries == 1 ? "" : "s");
  }

  const xlog::Stats& p = r.after_pipeline;
  std::printf("Held versus live\n");
  std::printf("  Peak live %s: the most the engine's blocks added up to at once (a batch's three\n"
              "  blocks and the 8-byte accumulator, which takes 512 bytes: sizes round up to 512).\n",
              bytes_text(p.peak_live_bytes).c_str());
  std::printf("  Peak held %s: the device memory xlog mapped, which is what the budget charges.\n",
              held_text(p.peak_outstanding_bytes).c_str());
  const std::uint64_t live_pages = (p.peak_live_bytes + kPageBytes - 1) / kPageBytes;
  if (p.peak_outstanding_bytes <= live_pages * kPageBytes) {
    std::printf("  Held is more than live because the arena maps whole 2 MiB pages: %s of blocks fit in %" PRIu64
                "\n  page%s, and freed blocks' pages stay mapped (cached) for the next allocation.\n",
                bytes_text(p.peak_live_bytes).c_str(), live_pages, live_pages == 1 ? "" : "s");
  } else {
    std::printf("  Held is more than live because the arena maps whole 2 MiB pages (%s of blocks needs %" PRIu64
                "),\n  and freed blocks' pages stay mapped (cached) while queued work still reads them.\n",
                bytes_text(p.peak_live_bytes).c_str(), live_pages);
  }
  std::printf("  At the end every block was freed and trim() gave back the %s still held: xlog holds %s.\n",
              held_text(r.released_by_trim).c_str(), bytes_text(r.final_stats.outstanding_bytes).c_str());
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
  const xlog::Stats& p = r.after_pipeline;
  const xlog::Stats& s = r.final_stats;
  if (r.checksum_checked) require(r.checksum == r.expected, "checksum differs from the host reference");
  require(ordering.violations.load() == 0,
          std::to_string(ordering.violations.load()) + " stage(s) ran before the stages they read from");
  for (std::size_t batch = 0; batch < kBatches; ++batch) {
    const std::uint32_t all = kProduced | kScaled | kMixed | kReduced;
    require(ordering.stages[batch].load() == all, "batch " + std::to_string(batch) + " did not run every stage");
  }
  // The refusal: once, with its numbers, changing nothing but the count.
  const Refusal& f = r.refusal;
  require(f.refusals == 1, "the over-budget allocation was not refused with XLOG_ERR_OUT_OF_BUDGET");
  require(f.after.failed_allocations == f.before.failed_allocations + 1, "failed_allocations did not grow by 1");
  require(f.after.live_bytes == f.before.live_bytes && f.after.live_blocks == f.before.live_blocks &&
              f.after.allocations == f.before.allocations,
          "the refused allocation changed the live blocks");
  require(f.after.outstanding_bytes <= f.before.outstanding_bytes, "the refused allocation left more memory held");
  require(f.after.peak_outstanding_bytes == f.before.peak_outstanding_bytes &&
              f.after.peak_live_bytes == f.before.peak_live_bytes,
          "the refused allocation moved a peak");
  // The pipeline: 3 blocks per batch and the accumulator, all freed but it.
  const std::uint64_t blocks = 3 * kBatches + 1;
  require(p.allocations == blocks, "allocations " + std::to_string(p.allocations) + ", expected " +
                                       std::to_string(blocks));
  require(p.live_blocks == 1, "blocks other than the accumulator live after the pipeline");
  require(p.failed_allocations == 1, "failed_allocations " + std::to_string(p.failed_allocations) + ", expected 1");
  require(p.peak_outstanding_bytes <= kBudgetBytes, "peak held bytes exceeded the budget");
  require(p.peak_live_bytes >= 3 * kBlockBytes, "peak live bytes below one batch's worth");
  require(p.peak_outstanding_bytes >= p.peak_live_bytes, "peak held below peak live");
  // The caught mistakes.
  require(r.stale.refused, "a stale handle was not refused with XLOG_ERR_USE_AFTER_FREE");
  require(r.race.writer_after_reader, "a block freed during a read was written again before the read ended");
  if (r.race.checksum_checked) require(r.race.checksum == r.race.expected, "the racing reader saw changed data");
  // The end: nothing live, nothing held, the whole budget back.
  require(s.live_bytes == 0 && s.live_blocks == 0, "blocks still live at the end");
  require(s.pending_bytes == 0 && s.pending_blocks == 0, "frees still pending at the end");
  require(r.released_by_trim == r.held_before_trim, "trim() released " + std::to_string(r.released_by_trim) +
                                                        " of " + std::to_string(r.held_before_trim) + " held bytes");
  require(s.outstanding_bytes == 0 && s.cached_bytes == 0, "memory still held after trim()");
  require(s.budget_limit == kBudgetBytes, "budget limit " + std::to_string(s.budget_limit));
  require(s.budget_remaining == kBudgetBytes, "budget not fully returned: " + std::to_string(s.budget_remaining) +
                                                  " of " + std::to_string(kBudgetBytes) + " bytes remaining");
  require(r.close.leaked_blocks == 0 && r.close.leaked_bytes == 0, "the runtime reported leaks at close");
  return ok;
}

// Every scene, in order, on `rt`; the accumulator is freed and the cache
// trimmed at the end.
void run_all(xlog::Runtime& rt, xlog::Runtime* peer, DataPath path, Ordering& ordering, Report& report) {
  xlog::Stream producer = rt.acquire_stream();
  xlog::Stream scaler = rt.acquire_stream();
  xlog::Stream mixer = peer != nullptr ? peer->acquire_stream() : rt.acquire_stream();
  xlog::Stream reducer = rt.acquire_stream();
  run_pipeline(rt, peer, path, ordering, report, producer, scaler, mixer, reducer);
  catch_stale_handle(rt, producer, report.stale);
  catch_raced_free(rt, path, producer, scaler, report.race);
  for (const xlog::Stream* s : {&producer, &scaler, &mixer, &reducer}) s->synchronize();
  report.held_before_trim = rt.stats().outstanding_bytes;
  report.released_by_trim = rt.trim();
  report.final_stats = rt.stats();
}

bool cuda_requested() {
  const char* backend = std::getenv("XLOG_BACKEND");
  return backend != nullptr && std::strcmp(backend, "cuda") == 0;
}

// The log's path: XLOG_LOG_PATH when set, else --log, else kDefaultLog in
// the working directory.
constexpr const char* kDefaultLog = "xlog-demo-log.csv";

std::string absolute_path(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char* cwd = getcwd(nullptr, 0);
  if (cwd == nullptr) return path;
  std::string full = std::string(cwd) + "/" + path;
  std::free(cwd);
  return full;
}

// Rows after the header; -1 where the file cannot be read.
long log_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in) return -1;
  long lines = 0;
  std::string line;
  while (std::getline(in, line)) ++lines;
  return lines > 0 ? lines - 1 : 0;
}

// "a/b/log.csv" -> "a/b/log.html"
std::string report_path_for(const std::string& log) {
  const std::size_t slash = log.rfind('/');
  const std::size_t dot = log.rfind('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) return log.substr(0, dot) + ".html";
  return log + ".html";
}

}  // namespace

int main(int argc, char** argv) {
  int peer_device = -1;
  std::string log_path = kDefaultLog;
  long rows_before = -1;  // rows already in the log file (XLOG_LOG_PATH appends)
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--peer-device") == 0 && i + 1 < argc) {
      char* end = nullptr;
      const long value = std::strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || value < 1 || value > 63) {
        std::printf("error: --peer-device wants a device ordinal from 1 to 63, got %s\n", argv[i]);
        return 2;
      }
      peer_device = static_cast<int>(value);
    } else if (std::strcmp(argv[i], "--log") == 0 && i + 1 < argc) {
      log_path = argv[++i];
    } else {
      std::printf("usage: %s [--peer-device N] [--log PATH]  (XLOG_LOG_PATH, when set, wins over --log)\n",
                  argv[0]);
      return 2;
    }
  }
  Ordering ordering;  // outlives the runtimes: see Ordering
  Report report;
  try {
    xlog::Config config;  // XLOG_BACKEND etc. from the environment
    config.budget_bytes(kBudgetBytes).wait_on_pressure(true);
    // The memory log (every allocation, free and refusal) for the HTML report.
    const char* env_log = std::getenv("XLOG_LOG_PATH");
    if (env_log != nullptr && env_log[0] != '\0') {
      log_path = env_log;
    } else {
      std::remove(log_path.c_str());  // the demo's own log: this run's rows only
      config.log_path(log_path);
    }
    rows_before = log_rows(log_path);
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
        xlog::Config peer_config = config;  // every block is device 0's: the log is its runtime's
        peer_config.log_path("");
        peer = std::make_unique<xlog::Runtime>(peer_config, peer_device);
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
    run_all(*rt, peer.get(), path, ordering, report);
    print_story(*rt, peer_device, path, ordering, report);
    report.close = rt->close();  // also flushes and closes the log

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
    const std::string log_file = absolute_path(log_path);
    const long rows = log_rows(log_file);
    if (rows >= 0) {
      std::printf("Memory log: %s (%ld rows from this run: its allocations, frees and refusal).\n",
                  log_file.c_str(), rows - (rows_before > 0 ? rows_before : 0));
      std::printf("HTML memory report: python3 -m xlog_cuda.report %s -o %s\n", log_file.c_str(),
                  report_path_for(log_file).c_str());
      std::printf("  (the xlog_cuda Python package: pip install . or PYTHONPATH=python; scripts/demo runs it)\n");
    } else {
      std::printf("  MISMATCH: the memory log %s was not written\n", log_file.c_str());
      ok = false;
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
