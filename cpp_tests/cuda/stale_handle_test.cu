// Stale handles on the real stream-ordered pool (cuMemAllocAsync), on a GPU.
//
// Addresses are reused — at once by the stream's cache (the default), or by
// the driver's pool with the cache off — so a handle kept after its block
// was freed can point at memory that now belongs to a new block. The runtime must reject
// such a handle by its generation even though its pointer is live again:
// xlog_deallocate, xlog_prepare, xlog_finish, xlog_prepare_all and
// xlog_block_validate all return XLOG_ERR_USE_AFTER_FREE, change nothing,
// and the new block at the same address keeps working.
//
// Finding a reused address: allocate, free and reallocate the same size on
// the same stream until the new block's pointer equals the freed one (tried
// both right after the free and after a drain; up to kAttempts rounds). With
// the cache on the first round must do it: the free put the block in the
// stream's cache and the same size on the same stream takes it. The whole
// test runs twice: cache on, then cache off (the driver's reuse).

#include "test_support.cu"

using namespace xlog_test;

namespace {

constexpr uint64_t kBytes = 1u << 20;
constexpr size_t kCount = kBytes / sizeof(uint32_t);
constexpr int kAttempts = 64;

__global__ void fill_kernel(uint32_t* data, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    data[i] = static_cast<uint32_t>(i) * 40503u + seed;
  }
}

struct Reused {
  xlog_block stale;  // freed
  xlog_block fresh;  // live, same address
  int attempts;
};

bool find_reuse(xlog_runtime* rt, const Stream& a, Reused* found) {
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    xlog_block old_block = allocate(rt, kBytes, a, "soon-stale");
    launch(rt, a, {use(old_block, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
      fill_kernel<<<grid_for(kCount, 256), 256, 0, s>>>(static_cast<uint32_t*>(old_block.ptr), kCount, 1);
    });
    XLOG_OR_DIE(xlog_deallocate(rt, old_block));
    // Odd attempts reallocate at once (same-stream reuse); even ones after
    // the free has completed and been reaped.
    if (attempt % 2 == 0) XLOG_OR_DIE(xlog_drain(rt, nullptr));
    xlog_block new_block = allocate(rt, kBytes, a, "fresh");
    if (new_block.ptr == old_block.ptr) {
      *found = Reused{old_block, new_block, attempt};
      return true;
    }
    XLOG_OR_DIE(xlog_deallocate(rt, new_block));
  }
  return false;
}

