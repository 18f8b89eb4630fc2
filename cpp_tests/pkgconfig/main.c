/* Built by check.sh with nothing but `cc main.c $(pkg-config --cflags --libs
 * xlog-cuda)`: the installed header and library, found through the
 * installed xlog-cuda.pc. One allocation round trip on the sim backend:
 * allocate, free (the memory stays held, idle), trim back to the driver. */
#include <stdio.h>
#include <xlog_cuda.h>

int main(void) {
  xlog_config cfg;
  xlog_config_init(&cfg);
  cfg.backend = XLOG_BACKEND_SIM;
  cfg.budget_bytes = 8u << 20; /* four 2 MiB pages */
  cfg.cache = 1; /* the default, whatever XLOG_CACHE says */
  /* What the 4096-byte block makes the runtime hold: the arena (the
     default) maps a 2 MiB page, the pool (XLOG_MEMORY=pool) the block. */
  const uint64_t held = cfg.memory == XLOG_MEMORY_POOL ? 4096u : (2u << 20);
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
  /* The free leaves the memory held (still charged): the block in its
   * stream's cache, or its page in the arena; trim hands exactly those
   * bytes back to the driver and retires them. */
  uint64_t released = 0;
  xlog_stats stats;
  stats.struct_size = sizeof stats;
  if (xlog_deallocate(rt, b) != XLOG_OK || xlog_get_stats(rt, &stats) != XLOG_OK || stats.cached_bytes != held ||
      stats.budget_remaining != (8u << 20) - held) {
    fprintf(stderr, "free failed or cached %llu bytes, not %llu\n", (unsigned long long)stats.cached_bytes,
            (unsigned long long)held);
    return 1;
  }
  if (xlog_trim(rt, 0, &released) != XLOG_OK || released != held) {
    fprintf(stderr, "trim failed or released %llu bytes, not %llu\n", (unsigned long long)released,
            (unsigned long long)held);
    return 1;
  }
  stats.struct_size = sizeof stats;
  if (xlog_get_stats(rt, &stats) != XLOG_OK || stats.outstanding_bytes != 0 || stats.budget_remaining != 8u << 20) {
    fprintf(stderr, "after trim: outstanding %llu, budget remaining %llu\n",
            (unsigned long long)stats.outstanding_bytes, (unsigned long long)stats.budget_remaining);
    return 1;
  }
  if (xlog_stream_release(rt, s) != XLOG_OK || xlog_runtime_close(rt) != XLOG_OK) return 1;
  printf("pkgconfig OK: libxlog_cuda %s, 4096 bytes allocated, cached and trimmed\n", xlog_version());
  return 0;
}
