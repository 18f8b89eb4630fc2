// benches/xlog_bench.cpp — xlog-cuda against its peers, in one process.
//
// Drives libxlog_cuda through its C ABI (the way engines use it) and, in the
// same run, each peer:
//
//   raw               cuMemAllocAsync / cuMemFreeAsync (driver API): the
//                     baseline every ratio_to_raw is taken against
//   cudaMallocAsync   the runtime API's wrapper of the same
//   cudaMalloc        cudaMalloc / cudaFree (synchronous)
//   xlog              the default stack: budget + async pool, logging off
//   xlog-nobudget     async pool alone
//   xlog-direct       budget + Direct (synchronous cuMemAlloc/cuMemFree)
//   rmm-*             RMM resources (libxlog_bench_rmm.so, see peer_rmm.cu)
//   torch-caching     PyTorch's CUDACachingAllocator (libxlog_bench_torch.so)
//
// cudarc is measured by benches/cudarc_bench (a Rust binary) in the same
// scripts/bench-gpu run. A peer that was not built or does not load is
// reported as a MISSING row with the reason, never dropped silently.
//
// Workloads (see BENCHMARKS.md for the full definitions):
//   W1  allocate+free pairs at 256 B, 1 MiB, 64 MiB on one stream
//       (xlog reaps every 64 pairs; a sample is at least 2,000 pairs and
//       at least 20 ms)
//   W2  replay of 20,000 random operations (sizes uniform in [1, 4 MiB],
//       at most 1,000 live, fixed seed)
//   W3  W2 on 1, 4 and 8 threads, one stream each: aggregate ops/us
//   W4  block tracking: prepare+finish against raw event record/wait
//   W5  a budget under pressure: needless refusals
//   W9  one 8-block recorded launch of an empty kernel: launched directly,
//       through xlog (prepare_all + launch + finish_all), replayed from a
//       graph captured directly, and from one captured through xlog
//   W10 the framework hook path (xlog_torch_malloc/free)
//
// Every timed figure is the median of --repeats runs; the runs of different
// peers are interleaved (repeat outer, peer inner) so that drift of the GPU
// or the host shows up as spread, not as a bias against one peer.
//
// Output: CSV rows workload,peer,param,metric,value,ratio_to_raw on stdout
// (or --csv FILE), every single run in --samples FILE. ratio_to_raw is
// value / raw's value for the same workload and parameter: for times lower
// is better, for ops/us higher is better.
//
// Exit status: 0 when it ran, 77 when there is no GPU (nothing measured),
// 1 on a usage or fatal error.

#include <xlog_cuda.h>

#include "bench_peer.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>

// benches/w9_kernel.cu: the host symbol of W9's empty kernel.
extern "C" const void* xlog_bench_w9_kernel();
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t GiB = 1024 * MiB;

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

// A failed call inside a measurement: the peer's rows for this workload
// become an ERROR row with this message.
struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// splitmix64: small, portable, and the same sequence on every platform, so
// a replay is the same trace wherever it runs.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
};

std::string csv_safe(std::string s) {
  for (char& c : s) {
    if (c == ',' || c == '\n' || c == '\r' || c == '"') c = (c == ',') ? ';' : ' ';
  }
  return s;
}

std::string size_label(uint64_t bytes) {
  if (bytes >= MiB && bytes % MiB == 0) return format("%lluMiB", static_cast<unsigned long long>(bytes / MiB));
  if (bytes >= KiB && bytes % KiB == 0) return format("%lluKiB", static_cast<unsigned long long>(bytes / KiB));
  return format("%lluB", static_cast<unsigned long long>(bytes));
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

struct Output {
  FILE* csv = stdout;
  FILE* samples = nullptr;

  void header() {
    std::fprintf(csv, "workload,peer,param,metric,value,ratio_to_raw\n");
    if (samples) std::fprintf(samples, "workload,peer,param,metric,repeat,value\n");
  }
  void row(const std::string& workload, const std::string& peer, const std::string& param,
           const std::string& metric, const std::string& value, const std::string& ratio) {
    std::fprintf(csv, "%s,%s,%s,%s,%s,%s\n", workload.c_str(), peer.c_str(), param.c_str(), metric.c_str(),
                 csv_safe(value).c_str(), ratio.c_str());
    std::fflush(csv);
  }
  void number(const std::string& workload, const std::string& peer, const std::string& param,
              const std::string& metric, double value, double raw_value) {
    std::string ratio = raw_value > 0 ? format("%.4f", value / raw_value) : "";
    row(workload, peer, param, metric, format("%.6g", value), ratio);
  }
  void sample(const std::string& workload, const std::string& peer, const std::string& param,
              const std::string& metric, int repeat, double value) {
    if (samples) {
      std::fprintf(samples, "%s,%s,%s,%s,%d,%.6g\n", workload.c_str(), peer.c_str(), param.c_str(),
                   metric.c_str(), repeat, value);
    }
  }
  void missing(const std::string& peer, const std::string& reason) {
    std::fprintf(stderr, "MISSING %s: %s\n", peer.c_str(), reason.c_str());
    row("ALL", peer, "", "MISSING", reason, "");
  }
};

Output out;

void note(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::fprintf(stderr, "xlog_bench: ");
  std::vfprintf(stderr, fmt, args);
  std::fprintf(stderr, "\n");
  va_end(args);
}

// ---------------------------------------------------------------------------
// The driver API, loaded at run time (no libcuda stub is needed to build,
// and a machine without a driver gets a clean "no GPU" exit).
// ---------------------------------------------------------------------------

struct Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*driver_version)(int*) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
  CUresult (*mem_alloc_async)(CUdeviceptr*, size_t, CUstream) = nullptr;
  CUresult (*mem_free_async)(CUdeviceptr, CUstream) = nullptr;
  CUresult (*stream_create)(CUstream*, unsigned) = nullptr;
  CUresult (*stream_destroy)(CUstream) = nullptr;
  CUresult (*stream_synchronize)(CUstream) = nullptr;
  CUresult (*stream_wait_event)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*event_create)(CUevent*, unsigned) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_query)(CUevent) = nullptr;
  CUresult (*launch_host_func)(CUstream, CUhostFn, void*) = nullptr;
  // W9: kernel launches and graphs.
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**, void**) = nullptr;
  CUresult (*stream_begin_capture)(CUstream, CUstreamCaptureMode) = nullptr;
  CUresult (*stream_end_capture)(CUstream, CUgraph*) = nullptr;
  CUresult (*graph_instantiate)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*graph_launch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*graph_exec_destroy)(CUgraphExec) = nullptr;
  CUresult (*graph_destroy)(CUgraph) = nullptr;

  bool load(std::string* why) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      *why = std::string("cannot load libcuda.so.1: ") + dlerror();
      return false;
    }
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      void* sym = dlsym(lib, name);
      if (!sym) {
        *why = std::string("libcuda.so.1 lacks ") + name;
        ok = false;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
    };
    get(init, "cuInit");
    get(driver_version, "cuDriverGetVersion");
    get(error_string, "cuGetErrorString");
    get(mem_alloc_async, "cuMemAllocAsync");
    get(mem_free_async, "cuMemFreeAsync");
    get(stream_create, "cuStreamCreate");
    get(stream_destroy, "cuStreamDestroy_v2");
    get(stream_synchronize, "cuStreamSynchronize");
    get(stream_wait_event, "cuStreamWaitEvent");
    get(event_create, "cuEventCreate");
    get(event_destroy, "cuEventDestroy_v2");
    get(event_record, "cuEventRecord");
    get(event_query, "cuEventQuery");
    get(launch_host_func, "cuLaunchHostFunc");
    get(launch_kernel, "cuLaunchKernel");
    get(stream_begin_capture, "cuStreamBeginCapture_v2");
    get(stream_end_capture, "cuStreamEndCapture");
    get(graph_instantiate, "cuGraphInstantiateWithFlags");
    get(graph_launch, "cuGraphLaunch");
    get(graph_exec_destroy, "cuGraphExecDestroy");
    get(graph_destroy, "cuGraphDestroy");
    return ok;
  }

  std::string describe(CUresult rc) const {
    const char* text = nullptr;
    if (error_string && error_string(rc, &text) == CUDA_SUCCESS && text) return text;
    return format("CUresult %d", static_cast<int>(rc));
  }
};

Driver drv;

void check_cu(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS) throw BenchError(format("%s: %s", what, drv.describe(rc).c_str()));
}

void check_rt(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw BenchError(format("%s: %s", what, cudaGetErrorString(rc)));
}

std::string xlog_message(xlog_status st, const char* what) {
  char buf[512];
  xlog_last_error_message(buf, sizeof buf);
  return format("%s: %s (%s)", what, xlog_status_name(st), buf);
}

