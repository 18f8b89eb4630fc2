// Two GPUs in one process through the C ABI (docs/design.md "Several
// devices"): one runtime per device, peer access, blocks of device 0 used by
// kernels on device 1 (peer reads and writes), a free on device 0 that waits
// for device 1's reader, budgets and stats per device, and handles refused
// by the other device's runtime.
//
// Needs two CUDA devices: with fewer it prints "SKIP: ..." and exits 77
// (XLOG_REQUIRE_GPUS=2, set by scripts/gpu-multi, turns that into a failure).
// Where the two devices have no peer access (cudaDeviceCanAccessPeer = 0),
// the test checks that xlog says so (XLOG_ERR_UNSATISFIABLE_DEPENDENCY naming
// both devices) and stops there.
//
// Kernels on a device's stream run with that device current: xlog makes its
// own device's context current for its calls, so the test sets the device
// before each launch (on_device) rather than trusting what is current.

#include "test_support.cu"

using namespace xlog_test;

namespace {

constexpr size_t kCount = 1u << 18;  // 256 Ki uint32 = 1 MiB
constexpr uint64_t kBytes = kCount * sizeof(uint32_t);
constexpr uint64_t kDelay = 100 * kMs;

constexpr uint32_t kSeedOld = 0x01010101u;
constexpr uint32_t kSeedX = 0x11111111u;
constexpr uint32_t kSeedY = 0x7e7e7e7eu;
constexpr uint32_t kSeedFromDevice1 = 0x5a5a5a5au;

void on_device(int device) { CUDA_OR_DIE(cudaSetDevice(device)); }

xlog_runtime* open_device(int device, uint64_t budget_bytes) {
  xlog_config cfg;
  xlog_config_init(&cfg);
  cfg.struct_size = sizeof(xlog_config);
  cfg.backend = XLOG_BACKEND_CUDA;
  cfg.allocator = XLOG_ALLOCATOR_ASYNC;
  cfg.budget_bytes = budget_bytes;
  cfg.log_path = nullptr;
  cfg.stream_pool_size = 16;
  cfg.wait_on_pressure = 0;
  cfg.cache = 1;
  cfg.pool_release_threshold = UINT64_MAX;
  xlog_runtime* rt = nullptr;
  XLOG_OR_DIE(xlog_runtime_open(device, &cfg, &rt));
  return rt;
}

// Copy `block` (of any device) to the host on stream `s` of device `device`,
// as a tracked read through the block's runtime `owner`.
std::vector<uint32_t> read_back(xlog_runtime* owner, const xlog_block& block, const Stream& s, int device) {
  std::vector<uint32_t> host(block.size / sizeof(uint32_t));
  XLOG_OR_DIE(xlog_prepare(owner, block, s.id, XLOG_ACCESS_READ));
  on_device(device);
  CUDA_OR_DIE(cudaMemcpyAsync(host.data(), block.ptr, block.size, cudaMemcpyDeviceToHost, s.native));
  XLOG_OR_DIE(xlog_finish(owner, block, s.id, XLOG_ACCESS_READ));
  CUDA_OR_DIE(cudaStreamSynchronize(s.native));
  return host;
}

size_t mismatches(const std::vector<uint32_t>& data, uint32_t seed) {
  size_t bad = 0;
  for (size_t i = 0; i < data.size(); ++i) bad += data[i] != pattern(seed, i);
  return bad;
}

// The launch bracket on the block's runtime with a stream of `device`.
template <class Launch>
void launch_on(xlog_runtime* owner, const Stream& s, int device, const std::vector<xlog_use>& uses, Launch&& enqueue) {
  XLOG_OR_DIE(xlog_prepare_all(owner, s.id, uses.data(), uses.size()));
  on_device(device);
  enqueue(s.native);
  CUDA_OR_DIE(cudaGetLastError());
  XLOG_OR_DIE(xlog_finish_all(owner, s.id, uses.data(), uses.size()));
}

}  // namespace

