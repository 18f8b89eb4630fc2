// The demo pipeline with real kernels on four streams, on a GPU.
//
// Each iteration k, every launch bracketed by xlog_prepare_all/finish_all:
//   S1 producer:    input[i]  = f(k, i)                 (after a 5 ms delay)
//   S2 transform 1: out1[i]   = input[i] * 3 + 1        (after a 30 ms delay)
//   S3 transform 2: out2[i]   = input[i] ^ 0x5a5a5a5a   (after a 15 ms delay)
//   S4 reducer:     result[i] = out1[i] + out2[i]
//   S4 copy:        result -> page-locked host buffer k
// then all four blocks are freed at once, each on the stream it was
// allocated on, and the next iteration starts without any host sync.
//
// The delays make every missing edge visible: the transforms start late, so
// if freeing `input` on S1 did not wait for both of them, the next
// iteration's producer (which gets the same memory from S1's cache) would
// overwrite it under their feet; if the transforms did not wait for the
// producer, they would read the previous contents; if the reducer did not
// wait for both transforms, it would add stale outputs. Every element of
// every iteration is checked on the host. A negative control then runs the
// same pipeline without prepare/finish and must come out wrong (outside
// compute-sanitizer, since it frees blocks that kernels still use).

#include "test_support.cu"

using namespace xlog_test;