void check_xlog(xlog_status st, const char* what) {
  if (st != XLOG_OK) throw BenchError(xlog_message(st, what));
}

// Host callback used to keep frees pending for a while (W5). Sleeping is
// allowed in a host function; calling CUDA is not.
void sleep_host_fn(void* user) {
  auto micros = *static_cast<const unsigned*>(user);
  std::this_thread::sleep_for(std::chrono::microseconds(micros));
}

// ---------------------------------------------------------------------------
// Run configuration
// ---------------------------------------------------------------------------

struct Settings {
  bool sim = false;  // xlog on the sim backend only: a smoke test of this program
  int repeats = 5;
  int w1_pairs = 2000;
  double w1_min_us = 20000;  // a W1 sample runs at least this long
  std::vector<uint64_t> w1_sizes{256, 1 * MiB, 64 * MiB};
  int w2_ops = 20000;
  int w2_repeats = 5;
  uint64_t w2_max_bytes = 4 * MiB;
  uint32_t w2_max_live = 1000;
  uint64_t seed = 20261122;
  std::vector<int> w3_threads{1, 4, 8};
  int w4_iterations = 10000;
  int w5_rounds = 50;
  uint64_t w5_budget = 1 * GiB;
  uint64_t w5_block = 8 * MiB;
  unsigned w5_delay_us = 200;
  uint64_t budget = 24 * GiB;  // the xlog budget in W1-W3 (never binding)
  uint64_t sim_capacity = 2 * GiB;
  int reap_every = 64;
  std::vector<std::string> workloads{"W1", "W2", "W3", "W4", "W5", "W9", "W10"};
  std::string plugin_dir;
  // Set the device's default memory pool (raw, cudaMallocAsync and xlog all
  // allocate from it) to keep freed memory across synchronisations, as
  // RMM's cuda_async resource does for its pool.
  bool keep_pool_memory = true;
};

Settings cfg;

// ---------------------------------------------------------------------------
// Peers of the allocation workloads
// ---------------------------------------------------------------------------

// One thread's stream, in whichever form the peer wants it.
struct Lane {
  CUstream cu = nullptr;
  xlog_stream xs = 0;
  uint64_t ops = 0;
};

struct Handle {
  void* ptr = nullptr;
  xlog_block block{};
  uint64_t bytes = 0;
};

enum class AllocResult { Ok, Refused };

// Why the last allocation on this thread was refused (set by the peers).
thread_local std::string t_refusal;

class Peer {
 public:
  virtual ~Peer() = default;
  virtual std::string name() const = 0;
  // Asynchronous (stream-ordered) peers run in W3; synchronous ones do not.
  virtual bool stream_ordered() const { return true; }
  // Whether begin() honours a byte limit (W5 needs one).
  virtual bool has_limit() const { return false; }
  virtual void begin(uint64_t limit_bytes) = 0;
  virtual void end() = 0;
  virtual void lane_open(Lane& lane) {
    check_cu(drv.stream_create(&lane.cu, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }
  virtual void lane_close(Lane& lane) {
    if (lane.cu) {
      check_cu(drv.stream_synchronize(lane.cu), "cuStreamSynchronize");
      check_cu(drv.stream_destroy(lane.cu), "cuStreamDestroy");
      lane.cu = nullptr;
    }
  }
  virtual AllocResult allocate(Lane& lane, uint64_t bytes, Handle* h) = 0;
  virtual void deallocate(Lane& lane, const Handle& h) = 0;
  // Called once per pair (W1) or per operation (W2, W3, W5): xlog reaps
  // every 64 calls, as an engine would from its main loop.
  virtual void tick(Lane&) {}
  virtual void synchronize(Lane& lane) { check_cu(drv.stream_synchronize(lane.cu), "cuStreamSynchronize"); }
  // The native stream (W5 records its probe events there).
  virtual CUstream native(Lane& lane) { return lane.cu; }
  // Queue a host-side delay on the lane's stream (W5).
  virtual void delay(Lane& lane, const unsigned* micros) {
    check_cu(drv.launch_host_func(lane.cu, sleep_host_fn, const_cast<unsigned*>(micros)), "cuLaunchHostFunc");
  }
  // On a refusal: make pending frees complete so that a retry can succeed.
  virtual void relieve(Lane& lane) { synchronize(lane); }
};

class RawPeer : public Peer {
 public:
  std::string name() const override { return "raw"; }
  void begin(uint64_t) override {}
  void end() override {}
  AllocResult allocate(Lane& lane, uint64_t bytes, Handle* h) override {
    CUdeviceptr p = 0;
    CUresult rc = drv.mem_alloc_async(&p, bytes, lane.cu);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
      t_refusal = "cuMemAllocAsync: " + drv.describe(rc);
      return AllocResult::Refused;
    }
    check_cu(rc, "cuMemAllocAsync");
    h->ptr = reinterpret_cast<void*>(p);
    h->bytes = bytes;
    return AllocResult::Ok;
  }
  void deallocate(Lane& lane, const Handle& h) override {
    check_cu(drv.mem_free_async(reinterpret_cast<CUdeviceptr>(h.ptr), lane.cu), "cuMemFreeAsync");
  }
};

class CudaMallocAsyncPeer : public Peer {
 public:
  std::string name() const override { return "cudaMallocAsync"; }
  void begin(uint64_t) override {}
  void end() override {}
  AllocResult allocate(Lane& lane, uint64_t bytes, Handle* h) override {
    cudaError_t rc = cudaMallocAsync(&h->ptr, bytes, reinterpret_cast<cudaStream_t>(lane.cu));
    if (rc == cudaErrorMemoryAllocation) {
      t_refusal = std::string("cudaMallocAsync: ") + cudaGetErrorString(rc);
      return AllocResult::Refused;
    }
    check_rt(rc, "cudaMallocAsync");
    h->bytes = bytes;
    return AllocResult::Ok;
  }
  void deallocate(Lane& lane, const Handle& h) override {
    check_rt(cudaFreeAsync(h.ptr, reinterpret_cast<cudaStream_t>(lane.cu)), "cudaFreeAsync");
  }
};

class CudaMallocPeer : public Peer {
 public:
  std::string name() const override { return "cudaMalloc"; }
  bool stream_ordered() const override { return false; }
  void begin(uint64_t) override {}
  void end() override {}
  AllocResult allocate(Lane&, uint64_t bytes, Handle* h) override {
    cudaError_t rc = cudaMalloc(&h->ptr, bytes);
    if (rc == cudaErrorMemoryAllocation) {
      t_refusal = std::string("cudaMalloc: ") + cudaGetErrorString(rc);
      return AllocResult::Refused;
    }
    check_rt(rc, "cudaMalloc");
    h->bytes = bytes;
    return AllocResult::Ok;
  }
  void deallocate(Lane&, const Handle& h) override { check_rt(cudaFree(h.ptr), "cudaFree"); }
};

// xlog through the C ABI. One runtime per measurement: on CUDA the runtime
// of an ordinal is a process-wide singleton, so two configurations cannot be
// open at once.
class XlogPeer : public Peer {
 public:
  XlogPeer(std::string name, xlog_allocator allocator, bool budget, bool wait_on_pressure, bool cache = true)
      : name_(std::move(name)), allocator_(allocator), budget_(budget), wait_(wait_on_pressure), cache_(cache) {}

  std::string name() const override { return name_; }
  bool stream_ordered() const override { return allocator_ == XLOG_ALLOCATOR_ASYNC; }
  bool has_limit() const override { return budget_; }

  xlog_runtime* runtime() const { return rt_; }

  void begin(uint64_t limit_bytes) override {
    xlog_config c;
    xlog_config_init(&c);
    if (c.struct_size == 0) {
      // A malformed XLOG_* variable in the environment; the fields below
      // override every one of them, so start again from a clean config.
      std::memset(&c, 0, sizeof c);
      c.struct_size = sizeof c;
      c.stream_pool_size = 16;
    }
    c.backend = cfg.sim ? XLOG_BACKEND_SIM : XLOG_BACKEND_CUDA;
    c.allocator = allocator_;
    c.budget_bytes = budget_ ? (limit_bytes ? limit_bytes : cfg.budget) : 0;
    c.log_path = nullptr;
    c.wait_on_pressure = wait_ ? 1 : 0;
    c.cache = cache_ ? 1 : 0;
    c.sim_capacity_bytes = cfg.sim_capacity;
    if (c.stream_pool_size < 16) c.stream_pool_size = 16;
    check_xlog(xlog_runtime_open(0, &c, &rt_), "xlog_runtime_open");
    xlog_backend backend = 0;
    check_xlog(xlog_runtime_backend(rt_, &backend), "xlog_runtime_backend");
    if (backend != (cfg.sim ? XLOG_BACKEND_SIM : XLOG_BACKEND_CUDA)) {
      throw BenchError(format("xlog opened backend %u, not the one asked for", backend));
    }
  }

