// Shared helpers for the GoogleTest suites of the C ABI (c_api_*_test.cpp).
// C++ only; the C test programs have their own small CHECK macros.
//
// Every runtime these suites open runs on the sim backend: block memory is
// host memory, so host callbacks (xlog_stream_enqueue_host) and the test
// itself can read and write blocks directly.
#ifndef XLOG_C_API_TEST_UTIL_H
#define XLOG_C_API_TEST_UTIL_H

#include <xlog_cuda.h>
#include <xlog/testing.h>  // fault injection, the panic check

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace xlog_test {

// This thread's last error message, sized first and then copied.
inline std::string LastError() {
  const std::size_t len = xlog_last_error_message(nullptr, 0);
  std::string text(len + 1, '\0');
  const std::size_t again = xlog_last_error_message(&text[0], text.size());
  EXPECT_EQ(again, len) << "message length changed between sizing and copying";
  text.resize(len);
  return text;
}

inline std::string StatusText(xlog_status s) {
  return std::string(xlog_status_name(s)) + " (" + std::to_string(s) + ")";
}

// The status of `call` must be exactly `expected`.
#define XLOG_EXPECT_STATUS(expected, call)                                      \
  do {                                                                          \
    const xlog_status xlog_got_ = (call);                                       \
    EXPECT_EQ(xlog_got_, (expected))                                            \
        << #call << " returned " << ::xlog_test::StatusText(xlog_got_)          \
        << ", expected " << ::xlog_test::StatusText(expected)                   \
        << "; message: " << ::xlog_test::LastError();                           \
  } while (0)

#define XLOG_ASSERT_OK(call)                                                    \
  do {                                                                          \
    const xlog_status xlog_got_ = (call);                                       \
    ASSERT_EQ(xlog_got_, XLOG_OK) << #call << " returned "                      \
                                  << ::xlog_test::StatusText(xlog_got_) << ": " \
                                  << ::xlog_test::LastError();                  \
  } while (0)

// Name of the entry point a call expression starts with ("xlog_allocate").
inline std::string EntryPointOf(const char* call_text) {
  std::string s(call_text);
  const std::size_t open = s.find('(');
  s = s.substr(0, open);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  return s;
}

// A rejected call: the exact error status, and a non-empty message from this
// thread that names the entry point that was called.
#define XLOG_EXPECT_REJECTED(expected, call)                                    \
  do {                                                                          \
    static_assert((expected) != XLOG_OK, "use XLOG_ASSERT_OK for successes");   \
    const xlog_status xlog_got_ = (call);                                       \
    const std::string xlog_msg_ = ::xlog_test::LastError();                     \
    EXPECT_EQ(xlog_got_, (expected))                                            \
        << #call << " returned " << ::xlog_test::StatusText(xlog_got_)          \
        << ", expected " << ::xlog_test::StatusText(expected)                   \
        << "; message: " << xlog_msg_;                                         \
    EXPECT_FALSE(xlog_msg_.empty()) << #call << " left no error message";       \
    const std::string xlog_fn_ = ::xlog_test::EntryPointOf(#call);              \
    EXPECT_EQ(xlog_msg_.rfind(xlog_fn_ + ":", 0), 0u)                           \
        << "message of " << xlog_fn_ << " does not start with its name: "      \
        << xlog_msg_;                                                           \
  } while (0)

// Every field is written by the library: fill with a pattern first.
inline xlog_stats StatsOf(xlog_runtime* rt) {
  xlog_stats s;
  std::memset(&s, 0xAB, sizeof s);
  s.struct_size = sizeof s;
  const xlog_status st = xlog_get_stats(rt, &s);
  EXPECT_EQ(st, XLOG_OK) << LastError();
  EXPECT_EQ(s.struct_size, sizeof s);
  return s;
}

// The fields of xlog_stats in order (padding excluded, so two snapshots
// compare by value).
inline std::array<std::uint64_t, 17> StatsFields(const xlog_stats& s) {
  return {s.struct_size,        s.live_bytes,         s.pending_bytes,  s.outstanding_bytes,
          s.peak_outstanding_bytes, s.budget_limit,   s.budget_remaining, s.live_blocks,
          s.pending_blocks,     s.allocations,        s.deallocations,  s.failed_allocations,
          s.cached_bytes,       s.cached_blocks,      s.cache_hits,     s.cache_misses,
          s.reserved_bytes};
}

inline std::string Describe(const xlog_stats& s) {
  return "live_bytes=" + std::to_string(s.live_bytes) +
         " pending_bytes=" + std::to_string(s.pending_bytes) +
         " outstanding_bytes=" + std::to_string(s.outstanding_bytes) +
         " peak=" + std::to_string(s.peak_outstanding_bytes) +
         " budget_limit=" + std::to_string(s.budget_limit) +
         " budget_remaining=" + std::to_string(s.budget_remaining) +
         " live_blocks=" + std::to_string(s.live_blocks) +
         " pending_blocks=" + std::to_string(s.pending_blocks) +
         " allocations=" + std::to_string(s.allocations) +
         " deallocations=" + std::to_string(s.deallocations) +
         " failed_allocations=" + std::to_string(s.failed_allocations) +
         " cached_bytes=" + std::to_string(s.cached_bytes) +
         " cached_blocks=" + std::to_string(s.cached_blocks) +
         " cache_hits=" + std::to_string(s.cache_hits) +
         " cache_misses=" + std::to_string(s.cache_misses) +
         " reserved_bytes=" + std::to_string(s.reserved_bytes);
}

// Stats byte for byte equal, except that a refused allocation counts itself
// in failed_allocations (that counter exists to count refusals).
inline void ExpectStatsUnchanged(const xlog_stats& before, const xlog_stats& after,
                                 std::uint64_t failed_allocations_added = 0) {
  xlog_stats expected = before;
  expected.failed_allocations += failed_allocations_added;
  EXPECT_TRUE(StatsFields(expected) == StatsFields(after))
      << "stats changed:\n  expected " << Describe(expected) << "\n  got      "
      << Describe(after);
}

// The same for a refused allocation, under either memory: a refusal counts
// as failed and changes nothing else (no cache hit or miss either).
inline void ExpectStatsUnchangedByRefusal(const xlog_stats& before, const xlog_stats& after,
                                          std::uint64_t refusals) {
  ExpectStatsUnchanged(before, after, refusals);
}

// Defaults from xlog_config_init, on the sim backend.
inline xlog_config SimConfig() {
  xlog_config cfg;
  std::memset(&cfg, 0, sizeof cfg);
  xlog_config_init(&cfg);
  EXPECT_EQ(cfg.struct_size, sizeof(xlog_config)) << LastError();
  cfg.backend = XLOG_BACKEND_SIM;
  return cfg;
}

// The memory xlog_config_init picks (XLOG_MEMORY, else the arena): ctest
// runs these suites under both. Tests about one mechanism set cfg.memory
// themselves; the others hold under either.
inline bool DefaultMemoryIsPool() { return SimConfig().memory == XLOG_MEMORY_POOL; }

// The arena maps device memory in pages of this size (one of the sim's
// 2 MiB granules, Hopper's); a budget below one page refuses every arena
// allocation.
constexpr std::uint64_t kPage = std::uint64_t{2} << 20;

// Bytes the runtime holds for `live` live bytes while everything fits in
// `pages` arena pages and the pool keeps no freed block: the pool holds
// exactly the live blocks, the arena the pages they lie in.
inline std::uint64_t HeldFor(std::uint64_t live, std::uint64_t pages = 1) {
  return DefaultMemoryIsPool() ? live : pages * kPage;
}

// What holds under either memory: outstanding is live + cached + pending,
// reserved (on sim) is outstanding, and with a budget the charge is
// outstanding too.
inline void ExpectBooksBalance(const xlog_stats& s) {
  EXPECT_EQ(s.outstanding_bytes, s.live_bytes + s.cached_bytes + s.pending_bytes) << Describe(s);
  EXPECT_EQ(s.reserved_bytes, s.outstanding_bytes) << Describe(s);
  EXPECT_GE(s.peak_outstanding_bytes, s.outstanding_bytes) << Describe(s);
  if (s.budget_limit != 0) {
    EXPECT_EQ(s.budget_limit - s.budget_remaining, s.outstanding_bytes) << Describe(s);
  }
}

inline xlog_runtime* OpenSim(const xlog_config& cfg, std::int32_t device = 0) {
  xlog_runtime* rt = nullptr;
  const xlog_status st = xlog_runtime_open(device, &cfg, &rt);
  EXPECT_EQ(st, XLOG_OK) << LastError();
  return rt;
}

inline void Close(xlog_runtime* rt) {
  if (rt == nullptr) return;
  const xlog_status st = xlog_runtime_close(rt);
  EXPECT_EQ(st, XLOG_OK) << LastError();
}

// The suites expect the library's own defaults: a developer's XLOG_BACKEND,
// XLOG_BUDGET_BYTES, XLOG_LOG_PATH, XLOG_CACHE, XLOG_POOL_RELEASE_THRESHOLD or
// XLOG_SIM_DEVICES must not leak into them. Tests that
// exercise the environment set the variables themselves and unset them after.
class ClearXlogEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    unsetenv("XLOG_BACKEND");
    unsetenv("XLOG_BUDGET_BYTES");
    unsetenv("XLOG_LOG_PATH");
    unsetenv("XLOG_CACHE");
    unsetenv("XLOG_POOL_RELEASE_THRESHOLD");
    unsetenv("XLOG_TRACK_CALLSITES");
    unsetenv("XLOG_SIM_DEVICES");
  }
};
inline ::testing::Environment* const kClearXlogEnvironment =
    ::testing::AddGlobalTestEnvironment(new ClearXlogEnvironment());

