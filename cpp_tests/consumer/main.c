/* consumer_c: opens a sim runtime through the installed C header and
 * library, allocates once, frees, and checks the accounting. Prints
 * "consumer_c OK" and exits 0 on success; anything else is a failure. */

#include <xlog_cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                   \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "consumer_c: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

static int ok(xlog_status status, const char *call) {
  if (status == XLOG_OK) return 1;
  char message[512];
  xlog_last_error_message(message, sizeof message);
  fprintf(stderr, "consumer_c: %s -> %s: %s\n", call, xlog_status_name(status), message);
  ++failures;
  return 0;
}

int main(void) {
  /* The header this was compiled with and the library it runs with agree. */
  char header_version[32];
  snprintf(header_version, sizeof header_version, "%d.%d.%d", XLOG_VERSION_MAJOR, XLOG_VERSION_MINOR,
           XLOG_VERSION_PATCH);
  EXPECT(strcmp(xlog_version(), header_version) == 0);

  xlog_config cfg;
  xlog_config_init(&cfg);
  cfg.backend = XLOG_BACKEND_SIM;
  cfg.budget_bytes = 8u << 20; /* four 2 MiB pages */
  cfg.cache = 1;
  /* What one 4096-byte block makes the runtime hold: the arena (the
     default) maps a whole 2 MiB page, the pool (XLOG_MEMORY=pool) holds
     the block itself. */
  const uint64_t held = cfg.memory == XLOG_MEMORY_POOL ? 4096u : (2u << 20);

  xlog_runtime *rt = NULL;
  if (!ok(xlog_runtime_open(0, &cfg, &rt), "xlog_runtime_open")) return 1;

  xlog_backend backend = XLOG_BACKEND_AUTO;
  if (ok(xlog_runtime_backend(rt, &backend), "xlog_runtime_backend")) EXPECT(backend == XLOG_BACKEND_SIM);

  xlog_stream stream = 0;
  if (ok(xlog_stream_acquire(rt, &stream), "xlog_stream_acquire")) {
    EXPECT(stream != 0);
    xlog_block block;
    memset(&block, 0, sizeof block);
    if (ok(xlog_allocate(rt, 4096, stream, "consumer", &block), "xlog_allocate")) {
      EXPECT(block.ptr != NULL);
      EXPECT(((uintptr_t)block.ptr % 256u) == 0);
      EXPECT(block.size == 4096);
      EXPECT(block.stream == stream);

      xlog_stats stats;
      memset(&stats, 0, sizeof stats);
      stats.struct_size = sizeof stats; /* the caller says how much it can take */
      if (ok(xlog_get_stats(rt, &stats), "xlog_get_stats")) {
        EXPECT(stats.live_bytes == 4096);
        EXPECT(stats.live_blocks == 1);
        EXPECT(stats.outstanding_bytes == held);
        EXPECT(stats.budget_limit == (8u << 20));
        EXPECT(stats.budget_remaining == (8u << 20) - held);
      }
      ok(xlog_deallocate(rt, block), "xlog_deallocate");
      /* A second free of the same handle is an error that changes nothing. */
      EXPECT(xlog_deallocate(rt, block) == XLOG_ERR_USE_AFTER_FREE);

      /* The freed memory stays held (the pool: the block in its stream's
         cache; the arena: its idle page); trim gives it back. */
      uint64_t reclaimed = 0;
      if (ok(xlog_trim(rt, 0, &reclaimed), "xlog_trim")) EXPECT(reclaimed == held);
      if (ok(xlog_drain(rt, &reclaimed), "xlog_drain")) EXPECT(reclaimed == 0);
      if (ok(xlog_get_stats(rt, &stats), "xlog_get_stats")) {
        EXPECT(stats.live_bytes == 0);
        EXPECT(stats.pending_bytes == 0);
        EXPECT(stats.cached_bytes == 0);
        EXPECT(stats.outstanding_bytes == 0);
        EXPECT(stats.allocations == 1);
        EXPECT(stats.deallocations == 1);
      }
    }
    ok(xlog_stream_release(rt, stream), "xlog_stream_release");
  }

  uint64_t leaked_blocks = 99, leaked_bytes = 99;
  ok(xlog_runtime_close_report(rt, &leaked_blocks, &leaked_bytes), "xlog_runtime_close_report");
  EXPECT(leaked_blocks == 0);
  EXPECT(leaked_bytes == 0);

  if (failures != 0) {
    fprintf(stderr, "consumer_c: %d check(s) failed\n", failures);
    return 1;
  }
  printf("consumer_c OK (libxlog_cuda %s)\n", xlog_version());
  return 0;
}
