// SPDX-License-Identifier: MIT
// src/cuda/engine.cu (with upload.cu, monitors.cu, the persistent kernel
// megakernel.cuh, the task bodies ops.cuh and the device monitors bpf_dev.cuh),
// compiled by g++ for the CPU (tests/test_engine_host.c). The CUDA runtime is
// tests/emu's, on host memory; every CTA is 256 fibers with CTA and warp
// barriers (tests/emu/cta_emu.h), so the megakernel's thread-0 logic, its
// barriers and the task bodies run with a whole CTA's semantics:
//   - the cooperative launch of the persistent kernel (cudaLaunchCooperativeKernel,
//     defined here) runs each CTA on an OS thread of its own, all at once (they
//     wait on each other's events, as on the device); the kernel's stream is
//     not ready while any runs, and cudaStreamSynchronize joins them;
//   - the per-op baseline's level kernels (engine.cu's MSD_HOST_EMU launch)
//     go through ms_emu_launch: captured into the CUDA Graph, replayed in order
//     by cudaGraphLaunch, each kernel's CTAs one after another on the caller.
// A CTA of the persistent kernel that fails in the emulation (a deadlock, a
// divergent barrier) aborts the process: the other CTAs would wait on it for
// ever, as a trapped kernel leaves the device. The real build compiles these
// files with nvcc, untouched by this one.
#define MS_EMU_CUDA_IMPL
#include "cuda_runtime.h"  // tests/emu: before any <cuda_runtime.h>
#include "cta_emu.h"

#include <pthread.h>

// What cuda/host_emu.h gives the persistent kernel in its C world: fences and
// the one atomic it uses, with the same orders.
#define MSD_EMU_FENCE(order) __atomic_thread_fence(order)
static inline void __threadfence(void) { MSD_EMU_FENCE(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system(void) { MSD_EMU_FENCE(__ATOMIC_SEQ_CST); }
static inline uint32_t atomicAdd(uint32_t *p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

#include "../../src/cuda/upload.cu"
#include "../../src/cuda/monitors.cu"
#include "cuda/ops.cuh"

extern "C" {
#include "megascope/cuda.h"
#include "megascope/cuda_diag.h"
#include "megascope/json.h"
#include "megascope/plan_ir.h"
}
#include "cuda/megakernel.cuh"

// A kernel of `grid` CTAs on stream s (captured while s captures): each CTA
// runs kernel() on 256 fibers, one CTA after another.
template <class F>
static cudaError_t ms_emu_launch(cudaStream_t s, int grid, F kernel) {
  return ms_emu_stream_enqueue(s, [grid, kernel]() -> cudaError_t {
    const char *why = NULL;
    if (msd_emu_launch(grid, kernel, &why) == 0) return cudaSuccess;
    fprintf(stderr, "emulated kernel (%d CTAs): %s\n", grid, why);
    return cudaErrorLaunchFailure;
  });
}

// ---- the cooperative launch: one OS thread per CTA ----

struct ms_emu_coop;
struct ms_emu_coop_cta {
  ms_emu_coop *c;
  int block;
};
struct ms_emu_coop {
  struct msd_rt rt;  // the kernel's argument, by value
  int grid;
  cudaStream_t s;
  pthread_t th[1024];
  ms_emu_coop_cta cta[1024];
  int n_started;
};

static void *ms_emu_coop_cta_main(void *a) {
  const ms_emu_coop_cta *me = (const ms_emu_coop_cta *)a;
  ms_emu_coop *c = me->c;
  const char *why = NULL;
  if (msd_emu_launch_cta(me->block, c->grid, [c] { msd_megakernel(c->rt); }, &why)) {
    fprintf(stderr, "emulated persistent kernel, CTA %d: %s\n", me->block, why);
    abort();
  }
  msd_emu_release();
  if (__atomic_fetch_sub(&c->s->live, 1, __ATOMIC_ACQ_REL) == 1)  // the kernel's last CTA: it is over
    __atomic_fetch_sub(&ms_emu_cuda_kernels, 1, __ATOMIC_RELEASE);
  return NULL;
}

static cudaError_t ms_emu_coop_join(cudaStream_t s) {
  ms_emu_coop *c = (ms_emu_coop *)s->join_arg;
  for (int i = 0; i < c->n_started; i++) pthread_join(c->th[i], NULL);
  s->join = NULL;
  s->join_arg = NULL;
  delete c;
  return cudaSuccess;
}

static cudaError_t cudaLaunchCooperativeKernel(const void *fn, dim3 grid, dim3 block, void **args, size_t smem,
                                               cudaStream_t s) {
  if (fn != (const void *)msd_megakernel || block.x != MSD_THREADS || grid.x < 1 || grid.x > 1024 || smem ||
      !s || s == cudaStreamLegacy)
    return cudaErrorInvalidValue;
  if (s->join) ms_emu_coop_join(s);  // stream order: the previous kernel first
  ms_emu_coop *c = new ms_emu_coop();
  c->rt = *(const struct msd_rt *)args[0];
  c->grid = (int)grid.x;
  c->s = s;
  s->join = ms_emu_coop_join;
  s->join_arg = c;
  __atomic_store_n(&s->live, (int)grid.x, __ATOMIC_RELEASE);
  __atomic_fetch_add(&ms_emu_cuda_kernels, 1, __ATOMIC_RELEASE);  // calls that could wait for it are counted now
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 1 << 20);
  for (int b = 0; b < c->grid; b++) {
    c->cta[b] = ms_emu_coop_cta{c, b};
    if (pthread_create(&c->th[b], &at, ms_emu_coop_cta_main, &c->cta[b])) {
      // a cooperative launch is all or nothing; the started CTAs would wait for ever
      fprintf(stderr, "emulated persistent kernel: cannot start CTA %d of %d\n", b, c->grid);
      abort();
    }
    c->n_started++;
  }
  pthread_attr_destroy(&at);
  return cudaSuccess;
}

#undef CK  // upload.cu's; engine.cu has its own
#include "../../src/cuda/engine.cu"
