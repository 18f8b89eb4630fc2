// The PyTorch side of xlog_cuda.torch: a small C++ library built against
// the installed PyTorch (torch.utils.cpp_extension) by
// xlog_cuda.torch.enable(). It does four things the library's C hooks cannot:
//
// 1. A refused allocation reaches Python as torch.OutOfMemoryError, with
//    the numbers. PyTorch's CUDAPluggableAllocator does not check the
//    pointer its malloc function returns (pytorch/pytorch#133280): a NULL
//    from xlog_torch_malloc would become a tensor whose data pointer is 0.
//    xlog_shim_torch_malloc calls the hook and, on a NULL, throws
//    c10::OutOfMemoryError whose text is the library's reason (requested,
//    live, cached, pending, limit).
//
// 2. Tensor.record_stream reaches xlog (built with XLOG_SHIM_RECORD_STREAM,
//    which needs PyTorch's CUDA headers): xlog_shim_install_record_stream
//    sets the pluggable allocator's record-stream hook, which PyTorch's
//    Python API does not expose, to a function that calls
//    xlog_torch_record_stream_hook. Without it, PyTorch drops the call.
//
// 3. torch.cuda.graph capture works (same build condition):
//    xlog_shim_install_graph_pools sets the pluggable allocator's three
//    graph-pool hooks (set_begin_allocate_to_pool,
//    set_end_allocate_to_pool_fn, set_release_pool), which PyTorch's
//    Python API does not expose either, to functions that call
//    xlog_torch_begin_allocate_to_pool / _end_allocate_to_pool /
//    _release_pool. CUDAGraph::capture_begin calls the first just before
//    it begins capturing the current stream, so the begin hook passes that
//    stream along: the library then adopts the capture begun on it (see
//    docs/design.md, "Stream capture"). Where the setters differ from
//    PyTorch 2.11's (another version), the shim still compiles (the
//    setters are detected at compile time) and the install reports why
//    the hooks are not set; enable() warns.
//
// How the exception is thrown. PyTorch calls xlog_shim_torch_malloc
// through a std::function over a plain function pointer, from C++ compiled
// with exceptions, and catches c10::Error subclasses further up (the
// Python binding turns c10::OutOfMemoryError into torch.OutOfMemoryError).
// So the throw must start in a C++ frame with unwind tables (this file;
// never a Rust frame: the library's hooks return NULL and the throw happens
// here, after they returned), and the exception must be built with the
// c10 API of the headers this file is compiled against. The message is
// first copied, with plain C calls and no C++ object alive, into a
// thread-local buffer (the library keeps its reason per thread, and the
// exception's own unwinding may free tensors, whose free hook clears it);
// a separate, never-inlined function then builds the one std::string and
// throws. The malloc frame itself owns nothing that needs a destructor, so
// unwinding passes through it without a landing pad. An earlier version
// formatted the message inside the throw expression with c10::str over a
// std::string read from the library, and crashed PyTorch 2.11 in the
// throw on the GPU machine; the cause was not isolated there, which is
// why this path keeps the formatting out of the exception machinery
// altogether (scripts/gpu-frameworks, scenario oom, checks it).
//
// 4. PyTorch calls xlog with no layer between (same build condition):
//    xlog_shim_install_native makes PyTorch's current allocator an
//    XlogTorchAllocator, a subclass of CUDAPluggableAllocator whose
//    allocate, raw_alloc, raw_alloc_with_stream, raw_delete and
//    raw_deleter call the library directly. CUDAPluggableAllocator's own
//    versions keep a map from every pointer to its size, device and
//    stream, under a mutex, and call the hooks through std::function:
//    a node allocation, a hash insert and a hash erase per tensor, which
//    the library does not need (its free finds the block from the pointer
//    and the device). The tensor's deleter is a plain function per device
//    (the DataPtr's context is the pointer itself); raw allocations,
//    whose deleter is told only the pointer, are freed through
//    xlog_torch_free_any_device. Everything else (the record-stream and
//    graph-pool hooks above, the OOM error) is inherited or shared, so the
//    two install paths behave alike. Python falls back to the plain
//    CUDAPluggableAllocator where this fails, or with
//    XLOG_TORCH_ALLOCATOR=pluggable.
//
// The library's entry points come from Python (xlog_shim_bind), as the
// addresses of the libxlog_cuda instance the package loaded, so the shim
// always drives that instance: one hook runtime, one budget.

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <sys/types.h>
#include <type_traits>
#include <utility>

