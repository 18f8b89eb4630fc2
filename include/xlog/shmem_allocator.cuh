// xlog/shmem_allocator.cuh — a per-block bump (stack) allocator over CUDA
// dynamic shared memory, after RXMesh's ShmemAllocator.
//
// A kernel launched with `kernel<<<grid, block, dynamic_bytes>>>` gets
// `dynamic_bytes` of shared memory that CUDA exposes as one unsized
// `extern __shared__` array. This allocator hands out pieces of that array:
// alloc() aligns the bump pointer and advances it, dealloc() moves it back.
// Both are O(1) and keep no per-block bookkeeping, so release is LIFO only.
//
//   __global__ void kernel(int n) {
//     xlog::ShmemAllocator shmem;                  // one per thread, in registers
//     float* scratch = shmem.alloc<float>(n);      // 8-byte aligned
//     char*  tile    = shmem.alloc(4096, 128);     // 128-byte aligned
//     ...
//     shmem.dealloc(4096);                         // LIFO: the last one first
//     shmem.dealloc<float>(n);
//   }
//
//   // host: size the launch with the planner (xlog/shmem_plan.hpp)
//   xlog::ShmemPlan plan;
//   plan.add<float>(n);
//   plan.add_bytes(4096, 128);
//   kernel<<<grid, block, plan.bytes()>>>(n);
//
// Build-time switches (define them before including this header, and the same
// way in every translation unit of a program, since they change inline code):
//
//   NDEBUG                         standard: removes every assert below.
//   XLOG_SHMEM_NO_OVERFLOW_ASSERT  alloc() failures (overflow, bad alignment,
//                                  size overflow in alloc<T>) return nullptr
//                                  without asserting even in debug builds. A
//                                  device assert aborts the whole kernel, so
//                                  code (and tests) that handle nullptr need it.
//   XLOG_SHMEM_NO_LIFO_ASSERT      dealloc() misuse (underflow, and in checked
//                                  mode a non-LIFO size) is reported only
//                                  through the return state / lifo_violated(),
//                                  not by an assert.
//   XLOG_SHMEM_CHECKED             makes xlog::ShmemAllocator the checked
//                                  variant (see ShmemAllocatorChecked).
//   XLOG_SHMEM_CHECKED_DEPTH       number of live allocations the checked
//                                  variant remembers (default 16).
//
// Alignment guarantee. The dynamic base is declared __align__(16) (PTX
// `.extern .shared .align 16`), so the toolchain places it on a 16-byte
// boundary after any static shared memory of the kernel. Nothing larger is
// assumed, and nothing larger can be: on an H200 the base was at shared
// address 1024 in a kernel without static shared memory and at 1040 in one
// with 13 bytes of it. alloc() therefore aligns the real shared-memory
// address of each block, not its offset from the base: a block requested
// with alignment A is A-aligned in the shared window for every power of two
// A, and so is its generic pointer, since the shared window starts at a
// generic address aligned far beyond that (the device test checks both).
// Because the padding for A > 16 depends on where the base sits, the planner
// charges its worst case for such alignments; for A <= 16 planner and device
// agree byte for byte.
//
// Thread safety. An allocator object is not synchronized. The intended use is
// one allocator per thread, in registers, with every thread of the block
// issuing the same alloc/dealloc sequence with the same arguments: all threads
// then compute the same pointers without talking to each other. If a single
// instance lives in shared memory instead (constructed by one thread, e.g.
// with placement new into a __shared__ buffer), only one thread may call
// alloc/dealloc, and it must publish the pointers with __syncthreads().
// Memory released by dealloc and handed out again is shared by all threads:
// put a __syncthreads() between the last use of the old block and the first
// write to the new one. Two allocators constructed in the same kernel both
// start at the base and overlap; pass one allocator around by reference.
#pragma once

#if !defined(__CUDACC__)
#error "xlog/shmem_allocator.cuh is CUDA device code; host-only code can include xlog/shmem_plan.hpp"
#endif

#include <cassert>
#include <cstdint>

#include "shmem_plan.hpp"

#ifndef XLOG_SHMEM_CHECKED_DEPTH
#define XLOG_SHMEM_CHECKED_DEPTH 16
#endif

// Internal assert helpers; #undef'd at the end of this header.
#if defined(NDEBUG) || defined(XLOG_SHMEM_NO_OVERFLOW_ASSERT)
#define XLOG_SHMEM_ALLOC_ASSERT(cond, what) ((void)0)
#else
#define XLOG_SHMEM_ALLOC_ASSERT(cond, what) assert((cond) && what)
#endif
#if defined(NDEBUG) || defined(XLOG_SHMEM_NO_LIFO_ASSERT)
#define XLOG_SHMEM_LIFO_ASSERT(cond, what) ((void)0)
#else
#define XLOG_SHMEM_LIFO_ASSERT(cond, what) assert((cond) && what)
#endif

