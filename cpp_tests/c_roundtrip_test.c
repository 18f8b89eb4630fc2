/*
 * A plain C99 program using the C API the way a C engine would: configure,
 * open a sim runtime, allocate a block, touch it from a stream-ordered host
 * callback, record the use, free it (into its stream's cache), take it
 * back from the cache, trim, check the books, close.
 * Exit status 0 on success, 1 on the first failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <xlog_cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_failed;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
      g_failed = 1;                                                            \
    }                                                                          \
  } while (0)

#define CHECK_STATUS(expected, call)                                           \
  do {                                                                         \
    char msg_[512];                                                            \
    xlog_status st_ = (call);                                                  \
    if (st_ != (expected)) {                                                   \
      xlog_last_error_message(msg_, sizeof msg_);                              \
      fprintf(stderr, "FAIL %s:%d: %s returned %s, expected %s: %s\n",         \
              __FILE__, __LINE__, #call, xlog_status_name(st_),                \
              xlog_status_name(expected), msg_);                               \
      return 1;                                                                \
    }                                                                          \
  } while (0)

struct fill_job {
  unsigned char *bytes;
  size_t len;
  unsigned long sum;
};

/* A host "kernel": fill the block with i % 251, then sum it. */
static void fill_and_sum(void *user) {
  struct fill_job *job = (struct fill_job *)user;
  size_t i;
  job->sum = 0;
  for (i = 0; i < job->len; ++i) job->bytes[i] = (unsigned char)(i % 251);
  for (i = 0; i < job->len; ++i) job->sum += job->bytes[i];
}

