// benches/w11_engine.cu — W11 (issue 24): an engine workload in C++ through
// xlog's C ABI, against raw cudaMallocAsync and RMM's pool.
//
// Each query is a small relational pipeline with sizes drawn per query from
// a wide range (fixed seed, so every allocator runs the same queries):
//
//   stream A  dim(key, attr)   generated, then sorted by key (CUB radix sort)
//   stream B  fact(key, value) generated, then probed against the sorted dim
//             (binary search: a sort-merge join), a 0/1 match flag per row;
//             exclusive scan of the flags; the join's row count is computed
//             on the device and read back to the host, which allocates the
//             join output (attr, value) at exactly that size and scatters
//             into it; group-by attr with a sum: CUB radix sort by attr,
//             then CUB reduce-by-key; a checksum of the groups.
//
// Every intermediate is allocated per query at its size, and every CUB
// call asks for its temporary storage and gets it from the allocator under
// test. The dim table is written on stream A and read on stream B: through
// xlog that read is declared (xlog_prepare_all / xlog_finish_all around
// every launch, so every launch is recorded, and xlog inserts the waits);
// the other allocators get the least a hand-written engine needs: one
// event from A to B before the probe, and one from B to A before the dim's
// memory is freed on A. Four host threads each drive one stream as B and
// build their dims on the next stream, so several queries are in flight.
//
// Allocators (--allocator NAME; one per process, for a clean device peak):
//   xlog        xlog_runtime_open with xlog_config_init's defaults plus the
//               environment (XLOG_BACKEND, XLOG_BUDGET_BYTES, XLOG_CACHE,
//               XLOG_MEMORY, ... whatever the library reads); streams are
//               this program's, imported with xlog_stream_import
//   raw         cudaMallocAsync / cudaFreeAsync on the device's default
//               pool, release threshold 0 (the driver's default)
//   raw-max     the same with release threshold UINT64_MAX
//   rmm-pool    RMM pool_memory_resource over cuda_memory_resource (only in
//               a build with -DXLOG_WITH_RMM; initial pool --rmm-initial
//               bytes, default 0: the pool grows by doubling)
//   cudamalloc  cudaMalloc / cudaFree (a reference, not in the default set)
// Two diagnostics, not in the default set either, that split xlog's time:
//   xlog-hand   xlog's allocate and free with no prepare/finish, ordered
//               by hand with the raw peers' events: the allocator alone
//   raw-max-ev  raw-max plus one event recorded after every launch: what
//               a tracker's record per launch costs with no tracker
//
// --turns OTHER: a second allocator in the same process, with an engine of
// its own; every round is run by both, one after the other (the order
// swapped each round), so the two are timed on the same host within
// milliseconds (separate processes differed by up to 1.3x in round time on
// the GPU machine: BENCHMARKS.md, "fourteenth pass"). Adds the other's
// round times and the median of the per-round ratios to the JSON; both
// allocators hold their memory at once, so the device peak is theirs
// together (time only).
//
// Output: one JSON line on stdout (time per round: median of --rounds
// rounds of --queries queries each, after --warmup rounds; the NVML device
// peak above the process's baseline, sampled by a thread; for xlog its
// stats; the results' checksum), a readable line on stderr. The results
// (per query: groups, checksum of the group sums, total, joined rows) are
// compared between rounds and, for the first round, with a host reference;
// the checksum is the same for every allocator with the same seed and
// sizes. benches/w11_run.sh runs each allocator in its own process, twice,
// and tabulates the JSON.
//
// Exit status: 0 when it ran and the results are right, 1 on an error or a
// wrong result, 77 without a CUDA device.
//
// Built with the CUDA tests (cpp_tests/cuda/CMakeLists.txt) as w11_engine,
// so CI compiles it; w11_engine_rmm (with RMM) where -DRMM_ROOT is given.

#include <xlog_cuda.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_runtime_api.h>

#ifdef XLOG_WITH_RMM
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#endif

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using u32 = std::uint32_t;
using u64 = std::uint64_t;

// ---------------------------------------------------------------------------
// Errors: one JSON line saying what failed, then exit 1. Called from worker
// threads too, so it ends the process at once rather than unwinding.
// ---------------------------------------------------------------------------

std::string g_label = "unknown";

std::string json_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

