// The device budget over the real stream-ordered pool, on a GPU.
//
// Phases 1 and 2 run with the cache off (`cache = 0`, the seed's
// free-to-driver behaviour: a free is pending until a reap sees it
// complete); phase 3 with the cache on (the default).
//
// Phase 1 — budget 8 MiB, wait_on_pressure = 0, cache = 0:
//   fill it with 4 x 2 MiB; a 1 MiB allocation is refused with
//   XLOG_ERR_OUT_OF_BUDGET and a message naming the numbers; a zero-byte
//   allocation still succeeds; a block freed while a kernel still runs on
//   its stream stays charged (pending) and a new allocation is refused
//   until xlog_drain retires it; a free that has completed is released by
//   polling xlog_reap (which never blocks); the shared per-ordinal runtime
//   refuses a second open with a different budget and shares the budget
//   with a second open of the same config.
// Phase 2 — after closing, reopen with wait_on_pressure = 1, cache = 0:
//   with the budget full and a 2 MiB block freed behind a ~150 ms kernel, a
//   2 MiB allocation on another stream succeeds without any explicit reap:
//   it waited for the free (the kernel was running when the call started
//   and had finished when it returned). An allocation that cannot fit even
//   if every pending free retires is refused at once, without waiting.
// Phase 3 — reopen with the cache on, wait_on_pressure = 0:
//   a block freed behind a running kernel goes to its stream's cache and
//   stays charged; the same size on the same stream is handed out again at
//   once (no host wait, same address) and a kernel on another stream that
//   takes it from that cache starts only after the running kernel ended;
//   an allocation the cache cannot serve, with the budget full, hands the
//   cached block back to the driver and, its free being queued behind a
//   busy stream, is refused naming cached 0 and the pending bytes, until
//   xlog_drain retires them; xlog_trim hands back exactly the cached bytes
//   and the budget is whole again.

#include "test_support.cu"

using namespace xlog_test;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kBudget = 8 * kMiB;
constexpr uint64_t kBlock = 2 * kMiB;
constexpr uint64_t kKernelSpin = 150 * kMs;

__global__ void touch_kernel(uint32_t* data, size_t count, uint32_t value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    data[i] = value + static_cast<uint32_t>(i);
  }
}

bool contains(const std::string& text, uint64_t number) { return text.find(std::to_string(number)) != std::string::npos; }

std::string usage(const xlog_stats& s) {
  return "live " + str(s.live_bytes) + ", cached " + str(s.cached_bytes) + ", pending " + str(s.pending_bytes) +
         ", remaining " + str(s.budget_remaining) + " of " + str(s.budget_limit);
}

// Fill the budget with 2 MiB blocks on `s`, each written by a kernel.
std::vector<xlog_block> fill_budget(xlog_runtime* rt, const Stream& s) {
  std::vector<xlog_block> blocks;
  for (uint64_t i = 0; i < kBudget / kBlock; ++i) {
    xlog_block b = allocate(rt, kBlock, s, "budget-filler");
    launch(rt, s, {use(b, XLOG_ACCESS_WRITE)}, [&](cudaStream_t native) {
      touch_kernel<<<grid_for(kBlock / 4, 256), 256, 0, native>>>(static_cast<uint32_t*>(b.ptr), kBlock / 4,
                                                                   static_cast<uint32_t>(i));
    });
    blocks.push_back(b);
  }
  return blocks;
}

// Occupy `block`'s stream with a long kernel that uses it, and return an
// event that completes when that kernel has finished.
cudaEvent_t busy_with(xlog_runtime* rt, const Stream& s, const xlog_block& block) {
  launch(rt, s, {use(block, XLOG_ACCESS_READ_WRITE)}, [&](cudaStream_t native) {
    delay_kernel<<<1, 1, 0, native>>>(kKernelSpin);
    touch_kernel<<<grid_for(block.size / 4, 256), 256, 0, native>>>(static_cast<uint32_t*>(block.ptr),
                                                                     block.size / 4, 7);
  });
  cudaEvent_t done;
  CUDA_OR_DIE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_OR_DIE(cudaEventRecord(done, s.native));
  return done;
}

bool still_running(cudaEvent_t event) {
  cudaError_t q = cudaEventQuery(event);
  if (q != cudaSuccess && q != cudaErrorNotReady) cuda_or_die(q, "cudaEventQuery");
  return q == cudaErrorNotReady;
}

