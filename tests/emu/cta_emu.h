/* SPDX-License-Identifier: MIT */
/* One CTA of 256 threads on the CPU, for running device code written for a CTA
 * (src/cuda/ops.cuh's task bodies) under g++ (C++17). Tests only.
 *
 * DESIGN. A CTA is MSD_EMU_THREADS fibers (user-level threads with their own
 * stacks, kept for the process's life) on the calling OS thread; a scheduler
 * (the caller of msd_emu_launch) resumes them one at a time. A fiber runs until
 * it reaches a synchronisation point and blocks there:
 *   - __syncthreads(): until all 256 threads of the CTA have arrived;
 *   - __syncwarp(), and each __shfl_xor_sync / __ballot_sync (a store to the
 *     warp's exchange array, a warp barrier, a load of the partner's value, a
 *     warp barrier): until all 32 lanes of its warp have arrived.
 * That is a legal schedule of the same program on a GPU with independent
 * thread scheduling, with two properties a pool of OS threads lacks: it is
 * exact about deadlock (no fiber runnable while some are unfinished: a barrier
 * that some threads never reach, a warp op with lanes missing; the report names
 * the launch and where each thread waits), and it is cheap on 2 cores (a
 * switch is a few nanoseconds, not a futex wake). The scheduler picks a warp
 * at random among those with a runnable lane and runs it until none of its
 * lanes can run (all at __syncthreads() or finished), resuming its lanes in a
 * fresh random order on every sweep; so warps run whole phases ahead of each
 * other in random orders, and a missing barrier (a thread reading memory
 * another thread writes in the same phase, in its warp or another) changes
 * results instead of being hidden by a fixed order.
 * `__shared__` is `static thread_local`, and so is the scheduler's state: the
 * 256 fibers of a CTA run on one OS thread, so they share it exactly as a
 * CTA's threads do. msd_emu_launch runs a grid's CTAs one after another (a
 * legal schedule); a persistent kernel whose CTAs wait on each other runs each
 * CTA on an OS thread of its own (msd_emu_launch_cta, tests/emu/engine_emu.cc),
 * concurrently. A fiber runs until it blocks: one that spins (thread 0 waiting
 * on another CTA while the others wait at a barrier, the persistent kernel's
 * pattern) keeps its OS thread, and __nanosleep yields that thread to the
 * other CTAs. What this does not model: memory ordering between the fibers of
 * a CTA (they never run at the same time), and timing.
 *
 * Also checked (an error of the launch, as a deadlock is): a warp operation
 * with a mask other than 0xffffffff, lanes of one warp meeting in different
 * warp operations (a shuffle against a ballot), and threads of one
 * __syncthreads() phase arriving from different source lines (divergent
 * barriers: undefined behaviour in CUDA).
 *
 * Not for C (src/cuda/host_emu.h is the C emulation, where a CTA is one
 * thread). Include this first, instead of any CUDA header; x86-64 switches
 * stacks in a few instructions, other machines use ucontext. */
#ifndef MS_TESTS_EMU_CTA_EMU_H
#define MS_TESTS_EMU_CTA_EMU_H

#ifndef __cplusplus
#error "cta_emu.h is C++"
#endif

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmath>
#include <type_traits>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#define MSD_HOST_EMU 1
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))

#define MSD_EMU_THREADS 256
#define MSD_EMU_STACK (128 * 1024)

struct msd_emu_dim {
  unsigned x, y, z;
};
struct uint4 {
  unsigned x, y, z, w;
};
struct float4 {
  float x, y, z, w;
};

/* The running fiber's coordinates (set by the scheduler before each resume). */
inline thread_local msd_emu_dim threadIdx, blockIdx, blockDim, gridDim;

enum { MSD_EMU_RUN, MSD_EMU_AT_CTA, MSD_EMU_AT_WARP, MSD_EMU_DONE };
enum { MSD_EMU_SYNCWARP = 1, MSD_EMU_SHFL, MSD_EMU_BALLOT };

struct msd_emu_fiber {
  void *sp;          /* saved stack pointer (x86-64) */
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
  char *stack;
  int state, line;   /* line: the source line of the barrier it waits at */
};

struct msd_emu_cta {
  msd_emu_fiber f[MSD_EMU_THREADS];
  void *sched_sp;
#if !defined(__x86_64__)
  ucontext_t sched_uc;
#endif
  int cur, n_done, cta_arrived, cta_line;
  int warp_arrived[MSD_EMU_THREADS / 32], warp_kind[MSD_EMU_THREADS / 32];
  uint32_t xch[MSD_EMU_THREADS / 32][32];  /* shuffle and ballot exchange */
  void (*fn)(void *);
  void *arg;
  uint64_t rng;
  char err[512];     /* first error of the launch ("" none) */
  uint64_t switches; /* statistics: resumes */
};