  void end() override {
    if (!rt_) return;
    xlog_drain(rt_, nullptr);
    uint64_t leaked_blocks = 0, leaked_bytes = 0;
    xlog_status st = xlog_runtime_close_report(rt_, &leaked_blocks, &leaked_bytes);
    rt_ = nullptr;
    check_xlog(st, "xlog_runtime_close");
    if (leaked_blocks) {
      throw BenchError(format("the benchmark leaked %llu blocks", static_cast<unsigned long long>(leaked_blocks)));
    }
  }

  void lane_open(Lane& lane) override { check_xlog(xlog_stream_acquire(rt_, &lane.xs), "xlog_stream_acquire"); }
  void lane_close(Lane& lane) override {
    if (lane.xs) {
      check_xlog(xlog_stream_synchronize(rt_, lane.xs), "xlog_stream_synchronize");
      check_xlog(xlog_stream_release(rt_, lane.xs), "xlog_stream_release");
      lane.xs = 0;
    }
  }

  AllocResult allocate(Lane& lane, uint64_t bytes, Handle* h) override {
    xlog_status st = xlog_allocate(rt_, bytes, lane.xs, "bench", &h->block);
    if (st == XLOG_ERR_OUT_OF_BUDGET || st == XLOG_ERR_OUT_OF_MEMORY) {
      t_refusal = xlog_message(st, "xlog_allocate");
      return AllocResult::Refused;
    }
    check_xlog(st, "xlog_allocate");
    h->ptr = h->block.ptr;
    h->bytes = bytes;
    return AllocResult::Ok;
  }
  void deallocate(Lane&, const Handle& h) override { check_xlog(xlog_deallocate(rt_, h.block), "xlog_deallocate"); }
  void tick(Lane& lane) override {
    if (++lane.ops % static_cast<uint64_t>(cfg.reap_every) == 0) check_xlog(xlog_reap(rt_, nullptr), "xlog_reap");
  }
  void synchronize(Lane& lane) override {
    check_xlog(xlog_stream_synchronize(rt_, lane.xs), "xlog_stream_synchronize");
  }
  CUstream native(Lane& lane) override {
    void* s = nullptr;
    check_xlog(xlog_stream_native(rt_, lane.xs, &s), "xlog_stream_native");
    return static_cast<CUstream>(s);
  }
  void delay(Lane& lane, const unsigned* micros) override {
    check_xlog(xlog_stream_enqueue_host(rt_, lane.xs, sleep_host_fn, const_cast<unsigned*>(micros)),
               "xlog_stream_enqueue_host");
  }
  void relieve(Lane&) override { check_xlog(xlog_drain(rt_, nullptr), "xlog_drain"); }

 private:
  std::string name_;
  xlog_allocator allocator_;
  bool budget_;
  bool wait_;
  bool cache_;
  xlog_runtime* rt_ = nullptr;
};

// A peer from a plugin library (RMM, torch).
class PluginPeer : public Peer {
 public:
  explicit PluginPeer(const xlog_bench_peer* p) : p_(p) {}
  std::string name() const override { return p_->name; }
  bool has_limit() const override { return p_->takes_limit != 0; }
  void begin(uint64_t limit_bytes) override {
    char err[512] = "";
    instance_ = p_->create(limit_bytes, err, sizeof err);
    if (!instance_) throw BenchError(format("%s: create failed: %s", p_->name, err));
  }
  void end() override {
    if (!instance_) return;
    check_rt(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (p_->trim) p_->trim(instance_);
    p_->destroy(instance_);
    instance_ = nullptr;
  }
  AllocResult allocate(Lane& lane, uint64_t bytes, Handle* h) override {
    char err[512] = "";
    int rc = p_->allocate(instance_, bytes, lane.cu, &h->ptr, err, sizeof err);
    if (rc == XLOG_BENCH_ALLOC_REFUSED) {
      t_refusal = format("%s allocate: %s", p_->name, err);
      return AllocResult::Refused;
    }
    if (rc != XLOG_BENCH_ALLOC_OK) throw BenchError(format("%s allocate: %s", p_->name, err));
    h->bytes = bytes;
    return AllocResult::Ok;
  }
  void deallocate(Lane& lane, const Handle& h) override { p_->deallocate(instance_, h.ptr, h.bytes, lane.cu); }

 private:
  const xlog_bench_peer* p_;
  void* instance_ = nullptr;
};

// Opens one measurement of a peer: begin + one lane per thread; the
// destructor undoes it even when the measurement threw.
class Session {
 public:
  Session(Peer& peer, int lanes, uint64_t limit = 0) : peer_(peer) {
    peer_.begin(limit);
    begun_ = true;
    lanes_.resize(static_cast<size_t>(lanes));
    for (auto& l : lanes_) {
      peer_.lane_open(l);
      ++opened_;
    }
  }
  ~Session() {
    try {
      finish();
    } catch (const std::exception& e) {
      note("cleanup of %s failed: %s", peer_.name().c_str(), e.what());
    }
  }
  // Closes everything and reports a failure (the destructor cannot).
  void finish() {
    for (; opened_ > 0; --opened_) peer_.lane_close(lanes_[static_cast<size_t>(opened_ - 1)]);
    if (begun_) {
      begun_ = false;
      peer_.end();
    }
  }
  Lane& lane(size_t i) { return lanes_[i]; }

 private:
  Peer& peer_;
  std::vector<Lane> lanes_;
  int opened_ = 0;
  bool begun_ = false;
};

// ---------------------------------------------------------------------------
// Peer registry (with the MISSING ones and why)
// ---------------------------------------------------------------------------

struct Registry {
  std::vector<std::unique_ptr<Peer>> peers;
  std::vector<std::pair<std::string, std::string>> missing;

  Peer* find(const std::string& name) {
    for (auto& p : peers)
      if (p->name() == name) return p.get();
    return nullptr;
  }
};

std::string executable_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  std::string path(buf);
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Load one plugin; its peers join the registry, or the expected names are
// reported MISSING with the reason.
void load_plugin(Registry& reg, const std::string& file, const std::vector<std::string>& expected,
                 const char* configure_reason) {
  auto mark_missing = [&](const std::string& why) {
    for (const auto& name : expected) reg.missing.emplace_back(name, why);
  };
  if (configure_reason && *configure_reason) {
    mark_missing(configure_reason);
    return;
  }
  std::string path = cfg.plugin_dir + "/" + file;
  if (access(path.c_str(), F_OK) != 0) {
    mark_missing(file + " was not built (its compile or link failed; see the build log)");
    return;
  }
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    mark_missing(std::string("dlopen failed: ") + dlerror());
    return;
  }
  auto entry = reinterpret_cast<xlog_bench_peers_fn>(dlsym(lib, "xlog_bench_peers"));
  if (!entry) {
    mark_missing(file + " does not export xlog_bench_peers");
    return;
  }
  const xlog_bench_peer* list = nullptr;
  char err[512] = "";
  int n = entry(XLOG_BENCH_PEER_ABI, &list, err, sizeof err);
  if (n < 0) {
    mark_missing(err);
    return;
  }
  for (int i = 0; i < n; ++i) reg.peers.push_back(std::make_unique<PluginPeer>(&list[i]));
  for (const auto& name : expected) {
    if (!reg.find(name)) reg.missing.emplace_back(name, file + " did not offer it");
  }
}

#ifndef XLOG_BENCH_RMM_REASON
#define XLOG_BENCH_RMM_REASON "not configured (configure with -DRMM_ROOT=<unpacked librmm and rapids_logger wheels>)"
#endif
#ifndef XLOG_BENCH_TORCH_REASON
#define XLOG_BENCH_TORCH_REASON "not configured (configure with -DTORCH_DIR=<torch package directory>)"
#endif

Registry make_registry() {
  Registry reg;
  if (cfg.sim) {
    const char* why = "--sim smoke run: only xlog is measured";
    for (const char* name : {"raw", "cudaMallocAsync", "cudaMalloc", "rmm-async", "rmm-limiting-async", "rmm-pool",
                             "torch-caching"}) {
      reg.missing.emplace_back(name, why);
    }
  } else {
    reg.peers.push_back(std::make_unique<RawPeer>());
    reg.peers.push_back(std::make_unique<CudaMallocAsyncPeer>());
    reg.peers.push_back(std::make_unique<CudaMallocPeer>());
  }
  reg.peers.push_back(std::make_unique<XlogPeer>("xlog", XLOG_ALLOCATOR_ASYNC, true, false));
  reg.peers.push_back(std::make_unique<XlogPeer>("xlog-nobudget", XLOG_ALLOCATOR_ASYNC, false, false));
  // The seed's behaviour: every free goes to the driver (cache off).
  reg.peers.push_back(std::make_unique<XlogPeer>("xlog-nocache", XLOG_ALLOCATOR_ASYNC, true, false, false));
  reg.peers.push_back(std::make_unique<XlogPeer>("xlog-direct", XLOG_ALLOCATOR_DIRECT, true, false));
  if (!cfg.sim) {
    load_plugin(reg, "libxlog_bench_rmm.so", {"rmm-async", "rmm-limiting-async", "rmm-pool"},
                XLOG_BENCH_RMM_REASON);
    load_plugin(reg, "libxlog_bench_torch.so", {"torch-caching"}, XLOG_BENCH_TORCH_REASON);
  }
  return reg;
}

// Runs `measure` for every peer, `repeats` times, interleaved; returns each
// peer's samples, or its error.
struct Measured {
  std::vector<double> samples;
  std::string error;
};

std::map<std::string, Measured> interleave(const std::vector<Peer*>& peers, int repeats,
                                           const std::function<double(Peer&)>& measure) {
  std::map<std::string, Measured> result;
  for (int r = 0; r < repeats; ++r) {
    for (Peer* p : peers) {
      Measured& m = result[p->name()];
      if (!m.error.empty()) continue;
      try {
        m.samples.push_back(measure(*p));
      } catch (const std::exception& e) {
        m.error = e.what();
        note("%s failed: %s", p->name().c_str(), e.what());
      }
    }
  }
  return result;
}

// Writes the medians; ratio against the peer named `baseline`.
void report(const std::string& workload, const std::string& param, const std::string& metric,
            const std::vector<Peer*>& peers, const std::map<std::string, Measured>& result,
            const std::string& baseline = "raw") {
  double base = 0;
  auto b = result.find(baseline);
  if (b != result.end() && b->second.error.empty()) base = median(b->second.samples);
  for (Peer* p : peers) {
    const Measured& m = result.at(p->name());
    if (!m.error.empty()) {
      out.row(workload, p->name(), param, "ERROR", m.error, "");
      continue;
    }
    for (size_t i = 0; i < m.samples.size(); ++i) {
      out.sample(workload, p->name(), param, metric, static_cast<int>(i), m.samples[i]);
    }
    out.number(workload, p->name(), param, metric, median(m.samples), base);
  }
}

// ---------------------------------------------------------------------------
// W1: allocate+free pairs
// ---------------------------------------------------------------------------

// `n` allocate+free pairs of `bytes` on `lane`, then a synchronize: the
// microseconds they took. tick() once a pair: xlog reaps every 64 pairs.
double time_pairs(Peer& peer, Lane& lane, uint64_t bytes, int n) {
  Handle h;
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (peer.allocate(lane, bytes, &h) != AllocResult::Ok) throw BenchError("refused: " + t_refusal);
    peer.deallocate(lane, h);
    peer.tick(lane);
  }
  peer.synchronize(lane);
  return micros_since(t0);
}

