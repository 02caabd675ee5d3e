/* SPDX-License-Identifier: MIT */
/* A CUDA runtime on host memory, for tests only: the few calls
 * src/cuda/monitors.cu, upload.cu, ops_check.cu and engine.cu make, so that
 * they compile with g++ (through tests/emu/monitors_emu.cc, ops_emu.cc and
 * engine_emu.cc) and drive the device-monitor code
 * (src/cuda/bpf_dev.cuh) that the persistent kernel runs on CPU threads
 * (src/cuda/host_emu.h, tests/test_monitors_host.c).
 *
 * "Device memory" is host memory shared with those threads. What the
 * emulation keeps of the device's guarantees, and what it adds:
 *   - copies move aligned 8-byte words with acquire loads and release stores
 *     (what the device sees of a copy: no torn pointer or counter, and a
 *     pointer published after the copy of what it points to), as ThreadSanitizer
 *     understands them (no fences). Every call completes before it returns,
 *     except a cooperative launch (tests/emu/engine_emu.cc: the persistent
 *     kernel's CTAs on OS threads), which its stream tracks: cudaStreamQuery
 *     says not ready while it runs, cudaStreamSynchronize joins it. A capture
 *     records launches into a graph that cudaGraphLaunch replays in order.
 *   - freed memory is poisoned (0xdb) and kept in quarantine, so a set, a
 *     program or a map freed while a kernel thread still holds it reads as
 *     garbage (a crash or a failed run) instead of going unnoticed; blocks
 *     from 8 MiB up are mapped instead, and returned at the free (below);
 *     ms_emu_cuda_drain() releases the quarantine ($MS_EMU_QUARANTINE_KIB bounds it);
 *   - ms_emu_cuda_fail_alloc = N makes the N-th allocation from now fail with
 *     cudaErrorMemoryAllocation (error paths);
 *   - while a cooperative kernel runs (ms_emu_cuda_kernels > 0), every call
 *     that on a GPU may allocate, free, synchronise with the device or need an
 *     SM (a memset can be a kernel) is counted in ms_emu_cuda_blocking, the
 *     last one named in ms_emu_cuda_blocking_what: with every SM held by the
 *     resident kernel such a call may wait for ever, so code that runs beside
 *     it must make none. Copies host to device and back on a non-blocking
 *     stream, and synchronising or querying such a stream, are not counted.
 * Defines __CUDA_RUNTIME_H__, the real header's guard, so that an
 * #include <cuda_runtime.h> after this one is empty. */
#ifndef MS_TESTS_EMU_CUDA_RUNTIME_H
#define MS_TESTS_EMU_CUDA_RUNTIME_H
#define __CUDA_RUNTIME_H__

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotReady = 600,
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
};

#define cudaStreamNonBlocking 0x01
#define cudaHostAllocDefault 0x00
#define cudaHostAllocMapped 0x02

/* A stream. Calls on it complete before they return, except the kernels that
 * tests/emu/engine_emu.cc launches on OS threads (the persistent kernel): the
 * stream counts them in `live` (cudaStreamQuery: not ready while any runs) and
 * cudaStreamSynchronize joins them (through `join`). Between
 * cudaStreamBeginCapture and cudaStreamEndCapture, a launch through
 * ms_emu_stream_enqueue (C++, below) is recorded instead of run. */
struct ms_emu_stream {
  int flags;
  int live;                                  /* kernel threads still running (atomic) */
  cudaError_t err;                           /* a launch's error, returned by the next synchronisation */
  void *capture;                             /* C++: the graph being recorded, or NULL */
  cudaError_t (*join)(struct ms_emu_stream *); /* waits for the kernel threads, or NULL */
  void *join_arg;
};
typedef struct ms_emu_stream *cudaStream_t;
/* the legacy default stream: its calls complete before they return */
#define cudaStreamLegacy ((cudaStream_t)0x1)

/* the test's knobs (defined where MS_EMU_CUDA_IMPL is) */
extern int ms_emu_cuda_fail_alloc;      /* fail the N-th allocation from now; 0: none */
extern uint64_t ms_emu_cuda_live;       /* allocations not yet freed */
extern int ms_emu_cuda_kernels;         /* cooperative kernels running (atomic) */
extern uint64_t ms_emu_cuda_blocking;   /* calls that may wait for a running kernel (atomic) */
extern const char *ms_emu_cuda_blocking_what;  /* the last one's name */
void ms_emu_cuda_drain(void);           /* frees the quarantine */
void ms_emu_cuda_malloc_free(void);     /* a cudaMallocAsync and its cudaFreeAsync, for C tests */

