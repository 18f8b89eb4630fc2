// Shared support for the CUDA kernel tests in this directory.
//
// Not a test and not compiled on its own: each test is one translation unit
// that `#include`s this file first, so every test stays a standalone program
// (plain main(), no framework) that ctest runs and compute-sanitizer wraps.
//
// Conventions every test follows:
// - Without a usable CUDA device the test prints "SKIP: no CUDA device:
//   <reason>" and exits 77 (ctest's SKIP_RETURN_CODE). XLOG_REQUIRE_GPU=1
//   turns that into a failure, for machines that must have a GPU.
// - Each check prints PASS/FAIL with the values involved; the last line is
//   "N passed, N failed"; the exit code is 0 only if nothing failed.
// - A failed CUDA or xlog call that the rest of the test depends on prints
//   FAIL and exits 1 at once: nothing after it could be trusted.
// - XLOG_UNDER_SANITIZER=1 (set by scripts/gpu-check) makes the negative
//   controls (the same launch shape WITHOUT prepare/finish, run to prove the
//   test can see the bug) report instead of assert, or not run at all where
//   the control is itself a use-after-free that memcheck would rightly
//   flag: the sanitizer runs are about the correct paths, and its tools may
//   serialize kernels, which hides the races the controls rely on.

#include <xlog_cuda.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace xlog_test {

// ---------------------------------------------------------------------------
// Reporting

inline int g_passed = 0;
inline int g_failed = 0;

