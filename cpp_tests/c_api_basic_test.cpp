// Success paths of every C entry point, on the sim backend.
#include "c_api_test_util.h"

#ifdef __linux__
#include <dirent.h>
#endif

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace xlog_test;

// ----- library-level calls -----

TEST(CApiLibrary, VersionMatchesHeaderMacros) {
  const char* v = xlog_version();
  ASSERT_NE(v, nullptr);
  const std::string expected = std::to_string(XLOG_VERSION_MAJOR) + "." +
                               std::to_string(XLOG_VERSION_MINOR) + "." +
                               std::to_string(XLOG_VERSION_PATCH);
  EXPECT_EQ(std::string(v), expected);
  EXPECT_EQ(xlog_version(), v) << "the version string is static";
}

TEST(CApiLibrary, StatusNamesAreExactAndNeverNull) {
  const struct {
    xlog_status status;
    const char* name;
  } names[] = {
      {XLOG_OK, "XLOG_OK"},
      {XLOG_ERR_INVALID_ARGUMENT, "XLOG_ERR_INVALID_ARGUMENT"},
      {XLOG_ERR_OUT_OF_BUDGET, "XLOG_ERR_OUT_OF_BUDGET"},
      {XLOG_ERR_OUT_OF_MEMORY, "XLOG_ERR_OUT_OF_MEMORY"},
      {XLOG_ERR_DRIVER, "XLOG_ERR_DRIVER"},
      {XLOG_ERR_STREAM_MISUSE, "XLOG_ERR_STREAM_MISUSE"},
      {XLOG_ERR_USE_AFTER_FREE, "XLOG_ERR_USE_AFTER_FREE"},
      {XLOG_ERR_UNSATISFIABLE_DEPENDENCY, "XLOG_ERR_UNSATISFIABLE_DEPENDENCY"},
      {XLOG_ERR_POOL_EXHAUSTED, "XLOG_ERR_POOL_EXHAUSTED"},
      {XLOG_ERR_NO_DEVICE, "XLOG_ERR_NO_DEVICE"},
      {XLOG_ERR_INTERNAL, "XLOG_ERR_INTERNAL"},
  };
  for (const auto& n : names) {
    ASSERT_NE(xlog_status_name(n.status), nullptr);
    EXPECT_STREQ(xlog_status_name(n.status), n.name);
  }
  // The values are fixed by the ABI.
  EXPECT_EQ(XLOG_OK, 0);
  EXPECT_EQ(XLOG_ERR_INVALID_ARGUMENT, 1);
  EXPECT_EQ(XLOG_ERR_INTERNAL, 10);
  for (xlog_status unknown : {-1, 11, 12345, INT32_MIN, INT32_MAX}) {
    ASSERT_NE(xlog_status_name(unknown), nullptr);
    EXPECT_STREQ(xlog_status_name(unknown), "XLOG_STATUS_UNKNOWN") << unknown;
  }
}

TEST(CApiLibrary, LastErrorMessageSizingAndTruncation) {
  // A failed call leaves a message; build a known one.
  ASSERT_EQ(xlog_get_stats(nullptr, nullptr), XLOG_ERR_INVALID_ARGUMENT);
  const std::size_t len = xlog_last_error_message(nullptr, 0);
  ASSERT_GT(len, 10u);

  // cap == 0 with a buffer sizes without writing.
  char untouched[4] = {'x', 'x', 'x', 'x'};
  EXPECT_EQ(xlog_last_error_message(untouched, 0), len);
  EXPECT_EQ(untouched[0], 'x');

  std::string full(len + 1, '#');
  EXPECT_EQ(xlog_last_error_message(&full[0], full.size()), len);
  EXPECT_EQ(full[len], '\0');
  EXPECT_EQ(std::strlen(full.c_str()), len);
  const std::string text = full.substr(0, len);

  // cap = 6 → 5 bytes and a NUL; the byte after the buffer is left alone.
  char small[8];
  std::memset(small, '#', sizeof small);
  EXPECT_EQ(xlog_last_error_message(small, 6), len);
  EXPECT_EQ(std::string(small), text.substr(0, 5));
  EXPECT_EQ(small[6], '#');

  // cap = 1 → just the NUL.
  char one = '#';
  EXPECT_EQ(xlog_last_error_message(&one, 1), len);
  EXPECT_EQ(one, '\0');

  // Reading the message does not clear it.
  EXPECT_EQ(xlog_last_error_message(nullptr, 0), len);

  // A later failure replaces it; a later success clears it.
  ASSERT_EQ(xlog_debug_panic(), XLOG_ERR_INTERNAL);
  ASSERT_NE(LastError(), text);
  xlog_config cfg;
  ASSERT_EQ(xlog_config_from_env(&cfg), XLOG_OK);
  EXPECT_EQ(xlog_last_error_message(nullptr, 0), 0u);
  char cleared[4] = {'#', '#', '#', '#'};
  EXPECT_EQ(xlog_last_error_message(cleared, sizeof cleared), 0u);
  EXPECT_EQ(cleared[0], '\0');
}

TEST(CApiLibrary, LastErrorMessageIsPerThread) {
  ASSERT_EQ(xlog_get_stats(nullptr, nullptr), XLOG_ERR_INVALID_ARGUMENT);
  const std::string mine = LastError();
  ASSERT_FALSE(mine.empty());
  std::size_t other_len = 12345;
  std::string other_after_error;
  std::thread t([&] {
    other_len = xlog_last_error_message(nullptr, 0);
    xlog_stream s = 0;
    (void)xlog_stream_acquire(nullptr, &s);
    other_after_error = LastError();
  });
  t.join();
  EXPECT_EQ(other_len, 0u) << "a fresh thread has no message";
  EXPECT_NE(other_after_error.find("xlog_stream_acquire"), std::string::npos) << other_after_error;
  EXPECT_EQ(LastError(), mine) << "another thread's failure must not replace this thread's message";
}

TEST(CApiLibrary, DebugPanicBecomesInternalErrorWithMessage) {
  EXPECT_EQ(xlog_debug_panic(), XLOG_ERR_INTERNAL);
  const std::string msg = LastError();
  EXPECT_NE(msg.find("xlog_debug_panic"), std::string::npos) << msg;
  EXPECT_NE(msg.find("panic"), std::string::npos) << msg;
  EXPECT_NE(msg.find("deliberate panic from xlog_debug_panic"), std::string::npos) << msg;
  // The process survived and the library still works.
  xlog_runtime* rt = OpenSim(SimConfig());
  ASSERT_NE(rt, nullptr);
  Close(rt);
}

// ----- configuration -----

TEST(CApiConfig, InitGivesDocumentedDefaults) {
  xlog_config cfg;
  std::memset(&cfg, 0x5A, sizeof cfg);
  xlog_config_init(&cfg);
  EXPECT_EQ(cfg.struct_size, sizeof(xlog_config));
  EXPECT_EQ(cfg.backend, XLOG_BACKEND_AUTO);
  EXPECT_EQ(cfg.allocator, XLOG_ALLOCATOR_ASYNC);
  EXPECT_EQ(cfg.budget_bytes, 0u);
  EXPECT_EQ(cfg.stream_pool_size, 16u);
  EXPECT_EQ(cfg.log_path, nullptr);
  EXPECT_EQ(cfg.sim_capacity_bytes, 1ull << 30);
  EXPECT_EQ(cfg.wait_on_pressure, 0);
  EXPECT_EQ(cfg.cache, 1) << "the async allocator caches freed blocks by default";
  EXPECT_EQ(cfg.pool_release_threshold, UINT64_MAX) << "the driver pool keeps its memory by default";
  EXPECT_EQ(xlog_last_error_message(nullptr, 0), 0u);
}