#ifdef XLOG_SHIM_RECORD_STREAM
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <array>
#include <memory>
#endif

extern "C" {
void* xlog_shim_torch_malloc(ssize_t size, int device, void* stream);
void xlog_shim_torch_free(void* ptr, ssize_t size, int device, void* stream);
}

namespace {

using MallocFn = void* (*)(size_t, int, void*);
using FreeFn = void (*)(void*, size_t, int, void*);
using MessageFn = size_t (*)(char*, size_t);
using RecordFn = int (*)(void*, void*);
using FreeAnyFn = void (*)(void*);
using PoolBeginFn = int (*)(int, uint64_t, uint64_t, void*);
using PoolEndFn = int (*)(int, uint64_t, uint64_t);
using PoolReleaseFn = int (*)(int, uint64_t, uint64_t, uint64_t*);

MallocFn g_malloc = nullptr;
FreeFn g_free = nullptr;
MessageFn g_message = nullptr;
RecordFn g_record = nullptr;
FreeAnyFn g_free_any = nullptr;
PoolBeginFn g_pool_begin = nullptr;
PoolEndFn g_pool_end = nullptr;
PoolReleaseFn g_pool_release = nullptr;

constexpr size_t kMessageBytes = 1024;

// The message of the last refusal (or record-stream failure) on this
// thread: plain bytes, valid until the next one on the same thread.
thread_local char t_message[kMessageBytes];

// Write "<prefix><the library's last error>" into t_message with C calls
// only.
void capture_message(const char* prefix) {
  size_t used = static_cast<size_t>(std::snprintf(t_message, kMessageBytes, "%s", prefix));
  if (used >= kMessageBytes) used = kMessageBytes - 1;
  size_t reason = 0;
  if (g_message != nullptr) {
    reason = g_message(t_message + used, kMessageBytes - used);
  }
  if (reason == 0) {
    std::snprintf(t_message + used, kMessageBytes - used, "%s",
                  "(no reason recorded on this thread; see xlog_cuda.torch.stats())");
  }
}

[[noreturn]] __attribute__((noinline)) void throw_out_of_memory() {
  throw c10::OutOfMemoryError(
      c10::SourceLocation{"xlog_shim_torch_malloc", __FILE__, static_cast<uint32_t>(__LINE__)},
      std::string(t_message));
}

[[noreturn]] __attribute__((noinline)) void throw_error() {
  throw c10::Error(
      c10::SourceLocation{"xlog_shim_record_stream", __FILE__, static_cast<uint32_t>(__LINE__)},
      std::string(t_message));
}

}  // namespace

extern "C" {

// Called once from Python with xlog_torch_malloc, xlog_torch_free,
// xlog_last_error_message and xlog_torch_record_stream_hook of the loaded
// library (the last two may be NULL: no numbers, no record_stream).
void xlog_shim_bind(void* malloc_fn, void* free_fn, void* message_fn, void* record_fn) {
  g_malloc = reinterpret_cast<MallocFn>(malloc_fn);
  g_free = reinterpret_cast<FreeFn>(free_fn);
  g_message = reinterpret_cast<MessageFn>(message_fn);
  g_record = reinterpret_cast<RecordFn>(record_fn);
}

// Called once from Python (after xlog_shim_bind) with
// xlog_torch_begin_allocate_to_pool, xlog_torch_end_allocate_to_pool and
// xlog_torch_release_pool of the loaded library.
void xlog_shim_bind_graph_pools(void* begin_fn, void* end_fn, void* release_fn) {
  g_pool_begin = reinterpret_cast<PoolBeginFn>(begin_fn);
  g_pool_end = reinterpret_cast<PoolEndFn>(end_fn);
  g_pool_release = reinterpret_cast<PoolReleaseFn>(release_fn);
}

void* xlog_shim_torch_malloc(ssize_t size, int device, void* stream) {
  void* ptr = g_malloc(static_cast<size_t>(size), device, stream);
  if (ptr == nullptr && size > 0) {
    char prefix[96];
    std::snprintf(prefix, sizeof prefix, "xlog-cuda refused %zd bytes on device %d: ", size, device);
    capture_message(prefix);
    throw_out_of_memory();
  }
  return ptr;
}

void xlog_shim_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  if (g_free != nullptr) g_free(ptr, static_cast<size_t>(size), device, stream);
}