/* A call that on a GPU may wait for the device: counted while a kernel runs. */
static inline void ms_emu_blocking(const char *what) {
  if (!__atomic_load_n(&ms_emu_cuda_kernels, __ATOMIC_ACQUIRE)) return;
  __atomic_store_n(&ms_emu_cuda_blocking_what, what, __ATOMIC_RELAXED);
  __atomic_fetch_add(&ms_emu_cuda_blocking, 1, __ATOMIC_RELEASE);
}

#ifdef MS_EMU_CUDA_IMPL
int ms_emu_cuda_fail_alloc;
uint64_t ms_emu_cuda_live;
int ms_emu_cuda_kernels;
uint64_t ms_emu_cuda_blocking;
const char *ms_emu_cuda_blocking_what;

/* an allocation: its size in front, 64 bytes so the user part stays aligned */
struct ms_emu_block {
  size_t size;
  struct ms_emu_block *next;   /* in quarantine */
  char pad[48];
};
static struct ms_emu_block *ms_emu_quarantine;
static size_t ms_emu_quarantine_bytes;

void ms_emu_cuda_drain(void) {
  while (ms_emu_quarantine) {
    struct ms_emu_block *b = ms_emu_quarantine;
    ms_emu_quarantine = b->next;
    free(b);
  }
  ms_emu_quarantine_bytes = 0;
}

/* The quarantine's bound in bytes: $MS_EMU_QUARANTINE_KIB (a soak of a
 * long-running process sets it, so that what its RSS shows is what the code
 * keeps), unbounded when unset. Past it the quarantine is drained whole. */
static long long ms_emu_quarantine_cap(void) {
  static long long cap = -2;
  if (cap == -2) {
    const char *v = getenv("MS_EMU_QUARANTINE_KIB");
    cap = v && *v ? atoll(v) * 1024 : -1;
  }
  return cap;
}
#endif

static inline const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorNotReady: return "device not ready";
  default: return "unknown error";
  }
}

static inline const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  default: return "cudaErrorUnknown";
  }
}

/* one "device", always there; launches (tests/emu/cta_emu.h) complete before they return */
static inline cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize(void) {
  ms_emu_blocking("cudaDeviceSynchronize");
  return cudaSuccess;
}

static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  ms_emu_blocking("cudaStreamCreateWithFlags");
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
  /* every call completed already (copies order themselves, word by word),
   * except the kernel threads of an emulated cooperative launch: join them */
  if (!s || s == cudaStreamLegacy) {
    ms_emu_blocking("cudaStreamSynchronize on the legacy stream");
    return cudaSuccess;
  }
  if (__atomic_load_n(&s->live, __ATOMIC_ACQUIRE)) ms_emu_blocking("cudaStreamSynchronize on a running kernel's stream");
  cudaError_t e = s->join ? s->join(s) : cudaSuccess;
  if (e == cudaSuccess) e = s->err;
  s->err = cudaSuccess;
  return e;
}

static inline cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (!s || s == cudaStreamLegacy) return cudaSuccess;
  return __atomic_load_n(&s->live, __ATOMIC_ACQUIRE) ? cudaErrorNotReady : cudaSuccess;
}

/* the device: one, with a few SMs (each CTA of a cooperative launch is an OS thread) */
typedef struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int multiProcessorCount, major, minor;
} cudaDeviceProp;
enum cudaDeviceAttr {
  cudaDevAttrCooperativeLaunch = 95,
  cudaDevAttrMemoryClockRate = 36,
  cudaDevAttrGlobalMemoryBusWidth = 37,
};
#define MS_EMU_CUDA_SMS 4
static inline cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
  if (d != 0) return cudaErrorInvalidValue;
  memset(p, 0, sizeof *p);
  strcpy(p->name, "emulated");
  p->totalGlobalMem = (size_t)1 << 30;
  p->multiProcessorCount = MS_EMU_CUDA_SMS;
  p->major = 9;
  return cudaSuccess;
}
static inline cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
  (void)d;
  *v = a == cudaDevAttrCooperativeLaunch ? 1 : a == cudaDevAttrMemoryClockRate ? 1000000 : 1024;
  return cudaSuccess;
}