inline thread_local msd_emu_cta msd_emu;

#if defined(__x86_64__)
/* msd_emu_switch(save, to): saves the callee-saved registers on the current
 * stack, stores its pointer in *save, continues on stack `to`. */
extern "C" void msd_emu_switch(void **save, void *to);
__asm__(".text\n"
        ".globl msd_emu_switch\n"
        ".type msd_emu_switch,@function\n"
        "msd_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size msd_emu_switch, .-msd_emu_switch\n");
#endif

inline void msd_emu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
inline void msd_emu_fail(const char *fmt, ...) {
  if (msd_emu.err[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msd_emu.err, sizeof msd_emu.err, fmt, ap);
  va_end(ap);
}

/* Back to the scheduler (the fiber's state says why). */
inline void msd_emu_yield(void) {
  msd_emu_fiber *f = &msd_emu.f[msd_emu.cur];
#if defined(__x86_64__)
  msd_emu_switch(&f->sp, msd_emu.sched_sp);
#else
  swapcontext(&f->uc, &msd_emu.sched_uc);
#endif
}

[[noreturn]] inline void msd_emu_fiber_main(void) {
  msd_emu.fn(msd_emu.arg);
  msd_emu.f[msd_emu.cur].state = MSD_EMU_DONE;
  msd_emu.n_done++;
  msd_emu_yield();
  abort();  /* a finished fiber is never resumed */
}

/* A fresh start of fiber i at msd_emu_fiber_main. */
inline void msd_emu_fiber_reset(int i) {
  msd_emu_fiber *f = &msd_emu.f[i];
  if (!f->stack && !(f->stack = (char *)malloc(MSD_EMU_STACK))) abort();
  f->state = MSD_EMU_RUN;
  f->line = 0;
#if defined(__x86_64__)
  uintptr_t top = ((uintptr_t)f->stack + MSD_EMU_STACK) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = NULL;                             /* msd_emu_fiber_main's return address: none */
  *--sp = (void *)&msd_emu_fiber_main;      /* msd_emu_switch's ret goes there */
  for (int r = 0; r < 6; r++) *--sp = NULL; /* rbp rbx r12-r15 */
  f->sp = sp;
#else
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->stack;
  f->uc.uc_stack.ss_size = MSD_EMU_STACK;
  f->uc.uc_link = NULL;
  makecontext(&f->uc, (void (*)(void))msd_emu_fiber_main, 0);
#endif
}

inline void msd_emu_resume(int i) {
  msd_emu.cur = i;
  threadIdx = msd_emu_dim{(unsigned)i, 0, 0};
  msd_emu.switches++;
#if defined(__x86_64__)
  msd_emu_switch(&msd_emu.sched_sp, msd_emu.f[i].sp);
#else
  swapcontext(&msd_emu.sched_uc, &msd_emu.f[i].uc);
#endif
}

/* ---- synchronisation ---- */

inline void msd_emu_syncthreads(int line) {
  msd_emu_fiber *f = &msd_emu.f[msd_emu.cur];
  if (msd_emu.cta_arrived == 0)
    msd_emu.cta_line = line;
  else if (line != msd_emu.cta_line)
    msd_emu_fail("divergent __syncthreads(): thread %d at line %d, an earlier thread of the phase at line %d",
                 msd_emu.cur, line, msd_emu.cta_line);
  f->state = MSD_EMU_AT_CTA;
  f->line = line;
  if (++msd_emu.cta_arrived == MSD_EMU_THREADS) {
    msd_emu.cta_arrived = 0;
    for (int i = 0; i < MSD_EMU_THREADS; i++) msd_emu.f[i].state = MSD_EMU_RUN;
  }
  msd_emu_yield();
}
#define __syncthreads() msd_emu_syncthreads(__LINE__)

inline void msd_emu_warp_barrier(int kind, unsigned mask, int line) {
  int t = msd_emu.cur, w = t >> 5;
  msd_emu_fiber *f = &msd_emu.f[t];
  if (mask != 0xffffffffu)
    msd_emu_fail("thread %d: a warp operation at line %d with mask %#x (only full warps are emulated)", t, line,
                 mask);
  if (msd_emu.warp_arrived[w] == 0)
    msd_emu.warp_kind[w] = kind;
  else if (msd_emu.warp_kind[w] != kind)
    msd_emu_fail("warp %d: lanes meet in different warp operations (kinds %d and %d; lane %d at line %d)", w,
                 msd_emu.warp_kind[w], kind, t & 31, line);
  f->state = MSD_EMU_AT_WARP;
  f->line = line;
  if (++msd_emu.warp_arrived[w] == 32) {
    msd_emu.warp_arrived[w] = 0;
    for (int i = w * 32; i < w * 32 + 32; i++) msd_emu.f[i].state = MSD_EMU_RUN;
  }
  msd_emu_yield();
}
#define __syncwarp(...) msd_emu_syncwarp(__LINE__, ##__VA_ARGS__)
inline void msd_emu_syncwarp(int line, unsigned mask = 0xffffffffu) {
  msd_emu_warp_barrier(MSD_EMU_SYNCWARP, mask, line);
}

template <class T>
inline T msd_emu_shfl_xor(unsigned mask, T v, int lanemask, int line) {
  static_assert(sizeof(T) == 4 && std::is_trivially_copyable<T>::value, "4-byte shuffles only");
  int t = msd_emu.cur, w = t >> 5, lane = t & 31;
  uint32_t bits;
  memcpy(&bits, &v, 4);
  msd_emu.xch[w][lane] = bits;
  msd_emu_warp_barrier(MSD_EMU_SHFL, mask, line);
  int src = lane ^ lanemask;
  bits = src >= 0 && src < 32 ? msd_emu.xch[w][src] : bits;
  msd_emu_warp_barrier(MSD_EMU_SHFL, mask, line);  /* every lane has read before the next write */
  T out;
  memcpy(&out, &bits, 4);
  return out;
}
#define __shfl_xor_sync(mask, v, lanemask) msd_emu_shfl_xor((mask), (v), (lanemask), __LINE__)

inline unsigned msd_emu_ballot(unsigned mask, int pred, int line) {
  int t = msd_emu.cur, w = t >> 5, lane = t & 31;
  msd_emu.xch[w][lane] = pred != 0;
  msd_emu_warp_barrier(MSD_EMU_BALLOT, mask, line);
  unsigned b = 0;
  for (int i = 0; i < 32; i++) b |= (msd_emu.xch[w][i] ? 1u : 0u) << i;
  msd_emu_warp_barrier(MSD_EMU_BALLOT, mask, line);
  return b;
}
#define __ballot_sync(mask, pred) msd_emu_ballot((mask), (pred), __LINE__)

/* ---- intrinsics ---- */

inline int __popc(unsigned v) { return __builtin_popcount(v); }
/* shared-memory atomics: a CTA's fibers never run at once, so a plain add is one */
inline int atomicAdd(int *p, int v) {
  int o = *p;
  *p = o + v;
  return o;
}
inline double atomicAdd(double *p, double v) {
  double o = *p;
  *p = o + v;
  return o;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
template <class T>
inline T __ldg(const T *p) {
  return *p;
}
inline uintptr_t __cvta_generic_to_global(const void *p) { return (uintptr_t)p; }
inline void __nanosleep(unsigned) { sched_yield(); } /* other CTAs may be other OS threads */

/* A prefetch (ops.cuh's msd_prefetch_range on the CPU): [lo, hi) widened as on
 * sm_90. A test may set msd_emu_prefetch_lo/hi to an arena; a range outside it
 * is an error of the launch. */
inline uintptr_t msd_emu_prefetch_lo, msd_emu_prefetch_hi;
inline void msd_emu_prefetch(uintptr_t a, int64_t bytes) {
  uintptr_t lo = a & ~(uintptr_t)15, hi = (a + (uintptr_t)bytes + 15) & ~(uintptr_t)15;
  if (msd_emu_prefetch_hi && (lo < msd_emu_prefetch_lo || hi > msd_emu_prefetch_hi))
    msd_emu_fail("prefetch of [%#lx, %#lx) outside the arena [%#lx, %#lx)", (unsigned long)lo, (unsigned long)hi,
                 (unsigned long)msd_emu_prefetch_lo, (unsigned long)msd_emu_prefetch_hi);
}

/* ---- launch ---- */

inline uint32_t msd_emu_rand(void) {  /* xorshift64* */
  uint64_t z = msd_emu.rng;
  z ^= z >> 12, z ^= z << 25, z ^= z >> 27;
  msd_emu.rng = z;
  return (uint32_t)((z * 0x2545f4914f6cdd1dull) >> 32);
}

/* One CTA of fn(arg) to completion. 0, or -1 with the reason in msd_emu.err. */
inline int msd_emu_run_cta(void) {
  for (int i = 0; i < MSD_EMU_THREADS; i++) msd_emu_fiber_reset(i);
  msd_emu.n_done = msd_emu.cta_arrived = 0;
  memset(msd_emu.warp_arrived, 0, sizeof msd_emu.warp_arrived);
  while (msd_emu.n_done < MSD_EMU_THREADS && !msd_emu.err[0]) {
    /* a random warp among those with a runnable lane runs until none of its
     * lanes can: sweeps over its lanes, each from a random lane with a random
     * odd stride */
    int ready[MSD_EMU_THREADS / 32], n_ready = 0;
    for (int w = 0; w < MSD_EMU_THREADS / 32; w++)
      for (int l = 0; l < 32; l++)
        if (msd_emu.f[w * 32 + l].state == MSD_EMU_RUN) {
          ready[n_ready++] = w;
          break;
        }
    if (!n_ready) {  /* nobody can run and somebody has not finished */
      int at_cta = 0, at_warp = 0, cl = 0, wl = 0, wt = -1;
      for (int i = 0; i < MSD_EMU_THREADS; i++) {
        const msd_emu_fiber *f = &msd_emu.f[i];
        if (f->state == MSD_EMU_AT_CTA) at_cta++, cl = f->line;
        if (f->state == MSD_EMU_AT_WARP) at_warp++, wl = f->line, wt = i;
      }
      msd_emu_fail("deadlock: %d threads finished, %d wait at __syncthreads() (line %d), %d at a warp operation "
                   "(thread %d, line %d)",
                   msd_emu.n_done, at_cta, cl, at_warp, wt, wl);
      break;
    }
    int w = ready[msd_emu_rand() % (unsigned)n_ready];
    for (int ran = 1; ran && !msd_emu.err[0];) {
      unsigned start = msd_emu_rand() % 32, stride = (msd_emu_rand() % 32) | 1u;
      ran = 0;
      for (unsigned j = 0; j < 32 && !msd_emu.err[0]; j++) {
        int i = w * 32 + (int)((start + j * stride) % 32);
        if (msd_emu.f[i].state != MSD_EMU_RUN) continue;
        msd_emu_resume(i);
        ran = 1;
      }
    }
  }
  return msd_emu.err[0] ? -1 : 0;
}

/* Runs kernel() as `grid` CTAs of MSD_EMU_THREADS threads, one CTA after the
 * other (blockIdx.x = 0 .. grid-1). 0, or -1 and *why says what went wrong
 * (the first error; the launch stops there). */
template <class F>
inline int msd_emu_launch(int grid, F kernel, const char **why) {
  msd_emu.err[0] = 0;
  if (!msd_emu.rng) msd_emu.rng = 0x9e3779b97f4a7c15ull;
  msd_emu.fn = [](void *a) { (*(F *)a)(); };
  msd_emu.arg = &kernel;
  blockDim = msd_emu_dim{MSD_EMU_THREADS, 1, 1};
  gridDim = msd_emu_dim{(unsigned)grid, 1, 1};
  int rc = 0;
  for (int b = 0; b < grid && !rc; b++) {
    blockIdx = msd_emu_dim{(unsigned)b, 0, 0};
    rc = msd_emu_run_cta();
  }
  *why = msd_emu.err;
  return rc;
}

/* Runs CTA `block` of a grid of `grid` CTAs of kernel() on the calling OS
 * thread (the persistent kernel: one OS thread per CTA). As msd_emu_launch. */
template <class F>
inline int msd_emu_launch_cta(int block, int grid, F kernel, const char **why) {
  msd_emu.err[0] = 0;
  if (!msd_emu.rng) msd_emu.rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t)block * 0x100000001b3ull);
  msd_emu.fn = [](void *a) { (*(F *)a)(); };
  msd_emu.arg = &kernel;
  blockDim = msd_emu_dim{MSD_EMU_THREADS, 1, 1};
  gridDim = msd_emu_dim{(unsigned)grid, 1, 1};
  blockIdx = msd_emu_dim{(unsigned)block, 0, 0};
  int rc = msd_emu_run_cta();
  *why = msd_emu.err;
  return rc;
}

/* Frees the calling OS thread's fiber stacks (before that thread ends). */
inline void msd_emu_release(void) {
  for (int i = 0; i < MSD_EMU_THREADS; i++) {
    free(msd_emu.f[i].stack);
    msd_emu.f[i].stack = NULL;
  }
}

#endif
