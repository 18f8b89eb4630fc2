// Cross-stream ordering through xlog_prepare / xlog_finish, on a real GPU.
//
// Each case runs one launch shape twice: once bracketed by prepare/finish
// (the runtime must order the streams, and the result must be right) and
// once without (a negative control that must show the wrong result, proving
// the first run passed because of the runtime and not by luck or because the
// GPU happened to serialize the kernels). The "early" kernel of each shape
// spins for ~100 ms on the GPU's global timer before touching the block, so
// the unordered run races deterministically.
//
// Cases:
//   read after write:   writer on A (slow), reader on B
//   write after read:   readers on B (slow) and C (less slow), writer on A;
//                       the writer must wait for BOTH readers, not only the
//                       last one recorded
//   write after write:  writer on A (slow), writer on B; the final value
//                       must be B's
//   recycled events:    RAW then an overwrite on C, after which the events
//                       of A's and B's launches go back to the runtime's
//                       event pool and unrelated launches on an idle stream
//                       D record them again; waits already queued must not
//                       be released by those newer records
//   first use elsewhere: a block allocated on A, whose memory A's cache
//                       took back from a block still being written by a slow
//                       kernel queued earlier on A, is first written on B
//                       through prepare/finish: B's write must land after
//                       A's earlier work (the allocation counts as a write on A)
//
// Every kernel also reports the global time of its access into page-locked
// host memory, so the order is checked directly, not only through values.

#include "test_support.cu"

using namespace xlog_test;

namespace {

constexpr uint32_t kOld = 0x01d01d01u;
constexpr uint32_t kNew = 0x0e110e11u;
constexpr uint32_t kSecond = 0x5ec0d0d0u;
constexpr uint64_t kLongSpin = 100 * kMs;
constexpr uint64_t kShortSpin = 20 * kMs;

// What a kernel saw and when it touched the block.
struct Probe {
  unsigned long long value;
  unsigned long long at_ns;
};

__global__ void set_kernel(uint32_t* cell, uint32_t value) { *cell = value; }

// Spin for `delay`, then write `value`, then report the time of the write.
__global__ void write_kernel(uint32_t* cell, uint32_t value, uint64_t delay, Probe* probe) {
  spin_for(delay);
  *reinterpret_cast<volatile uint32_t*>(cell) = value;
  __threadfence();
  probe->value = value;
  probe->at_ns = global_ns();
  __threadfence_system();
}

// Spin for `delay`, then read the cell and report what and when.
__global__ void read_kernel(const uint32_t* cell, uint64_t delay, Probe* probe) {
  spin_for(delay);
  probe->at_ns = global_ns();
  probe->value = *reinterpret_cast<const volatile uint32_t*>(cell);
  __threadfence_system();
}

__global__ void fill_kernel(uint32_t* data, size_t count, uint32_t value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    data[i] = value;
  }
}

__global__ void load_kernel(const uint32_t* cell, Probe* probe) {
  probe->value = *reinterpret_cast<const volatile uint32_t*>(cell);
  probe->at_ns = global_ns();
  __threadfence_system();
}

struct Fixture {
  xlog_runtime* rt;
  Stream a, b, c, d;
};