#ifdef MS_EMU_CUDA_IMPL
/* Blocks from MS_EMU_BIG up (the monitors' arena, weights, KV pools, logits)
 * are mapped, neither poisoned nor quarantined: their pages cost nothing until
 * touched and go back to the system at the free, so that an engine's 48 MiB
 * arena is not held for ever by every engine a test makes. Each is freed
 * only once no kernel runs; what code inside one hands out is poisoned there
 * (monitors.cu poisons the arena's spans when given and when freed), and the
 * rest is written before it is read (upload.cu clears weights and state). */
#define MS_EMU_BIG ((size_t)8 << 20)

static inline cudaError_t ms_emu_alloc(void **p, size_t n) {
  *p = NULL;
  if (ms_emu_cuda_fail_alloc > 0 && --ms_emu_cuda_fail_alloc == 0) return cudaErrorMemoryAllocation;
  if (n >= MS_EMU_BIG) {
    void *m = mmap(NULL, sizeof(struct ms_emu_block) + n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
    ((struct ms_emu_block *)m)->size = n;
    ms_emu_cuda_live++;
    *p = (struct ms_emu_block *)m + 1;
    return cudaSuccess;
  }
  struct ms_emu_block *b = (struct ms_emu_block *)malloc(sizeof *b + n);
  if (!b) return cudaErrorMemoryAllocation;
  b->size = n;
  b->next = NULL;
  memset(b + 1, 0xa5, n);  /* as uninitialised as the device's */
  ms_emu_cuda_live++;
  *p = b + 1;
  return cudaSuccess;
}

static inline cudaError_t ms_emu_free(void *p) {
  if (!p) return cudaSuccess;
  struct ms_emu_block *b = (struct ms_emu_block *)p - 1;
  if (b->size >= MS_EMU_BIG) {
    ms_emu_cuda_live--;
    munmap(b, sizeof *b + b->size);
    return cudaSuccess;
  }
  memset(p, 0xdb, b->size);
  b->next = ms_emu_quarantine;
  ms_emu_quarantine = b;
  ms_emu_quarantine_bytes += b->size;
  ms_emu_cuda_live--;
  long long cap = ms_emu_quarantine_cap();
  if (cap >= 0 && ms_emu_quarantine_bytes > (size_t)cap) ms_emu_cuda_drain();
  return cudaSuccess;
}

static inline cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  (void)s;
  ms_emu_blocking("cudaMallocAsync");
  return ms_emu_alloc(p, n);
}

static inline cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  ms_emu_blocking("cudaFreeAsync");
  return ms_emu_free(p);
}

void ms_emu_cuda_malloc_free(void) {
  void *p = NULL;
  cudaMallocAsync(&p, 64, NULL);
  cudaFreeAsync(p, NULL);
}
#endif

/* A copy; dst and src as the call gives them (the emulation's copies order
 * themselves word by word). */
static inline void ms_emu_copy(void *dst, const void *src, size_t n) {
  if (((uintptr_t)dst | (uintptr_t)src | n) % 8 == 0) {
    uint64_t *d = (uint64_t *)dst;
    const uint64_t *r = (const uint64_t *)src;
    for (size_t i = 0; i < n / 8; i++) __atomic_store_n(&d[i], __atomic_load_n(&r[i], __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
  } else {
    memcpy(dst, src, n);
  }
}

/* Host to device and back on a non-blocking stream: the copy engine's, never
 * waiting for an SM; on the legacy stream, or device to device (which may be a
 * kernel), counted as a call that may wait. */
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                                          cudaStream_t s) {
  if (!s || s == cudaStreamLegacy)
    ms_emu_blocking("cudaMemcpyAsync on the legacy stream");
  else if (k == cudaMemcpyDeviceToDevice)
    ms_emu_blocking("cudaMemcpyAsync device to device");
  ms_emu_copy(dst, src, n);
  return cudaSuccess;
}

static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  (void)s;
  ms_emu_blocking("cudaMemsetAsync");  /* a memset may be a kernel: it needs an SM */
  memset(p, v, n);  /* only on fresh allocations or memory no kernel runs on */
  return cudaSuccess;
}

