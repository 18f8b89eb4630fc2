// Two devices in one process through the C ABI, on the sim backend
// (sim_devices = 2): one runtime per device, a block of device 0 used by a
// stream of device 1 once xlog_enable_peer_access has paired them, a free
// on device 0 that waits for device 1's reader, budgets and stats per
// device, handles refused by the other device's runtime, and a pair
// without peer capability (xlog_sim_deny_peer_access) refused with
// XLOG_ERR_UNSATISFIABLE_DEPENDENCY naming both devices.
//
// Host callbacks stand in for kernels; a gate holds one back so the test
// can show that an order really holds.
#include "c_api_test_util.h"

#include <atomic>
#include <string>

namespace {

using namespace xlog_test;

struct Gate {
  std::atomic<bool> open{false};
};

struct Read {
  Gate* gate;
  const std::uint64_t* src;
  std::atomic<std::uint64_t> seen{0};
};

void GatedRead(void* user) {
  auto* r = static_cast<Read*>(user);
  while (!r->gate->open.load(std::memory_order_acquire)) SleepMs(1);
  r->seen.store(*r->src, std::memory_order_release);
}

struct Write {
  Gate* gate;
  std::uint64_t* dst;
  std::uint64_t value;
  std::atomic<bool> done{false};
};

void GatedWrite(void* user) {
  auto* w = static_cast<Write*>(user);
  while (!w->gate->open.load(std::memory_order_acquire)) SleepMs(1);
  *w->dst = w->value;
  w->done.store(true, std::memory_order_release);
}

bool Contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

class TwoDevices : public ::testing::Test {
 protected:
  void SetUp() override {
    xlog_config cfg = SimConfig();
    cfg.sim_devices = 2;
    cfg.sim_capacity_bytes = 64u << 20;
    cfg.budget_bytes = budget0_;
    XLOG_ASSERT_OK(xlog_runtime_open(0, &cfg, &d0_));
    cfg.budget_bytes = budget1_;
    XLOG_ASSERT_OK(xlog_runtime_open(1, &cfg, &d1_));
    XLOG_ASSERT_OK(xlog_stream_acquire(d0_, &s0_));
    XLOG_ASSERT_OK(xlog_stream_acquire(d1_, &s1_));
  }
  void TearDown() override {
    Close(d0_);
    Close(d1_);
  }
  void Pair() { XLOG_ASSERT_OK(xlog_enable_peer_access(d0_, d1_)); }

  // Whole pages (the arena charges 2 MiB pages), so that the numbers are
  // the same under either memory.
  std::uint64_t budget0_ = kPage;
  std::uint64_t budget1_ = 4 * kPage;
  xlog_runtime* d0_ = nullptr;
  xlog_runtime* d1_ = nullptr;
  xlog_stream s0_ = 0;
  xlog_stream s1_ = 0;
};

TEST(MultiDeviceOpen, OrdinalPastTheSimDeviceCountIsNoDevice) {
  xlog_config cfg = SimConfig();
  EXPECT_EQ(cfg.sim_devices, 1u) << "one sim device by default";
  xlog_runtime* rt = nullptr;
  XLOG_EXPECT_REJECTED(XLOG_ERR_NO_DEVICE, xlog_runtime_open(1, &cfg, &rt));
  EXPECT_TRUE(Contains(LastError(), "1 device(s)")) << LastError();
  EXPECT_EQ(rt, nullptr);
  cfg.sim_devices = 2;
  XLOG_EXPECT_REJECTED(XLOG_ERR_NO_DEVICE, xlog_runtime_open(2, &cfg, &rt));
  EXPECT_TRUE(Contains(LastError(), "2 device(s)")) << LastError();
  rt = OpenSim(cfg, 1);
  Close(rt);
}

TEST(MultiDeviceOpen, SimDevicesComesFromTheEnvironment) {
  setenv("XLOG_SIM_DEVICES", "3", 1);
  xlog_config cfg;
  std::memset(&cfg, 0, sizeof cfg);
  XLOG_EXPECT_STATUS(XLOG_OK, xlog_config_from_env(&cfg));
  EXPECT_EQ(cfg.sim_devices, 3u);
  setenv("XLOG_SIM_DEVICES", "zero", 1);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_config_from_env(&cfg));
  EXPECT_TRUE(Contains(LastError(), "XLOG_SIM_DEVICES")) << LastError();
  unsetenv("XLOG_SIM_DEVICES");
}