TEST(CApiConfig, FromEnvAppliesVariables) {
  ASSERT_EQ(setenv("XLOG_BACKEND", "sim", 1), 0);
  ASSERT_EQ(setenv("XLOG_BUDGET_BYTES", "512MiB", 1), 0);
  ASSERT_EQ(setenv("XLOG_LOG_PATH", "/tmp/xlog_c_api_env_test.csv", 1), 0);
  ASSERT_EQ(setenv("XLOG_CACHE", "0", 1), 0);
  ASSERT_EQ(setenv("XLOG_POOL_RELEASE_THRESHOLD", "2GiB", 1), 0);
  xlog_config cfg;
  std::memset(&cfg, 0, sizeof cfg);
  const xlog_status st = xlog_config_from_env(&cfg);
  const std::string msg = LastError();
  unsetenv("XLOG_LOG_PATH");
  unsetenv("XLOG_CACHE");
  unsetenv("XLOG_POOL_RELEASE_THRESHOLD");

  EXPECT_EQ(st, XLOG_OK) << msg;
  EXPECT_EQ(cfg.struct_size, sizeof(xlog_config));
  EXPECT_EQ(cfg.backend, XLOG_BACKEND_SIM);
  EXPECT_EQ(cfg.budget_bytes, 512ull << 20);
  ASSERT_NE(cfg.log_path, nullptr);
  EXPECT_STREQ(cfg.log_path, "/tmp/xlog_c_api_env_test.csv");
  EXPECT_EQ(cfg.cache, 0);
  EXPECT_EQ(cfg.pool_release_threshold, 2ull << 30);

  // A NULL config means "defaults plus environment": sim and the budget.
  ASSERT_EQ(setenv("XLOG_BUDGET_BYTES", "3KiB", 1), 0);
  xlog_runtime* rt = nullptr;
  const xlog_status open = xlog_runtime_open(0, nullptr, &rt);
  unsetenv("XLOG_BACKEND");
  unsetenv("XLOG_BUDGET_BYTES");
  ASSERT_EQ(open, XLOG_OK) << LastError();
  xlog_backend backend = 77;
  XLOG_ASSERT_OK(xlog_runtime_backend(rt, &backend));
  EXPECT_EQ(backend, XLOG_BACKEND_SIM);
  const xlog_stats s = StatsOf(rt);
  EXPECT_EQ(s.budget_limit, 3072u);
  EXPECT_EQ(s.budget_remaining, 3072u);
  Close(rt);
}

// ----- runtime lifecycle -----

TEST(CApiRuntime, OpenBackendStatsClose) {
  xlog_runtime* rt = nullptr;
  xlog_config cfg = SimConfig();
  XLOG_ASSERT_OK(xlog_runtime_open(0, &cfg, &rt));
  ASSERT_NE(rt, nullptr);
  xlog_backend backend = 0;
  XLOG_ASSERT_OK(xlog_runtime_backend(rt, &backend));
  EXPECT_EQ(backend, XLOG_BACKEND_SIM);

  const xlog_stats s = StatsOf(rt);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.peak_outstanding_bytes, 0u);
  EXPECT_EQ(s.budget_limit, 0u) << "no budget layer";
  EXPECT_EQ(s.budget_remaining, UINT64_MAX) << "no budget layer";
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.pending_blocks, 0u);
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.deallocations, 0u);
  EXPECT_EQ(s.failed_allocations, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.cached_blocks, 0u);
  EXPECT_EQ(s.cache_hits, 0u);
  EXPECT_EQ(s.cache_misses, 0u);
  EXPECT_EQ(s.reserved_bytes, 0u);

  XLOG_ASSERT_OK(xlog_runtime_close(rt));
}

TEST(CApiRuntime, SimOpensAreIndependent) {
  // Budgets of whole pages, so that the arena (2 MiB pages) fits in them too.
  xlog_config cfg = SimConfig();
  cfg.budget_bytes = 2 * kPage;
  xlog_runtime* a = OpenSim(cfg);
  cfg.budget_bytes = 4 * kPage;
  xlog_runtime* b = OpenSim(cfg);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  xlog_stream sa = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(a, &sa));
  xlog_block blk;
  XLOG_ASSERT_OK(xlog_allocate(a, 1000, sa, "a", &blk));
  EXPECT_EQ(blk.size, 1000u) << "the handle keeps the caller's size";
  EXPECT_EQ(StatsOf(a).live_bytes, 1024u) << "device bytes: 1000 rounds up to its 1024-byte class";
  EXPECT_EQ(StatsOf(a).budget_limit, 2 * kPage);
  EXPECT_EQ(StatsOf(a).budget_remaining, 2 * kPage - HeldFor(1024)) << "a is charged what it holds";
  ExpectBooksBalance(StatsOf(a));
  EXPECT_EQ(StatsOf(b).live_bytes, 0u) << "b has its own books";
  EXPECT_EQ(StatsOf(b).outstanding_bytes, 0u);
  EXPECT_EQ(StatsOf(b).budget_limit, 4 * kPage);
  EXPECT_EQ(StatsOf(b).budget_remaining, 4 * kPage);
  XLOG_ASSERT_OK(xlog_deallocate(a, blk));
  EXPECT_EQ(StatsOf(a).cached_bytes, HeldFor(1024)) << "freed, a's memory stays held and idle";
  ExpectBooksBalance(StatsOf(a));
  EXPECT_EQ(StatsOf(b).cached_bytes, 0u) << "a's cache is not b's";
  Close(a);
  EXPECT_EQ(StatsOf(b).live_bytes, 0u);
  Close(b);
}

TEST(CApiRuntime, CloseReportCountsLeakedBlocks) {
  xlog_runtime* rt = OpenSim(SimConfig());
  ASSERT_NE(rt, nullptr);
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &s));
  xlog_block a, b, c;
  XLOG_ASSERT_OK(xlog_allocate(rt, 100, s, "leaked_a", &a));
  XLOG_ASSERT_OK(xlog_allocate(rt, 300, s, "leaked_b", &b));
  XLOG_ASSERT_OK(xlog_allocate(rt, 5000, s, "freed", &c));
  XLOG_ASSERT_OK(xlog_deallocate(rt, c));
  EXPECT_EQ(StatsOf(rt).live_bytes, 1024u) << "stats count device bytes: two 512-byte classes";
  std::uint64_t blocks = 0, bytes = 0;
  XLOG_ASSERT_OK(xlog_runtime_close_report(rt, &blocks, &bytes));
  EXPECT_EQ(blocks, 2u);
  EXPECT_EQ(bytes, 400u) << "the leak report names the blocks by their requested sizes (100 + 300)";

  // Either out-pointer may be NULL.
  rt = OpenSim(SimConfig());
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &s));
  XLOG_ASSERT_OK(xlog_allocate(rt, 64, s, nullptr, &a));
  bytes = 0;
  XLOG_ASSERT_OK(xlog_runtime_close_report(rt, nullptr, &bytes));
  EXPECT_EQ(bytes, 64u);
}