/* the synchronous calls: the default stream */
#ifdef MS_EMU_CUDA_IMPL
static inline cudaError_t cudaMalloc(void **p, size_t n) {
  ms_emu_blocking("cudaMalloc");
  return ms_emu_alloc(p, n);
}
static inline cudaError_t cudaFree(void *p) {
  ms_emu_blocking("cudaFree");
  return ms_emu_free(p);
}
#endif
static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
  (void)k;
  ms_emu_blocking("cudaMemcpy");
  ms_emu_copy(dst, src, n);
  return cudaSuccess;
}
static inline cudaError_t cudaMemset(void *p, int v, size_t n) {
  ms_emu_blocking("cudaMemset");
  memset(p, v, n);
  return cudaSuccess;
}

#ifdef MS_EMU_CUDA_IMPL
/* host-mapped memory: the device pointer is the host pointer */
static inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
  (void)flags;
  ms_emu_blocking("cudaHostAlloc");
  return ms_emu_alloc(p, n);
}
static inline cudaError_t cudaFreeHost(void *p) {
  ms_emu_blocking("cudaFreeHost");
  return ms_emu_free(p);
}
#endif
static inline cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned flags) {
  (void)flags;
  *d = h;
  return cudaSuccess;
}

/* Events: a stream's calls complete before they return (but a cooperative
 * kernel's), so an event records the host's clock when it is recorded. */
typedef struct ms_emu_event {
  uint64_t t;
} *cudaEvent_t;
static inline uint64_t ms_emu_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t *ev) {
  ms_emu_blocking("cudaEventCreate");
  *ev = (cudaEvent_t)calloc(1, sizeof **ev);
  return *ev ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  free(ev);
  return cudaSuccess;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  (void)s;
  ev->t = ms_emu_clock();
  return cudaSuccess;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  (void)ev;
  return cudaSuccess;
}
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = (float)((double)(b->t - a->t) / 1e6);
  return cudaSuccess;
}

#ifdef __cplusplus
}
#if defined(MS_EMU_CUDA_IMPL)
template <class T>
static inline cudaError_t cudaMalloc(T **p, size_t n) {  /* the real header's typed overload */
  return cudaMalloc((void **)p, n);
}
template <class T>
static inline cudaError_t cudaHostAlloc(T **p, size_t n, unsigned flags) {
  return cudaHostAlloc((void **)p, n, flags);
}
#endif

#include <functional>
#include <vector>

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

template <class F>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F fn, int threads, size_t smem) {
  (void)fn, (void)threads, (void)smem;
  *n = 1;
  return cudaSuccess;
}

/* CUDA Graphs: a graph is the launches recorded by a capture, replayed in order
 * (each completes before the next starts, as the stream's order asks). */
struct ms_emu_graph {
  std::vector<std::function<cudaError_t()>> launches;
};
typedef struct ms_emu_graph *cudaGraph_t;
typedef struct ms_emu_graph *cudaGraphExec_t;
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1 };

/* A kernel launch on s (the emulation's launch function, closed over its
 * arguments): recorded while s captures, else run now (errors stick to s). */
static inline cudaError_t ms_emu_stream_enqueue(cudaStream_t s, std::function<cudaError_t()> launch) {
  if (s && s != cudaStreamLegacy && s->capture) {
    ((ms_emu_graph *)s->capture)->launches.push_back(std::move(launch));
    return cudaSuccess;
  }
  cudaError_t e = launch();
  if (e != cudaSuccess && s && s != cudaStreamLegacy && s->err == cudaSuccess) s->err = e;
  return e;
}

static inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  (void)mode;
  if (!s || s == cudaStreamLegacy || s->capture) return cudaErrorInvalidValue;
  s->capture = new ms_emu_graph;
  return cudaSuccess;
}
static inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  if (!s || s == cudaStreamLegacy || !s->capture) return cudaErrorInvalidValue;
  *g = (ms_emu_graph *)s->capture;
  s->capture = NULL;
  return cudaSuccess;
}
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags) {
  (void)flags;
  *x = new ms_emu_graph(*g);
  return cudaSuccess;
}
static inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
  delete x;
  return cudaSuccess;
}
static inline cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) {
  for (auto &l : x->launches) {
    cudaError_t e = l();
    if (e != cudaSuccess) {
      if (s && s != cudaStreamLegacy && s->err == cudaSuccess) s->err = e;
      break;
    }
  }
  return cudaSuccess;  /* as on the device: a kernel's failure shows at the next synchronisation */
}
#endif
#endif
