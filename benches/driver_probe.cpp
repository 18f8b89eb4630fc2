// benches/driver_probe.cpp — what the driver's event calls cost on streams
// in different states (issue 13's W4 raw analogues). Stand-alone: only the
// driver API, no xlog. On the GPU machine:
//
//   nvcc -O2 -o /tmp/driver_probe benches/driver_probe.cpp -lcuda -L/usr/local/nvidia/lib64
//   LD_LIBRARY_PATH=/usr/local/nvidia/lib64 /tmp/driver_probe
//
// Prints, per stream state and repetition, µs per cuEventRecord (one event,
// two in turn), per record+wait alternating between two streams (one event,
// two), per cuStreamWriteValue64 (device and host-mapped word), per
// cuStreamWriteValue32, per wait+write value pair, and per cuEventQuery.
// States: fresh streams; streams that ran cuMemAllocFromPoolAsync/FreeAsync
// on a pool with default attributes, or with the three reuse attributes
// off, or holding the memory; streams that only waited on an event of a
// stream that allocated from a pool; streams that only freed pool memory.
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; cuGetErrorString(r, &s); printf("%s failed: %s (line %d)\n", #x, s, __LINE__); exit(1);} } while (0)
using Clock = std::chrono::steady_clock;
static const int N = 20000;
template <class F> double tl(F f, CUstream a, CUstream b) {
  for (int i = 0; i < 2000; ++i) f(i);
  CK(cuStreamSynchronize(a)); CK(cuStreamSynchronize(b));
  auto t0 = Clock::now();
  for (int i = 0; i < N; ++i) f(i);
  CK(cuStreamSynchronize(a)); CK(cuStreamSynchronize(b));
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / N;
}
struct Case { const char* name; std::vector<double> v; };
int main() {
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  // Pools: default attrs and no-reuse attrs.
  CUmemPoolProps props = {}; props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; props.location.type = CU_MEM_LOCATION_TYPE_DEVICE; props.location.id = 0;
  CUmemoryPool p1, p2; CK(cuMemPoolCreate(&p1, &props)); CK(cuMemPoolCreate(&p2, &props));
  int zero = 0;
  CK(cuMemPoolSetAttribute(p2, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &zero));
  CK(cuMemPoolSetAttribute(p2, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &zero));
  CK(cuMemPoolSetAttribute(p2, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &zero));
  cuuint64_t mx = ~0ull; CK(cuMemPoolSetAttribute(p1, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &mx)); CK(cuMemPoolSetAttribute(p2, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &mx));
  const char* states[] = {"fresh", "pool-default", "pool-noreuse", "pool-default-held", "waited-on-pool-stream", "free-only-on-stream"};
  CUdeviceptr word; CK(cuMemAlloc(&word, 64)); CK(cuMemsetD8(word, 0, 64));
  void* host; CK(cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE)); CUdeviceptr hword; CK(cuMemHostGetDevicePointer(&hword, host, 0));
  for (int rep = 0; rep < 2; ++rep) {
    for (int st = 0; st < 6; ++st) {
      CUstream a, b; CK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING)); CK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
      std::vector<CUdeviceptr> held;
      if (st == 4 || st == 5) {
        CUstream p; CK(cuStreamCreate(&p, CU_STREAM_NON_BLOCKING));
        CUevent pe; CK(cuEventCreate(&pe, CU_EVENT_DISABLE_TIMING));
        std::vector<CUdeviceptr> ds;
        for (int i = 0; i < 8; ++i) { CUdeviceptr d; CK(cuMemAllocFromPoolAsync(&d, 1 << 20, p1, p)); ds.push_back(d); }
        CK(cuEventRecord(pe, p));
        CK(cuStreamWaitEvent(a, pe, 0)); CK(cuStreamWaitEvent(b, pe, 0));
        if (st == 5) { for (int i = 0; i < 4; ++i) CK(cuMemFreeAsync(ds[i], a)); for (int i = 4; i < 8; ++i) CK(cuMemFreeAsync(ds[i], b)); }
        else { for (auto d : ds) CK(cuMemFreeAsync(d, p)); }
        CK(cuCtxSynchronize());
        CK(cuEventDestroy(pe)); CK(cuStreamDestroy(p));
      } else if (st >= 1) {
        CUmemoryPool p = st == 2 ? p2 : p1;
        for (CUstream s : {a, b}) for (int i = 0; i < 4; ++i) { CUdeviceptr d; CK(cuMemAllocFromPoolAsync(&d, 1 << 20, p, s)); if (st == 3) held.push_back(d); else CK(cuMemFreeAsync(d, s)); }
        CK(cuCtxSynchronize());
      }
      CUevent e[2]; for (auto& x : e) CK(cuEventCreate(&x, CU_EVENT_DISABLE_TIMING));
      cuuint64_t seq = 0;
      double rec = tl([&](int) { CK(cuEventRecord(e[0], a)); }, a, b);
      double rec2 = tl([&](int i) { CK(cuEventRecord(e[i & 1], a)); }, a, b);
      double rw = tl([&](int i) { CUstream s = (i & 1) ? b : a; CK(cuStreamWaitEvent(s, e[0], 0)); CK(cuEventRecord(e[0], s)); }, a, b);
      double rw2 = tl([&](int i) { CUstream s = (i & 1) ? b : a; CK(cuStreamWaitEvent(s, e[(i + 1) & 1], 0)); CK(cuEventRecord(e[i & 1], s)); }, a, b);
      double wv = tl([&](int) { CK(cuStreamWriteValue64(a, word, ++seq, 0)); }, a, b);
      double wvh = tl([&](int) { CK(cuStreamWriteValue64(a, hword, ++seq, 0)); }, a, b);
      double wvnb = tl([&](int) { CK(cuStreamWriteValue32(a, word, (cuuint32_t)++seq, 0)); }, a, b);
      double wwv = tl([&](int i) { CUstream s = (i & 1) ? b : a; CK(cuStreamWaitValue64(s, word, seq, CU_STREAM_WAIT_VALUE_GEQ)); CK(cuStreamWriteValue64(s, word, ++seq, 0)); }, a, b);
      double q = tl([&](int) { (void)cuEventQuery(e[0]); }, a, b);
      printf("rep %d state %-18s record %.3f  record(2ev) %.3f  rec+wait(1ev) %.3f  rec+wait(2ev) %.3f  writeval %.3f  writeval(host) %.3f  writeval32 %.3f  wait+writeval %.3f  query %.3f\n",
             rep, states[st], rec, rec2, rw, rw2, wv, wvh, wvnb, wwv, q);
      fflush(stdout);
      for (auto d : held) CK(cuMemFreeAsync(d, a));
      CK(cuCtxSynchronize());
      for (auto& x : e) CK(cuEventDestroy(x));
      CK(cuStreamDestroy(a)); CK(cuStreamDestroy(b));
    }
  }
  return 0;
}