#ifdef __linux__
int ThreadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Sim streams are worker threads: closing a runtime must join every one,
// the pooled, the imported and the legacy-default ones alike.
TEST(CApiRuntime, CloseJoinsEveryStreamWorker) {
  const int before = ThreadCount();
  ASSERT_GT(before, 0);
  for (int round = 0; round < 3; ++round) {
    xlog_runtime* rt = OpenSim(SimConfig());
    ASSERT_NE(rt, nullptr);
    xlog_stream a = 0, b = 0, foreign = 0, legacy = 0;
    XLOG_ASSERT_OK(xlog_stream_acquire(rt, &a));
    XLOG_ASSERT_OK(xlog_stream_acquire(rt, &b));
    XLOG_ASSERT_OK(xlog_stream_import(rt, reinterpret_cast<void*>(std::uintptr_t{0x999}), &foreign));
    XLOG_ASSERT_OK(xlog_stream_import(rt, nullptr, &legacy));
    xlog_block x;
    XLOG_ASSERT_OK(xlog_allocate(rt, 1000, a, "x", &x));
    const xlog_use uses[1] = {{x, XLOG_ACCESS_WRITE}};
    XLOG_ASSERT_OK(xlog_prepare_all(rt, foreign, uses, 1));
    XLOG_ASSERT_OK(xlog_finish_all(rt, foreign, uses, 1));
    EXPECT_GE(ThreadCount(), before + 4) << "one worker per stream";
    XLOG_ASSERT_OK(xlog_deallocate(rt, x));
    XLOG_ASSERT_OK(xlog_runtime_close(rt));
    EXPECT_EQ(ThreadCount(), before) << "stream workers outlived the runtime (round " << round << ")";
  }
}
#endif

// ----- streams -----

TEST(CApiStreams, AcquireReleaseNeverReusesIds) {
  xlog_config cfg = SimConfig();
  cfg.stream_pool_size = 3;
  xlog_runtime* rt = OpenSim(cfg);
  ASSERT_NE(rt, nullptr);
  std::set<xlog_stream> seen;
  for (int round = 0; round < 4; ++round) {
    xlog_stream ids[3];
    for (xlog_stream& id : ids) {
      id = 0;
      XLOG_ASSERT_OK(xlog_stream_acquire(rt, &id));
      EXPECT_NE(id, 0u);
      EXPECT_TRUE(seen.insert(id).second) << "stream id " << id << " was issued twice";
    }
    for (xlog_stream id : ids) XLOG_ASSERT_OK(xlog_stream_release(rt, id));
  }
  EXPECT_EQ(seen.size(), 12u);
  Close(rt);
}

TEST(CApiStreams, NativeAndImport) {
  xlog_runtime* rt = OpenSim(SimConfig());
  ASSERT_NE(rt, nullptr);
  xlog_stream a = 0, b = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &a));
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &b));
  void* na = nullptr;
  void* nb = nullptr;
  XLOG_ASSERT_OK(xlog_stream_native(rt, a, &na));
  XLOG_ASSERT_OK(xlog_stream_native(rt, b, &nb));
  EXPECT_NE(na, nullptr);
  EXPECT_NE(na, nb) << "two streams, two native handles";

  // A foreign handle maps to one id until that id is released.
  void* foreign = reinterpret_cast<void*>(std::uintptr_t{0x7000});
  xlog_stream f1 = 0, f2 = 0;
  XLOG_ASSERT_OK(xlog_stream_import(rt, foreign, &f1));
  XLOG_ASSERT_OK(xlog_stream_import(rt, foreign, &f2));
  EXPECT_NE(f1, 0u);
  EXPECT_EQ(f1, f2);
  EXPECT_NE(f1, a);
  EXPECT_NE(f1, b);
  void* nf = nullptr;
  XLOG_ASSERT_OK(xlog_stream_native(rt, f1, &nf));
  EXPECT_NE(nf, nullptr);

  // The legacy default stream (NULL) is importable too.
  xlog_stream legacy = 0;
  XLOG_ASSERT_OK(xlog_stream_import(rt, nullptr, &legacy));
  EXPECT_NE(legacy, 0u);
  EXPECT_NE(legacy, f1);

  XLOG_ASSERT_OK(xlog_stream_release(rt, f1));
  xlog_stream f3 = 0;
  XLOG_ASSERT_OK(xlog_stream_import(rt, foreign, &f3));
  EXPECT_NE(f3, f1) << "ids are never reused";

  // Blocks can live on imported streams.
  xlog_block blk;
  XLOG_ASSERT_OK(xlog_allocate(rt, 512, f3, "imported", &blk));
  EXPECT_EQ(blk.stream, f3);
  XLOG_ASSERT_OK(xlog_deallocate(rt, blk));
  XLOG_ASSERT_OK(xlog_drain(rt, nullptr));
  Close(rt);
}

struct Flag {
  std::atomic<int> value{0};
};

void SleepThenSet(void* user) {
  SleepMs(60);
  static_cast<Flag*>(user)->value.store(1);
}

void CopyFlag(void* user) {
  auto* pair = static_cast<std::pair<Flag*, Flag*>*>(user);
  pair->second->value.store(pair->first->value.load() + 10);
}

TEST(CApiStreams, ImportingOwnNativeHandleSharesTheStream) {
  xlog_runtime* rt = OpenSim(SimConfig());
  ASSERT_NE(rt, nullptr);
  xlog_stream a = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &a));
  void* native = nullptr;
  XLOG_ASSERT_OK(xlog_stream_native(rt, a, &native));
  xlog_stream alias = 0;
  XLOG_ASSERT_OK(xlog_stream_import(rt, native, &alias));
  EXPECT_NE(alias, a) << "an import gets its own id";
  void* alias_native = nullptr;
  XLOG_ASSERT_OK(xlog_stream_native(rt, alias, &alias_native));
  EXPECT_EQ(alias_native, native);

  // Same underlying stream: work on the alias runs after work on `a`.
  Flag first, second;
  std::pair<Flag*, Flag*> link(&first, &second);
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt, a, SleepThenSet, &first));
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt, alias, CopyFlag, &link));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt, alias));
  EXPECT_EQ(second.value.load(), 11) << "alias work ran before the earlier work on the same stream";
  Close(rt);
}

TEST(CApiStreams, SynchronizeWaitsForQueuedWork) {
  xlog_runtime* rt = OpenSim(SimConfig());
  ASSERT_NE(rt, nullptr);
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &s));
  Flag flag;
  const auto start = std::chrono::steady_clock::now();
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt, s, SleepThenSet, &flag));
  EXPECT_EQ(flag.value.load(), 0) << "enqueue_host must not run the callback inline";
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt, s));
  EXPECT_EQ(flag.value.load(), 1);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(55));
  // Synchronizing an idle stream returns at once.
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt, s));
  Close(rt);
}

struct OrderLog {
  std::mutex mu;
  std::vector<int> order;
  std::thread::id first_thread;
  bool one_thread = true;
};

struct OrderItem {
  OrderLog* log;
  int index;
};

void AppendIndex(void* user) {
  auto* item = static_cast<OrderItem*>(user);
  std::lock_guard<std::mutex> lock(item->log->mu);
  if (item->log->order.empty()) {
    item->log->first_thread = std::this_thread::get_id();
  } else if (item->log->first_thread != std::this_thread::get_id()) {
    item->log->one_thread = false;
  }
  item->log->order.push_back(item->index);
}

