// consumer_cpp: the C++ RAII layer from an installed/exported package.
// Opens a sim runtime, allocates once, writes and reads the block in stream
// order, and checks that an over-budget request throws xlog::Error with
// XLOG_ERR_OUT_OF_BUDGET. Prints "consumer_cpp OK" and exits 0 on success.

#include <xlog/runtime.hpp>

#include <cstdint>
#include <cstdio>

namespace {
int failures = 0;

void expect(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "consumer_cpp: failed: %s\n", what);
    ++failures;
  }
}
}  // namespace

int main() {
  try {
    constexpr std::uint64_t kBudget = 8 << 20;  // four 2 MiB pages
    const xlog::Config config = xlog::Config().backend(XLOG_BACKEND_SIM).budget_bytes(kBudget).cache(true);
    // What one 1024-byte block makes the runtime hold: the arena (the
    // default) maps a 2 MiB page, the pool (XLOG_MEMORY=pool) holds the block.
    const std::uint64_t held = config.raw().memory == XLOG_MEMORY_POOL ? 1024 : 2 << 20;
    xlog::Runtime rt{config};
    expect(rt.backend() == XLOG_BACKEND_SIM, "backend is sim");
    {
      xlog::Stream stream = rt.acquire_stream();
      xlog::Block block = rt.allocate(1024, stream, "consumer");
      expect(block.size() == 1024, "block size");

      // Write 0..255 in stream order, then read it back in stream order.
      unsigned sum = 0;
      xlog::launch(rt, stream, {xlog::write(block)}, [&](const xlog::Stream& on) {
        on.enqueue_host([p = block.data<unsigned char>()] {
          for (int i = 0; i < 1024; ++i) p[i] = static_cast<unsigned char>(i);
        });
      });
      xlog::launch(rt, stream, {xlog::read(block)}, [&](const xlog::Stream& on) {
        on.enqueue_host([&sum, p = block.data<const unsigned char>()] {
          for (int i = 0; i < 1024; ++i) sum += p[i];
        });
      });
      stream.synchronize();
      expect(sum == 4 * (255 * 256 / 2), "bytes written and read in stream order");

      bool refused = false;
      try {
        xlog::Block too_big = rt.allocate(kBudget + 1, stream, "too-big");
      } catch (const xlog::Error& e) {
        refused = e.status() == XLOG_ERR_OUT_OF_BUDGET && !e.message().empty();
      }
      expect(refused, "over-budget allocation throws XLOG_ERR_OUT_OF_BUDGET");
    }
    expect(rt.stats().cached_bytes == held, "the freed block's memory stays held, idle");
    expect(rt.trim() == held, "trim hands it back");
    expect(rt.drain() == 0, "nothing left pending after trim");
    const xlog::Stats stats = rt.stats();
    expect(stats.struct_size == sizeof(xlog::Stats), "stats() sets struct_size");
    expect(stats.live_bytes == 0 && stats.pending_bytes == 0 && stats.outstanding_bytes == 0,
           "nothing outstanding");
    expect(stats.allocations == 1 && stats.failed_allocations == 1, "allocation counters");
    const xlog::CloseReport report = rt.close();
    expect(report.leaked_blocks == 0, "no leaks");
  } catch (const xlog::Error& e) {
    std::fprintf(stderr, "consumer_cpp: %s\n", e.what());
    return 1;
  }
  if (failures != 0) return 1;
  std::printf("consumer_cpp OK (libxlog_cuda %s)\n", xlog::version());
  return 0;
}