int main() {
  skip_without_device();
  int count = 0;
  CUDA_OR_DIE(cudaGetDeviceCount(&count));
  if (count < 2) {
    const std::string reason = "needs 2 CUDA devices, found " + str(count);
    if (env_flag("XLOG_REQUIRE_GPUS")) die("XLOG_REQUIRE_GPUS is set: " + reason);
    std::printf("SKIP: %s\n", reason.c_str());
    return 77;
  }
  int can01 = 0, can10 = 0;
  CUDA_OR_DIE(cudaDeviceCanAccessPeer(&can01, 0, 1));
  CUDA_OR_DIE(cudaDeviceCanAccessPeer(&can10, 1, 0));
  std::printf("peer access 0->1: %d, 1->0: %d\n", can01, can10);

  const uint64_t budget0 = 64ull << 20, budget1 = 128ull << 20;
  xlog_runtime* d0 = open_device(0, budget0);
  xlog_runtime* d1 = open_device(1, budget1);
  const Stream s0 = acquire(d0), s0b = acquire(d0);
  const Stream s1 = acquire(d1);
  const unsigned threads = 256, grid = grid_for(kCount, threads);

  // Before peer access: a stream of device 1 on device 0's block is refused.
  xlog_block probe = allocate(d0, 256, s0, "probe");
  const Captured before_enable = capture(xlog_prepare(d0, probe, s1.id, XLOG_ACCESS_READ));
  expect_captured(before_enable, XLOG_ERR_UNSATISFIABLE_DEPENDENCY, "a device-1 stream before peer access is refused");
  check(before_enable.message.find("device 0") != std::string::npos &&
            before_enable.message.find("device 1") != std::string::npos,
        "the refusal names both devices", before_enable.message);

  if (!can01 || !can10) {
    expect_status(xlog_enable_peer_access(d0, d1), XLOG_ERR_UNSATISFIABLE_DEPENDENCY,
                  "enable_peer_access on a pair without peer capability is refused");
    note("devices 0 and 1 have no peer access: the cross-device checks need it and are not run");
    XLOG_OR_DIE(xlog_deallocate(d0, probe));
    close_expect_no_leaks(d0, "device 0 closes without leaks");
    close_expect_no_leaks(d1, "device 1 closes without leaks");
    return summary();
  }
  expect_status(xlog_enable_peer_access(d0, d1), XLOG_OK, "enable_peer_access(device 0, device 1)");
  expect_status(xlog_enable_peer_access(d1, d0), XLOG_OK, "enable_peer_access again (the other way) is a no-op");
  XLOG_OR_DIE(xlog_deallocate(d0, probe));

  // ---- 1. written on device 0, read by device 1 (peer read) and device 0 ----
  xlog_block x = allocate(d0, kBytes, s0, "x");
  launch_on(d0, s0, 0, {use(x, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    fill_pattern_kernel<<<grid, threads, 0, s>>>(static_cast<uint32_t*>(x.ptr), kCount, kSeedOld);
  });
  // The writer starts late: readers that do not wait for it see kSeedOld.
  launch_on(d0, s0, 0, {use(x, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    delay_kernel<<<1, 1, 0, s>>>(kDelay);
    fill_pattern_kernel<<<grid, threads, 0, s>>>(static_cast<uint32_t*>(x.ptr), kCount, kSeedX);
  });
  xlog_block out1 = allocate(d1, kBytes, s1, "out1");
  launch_on(d0, s1, 1, {use(x, XLOG_ACCESS_READ)}, [&](cudaStream_t s) {
    // Device 1's kernel reads device 0's memory through peer access; its own
    // output block is ordered on its own runtime (same stream: no wait).
    XLOG_OR_DIE(xlog_prepare(d1, out1, s1.id, XLOG_ACCESS_WRITE));
    on_device(1);
    copy_words_kernel<<<grid, threads, 0, s>>>(static_cast<const uint32_t*>(x.ptr), static_cast<uint32_t*>(out1.ptr), kCount);
  });
  XLOG_OR_DIE(xlog_finish(d1, out1, s1.id, XLOG_ACCESS_WRITE));
  xlog_block out0 = allocate(d0, kBytes, s0b, "out0");
  launch_on(d0, s0b, 0, {use(x, XLOG_ACCESS_READ), use(out0, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    copy_words_kernel<<<grid, threads, 0, s>>>(static_cast<const uint32_t*>(x.ptr), static_cast<uint32_t*>(out0.ptr), kCount);
  });
  const size_t bad1 = mismatches(read_back(d1, out1, s1, 1), kSeedX);
  const size_t bad0 = mismatches(read_back(d0, out0, s0b, 0), kSeedX);
  check(bad1 == 0, "device 1's peer read saw device 0's write", str(bad1) + " of " + str(kCount) + " elements differ");
  check(bad0 == 0, "device 0's second stream saw the write", str(bad0) + " elements differ");

  // ---- 2. freed on device 0 while device 1 still reads ----
  launch_on(d0, s1, 1, {use(x, XLOG_ACCESS_READ)}, [&](cudaStream_t s) {
    XLOG_OR_DIE(xlog_prepare(d1, out1, s1.id, XLOG_ACCESS_WRITE));
    on_device(1);
    delay_kernel<<<1, 1, 0, s>>>(kDelay);
    copy_words_kernel<<<grid, threads, 0, s>>>(static_cast<const uint32_t*>(x.ptr), static_cast<uint32_t*>(out1.ptr), kCount);
  });
  XLOG_OR_DIE(xlog_finish(d1, out1, s1.id, XLOG_ACCESS_WRITE));
  const xlog_block freed_x = x;
  XLOG_OR_DIE(xlog_deallocate(d0, x));
  xlog_block y = allocate(d0, kBytes, s0, "y");
  check(y.ptr == freed_x.ptr, "the cache hands x's memory to y on the allocation stream",
        "x at " + str(reinterpret_cast<uintptr_t>(freed_x.ptr)) + ", y at " + str(reinterpret_cast<uintptr_t>(y.ptr)));
  launch_on(d0, s0, 0, {use(y, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    fill_pattern_kernel<<<grid, threads, 0, s>>>(static_cast<uint32_t*>(y.ptr), kCount, kSeedY);
  });
  const size_t bad_after_free = mismatches(read_back(d1, out1, s1, 1), kSeedX);
  check(bad_after_free == 0, "the free on device 0 waited for device 1's reader",
        str(bad_after_free) + " elements of device 1's copy are not x's data (overwritten by y?)");
  const size_t bad_y = mismatches(read_back(d0, y, s0, 0), kSeedY);
  check(bad_y == 0, "y holds its own data", str(bad_y) + " elements differ");
  expect_status(xlog_block_validate(d0, freed_x), XLOG_ERR_USE_AFTER_FREE, "x's handle is stale on device 0");
  expect_status(xlog_prepare(d0, freed_x, s1.id, XLOG_ACCESS_READ), XLOG_ERR_USE_AFTER_FREE,
                "x's stale handle with device 1's stream is refused");

  // ---- 3. written by device 1 (peer write), read on device 0 ----
  launch_on(d0, s1, 1, {use(y, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    delay_kernel<<<1, 1, 0, s>>>(kDelay);
    fill_pattern_kernel<<<grid, threads, 0, s>>>(static_cast<uint32_t*>(y.ptr), kCount, kSeedFromDevice1);
  });
  const size_t bad_peer_write = mismatches(read_back(d0, y, s0b, 0), kSeedFromDevice1);
  check(bad_peer_write == 0, "device 0 read what device 1 wrote into its block", str(bad_peer_write) + " elements differ");

  // ---- 4. handles of one device on the other's runtime ----
  const Captured foreign = capture(xlog_deallocate(d1, y));
  expect_captured(foreign, XLOG_ERR_INVALID_ARGUMENT, "device 0's block is refused by device 1's runtime");
  check(foreign.message.find("device 0") != std::string::npos && foreign.message.find("device 1") != std::string::npos,
        "the refusal names both devices", foreign.message);
  expect_status(xlog_block_validate(d0, y), XLOG_OK, "the refused free changed nothing");

  // ---- 5. budgets and stats per device ----
  XLOG_OR_DIE(xlog_deallocate(d0, y));
  XLOG_OR_DIE(xlog_deallocate(d0, out0));
  XLOG_OR_DIE(xlog_deallocate(d1, out1));
  trim_and_drain(d0);
  trim_and_drain(d1);
  xlog_block big0 = allocate(d0, budget0, s0, "big0");
  xlog_block over{};
  expect_status(xlog_allocate(d0, 1u << 20, s0.id, "over", &over), XLOG_ERR_OUT_OF_BUDGET,
                "device 0 refuses past its own budget");
  xlog_block big1 = allocate(d1, budget1 - (1ull << 20), s1, "big1");
  const xlog_stats st0 = stats(d0), st1 = stats(d1);
  check(st0.budget_limit == budget0 && st1.budget_limit == budget1, "each device has its own budget limit",
        str(st0.budget_limit) + " / " + str(st1.budget_limit));
  check(st0.live_bytes == budget0 && st1.live_bytes == budget1 - (1ull << 20), "live bytes are counted per device",
        str(st0.live_bytes) + " / " + str(st1.live_bytes));
  check(st0.failed_allocations == 1 && st1.failed_allocations == 0, "refusals are counted per device",
        str(st0.failed_allocations) + " / " + str(st1.failed_allocations));
  XLOG_OR_DIE(xlog_deallocate(d0, big0));
  XLOG_OR_DIE(xlog_deallocate(d1, big1));

  XLOG_OR_DIE(xlog_stream_release(d0, s0.id));
  XLOG_OR_DIE(xlog_stream_release(d0, s0b.id));
  XLOG_OR_DIE(xlog_stream_release(d1, s1.id));
  close_expect_no_leaks(d0, "device 0 closes without leaks");
  close_expect_no_leaks(d1, "device 1 closes without leaks");
  return summary();
}
