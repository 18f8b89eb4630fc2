// xlog/mr.hpp — xlog as a CCCL / RMM memory resource (header-only, C++17).
//
// xlog::memory_resource hands out device memory from an open xlog runtime, so
// code that takes a `cuda::mr` resource (RMM's device_async_resource_ref,
// rmm::mr::set_current_device_resource, device_buffer/device_uvector, Thrust
// and CUB temporary storage through CCCL) allocates under xlog's budget, its
// stream ordering, its stats and its log.
//
// Contract
//
//   * Borrowed runtime. The resource does not own the xlog_runtime: keep the
//     runtime open until every copy of the resource is gone and every pointer
//     it handed out has been deallocated. Copies are cheap and share one
//     state (a pointer → block map and a stream cache); two resources compare
//     equal exactly when they share that state, because only then can one
//     free what the other allocated.
//   * Members, both CCCL generations. CCCL 3.1 and later name the
//     stream-ordered pair `allocate(stream, bytes, alignment)` /
//     `deallocate(stream, ptr, bytes, alignment)` (concept cuda::mr::resource)
//     and the blocking pair `allocate_sync` / `deallocate_sync`
//     (cuda::mr::synchronous_resource). CCCL 2.x and 3.0 (CUDA 12, 13.0) named the blocking
//     pair `allocate(bytes, alignment)` / `deallocate(ptr, bytes, alignment)`
//     (its cuda::mr::resource) and the stream-ordered pair
//     `allocate_async(bytes, alignment, stream)` / `deallocate_async(ptr,
//     bytes, alignment, stream)` (its cuda::mr::async_resource). This class
//     has all of them, so it satisfies either generation's concepts, with the
//     property cuda::mr::device_accessible. Members that take a
//     cuda::stream_ref exist only where <cuda/memory_resource> is found; the
//     `*_on(void* cuda_stream, ...)` members are the same calls without CCCL.
//   * Streams. A cudaStream_t is adopted with xlog_stream_import the first
//     time it is seen and the xlog stream id is cached for the life of the
//     shared state (never released: xlog maps one native stream to one id).
//     The blocking pair uses the legacy default stream (a NULL cudaStream_t).
//   * Blocking allocate synchronizes the legacy default stream after the
//     allocation, so the memory is ready for any stream when it returns.
//     Blocking deallocate does not wait: the free is queued in stream order
//     (xlog's rule) and the caller already promises no work uses the memory.
//   * Stream-ordered deallocate on a stream other than the allocation stream
//     first records a use of the block on that stream (xlog_prepare +
//     xlog_finish), so the allocation stream waits for the work queued there
//     before the memory is reused, as the CCCL/RMM contract asks.
//   * Pointer → block. RMM and CCCL give back only the pointer; the resource
//     keeps each live pointer's xlog_block (generation included) in a map
//     under a mutex. The mutex is never held across an xlog call, since an
//     allocation may wait for budget pressure to clear.
//   * Zero bytes returns nullptr without calling xlog; deallocating nullptr
//     does nothing. A pointer this resource never handed out (or already
//     freed) is not freed: deallocate is noexcept, so it is counted in
//     unmatched_deallocations() instead.
//   * Alignment. xlog aligns every block to 256 bytes. An alignment that is
//     not a power of two or is above 256 throws xlog::bad_alloc with status
//     XLOG_ERR_INVALID_ARGUMENT; nothing is allocated.
//   * Refusals. XLOG_ERR_OUT_OF_BUDGET and XLOG_ERR_OUT_OF_MEMORY throw
//     xlog::bad_alloc. Without RMM it derives from std::bad_alloc. Where
//     RMM's headers come first (any RMM header included before this one,
//     which is how RMM code reads anyway), or with XLOG_MR_RMM_ERRORS
//     defined to 1, it derives from rmm::out_of_memory instead (itself an
//     rmm::bad_alloc, itself a std::bad_alloc), so RMM code and RMM's
//     failure_callback / failure_alternate adaptors see xlog's refusal as
//     RMM's own; XLOG_MR_RMM_ERRORS 0 turns that off. Either way status()
//     tells the cases apart and what() carries the library's numbers. Every
//     other failure (a closed runtime, a stream pool exhausted by imports,
//     a driver error) throws xlog::Error. Deallocation never throws; a
//     failed xlog_deallocate is dropped (the runtime's close reports the
//     block as leaked).
// Typical use with RMM (RMM 25.x/26.x, CCCL 3):
//
//   xlog::Runtime rt{xlog::Config().budget_bytes(8ull << 30)};
//   xlog::memory_resource xmr{rt, "rmm"};
//   rmm::mr::set_current_device_resource_ref(xmr);   // RMM 25.x; 26.04 renamed
//                                                    // it set_current_device_resource
//   rmm::device_uvector<int> v(1 << 20, stream);     // charged to xlog

#ifndef XLOG_MR_HPP
#define XLOG_MR_HPP

#include "runtime.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>

