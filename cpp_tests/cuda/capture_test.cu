// CUDA stream capture through xlog, on a GPU (issue 13, item 3).
//
// 1. A multi-stream pipeline captured into one graph with
//    xlog_capture_begin/xlog_capture_end on stream P:
//      P  (producer):  ctr += 1; T1 = f(ctr, i); A = g(T1); T1 freed
//      R1 (reader 1):  after a delay, out1 = r1(A)
//      R2 (reader 2):  T2 (allocated on R2 once it is in the capture) =
//                      A ^ mask; out2 = r2(T2); T2 freed
//      W  (writer):    after a delay, A = w(ctr, i)  (overwrites A after both
//                      readers)
//      P  (join):      T3 = out1 + out2; B = T3 ^ A; T3 freed
//    R1, R2 and W enter the capture only through xlog_prepare (the captured
//    event waits on A's producer and readers), and P joins them back through
//    xlog_prepare of out1, out2 and A. A, B, T1, T2 and T3 come from the
//    capture's private memory; ctr, out1 and out2 are ordinary blocks
//    allocated before the capture. The graph is instantiated and replayed
//    1,000 times on a launch stream L, each launch inside
//    xlog_prepare_all/xlog_finish_all, in batches of 10 launches enqueued
//    back to back; every output of every replay is copied back and checked
//    (replay k must see ctr = k). Then the graph is destroyed; releasing the
//    capture is refused while A and B are live, and accepted once they are
//    freed, and the runtime's figures are back where they were before the
//    capture.
// 2. A capture an xlog call could have broken, shown not to break: while P
//    captures (global capture mode), xlog_reap, xlog_trim, a synchronize of
//    an unrelated stream and an allocate/launch/free on that stream; P still
//    captures and the capture ends into a graph that launches.
// 3. The refusals: prepare on the capturing P of a block whose writer (a
//    long kernel on another stream, outside the capture) is still running,
//    and prepare on a non-capturing stream of a block last used inside the
//    capture, are XLOG_ERR_STREAM_MISUSE and leave the capture active.
//
// Every delay makes a missing graph edge visible: without the fork edges the
// readers would read A before it is produced, without the edges from the
// readers to W they would read the overwritten A, without the join B would
// combine stale values. There is no negative control: without xlog's event
// waits the readers would not be in the capture at all.

#include "test_support.cu"

using namespace xlog_test;

