// Streams made per query, on a real GPU: an engine that creates a stream
// for each query, imports it into xlog, allocates and runs kernels on it,
// hands its result to a long-lived stream, frees, releases the import and
// destroys the stream. Each query's sizes differ a little, so blocks land
// in the regions earlier queries' streams left.
//
// Checks:
//   - every query's result, read on the long-lived stream after its
//     producer's stream was destroyed, is intact;
//   - xlog makes no CUDA call on a destroyed stream: scripts/gpu-check runs
//     this under compute-sanitizer, which fails the run on any API error
//     (an event recorded on, or a wait queued on, a destroyed stream is one;
//     on CUDA it is undefined, the handle may be another stream's by then);
//   - the memory held stays near the live peak (no region and pages kept
//     per stream): at most the live peak in 2 MiB pages plus 1/32 and
//     four pages.

#include "test_support.cu"

using namespace xlog_test;

namespace {

constexpr int kQueries = 48;
constexpr uint64_t kPage = 2ull << 20;

__global__ void triple_plus_one_kernel(const uint32_t* from, uint32_t* to, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    to[i] = from[i] * 3u + 1u;
  }
}

void run() {
  xlog_runtime* rt = open_cuda();
  const Stream keep = acquire(rt);
  size_t wrong_total = 0;
  int queries_wrong = 0;
  for (int q = 0; q < kQueries; ++q) {
    // The query's stream, made and imported as an engine would.
    cudaStream_t native = nullptr;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&native, cudaStreamNonBlocking));
    Stream s;
    s.native = native;
    XLOG_OR_DIE(xlog_stream_import(rt, native, &s.id));

    const size_t count = (size_t{1} << 18) + static_cast<size_t>(q) * 20011u;  // ~1-5 MiB a block
    const uint32_t seed = 0x5eed0000u + static_cast<uint32_t>(q);
    xlog_block input = allocate(rt, count * sizeof(uint32_t), s, "input");
    xlog_block scratch = allocate(rt, 2 * count * sizeof(uint32_t), s, "scratch");
    // The result lives on the long-lived stream; the query's stream writes it.
    xlog_block result = allocate(rt, count * sizeof(uint32_t), keep, "result");
    const unsigned threads = 256, grid = grid_for(count, threads);
    launch(rt, s, {use(input, XLOG_ACCESS_WRITE)}, [&](cudaStream_t st) {
      fill_pattern_kernel<<<grid, threads, 0, st>>>(static_cast<uint32_t*>(input.ptr), count, seed);
    });
    launch(rt, s, {use(input, XLOG_ACCESS_READ), use(scratch, XLOG_ACCESS_WRITE)}, [&](cudaStream_t st) {
      triple_plus_one_kernel<<<grid, threads, 0, st>>>(static_cast<const uint32_t*>(input.ptr),
                                                        static_cast<uint32_t*>(scratch.ptr), count);
    });
    launch(rt, s, {use(scratch, XLOG_ACCESS_READ), use(result, XLOG_ACCESS_WRITE)}, [&](cudaStream_t st) {
      copy_words_kernel<<<grid, threads, 0, st>>>(static_cast<const uint32_t*>(scratch.ptr),
                                                   static_cast<uint32_t*>(result.ptr), count);
    });
    XLOG_OR_DIE(xlog_deallocate(rt, input));
    XLOG_OR_DIE(xlog_deallocate(rt, scratch));
    XLOG_OR_DIE(xlog_stream_release(rt, s.id));
    CUDA_OR_DIE(cudaStreamDestroy(native));

    // Read on the long-lived stream, after the writer's stream is gone.
    std::vector<uint32_t> host = copy_to_host<uint32_t>(rt, result, keep);
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += host[i] != pattern(seed, i) * 3u + 1u;
    wrong_total += wrong;
    queries_wrong += wrong != 0;
    XLOG_OR_DIE(xlog_deallocate(rt, result));
  }
  check(queries_wrong == 0, "every query's result is intact after its stream was destroyed",
        str(static_cast<unsigned long long>(queries_wrong)) + " queries, " +
            str(static_cast<unsigned long long>(wrong_total)) + " words wrong");
  CUDA_OR_DIE(cudaDeviceSynchronize());
  const xlog_stats st = stats(rt);
  const uint64_t live_pages = (st.peak_live_bytes + kPage - 1) / kPage;
  const uint64_t bound = (live_pages + live_pages / 32 + 4) * kPage;
  check(st.peak_outstanding_bytes <= bound, "the memory held stays near the live peak across the streams",
        "held peak " + str(st.peak_outstanding_bytes) + " bytes, live peak " + str(st.peak_live_bytes) +
            ", bound " + str(bound) + ", pages mapped " + str(st.pages_mapped));
  note("held peak " + str(st.peak_outstanding_bytes >> 20) + " MiB, live peak " + str(st.peak_live_bytes >> 20) +
       " MiB, pages mapped " + str(st.pages_mapped) + ", unmapped " + str(st.pages_unmapped));
  XLOG_OR_DIE(xlog_stream_release(rt, keep.id));
  close_expect_no_leaks(rt, "close reports no leaks");
}

}  // namespace

int main() {
  skip_without_device();
  run();
  return summary();
}
