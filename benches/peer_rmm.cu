// benches/peer_rmm.cu — RMM's resources as xlog_bench peers
// (libxlog_bench_rmm.so, loaded by xlog_bench at run time).
//
//   rmm-async           cuda_async_memory_resource (a cudaMallocAsync pool)
//   rmm-limiting-async  limiting_resource_adaptor over cuda_async_memory_resource
//   rmm-pool            pool_memory_resource over cuda_memory_resource
//
// RMM 26.x resources follow CCCL's memory-resource concept: every call takes
// an explicit alignment, and allocate/deallocate take the stream first.

#include "bench_peer.h"

#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/limiting_resource_adaptor.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <variant>

namespace {

constexpr std::size_t kAlignment = 256;
// Large enough that the workloads (W3: 8 threads of about 1 GiB live each)
// do not measure pool growth, and small enough to leave room for the rest.
std::size_t initial_pool_bytes() {
  std::size_t free_bytes = 0, total_bytes = 0;
  std::size_t want = std::size_t{16} << 30;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) want = std::min(want, free_bytes / 10 * 4);
  return want / 256 * 256;
}

void copy_message(char* err, std::size_t cap, const std::string& text) {
  if (err == nullptr || cap == 0) return;
  std::snprintf(err, cap, "%s", text.c_str());
}

cuda::stream_ref as_stream(void* stream) { return cuda::stream_ref{static_cast<cudaStream_t>(stream)}; }

// One type for the three peers: which member is live tells the resource.
struct Instance {
  std::variant<std::monostate, rmm::mr::cuda_async_memory_resource, rmm::mr::limiting_resource_adaptor,
               rmm::mr::pool_memory_resource>
      resource;
};

template <typename Make>
void* create_with(Make make, char* err, std::size_t cap) {
  try {
    auto instance = std::make_unique<Instance>();
    make(*instance);
    return instance.release();
  } catch (const std::exception& e) {
    copy_message(err, cap, std::string("RMM resource construction failed: ") + e.what());
  } catch (...) {
    copy_message(err, cap, "RMM resource construction failed with a non-standard exception");
  }
  return nullptr;
}

void* create_async(uint64_t, char* err, std::size_t cap) {
  return create_with([](Instance& i) { i.resource.emplace<rmm::mr::cuda_async_memory_resource>(); }, err, cap);
}

void* create_limiting(uint64_t limit, char* err, std::size_t cap) {
  if (limit == 0) limit = UINT64_MAX / 2;
  return create_with(
      [limit](Instance& i) {
        rmm::mr::cuda_async_memory_resource upstream;
        i.resource.emplace<rmm::mr::limiting_resource_adaptor>(upstream, static_cast<std::size_t>(limit), kAlignment);
      },
      err, cap);
}

void* create_pool(uint64_t, char* err, std::size_t cap) {
  return create_with(
      [](Instance& i) {
        rmm::mr::cuda_memory_resource upstream;
        i.resource.emplace<rmm::mr::pool_memory_resource>(upstream, initial_pool_bytes());
      },
      err, cap);
}

void destroy(void* instance) { delete static_cast<Instance*>(instance); }

int allocate(void* instance, std::size_t bytes, void* stream, void** out, char* err, std::size_t cap) {
  auto* self = static_cast<Instance*>(instance);
  try {
    *out = std::visit(
        [&](auto& r) -> void* {
          if constexpr (std::is_same_v<std::decay_t<decltype(r)>, std::monostate>) {
            throw std::logic_error("empty RMM peer instance");
          } else {
            return r.allocate(as_stream(stream), bytes, kAlignment);
          }
        },
        self->resource);
    return XLOG_BENCH_ALLOC_OK;
  } catch (const std::bad_alloc& e) {  // rmm::out_of_memory and the limit
    copy_message(err, cap, e.what());
    return XLOG_BENCH_ALLOC_REFUSED;
  } catch (const std::exception& e) {
    copy_message(err, cap, e.what());
    return XLOG_BENCH_ALLOC_ERROR;
  }
}

void deallocate(void* instance, void* ptr, std::size_t bytes, void* stream) {
  auto* self = static_cast<Instance*>(instance);
  std::visit(
      [&](auto& r) {
        if constexpr (!std::is_same_v<std::decay_t<decltype(r)>, std::monostate>) {
          r.deallocate(as_stream(stream), ptr, bytes, kAlignment);
        }
      },
      self->resource);
}

const xlog_bench_peer kPeers[] = {
    {"rmm-async", 0, create_async, destroy, allocate, deallocate, nullptr},
    {"rmm-limiting-async", 1, create_limiting, destroy, allocate, deallocate, nullptr},
    {"rmm-pool", 0, create_pool, destroy, allocate, deallocate, nullptr},
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int xlog_bench_peers(int abi, const xlog_bench_peer** peers,
                                                                       char* err, std::size_t cap) {
  if (abi != XLOG_BENCH_PEER_ABI) {
    copy_message(err, cap, "peer ABI mismatch");
    return -1;
  }
  *peers = kPeers;
  return static_cast<int>(sizeof(kPeers) / sizeof(kPeers[0]));
}
