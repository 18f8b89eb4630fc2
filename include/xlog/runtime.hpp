// xlog/runtime.hpp — header-only C++17 RAII layer over the xlog-cuda C ABI.
//
// Everything here is a thin owner of a C handle: no state is duplicated on
// the C++ side, so the C ABI's rules (status codes, generation-checked block
// handles, per-thread error messages) hold unchanged. A failed call throws
// xlog::Error carrying the status and the library's message; destructors
// never throw (a failed release in a destructor is dropped, because the
// library already reports leaks at runtime close).
//
// Lifetime rule: Stream and Block objects must be destroyed (or released)
// before the Runtime they came from is closed. Doing otherwise is not a
// crash — the library rejects the stale runtime token — but the release is
// lost and the close reports the block as leaked.
//
// Typical use:
//
//   xlog::Runtime rt{xlog::Config().backend(XLOG_BACKEND_SIM).budget_bytes(64 << 20)};
//   xlog::Stream s = rt.acquire_stream();
//   xlog::Block b = rt.allocate(1 << 20, s, "input");
//   xlog::launch(rt, s, {xlog::write(b)}, [&](const xlog::Stream& on) {
//     on.enqueue_host([p = b.data<float>()] { p[0] = 1.0f; });   // or a kernel
//   });
//   // ~Block queues the free in stream order; rt.reap() retires it later.

#ifndef XLOG_RUNTIME_HPP
#define XLOG_RUNTIME_HPP

// Relative include: this header and xlog_cuda.h are always installed side by
// side, so the pair can never mismatch, whatever else is on the include path.
#include "../xlog_cuda.h"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xlog {

/// Name of a status code, e.g. "XLOG_ERR_OUT_OF_BUDGET".
inline const char* status_name(xlog_status status) noexcept { return xlog_status_name(status); }

/// Library version at run time, "MAJOR.MINOR.PATCH".
inline const char* version() noexcept { return xlog_version(); }

/// Lower-case name of a backend code: "auto", "cuda", "sim" or "unknown".
inline const char* backend_name(xlog_backend backend) noexcept {
  switch (backend) {
    case XLOG_BACKEND_AUTO: return "auto";
    case XLOG_BACKEND_CUDA: return "cuda";
    case XLOG_BACKEND_SIM: return "sim";
    default: return "unknown";
  }
}

/// This thread's last error message from the library ("" after a success).
inline std::string last_error_message() {
  const std::size_t length = xlog_last_error_message(nullptr, 0);
  if (length == 0) return std::string();
  std::vector<char> buffer(length + 1, '\0');
  const std::size_t written = xlog_last_error_message(buffer.data(), buffer.size());
  // The message cannot grow between the two calls (it is per thread), but
  // never trust a length we did not write.
  return std::string(buffer.data(), written < length ? written : length);
}

/// A failed library call: the status code plus the library's own message,
/// which names the call and the numbers involved (requested, remaining,
/// limit, ...). what() reads "<STATUS_NAME>: <message>", or
/// "<call>: <STATUS_NAME>" when the library gave no message.
class Error : public std::runtime_error {
 public:
  Error(xlog_status status, std::string message, const char* call = nullptr)
      : std::runtime_error(describe(status, message, call)),
        status_(status),
        message_(std::move(message)) {}

  /// The XLOG_ERR_* code.
  xlog_status status() const noexcept { return status_; }
  /// The library's message, without the status name.
  const std::string& message() const noexcept { return message_; }

 private:
  static std::string describe(xlog_status status, const std::string& message, const char* call) {
    std::string text = xlog_status_name(status);
    if (!message.empty()) return text + ": " + message;  // the message names the call itself
    if (call != nullptr) return std::string(call) + ": " + text;
    return text;
  }

  xlog_status status_;
  std::string message_;
};

/// Throw xlog::Error for any status but XLOG_OK. Call it right after the
/// failing C call, on the same thread: the message is per thread.
inline void check(xlog_status status, const char* call = nullptr) {
  if (status != XLOG_OK) throw Error(status, last_error_message(), call);
}

/// Runtime configuration: the library defaults with XLOG_BACKEND,
/// XLOG_BUDGET_BYTES and XLOG_LOG_PATH applied (xlog_config_init), then
/// whatever the setters change. A malformed environment variable is not
/// silently ignored: the Runtime constructor throws with the reason (or call
/// Config::from_env(), which throws at once).
class Config {
 public:
  Config() noexcept { xlog_config_init(&config_); }

