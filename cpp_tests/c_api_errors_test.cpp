// Bad input to the C ABI. Every case asserts the exact status, a non-empty
// message on this thread that names the entry point, and that the runtime's
// statistics did not move (a refused allocation only adds itself to
// failed_allocations, the counter of refusals).
#include "c_api_test_util.h"

#include <atomic>
#include <string>
#include <vector>

namespace {

using namespace xlog_test;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

void Noop(void*) {}

class CApiErrors : public SimRuntimeTest {};

// ----- NULL and forged runtime handles -----

TEST_F(CApiErrors, NullRuntimeLifecycleCalls) {
  const xlog_stats before = StatsOf(rt_);
  xlog_backend backend = 77;
  xlog_stats stats{};
  stats.struct_size = sizeof stats;
  std::uint64_t blocks = 7, bytes = 7;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_close(nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_close_report(nullptr, &blocks, &bytes));
  EXPECT_EQ(blocks, 7u);
  EXPECT_EQ(bytes, 7u);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_backend(nullptr, &backend));
  EXPECT_EQ(backend, 77u);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_get_stats(nullptr, &stats));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_sim_inject_fault(nullptr, XLOG_FAULT_ALLOC, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_reap(nullptr, &bytes));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_drain(nullptr, &bytes));
  EXPECT_EQ(bytes, 7u);
  EXPECT_TRUE(Contains(LastError(), "NULL")) << LastError();
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

TEST_F(CApiErrors, NullRuntimeStreamCalls) {
  const xlog_stats before = StatsOf(rt_);
  xlog_stream s = 55;
  void* native = &s;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_acquire(nullptr, &s));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_release(nullptr, stream_));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_import(nullptr, nullptr, &s));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_native(nullptr, stream_, &native));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_synchronize(nullptr, stream_));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_enqueue_host(nullptr, stream_, Noop, nullptr));
  EXPECT_EQ(s, 55u);
  EXPECT_EQ(native, static_cast<void*>(&s));
  // The real stream is untouched by the NULL-runtime release.
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, stream_));
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

TEST_F(CApiErrors, NullRuntimeBlockCalls) {
  xlog_block live = Allocate(512);
  const xlog_stats before = StatsOf(rt_);
  xlog_block out;
  std::memset(&out, 0x77, sizeof out);
  const xlog_use uses[1] = {{live, XLOG_ACCESS_READ}};
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_allocate(nullptr, 64, stream_, "t", &out));
  EXPECT_EQ(out.size, 0x7777777777777777ull) << "out written on failure";
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_deallocate(nullptr, live));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_block_validate(nullptr, live));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare(nullptr, live, stream_, XLOG_ACCESS_READ));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish(nullptr, live, stream_, XLOG_ACCESS_READ));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare_all(nullptr, stream_, uses, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish_all(nullptr, stream_, uses, 1));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_block_validate(rt_, live));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, live));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, NeverOpenedForgedRuntimeHandles) {
  const xlog_stats before = StatsOf(rt_);
  int not_a_runtime = 0;
  xlog_runtime* forged[] = {
      reinterpret_cast<xlog_runtime*>(std::uintptr_t{0x1234}),
      reinterpret_cast<xlog_runtime*>(&not_a_runtime),
      reinterpret_cast<xlog_runtime*>(reinterpret_cast<std::uintptr_t>(rt_) + 1),
      reinterpret_cast<xlog_runtime*>(~std::uintptr_t{0}),
  };
  for (xlog_runtime* f : forged) {
    SCOPED_TRACE(reinterpret_cast<std::uintptr_t>(f));
    xlog_stats s{};
    s.struct_size = sizeof s;
    xlog_stream id = 0;
    xlog_block b;
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_get_stats(f, &s));
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_acquire(f, &id));
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_allocate(f, 64, stream_, "t", &b));
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_close(f));
    EXPECT_TRUE(Contains(LastError(), "not open")) << LastError();
  }
  EXPECT_EQ(not_a_runtime, 0) << "a forged handle was written through";
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

TEST(CApiClosedRuntime, EveryCallOnAClosedHandleIsRejected) {
  xlog_runtime* rt = OpenSim(SimConfig());
  ASSERT_NE(rt, nullptr);
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &s));
  xlog_block b;
  XLOG_ASSERT_OK(xlog_allocate(rt, 256, s, "closed", &b));
  XLOG_ASSERT_OK(xlog_deallocate(rt, b));
  XLOG_ASSERT_OK(xlog_runtime_close(rt));

  xlog_stats stats{};
  stats.struct_size = sizeof stats;
  xlog_backend backend;
  xlog_stream out_stream;
  void* native;
  xlog_block out;
  std::uint64_t n;
  const xlog_use uses[1] = {{b, XLOG_ACCESS_READ}};
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_close(rt));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_close_report(rt, &n, &n));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_backend(rt, &backend));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_get_stats(rt, &stats));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_acquire(rt, &out_stream));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_release(rt, s));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_import(rt, nullptr, &out_stream));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_native(rt, s, &native));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_synchronize(rt, s));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_enqueue_host(rt, s, Noop, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_allocate(rt, 64, s, "t", &out));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_deallocate(rt, b));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_block_validate(rt, b));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare(rt, b, s, XLOG_ACCESS_READ));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish(rt, b, s, XLOG_ACCESS_READ));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare_all(rt, s, uses, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish_all(rt, s, uses, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_reap(rt, &n));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_drain(rt, &n));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_sim_inject_fault(rt, XLOG_FAULT_ALLOC, 1));
  EXPECT_TRUE(Contains(LastError(), "not open")) << LastError();
}

// ----- NULL out-pointers -----

TEST(CApiNullOutNoRuntime, OpenAndConfigWithNullOut) {
  xlog_config cfg = SimConfig();
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_open(0, &cfg, nullptr));
  EXPECT_TRUE(Contains(LastError(), "out is NULL")) << LastError();
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_config_from_env(nullptr));
  EXPECT_TRUE(Contains(LastError(), "cfg is NULL")) << LastError();
  xlog_config_init(nullptr);  // must not crash
}

class CApiNullOut : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override { cfg.stream_pool_size = 2; }
};

