// cuMemSetAccess / cuMemMap / cuMemUnmap cost by range size, GPU idle or busy.
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cstdlib>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; cuGetErrorString(r, &s); printf("%s: %s line %d\n", #x, s, __LINE__); return 1; } } while (0)
using C = std::chrono::steady_clock;
__global__ void spin(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }
int main(int argc, char** argv) {
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, d)); CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp p = {}; p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = 0;
  size_t g; CK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemAccessDesc a = {}; a.location = p.location; a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr va; size_t total = 4096ull << 20; CK(cuMemAddressReserve(&va, total, 0, 0, 0));
  CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  // Background mappings: argv[1] handles of 2 MiB mapped and granted elsewhere first.
  int bg = argc > 1 ? atoi(argv[1]) : 0;
  CUdeviceptr bva = 0;
  if (bg) {
    CK(cuMemAddressReserve(&bva, (size_t)bg * g, 0, 0, 0));
    for (int i = 0; i < bg; ++i) { CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, g, &p, 0)); CK(cuMemMap(bva + (size_t)i * g, g, 0, h, 0)); CK(cuMemSetAccess(bva + (size_t)i * g, g, &a, 1)); }
    printf("background: %d handles of %zu MiB mapped\n", bg, g >> 20);
  }
  for (size_t page : {g, 8 * g}) for (int n : {1, 8, 21, 64}) for (int busy : {0, 1}) {
    if (page * n > total) continue;
    std::vector<CUmemGenericAllocationHandle> h(n);
    for (int i = 0; i < n; ++i) CK(cuMemCreate(&h[i], page, &p, 0));
    double tm = 0, ts = 0, tu = 0; int reps = 5;
    for (int r = 0; r < reps; ++r) {
      if (busy) { spin<<<264, 128, 0, (cudaStream_t)s>>>(40000000LL); } // ~20 ms on every SM
      auto t0 = C::now();
      for (int i = 0; i < n; ++i) CK(cuMemMap(va + i * page, page, 0, h[i], 0));
      auto t1 = C::now();
      CK(cuMemSetAccess(va, page * n, &a, 1));
      auto t2 = C::now();
      CK(cuMemUnmap(va, page * n));
      auto t3 = C::now();
      CK(cuStreamSynchronize(s));
      tm += std::chrono::duration<double, std::micro>(t1 - t0).count();
      ts += std::chrono::duration<double, std::micro>(t2 - t1).count();
      tu += std::chrono::duration<double, std::micro>(t3 - t2).count();
    }
    printf("page %4zu MiB x %2d (%5zu MiB) gpu %s: map %8.1f us  set_access %8.1f us  unmap %8.1f us\n", page >> 20, n, (page * n) >> 20, busy ? "busy" : "idle", tm / reps, ts / reps, tu / reps);
    for (auto x : h) CK(cuMemRelease(x));
  }
  return 0;
}