  /// Like Config(), but throws xlog::Error (XLOG_ERR_INVALID_ARGUMENT) if
  /// one of the XLOG_* environment variables is malformed.
  static Config from_env() {
    Config config;
    check(xlog_config_from_env(&config.config_), "xlog_config_from_env");
    return config;
  }

  Config& backend(xlog_backend value) noexcept { config_.backend = value; return *this; }
  Config& allocator(xlog_allocator value) noexcept { config_.allocator = value; return *this; }
  /// 0 removes the budget layer.
  Config& budget_bytes(std::uint64_t value) noexcept { config_.budget_bytes = value; return *this; }
  Config& stream_pool_size(std::uint32_t value) noexcept { config_.stream_pool_size = value; return *this; }
  /// CSV log file; "" removes the logging layer. The string is kept here,
  /// so the Config must outlive the Runtime constructor call.
  Config& log_path(std::string path) {
    log_path_ = std::move(path);
    log_path_set_ = true;
    return *this;
  }
  Config& sim_capacity_bytes(std::uint64_t value) noexcept { config_.sim_capacity_bytes = value; return *this; }
  Config& wait_on_pressure(bool value) noexcept { config_.wait_on_pressure = value ? 1 : 0; return *this; }
  /// Devices the sim backend simulates (default 1, env XLOG_SIM_DEVICES).
  Config& sim_devices(std::uint32_t value) noexcept { config_.sim_devices = value; return *this; }
  /// Where the async allocator's memory comes from: XLOG_MEMORY_ARENA (the
  /// default, xlog's own arena on the virtual-memory API) or
  /// XLOG_MEMORY_POOL (the driver's stream-ordered pool).
  Config& memory(std::uint8_t value) noexcept { config_.memory = value; return *this; }
  /// Keep freed blocks in per-stream caches for reuse (the default); false
  /// frees every block to the driver.
  Config& cache(bool value) noexcept { config_.cache = value ? 1 : 0; return *this; }
  /// Freed bytes xlog's driver pool keeps mapped at synchronisation points
  /// (UINT64_MAX, the default, keeps all).
  Config& pool_release_threshold(std::uint64_t value) noexcept {
    config_.pool_release_threshold = value;
    return *this;
  }
  /// Record each allocation's call site for live_blocks() (default off, env
  /// XLOG_TRACK_CALLSITES=1): a lock and a map update per allocation and
  /// free when on.
  Config& track_call_sites(bool value) noexcept { config_.track_call_sites = value ? 1 : 0; return *this; }

  /// The C struct to pass to xlog_runtime_open. Its log_path points into
  /// this object (or at the library's interned environment value): valid
  /// while this Config lives and is not changed.
  xlog_config raw() const noexcept {
    xlog_config config = config_;
    if (log_path_set_) config.log_path = log_path_.empty() ? nullptr : log_path_.c_str();
    return config;
  }

 private:
  xlog_config config_{};
  // A std::string rather than a pointer into the caller's memory, so copies
  // and moves of a Config stay valid (raw() re-points on every call).
  std::string log_path_;
  bool log_path_set_ = false;
};

class Runtime;

/// Marks the native stream passed to launch()'s work: it converts to any
/// pointer type, so a callable taking cudaStream_t (or void*) works without
/// this header needing the CUDA headers.
class NativeStream {
 public:
  explicit NativeStream(void* handle) noexcept : handle_(handle) {}
  void* get() const noexcept { return handle_; }
  template <class T>
  operator T*() const noexcept {
    return static_cast<T*>(handle_);
  }

 private:
  void* handle_;
};