TEST_F(CApiNullOut, QueriesWithNullOut) {
  const xlog_stats before = StatsOf(rt_);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_backend(rt_, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_get_stats(rt_, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_native(rt_, stream_, nullptr));
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

// xlog_stats is versioned by the caller's struct_size: too small (or left
// 0) is refused before anything is written; an older caller's shorter struct
// gets exactly its own fields.
TEST_F(CApiNullOut, StatsStructSizeIsTheCallers) {
  const xlog_stats before = StatsOf(rt_);
  xlog_stats s;
  for (std::uint32_t bad : {0u, 4u, 95u}) {
    SCOPED_TRACE(bad);
    std::memset(&s, 0xAB, sizeof s);
    s.struct_size = bad;
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_get_stats(rt_, &s));
    EXPECT_TRUE(Contains(LastError(), "struct_size")) << LastError();
    EXPECT_EQ(s.struct_size, bad);
    EXPECT_EQ(s.live_bytes, 0xABABABABABABABABull) << "a refused call wrote the struct";
  }
  // The smallest layout the library accepts ends with failed_allocations
  // (the fields before the cache counters): 96 bytes.
  const std::size_t v1 = offsetof(xlog_stats, failed_allocations) + sizeof(std::uint64_t);
  ASSERT_EQ(v1, 96u);
  std::memset(&s, 0xAB, sizeof s);
  s.struct_size = static_cast<std::uint32_t>(v1);
  XLOG_ASSERT_OK(xlog_get_stats(rt_, &s));
  EXPECT_EQ(s.struct_size, v1);
  EXPECT_EQ(s.allocations, before.allocations);
  EXPECT_EQ(s.budget_remaining, before.budget_remaining);
  EXPECT_EQ(s.cached_bytes, 0xABABABABABABABABull) << "wrote past the caller's struct_size";
  EXPECT_EQ(s.reserved_bytes, 0xABABABABABABABABull) << "wrote past the caller's struct_size";
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

TEST_F(CApiNullOut, TrimTakesANullOutAndRejectsBadHandles) {
  const xlog_stats before = StatsOf(rt_);
  std::uint64_t released = 7;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_trim(nullptr, 0, &released));
  EXPECT_EQ(released, 7u);
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, nullptr));
  XLOG_ASSERT_OK(xlog_trim(rt_, UINT64_MAX, &released));
  EXPECT_EQ(released, 0u);
  ExpectStatsUnchanged(before, StatsOf(rt_));
  // The hooks of a device never used: nothing to trim, and NULL is fine.
  released = 7;
  XLOG_ASSERT_OK(xlog_interop_trim(7777, 0, &released));
  EXPECT_EQ(released, 0u);
  XLOG_ASSERT_OK(xlog_interop_trim(7777, 0, nullptr));
}

TEST_F(CApiNullOut, AcquireAndImportWithNullOutTakeNoStream) {
  const xlog_stats before = StatsOf(rt_);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_acquire(rt_, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_import(rt_, nullptr, nullptr));
  // Pool of 2 with one held by the fixture: exactly one more is available,
  // so the failed acquire above did not take one.
  xlog_stream second = 0, third = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &second));
  XLOG_EXPECT_REJECTED(XLOG_ERR_POOL_EXHAUSTED, xlog_stream_acquire(rt_, &third));
  XLOG_ASSERT_OK(xlog_stream_release(rt_, second));
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

TEST_F(CApiNullOut, AllocateWithNullOutAllocatesNothing) {
  const xlog_stats before = StatsOf(rt_);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_allocate(rt_, 4096, stream_, "t", nullptr));
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

// ----- enumeration values -----

TEST_F(CApiErrors, UnknownAccessValues) {
  xlog_block b = Allocate(256);
  const xlog_stats before = StatsOf(rt_);
  for (xlog_access bad : {0u, 4u, 99u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(bad);
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare(rt_, b, stream_, bad));
    EXPECT_TRUE(Contains(LastError(), "access value " + std::to_string(bad))) << LastError();
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish(rt_, b, stream_, bad));
    const xlog_use uses[2] = {{b, XLOG_ACCESS_READ}, {b, bad}};
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare_all(rt_, stream_, uses, 2));
    EXPECT_TRUE(Contains(LastError(), "uses[1]")) << LastError();
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish_all(rt_, stream_, uses, 2));
  }
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, UnknownFaultKind) {
  const xlog_stats before = StatsOf(rt_);
  for (xlog_fault bad : {0u, 5u, 99u}) {
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_sim_inject_fault(rt_, bad, 1));
    EXPECT_TRUE(Contains(LastError(), "fault kind " + std::to_string(bad))) << LastError();
  }
  // Nothing got armed: the next allocations succeed.
  xlog_block a = Allocate(64);
  xlog_block b = Allocate(64);
  xlog_stats after = StatsOf(rt_);
  EXPECT_EQ(after.failed_allocations, before.failed_allocations);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, EnqueueHostWithNullFunction) {
  const xlog_stats before = StatsOf(rt_);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_enqueue_host(rt_, stream_, nullptr, nullptr));
  EXPECT_TRUE(Contains(LastError(), "NULL")) << LastError();
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, stream_));
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

// ----- configuration -----

class CApiBadConfig : public ::testing::Test {
 protected:
  // Open must fail with `expected`, leave *out alone, and explain itself.
  void ExpectOpenRefused(const xlog_config& cfg, const std::string& fragment,
                         std::int32_t device = 0) {
    xlog_runtime* sentinel = reinterpret_cast<xlog_runtime*>(std::uintptr_t{0xBAD});
    xlog_runtime* rt = sentinel;
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_open(device, &cfg, &rt));
    EXPECT_EQ(rt, sentinel) << "out was written by a failed open";
    EXPECT_TRUE(Contains(LastError(), fragment)) << "message lacks \"" << fragment << "\": " << LastError();
    if (rt != sentinel && rt != nullptr) xlog_runtime_close(rt);
  }
};

TEST_F(CApiBadConfig, UnknownBackendValue) {
  for (xlog_backend bad : {3u, 7u, 0xFFFFFFFFu}) {
    xlog_config cfg = SimConfig();
    cfg.backend = bad;
    ExpectOpenRefused(cfg, "backend value " + std::to_string(bad));
  }
}

TEST_F(CApiBadConfig, UnknownAllocatorValue) {
  for (xlog_allocator bad : {2u, 5u, 0xFFFFFFFFu}) {
    xlog_config cfg = SimConfig();
    cfg.allocator = bad;
    ExpectOpenRefused(cfg, "allocator value " + std::to_string(bad));
  }
}