[[noreturn]] void fail(const std::string& what) {
  static std::mutex once;
  once.lock();  // never unlocked: the first failure ends the process
  std::printf("{\"workload\":\"W11\",\"allocator\":\"%s\",\"status\":\"error\",\"error\":\"%s\"}\n",
              json_escape(g_label).c_str(), json_escape(what).c_str());
  std::fprintf(stderr, "w11_engine [%s]: error: %s\n", g_label.c_str(), what.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

std::string xlog_message() {
  const std::size_t length = xlog_last_error_message(nullptr, 0);
  std::string text(length + 1, '\0');
  xlog_last_error_message(&text[0], text.size());
  text.resize(length);
  return text;
}

void xlog_ok(xlog_status status, const char* what) {
  if (status != XLOG_OK) fail(std::string(what) + ": " + xlog_status_name(status) + ": " + xlog_message());
}

// A flat JSON object written field by field.
class Json {
 public:
  Json& num(const char* key, u64 value) { return raw(key, std::to_string(value)); }
  Json& num(const char* key, double value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4f", value);
    return raw(key, buf);
  }
  Json& str(const char* key, const std::string& value) { return raw(key, "\"" + json_escape(value) + "\""); }
  Json& null(const char* key) { return raw(key, "null"); }
  Json& raw(const char* key, const std::string& value) {
    if (!body_.empty()) body_ += ',';
    body_ += "\"" + json_escape(key) + "\":" + value;
    return *this;
  }
  std::string text() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

// ---------------------------------------------------------------------------
// The data: every row is a function of the query's parameters and its index,
// so the device generates the tables and the host recomputes the answer
// without either side storing anything.
// ---------------------------------------------------------------------------

// A bijection of 32-bit words (the MurmurHash3 finalizer: xor-shifts and
// multiplications by odd constants are each invertible), so distinct
// inputs give distinct keys.
__host__ __device__ inline u32 mix32(u32 h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

__host__ __device__ inline u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct QueryParams {
  u32 fact_rows;
  u32 dim_rows;
  u32 groups;      // attr values are in [0, groups)
  u32 fact_range;  // a fact row refers to dim row r in [0, fact_range): a match when r < dim_rows
  u32 key_salt, attr_salt, ref_salt, value_salt;
};

// Dim row i has key mix32(i ^ key_salt): unique, since both steps are
// bijections. A fact row referring to r >= dim_rows gets the key of a row
// that does not exist, so it matches nothing.
__host__ __device__ inline u32 row_key(const QueryParams& p, u32 row) { return mix32(row ^ p.key_salt); }
__host__ __device__ inline u32 dim_attr(const QueryParams& p, u32 row) {
  return mix32(row * 0x9e3779b1u + p.attr_salt) % p.groups;
}
__host__ __device__ inline u32 fact_ref(const QueryParams& p, u32 row) { return mix32(row ^ p.ref_salt) % p.fact_range; }
__host__ __device__ inline u32 fact_value(const QueryParams& p, u32 row) {
  return mix32(row * 0x2545f491u ^ p.value_salt) % 1000u;
}
// One group's contribution to a query's checksum; the checksum is a sum,
// so the order groups come out in does not matter.
__host__ __device__ inline u64 group_mix(u32 attr, u64 sum) {
  return mix64(static_cast<u64>(attr) * 0x9e3779b97f4a7c15ull ^ sum);
}

// What a query produces, 4 words: filled on the device, read back at once.
enum ResultWord { kGroups = 0, kChecksum = 1, kTotal = 2, kJoined = 3, kResultWords = 4 };

struct SplitMix {
  u64 state;
  u64 next() { return mix64(state += 0x9e3779b97f4a7c15ull); }
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
};

// Rows drawn log-uniformly from [2^lo, 2^hi].
u32 log_uniform(SplitMix& rng, int lo, int hi) {
  const double bits = lo + (hi - lo) * rng.unit();
  return static_cast<u32>(std::llround(std::exp2(bits)));
}

QueryParams make_query(u64 seed, int query, int fact_lo, int fact_hi) {
  SplitMix rng{seed ^ mix64(0x57311ull + static_cast<u64>(query))};
  QueryParams p{};
  p.fact_rows = log_uniform(rng, fact_lo, fact_hi);
  p.dim_rows = log_uniform(rng, std::max(fact_lo - 2, 4), std::max(fact_hi - 2, 4));
  p.groups = log_uniform(rng, 4, 16);
  p.fact_range = p.dim_rows + p.dim_rows / 4;  // about 80% of the fact rows match
  p.key_salt = static_cast<u32>(rng.next());
  p.attr_salt = static_cast<u32>(rng.next());
  p.ref_salt = static_cast<u32>(rng.next());
  p.value_salt = static_cast<u32>(rng.next());
  return p;
}

// The answer computed on the host, as the device must produce it.
void host_reference(const QueryParams& p, u64 out[kResultWords]) {
  std::vector<u64> sums(p.groups, 0);
  std::vector<unsigned char> present(p.groups, 0);
  u64 joined = 0;
  for (u32 row = 0; row < p.fact_rows; ++row) {
    const u32 ref = fact_ref(p, row);
    if (ref >= p.dim_rows) continue;
    const u32 attr = dim_attr(p, ref);
    sums[attr] += fact_value(p, row);
    present[attr] = 1;
    ++joined;
  }
  u64 groups = 0, checksum = 0, total = 0;
  for (u32 attr = 0; attr < p.groups; ++attr) {
    if (!present[attr]) continue;
    ++groups;
    checksum += group_mix(attr, sums[attr]);
    total += sums[attr];
  }
  out[kGroups] = groups;
  out[kChecksum] = checksum;
  out[kTotal] = total;
  out[kJoined] = joined;
}

// ---------------------------------------------------------------------------
// Kernels.
// ---------------------------------------------------------------------------

constexpr int kBlockThreads = 256;

inline unsigned grid_for(u64 items) {
  return static_cast<unsigned>(std::max<u64>(1, (items + kBlockThreads - 1) / kBlockThreads));
}

__global__ void generate_dim(QueryParams p, u32* keys, u32* attrs) {
  const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.dim_rows) return;
  keys[i] = row_key(p, i);
  attrs[i] = dim_attr(p, i);
}

__global__ void generate_fact(QueryParams p, u32* keys, u32* values) {
  const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.fact_rows) return;
  keys[i] = row_key(p, fact_ref(p, i));
  values[i] = fact_value(p, i);
}

// Sort-merge join, probe side: a lower bound in the sorted dim keys.
__global__ void probe(u32 fact_rows, const u32* fact_keys, u32 dim_rows, const u32* dim_keys_sorted,
                      const u32* dim_attrs_sorted, u32* match_flag, u32* match_attr) {
  const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= fact_rows) return;
  const u32 key = fact_keys[i];
  u32 lo = 0, hi = dim_rows;
  while (lo < hi) {
    const u32 mid = lo + (hi - lo) / 2;
    if (dim_keys_sorted[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const bool hit = lo < dim_rows && dim_keys_sorted[lo] == key;
  match_flag[i] = hit ? 1u : 0u;
  match_attr[i] = hit ? dim_attrs_sorted[lo] : 0u;
}

// The join's size: the exclusive scan's last entry plus the last flag.
__global__ void join_count(u32 rows, const u32* flags, const u32* positions, u64* result) {
  result[kJoined] = static_cast<u64>(positions[rows - 1]) + flags[rows - 1];
}

__global__ void scatter_join(u32 rows, const u32* flags, const u32* positions, const u32* match_attr,
                             const u32* values, u32* join_attr, u64* join_value) {
  const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows || flags[i] == 0) return;
  const u32 at = positions[i];
  join_attr[at] = match_attr[i];
  join_value[at] = values[i];
}

// Reads the number of groups reduce-by-key wrote into result[kGroups].
__global__ void checksum_groups(u32 capacity, const u32* attrs, const u64* sums, u64* result) {
  const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= capacity || i >= result[kGroups]) return;
  atomicAdd(reinterpret_cast<unsigned long long*>(&result[kChecksum]),
            static_cast<unsigned long long>(group_mix(attrs[i], sums[i])));
  atomicAdd(reinterpret_cast<unsigned long long*>(&result[kTotal]), static_cast<unsigned long long>(sums[i]));
}

struct SumU64 {
  __host__ __device__ u64 operator()(u64 a, u64 b) const { return a + b; }
};

// ---------------------------------------------------------------------------
// The allocators under test, behind one small interface the pipeline uses.
// ---------------------------------------------------------------------------

struct Buffer {
  void* ptr = nullptr;
  u64 bytes = 0;
  int stream = -1;         // index of the allocation stream
  xlog_block block{};      // xlog only
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
};

struct Use {
  const Buffer* buffer;
  xlog_access access;
};
inline Use reads(const Buffer& b) { return Use{&b, XLOG_ACCESS_READ}; }
inline Use writes(const Buffer& b) { return Use{&b, XLOG_ACCESS_WRITE}; }
inline Use updates(const Buffer& b) { return Use{&b, XLOG_ACCESS_READ_WRITE}; }

struct UseList {
  static constexpr std::size_t kCapacity = 10;
  Use items[kCapacity];
  std::size_t count = 0;
  UseList(std::initializer_list<Use> uses) {
    for (const Use& use : uses) add(use);
  }
  void add(const Use& use) {
    if (count == kCapacity) fail("UseList: more than 10 uses in one launch");
    items[count++] = use;
  }
};

class Allocator {
 public:
  explicit Allocator(std::vector<cudaStream_t> streams) : streams_(std::move(streams)) {}
  virtual ~Allocator() = default;
  virtual Buffer allocate(int lane, u64 bytes, int stream, const char* tag) = 0;
  // Free `buffer`, whose last use was enqueued on stream `last_use`.
  virtual void release(int lane, Buffer& buffer, int last_use) = 0;
  // Around every launch: xlog records the uses; the others need nothing.
  virtual void before_launch(int /*stream*/, const UseList& /*uses*/) {}
  virtual void after_launch(int /*stream*/, const UseList& /*uses*/) {}
  // Work on `consumer` enqueued after this call reads what `producer` wrote
  // so far (xlog learns that from the recorded launches instead).
  virtual void hand_over(int /*lane*/, int /*producer*/, int /*consumer*/) {}
  // Once, at the end, while everything is still alive.
  virtual void report(Json& /*json*/) {}
  // Called before the allocator is destroyed: leaks, closing.
  virtual void shut_down(Json& /*json*/) {}

  cudaStream_t stream(int index) const { return streams_[static_cast<std::size_t>(index)]; }
  int stream_count() const { return static_cast<int>(streams_.size()); }

 protected:
  std::vector<cudaStream_t> streams_;
};

// Hand-written cross-stream ordering for the allocators that track
// nothing: one event per host thread (lane), recorded and waited on at
// once, so it can be reused right away.
class LaneEvents {
 public:
  explicit LaneEvents(int lanes) : events_(static_cast<std::size_t>(lanes)) {
    for (cudaEvent_t& event : events_) cuda_ok(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  ~LaneEvents() {
    for (cudaEvent_t event : events_) (void)cudaEventDestroy(event);
  }
  LaneEvents(const LaneEvents&) = delete;
  LaneEvents& operator=(const LaneEvents&) = delete;
  // Work queued on `consumer` from here on runs after what `producer` has.
  void order(int lane, cudaStream_t producer, cudaStream_t consumer) {
    if (producer == consumer) return;
    cudaEvent_t event = events_[static_cast<std::size_t>(lane)];
    cuda_ok(cudaEventRecord(event, producer), "cudaEventRecord");
    cuda_ok(cudaStreamWaitEvent(consumer, event, 0), "cudaStreamWaitEvent");
  }

 private:
  std::vector<cudaEvent_t> events_;
};

// The allocators that track nothing, ordered by hand with LaneEvents.
class HandOrdered : public Allocator {
 public:
  HandOrdered(std::vector<cudaStream_t> streams, int lanes) : Allocator(std::move(streams)), events_(lanes) {}
  void hand_over(int lane, int producer, int consumer) override {
    events_.order(lane, stream(producer), stream(consumer));
  }
  void release(int lane, Buffer& buffer, int last_use) override {
    if (buffer.ptr != nullptr) {
      // Freed on its allocation stream, once the last reader is done.
      hand_over(lane, last_use, buffer.stream);
      free_on(buffer, buffer.stream);
    }
    buffer = Buffer{};
  }

 protected:
  virtual void free_on(Buffer& buffer, int stream) = 0;

 private:
  LaneEvents events_;
};

// raw / raw-max: the device's default memory pool.
class DriverPool : public HandOrdered {
 public:
  DriverPool(std::vector<cudaStream_t> streams, int lanes, int device, u64 release_threshold)
      : HandOrdered(std::move(streams), lanes), release_threshold_(release_threshold) {
    cuda_ok(cudaDeviceGetDefaultMemPool(&pool_, device), "cudaDeviceGetDefaultMemPool");
    cuda_ok(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &release_threshold_),
            "cudaMemPoolSetAttribute(ReleaseThreshold)");
    cuda_ok(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo");
    u64 zero = 0;  // setting a high watermark to 0 restarts it
    cuda_ok(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero), "reset ReservedMemHigh");
    zero = 0;
    cuda_ok(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero), "reset UsedMemHigh");
  }
  Buffer allocate(int, u64 bytes, int s, const char*) override {
    Buffer b;
    b.bytes = bytes;
    b.stream = s;
    if (bytes > 0) cuda_ok(cudaMallocAsync(&b.ptr, bytes, stream(s)), "cudaMallocAsync");
    return b;
  }
  void report(Json& json) override {
    json.num("release_threshold", release_threshold_);
    json.num("pool_reserved_high_bytes", attribute(cudaMemPoolAttrReservedMemHigh));
    json.num("pool_used_high_bytes", attribute(cudaMemPoolAttrUsedMemHigh));
    json.num("pool_reserved_bytes_end", attribute(cudaMemPoolAttrReservedMemCurrent));
  }

 protected:
  void free_on(Buffer& buffer, int s) override { cuda_ok(cudaFreeAsync(buffer.ptr, stream(s)), "cudaFreeAsync"); }

 private:
  u64 attribute(cudaMemPoolAttr attr) const {
    u64 value = 0;
    cuda_ok(cudaMemPoolGetAttribute(pool_, attr, &value), "cudaMemPoolGetAttribute");
    return value;
  }
  cudaMemPool_t pool_ = nullptr;
  u64 release_threshold_;
};

// cudamalloc: synchronous allocation (cudaFree waits for the device), and
// the allocator of the warm-up query that runs before the baseline.
class SyncMalloc : public HandOrdered {
 public:
  using HandOrdered::HandOrdered;
  Buffer allocate(int, u64 bytes, int s, const char*) override {
    Buffer b;
    b.bytes = bytes;
    b.stream = s;
    if (bytes > 0) cuda_ok(cudaMalloc(&b.ptr, bytes), "cudaMalloc");
    return b;
  }

 protected:
  void free_on(Buffer& buffer, int) override { cuda_ok(cudaFree(buffer.ptr), "cudaFree"); }
};

#ifdef XLOG_WITH_RMM
// rmm-pool: RMM's coalescing best-fit pool over cudaMalloc. It is thread
// safe and stream ordered; frees go back on the allocation stream.
class RmmPool : public HandOrdered {
 public:
  RmmPool(std::vector<cudaStream_t> streams, int lanes, u64 initial_bytes)
      : HandOrdered(std::move(streams), lanes), initial_bytes_(initial_bytes / 256 * 256) {
    try {
      pool_ = std::make_unique<rmm::mr::pool_memory_resource>(upstream_, static_cast<std::size_t>(initial_bytes_));
    } catch (const std::exception& e) {
      fail(std::string("rmm::mr::pool_memory_resource: ") + e.what());
    }
  }
  ~RmmPool() override { pool_.reset(); }
  Buffer allocate(int, u64 bytes, int s, const char*) override {
    Buffer b;
    b.bytes = bytes;
    b.stream = s;
    if (bytes == 0) return b;
    try {
      b.ptr = pool_->allocate(cuda::stream_ref{stream(s)}, static_cast<std::size_t>(bytes), kAlignment);
    } catch (const std::exception& e) {
      fail(std::string("rmm-pool allocate: ") + e.what());
    }
    return b;
  }
  void report(Json& json) override { json.num("rmm_initial_pool_bytes", initial_bytes_); }

 protected:
  void free_on(Buffer& buffer, int s) override {
    pool_->deallocate(cuda::stream_ref{stream(s)}, buffer.ptr, static_cast<std::size_t>(buffer.bytes), kAlignment);
  }

 private:
  static constexpr std::size_t kAlignment = 256;
  u64 initial_bytes_;
  rmm::mr::cuda_memory_resource upstream_;
  std::unique_ptr<rmm::mr::pool_memory_resource> pool_;
};
#endif

// Optional xlog_stats fields: reported when the header has them (the
// physical-memory fields of issue 24 are being added), without a build flag.
#define W11_OPTIONAL_STAT(field)                                                               \
  template <class S, class = void>                                                             \
  struct has_##field : std::false_type {};                                                     \
  template <class S>                                                                           \
  struct has_##field<S, std::void_t<decltype(std::declval<S&>().field)>> : std::true_type {};  \
  template <class S>                                                                           \
  void put_##field(Json& json, const S& stats) {                                               \
    if constexpr (has_##field<S>::value) json.num(#field, static_cast<u64>(stats.field));      \
  }
W11_OPTIONAL_STAT(held_bytes)
W11_OPTIONAL_STAT(peak_held_bytes)
W11_OPTIONAL_STAT(mapped_bytes)
W11_OPTIONAL_STAT(peak_mapped_bytes)
W11_OPTIONAL_STAT(peak_reserved_bytes)
#undef W11_OPTIONAL_STAT

class Xlog : public Allocator {
 public:
  Xlog(std::vector<cudaStream_t> streams, int device) : Allocator(std::move(streams)) {
    xlog_config config;
    xlog_config_init(&config);
    if (config.struct_size == 0) fail("xlog_config_init: malformed environment: " + xlog_message());
    xlog_ok(xlog_runtime_open(device, &config, &rt_), "xlog_runtime_open");
    xlog_backend backend = XLOG_BACKEND_AUTO;
    xlog_ok(xlog_runtime_backend(rt_, &backend), "xlog_runtime_backend");
    if (backend != XLOG_BACKEND_CUDA) fail("xlog opened the sim backend, not CUDA (XLOG_BACKEND?)");
    budget_bytes_ = config.budget_bytes;
    for (cudaStream_t native : streams_) {
      xlog_stream id = 0;
      xlog_ok(xlog_stream_import(rt_, native, &id), "xlog_stream_import");
      ids_.push_back(id);
    }
  }
  ~Xlog() override {
    if (rt_ != nullptr) (void)xlog_runtime_close(rt_);
  }
  Buffer allocate(int, u64 bytes, int s, const char* tag) override {
    Buffer b;
    b.bytes = bytes;
    b.stream = s;
    xlog_ok(xlog_allocate(rt_, bytes, ids_[static_cast<std::size_t>(s)], tag, &b.block), "xlog_allocate");
    b.ptr = b.block.ptr;
    return b;
  }
  void release(int, Buffer& buffer, int) override {
    // xlog knows every use: the allocation stream waits for them itself.
    if (buffer.stream >= 0) xlog_ok(xlog_deallocate(rt_, buffer.block), "xlog_deallocate");
    buffer = Buffer{};
  }
  void before_launch(int s, const UseList& uses) override {
    xlog_use list[UseList::kCapacity];
    const std::size_t n = convert(uses, list);
    xlog_ok(xlog_prepare_all(rt_, ids_[static_cast<std::size_t>(s)], list, n), "xlog_prepare_all");
  }
  void after_launch(int s, const UseList& uses) override {
    xlog_use list[UseList::kCapacity];
    const std::size_t n = convert(uses, list);
    xlog_ok(xlog_finish_all(rt_, ids_[static_cast<std::size_t>(s)], list, n), "xlog_finish_all");
  }
  void report(Json& json) override {
    xlog_stats stats{};
    stats.struct_size = sizeof(xlog_stats);
    xlog_ok(xlog_get_stats(rt_, &stats), "xlog_get_stats");
    json.str("xlog_version", xlog_version());
    json.num("budget_bytes", budget_bytes_);
    json.num("peak_live_bytes", stats.peak_live_bytes);
    json.num("peak_outstanding_bytes", stats.peak_outstanding_bytes);
    put_held_bytes(json, stats);
    put_peak_held_bytes(json, stats);
    put_mapped_bytes(json, stats);
    put_peak_mapped_bytes(json, stats);
    put_peak_reserved_bytes(json, stats);
    json.num("live_bytes_end", stats.live_bytes);
    json.num("cached_bytes_end", stats.cached_bytes);
    json.num("pending_bytes_end", stats.pending_bytes);
    json.num("outstanding_bytes_end", stats.outstanding_bytes);
    json.num("reserved_bytes_end", stats.reserved_bytes);
    json.num("xlog_allocations", stats.allocations);
    json.num("failed_allocations", stats.failed_allocations);
    json.num("alloc_retries", stats.alloc_retries);
    json.num("cache_hits", stats.cache_hits);
    json.num("cache_misses", stats.cache_misses);
    json.num("stats_struct_size", static_cast<u64>(sizeof(xlog_stats)));
  }
  void shut_down(Json& json) override {
    for (xlog_stream id : ids_) xlog_ok(xlog_stream_release(rt_, id), "xlog_stream_release");
    ids_.clear();
    u64 leaked_blocks = 0, leaked_bytes = 0;
    xlog_runtime* rt = std::exchange(rt_, nullptr);
    xlog_ok(xlog_runtime_close_report(rt, &leaked_blocks, &leaked_bytes), "xlog_runtime_close_report");
    json.num("leaked_blocks", leaked_blocks);
  }
  std::string summary() const {
    std::size_t needed = 0;
    if (xlog_memory_summary(rt_, nullptr, 0, &needed) != XLOG_OK || needed == 0) return "";
    std::string text(needed, '\0');
    if (xlog_memory_summary(rt_, &text[0], text.size(), &needed) != XLOG_OK) return "";
    text.resize(std::strlen(text.c_str()));
    return text;
  }

 private:
  static std::size_t convert(const UseList& uses, xlog_use* out) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < uses.count; ++i) {
      if (uses.items[i].buffer->bytes == 0) continue;  // a 0-byte block is never touched
      out[n].block = uses.items[i].buffer->block;
      out[n].access = uses.items[i].access;
      ++n;
    }
    return n;
  }

  xlog_runtime* rt_ = nullptr;
  std::vector<xlog_stream> ids_;
  u64 budget_bytes_ = 0;
};

