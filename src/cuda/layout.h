/* SPDX-License-Identifier: MIT */
/* How the persistent kernel's queues are laid out for a plan (private to
 * src/cuda): the AOT lists and the ring capacities. Plain C, so that the CUDA
 * host code (engine.cu) and the CPU run of the kernel (tests/emu/harness.h) lay
 * them out with the same code. */
#ifndef MS_CUDA_LAYOUT_H
#define MS_CUDA_LAYOUT_H

#include <stdint.h>
#include <stdlib.h>

#include "megascope/plan_ir.h"

static inline uint32_t msd_pow2_at_least(uint64_t x) {
  uint32_t p = 16;
  while (p < x) p <<= 1;
  return p;
}

/* JIT ring per worker: every JIT task of a step fits in one ring. */
static inline uint32_t msd_jit_cap(const struct ms_plan *p) {
  return msd_pow2_at_least((uint64_t)p->stats.jit_tasks + 1);
}

/* Fired-event ring: events fire once a step and the ring is drained each step;
 * twice the events leaves room for the next step's first firings. */
static inline uint32_t msd_fired_cap(const struct ms_plan *p) {
  return msd_pow2_at_least(2ull * (uint64_t)p->n_events);
}

/* AOT placement: round-robin in plan order over W workers (so each list is in
 * topological order); the step start (task 0) is the scheduler's. Worker w's
 * tasks are aot[off[w] .. off[w+1]); aot holds n_tasks, off W + 1 entries.
 * Returns the AOT tasks placed. */
static inline int msd_place_aot(const struct ms_plan *p, int W, int32_t *aot, int32_t *off) {
  int n = 0;
  for (int w = 0; w < W; w++) {
    off[w] = n;
    int k = 0;  /* AOT tasks seen: the k-th goes to worker k % W */
    for (int t = 1; t < p->n_tasks; t++) {
      if (p->tasks[t].launch != MS_LAUNCH_AOT) continue;
      if (k++ % W == w) aot[n++] = t;
    }
  }
  off[W] = n;
  return n;
}

/* The per-op baseline's kernels: a task's level is one past its producers'
 * highest (the producers of the event it waits on), so every task's transitive
 * predecessors are in earlier levels; each level becomes one kernel whose CTAs
 * are its tasks, the step start, empty and comm tasks (no body) left out. Level
 * l's tasks are order[level_off[l] .. level_off[l + 1]); order and level_off
 * hold n_tasks and n_tasks + 1 entries. Returns the levels, -1 out of memory. */
static inline int msd_levels(const struct ms_plan *p, int32_t *order, int32_t *level_off) {
  int *level = (int *)calloc((size_t)p->n_tasks, sizeof(int));
  if (!level) return -1;
  int max_level = 0;
  for (int t = 0; t < p->n_tasks; t++) {  /* plan order is topological */
    int ev = p->tasks[t].wait, l = 0;
    if (ev >= 0)
      for (int i = p->trig_off[ev]; i < p->trig_off[ev + 1]; i++)
        if (level[p->trig[i]] + 1 > l) l = level[p->trig[i]] + 1;
    level[t] = l;
    if (l > max_level) max_level = l;
  }
  int n = 0, nl = 0;
  level_off[0] = 0;
  for (int l = 0; l <= max_level; l++) {
    int start = n;
    for (int t = 0; t < p->n_tasks; t++) {
      int k = p->tasks[t].kernel;
      if (level[t] == l && k != MS_K_STEP_START && k != MS_K_EMPTY && k != MS_K_COMM) order[n++] = t;
    }
    if (n > start) level_off[++nl] = n;
  }
  free(level);
  return nl;
}

#endif
