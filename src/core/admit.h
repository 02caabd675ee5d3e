/* SPDX-License-Identifier: MIT */
/* Which hook firings an attachment runs, written once for the CPU engines'
 * hook sites (fire.c) and the device's (src/cuda/bpf_dev.cuh); C11 and CUDA.
 *
 * Sampling keys on what names the firing, never on time or on the worker: a
 * task hook on its task generation (task_gen), comm on the generation and the
 * phase, step on the step and the phase, request on the slot, its generation,
 * the phase and the step, queue_pressure on the step and the queue. So the
 * same firings are sampled in every run of the same plan, on every backend;
 * mixed with the attachment's id, two attachments sample different ones. The
 * per-step budget counts a worker's runs in the step (a worker's own slot: no
 * atomics). */
#ifndef MS_CORE_ADMIT_H
#define MS_CORE_ADMIT_H

#include <stdint.h>

#include "core/hostdev.h"
#include "megascope/bpf/megascope.h"

#define MS_ADMIT_FN MS_CORE_DEV

MS_ADMIT_FN uint64_t ms_hook_sample_key(const struct ms_hook_ctx *c) {
  switch (c->hook) {
  case MS_HOOK_COMM: return c->task_gen << 1 | c->comm_phase;
  case MS_HOOK_STEP: return c->step << 1 | c->phase;
  case MS_HOOK_REQUEST:
    return (uint64_t)c->req_slot << 40 ^ (uint64_t)c->req_gen << 8 ^ (uint64_t)c->phase ^ c->step << 44;
  case MS_HOOK_QUEUE_PRESSURE: return c->step << 8 | c->queue_kind;
  default: return c->task_gen;
  }
}

MS_ADMIT_FN uint64_t ms_hook_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* 1 when the firing keyed `key` is one of attachment att's 1 in `every`. */
MS_ADMIT_FN int ms_hook_sampled(uint64_t key, uint32_t att, uint32_t every) {
  return every <= 1 || ms_hook_mix(key ^ (uint64_t)att * 0x9e3779b97f4a7c15ull) % every == 0;
}

/* The per-step budget of one worker's slot: 1 (and the run counted) when a
 * run is left in `step` under `max` (0: no limit). */
MS_ADMIT_FN int ms_hook_step_admit(uint64_t *step_key, uint64_t *step_execs, uint64_t step, uint32_t max) {
  if (!max) return 1;
  if (*step_key != step + 1) {
    *step_key = step + 1;
    *step_execs = 0;
  }
  if (*step_execs >= max) return 0;
  ++*step_execs;
  return 1;
}

#endif
