// The arena's physics through the C ABI (DESIGN.md "Physical memory";
// src/resources/arena/mod.rs has the contract): device memory is held in
// 2 MiB pages mapped as needed, the budget is charged exactly the pages
// held, freed memory stays mapped (idle) and serves later blocks without a
// driver call, and a refusal comes only once no idle page is left.
//
// Every runtime here sets cfg.memory = XLOG_MEMORY_ARENA, so these hold
// whatever XLOG_MEMORY the suite runs under; the pool's counterparts (its
// per-stream caches of whole blocks) are CApiPoolBlocks, CApiCache* and
// CApiFaults.
#include "c_api_test_util.h"

#include <atomic>
#include <string>
#include <vector>

namespace {

using namespace xlog_test;

bool Contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// What the arena must always report: held bytes in whole pages, charged
// exactly what is held, and the usual identity of the views.
void ExpectPagePhysics(const xlog_stats& s) {
  ExpectBooksBalance(s);
  EXPECT_EQ(s.outstanding_bytes % kPage, 0u) << "held memory is whole pages: " << Describe(s);
  EXPECT_GE(s.outstanding_bytes, s.live_bytes) << Describe(s);
}

class ArenaPages : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override {
    cfg.memory = XLOG_MEMORY_ARENA;
    cfg.budget_bytes = budget_;
    cfg.wait_on_pressure = 0;
  }
  std::uint64_t budget_ = 4 * kPage;
};

// A 512-byte block maps one whole page, and the budget is charged for it.
TEST_F(ArenaPages, ASmallBlockMapsAWholeChargedPage) {
  xlog_block b = Allocate(1);
  const xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 512u) << "blocks are 512-byte multiples";
  EXPECT_EQ(s.outstanding_bytes, kPage) << "one page mapped for it";
  EXPECT_EQ(s.budget_remaining, budget_ - kPage);
  ExpectPagePhysics(s);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
}

// A free keeps its page mapped and charged (idle): reap and drain retire
// pending frees only and leave it; trim unmaps it and gives the budget back.
TEST_F(ArenaPages, FreeKeepsThePageHeldAndChargedUntilTrimmed) {
  xlog_block b = Allocate(4096);
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 4096u);
  EXPECT_EQ(s.outstanding_bytes, kPage);
  EXPECT_EQ(s.cache_misses, 1u) << "the first block maps a page";
  ExpectPagePhysics(s);

  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, kPage) << "the whole page is idle";
  EXPECT_EQ(s.outstanding_bytes, kPage) << "and still held";
  EXPECT_EQ(s.budget_remaining, budget_ - kPage) << "and still charged";
  EXPECT_EQ(s.deallocations, 1u);
  ExpectPagePhysics(s);

  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, stream_));
  std::uint64_t got = 12345;
  XLOG_ASSERT_OK(xlog_reap(rt_, &got));
  EXPECT_EQ(got, 0u);
  got = 12345;
  XLOG_ASSERT_OK(xlog_drain(rt_, &got));
  EXPECT_EQ(got, 0u);
  ExpectStatsUnchanged(s, StatsOf(rt_));

  std::uint64_t released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, kPage) << "trim unmaps the idle page";
  s = StatsOf(rt_);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.budget_remaining, budget_);
  EXPECT_EQ(s.peak_outstanding_bytes, kPage);
  ExpectPagePhysics(s);
  released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, 0u) << "nothing left to release";
}

// Blocks of changing sizes share the pages already mapped: a hit makes no
// driver call and maps nothing, and a freed block's old handle stays dead
// after its memory serves another block.
TEST_F(ArenaPages, IdleMemoryServesTheNextBlocksWithoutNewPages) {
  std::vector<xlog_block> blocks;
  for (std::uint64_t size : {1000u, 3000u, 64u << 10, 200u << 10}) blocks.push_back(Allocate(size));
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.outstanding_bytes, kPage) << "all four lie in one page";
  EXPECT_EQ(s.cache_misses, 1u);
  EXPECT_EQ(s.cache_hits, 3u);
  ExpectPagePhysics(s);
  for (const xlog_block& b : blocks) XLOG_ASSERT_OK(xlog_deallocate(rt_, b));

  // Other sizes, many rounds: the page mapped first serves them all.
  for (int round = 0; round < 20; ++round) {
    xlog_block x = Allocate(512u * (1 + round * 37));
    xlog_block y = Allocate(100u << 10);
    XLOG_ASSERT_OK(xlog_deallocate(rt_, x));
    XLOG_ASSERT_OK(xlog_deallocate(rt_, y));
  }
  s = StatsOf(rt_);
  EXPECT_EQ(s.outstanding_bytes, kPage) << "changing sizes mapped no new page";
  EXPECT_EQ(s.cache_misses, 1u);
  EXPECT_EQ(s.cache_hits, 3u + 40u);
  EXPECT_EQ(s.cached_bytes, kPage);
  ExpectPagePhysics(s);
  for (const xlog_block& b : blocks) {
    XLOG_EXPECT_STATUS(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(rt_, b));
  }
}