TEST(CApiStreams, EnqueueHostRunsInStreamOrderOffTheCallingThread) {
  xlog_runtime* rt = OpenSim(SimConfig());
  ASSERT_NE(rt, nullptr);
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &s));
  OrderLog log;
  std::vector<OrderItem> items(200);
  for (int i = 0; i < 200; ++i) {
    items[i] = OrderItem{&log, i};
    XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt, s, AppendIndex, &items[i]));
  }
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt, s));
  ASSERT_EQ(log.order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(log.order[i], i);
  EXPECT_NE(log.first_thread, std::this_thread::get_id());
  EXPECT_TRUE(log.one_thread);
  Close(rt);
}

TEST(CApiStreams, ReleasedStreamStillRunsQueuedWork) {
  xlog_runtime* rt = OpenSim(SimConfig());
  ASSERT_NE(rt, nullptr);
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &s));
  Flag flag;
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt, s, SleepThenSet, &flag));
  XLOG_ASSERT_OK(xlog_stream_release(rt, s));
  for (int i = 0; i < 200 && flag.value.load() == 0; ++i) SleepMs(5);
  EXPECT_EQ(flag.value.load(), 1) << "work queued before release was dropped";
  Close(rt);
}

// ----- blocks -----

// The default runtime: async allocator, cache on. Byte counts are device
// bytes: sizes round up to size classes (512-byte steps up to 8 KiB, then
// sixteen classes per power of two); a handle's `size` stays the request.
class CApiBlocks : public SimRuntimeTest {};

// The driver pool's mechanics (per-stream caches of whole blocks, pending
// frees, reap), whatever the default memory is; the arena's are in
// c_api_arena_test.cpp.
class CApiPoolBlocks : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override { cfg.memory = XLOG_MEMORY_POOL; }
};

// The same runtime with `cache = 0`: the seed's free-to-driver behaviour (a
// free is queued on the allocation stream, its bytes pending until a reap
// sees it complete), sizes rounded up to 256 bytes.
class CApiBlocksNoCache : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override { cfg.cache = 0; }
};

TEST_F(CApiBlocks, AllocateGivesAlignedWritableBlockAndCountsIt) {
  xlog_block b = Allocate(1000, "alloc_test");
  ASSERT_NE(b.ptr, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.ptr) % 256, 0u);
  EXPECT_EQ(b.size, 1000u) << "the handle keeps the caller's size";
  EXPECT_NE(b.generation, 0u);
  EXPECT_EQ(b.stream, stream_);
  EXPECT_EQ(b.device, 0);
  // Sim memory is host memory: every byte is writable and keeps its value.
  std::memset(b.ptr, 0xC3, 1000);
  EXPECT_EQ(static_cast<unsigned char*>(b.ptr)[999], 0xC3);

  xlog_block c = Allocate(1);
  EXPECT_EQ(c.size, 1u);
  EXPECT_NE(c.generation, b.generation);
  // The blocks do not overlap, not even in their rounded-up device bytes.
  const auto pb = reinterpret_cast<std::uintptr_t>(b.ptr);
  const auto pc = reinterpret_cast<std::uintptr_t>(c.ptr);
  EXPECT_TRUE(pc >= pb + 1024 || pc + 512 <= pb) << "blocks overlap";

  // 1000 → its 1024-byte class, 1 → the smallest class, 512 (the arena
  // rounds to 512 bytes too). The pool holds the two blocks, the arena the
  // page they were carved from.
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 1024u + 512u);
  EXPECT_EQ(s.outstanding_bytes, HeldFor(1536));
  EXPECT_EQ(s.peak_outstanding_bytes, HeldFor(1536));
  EXPECT_EQ(s.reserved_bytes, s.outstanding_bytes) << "on sim, reserved is what xlog holds";
  ExpectBooksBalance(s);
  EXPECT_EQ(s.live_blocks, 2u);
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.failed_allocations, 0u);
  if (DefaultMemoryIsPool()) {
    EXPECT_EQ(s.cache_misses, 2u) << "nothing was cached yet: both came from the driver";
    EXPECT_EQ(s.cache_hits, 0u);
  } else {
    EXPECT_EQ(s.cache_misses, 1u) << "the first block maps a page";
    EXPECT_EQ(s.cache_hits, 1u) << "the second lies in the page already mapped";
  }

  XLOG_ASSERT_OK(xlog_block_validate(rt_, b));
  XLOG_ASSERT_OK(xlog_block_validate(rt_, c));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, c));
  // Freed into the stream's cache (the pool) or free range (the arena):
  // still held, still charged, all of it idle.
  s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, HeldFor(1536));
  if (DefaultMemoryIsPool()) {
    EXPECT_EQ(s.cached_blocks, 2u);
  }
  EXPECT_EQ(s.outstanding_bytes, HeldFor(1536));
  ExpectBooksBalance(s);
  std::uint64_t released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, HeldFor(1536));
  EXPECT_EQ(StatsOf(rt_).outstanding_bytes, 0u);
}

TEST_F(CApiBlocks, BlockOutlivesItsReleasedAllocationStream) {
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &s));
  xlog_block b;
  XLOG_ASSERT_OK(xlog_allocate(rt_, 2048, s, "orphan", &b));
  XLOG_ASSERT_OK(xlog_stream_release(rt_, s));
  // The handle stays valid and usable from other streams; its free still
  // goes to the (released) allocation stream's cache.
  XLOG_ASSERT_OK(xlog_block_validate(rt_, b));
  XLOG_ASSERT_OK(xlog_prepare(rt_, b, stream_, XLOG_ACCESS_WRITE));
  XLOG_ASSERT_OK(xlog_finish(rt_, b, stream_, XLOG_ACCESS_WRITE));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  xlog_stats st = StatsOf(rt_);
  EXPECT_EQ(st.cached_bytes, HeldFor(2048));
  EXPECT_EQ(st.outstanding_bytes, HeldFor(2048));
  ExpectBooksBalance(st);
  std::uint64_t drained = 12345;
  XLOG_ASSERT_OK(xlog_drain(rt_, &drained));
  EXPECT_EQ(drained, 0u) << "drain retires pending frees only, and nothing is pending";
  // Another stream can take the memory (ordered after the orphan stream).
  xlog_block again = Allocate(2048, "adopter");
  EXPECT_EQ(again.ptr, b.ptr);
  EXPECT_NE(again.generation, b.generation);
  EXPECT_EQ(StatsOf(rt_).cache_hits, 1u);
  EXPECT_EQ(StatsOf(rt_).outstanding_bytes, HeldFor(2048)) << "the adopter took the held memory";
  XLOG_EXPECT_STATUS(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(rt_, b));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, again));
  std::uint64_t released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, HeldFor(2048));
  st = StatsOf(rt_);
  EXPECT_EQ(st.outstanding_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, 0u);
  EXPECT_EQ(st.pending_bytes, 0u);
}

TEST_F(CApiBlocksNoCache, BlockOutlivesItsReleasedAllocationStream) {
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &s));
  xlog_block b;
  XLOG_ASSERT_OK(xlog_allocate(rt_, 2048, s, "orphan", &b));
  XLOG_ASSERT_OK(xlog_stream_release(rt_, s));
  // Without the cache the free is queued on the released stream, which
  // still runs it.
  XLOG_ASSERT_OK(xlog_block_validate(rt_, b));
  XLOG_ASSERT_OK(xlog_prepare(rt_, b, stream_, XLOG_ACCESS_WRITE));
  XLOG_ASSERT_OK(xlog_finish(rt_, b, stream_, XLOG_ACCESS_WRITE));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  std::uint64_t drained = 0;
  XLOG_ASSERT_OK(xlog_drain(rt_, &drained));
  EXPECT_EQ(drained, 2048u);
  EXPECT_EQ(StatsOf(rt_).outstanding_bytes, 0u);
}