namespace {

constexpr size_t kCount = 1u << 18;  // 1 MiB of uint32 per block
constexpr uint64_t kBytes = kCount * sizeof(uint32_t);
constexpr int kIterations = 4;
constexpr unsigned kThreads = 256;

__host__ __device__ inline uint32_t produced(int iteration, size_t i) {
  return static_cast<uint32_t>(i) * 2246822519u + 0x9e3779b9u * static_cast<uint32_t>(iteration + 1);
}
__host__ __device__ inline uint32_t transform1(uint32_t v) { return v * 3u + 1u; }
__host__ __device__ inline uint32_t transform2(uint32_t v) { return v ^ 0x5a5a5a5au; }

#define GRID_STRIDE(i, count) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (count); i += size_t(gridDim.x) * blockDim.x)

__global__ void produce_kernel(uint32_t* input, size_t count, int iteration) {
  GRID_STRIDE(i, count) input[i] = produced(iteration, i);
}
__global__ void transform1_kernel(const uint32_t* input, uint32_t* out, size_t count) {
  GRID_STRIDE(i, count) out[i] = transform1(input[i]);
}
__global__ void transform2_kernel(const uint32_t* input, uint32_t* out, size_t count) {
  GRID_STRIDE(i, count) out[i] = transform2(input[i]);
}
__global__ void reduce_kernel(const uint32_t* a, const uint32_t* b, uint32_t* result, size_t count) {
  GRID_STRIDE(i, count) result[i] = a[i] + b[i];
}

template <class T>
T* as(const xlog_block& b) {
  return static_cast<T*>(b.ptr);
}

struct Streams {
  Stream s1, s2, s3, s4;
};

// The launch bracket, or (for the negative control) the bare launches.
template <class Launch>
void maybe_tracked(bool tracked, xlog_runtime* rt, const Stream& s, const std::vector<xlog_use>& uses,
                   Launch&& enqueue) {
  if (tracked) {
    launch(rt, s, uses, enqueue);
  } else {
    enqueue(s.native);
    CUDA_OR_DIE(cudaGetLastError());
  }
}

// Run kIterations of the pipeline with inputs seeded from `first_seed`;
// return, per iteration, how many result elements are wrong.
std::vector<size_t> run_pipeline(xlog_runtime* rt, const Streams& st, bool tracked, int first_seed) {
  const unsigned grid = grid_for(kCount, kThreads);
  std::vector<uint32_t*> host(kIterations, nullptr);
  for (uint32_t*& h : host) CUDA_OR_DIE(cudaMallocHost(reinterpret_cast<void**>(&h), kBytes));

  const double t0 = now_ms();
  for (int k = 0; k < kIterations; ++k) {
    const int seed = first_seed + k;
    xlog_block input = allocate(rt, kBytes, st.s1, "input");
    xlog_block out1 = allocate(rt, kBytes, st.s2, "out1");
    xlog_block out2 = allocate(rt, kBytes, st.s3, "out2");
    xlog_block result = allocate(rt, kBytes, st.s4, "result");

    maybe_tracked(tracked, rt, st.s1, {use(input, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
      delay_kernel<<<1, 1, 0, s>>>(5 * kMs);
      produce_kernel<<<grid, kThreads, 0, s>>>(as<uint32_t>(input), kCount, seed);
    });
    maybe_tracked(tracked, rt, st.s2, {use(input, XLOG_ACCESS_READ), use(out1, XLOG_ACCESS_WRITE)},
                  [&](cudaStream_t s) {
                    delay_kernel<<<1, 1, 0, s>>>(30 * kMs);
                    transform1_kernel<<<grid, kThreads, 0, s>>>(as<const uint32_t>(input), as<uint32_t>(out1), kCount);
                  });
    maybe_tracked(tracked, rt, st.s3, {use(input, XLOG_ACCESS_READ), use(out2, XLOG_ACCESS_WRITE)},
                  [&](cudaStream_t s) {
                    delay_kernel<<<1, 1, 0, s>>>(15 * kMs);
                    transform2_kernel<<<grid, kThreads, 0, s>>>(as<const uint32_t>(input), as<uint32_t>(out2), kCount);
                  });
    maybe_tracked(tracked, rt, st.s4,
                  {use(out1, XLOG_ACCESS_READ), use(out2, XLOG_ACCESS_READ), use(result, XLOG_ACCESS_WRITE)},
                  [&](cudaStream_t s) {
                    reduce_kernel<<<grid, kThreads, 0, s>>>(as<const uint32_t>(out1), as<const uint32_t>(out2),
                                                            as<uint32_t>(result), kCount);
                  });
    maybe_tracked(tracked, rt, st.s4, {use(result, XLOG_ACCESS_READ)}, [&](cudaStream_t s) {
      CUDA_OR_DIE(cudaMemcpyAsync(host[k], result.ptr, kBytes, cudaMemcpyDeviceToHost, s));
    });

    // Free everything now; each free waits on its block's other-stream users
    // (none are known to the runtime in the control).
    for (const xlog_block& b : {input, out1, out2, result}) XLOG_OR_DIE(xlog_deallocate(rt, b));
  }
  const double enqueue_ms = now_ms() - t0;
  for (const Stream& s : {st.s1, st.s2, st.s3, st.s4}) CUDA_OR_DIE(cudaStreamSynchronize(s.native));
  std::printf("%s: %d iterations enqueued in %.2f ms, completed in %.2f ms\n", tracked ? "tracked" : "control",
              kIterations, enqueue_ms, now_ms() - t0);

  std::vector<size_t> wrong(kIterations, 0);
  for (int k = 0; k < kIterations; ++k) {
    size_t first_wrong = kCount;
    for (size_t i = 0; i < kCount; ++i) {
      const uint32_t v = produced(first_seed + k, i);
      if (host[k][i] != transform1(v) + transform2(v) && wrong[k]++ == 0) first_wrong = i;
    }
    if (wrong[k] > 0) {
      const uint32_t v = produced(first_seed + k, first_wrong);
      std::printf("%s: iteration %d: %zu of %zu elements wrong; first at %zu: got %u, expected %u\n",
                  tracked ? "tracked" : "control", k, wrong[k], kCount, first_wrong, host[k][first_wrong],
                  transform1(v) + transform2(v));
    }
  }
  for (uint32_t* h : host) CUDA_OR_DIE(cudaFreeHost(h));
  return wrong;
}

}  // namespace

int main() {
  skip_without_device();
  // The byte counts checked here are the driver pool's (a block holds its
  // own size, frees pend until reaped); the arena's are in tests/arena.rs
  // and the W7/W8/W11/W12 benchmarks.
  g_test_memory = XLOG_MEMORY_POOL;
  xlog_runtime* rt = open_cuda();
  Streams st{acquire(rt), acquire(rt), acquire(rt), acquire(rt)};
  const xlog_stats start = stats(rt);

  std::vector<size_t> wrong = run_pipeline(rt, st, true, 0);
  for (int k = 0; k < kIterations; ++k) {
    check(wrong[k] == 0, "iteration " + std::to_string(k) + ": every result element is out1 + out2 of its own input",
          str(wrong[k]) + " of " + str(kCount) + " elements wrong");
  }

  xlog_stats s = stats(rt);
  check(s.allocations - start.allocations == 4u * kIterations &&
            s.deallocations - start.deallocations == 4u * kIterations,
        "the runtime counted every allocation and free",
        "allocations +" + str(s.allocations - start.allocations) + ", deallocations +" +
            str(s.deallocations - start.deallocations));
  check(s.live_blocks == 0 && s.live_bytes == 0, "no block is live after the pipeline",
        "live blocks " + str(s.live_blocks));
  // The first iteration takes four blocks from the driver; every later one
  // reuses them from the streams' caches, so xlog never holds more.
  check(s.cache_misses - start.cache_misses == 4u && s.cache_hits - start.cache_hits == 4u * (kIterations - 1),
        "iterations after the first are served from the caches",
        "misses +" + str(s.cache_misses - start.cache_misses) + ", hits +" + str(s.cache_hits - start.cache_hits));
  check(s.peak_outstanding_bytes == 4 * kBytes, "the peak is one iteration's four blocks",
        "peak " + str(s.peak_outstanding_bytes));
  check(s.cached_bytes == 4 * kBytes && s.outstanding_bytes == 4 * kBytes && s.pending_bytes == 0,
        "the four freed blocks wait in the caches",
        "cached " + str(s.cached_bytes) + ", outstanding " + str(s.outstanding_bytes));
  const uint64_t released = trim_and_drain(rt);
  s = stats(rt);
  check(released == 4 * kBytes && s.pending_bytes == 0 && s.pending_blocks == 0 && s.outstanding_bytes == 0,
        "xlog_trim hands the cached blocks back and nothing stays pending",
        "released " + str(released) + ", pending " + str(s.pending_bytes) + ", outstanding " +
            str(s.outstanding_bytes));

  // Negative control: the same pipeline with no prepare/finish must go wrong
  // (the reducer does not wait for the delayed transforms), proving that the
  // checks above can fail. Its seeds differ from the tracked run's, so stale
  // memory left by that run cannot look right by accident. It frees memory
  // that kernels still use, so it does not run under compute-sanitizer.
  if (under_sanitizer()) {
    note("negative control not run under compute-sanitizer (it frees blocks in use on purpose)");
  } else {
    std::vector<size_t> control = run_pipeline(rt, st, false, 100);
    size_t total = 0;
    for (size_t w : control) total += w;
    check(total > 0, "control: without prepare/finish the pipeline produces wrong results",
          "every element of every iteration came out right");
    trim_and_drain(rt);
  }

  for (const Stream& stream : {st.s1, st.s2, st.s3, st.s4}) XLOG_OR_DIE(xlog_stream_release(rt, stream.id));
  close_expect_no_leaks(rt, "close reports no leaks");
  return summary();
}