TEST_F(CApiBadConfig, StructSizeZero) {
  xlog_config cfg = SimConfig();
  cfg.struct_size = 0;
  ExpectOpenRefused(cfg, "xlog_config_init");
}

TEST_F(CApiBadConfig, StructSizeWrong) {
  for (std::uint32_t bad : {static_cast<std::uint32_t>(sizeof(xlog_config) - 8),
                            static_cast<std::uint32_t>(sizeof(xlog_config) + 8), 1u, 4096u}) {
    xlog_config cfg = SimConfig();
    cfg.struct_size = bad;
    ExpectOpenRefused(cfg, "struct_size is " + std::to_string(bad));
  }
}

TEST_F(CApiBadConfig, OutOfRangeFields) {
  xlog_config cfg = SimConfig();
  cfg.wait_on_pressure = 2;
  ExpectOpenRefused(cfg, "wait_on_pressure");
  cfg = SimConfig();
  cfg.stream_pool_size = 0;
  ExpectOpenRefused(cfg, "stream_pool_size");
  cfg = SimConfig();
  cfg.sim_capacity_bytes = 0;
  ExpectOpenRefused(cfg, "sim_capacity_bytes");
  cfg = SimConfig();
  cfg.cache = 2;
  ExpectOpenRefused(cfg, "cache is 2");
  ExpectOpenRefused(SimConfig(), "negative", -1);
}

// Sets an environment variable for one test and always unsets it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST_F(CApiBadConfig, MalformedBudgetEnvironmentVariable) {
  ScopedEnv env("XLOG_BUDGET_BYTES", "12xyz");
  xlog_config cfg;
  std::memset(&cfg, 0, sizeof cfg);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_config_from_env(&cfg));
  std::string msg = LastError();
  EXPECT_TRUE(Contains(msg, "XLOG_BUDGET_BYTES")) << msg;
  EXPECT_TRUE(Contains(msg, "12xyz")) << msg;
  EXPECT_EQ(cfg.struct_size, 0u) << "a malformed environment marks the config unusable";

  // xlog_config_init has no status: it marks the config and leaves the message.
  std::memset(&cfg, 0, sizeof cfg);
  xlog_config_init(&cfg);
  EXPECT_EQ(cfg.struct_size, 0u);
  EXPECT_TRUE(Contains(LastError(), "12xyz")) << LastError();
  cfg.backend = XLOG_BACKEND_SIM;
  // ...and open refuses such a config with the reason.
  ExpectOpenRefused(cfg, "XLOG_BUDGET_BYTES");
  EXPECT_TRUE(Contains(LastError(), "12xyz")) << LastError();

  // A NULL config reads the environment too.
  xlog_runtime* rt = nullptr;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_open(0, nullptr, &rt));
  EXPECT_EQ(rt, nullptr);
  EXPECT_TRUE(Contains(LastError(), "XLOG_BUDGET_BYTES")) << LastError();
}

TEST_F(CApiBadConfig, MalformedBackendEnvironmentVariable) {
  ScopedEnv env("XLOG_BACKEND", "tpu");
  xlog_config cfg;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_config_from_env(&cfg));
  EXPECT_TRUE(Contains(LastError(), "XLOG_BACKEND")) << LastError();
  EXPECT_TRUE(Contains(LastError(), "tpu")) << LastError();
  EXPECT_EQ(cfg.struct_size, 0u);
  xlog_runtime* rt = nullptr;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_open(0, nullptr, &rt));
  EXPECT_EQ(rt, nullptr);
  EXPECT_TRUE(Contains(LastError(), "tpu")) << LastError();
}

TEST_F(CApiBadConfig, MalformedCacheEnvironmentVariables) {
  for (const char* bad : {"yes", "2", "on"}) {
    SCOPED_TRACE(bad);
    ScopedEnv env("XLOG_CACHE", bad);
    xlog_config cfg;
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_config_from_env(&cfg));
    EXPECT_TRUE(Contains(LastError(), "XLOG_CACHE")) << LastError();
    EXPECT_TRUE(Contains(LastError(), bad)) << LastError();
    EXPECT_EQ(cfg.struct_size, 0u);
  }
  ScopedEnv env("XLOG_POOL_RELEASE_THRESHOLD", "lots");
  xlog_config cfg;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_config_from_env(&cfg));
  EXPECT_TRUE(Contains(LastError(), "XLOG_POOL_RELEASE_THRESHOLD")) << LastError();
  EXPECT_TRUE(Contains(LastError(), "lots")) << LastError();
  xlog_runtime* rt = nullptr;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_open(0, nullptr, &rt));
  EXPECT_EQ(rt, nullptr);
}

TEST_F(CApiBadConfig, BudgetEnvironmentOverflow) {
  ScopedEnv env("XLOG_BUDGET_BYTES", "20000000TiB");
  xlog_config cfg;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_config_from_env(&cfg));
  EXPECT_TRUE(Contains(LastError(), "20000000TiB")) << LastError();
  EXPECT_EQ(cfg.struct_size, 0u);
}

// ----- streams -----

TEST_F(CApiErrors, StreamZeroIsNeverValid) {
  xlog_block b = Allocate(256);
  const xlog_stats before = StatsOf(rt_);
  xlog_block out;
  void* native;
  const xlog_use uses[1] = {{b, XLOG_ACCESS_READ}};
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_allocate(rt_, 64, 0, "t", &out));
  EXPECT_TRUE(Contains(LastError(), "stream 0")) << LastError();
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_release(rt_, 0));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_native(rt_, 0, &native));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_synchronize(rt_, 0));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_enqueue_host(rt_, 0, Noop, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare(rt_, b, 0, XLOG_ACCESS_READ));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish(rt_, b, 0, XLOG_ACCESS_READ));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare_all(rt_, 0, uses, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish_all(rt_, 0, uses, 1));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, ReleasedStreamIsDead) {
  xlog_stream gone = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &gone));
  xlog_block b = Allocate(256);
  XLOG_ASSERT_OK(xlog_stream_release(rt_, gone));
  const xlog_stats before = StatsOf(rt_);
  xlog_block out;
  void* native;
  const xlog_use uses[1] = {{b, XLOG_ACCESS_READ}};
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_release(rt_, gone));
  EXPECT_TRUE(Contains(LastError(), "stream " + std::to_string(gone))) << LastError();
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_allocate(rt_, 64, gone, "t", &out));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_native(rt_, gone, &native));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_synchronize(rt_, gone));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_enqueue_host(rt_, gone, Noop, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare(rt_, b, gone, XLOG_ACCESS_WRITE));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish(rt_, b, gone, XLOG_ACCESS_WRITE));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare_all(rt_, gone, uses, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish_all(rt_, gone, uses, 1));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, NeverIssuedStreamId) {
  const xlog_stats before = StatsOf(rt_);
  xlog_block out;
  const xlog_stream never = 0xFFFFFFF0u;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_allocate(rt_, 64, never, "t", &out));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_synchronize(rt_, never));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_release(rt_, never));
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