void free_all(xlog_runtime* rt, std::vector<xlog_block>& blocks) {
  for (const xlog_block& b : blocks) XLOG_OR_DIE(xlog_deallocate(rt, b));
  blocks.clear();
}

// ---------------------------------------------------------------------------

void phase_refuse_and_release() {
  std::printf("-- phase 1: budget %llu bytes, wait_on_pressure 0, cache 0\n", static_cast<unsigned long long>(kBudget));
  xlog_runtime* rt = open_cuda(kBudget, false, false);
  Stream a = acquire(rt), b = acquire(rt);

  xlog_stats s = stats(rt);
  check(s.budget_limit == kBudget && s.budget_remaining == kBudget && s.outstanding_bytes == 0,
        "a fresh runtime has the whole budget", usage(s));

  std::vector<xlog_block> blocks = fill_budget(rt, a);
  s = stats(rt);
  check(s.live_bytes == kBudget && s.budget_remaining == 0, "four 2 MiB blocks fill the budget", usage(s));

  // Refusal, with the numbers in the message.
  xlog_block refused{};
  const uint64_t failed_before = s.failed_allocations;
  const Captured over = capture(xlog_allocate(rt, kMiB, b.id, "over-budget", &refused));
  expect_captured(over, XLOG_ERR_OUT_OF_BUDGET, "1 MiB more is refused with OUT_OF_BUDGET");
  check(contains(over.message, kMiB) && contains(over.message, kBudget), "the refusal names the request and the limit",
        over.message);
  s = stats(rt);
  check(s.failed_allocations == failed_before + 1 && s.live_bytes == kBudget,
        "the refusal is counted and changes nothing else", usage(s));

  xlog_block empty{};
  expect_status(xlog_allocate(rt, 0, b.id, "empty", &empty), XLOG_OK, "a zero-byte allocation fits a full budget");
  check(empty.ptr == nullptr && empty.size == 0, "a zero-byte block has a NULL pointer");
  expect_status(xlog_deallocate(rt, empty), XLOG_OK, "a zero-byte block frees");

  // Second opens share the runtime (and its budget) only with the same config.
  {
    xlog_config other;
    xlog_config_init(&other);
    other.struct_size = sizeof(xlog_config);
    other.backend = XLOG_BACKEND_CUDA;
    other.allocator = XLOG_ALLOCATOR_ASYNC;
    other.log_path = nullptr;
    other.budget_bytes = 2 * kBudget;
    xlog_runtime* second = nullptr;
    expect_status(xlog_runtime_open(0, &other, &second), XLOG_ERR_INVALID_ARGUMENT,
                  "a second open of device 0 with another budget is refused");
    xlog_runtime* shared = open_cuda(kBudget, false, false);
    xlog_stats seen = stats(shared);
    check(seen.live_bytes == kBudget && seen.budget_remaining == 0,
          "a second open with the same config sees the same budget", usage(seen));
    Stream c = acquire(shared);
    xlog_block through_second{};
    expect_status(xlog_allocate(shared, kMiB, c.id, "through-second-open", &through_second),
                  XLOG_ERR_OUT_OF_BUDGET, "the full budget also refuses through the second handle");
    XLOG_OR_DIE(xlog_stream_release(shared, c.id));
    XLOG_OR_DIE(xlog_runtime_close(shared));
    s = stats(rt);
    check(s.live_bytes == kBudget, "closing the second handle leaves the first working", usage(s));
  }

  // A block freed behind a running kernel stays charged until its free completes.
  cudaEvent_t kernel_done = busy_with(rt, a, blocks[0]);
  XLOG_OR_DIE(xlog_deallocate(rt, blocks[0]));
  blocks.erase(blocks.begin());
  const bool running_at_free = still_running(kernel_done);
  s = stats(rt);
  check(s.pending_bytes == kBlock && s.live_bytes == kBudget - kBlock && s.budget_remaining == 0,
        "a freed block is pending and still charged", usage(s));
  xlog_block retry{};
  const Captured while_pending = capture(xlog_allocate(rt, kBlock, b.id, "while-pending", &retry));
  uint64_t reaped = 12345;
  const Captured reap = capture(xlog_reap(rt, &reaped));
  const bool running_after = still_running(kernel_done);
  if (running_at_free && running_after) {
    expect_captured(while_pending, XLOG_ERR_OUT_OF_BUDGET,
                    "allocating over pending bytes is refused while the free is queued");
    check(contains(while_pending.message, kBudget - kBlock) && contains(while_pending.message, kBlock),
          "the refusal names the live and pending bytes", while_pending.message);
    check(reap.status == XLOG_OK && reaped == 0, "xlog_reap releases nothing while the kernel runs",
          std::string(xlog_status_name(reap.status)) + " " + reap.message + ", reclaimed " + str(reaped));
  } else {
    check(false, "the 150 ms kernel was still running during the pending checks",
          std::string("running at free: ") + (running_at_free ? "yes" : "no") +
              ", after reap: " + (running_after ? "yes" : "no"));
  }
  uint64_t drained = 0;
  expect_status(xlog_drain(rt, &drained), XLOG_OK, "xlog_drain");
  check(drained == kBlock && !still_running(kernel_done), "xlog_drain waits for the free and releases 2 MiB",
        "reclaimed " + str(drained));
  CUDA_OR_DIE(cudaEventDestroy(kernel_done));
  s = stats(rt);
  check(s.pending_bytes == 0 && s.budget_remaining == kBlock, "the drained bytes are back in the budget", usage(s));
  xlog_block again{};
  expect_status(xlog_allocate(rt, kBlock, b.id, "after-drain", &again), XLOG_OK, "allocating after the drain fits");
  blocks.push_back(again);

  // A completed free is released by xlog_reap, which never blocks: poll it.
  XLOG_OR_DIE(xlog_deallocate(rt, blocks.back()));
  blocks.pop_back();
  CUDA_OR_DIE(cudaStreamSynchronize(b.native));
  uint64_t reclaimed_total = 0;
  const double deadline = now_ms() + 2000.0;
  while (reclaimed_total < kBlock && now_ms() < deadline) {
    uint64_t reclaimed = 0;
    XLOG_OR_DIE(xlog_reap(rt, &reclaimed));
    reclaimed_total += reclaimed;
  }
  check(reclaimed_total == kBlock, "polling xlog_reap releases a completed free", "reclaimed " + str(reclaimed_total));
  s = stats(rt);
  check(s.pending_bytes == 0 && s.budget_remaining == kBlock, "reaped bytes are back in the budget", usage(s));

  free_all(rt, blocks);
  XLOG_OR_DIE(xlog_drain(rt, nullptr));
  s = stats(rt);
  check(s.outstanding_bytes == 0 && s.budget_remaining == kBudget, "everything freed returns the whole budget",
        usage(s));
  XLOG_OR_DIE(xlog_stream_release(rt, a.id));
  XLOG_OR_DIE(xlog_stream_release(rt, b.id));
  close_expect_no_leaks(rt, "phase 1 closes without leaks");
}