/// An owned stream id from the runtime's pool (or an imported native
/// stream). Move-only; the destructor gives the id back (queued work still
/// runs). Ids are never reused, so a stale id is an error, never another
/// stream.
class Stream {
 public:
  Stream() noexcept = default;
  /// Adopt `id` of runtime `rt`; this object will release it.
  Stream(xlog_runtime* rt, xlog_stream id) noexcept : rt_(rt), id_(id) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& other) noexcept : rt_(other.rt_), id_(other.id_) {
    other.rt_ = nullptr;
    other.id_ = 0;
  }
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      release_quietly();
      rt_ = std::exchange(other.rt_, nullptr);
      id_ = std::exchange(other.id_, 0);
    }
    return *this;
  }
  ~Stream() { release_quietly(); }

  /// The stream id (0 for an empty Stream).
  xlog_stream id() const noexcept { return id_; }
  xlog_runtime* runtime_handle() const noexcept { return rt_; }
  explicit operator bool() const noexcept { return rt_ != nullptr; }

  /// The native cudaStream_t (an opaque token on the sim backend).
  void* native() const {
    void* handle = nullptr;
    check(xlog_stream_native(rt_, id_, &handle), "xlog_stream_native");
    return handle;
  }

  /// Block until all work queued so far on this stream has completed.
  void synchronize() const { check(xlog_stream_synchronize(rt_, id_), "xlog_stream_synchronize"); }

  /// Run `fn()` on a host thread in stream order (cuLaunchHostFunc on CUDA,
  /// the stream's worker on sim). `fn` must make no xlog call, on either
  /// backend: each is refused there (XLOG_ERR_STREAM_MISUSE, which these
  /// wrappers throw as xlog::Error), and a Block or Stream destroyed there
  /// is not freed or released (its runtime's close does it). The callable is moved to the heap and deleted after it
  /// has run. It must not throw: the call comes from the library's thread,
  /// where an escaping exception ends the process (std::terminate).
  template <class F>
  void enqueue_host(F&& fn) const {
    using Callable = std::decay_t<F>;
    static_assert(std::is_invocable_v<Callable&>, "enqueue_host needs a callable taking no arguments");
    auto owned = std::make_unique<Callable>(std::forward<F>(fn));
    check(xlog_stream_enqueue_host(rt_, id_, &Stream::trampoline<Callable>, owned.get()),
          "xlog_stream_enqueue_host");
    owned.release();  // the trampoline owns it now
  }

  /// Give the id back now; throws on failure (the id is kept then), e.g.
  /// XLOG_ERR_STREAM_MISUSE while the stream takes part in a capture.
  void reset() {
    if (rt_ == nullptr) return;
    check(xlog_stream_release(rt_, id_), "xlog_stream_release");
    rt_ = nullptr;
    id_ = 0;
  }

  /// Stop owning the id without releasing it; returns it.
  xlog_stream release() noexcept {
    rt_ = nullptr;
    return std::exchange(id_, 0);
  }

 private:
  template <class Callable>
  static void trampoline(void* user) noexcept {
    std::unique_ptr<Callable> fn(static_cast<Callable*>(user));
    (*fn)();
  }

  void release_quietly() noexcept {
    // Destructors must not throw. A failure here means the runtime is
    // already closed (the close reclaimed the stream), or the stream takes
    // part in a capture (the release is refused: the id stays acquired and
    // the runtime's close names it as never released).
    if (rt_ != nullptr) (void)xlog_stream_release(rt_, id_);
    rt_ = nullptr;
    id_ = 0;
  }

  xlog_runtime* rt_ = nullptr;
  xlog_stream id_ = 0;
};

/// An owned device block. Move-only; the destructor frees it with
/// xlog_deallocate, which is stream-ordered: the allocation stream first
/// waits for every recorded use on other streams. The bytes stay charged to
/// the budget (as pending) until Runtime::reap() sees the free complete.
class Block {
 public:
  Block() noexcept = default;
  /// Adopt `block` of runtime `rt`; this object will free it.
  Block(xlog_runtime* rt, const xlog_block& block) noexcept : rt_(rt), block_(block) {}
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  Block(Block&& other) noexcept : rt_(std::exchange(other.rt_, nullptr)), block_(other.block_) {
    other.block_ = xlog_block{};
  }
  Block& operator=(Block&& other) noexcept {
    if (this != &other) {
      free_quietly();
      rt_ = std::exchange(other.rt_, nullptr);
      block_ = std::exchange(other.block_, xlog_block{});
    }
    return *this;
  }
  ~Block() { free_quietly(); }

  /// Device pointer (host memory on sim); nullptr for a 0-byte block.
  void* get() const noexcept { return block_.ptr; }
  template <class T>
  T* data() const noexcept {
    return static_cast<T*>(block_.ptr);
  }
  std::uint64_t size() const noexcept { return block_.size; }
  /// The C value handle (copyable; checked by generation on every use).
  const xlog_block& handle() const noexcept { return block_; }
  xlog_runtime* runtime_handle() const noexcept { return rt_; }
  /// True while this object owns a block (a 0-byte block counts).
  explicit operator bool() const noexcept { return rt_ != nullptr; }