namespace {

constexpr size_t kCount = 1u << 16;  // 256 KiB of uint32 per block
constexpr uint64_t kBytes = kCount * sizeof(uint32_t);
constexpr int kReplays = 1000;
constexpr int kBatch = 10;  // replays enqueued back to back between host checks
constexpr unsigned kThreads = 256;
constexpr uint64_t kUs = 1000;  // nanoseconds per microsecond

__host__ __device__ inline uint32_t produced(uint32_t k, size_t i) {
  return static_cast<uint32_t>(i) * 2654435761u + k * 0x9e3779b9u;
}
__host__ __device__ inline uint32_t shaped(uint32_t v) { return v * 3u + 1u; }
__host__ __device__ inline uint32_t read1(uint32_t a) { return a + 0x01234567u; }
__host__ __device__ inline uint32_t temp2(uint32_t a) { return a ^ 0x5a5a5a5au; }
__host__ __device__ inline uint32_t read2(uint32_t t) { return t * 5u; }
__host__ __device__ inline uint32_t overwritten(uint32_t k, size_t i) {
  return static_cast<uint32_t>(i) * 7u + k * 13u + 0x70000000u;
}

#define GRID_STRIDE(i, count) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (count); i += size_t(gridDim.x) * blockDim.x)

__global__ void bump_kernel(uint32_t* ctr) { ctr[0] += 1u; }
__global__ void produce_kernel(const uint32_t* ctr, uint32_t* t1, size_t n) {
  const uint32_t k = ctr[0];
  GRID_STRIDE(i, n) t1[i] = produced(k, i);
}
__global__ void shape_kernel(const uint32_t* t1, uint32_t* a, size_t n) { GRID_STRIDE(i, n) a[i] = shaped(t1[i]); }
__global__ void read1_kernel(const uint32_t* a, uint32_t* out1, size_t n) { GRID_STRIDE(i, n) out1[i] = read1(a[i]); }
__global__ void temp2_kernel(const uint32_t* a, uint32_t* t2, size_t n) { GRID_STRIDE(i, n) t2[i] = temp2(a[i]); }
__global__ void read2_kernel(const uint32_t* t2, uint32_t* out2, size_t n) { GRID_STRIDE(i, n) out2[i] = read2(t2[i]); }
__global__ void overwrite_kernel(const uint32_t* ctr, uint32_t* a, size_t n) {
  const uint32_t k = ctr[0];
  GRID_STRIDE(i, n) a[i] = overwritten(k, i);
}
__global__ void sum_kernel(const uint32_t* out1, const uint32_t* out2, uint32_t* t3, size_t n) {
  GRID_STRIDE(i, n) t3[i] = out1[i] + out2[i];
}
__global__ void combine_kernel(const uint32_t* t3, const uint32_t* a, uint32_t* b, size_t n) {
  GRID_STRIDE(i, n) b[i] = t3[i] ^ a[i];
}
__global__ void fill_kernel(uint32_t* p, uint32_t value, size_t n) { GRID_STRIDE(i, n) p[i] = value; }

template <class T>
T* as(const xlog_block& b) {
  return static_cast<T*>(b.ptr);
}

unsigned grid() { return grid_for(kCount, kThreads); }

// The capture state of a stream, as the driver sees it.
cudaStreamCaptureStatus capture_status(const Stream& s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_OR_DIE(cudaStreamIsCapturing(s.native, &status));
  return status;
}

const char* status_name(cudaStreamCaptureStatus s) {
  switch (s) {
    case cudaStreamCaptureStatusNone: return "none";
    case cudaStreamCaptureStatusActive: return "active";
    case cudaStreamCaptureStatusInvalidated: return "INVALIDATED";
  }
  return "?";
}

void expect_capturing(const Stream& s, const std::string& name) {
  const cudaStreamCaptureStatus status = capture_status(s);
  check(status == cudaStreamCaptureStatusActive, name, std::string("capture status ") + status_name(status));
}

size_t node_count(cudaGraph_t graph) {
  size_t nodes = 0;
  CUDA_OR_DIE(cudaGraphGetNodes(graph, nullptr, &nodes));
  return nodes;
}

std::string figures(const xlog_stats& s) {
  return "outstanding " + str(s.outstanding_bytes) + ", live " + str(s.live_bytes) + " B / " + str(s.live_blocks) +
         " blocks, cached " + str(s.cached_bytes) + ", pending " + str(s.pending_bytes) + ", budget remaining " +
         str(s.budget_remaining);
}

bool same_figures(const xlog_stats& a, const xlog_stats& b) {
  return a.outstanding_bytes == b.outstanding_bytes && a.live_bytes == b.live_bytes &&
         a.live_blocks == b.live_blocks && a.cached_bytes == b.cached_bytes && a.pending_bytes == b.pending_bytes &&
         a.budget_remaining == b.budget_remaining;
}

struct Streams {
  Stream p, r1, r2, w, launch;
};

// Ordinary blocks (allocated outside any capture) the graph uses.
struct Ordinary {
  xlog_block ctr, out1, out2;
};

struct Graph {
  cudaGraph_t graph = nullptr;
  uint64_t id = 0;
  xlog_block a{}, b{};  // capture blocks, live after the capture
};

// ---------------------------------------------------------------------------
// Part 1: the pipeline

Graph capture_pipeline(xlog_runtime* rt, const Streams& st, const Ordinary& o) {
  const unsigned g = grid();
  Graph c;
  XLOG_OR_DIE(xlog_capture_begin(rt, st.p.id, XLOG_CAPTURE_GLOBAL));
  expect_capturing(st.p, "pipeline: xlog_capture_begin puts P into capture");

  c.a = allocate(rt, kBytes, st.p, "capture.A");
  c.b = allocate(rt, kBytes, st.p, "capture.B");
  xlog_block t1 = allocate(rt, kBytes, st.p, "capture.T1");
  launch(rt, st.p, {use(o.ctr, XLOG_ACCESS_READ_WRITE), use(t1, XLOG_ACCESS_WRITE), use(c.a, XLOG_ACCESS_WRITE)},
         [&](cudaStream_t s) {
           bump_kernel<<<1, 1, 0, s>>>(as<uint32_t>(o.ctr));
           produce_kernel<<<g, kThreads, 0, s>>>(as<const uint32_t>(o.ctr), as<uint32_t>(t1), kCount);
           shape_kernel<<<g, kThreads, 0, s>>>(as<const uint32_t>(t1), as<uint32_t>(c.a), kCount);
         });
  XLOG_OR_DIE(xlog_deallocate(rt, t1));  // a temporary freed inside the capture

  // R1: forked into the capture by the wait on A's producer.
  check(capture_status(st.r1) == cudaStreamCaptureStatusNone, "pipeline: R1 is not capturing before its prepare");
  launch(rt, st.r1, {use(c.a, XLOG_ACCESS_READ), use(o.out1, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    delay_kernel<<<1, 1, 0, s>>>(200 * kUs);
    read1_kernel<<<g, kThreads, 0, s>>>(as<const uint32_t>(c.a), as<uint32_t>(o.out1), kCount);
  });
  expect_capturing(st.r1, "pipeline: xlog_prepare of A on R1 forked R1 into the capture");

  // R2: the prepare of A forks it; T2 is then allocated on a capturing
  // stream, so from the capture's memory.
  XLOG_OR_DIE(xlog_prepare(rt, c.a, st.r2.id, XLOG_ACCESS_READ));
  expect_capturing(st.r2, "pipeline: xlog_prepare of A on R2 forked R2 into the capture");
  xlog_block t2 = allocate(rt, kBytes, st.r2, "capture.T2");
  const std::vector<xlog_use> r2_rest{use(o.out2, XLOG_ACCESS_WRITE), use(t2, XLOG_ACCESS_WRITE)};
  XLOG_OR_DIE(xlog_prepare_all(rt, st.r2.id, r2_rest.data(), r2_rest.size()));
  delay_kernel<<<1, 1, 0, st.r2.native>>>(100 * kUs);
  temp2_kernel<<<g, kThreads, 0, st.r2.native>>>(as<const uint32_t>(c.a), as<uint32_t>(t2), kCount);
  read2_kernel<<<g, kThreads, 0, st.r2.native>>>(as<const uint32_t>(t2), as<uint32_t>(o.out2), kCount);
  CUDA_OR_DIE(cudaGetLastError());
  const std::vector<xlog_use> r2_all{use(c.a, XLOG_ACCESS_READ), use(o.out2, XLOG_ACCESS_WRITE),
                                     use(t2, XLOG_ACCESS_WRITE)};
  XLOG_OR_DIE(xlog_finish_all(rt, st.r2.id, r2_all.data(), r2_all.size()));
  XLOG_OR_DIE(xlog_deallocate(rt, t2));

  // W: overwrites A once both readers are done with it.
  launch(rt, st.w, {use(o.ctr, XLOG_ACCESS_READ), use(c.a, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    delay_kernel<<<1, 1, 0, s>>>(100 * kUs);
    overwrite_kernel<<<g, kThreads, 0, s>>>(as<const uint32_t>(o.ctr), as<uint32_t>(c.a), kCount);
  });
  expect_capturing(st.w, "pipeline: xlog_prepare of A (write) on W forked W into the capture");

  // The join: P waits for R1 (out1), R2 (out2) and W (A).
  xlog_block t3 = allocate(rt, kBytes, st.p, "capture.T3");
  launch(rt, st.p,
         {use(o.out1, XLOG_ACCESS_READ), use(o.out2, XLOG_ACCESS_READ), use(c.a, XLOG_ACCESS_READ),
          use(t3, XLOG_ACCESS_WRITE), use(c.b, XLOG_ACCESS_WRITE)},
         [&](cudaStream_t s) {
           sum_kernel<<<g, kThreads, 0, s>>>(as<const uint32_t>(o.out1), as<const uint32_t>(o.out2),
                                             as<uint32_t>(t3), kCount);
           combine_kernel<<<g, kThreads, 0, s>>>(as<const uint32_t>(t3), as<const uint32_t>(c.a),
                                                 as<uint32_t>(c.b), kCount);
         });
  XLOG_OR_DIE(xlog_deallocate(rt, t3));
  expect_capturing(st.p, "pipeline: P still captures after the whole pipeline was enqueued");

  void* graph = nullptr;
  expect_status(xlog_capture_end(rt, st.p.id, &graph, &c.id), XLOG_OK,
                "pipeline: xlog_capture_end succeeds (every forked stream was joined)");
  if (graph == nullptr) die("xlog_capture_end returned no graph");
  c.graph = static_cast<cudaGraph_t>(graph);
  for (const Stream* s : {&st.p, &st.r1, &st.r2, &st.w}) {
    if (capture_status(*s) != cudaStreamCaptureStatusNone) die("a stream still captures after xlog_capture_end");
  }
  return c;
}

// Host copies of one replay's outputs.
struct Slot {
  uint32_t* ctr = nullptr;
  uint32_t *a = nullptr, *b = nullptr, *out1 = nullptr, *out2 = nullptr;
};

// The number of wrong elements of replay k (prints the first).
size_t check_replay(const Slot& s, uint32_t k) {
  if (s.ctr[0] != k) {
    std::printf("replay %u: ctr is %u\n", k, s.ctr[0]);
    return kCount;
  }
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const uint32_t a0 = shaped(produced(k, i));
    const uint32_t o1 = read1(a0), o2 = read2(temp2(a0)), aw = overwritten(k, i), b = (o1 + o2) ^ aw;
    const bool ok = s.out1[i] == o1 && s.out2[i] == o2 && s.a[i] == aw && s.b[i] == b;
    if (!ok && wrong++ == 0) {
      std::printf("replay %u element %zu: out1 %u (want %u), out2 %u (want %u), A %u (want %u), B %u (want %u)\n", k,
                  i, s.out1[i], o1, s.out2[i], o2, s.a[i], aw, s.b[i], b);
    }
  }
  return wrong;
}

void run_pipeline(xlog_runtime* rt, const Streams& st) {
  const unsigned g = grid();
  Ordinary o;
  o.ctr = allocate(rt, sizeof(uint32_t), st.p, "ctr");
  o.out1 = allocate(rt, kBytes, st.r1, "out1");
  o.out2 = allocate(rt, kBytes, st.r2, "out2");
  // Zero the counter and fill the outputs with a value no replay produces
  // where it is checked; then let all of it complete, so that the
  // capture's dependencies on this work are ones the driver has finished.
  launch(rt, st.p, {use(o.ctr, XLOG_ACCESS_WRITE)},
         [&](cudaStream_t s) { CUDA_OR_DIE(cudaMemsetAsync(o.ctr.ptr, 0, sizeof(uint32_t), s)); });
  launch(rt, st.r1, {use(o.out1, XLOG_ACCESS_WRITE)},
         [&](cudaStream_t s) { fill_kernel<<<g, kThreads, 0, s>>>(as<uint32_t>(o.out1), 0xdeadbeefu, kCount); });
  launch(rt, st.r2, {use(o.out2, XLOG_ACCESS_WRITE)},
         [&](cudaStream_t s) { fill_kernel<<<g, kThreads, 0, s>>>(as<uint32_t>(o.out2), 0xdeadbeefu, kCount); });
  for (const Stream* s : {&st.p, &st.r1, &st.r2, &st.w, &st.launch}) XLOG_OR_DIE(xlog_stream_synchronize(rt, s->id));
  trim_and_drain(rt);
  const xlog_stats before = stats(rt);

  Graph c = capture_pipeline(rt, st, o);
  const size_t nodes = node_count(c.graph);
  check(nodes >= 12, "pipeline: the graph holds the pipeline's kernels", str(nodes) + " nodes");

  xlog_stats s = stats(rt);
  check(s.live_blocks == before.live_blocks + 2 && s.live_bytes >= before.live_bytes + 2 * kBytes,
        "pipeline: A and B are live after the capture, the temporaries are not",
        "before: " + figures(before) + "; after: " + figures(s));
  check(s.outstanding_bytes >= before.outstanding_bytes + 2 * kBytes &&
            before.budget_remaining - s.budget_remaining == s.outstanding_bytes - before.outstanding_bytes,
        "pipeline: the capture's memory is charged to the budget",
        "before: " + figures(before) + "; after: " + figures(s));

  cudaGraphExec_t exec = nullptr;
  CUDA_OR_DIE(cudaGraphInstantiate(&exec, c.graph, 0));

  std::vector<Slot> slots(kBatch);
  for (Slot& slot : slots) {
    CUDA_OR_DIE(cudaMallocHost(reinterpret_cast<void**>(&slot.ctr), sizeof(uint32_t)));
    for (uint32_t** p : {&slot.a, &slot.b, &slot.out1, &slot.out2})
      CUDA_OR_DIE(cudaMallocHost(reinterpret_cast<void**>(p), kBytes));
  }
  // Everything the graph touches, as the graph touches it, and the reads of
  // the copies back.
  const std::vector<xlog_use> graph_uses{use(o.ctr, XLOG_ACCESS_READ_WRITE), use(c.a, XLOG_ACCESS_READ_WRITE),
                                         use(c.b, XLOG_ACCESS_WRITE), use(o.out1, XLOG_ACCESS_WRITE),
                                         use(o.out2, XLOG_ACCESS_WRITE)};
  const std::vector<xlog_use> copy_uses{use(o.ctr, XLOG_ACCESS_READ), use(c.a, XLOG_ACCESS_READ),
                                        use(c.b, XLOG_ACCESS_READ), use(o.out1, XLOG_ACCESS_READ),
                                        use(o.out2, XLOG_ACCESS_READ)};
  const Stream& L = st.launch;
  int wrong_replays = 0;
  uint32_t first_wrong = 0;
  const double t0 = now_ms();
  for (int first = 1; first <= kReplays; first += kBatch) {
    for (int j = 0; j < kBatch; ++j) {
      launch(rt, L, graph_uses, [&](cudaStream_t s) { CUDA_OR_DIE(cudaGraphLaunch(exec, s)); });
      const Slot& slot = slots[static_cast<size_t>(j)];
      launch(rt, L, copy_uses, [&](cudaStream_t s) {
        CUDA_OR_DIE(cudaMemcpyAsync(slot.ctr, o.ctr.ptr, sizeof(uint32_t), cudaMemcpyDeviceToHost, s));
        CUDA_OR_DIE(cudaMemcpyAsync(slot.a, c.a.ptr, kBytes, cudaMemcpyDeviceToHost, s));
        CUDA_OR_DIE(cudaMemcpyAsync(slot.b, c.b.ptr, kBytes, cudaMemcpyDeviceToHost, s));
        CUDA_OR_DIE(cudaMemcpyAsync(slot.out1, o.out1.ptr, kBytes, cudaMemcpyDeviceToHost, s));
        CUDA_OR_DIE(cudaMemcpyAsync(slot.out2, o.out2.ptr, kBytes, cudaMemcpyDeviceToHost, s));
      });
    }
    XLOG_OR_DIE(xlog_stream_synchronize(rt, L.id));
    for (int j = 0; j < kBatch; ++j) {
      const uint32_t k = static_cast<uint32_t>(first + j);
      if (check_replay(slots[static_cast<size_t>(j)], k) != 0 && wrong_replays++ == 0) first_wrong = k;
    }
    if ((first - 1) % 100 == 0) trace("replays: 100 more checked");
  }
  std::printf("pipeline: %d replays in %.1f ms\n", kReplays, now_ms() - t0);
  check(wrong_replays == 0, "pipeline: every output of every one of 1000 replays is right",
        str(static_cast<unsigned long long>(wrong_replays)) + " replays wrong, the first is replay " +
            str(first_wrong));
  for (Slot& slot : slots) {
    for (uint32_t* p : {slot.ctr, slot.a, slot.b, slot.out1, slot.out2}) CUDA_OR_DIE(cudaFreeHost(p));
  }

  CUDA_OR_DIE(cudaGraphExecDestroy(exec));
  CUDA_OR_DIE(cudaGraphDestroy(c.graph));

  // Release is refused while a capture block is live, and changes nothing.
  const xlog_stats live = stats(rt);
  expect_status(xlog_capture_release(rt, c.id, nullptr), XLOG_ERR_STREAM_MISUSE,
                "pipeline: xlog_capture_release is refused while A and B are live");
  const xlog_stats refused = stats(rt);
  check(same_figures(live, refused), "pipeline: the refused release changed nothing",
        "before: " + figures(live) + "; after: " + figures(refused));

  XLOG_OR_DIE(xlog_deallocate(rt, c.a));
  XLOG_OR_DIE(xlog_deallocate(rt, c.b));
  const xlog_stats freed = stats(rt);
  uint64_t released = 0;
  expect_status(xlog_capture_release(rt, c.id, &released), XLOG_OK,
                "pipeline: xlog_capture_release once A and B are freed");
  const xlog_stats given_back = stats(rt);
  check(released >= 2 * kBytes && freed.outstanding_bytes - given_back.outstanding_bytes == released,
        "pipeline: the release gives back the capture's memory, as much as it reports",
        "released " + str(released) + "; before the release: " + figures(freed) + "; after: " + figures(given_back));
  trim_and_drain(rt);
  const xlog_stats after = stats(rt);
  check(same_figures(before, after), "pipeline: the runtime's figures are back to where they were before the capture",
        "before: " + figures(before) + "; after: " + figures(after));
  const xlog_test::Captured again = capture(xlog_capture_release(rt, c.id, nullptr));
  check(again.status != XLOG_OK && !again.message.empty(), "pipeline: a second release of the same capture is refused",
        std::string(xlog_status_name(again.status)) + ": " + again.message);

  for (const xlog_block& b : {o.ctr, o.out1, o.out2}) XLOG_OR_DIE(xlog_deallocate(rt, b));
}

// ---------------------------------------------------------------------------
// Part 2: xlog calls that must not break a capture

void run_unbroken(xlog_runtime* rt, const Streams& st, const Stream& u) {
  const unsigned g = grid();
  // Give reap and trim something to do: a finished launch and a free on U
  // (cached), and a block written on U whose free is still in flight.
  xlog_block x = allocate(rt, kBytes, u, "unrelated.x");
  launch(rt, u, {use(x, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    delay_kernel<<<1, 1, 0, s>>>(20 * kMs);  // 20 ms: still running during the capture
    fill_kernel<<<g, kThreads, 0, s>>>(as<uint32_t>(x), 1u, kCount);
  });
  XLOG_OR_DIE(xlog_deallocate(rt, x));

  XLOG_OR_DIE(xlog_capture_begin(rt, st.p.id, XLOG_CAPTURE_GLOBAL));
  xlog_block cblock = allocate(rt, kBytes, st.p, "capture.C");
  launch(rt, st.p, {use(cblock, XLOG_ACCESS_WRITE)},
         [&](cudaStream_t s) { fill_kernel<<<g, kThreads, 0, s>>>(as<uint32_t>(cblock), 2u, kCount); });

  uint64_t reclaimed = 0;
  expect_status(xlog_reap(rt, &reclaimed), XLOG_OK, "unbroken: xlog_reap during a capture");
  expect_capturing(st.p, "unbroken: P still captures after xlog_reap");
  expect_status(xlog_trim(rt, 0, nullptr), XLOG_OK, "unbroken: xlog_trim(0) during a capture");
  expect_capturing(st.p, "unbroken: P still captures after xlog_trim");
  expect_status(xlog_stream_synchronize(rt, u.id), XLOG_OK,
                "unbroken: xlog_stream_synchronize of an unrelated stream during a capture");
  expect_capturing(st.p, "unbroken: P still captures after synchronizing an unrelated stream");
  xlog_block y{};
  expect_status(xlog_allocate(rt, kBytes, u.id, "unrelated.y", &y), XLOG_OK,
                "unbroken: xlog_allocate on an unrelated stream during a capture");
  launch(rt, u, {use(y, XLOG_ACCESS_WRITE)},
         [&](cudaStream_t s) { fill_kernel<<<g, kThreads, 0, s>>>(as<uint32_t>(y), 3u, kCount); });
  expect_status(xlog_deallocate(rt, y), XLOG_OK, "unbroken: xlog_deallocate on an unrelated stream during a capture");
  expect_capturing(st.p, "unbroken: P still captures after an allocate, launch and free on an unrelated stream");
  XLOG_OR_DIE(xlog_deallocate(rt, cblock));

  void* graph = nullptr;
  uint64_t id = 0;
  expect_status(xlog_capture_end(rt, st.p.id, &graph, &id), XLOG_OK, "unbroken: the capture ends into a graph");
  if (graph == nullptr) die("xlog_capture_end returned no graph");
  cudaGraphExec_t exec = nullptr;
  CUDA_OR_DIE(cudaGraphInstantiate(&exec, static_cast<cudaGraph_t>(graph), 0));
  CUDA_OR_DIE(cudaGraphLaunch(exec, st.launch.native));
  const cudaError_t done = cudaStreamSynchronize(st.launch.native);
  check(done == cudaSuccess, "unbroken: the graph launches and completes", cudaGetErrorName(done));
  CUDA_OR_DIE(cudaGraphExecDestroy(exec));
  CUDA_OR_DIE(cudaGraphDestroy(static_cast<cudaGraph_t>(graph)));
  expect_status(xlog_capture_release(rt, id, nullptr), XLOG_OK, "unbroken: xlog_capture_release");
  XLOG_OR_DIE(xlog_stream_synchronize(rt, u.id));
}

// ---------------------------------------------------------------------------
// Part 3: what a capture cannot do is refused, and the capture survives

void run_refusals(xlog_runtime* rt, const Streams& st, const Stream& other) {
  const unsigned g = grid();
  // Z is written on `other`, outside any capture, behind a 500 ms kernel.
  xlog_block z = allocate(rt, kBytes, other, "outside.Z");
  launch(rt, other, {use(z, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    delay_kernel<<<1, 1, 0, s>>>(500 * kMs);
    fill_kernel<<<g, kThreads, 0, s>>>(as<uint32_t>(z), 4u, kCount);
  });

  XLOG_OR_DIE(xlog_capture_begin(rt, st.p.id, XLOG_CAPTURE_GLOBAL));
  const xlog_stats before = stats(rt);
  const xlog_test::Captured got = capture(xlog_prepare(rt, z, st.p.id, XLOG_ACCESS_READ));
  expect_captured(got, XLOG_ERR_STREAM_MISUSE,
                  "refusals: prepare on a capturing stream of a block whose outside writer still runs");
  check(got.message.find("captur") != std::string::npos, "refusals: the message names the capture", got.message);
  expect_capturing(st.p, "refusals: the capture is still active after the refused prepare");

  // A block last used inside the capture, used on a stream that does not
  // capture (it would pull that stream into the capture).
  xlog_block cblock = allocate(rt, kBytes, st.p, "capture.C2");
  launch(rt, st.p, {use(cblock, XLOG_ACCESS_WRITE)},
         [&](cudaStream_t s) { fill_kernel<<<g, kThreads, 0, s>>>(as<uint32_t>(cblock), 5u, kCount); });
  const xlog_test::Captured outside = capture(xlog_prepare(rt, cblock, st.launch.id, XLOG_ACCESS_READ));
  expect_captured(outside, XLOG_ERR_STREAM_MISUSE,
                  "refusals: prepare on a non-capturing stream of a block last used in the capture");
  expect_capturing(st.p, "refusals: the capture is still active after the second refusal");
  check(capture_status(st.launch) == cudaStreamCaptureStatusNone,
        "refusals: the non-capturing stream was not pulled into the capture");
  XLOG_OR_DIE(xlog_deallocate(rt, cblock));
  const xlog_stats after = stats(rt);
  check(after.live_blocks == before.live_blocks, "refusals: the refusals left no block behind",
        "before: " + figures(before) + "; after: " + figures(after));

  void* graph = nullptr;
  uint64_t id = 0;
  expect_status(xlog_capture_end(rt, st.p.id, &graph, &id), XLOG_OK,
                "refusals: the capture still ends into a graph");
  // Still running after the capture ended, so it was running at the refusal.
  check(cudaStreamQuery(other.native) == cudaErrorNotReady, "refusals: Z's writer was still running at the refusal");
  if (graph != nullptr) CUDA_OR_DIE(cudaGraphDestroy(static_cast<cudaGraph_t>(graph)));
  expect_status(xlog_capture_release(rt, id, nullptr), XLOG_OK, "refusals: xlog_capture_release");

  // Outside the capture, Z's use is an ordinary one again.
  XLOG_OR_DIE(xlog_stream_synchronize(rt, other.id));
  XLOG_OR_DIE(xlog_deallocate(rt, z));
}

}  // namespace

int main() {
  skip_without_device();
  xlog_runtime* rt = open_cuda(1ull << 30);
  Streams st{acquire(rt), acquire(rt), acquire(rt), acquire(rt), acquire(rt)};
  Stream unrelated = acquire(rt);

  trace("pipeline");
  run_pipeline(rt, st);
  trace("unbroken");
  run_unbroken(rt, st, unrelated);
  trace("refusals");
  run_refusals(rt, st, unrelated);

  trim_and_drain(rt);
  const xlog_stats end = stats(rt);
  check(end.live_blocks == 0 && end.outstanding_bytes == 0, "nothing is held at the end", figures(end));
  for (const Stream* s : {&st.p, &st.r1, &st.r2, &st.w, &st.launch, &unrelated})
    XLOG_OR_DIE(xlog_stream_release(rt, s->id));
  close_expect_no_leaks(rt, "close reports no leaks");
  return summary();
}