namespace xlog {

/// How many live allocations ShmemAllocatorChecked remembers sizes for.
inline constexpr std::uint32_t kShmemCheckedDepth = XLOG_SHMEM_CHECKED_DEPTH;
static_assert(kShmemCheckedDepth > 0, "XLOG_SHMEM_CHECKED_DEPTH must be positive");

namespace detail {

// The block's dynamic shared memory. Every `extern __shared__` array of a
// kernel names the same address; the declared alignment is the guarantee the
// allocator (and kShmemBaseAlignment in the planner) builds on.
extern __shared__ __align__(16) char shmem_dynamic_base[];
static_assert(kShmemBaseAlignment == 16, "keep the declaration above in step");

// Per-allocator bookkeeping of the checked variant; empty when unchecked so
// the plain allocator stays two registers.
template <bool Checked>
struct ShmemLifoLog {};

template <>
struct ShmemLifoLog<true> {
  std::uint32_t live_sizes[kShmemCheckedDepth];  // sizes of the oldest live blocks
  std::uint32_t live_count = 0;                  // live blocks, tracked or not
  bool violated = false;
};

}  // namespace detail

/// The allocator. Use the aliases ShmemAllocator / ShmemAllocatorChecked.
///
/// Checked == true adds a small stack of the sizes of live allocations (the
/// first kShmemCheckedDepth of them) so that dealloc() can verify it pops the
/// most recent allocation. This costs local memory per thread; use it in debug
/// builds and tests.
template <bool Checked>
class BasicShmemAllocator : private detail::ShmemLifoLog<Checked> {
 public:
  /// Alignment used when alloc() is given none, and by alloc<T>.
  static constexpr std::uint32_t default_alignment = kShmemDefaultAlignment;
  /// Alignment of the dynamic base (see the header comment).
  static constexpr std::uint32_t base_alignment = kShmemBaseAlignment;
  static constexpr bool checked = Checked;

  /// Starts at the dynamic base with nothing allocated. Cheap: two registers
  /// (plus the LIFO log when checked).
  __device__ BasicShmemAllocator()
      : m_base_address(static_cast<std::uint32_t>(
            __cvta_generic_to_shared(detail::shmem_dynamic_base))),
        m_offset(0) {}

  /// Carves num_bytes whose shared-memory address is a multiple of
  /// byte_alignment, skipping padding first if needed.
  ///
  /// byte_alignment must be a power of two (1 .. 2^31). Returns nullptr, with
  /// the allocator unchanged, if the alignment is not a power of two or if the
  /// padded block would end past get_max_size_bytes(); both also assert in
  /// debug builds unless XLOG_SHMEM_NO_OVERFLOW_ASSERT is defined.
  /// num_bytes == 0 is allowed: it consumes only the padding and returns the
  /// aligned position (possibly one past the end of the dynamic memory), which
  /// must not be dereferenced.
  __device__ char* alloc(std::uint32_t num_bytes,
                         std::uint32_t byte_alignment = default_alignment) {
    if (!detail::shmem_is_power_of_two(byte_alignment)) {
      XLOG_SHMEM_ALLOC_ASSERT(false, "ShmemAllocator::alloc: alignment is not a power of two");
      return nullptr;
    }
    // Same rule, same function as ShmemPlan::add_bytes: pad the absolute
    // shared address, so planner and device cannot drift apart.
    const std::uint32_t padding =
        detail::shmem_padding(m_base_address + m_offset, byte_alignment);
    const std::uint64_t start = std::uint64_t{m_offset} + padding;
    const std::uint64_t end = start + num_bytes;
    if (end > get_max_size_bytes()) {
      XLOG_SHMEM_ALLOC_ASSERT(false, "ShmemAllocator::alloc: dynamic shared memory exhausted");
      return nullptr;
    }
    m_offset = static_cast<std::uint32_t>(end);
    if constexpr (Checked) {
      if (this->live_count < kShmemCheckedDepth) this->live_sizes[this->live_count] = num_bytes;
      ++this->live_count;
    }
    return detail::shmem_dynamic_base + start;
  }

  /// Typed convenience: count * sizeof(T) bytes at default_alignment (8).
  /// sizeof(T) must be <= 8 because only 8-byte alignment is requested; for
  /// larger types call alloc(count * sizeof(T), alignof(T)) or larger.
  /// Returns nullptr as alloc() does, and also when count * sizeof(T) does not
  /// fit in 32 bits.
  template <class T>
  __device__ T* alloc(std::uint32_t count) {
    static_assert(sizeof(T) <= default_alignment,
                  "alloc<T> only guarantees 8-byte alignment; use alloc(bytes, alignment)");
    static_assert(alignof(T) <= default_alignment, "alloc<T> needs alignof(T) <= 8");
    const std::uint64_t num_bytes = std::uint64_t{count} * sizeof(T);
    if (num_bytes > 0xFFFFFFFFull) {
      XLOG_SHMEM_ALLOC_ASSERT(false, "ShmemAllocator::alloc<T>: count * sizeof(T) overflows");
      return nullptr;
    }
    return reinterpret_cast<T*>(alloc(static_cast<std::uint32_t>(num_bytes), default_alignment));
  }

