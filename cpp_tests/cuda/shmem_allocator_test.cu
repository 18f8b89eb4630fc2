// Device tests of xlog::ShmemAllocator (include/xlog/shmem_allocator.cuh) and
// of its agreement with the host planner xlog::ShmemPlan.
//
// A plain executable (no test framework): each check prints PASS/FAIL, the
// last line is "N passed, N failed", and the exit code is 0 only if every
// check passed. Without a usable CUDA device it prints "SKIP: no CUDA device:
// <reason>" and exits 77 (register it with ctest's SKIP_RETURN_CODE 77); set
// XLOG_REQUIRE_GPU=1 to turn that into a failure on machines that must have a
// GPU.
//
// The kernels record what the allocator returned into global memory; every
// verdict is reached on the host.

// The overflow and misuse checks need nullptr / flags, not a device assert
// (which would abort the kernel), so these are set even in debug builds.
#define XLOG_SHMEM_NO_OVERFLOW_ASSERT
#define XLOG_SHMEM_NO_LIFO_ASSERT
#include <xlog/shmem_allocator.cuh>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// ---------------------------------------------------------------------------
// Reporting

int g_passed = 0;
int g_failed = 0;

void check(bool ok, const std::string& name, const std::string& detail = "") {
  if (ok) {
    ++g_passed;
    std::printf("PASS: %s\n", name.c_str());
  } else {
    ++g_failed;
    std::printf("FAIL: %s%s%s\n", name.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  }
  std::fflush(stdout);
}

std::string str(unsigned long long value) { return std::to_string(value); }

// A CUDA API failure leaves nothing trustworthy to check: report and stop.
void cuda_or_die(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  ++g_failed;
  std::printf("FAIL: %s: %s (%s)\n", what, cudaGetErrorString(status), cudaGetErrorName(status));
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  std::exit(1);
}
#define CUDA_OR_DIE(expr) cuda_or_die((expr), #expr)

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(std::size_t count) {
    CUDA_OR_DIE(cudaMalloc(&ptr, count * sizeof(T)));
    CUDA_OR_DIE(cudaMemset(ptr, 0xFF, count * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

template <class T>
std::vector<T> to_host(const T* device, std::size_t count) {
  std::vector<T> host(count);
  CUDA_OR_DIE(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// ---------------------------------------------------------------------------
// Scripted allocator runs: the host writes a sequence of steps, every thread
// of the block replays it on its own register allocator, and each thread
// records every result.

enum StepKind : std::uint32_t {
  kAlloc,         // alloc(amount, alignment)
  kDealloc,       // dealloc(amount)
  kAllocF32,      // alloc<float>(amount)
  kDeallocF32,    // dealloc<float>(amount)
  kAllocF64,      // alloc<double>(amount)
  kDeallocF64,    // dealloc<double>(amount)
  kAllocU8,       // alloc<uint8_t>(amount)
  kAllocI16,      // alloc<int16_t>(amount)
  kAllocU64,      // alloc<uint64_t>(amount)
};

struct Step {
  StepKind kind;
  std::uint32_t amount;     // bytes, or element count for typed kinds
  std::uint32_t alignment;  // kAlloc only
};

constexpr std::uint32_t kNoOffset = 0xFFFFFFFFu;  // a dealloc, or alloc returned nullptr

struct StepResult {
  std::uint32_t offset;           // from the dynamic base; kNoOffset if none
  std::uint32_t shared_address;   // of the returned block (0 if none)
  unsigned long long generic;     // generic address of the returned block (0 if none)
  std::uint32_t allocated_after;  // get_allocated_size_bytes() after the step
  std::uint32_t padding_;
};

struct LaunchInfo {
  std::uint32_t base_shared_address;
  std::uint32_t max_size_bytes;
  std::uint32_t allocated_at_start;
  std::uint32_t static_shared_address;  // kWithStaticShared only
  std::uint32_t static_checksum;        // keeps the static array alive
};

bool is_alloc(StepKind kind) {
  return kind == kAlloc || kind == kAllocF32 || kind == kAllocF64 || kind == kAllocU8 ||
         kind == kAllocI16 || kind == kAllocU64;
}

__device__ char* apply_step(xlog::ShmemAllocator& shmem, const Step& step) {
  switch (step.kind) {
    case kAlloc: return shmem.alloc(step.amount, step.alignment);
    case kDealloc: shmem.dealloc(step.amount); return nullptr;
    case kAllocF32: return reinterpret_cast<char*>(shmem.alloc<float>(step.amount));
    case kDeallocF32: shmem.dealloc<float>(step.amount); return nullptr;
    case kAllocF64: return reinterpret_cast<char*>(shmem.alloc<double>(step.amount));
    case kDeallocF64: shmem.dealloc<double>(step.amount); return nullptr;
    case kAllocU8: return reinterpret_cast<char*>(shmem.alloc<std::uint8_t>(step.amount));
    case kAllocI16: return reinterpret_cast<char*>(shmem.alloc<std::int16_t>(step.amount));
    case kAllocU64: return reinterpret_cast<char*>(shmem.alloc<std::uint64_t>(step.amount));
  }
  return nullptr;
}

template <bool kWithStaticShared>
__global__ void script_kernel(const Step* steps, int num_steps, StepResult* results,
                              LaunchInfo* info) {
  if constexpr (kWithStaticShared) {
    // Static shared memory of an odd size sits before the dynamic base and
    // must not break its 16-byte alignment.
    __shared__ char static_pad[13];
    if (threadIdx.x < 13) static_pad[threadIdx.x] = static_cast<char>(threadIdx.x + 1);
    __syncthreads();
    if (threadIdx.x == 0) {
      info->static_shared_address =
          static_cast<std::uint32_t>(__cvta_generic_to_shared(static_pad));
      info->static_checksum = static_cast<std::uint32_t>(static_pad[0] + static_pad[12]);
    }
  }
  xlog::ShmemAllocator shmem;
  if (threadIdx.x == 0) {
    info->base_shared_address = shmem.base_shared_address();
    info->max_size_bytes = shmem.get_max_size_bytes();
    info->allocated_at_start = shmem.get_allocated_size_bytes();
  }
  for (int i = 0; i < num_steps; ++i) {
    const Step step = steps[i];
    char* block = apply_step(shmem, step);
    StepResult result{};
    result.offset = block ? static_cast<std::uint32_t>(block - shmem.base()) : kNoOffset;
    result.shared_address = block ? static_cast<std::uint32_t>(__cvta_generic_to_shared(block)) : 0;
    result.generic = reinterpret_cast<unsigned long long>(block);
    result.allocated_after = shmem.get_allocated_size_bytes();
    results[threadIdx.x * num_steps + i] = result;
  }
}

struct ScriptRun {
  std::vector<StepResult> results;  // thread 0's, one per step
  LaunchInfo info{};
  bool threads_agree = true;
};

constexpr int kScriptThreads = 64;

// Opting in is needed past 48 KiB (static + dynamic); setting it for every
// launch keeps debug builds (-G), whose static shared memory differs, working.
template <class Kernel>
void allow_dynamic_bytes(Kernel kernel, std::uint32_t dynamic_bytes) {
  CUDA_OR_DIE(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(dynamic_bytes)));
}

// The largest dynamic size a launch of `kernel` can ask for.
template <class Kernel>
std::uint32_t max_dynamic_bytes(Kernel kernel, int max_optin_bytes) {
  cudaFuncAttributes attributes{};
  CUDA_OR_DIE(cudaFuncGetAttributes(&attributes, kernel));
  return static_cast<std::uint32_t>(max_optin_bytes) -
         static_cast<std::uint32_t>(attributes.sharedSizeBytes);
}

ScriptRun run_script(const std::vector<Step>& steps, std::uint32_t dynamic_bytes,
                     bool with_static_shared = false) {
  const int num_steps = static_cast<int>(steps.size());
  DeviceBuffer<Step> device_steps(steps.size());
  DeviceBuffer<StepResult> device_results(steps.size() * kScriptThreads);
  DeviceBuffer<LaunchInfo> device_info(1);
  CUDA_OR_DIE(cudaMemcpy(device_steps.ptr, steps.data(), steps.size() * sizeof(Step),
                         cudaMemcpyHostToDevice));
  if (with_static_shared) {
    allow_dynamic_bytes(script_kernel<true>, dynamic_bytes);
    script_kernel<true><<<1, kScriptThreads, dynamic_bytes>>>(device_steps.ptr, num_steps,
                                                               device_results.ptr,
                                                               device_info.ptr);
  } else {
    allow_dynamic_bytes(script_kernel<false>, dynamic_bytes);
    script_kernel<false><<<1, kScriptThreads, dynamic_bytes>>>(device_steps.ptr, num_steps,
                                                                device_results.ptr,
                                                                device_info.ptr);
  }
  CUDA_OR_DIE(cudaGetLastError());
  CUDA_OR_DIE(cudaDeviceSynchronize());

  const std::vector<StepResult> all = to_host(device_results.ptr, steps.size() * kScriptThreads);
  ScriptRun run;
  run.info = to_host(device_info.ptr, 1)[0];
  run.results.assign(all.begin(), all.begin() + num_steps);
  for (int t = 1; t < kScriptThreads; ++t) {
    for (int i = 0; i < num_steps; ++i) {
      const StepResult& mine = all[t * num_steps + i];
      const StepResult& first = run.results[i];
      if (mine.offset != first.offset || mine.generic != first.generic ||
          mine.allocated_after != first.allocated_after) {
        run.threads_agree = false;
      }
    }
  }
  return run;
}

// Replays a script on a plan; returns the planned offset of each step
// (kShmemPlanInvalidOffset for deallocs).
std::vector<std::uint64_t> replay(const std::vector<Step>& steps, xlog::ShmemPlan& plan) {
  std::vector<std::uint64_t> offsets;
  for (const Step& step : steps) {
    std::uint64_t offset = xlog::kShmemPlanInvalidOffset;
    switch (step.kind) {
      case kAlloc: offset = plan.add_bytes(step.amount, step.alignment); break;
      case kDealloc: plan.release_bytes(step.amount); break;
      case kAllocF32: offset = plan.add<float>(step.amount); break;
      case kDeallocF32: plan.release<float>(step.amount); break;
      case kAllocF64: offset = plan.add<double>(step.amount); break;
      case kDeallocF64: plan.release<double>(step.amount); break;
      case kAllocU8: offset = plan.add<std::uint8_t>(step.amount); break;
      case kAllocI16: offset = plan.add<std::int16_t>(step.amount); break;
      case kAllocU64: offset = plan.add<std::uint64_t>(step.amount); break;
    }
    offsets.push_back(offset);
  }
  return offsets;
}

std::uint32_t step_alignment(const Step& step) {
  return step.kind == kAlloc ? step.alignment : xlog::kShmemDefaultAlignment;
}

std::uint64_t step_bytes(const Step& step) {
  switch (step.kind) {
    case kAlloc: case kDealloc: case kAllocU8: return step.amount;
    case kAllocF32: case kDeallocF32: return std::uint64_t{step.amount} * 4;
    case kAllocF64: case kDeallocF64: case kAllocU64: return std::uint64_t{step.amount} * 8;
    case kAllocI16: return std::uint64_t{step.amount} * 2;
  }
  return 0;
}

std::uint32_t device_peak(const ScriptRun& run) {
  std::uint32_t peak = 0;
  for (const StepResult& r : run.results) peak = r.allocated_after > peak ? r.allocated_after : peak;
  return peak;
}

// Checks every successful allocation of a run: aligned in the shared window
// and in the generic address space, inside the launch, not overlapping the
// block allocated before it.
void check_alignment_of(const std::string& name, const std::vector<Step>& steps,
                        const ScriptRun& run) {
  std::string problems;
  std::uint64_t previous_end = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    const StepResult& r = run.results[i];
    if (!is_alloc(step.kind)) {
      previous_end = r.allocated_after;
      continue;
    }
    if (r.offset == kNoOffset) {
      problems += " step " + str(i) + " returned nullptr;";
      continue;
    }
    const std::uint32_t alignment = step_alignment(step);
    if (r.shared_address % alignment != 0) {
      problems += " step " + str(i) + " shared address " + str(r.shared_address) +
                  " not " + str(alignment) + "-aligned;";
    }
    if (r.generic % alignment != 0) {
      problems += " step " + str(i) + " generic address not " + str(alignment) + "-aligned;";
    }
    if (r.offset < previous_end) problems += " step " + str(i) + " overlaps the previous block;";
    if (r.offset + step_bytes(step) > run.info.max_size_bytes) {
      problems += " step " + str(i) + " ends past the launch;";
    }
    if (r.allocated_after != r.offset + step_bytes(step)) {
      problems += " step " + str(i) + " allocated size " + str(r.allocated_after) +
                  " != offset + size;";
    }
    previous_end = r.allocated_after;
  }
  check(problems.empty(), name, problems);
}

// Compares a device run with the planner: the exact replay for this launch's
// base must match offsets and allocated sizes step by step; the default
// (base-agnostic) plan must match exactly when it says it is exact and bound
// the device otherwise.
void check_planner_agrees(const std::string& name, const std::vector<Step>& steps,
                          const ScriptRun& run) {
  xlog::ShmemPlan exact = xlog::ShmemPlan::for_base_address(run.info.base_shared_address);
  xlog::ShmemPlan bound;
  const std::vector<std::uint64_t> exact_offsets = replay(steps, exact);
  const std::vector<std::uint64_t> bound_offsets = replay(steps, bound);

  std::string exact_problems;
  std::string bound_problems;
  xlog::ShmemPlan exact_prefix = xlog::ShmemPlan::for_base_address(run.info.base_shared_address);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const StepResult& r = run.results[i];
    replay({steps[i]}, exact_prefix);
    if (exact_prefix.current_bytes() != r.allocated_after) {
      exact_problems += " step " + str(i) + " allocated " + str(r.allocated_after) + " vs plan " +
                        str(exact_prefix.current_bytes()) + ";";
    }
    if (!is_alloc(steps[i].kind)) continue;
    if (exact_offsets[i] != r.offset) {
      exact_problems += " step " + str(i) + " device offset " + str(r.offset) + " vs plan " +
                        str(exact_offsets[i]) + ";";
    }
    if (bound.is_exact() ? bound_offsets[i] != r.offset : bound_offsets[i] < r.offset) {
      bound_problems += " step " + str(i) + " device offset " + str(r.offset) +
                        " vs default plan " + str(bound_offsets[i]) + ";";
    }
  }
  if (exact.bytes() != device_peak(run)) {
    exact_problems += " peak " + str(device_peak(run)) + " vs plan " + str(exact.bytes());
  }
  if (bound.is_exact() ? bound.bytes() != device_peak(run) : bound.bytes() < device_peak(run)) {
    bound_problems += " peak " + str(device_peak(run)) + " vs default plan " + str(bound.bytes());
  }
  check(exact.ok() && exact_problems.empty(), name + ": exact replay for base " +
                                                  str(run.info.base_shared_address),
        exact_problems);
  check(bound.ok() && bound_problems.empty(),
        name + (bound.is_exact() ? ": default plan equals device"
                                 : ": default plan bounds device (alignment > 16)"),
        bound_problems);
}

// ---------------------------------------------------------------------------
// Tests

void test_max_size(int max_optin_bytes) {
  const std::uint32_t largest = max_dynamic_bytes(script_kernel<false>, max_optin_bytes);
  std::vector<std::uint32_t> sizes = {0, 16, 1000, 4096, 48 * 1024};
  if (largest > 100 * 1024) sizes.push_back(100 * 1024);
  if (largest > 48 * 1024) sizes.push_back(largest);
  const std::vector<Step> no_steps = {{kAlloc, 0, 1}};
  for (std::uint32_t size : sizes) {
    const ScriptRun run = run_script(no_steps, size);
    check(run.info.max_size_bytes == size,
          "get_max_size_bytes() == launch dynamic bytes " + str(size),
          "device reported " + str(run.info.max_size_bytes));
    check(run.info.allocated_at_start == 0, "fresh allocator has 0 bytes allocated (" + str(size) + ")",
          str(run.info.allocated_at_start));
    check(run.info.base_shared_address % xlog::kShmemBaseAlignment == 0,
          "dynamic base is 16-byte aligned (" + str(size) + ")",
          "base " + str(run.info.base_shared_address));
  }
}

void test_alignment() {
  const std::vector<Step> steps = {
      {kAlloc, 1, 1},    {kAlloc, 3, 8},    {kAlloc, 5, 16},   {kAlloc, 7, 64},
      {kAlloc, 9, 128},  {kAlloc, 2, 8},    {kAlloc, 1, 128},  {kAlloc, 10, 16},
      {kAlloc, 3, 256},  {kAlloc, 1, 1024}, {kAlloc, 17, 64},  {kAlloc, 5, 8},
  };
  for (bool with_static : {false, true}) {
    const std::string label = with_static ? " (with static shared memory)" : "";
    const ScriptRun run = run_script(steps, 8192, with_static);
    check(run.threads_agree, "all threads get the same pointers" + label);
    check(run.info.base_shared_address % 16 == 0, "dynamic base 16-byte aligned" + label,
          "base " + str(run.info.base_shared_address));
    if (with_static) {
      check(run.info.static_checksum == 14 &&
                run.info.static_shared_address + 13 <= run.info.base_shared_address,
            "static shared memory lies before the dynamic base",
            "static at " + str(run.info.static_shared_address) + ", dynamic base at " +
                str(run.info.base_shared_address));
    }
    check_alignment_of("alignments 1/8/16/64/128/256/1024 honoured" + label, steps, run);
    check_planner_agrees("alignment sequence" + label, steps, run);
  }
}

void test_overflow() {
  const std::vector<Step> steps = {
      {kAlloc, 200, 8},          // 0: fits
      {kAlloc, 100, 8},          // 1: 300 > 256 -> nullptr
      {kAlloc, 56, 8},           // 2: exactly fills 256
      {kAlloc, 0, 8},            // 3: zero bytes at the end still fits
      {kAlloc, 1, 1},            // 4: nothing left -> nullptr
      {kAllocU64, 0x40000000u, 0},  // 5: 8 GiB, product overflows 32 bits -> nullptr
      {kAlloc, 4, 3},            // 6: alignment not a power of two -> nullptr
      {kAlloc, 4, 0},            // 7: alignment 0 -> nullptr
      {kDealloc, 0, 0},          // 8: LIFO: the zero-byte block of step 3 first
      {kDealloc, 56, 0},         // 9
      {kAlloc, 57, 8},           // 10: one byte too many -> nullptr
      {kAlloc, 56, 8},           // 11: fits again, same block as step 2
  };
  const ScriptRun run = run_script(steps, 256);
  const std::vector<StepResult>& r = run.results;
  check(run.threads_agree, "overflow: all threads agree");
  check(r[0].offset == 0 && r[0].allocated_after == 200, "overflow: first block fits");
  check(r[1].offset == kNoOffset && r[1].allocated_after == 200,
        "overflow: alloc past the end returns nullptr and changes nothing",
        "offset " + str(r[1].offset) + " allocated " + str(r[1].allocated_after));
  check(r[2].offset == 200 && r[2].allocated_after == 256, "overflow: exact fill succeeds");
  check(r[3].offset == 256 && r[3].allocated_after == 256,
        "overflow: zero-byte alloc at the end returns the end position");
  check(r[4].offset == kNoOffset && r[4].allocated_after == 256,
        "overflow: one byte past a full launch returns nullptr");
  check(r[5].offset == kNoOffset && r[5].allocated_after == 256,
        "overflow: alloc<uint64_t> whose size overflows 32 bits returns nullptr");
  check(r[6].offset == kNoOffset && r[7].offset == kNoOffset && r[7].allocated_after == 256,
        "overflow: non-power-of-two alignments return nullptr");
  check(r[10].offset == kNoOffset && r[10].allocated_after == 200,
        "overflow: after dealloc, one byte too many still fails");
  check(r[11].offset == r[2].offset, "overflow: after dealloc the block is reusable");

  const std::vector<Step> zero_launch = {{kAlloc, 1, 1}, {kAlloc, 0, 8}};
  const ScriptRun empty = run_script(zero_launch, 0);
  check(empty.info.max_size_bytes == 0 && empty.results[0].offset == kNoOffset &&
            empty.results[1].offset == 0 && empty.results[1].allocated_after == 0,
        "overflow: launch without dynamic memory: alloc(1) fails, alloc(0) returns the base");
}

void test_typed() {
  const std::vector<Step> steps = {
      {kAllocF32, 10, 0}, {kAllocF64, 3, 0},  {kAllocU8, 5, 0},   {kAllocI16, 3, 0},
      {kAllocF32, 0, 0},  {kAllocF64, 1, 0},  {kDeallocF64, 1, 0}, {kDeallocF32, 0, 0},
      {kAllocU64, 2, 0},
  };
  const ScriptRun run = run_script(steps, 1024);
  check(run.threads_agree, "typed: all threads agree");
  check_alignment_of("typed alloc<T>: 8-byte aligned, sizeof(T) * count bytes", steps, run);
  check_planner_agrees("typed sequence", steps, run);
  const std::vector<StepResult>& r = run.results;
  check(r[0].offset == 0 && r[0].allocated_after == 40 && r[1].offset == 40 &&
            r[1].allocated_after == 64 && r[2].offset == 64 && r[3].offset == 72 &&
            r[3].allocated_after == 78,
        "typed: offsets 0/40/64/72 for float[10], double[3], uint8_t[5], int16_t[3]");
  check(r[6].allocated_after == 80 && r[8].offset == 80,
        "typed: dealloc<double>(1) rewinds 8 bytes and the next block reuses them");
}

void test_lifo_reuse() {
  const std::vector<Step> steps = {
      {kAlloc, 100, 16},   // 0: a
      {kDealloc, 100, 0},  // 1
      {kAlloc, 100, 16},   // 2: a again
      {kAlloc, 50, 128},   // 3: b, after padding up to a 128-byte boundary
      {kDealloc, 50, 0},   // 4
      {kAlloc, 50, 128},   // 5: b again
      {kDealloc, 50, 0},   // 6
      {kDealloc, 100, 0},  // 7: everything released
      {kAlloc, 8, 8},      // 8: c
      {kDealloc, 8, 0},    // 9
      {kAlloc, 8, 8},      // 10: c again
  };
  const ScriptRun run = run_script(steps, 4096);
  const std::vector<StepResult>& r = run.results;
  check(run.threads_agree, "LIFO: all threads agree");
  check(r[1].allocated_after == 0 && r[2].generic == r[0].generic,
        "LIFO: dealloc then alloc returns the same pointer");
  check(r[4].allocated_after == r[3].offset && r[5].generic == r[3].generic,
        "LIFO: dealloc then alloc (128-aligned) returns the same pointer");
  check(r[10].generic == r[8].generic, "LIFO: same pointer after padding was left behind");
  // dealloc rewinds by the block size only (the seed's contract): the padding
  // skipped before b is not given back when everything is released.
  check(r[7].allocated_after == r[3].offset - 100,
        "LIFO: releasing everything leaves only the padding before b consumed",
        str(r[7].allocated_after) + " vs " + str(r[3].offset - 100));
  check_planner_agrees("LIFO sequence", steps, run);
}

void test_planner_sizes_launch() {
  // Alignments <= 16: the default plan is exact, so its bytes() is the
  // smallest launch that works and one byte less must fail.
  const std::vector<Step> small = {
      {kAllocF32, 33, 0}, {kAlloc, 7, 16}, {kAllocU8, 3, 0}, {kDealloc, 3, 0},
      {kAlloc, 20, 4},    {kAllocF64, 5, 0}, {kDeallocF64, 5, 0}, {kDealloc, 20, 0},
      {kAlloc, 64, 16},   {kAllocI16, 9, 0},
  };
  xlog::ShmemPlan small_plan;
  replay(small, small_plan);
  check(small_plan.ok() && small_plan.is_exact(), "planner: small-alignment plan is exact");
  const auto small_bytes = static_cast<std::uint32_t>(small_plan.bytes());
  const ScriptRun fits = run_script(small, small_bytes);
  bool all_fit = true;
  for (std::size_t i = 0; i < small.size(); ++i) {
    if (is_alloc(small[i].kind) && fits.results[i].offset == kNoOffset) all_fit = false;
  }
  check(all_fit, "planner: launch with plan.bytes() = " + str(small_bytes) + " satisfies every alloc");
  check_planner_agrees("planner small-alignment sequence", small, fits);
  const ScriptRun tight = run_script(small, small_bytes - 1);
  bool one_failed = false;
  for (std::size_t i = 0; i < small.size(); ++i) {
    if (is_alloc(small[i].kind) && tight.results[i].offset == kNoOffset) one_failed = true;
  }
  check(one_failed, "planner: plan.bytes() - 1 is too small (the plan is tight)");

  // Mixed alignments: the default plan is an upper bound that still suffices,
  // with and without static shared memory moving the base.
  const std::vector<Step> mixed = {
      {kAlloc, 12, 4},   {kAlloc, 300, 128}, {kAllocF32, 7, 0}, {kAlloc, 64, 64},
      {kDealloc, 64, 0}, {kAlloc, 64, 64},   {kAlloc, 5, 512},  {kAllocF64, 3, 0},
  };
  xlog::ShmemPlan mixed_plan;
  replay(mixed, mixed_plan);
  for (bool with_static : {false, true}) {
    const std::string label = with_static ? " (with static shared memory)" : "";
    const ScriptRun run =
        run_script(mixed, static_cast<std::uint32_t>(mixed_plan.bytes()), with_static);
    bool ok = true;
    for (std::size_t i = 0; i < mixed.size(); ++i) {
      if (is_alloc(mixed[i].kind) && run.results[i].offset == kNoOffset) ok = false;
    }
    check(ok, "planner: launch with conservative plan.bytes() = " + str(mixed_plan.bytes()) +
                  " satisfies every alloc" + label);
    check_alignment_of("planner mixed sequence aligned" + label, mixed, run);
    check_planner_agrees("planner mixed sequence" + label, mixed, run);
  }
}

__global__ void shared_memory_usable_kernel(int* out) {
  xlog::ShmemAllocator shmem;
  int* ints = shmem.alloc<int>(blockDim.x);
  float* floats = reinterpret_cast<float*>(shmem.alloc(blockDim.x * sizeof(float), 128));
  if (ints == nullptr || floats == nullptr) {
    out[threadIdx.x] = -1;
    return;
  }
  ints[threadIdx.x] = static_cast<int>(threadIdx.x) * 3;
  floats[threadIdx.x] = static_cast<float>(threadIdx.x) + 0.5f;
  __syncthreads();
  const unsigned neighbour = (threadIdx.x + 1) % blockDim.x;
  const bool ok = ints[neighbour] == static_cast<int>(neighbour) * 3 &&
                  floats[neighbour] == static_cast<float>(neighbour) + 0.5f;
  out[threadIdx.x] = ok ? 1 : 0;
}

void test_shared_memory_usable() {
  constexpr int kThreads = 256;
  xlog::ShmemPlan plan;
  plan.add<int>(kThreads);
  plan.add_bytes(kThreads * sizeof(float), 128);
  DeviceBuffer<int> out(kThreads);
  shared_memory_usable_kernel<<<4, kThreads, plan.bytes()>>>(out.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  CUDA_OR_DIE(cudaDeviceSynchronize());
  const std::vector<int> host = to_host(out.ptr, kThreads);
  int good = 0;
  for (int v : host) good += v == 1;
  check(good == kThreads, "blocks carved for all threads hold their data without overlap",
        str(good) + "/" + str(kThreads) + " threads read their neighbour's values");
}

// Checked mode. Each case writes: violated, live allocations, allocated bytes.
__global__ void checked_kernel(std::uint32_t* out) {
  if (threadIdx.x != 0) return;
  {  // 0: correct LIFO order
    xlog::ShmemAllocatorChecked shmem;
    shmem.alloc(16);
    shmem.alloc(32);
    shmem.dealloc(32);
    shmem.dealloc(16);
    out[0] = shmem.lifo_violated();
    out[1] = shmem.live_allocations();
    out[2] = shmem.get_allocated_size_bytes();
  }
  {  // 3: releasing the older block first
    xlog::ShmemAllocatorChecked shmem;
    shmem.alloc(16);
    shmem.alloc(32);
    shmem.dealloc(16);  // not the most recent
    out[3] = shmem.lifo_violated();
    out[4] = shmem.live_allocations();
    out[5] = shmem.get_allocated_size_bytes();
    shmem.dealloc(32);  // correct pops still work afterwards
    shmem.dealloc(16);
    out[6] = shmem.lifo_violated();  // sticky
    out[7] = shmem.get_allocated_size_bytes();
  }
  {  // 8: dealloc with nothing allocated
    xlog::ShmemAllocatorChecked shmem;
    shmem.dealloc(0);
    out[8] = shmem.lifo_violated();
    out[9] = shmem.get_allocated_size_bytes();
  }
  {  // 10: more live blocks than the log remembers, released in order
    xlog::ShmemAllocatorChecked shmem;
    constexpr std::uint32_t kCount = xlog::kShmemCheckedDepth + 4;
    for (std::uint32_t i = 0; i < kCount; ++i) shmem.alloc(8 + 8 * i);
    out[10] = shmem.live_allocations();
    for (std::uint32_t i = kCount; i-- > 0;) shmem.dealloc(8 + 8 * i);
    out[11] = shmem.lifo_violated();
    out[12] = shmem.get_allocated_size_bytes();
  }
  {  // 13: typed wrappers are checked by byte size
    xlog::ShmemAllocatorChecked shmem;
    shmem.alloc<float>(4);
    shmem.alloc<double>(3);
    shmem.dealloc<double>(2);  // 16 bytes, the top is 24
    out[13] = shmem.lifo_violated();
    out[14] = shmem.get_allocated_size_bytes();
  }
  {  // 15: the unchecked allocator ignores an underflowing dealloc
    xlog::ShmemAllocator shmem;
    shmem.alloc(8);
    shmem.dealloc(9);
    out[15] = shmem.get_allocated_size_bytes();
  }
}

void test_checked() {
  constexpr int kOut = 16;
  DeviceBuffer<std::uint32_t> out(kOut);
  checked_kernel<<<1, 32, 4096>>>(out.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  CUDA_OR_DIE(cudaDeviceSynchronize());
  const std::vector<std::uint32_t> o = to_host(out.ptr, kOut);
  check(o[0] == 0 && o[1] == 0 && o[2] == 0, "checked: LIFO order is not flagged",
        str(o[0]) + "/" + str(o[1]) + "/" + str(o[2]));
  check(o[3] == 1, "checked: non-LIFO dealloc sets lifo_violated()");
  check(o[4] == 2 && o[5] == 48, "checked: a non-LIFO dealloc is ignored",
        "live " + str(o[4]) + " allocated " + str(o[5]));
  check(o[6] == 1 && o[7] == 0, "checked: flag is sticky, later LIFO pops still work");
  check(o[8] == 1 && o[9] == 0, "checked: dealloc on an empty allocator is flagged");
  check(o[10] == xlog::kShmemCheckedDepth + 4 && o[11] == 0 && o[12] == 0,
        "checked: more live blocks than XLOG_SHMEM_CHECKED_DEPTH, released in order",
        "live " + str(o[10]) + " violated " + str(o[11]) + " allocated " + str(o[12]));
  check(o[13] == 1 && o[14] == 40, "checked: typed dealloc of the wrong size is flagged");
  check(o[15] == 8, "unchecked: underflowing dealloc is ignored", str(o[15]));
}

}  // namespace

int main() {
  int device_count = 0;
  const cudaError_t status = cudaGetDeviceCount(&device_count);
  if (status != cudaSuccess || device_count == 0) {
    const std::string reason =
        status != cudaSuccess ? std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status)
                              : std::string("cudaGetDeviceCount returned 0");
    const char* require = std::getenv("XLOG_REQUIRE_GPU");
    if (require != nullptr && require[0] != '\0' && require[0] != '0') {
      std::printf("FAIL: no CUDA device but XLOG_REQUIRE_GPU is set: %s\n", reason.c_str());
      return 1;
    }
    std::printf("SKIP: no CUDA device: %s\n", reason.c_str());
    return 77;
  }

  cudaDeviceProp prop{};
  CUDA_OR_DIE(cudaGetDeviceProperties(&prop, 0));
  int max_optin = 0;
  CUDA_OR_DIE(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  std::printf("device 0: %s (sm_%d%d), max dynamic shared memory per block (opt-in) %d bytes\n",
              prop.name, prop.major, prop.minor, max_optin);

  test_max_size(max_optin);
  test_alignment();
  test_overflow();
  test_typed();
  test_lifo_reuse();
  test_planner_sizes_launch();
  test_shared_memory_usable();
  test_checked();

  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