// Under a budget, idle pages are recycled before a refusal: with the whole
// budget idle on one stream, another stream still gets all of it, and the
// device never holds more than the budget. Only when live blocks fill every
// page is the next allocation refused, naming the numbers.
TEST_F(ArenaPages, RefusalComesOnlyAfterIdlePagesAreReleased) {
  xlog_stream other = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &other));
  xlog_block first = Allocate(budget_);
  EXPECT_EQ(StatsOf(rt_).budget_remaining, 0u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, first));
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes, budget_) << "every page idle, still charged";
  EXPECT_EQ(s.budget_remaining, 0u);
  ExpectPagePhysics(s);

  // Page-sized blocks on the other stream: the idle pages serve them.
  std::vector<xlog_block> taken;
  for (int i = 0; i < 4; ++i) {
    xlog_block b;
    XLOG_ASSERT_OK(xlog_allocate(rt_, kPage, other, "other", &b));
    taken.push_back(b);
    s = StatsOf(rt_);
    EXPECT_LE(s.outstanding_bytes, budget_) << "held more than the budget";
    ExpectPagePhysics(s);
  }
  s = StatsOf(rt_);
  EXPECT_EQ(s.failed_allocations, 0u) << "refused while idle pages were held";
  EXPECT_EQ(s.live_bytes, budget_);
  EXPECT_EQ(s.cached_bytes, 0u);

  // Now nothing is idle: one more byte is refused, the message names it.
  xlog_block out;
  const xlog_stats before = StatsOf(rt_);
  XLOG_EXPECT_REJECTED(XLOG_ERR_OUT_OF_BUDGET, xlog_allocate(rt_, 1, stream_, "one_more", &out));
  const std::string msg = LastError();
  EXPECT_TRUE(Contains(msg, "live " + std::to_string(budget_))) << msg;
  EXPECT_TRUE(Contains(msg, "limit " + std::to_string(budget_))) << msg;
  EXPECT_TRUE(Contains(msg, "remaining 0")) << msg;
  ExpectStatsUnchangedByRefusal(before, StatsOf(rt_), 1);
  for (const xlog_block& b : taken) XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_stream_release(rt_, other));
}

// The second pressure case of issue 24: budget 8 MiB, 24 blocks of 256 KiB
// allocated and freed, then 6 MiB: never refused (the pool refused it in
// most tries, its cache emptied into pending frees).
TEST_F(ArenaPages, SmallFreedBlocksThenALargeOneIsNeverRefused) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    SCOPED_TRACE(attempt);
    std::vector<xlog_block> small;
    for (int i = 0; i < 24; ++i) small.push_back(Allocate(256u << 10));
    for (const xlog_block& b : small) XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
    xlog_block large;
    XLOG_ASSERT_OK(xlog_allocate(rt_, 6u << 20, stream_, "large", &large));
    const xlog_stats s = StatsOf(rt_);
    EXPECT_LE(s.outstanding_bytes, budget_);
    ExpectPagePhysics(s);
    XLOG_ASSERT_OK(xlog_deallocate(rt_, large));
  }
  EXPECT_EQ(StatsOf(rt_).failed_allocations, 0u);
}

struct Gate {
  std::atomic<int> opened{0};
};
void SleepThenOpen(void* user) {
  SleepMs(150);
  static_cast<Gate*>(user)->opened.store(1);
}
struct Observation {
  Gate* gate;
  std::atomic<int> seen{-1};
};
void Observe(void* user) {
  auto* o = static_cast<Observation*>(user);
  o->seen.store(o->gate->opened.load());
}

