// include/xlog/testing.h compiles alone as strict C++17
// (-std=c++17 -pedantic -Wall -Wextra -Werror) with C linkage for its
// functions, and includes the production header itself.
#include <xlog/testing.h>

#include <cstring>

static_assert(XLOG_FAULT_ALLOC == 1 && XLOG_FAULT_STREAM_CREATE == 4, "fault kinds are fixed");
static_assert(sizeof(xlog_fault) == 4, "xlog_fault is uint32_t");

int main() {
  if (xlog_debug_panic() != XLOG_ERR_INTERNAL) return 1;
  char message[256];
  xlog_last_error_message(message, sizeof message);
  if (std::strstr(message, "xlog_debug_panic") == nullptr) return 2;
  xlog_runtime* rt = nullptr;
  return xlog_sim_inject_fault(rt, 99, 1) == XLOG_ERR_INVALID_ARGUMENT ? 0 : 3;
}
