// Calls into xlog from inside a host callback (xlog_stream_enqueue_host), and
// closing a runtime while callbacks are queued or running: the same rule on
// both backends, and this same file checks it on both.
//
//   host_callback_test sim    run by ctest everywhere (cpp_tests/)
//   cuda_host_callback_test   the same program built in cpp_tests/cuda/ with
//                             the CUDA backend as its default; run by ctest
//                             and gpu-check's sanitizers where a GPU is;
//                             exits 77 (skip) without one unless
//                             XLOG_REQUIRE_GPU=1
//
// The rule: every xlog call made from inside a host callback returns
// XLOG_ERR_STREAM_MISUSE with a message that says why, and changes nothing
// (the hooks: NULL from malloc, nothing freed); xlog_version,
// xlog_status_name and xlog_last_error_message keep working. A close from
// another thread waits for the callbacks already queued or running before
// it frees anything.
//
// Each of the paths that used to hang (issue 17.1) has its own case: drain
// with a free queued behind the callback, close with a live block, an
// allocation that would wait on budget pressure for a free queued behind
// the callback, and close while another thread synchronizes the callback's
// stream. A watchdog turns a hang into a failure.
//
// Output follows the CUDA tests' convention (PASS/FAIL lines, then
// "N passed, N failed"), so scripts/gpu-check reads it like theirs.

#include <xlog_cuda.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

int g_passed = 0;
int g_failed = 0;
xlog_backend g_backend = XLOG_BACKEND_SIM;