// Memory freed on a busy stream serves another stream without a host wait
// and without a new page, and the other stream's work is ordered after the
// busy stream's (a GPU-side wait).
TEST_F(ArenaPages, AnotherStreamTakesIdleMemoryOrderedAfterTheFree) {
  xlog_stream a = 0, b = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &a));
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &b));
  // The whole budget on A, so that B cannot map a page of its own.
  xlog_block x;
  XLOG_ASSERT_OK(xlog_allocate(rt_, budget_, a, "x", &x));
  Gate gate;  // A's last use of x ends 150 ms from now
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, a, SleepThenOpen, &gate));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, x));

  xlog_block y;
  XLOG_ASSERT_OK(xlog_allocate(rt_, kPage, b, "y", &y));
  EXPECT_EQ(y.stream, b);
  EXPECT_EQ(gate.opened.load(), 0) << "taking A's idle memory must not wait on the host";
  const xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.outstanding_bytes, budget_) << "no page was added";
  EXPECT_EQ(s.failed_allocations, 0u);
  ExpectPagePhysics(s);

  Observation seen{&gate};
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, b, Observe, &seen));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, b));
  EXPECT_EQ(seen.seen.load(), 1) << "B used the memory before A's work on it was done";
  XLOG_ASSERT_OK(xlog_deallocate(rt_, y));
  XLOG_ASSERT_OK(xlog_stream_release(rt_, a));
  XLOG_ASSERT_OK(xlog_stream_release(rt_, b));
}

void SleepThenOpenLater(void* user) {
  SleepMs(250);
  static_cast<Gate*>(user)->opened.store(1);
}

// Trim unmaps a page only once the frees in it are complete on the GPU:
// behind a sleeping stream it returns only once the stream got there
// (drain, with nothing pending, does not wait).
TEST_F(ArenaPages, TrimWaitsForTheStreamBeforeUnmapping) {
  Gate slept;
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, SleepThenOpenLater, &slept));
  xlog_block a = Allocate(1000);
  xlog_block b = Allocate(3000);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  EXPECT_EQ(StatsOf(rt_).cached_bytes, kPage);
  std::uint64_t drained = 12345;
  XLOG_ASSERT_OK(xlog_drain(rt_, &drained));
  EXPECT_EQ(drained, 0u);
  EXPECT_EQ(slept.opened.load(), 0) << "nothing was pending, so drain must not have waited";
  std::uint64_t released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(slept.opened.load(), 1) << "trim unmapped a page before the stream was done with it";
  EXPECT_EQ(released, kPage);
  const xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.budget_remaining, budget_);
  ExpectPagePhysics(s);
}

// Fault injection: XLOG_FAULT_ALLOC fires on the arena's page creation. A
// failed page creation is a driver error that charges and holds nothing; a
// block that fits in pages already mapped makes no driver call, so an armed
// fault waits for the next page.
TEST_F(ArenaPages, PageCreationFaultIsADriverErrorAndChargesNothing) {
  xlog_block small = Allocate(4096);
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_ALLOC, 1));
  xlog_block hit = Allocate(8192);  // in the page already mapped
  xlog_stats before = StatsOf(rt_);
  EXPECT_EQ(before.cache_hits, 1u);
  EXPECT_EQ(before.failed_allocations, 0u);
  EXPECT_EQ(before.outstanding_bytes, kPage);

  xlog_block out;
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_allocate(rt_, 2 * kPage, stream_, "faulted", &out));
  EXPECT_TRUE(Contains(LastError(), "injected")) << LastError();
  const xlog_stats after = StatsOf(rt_);
  ExpectStatsUnchangedByRefusal(before, after, 1);
  EXPECT_EQ(after.budget_remaining, budget_ - kPage) << "a failed page creation left a charge";
  ExpectPagePhysics(after);

  // The fault fired once: the same request now maps its pages.
  xlog_block big = Allocate(2 * kPage);
  EXPECT_NE(big.ptr, nullptr);
  ExpectPagePhysics(StatsOf(rt_));
  for (const xlog_block& b : {small, hit, big}) XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
}

}  // namespace