void phase_wait_on_pressure() {
  std::printf("-- phase 2: budget %llu bytes, wait_on_pressure 1, cache 0\n", static_cast<unsigned long long>(kBudget));
  xlog_runtime* rt = open_cuda(kBudget, true, false);
  Stream a = acquire(rt), b = acquire(rt);
  std::vector<xlog_block> blocks = fill_budget(rt, a);

  // Fits once the pending free retires: the allocation waits for it.
  cudaEvent_t kernel_done = busy_with(rt, a, blocks[0]);
  XLOG_OR_DIE(xlog_deallocate(rt, blocks[0]));
  blocks.erase(blocks.begin());
  const bool running_before = still_running(kernel_done);
  const double start = now_ms();
  xlog_block waited{};
  const Captured pressured = capture(xlog_allocate(rt, kBlock, b.id, "waits-on-pressure", &waited));
  const double took = now_ms() - start;
  const bool running_after = still_running(kernel_done);
  std::printf("allocation under pressure took %.1f ms\n", took);
  check(running_before, "the kernel on the freeing stream was running when the allocation started");
  expect_captured(pressured, XLOG_OK, "an allocation that fits after pending frees retire succeeds without a reap");
  check(!running_after, "it returned only after the kernel (and so the free) had completed");
  xlog_stats s = stats(rt);
  check(s.live_bytes == kBudget && s.pending_bytes == 0 && s.budget_remaining == 0,
        "the retired free's bytes went to the new block", usage(s));
  if (pressured.status == XLOG_OK) blocks.push_back(waited);
  CUDA_OR_DIE(cudaEventDestroy(kernel_done));

  // Cannot fit even if every pending free retires: refused at once.
  kernel_done = busy_with(rt, a, blocks[0]);
  XLOG_OR_DIE(xlog_deallocate(rt, blocks[0]));
  blocks.erase(blocks.begin());
  xlog_block too_big{};
  const Captured hopeless = capture(xlog_allocate(rt, 2 * kBlock, b.id, "never-fits", &too_big));
  const bool still = still_running(kernel_done);
  expect_captured(hopeless, XLOG_ERR_OUT_OF_BUDGET, "4 MiB with only 2 MiB pending is refused");
  check(still, "the hopeless allocation did not wait for the pending free");
  XLOG_OR_DIE(xlog_drain(rt, nullptr));
  CUDA_OR_DIE(cudaEventDestroy(kernel_done));

  free_all(rt, blocks);
  XLOG_OR_DIE(xlog_drain(rt, nullptr));
  s = stats(rt);
  check(s.outstanding_bytes == 0 && s.budget_remaining == kBudget, "everything freed returns the whole budget",
        usage(s));
  XLOG_OR_DIE(xlog_stream_release(rt, a.id));
  XLOG_OR_DIE(xlog_stream_release(rt, b.id));
  close_expect_no_leaks(rt, "phase 2 closes without leaks");
}