  /// Stop owning the block without freeing it; returns its handle.
  xlog_block release() noexcept {
    rt_ = nullptr;
    return std::exchange(block_, xlog_block{});
  }

  /// Free now (stream-ordered). Throws on failure and keeps ownership then,
  /// since a failed xlog_deallocate changes nothing.
  void reset() {
    if (rt_ == nullptr) return;
    check(xlog_deallocate(rt_, block_), "xlog_deallocate");
    rt_ = nullptr;
    block_ = xlog_block{};
  }

 private:
  void free_quietly() noexcept {
    // Destructors must not throw; a block whose free failed is reported as
    // a leak (tag and size) when the runtime closes.
    if (rt_ != nullptr) (void)xlog_deallocate(rt_, block_);
    rt_ = nullptr;
    block_ = xlog_block{};
  }

  xlog_runtime* rt_ = nullptr;
  xlog_block block_{};
};

/// Leak report returned by Runtime::close(): what the last close of the
/// runtime found still live (and freed), and the pooled streams acquired and
/// never released (and released); each is also named on stderr and in the
/// log. Zeros from a close that only dropped one reference of a shared
/// (CUDA) runtime.
struct CloseReport {
  std::uint64_t leaked_blocks = 0;
  std::uint64_t leaked_bytes = 0;
  std::uint64_t unreleased_streams = 0;
};

using Stats = xlog_stats;
/// One live block (its tag and call_site strings live as long as the process).
using LiveBlock = xlog_live_block;
/// Counters of one tag (its tag string lives as long as the process).
using TagStat = xlog_tag_stat;

#define XLOG_DETAIL_STRINGIFY2(x) #x
#define XLOG_DETAIL_STRINGIFY(x) XLOG_DETAIL_STRINGIFY2(x)
/// "file.cpp:42" of the place it is written: a call site for allocate_at.
#define XLOG_CALL_SITE (__FILE__ ":" XLOG_DETAIL_STRINGIFY(__LINE__))

namespace detail {
/// Call a fill-a-buffer entry point until the buffer holds every entry
/// (other threads may allocate between the sizing call and the filling one).
template <class T, class Call>
std::vector<T> fill_array(Call call, const char* name) {
  std::size_t count = 0;
  check(call(nullptr, 0, &count), name);
  std::vector<T> out;
  for (;;) {
    out.assign(count + 16, T{});
    out[0].struct_size = sizeof(T);
    const std::size_t cap = out.size();
    check(call(out.data(), cap, &count), name);
    if (count <= cap) {
      out.resize(count);
      return out;
    }
  }
}
}  // namespace detail