// The last message this shim threw on this thread (for tests): copies at
// most cap - 1 bytes and a NUL; returns the message's length.
size_t xlog_shim_last_message(char* buf, size_t cap) {
  size_t n = std::strlen(t_message);
  if (buf != nullptr && cap > 0) {
    size_t k = n < cap - 1 ? n : cap - 1;
    std::memcpy(buf, t_message, k);
    buf[k] = '\0';
  }
  return n;
}

// Whether this build can install the record-stream hook.
int xlog_shim_has_record_stream(void) {
#ifdef XLOG_SHIM_RECORD_STREAM
  return 1;
#else
  return 0;
#endif
}

// Whether this build can install the graph-pool hooks (it needs the same
// PyTorch CUDA headers as the record-stream hook).
int xlog_shim_has_graph_pools(void) {
#ifdef XLOG_SHIM_RECORD_STREAM
  return 1;
#else
  return 0;
#endif
}

#ifdef XLOG_SHIM_RECORD_STREAM
}  // extern "C"

namespace {

// PyTorch's record-stream hook: CUDAPluggableAllocator::recordStream calls
// it with the block's base pointer and the stream. A failure is reported
// as a c10::Error (RuntimeError in Python) rather than dropped: a lost
// record_stream is a data race.
void record_stream_hook(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr || g_record == nullptr) return;
  if (g_record(ptr, static_cast<void*>(stream)) != 0) {
    capture_message("xlog-cuda could not record the stream use: ");
    throw_error();
  }
}

// The graph-pool hooks. PyTorch calls them with the device, the graph
// pool's MempoolId_t (a pair of integers) and, for the begin, a filter of
// the streams of the capture, which the library does not need: it asks
// the driver which capture a stream takes part in, and the begin hook
// passes the stream about to capture.
using PoolId = c10::cuda::MempoolId_t;
using BeginHook = std::function<void(int, PoolId, std::function<bool(cudaStream_t)>)>;
using PoolHook = std::function<void(int, PoolId)>;

