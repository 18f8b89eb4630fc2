// Host-only tests of xlog::ShmemPlan (include/xlog/shmem_plan.hpp). No CUDA:
// this file is compiled by the host C++ compiler alone.
//
// The planner claims to replay the device allocator's carving rule. The device
// rule is restated here independently (ReferenceDevice: pad the absolute shared
// address up to the alignment, bump, rewind on release) so the tests compare
// the planner against the rule, not against itself.
#include <xlog/shmem_plan.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using xlog::ShmemPlan;

// What the device allocator does for a given base address, written out
// longhand with 64-bit addresses.
struct ReferenceDevice {
  std::uint64_t base = 0;
  std::uint64_t offset = 0;
  std::uint64_t peak = 0;

  std::uint64_t alloc(std::uint64_t num_bytes, std::uint64_t alignment) {
    const std::uint64_t address = base + offset;
    const std::uint64_t aligned = (address + alignment - 1) / alignment * alignment;
    const std::uint64_t start = aligned - base;
    offset = start + num_bytes;
    peak = std::max(peak, offset);
    return start;
  }
  void release(std::uint64_t num_bytes) { offset -= num_bytes; }
};

struct Op {
  bool is_alloc;
  std::uint64_t num_bytes;
  std::uint32_t alignment;
};

// A random LIFO-correct sequence of allocations and releases.
std::vector<Op> random_sequence(std::mt19937& rng, std::uint32_t max_alignment_log2,
                                int length) {
  std::vector<Op> ops;
  std::vector<std::uint64_t> live;
  std::uniform_int_distribution<int> coin(0, 2);
  std::uniform_int_distribution<std::uint64_t> size(0, 300);
  std::uniform_int_distribution<std::uint32_t> align_log2(0, max_alignment_log2);
  for (int i = 0; i < length; ++i) {
    if (!live.empty() && coin(rng) == 0) {
      ops.push_back({false, live.back(), 0});
      live.pop_back();
    } else {
      const std::uint64_t bytes = size(rng);
      ops.push_back({true, bytes, 1u << align_log2(rng)});
      live.push_back(bytes);
    }
  }
  return ops;
}

TEST(ShmemPlan, EmptyPlanNeedsNothing) {
  constexpr ShmemPlan plan;
  static_assert(plan.bytes() == 0 && plan.current_bytes() == 0);
  EXPECT_TRUE(plan.ok());
  EXPECT_TRUE(plan.is_exact());
  EXPECT_TRUE(plan.fits(0));
}

TEST(ShmemPlan, DefaultAlignmentIsEight) {
  ShmemPlan plan;
  EXPECT_EQ(plan.add_bytes(1), 0u);
  EXPECT_EQ(plan.add_bytes(1), 8u);
  EXPECT_EQ(plan.add_bytes(3, 4), 12u);
  EXPECT_EQ(plan.add_bytes(5, 1), 15u);
  EXPECT_EQ(plan.add_bytes(2, 2), 20u);
  EXPECT_EQ(plan.add_bytes(1, 16), 32u);
  EXPECT_EQ(plan.bytes(), 33u);
  EXPECT_TRUE(plan.is_exact());
}

TEST(ShmemPlan, TypedSizesUseSizeofAndEightByteAlignment) {
  ShmemPlan plan;
  EXPECT_EQ(plan.add<float>(3), 0u);          // 12 bytes
  EXPECT_EQ(plan.add<double>(2), 16u);        // 16 bytes
  EXPECT_EQ(plan.add<std::uint8_t>(5), 32u);  // 5 bytes
  EXPECT_EQ(plan.add<std::int16_t>(3), 40u);  // 6 bytes
  EXPECT_EQ(plan.bytes(), 46u);
  plan.release<std::int16_t>(3);
  EXPECT_EQ(plan.current_bytes(), 40u);
  EXPECT_EQ(plan.bytes(), 46u);
}

TEST(ShmemPlan, IsConstexpr) {
  constexpr std::uint64_t needed = [] {
    ShmemPlan plan;
    plan.add<float>(10);       // 0..40
    plan.add_bytes(7, 16);     // 48..55
    plan.release_bytes(7);
    plan.add<std::uint32_t>(2);  // 48..56
    return plan.bytes();
  }();
  static_assert(needed == 56);
  EXPECT_EQ(needed, 56u);
}

TEST(ShmemPlan, ZeroCountEntriesConsumeOnlyPadding) {
  ShmemPlan plan;
  EXPECT_EQ(plan.add<float>(0), 0u);
  EXPECT_EQ(plan.bytes(), 0u);
  plan.add_bytes(1);
  EXPECT_EQ(plan.add<float>(0), 8u);  // aligned position, nothing after it
  EXPECT_EQ(plan.current_bytes(), 8u);
  EXPECT_EQ(plan.add<float>(2), 8u);  // the zero-byte block does not displace it
  EXPECT_EQ(plan.bytes(), 16u);
  plan.release_bytes(0);
  EXPECT_EQ(plan.current_bytes(), 16u);
  EXPECT_TRUE(plan.ok());
}