  /// Moves the bump pointer back by num_bytes: undoes the most recent
  /// allocation of that size. The padding that preceded it stays consumed
  /// (there is no bookkeeping to know it), so allocating the same size and
  /// alignment again returns the same pointer, and releasing every block can
  /// leave get_allocated_size_bytes() above zero by the padding skipped for
  /// over-aligned blocks. ShmemPlan models exactly this.
  ///
  /// LIFO only: releasing anything but the most recent live block makes later
  /// allocations overlap live ones. The unchecked allocator cannot see that;
  /// the checked one detects it. Releasing more than is allocated (underflow),
  /// and in checked mode a size different from the most recent allocation, is
  /// ignored (the allocator is left unchanged), sets lifo_violated() when
  /// checked, and asserts in debug builds unless XLOG_SHMEM_NO_LIFO_ASSERT.
  __device__ void dealloc(std::uint32_t num_bytes) {
    if constexpr (Checked) {
      const std::uint32_t live = this->live_count;
      const bool size_matches =
          live > 0 && (live > kShmemCheckedDepth || this->live_sizes[live - 1] == num_bytes);
      if (!size_matches || num_bytes > m_offset) {
        this->violated = true;
        XLOG_SHMEM_LIFO_ASSERT(false, "ShmemAllocator::dealloc: not the most recent allocation");
        return;
      }
      --this->live_count;
    } else {
      if (num_bytes > m_offset) {
        XLOG_SHMEM_LIFO_ASSERT(false, "ShmemAllocator::dealloc: more than is allocated");
        return;
      }
    }
    m_offset -= num_bytes;
  }

  /// Typed convenience for dealloc(count * sizeof(T)); a product that does not
  /// fit in 32 bits cannot have been allocated and counts as misuse.
  template <class T>
  __device__ void dealloc(std::uint32_t count) {
    const std::uint64_t num_bytes = std::uint64_t{count} * sizeof(T);
    if (num_bytes > 0xFFFFFFFFull) {
      if constexpr (Checked) this->violated = true;
      XLOG_SHMEM_LIFO_ASSERT(false, "ShmemAllocator::dealloc<T>: count * sizeof(T) overflows");
      return;
    }
    dealloc(static_cast<std::uint32_t>(num_bytes));
  }

  /// The dynamic shared memory this block was launched with, read from the
  /// PTX special register %dynamic_smem_size, so it always matches the launch
  /// however the size was passed.
  __device__ std::uint32_t get_max_size_bytes() const {
    std::uint32_t size;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(size));
    return size;
  }

  /// Bytes in use: the bump pointer's offset from the base, padding included.
  __device__ std::uint32_t get_allocated_size_bytes() const { return m_offset; }

  /// Start of the dynamic shared memory (generic pointer).
  __device__ char* base() const { return detail::shmem_dynamic_base; }

  /// Shared-window address of the base; ShmemPlan::for_base_address() takes
  /// it to replay this launch's carving exactly.
  __device__ std::uint32_t base_shared_address() const { return m_base_address; }

  /// Checked variant only: true once a dealloc was ignored as misuse (empty
  /// stack, size different from the most recent allocation, underflow).
  /// Sticky. Blocks beyond the first kShmemCheckedDepth live ones are only
  /// checked for underflow.
  __device__ bool lifo_violated() const {
    static_assert(Checked, "lifo_violated() needs ShmemAllocatorChecked (or XLOG_SHMEM_CHECKED)");
    return this->violated;
  }

  /// Checked variant only: number of live (allocated, not yet released) blocks.
  __device__ std::uint32_t live_allocations() const {
    static_assert(Checked, "live_allocations() needs ShmemAllocatorChecked (or XLOG_SHMEM_CHECKED)");
    return this->live_count;
  }

 private:
  std::uint32_t m_base_address;  // shared-window address of shmem_dynamic_base
  std::uint32_t m_offset;        // bytes in use, from the base
};

/// The checked variant: detects non-LIFO dealloc (see dealloc, lifo_violated).
using ShmemAllocatorChecked = BasicShmemAllocator<true>;

#if defined(XLOG_SHMEM_CHECKED)
using ShmemAllocator = BasicShmemAllocator<true>;
#else
/// The plain allocator: two registers, no bookkeeping.
using ShmemAllocator = BasicShmemAllocator<false>;
#endif

}  // namespace xlog

#undef XLOG_SHMEM_ALLOC_ASSERT
#undef XLOG_SHMEM_LIFO_ASSERT
