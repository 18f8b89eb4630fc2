/*
 * benches/bench_peer.h — the interface between xlog_bench and the peers it
 * loads at run time (RMM, PyTorch's caching allocator).
 *
 * Each peer library lives beside the xlog_bench executable
 * (libxlog_bench_rmm.so, libxlog_bench_torch.so) and exports one function,
 * xlog_bench_peers(). Keeping the heavy peers in their own shared objects,
 * built as separate targets, means a peer that fails to build (or to load)
 * costs only its own rows, which xlog_bench then reports as MISSING with
 * the reason, instead of taking the whole benchmark down.
 *
 * Everything crosses this boundary as plain C: streams are `cudaStream_t`
 * values (the same as `CUstream`) passed as void*.
 */
#ifndef XLOG_BENCH_PEER_H
#define XLOG_BENCH_PEER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XLOG_BENCH_PEER_ABI 1

/* Result of xlog_bench_peer.allocate. */
#define XLOG_BENCH_ALLOC_OK 0
/* Refused: out of memory, or over the peer's own limit. */
#define XLOG_BENCH_ALLOC_REFUSED 1
/* Anything else (a driver error, an exception of another kind). */
#define XLOG_BENCH_ALLOC_ERROR 2

typedef struct xlog_bench_peer {
  /* Short stable name used in the CSV ("rmm-async"). */
  const char* name;
  /* 1 if the peer takes a byte limit (create's limit_bytes is honoured). */
  int takes_limit;
  /* Make one instance on the current device. limit_bytes is 0 for "no
   * limit". Returns NULL on failure with the reason in err. */
  void* (*create)(uint64_t limit_bytes, char* err, size_t err_cap);
  void (*destroy)(void* instance);
  /* Stream-ordered allocate/free on `stream`. On REFUSED or ERROR the
   * reason is copied into err (may be NULL). */
  int (*allocate)(void* instance, size_t bytes, void* stream, void** out, char* err, size_t err_cap);
  void (*deallocate)(void* instance, void* ptr, size_t bytes, void* stream);
  /* Give cached memory back where the peer caches (may be NULL). Called
   * between measurements with the device idle. */
  void (*trim)(void* instance);
} xlog_bench_peer;

/* Exported by each peer library. Fills *peers with a static array and
 * returns its length; returns -1 with the reason in err when the library
 * cannot offer any peer (for example no device). */
typedef int (*xlog_bench_peers_fn)(int abi, const xlog_bench_peer** peers, char* err, size_t err_cap);

#ifdef __cplusplus
}
#endif

#endif /* XLOG_BENCH_PEER_H */
