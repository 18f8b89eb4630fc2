// include/xlog/mr.hpp against CCCL: the concepts at compile time (so a CI
// build with nvcc and no GPU already checks them), then, on a GPU, kernels
// on memory taken through type-erased CCCL references, the stats moving with
// each allocation, a free on another stream than the allocation's, and a
// budget refusal surfacing as xlog::bad_alloc (a std::bad_alloc, which is
// what RMM's callers catch; see the contract in mr.hpp).
//
// Compile check alone, without CMake (what CI does with the pip nvcc):
//   $CUDA_ROOT/bin/nvcc -std=c++17 -I include -c cpp_tests/cuda/mr_test.cu

#include "test_support.cu"

#include <xlog/mr.hpp>

#include <new>

#if !XLOG_MR_HAVE_CCCL
#error "mr_test.cu needs <cuda/memory_resource> (CCCL, shipped with every CUDA toolkit nvcc)"
#endif

using xlog_test::check;
using xlog_test::str;

// ---- the concepts ----
// CCCL 3.1 and later call the stream-ordered concept `resource` and the
// blocking one `synchronous_resource`; CCCL 2.x and 3.0 (CUDA 13.0's) called
// them `async_resource` and `resource` (the rename, CCCL PR 5313, was
// backported to 3.1). Checked with CCCL 3.5 (the pip nvcc 13.5, CI) and
// CCCL 3.0 (CUDA 13.0, the GPU machine).
#if CCCL_MAJOR_VERSION > 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION >= 1)
static_assert(cuda::mr::synchronous_resource_with<xlog::memory_resource, cuda::mr::device_accessible>,
              "blocking pair: allocate_sync / deallocate_sync, ==, device_accessible");
static_assert(cuda::mr::resource_with<xlog::memory_resource, cuda::mr::device_accessible>,
              "stream-ordered pair: allocate(stream, ...) / deallocate(stream, ...)");
using ordered_ref = cuda::mr::resource_ref<cuda::mr::device_accessible>;
using blocking_ref = cuda::mr::synchronous_resource_ref<cuda::mr::device_accessible>;
#  define XLOG_TEST_ALLOCATE(ref, stream, bytes) (ref).allocate((stream), (bytes), 256)
#  define XLOG_TEST_DEALLOCATE(ref, stream, ptr, bytes) (ref).deallocate((stream), (ptr), (bytes), 256)
#  define XLOG_TEST_ALLOCATE_SYNC(ref, bytes) (ref).allocate_sync((bytes), 256)
#  define XLOG_TEST_DEALLOCATE_SYNC(ref, ptr, bytes) (ref).deallocate_sync((ptr), (bytes), 256)
#else
static_assert(cuda::mr::resource_with<xlog::memory_resource, cuda::mr::device_accessible>,
              "blocking pair: allocate / deallocate, ==, device_accessible");
static_assert(cuda::mr::async_resource_with<xlog::memory_resource, cuda::mr::device_accessible>,
              "stream-ordered pair: allocate_async / deallocate_async");
using ordered_ref = cuda::mr::async_resource_ref<cuda::mr::device_accessible>;
using blocking_ref = cuda::mr::resource_ref<cuda::mr::device_accessible>;
#  define XLOG_TEST_ALLOCATE(ref, stream, bytes) (ref).allocate_async((bytes), 256, (stream))
#  define XLOG_TEST_DEALLOCATE(ref, stream, ptr, bytes) (ref).deallocate_async((ptr), (bytes), 256, (stream))
#  define XLOG_TEST_ALLOCATE_SYNC(ref, bytes) (ref).allocate((bytes), 256)
#  define XLOG_TEST_DEALLOCATE_SYNC(ref, ptr, bytes) (ref).deallocate((ptr), (bytes), 256)
#endif
static_assert(!cuda::has_property<xlog::memory_resource, cuda::mr::host_accessible>,
              "blocks are device memory only");
static_assert(std::is_base_of<std::bad_alloc, xlog::bad_alloc>::value, "refusals are std::bad_alloc");

__global__ void fill(unsigned* data, size_t count, unsigned value) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < count) data[i] = value + static_cast<unsigned>(i);
}

