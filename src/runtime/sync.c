/* SPDX-License-Identifier: MIT */
/* Futex waits, the MPMC queue and the barrier. See sync.h. */
#include "runtime/sync.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void ms_futex_wait(_Atomic uint32_t *addr, uint32_t val, int timeout_ms) {
  struct timespec ts, *tp = NULL;
  if (timeout_ms >= 0) {
    ts.tv_sec = timeout_ms / 1000;
    ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
    tp = &ts;
  }
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, tp, NULL, 0);
}

void ms_futex_wake_all(_Atomic uint32_t *addr) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

int ms_mpmc_init(struct ms_mpmc *q, uint64_t min_cap) {
  uint64_t cap = 2;
  while (cap < min_cap) cap <<= 1;
  q->cells = calloc(cap, sizeof *q->cells);
  if (!q->cells) return -ENOMEM;
  q->mask = cap - 1;
  for (uint64_t i = 0; i < cap; i++) atomic_init(&q->cells[i].seq, i);
  atomic_init(&q->head, 0);
  atomic_init(&q->tail, 0);
  return 0;
}

void ms_mpmc_destroy(struct ms_mpmc *q) {
  free(q->cells);
  q->cells = NULL;
}

/* A cell's seq says whose turn it is: == pos, free for the producer of pos;
 * == pos + 1, full for the consumer of pos. The acquire on seq pairs with the
 * release that hands the cell over, so the value is visible with it. */
int ms_mpmc_push(struct ms_mpmc *q, int64_t v) {
  uint64_t pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
  struct ms_mpmc_cell *c;
  for (;;) {
    c = &q->cells[pos & q->mask];
    uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
    int64_t dif = (int64_t)(seq - pos);
    if (dif == 0) {
      if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed))
        break;
    } else if (dif < 0) {
      return -1;
    } else {
      pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
    }
  }
  c->val = v;
  atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
  return 0;
}

int ms_mpmc_pop(struct ms_mpmc *q, int64_t *v) {
  uint64_t pos = atomic_load_explicit(&q->head, memory_order_relaxed);
  struct ms_mpmc_cell *c;
  for (;;) {
    c = &q->cells[pos & q->mask];
    uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
    int64_t dif = (int64_t)(seq - (pos + 1));
    if (dif == 0) {
      if (atomic_compare_exchange_weak_explicit(&q->head, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed))
        break;
    } else if (dif < 0) {
      return -1;
    } else {
      pos = atomic_load_explicit(&q->head, memory_order_relaxed);
    }
  }
  *v = c->val;
  atomic_store_explicit(&c->seq, pos + q->mask + 1, memory_order_release);
  return 0;
}

void ms_barrier_init(struct ms_barrier *b, int n) {
  b->n = n;
  atomic_init(&b->arrived, 0);
  atomic_init(&b->phase, 0);
}

/* The last to arrive resets the count and advances the phase (release: the work
 * of every thread before the barrier is visible to every thread after it, through
 * the acq_rel arrivals and the acquire load of the phase). */
void ms_barrier_wait(struct ms_barrier *b) {
  uint32_t phase = atomic_load_explicit(&b->phase, memory_order_acquire);
  if ((int)atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) + 1 == b->n) {
    atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
    atomic_store_explicit(&b->phase, phase + 1, memory_order_release);
    ms_futex_wake_all(&b->phase);
    return;
  }
  for (int i = 0; atomic_load_explicit(&b->phase, memory_order_acquire) == phase; i++) {
    if (i < 2000)
      ms_cpu_relax();
    else if (i < 2100)
      sched_yield();
    else
      ms_futex_wait(&b->phase, phase, 50);
  }
}