void check(bool ok, const std::string& name, const std::string& detail = "") {
  if (ok) {
    ++g_passed;
    std::printf("PASS: %s\n", name.c_str());
  } else {
    ++g_failed;
    std::printf("FAIL: %s%s%s\n", name.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  }
  std::fflush(stdout);
}

int summary() {
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  std::fflush(stdout);
  return g_failed == 0 ? 0 : 1;
}

[[noreturn]] void die(const std::string& what) {
  ++g_failed;
  std::printf("FAIL: %s\n", what.c_str());
  summary();
  std::exit(1);
}

std::string last_message() {
  const size_t length = xlog_last_error_message(nullptr, 0);
  std::string text(length + 1, '\0');
  xlog_last_error_message(&text[0], text.size());
  text.resize(length);
  return text;
}

std::string describe(xlog_status status) {
  std::string text = xlog_status_name(status);
  if (status != XLOG_OK) text += ": " + last_message();
  return text;
}

void ok_or_die(xlog_status status, const char* what) {
  if (status != XLOG_OK) die(std::string(what) + " -> " + describe(status));
}
#define OK_OR_DIE(expr) ok_or_die((expr), #expr)

// A hang is a failure: if `seconds` pass before the guard is dropped, report
// and exit (a deadlocked test cannot be unwound).
class Watchdog {
 public:
  Watchdog(std::string what, int seconds) : what_(std::move(what)) {
    thread_ = std::thread([this, seconds] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
        std::printf("FAIL: %s: no progress within %d s (deadlock)\n", what_.c_str(), seconds);
        ++g_failed;
        summary();
        std::_Exit(1);
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// A one-shot signal with a bounded wait, so that a callback held at a gate
// cannot block its stream forever when a test fails.
class Signal {
 public:
  void set() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      set_ = true;
    }
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds limit = 20000ms) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, limit, [this] { return set_; });
  }
  bool is_set() {
    std::lock_guard<std::mutex> lock(mutex_);
    return set_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool set_ = false;
};

// Host callbacks run a std::function handed over through `user`.
void run_function(void* user) { (*static_cast<std::function<void()>*>(user))(); }

void enqueue(xlog_runtime* rt, xlog_stream s, std::function<void()>* fn) {
  OK_OR_DIE(xlog_stream_enqueue_host(rt, s, run_function, fn));
}

// What one call made from a callback returned, and this thread's message
// right after it.
struct Outcome {
  std::string call;
  xlog_status status = -1;
  std::string message;
};

Outcome outcome(const char* call, xlog_status status) { return Outcome{call, status, last_message()}; }

// A refused call: STREAM_MISUSE, and a message naming the call and saying
// that it came from a host callback.
void expect_refused(const Outcome& o, const std::string& where) {
  const bool named = o.message.rfind(o.call + ":", 0) == 0;
  const bool says_why = o.message.find("host callback") != std::string::npos;
  check(o.status == XLOG_ERR_STREAM_MISUSE && named && says_why, where + ": " + o.call + " is refused",
        std::string("got ") + xlog_status_name(o.status) + ": " + o.message);
}

xlog_config config(uint64_t budget, bool wait_on_pressure) {
  xlog_config cfg;
  xlog_config_init(&cfg);
  cfg.struct_size = sizeof(xlog_config);  // a malformed XLOG_* must not matter here
  cfg.backend = g_backend;
  cfg.allocator = XLOG_ALLOCATOR_ASYNC;
  cfg.budget_bytes = budget;
  cfg.stream_pool_size = 8;
  cfg.log_path = nullptr;
  cfg.sim_capacity_bytes = 64ull << 20;
  cfg.wait_on_pressure = wait_on_pressure ? 1 : 0;
  // cfg.memory stays xlog_config_init's (XLOG_MEMORY, else the arena):
  // ctest runs this program under both memories. Budgets are whole 2 MiB
  // pages (what the arena maps and charges), byte counts are read from the
  // runtime's own stats.
  return cfg;
}

constexpr uint64_t kPage = 2ull << 20;

xlog_runtime* open_runtime(uint64_t budget = 0, bool wait_on_pressure = false) {
  const xlog_config cfg = config(budget, wait_on_pressure);
  xlog_runtime* rt = nullptr;
  OK_OR_DIE(xlog_runtime_open(0, &cfg, &rt));
  return rt;
}

xlog_stream acquire(xlog_runtime* rt) {
  xlog_stream s = 0;
  OK_OR_DIE(xlog_stream_acquire(rt, &s));
  return s;
}

xlog_block allocate(xlog_runtime* rt, uint64_t bytes, xlog_stream s, const char* tag) {
  xlog_block b{};
  OK_OR_DIE(xlog_allocate(rt, bytes, s, tag, &b));
  return b;
}

xlog_stats stats(xlog_runtime* rt) {
  xlog_stats s{};
  s.struct_size = sizeof s;
  OK_OR_DIE(xlog_get_stats(rt, &s));
  return s;
}

bool same_stats(const xlog_stats& a, const xlog_stats& b) {
  return a.live_bytes == b.live_bytes && a.live_blocks == b.live_blocks && a.pending_bytes == b.pending_bytes &&
         a.pending_blocks == b.pending_blocks && a.allocations == b.allocations &&
         a.deallocations == b.deallocations && a.failed_allocations == b.failed_allocations &&
         a.budget_remaining == b.budget_remaining;
}

std::string text_of(const xlog_stats& s) {
  return "live " + std::to_string(s.live_bytes) + " B in " + std::to_string(s.live_blocks) + ", pending " +
         std::to_string(s.pending_bytes) + " B in " + std::to_string(s.pending_blocks) + ", allocations " +
         std::to_string(s.allocations) + ", deallocations " + std::to_string(s.deallocations) + ", failed " +
         std::to_string(s.failed_allocations);
}

void close_expect(xlog_runtime* rt, uint64_t leaked_blocks, const std::string& name) {
  uint64_t blocks = 0, bytes = 0;
  const xlog_status status = xlog_runtime_close_report(rt, &blocks, &bytes);
  check(status == XLOG_OK && blocks == leaked_blocks, name,
        describe(status) + ", " + std::to_string(blocks) + " leaked blocks, expected " +
            std::to_string(leaked_blocks));
}

// ---------------------------------------------------------------------------

void noop_callback(void*) {}

// Every entry point, called from inside a callback: refused, and nothing
// changed afterwards.
void every_call_is_refused_inside_a_callback() {
  const std::string name = "every call from a callback";
  Watchdog watchdog(name, 60);
  xlog_runtime* rt = open_runtime(2 * kPage);
  const xlog_stream s = acquire(rt);
  const xlog_stream other = acquire(rt);
  const xlog_block block = allocate(rt, 4096, s, "held");
  const xlog_stats before = stats(rt);

  std::vector<Outcome> refused;
  std::vector<std::string> problems;
  void* torch_ptr = reinterpret_cast<void*>(1);
  void* cupy_ptr = reinterpret_cast<void*>(1);
  std::string torch_message, torch_free_message, cupy_message, live_blocks_message, after_ok_message;
  uint64_t live_hook_blocks = 99;
  xlog_runtime* opened = nullptr;
  xlog_runtime* interop = nullptr;
  xlog_stream acquired = 0, imported = 0;
  Signal done;
  std::function<void()> body = [&] {
    const xlog_use use{block, XLOG_ACCESS_READ};
    xlog_block out{};
    xlog_stats st{};
    xlog_backend backend = 0;
    uint64_t reclaimed = 0, leaked_blocks = 0, leaked_bytes = 0;
    void* native = nullptr;
    xlog_config cfg = config(0, false);
    refused.push_back(outcome("xlog_allocate", xlog_allocate(rt, 256, s, "from-callback", &out)));
    refused.push_back(outcome("xlog_deallocate", xlog_deallocate(rt, block)));
    refused.push_back(outcome("xlog_block_validate", xlog_block_validate(rt, block)));
    refused.push_back(outcome("xlog_prepare", xlog_prepare(rt, block, other, XLOG_ACCESS_WRITE)));
    refused.push_back(outcome("xlog_finish", xlog_finish(rt, block, other, XLOG_ACCESS_WRITE)));
    refused.push_back(outcome("xlog_prepare_all", xlog_prepare_all(rt, other, &use, 1)));
    refused.push_back(outcome("xlog_finish_all", xlog_finish_all(rt, other, &use, 1)));
    refused.push_back(outcome("xlog_reap", xlog_reap(rt, &reclaimed)));
    refused.push_back(outcome("xlog_drain", xlog_drain(rt, &reclaimed)));
    refused.push_back(outcome("xlog_get_stats", xlog_get_stats(rt, &st)));
    refused.push_back(outcome("xlog_runtime_backend", xlog_runtime_backend(rt, &backend)));
    refused.push_back(outcome("xlog_stream_acquire", xlog_stream_acquire(rt, &acquired)));
    refused.push_back(outcome("xlog_stream_release", xlog_stream_release(rt, other)));
    refused.push_back(outcome("xlog_stream_import", xlog_stream_import(rt, reinterpret_cast<void*>(0x7000), &imported)));
    refused.push_back(outcome("xlog_stream_native", xlog_stream_native(rt, other, &native)));
    refused.push_back(outcome("xlog_stream_synchronize", xlog_stream_synchronize(rt, s)));
    refused.push_back(outcome("xlog_stream_synchronize", xlog_stream_synchronize(rt, other)));
    refused.push_back(outcome("xlog_stream_enqueue_host", xlog_stream_enqueue_host(rt, other, noop_callback, nullptr)));
    refused.push_back(outcome("xlog_runtime_open", xlog_runtime_open(0, &cfg, &opened)));
    refused.push_back(outcome("xlog_runtime_close", xlog_runtime_close(rt)));
    refused.push_back(outcome("xlog_runtime_close_report", xlog_runtime_close_report(rt, &leaked_blocks, &leaked_bytes)));
    refused.push_back(outcome("xlog_config_from_env", xlog_config_from_env(&cfg)));
    refused.push_back(outcome("xlog_interop_configure", xlog_interop_configure(0, &cfg)));
    refused.push_back(outcome("xlog_interop_runtime", xlog_interop_runtime(0, &interop)));
    refused.push_back(outcome("xlog_torch_record_stream", xlog_torch_record_stream(block.ptr, 0, nullptr)));
    torch_ptr = xlog_torch_malloc(256, 0, nullptr);
    torch_message = last_message();
    xlog_torch_free(block.ptr, 4096, 0, nullptr);
    torch_free_message = last_message();
    cupy_ptr = xlog_cupy_malloc(nullptr, 256, 0);
    cupy_message = last_message();
    live_hook_blocks = xlog_interop_live_blocks(0);
    live_blocks_message = last_message();
    // What does work from a callback: the functions that touch no runtime.
    if (std::strcmp(xlog_status_name(XLOG_ERR_STREAM_MISUSE), "XLOG_ERR_STREAM_MISUSE") != 0) {
      problems.push_back("xlog_status_name does not work from a callback");
    }
    if (xlog_version() == nullptr || xlog_version()[0] == '\0') problems.push_back("xlog_version is empty");
    done.set();
  };
  enqueue(rt, s, &body);
  if (!done.wait()) die(name + ": the callback did not finish");

  for (const Outcome& o : refused) expect_refused(o, name);
  check(torch_ptr == nullptr && torch_message.rfind("xlog_torch_malloc:", 0) == 0 &&
            torch_message.find("host callback") != std::string::npos,
        name + ": xlog_torch_malloc returns NULL with the reason", torch_message);
  check(torch_free_message.rfind("xlog_torch_free:", 0) == 0 &&
            torch_free_message.find("host callback") != std::string::npos,
        name + ": xlog_torch_free frees nothing and says why", torch_free_message);
  check(cupy_ptr == nullptr && cupy_message.find("host callback") != std::string::npos,
        name + ": xlog_cupy_malloc returns NULL with the reason", cupy_message);
  check(live_hook_blocks == 0 && live_blocks_message.find("host callback") != std::string::npos,
        name + ": xlog_interop_live_blocks says why", live_blocks_message);
  check(problems.empty(), name + ": version and status names work from a callback",
        problems.empty() ? "" : problems.front());
  check(opened == nullptr && interop == nullptr && acquired == 0 && imported == 0,
        name + ": refused calls wrote no out-pointer");

  // Nothing changed: the same numbers, the block still live, both streams
  // still usable, the runtime still open (the refused close did nothing).
  const xlog_stats after = stats(rt);
  check(same_stats(before, after), name + ": stats unchanged", text_of(before) + " vs " + text_of(after));
  const xlog_status valid = xlog_block_validate(rt, block);
  check(valid == XLOG_OK, name + ": the block is still live", describe(valid));
  const xlog_status synced = xlog_stream_synchronize(rt, other);
  check(synced == XLOG_OK, name + ": the other stream is still acquired", describe(synced));
  OK_OR_DIE(xlog_deallocate(rt, block));
  OK_OR_DIE(xlog_stream_release(rt, other));
  OK_OR_DIE(xlog_stream_release(rt, s));
  close_expect(rt, 0, name + ": the runtime closes normally afterwards");
}

// Issue 17.1, path 1: drain with a free queued behind the running callback
// used to wait for that free, which waits for the callback.
void drain_with_a_free_behind_the_callback() {
  const std::string name = "drain from a callback, free queued behind it";
  Watchdog watchdog(name, 30);
  xlog_runtime* rt = open_runtime();
  const xlog_stream s = acquire(rt);
  const xlog_block block = allocate(rt, 1 << 16, s, "freed-behind");
  const uint64_t held = stats(rt).outstanding_bytes;  // the block (pool), its page (arena)
  check(held >= (1 << 16), name + ": the block is held", std::to_string(held) + " bytes");
  Signal gate, done;
  Outcome drained;
  std::function<void()> body = [&] {
    gate.wait();
    uint64_t reclaimed = 0;
    drained = outcome("xlog_drain", xlog_drain(rt, &reclaimed));
    done.set();
  };
  enqueue(rt, s, &body);
  OK_OR_DIE(xlog_deallocate(rt, block));  // queued on s behind the callback
  gate.set();
  if (!done.wait()) die(name + ": the callback did not finish");
  expect_refused(drained, name);
  // The free went to the stream's cache (the arena: its mapped page, idle;
  // with the cache off, to the driver): a drain and a trim from this
  // thread give back all that was held.
  uint64_t reclaimed = 0, trimmed = 0;
  OK_OR_DIE(xlog_drain(rt, &reclaimed));
  OK_OR_DIE(xlog_trim(rt, 0, &trimmed));
  reclaimed += trimmed;
  check(reclaimed == held, name + ": a drain from this thread then reclaims the free",
        std::to_string(reclaimed) + " of " + std::to_string(held) + " bytes");
  check(stats(rt).outstanding_bytes == 0, name + ": nothing is held afterwards");
  OK_OR_DIE(xlog_stream_release(rt, s));
  close_expect(rt, 0, name + ": close");
}

// Issue 17.1, path 2: closing from a callback while a block is live on
// its stream used to free the block on that stream and wait for itself.
void close_from_a_callback_with_a_live_block() {
  const std::string name = "close from a callback, live block on its stream";
  Watchdog watchdog(name, 30);
  xlog_runtime* rt = open_runtime();
  const xlog_stream s = acquire(rt);
  const xlog_block block = allocate(rt, 4096, s, "live");
  Signal done;
  Outcome closed, closed_report;
  std::function<void()> body = [&] {
    closed = outcome("xlog_runtime_close", xlog_runtime_close(rt));
    uint64_t blocks = 0, bytes = 0;
    closed_report = outcome("xlog_runtime_close_report", xlog_runtime_close_report(rt, &blocks, &bytes));
    done.set();
  };
  enqueue(rt, s, &body);
  if (!done.wait()) die(name + ": the callback did not finish");
  expect_refused(closed, name);
  expect_refused(closed_report, name);
  OK_OR_DIE(xlog_stream_synchronize(rt, s));
  const xlog_status valid = xlog_block_validate(rt, block);
  check(valid == XLOG_OK, name + ": the runtime is still open with its block", describe(valid));
  close_expect(rt, 1, name + ": a close from this thread then frees the block");
}

// Issue 17.1, path 3: an allocation under budget pressure with
// wait_on_pressure used to wait for a pending free queued behind the
// callback it was made from.
void allocation_waiting_on_pressure_from_a_callback() {
  const std::string name = "allocation on budget pressure from a callback";
  Watchdog watchdog(name, 30);
  const uint64_t budget = kPage;
  xlog_runtime* rt = open_runtime(budget, true);
  const xlog_stream s = acquire(rt);
  const xlog_block full = allocate(rt, budget, s, "fills-the-budget");
  Signal gate, done;
  Outcome allocated;
  xlog_block out{};
  std::function<void()> body = [&] {
    gate.wait();
    allocated = outcome("xlog_allocate", xlog_allocate(rt, budget, s, "under-pressure", &out));
    done.set();
  };
  enqueue(rt, s, &body);
  OK_OR_DIE(xlog_deallocate(rt, full));  // pending behind the callback
  const xlog_stats before = stats(rt);
  gate.set();
  if (!done.wait()) die(name + ": the callback did not finish");
  expect_refused(allocated, name);
  const xlog_stats after = stats(rt);
  check(same_stats(before, after) && out.generation == 0, name + ": nothing allocated, nothing counted",
        text_of(before) + " vs " + text_of(after));
  xlog_block again{};
  const xlog_status status = xlog_allocate(rt, budget, s, "after", &again);
  check(status == XLOG_OK, name + ": the same allocation from this thread waits for the free and succeeds",
        describe(status));
  if (status == XLOG_OK) OK_OR_DIE(xlog_deallocate(rt, again));
  OK_OR_DIE(xlog_stream_release(rt, s));
  close_expect(rt, 0, name + ": close");
}

// Issue 17.1, path 4: a close from a callback while another thread waits
// in xlog_stream_synchronize on the callback's stream: the close used to
// wait for that thread, which waits for the callback.
void close_from_a_callback_while_another_thread_synchronizes() {
  const std::string name = "close from a callback during a synchronize";
  Watchdog watchdog(name, 30);
  xlog_runtime* rt = open_runtime();
  const xlog_stream s = acquire(rt);
  Signal gate, done, sync_started;
  Outcome closed;
  std::function<void()> body = [&] {
    gate.wait();
    closed = outcome("xlog_runtime_close", xlog_runtime_close(rt));
    done.set();
  };
  enqueue(rt, s, &body);
  xlog_status synchronized = -1;
  std::thread waiter([&] {
    sync_started.set();
    synchronized = xlog_stream_synchronize(rt, s);
  });
  sync_started.wait();
  std::this_thread::sleep_for(50ms);  // let it block in the synchronize
  gate.set();
  if (!done.wait()) die(name + ": the callback did not finish");
  waiter.join();
  expect_refused(closed, name);
  check(synchronized == XLOG_OK, name + ": the synchronize returns", xlog_status_name(synchronized));
  OK_OR_DIE(xlog_stream_release(rt, s));
  close_expect(rt, 0, name + ": close");
}

// A close from another thread while one callback runs and another is queued
// behind it: the close waits for both before it frees the live block (which
// the callbacks may still use), and neither side deadlocks.
void close_waits_for_queued_and_running_callbacks() {
  const std::string name = "close while callbacks run";
  Watchdog watchdog(name, 30);
  xlog_runtime* rt = open_runtime();
  const xlog_stream s = acquire(rt);
  const xlog_stream t = acquire(rt);
  allocate(rt, 4096, t, "used-by-the-callbacks");  // live on another stream
  Signal gate, first_running;
  std::atomic<int> sequence{0};
  std::atomic<int> first_done{-1}, second_done{-1}, close_done{-1};
  std::atomic<xlog_status> first_call{-1};
  std::function<void()> first = [&] {
    first_running.set();
    gate.wait();
    first_call = xlog_reap(rt, nullptr);  // the runtime is closing: still refused
    first_done = sequence++;
  };
  std::function<void()> second = [&] { second_done = sequence++; };
  enqueue(rt, s, &first);
  enqueue(rt, s, &second);
  first_running.wait();
  uint64_t leaked = 0;
  xlog_status closed = -1;
  std::thread closer([&] {
    closed = xlog_runtime_close_report(rt, &leaked, nullptr);
    close_done = sequence++;
  });
  std::this_thread::sleep_for(200ms);
  check(close_done.load() == -1, name + ": the close waits while a callback runs");
  gate.set();
  closer.join();
  check(closed == XLOG_OK && leaked == 1, name + ": the close succeeds and frees the live block",
        std::string(xlog_status_name(closed)) + ", " + std::to_string(leaked) + " leaked");
  check(first_done.load() >= 0 && second_done.load() > first_done.load() &&
            close_done.load() > second_done.load(),
        name + ": both callbacks ran before the close returned",
        "order first " + std::to_string(first_done.load()) + ", second " + std::to_string(second_done.load()) +
            ", close " + std::to_string(close_done.load()));
  check(first_call.load() == XLOG_ERR_STREAM_MISUSE, name + ": a call from the running callback is refused",
        xlog_status_name(first_call.load()));
}

}  // namespace

