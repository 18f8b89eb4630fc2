// xlog/shmem_plan.hpp — host-side (and device-usable) planner for the dynamic
// shared memory that xlog::ShmemAllocator (xlog/shmem_allocator.cuh) carves.
//
// This header is plain C++17: a host-only translation unit compiled by g++ or
// clang++ can include it without any CUDA headers. Under nvcc the member
// functions are also __device__, so a kernel may build a plan too.
//
// Why a planner: the bytes a kernel must be launched with are the peak of a
// bump allocator *including its alignment padding*. Summing `count * sizeof(T)`
// by hand under-counts the padding and the kernel then gets nullptr from
// alloc(). ShmemPlan replays the allocator's exact carving rule instead, so the
// launch size and the device agree.
//
// Model (shared with the device allocator, which calls the same
// detail::shmem_padding function):
//   * The allocator aligns the *real shared-memory address* of each block, not
//     its offset from the dynamic base, so a pointer returned for alignment A
//     really is A-aligned.
//   * The dynamic shared-memory base is declared 16-byte aligned
//     (kShmemBaseAlignment). Nothing stronger is assumed.
//   * Consequently, for alignments <= 16 the padding is the same for every
//     base and a default-constructed plan reproduces the device offsets
//     exactly. For an alignment > 16 the padding depends on where the base
//     happens to sit; the plan then charges the worst case over all bases
//     that satisfy the 16-byte guarantee, so bytes() is always enough, and is
//     the smallest number that is enough for every such base.
//   * After such an alignment the plan knows the device address modulo that
//     alignment (the block start is aligned), so a LIFO release followed by the
//     same allocation again costs no new padding, exactly as on the device.
//   * When the base address is known (the device can report it through
//     ShmemAllocator::base_shared_address()), ShmemPlan::for_base_address()
//     replays that launch exactly, including alignments > 16.
//
// Errors are sticky: an alignment that is not a power of two, a size that
// overflows 64 bits, or a release larger than what is allocated makes ok()
// false; from then on the plan ignores further requests.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define XLOG_SHMEM_PLAN_HD __host__ __device__
#else
#define XLOG_SHMEM_PLAN_HD
#endif

namespace xlog {

/// Alignment used by ShmemAllocator::alloc when none is given, and by the
/// typed alloc<T>/add<T> (which therefore require sizeof(T) <= 8).
inline constexpr std::uint32_t kShmemDefaultAlignment = 8;

/// Alignment the dynamic shared-memory base is declared with (and so is
/// guaranteed to have). Alignments up to this value are planned exactly.
inline constexpr std::uint32_t kShmemBaseAlignment = 16;

/// Returned by ShmemPlan::add/add_bytes when the request was rejected.
inline constexpr std::uint64_t kShmemPlanInvalidOffset = ~std::uint64_t{0};

namespace detail {

XLOG_SHMEM_PLAN_HD constexpr bool shmem_is_power_of_two(std::uint64_t value) noexcept {
  return value != 0 && (value & (value - 1)) == 0;
}

/// Bytes that must be skipped from shared address `address` to reach the next
/// multiple of `alignment` (a power of two). Only the low bits of the address
/// matter, so callers may pass the address modulo any multiple of alignment,
/// and unsigned wrap-around of `address` is harmless.
XLOG_SHMEM_PLAN_HD constexpr std::uint32_t shmem_padding(std::uint32_t address,
                                                         std::uint32_t alignment) noexcept {
  return (0u - address) & (alignment - 1u);
}

}  // namespace detail

/// Computes the dynamic shared-memory bytes that a sequence of
/// ShmemAllocator::alloc / dealloc calls needs, by replaying the allocator's
/// carving rule. Mirror each device call with the matching plan call:
///
///   device                                  plan
///   alloc(num_bytes, alignment)             add_bytes(num_bytes, alignment)
///   alloc<T>(count)                         add<T>(count)
///   dealloc(num_bytes)                      release_bytes(num_bytes)
///   dealloc<T>(count)                       release<T>(count)
///
/// then launch with bytes() as the dynamic shared-memory size (after checking
/// fits(), since the device works in 32-bit sizes).
///
/// Sizes and offsets are 64-bit so large element counts cannot wrap; a result
/// that does not fit in 64 bits makes the plan not ok().
class ShmemPlan {
 public:
  /// A plan for an unknown base that is only known to be 16-byte aligned.
  constexpr ShmemPlan() noexcept = default;

  /// A plan that replays one launch whose dynamic shared-memory base has the
  /// given shared-window address (ShmemAllocator::base_shared_address()).
  /// Every padding is then known, so offsets match the device exactly for any
  /// alignment.
  XLOG_SHMEM_PLAN_HD static constexpr ShmemPlan for_base_address(
      std::uint32_t base_shared_address) noexcept {
    ShmemPlan plan;
    plan.m_known_modulus = std::uint64_t{1} << 32;
    plan.m_address_residue = base_shared_address;
    return plan;
  }

