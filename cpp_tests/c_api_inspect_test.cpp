// The inspection entry points: xlog_live_blocks, xlog_tag_stats,
// xlog_reset_peak, xlog_memory_summary, xlog_allocate_at,
// xlog_set_call_site, and their C++ wrappers (sim backend).
#include "c_api_test_util.h"

#include <xlog/runtime.hpp>

#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace xlog_test;

xlog_block Alloc(xlog_runtime* rt, std::uint64_t bytes, xlog_stream s, const char* tag) {
  xlog_block b{};
  EXPECT_EQ(xlog_allocate(rt, bytes, s, tag, &b), XLOG_OK) << LastError();
  return b;
}

class InspectTest : public SimRuntimeTest {};

TEST_F(InspectTest, LiveBlocksCountsFillsWhatFitsAndNeverWritesPastCap) {
  xlog_stream second = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &second));
  const xlog_block a = Alloc(rt_, 1000, stream_, "in-a");
  const xlog_block b = Alloc(rt_, 70000, second, "in-b");
  const xlog_block c = Alloc(rt_, 300, stream_, nullptr);

  std::size_t count = 12345;
  XLOG_ASSERT_OK(xlog_live_blocks(rt_, nullptr, 0, &count));
  EXPECT_EQ(count, 3u) << "out NULL and cap 0 only count";

  // Room for two of three, plus a canary element after them.
  xlog_live_block buf[3];
  std::memset(buf, 0xCD, sizeof buf);
  buf[0].struct_size = sizeof(xlog_live_block);
  count = 0;
  XLOG_ASSERT_OK(xlog_live_blocks(rt_, buf, 2, &count));
  EXPECT_EQ(count, 3u) << "count is every live block, not what fitted";
  unsigned char canary[sizeof(xlog_live_block)];
  std::memset(canary, 0xCD, sizeof canary);
  EXPECT_EQ(std::memcmp(&buf[2], canary, sizeof canary), 0) << "wrote past cap";
  // Oldest first, each entry the handle the allocation returned.
  EXPECT_EQ(buf[0].block.ptr, a.ptr);
  EXPECT_EQ(buf[0].block.generation, a.generation);
  EXPECT_EQ(buf[0].block.size, 1000u);
  EXPECT_EQ(buf[0].block.stream, stream_);
  EXPECT_GE(buf[0].device_bytes, 1000u);
  EXPECT_STREQ(buf[0].tag, "in-a");
  EXPECT_EQ(buf[0].call_site, nullptr) << "call sites are off by default";
  EXPECT_EQ(buf[0].age_ns, UINT64_MAX);
  EXPECT_EQ(buf[0].allocations_since, 1u) << "c came after a on the same stream";
  EXPECT_EQ(buf[1].block.generation, b.generation);
  EXPECT_EQ(buf[1].block.stream, second);
  EXPECT_STREQ(buf[1].tag, "in-b");
  EXPECT_EQ(buf[1].struct_size, sizeof(xlog_live_block));
  // The handles in the list work with the block calls.
  XLOG_ASSERT_OK(xlog_block_validate(rt_, buf[1].block));

  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  std::memset(buf, 0, sizeof buf);
  buf[0].struct_size = sizeof(xlog_live_block);
  XLOG_ASSERT_OK(xlog_live_blocks(rt_, buf, 3, &count));
  ASSERT_EQ(count, 2u);
  EXPECT_EQ(buf[0].block.generation, b.generation);
  EXPECT_EQ(buf[1].block.generation, c.generation);
  EXPECT_STREQ(buf[1].tag, "") << "untagged blocks have an empty tag, never NULL";
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, c));
  XLOG_ASSERT_OK(xlog_stream_release(rt_, second));
}

TEST_F(InspectTest, ArrayCallsRejectNullArgumentsAndShortStructSizes) {
  const xlog_block a = Alloc(rt_, 64, stream_, "in-rej");
  xlog_live_block blocks[2];
  xlog_tag_stat tags[2];
  std::size_t count = 77;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_live_blocks(rt_, nullptr, 0, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_live_blocks(rt_, nullptr, 2, &count));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_tag_stats(rt_, nullptr, 0, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_tag_stats(rt_, nullptr, 2, &count));
  EXPECT_EQ(count, 77u) << "a rejected call writes nothing";
  // struct_size 0 (not set) and too short: rejected, buffer untouched.
  for (std::uint32_t size : {0u, 4u, static_cast<std::uint32_t>(sizeof(xlog_live_block) - 8)}) {
    std::memset(blocks, 0xEE, sizeof blocks);
    blocks[0].struct_size = size;
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_live_blocks(rt_, blocks, 2, &count));
    EXPECT_EQ(blocks[0].struct_size, size);
    EXPECT_EQ(count, 77u);
  }
  std::memset(tags, 0, sizeof tags);
  tags[0].struct_size = 8;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_tag_stats(rt_, tags, 2, &count));
  EXPECT_NE(LastError().find("struct_size"), std::string::npos);
  // A NULL or closed runtime.
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_live_blocks(nullptr, nullptr, 0, &count));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_tag_stats(nullptr, nullptr, 0, &count));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_reset_peak(nullptr));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
}

