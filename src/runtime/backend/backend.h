/* SPDX-License-Identifier: MIT */
/* The backend table (private to src/runtime): what a backend gives the shared
 * runtime. The backends (cpu.c, sim.c, cuda.c) live beside this header in
 * src/runtime/backend/, and backend.c lists them and answers the public
 * questions about them (megascope/engine.h's ms_backend_info). */
#ifndef MS_RUNTIME_BACKEND_H
#define MS_RUNTIME_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/base.h"
#include "megascope/engine.h"
#include "megascope/plan_ir.h"

struct ms_engine;
struct plan_rt;
struct worker;

/* A backend: who runs the SMs and what time it is there. The shared runtime
 * (step.c, requests.c, plans.c, fault.c, telemetry.c, the watchdog) owns
 * requests, admission, batching, KV pages, plans, event counters, hooks,
 * telemetry and faults; it reaches the SMs only through this table and the
 * context start returned, and names no backend. A backend's SMs run steps with
 * ms_rt_step_begin / ms_rt_step_end and each task with ms_rt_task_start,
 * ms_rt_task_body and ms_rt_task_finish. */
struct ms_backend_ops {
  /* what the backend is (megascope/engine.h); info.virtual_clock: now() is
   * simulated time, a request's times start at its admission, and
   * ms_engine_sim_now reports the clock */
  struct ms_backend_info info;
  /* tasks run elsewhere (the device): no host task hooks; the backend feeds
   * the aggregates and the trace buffers and runs the monitors itself */
  int remote_tasks;
  void (*defaults)(struct ms_engine_opts *o);          /* before anything is sized; NULL: none */
  int (*shape_only)(const struct ms_engine_opts *o);   /* 1: tasks run no kernels */
  /* The threads that run steps, once everything else is built: sets
   * e->be_ctx before they run, and leaves it NULL and nothing running when it
   * fails. */
  int (*start)(struct ms_engine *e, struct ms_textbuf *log);
  void (*stop)(struct ms_engine *e);          /* after stop_req: joins, frees be_ctx */
  uint64_t (*now)(const void *ctx);           /* the engine clock, ns */
  /* The step start wrote cur, cur_gen, cur_step (or cur_stop): hand the step
   * to the SMs, with the release that publishes its metadata. */
  void (*publish_step)(void *ctx);
  /* Event ev of rt fired (its JIT successors are queued): wake what waits. */
  void (*fired)(void *ctx, struct plan_rt *rt, int ev);
  /* Fault injection (delayed_release): the trigger of producer on worker w
   * is held delay_ns. 1: the backend counts it itself later (with
   * ms_rt_trigger_now); 0: the delay has passed, the caller counts it now. */
  int (*defer_trigger)(void *ctx, struct worker *w, int producer, uint64_t delay_ns);
  /* Fault injection (starve_task): a held JIT task is due at `at`; an SM
   * that idles must look for JIT work again then. */
  void (*poll_at)(void *ctx, uint64_t at);
  /* Whether a task trace can be recorded now (NULL: always): the records'
   * tasks must be the engine's plans'. */
  int (*can_trace)(const struct ms_engine *e);
  /* What the SMs run now (ms_engine_sample_kernels; NULL: the workers' own
   * running and waiting words): each one's running and waiting task (-1:
   * none) of *plan, for SMs 0 .. n; returns how many. */
  int (*sample)(void *ctx, const struct ms_plan **plan, int32_t *running, int32_t *waiting, int n);
  /* Whether it injects faults of this type (enum ms_fault_type; NULL: every type). */
  int (*injects)(int fault_type);
  /* The accelerator it runs on (NULL: none, it runs on the host). */
  int (*device)(struct ms_device_info *out, char *why, size_t n);
};

extern const struct ms_backend_ops ms_backend_cpu;  /* backend/cpu.c */
extern const struct ms_backend_ops ms_backend_sim;  /* backend/sim.c */
extern const struct ms_backend_ops ms_backend_cuda; /* backend/cuda.c */
/* backend/backend.c: the table of a backend, NULL when there is none by that id. */
const struct ms_backend_ops *ms_backend_get(enum ms_backend b);

#endif