// Two diagnostic variants (not in the default set): where xlog's time goes.
// xlog-hand: xlog's allocate and free, ordered by hand as the raw peers are
// (no prepare/finish): the allocator without the per-launch tracking.
class XlogHand : public Xlog {
 public:
  XlogHand(std::vector<cudaStream_t> streams, int device, int lanes) : Xlog(std::move(streams), device), events_(lanes) {}
  void before_launch(int, const UseList&) override {}
  void after_launch(int, const UseList&) override {}
  void hand_over(int lane, int producer, int consumer) override {
    events_.order(lane, stream(producer), stream(consumer));
  }
  void release(int lane, Buffer& buffer, int last_use) override {
    if (buffer.stream >= 0) hand_over(lane, last_use, buffer.stream);
    Xlog::release(lane, buffer, last_use);
  }

 private:
  LaneEvents events_;
};

// raw-max-ev: raw-max plus one event recorded after every launch (each
// host thread its own event), what a tracker's record per launch costs
// with no tracker around it.
class DriverPoolEvents : public DriverPool {
 public:
  using DriverPool::DriverPool;
  void after_launch(int s, const UseList&) override {
    thread_local cudaEvent_t event = nullptr;
    if (event == nullptr) cuda_ok(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cuda_ok(cudaEventRecord(event, stream(s)), "cudaEventRecord");
  }
};

// ---------------------------------------------------------------------------
// The pipeline.
// ---------------------------------------------------------------------------

class Engine {
 public:
  Engine(Allocator& alloc, u64* host_results) : alloc_(alloc), host_results_(host_results) {}