double w1_once(Peer& peer, uint64_t bytes, int pairs) {
  Session session(peer, 1);
  Lane& lane = session.lane(0);
  time_pairs(peer, lane, bytes, std::max(64, pairs / 10));  // warm-up: pools, event caches, code
  // At least `pairs` pairs and at least cfg.w1_min_us of them: a pair of
  // the fast peers is a fraction of a microsecond, and a sample of a
  // millisecond moves by a tenth with one interruption of the thread.
  auto t0 = Clock::now();
  long done = 0;
  do {
    time_pairs(peer, lane, bytes, pairs);
    done += pairs;
  } while (micros_since(t0) < cfg.w1_min_us);
  double us = micros_since(t0) / done;
  session.finish();
  return us;
}

// W1's ratio of `a` to `b` measured in turns: both peers' sessions open at
// once, then `turn` pairs of one, `turn` of the other, and so on for at
// least cfg.w1_min_us; the ratio of their total times. The host's speed
// drifts by a third over seconds on the GPU machines (the samples of two
// peers a second apart move together), so two medians taken at different
// moments carry that drift into their ratio; turns of a few hundred
// microseconds see the same host.
double w1_turns(Peer& a, Peer& b, uint64_t bytes, int turn) {
  Session sa(a, 1), sb(b, 1);
  time_pairs(a, sa.lane(0), bytes, std::max(64, turn));  // warm-up of both
  time_pairs(b, sb.lane(0), bytes, std::max(64, turn));
  double ta = 0, tb = 0;
  auto t0 = Clock::now();
  do {
    ta += time_pairs(a, sa.lane(0), bytes, turn);
    tb += time_pairs(b, sb.lane(0), bytes, turn);
  } while (micros_since(t0) < 2 * cfg.w1_min_us);
  sa.finish();
  sb.finish();
  return ta / tb;
}

void workload_w1(Registry& reg) {
  std::vector<Peer*> peers;
  for (auto& p : reg.peers) peers.push_back(p.get());
  for (uint64_t bytes : cfg.w1_sizes) {
    note("W1 %s", size_label(bytes).c_str());
    auto result = interleave(peers, cfg.repeats, [&](Peer& p) { return w1_once(p, bytes, cfg.w1_pairs); });
    report("W1", size_label(bytes), "us_per_pair", peers, result);
    Peer* x = reg.find("xlog");
    Peer* raw = reg.find("raw");
    if (x && raw && result.at("xlog").error.empty() && result.at("raw").error.empty()) {
      std::vector<double> ratios;
      for (int r = 0; r < cfg.repeats; ++r) ratios.push_back(w1_turns(*x, *raw, bytes, 500));
      out.row("W1", "xlog", size_label(bytes), "ratio_to_raw_in_turns", format("%.4f", median(ratios)), "");
    }
    // Direct is compared with cudaMalloc, its synchronous counterpart.
    auto d = result.find("xlog-direct");
    auto c = result.find("cudaMalloc");
    if (d != result.end() && c != result.end() && d->second.error.empty() && c->second.error.empty()) {
      out.row("W1", "xlog-direct", size_label(bytes), "ratio_to_cudaMalloc",
              format("%.4f", median(d->second.samples) / median(c->second.samples)), "");
    }
  }
}

// ---------------------------------------------------------------------------
// W2 / W3: random replay
// ---------------------------------------------------------------------------

struct Op {
  bool allocate;
  uint32_t slot;
  uint64_t bytes;
};

// Allocation probability falls as the live count rises (1 - live/max_live),
// so the trace settles around max_live/2 live blocks and never exceeds
// max_live; the fixed seed makes it the same trace every run.
std::vector<Op> make_trace(uint64_t seed) {
  Rng rng(seed);
  std::vector<Op> ops;
  ops.reserve(static_cast<size_t>(cfg.w2_ops));
  std::vector<uint32_t> live, free_slots;
  for (uint32_t s = cfg.w2_max_live; s > 0; --s) free_slots.push_back(s - 1);
  for (int i = 0; i < cfg.w2_ops; ++i) {
    double p_alloc = 1.0 - static_cast<double>(live.size()) / cfg.w2_max_live;
    bool alloc = live.empty() || (live.size() < cfg.w2_max_live && rng.unit() < p_alloc);
    if (alloc) {
      uint32_t slot = free_slots.back();
      free_slots.pop_back();
      live.push_back(slot);
      ops.push_back({true, slot, 1 + rng.below(cfg.w2_max_bytes)});
    } else {
      size_t j = static_cast<size_t>(rng.below(live.size()));
      uint32_t slot = live[j];
      live[j] = live.back();
      live.pop_back();
      free_slots.push_back(slot);
      ops.push_back({false, slot, 0});
    }
  }
  return ops;
}

void replay(Peer& peer, Lane& lane, const std::vector<Op>& ops, std::vector<Handle>& slots) {
  for (const Op& op : ops) {
    if (op.allocate) {
      if (peer.allocate(lane, op.bytes, &slots[op.slot]) != AllocResult::Ok) {
        throw BenchError(format("allocation of %llu bytes refused: ", static_cast<unsigned long long>(op.bytes)) +
                         t_refusal);
      }
    } else {
      peer.deallocate(lane, slots[op.slot]);
      slots[op.slot].bytes = 0;
    }
    peer.tick(lane);
  }
}

void free_all(Peer& peer, Lane& lane, std::vector<Handle>& slots) {
  for (Handle& h : slots) {
    if (h.bytes) {
      peer.deallocate(lane, h);
      h.bytes = 0;
    }
  }
  peer.synchronize(lane);
}