TEST(ShmemPlan, LargeCountsUseSixtyFourBitMath) {
  ShmemPlan plan;
  const std::uint64_t count = std::uint64_t{1} << 33;  // 2^33 doubles = 64 GiB
  EXPECT_EQ(plan.add<double>(count), 0u);
  EXPECT_EQ(plan.bytes(), std::uint64_t{1} << 36);
  EXPECT_TRUE(plan.ok());
  EXPECT_FALSE(plan.fits(~std::uint64_t{0}));  // beyond the device's 32-bit sizes
  EXPECT_EQ(plan.add<std::uint32_t>(0x40000000u), std::uint64_t{1} << 36);
  EXPECT_EQ(plan.bytes(), (std::uint64_t{1} << 36) + (std::uint64_t{1} << 32));

  ShmemPlan just_fits;
  just_fits.add<std::uint8_t>(0xFFFFFFFFull);
  EXPECT_TRUE(just_fits.fits(0xFFFFFFFFull));
  EXPECT_FALSE(just_fits.fits(0xFFFFFFFEull));
}

TEST(ShmemPlan, SixtyFourBitOverflowIsAnError) {
  ShmemPlan plan;
  EXPECT_EQ(plan.add<std::uint32_t>(~std::uint64_t{0}), xlog::kShmemPlanInvalidOffset);
  EXPECT_FALSE(plan.ok());
  EXPECT_FALSE(plan.fits(~std::uint64_t{0}));

  ShmemPlan padded;
  padded.add_bytes(~std::uint64_t{0} - 3, 1);
  EXPECT_TRUE(padded.ok());
  EXPECT_EQ(padded.add_bytes(1, 16), xlog::kShmemPlanInvalidOffset);  // padding wraps
  EXPECT_FALSE(padded.ok());

  ShmemPlan sized;
  sized.add_bytes(16);
  EXPECT_EQ(sized.add_bytes(~std::uint64_t{0} - 8), xlog::kShmemPlanInvalidOffset);
  EXPECT_FALSE(sized.ok());
}

TEST(ShmemPlan, AlignmentMustBeAPowerOfTwo) {
  for (std::uint32_t bad : {0u, 3u, 6u, 24u, 100u, 0xFFFFFFFFu}) {
    ShmemPlan plan;
    EXPECT_EQ(plan.add_bytes(4, bad), xlog::kShmemPlanInvalidOffset) << bad;
    EXPECT_FALSE(plan.ok()) << bad;
  }
  ShmemPlan plan;
  EXPECT_EQ(plan.add_bytes(4, 0x80000000u), 0x80000000u - 16);
  EXPECT_TRUE(plan.ok());
}

TEST(ShmemPlan, ErrorsAreSticky) {
  ShmemPlan plan;
  plan.add_bytes(8);
  plan.add_bytes(8, 3);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.add_bytes(8), xlog::kShmemPlanInvalidOffset);
  EXPECT_EQ(plan.add<float>(1), xlog::kShmemPlanInvalidOffset);
  EXPECT_EQ(plan.current_bytes(), 8u);
}

TEST(ShmemPlan, ReleasingMoreThanAllocatedIsAnError) {
  ShmemPlan plan;
  plan.add_bytes(12);
  plan.release_bytes(13);
  EXPECT_FALSE(plan.ok());
  EXPECT_EQ(plan.current_bytes(), 12u);  // ignored, as the device ignores it

  ShmemPlan typed;
  typed.add<std::uint64_t>(1);
  typed.release<std::uint64_t>(~std::uint64_t{0});
  EXPECT_FALSE(typed.ok());
}

TEST(ShmemPlan, PeakNotSumForSerialReuse) {
  // The seed's Query pattern: allocate, release, allocate again.
  ShmemPlan plan;
  plan.add<std::int32_t>(100);
  for (int i = 0; i < 5; ++i) {
    plan.add_bytes(1000, 16);
    plan.release_bytes(1000);
  }
  EXPECT_EQ(plan.bytes(), 400u + 1000u);
}

TEST(ShmemPlan, LargeAlignmentChargesWorstCase) {
  ShmemPlan plan;
  plan.add_bytes(1, 1);  // device address is base + 1, base only known 16-aligned
  // The device pads by 15 + 16 * j for some j in [0, 8): charge 15 + 112.
  EXPECT_EQ(plan.add_bytes(4, 128), 128u);
  EXPECT_FALSE(plan.is_exact());
  EXPECT_EQ(plan.bytes(), 132u);
  // Now the address is known modulo 128: small alignments are exact again.
  EXPECT_EQ(plan.add_bytes(1, 64), 192u);
}