TEST_F(CApiErrors, StreamFromAnotherRuntime) {
  xlog_runtime* other = OpenSim(SimConfig());
  ASSERT_NE(other, nullptr);
  xlog_stream foreign = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(other, &foreign));
  xlog_block b = Allocate(256);
  const xlog_stats before = StatsOf(rt_);
  xlog_block out;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_allocate(rt_, 64, foreign, "t", &out));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare(rt_, b, foreign, XLOG_ACCESS_READ));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_synchronize(rt_, foreign));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_stream_release(rt_, foreign));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  // ...and the other runtime still owns it.
  XLOG_ASSERT_OK(xlog_stream_synchronize(other, foreign));
  XLOG_ASSERT_OK(xlog_stream_release(other, foreign));
  Close(other);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

// Every xlog call from a host callback is refused the same way, on both
// backends (host_callback_test.cpp goes through all of them).
TEST_F(CApiErrors, SynchronizeFromOwnHostCallbackIsRefused) {
  struct Probe {
    xlog_runtime* rt;
    xlog_stream stream;
    xlog_status status;
    std::string message;
  } probe{rt_, stream_, -1, std::string()};
  const xlog_stats before = StatsOf(rt_);
  auto cb = [](void* user) {
    auto* p = static_cast<Probe*>(user);
    p->status = xlog_stream_synchronize(p->rt, p->stream);
    p->message = LastError();
  };
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, cb, &probe));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, stream_));
  EXPECT_EQ(probe.status, XLOG_ERR_STREAM_MISUSE) << StatusText(probe.status);
  EXPECT_TRUE(Contains(probe.message, "xlog_stream_synchronize: ")) << probe.message;
  EXPECT_TRUE(Contains(probe.message, "host callback")) << probe.message;
  EXPECT_EQ(xlog_last_error_message(nullptr, 0), 0u) << "the callback's message belongs to the worker thread";
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

TEST_F(CApiErrors, PoolExhausted) {
  xlog_runtime* rt = nullptr;
  xlog_config cfg = SimConfig();
  cfg.stream_pool_size = 2;
  XLOG_ASSERT_OK(xlog_runtime_open(0, &cfg, &rt));
  xlog_stream a = 0, b = 0, c = 77;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &a));
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &b));
  const xlog_stats before = StatsOf(rt);
  XLOG_EXPECT_REJECTED(XLOG_ERR_POOL_EXHAUSTED, xlog_stream_acquire(rt, &c));
  EXPECT_TRUE(Contains(LastError(), "all 2 pooled streams")) << LastError();
  EXPECT_EQ(c, 77u);
  ExpectStatsUnchanged(before, StatsOf(rt));
  // Imports do not count against the pool.
  xlog_stream imported = 0;
  XLOG_ASSERT_OK(xlog_stream_import(rt, reinterpret_cast<void*>(std::uintptr_t{0x4242}), &imported));
  XLOG_ASSERT_OK(xlog_stream_release(rt, a));
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &c));
  EXPECT_NE(c, a);
  XLOG_EXPECT_REJECTED(XLOG_ERR_POOL_EXHAUSTED, xlog_stream_acquire(rt, &a));
  Close(rt);
}

// ----- block handles -----

TEST_F(CApiErrors, DoubleFree) {
  xlog_block b = Allocate(1024);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  const xlog_stats before = StatsOf(rt_);
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_deallocate(rt_, b));
  EXPECT_TRUE(Contains(LastError(), "generation " + std::to_string(b.generation))) << LastError();
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, StaleHandleAfterAddressReuse) {
  xlog_block old_block = Allocate(4096, "old");
  XLOG_ASSERT_OK(xlog_deallocate(rt_, old_block));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
  xlog_block reused = Allocate(4096, "new");
  ASSERT_EQ(reused.ptr, old_block.ptr) << "the stream's cache hands the same address out again";
  ASSERT_EQ(reused.size, old_block.size);
  ASSERT_NE(reused.generation, old_block.generation);
  std::memset(reused.ptr, 0x5E, 4096);

  const xlog_stats before = StatsOf(rt_);
  const xlog_use uses[1] = {{old_block, XLOG_ACCESS_WRITE}};
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_deallocate(rt_, old_block));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(rt_, old_block));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_prepare(rt_, old_block, stream_, XLOG_ACCESS_WRITE));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_finish(rt_, old_block, stream_, XLOG_ACCESS_WRITE));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_prepare_all(rt_, stream_, uses, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_finish_all(rt_, stream_, uses, 1));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  // The new owner is untouched.
  XLOG_ASSERT_OK(xlog_block_validate(rt_, reused));
  EXPECT_EQ(static_cast<unsigned char*>(reused.ptr)[4095], 0x5E);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, reused));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, ForgedHandleWithLiveGeneration) {
  xlog_block b = Allocate(1024);
  xlog_block neighbour = Allocate(1024);
  const xlog_stats before = StatsOf(rt_);
  xlog_stream other = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &other));

  std::vector<xlog_block> forged(5, b);
  forged[0].ptr = static_cast<char*>(b.ptr) + 256;
  forged[1].size = b.size + 1;
  forged[2].size = 0;
  forged[3].stream = other;
  forged[4].device = 1;
  for (const xlog_block& f : forged) {
    SCOPED_TRACE(::testing::Message() << "ptr " << f.ptr << " size " << f.size << " stream "
                                      << f.stream << " device " << f.device);
    const xlog_use uses[2] = {{neighbour, XLOG_ACCESS_READ}, {f, XLOG_ACCESS_READ}};
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_block_validate(rt_, f));
    EXPECT_TRUE(Contains(LastError(), "does not match")) << LastError();
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_deallocate(rt_, f));
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare(rt_, f, stream_, XLOG_ACCESS_READ));
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish(rt_, f, stream_, XLOG_ACCESS_READ));
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare_all(rt_, stream_, uses, 2));
    XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish_all(rt_, stream_, uses, 2));
  }
  // A forged pointer that is another live block's address is still refused.
  xlog_block swapped = b;
  swapped.ptr = neighbour.ptr;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_deallocate(rt_, swapped));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_block_validate(rt_, b));
  XLOG_ASSERT_OK(xlog_block_validate(rt_, neighbour));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, neighbour));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, NeverIssuedAndZeroedHandles) {
  xlog_block b = Allocate(256);
  const xlog_stats before = StatsOf(rt_);
  xlog_block zero;
  std::memset(&zero, 0, sizeof zero);
  xlog_block future = b;
  future.generation = UINT64_MAX;
  for (const xlog_block& h : {zero, future}) {
    XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(rt_, h));
    XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_deallocate(rt_, h));
    XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_prepare(rt_, h, stream_, XLOG_ACCESS_READ));
  }
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, BlockFromAnotherRuntime) {
  xlog_runtime* other = OpenSim(SimConfig());
  ASSERT_NE(other, nullptr);
  xlog_stream os = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(other, &os));
  xlog_block theirs;
  XLOG_ASSERT_OK(xlog_allocate(other, 512, os, "theirs", &theirs));
  const xlog_stats before = StatsOf(rt_);
  const xlog_stats before_other = StatsOf(other);
  // Live in the other runtime: named as its block, not a use after free.
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_deallocate(rt_, theirs));
  EXPECT_NE(LastError().find("live block of another runtime of device 0"), std::string::npos) << LastError();
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_block_validate(rt_, theirs));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare(rt_, theirs, stream_, XLOG_ACCESS_READ));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  ExpectStatsUnchanged(before_other, StatsOf(other));
  XLOG_ASSERT_OK(xlog_block_validate(other, theirs));
  XLOG_ASSERT_OK(xlog_deallocate(other, theirs));
  // Freed, it is live nowhere: a use after free everywhere.
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_deallocate(rt_, theirs));
  XLOG_ASSERT_OK(xlog_stream_release(other, os));
  Close(other);
}