static bool pattern_ok(const unsigned* device, size_t count, unsigned value, cudaStream_t stream) {
  std::vector<unsigned> host(count);
  CUDA_OR_DIE(cudaMemcpyAsync(host.data(), device, count * sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
  CUDA_OR_DIE(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < count; ++i) {
    if (host[i] != value + static_cast<unsigned>(i)) return false;
  }
  return true;
}

int main() {
  xlog_test::skip_without_device();
  constexpr uint64_t budget = 64ull << 20;
  xlog_runtime* rt = xlog_test::open_cuda(budget);
  cudaStream_t first = nullptr, second = nullptr;
  CUDA_OR_DIE(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  CUDA_OR_DIE(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  {
    xlog::memory_resource xmr{rt, "mr_test"};
    ordered_ref ordered{xmr};
    blocking_ref blocking{xmr};

    const cuda::stream_ref on_first{first};
    const cuda::stream_ref on_second{second};

    // Stream-ordered: allocate, a kernel on the same stream, read back.
    const size_t count = 1 << 18;
    const size_t bytes = count * sizeof(unsigned);
    const xlog_stats before = xlog_test::stats(rt);
    auto* data = static_cast<unsigned*>(XLOG_TEST_ALLOCATE(ordered, on_first, bytes));
    const xlog_stats during = xlog_test::stats(rt);
    check(data != nullptr && reinterpret_cast<uintptr_t>(data) % 256 == 0, "ordered allocate: 256-aligned pointer");
    check(during.live_blocks == before.live_blocks + 1 && during.live_bytes >= before.live_bytes + bytes,
          "ordered allocate: xlog stats count the block",
          "live blocks " + str(during.live_blocks) + ", live bytes " + str(during.live_bytes));
    fill<<<xlog_test::grid_for(count, 256), 256, 0, first>>>(data, count, 7);
    CUDA_OR_DIE(cudaGetLastError());
    check(pattern_ok(data, count, 7, first), "kernel wrote through the resource's memory");

    // Free on another stream after work there: the resource records that
    // stream's use, so the memory is not reused before the kernel ends.
    fill<<<xlog_test::grid_for(count, 256), 256, 0, second>>>(data, count, 9);
    CUDA_OR_DIE(cudaGetLastError());
    XLOG_TEST_DEALLOCATE(ordered, on_second, data, bytes);
    const xlog_stats after = xlog_test::stats(rt);
    check(after.live_blocks == before.live_blocks && after.deallocations == before.deallocations + 1,
          "ordered deallocate on another stream: the block is freed",
          "live blocks " + str(after.live_blocks) + ", deallocations " + str(after.deallocations));
    check(xmr.live_pointers() == 0 && xmr.unmatched_deallocations() == 0, "pointer map empty, no unmatched frees");

    // Blocking pair: ready for any stream when it returns.
    auto* sync_data = static_cast<unsigned*>(XLOG_TEST_ALLOCATE_SYNC(blocking, bytes));
    fill<<<xlog_test::grid_for(count, 256), 256, 0, second>>>(sync_data, count, 11);
    CUDA_OR_DIE(cudaGetLastError());
    check(pattern_ok(sync_data, count, 11, second), "blocking allocate: usable from another stream");
    XLOG_TEST_DEALLOCATE_SYNC(blocking, sync_data, bytes);
    check(xmr.live_pointers() == 0, "blocking deallocate: pointer map empty");

    // A refusal: more than the whole budget.
    const uint64_t failed_before = xlog_test::stats(rt).failed_allocations;
    bool refused = false;
    try {
      (void)XLOG_TEST_ALLOCATE(ordered, on_first, budget + (1u << 20));
    } catch (const std::bad_alloc& error) {
      const auto* xlog_error = dynamic_cast<const xlog::bad_alloc*>(&error);
      refused = xlog_error != nullptr && xlog_error->status() == XLOG_ERR_OUT_OF_BUDGET;
      xlog_test::note(std::string("refusal: ") + error.what());
    }
    check(refused, "budget refusal surfaces as xlog::bad_alloc (std::bad_alloc), XLOG_ERR_OUT_OF_BUDGET");
    check(xlog_test::stats(rt).failed_allocations == failed_before + 1, "the refusal is counted");

    // Alignment xlog does not give.
    bool alignment_refused = false;
    try {
      (void)xmr.allocate_on(first, 4096, 512);
    } catch (const xlog::bad_alloc& error) {
      alignment_refused = error.status() == XLOG_ERR_INVALID_ARGUMENT;
    }
    check(alignment_refused && xmr.live_pointers() == 0, "alignment 512 refused with XLOG_ERR_INVALID_ARGUMENT");

    CUDA_OR_DIE(cudaStreamSynchronize(first));
    CUDA_OR_DIE(cudaStreamSynchronize(second));
    xlog_test::trim_and_drain(rt);
  }
  // The runtime goes before the streams it imported.
  xlog_test::close_expect_no_leaks(rt, "close: nothing leaked through the resource");
  CUDA_OR_DIE(cudaStreamDestroy(first));
  CUDA_OR_DIE(cudaStreamDestroy(second));
  return xlog_test::summary();
}