TEST_F(CApiBlocks, DeviceOrdinalIsRecordedInHandles) {
  xlog_config cfg = SimConfig();
  cfg.sim_devices = 4;  // sim ordinal 3 exists only with 4 sim devices
  xlog_runtime* rt3 = OpenSim(cfg, 3);
  ASSERT_NE(rt3, nullptr);
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt3, &s));
  xlog_block b;
  XLOG_ASSERT_OK(xlog_allocate(rt3, 256, s, "dev3", &b));
  EXPECT_EQ(b.device, 3);
  XLOG_ASSERT_OK(xlog_block_validate(rt3, b));
  XLOG_ASSERT_OK(xlog_deallocate(rt3, b));
  Close(rt3);
}

// With the cache on, a free is not a driver free: the bytes move from live
// to cached, stay charged, and no reap or drain retires them; only trim
// hands them back (and then waits for and retires that free).
TEST_F(CApiPoolBlocks, FreeMovesBytesToTheCacheUntilTrimmed) {
  xlog_block b = Allocate(4096);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, 4096u);
  EXPECT_EQ(s.cached_blocks, 1u);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.pending_blocks, 0u);
  EXPECT_EQ(s.outstanding_bytes, 4096u) << "a free does not change outstanding = live + cached + pending";
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.deallocations, 1u);

  // reap and drain retire pending frees only: the cached block stays.
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, stream_));
  std::uint64_t got = 12345;
  XLOG_ASSERT_OK(xlog_reap(rt_, &got));
  EXPECT_EQ(got, 0u);
  got = 12345;
  XLOG_ASSERT_OK(xlog_drain(rt_, &got));
  EXPECT_EQ(got, 0u);
  const xlog_stats after_drain = StatsOf(rt_);
  ExpectStatsUnchanged(s, after_drain);

  // trim hands exactly the cached bytes back and retires them.
  std::uint64_t released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, 4096u);
  s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.cached_blocks, 0u);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.pending_blocks, 0u);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.peak_outstanding_bytes, 4096u);
  // Nothing left: reap (with a NULL out-pointer), drain and trim report nothing.
  XLOG_ASSERT_OK(xlog_reap(rt_, nullptr));
  got = 12345;
  XLOG_ASSERT_OK(xlog_drain(rt_, &got));
  EXPECT_EQ(got, 0u);
  released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, 0u);
}

TEST_F(CApiBlocksNoCache, FreeMovesBytesToPendingUntilReaped) {
  xlog_block b = Allocate(4096);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.pending_bytes, 4096u);
  EXPECT_EQ(s.outstanding_bytes, 4096u);
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.pending_blocks, 1u);
  EXPECT_EQ(s.deallocations, 1u);
  EXPECT_EQ(s.cached_bytes, 0u) << "cache = 0 caches nothing";
  EXPECT_EQ(s.cached_blocks, 0u);

  // reap never blocks; once the stream has passed the free, a reap retires it.
  std::uint64_t total = 0, got = 12345;
  XLOG_ASSERT_OK(xlog_reap(rt_, &got));
  EXPECT_TRUE(got == 0 || got == 4096) << got;
  total += got;
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, stream_));
  got = 12345;
  XLOG_ASSERT_OK(xlog_reap(rt_, &got));
  total += got;
  EXPECT_EQ(total, 4096u);
  s = StatsOf(rt_);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.pending_blocks, 0u);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.peak_outstanding_bytes, 4096u);
  // Nothing left: reap (with a NULL out-pointer) and drain report nothing.
  XLOG_ASSERT_OK(xlog_reap(rt_, nullptr));
  got = 12345;
  XLOG_ASSERT_OK(xlog_drain(rt_, &got));
  EXPECT_EQ(got, 0u);
  // ...and trim has nothing cached to hand back.
  got = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &got));
  EXPECT_EQ(got, 0u);
}

void SleepOnly(void* user) { SleepMs(*static_cast<int*>(user)); }

TEST_F(CApiBlocksNoCache, DrainWaitsForQueuedFrees) {
  int delay = 150;
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, SleepOnly, &delay));
  xlog_block a = Allocate(1000);  // 1024 device bytes (256-byte steps)
  xlog_block b = Allocate(3000);  // 3072
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  std::uint64_t reaped = 12345;
  XLOG_ASSERT_OK(xlog_reap(rt_, &reaped));
  EXPECT_EQ(reaped, 0u) << "the stream is still sleeping, so nothing can have completed";
  EXPECT_EQ(StatsOf(rt_).pending_bytes, 4096u);
  std::uint64_t drained = 0;
  XLOG_ASSERT_OK(xlog_drain(rt_, &drained));
  EXPECT_EQ(drained, 4096u);
  const xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.deallocations, 2u);
}

void SleepLongThenSet(void* user) {
  SleepMs(250);
  static_cast<Flag*>(user)->value.store(1);
}

// trim queues the cached blocks' frees on their stream and waits for them:
// behind a sleeping stream it returns only once the stream got there.
TEST_F(CApiPoolBlocks, TrimWaitsForTheFreesItQueues) {
  Flag slept;
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, SleepLongThenSet, &slept));
  xlog_block a = Allocate(1000);  // class 1024
  xlog_block b = Allocate(3000);  // class 3072
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes, 4096u);
  EXPECT_EQ(s.pending_bytes, 0u);
  std::uint64_t drained = 12345;
  XLOG_ASSERT_OK(xlog_drain(rt_, &drained));
  EXPECT_EQ(drained, 0u) << "drain does not touch the cache";
  EXPECT_EQ(slept.value.load(), 0)
      << "nothing was pending, so drain must not have waited for the sleeping stream";
  std::uint64_t released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(slept.value.load(), 1) << "trim returned before the stream reached the frees it queued";
  EXPECT_EQ(released, 4096u);
  s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.deallocations, 2u);
}

TEST_F(CApiBlocks, ZeroByteBlockIsNullFreshAndFreesOnce) {
  xlog_block a = Allocate(64);
  xlog_block z = Allocate(0, "empty");
  EXPECT_EQ(z.ptr, nullptr);
  EXPECT_EQ(z.size, 0u);
  EXPECT_NE(z.generation, 0u);
  EXPECT_GT(z.generation, a.generation) << "generations come from one increasing counter";
  xlog_block z2 = Allocate(0);
  EXPECT_NE(z2.generation, z.generation);
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 512u) << "0-byte blocks charge nothing (64 bytes take the 512-byte class)";
  EXPECT_EQ(s.allocations, 3u);
  XLOG_ASSERT_OK(xlog_block_validate(rt_, z));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, z));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, z2));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes, HeldFor(512)) << "a 0-byte free adds nothing to what is held";
  if (DefaultMemoryIsPool()) {
    EXPECT_EQ(s.cached_blocks, 1u) << "a 0-byte free caches nothing";
  }
  EXPECT_EQ(s.pending_blocks, 0u);
  EXPECT_EQ(s.deallocations, 3u);
  ExpectBooksBalance(s);
  std::uint64_t released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, HeldFor(512));
}