inline void check(bool ok, const std::string& name, const std::string& detail = "") {
  if (ok) {
    ++g_passed;
    std::printf("PASS: %s\n", name.c_str());
  } else {
    ++g_failed;
    std::printf("FAIL: %s%s%s\n", name.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  }
  std::fflush(stdout);
}

inline void note(const std::string& text) {
  std::printf("NOTE: %s\n", text.c_str());
  std::fflush(stdout);
}

inline int summary() {
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  std::fflush(stdout);
  return g_failed == 0 ? 0 : 1;
}

[[noreturn]] inline void die(const std::string& what) {
  ++g_failed;
  std::printf("FAIL: %s\n", what.c_str());
  summary();
  std::exit(1);
}

inline std::string str(unsigned long long value) { return std::to_string(value); }

inline bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

inline bool under_sanitizer() { return env_flag("XLOG_UNDER_SANITIZER"); }

// The compute-sanitizer tool running us, as scripts/gpu-check announces it
// in XLOG_SANITIZER_TOOL ("memcheck", "racecheck", ...); empty otherwise.
inline std::string sanitizer_tool() {
  const char* tool = std::getenv("XLOG_SANITIZER_TOOL");
  return tool == nullptr ? "" : tool;
}

// Progress lines for locating a hang (XLOG_TEST_TRACE=1); silent otherwise.
inline void trace(const char* step) {
  static const bool enabled = env_flag("XLOG_TEST_TRACE");
  if (!enabled) return;
  std::printf("trace: %s\n", step);
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// CUDA runtime and xlog call checking

inline void cuda_or_die(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  die(std::string(what) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}
#define CUDA_OR_DIE(expr) ::xlog_test::cuda_or_die((expr), #expr)

// This thread's last xlog error message.
inline std::string last_message() {
  size_t length = xlog_last_error_message(nullptr, 0);
  std::string text(length + 1, '\0');
  xlog_last_error_message(&text[0], text.size());
  text.resize(length);
  return text;
}

inline std::string describe(xlog_status status) {
  std::string text = xlog_status_name(status);
  if (status != XLOG_OK) text += ": " + last_message();
  return text;
}

inline void xlog_or_die(xlog_status status, const char* what) {
  if (status == XLOG_OK) return;
  die(std::string(what) + " -> " + describe(status));
}
#define XLOG_OR_DIE(expr) ::xlog_test::xlog_or_die((expr), #expr)

// A status together with the message this thread had right after the call
// (the next xlog call replaces or clears it).
struct Captured {
  xlog_status status = XLOG_OK;
  std::string message;
};

inline Captured capture(xlog_status status) { return Captured{status, status == XLOG_OK ? "" : last_message()}; }

// Check that a captured status is exactly `expected`; for an error status
// also that a message was left for this thread.
inline void expect_captured(const Captured& got, xlog_status expected, const std::string& name) {
  bool ok = got.status == expected;
  std::string detail = std::string("got ") + xlog_status_name(got.status) +
                       (got.message.empty() ? "" : ": " + got.message) + ", expected " + xlog_status_name(expected);
  if (ok && expected != XLOG_OK && got.message.empty()) {
    ok = false;
    detail = "status right but xlog_last_error_message was empty right after the call";
  }
  check(ok, name, ok ? "" : detail);
}

// Check a status just returned (this thread's message is still current).
inline void expect_status(xlog_status status, xlog_status expected, const std::string& name) {
  expect_captured(capture(status), expected, name);
}

// ---------------------------------------------------------------------------
// Device discovery: skip (77) when there is no usable device. Every test
// calls this first, before any other CUDA or xlog call.

inline void skip_without_device() {
  // Load every kernel when CUDA initialises, not at its first launch: with
  // lazy loading (the default since CUDA 12.2) a first launch may have to
  // wait for the kernels already running, which silently serializes the
  // very overlaps these tests build. Must happen before the first CUDA call;
  // a value set by the caller wins.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  std::string reason;
  if (status != cudaSuccess) {
    reason = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(status) + " (" +
             cudaGetErrorString(status) + ")";
  } else if (count == 0) {
    reason = "cudaGetDeviceCount reports 0 devices";
  }
  if (reason.empty()) {
    cudaDeviceProp prop{};
    CUDA_OR_DIE(cudaGetDeviceProperties(&prop, 0));
    std::printf("device 0: %s (sm_%d%d), %d device(s); xlog %s\n", prop.name, prop.major, prop.minor,
                count, xlog_version());
    std::fflush(stdout);
    return;
  }
  if (env_flag("XLOG_REQUIRE_GPU")) die("XLOG_REQUIRE_GPU is set but there is no CUDA device: " + reason);
  std::printf("SKIP: no CUDA device: %s\n", reason.c_str());
  std::fflush(stdout);
  std::exit(77);
}

// ---------------------------------------------------------------------------
// Runtime and streams

// Open device 0 on the CUDA backend with the default async stack (the
// per-stream cache on unless `cache` is false: `cache = 0` is the seed's
// free-to-driver behaviour, where a free is pending until a reap sees it
// complete). Every field that matters is set explicitly, so XLOG_*
// variables in the environment cannot change what a test runs against.
// Where open_cuda's memory comes from: the arena (the default) unless a
// test whose byte counts are the driver pool's says XLOG_MEMORY_POOL.
inline uint8_t g_test_memory = XLOG_MEMORY_ARENA;

inline xlog_runtime* open_cuda(uint64_t budget_bytes = 0, bool wait_on_pressure = false, bool cache = true) {
  xlog_config cfg;
  xlog_config_init(&cfg);
  cfg.struct_size = sizeof(xlog_config);  // a malformed XLOG_* must not matter here
  cfg.backend = XLOG_BACKEND_CUDA;
  cfg.allocator = XLOG_ALLOCATOR_ASYNC;
  cfg.budget_bytes = budget_bytes;
  cfg.log_path = nullptr;
  cfg.stream_pool_size = 16;
  cfg.wait_on_pressure = wait_on_pressure ? 1 : 0;
  cfg.cache = cache ? 1 : 0;
  cfg.pool_release_threshold = UINT64_MAX;
  cfg.memory = g_test_memory;
  xlog_runtime* rt = nullptr;
  XLOG_OR_DIE(xlog_runtime_open(0, &cfg, &rt));
  xlog_backend backend = 0;
  XLOG_OR_DIE(xlog_runtime_backend(rt, &backend));
  if (backend != XLOG_BACKEND_CUDA) die("runtime opened with XLOG_BACKEND_CUDA reports backend " + str(backend));
  return rt;
}

// Give every cached block back to the driver (xlog_trim waits for those
// frees and retires them), then retire any other pending free: afterwards
// xlog holds only what is live. Returns the cached bytes trim handed back.
inline uint64_t trim_and_drain(xlog_runtime* rt) {
  uint64_t released = 0;
  XLOG_OR_DIE(xlog_trim(rt, 0, &released));
  XLOG_OR_DIE(xlog_drain(rt, nullptr));
  return released;
}

inline void close_expect_no_leaks(xlog_runtime* rt, const std::string& name) {
  uint64_t leaked_blocks = 0, leaked_bytes = 0;
  xlog_status status = xlog_runtime_close_report(rt, &leaked_blocks, &leaked_bytes);
  check(status == XLOG_OK && leaked_blocks == 0 && leaked_bytes == 0, name,
        describe(status) + ", leaked " + str(leaked_blocks) + " blocks / " + str(leaked_bytes) + " bytes");
}

// One xlog stream and the cudaStream_t behind it.
struct Stream {
  xlog_stream id = 0;
  cudaStream_t native = nullptr;
};

inline Stream acquire(xlog_runtime* rt) {
  Stream s;
  XLOG_OR_DIE(xlog_stream_acquire(rt, &s.id));
  void* native = nullptr;
  XLOG_OR_DIE(xlog_stream_native(rt, s.id, &native));
  if (native == nullptr) die("xlog_stream_native returned the legacy default stream for a pooled stream");
  s.native = static_cast<cudaStream_t>(native);
  return s;
}

inline xlog_stats stats(xlog_runtime* rt) {
  xlog_stats s{};
  s.struct_size = sizeof s;
  XLOG_OR_DIE(xlog_get_stats(rt, &s));
  return s;
}

inline xlog_block allocate(xlog_runtime* rt, uint64_t bytes, const Stream& s, const char* tag) {
  xlog_block b{};
  XLOG_OR_DIE(xlog_allocate(rt, bytes, s.id, tag, &b));
  return b;
}

inline xlog_use use(const xlog_block& block, xlog_access access) {
  xlog_use u{};
  u.block = block;
  u.access = access;
  return u;
}

// The recorded-launch bracket: prepare_all, the caller's launches, finish_all.
template <class Launch>
void launch(xlog_runtime* rt, const Stream& s, const std::vector<xlog_use>& uses, Launch&& enqueue) {
  XLOG_OR_DIE(xlog_prepare_all(rt, s.id, uses.data(), uses.size()));
  enqueue(s.native);
  CUDA_OR_DIE(cudaGetLastError());
  XLOG_OR_DIE(xlog_finish_all(rt, s.id, uses.data(), uses.size()));
}

// Copy a block back to the host in stream order on `s`, as a tracked read.
template <class T>
std::vector<T> copy_to_host(xlog_runtime* rt, const xlog_block& block, const Stream& s) {
  std::vector<T> host(block.size / sizeof(T));
  XLOG_OR_DIE(xlog_prepare(rt, block, s.id, XLOG_ACCESS_READ));
  CUDA_OR_DIE(cudaMemcpyAsync(host.data(), block.ptr, host.size() * sizeof(T), cudaMemcpyDeviceToHost, s.native));
  XLOG_OR_DIE(xlog_finish(rt, block, s.id, XLOG_ACCESS_READ));
  CUDA_OR_DIE(cudaStreamSynchronize(s.native));
  return host;
}

inline double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

// Page-locked host memory that kernels write directly (UVA), for probes:
// values and timestamps a kernel reports without a copy on any stream.
template <class T>
struct HostProbe {
  T* ptr = nullptr;
  explicit HostProbe(size_t count = 1) {
    CUDA_OR_DIE(cudaHostAlloc(reinterpret_cast<void**>(&ptr), count * sizeof(T), cudaHostAllocMapped));
    std::memset(static_cast<void*>(ptr), 0, count * sizeof(T));
  }
  ~HostProbe() { cudaFreeHost(ptr); }
  HostProbe(const HostProbe&) = delete;
  HostProbe& operator=(const HostProbe&) = delete;
  T& operator[](size_t i) { return ptr[i]; }
};

// ---------------------------------------------------------------------------
// Device helpers

// Nanoseconds from the GPU's global timer: comparable across streams and
// kernels, unlike clock64(), which counts per-SM cycles.
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Busy-wait for `ns` of wall time. Time-based rather than a cycle count, so
// instrumentation (compute-sanitizer) makes it no longer than asked.
__device__ __forceinline__ void spin_for(uint64_t ns) {
  const uint64_t start = global_ns();
  while (global_ns() - start < ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(1000);
#endif
  }
}

// A one-thread kernel that only occupies its stream for `ns`: put in front of
// a launch on the same stream to make that launch start late.
__global__ void delay_kernel(uint64_t ns) { spin_for(ns); }

// Write the global time into *out: a timestamp in stream order.
__global__ void timestamp_kernel(unsigned long long* out) {
  *out = global_ns();
  __threadfence_system();
}

constexpr uint64_t kMs = 1000ull * 1000ull;  // nanoseconds per millisecond

inline unsigned grid_for(size_t count, unsigned block) {
  size_t grid = (count + block - 1) / block;
  return static_cast<unsigned>(grid < 1024 ? (grid == 0 ? 1 : grid) : 1024);
}

// A word pattern that differs per seed and per index, so a reader can tell
// whose data it sees; kernels that fill it and copy it word by word.
__host__ __device__ inline uint32_t pattern(uint32_t seed, size_t i) {
  return static_cast<uint32_t>(i) * 2654435761u ^ seed;
}

__global__ void fill_pattern_kernel(uint32_t* data, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    data[i] = pattern(seed, i);
  }
}

__global__ void copy_words_kernel(const uint32_t* from, uint32_t* to, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    to[i] = from[i];
  }
}

}  // namespace xlog_test