TEST_F(TwoDevices, DeviceOneReadsWhatDeviceZeroWroteAndTheFreeWaitsForIt) {
  Pair();
  xlog_block x{};
  XLOG_ASSERT_OK(xlog_allocate(d0_, 4096, s0_, "x", &x));
  EXPECT_EQ(x.device, 0);
  auto* cell = static_cast<std::uint64_t*>(x.ptr);
  *cell = 1;

  // Device 0 writes 42, held back by a gate.
  Gate write_gate;
  Write w{&write_gate, cell, 42};
  XLOG_ASSERT_OK(xlog_prepare(d0_, x, s0_, XLOG_ACCESS_WRITE));
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(d0_, s0_, GatedWrite, &w));
  XLOG_ASSERT_OK(xlog_finish(d0_, x, s0_, XLOG_ACCESS_WRITE));

  // Device 1 reads it (on the block's runtime, with device 1's stream),
  // itself held back by a second gate.
  Gate read_gate;
  Read r{&read_gate, cell};
  const xlog_use read_x{x, XLOG_ACCESS_READ};
  XLOG_ASSERT_OK(xlog_prepare_all(d0_, s1_, &read_x, 1));
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(d1_, s1_, GatedRead, &r));
  XLOG_ASSERT_OK(xlog_finish_all(d0_, s1_, &read_x, 1));
  read_gate.open = true;
  SleepMs(30);
  EXPECT_EQ(r.seen.load(), 0u) << "device 1 read before device 0's write";
  read_gate.open = false;

  // Device 0 frees x; the cache hands its memory to y on the same stream,
  // and y's writer must wait for device 1's read.
  write_gate.open = true;
  XLOG_ASSERT_OK(xlog_deallocate(d0_, x));
  xlog_block y{};
  XLOG_ASSERT_OK(xlog_allocate(d0_, 4096, s0_, "y", &y));
  ASSERT_EQ(y.ptr, x.ptr) << "the stream's cache reuses x's memory";
  Gate open_gate;
  open_gate.open = true;
  Write overwrite{&open_gate, static_cast<std::uint64_t*>(y.ptr), 99};
  XLOG_ASSERT_OK(xlog_stream_enqueue_host(d0_, s0_, GatedWrite, &overwrite));
  SleepMs(40);
  EXPECT_FALSE(overwrite.done.load()) << "x's next owner wrote while device 1 still read x";
  read_gate.open = true;
  XLOG_ASSERT_OK(xlog_stream_synchronize(d0_, s0_));
  XLOG_ASSERT_OK(xlog_stream_synchronize(d1_, s1_));
  EXPECT_EQ(r.seen.load(), 42u);
  EXPECT_TRUE(overwrite.done.load());
  XLOG_ASSERT_OK(xlog_deallocate(d0_, y));
}

TEST_F(TwoDevices, BudgetsAndStatsAreIndependent) {
  Pair();
  xlog_block a{}, b{}, over{};
  XLOG_ASSERT_OK(xlog_allocate(d0_, kPage, s0_, "a", &a));
  XLOG_EXPECT_REJECTED(XLOG_ERR_OUT_OF_BUDGET, xlog_allocate(d0_, kPage, s0_, "over", &over));
  XLOG_ASSERT_OK(xlog_allocate(d1_, 3 * kPage, s1_, "b", &b));
  const xlog_stats st0 = StatsOf(d0_), st1 = StatsOf(d1_);
  EXPECT_EQ(st0.budget_limit, kPage);
  EXPECT_EQ(st1.budget_limit, 4 * kPage);
  EXPECT_EQ(st0.live_bytes, kPage);
  EXPECT_EQ(st1.live_bytes, 3 * kPage);
  EXPECT_EQ(st0.failed_allocations, 1u);
  EXPECT_EQ(st1.failed_allocations, 0u);
  EXPECT_EQ(st1.budget_remaining, kPage);
  ExpectBooksBalance(st0);
  ExpectBooksBalance(st1);
  XLOG_ASSERT_OK(xlog_deallocate(d0_, a));
  XLOG_ASSERT_OK(xlog_deallocate(d1_, b));
}

