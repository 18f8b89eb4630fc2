// Releasing and closing, as a hostile caller tries them (issue 25, sim
// backend): a stream that takes part in a capture is neither released nor
// closed under, and the close report names the streams never released,
// through the C ABI and the C++ wrapper.
#include "c_api_test_util.h"

#include <xlog/runtime.hpp>

#include <string>

namespace {

using namespace xlog_test;

xlog_config PoolOf(std::uint32_t streams) {
  xlog_config cfg = SimConfig();
  cfg.stream_pool_size = streams;
  return cfg;
}

void* NativeOf(xlog_runtime* rt, xlog_stream s) {
  void* native = nullptr;
  EXPECT_EQ(xlog_stream_native(rt, s, &native), XLOG_OK) << LastError();
  return native;
}

std::uint64_t EndCapture(xlog_runtime* rt, xlog_stream s) {
  void* graph = nullptr;
  std::uint64_t capture = 0;
  EXPECT_EQ(xlog_capture_end(rt, s, &graph, &capture), XLOG_OK) << LastError();
  return capture;
}

TEST(CApiCapture, ReleasingACapturingStreamIsRefusedAndNeverHandsItOut) {
  xlog_runtime* rt = OpenSim(PoolOf(1));
  xlog_stream a = 0, b = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &a));
  void* const native = NativeOf(rt, a);
  XLOG_ASSERT_OK(xlog_capture_begin(rt, a, XLOG_CAPTURE_GLOBAL));
  XLOG_EXPECT_REJECTED(XLOG_ERR_STREAM_MISUSE, xlog_stream_release(rt, a));
  const std::string refusal = LastError();
  XLOG_EXPECT_REJECTED(XLOG_ERR_POOL_EXHAUSTED, xlog_stream_acquire(rt, &b));
  const std::uint64_t capture = EndCapture(rt, a);
  EXPECT_NE(refusal.find("capture " + std::to_string(capture)), std::string::npos) << refusal;

  XLOG_ASSERT_OK(xlog_stream_release(rt, a));
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &b));
  EXPECT_EQ(NativeOf(rt, b), native) << "the one pooled stream, no longer capturing";
  XLOG_ASSERT_OK(xlog_capture_begin(rt, b, XLOG_CAPTURE_GLOBAL));
  EndCapture(rt, b);
  XLOG_ASSERT_OK(xlog_stream_release(rt, b));
  Close(rt);
}

TEST(CApiCapture, ClosingWhileAStreamCapturesIsRefusedAndTheHandleStaysOpen) {
  xlog_runtime* rt = OpenSim(PoolOf(2));
  xlog_stream a = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &a));
  XLOG_ASSERT_OK(xlog_capture_begin(rt, a, XLOG_CAPTURE_GLOBAL));
  std::uint64_t blocks = 99, bytes = 99;
  XLOG_EXPECT_REJECTED(XLOG_ERR_STREAM_MISUSE, xlog_runtime_close_report(rt, &blocks, &bytes));
  EXPECT_NE(LastError().find("stream " + std::to_string(a) + " takes part in capture"), std::string::npos)
      << LastError();
  EXPECT_EQ(blocks, 99u) << "nothing was reported: nothing was closed";
  StatsOf(rt);  // the handle is still open
  EndCapture(rt, a);
  XLOG_ASSERT_OK(xlog_stream_release(rt, a));
  XLOG_ASSERT_OK(xlog_runtime_close_report(rt, &blocks, &bytes));
  EXPECT_EQ(blocks, 0u);
}

TEST(CppRuntime, ACloseRefusedWhileAStreamCapturesKeepsTheHandle) {
  xlog::Runtime rt{xlog::Config().backend(XLOG_BACKEND_SIM).stream_pool_size(2)};
  xlog::Stream s = rt.acquire_stream();
  XLOG_ASSERT_OK(xlog_capture_begin(rt.handle(), s.id(), XLOG_CAPTURE_GLOBAL));
  try {
    rt.close();
    FAIL() << "close went through while a stream captures";
  } catch (const xlog::Error& e) {
    EXPECT_EQ(e.status(), XLOG_ERR_STREAM_MISUSE) << e.what();
  }
  ASSERT_TRUE(rt) << "the Runtime still owns its open handle";
  try {
    s.reset();
    FAIL() << "a capturing stream was released";
  } catch (const xlog::Error& e) {
    EXPECT_EQ(e.status(), XLOG_ERR_STREAM_MISUSE) << e.what();
  }
  ASSERT_TRUE(s) << "the Stream still owns its id";
  EndCapture(rt.handle(), s.id());
  s.reset();
  const xlog::CloseReport report = rt.close();
  EXPECT_EQ(report.leaked_blocks, 0u);
  EXPECT_FALSE(rt);
}

}  // namespace

namespace {

using namespace xlog_test;

TEST(CApiClose, TheDetailedReportCountsTheStreamsNeverReleased) {
  xlog_runtime* rt = OpenSim(PoolOf(4));
  xlog_stream kept = 0, released = 0;
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &kept));
  XLOG_ASSERT_OK(xlog_stream_acquire(rt, &released));
  XLOG_ASSERT_OK(xlog_stream_release(rt, released));
  xlog_stream imported = 0;  // the caller's own native stream: not counted
  XLOG_ASSERT_OK(xlog_stream_import(rt, reinterpret_cast<void*>(0x5300), &imported));
  xlog_block block{};
  XLOG_ASSERT_OK(xlog_allocate(rt, 1000, kept, "left", &block));

  xlog_close_report report;
  std::memset(&report, 0xAB, sizeof report);
  report.struct_size = 4;
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_close_detailed(rt, &report));
  XLOG_EXPECT_REJECTED(XLOG_ERR_INVALID_ARGUMENT, xlog_runtime_close_detailed(rt, nullptr));
  StatsOf(rt);  // refused before anything: still open
  report.struct_size = sizeof report;
  XLOG_ASSERT_OK(xlog_runtime_close_detailed(rt, &report));
  EXPECT_EQ(report.struct_size, sizeof report);
  EXPECT_EQ(report.leaked_blocks, 1u);
  EXPECT_EQ(report.leaked_bytes, 1000u);
  EXPECT_EQ(report.unreleased_streams, 1u);
}

TEST(CppRuntime, CloseReportsTheStreamsNeverReleased) {
  xlog::Runtime rt{xlog::Config().backend(XLOG_BACKEND_SIM).stream_pool_size(4)};
  xlog::Stream released = rt.acquire_stream();
  const xlog_stream lost = rt.acquire_stream().release();  // owned by nobody now
  released.reset();
  const xlog::CloseReport report = rt.close();
  EXPECT_EQ(report.unreleased_streams, 1u) << "stream " << lost;
  EXPECT_EQ(report.leaked_blocks, 0u);
}

}  // namespace