// A caller built against a newer header passes a longer struct: the library
// writes its own fields at the caller's stride and leaves the rest alone.
TEST_F(InspectTest, ALongerStructSizeIsTheStride) {
  struct Newer {
    xlog_live_block known;
    std::uint64_t added_later;
  };
  const xlog_block a = Alloc(rt_, 64, stream_, "in-s1");
  const xlog_block b = Alloc(rt_, 128, stream_, "in-s2");
  Newer buf[2];
  std::memset(buf, 0, sizeof buf);
  buf[0].added_later = buf[1].added_later = 0x1234;
  buf[0].known.struct_size = sizeof(Newer);
  std::size_t count = 0;
  // The library sees an xlog_live_block pointer; the stride comes from
  // struct_size.
  XLOG_ASSERT_OK(xlog_live_blocks(rt_, &buf[0].known, 2, &count));
  ASSERT_EQ(count, 2u);
  EXPECT_EQ(buf[0].known.block.generation, a.generation);
  EXPECT_EQ(buf[1].known.block.generation, b.generation);
  EXPECT_STREQ(buf[1].known.tag, "in-s2");
  EXPECT_EQ(buf[0].known.struct_size, sizeof(xlog_live_block)) << "struct_size tells what was written";
  EXPECT_EQ(buf[0].added_later, 0x1234u);
  EXPECT_EQ(buf[1].added_later, 0x1234u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
}

TEST_F(InspectTest, TagStatsAndResetPeak) {
  std::vector<xlog_block> x;
  for (int i = 0; i < 3; ++i) x.push_back(Alloc(rt_, 4096, stream_, "in-x"));
  const xlog_block y = Alloc(rt_, 100, stream_, "in-y");
  XLOG_ASSERT_OK(xlog_deallocate(rt_, x[0]));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, x[1]));

  std::size_t count = 0;
  XLOG_ASSERT_OK(xlog_tag_stats(rt_, nullptr, 0, &count));
  ASSERT_EQ(count, 2u);
  xlog_tag_stat one[1];
  std::memset(one, 0, sizeof one);
  one[0].struct_size = sizeof(xlog_tag_stat);
  XLOG_ASSERT_OK(xlog_tag_stats(rt_, one, 1, &count));
  EXPECT_EQ(count, 2u);
  EXPECT_STREQ(one[0].tag, "in-x") << "largest live bytes first";
  const std::uint64_t held = one[0].live_bytes;
  EXPECT_GE(held, 4096u);
  EXPECT_EQ(one[0].live_blocks, 1u);
  EXPECT_EQ(one[0].peak_bytes, 3 * held);
  EXPECT_EQ(one[0].allocations, 3u);
  EXPECT_EQ(one[0].frees, 2u);

  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.peak_live_blocks, 4u);
  XLOG_ASSERT_OK(xlog_reset_peak(rt_));
  s = StatsOf(rt_);
  EXPECT_EQ(s.peak_live_blocks, 2u);
  EXPECT_EQ(s.peak_live_bytes, s.live_bytes);
  EXPECT_EQ(s.peak_outstanding_bytes, s.outstanding_bytes);
  XLOG_ASSERT_OK(xlog_tag_stats(rt_, one, 1, &count));
  EXPECT_EQ(one[0].peak_bytes, held);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, x[2]));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, y));
}