TEST(ShmemPlan, LargeAlignmentReleaseAndReallocCostsNoNewPadding) {
  ShmemPlan plan;
  const std::uint64_t first = plan.add_bytes(100, 256);
  plan.release_bytes(100);
  const std::uint64_t again = plan.add_bytes(100, 256);
  EXPECT_EQ(first, again);
  EXPECT_EQ(plan.bytes(), first + 100);
}

TEST(ShmemPlan, KnownBaseIsExactForAnyAlignment) {
  // Base at shared address 1072: 1072 % 128 == 48.
  ShmemPlan plan = ShmemPlan::for_base_address(1072);
  EXPECT_EQ(plan.add_bytes(1, 1), 0u);     // address 1072
  EXPECT_EQ(plan.add_bytes(4, 128), 80u);  // 1073 -> 1152
  EXPECT_EQ(plan.add_bytes(8, 1024), 1024u - 48u);
  EXPECT_TRUE(plan.is_exact());

  ShmemPlan aligned = ShmemPlan::for_base_address(0x1000);
  aligned.add_bytes(1, 1);
  EXPECT_EQ(aligned.add_bytes(4, 128), 128u);
}

TEST(ShmemPlan, KnownBaseAgreesWithDefaultForSmallAlignments) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const std::vector<Op> ops = random_sequence(rng, 4, 40);  // alignments 1..16
    ShmemPlan unknown_base;
    ShmemPlan known_base = ShmemPlan::for_base_address(16 * (round + 3));
    for (const Op& op : ops) {
      if (op.is_alloc) {
        ASSERT_EQ(unknown_base.add_bytes(op.num_bytes, op.alignment),
                  known_base.add_bytes(op.num_bytes, op.alignment));
      } else {
        unknown_base.release_bytes(op.num_bytes);
        known_base.release_bytes(op.num_bytes);
      }
    }
    EXPECT_EQ(unknown_base.bytes(), known_base.bytes());
    EXPECT_TRUE(unknown_base.is_exact());
  }
}

// For every 16-aligned base the exact replay equals the reference device, the
// default plan bounds it at every step, and the default plan's peak is the
// maximum over bases (the bound is tight), with equality everywhere when the
// sequence only uses alignments <= 16.
TEST(ShmemPlan, MatchesReferenceDeviceForEveryBase) {
  std::mt19937 rng(2024);
  constexpr std::uint32_t kMaxAlignmentLog2 = 9;  // up to 512
  for (int round = 0; round < 300; ++round) {
    const std::vector<Op> ops = random_sequence(rng, kMaxAlignmentLog2, 30);
    // Default plan and its per-step offsets.
    ShmemPlan bound;
    std::vector<std::uint64_t> bound_offsets;
    for (const Op& op : ops) {
      if (op.is_alloc) {
        bound_offsets.push_back(bound.add_bytes(op.num_bytes, op.alignment));
      } else {
        bound.release_bytes(op.num_bytes);
      }
    }
    ASSERT_TRUE(bound.ok());

    std::uint64_t worst_peak = 0;
    // Bases covering every residue modulo 512 that the 16-byte guarantee
    // allows, placed above a nonzero window offset like a real launch.
    for (std::uint64_t base = 0x400; base < 0x400 + 512; base += 16) {
      ReferenceDevice device{base};
      ShmemPlan exact = ShmemPlan::for_base_address(static_cast<std::uint32_t>(base));
      std::size_t alloc_index = 0;
      for (const Op& op : ops) {
        if (op.is_alloc) {
          const std::uint64_t expected = device.alloc(op.num_bytes, op.alignment);
          ASSERT_EQ(exact.add_bytes(op.num_bytes, op.alignment), expected)
              << "round " << round << " base " << base;
          ASSERT_LE(expected, bound_offsets[alloc_index]);
          if (bound.is_exact()) {
            ASSERT_EQ(expected, bound_offsets[alloc_index]);
          }
          ++alloc_index;
        } else {
          device.release(op.num_bytes);
          exact.release_bytes(op.num_bytes);
        }
        ASSERT_EQ(exact.current_bytes(), device.offset);
      }
      EXPECT_EQ(exact.bytes(), device.peak);
      EXPECT_TRUE(exact.is_exact());
      worst_peak = std::max(worst_peak, device.peak);
    }
    EXPECT_EQ(bound.bytes(), worst_peak) << "round " << round;
  }
}

}  // namespace
