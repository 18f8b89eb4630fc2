// benches/peer_torch.cpp — PyTorch's CUDA caching allocator (libc10_cuda) as
// an xlog_bench peer (libxlog_bench_torch.so, loaded at run time).
//
// This is the allocator torch tensors use, called the way C++ extensions
// call it: raw_alloc_with_stream / raw_delete. The allocator needs init()
// with the device count before its first use (torch's Python module does
// that on CUDA initialisation; a plain C++ process has to do it itself).

#include "bench_peer.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

void copy_message(char* err, size_t cap, const std::string& text) {
  if (err == nullptr || cap == 0) return;
  std::snprintf(err, cap, "%s", text.c_str());
}

// Not thread-safe on its own: xlog_bench creates instances from one thread.
bool g_initialised = false;
int g_dummy_instance = 0;

void* create(uint64_t, char* err, size_t cap) {
  try {
    if (!g_initialised) {
      int devices = 0;
      cudaError_t rc = cudaGetDeviceCount(&devices);
      if (rc != cudaSuccess || devices == 0) {
        copy_message(err, cap, std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc));
        return nullptr;
      }
      alloc::init(devices);
      g_initialised = true;
    }
    // The allocator is a process-wide singleton; the instance is a token.
    return &g_dummy_instance;
  } catch (const std::exception& e) {
    copy_message(err, cap, std::string("CUDACachingAllocator init failed: ") + e.what());
    return nullptr;
  }
}

void destroy(void*) {}

int allocate(void*, size_t bytes, void* stream, void** out, char* err, size_t cap) {
  try {
    *out = alloc::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
    return XLOG_BENCH_ALLOC_OK;
  } catch (const c10::OutOfMemoryError& e) {
    copy_message(err, cap, e.what_without_backtrace());
    return XLOG_BENCH_ALLOC_REFUSED;
  } catch (const std::exception& e) {
    copy_message(err, cap, e.what());
    return XLOG_BENCH_ALLOC_ERROR;
  }
}

void deallocate(void*, void* ptr, size_t, void*) { alloc::raw_delete(ptr); }

void trim(void*) {
  try {
    alloc::emptyCache();
  } catch (...) {
  }
}

const xlog_bench_peer kPeers[] = {
    {"torch-caching", 0, create, destroy, allocate, deallocate, trim},
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int xlog_bench_peers(int abi, const xlog_bench_peer** peers,
                                                                       char* err, size_t cap) {
  if (abi != XLOG_BENCH_PEER_ABI) {
    copy_message(err, cap, "peer ABI mismatch");
    return -1;
  }
  // A non-default backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)
  // would measure cudaMallocAsync again under torch's name.
  try {
    std::string name = alloc::get()->name();
    if (name != "native") {
      copy_message(err, cap, "torch allocator backend is '" + name + "', not the native caching allocator");
      return -1;
    }
  } catch (const std::exception& e) {
    copy_message(err, cap, std::string("torch allocator unavailable: ") + e.what());
    return -1;
  }
  *peers = kPeers;
  return 1;
}
