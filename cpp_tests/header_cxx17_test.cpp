// include/xlog_cuda.h compiles alone as strict C++17
// (-std=c++17 -pedantic -Wall -Wextra -Werror) and links: the extern "C"
// guard must give the entry points C linkage, or the calls below would not
// resolve. Nothing but the header is included.
#include <xlog_cuda.h>

// Test-only items live in xlog/testing.h, never here.
#ifdef XLOG_FAULT_ALLOC
#error "xlog_cuda.h defines XLOG_FAULT_ALLOC: test-only items leaked into the public header"
#endif

static_assert(sizeof(xlog_status) == 4, "xlog_status is int32_t");
static_assert(sizeof(xlog_stream) == 4, "xlog_stream is uint32_t");
static_assert(XLOG_OK == 0 && XLOG_ERR_INTERNAL == 10, "status values are fixed");
static_assert(sizeof(void*) != 8 || sizeof(xlog_block) == 32, "xlog_block layout");
static_assert(sizeof(void*) != 8 || sizeof(xlog_use) == 40, "xlog_use layout");
static_assert(sizeof(void*) != 8 || sizeof(xlog_config) == 80, "xlog_config layout");
static_assert(sizeof(xlog_stats) == 184, "xlog_stats layout");
static_assert(sizeof(void*) != 8 || sizeof(xlog_live_block) == 88, "xlog_live_block layout");
static_assert(sizeof(void*) != 8 || sizeof(xlog_tag_stat) == 56, "xlog_tag_stat layout");

namespace {
constexpr char kExpected[] = {
    static_cast<char>('0' + XLOG_VERSION_MAJOR), '.', static_cast<char>('0' + XLOG_VERSION_MINOR), '.',
    static_cast<char>('0' + XLOG_VERSION_PATCH), '\0'};
static_assert(XLOG_VERSION_MAJOR < 10 && XLOG_VERSION_MINOR < 10 && XLOG_VERSION_PATCH < 10,
              "single-digit version assumed by this check");
}  // namespace

int main() {
  const char* v = xlog_version();
  for (unsigned i = 0; i < sizeof kExpected; ++i) {
    if (v[i] != kExpected[i]) return 1;
  }
  // An extern "C" function pointer from the header's typedef.
  xlog_host_fn fn = nullptr;
  (void)fn;
  return xlog_status_name(XLOG_ERR_NO_DEVICE)[0] == 'X' ? 0 : 1;
}
