/*
 * Multi-threaded C99 test of the C ABI on the sim backend.
 *
 * 8 threads share one runtime with an 8 MiB budget. Each acquires its own
 * stream and loops allocate → prepare_all → finish_all → deallocate, reaping
 * every few iterations, while also recording reads of one shared block, so
 * that the runtime's block table, budget and event pool are all contended.
 * Each thread holds up to 4 blocks of up to 512 KiB, about as much as
 * the budget plus what is pending, so the budget is reached: OUT_OF_BUDGET
 * is the only error allowed, and it usually happens (hundreds of times a
 * run), though a run whose pressure path retires every free in time may
 * see none (one ASan run in CI did, its charge at 8 MiB of 8 MiB); then
 * the charge must have reached the budget. The budget is whole 2 MiB
 * pages, so the program runs the same under either memory (XLOG_MEMORY:
 * the arena, the default, or the pool; ctest runs both).
 *
 * Checked:
 *   - no status other than XLOG_OK and XLOG_ERR_OUT_OF_BUDGET;
 *   - an observer thread never sees outstanding_bytes > budget_limit;
 *   - no two live blocks overlap (live ranges tracked under a mutex), and
 *     canaries written into each block survive until its free;
 *   - outstanding == live + cached + pending in every snapshot (the cache
 *     is on: freed blocks wait in their stream's cache, or freed ranges
 *     in the arena's mapped pages, charged);
 *   - afterwards the counters add up, and after xlog_trim + xlog_drain
 *     outstanding == 0.
 * Exit status 0 on success, 1 on failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <xlog_cuda.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREADS 8
#define ITERATIONS 3000
#define HELD 4
#define BUDGET_BYTES (8u * 1024u * 1024u)
#define MAX_BLOCK_BYTES (512u * 1024u)
#define REAP_EVERY 4

static xlog_runtime *g_rt;

/* Failures, live ranges and the done counter share one mutex. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_failures;
static int g_workers_done;

struct live_range {
  uintptr_t start;
  uint64_t size;
  int in_use;
};
static struct live_range g_live[THREADS * HELD];

static void fail(const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&g_mu);
  if (g_failures < 20) {
    fputs("FAIL: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
  }
  ++g_failures;
  pthread_mutex_unlock(&g_mu);
}

static int failures(void) {
  int n;
  pthread_mutex_lock(&g_mu);
  n = g_failures;
  pthread_mutex_unlock(&g_mu);
  return n;
}

static const char *last_error(char *buf, size_t cap) {
  xlog_last_error_message(buf, cap);
  return buf;
}

/* Register a new live block; fails if it overlaps any other live block. */
static int live_insert(const xlog_block *b) {
  uintptr_t start = (uintptr_t)b->ptr;
  int slot = -1;
  int i;
  if (b->size == 0) return -1;
  pthread_mutex_lock(&g_mu);
  for (i = 0; i < THREADS * HELD; ++i) {
    if (!g_live[i].in_use) {
      if (slot < 0) slot = i;
      continue;
    }
    if (start < g_live[i].start + g_live[i].size && g_live[i].start < start + b->size) {
      pthread_mutex_unlock(&g_mu);
      fail("block [%#lx, +%lu) overlaps live block [%#lx, +%lu)", (unsigned long)start,
           (unsigned long)b->size, (unsigned long)g_live[i].start, (unsigned long)g_live[i].size);
      return -1;
    }
  }
  if (slot >= 0) {
    g_live[slot].start = start;
    g_live[slot].size = b->size;
    g_live[slot].in_use = 1;
  }
  pthread_mutex_unlock(&g_mu);
  if (slot < 0) fail("more live blocks than %d", THREADS * HELD);
  return slot;
}

static void live_remove(int slot) {
  if (slot < 0) return;
  pthread_mutex_lock(&g_mu);
  g_live[slot].in_use = 0;
  pthread_mutex_unlock(&g_mu);
}

/* xorshift32: a per-thread generator, no shared state. */
static uint32_t next_random(uint32_t *state) {
  uint32_t x = *state;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  *state = x;
  return x;
}

struct held_block {
  xlog_block block;
  uint64_t canary;
  int slot;
};

struct worker {
  int index;
  xlog_block shared;
  xlog_stream stream;
  unsigned long allocations;
  unsigned long out_of_budget;
  unsigned long frees;
};