TEST_F(TwoDevices, HandlesOfDeviceZeroAreRefusedByDeviceOneNamingBoth) {
  Pair();
  xlog_block x{};
  XLOG_ASSERT_OK(xlog_allocate(d0_, 4096, s0_, "x", &x));
  const xlog_stats before = StatsOf(d1_);
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_deallocate(d1_, x));
  EXPECT_TRUE(Contains(LastError(), "device 0") && Contains(LastError(), "device 1")) << LastError();
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_prepare(d1_, x, s1_, XLOG_ACCESS_READ));
  EXPECT_TRUE(Contains(LastError(), "device 0") && Contains(LastError(), "device 1")) << LastError();
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_block_validate(d1_, x));
  ExpectStatsUnchanged(before, StatsOf(d1_));
  XLOG_EXPECT_STATUS(XLOG_OK, xlog_block_validate(d0_, x));

  // Stale across devices: device 0 says stale, device 1 names the owner.
  XLOG_ASSERT_OK(xlog_deallocate(d0_, x));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(d0_, x));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_prepare(d0_, x, s1_, XLOG_ACCESS_READ));
  XLOG_EXPECT_REJECTED(XLOG_ERR_USE_AFTER_FREE, xlog_finish(d0_, x, s1_, XLOG_ACCESS_READ));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_block_validate(d1_, x));
  EXPECT_TRUE(Contains(LastError(), "device 0") && Contains(LastError(), "device 1")) << LastError();
}

TEST_F(TwoDevices, NoPeerAccessIsAnUnsatisfiableDependencyNamingBothDevices) {
  xlog_block x{};
  XLOG_ASSERT_OK(xlog_allocate(d0_, 4096, s0_, "x", &x));
  // Not paired yet.
  XLOG_EXPECT_REJECTED(XLOG_ERR_UNSATISFIABLE_DEPENDENCY, xlog_prepare(d0_, x, s1_, XLOG_ACCESS_READ));
  EXPECT_TRUE(Contains(LastError(), "device 0") && Contains(LastError(), "device 1")) << LastError();
  // A pair without peer capability cannot be paired.
  XLOG_ASSERT_OK(xlog_sim_deny_peer_access(d0_, d1_));
  XLOG_EXPECT_REJECTED(XLOG_ERR_UNSATISFIABLE_DEPENDENCY, xlog_enable_peer_access(d0_, d1_));
  EXPECT_TRUE(Contains(LastError(), "device 0") && Contains(LastError(), "device 1")) << LastError();
  const xlog_use use{x, XLOG_ACCESS_WRITE};
  XLOG_EXPECT_REJECTED(XLOG_ERR_UNSATISFIABLE_DEPENDENCY, xlog_finish_all(d0_, s1_, &use, 1));
  XLOG_ASSERT_OK(xlog_deallocate(d0_, x));
}

TEST_F(TwoDevices, EnablePeerAccessChecksItsArguments) {
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_enable_peer_access(nullptr, d1_));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_enable_peer_access(d0_, nullptr));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_enable_peer_access(d0_, d0_));
  XLOG_ASSERT_OK(xlog_enable_peer_access(d0_, d1_));
  XLOG_ASSERT_OK(xlog_enable_peer_access(d1_, d0_));  // once per pair; again is fine
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_sim_deny_peer_access(d0_, nullptr));
}

}  // namespace
