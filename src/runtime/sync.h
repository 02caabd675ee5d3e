/* SPDX-License-Identifier: MIT */
/* Synchronisation for the runtime: futex waits, a bounded lock-free MPMC queue
 * (Vyukov's), a spin-then-sleep barrier, and a CPU pause. */
#ifndef MS_RUNTIME_SYNC_H
#define MS_RUNTIME_SYNC_H

#include <stdatomic.h>
#include <stdint.h>

static inline void ms_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}

/* Sleeps while *addr == val, at most timeout_ms (< 0: no limit). */
void ms_futex_wait(_Atomic uint32_t *addr, uint32_t val, int timeout_ms);
void ms_futex_wake_all(_Atomic uint32_t *addr);

/* Bounded multi-producer multi-consumer queue of 64-bit values. */
struct ms_mpmc_cell {
  _Atomic uint64_t seq;
  int64_t val;
};
struct ms_mpmc {
  struct ms_mpmc_cell *cells;
  uint64_t mask;
  _Alignas(64) _Atomic uint64_t tail;  /* producers */
  _Alignas(64) _Atomic uint64_t head;  /* consumers */
};
int ms_mpmc_init(struct ms_mpmc *q, uint64_t min_cap);
void ms_mpmc_destroy(struct ms_mpmc *q);
int ms_mpmc_push(struct ms_mpmc *q, int64_t v);  /* 0, or -1 when full */
int ms_mpmc_pop(struct ms_mpmc *q, int64_t *v);  /* 0, or -1 when empty */

/* A reusable barrier for n threads: spin, then yield, then sleep. */
struct ms_barrier {
  int n;
  _Alignas(64) _Atomic uint32_t arrived;
  _Alignas(64) _Atomic uint32_t phase;
};
void ms_barrier_init(struct ms_barrier *b, int n);
void ms_barrier_wait(struct ms_barrier *b);

#endif