TEST_F(CApiErrors, PrepareAndFinishAfterFree) {
  xlog_block b = Allocate(2048);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  const xlog_stats before = StatsOf(rt_);
  for (xlog_access acc : {XLOG_ACCESS_READ, XLOG_ACCESS_WRITE, XLOG_ACCESS_READ_WRITE}) {
    XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_prepare(rt_, b, stream_, acc));
    XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_finish(rt_, b, stream_, acc));
  }
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(rt_, b));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

struct Gate {
  std::atomic<int> opened{0};
};
void SleepThenOpen(void* user) {
  SleepMs(250);
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

// prepare_all / finish_all with one stale handle among good ones: the call
// fails and nothing is queued or recorded for the good handles either.
TEST_F(CApiErrors, LaunchWithOneStaleHandleChangesNothing) {
  xlog_stream slow = 0, fast = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &slow));
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &fast));
  xlog_block good1 = Allocate(256);
  xlog_block good2 = Allocate(256);
  xlog_block stale = Allocate(256);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, stale));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));

  // good1's last write is a launch on `slow` that finishes only after 250 ms.
  Gate gate;
  const xlog_use write_good1[1] = {{good1, XLOG_ACCESS_WRITE}};
  XLOG_ASSERT_OK(xlog_prepare_all(rt_, slow, write_good1, 1));
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, slow, SleepThenOpen, &gate));
  XLOG_ASSERT_OK(xlog_finish_all(rt_, slow, write_good1, 1));
  const xlog_stats before = StatsOf(rt_);

  // prepare_all on `fast` naming good1 (which would have to wait for
  // `slow`) and a stale handle: refused, and no wait is queued on `fast`.
  const xlog_use bad_launch[3] = {
      {good1, XLOG_ACCESS_READ}, {good2, XLOG_ACCESS_WRITE}, {stale, XLOG_ACCESS_READ}};
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_prepare_all(rt_, fast, bad_launch, 3));
  Observation after_prepare{&gate};
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, fast, Observe, &after_prepare));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, fast));
  EXPECT_EQ(after_prepare.seen.load(), 0) << "the refused prepare_all queued a wait on the good handle";

  // finish_all on `slow` naming good2 and the stale handle: refused, and
  // good2 gets no recorded write on `slow` (a later read on `fast` would
  // otherwise wait for the sleeping stream).
  const xlog_use bad_finish[2] = {{good2, XLOG_ACCESS_WRITE}, {stale, XLOG_ACCESS_WRITE}};
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_finish_all(rt_, slow, bad_finish, 2));
  const xlog_use read_good2[1] = {{good2, XLOG_ACCESS_READ}};
  XLOG_ASSERT_OK(xlog_prepare_all(rt_, fast, read_good2, 1));
  Observation after_finish{&gate};
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, fast, Observe, &after_finish));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, fast));
  EXPECT_EQ(after_finish.seen.load(), 0) << "the refused finish_all recorded a use of the good handle";

  // Control: the good launch alone does wait for `slow`.
  const xlog_use read_good1[1] = {{good1, XLOG_ACCESS_READ}};
  XLOG_ASSERT_OK(xlog_prepare_all(rt_, fast, read_good1, 1));
  Observation control{&gate};
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, fast, Observe, &control));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, fast));
  EXPECT_EQ(control.seen.load(), 1) << "control: prepare_all of a good handle must wait for its writer";

  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, good1));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, good2));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, UsesNullWithNonZeroCount) {
  const xlog_stats before = StatsOf(rt_);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare_all(rt_, stream_, nullptr, 1));
  EXPECT_TRUE(Contains(LastError(), "uses is NULL but n is 1")) << LastError();
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish_all(rt_, stream_, nullptr, 3));
  EXPECT_TRUE(Contains(LastError(), "n is 3")) << LastError();
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

