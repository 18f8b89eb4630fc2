// include/xlog/mr.hpp under RMM itself (issue 26 item 2), on a GPU: xlog
// is made RMM's current device resource, then an ordinary RMM + Thrust
// pipeline runs on it (device_uvector, Thrust algorithms whose temporary
// storage RMM's exec_policy takes from the current resource), and the test
// checks that every byte came through xlog (its stats, its budget) and that
// a refusal reaches RMM code as rmm::out_of_memory.
//
// Built only where -DRMM_ROOT names the unpacked librmm-cu13 and
// rapids-logger wheels (cpp_tests/cuda/CMakeLists.txt; GPU_NOTES.md), with
// C++20 as RMM requires. RMM's headers come first, so mr.hpp takes RMM's
// exception types (its contract, "Refusals").

#include <rmm/cuda_stream.hpp>
#include <rmm/device_buffer.hpp>
#include <rmm/device_uvector.hpp>
#include <rmm/error.hpp>
#include <rmm/exec_policy.hpp>
#include <rmm/mr/per_device_resource.hpp>

#include <thrust/functional.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include "test_support.cu"

#include <xlog/mr.hpp>

#include <memory>

#if !XLOG_MR_RMM_ERRORS
#error "RMM's headers came first: mr.hpp should have taken RMM's exception types"
#endif
static_assert(std::is_base_of<rmm::out_of_memory, xlog::bad_alloc>::value,
              "with RMM, xlog's refusal is an rmm::out_of_memory");
static_assert(std::is_base_of<std::bad_alloc, xlog::bad_alloc>::value, "and still a std::bad_alloc");

using xlog_test::check;
using xlog_test::str;

namespace {

struct square_mod {
  __host__ __device__ long long operator()(long long x) const { return (x * x) % 1000003; }
};

// The host reference of the pipeline below.
long long expected_sum(std::size_t n) {
  long long sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const long long x = static_cast<long long>(n - 1 - i);
    sum += (x * x) % 1000003;
  }
  return sum;
}

}  // namespace

int main() {
  xlog_test::skip_without_device();
  constexpr std::uint64_t budget = 256ull << 20;
  xlog_runtime* rt = xlog_test::open_cuda(budget);
  const xlog_stats before = xlog_test::stats(rt);
  // Outlives the runtime: close synchronizes the streams xlog imported.
  auto owned_stream = std::make_unique<rmm::cuda_stream>();
  const ::cuda::stream_ref stream{owned_stream->value()};

  {
    xlog::memory_resource xmr{rt, "rmm"};
    auto previous = rmm::mr::set_current_device_resource(xmr);
    check(rmm::mr::get_current_device_resource_ref() == rmm::device_async_resource_ref{xmr},
          "xlog is RMM's current device resource");

    constexpr std::size_t n = 4u << 20;  // 32 MiB of int64
    long long got = -1;
    {
      rmm::device_uvector<long long> v(n, stream);
      thrust::sequence(rmm::exec_policy(stream), v.begin(), v.end());
      // A descending sort: its temporary storage comes from the current
      // resource through exec_policy, i.e. from xlog.
      thrust::sort(rmm::exec_policy(stream), v.begin(), v.end(), thrust::greater<long long>());
      rmm::device_uvector<long long> w(n, stream);
      thrust::transform(rmm::exec_policy(stream), v.begin(), v.end(), w.begin(), square_mod{});
      got = thrust::reduce(rmm::exec_policy(stream), w.begin(), w.end(), 0LL);
      const xlog_stats during = xlog_test::stats(rt);
      check(during.live_bytes >= 2 * n * sizeof(long long),
            "both vectors are live in xlog", "live " + str(during.live_bytes));
      check(xmr.live_pointers() == 2, "the resource maps the two live vectors",
            str(xmr.live_pointers()) + " live pointers");
    }
    stream.sync();
    check(got == expected_sum(n), "the Thrust pipeline on xlog memory gives the host's answer",
          "got " + std::to_string(got) + ", expected " + std::to_string(expected_sum(n)));

    const xlog_stats after = xlog_test::stats(rt);
    const std::uint64_t made = after.allocations - before.allocations;
    // Two vectors plus the sort's and the reduction's temporary storage.
    check(made >= 4, "the sort's and reduction's temporary storage came from xlog too",
          str(made) + " allocations through xlog");
    check(after.live_bytes == before.live_bytes && xmr.live_pointers() == 0,
          "everything RMM allocated went back to xlog", "live " + str(after.live_bytes));
    check(after.peak_outstanding_bytes <= budget, "the pipeline stayed under xlog's budget",
          "held peak " + str(after.peak_outstanding_bytes) + " of " + str(budget));

    // Over the budget: RMM code sees RMM's own refusal type.
    bool refused_as_rmm = false;
    std::string message;
    try {
      rmm::device_buffer big(budget + (64ull << 20), stream);
    } catch (const rmm::out_of_memory& e) {
      refused_as_rmm = true;
      message = e.what();
    } catch (const std::exception& e) {
      message = std::string("other exception: ") + e.what();
    }
    check(refused_as_rmm, "a request over the budget is an rmm::out_of_memory", message);
    check(message.find("XLOG_ERR_OUT_OF_BUDGET") != std::string::npos && message.find(str(budget)) != std::string::npos,
          "its message names the status and the limit", message);
    const xlog_stats refused = xlog_test::stats(rt);
    check(refused.failed_allocations == after.failed_allocations + 1 && refused.live_bytes == after.live_bytes,
          "the refusal is counted and changes nothing live");

    // After a refusal the resource keeps working.
    {
      rmm::device_uvector<int> small(1 << 20, stream);
      thrust::sequence(rmm::exec_policy(stream), small.begin(), small.end());
      const long long s = thrust::reduce(rmm::exec_policy(stream), small.begin(), small.end(), 0LL);
      const long long m = (1 << 20);
      check(s == m * (m - 1) / 2, "allocations after the refusal work");
    }
    stream.sync();
    rmm::mr::set_current_device_resource(std::move(previous));
  }
  // The per-device map has given up its copy of the resource: close is clean.
  xlog_test::close_expect_no_leaks(rt, "close after RMM reports no leaked block");
  owned_stream.reset();
  return xlog_test::summary();
}