void run(bool cache) {
  const std::string mode = cache ? "cache on: " : "cache off: ";
  std::printf("-- %s\n", cache ? "cache on" : "cache off");
  xlog_runtime* rt = open_cuda(0, false, cache);
  Stream a = acquire(rt), b = acquire(rt);

  Reused r{};
  if (!find_reuse(rt, a, &r)) {
    die(mode + "the async pool never reused a freed address in " + str(kAttempts) +
        " rounds of allocate/free/reallocate of " + str(kBytes) + " bytes on one stream");
  }
  std::printf("address %p reused after %d attempt(s): stale generation %llu, new generation %llu\n", r.fresh.ptr,
              r.attempts, static_cast<unsigned long long>(r.stale.generation),
              static_cast<unsigned long long>(r.fresh.generation));
  check(r.stale.generation != r.fresh.generation, mode + "the reused address got a new generation");
  if (cache) {
    check(r.attempts == 1, mode + "the stream's cache reused the address at the first reallocation",
          "took " + str(r.attempts) + " attempts");
    const xlog_stats hit = stats(rt);
    check(hit.cache_hits == 1 && hit.cache_misses == 1, mode + "one miss, then a cache hit",
          "hits " + str(hit.cache_hits) + ", misses " + str(hit.cache_misses));
  }

  const xlog_stats before = stats(rt);

  // Every entry point rejects the stale handle by generation.
  xlog_status status = xlog_block_validate(rt, r.stale);
  expect_status(status, XLOG_ERR_USE_AFTER_FREE, mode + "xlog_block_validate(stale) is USE_AFTER_FREE");
  std::string message = last_message();
  check(message.find(std::to_string(r.stale.generation)) != std::string::npos,
        mode + "the message names the stale generation", message);
  expect_status(xlog_prepare(rt, r.stale, b.id, XLOG_ACCESS_READ), XLOG_ERR_USE_AFTER_FREE,
                mode + "xlog_prepare(stale, Read) is USE_AFTER_FREE");
  expect_status(xlog_prepare(rt, r.stale, b.id, XLOG_ACCESS_WRITE), XLOG_ERR_USE_AFTER_FREE,
                mode + "xlog_prepare(stale, Write) is USE_AFTER_FREE");
  expect_status(xlog_finish(rt, r.stale, b.id, XLOG_ACCESS_WRITE), XLOG_ERR_USE_AFTER_FREE,
                mode + "xlog_finish(stale, Write) is USE_AFTER_FREE");
  std::vector<xlog_use> mixed = {use(r.fresh, XLOG_ACCESS_READ), use(r.stale, XLOG_ACCESS_WRITE)};
  expect_status(xlog_prepare_all(rt, b.id, mixed.data(), mixed.size()), XLOG_ERR_USE_AFTER_FREE,
                mode + "xlog_prepare_all(fresh, stale) is USE_AFTER_FREE");
  expect_status(xlog_finish_all(rt, b.id, mixed.data(), mixed.size()), XLOG_ERR_USE_AFTER_FREE,
                mode + "xlog_finish_all(fresh, stale) is USE_AFTER_FREE");
  expect_status(xlog_deallocate(rt, r.stale), XLOG_ERR_USE_AFTER_FREE, mode + "xlog_deallocate(stale) is USE_AFTER_FREE");

  // A handle with a generation never issued, and one whose live generation
  // does not match the rest of it.
  xlog_block forged = r.fresh;
  forged.generation = r.fresh.generation + (1ull << 40);
  expect_status(xlog_block_validate(rt, forged), XLOG_ERR_USE_AFTER_FREE,
                mode + "a generation never issued is USE_AFTER_FREE");
  xlog_block resized = r.fresh;
  resized.size = kBytes / 2;
  expect_status(xlog_deallocate(rt, resized), XLOG_ERR_INVALID_ARGUMENT,
                mode + "a live generation with a different size is INVALID_ARGUMENT");

  // Nothing changed: the fresh block is live and its memory still usable.
  const xlog_stats after = stats(rt);
  check(after.live_blocks == before.live_blocks && after.live_bytes == before.live_bytes &&
            after.deallocations == before.deallocations && after.pending_bytes == before.pending_bytes,
        mode + "rejected calls changed no statistics",
        "live blocks " + str(before.live_blocks) + " -> " + str(after.live_blocks) + ", deallocations " +
            str(before.deallocations) + " -> " + str(after.deallocations));
  expect_status(xlog_block_validate(rt, r.fresh), XLOG_OK, mode + "the fresh block at the same address is live");
  // Written on its allocation stream A (the first use of a block on another
  // stream is a separate matter: ordering_test's "first use on another
  // stream"), read back on B after the recorded write.
  launch(rt, a, {use(r.fresh, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    fill_kernel<<<grid_for(kCount, 256), 256, 0, s>>>(static_cast<uint32_t*>(r.fresh.ptr), kCount, 0xabcdu);
  });
  std::vector<uint32_t> host = copy_to_host<uint32_t>(rt, r.fresh, b);
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) wrong += host[i] != static_cast<uint32_t>(i) * 40503u + 0xabcdu;
  check(wrong == 0, mode + "the fresh block is written on A and read back on B intact", str(wrong) + " elements differ");

  // Double free of the fresh block: the second is rejected.
  expect_status(xlog_deallocate(rt, r.fresh), XLOG_OK, mode + "freeing the fresh block");
  expect_status(xlog_deallocate(rt, r.fresh), XLOG_ERR_USE_AFTER_FREE, mode + "double free is USE_AFTER_FREE");

  // Freed blocks wait in the cache (cache on) or are pending (cache off).
  trim_and_drain(rt);
  xlog_stats s = stats(rt);
  check(s.live_blocks == 0 && s.pending_blocks == 0 && s.cached_bytes == 0 && s.outstanding_bytes == 0,
        mode + "every block freed, trimmed and drained",
        "live " + str(s.live_blocks) + ", pending " + str(s.pending_blocks) + ", cached " + str(s.cached_bytes));
  XLOG_OR_DIE(xlog_stream_release(rt, a.id));
  XLOG_OR_DIE(xlog_stream_release(rt, b.id));
  close_expect_no_leaks(rt, mode + "close reports no leaks");
}

}  // namespace

int main() {
  skip_without_device();
  run(true);
  run(false);
  return summary();
}