TEST_F(CApiErrors, AbsurdUseCountIsRefusedBeforeReading) {
  xlog_block b = Allocate(256);
  const xlog_stats before = StatsOf(rt_);
  const xlog_use one[1] = {{b, XLOG_ACCESS_READ}};
  // Only one element is really there: the count must be refused before the
  // array is read.
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare_all(rt_, stream_, one, SIZE_MAX));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_finish_all(rt_, stream_, one, (1u << 20) + 1));
  EXPECT_TRUE(Contains(LastError(), "exceeds the limit")) << LastError();
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiErrors, ZeroByteBlockFreesExactlyOnce) {
  xlog_block z = Allocate(0);
  ASSERT_EQ(z.ptr, nullptr);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, z));
  const xlog_stats before = StatsOf(rt_);
  EXPECT_EQ(before.outstanding_bytes, 0u);
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_deallocate(rt_, z));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(rt_, z));
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

// ----- sizes and budgets -----

TEST_F(CApiErrors, HugeAllocationWithoutBudgetIsOutOfMemory) {
  const xlog_stats before = StatsOf(rt_);
  xlog_block out;
  std::memset(&out, 0x66, sizeof out);
  std::uint64_t failed = 0;
  for (std::uint64_t huge : {std::uint64_t{UINT64_MAX}, std::uint64_t{UINT64_MAX - 255},
                             std::uint64_t{UINT64_MAX / 2}, std::uint64_t{2} << 30}) {
    SCOPED_TRACE(huge);
    XLOG_EXPECT_REJECTED(XLOG_ERR_OUT_OF_MEMORY, xlog_allocate(rt_, huge, stream_, "huge", &out));
    EXPECT_TRUE(Contains(LastError(), std::to_string(huge))) << LastError();
    ++failed;
  }
  EXPECT_EQ(out.size, 0x6666666666666666ull) << "out written on failure";
  ExpectStatsUnchangedByRefusal(before, StatsOf(rt_), failed);
}

// A budget of whole pages (the arena charges 2 MiB pages): every number
// below is the same under either memory.
constexpr std::uint64_t kBudget = 2 * kPage;

class CApiBudget : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override { cfg.budget_bytes = kBudget; }
};

TEST_F(CApiBudget, HugeAllocationWithBudgetIsOutOfBudgetAndChargesNothing) {
  const xlog_stats before = StatsOf(rt_);
  EXPECT_EQ(before.budget_limit, kBudget);
  EXPECT_EQ(before.budget_remaining, kBudget);
  xlog_block out;
  // Their device size (the size class) does not even fit in 64 bits: the
  // budget refuses them, naming the caller's request.
  for (std::uint64_t huge : {std::uint64_t{UINT64_MAX}, std::uint64_t{UINT64_MAX - 255}}) {
    SCOPED_TRACE(huge);
    XLOG_EXPECT_REJECTED(XLOG_ERR_OUT_OF_BUDGET, xlog_allocate(rt_, huge, stream_, "huge", &out));
    EXPECT_TRUE(Contains(LastError(), "requested " + std::to_string(huge) + " bytes")) << LastError();
    EXPECT_TRUE(Contains(LastError(), "limit " + std::to_string(kBudget))) << LastError();
  }
  ExpectStatsUnchangedByRefusal(before, StatsOf(rt_), 2);
  // The whole budget is still there.
  xlog_block all = Allocate(kBudget);
  EXPECT_EQ(StatsOf(rt_).budget_remaining, 0u);
  ExpectBooksBalance(StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, all));
  EXPECT_EQ(StatsOf(rt_).budget_remaining, 0u) << "the freed memory is held (idle), still charged";
  std::uint64_t released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, kBudget);
  EXPECT_EQ(StatsOf(rt_).budget_remaining, kBudget);
}

TEST_F(CApiBudget, ZeroByteBlockChargesNothingAndFreesOnce) {
  xlog_block z = Allocate(0, "empty");
  EXPECT_EQ(z.ptr, nullptr);
  EXPECT_NE(z.generation, 0u);
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.budget_remaining, kBudget);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.live_blocks, 1u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, z));
  const xlog_stats before = StatsOf(rt_);
  EXPECT_EQ(before.budget_remaining, kBudget);
  EXPECT_EQ(before.pending_bytes, 0u);
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_deallocate(rt_, z));
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

// Budget 4 pages, 3 held: the numbers are the same under either memory.
TEST_F(CApiBudget, BudgetExceededNamesTheNumbers) {
  xlog_runtime* const fixture_rt = rt_;
  xlog_config cfg = SimConfig();
  cfg.budget_bytes = 4 * kPage;
  XLOG_ASSERT_OK(xlog_runtime_open(0, &cfg, &rt_));
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &stream_));
  xlog_block held = Allocate(3 * kPage);
  const xlog_stats before = StatsOf(rt_);
  EXPECT_EQ(before.budget_remaining, kPage);
  xlog_block out;
  XLOG_EXPECT_REJECTED(XLOG_ERR_OUT_OF_BUDGET, xlog_allocate(rt_, 2 * kPage, stream_, "too_big", &out));
  const std::string msg = LastError();
  EXPECT_TRUE(Contains(msg, "requested " + std::to_string(2 * kPage))) << msg;
  EXPECT_TRUE(Contains(msg, "limit " + std::to_string(4 * kPage))) << msg;
  EXPECT_TRUE(Contains(msg, "live " + std::to_string(3 * kPage))) << msg;
  EXPECT_TRUE(Contains(msg, "remaining " + std::to_string(kPage))) << msg;
  ExpectStatsUnchangedByRefusal(before, StatsOf(rt_), 1);
  // Exactly the remainder still fits.
  xlog_block rest = Allocate(kPage);
  EXPECT_EQ(StatsOf(rt_).budget_remaining, 0u);
  XLOG_EXPECT_REJECTED(XLOG_ERR_OUT_OF_BUDGET, xlog_allocate(rt_, 1, stream_, "one_more", &out));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, held));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, rest));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
  XLOG_ASSERT_OK(xlog_stream_release(rt_, stream_));
  Close(rt_);
  rt_ = fixture_rt;  // TearDown closes the fixture's runtime
}