int main(void) {
  xlog_config cfg;
  xlog_runtime *rt = NULL;
  xlog_stream stream = 0;
  xlog_block block;
  xlog_use use;
  xlog_stats stats;
  xlog_block again;
  xlog_backend backend = 0;
  struct fill_job job;
  unsigned long expected_sum = 0;
  uint64_t reclaimed = 0, leaked_blocks = 99, leaked_bytes = 99;
  char msg[256];
  size_t len, i;
  /* A size the allocator hands out as it is (10 KiB: a multiple of its
     512-byte steps), so device bytes equal requested bytes below. */
  const size_t bytes = 10240;
  /* A budget of four 2 MiB pages: the arena (the default memory) charges
     the pages it maps, the pool (XLOG_MEMORY=pool) its blocks. `held` is
     what the one block makes the runtime hold, under either. */
  const uint64_t budget = 8u * 1024u * 1024u;
  uint64_t held;
  int pool;

  unsetenv("XLOG_BACKEND");
  unsetenv("XLOG_BUDGET_BYTES");
  unsetenv("XLOG_LOG_PATH");
  unsetenv("XLOG_CACHE");
  unsetenv("XLOG_POOL_RELEASE_THRESHOLD");

  CHECK_STATUS(XLOG_OK, xlog_config_from_env(&cfg));
  CHECK(cfg.struct_size == sizeof(xlog_config));
  CHECK(cfg.cache == 1);
  CHECK(cfg.pool_release_threshold == UINT64_MAX);
  cfg.backend = XLOG_BACKEND_SIM;
  cfg.budget_bytes = budget;
  pool = cfg.memory == XLOG_MEMORY_POOL;
  held = pool ? bytes : 2u * 1024u * 1024u;
  CHECK_STATUS(XLOG_OK, xlog_runtime_open(0, &cfg, &rt));
  CHECK(rt != NULL);
  CHECK_STATUS(XLOG_OK, xlog_runtime_backend(rt, &backend));
  CHECK(backend == XLOG_BACKEND_SIM);
  CHECK_STATUS(XLOG_OK, xlog_stream_acquire(rt, &stream));
  CHECK(stream != 0);

  CHECK_STATUS(XLOG_OK, xlog_allocate(rt, bytes, stream, "c_roundtrip", &block));
  CHECK(block.ptr != NULL);
  CHECK(((uintptr_t)block.ptr % 256) == 0);
  CHECK(block.size == bytes);
  CHECK(block.generation != 0);
  CHECK(block.stream == stream);
  CHECK(block.device == 0);
  CHECK_STATUS(XLOG_OK, xlog_block_validate(rt, block));

  /* The caller sets struct_size; without it the call is refused. */
  memset(&stats, 0, sizeof stats);
  CHECK_STATUS(XLOG_ERR_INVALID_ARGUMENT, xlog_get_stats(rt, &stats));
  stats.struct_size = sizeof stats;
  CHECK_STATUS(XLOG_OK, xlog_get_stats(rt, &stats));
  CHECK(stats.struct_size == sizeof stats);
  CHECK(stats.live_bytes == bytes);
  CHECK(stats.live_blocks == 1);
  CHECK(stats.budget_limit == budget);
  CHECK(stats.outstanding_bytes == held);
  CHECK(stats.budget_remaining == budget - held);

  /* One recorded launch with a host callback as the kernel. */
  use.block = block;
  use.access = XLOG_ACCESS_WRITE;
  job.bytes = (unsigned char *)block.ptr;
  job.len = bytes;
  job.sum = 0;
  CHECK_STATUS(XLOG_OK, xlog_prepare_all(rt, stream, &use, 1));
  CHECK_STATUS(XLOG_OK, xlog_stream_enqueue_host(rt, stream, fill_and_sum, &job));
  CHECK_STATUS(XLOG_OK, xlog_finish_all(rt, stream, &use, 1));
  CHECK_STATUS(XLOG_OK, xlog_stream_synchronize(rt, stream));
  for (i = 0; i < bytes; ++i) expected_sum += (unsigned long)(i % 251);
  CHECK(job.sum == expected_sum);
  CHECK(((unsigned char *)block.ptr)[bytes - 1] == (unsigned char)((bytes - 1) % 251));

  /* The free puts the block in its stream's cache (the arena: its range
     back among the stream's free ranges, the page still mapped): held and
     charged, all of it idle. */
  CHECK_STATUS(XLOG_OK, xlog_deallocate(rt, block));
  CHECK_STATUS(XLOG_OK, xlog_get_stats(rt, &stats));
  CHECK(stats.live_bytes == 0);
  CHECK(stats.cached_bytes == held);
  if (pool) CHECK(stats.cached_blocks == 1);
  CHECK(stats.pending_bytes == 0);
  CHECK(stats.outstanding_bytes == held);
  CHECK(stats.budget_remaining == budget - held);

  /* A second free of the same handle is refused with a message. */
  CHECK_STATUS(XLOG_ERR_USE_AFTER_FREE, xlog_deallocate(rt, block));
  len = xlog_last_error_message(msg, sizeof msg);
  CHECK(len > 0);
  CHECK(strstr(msg, "xlog_deallocate") != NULL);
  CHECK(strcmp(xlog_status_name(XLOG_ERR_USE_AFTER_FREE), "XLOG_ERR_USE_AFTER_FREE") == 0);

  /* The next allocation of that size on that stream is a cache hit: the
     same memory under a new generation; the old handle stays stale. */
  CHECK_STATUS(XLOG_OK, xlog_allocate(rt, bytes, stream, "c_roundtrip_again", &again));
  CHECK(again.ptr == block.ptr);
  CHECK(again.generation > block.generation);
  CHECK_STATUS(XLOG_ERR_USE_AFTER_FREE, xlog_block_validate(rt, block));
  CHECK_STATUS(XLOG_OK, xlog_deallocate(rt, again));

  /* trim hands the cached memory back and waits for it. */
  CHECK_STATUS(XLOG_OK, xlog_trim(rt, 0, &reclaimed));
  CHECK(reclaimed == held);
  CHECK_STATUS(XLOG_OK, xlog_get_stats(rt, &stats));
  CHECK(stats.outstanding_bytes == 0);
  CHECK(stats.cached_bytes == 0);
  CHECK(stats.budget_remaining == budget);
  CHECK(stats.allocations == 2);
  CHECK(stats.deallocations == 2);
  CHECK(stats.cache_hits == 1);
  CHECK(stats.cache_misses == 1);
  CHECK_STATUS(XLOG_OK, xlog_drain(rt, &reclaimed));
  CHECK(reclaimed == 0);

  CHECK_STATUS(XLOG_OK, xlog_stream_release(rt, stream));
  CHECK_STATUS(XLOG_OK, xlog_runtime_close_report(rt, &leaked_blocks, &leaked_bytes));
  CHECK(leaked_blocks == 0);
  CHECK(leaked_bytes == 0);

  if (g_failed) return 1;
  printf("PASS: C roundtrip on %s\n", xlog_version());
  return 0;
}