void pool_begin_hook(int device, PoolId pool, std::function<bool(cudaStream_t)> /*filter*/) {
  if (g_pool_begin == nullptr) return;
  // CUDAGraph::capture_begin captures the current stream of the current
  // device, right after this call.
  void* stream = nullptr;
  try {
    stream = static_cast<void*>(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
  } catch (...) {
    stream = nullptr;  // not known: the library then adopts by elimination
  }
  if (g_pool_begin(device, static_cast<uint64_t>(pool.first), static_cast<uint64_t>(pool.second), stream) != 0) {
    // Before the capture begins: PyTorch raises it from capture_begin.
    capture_message("xlog-cuda could not prepare the CUDA graph capture: ");
    throw_error();
  }
}

// The end and the release never throw: releasePool runs in CUDAGraph's
// destructor, where an exception would terminate the process. A failure
// is printed, with the library's reason.
void report_pool_failure(const char* what) {
  capture_message(what);
  std::fprintf(stderr, "%s\n", t_message);
}

void pool_end_hook(int device, PoolId pool) {
  if (g_pool_end == nullptr) return;
  if (g_pool_end(device, static_cast<uint64_t>(pool.first), static_cast<uint64_t>(pool.second)) != 0) {
    report_pool_failure("xlog-cuda: warning: the end of a CUDA graph capture: ");
  }
}

void pool_release_hook(int device, PoolId pool) {
  if (g_pool_release == nullptr) return;
  uint64_t released = 0;
  if (g_pool_release(device, static_cast<uint64_t>(pool.first), static_cast<uint64_t>(pool.second), &released) != 0) {
    report_pool_failure("xlog-cuda: warning: releasing a CUDA graph's memory: ");
  }
}

// Whether allocator type A has PyTorch 2.11's three graph-pool setters
// (detected, so that the shim compiles against versions without them).
template <typename A, typename = void>
struct HasPoolSetters : std::false_type {};

template <typename A>
struct HasPoolSetters<A, std::void_t<decltype(std::declval<A&>().set_begin_allocate_to_pool(std::declval<BeginHook>())),
                                     decltype(std::declval<A&>().set_end_allocate_to_pool_fn(std::declval<PoolHook>())),
                                     decltype(std::declval<A&>().set_release_pool(std::declval<PoolHook>()))>>
    : std::true_type {};

template <typename A>
int set_pool_hooks(A* pluggable, char* why, size_t cap) {
  if constexpr (HasPoolSetters<A>::value) {
    pluggable->set_begin_allocate_to_pool(BeginHook(&pool_begin_hook));
    pluggable->set_end_allocate_to_pool_fn(PoolHook(&pool_end_hook));
    pluggable->set_release_pool(PoolHook(&pool_release_hook));
    return 1;
  } else {
    (void)pluggable;
    std::snprintf(why, cap, "%s",
                  "this PyTorch's CUDAPluggableAllocator has no set_begin_allocate_to_pool / "
                  "set_end_allocate_to_pool_fn / set_release_pool with the signatures of PyTorch 2.11");
    return 0;
  }
}

// PyTorch's current allocator as the CUDAPluggableAllocator over this shim;
// nullptr with the reason in `why` (cap bytes) when it is not one.
torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator* current_pluggable(char* why, size_t cap) {
  auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
  auto* pluggable = dynamic_cast<torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator*>(current.get());
  if (pluggable == nullptr) {
    std::snprintf(why, cap, "PyTorch's current allocator is not a CUDAPluggableAllocator (%s)",
                  current ? current->name().c_str() : "none");
  }
  return pluggable;
}

// ----- The native allocator (job 4) -----

// The deleter of a tensor allocated on device D: the DataPtr's context is
// the pointer. One plain function per device, so that a free needs no
// lookup of the device and no captured state.
template <int D>
void free_on_device(void* ptr) {
  if (ptr != nullptr) g_free(ptr, 0, D, nullptr);
}

// The deleter of raw allocations (told only the pointer).
void free_any_device(void* ptr) {
  if (ptr != nullptr) g_free_any(ptr);
}

constexpr size_t kDeleterDevices = 64;

template <size_t... D>
constexpr std::array<c10::DeleterFnPtr, sizeof...(D)> deleters_for(std::index_sequence<D...>) {
  return {&free_on_device<static_cast<int>(D)>...};
}

constexpr std::array<c10::DeleterFnPtr, kDeleterDevices> kFreeOnDevice =
    deleters_for(std::make_index_sequence<kDeleterDevices>{});

c10::DeleterFnPtr deleter_of(c10::DeviceIndex device) {
  return device >= 0 && static_cast<size_t>(device) < kDeleterDevices ? kFreeOnDevice[static_cast<size_t>(device)]
                                                                        : &free_any_device;
}

c10::DeviceIndex current_device() {
  c10::DeviceIndex device = -1;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return device;
}

void* shim_malloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
  return xlog_shim_torch_malloc(static_cast<ssize_t>(size), static_cast<int>(device), static_cast<void*>(stream));
}

// PyTorch's allocator over the library with no bookkeeping of its own
// (see job 4 at the top). The base class keeps the hooks set on it
// (record stream, graph pools) and everything this class does not
// override; its std::function pair is set to the shim's malloc and free
// only so that the base is whole (nothing here calls them).
class XlogTorchAllocator final : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  XlogTorchAllocator()
      : CUDAPluggableAllocator(
            [](size_t size, int device, cudaStream_t stream) {
              return xlog_shim_torch_malloc(static_cast<ssize_t>(size), device, static_cast<void*>(stream));
            },
            [](void* ptr, size_t size, int device, cudaStream_t stream) {
              xlog_shim_torch_free(ptr, static_cast<ssize_t>(size), device, static_cast<void*>(stream));
            }) {}

  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = current_device();
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* ptr = shim_malloc_on(size, device, stream);
    return {ptr, ptr, deleter_of(device), c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_any_device; }

  void* raw_alloc(size_t nbytes) override {
    c10::DeviceIndex device = current_device();
    return shim_malloc_on(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return shim_malloc_on(nbytes, current_device(), stream);
  }

  void raw_delete(void* ptr) override { free_any_device(ptr); }
};

}  // namespace