TEST_F(CApiBudget, SimCapacityExhaustedWithinBudgetIsOutOfMemory) {
  xlog_runtime* rt = nullptr;
  xlog_config cfg = SimConfig();
  cfg.budget_bytes = kBudget;
  cfg.sim_capacity_bytes = kPage;  // a device of one page, a budget of two
  XLOG_ASSERT_OK(xlog_runtime_open(0, &cfg, &rt));
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &s));
  const xlog_stats before = StatsOf(rt);
  xlog_block out;
  XLOG_EXPECT_REJECTED(XLOG_ERR_OUT_OF_MEMORY, xlog_allocate(rt, 2 * kPage, s, "bigger_than_device", &out));
  ExpectStatsUnchangedByRefusal(before, StatsOf(rt), 1);
  EXPECT_EQ(StatsOf(rt).budget_remaining, kBudget) << "the reservation was rolled back";
  Close(rt);
}

// ----- Direct allocator -----

class CApiDirect : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override { cfg.allocator = XLOG_ALLOCATOR_DIRECT; }
};

TEST_F(CApiDirect, PrepareAndFinishAreStreamMisuse) {
  xlog_block b = Allocate(4096);
  const xlog_stats before = StatsOf(rt_);
  const xlog_use uses[1] = {{b, XLOG_ACCESS_READ}};
  XLOG_EXPECT_REJECTED(XLOG_ERR_STREAM_MISUSE, xlog_prepare(rt_, b, stream_, XLOG_ACCESS_READ));
  EXPECT_TRUE(Contains(LastError(), "Direct")) << LastError();
  XLOG_EXPECT_REJECTED(XLOG_ERR_STREAM_MISUSE, xlog_finish(rt_, b, stream_, XLOG_ACCESS_WRITE));
  XLOG_EXPECT_REJECTED(XLOG_ERR_STREAM_MISUSE, xlog_prepare_all(rt_, stream_, uses, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_STREAM_MISUSE, xlog_finish_all(rt_, stream_, uses, 1));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  // Direct frees at once: nothing goes pending, and it has no cache.
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  const xlog_stats after = StatsOf(rt_);
  EXPECT_EQ(after.live_bytes, 0u);
  EXPECT_EQ(after.pending_bytes, 0u);
  EXPECT_EQ(after.cached_bytes, 0u);
  EXPECT_EQ(after.outstanding_bytes, 0u);
  EXPECT_EQ(after.deallocations, 1u);
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_deallocate(rt_, b));
}

TEST_F(CApiDirect, RoundsTo256BytesAndCachesNothing) {
  xlog_block a = Allocate(1000);
  xlog_block b = Allocate(1);
  EXPECT_EQ(a.size, 1000u);
  EXPECT_EQ(b.size, 1u);
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 1024u + 256u);
  EXPECT_EQ(s.outstanding_bytes, 1024u + 256u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  xlog_block c = Allocate(1000);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, c));
  s = StatsOf(rt_);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.cached_blocks, 0u);
  EXPECT_EQ(s.cache_hits, 0u);
  EXPECT_EQ(s.cache_misses, 0u);
  std::uint64_t released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, 0u);
}

// ----- injected faults -----
//
// With the cache on, the sim's alloc fault fires only when the pool goes
// to the driver (a cache miss), its free fault only when cached memory
// goes back to the driver (trim, pressure), and an event-record fault can
// hit a cross-stream cache hand-out. CApiFaultsNoCache runs with
// `cache = 0`, where every free is a driver free (the seed's behaviour).

// These count the driver pool's calls (cuMemAllocAsync on a miss, a free
// on trim, an event record on a cross-stream hand-out): pinned to the pool.
// The arena's page creation under a fault is in c_api_arena_test.cpp.
class CApiFaults : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override {
    cfg.budget_bytes = 1 << 20;
    cfg.stream_pool_size = 2;
    cfg.cache = cache_;
    cfg.memory = XLOG_MEMORY_POOL;
  }
  std::uint8_t cache_ = 1;
};

class CApiFaultsNoCache : public CApiFaults {
 protected:
  void Configure(xlog_config& cfg) override {
    cache_ = 0;
    CApiFaults::Configure(cfg);
  }
};

TEST_F(CApiFaults, InjectedAllocFaultIsDriverErrorAndChargesNothing) {
  xlog_block held = Allocate(1000);
  const xlog_stats before = StatsOf(rt_);
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_ALLOC, 1));
  xlog_block out;
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_allocate(rt_, 4096, stream_, "faulted", &out));
  EXPECT_TRUE(Contains(LastError(), "injected")) << LastError();
  const xlog_stats after = StatsOf(rt_);
  ExpectStatsUnchanged(before, after, 1);
  EXPECT_EQ(after.budget_remaining, (1u << 20) - 1024) << "the reservation was not rolled back";
  xlog_block next = Allocate(4096);
  EXPECT_NE(next.ptr, nullptr);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, next));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, held));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiFaults, InjectedAllocFaultSparesCacheHits) {
  xlog_block b = Allocate(4096);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_ALLOC, 1));
  // A hit makes no driver call: the armed fault does not fire.
  xlog_block hit = Allocate(4096);
  EXPECT_EQ(hit.ptr, b.ptr);
  xlog_stats before = StatsOf(rt_);
  EXPECT_EQ(before.cache_hits, 1u);
  EXPECT_EQ(before.failed_allocations, 0u);
  // The next miss is the driver's next allocation: that one fails.
  xlog_block out;
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_allocate(rt_, 8192, stream_, "miss", &out));
  EXPECT_TRUE(Contains(LastError(), "injected")) << LastError();
  ExpectStatsUnchanged(before, StatsOf(rt_), 1);
  xlog_block miss = Allocate(8192);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, miss));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, hit));
}

TEST_F(CApiFaultsNoCache, InjectedFreeFaultLeavesTheBlockLive) {
  xlog_block b = Allocate(2048);
  std::memset(b.ptr, 0x42, 2048);
  const xlog_stats before = StatsOf(rt_);
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_FREE, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_deallocate(rt_, b));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_block_validate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
  EXPECT_EQ(static_cast<unsigned char*>(b.ptr)[2047], 0x42) << "the memory was released";
  // A second allocation must not land on it.
  xlog_block other = Allocate(2048);
  EXPECT_NE(other.ptr, b.ptr);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, other));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
  EXPECT_EQ(StatsOf(rt_).outstanding_bytes, 0u);
}

