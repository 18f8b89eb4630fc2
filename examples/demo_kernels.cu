// demo_kernels.cu — the device side of examples/demo_engine.cpp.
//
// Compiled into xlog_demo when CMake enables CUDA (XLOG_DEMO_HAVE_KERNELS).
// Each function below enqueues its work asynchronously on the stream the
// engine passes (a cudaStream_t handed over as void*: the library's native
// stream, a CUstream of the primary context, which the CUDA runtime shares)
// and returns 0 or the cudaError_t of the failed call. Nothing here waits:
// the ordering between the engine's four streams is the runtime's job
// (prepare_all / finish_all around every stage).
//
// The arithmetic repeats the host reference in demo_engine.cpp (mix32,
// produce_value, scale_value, mix_value, reduce_term) bit for bit; unsigned
// overflow wraps on the device exactly as on the host, so every sum is
// modulo 2^64 and the reduction's order does not matter.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace demo_kernels {

int fill_zero(void* stream, void* device_ptr, std::size_t bytes);
int produce(void* stream, std::uint32_t* input, std::size_t count, std::uint32_t batch);
int transform_scale(void* stream, const std::uint32_t* input, std::uint32_t* output, std::size_t count);
int transform_mix(void* stream, const std::uint32_t* input, std::uint32_t* output, std::size_t count);
int reduce(void* stream, const std::uint32_t* scaled, const std::uint32_t* mixed, std::size_t count,
           std::uint64_t* accumulator);
int copy_to_host(void* stream, void* host_dst, const void* device_src, std::size_t bytes);

namespace {

constexpr unsigned kThreads = 256;
// Grid-stride loops: enough blocks to fill an H100/H200 several times over,
// few enough that the reduction does one atomic per block, not per element.
constexpr std::size_t kMaxBlocks = 1024;

// --- The arithmetic (same as the host reference) ---------------------------

__device__ __forceinline__ std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ std::uint32_t produce_value(std::uint32_t batch, std::size_t i, std::size_t count) {
  // The host computes batch * count + i in size_t and truncates to 32 bits.
  return mix32(static_cast<std::uint32_t>(static_cast<std::size_t>(batch) * count + i));
}

__device__ __forceinline__ std::uint32_t scale_value(std::uint32_t x) { return x * 3U + 1U; }

__device__ __forceinline__ std::uint32_t mix_value(std::uint32_t x) {
  return ((x << 7) | (x >> 25)) ^ 0x9e3779b9U;
}

__device__ __forceinline__ std::uint64_t reduce_term(std::uint32_t scaled, std::uint32_t mixed, std::size_t i) {
  return std::uint64_t{scaled} * (std::uint64_t{i} + 1) + std::uint64_t{mixed};
}

// --- Kernels ----------------------------------------------------------------

__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

__global__ void produce_kernel(std::uint32_t* input, std::size_t count, std::uint32_t batch) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) input[i] = produce_value(batch, i, count);
}

__global__ void scale_kernel(const std::uint32_t* __restrict__ input, std::uint32_t* __restrict__ output,
                             std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) output[i] = scale_value(input[i]);
}

__global__ void mix_kernel(const std::uint32_t* __restrict__ input, std::uint32_t* __restrict__ output,
                           std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) output[i] = mix_value(input[i]);
}

// Each thread sums its grid-stride slice, each warp folds its 32 partial sums
// with shuffles, warp 0 folds the warps' sums, and one atomicAdd per block
// adds the block's sum to *accumulator (all modulo 2^64).
__global__ void reduce_kernel(const std::uint32_t* __restrict__ scaled, const std::uint32_t* __restrict__ mixed,
                              std::size_t count, unsigned long long* accumulator) {
  __shared__ std::uint64_t warp_sums[kThreads / 32];

  std::uint64_t sum = 0;
  for (std::size_t i = first_index(); i < count; i += grid_stride()) sum += reduce_term(scaled[i], mixed[i], i);

  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffU, sum, offset);
  const unsigned lane = threadIdx.x % 32;
  const unsigned warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();

  if (warp == 0) {
    sum = lane < blockDim.x / 32 ? warp_sums[lane] : 0;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffU, sum, offset);
    if (lane == 0) atomicAdd(accumulator, static_cast<unsigned long long>(sum));
  }
}

// --- Launch helpers ---------------------------------------------------------

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

unsigned blocks_for(std::size_t count) {
  const std::size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// With lazy module loading (the CUDA 12.2+ default) the first launch of each
// kernel loads it, which may wait for work already running on the device.
// Load all four up front, once per device, before the pipeline's streams are
// busy. Also makes the stream's device current: the engine may run a stage
// on a stream of a second device (--peer-device), and xlog's own calls leave
// whichever device's context they used current on this thread.
int load_kernels(void* stream) {
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static bool loaded[kMaxDevices] = {};
  int device = 0;
  cudaError_t status = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device);
  if (status != cudaSuccess) return static_cast<int>(status);
  int current = -1;
  status = cudaGetDevice(&current);
  if (status == cudaSuccess && current != device) status = cudaSetDevice(device);
  if (status != cudaSuccess) return static_cast<int>(status);
  std::lock_guard<std::mutex> lock(mutex);
  if (device < kMaxDevices && loaded[device]) return 0;
  cudaFuncAttributes attributes{};
  const void* kernels[] = {
      reinterpret_cast<const void*>(&produce_kernel),
      reinterpret_cast<const void*>(&scale_kernel),
      reinterpret_cast<const void*>(&mix_kernel),
      reinterpret_cast<const void*>(&reduce_kernel),
  };
  for (const void* kernel : kernels) {
    status = cudaFuncGetAttributes(&attributes, kernel);
    if (status != cudaSuccess) return static_cast<int>(status);
  }
  if (device < kMaxDevices) loaded[device] = true;
  return 0;
}

// The launch's own error (bad configuration, no kernel image for this GPU).
int launched() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

int fill_zero(void* stream, void* device_ptr, std::size_t bytes) {
  if (const int status = load_kernels(stream)) return status;
  if (bytes == 0) return 0;
  return static_cast<int>(cudaMemsetAsync(device_ptr, 0, bytes, as_stream(stream)));
}

int produce(void* stream, std::uint32_t* input, std::size_t count, std::uint32_t batch) {
  if (const int status = load_kernels(stream)) return status;
  if (count == 0) return 0;
  produce_kernel<<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(input, count, batch);
  return launched();
}

int transform_scale(void* stream, const std::uint32_t* input, std::uint32_t* output, std::size_t count) {
  if (const int status = load_kernels(stream)) return status;
  if (count == 0) return 0;
  scale_kernel<<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(input, output, count);
  return launched();
}

int transform_mix(void* stream, const std::uint32_t* input, std::uint32_t* output, std::size_t count) {
  if (const int status = load_kernels(stream)) return status;
  if (count == 0) return 0;
  mix_kernel<<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(input, output, count);
  return launched();
}

int reduce(void* stream, const std::uint32_t* scaled, const std::uint32_t* mixed, std::size_t count,
           std::uint64_t* accumulator) {
  static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t), "atomicAdd needs a 64-bit unsigned long long");
  if (const int status = load_kernels(stream)) return status;
  if (count == 0) return 0;
  reduce_kernel<<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(
      scaled, mixed, count, reinterpret_cast<unsigned long long*>(accumulator));
  return launched();
}

int copy_to_host(void* stream, void* host_dst, const void* device_src, std::size_t bytes) {
  if (const int status = load_kernels(stream)) return status;
  if (bytes == 0) return 0;
  return static_cast<int>(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
}

}  // namespace demo_kernels
