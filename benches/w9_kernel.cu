// benches/w9_kernel.cu — the kernel W9 launches: it takes the eight block
// pointers of a recorded launch and does nothing with them, so a launch
// costs only what launching costs. Compiled by nvcc into xlog_bench, which
// launches it with cuLaunchKernel through the CUfunction that
// xlog_bench_w9_kernel() leads to (cudaGetFuncBySymbol).

extern "C" __global__ void xlog_bench_w9_empty(void*, void*, void*, void*, void*, void*, void*, void*) {}

// The kernel's host-side symbol, for cudaGetFuncBySymbol in xlog_bench.cpp
// (which is plain C++ and cannot name a __global__ function itself).
extern "C" const void* xlog_bench_w9_kernel() { return reinterpret_cast<const void*>(&xlog_bench_w9_empty); }