static void write_canary(const struct held_block *h) {
  if (h->block.size < 16) return;
  memcpy(h->block.ptr, &h->canary, 8);
  memcpy((char *)h->block.ptr + h->block.size - 8, &h->canary, 8);
}

static int canary_intact(const struct held_block *h) {
  uint64_t head, tail;
  if (h->block.size < 16) return 1;
  memcpy(&head, h->block.ptr, 8);
  memcpy(&tail, (char *)h->block.ptr + h->block.size - 8, 8);
  return head == h->canary && tail == h->canary;
}

static int free_held(struct worker *w, struct held_block *h) {
  char msg[512];
  xlog_status st;
  if (!canary_intact(h)) {
    fail("thread %d: canary of block gen %lu was overwritten", w->index,
         (unsigned long)h->block.generation);
  }
  live_remove(h->slot);
  st = xlog_deallocate(g_rt, h->block);
  if (st != XLOG_OK) {
    fail("thread %d: deallocate: %s: %s", w->index, xlog_status_name(st), last_error(msg, sizeof msg));
    return 0;
  }
  ++w->frees;
  return 1;
}

static void *worker_main(void *arg) {
  struct worker *w = (struct worker *)arg;
  struct held_block held[HELD];
  int count = 0;
  int i;
  uint32_t rng = 0x9E3779B9u ^ (uint32_t)(w->index * 7919 + 1);
  char msg[512];
  xlog_status st;
  uint64_t reclaimed;
  struct timespec backoff;
  backoff.tv_sec = 0;
  backoff.tv_nsec = 50 * 1000;

  for (i = 0; i < ITERATIONS && failures() == 0; ++i) {
    uint64_t bytes = (i % 50 == 7) ? 0 : (uint64_t)(next_random(&rng) % MAX_BLOCK_BYTES) + 1;
    xlog_block b;
    xlog_use uses[2];

    if (count == HELD) {
      /* Free the oldest to make room. */
      if (!free_held(w, &held[0])) break;
      memmove(&held[0], &held[1], sizeof held[0] * (HELD - 1));
      --count;
    }

    st = xlog_allocate(g_rt, bytes, w->stream, "mt", &b);
    if (st == XLOG_ERR_OUT_OF_BUDGET) {
      ++w->out_of_budget;
      /* Give some room back: free the oldest, if any, and reap. */
      if (count > 0) {
        if (!free_held(w, &held[0])) break;
        memmove(&held[0], &held[1], sizeof held[0] * (HELD - 1));
        --count;
      }
      reclaimed = 0;
      st = xlog_reap(g_rt, &reclaimed);
      if (st != XLOG_OK) fail("thread %d: reap: %s: %s", w->index, xlog_status_name(st), last_error(msg, sizeof msg));
      /* Nothing retired yet: back off so the stream workers can run the
         frees (the sim's workers share the CPUs with these threads). */
      if (reclaimed == 0) nanosleep(&backoff, NULL);
      continue;
    }
    if (st != XLOG_OK) {
      fail("thread %d: allocate %lu: %s: %s", w->index, (unsigned long)bytes, xlog_status_name(st),
           last_error(msg, sizeof msg));
      break;
    }
    ++w->allocations;
    if (b.size != bytes || b.stream != w->stream || (bytes == 0) != (b.ptr == NULL) ||
        ((uintptr_t)b.ptr % 256) != 0) {
      fail("thread %d: allocate %lu returned a bad block (size %lu, ptr %p)", w->index,
           (unsigned long)bytes, (unsigned long)b.size, b.ptr);
    }
    held[count].block = b;
    held[count].canary = ((uint64_t)w->index << 56) ^ b.generation;
    held[count].slot = live_insert(&b);
    write_canary(&held[count]);
    ++count;

    /* A launch on this thread's stream: write the new block, read the shared one. */
    uses[0].block = b;
    uses[0].access = XLOG_ACCESS_WRITE;
    uses[1].block = w->shared;
    uses[1].access = XLOG_ACCESS_READ;
    st = xlog_prepare_all(g_rt, w->stream, uses, 2);
    if (st != XLOG_OK) fail("thread %d: prepare_all: %s: %s", w->index, xlog_status_name(st), last_error(msg, sizeof msg));
    st = xlog_finish_all(g_rt, w->stream, uses, 2);
    if (st != XLOG_OK) fail("thread %d: finish_all: %s: %s", w->index, xlog_status_name(st), last_error(msg, sizeof msg));
    /* And the single-block form on an older block. */
    if (count > 1) {
      st = xlog_prepare(g_rt, held[0].block, w->stream, XLOG_ACCESS_READ_WRITE);
      if (st != XLOG_OK) fail("thread %d: prepare: %s: %s", w->index, xlog_status_name(st), last_error(msg, sizeof msg));
      st = xlog_finish(g_rt, held[0].block, w->stream, XLOG_ACCESS_READ_WRITE);
      if (st != XLOG_OK) fail("thread %d: finish: %s: %s", w->index, xlog_status_name(st), last_error(msg, sizeof msg));
    }
    if (i % REAP_EVERY == 0) {
      st = xlog_reap(g_rt, NULL);
      if (st != XLOG_OK) fail("thread %d: reap: %s: %s", w->index, xlog_status_name(st), last_error(msg, sizeof msg));
    }
  }
  while (count > 0) {
    free_held(w, &held[count - 1]);
    --count;
  }
  pthread_mutex_lock(&g_mu);
  ++g_workers_done;
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

struct observer {
  unsigned long samples;
  uint64_t max_outstanding;
  uint64_t max_pending;
  uint64_t max_cached;
};

static void *observer_main(void *arg) {
  struct observer *o = (struct observer *)arg;
  struct timespec pause;
  char msg[512];
  pause.tv_sec = 0;
  pause.tv_nsec = 100 * 1000;
  for (;;) {
    xlog_stats s;
    int done;
    xlog_status st;
    s.struct_size = sizeof s;
    st = xlog_get_stats(g_rt, &s);
    if (st != XLOG_OK) {
      fail("observer: get_stats: %s: %s", xlog_status_name(st), last_error(msg, sizeof msg));
      return NULL;
    }
    ++o->samples;
    if (s.outstanding_bytes > o->max_outstanding) o->max_outstanding = s.outstanding_bytes;
    if (s.pending_bytes > o->max_pending) o->max_pending = s.pending_bytes;
    if (s.cached_bytes > o->max_cached) o->max_cached = s.cached_bytes;
    if (s.budget_limit != BUDGET_BYTES) fail("observer: budget_limit %lu", (unsigned long)s.budget_limit);
    if (s.outstanding_bytes > s.budget_limit) {
      fail("observer: outstanding %lu bytes exceeds the budget %lu", (unsigned long)s.outstanding_bytes,
           (unsigned long)s.budget_limit);
    }
    if (s.outstanding_bytes != s.live_bytes + s.cached_bytes + s.pending_bytes) {
      fail("observer: outstanding %lu != live %lu + cached %lu + pending %lu", (unsigned long)s.outstanding_bytes,
           (unsigned long)s.live_bytes, (unsigned long)s.cached_bytes, (unsigned long)s.pending_bytes);
    }
    if (s.peak_outstanding_bytes > s.budget_limit) {
      fail("observer: peak %lu exceeds the budget", (unsigned long)s.peak_outstanding_bytes);
    }
    pthread_mutex_lock(&g_mu);
    done = g_workers_done == THREADS || g_failures > 0;
    pthread_mutex_unlock(&g_mu);
    if (done) return NULL;
    nanosleep(&pause, NULL);
  }
}

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) fail("%s:%d: check failed: %s", __FILE__, __LINE__, #cond);     \
  } while (0)

