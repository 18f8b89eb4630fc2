/*
 * include/xlog/testing.h (the test and debug entry points) compiles alone as
 * strict C99 (-std=c99 -pedantic -Wall -Wextra -Werror), brings in
 * xlog_cuda.h itself, and its functions link and behave: the panic check
 * becomes XLOG_ERR_INTERNAL with a message, fault injection refuses a NULL
 * runtime and an unknown kind.
 */
#include <xlog/testing.h>

#include <string.h>

int main(void) {
  char message[256];
  xlog_fault kinds[4];
  size_t i;
  kinds[0] = XLOG_FAULT_ALLOC;
  kinds[1] = XLOG_FAULT_FREE;
  kinds[2] = XLOG_FAULT_EVENT_RECORD;
  kinds[3] = XLOG_FAULT_STREAM_CREATE;
  for (i = 0; i < 4; ++i) {
    if (kinds[i] != (xlog_fault)(i + 1)) return 1;
  }
  if (xlog_debug_panic() != XLOG_ERR_INTERNAL) return 2;
  xlog_last_error_message(message, sizeof message);
  if (strstr(message, "deliberate panic") == NULL) return 3;
  if (xlog_sim_inject_fault(NULL, XLOG_FAULT_ALLOC, 1) != XLOG_ERR_INVALID_ARGUMENT) return 4;
  return 0;
}