// The backend when none is named on the command line: cuda/ builds this
// file with "cuda", so scripts/gpu-check's sanitizer runs (which pass no
// arguments) check the CUDA backend.
#ifndef XLOG_HOST_CALLBACK_TEST_BACKEND
#define XLOG_HOST_CALLBACK_TEST_BACKEND "sim"
#endif

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : XLOG_HOST_CALLBACK_TEST_BACKEND;
  if (backend == "cuda") {
    g_backend = XLOG_BACKEND_CUDA;
  } else if (backend != "sim") {
    std::fprintf(stderr, "usage: %s [sim|cuda]\n", argv[0]);
    return 2;
  }
  if (g_backend == XLOG_BACKEND_CUDA) {
    const xlog_config cfg = config(0, false);
    xlog_runtime* rt = nullptr;
    const xlog_status status = xlog_runtime_open(0, &cfg, &rt);
    if (status == XLOG_ERR_NO_DEVICE) {
      const char* require = std::getenv("XLOG_REQUIRE_GPU");
      if (require != nullptr && require[0] != '\0' && std::strcmp(require, "0") != 0) {
        die("XLOG_REQUIRE_GPU is set but there is no CUDA device: " + last_message());
      }
      std::printf("SKIP: no CUDA device: %s\n", last_message().c_str());
      return 77;
    }
    OK_OR_DIE(status);
    OK_OR_DIE(xlog_runtime_close(rt));
  }
  std::printf("host callback rule on the %s backend (xlog %s)\n", backend.c_str(), xlog_version());
  every_call_is_refused_inside_a_callback();
  drain_with_a_free_behind_the_callback();
  close_from_a_callback_with_a_live_block();
  allocation_waiting_on_pressure_from_a_callback();
  close_from_a_callback_while_another_thread_synchronizes();
  close_waits_for_queued_and_running_callbacks();
  return summary();
}