  /// Mirrors ShmemAllocator::alloc(num_bytes, alignment). Returns the offset of
  /// the block from the dynamic base (exact when is_exact(), otherwise an upper
  /// bound of the device offset), or kShmemPlanInvalidOffset if the alignment
  /// is not a power of two, the size overflows, or the plan is already not ok.
  XLOG_SHMEM_PLAN_HD constexpr std::uint64_t add_bytes(
      std::uint64_t num_bytes, std::uint32_t alignment = kShmemDefaultAlignment) noexcept {
    if (!m_ok) return kShmemPlanInvalidOffset;
    if (!detail::shmem_is_power_of_two(alignment)) return fail();

    std::uint64_t padding = 0;
    std::uint64_t known_modulus = m_known_modulus;
    std::uint32_t start_residue = 0;
    if (alignment <= known_modulus) {
      // The device address is known modulo a multiple of the alignment, so
      // its padding is known exactly.
      padding = detail::shmem_padding(m_address_residue, alignment);
      start_residue = m_address_residue + static_cast<std::uint32_t>(padding);
    } else {
      // The device address is only known modulo known_modulus; its real
      // padding is this residue's padding to known_modulus plus some multiple
      // of known_modulus below the alignment. Charge the largest such value.
      padding = detail::shmem_padding(m_address_residue,
                                      static_cast<std::uint32_t>(known_modulus)) +
                (alignment - known_modulus);
      // Whatever the base, the block start is now aligned to `alignment`.
      known_modulus = alignment;
      start_residue = 0;
    }

    const std::uint64_t start = m_offset + padding;
    const std::uint64_t end = start + num_bytes;
    if (start < m_offset || end < start) return fail();  // 64-bit overflow

    if (known_modulus != m_known_modulus) m_exact = false;
    m_known_modulus = known_modulus;
    m_address_residue = reduce(start_residue + static_cast<std::uint32_t>(num_bytes));
    m_offset = end;
    if (m_offset > m_peak) m_peak = m_offset;
    return start;
  }

  /// Mirrors ShmemAllocator::alloc<T>(count): count * sizeof(T) bytes at the
  /// default alignment (8), hence the same sizeof(T) <= 8 restriction.
  template <class T>
  XLOG_SHMEM_PLAN_HD constexpr std::uint64_t add(std::uint64_t count) noexcept {
    static_assert(sizeof(T) <= kShmemDefaultAlignment,
                  "add<T> mirrors alloc<T>, which only guarantees 8-byte alignment; "
                  "use add_bytes(count * sizeof(T), alignment) for larger types");
    if (!m_ok) return kShmemPlanInvalidOffset;
    if (count > ~std::uint64_t{0} / sizeof(T)) return fail();
    return add_bytes(count * sizeof(T), kShmemDefaultAlignment);
  }

  /// Mirrors ShmemAllocator::dealloc(num_bytes): the bump pointer moves back by
  /// num_bytes (padding before the released block stays consumed, as on the
  /// device). Releasing more than is allocated makes the plan not ok.
  XLOG_SHMEM_PLAN_HD constexpr void release_bytes(std::uint64_t num_bytes) noexcept {
    if (!m_ok) return;
    if (num_bytes > m_offset) {
      fail();
      return;
    }
    m_offset -= num_bytes;
    m_address_residue = reduce(m_address_residue - static_cast<std::uint32_t>(num_bytes));
  }

  /// Mirrors ShmemAllocator::dealloc<T>(count).
  template <class T>
  XLOG_SHMEM_PLAN_HD constexpr void release(std::uint64_t count) noexcept {
    if (!m_ok) return;
    if (count > ~std::uint64_t{0} / sizeof(T)) {
      fail();
      return;
    }
    release_bytes(count * sizeof(T));
  }

  /// Peak bytes in use over the whole sequence: the dynamic shared-memory
  /// size to launch with. Meaningful only while ok().
  XLOG_SHMEM_PLAN_HD constexpr std::uint64_t bytes() const noexcept { return m_peak; }

  /// Bytes in use after the last call (the device's get_allocated_size_bytes()).
  XLOG_SHMEM_PLAN_HD constexpr std::uint64_t current_bytes() const noexcept { return m_offset; }

  /// False once any request was rejected (see the class comment).
  XLOG_SHMEM_PLAN_HD constexpr bool ok() const noexcept { return m_ok; }

  /// True when every padding so far was known exactly, so offsets and bytes()
  /// equal the device's; false when an alignment above what is known about the
  /// base was charged at its worst case.
  XLOG_SHMEM_PLAN_HD constexpr bool is_exact() const noexcept { return m_exact; }

  /// True when the plan is ok and its peak fits in `limit` bytes and in the
  /// device's 32-bit sizes.
  XLOG_SHMEM_PLAN_HD constexpr bool fits(std::uint64_t limit) const noexcept {
    return m_ok && m_peak <= limit && m_peak <= 0xFFFFFFFFull;
  }

 private:
  XLOG_SHMEM_PLAN_HD constexpr std::uint32_t reduce(std::uint32_t residue) const noexcept {
    // m_known_modulus is a power of two <= 2^32, so masking with modulus - 1
    // (computed in 64 bits, then truncated) keeps the residue modulo it, and
    // 32-bit wrap-around above is harmless because the modulus divides 2^32.
    return residue & static_cast<std::uint32_t>(m_known_modulus - 1);
  }

  XLOG_SHMEM_PLAN_HD constexpr std::uint64_t fail() noexcept {
    m_ok = false;
    return kShmemPlanInvalidOffset;
  }

  std::uint64_t m_offset = 0;  // bump offset from the dynamic base
  std::uint64_t m_peak = 0;    // largest m_offset seen
  // What is known about the device's current shared address: it equals
  // m_address_residue modulo m_known_modulus (a power of two, 16 .. 2^32).
  std::uint64_t m_known_modulus = kShmemBaseAlignment;
  std::uint32_t m_address_residue = 0;
  bool m_ok = true;
  bool m_exact = true;
};

}  // namespace xlog

#undef XLOG_SHMEM_PLAN_HD