// A fresh one-cell block on A holding kOld, with the initial write complete
// (and recorded, so it is the block's last write).
xlog_block fresh_cell(Fixture& f, const char* tag) {
  xlog_block cell = allocate(f.rt, 256, f.a, tag);
  launch(f.rt, f.a, {use(cell, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    set_kernel<<<1, 1, 0, s>>>(static_cast<uint32_t*>(cell.ptr), kOld);
  });
  CUDA_OR_DIE(cudaStreamSynchronize(f.a.native));
  return cell;
}

void sync_all(Fixture& f) {
  CUDA_OR_DIE(cudaStreamSynchronize(f.a.native));
  CUDA_OR_DIE(cudaStreamSynchronize(f.b.native));
  CUDA_OR_DIE(cudaStreamSynchronize(f.c.native));
  CUDA_OR_DIE(cudaStreamSynchronize(f.d.native));
}

std::string hex(unsigned long long v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%08llx", v);
  return buf;
}

std::string ms_between(unsigned long long from_ns, unsigned long long to_ns) {
  double ms = (static_cast<double>(to_ns) - static_cast<double>(from_ns)) / 1e6;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f ms", ms);
  return buf;
}

// A negative control that did not show the race: a failure normally, a note
// under compute-sanitizer (whose tools may serialize kernels).
void control_check(bool race_seen, const std::string& name, const std::string& detail) {
  if (race_seen) {
    check(true, name);
  } else if (under_sanitizer()) {
    note(name + ": race not observed under compute-sanitizer (kernels likely serialized): " + detail);
  } else {
    check(false, name + " (could not demonstrate the race; a 100 ms head start should make it deterministic)",
          detail);
  }
}

// ---------------------------------------------------------------------------

void read_after_write(Fixture& f, bool tracked) {
  const std::string label = tracked ? "RAW with prepare/finish" : "RAW control without prepare/finish";
  xlog_block cell = fresh_cell(f, tracked ? "raw-cell" : "raw-cell-control");
  HostProbe<Probe> writer, reader;
  uint32_t* p = static_cast<uint32_t*>(cell.ptr);

  if (tracked) XLOG_OR_DIE(xlog_prepare(f.rt, cell, f.a.id, XLOG_ACCESS_WRITE));
  write_kernel<<<1, 1, 0, f.a.native>>>(p, kNew, kLongSpin, writer.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  if (tracked) XLOG_OR_DIE(xlog_finish(f.rt, cell, f.a.id, XLOG_ACCESS_WRITE));

  if (tracked) XLOG_OR_DIE(xlog_prepare(f.rt, cell, f.b.id, XLOG_ACCESS_READ));
  load_kernel<<<1, 1, 0, f.b.native>>>(p, reader.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  if (tracked) XLOG_OR_DIE(xlog_finish(f.rt, cell, f.b.id, XLOG_ACCESS_READ));
  sync_all(f);

  const std::string detail = "reader saw " + hex(reader[0].value) + " " +
                             ms_between(writer[0].at_ns, reader[0].at_ns) + " after the write (old " +
                             hex(kOld) + ", new " + hex(kNew) + ")";
  if (tracked) {
    check(reader[0].value == kNew, label + ": reader on B sees the value written on A", detail);
    check(reader[0].at_ns >= writer[0].at_ns, label + ": reader ran after the writer finished", detail);
  } else {
    control_check(reader[0].value == kOld && reader[0].at_ns < writer[0].at_ns,
                  label + ": reader on B sees the OLD value", detail);
  }
  XLOG_OR_DIE(xlog_deallocate(f.rt, cell));
}

void write_after_read(Fixture& f, bool tracked) {
  const std::string label = tracked ? "WAR with prepare/finish" : "WAR control without prepare/finish";
  xlog_block cell = fresh_cell(f, tracked ? "war-cell" : "war-cell-control");
  HostProbe<Probe> slow_reader, fast_reader, writer;
  uint32_t* p = static_cast<uint32_t*>(cell.ptr);

  // The slow reader is recorded first; the fast one second. A runtime that
  // kept only the latest reader would let the writer overtake the slow one.
  if (tracked) XLOG_OR_DIE(xlog_prepare(f.rt, cell, f.b.id, XLOG_ACCESS_READ));
  read_kernel<<<1, 1, 0, f.b.native>>>(p, kLongSpin, slow_reader.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  if (tracked) XLOG_OR_DIE(xlog_finish(f.rt, cell, f.b.id, XLOG_ACCESS_READ));

  if (tracked) XLOG_OR_DIE(xlog_prepare(f.rt, cell, f.c.id, XLOG_ACCESS_READ));
  read_kernel<<<1, 1, 0, f.c.native>>>(p, kShortSpin, fast_reader.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  if (tracked) XLOG_OR_DIE(xlog_finish(f.rt, cell, f.c.id, XLOG_ACCESS_READ));

  if (tracked) XLOG_OR_DIE(xlog_prepare(f.rt, cell, f.a.id, XLOG_ACCESS_WRITE));
  write_kernel<<<1, 1, 0, f.a.native>>>(p, kNew, 0, writer.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  if (tracked) XLOG_OR_DIE(xlog_finish(f.rt, cell, f.a.id, XLOG_ACCESS_WRITE));
  sync_all(f);

  const std::string detail = "slow reader (B) saw " + hex(slow_reader[0].value) + ", fast reader (C) saw " +
                             hex(fast_reader[0].value) + "; write at slow-read " +
                             ms_between(slow_reader[0].at_ns, writer[0].at_ns) + ", fast-read " +
                             ms_between(fast_reader[0].at_ns, writer[0].at_ns);
  if (tracked) {
    check(slow_reader[0].value == kOld, label + ": slow reader on B still sees the old value", detail);
    check(fast_reader[0].value == kOld, label + ": fast reader on C still sees the old value", detail);
    check(writer[0].at_ns >= slow_reader[0].at_ns && writer[0].at_ns >= fast_reader[0].at_ns,
          label + ": writer on A ran after both readers", detail);
  } else {
    control_check(slow_reader[0].value == kNew && writer[0].at_ns < slow_reader[0].at_ns,
                  label + ": slow reader sees the NEW value (writer overtook it)", detail);
  }
  XLOG_OR_DIE(xlog_deallocate(f.rt, cell));
}

void write_after_write(Fixture& f, bool tracked) {
  const std::string label = tracked ? "WAW with prepare/finish" : "WAW control without prepare/finish";
  xlog_block cell = fresh_cell(f, tracked ? "waw-cell" : "waw-cell-control");
  HostProbe<Probe> first, second, final_read;
  uint32_t* p = static_cast<uint32_t*>(cell.ptr);

  if (tracked) XLOG_OR_DIE(xlog_prepare(f.rt, cell, f.a.id, XLOG_ACCESS_WRITE));
  write_kernel<<<1, 1, 0, f.a.native>>>(p, kNew, kLongSpin, first.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  if (tracked) XLOG_OR_DIE(xlog_finish(f.rt, cell, f.a.id, XLOG_ACCESS_WRITE));

  if (tracked) XLOG_OR_DIE(xlog_prepare(f.rt, cell, f.b.id, XLOG_ACCESS_WRITE));
  write_kernel<<<1, 1, 0, f.b.native>>>(p, kSecond, 0, second.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  if (tracked) XLOG_OR_DIE(xlog_finish(f.rt, cell, f.b.id, XLOG_ACCESS_WRITE));
  sync_all(f);

  // Read the final value in order after both (tracked, so it waits for B).
  XLOG_OR_DIE(xlog_prepare(f.rt, cell, f.c.id, XLOG_ACCESS_READ));
  load_kernel<<<1, 1, 0, f.c.native>>>(p, final_read.ptr);
  CUDA_OR_DIE(cudaGetLastError());
  XLOG_OR_DIE(xlog_finish(f.rt, cell, f.c.id, XLOG_ACCESS_READ));
  sync_all(f);

  const std::string detail = "final value " + hex(final_read[0].value) + " (A wrote " + hex(kNew) + ", B wrote " +
                             hex(kSecond) + "); B's write " + ms_between(first[0].at_ns, second[0].at_ns) +
                             " after A's";
  if (tracked) {
    check(final_read[0].value == kSecond, label + ": the later writer (B) wins", detail);
    check(second[0].at_ns >= first[0].at_ns, label + ": B wrote after A", detail);
  } else {
    control_check(final_read[0].value == kNew && second[0].at_ns < first[0].at_ns,
                  label + ": the slow writer (A) overwrites B", detail);
  }
  XLOG_OR_DIE(xlog_deallocate(f.rt, cell));
}

// The slow writer's and the reader's events are recycled while the waits for
// them are still queued. Tracked only: the runtime's event pool is what is
// under test (on the sim backend this once released the waits early).
void recycled_events(Fixture& f) {
  const std::string label = "recycled events";
  xlog_block cell = fresh_cell(f, "recycled-cell");
  xlog_block scratch = allocate(f.rt, 256, f.d, "unrelated");
  HostProbe<Probe> writer, reader, overwriter, final_read;
  uint32_t* p = static_cast<uint32_t*>(cell.ptr);

  launch(f.rt, f.a, {use(cell, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    write_kernel<<<1, 1, 0, s>>>(p, kNew, kLongSpin, writer.ptr);
  });
  launch(f.rt, f.b, {use(cell, XLOG_ACCESS_READ)}, [&](cudaStream_t s) { load_kernel<<<1, 1, 0, s>>>(p, reader.ptr); });
  // C's write replaces the last write and clears the readers: A's and B's
  // events are now referenced only by the waits queued on B and C.
  launch(f.rt, f.c, {use(cell, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    write_kernel<<<1, 1, 0, s>>>(p, kSecond, 0, overwriter.ptr);
  });
  // Two unrelated launches on the idle stream D take those two events from
  // the pool and record them again; D has nothing queued, so both complete
  // at once, while A is still spinning.
  for (int i = 0; i < 2; ++i) launch(f.rt, f.d, {use(scratch, XLOG_ACCESS_WRITE)}, [](cudaStream_t) {});
  CUDA_OR_DIE(cudaStreamSynchronize(f.d.native));
  launch(f.rt, f.d, {use(cell, XLOG_ACCESS_READ)}, [&](cudaStream_t s) { load_kernel<<<1, 1, 0, s>>>(p, final_read.ptr); });
  sync_all(f);

  const std::string detail = "reader saw " + hex(reader[0].value) + " " +
                             ms_between(writer[0].at_ns, reader[0].at_ns) + " after the write; overwrite " +
                             ms_between(reader[0].at_ns, overwriter[0].at_ns) + " after the read; final " +
                             hex(final_read[0].value);
  check(reader[0].value == kNew && reader[0].at_ns >= writer[0].at_ns,
        label + ": the reader on B still waited for the slow writer on A", detail);
  check(overwriter[0].at_ns >= writer[0].at_ns && overwriter[0].at_ns >= reader[0].at_ns,
        label + ": the overwrite on C still waited for the writer and the reader", detail);
  check(final_read[0].value == kSecond, label + ": the overwrite is the final value", detail);
  XLOG_OR_DIE(xlog_deallocate(f.rt, scratch));
  XLOG_OR_DIE(xlog_deallocate(f.rt, cell));
}

// Memory is valid in the allocation stream's order only: A's cache hands
// out again, on A and at once, memory that a free on A gave back while A's
// earlier work on it is still pending (cuMemAllocAsync's pool may do the
// same with the cache off). Another stream must wait
// for A before its first use; the runtime does this by treating the
// allocation as the block's first write: prepare on a block with no
// recorded use, from another stream, records a fence on A and waits on it.
// Here a slow kernel queued on A would otherwise write the old owner's data
// over B's write.
void first_use_on_another_stream(Fixture& f) {
  const std::string label = "first use on another stream";
  constexpr size_t kCount = 1u << 16;
  constexpr uint64_t kBytes = kCount * sizeof(uint32_t);
  const unsigned threads = 256, grid = grid_for(kCount, threads);

  xlog_block previous = allocate(f.rt, kBytes, f.a, "previous-owner");
  launch(f.rt, f.a, {use(previous, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    delay_kernel<<<1, 1, 0, s>>>(kLongSpin);
    fill_kernel<<<grid, threads, 0, s>>>(static_cast<uint32_t*>(previous.ptr), kCount, kOld);
  });
  XLOG_OR_DIE(xlog_deallocate(f.rt, previous));
  xlog_block block = allocate(f.rt, kBytes, f.a, "new-owner");
  const bool reused = block.ptr == previous.ptr;
  launch(f.rt, f.b, {use(block, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    fill_kernel<<<grid, threads, 0, s>>>(static_cast<uint32_t*>(block.ptr), kCount, kNew);
  });
  sync_all(f);
  std::vector<uint32_t> host = copy_to_host<uint32_t>(f.rt, block, f.b);
  size_t old_values = 0, other = 0;
  for (uint32_t v : host) {
    old_values += v == kOld;
    other += v != kOld && v != kNew;
  }
  check(reused, label + ": A's cache handed the freed block's memory out again (the gap under test)");
  check(old_values == 0 && other == 0,
        label + ": B's write to a block allocated on A lands after A's earlier work",
        str(old_values) + " of " + str(kCount) + " elements hold the previous owner's " + hex(kOld) +
            " written later by the slow kernel on A, " + str(other) + " hold neither value" +
            (reused ? " (address reused)" : ""));
  XLOG_OR_DIE(xlog_deallocate(f.rt, block));
}

// Same-stream use needs no wait and must still be correct.
void same_stream(Fixture& f) {
  xlog_block cell = fresh_cell(f, "same-stream-cell");
  HostProbe<Probe> writer, reader;
  uint32_t* p = static_cast<uint32_t*>(cell.ptr);
  launch(f.rt, f.a, {use(cell, XLOG_ACCESS_WRITE)}, [&](cudaStream_t s) {
    write_kernel<<<1, 1, 0, s>>>(p, kNew, kShortSpin, writer.ptr);
  });
  launch(f.rt, f.a, {use(cell, XLOG_ACCESS_READ)}, [&](cudaStream_t s) { load_kernel<<<1, 1, 0, s>>>(p, reader.ptr); });
  sync_all(f);
  check(reader[0].value == kNew && reader[0].at_ns >= writer[0].at_ns,
        "same stream: a later read sees the earlier write", "read " + hex(reader[0].value));
  XLOG_OR_DIE(xlog_deallocate(f.rt, cell));
}

}  // namespace

int main() {
  skip_without_device();
  Fixture f{open_cuda(), {}, {}, {}, {}};
  f.a = acquire(f.rt);
  f.b = acquire(f.rt);
  f.c = acquire(f.rt);
  f.d = acquire(f.rt);

  read_after_write(f, true);
  read_after_write(f, false);
  write_after_read(f, true);
  write_after_read(f, false);
  write_after_write(f, true);
  write_after_write(f, false);
  recycled_events(f);
  same_stream(f);
  first_use_on_another_stream(f);

  // Freed blocks wait in the caches until trimmed.
  trim_and_drain(f.rt);
  xlog_stats s = stats(f.rt);
  check(s.live_blocks == 0 && s.pending_blocks == 0 && s.cached_bytes == 0 && s.outstanding_bytes == 0,
        "every block freed, trimmed and drained",
        "live " + str(s.live_blocks) + ", pending " + str(s.pending_blocks) + ", outstanding " +
            str(s.outstanding_bytes));
  for (Stream* stream : {&f.a, &f.b, &f.c, &f.d}) XLOG_OR_DIE(xlog_stream_release(f.rt, stream->id));
  close_expect_no_leaks(f.rt, "close reports no leaks");
  return summary();
}
