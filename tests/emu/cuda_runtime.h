/* SPDX-License-Identifier: MIT */
/* A CUDA runtime on host memory, for tests only: the few calls
 * src/cuda/monitors.cu, upload.cu and ops_check.cu make, so that they compile
 * with g++ (through tests/emu/monitors_emu.cc and tests/emu/ops_emu.cc) and
 * drive the device-monitor code
 * (src/cuda/bpf_dev.cuh) that the persistent kernel runs on CPU threads
 * (src/cuda/host_emu.h, tests/test_monitors_host.c).
 *
 * "Device memory" is host memory shared with those threads. What the
 * emulation keeps of the device's guarantees, and what it adds:
 *   - copies move aligned 8-byte words with acquire loads and release stores
 *     (what the device sees of a copy: no torn pointer or counter, and a
 *     pointer published after the copy of what it points to), as ThreadSanitizer
 *     understands them (no fences). Streams are dummies: every call completes
 *     before it returns.
 *   - freed memory is poisoned (0xdb) and kept in quarantine, so a set, a
 *     program or a map freed while a kernel thread still holds it reads as
 *     garbage (a crash or a failed run) instead of going unnoticed;
 *     ms_emu_cuda_drain() releases the quarantine.
 *   - ms_emu_cuda_fail_alloc = N makes the N-th allocation from now fail with
 *     cudaErrorMemoryAllocation (error paths).
 * Defines __CUDA_RUNTIME_H__, the real header's guard, so that an
 * #include <cuda_runtime.h> after this one is empty. */
#ifndef MS_TESTS_EMU_CUDA_RUNTIME_H
#define MS_TESTS_EMU_CUDA_RUNTIME_H
#define __CUDA_RUNTIME_H__

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
};

#define cudaStreamNonBlocking 0x01

struct ms_emu_stream {
  int flags;
};
typedef struct ms_emu_stream *cudaStream_t;

/* the test's knobs (defined in tests/emu/monitors_emu.cc) */
extern int ms_emu_cuda_fail_alloc;      /* fail the N-th allocation from now; 0: none */
extern uint64_t ms_emu_cuda_live;       /* allocations not yet freed */
void ms_emu_cuda_drain(void);           /* frees the quarantine */

#ifdef MS_EMU_CUDA_IMPL
int ms_emu_cuda_fail_alloc;
uint64_t ms_emu_cuda_live;

/* an allocation: its size in front, 64 bytes so the user part stays aligned */
struct ms_emu_block {
  size_t size;
  struct ms_emu_block *next;   /* in quarantine */
  char pad[48];
};
static struct ms_emu_block *ms_emu_quarantine;

void ms_emu_cuda_drain(void) {
  while (ms_emu_quarantine) {
    struct ms_emu_block *b = ms_emu_quarantine;
    ms_emu_quarantine = b->next;
    free(b);
  }
}
#endif

static inline const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  default: return "unknown error";
  }
}

static inline const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  default: return "cudaErrorUnknown";
  }
}

/* one "device", always there; launches (tests/emu/cta_emu.h) complete before they return */
static inline cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  *s = (cudaStream_t)calloc(1, sizeof **s);
  if (!*s) return cudaErrorMemoryAllocation;
  (*s)->flags = (int)flags;
  return cudaSuccess;
}

static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  free(s);
  return cudaSuccess;
}

static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;  /* every call completed already; copies order themselves (word by word) */
  return cudaSuccess;
}

#ifdef MS_EMU_CUDA_IMPL
static inline cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  (void)s;
  *p = NULL;
  if (ms_emu_cuda_fail_alloc > 0 && --ms_emu_cuda_fail_alloc == 0) return cudaErrorMemoryAllocation;
  struct ms_emu_block *b = (struct ms_emu_block *)malloc(sizeof *b + n);
  if (!b) return cudaErrorMemoryAllocation;
  b->size = n;
  b->next = NULL;
  memset(b + 1, 0xa5, n);  /* as uninitialised as the device's */
  ms_emu_cuda_live++;
  *p = b + 1;
  return cudaSuccess;
}

static inline cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  if (!p) return cudaSuccess;
  struct ms_emu_block *b = (struct ms_emu_block *)p - 1;
  memset(p, 0xdb, b->size);
  b->next = ms_emu_quarantine;
  ms_emu_quarantine = b;
  ms_emu_cuda_live--;
  return cudaSuccess;
}
#endif

static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                                          cudaStream_t s) {
  (void)k, (void)s;
  if (((uintptr_t)dst | (uintptr_t)src | n) % 8 == 0) {
    uint64_t *d = (uint64_t *)dst;
    const uint64_t *r = (const uint64_t *)src;
    for (size_t i = 0; i < n / 8; i++) __atomic_store_n(&d[i], __atomic_load_n(&r[i], __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
  } else {
    memcpy(dst, src, n);
  }
  return cudaSuccess;
}

static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);

/* the synchronous calls: the default stream */
#ifdef MS_EMU_CUDA_IMPL
static inline cudaError_t cudaMalloc(void **p, size_t n) { return cudaMallocAsync(p, n, NULL); }
static inline cudaError_t cudaFree(void *p) { return cudaFreeAsync(p, NULL); }
#endif
static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
  return cudaMemcpyAsync(dst, src, n, k, NULL);
}
static inline cudaError_t cudaMemset(void *p, int v, size_t n) { return cudaMemsetAsync(p, v, n, NULL); }

static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  (void)s;
  memset(p, v, n);  /* only on fresh allocations, before anything publishes them */
  return cudaSuccess;
}

#ifdef __cplusplus
}
#if defined(MS_EMU_CUDA_IMPL)
template <class T>
static inline cudaError_t cudaMalloc(T **p, size_t n) {  /* the real header's typed overload */
  return cudaMalloc((void **)p, n);
}
#endif
#endif
#endif
