#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <thread>
#define CK(x) do { CUresult r = (x); if (r) { const char* s; cuGetErrorName(r, &s); printf("%s -> %s\n", #x, s); } } while (0)
int main() {
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CUcontext c; CK(cuDevicePrimaryCtxRetain(&c, d)); CK(cuCtxSetCurrent(c));
  CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent e; CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  const int N = 1000000;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < N; ++i) { CUstreamCaptureStatus st; cuuint64_t id; cuStreamGetCaptureInfo(s, &st, &id, nullptr, nullptr, nullptr, nullptr); }
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < N; ++i) { CUstreamCaptureStatus st; cuStreamIsCapturing(s, &st); }
  auto t2 = std::chrono::steady_clock::now();
  for (int i = 0; i < N; ++i) { CUcontext cur; cuCtxGetCurrent(&cur); }
  auto t3 = std::chrono::steady_clock::now();
  for (int i = 0; i < N; ++i) { cuEventRecord(e, s); }
  cuStreamSynchronize(s);
  auto t4 = std::chrono::steady_clock::now();
  auto ns = [&](auto a, auto b) { return std::chrono::duration<double, std::nano>(b - a).count() / N; };
  printf("cuStreamGetCaptureInfo %.1f ns, cuStreamIsCapturing %.1f ns, cuCtxGetCurrent %.1f ns, cuEventRecord %.1f ns\n", ns(t0,t1), ns(t1,t2), ns(t2,t3), ns(t3,t4));
  std::thread th([&] {
    CUcontext cur = nullptr; cuCtxGetCurrent(&cur);
    CUresult r1 = cuEventRecord(e, s); CUresult r2 = cuStreamWaitEvent(s, e, 0); CUresult r3 = cuEventQuery(e);
    printf("fresh thread (ctx %p): cuEventRecord=%d cuStreamWaitEvent=%d cuEventQuery=%d\n", (void*)cur, r1, r2, r3);
  });
  th.join();
  // capture: query a non-captured event and wait on it from a capturing stream
  CUstream cs; CK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
  CK(cuEventRecord(e, s)); CK(cuStreamSynchronize(s));
  CK(cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUresult q = cuEventQuery(e); printf("cuEventQuery(non-captured) during global capture: %d\n", q);
  CUresult w = cuStreamWaitEvent(cs, e, 0); printf("cuStreamWaitEvent(capturing, non-captured event): %d\n", w);
  CUstreamCaptureStatus st; cuStreamIsCapturing(cs, &st); printf("capture status after: %d\n", st);
  CUgraph g; CUresult en = cuStreamEndCapture(cs, &g); printf("end capture: %d\n", en);
  return 0;
}