#define CHECK_OK(call)                                                           \
  do {                                                                           \
    char check_msg_[512];                                                        \
    xlog_status check_st_ = (call);                                              \
    if (check_st_ != XLOG_OK) {                                                  \
      fail("%s:%d: %s returned %s: %s", __FILE__, __LINE__, #call,               \
           xlog_status_name(check_st_), last_error(check_msg_, sizeof check_msg_)); \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main(void) {
  xlog_config cfg;
  xlog_stream main_stream;
  xlog_block shared;
  struct worker workers[THREADS];
  pthread_t threads[THREADS];
  pthread_t observer_thread;
  struct observer obs;
  xlog_stats s;
  unsigned long allocations = 1, out_of_budget = 0, frees = 0;
  uint64_t drained = 0, trimmed = 0, leaked_blocks = 99, leaked_bytes = 99;
  int i;

  unsetenv("XLOG_BACKEND");
  unsetenv("XLOG_BUDGET_BYTES");
  unsetenv("XLOG_LOG_PATH");
  unsetenv("XLOG_CACHE");
  xlog_config_init(&cfg);
  cfg.backend = XLOG_BACKEND_SIM;
  cfg.budget_bytes = BUDGET_BYTES;
  cfg.stream_pool_size = THREADS + 1;
  CHECK_OK(xlog_runtime_open(0, &cfg, &g_rt));
  CHECK_OK(xlog_stream_acquire(g_rt, &main_stream));
  CHECK_OK(xlog_allocate(g_rt, 4096, main_stream, "shared", &shared));
  CHECK_OK(xlog_prepare(g_rt, shared, main_stream, XLOG_ACCESS_WRITE));
  CHECK_OK(xlog_finish(g_rt, shared, main_stream, XLOG_ACCESS_WRITE));

  for (i = 0; i < THREADS; ++i) {
    memset(&workers[i], 0, sizeof workers[i]);
    workers[i].index = i;
    workers[i].shared = shared;
    CHECK_OK(xlog_stream_acquire(g_rt, &workers[i].stream));
  }
  memset(&obs, 0, sizeof obs);
  if (pthread_create(&observer_thread, NULL, observer_main, &obs) != 0) {
    fprintf(stderr, "FAIL: pthread_create\n");
    return 1;
  }
  for (i = 0; i < THREADS; ++i) {
    if (pthread_create(&threads[i], NULL, worker_main, &workers[i]) != 0) {
      fprintf(stderr, "FAIL: pthread_create\n");
      return 1;
    }
  }
  for (i = 0; i < THREADS; ++i) pthread_join(threads[i], NULL);
  pthread_join(observer_thread, NULL);

  for (i = 0; i < THREADS; ++i) {
    allocations += workers[i].allocations;
    out_of_budget += workers[i].out_of_budget;
    frees += workers[i].frees;
  }
  printf("threads %d x %d iterations: %lu allocations, %lu OUT_OF_BUDGET, %lu frees; "
         "observer: %lu samples, max outstanding %lu of %u, max pending %lu, max cached %lu\n",
         THREADS, ITERATIONS, allocations - 1, out_of_budget, frees, obs.samples,
         (unsigned long)obs.max_outstanding, BUDGET_BYTES, (unsigned long)obs.max_pending,
         (unsigned long)obs.max_cached);

  CHECK(obs.samples > 10);
  CHECK(frees == allocations - 1);

  CHECK_OK(xlog_deallocate(g_rt, shared));
  CHECK_OK(xlog_trim(g_rt, 0, &trimmed));
  CHECK_OK(xlog_drain(g_rt, &drained));
  s.struct_size = sizeof s;
  CHECK_OK(xlog_get_stats(g_rt, &s));
  printf("after trim %lu + drain %lu: allocations %lu, failed %lu, cache hits %lu, misses %lu\n",
         (unsigned long)trimmed, (unsigned long)drained, (unsigned long)s.allocations,
         (unsigned long)s.failed_allocations, (unsigned long)s.cache_hits, (unsigned long)s.cache_misses);
  CHECK(obs.max_cached > 0);
  CHECK(s.cached_bytes == 0);
  CHECK(s.cached_blocks == 0);
  CHECK(s.cache_hits > 0);
  /* Each successful call is one hit or one miss; a refused one neither. */
  CHECK(s.cache_hits + s.cache_misses <= s.allocations);
  CHECK(s.outstanding_bytes == 0);
  CHECK(s.live_bytes == 0);
  CHECK(s.pending_bytes == 0);
  CHECK(s.live_blocks == 0);
  CHECK(s.pending_blocks == 0);
  CHECK(s.budget_remaining == BUDGET_BYTES);
  CHECK(s.allocations == allocations);
  CHECK(s.deallocations == frees + 1);
  CHECK(s.failed_allocations == out_of_budget);
  CHECK(s.peak_outstanding_bytes <= BUDGET_BYTES);
  /* Budget pressure really happened, so the budget checks were not idle:
     requests were refused, or the charge reached the limit itself. */
  CHECK(out_of_budget > 0 || s.peak_outstanding_bytes == BUDGET_BYTES);
  CHECK(s.peak_outstanding_bytes > BUDGET_BYTES / 2);

  CHECK_OK(xlog_runtime_close_report(g_rt, &leaked_blocks, &leaked_bytes));
  CHECK(leaked_blocks == 0);
  CHECK(leaked_bytes == 0);

  if (failures() != 0) {
    fprintf(stderr, "%d failure(s)\n", failures());
    return 1;
  }
  printf("PASS\n");
  return 0;
}
