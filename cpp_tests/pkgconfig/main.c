/* Built by check.sh with nothing but `cc main.c $(pkg-config --cflags --libs
 * xlog-cuda)`: the installed header and library, found through the
 * installed xlog-cuda.pc. One allocation round trip on the sim backend:
 * allocate, free into the stream's cache, trim back to the driver. */
#include <stdio.h>
#include <xlog_cuda.h>

int main(void) {
  xlog_config cfg;
  xlog_config_init(&cfg);
  cfg.backend = XLOG_BACKEND_SIM;
  cfg.budget_bytes = 1u << 20;
  cfg.memory = XLOG_MEMORY_POOL; /* byte-exact blocks: the numbers below are the pool's */
  cfg.cache = 1; /* the default, whatever XLOG_CACHE says */
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
  /* The free puts the block in its stream's cache (still charged); trim
   * hands exactly those bytes back to the driver and retires them. */
  uint64_t released = 0;
  xlog_stats stats;
  stats.struct_size = sizeof stats;
  if (xlog_deallocate(rt, b) != XLOG_OK || xlog_get_stats(rt, &stats) != XLOG_OK || stats.cached_bytes != 4096 ||
      stats.budget_remaining != (1u << 20) - 4096) {
    fprintf(stderr, "free failed or cached %llu bytes, not 4096\n", (unsigned long long)stats.cached_bytes);
    return 1;
  }
  if (xlog_trim(rt, 0, &released) != XLOG_OK || released != 4096) {
    fprintf(stderr, "trim failed or released %llu bytes, not 4096\n", (unsigned long long)released);
    return 1;
  }
  stats.struct_size = sizeof stats;
  if (xlog_get_stats(rt, &stats) != XLOG_OK || stats.outstanding_bytes != 0 || stats.budget_remaining != 1u << 20) {
    fprintf(stderr, "after trim: outstanding %llu, budget remaining %llu\n",
            (unsigned long long)stats.outstanding_bytes, (unsigned long long)stats.budget_remaining);
    return 1;
  }
  if (xlog_stream_release(rt, s) != XLOG_OK || xlog_runtime_close(rt) != XLOG_OK) return 1;
  printf("pkgconfig OK: libxlog_cuda %s, 4096 bytes allocated, cached and trimmed\n", xlog_version());
  return 0;
}