void phase_cache() {
  std::printf("-- phase 3: budget %llu bytes, wait_on_pressure 0, cache 1\n", static_cast<unsigned long long>(kBudget));
  xlog_runtime* rt = open_cuda(kBudget, false, true);
  Stream a = acquire(rt), b = acquire(rt);
  std::vector<xlog_block> blocks = fill_budget(rt, a);
  xlog_stats s = stats(rt);
  check(s.live_bytes == kBudget && s.budget_remaining == 0 && s.cache_misses == blocks.size(),
        "cache on: four 2 MiB blocks from the driver fill the budget", usage(s));

  // Freed behind a running kernel: cached on A, still charged.
  HostProbe<unsigned long long> stamps(2);  // [0] A's kernel done, [1] B's first kernel on the reused block
  cudaEvent_t kernel_done = busy_with(rt, a, blocks[0]);
  timestamp_kernel<<<1, 1, 0, a.native>>>(&stamps[0]);
  CUDA_OR_DIE(cudaGetLastError());
  const xlog_block freed = blocks[0];
  XLOG_OR_DIE(xlog_deallocate(rt, freed));
  blocks.erase(blocks.begin());
  s = stats(rt);
  check(s.cached_bytes == kBlock && s.cached_blocks == 1 && s.pending_bytes == 0 && s.budget_remaining == 0 &&
            s.outstanding_bytes == kBudget,
        "a freed block waits in its stream's cache, still charged", usage(s));

  // Same stream, same size: at once, same memory, no budget needed.
  xlog_block same{};
  const Captured same_stream = capture(xlog_allocate(rt, kBlock, a.id, "same-stream-hit", &same));
  const bool running_after_hit = still_running(kernel_done);
  expect_captured(same_stream, XLOG_OK, "the same size on the same stream fits a full budget");
  check(same.ptr == freed.ptr && same.generation != freed.generation,
        "it is the cached block, under a new generation");
  check(running_after_hit, "a same-stream cache hit does not wait for the running kernel");
  expect_status(xlog_block_validate(rt, freed), XLOG_ERR_USE_AFTER_FREE, "the freed handle stays dead");
  XLOG_OR_DIE(xlog_deallocate(rt, same));

  // Another stream takes it from A's cache: B's work on it waits for A's.
  xlog_block cross{};
  const Captured cross_stream = capture(xlog_allocate(rt, kBlock, b.id, "cross-stream-hit", &cross));
  const bool running_after_cross = still_running(kernel_done);
  expect_captured(cross_stream, XLOG_OK, "the same size on another stream is served from A's cache");
  check(cross.ptr == freed.ptr, "B got A's cached block");
  check(running_after_cross, "the cross-stream hand-out did not wait on the host");
  launch(rt, b, {use(cross, XLOG_ACCESS_WRITE)}, [&](cudaStream_t native) {
    timestamp_kernel<<<1, 1, 0, native>>>(&stamps[1]);
    touch_kernel<<<grid_for(kBlock / 4, 256), 256, 0, native>>>(static_cast<uint32_t*>(cross.ptr), kBlock / 4, 9);
  });
  CUDA_OR_DIE(cudaStreamSynchronize(b.native));
  check(stamps[0] != 0 && stamps[1] >= stamps[0], "B's first kernel on the block started after A's kernel ended",
        "A done at " + str(stamps[0]) + " ns, B started at " + str(stamps[1]) + " ns");
  s = stats(rt);
  check(s.cache_hits == 2 && s.cached_bytes == 0 && s.live_bytes == kBudget && s.budget_remaining == 0,
        "two hits, nothing new from the driver", usage(s) + ", hits " + str(s.cache_hits));
  CUDA_OR_DIE(cudaEventDestroy(kernel_done));

  // Pressure: B's block goes back to B's cache behind another long kernel;
  // 1 MiB cannot be served by a 2 MiB block and the budget is full, so the
  // cached block is handed back to the driver, but its free waits behind
  // the kernel: refused, with the numbers.
  kernel_done = busy_with(rt, b, cross);
  XLOG_OR_DIE(xlog_deallocate(rt, cross));
  xlog_block pressured{};
  const Captured refused = capture(xlog_allocate(rt, kMiB, b.id, "pressured", &pressured));
  const bool running_after_refusal = still_running(kernel_done);
  s = stats(rt);
  if (running_after_refusal) {
    expect_captured(refused, XLOG_ERR_OUT_OF_BUDGET,
                    "with the budget full, an allocation the cache cannot serve is refused while the free runs");
    check(refused.message.find("cached 0,") != std::string::npos &&
              refused.message.find("pending " + std::to_string(kBlock)) != std::string::npos &&
              contains(refused.message, kMiB) && contains(refused.message, kBudget),
          "the refusal names the request, cached 0, the pending bytes and the limit", refused.message);
    check(s.cached_bytes == 0 && s.pending_bytes == kBlock && s.budget_remaining == 0,
          "pressure handed the cached block back to the driver", usage(s));
  } else {
    check(false, "the 150 ms kernel was still running during the pressure checks", usage(s));
  }
  uint64_t drained = 0;
  XLOG_OR_DIE(xlog_drain(rt, &drained));
  check(drained == kBlock && !still_running(kernel_done), "xlog_drain retires the handed-back block",
        "reclaimed " + str(drained));
  CUDA_OR_DIE(cudaEventDestroy(kernel_done));
  expect_status(xlog_allocate(rt, kMiB, b.id, "after-drain", &pressured), XLOG_OK, "1 MiB fits after the drain");
  blocks.push_back(pressured);

  // Trim: exactly the cached bytes go back, and the budget is whole again.
  free_all(rt, blocks);
  s = stats(rt);
  const uint64_t cached = s.cached_bytes;
  check(cached == kBudget - kBlock + kMiB && s.live_bytes == 0 && s.budget_remaining == kBudget - cached,
        "every freed block waits in a cache, still charged", usage(s));
  uint64_t released = 0;
  expect_status(xlog_trim(rt, 0, &released), XLOG_OK, "xlog_trim");
  s = stats(rt);
  check(released == cached, "trim reports exactly the cached bytes", "released " + str(released) + " of " + str(cached));
  check(s.cached_bytes == 0 && s.pending_bytes == 0 && s.outstanding_bytes == 0 && s.budget_remaining == kBudget,
        "after trim nothing is held and the whole budget is back", usage(s));
  XLOG_OR_DIE(xlog_stream_release(rt, a.id));
  XLOG_OR_DIE(xlog_stream_release(rt, b.id));
  close_expect_no_leaks(rt, "phase 3 closes without leaks");
}

}  // namespace

int main() {
  skip_without_device();
  // The byte counts checked here are the driver pool's (a block holds its
  // own size, frees pend until reaped); the arena's are in tests/arena.rs
  // and the W7/W8/W11/W12 benchmarks.
  g_test_memory = XLOG_MEMORY_POOL;
  phase_refuse_and_release();
  phase_wait_on_pressure();
  phase_cache();
  return summary();
}