// Aggregate ops/us of `threads` threads, each replaying its own trace on its
// own stream, from a common start to the last thread's end.
// The live handles of a replay, one table per lane; whatever a failed run
// still holds is given back on the way out, so the runtime's close finds no
// leaks to report.
struct LiveSlots {
  Peer& peer;
  Session& session;
  std::vector<std::vector<Handle>> tables;
  LiveSlots(Peer& p, Session& s, int lanes)
      : peer(p), session(s), tables(static_cast<size_t>(lanes), std::vector<Handle>(cfg.w2_max_live)) {}
  ~LiveSlots() {
    for (size_t t = 0; t < tables.size(); ++t) {
      try {
        free_all(peer, session.lane(t), tables[t]);
      } catch (const std::exception&) {
      }
    }
  }
  std::vector<Handle>& operator[](size_t lane) { return tables[lane]; }
};

double replay_once(Peer& peer, int threads, const std::vector<std::vector<Op>>& traces) {
  Session session(peer, threads);
  LiveSlots slots(peer, session, threads);
  // Warm-up on every lane in turn: the first part of its trace (enough to
  // reach about the steady live count), then free it all. Caching peers
  // keep that memory per stream, and the default pool keeps it (see
  // --default-pool-threshold), so no peer measures first-touch growth.
  for (int t = 0; t < threads; ++t) {
    const auto& trace = traces[static_cast<size_t>(t)];
    std::vector<Op> head(trace.begin(), trace.begin() + std::min<size_t>(trace.size(), 2000));
    replay(peer, session.lane(static_cast<size_t>(t)), head, slots[static_cast<size_t>(t)]);
    free_all(peer, session.lane(static_cast<size_t>(t)), slots[static_cast<size_t>(t)]);
  }
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::string> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        if (!cfg.sim) check_rt(cudaSetDevice(0), "cudaSetDevice");  // make the context current here
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      if (!errors[static_cast<size_t>(t)].empty()) return;
      try {
        replay(peer, session.lane(static_cast<size_t>(t)), traces[static_cast<size_t>(t)],
               slots[static_cast<size_t>(t)]);
        peer.synchronize(session.lane(static_cast<size_t>(t)));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  while (ready.load() < threads) {
  }
  auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  double us = micros_since(t0);
  for (const auto& e : errors)
    if (!e.empty()) throw BenchError(e);
  for (int t = 0; t < threads; ++t) free_all(peer, session.lane(static_cast<size_t>(t)), slots[static_cast<size_t>(t)]);
  session.finish();
  uint64_t total_ops = 0;
  for (int t = 0; t < threads; ++t) total_ops += traces[static_cast<size_t>(t)].size();
  return static_cast<double>(total_ops) / us;
}

void workload_w2(Registry& reg) {
  note("W2 replay of %d ops", cfg.w2_ops);
  std::vector<Peer*> peers;
  for (auto& p : reg.peers) peers.push_back(p.get());
  std::vector<std::vector<Op>> traces{make_trace(cfg.seed)};
  auto result = interleave(peers, cfg.w2_repeats, [&](Peer& p) { return replay_once(p, 1, traces); });
  report("W2", format("%dops", cfg.w2_ops), "ops_per_us", peers, result);
}

void workload_w3(Registry& reg) {
  std::vector<Peer*> peers;
  for (auto& p : reg.peers) {
    if (p->stream_ordered()) {
      peers.push_back(p.get());
    } else {
      out.row("W3", p->name(), "", "SKIPPED", "synchronous allocator: not run multi-threaded", "");
    }
  }
  for (int threads : cfg.w3_threads) {
    note("W3 %d threads", threads);
    std::vector<std::vector<Op>> traces;
    for (int t = 0; t < threads; ++t) traces.push_back(make_trace(cfg.seed + static_cast<uint64_t>(t)));
    auto result = interleave(peers, cfg.w2_repeats, [&](Peer& p) { return replay_once(p, threads, traces); });
    report("W3", format("%dthreads", threads), "aggregate_ops_per_us", peers, result);
  }
}

// ---------------------------------------------------------------------------
// W4: block tracking
// ---------------------------------------------------------------------------

constexpr int kLaunchBlocks = 8;

struct TrackingResult {
  std::map<std::string, std::vector<double>> samples;
  std::string error;
};

// Two raw streams and events, for the raw side of W4.
struct RawPair {
  CUstream a = nullptr, b = nullptr;
  std::vector<CUevent> events;
  RawPair() {
    check_cu(drv.stream_create(&a, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check_cu(drv.stream_create(&b, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    for (int i = 0; i < kLaunchBlocks; ++i) {
      CUevent e = nullptr;
      check_cu(drv.event_create(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
      events.push_back(e);
    }
  }
  ~RawPair() {
    drv.stream_synchronize(a);
    drv.stream_synchronize(b);
    for (CUevent e : events) drv.event_destroy(e);
    drv.stream_destroy(a);
    drv.stream_destroy(b);
  }
  void sync() {
    check_cu(drv.stream_synchronize(a), "cuStreamSynchronize");
    check_cu(drv.stream_synchronize(b), "cuStreamSynchronize");
  }
};

// Times `body(i)` over n iterations (after a warm-up), then `sync()`; us per
// iteration.
template <typename Body, typename Sync>
double time_loop(int n, Body body, Sync sync) {
  for (int i = 0; i < std::max(100, n / 10); ++i) body(i);
  sync();
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) body(i);
  sync();
  return micros_since(t0) / n;
}

// ---------------------------------------------------------------------------
// W9: one 8-block recorded launch of an empty kernel, on one xlog stream
// (the default stack's runtime), µs per launch over w4_iterations launches
// plus the final synchronize:
//   raw  launch              cuLaunchKernel
//   xlog launch              xlog_prepare_all + cuLaunchKernel + xlog_finish_all
//   raw  graph               cuGraphLaunch of the launch captured with plain
//                            cuStreamBeginCapture
//   xlog graph               cuGraphLaunch of the recorded launch captured
//                            with xlog_capture_begin/xlog_capture_end
//   xlog graph+prepare_all   the same inside xlog_prepare_all/finish_all
//                            (what the capture rules ask of a replay that
//                            other xlog work must be ordered against)
// The xlog rows' ratio is to the raw row of the same kind (launch, graph).
// ---------------------------------------------------------------------------

void workload_w9(Registry& reg) {
  if (cfg.sim) return;  // kernels and graphs need a GPU
  const int n = cfg.w4_iterations;
  note("W9 recorded launch of an empty kernel, %d launches", n);
  const std::vector<std::string> names{"raw:launch", "xlog:launch", "raw:graph", "xlog:graph",
                                       "xlog:graph+prepare_all"};
  std::map<std::string, Measured> m;
  auto* xp = dynamic_cast<XlogPeer*>(reg.find("xlog"));
  CUfunction fn = nullptr;
  {
    cudaFunction_t f = nullptr;
    cudaError_t rc = cudaGetFuncBySymbol(&f, xlog_bench_w9_kernel());
    if (rc != cudaSuccess || !xp) {
      const std::string why = !xp ? std::string("no xlog peer")
                                  : std::string("cudaGetFuncBySymbol(W9 kernel): ") + cudaGetErrorString(rc);
      for (const auto& k : names) out.row("W9", k.substr(0, k.find(':')), k.substr(k.find(':') + 1), "ERROR", why, "");
      return;
    }
    fn = reinterpret_cast<CUfunction>(f);
  }
  for (int r = 0; r < cfg.repeats; ++r) {
    CUgraph raw_graph = nullptr, xlog_graph = nullptr;
    CUgraphExec raw_exec = nullptr, xlog_exec = nullptr;
    uint64_t capture = 0;
    const char* stage = "raw:launch";
    try {
      Session session(*xp, 1);
      xlog_runtime* rt = xp->runtime();
      Lane& lane = session.lane(0);
      const xlog_stream xs = lane.xs;
      const CUstream s = xp->native(lane);
      std::vector<xlog_use> uses(kLaunchBlocks);
      void* ptrs[kLaunchBlocks];
      void* params[kLaunchBlocks];
      for (int i = 0; i < kLaunchBlocks; ++i) {
        check_xlog(xlog_allocate(rt, 4096, xs, "w9", &uses[static_cast<size_t>(i)].block), "xlog_allocate");
        uses[static_cast<size_t>(i)].access = XLOG_ACCESS_WRITE;
        ptrs[i] = uses[static_cast<size_t>(i)].block.ptr;
        params[i] = &ptrs[i];
      }
      auto sync = [&] { check_xlog(xlog_stream_synchronize(rt, xs), "xlog_stream_synchronize"); };
      auto kernel = [&] { check_cu(drv.launch_kernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr), "cuLaunchKernel"); };
      auto recorded = [&](auto&& body) {
        check_xlog(xlog_prepare_all(rt, xs, uses.data(), uses.size()), "xlog_prepare_all");
        body();
        check_xlog(xlog_finish_all(rt, xs, uses.data(), uses.size()), "xlog_finish_all");
      };

      m["raw:launch"].samples.push_back(time_loop(n, [&](int) { kernel(); }, sync));
      stage = "xlog:launch";
      m["xlog:launch"].samples.push_back(time_loop(n, [&](int) { recorded(kernel); }, sync));

      stage = "raw:graph";
      sync();
      check_cu(drv.stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
      kernel();
      check_cu(drv.stream_end_capture(s, &raw_graph), "cuStreamEndCapture");
      check_cu(drv.graph_instantiate(&raw_exec, raw_graph, 0), "cuGraphInstantiate");
      m["raw:graph"].samples.push_back(time_loop(
          n, [&](int) { check_cu(drv.graph_launch(raw_exec, s), "cuGraphLaunch"); }, sync));

      stage = "xlog:graph";
#if defined(XLOG_BENCH_HAVE_CAPTURE)
      sync();
      check_xlog(xlog_capture_begin(rt, xs, XLOG_CAPTURE_GLOBAL), "xlog_capture_begin");
      recorded(kernel);
      void* graph = nullptr;
      check_xlog(xlog_capture_end(rt, xs, &graph, &capture), "xlog_capture_end");
      xlog_graph = static_cast<CUgraph>(graph);
      check_cu(drv.graph_instantiate(&xlog_exec, xlog_graph, 0), "cuGraphInstantiate");
      auto replay = [&] { check_cu(drv.graph_launch(xlog_exec, s), "cuGraphLaunch"); };
      m["xlog:graph"].samples.push_back(time_loop(n, [&](int) { replay(); }, sync));
      stage = "xlog:graph+prepare_all";
      m["xlog:graph+prepare_all"].samples.push_back(time_loop(n, [&](int) { recorded(replay); }, sync));
#else
      (void)capture;
      throw BenchError("this xlog_bench was built against a header without xlog_capture_begin");
#endif
      sync();
      for (auto& u : uses) check_xlog(xlog_deallocate(rt, u.block), "xlog_deallocate");
      stage = "cleanup";
      check_cu(drv.graph_exec_destroy(raw_exec), "cuGraphExecDestroy");
      check_cu(drv.graph_destroy(raw_graph), "cuGraphDestroy");
      raw_exec = nullptr;
      raw_graph = nullptr;
      if (xlog_exec) check_cu(drv.graph_exec_destroy(xlog_exec), "cuGraphExecDestroy");
      if (xlog_graph) check_cu(drv.graph_destroy(xlog_graph), "cuGraphDestroy");
      xlog_exec = nullptr;
      xlog_graph = nullptr;
#if defined(XLOG_BENCH_HAVE_CAPTURE)
      if (capture) check_xlog(xlog_capture_release(rt, capture, nullptr), "xlog_capture_release");
#endif
      session.finish();
    } catch (const std::exception& e) {
      // The stage that failed and every later one of this repeat get the
      // error (a stage that already has samples keeps them).
      bool from_here = false;
      for (const auto& k : names) {
        from_here = from_here || k == stage;
        if (from_here && m[k].error.empty()) m[k].error = e.what();
      }
      if (!from_here) note("W9 %s failed: %s", stage, e.what());
      if (raw_exec) drv.graph_exec_destroy(raw_exec);
      if (raw_graph) drv.graph_destroy(raw_graph);
      if (xlog_exec) drv.graph_exec_destroy(xlog_exec);
      if (xlog_graph) drv.graph_destroy(xlog_graph);
    }
  }
  const std::map<std::string, std::string> baseline{{"raw:launch", ""},
                                                    {"xlog:launch", "raw:launch"},
                                                    {"raw:graph", ""},
                                                    {"xlog:graph", "raw:graph"},
                                                    {"xlog:graph+prepare_all", "raw:graph"}};
  for (const auto& key : names) {
    const Measured& x = m[key];
    const std::string peer = key.substr(0, key.find(':'));
    const std::string param = key.substr(key.find(':') + 1);
    if (!x.error.empty()) {
      out.row("W9", peer, param, "ERROR", x.error, "");
      continue;
    }
    if (x.samples.empty()) continue;
    double base = 0;
    const std::string& bname = baseline.at(key);
    if (!bname.empty() && m[bname].error.empty() && !m[bname].samples.empty()) base = median(m[bname].samples);
    for (size_t i = 0; i < x.samples.size(); ++i) out.sample("W9", peer, param, "us_per_launch", static_cast<int>(i), x.samples[i]);
    out.number("W9", peer, param, "us_per_launch", median(x.samples), base);
  }
}

// ---------------------------------------------------------------------------
// W10: the framework hook path (what PyTorch's pluggable allocator calls)
// against xlog_allocate/xlog_deallocate on the same runtime (the hook
// runtime of device 0) and the same native stream, 1 MiB blocks. Runs last:
// the hooks keep their runtime open for the rest of the process, and other
// workloads open device 0 with configs of their own.
// ---------------------------------------------------------------------------

void workload_hooks() {
  if (cfg.sim) return;
  const int n = cfg.w4_iterations;
  note("W10 hook path, %d iterations", n);
  const char* keys[] = {"allocate+deallocate", "torch_malloc+torch_free"};
  std::map<std::string, Measured> m;
  xlog_runtime* hrt = nullptr;
  CUstream native = nullptr;
  try {
    check_cu(drv.stream_create(&native, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check_xlog(xlog_interop_runtime(0, &hrt), "xlog_interop_runtime");
    xlog_stream hs = 0;
    check_xlog(xlog_stream_import(hrt, native, &hs), "xlog_stream_import");
    const uint64_t bytes = 1 << 20;
    auto hsync = [&] { check_cu(drv.stream_synchronize(native), "cuStreamSynchronize"); };
    for (int r = 0; r < cfg.repeats; ++r) {
      m[keys[0]].samples.push_back(time_loop(
          n,
          [&](int) {
            xlog_block b;
            check_xlog(xlog_allocate(hrt, bytes, hs, "hookbench", &b), "xlog_allocate");
            check_xlog(xlog_deallocate(hrt, b), "xlog_deallocate");
          },
          hsync));
      m[keys[1]].samples.push_back(time_loop(
          n,
          [&](int) {
            void* p = xlog_torch_malloc(bytes, 0, native);
            if (!p) throw BenchError("xlog_torch_malloc returned NULL");
            xlog_torch_free(p, bytes, 0, native);
          },
          hsync));
    }
    hsync();
    check_xlog(xlog_stream_release(hrt, hs), "xlog_stream_release");
  } catch (const std::exception& e) {
    for (const char* k : keys) m[k].error = e.what();
  }
  if (hrt) xlog_runtime_close(hrt);
  if (native) drv.stream_destroy(native);
  for (const char* k : keys) {
    const Measured& x = m[k];
    if (!x.error.empty()) {
      out.row("W10", "xlog", k, "ERROR", x.error, "");
      continue;
    }
    double base = 0;
    if (std::string(k) != keys[0] && m[keys[0]].error.empty()) base = median(m[keys[0]].samples);
    for (size_t i = 0; i < x.samples.size(); ++i) out.sample("W10", "xlog", k, "us_per_pair", static_cast<int>(i), x.samples[i]);
    out.number("W10", "xlog", k, "us_per_pair", median(x.samples), base);
  }
}

void workload_w4(Registry& reg) {
  note("W4 block tracking, %d iterations", cfg.w4_iterations);
  const int n = cfg.w4_iterations;
  // name -> (samples, error)
  std::map<std::string, Measured> m;
  // The split rows (record of two events in turn, prepare alone, finish
  // alone) show where the same-stream figure's time goes.
  const std::vector<std::string> names{"raw:record",
                                       "raw:record(2 events)",
                                       "raw:record(xlog stream)",
                                       "raw:record+wait",
                                       "raw:record+wait(xlog streams)",
                                       "raw:8x(record+wait)",
                                       "xlog:same-stream",
                                       "xlog:prepare-only",
                                       "xlog:finish-only",
                                       "xlog:cross-stream",
                                       "xlog:prepare_all+finish_all(8)"};
  auto* xp = dynamic_cast<XlogPeer*>(reg.find("xlog"));
  for (int r = 0; r < cfg.repeats; ++r) {
    if (!cfg.sim) {
      try {
        RawPair raw;
        m["raw:record"].samples.push_back(time_loop(
            n, [&](int) { check_cu(drv.event_record(raw.events[0], raw.a), "cuEventRecord"); },
            [&] { raw.sync(); }));
        // xlog's finish records a pooled event: two take turns.
        m["raw:record(2 events)"].samples.push_back(time_loop(
            n, [&](int i) { check_cu(drv.event_record(raw.events[static_cast<size_t>(i & 1)], raw.a), "cuEventRecord"); },
            [&] { raw.sync(); }));
        // Alternate direction like the xlog loop: wait for the other
        // stream's last record, then record on this one.
        m["raw:record+wait"].samples.push_back(time_loop(
            n,
            [&](int i) {
              CUstream s = (i & 1) ? raw.b : raw.a;
              check_cu(drv.stream_wait_event(s, raw.events[0], 0), "cuStreamWaitEvent");
              check_cu(drv.event_record(raw.events[0], s), "cuEventRecord");
            },
            [&] { raw.sync(); }));
        m["raw:8x(record+wait)"].samples.push_back(time_loop(
            n,
            [&](int i) {
              CUstream s = (i & 1) ? raw.b : raw.a;
              for (int j = 0; j < kLaunchBlocks; ++j) {
                check_cu(drv.stream_wait_event(s, raw.events[static_cast<size_t>(j)], 0), "cuStreamWaitEvent");
                check_cu(drv.event_record(raw.events[static_cast<size_t>(j)], s), "cuEventRecord");
              }
            },
            [&] { raw.sync(); }));
      } catch (const std::exception& e) {
        for (const char* k : {"raw:record", "raw:record(2 events)", "raw:record+wait", "raw:8x(record+wait)"})
          m[k].error = e.what();
      }
    }
    if (!xp) continue;
    try {
      Session session(*xp, 2);
      xlog_runtime* rt = xp->runtime();
      xlog_stream a = session.lane(0).xs, b = session.lane(1).xs;
      std::vector<xlog_use> uses(kLaunchBlocks);
      for (auto& u : uses) {
        check_xlog(xlog_allocate(rt, 4096, a, "w4", &u.block), "xlog_allocate");
        u.access = XLOG_ACCESS_WRITE;
      }
      auto sync = [&] {
        check_xlog(xlog_stream_synchronize(rt, a), "xlog_stream_synchronize");
        check_xlog(xlog_stream_synchronize(rt, b), "xlog_stream_synchronize");
      };
      const xlog_block blk = uses[0].block;
      // The raw record again, on the very stream the xlog rows use: a
      // stream that has run a pool allocation (or waited on another
      // stream) records events measurably slower than a fresh one.
      if (!cfg.sim) {
        void* native = nullptr;
        void* native_b = nullptr;
        check_xlog(xlog_stream_native(rt, a, &native), "xlog_stream_native");
        check_xlog(xlog_stream_native(rt, b, &native_b), "xlog_stream_native");
        CUevent ev = nullptr;
        check_cu(drv.event_create(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        m["raw:record(xlog stream)"].samples.push_back(time_loop(
            n, [&](int) { check_cu(drv.event_record(ev, static_cast<CUstream>(native)), "cuEventRecord"); }, sync));
        // The cross-stream row's raw calls on the very streams it uses:
        // streams that have run pool allocations record and wait slower
        // than the fresh ones of "raw:record+wait" (1.3x on an H200,
        // 2026-11-26).
        m["raw:record+wait(xlog streams)"].samples.push_back(time_loop(
            n,
            [&](int i) {
              CUstream s = static_cast<CUstream>((i & 1) ? native_b : native);
              check_cu(drv.stream_wait_event(s, ev, 0), "cuStreamWaitEvent");
              check_cu(drv.event_record(ev, s), "cuEventRecord");
            },
            sync));
        sync();
        drv.event_destroy(ev);
      }
      m["xlog:same-stream"].samples.push_back(time_loop(
          n,
          [&](int) {
            check_xlog(xlog_prepare(rt, blk, a, XLOG_ACCESS_WRITE), "xlog_prepare");
            check_xlog(xlog_finish(rt, blk, a, XLOG_ACCESS_WRITE), "xlog_finish");
          },
          sync));
      m["xlog:prepare-only"].samples.push_back(time_loop(
          n, [&](int) { check_xlog(xlog_prepare(rt, blk, a, XLOG_ACCESS_WRITE), "xlog_prepare"); }, sync));
      m["xlog:finish-only"].samples.push_back(time_loop(
          n, [&](int) { check_xlog(xlog_finish(rt, blk, a, XLOG_ACCESS_WRITE), "xlog_finish"); }, sync));
      m["xlog:cross-stream"].samples.push_back(time_loop(
          n,
          [&](int i) {
            xlog_stream s = (i & 1) ? b : a;
            check_xlog(xlog_prepare(rt, blk, s, XLOG_ACCESS_WRITE), "xlog_prepare");
            check_xlog(xlog_finish(rt, blk, s, XLOG_ACCESS_WRITE), "xlog_finish");
          },
          sync));
      m["xlog:prepare_all+finish_all(8)"].samples.push_back(time_loop(
          n,
          [&](int i) {
            xlog_stream s = (i & 1) ? b : a;
            check_xlog(xlog_prepare_all(rt, s, uses.data(), uses.size()), "xlog_prepare_all");
            check_xlog(xlog_finish_all(rt, s, uses.data(), uses.size()), "xlog_finish_all");
          },
          sync));
      for (auto& u : uses) check_xlog(xlog_deallocate(rt, u.block), "xlog_deallocate");
      session.finish();
    } catch (const std::exception& e) {
      for (const char* k : {"xlog:same-stream", "xlog:prepare-only", "xlog:finish-only", "xlog:cross-stream",
                            "xlog:prepare_all+finish_all(8)"})
        m[k].error = e.what();
    }
  }
  // Each xlog case against its raw analogue.
  const std::map<std::string, std::string> baseline{{"raw:record", ""},
                                                    {"raw:record(2 events)", "raw:record"},
                                                    {"raw:record(xlog stream)", "raw:record"},
                                                    {"xlog:prepare-only", ""},
                                                    {"xlog:finish-only", "raw:record"},
                                                    {"raw:record+wait", ""},
                                                    {"raw:record+wait(xlog streams)", "raw:record+wait"},
                                                    {"raw:8x(record+wait)", ""},
                                                    {"xlog:same-stream", "raw:record"},
                                                    {"xlog:cross-stream", "raw:record+wait"},
                                                    {"xlog:prepare_all+finish_all(8)", "raw:8x(record+wait)"}};
  for (const auto& key : names) {
    auto it = m.find(key);
    if (it == m.end()) continue;
    std::string peer = key.substr(0, key.find(':'));
    std::string param = key.substr(key.find(':') + 1);
    if (!it->second.error.empty()) {
      out.row("W4", peer, param, "ERROR", it->second.error, "");
      continue;
    }
    double base = 0;
    const std::string& bname = baseline.at(key);
    if (!bname.empty()) {
      auto b = m.find(bname);
      if (b != m.end() && b->second.error.empty()) base = median(b->second.samples);
    }
    for (size_t i = 0; i < it->second.samples.size(); ++i)
      out.sample("W4", peer, param, "us_per_op", static_cast<int>(i), it->second.samples[i]);
    out.number("W4", peer, param, "us_per_op", median(it->second.samples), base);
  }
  if (!xp) out.row("W4", "xlog", "", "ERROR", "no xlog peer", "");
}

// ---------------------------------------------------------------------------
// W5: budget under pressure
// ---------------------------------------------------------------------------

// Fill to 90% of the budget, then per round: queue a host delay (so the
// frees that follow stay pending on the GPU for a while), free the oldest
// half, allocate back to 90%. Every refusal here is needless: live bytes
// plus the request never exceed 90% of the budget, so the allocation fits
// as soon as the pending frees retire. Also counted: allocations admitted
// while live + not-yet-completed frees + the request exceeded the budget
// (a limit that forgets pending frees).
struct PressureCounts {
  uint64_t attempts = 0, refused = 0, refused_needless = 0, admitted_over_limit = 0;
  double us_per_round = 0;
};

PressureCounts w5_run(Peer& peer) {
  PressureCounts c;
  Session session(peer, 1, cfg.w5_budget);
  Lane& lane = session.lane(0);
  const uint64_t block = cfg.w5_block;
  const size_t fill = static_cast<size_t>((cfg.w5_budget * 9 / 10) / block);
  std::deque<Handle> live;
  uint64_t live_bytes = 0;
  // One probe event after each free tells when the GPU really released it
  // (not on sim, where there is no driver).
  std::vector<CUevent> idle_events;
  std::deque<CUevent> probes;
  auto probe_free = [&]() {
    if (cfg.sim) return;
    CUevent e = nullptr;
    if (idle_events.empty()) {
      check_cu(drv.event_create(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    } else {
      e = idle_events.back();
      idle_events.pop_back();
    }
    check_cu(drv.event_record(e, peer.native(lane)), "cuEventRecord");
    probes.push_back(e);
  };
  // Bytes freed whose free has not completed on the GPU. One stream runs in
  // order, so the probes complete front to back.
  auto pending_on_gpu = [&]() -> uint64_t {
    while (!probes.empty()) {
      CUresult rc = drv.event_query(probes.front());
      if (rc == CUDA_ERROR_NOT_READY) break;
      check_cu(rc, "cuEventQuery");
      idle_events.push_back(probes.front());
      probes.pop_front();
    }
    return probes.size() * block;
  };
  auto allocate_one = [&]() {
    Handle h;
    ++c.attempts;
    if (peer.allocate(lane, block, &h) == AllocResult::Refused) {
      ++c.refused;
      if (live_bytes + block <= cfg.w5_budget) ++c.refused_needless;
      peer.relieve(lane);
      if (peer.allocate(lane, block, &h) == AllocResult::Refused) {
        throw BenchError("allocation refused again after all pending frees completed: " + t_refusal);
      }
    } else if (live_bytes + pending_on_gpu() + block > cfg.w5_budget) {
      // Probed after the allocation returned: a peer that waited for or
      // observed the completion of frees inside allocate is not miscounted.
      ++c.admitted_over_limit;
    }
    peer.tick(lane);
    live.push_back(h);
    live_bytes += block;
  };
  while (live.size() < fill) allocate_one();
  peer.synchronize(lane);
  auto t0 = Clock::now();
  for (int round = 0; round < cfg.w5_rounds; ++round) {
    peer.delay(lane, &cfg.w5_delay_us);
    for (size_t i = 0, half = fill / 2; i < half; ++i) {
      peer.deallocate(lane, live.front());
      probe_free();
      peer.tick(lane);
      live_bytes -= block;
      live.pop_front();
    }
    while (live.size() < fill) allocate_one();
  }
  peer.synchronize(lane);
  c.us_per_round = micros_since(t0) / cfg.w5_rounds;
  for (CUevent e : probes) drv.event_destroy(e);
  for (CUevent e : idle_events) drv.event_destroy(e);
  for (auto& h : live) peer.deallocate(lane, h);
  session.finish();
  return c;
}

void workload_w5(Registry& reg) {
  note("W5 budget pressure, %d rounds", cfg.w5_rounds);
  const std::string param = format("budget%s_block%s", size_label(cfg.w5_budget).c_str(), size_label(cfg.w5_block).c_str());
  std::vector<std::unique_ptr<Peer>> extra;
  std::vector<Peer*> peers;
  peers.push_back(reg.find("xlog"));  // wait_on_pressure off
  extra.push_back(std::make_unique<XlogPeer>("xlog-wait", XLOG_ALLOCATOR_ASYNC, true, true));
  peers.push_back(extra.back().get());
  if (Peer* p = reg.find("rmm-limiting-async")) peers.push_back(p);
  for (Peer* p : peers) {
    if (!p) continue;
    try {
      PressureCounts c = w5_run(*p);
      std::string name = p->name() == "xlog" ? "xlog-nowait" : p->name();
      out.row("W5", name, param, "refused_needless", format("%llu", (unsigned long long)c.refused_needless), "");
      out.row("W5", name, param, "refused_total", format("%llu", (unsigned long long)c.refused), "");
      out.row("W5", name, param, "attempts", format("%llu", (unsigned long long)c.attempts), "");
      if (!cfg.sim) {
        out.row("W5", name, param, "admitted_over_limit", format("%llu", (unsigned long long)c.admitted_over_limit),
                "");
      }
      out.row("W5", name, param, "us_per_round", format("%.2f", c.us_per_round), "");
    } catch (const std::exception& e) {
      out.row("W5", p->name(), param, "ERROR", e.what(), "");
    }
  }
}

// ---------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------

void usage() {
  std::fprintf(stderr,
               "usage: xlog_bench [--csv FILE] [--samples FILE] [--workloads W1,W2,...] [--repeats N]\n"
               "                  [--quick] [--sim] [--plugin-dir DIR] [--default-pool-threshold]\n"
               "  --quick   small iteration counts (a smoke run, not for numbers)\n"
               "  --sim     xlog alone on the sim backend (no GPU needed; checks this program)\n"
               "  --default-pool-threshold  leave the default memory pool's release threshold\n"
               "            at the driver's 0 (by default it is raised so freed memory is kept)\n");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    if (end > start) parts.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

bool wants(const std::string& w) {
  return std::find(cfg.workloads.begin(), cfg.workloads.end(), w) != cfg.workloads.end();
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path, samples_path;
  bool quick = false;
  int repeats = 0;
  cfg.plugin_dir = executable_dir();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--csv") csv_path = value();
    else if (a == "--samples") samples_path = value();
    else if (a == "--workloads") cfg.workloads = split(value(), ',');
    else if (a == "--repeats") repeats = std::atoi(value().c_str());
    else if (a == "--quick") quick = true;
    else if (a == "--sim") cfg.sim = true;
    else if (a == "--plugin-dir") cfg.plugin_dir = value();
    else if (a == "--default-pool-threshold") cfg.keep_pool_memory = false;
    else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      usage();
      return 1;
    }
  }
  if (quick) {
    cfg.repeats = 3;
    cfg.w1_pairs = 200;
    cfg.w1_min_us = 0;
    cfg.w2_ops = 2000;
    cfg.w2_repeats = 3;
    cfg.w4_iterations = 1000;
    cfg.w5_rounds = 5;
  }
  if (cfg.sim) {
    // Small blocks: this mode checks the program, it does not produce
    // numbers. The arena (reserved, committed only where touched, and the
    // benchmark never touches block memory) and the budget are roomy
    // because the sim's stream workers can fall far behind the allocating
    // threads on a loaded host, and frees stay pending until they catch up.
    cfg.w1_sizes = {256, 64 * KiB, 1 * MiB};
    cfg.w2_max_bytes = 256 * KiB;
    cfg.sim_capacity = 8 * GiB;
    cfg.budget = 6 * GiB;
    cfg.w5_budget = 256 * MiB;
    cfg.w5_block = 2 * MiB;
  }
  if (repeats > 0) cfg.repeats = cfg.w2_repeats = repeats;

  std::string why;
  if (!cfg.sim) {
    if (!drv.load(&why)) {
      std::printf("xlog_bench: no GPU: %s\n", why.c_str());
      return 77;
    }
    CUresult rc = drv.init(0);
    int devices = 0;
    if (rc != CUDA_SUCCESS || cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::printf("xlog_bench: no GPU: cuInit: %s, %d devices\n", drv.describe(rc).c_str(), devices);
      return 77;
    }
    if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
      std::printf("xlog_bench: cannot initialise device 0\n");
      return 1;
    }
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      cfg.budget = std::min<uint64_t>(cfg.budget, total_b / 10 * 6);
    }
    if (cfg.keep_pool_memory) {
      cudaMemPool_t pool = nullptr;
      cuuint64_t keep_all = UINT64_MAX;
      if (cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess ||
          cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all) != cudaSuccess) {
        std::printf("xlog_bench: cannot set the default memory pool's release threshold\n");
        return 1;
      }
    }
  }

  if (!csv_path.empty()) {
    out.csv = std::fopen(csv_path.c_str(), "w");
    if (!out.csv) {
      std::perror(csv_path.c_str());
      return 1;
    }
  }
  if (!samples_path.empty()) {
    out.samples = std::fopen(samples_path.c_str(), "w");
    if (!out.samples) {
      std::perror(samples_path.c_str());
      return 1;
    }
  }
  out.header();

  // Run metadata.
  char date[64];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  out.row("META", "", "", "date", date, "");
  out.row("META", "xlog", "", "version", xlog_version(), "");
  out.row("META", "", "", "backend", cfg.sim ? "sim" : "cuda", "");
  out.row("META", "", "", "repeats", format("%d", cfg.repeats), "");
  out.row("META", "", "", "mode", quick ? "quick" : "full", "");
  if (!cfg.sim) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) out.row("META", "", "", "device", prop.name, "");
    int dv = 0, rv = 0;
    drv.driver_version(&dv);
    cudaRuntimeGetVersion(&rv);
    out.row("META", "", "", "driver_cuda_version", format("%d.%d", dv / 1000, (dv % 1000) / 10), "");
    out.row("META", "", "", "cudart_version", format("%d.%d", rv / 1000, (rv % 1000) / 10), "");
    out.row("META", "xlog", "", "budget_bytes", format("%llu", (unsigned long long)cfg.budget), "");
    out.row("META", "", "", "default_pool_release_threshold", cfg.keep_pool_memory ? "max" : "driver default (0)", "");
  }

  Registry reg = make_registry();
  for (const auto& [peer, reason] : reg.missing) out.missing(peer, reason);

  if (wants("W1")) workload_w1(reg);
  if (wants("W2")) workload_w2(reg);
  if (wants("W3")) workload_w3(reg);
  if (wants("W4")) workload_w4(reg);
  if (wants("W5")) workload_w5(reg);
  if (wants("W9")) workload_w9(reg);  // before W10: the hooks keep device 0's runtime open
  if (wants("W10")) workload_hooks();

  if (out.csv != stdout) std::fclose(out.csv);
  if (out.samples) std::fclose(out.samples);
  note("done");
  return 0;
}