TEST_F(InspectTest, MemorySummaryIsSnprintfLike) {
  const xlog_block a = Alloc(rt_, 3 << 20, stream_, "in-summary");
  std::size_t needed = 0;
  XLOG_ASSERT_OK(xlog_memory_summary(rt_, nullptr, 0, &needed));
  ASSERT_GT(needed, 100u);
  std::string full(needed + 8, 'Z');
  std::size_t again = 0;
  XLOG_ASSERT_OK(xlog_memory_summary(rt_, &full[0], full.size(), &again));
  EXPECT_EQ(again, needed);
  EXPECT_EQ(std::strlen(full.c_str()), needed - 1) << "needed counts the NUL";
  const std::string text = full.c_str();
  EXPECT_NE(text.find("in-summary"), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(3 << 20)), std::string::npos) << text;

  // Too small: what fits, NUL-terminated, nothing past cap.
  char small[32];
  std::memset(small, 'Q', sizeof small);
  needed = 0;
  XLOG_ASSERT_OK(xlog_memory_summary(rt_, small, 16, &needed));
  EXPECT_EQ(needed, again);
  EXPECT_EQ(small[15], '\0');
  EXPECT_EQ(std::string(small, 15), text.substr(0, 15));
  for (std::size_t i = 16; i < sizeof small; ++i) EXPECT_EQ(small[i], 'Q') << "byte " << i;
  // cap 1: just the NUL.
  small[0] = 'Q';
  XLOG_ASSERT_OK(xlog_memory_summary(rt_, small, 1, &needed));
  EXPECT_EQ(small[0], '\0');

  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_memory_summary(rt_, small, 16, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_memory_summary(rt_, nullptr, 16, &needed));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_memory_summary(nullptr, nullptr, 0, &needed));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
}

class TrackedInspectTest : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override { cfg.track_call_sites = 1; }
};

TEST_F(TrackedInspectTest, CallSitesFromAllocateAtAndTheThreadLabel) {
  xlog_block a{}, b{}, c{};
  XLOG_ASSERT_OK(xlog_allocate_at(rt_, 64, stream_, "in-cs", "engine.c:42", &a));
  XLOG_ASSERT_OK(xlog_set_call_site("phase-load"));
  XLOG_ASSERT_OK(xlog_allocate(rt_, 64, stream_, "in-cs", &b));
  XLOG_ASSERT_OK(xlog_set_call_site(nullptr));
  XLOG_ASSERT_OK(xlog_allocate(rt_, 64, stream_, "in-cs", &c));
  xlog_live_block buf[3];
  std::memset(buf, 0, sizeof buf);
  buf[0].struct_size = sizeof(xlog_live_block);
  std::size_t count = 0;
  XLOG_ASSERT_OK(xlog_live_blocks(rt_, buf, 3, &count));
  ASSERT_EQ(count, 3u);
  ASSERT_NE(buf[0].call_site, nullptr);
  EXPECT_STREQ(buf[0].call_site, "engine.c:42");
  ASSERT_NE(buf[1].call_site, nullptr);
  EXPECT_STREQ(buf[1].call_site, "phase-load");
  EXPECT_EQ(buf[2].call_site, nullptr) << "the label was cleared";
  EXPECT_NE(buf[0].age_ns, UINT64_MAX) << "tracked runtimes know the age in time";
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_allocate_at(rt_, 64, stream_, "t", "s", nullptr));
  for (const xlog_block& x : {a, b, c}) XLOG_ASSERT_OK(xlog_deallocate(rt_, x));
}

TEST_F(TrackedInspectTest, ConfigRejectsATrackingValueOtherThanZeroOrOne) {
  xlog_config cfg = SimConfig();
  cfg.track_call_sites = 2;
  xlog_runtime* rt = nullptr;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_open(0, &cfg, &rt));
  EXPECT_EQ(rt, nullptr);
}

TEST(InspectCxx, WrapperListsSummarisesAndResets) {
  xlog::Runtime rt(xlog::Config().backend(XLOG_BACKEND_SIM).track_call_sites(true));
  xlog::Stream s = rt.acquire_stream();
  xlog::Block big = rt.allocate_at(1 << 20, s, "cxx-big", XLOG_CALL_SITE);
  std::vector<xlog::Block> small;
  for (int i = 0; i < 40; ++i) small.push_back(rt.allocate(512, s, "cxx-small"));
  const std::vector<xlog::LiveBlock> live = rt.live_blocks();
  ASSERT_EQ(live.size(), 41u);
  EXPECT_EQ(live[0].block.generation, big.handle().generation);
  ASSERT_NE(live[0].call_site, nullptr);
  EXPECT_NE(std::string(live[0].call_site).find("c_api_inspect_test.cpp:"), std::string::npos) << live[0].call_site;

  std::map<std::string, xlog::TagStat> tags;
  for (const xlog::TagStat& t : rt.tag_stats()) tags[t.tag] = t;
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags["cxx-small"].live_blocks, 40u);

  const std::string summary = rt.memory_summary();
  EXPECT_NE(summary.find("cxx-big"), std::string::npos) << summary;
  EXPECT_NE(summary.find("cxx-small"), std::string::npos);
  EXPECT_NE(summary.find("largest live blocks (10 of 41)"), std::string::npos) << summary;
  EXPECT_EQ(summary.back(), '\n');

  small.clear();
  EXPECT_EQ(rt.stats().peak_live_blocks, 41u);
  rt.reset_peak();
  EXPECT_EQ(rt.stats().peak_live_blocks, 1u);
}

}  // namespace