// With the cache on a free makes no driver call (an armed free fault does
// not fire); trim does, and a failed trim keeps the block cached.
TEST_F(CApiFaults, InjectedFreeFaultFailsTheTrimAndKeepsTheBlockCached) {
  xlog_block b = Allocate(2048);
  std::memset(b.ptr, 0x42, 2048);
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_FREE, 1));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(rt_, b));
  const xlog_stats before = StatsOf(rt_);
  EXPECT_EQ(before.cached_bytes, 2048u);
  EXPECT_EQ(before.deallocations, 1u);

  std::uint64_t released = 77;
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_trim(rt_, 0, &released));
  EXPECT_TRUE(Contains(LastError(), "injected")) << LastError();
  EXPECT_EQ(released, 77u);
  ExpectStatsUnchanged(before, StatsOf(rt_));
  EXPECT_EQ(static_cast<unsigned char*>(b.ptr)[2047], 0x42) << "the memory was released";

  // The block is still in the cache: the same stream gets it back.
  xlog_block again = Allocate(2048);
  EXPECT_EQ(again.ptr, b.ptr);
  EXPECT_EQ(StatsOf(rt_).cache_hits, 1u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, again));
  // The fault fired once: the next trim succeeds.
  released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, 2048u);
  const xlog_stats after = StatsOf(rt_);
  EXPECT_EQ(after.outstanding_bytes, 0u);
  EXPECT_EQ(after.budget_remaining, 1u << 20);
}

TEST_F(CApiFaults, InjectedStreamCreateFaultFailsOneAcquire) {
  const xlog_stats before = StatsOf(rt_);
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_STREAM_CREATE, 1));
  xlog_stream s = 88;
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_stream_acquire(rt_, &s));
  EXPECT_EQ(s, 88u);
  // The failed acquire did not use up the pool (size 2, one held).
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &s));
  EXPECT_NE(s, 0u);
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, s));
  ExpectStatsUnchanged(before, StatsOf(rt_));
}

TEST_F(CApiFaults, InjectedEventRecordFaultRecordsNothing) {
  xlog_stream slow = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &slow));
  xlog_block b = Allocate(512);
  Gate gate;
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, slow, SleepThenOpen, &gate));
  const xlog_stats before = StatsOf(rt_);
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_EVENT_RECORD, 1));
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_finish(rt_, b, slow, XLOG_ACCESS_WRITE));
  // No write was recorded on `slow`, so a read on the fixture's stream does
  // not wait for the sleeping stream.
  XLOG_ASSERT_OK(xlog_prepare(rt_, b, stream_, XLOG_ACCESS_READ));
  Observation seen{&gate};
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, Observe, &seen));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, stream_));
  EXPECT_EQ(seen.seen.load(), 0);
  ExpectStatsUnchanged(before, StatsOf(rt_));
  // The fault fired once: the next finish records.
  XLOG_ASSERT_OK(xlog_finish(rt_, b, slow, XLOG_ACCESS_WRITE));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, slow));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

// A block cached on `slow` handed to the fixture's stream needs an event
// recorded on `slow`: when that record fails, the allocation fails with
// nothing changed (the block stays cached, no hit is counted), and the
// next try takes it, ordered after `slow`.
TEST_F(CApiFaults, InjectedEventRecordFaultFailsACrossStreamHandOut) {
  xlog_stream slow = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &slow));
  xlog_block x;
  XLOG_ASSERT_OK(xlog_allocate(rt_, 8192, slow, "x", &x));
  Gate gate;
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, slow, SleepThenOpen, &gate));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, x));
  const xlog_stats before = StatsOf(rt_);
  EXPECT_EQ(before.cached_bytes, 8192u);

  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_EVENT_RECORD, 1));
  xlog_block out;
  std::memset(&out, 0x66, sizeof out);
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_allocate(rt_, 8192, stream_, "handed", &out));
  EXPECT_TRUE(Contains(LastError(), "injected")) << LastError();
  EXPECT_EQ(out.size, 0x6666666666666666ull) << "out written on failure";
  ExpectStatsUnchanged(before, StatsOf(rt_), 1);

  xlog_block y = Allocate(8192, "handed");
  EXPECT_EQ(y.ptr, x.ptr);
  EXPECT_EQ(StatsOf(rt_).cache_hits, 1u);
  Observation seen{&gate};
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, Observe, &seen));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, stream_));
  EXPECT_EQ(seen.seen.load(), 1) << "the hand-out was not ordered after the slow stream";
  XLOG_ASSERT_OK(xlog_deallocate(rt_, y));
}

TEST_F(CApiFaultsNoCache, InjectedEventRecordFaultDuringReapKeepsFreesPending) {
  xlog_block b = Allocate(3000);  // 3072 device bytes
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, stream_));
  const xlog_stats before = StatsOf(rt_);
  EXPECT_EQ(before.pending_bytes, 3072u);
  // reap seals the stream's pending frees with one event record: make it fail.
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_EVENT_RECORD, 1));
  std::uint64_t reclaimed = 77;
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_reap(rt_, &reclaimed));
  EXPECT_EQ(reclaimed, 77u);
  ExpectStatsUnchanged(before, StatsOf(rt_));
  // Nothing was lost: the next drain retires the free.
  reclaimed = 0;
  XLOG_ASSERT_OK(xlog_drain(rt_, &reclaimed));
  EXPECT_EQ(reclaimed, 3072u);
  EXPECT_EQ(StatsOf(rt_).budget_remaining, 1u << 20);
}

// The same fault during a trim (it seals the frees it queued with an event
// record before waiting for them): the call fails, the bytes stay held and
// charged (today the block's free is already queued, so they show as
// pending rather than cached), and a later drain / trim retires them.
TEST_F(CApiFaults, InjectedEventRecordFaultDuringTrimKeepsItsFreesPending) {
  xlog_block b = Allocate(3000);  // class 3072
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_EVENT_RECORD, 1));
  std::uint64_t released = 77;
  XLOG_EXPECT_REJECTED(XLOG_ERR_DRIVER, xlog_trim(rt_, 0, &released));
  EXPECT_TRUE(Contains(LastError(), "injected")) << LastError();
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes + s.pending_bytes, 3072u) << Describe(s);
  EXPECT_EQ(s.outstanding_bytes, 3072u);
  EXPECT_EQ(s.budget_remaining, (1u << 20) - 3072) << "bytes left charged until really retired";
  std::uint64_t drained = 0;
  XLOG_ASSERT_OK(xlog_drain(rt_, &drained));
  released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  s = StatsOf(rt_);
  EXPECT_EQ(drained + released, 3072u);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.budget_remaining, 1u << 20);
}

}  // namespace