/// An open runtime of one device. Move-only; opened by the constructor,
/// closed by the destructor (errors ignored — call close() to see them and
/// the leak report). On CUDA, runtimes of one ordinal share state (and one
/// budget) in the library; each object is still its own open/close pair.
class Runtime {
 public:
  /// Defaults plus environment, device 0.
  Runtime() : Runtime(Config()) {}
  explicit Runtime(const Config& config, std::int32_t device = 0) {
    const xlog_config raw = config.raw();
    check(xlog_runtime_open(device, &raw, &rt_), "xlog_runtime_open");
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  Runtime(Runtime&& other) noexcept : rt_(std::exchange(other.rt_, nullptr)) {}
  Runtime& operator=(Runtime&& other) noexcept {
    if (this != &other) {
      close_quietly();
      rt_ = std::exchange(other.rt_, nullptr);
    }
    return *this;
  }
  ~Runtime() { close_quietly(); }

  /// The C handle, for calls this header does not wrap.
  xlog_runtime* handle() const noexcept { return rt_; }
  explicit operator bool() const noexcept { return rt_ != nullptr; }

  /// XLOG_BACKEND_CUDA or XLOG_BACKEND_SIM (what AUTO resolved to).
  xlog_backend backend() const {
    xlog_backend out = XLOG_BACKEND_AUTO;
    check(xlog_runtime_backend(rt_, &out), "xlog_runtime_backend");
    return out;
  }

  /// A snapshot of the counters (struct_size is set here for the caller).
  Stats stats() const {
    Stats out{};
    out.struct_size = sizeof(Stats);
    check(xlog_get_stats(rt_, &out), "xlog_get_stats");
    return out;
  }

  /// Every live block, by generation: allocation order within a thread (xlog_live_blocks).
  std::vector<LiveBlock> live_blocks() const {
    xlog_runtime* rt = rt_;
    return detail::fill_array<LiveBlock>(
        [rt](LiveBlock* out, std::size_t cap, std::size_t* count) { return xlog_live_blocks(rt, out, cap, count); },
        "xlog_live_blocks");
  }

  /// Counters per tag, largest live bytes first (xlog_tag_stats).
  std::vector<TagStat> tag_stats() const {
    xlog_runtime* rt = rt_;
    return detail::fill_array<TagStat>(
        [rt](TagStat* out, std::size_t cap, std::size_t* count) { return xlog_tag_stats(rt, out, cap, count); },
        "xlog_tag_stats");
  }

  /// Restart every peak from its current value (xlog_reset_peak).
  void reset_peak() { check(xlog_reset_peak(rt_), "xlog_reset_peak"); }

  /// The readable memory summary (xlog_memory_summary).
  std::string memory_summary() const {
    std::size_t needed = 0;
    check(xlog_memory_summary(rt_, nullptr, 0, &needed), "xlog_memory_summary");
    for (;;) {
      std::string text(needed, '\0');
      const std::size_t cap = text.size();
      check(xlog_memory_summary(rt_, &text[0], cap, &needed), "xlog_memory_summary");
      if (needed <= cap) {
        text.resize(needed - 1);
        return text;
      }
    }
  }

  /// Retire completed frees without blocking; returns the bytes released.
  std::uint64_t reap() {
    std::uint64_t reclaimed = 0;
    check(xlog_reap(rt_, &reclaimed), "xlog_reap");
    return reclaimed;
  }

  /// Give cached memory back to the driver until at most `keep_bytes` stay
  /// cached (0: all of it); returns the bytes released.
  std::uint64_t trim(std::uint64_t keep_bytes = 0) {
    std::uint64_t released = 0;
    check(xlog_trim(rt_, keep_bytes, &released), "xlog_trim");
    return released;
  }

  /// Wait for every free queued so far, then reap; returns the bytes released.
  std::uint64_t drain() {
    std::uint64_t reclaimed = 0;
    check(xlog_drain(rt_, &reclaimed), "xlog_drain");
    return reclaimed;
  }

  /// A stream from the bounded pool (XLOG_ERR_POOL_EXHAUSTED past its size).
  Stream acquire_stream() {
    xlog_stream id = 0;
    check(xlog_stream_acquire(rt_, &id), "xlog_stream_acquire");
    return Stream(rt_, id);
  }

  /// Adopt a foreign cudaStream_t (nullptr = legacy default stream). The
  /// library maps one native stream to one id until that id is released, so
  /// keep a single owning Stream per native stream.
  Stream import_stream(void* cuda_stream) {
    xlog_stream id = 0;
    check(xlog_stream_import(rt_, cuda_stream, &id), "xlog_stream_import");
    return Stream(rt_, id);
  }

  /// Allocate `bytes` ordered on `stream` (>= 256-byte alignment; 0 bytes
  /// gives a null pointer). `tag` names the caller in logs and errors.
  Block allocate(std::uint64_t bytes, xlog_stream stream, const char* tag = nullptr) {
    xlog_block block{};
    check(xlog_allocate(rt_, bytes, stream, tag, &block), "xlog_allocate");
    return Block(rt_, block);
  }
  Block allocate(std::uint64_t bytes, const Stream& stream, const char* tag = nullptr) {
    return allocate(bytes, stream.id(), tag);
  }
  Block allocate(std::uint64_t bytes, const Stream& stream, const std::string& tag) {
    return allocate(bytes, stream.id(), tag.c_str());
  }

  /// allocate() recording `call_site` (e.g. XLOG_CALL_SITE) for
  /// live_blocks() when the runtime tracks call sites.
  Block allocate_at(std::uint64_t bytes, xlog_stream stream, const char* tag, const char* call_site) {
    xlog_block block{};
    check(xlog_allocate_at(rt_, bytes, stream, tag, call_site, &block), "xlog_allocate_at");
    return Block(rt_, block);
  }
  Block allocate_at(std::uint64_t bytes, const Stream& stream, const char* tag, const char* call_site) {
    return allocate_at(bytes, stream.id(), tag, call_site);
  }

  /// Let this runtime's device and `peer`'s (another device) use each
  /// other's memory: afterwards a stream of either may be passed to the
  /// other's prepare/finish for its blocks. Once per device pair (again is a
  /// no-op); throws XLOG_ERR_UNSATISFIABLE_DEPENDENCY, naming both devices,
  /// where the hardware has no peer access between them.
  void enable_peer_access(const Runtime& peer) {
    check(xlog_enable_peer_access(rt_, peer.rt_), "xlog_enable_peer_access");
  }

  /// XLOG_OK if `block` is live here, else the reason (does not throw).
  xlog_status validate(const xlog_block& block) const noexcept { return xlog_block_validate(rt_, block); }
  xlog_status validate(const Block& block) const noexcept { return validate(block.handle()); }

  /// Close now; returns what was still live (leaked) and the streams never
  /// released. The handle is gone
  /// afterwards even if this throws, except when the library refuses the
  /// close (XLOG_ERR_STREAM_MISUSE: from inside a host callback, or while a
  /// stream of the runtime takes part in a capture): nothing changed then,
  /// and this object still owns the open handle.
  CloseReport close() {
    CloseReport report;
    if (rt_ == nullptr) return report;
    xlog_close_report found{};
    found.struct_size = sizeof found;
    const xlog_status status = xlog_runtime_close_detailed(rt_, &found);
    if (status != XLOG_ERR_STREAM_MISUSE) rt_ = nullptr;
    check(status, "xlog_runtime_close_detailed");
    report.leaked_blocks = found.leaked_blocks;
    report.leaked_bytes = found.leaked_bytes;
    report.unreleased_streams = found.unreleased_streams;
    return report;
  }

 private:
  void close_quietly() noexcept {
    // Destructors must not throw; the library prints leak reports itself.
    if (rt_ != nullptr) (void)xlog_runtime_close(rt_);
    rt_ = nullptr;
  }

  xlog_runtime* rt_ = nullptr;
};

/// One block used by a launch, for prepare_all / finish_all.
inline xlog_use use(const xlog_block& block, xlog_access access) noexcept {
  xlog_use out{};
  out.block = block;
  out.access = access;
  return out;
}
inline xlog_use read(const xlog_block& block) noexcept { return use(block, XLOG_ACCESS_READ); }
inline xlog_use write(const xlog_block& block) noexcept { return use(block, XLOG_ACCESS_WRITE); }
inline xlog_use read_write(const xlog_block& block) noexcept { return use(block, XLOG_ACCESS_READ_WRITE); }
inline xlog_use read(const Block& block) noexcept { return read(block.handle()); }
inline xlog_use write(const Block& block) noexcept { return write(block.handle()); }
inline xlog_use read_write(const Block& block) noexcept { return read_write(block.handle()); }

namespace detail {

// Call the launch's work with whatever it accepts, in this order: the
// Stream itself, the native stream (any pointer type: cudaStream_t, void*),
// the stream id, or nothing.
template <class F>
void invoke_work(F& work, const Stream& stream) {
  if constexpr (std::is_invocable_v<F&, const Stream&>) {
    work(stream);
  } else if constexpr (std::is_invocable_v<F&, NativeStream>) {
    work(NativeStream(stream.native()));
  } else if constexpr (std::is_invocable_v<F&, xlog_stream>) {
    work(stream.id());
  } else {
    static_assert(std::is_invocable_v<F&>,
                  "launch work must take const xlog::Stream&, a native stream pointer, an xlog_stream, or nothing");
    work();
  }
}

}  // namespace detail

/// The recorded-launch form: xlog_prepare_all (queue the waits the uses
/// need), then `work` enqueues the real work on `stream`, then
/// xlog_finish_all (record the uses with one event). If `work` throws,
/// finish_all is not called (nothing was enqueued that needs recording) and
/// the exception propagates.
template <class F>
void launch(Runtime& rt, const Stream& stream, const xlog_use* uses, std::size_t count, F&& work) {
  check(xlog_prepare_all(rt.handle(), stream.id(), uses, count), "xlog_prepare_all");
  detail::invoke_work(work, stream);
  check(xlog_finish_all(rt.handle(), stream.id(), uses, count), "xlog_finish_all");
}

template <class F>
void launch(Runtime& rt, const Stream& stream, std::initializer_list<xlog_use> uses, F&& work) {
  launch(rt, stream, uses.begin(), uses.size(), std::forward<F>(work));
}

template <class F>
void launch(Runtime& rt, const Stream& stream, const std::vector<xlog_use>& uses, F&& work) {
  launch(rt, stream, uses.data(), uses.size(), std::forward<F>(work));
}

}  // namespace xlog

#endif  // XLOG_RUNTIME_HPP