TEST_F(CApiBlocksNoCache, ZeroByteBlockIsNullFreshAndFreesOnce) {
  xlog_block a = Allocate(64);
  xlog_block z = Allocate(0, "empty");
  EXPECT_EQ(z.ptr, nullptr);
  EXPECT_NE(z.generation, 0u);
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 256u) << "0-byte blocks charge nothing (64 bytes round up to 256)";
  XLOG_ASSERT_OK(xlog_deallocate(rt_, z));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  s = StatsOf(rt_);
  EXPECT_EQ(s.pending_bytes, 256u);
  EXPECT_EQ(s.pending_blocks, 1u) << "a 0-byte free leaves nothing pending";
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

TEST_F(CApiBlocks, PrepareFinishSingleAndAllSucceed) {
  xlog_stream other = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &other));
  xlog_block a = Allocate(256);
  xlog_block b = Allocate(512);
  for (xlog_access acc : {XLOG_ACCESS_READ, XLOG_ACCESS_WRITE, XLOG_ACCESS_READ_WRITE}) {
    XLOG_ASSERT_OK(xlog_prepare(rt_, a, other, acc));
    XLOG_ASSERT_OK(xlog_finish(rt_, a, other, acc));
    XLOG_ASSERT_OK(xlog_prepare(rt_, a, stream_, acc));
    XLOG_ASSERT_OK(xlog_finish(rt_, a, stream_, acc));
  }
  const xlog_use uses[2] = {{a, XLOG_ACCESS_READ}, {b, XLOG_ACCESS_WRITE}};
  XLOG_ASSERT_OK(xlog_prepare_all(rt_, other, uses, 2));
  XLOG_ASSERT_OK(xlog_finish_all(rt_, other, uses, 2));
  // An empty launch is fine, even with a NULL array.
  XLOG_ASSERT_OK(xlog_prepare_all(rt_, other, nullptr, 0));
  XLOG_ASSERT_OK(xlog_finish_all(rt_, other, nullptr, 0));
  // The same block twice in one launch is fine.
  const xlog_use twice[2] = {{a, XLOG_ACCESS_READ}, {a, XLOG_ACCESS_READ_WRITE}};
  XLOG_ASSERT_OK(xlog_prepare_all(rt_, stream_, twice, 2));
  XLOG_ASSERT_OK(xlog_finish_all(rt_, stream_, twice, 2));
  // Tracking does not change byte accounting (both take the 512-byte class).
  const xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 1024u);
  EXPECT_EQ(s.live_blocks, 2u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, a));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
  EXPECT_EQ(StatsOf(rt_).outstanding_bytes, HeldFor(1024)) << "both blocks' memory stays held, idle";
  std::uint64_t released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, HeldFor(1024));
  EXPECT_EQ(StatsOf(rt_).outstanding_bytes, 0u);
}

TEST_F(CApiBlocks, FaultInjectionArmsAndDisarms) {
  // Blocks of a whole page each: nothing is cached or free, so every
  // allocation is one driver allocation (the pool's cuMemAllocAsync, the
  // arena's page creation), whichever the memory.
  const std::uint64_t size = kPage;
  // Arm the 2nd allocation, then disarm before it happens.
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_ALLOC, 2));
  xlog_block a = Allocate(size);
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_ALLOC, 0));
  xlog_block b = Allocate(size);
  EXPECT_EQ(StatsOf(rt_).failed_allocations, 0u);
  // Armed for the 2nd: the first succeeds, the second fails, the third succeeds.
  XLOG_ASSERT_OK(xlog_sim_inject_fault(rt_, XLOG_FAULT_ALLOC, 2));
  xlog_block c = Allocate(size);
  xlog_block d;
  EXPECT_EQ(xlog_allocate(rt_, size, stream_, "faulted", &d), XLOG_ERR_DRIVER);
  ExpectBooksBalance(StatsOf(rt_));
  EXPECT_EQ(StatsOf(rt_).live_bytes, 3 * size) << "the failed allocation holds nothing";
  xlog_block e = Allocate(size);
  EXPECT_EQ(StatsOf(rt_).failed_allocations, 1u);
  EXPECT_EQ(StatsOf(rt_).cache_misses, 4u) << "the four blocks the driver served (the failed one is no miss)";
  for (const xlog_block& blk : {a, b, c, e}) XLOG_ASSERT_OK(xlog_deallocate(rt_, blk));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

// ----- the cache -----

// The driver pool's per-stream cache of whole blocks (docs/caching.md):
// these pin the pool, whatever the default memory is.
class CApiCache : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override { cfg.memory = XLOG_MEMORY_POOL; }
};

TEST_F(CApiCache, SameStreamReuseIsTheSameAddressWithANewGeneration) {
  xlog_block old_block = Allocate(4096, "old");
  std::memset(old_block.ptr, 0x7E, 4096);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, old_block));
  const xlog_stats freed = StatsOf(rt_);
  EXPECT_EQ(freed.cached_bytes, 4096u);

  xlog_block reused = Allocate(4096, "new");
  EXPECT_EQ(reused.ptr, old_block.ptr) << "the stream's own cache serves the same size at once";
  EXPECT_EQ(reused.size, 4096u);
  EXPECT_EQ(reused.stream, stream_);
  EXPECT_GT(reused.generation, old_block.generation) << "a cache hit is a new block: fresh generation";
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.cache_misses, 1u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.live_bytes, 4096u);
  EXPECT_EQ(s.outstanding_bytes, 4096u) << "a hit takes nothing new from the driver";
  EXPECT_EQ(s.allocations, 2u);

  // The old handle died at the free, although its address is live again.
  const xlog_stats before = StatsOf(rt_);
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(rt_, old_block));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_deallocate(rt_, old_block));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_prepare(rt_, old_block, stream_, XLOG_ACCESS_WRITE));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_finish(rt_, old_block, stream_, XLOG_ACCESS_WRITE));
  ExpectStatsUnchanged(before, StatsOf(rt_));
  XLOG_ASSERT_OK(xlog_block_validate(rt_, reused));

  // A request of another size in the same class is served by it too, and
  // the handle carries that request.
  XLOG_ASSERT_OK(xlog_deallocate(rt_, reused));
  xlog_block smaller = Allocate(4000);
  EXPECT_EQ(smaller.ptr, old_block.ptr);
  EXPECT_EQ(smaller.size, 4000u);
  EXPECT_EQ(StatsOf(rt_).live_bytes, 4096u);
  EXPECT_EQ(StatsOf(rt_).cache_hits, 2u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, smaller));
}

// A request takes a cached block at most 9/8 of its own class
// (docs/caching.md): a 4096-byte block serves 4000 (class 4096) but not
// 3584 (class 3584; 4096 > 9/8 × 3584) nor 1000.
TEST_F(CApiCache, ABlockMuchLargerThanTheRequestIsNotHandedOut) {
  // First a 64 KiB live peak, so that the hoarding bound (live peak + 1/16)
  // leaves the 4096-byte block in the cache while the misses below grow.
  xlog_block peak = Allocate(64 << 10);
  xlog_block big = Allocate(4096);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, big));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, peak));
  std::uint64_t released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 4096, &released));
  ASSERT_EQ(released, 64u << 10) << "trim gives back the largest block first";
  ASSERT_EQ(StatsOf(rt_).cached_bytes, 4096u);

  xlog_block small = Allocate(1000);
  xlog_block mid = Allocate(3584);
  EXPECT_NE(small.ptr, big.ptr);
  EXPECT_NE(mid.ptr, big.ptr);
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.cache_hits, 0u);
  EXPECT_EQ(s.cache_misses, 4u);
  EXPECT_EQ(s.cached_bytes, 4096u);
  EXPECT_EQ(s.live_bytes, 1024u + 3584u);
  xlog_block fits = Allocate(4000);
  EXPECT_EQ(fits.ptr, big.ptr);
  EXPECT_EQ(StatsOf(rt_).cache_hits, 1u);
  for (const xlog_block& b : {small, mid, fits}) XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
}