inline void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// A runtime (sim, defaults unless the test changes Configure) with one
// acquired stream; closed after each test, which must leave no live blocks.
class SimRuntimeTest : public ::testing::Test {
 protected:
  virtual void Configure(xlog_config& /*cfg*/) {}

  void SetUp() override {
    xlog_config cfg = SimConfig();
    Configure(cfg);
    XLOG_ASSERT_OK(xlog_runtime_open(0, &cfg, &rt_));
    XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &stream_));
  }

  void TearDown() override {
    if (rt_ == nullptr) return;
    // The fixture's stream (a test may have released it already: then this
    // is refused and changes nothing).
    (void)xlog_stream_release(rt_, stream_);
    std::uint64_t leaked_blocks = 99, leaked_bytes = 99;
    const xlog_status st = xlog_runtime_close_report(rt_, &leaked_blocks, &leaked_bytes);
    EXPECT_EQ(st, XLOG_OK) << LastError();
    EXPECT_EQ(leaked_blocks, 0u) << "the test left live blocks behind";
    EXPECT_EQ(leaked_bytes, 0u);
    rt_ = nullptr;
  }

  xlog_block Allocate(std::uint64_t bytes, const char* tag = "test") {
    xlog_block b;
    std::memset(&b, 0, sizeof b);
    const xlog_status st = xlog_allocate(rt_, bytes, stream_, tag, &b);
    EXPECT_EQ(st, XLOG_OK) << "allocate " << bytes << ": " << LastError();
    return b;
  }

  xlog_runtime* rt_ = nullptr;
  xlog_stream stream_ = 0;
};

}  // namespace xlog_test

#endif  // XLOG_C_API_TEST_UTIL_H