// CCCL 2.x only declares its memory-resource concepts when this macro is set
// before <cuda/memory_resource>; CCCL 3.x no longer reads it. Setting it here
// (if the includer has not) makes the header work with either.
#if defined(__has_include)
#  if __has_include(<cuda/memory_resource>) && __has_include(<cuda/stream_ref>)
#    ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#      define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#    endif
#    include <cuda/memory_resource>
#    include <cuda/stream_ref>
#    define XLOG_MR_HAVE_CCCL 1
#  endif
#endif
#ifndef XLOG_MR_HAVE_CCCL
#  define XLOG_MR_HAVE_CCCL 0
#endif

namespace xlog {

// RMM's exception types, when RMM is in use (see "Refusals" above).
// RMM_NAMESPACE_BEGIN comes from rmm/detail/export.hpp, which every RMM
// header includes first.
#ifndef XLOG_MR_RMM_ERRORS
#  if defined(RMM_NAMESPACE_BEGIN)
#    define XLOG_MR_RMM_ERRORS 1
#  else
#    define XLOG_MR_RMM_ERRORS 0
#  endif
#endif
#if XLOG_MR_RMM_ERRORS
#  include <rmm/error.hpp>
#endif

namespace detail {
#if XLOG_MR_RMM_ERRORS
/// rmm::out_of_memory keeps the message it is given and returns it from what().
class bad_alloc_base : public ::rmm::out_of_memory {
 protected:
  explicit bad_alloc_base(const std::string& message) : ::rmm::out_of_memory(message) {}
};
#else
/// std::bad_alloc has no message of its own: keep ours and return it.
class bad_alloc_base : public std::bad_alloc {
 public:
  const char* what() const noexcept override { return what_.c_str(); }

 protected:
  explicit bad_alloc_base(std::string message) : what_(std::move(message)) {}

 private:
  std::string what_;
};
#endif
}  // namespace detail

/// An allocation the memory resource could not make: the budget or the
/// device refused it (XLOG_ERR_OUT_OF_BUDGET / XLOG_ERR_OUT_OF_MEMORY), or
/// the alignment asked for is one xlog does not give
/// (XLOG_ERR_INVALID_ARGUMENT). A std::bad_alloc, as allocators' callers
/// expect (an rmm::out_of_memory where RMM is in use); status() tells the
/// cases apart and what() carries the library's message with its numbers.
class bad_alloc : public detail::bad_alloc_base {
 public:
  bad_alloc(xlog_status status, const std::string& message)
      : detail::bad_alloc_base(std::string(xlog_status_name(status)) + ": " + message), status_(status) {}
  xlog_status status() const noexcept { return status_; }

 private:
  xlog_status status_;
};

class memory_resource {
 public:
  /// What every xlog block is aligned to; the largest alignment accepted.
  static constexpr std::size_t max_alignment = 256;

  /// Over a borrowed C runtime handle. `tag` names these allocations in
  /// xlog's log, leak reports and tag stats.
  explicit memory_resource(xlog_runtime* runtime, std::string tag = "cuda::mr")
      : state_(std::make_shared<shared_state>(runtime, std::move(tag))) {}
  explicit memory_resource(const Runtime& runtime, std::string tag = "cuda::mr")
      : memory_resource(runtime.handle(), std::move(tag)) {}

  xlog_runtime* runtime_handle() const noexcept { return state_->runtime; }

  // ---- blocking pair (CCCL 3.1+ names) ----
  void* allocate_sync(std::size_t bytes, std::size_t alignment) {
    const xlog_stream stream = import_stream(nullptr);
    void* ptr = allocate_ordered(stream, bytes, alignment);
    if (ptr != nullptr) {
      const xlog_status synced = xlog_stream_synchronize(state_->runtime, stream);
      if (synced != XLOG_OK) {
        const std::string message = last_error_message();
        release(nullptr, ptr);
        throw Error(synced, message, "xlog_stream_synchronize");
      }
    }
    return ptr;
  }
  void deallocate_sync(void* ptr, std::size_t /*bytes*/, std::size_t /*alignment*/) noexcept {
    release(nullptr, ptr);
  }

  // ---- blocking pair (CCCL 2 / 3.0 names) ----
  void* allocate(std::size_t bytes, std::size_t alignment) { return allocate_sync(bytes, alignment); }
  void deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
    deallocate_sync(ptr, bytes, alignment);
  }

  // ---- stream-ordered pair on a raw cudaStream_t (no CCCL needed) ----
  void* allocate_on(void* cuda_stream, std::size_t bytes, std::size_t alignment) {
    return allocate_ordered(import_stream(cuda_stream), bytes, alignment);
  }
  void deallocate_on(void* cuda_stream, void* ptr, std::size_t /*bytes*/, std::size_t /*alignment*/) noexcept {
    release(cuda_stream, ptr);
  }

#if XLOG_MR_HAVE_CCCL
  // ---- stream-ordered pair (CCCL 3.1+ names) ----
  void* allocate(::cuda::stream_ref stream, std::size_t bytes, std::size_t alignment) {
    return allocate_on(static_cast<void*>(stream.get()), bytes, alignment);
  }
  void deallocate(::cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
    deallocate_on(static_cast<void*>(stream.get()), ptr, bytes, alignment);
  }