// The hoarding bound (docs/caching.md): a workload whose sizes keep
// changing does not keep every size it ever freed. Before a miss grows
// what xlog holds past twice the live peak, cold cached blocks go back to
// the driver (down to the live peak plus 1/16).
TEST_F(CApiCache, SizesThatKeepChangingDoNotPileUpInTheCache) {
  std::uint64_t sum = 0;
  for (std::uint64_t i = 1; i <= 20; ++i) {
    xlog_block b = Allocate(i * 8192);
    sum += i * 8192;
    XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
    const xlog_stats s = StatsOf(rt_);
    const std::uint64_t held = s.live_bytes + s.cached_bytes;
    EXPECT_LE(held, 2 * i * 8192) << "step " << i << ": " << Describe(s);
  }
  xlog_stats s = StatsOf(rt_);
  EXPECT_GE(s.cached_bytes, 20u * 8192) << "the last (largest) block stays cached";
  EXPECT_LT(s.cached_bytes, sum / 4) << "without the bound every size would still be cached";
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
  s = StatsOf(rt_);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.outstanding_bytes, s.cached_bytes);
}

// trim releases largest first until at most keep_bytes stay cached, and
// reports exactly the cached bytes it handed back; the budget drops by them.
TEST_F(CApiCache, TrimReportsExactlyTheCachedBytes) {
  xlog_runtime* rt = nullptr;
  xlog_config cfg = SimConfig();
  cfg.budget_bytes = 4 << 20;
  cfg.memory = XLOG_MEMORY_POOL;
  XLOG_ASSERT_OK(xlog_runtime_open(0, &cfg, &rt));
  xlog_stream s = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &s));
  xlog_block a, b, c;
  XLOG_ASSERT_OK(xlog_allocate(rt, 1000, s, "a", &a));       // class 1024
  XLOG_ASSERT_OK(xlog_allocate(rt, 3000, s, "b", &b));       // class 3072
  XLOG_ASSERT_OK(xlog_allocate(rt, 600 << 10, s, "c", &c));  // class 622592 (608 KiB)
  const std::uint64_t total = 1024 + 3072 + 622592;
  EXPECT_EQ(StatsOf(rt).live_bytes, total);
  for (const xlog_block& blk : {a, b, c}) XLOG_ASSERT_OK(xlog_deallocate(rt, blk));
  xlog_stats st = StatsOf(rt);
  EXPECT_EQ(st.cached_bytes, total);
  EXPECT_EQ(st.cached_blocks, 3u);
  EXPECT_EQ(st.budget_remaining, (4u << 20) - total) << "cached bytes stay charged";

  // Everything fits under keep_bytes: nothing goes back.
  std::uint64_t released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt, total, &released));
  EXPECT_EQ(released, 0u);
  EXPECT_EQ(StatsOf(rt).cached_bytes, total);

  // Keep 4096: the 608 KiB block goes, the two small ones stay.
  released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt, 4096, &released));
  EXPECT_EQ(released, 622592u);
  st = StatsOf(rt);
  EXPECT_EQ(st.cached_bytes, 4096u);
  EXPECT_EQ(st.cached_blocks, 2u);
  EXPECT_EQ(st.pending_bytes, 0u) << "trim waits for its frees and retires them";
  EXPECT_EQ(st.outstanding_bytes, 4096u);
  EXPECT_EQ(st.budget_remaining, (4u << 20) - 4096u);

  // Keep 2000: the largest left (3072) goes; 1024 ≤ 2000 stays.
  released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt, 2000, &released));
  EXPECT_EQ(released, 3072u);
  EXPECT_EQ(StatsOf(rt).cached_bytes, 1024u);

  released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt, 0, &released));
  EXPECT_EQ(released, 1024u);
  st = StatsOf(rt);
  EXPECT_EQ(st.cached_bytes, 0u);
  EXPECT_EQ(st.cached_blocks, 0u);
  EXPECT_EQ(st.outstanding_bytes, 0u);
  EXPECT_EQ(st.reserved_bytes, 0u);
  EXPECT_EQ(st.budget_remaining, 4u << 20);
  EXPECT_EQ(st.peak_outstanding_bytes, total);

  // Live blocks are never trimmed.
  xlog_block live;
  XLOG_ASSERT_OK(xlog_allocate(rt, 4096, s, "live", &live));
  released = 12345;
  XLOG_ASSERT_OK(xlog_trim(rt, 0, &released));
  EXPECT_EQ(released, 0u);
  XLOG_ASSERT_OK(xlog_block_validate(rt, live));
  EXPECT_EQ(StatsOf(rt).live_bytes, 4096u);
  XLOG_ASSERT_OK(xlog_deallocate(rt, live));
  Close(rt);
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

// A block cached on stream A handed to stream B: B is made to wait (on the
// stream, not the host) for everything A queued before the free.
TEST_F(CApiCache, CrossStreamReuseIsOrderedAfterTheFree) {
  xlog_stream a = 0, b = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &a));
  XLOG_ASSERT_OK(xlog_stream_acquire(rt_, &b));
  xlog_block x;
  XLOG_ASSERT_OK(xlog_allocate(rt_, 8192, a, "x", &x));
  Gate gate;  // A's last use of x ends 150 ms from now
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, a, SleepThenOpen, &gate));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, x));

  xlog_block y;
  XLOG_ASSERT_OK(xlog_allocate(rt_, 8192, b, "y", &y));
  EXPECT_EQ(gate.opened.load(), 0) << "a cross-stream hand-out must not wait on the host";
  EXPECT_EQ(y.ptr, x.ptr) << "A's cached block serves B";
  EXPECT_EQ(y.stream, b);
  const xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.cached_bytes, 0u);

  // Work queued on B after the hand-out runs after A's work.
  Observation seen{&gate};
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, b, Observe, &seen));
  XLOG_ASSERT_OK(xlog_stream_synchronize(rt_, b));
  EXPECT_EQ(seen.seen.load(), 1) << "B used the memory before A's work on it was done";
  XLOG_ASSERT_OK(xlog_deallocate(rt_, y));
}

// cache = 0 in the config: frees go to the driver, nothing is ever a hit,
// and sizes round up to 256 bytes instead of size classes.
TEST_F(CApiBlocksNoCache, CacheOffFreesToTheDriverAndRoundsTo256) {
  xlog_block a = Allocate(1000);
  xlog_block b = Allocate(1);
  xlog_block c = Allocate(4096);
  EXPECT_EQ(a.size, 1000u);
  EXPECT_EQ(b.size, 1u);
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 1024u + 256u + 4096u);
  for (const xlog_block& blk : {a, b, c}) XLOG_ASSERT_OK(xlog_deallocate(rt_, blk));
  s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.cached_blocks, 0u);
  EXPECT_EQ(s.pending_bytes, 1024u + 256u + 4096u) << "every free was queued to the driver";
  EXPECT_EQ(s.pending_blocks, 3u);
  EXPECT_EQ(s.outstanding_bytes, s.pending_bytes);
  std::uint64_t drained = 0;
  XLOG_ASSERT_OK(xlog_drain(rt_, &drained));
  EXPECT_EQ(drained, 1024u + 256u + 4096u);
  xlog_block again = Allocate(4096);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, again));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
  s = StatsOf(rt_);
  EXPECT_EQ(s.cache_hits, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.outstanding_bytes, 0u);
}

