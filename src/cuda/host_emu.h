/* SPDX-License-Identifier: MIT */
/* The persistent kernel's scheduling code on the CPU (private; tests only).
 *
 * megakernel.cuh is written so that, with MSD_HOST_EMU defined and this header
 * included first, it compiles as C11: every CTA becomes one host thread (so a
 * CTA barrier is a no-op and __shared__ is thread-local), GPU-scope atomics
 * become C11 atomics of the same order, %globaltimer the monotonic clock. The
 * includer supplies the task bodies (msd_task_run, msd_task_prefetch) and the
 * hook functions (msd_hook_armed, msd_hook_fire, msd_hook_sched_hint,
 * msd_hooks_quiescent): fakes, or the real ones of cuda/bpf_dev.cuh, which
 * also compiles here (tests/test_monitors_host.c, with monitors.cu on
 * tests/emu's host-memory CUDA runtime). This runs the scheduler, the queues, the event
 * protocol, admission and the step loop exactly as written for the device,
 * which is what tests/test_megakernel_host.c checks against the CPU engine;
 * it says nothing about the warp-level task bodies (test_cuda_ops does on a
 * GPU; test_ops_host on the CPU, through tests/emu/cta_emu.h, a C++ emulation
 * of a whole 256-thread CTA). */
#ifndef MS_CUDA_HOST_EMU_H
#define MS_CUDA_HOST_EMU_H

#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define MSD_HOST_EMU 1
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static __thread

struct msd_emu_dim {
  unsigned x, y, z;
};
extern __thread struct msd_emu_dim blockIdx;  /* the CTA this thread plays */
static const struct msd_emu_dim threadIdx = {0, 0, 0};

#define __syncthreads() ((void)0)
static inline void __nanosleep(unsigned ns) {
  (void)ns;
  sched_yield();  /* more CTAs than cores: let the producers run */
}
/* A fence. ThreadSanitizer does not model stand-alone fences (gcc warns, and
 * -Werror stops the build), so there a seq_cst read-modify-write stands in. */
#if defined(__SANITIZE_THREAD__)
static int msd_emu_fence_word;
#define MSD_EMU_FENCE(order) ((void)__atomic_fetch_add(&msd_emu_fence_word, 0, __ATOMIC_SEQ_CST))
#else
#define MSD_EMU_FENCE(order) __atomic_thread_fence(order)
#endif
static inline void __threadfence(void) { MSD_EMU_FENCE(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system(void) { MSD_EMU_FENCE(__ATOMIC_SEQ_CST); }
static inline uint32_t atomicAdd(uint32_t *p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

#endif