  // ---- stream-ordered pair (CCCL 2 / 3.0 names) ----
  void* allocate_async(std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) {
    return allocate(stream, bytes, alignment);
  }
  void deallocate_async(void* ptr, std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) noexcept {
    deallocate(stream, ptr, bytes, alignment);
  }

  /// Blocks are device memory (host memory on the sim backend, which CCCL
  /// code never sees: it needs a GPU).
  friend void get_property(const memory_resource&, ::cuda::mr::device_accessible) noexcept {}
#endif

  /// Same shared state: memory from one may be freed through the other.
  bool operator==(const memory_resource& other) const noexcept { return state_ == other.state_; }
  bool operator!=(const memory_resource& other) const noexcept { return !(*this == other); }

  /// Pointers handed out and not yet deallocated.
  std::size_t live_pointers() const {
    std::lock_guard<std::mutex> guard(state_->mutex);
    return state_->blocks.size();
  }
  /// Deallocations of a pointer this state did not hand out (or freed twice).
  std::uint64_t unmatched_deallocations() const noexcept {
    return state_->unmatched_deallocations.load(std::memory_order_relaxed);
  }

 private:
  struct shared_state {
    shared_state(xlog_runtime* rt, std::string name) : runtime(rt), tag(std::move(name)) {}
    xlog_runtime* runtime;
    std::string tag;
    std::mutex mutex;  // guards blocks and streams; never held across an xlog call
    std::unordered_map<void*, xlog_block> blocks;
    std::unordered_map<void*, xlog_stream> streams;  // cudaStream_t → imported id
    std::atomic<std::uint64_t> unmatched_deallocations{0};
  };

  xlog_stream import_stream(void* cuda_stream) {
    {
      std::lock_guard<std::mutex> guard(state_->mutex);
      const auto found = state_->streams.find(cuda_stream);
      if (found != state_->streams.end()) return found->second;
    }
    // Outside the lock: two threads may both import a new stream; xlog gives
    // both the same id for the same native stream, so either insert is right.
    xlog_stream id = 0;
    check(xlog_stream_import(state_->runtime, cuda_stream, &id), "xlog_stream_import");
    std::lock_guard<std::mutex> guard(state_->mutex);
    state_->streams.emplace(cuda_stream, id);
    return id;
  }

  void* allocate_ordered(xlog_stream stream, std::size_t bytes, std::size_t alignment) {
    const bool power_of_two = alignment != 0 && (alignment & (alignment - 1)) == 0;
    if (!power_of_two || alignment > max_alignment) {
      throw bad_alloc(XLOG_ERR_INVALID_ARGUMENT,
                      "alignment " + std::to_string(alignment) +
                          " is not a power of two up to 256, the alignment of every xlog block");
    }
    if (bytes == 0) return nullptr;
    xlog_block block{};
    const xlog_status status =
        xlog_allocate(state_->runtime, static_cast<std::uint64_t>(bytes), stream, state_->tag.c_str(), &block);
    if (status == XLOG_ERR_OUT_OF_BUDGET || status == XLOG_ERR_OUT_OF_MEMORY) {
      throw bad_alloc(status, last_error_message());
    }
    check(status, "xlog_allocate");
    std::lock_guard<std::mutex> guard(state_->mutex);
    state_->blocks.emplace(block.ptr, block);
    return block.ptr;
  }

  // Frees `ptr` in stream order. `cuda_stream` is where the caller's last
  // use of the memory was queued, or nullptr for the blocking pair.
  void release(void* cuda_stream, void* ptr) noexcept {
    if (ptr == nullptr) return;
    xlog_block block{};
    bool have_stream = false;
    xlog_stream free_stream = 0;
    {
      std::lock_guard<std::mutex> guard(state_->mutex);
      const auto found = state_->blocks.find(ptr);
      if (found == state_->blocks.end()) {
        state_->unmatched_deallocations.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      block = found->second;
      state_->blocks.erase(found);
      const auto stream = state_->streams.find(cuda_stream);
      if (stream != state_->streams.end()) {
        have_stream = true;
        free_stream = stream->second;
      }
    }
    xlog_runtime* rt = state_->runtime;
    if (!have_stream && xlog_stream_import(rt, cuda_stream, &free_stream) == XLOG_OK) {
      have_stream = true;
      std::lock_guard<std::mutex> guard(state_->mutex);
      state_->streams.emplace(cuda_stream, free_stream);
    }
    // The block's allocation stream knows nothing of work the caller queued
    // on another stream; record that stream's use so the free waits for it.
    // If the stream cannot be imported (a pool exhausted by imports) the
    // free still happens, ordered on the allocation stream only: deallocate
    // cannot throw, and keeping the memory would leak it.
    if (have_stream && free_stream != block.stream) {
      if (xlog_prepare(rt, block, free_stream, XLOG_ACCESS_READ_WRITE) == XLOG_OK) {
        (void)xlog_finish(rt, block, free_stream, XLOG_ACCESS_READ_WRITE);
      }
    }
    (void)xlog_deallocate(rt, block);
  }

  std::shared_ptr<shared_state> state_;
};

}  // namespace xlog

#endif  // XLOG_MR_HPP