// An imported stream may be destroyed by its owner once released: its
// cache goes back to the driver at the release.
TEST_F(CApiCache, ReleasingAnImportedStreamGivesItsCacheBack) {
  xlog_stream foreign = 0;
  XLOG_ASSERT_OK(xlog_stream_import(rt_, reinterpret_cast<void*>(std::uintptr_t{0x5150}), &foreign));
  xlog_block b;
  XLOG_ASSERT_OK(xlog_allocate(rt_, 8192, foreign, "imported", &b));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, b));
  EXPECT_EQ(StatsOf(rt_).cached_bytes, 8192u);
  XLOG_ASSERT_OK(xlog_stream_release(rt_, foreign));
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes, 0u) << "the released stream's cache was kept";
  EXPECT_EQ(s.cached_blocks, 0u);
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
  s = StatsOf(rt_);
  EXPECT_EQ(s.outstanding_bytes, 0u);
  EXPECT_EQ(s.pending_bytes, 0u);
}

// Budget pressure, cache off (the seed's semantics): pending frees count
// against the budget until reaped; with wait_on_pressure the allocation
// waits for them instead of failing.
class CApiBudgetPressure : public SimRuntimeTest {
 protected:
  void Configure(xlog_config& cfg) override {
    cfg.budget_bytes = 1 << 20;
    cfg.wait_on_pressure = wait_;
    cfg.cache = cache_;
  }
  std::uint8_t wait_ = 0;
  std::uint8_t cache_ = 0;
};

TEST_F(CApiBudgetPressure, PendingBytesStayChargedUntilTheFreeCompletes) {
  int delay = 150;
  xlog_block big = Allocate(1 << 20);
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, SleepOnly, &delay));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, big));
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.pending_bytes, 1u << 20);
  EXPECT_EQ(s.budget_remaining, 0u);
  xlog_block again;
  XLOG_EXPECT_STATUS(XLOG_ERR_OUT_OF_BUDGET, xlog_allocate(rt_, 1 << 19, stream_, "t", &again));
  const std::string msg = LastError();
  EXPECT_NE(msg.find("pending 1048576"), std::string::npos) << msg;
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
  again = Allocate(1 << 20);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, again));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

class CApiBudgetWaits : public CApiBudgetPressure {
 protected:
  void Configure(xlog_config& cfg) override {
    wait_ = 1;
    CApiBudgetPressure::Configure(cfg);
  }
};

TEST_F(CApiBudgetWaits, WaitOnPressureWaitsForPendingFrees) {
  int delay = 80;
  xlog_block big = Allocate(1 << 20);
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, SleepOnly, &delay));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, big));
  const auto start = std::chrono::steady_clock::now();
  xlog_block again = Allocate(1 << 20);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40))
      << "the allocation could only fit after the pending free completed";
  const xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 1u << 20);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.budget_remaining, 0u);
  EXPECT_EQ(s.failed_allocations, 0u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, again));
  XLOG_ASSERT_OK(xlog_drain(rt_, nullptr));
}

// Budget pressure with the cache on: cached bytes are charged, a hit needs
// no budget, and an allocation the cache cannot serve first hands cached
// blocks back to the driver.
// (The pool's cache: pinned. The arena's pages under a budget are in
// c_api_arena_test.cpp.)
class CApiCachePressure : public CApiBudgetPressure {
 protected:
  void Configure(xlog_config& cfg) override {
    cache_ = 1;
    CApiBudgetPressure::Configure(cfg);
    cfg.memory = XLOG_MEMORY_POOL;
  }
};

TEST_F(CApiCachePressure, CachedBytesStayChargedAndAHitNeedsNoBudgetNorWait) {
  Flag slept;
  xlog_block big = Allocate(1 << 20);
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, SleepLongThenSet, &slept));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, big));
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes, 1u << 20);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.budget_remaining, 0u) << "cached memory is still held from the driver";
  // The whole budget is cached, the stream is busy: the same size is still
  // served at once, from the cache.
  xlog_block again = Allocate(1 << 20);
  EXPECT_EQ(slept.value.load(), 0) << "the hit waited for the stream";
  EXPECT_EQ(again.ptr, big.ptr);
  s = StatsOf(rt_);
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.failed_allocations, 0u);
  EXPECT_EQ(s.live_bytes, 1u << 20);
  EXPECT_EQ(s.budget_remaining, 0u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, again));
  std::uint64_t released = 0;
  XLOG_ASSERT_OK(xlog_trim(rt_, 0, &released));
  EXPECT_EQ(released, 1u << 20);
  EXPECT_EQ(StatsOf(rt_).budget_remaining, 1u << 20) << "trim retired what it released";
}

TEST_F(CApiCachePressure, PressureHandsCachedBlocksBackBeforeRefusing) {
  int delay = 150;
  xlog_block big = Allocate(1 << 20);
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, SleepOnly, &delay));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, big));
  EXPECT_EQ(StatsOf(rt_).cached_bytes, 1u << 20);
  // 512 KiB: the cached 1 MiB block is too large to serve it, the budget is
  // full. The cached block goes back to the driver, but its free is queued
  // behind the sleeping stream, so without wait_on_pressure: refused.
  xlog_block half;
  XLOG_EXPECT_STATUS(XLOG_ERR_OUT_OF_BUDGET, xlog_allocate(rt_, 1 << 19, stream_, "half", &half));
  const std::string msg = LastError();
  EXPECT_NE(msg.find("requested 524288 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cached 0,"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pending 1048576"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limit 1048576"), std::string::npos) << msg;
  xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.pending_bytes, 1u << 20);
  EXPECT_EQ(s.failed_allocations, 1u);
  std::uint64_t drained = 0;
  XLOG_ASSERT_OK(xlog_drain(rt_, &drained));
  EXPECT_EQ(drained, 1u << 20);
  EXPECT_EQ(StatsOf(rt_).budget_remaining, 1u << 20);
  half = Allocate(1 << 19);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, half));
}

class CApiCacheWaits : public CApiBudgetPressure {
 protected:
  void Configure(xlog_config& cfg) override {
    cache_ = 1;
    wait_ = 1;
    CApiBudgetPressure::Configure(cfg);
    cfg.memory = XLOG_MEMORY_POOL;
  }
};

TEST_F(CApiCacheWaits, WaitOnPressureWaitsForTheCacheItHandedBack) {
  int delay = 100;
  xlog_block big = Allocate(1 << 20);
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(rt_, stream_, SleepOnly, &delay));
  XLOG_ASSERT_OK(xlog_deallocate(rt_, big));
  const auto start = std::chrono::steady_clock::now();
  xlog_block half = Allocate(1 << 19);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50))
      << "the allocation could only fit after the cached block's free completed";
  const xlog_stats s = StatsOf(rt_);
  EXPECT_EQ(s.live_bytes, 1u << 19);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_EQ(s.budget_remaining, 1u << 19);
  EXPECT_EQ(s.failed_allocations, 0u);
  XLOG_ASSERT_OK(xlog_deallocate(rt_, half));
}

}  // namespace
