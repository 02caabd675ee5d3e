/* SPDX-License-Identifier: MIT */
/* Filling a hook's context from the plan, written once for the CPU engines'
 * hook sites (src/runtime/hooksite.h) and the device's (src/cuda/
 * megakernel.cuh); C11 and CUDA. What is here depends on the plan and the
 * firing alone: the fields every hook has, a task's fields, its event's. Where
 * the batch layout, clocks and counters live differs between the backends, so
 * the request fields of a row (read under each one's seqlock), t_ready, the
 * event count and the ABI v2 work fields are filled by each. */
#ifndef MS_CORE_CTX_FILL_H
#define MS_CORE_CTX_FILL_H

#include <stdint.h>
#include <string.h>

#include "core/hostdev.h"
#include "megascope/bpf/megascope.h"
#include "megascope/plan_ir.h"

#define MS_CTXF_FN MS_CORE_DEV

/* The fields every hook has; the rest zero, and the fields that mean "none"
 * when unset (a request, a remote producer) MS_HOOK_NONE32. rows and bucket:
 * the step's rows and its plan's (0, 0 outside a step). */
MS_CTXF_FN void ms_ctx_fill_base(struct ms_hook_ctx *c, int hook, uint64_t now, uint32_t worker, uint32_t device,
                                 uint64_t step, uint32_t rows, uint32_t bucket) {
  memset(c, 0, sizeof *c);
  c->abi_version = MS_HOOK_ABI_VERSION;
  c->hook = (uint32_t)hook;
  c->now_ns = now;
  c->worker = worker;
  c->device = device;
  c->step = step;
  c->batch_size = rows;
  c->bucket = bucket;
  c->req_slot = c->req_gen = MS_HOOK_NONE32;
  c->remote_event = c->remote_device = MS_HOOK_NONE32;
}

/* Task t's fields from the plan; task_gen names this execution of it in c->step. */
MS_CTXF_FN void ms_ctx_fill_task(struct ms_hook_ctx *c, const struct ms_task *k, int t) {
  c->task_class = k->cls;
  c->op = k->kernel;
  c->task_index = (uint32_t)t;
  c->launch_mode = k->launch;
  c->task_gen = c->step << 32 | (uint32_t)t;
  c->tile_x = k->tile[0];
  c->tile_y = k->tile[1];
  c->tile_z = k->tile[2];
}

/* Event ev's fields from the plan (its count is the backend's). */
MS_CTXF_FN void ms_ctx_fill_event(struct ms_hook_ctx *c, const struct ms_event *E, int ev) {
  c->event_id = (uint32_t)ev;
  c->event_class = E->cls;
  c->event_needed = (uint32_t)E->needed;
}

#endif
