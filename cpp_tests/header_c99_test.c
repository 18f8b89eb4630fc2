/*
 * include/xlog_cuda.h compiles alone as strict C99
 * (-std=c99 -pedantic -Wall -Wextra -Werror) and links: nothing but the
 * header is included. Also pins the LP64 layout of the ABI structs, which
 * the Rust side defines with #[repr(C)].
 */
#include <xlog_cuda.h>

/* The production header holds the production API only: the test and debug
   entry points live in xlog/testing.h (testing_header_c99_test.c). */
#ifdef XLOG_FAULT_ALLOC
#error "xlog_cuda.h defines XLOG_FAULT_ALLOC: test-only items leaked into the public header"
#endif
#ifdef XLOG_TESTING_H
#error "xlog_cuda.h includes xlog/testing.h"
#endif

/* C99 has no static_assert: a negative array size fails the build. */
#define XLOG_CHECK_LAYOUT(name, cond) typedef char name[(cond) ? 1 : -1]

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
XLOG_CHECK_LAYOUT(block_is_32_bytes, sizeof(xlog_block) == 32);
XLOG_CHECK_LAYOUT(use_is_40_bytes, sizeof(xlog_use) == 40);
XLOG_CHECK_LAYOUT(config_is_80_bytes, sizeof(xlog_config) == 80);
XLOG_CHECK_LAYOUT(stats_is_184_bytes, sizeof(xlog_stats) == 184);
XLOG_CHECK_LAYOUT(live_block_is_88_bytes, sizeof(xlog_live_block) == 88);
XLOG_CHECK_LAYOUT(tag_stat_is_56_bytes, sizeof(xlog_tag_stat) == 56);
#endif
XLOG_CHECK_LAYOUT(status_is_32_bits, sizeof(xlog_status) == 4);
XLOG_CHECK_LAYOUT(stream_is_32_bits, sizeof(xlog_stream) == 4);
XLOG_CHECK_LAYOUT(ok_is_zero, XLOG_OK == 0);
XLOG_CHECK_LAYOUT(internal_is_ten, XLOG_ERR_INTERNAL == 10);

#define XLOG_STR_(x) #x
#define XLOG_STR(x) XLOG_STR_(x)

int main(void) {
  static const char expected[] =
      XLOG_STR(XLOG_VERSION_MAJOR) "." XLOG_STR(XLOG_VERSION_MINOR) "." XLOG_STR(XLOG_VERSION_PATCH);
  const char *v = xlog_version();
  size_t i;
  for (i = 0; i < sizeof expected; ++i) {
    if (v[i] != expected[i]) return 1;
  }
  return xlog_status_name(XLOG_OK)[0] == 'X' ? 0 : 1;
}
