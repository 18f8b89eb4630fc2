/* Built by check.sh with nothing but `cc main.c $(pkg-config --cflags --libs
 * xlog-cuda)`: the installed header and library, found through the
 * installed xlog-cuda.pc. One allocation round trip on the sim backend. */
#include <stdio.h>
#include <xlog_cuda.h>

int main(void) {
  xlog_config cfg;
  xlog_config_init(&cfg);
  cfg.backend = XLOG_BACKEND_SIM;
  cfg.budget_bytes = 1u << 20;
  xlog_runtime *rt = NULL;
  xlog_stream s = 0;
  xlog_block b;
  if (xlog_runtime_open(0, &cfg, &rt) != XLOG_OK || xlog_stream_acquire(rt, &s) != XLOG_OK ||
      xlog_allocate(rt, 4096, s, "pkgconfig", &b) != XLOG_OK) {
    char message[256];
    xlog_last_error_message(message, sizeof message);
    fprintf(stderr, "setup failed: %s\n", message);
    return 1;
  }
  uint64_t released = 0;
  if (xlog_deallocate(rt, b) != XLOG_OK || xlog_drain(rt, &released) != XLOG_OK || released != 4096) {
    fprintf(stderr, "free failed or released %llu bytes, not 4096\n", (unsigned long long)released);
    return 1;
  }
  if (xlog_stream_release(rt, s) != XLOG_OK || xlog_runtime_close(rt) != XLOG_OK) return 1;
  printf("pkgconfig OK: libxlog_cuda %s, 4096 bytes allocated and released\n", xlog_version());
  return 0;
}