  u64 allocations() const { return allocations_.load(std::memory_order_relaxed); }

  // One query; the calling thread is `lane` and drives stream `lane` (B);
  // the dim table is built on the next stream (A).
  void run_query(int lane, int query, const QueryParams& p) {
    const int streams = alloc_.stream_count();
    const int b = lane % streams;
    const int a = (lane + 1) % streams;
    u64* host = host_results_ + static_cast<std::size_t>(query) * kResultWords;

    // ---- dim on stream A: generate, sort by key ----
    Buffer dim_key = allocate(lane, u64{4} * p.dim_rows, a, "dim_key");
    Buffer dim_attr = allocate(lane, u64{4} * p.dim_rows, a, "dim_attr");
    launch(a, {writes(dim_key), writes(dim_attr)}, [&](cudaStream_t s) {
      generate_dim<<<grid_for(p.dim_rows), kBlockThreads, 0, s>>>(p, dim_key.as<u32>(), dim_attr.as<u32>());
    });
    Buffer dim_key_sorted = allocate(lane, u64{4} * p.dim_rows, a, "dim_key_sorted");
    Buffer dim_attr_sorted = allocate(lane, u64{4} * p.dim_rows, a, "dim_attr_sorted");
    with_temp(lane, a, {reads(dim_key), reads(dim_attr), writes(dim_key_sorted), writes(dim_attr_sorted)},
              "sort_dim_temp", [&](void* temp, std::size_t& bytes, cudaStream_t s) {
                return cub::DeviceRadixSort::SortPairs(temp, bytes, dim_key.as<const u32>(), dim_key_sorted.as<u32>(),
                                                       dim_attr.as<const u32>(), dim_attr_sorted.as<u32>(),
                                                       static_cast<int>(p.dim_rows), 0, 32, s);
              });
    release(lane, dim_key, a);
    release(lane, dim_attr, a);
    alloc_.hand_over(lane, a, b);  // the sorted dim is read on B from here on

    // ---- fact on stream B: generate, probe ----
    Buffer fact_key = allocate(lane, u64{4} * p.fact_rows, b, "fact_key");
    Buffer fact_value = allocate(lane, u64{4} * p.fact_rows, b, "fact_value");
    launch(b, {writes(fact_key), writes(fact_value)}, [&](cudaStream_t s) {
      generate_fact<<<grid_for(p.fact_rows), kBlockThreads, 0, s>>>(p, fact_key.as<u32>(), fact_value.as<u32>());
    });
    Buffer flag = allocate(lane, u64{4} * p.fact_rows, b, "match_flag");
    Buffer match_attr = allocate(lane, u64{4} * p.fact_rows, b, "match_attr");
    launch(b, {reads(fact_key), reads(dim_key_sorted), reads(dim_attr_sorted), writes(flag), writes(match_attr)},
           [&](cudaStream_t s) {
             probe<<<grid_for(p.fact_rows), kBlockThreads, 0, s>>>(p.fact_rows, fact_key.as<const u32>(), p.dim_rows,
                                                                   dim_key_sorted.as<const u32>(),
                                                                   dim_attr_sorted.as<const u32>(), flag.as<u32>(),
                                                                   match_attr.as<u32>());
           });
    release(lane, fact_key, b);
    release(lane, dim_key_sorted, b);  // allocated on A, last read on B
    release(lane, dim_attr_sorted, b);

    // ---- the join's size, on the device, read back to size its output ----
    Buffer position = allocate(lane, u64{4} * p.fact_rows, b, "match_position");
    with_temp(lane, b, {reads(flag), writes(position)}, "scan_temp",
              [&](void* temp, std::size_t& bytes, cudaStream_t s) {
                return cub::DeviceScan::ExclusiveSum(temp, bytes, flag.as<const u32>(), position.as<u32>(),
                                                     static_cast<int>(p.fact_rows), s);
              });
    Buffer result = allocate(lane, u64{8} * kResultWords, b, "result");
    launch(b, {writes(result)}, [&](cudaStream_t s) {
      cuda_ok(cudaMemsetAsync(result.ptr, 0, result.bytes, s), "cudaMemsetAsync");
    });
    launch(b, {reads(flag), reads(position), updates(result)}, [&](cudaStream_t s) {
      join_count<<<1, 1, 0, s>>>(p.fact_rows, flag.as<const u32>(), position.as<const u32>(), result.as<u64>());
    });
    launch(b, {reads(result)}, [&](cudaStream_t s) {
      cuda_ok(cudaMemcpyAsync(&host[kJoined], result.as<u64>() + kJoined, sizeof(u64), cudaMemcpyDeviceToHost, s),
              "cudaMemcpyAsync(join size)");
    });
    cuda_ok(cudaStreamSynchronize(alloc_.stream(b)), "cudaStreamSynchronize(join size)");
    const u64 joined = host[kJoined];
    if (joined > p.fact_rows) fail("join size read back larger than the fact table");

    if (joined > 0) {
      // ---- materialise the join at its exact size ----
      Buffer join_attr = allocate(lane, 4 * joined, b, "join_attr");
      Buffer join_value = allocate(lane, 8 * joined, b, "join_value");
      launch(b,
             {reads(flag), reads(position), reads(match_attr), reads(fact_value), writes(join_attr),
              writes(join_value)},
             [&](cudaStream_t s) {
               scatter_join<<<grid_for(p.fact_rows), kBlockThreads, 0, s>>>(
                   p.fact_rows, flag.as<const u32>(), position.as<const u32>(), match_attr.as<const u32>(),
                   fact_value.as<const u32>(), join_attr.as<u32>(), join_value.as<u64>());
             });
      release(lane, flag, b);
      release(lane, position, b);
      release(lane, match_attr, b);
      release(lane, fact_value, b);

      // ---- group by attr, sum(value): sort by attr, reduce by key ----
      const int attr_bits = 32 - __builtin_clz((p.groups - 1) | 1u);  // bits of the largest attr
      Buffer sorted_attr = allocate(lane, 4 * joined, b, "sorted_attr");
      Buffer sorted_value = allocate(lane, 8 * joined, b, "sorted_value");
      with_temp(lane, b, {reads(join_attr), reads(join_value), writes(sorted_attr), writes(sorted_value)},
                "sort_join_temp", [&](void* temp, std::size_t& bytes, cudaStream_t s) {
                  return cub::DeviceRadixSort::SortPairs(temp, bytes, join_attr.as<const u32>(), sorted_attr.as<u32>(),
                                                         join_value.as<const u64>(), sorted_value.as<u64>(),
                                                         static_cast<int>(joined), 0, attr_bits, s);
                });
      release(lane, join_attr, b);
      release(lane, join_value, b);
      // At most one group per attr value, per dim row and per joined row:
      // a bound known on the host, so no second read-back.
      const u64 group_capacity = std::min<u64>({joined, p.groups, p.dim_rows});
      Buffer group_attr = allocate(lane, 4 * group_capacity, b, "group_attr");
      Buffer group_sum = allocate(lane, 8 * group_capacity, b, "group_sum");
      with_temp(lane, b, {reads(sorted_attr), reads(sorted_value), writes(group_attr), writes(group_sum), updates(result)},
                "reduce_temp", [&](void* temp, std::size_t& bytes, cudaStream_t s) {
                  return cub::DeviceReduce::ReduceByKey(temp, bytes, sorted_attr.as<const u32>(), group_attr.as<u32>(),
                                                        sorted_value.as<const u64>(), group_sum.as<u64>(),
                                                        result.as<u64>() + kGroups, SumU64{},
                                                        static_cast<int>(joined), s);
                });
      release(lane, sorted_attr, b);
      release(lane, sorted_value, b);
      launch(b, {reads(group_attr), reads(group_sum), updates(result)}, [&](cudaStream_t s) {
        checksum_groups<<<grid_for(group_capacity), kBlockThreads, 0, s>>>(
            static_cast<u32>(group_capacity), group_attr.as<const u32>(), group_sum.as<const u64>(), result.as<u64>());
      });
      release(lane, group_attr, b);
      release(lane, group_sum, b);
    } else {
      release(lane, flag, b);
      release(lane, position, b);
      release(lane, match_attr, b);
      release(lane, fact_value, b);
    }
    // The whole result; the host reads it once the round is over.
    launch(b, {reads(result)}, [&](cudaStream_t s) {
      cuda_ok(cudaMemcpyAsync(host, result.ptr, result.bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync(result)");
    });
    release(lane, result, b);
  }

 private:
  Buffer allocate(int lane, u64 bytes, int s, const char* tag) {
    allocations_.fetch_add(1, std::memory_order_relaxed);
    return alloc_.allocate(lane, bytes, s, tag);
  }
  void release(int lane, Buffer& buffer, int last_use) { alloc_.release(lane, buffer, last_use); }

  template <class Work>
  void launch(int s, const UseList& uses, Work&& work) {
    alloc_.before_launch(s, uses);
    work(alloc_.stream(s));
    cuda_ok(cudaPeekAtLastError(), "kernel launch");
    alloc_.after_launch(s, uses);
  }

  // A CUB call: ask for its temporary storage, allocate it, run, free it.
  template <class Call>
  void with_temp(int lane, int s, UseList uses, const char* tag, Call&& call) {
    std::size_t bytes = 0;
    cuda_ok(call(nullptr, bytes, alloc_.stream(s)), tag);
    Buffer temp = allocate(lane, bytes, s, tag);
    uses.add(writes(temp));
    launch(s, uses, [&](cudaStream_t stream) { cuda_ok(call(temp.ptr, bytes, stream), tag); });
    release(lane, temp, s);
  }

  Allocator& alloc_;
  u64* host_results_;
  std::atomic<u64> allocations_{0};
};

// ---------------------------------------------------------------------------
// NVML, loaded at run time: the device's used memory, sampled by a thread.
// ---------------------------------------------------------------------------

class DeviceMemorySampler {
 public:
  DeviceMemorySampler(int device, int interval_us) : interval_us_(interval_us) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      why_ = std::string("dlopen libnvidia-ml.so.1: ") + dlerror();
      return;
    }
    using InitFn = int (*)();
    using ByBusFn = int (*)(const char*, void**);
    using ByIndexFn = int (*)(unsigned, void**);
    auto init = reinterpret_cast<InitFn>(dlsym(lib_, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<ByBusFn>(dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    auto by_index = reinterpret_cast<ByIndexFn>(dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
    shutdown_ = reinterpret_cast<InitFn>(dlsym(lib_, "nvmlShutdown"));
    memory_info_ = reinterpret_cast<MemoryInfoFn>(dlsym(lib_, "nvmlDeviceGetMemoryInfo"));
    if (init == nullptr || by_bus == nullptr || by_index == nullptr || shutdown_ == nullptr || memory_info_ == nullptr) {
      why_ = "libnvidia-ml.so.1 lacks an entry point";
      return;
    }
    if (int rc = init(); rc != 0) {
      why_ = "nvmlInit_v2 returned " + std::to_string(rc);
      return;
    }
    initialized_ = true;
    // CUDA's ordinals and NVML's indices can differ: match by PCI bus id.
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess || by_bus(bus, &handle_) != 0) {
      if (by_index(static_cast<unsigned>(device), &handle_) != 0) {
        why_ = "NVML knows no device for CUDA ordinal " + std::to_string(device);
        handle_ = nullptr;
        return;
      }
    }
    u64 probe = 0;
    if (!read(probe)) {
      why_ = "nvmlDeviceGetMemoryInfo failed";
      handle_ = nullptr;
    }
  }
  ~DeviceMemorySampler() {
    stop();
    if (initialized_ && shutdown_ != nullptr) shutdown_();
    if (lib_ != nullptr) dlclose(lib_);
  }

  bool available() const { return handle_ != nullptr; }
  const std::string& why() const { return why_; }

  // The median of a few reads, with nothing of ours allocated.
  u64 baseline() {
    std::vector<u64> reads;
    for (int i = 0; i < 15; ++i) {
      u64 used = 0;
      if (read(used)) reads.push_back(used);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (reads.empty()) return 0;
    std::sort(reads.begin(), reads.end());
    return reads[reads.size() / 2];
  }

  void start() {
    if (!available()) return;
    running_.store(true);
    thread_ = std::thread([this] {
      while (running_.load(std::memory_order_relaxed)) {
        u64 used = 0;
        if (read(used)) {
          samples_.fetch_add(1, std::memory_order_relaxed);
          u64 seen = peak_.load(std::memory_order_relaxed);
          while (used > seen && !peak_.compare_exchange_weak(seen, used)) {
          }
        }
        std::this_thread::sleep_for(std::chrono::microseconds(interval_us_));
      }
    });
  }
  void stop() {
    if (thread_.joinable()) {
      running_.store(false);
      thread_.join();
    }
  }
  u64 peak() const { return peak_.load(); }
  u64 samples() const { return samples_.load(); }

 private:
  struct Memory {  // nvmlMemory_t (version 1)
    unsigned long long total, free, used;
  };
  using MemoryInfoFn = int (*)(void*, Memory*);
  bool read(u64& used) {
    Memory memory{};
    if (handle_ == nullptr || memory_info_(handle_, &memory) != 0) return false;
    used = memory.used;
    return true;
  }

  void* lib_ = nullptr;
  void* handle_ = nullptr;
  bool initialized_ = false;
  int (*shutdown_)() = nullptr;
  MemoryInfoFn memory_info_ = nullptr;
  std::string why_;
  int interval_us_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<u64> peak_{0};
  std::atomic<u64> samples_{0};
};

// ---------------------------------------------------------------------------
// Driver.
// ---------------------------------------------------------------------------

struct Options {
  std::string allocator;
  std::string label;
  std::string turns;
  int queries = 32;
  int rounds = 21;
  int warmup = 1;
  int streams = 4;
  int device = 0;
  u64 seed = 0x5eed0011ull;
  int fact_lo = 16, fact_hi = 23;
  bool verify = true;
  bool summary = false;
  int sample_us = 250;
  u64 rmm_initial = 0;
};

const char* kAllocators[] = {"xlog", "raw", "raw-max",
#ifdef XLOG_WITH_RMM
                             "rmm-pool",
#endif
                             "cudamalloc", "xlog-hand", "raw-max-ev"};

[[noreturn]] void usage(const char* program, int code) {
  std::fprintf(stderr,
               "usage: %s --allocator NAME [--turns OTHER] [--label TEXT] [--queries Q] [--rounds N] [--warmup W]\n"
               "          [--streams S] [--device D] [--seed X] [--fact-log2 LO:HI] [--no-verify]\n"
               "          [--sample-us US] [--rmm-initial BYTES] [--summary] | --list\n"
               "allocators in this build:",
               program);
  for (const char* name : kAllocators) std::fprintf(stderr, " %s", name);
  std::fprintf(stderr, "\n");
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> const char* {
    if (i + 1 >= argc) usage(argv[0], 2);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--allocator") {
      o.allocator = value(i);
    } else if (arg == "--label") {
      o.label = value(i);
    } else if (arg == "--turns") {
      o.turns = value(i);
    } else if (arg == "--queries") {
      o.queries = std::atoi(value(i));
    } else if (arg == "--rounds") {
      o.rounds = std::atoi(value(i));
    } else if (arg == "--warmup") {
      o.warmup = std::atoi(value(i));
    } else if (arg == "--streams") {
      o.streams = std::atoi(value(i));
    } else if (arg == "--device") {
      o.device = std::atoi(value(i));
    } else if (arg == "--seed") {
      o.seed = std::strtoull(value(i), nullptr, 0);
    } else if (arg == "--fact-log2") {
      if (std::sscanf(value(i), "%d:%d", &o.fact_lo, &o.fact_hi) != 2) usage(argv[0], 2);
    } else if (arg == "--no-verify") {
      o.verify = false;
    } else if (arg == "--sample-us") {
      o.sample_us = std::atoi(value(i));
    } else if (arg == "--rmm-initial") {
      o.rmm_initial = std::strtoull(value(i), nullptr, 0);
    } else if (arg == "--summary") {
      o.summary = true;
    } else if (arg == "--list") {
      for (const char* name : kAllocators) std::printf("%s\n", name);
      std::exit(0);
    } else if (arg == "-h" || arg == "--help") {
      usage(argv[0], 0);
    } else {
      std::fprintf(stderr, "w11_engine: unknown argument %s\n", arg.c_str());
      usage(argv[0], 2);
    }
  }
  if (o.allocator.empty() || o.turns == o.allocator) usage(argv[0], 2);
  if (o.label.empty()) o.label = o.allocator;
  if (o.queries < 1 || o.rounds < 1 || o.warmup < 0 || o.streams < 1 || o.streams > 64 || o.sample_us < 10 ||
      o.fact_lo < 4 || o.fact_hi < o.fact_lo || o.fact_hi > 28) {
    std::fprintf(stderr, "w11_engine: an option is out of range\n");
    usage(argv[0], 2);
  }
  return o;
}

std::unique_ptr<Allocator> make_allocator(const Options& o, const std::vector<cudaStream_t>& streams) {
  const int lanes = o.streams;
  if (o.allocator == "xlog") return std::make_unique<Xlog>(streams, o.device);
  if (o.allocator == "raw") return std::make_unique<DriverPool>(streams, lanes, o.device, 0);
  if (o.allocator == "raw-max") return std::make_unique<DriverPool>(streams, lanes, o.device, UINT64_MAX);
  if (o.allocator == "xlog-hand") return std::make_unique<XlogHand>(streams, o.device, lanes);
  if (o.allocator == "raw-max-ev") return std::make_unique<DriverPoolEvents>(streams, lanes, o.device, UINT64_MAX);
  if (o.allocator == "cudamalloc") return std::make_unique<SyncMalloc>(streams, lanes);
#ifdef XLOG_WITH_RMM
  if (o.allocator == "rmm-pool") return std::make_unique<RmmPool>(streams, lanes, o.rmm_initial);
#else
  if (o.allocator == "rmm-pool") fail("rmm-pool: this binary was built without RMM (use w11_engine_rmm)");
#endif
  fail("unknown allocator " + o.allocator);
}

// One round: every query once, lane t running queries t, t+S, t+2S, ...
double run_round(Engine& engine, const std::vector<QueryParams>& queries, int lanes, int device) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int lane = 0; lane < lanes; ++lane) {
    threads.emplace_back([&, lane] {
      cuda_ok(cudaSetDevice(device), "cudaSetDevice");
      for (int q = lane; q < static_cast<int>(queries.size()); q += lanes) {
        engine.run_query(lane, q, queries[static_cast<std::size_t>(q)]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::string hex(u64 value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, value);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  g_label = o.label;
  // Load every kernel when the context is made, so the baseline below
  // already holds the modules (lazy loading would add them during round 1).
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);

  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count <= o.device) {
    std::fprintf(stderr, "w11_engine: SKIP: no CUDA device %d\n", o.device);
    return 77;
  }
  cuda_ok(cudaSetDevice(o.device), "cudaSetDevice");
  cuda_ok(cudaFree(nullptr), "cudaFree(nullptr): context");

  std::vector<cudaStream_t> streams(static_cast<std::size_t>(o.streams));
  for (cudaStream_t& s : streams) cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");

  std::vector<QueryParams> queries;
  u64 fact_rows_per_round = 0;
  for (int q = 0; q < o.queries; ++q) {
    queries.push_back(make_query(o.seed, q, o.fact_lo, o.fact_hi));
    fact_rows_per_round += queries.back().fact_rows;
  }
  // Pinned: one slot of kResultWords per query (the warm-up uses one per lane).
  u64* host_results = nullptr;
  const std::size_t slots = static_cast<std::size_t>(std::max(o.queries, o.streams));
  cuda_ok(cudaMallocHost(&host_results, sizeof(u64) * kResultWords * slots), "cudaMallocHost");

  // Warm-up outside the measurement: one query of every lane through
  // cudaMalloc/cudaFree (which give everything back), then the baseline.
  {
    SyncMalloc warm(streams, o.streams);
    Engine engine(warm, host_results);
    std::vector<QueryParams> small;
    for (int lane = 0; lane < o.streams; ++lane) small.push_back(make_query(o.seed ^ 0xa11ull, lane, 18, 20));
    run_round(engine, small, o.streams, o.device);
  }
  DeviceMemorySampler sampler(o.device, o.sample_us);
  const u64 baseline = sampler.available() ? sampler.baseline() : 0;

  std::unique_ptr<Allocator> alloc = make_allocator(o, streams);
  Engine engine(*alloc, host_results);
  // --turns: the other allocator and its engine (see the top).
  std::unique_ptr<Allocator> other;
  std::unique_ptr<Engine> other_engine;
  if (!o.turns.empty()) {
    Options ot = o;
    ot.allocator = o.turns;
    other = make_allocator(ot, streams);
    other_engine = std::make_unique<Engine>(*other, host_results);
  }
  sampler.start();

  std::vector<u64> first(static_cast<std::size_t>(o.queries) * kResultWords, 0);
  std::vector<double> round_ms, other_ms;
  int mismatched_rounds = 0;
  const u64 allocations_before = engine.allocations();
  // One round of `e`, its results checked against the first round's.
  auto round = [&](Engine& e, int r, std::vector<double>& times) {
    const double ms = run_round(e, queries, o.streams, o.device);
    const u64* results = host_results;
    if (r == 0 && &e == &engine) {
      std::copy(results, results + first.size(), first.begin());
    } else if (!std::equal(first.begin(), first.end(), results)) {
      ++mismatched_rounds;
    }
    if (r >= o.warmup) times.push_back(ms);
  };
  for (int r = 0; r < o.warmup + o.rounds; ++r) {
    if (!other_engine) {
      round(engine, r, round_ms);
    } else if (r % 2 == 0) {
      round(engine, r, round_ms);
      round(*other_engine, r, other_ms);
    } else {
      round(*other_engine, r, other_ms);
      round(engine, r, round_ms);
    }
  }
  const u64 allocations_per_round = (engine.allocations() - allocations_before) / static_cast<u64>(o.warmup + o.rounds);
  sampler.stop();

  // Results: the fold over every query's four words (the same for every
  // allocator with the same seed and sizes), and the host's answer.
  u64 checksum = 0, joined_rows = 0, groups = 0;
  for (int q = 0; q < o.queries; ++q) {
    for (int w = 0; w < kResultWords; ++w) checksum = mix64(checksum ^ first[static_cast<std::size_t>(q) * kResultWords + w]) + static_cast<u64>(q);
    joined_rows += first[static_cast<std::size_t>(q) * kResultWords + kJoined];
    groups += first[static_cast<std::size_t>(q) * kResultWords + kGroups];
  }
  int wrong_queries = 0;
  if (o.verify) {
    std::vector<std::thread> workers;
    std::atomic<int> wrong{0}, next{0};
    const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    for (unsigned t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        for (int q = next++; q < o.queries; q = next++) {
          u64 expected[kResultWords];
          host_reference(queries[static_cast<std::size_t>(q)], expected);
          if (!std::equal(expected, expected + kResultWords, first.begin() + static_cast<std::ptrdiff_t>(q) * kResultWords)) ++wrong;
        }
      });
    }
    for (std::thread& t : workers) t.join();
    wrong_queries = wrong.load();
  }
  const bool results_ok = mismatched_rounds == 0 && wrong_queries == 0;

  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  auto list_of = [](const std::vector<double>& v) {
    std::string list = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.3f", i ? "," : "", v[i]);
      list += buf;
    }
    return list + "]";
  };
  std::vector<double> sorted = round_ms;
  std::sort(sorted.begin(), sorted.end());
  const double median_ms = median_of(round_ms);

  Json json;
  json.str("workload", "W11").str("allocator", o.allocator).str("label", o.label);
  json.str("status", results_ok ? "ok" : "wrong_result");
  json.num("queries", static_cast<u64>(o.queries)).num("rounds", static_cast<u64>(o.rounds));
  json.num("warmup", static_cast<u64>(o.warmup)).num("streams", static_cast<u64>(o.streams));
  json.str("seed", hex(o.seed)).str("fact_log2", std::to_string(o.fact_lo) + ":" + std::to_string(o.fact_hi));
  json.num("round_ms_median", median_ms).num("round_ms_min", sorted.front()).num("round_ms_max", sorted.back());
  json.raw("round_ms", list_of(round_ms));
  double turns_ratio = 0;
  if (other) {
    std::vector<double> ratios;
    for (std::size_t i = 0; i < round_ms.size(); ++i) ratios.push_back(round_ms[i] / other_ms[i]);
    turns_ratio = median_of(ratios);
    json.str("turns", o.turns).num("turns_round_ms_median", median_of(other_ms)).raw("turns_round_ms", list_of(other_ms));
    json.num("turns_ratio_median", turns_ratio);
  }
  if (sampler.available()) {
    json.num("nvml_baseline_bytes", baseline).num("nvml_peak_bytes", sampler.peak());
    json.num("device_peak_bytes", sampler.peak() > baseline ? sampler.peak() - baseline : 0);
    json.num("nvml_samples", sampler.samples());
  } else {
    json.null("device_peak_bytes").str("nvml", sampler.why());
  }
  json.str("checksum", hex(checksum)).num("fact_rows_per_round", fact_rows_per_round);
  json.num("joined_rows_per_round", joined_rows).num("groups_per_round", groups);
  json.num("allocations_per_round", allocations_per_round);
  json.num("cub_version", static_cast<u64>(CUB_VERSION));
#ifdef XLOG_WITH_RMM
  json.raw("with_rmm", "true");
#else
  json.raw("with_rmm", "false");
#endif
  json.num("mismatched_rounds", static_cast<u64>(mismatched_rounds));
  if (o.verify) {
    json.num("wrong_queries", static_cast<u64>(wrong_queries));
  } else {
    json.null("wrong_queries");
  }
  for (const char* name : {"XLOG_MEMORY", "XLOG_BUDGET_BYTES", "XLOG_CACHE", "XLOG_POOL_RELEASE_THRESHOLD", "XLOG_BACKEND"}) {
    if (const char* v = std::getenv(name)) json.str(name, v);
  }
  alloc->report(json);
  if (o.summary) {
    if (auto* x = dynamic_cast<Xlog*>(alloc.get())) std::fprintf(stderr, "%s\n", x->summary().c_str());
  }
  alloc->shut_down(json);
  alloc.reset();
  if (other) {
    Json other_json;
    other->shut_down(other_json);
    other.reset();
    json.raw("turns_shut_down", other_json.text());
  }
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (cudaStream_t s : streams) (void)cudaStreamDestroy(s);
  (void)cudaFreeHost(host_results);

  std::printf("%s\n", json.text().c_str());
  std::fflush(stdout);
  std::string peak_text = "n/a";
  if (sampler.available()) {
    const u64 above = sampler.peak() > baseline ? sampler.peak() - baseline : 0;
    peak_text = std::to_string(above >> 20) + " MiB";
  }
  std::fprintf(stderr, "w11_engine [%s]: %.2f ms/round (median of %d, %d queries, %d streams), device peak %s, %s\n",
               o.label.c_str(), median_ms, o.rounds, o.queries, o.streams, peak_text.c_str(),
               results_ok ? "results ok" : "WRONG RESULTS");
  if (!o.turns.empty()) {
    std::fprintf(stderr, "w11_engine [%s]: in turns with %s (%.2f ms/round): median per-round ratio %.3f; the peak is both's\n",
                 o.label.c_str(), o.turns.c_str(), median_of(other_ms), turns_ratio);
  }
  return results_ok ? 0 : 1;
}