extern "C" {
#endif

// Why a hook needing PyTorch's CUDA headers cannot be installed.
static const char kNoCudaHeaders[] =
    "the shim was built without PyTorch's CUDA headers (no CUDA toolkit found by "
    "torch.utils.cpp_extension)";

// Install the record-stream hook on PyTorch's current allocator, which must
// be the CUDAPluggableAllocator over this shim (call it right after
// torch.cuda.memory.change_current_allocator). Returns 1 when installed;
// 0 with the reason in `why` (cap bytes) otherwise.
int xlog_shim_install_record_stream(char* why, size_t cap) {
#ifdef XLOG_SHIM_RECORD_STREAM
  try {
    auto* pluggable = current_pluggable(why, cap);
    if (pluggable == nullptr) return 0;
    if (g_record == nullptr) {
      std::snprintf(why, cap, "%s", "xlog_torch_record_stream_hook was not bound");
      return 0;
    }
    pluggable->set_record_stream_fn(&record_stream_hook);
    return 1;
  } catch (const std::exception& e) {
    std::snprintf(why, cap, "setting the record-stream hook failed: %s", e.what());
    return 0;
  }
#else
  std::snprintf(why, cap, "%s", kNoCudaHeaders);
  return 0;
#endif
}

// Install the graph-pool hooks on PyTorch's current allocator (the
// CUDAPluggableAllocator over this shim; call it after
// torch.cuda.memory.change_current_allocator). Returns 1 when installed;
// 0 with the reason in `why` (cap bytes) otherwise.
int xlog_shim_install_graph_pools(char* why, size_t cap) {
#ifdef XLOG_SHIM_RECORD_STREAM
  try {
    auto* pluggable = current_pluggable(why, cap);
    if (pluggable == nullptr) return 0;
    if (g_pool_begin == nullptr || g_pool_end == nullptr || g_pool_release == nullptr) {
      std::snprintf(why, cap, "%s", "the library's xlog_torch_*_pool entry points were not bound");
      return 0;
    }
    return set_pool_hooks(pluggable, why, cap);
  } catch (const std::exception& e) {
    std::snprintf(why, cap, "setting the graph-pool hooks failed: %s", e.what());
    return 0;
  }
#else
  std::snprintf(why, cap, "%s", kNoCudaHeaders);
  return 0;
#endif
}

// Make PyTorch's current allocator an XlogTorchAllocator (job 4 at the
// top), with `free_any_fn` (xlog_torch_free_any_device of the loaded
// library) for raw allocations. Call it after xlog_shim_bind and before
// PyTorch initialises CUDA, instead of
// torch.cuda.memory.change_current_allocator; then install the other hooks
// as for the plain pluggable allocator. Returns 1 when installed; 0 with
// the reason in `why` (cap bytes) otherwise, PyTorch's allocator then
// unchanged.
int xlog_shim_install_native(void* free_any_fn, char* why, size_t cap) {
#ifdef XLOG_SHIM_RECORD_STREAM
  if (g_malloc == nullptr || g_free == nullptr || free_any_fn == nullptr) {
    std::snprintf(why, cap, "%s", "the library's xlog_torch_malloc / _free / _free_any_device were not bound");
    return 0;
  }
  try {
    g_free_any = reinterpret_cast<FreeAnyFn>(free_any_fn);
    auto allocator = std::make_shared<XlogTorchAllocator>();
    allocator->init(0);
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    return 1;
  } catch (const std::exception& e) {
    std::snprintf(why, cap, "installing the native allocator failed: %s", e.what());
    return 0;
  }
#else
  (void)free_any_fn;
  std::snprintf(why, cap, "%s", kNoCudaHeaders);
  return 0;
#endif
}

}  // extern "C"
