/* SPDX-License-Identifier: MIT */
/* The CUDA backend's library (megascope_gpu): what the engine's cuda backend
 * (src/runtime/backend/cuda.c) drives, and nothing else. The kernel on its own,
 * without the engine (`megascope cuda`, the GPU tests), is megascope/cuda_diag.h.
 *
 * Built when nvcc is found (the .cu files of src/cuda); otherwise every function here exists
 * and reports -MS_E_UNSUPP ("built without CUDA"), so callers need no #ifdefs.
 * This header is plain C: the core and the CLI never include CUDA headers.
 *
 * One engine holds one plan (the bucket of max_batch rows; rows without a request
 * are padding) and runs it as a cooperative kernel of one CTA per SM: CTA 0 is the
 * scheduler (step start, admission, JIT dispatch, sampling bookkeeping), the
 * others are workers with per-worker queues in global memory. Weights are bf16
 * on the device (f32 and quantised models are converted when uploaded),
 * accumulation is f32, the KV cache is f32.
 *
 * The engine uses it in fed mode (ms_cuda_feed_*, below): MS_BACKEND_CUDA in
 * megascope/engine.h, where the engine's step machine admits, batches and
 * samples, and the resident kernel runs each step it is handed. */
#ifndef MEGASCOPE_CUDA_H
#define MEGASCOPE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/base.h"
#include "megascope/model.h"
#include "megascope/monitor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ms_cuda_device {
  char name[128];
  int sms, major, minor;
  double mem_gib;
  double peak_gbs;          /* HBM bandwidth: 2 x memory clock x bus width */
};
/* 0, or -MS_E_UNSUPP with the reason in why. */
int ms_cuda_device_info(struct ms_cuda_device *out, char *why, size_t n);

enum ms_cuda_mode {
  MS_CUDA_MEGAKERNEL = 0,   /* one persistent kernel for the whole decode loop */
  MS_CUDA_PER_OP = 1,       /* one kernel per operator, a step captured as a CUDA Graph */
};

struct ms_cuda_opts {
  size_t sz;                /* sizeof(struct ms_cuda_opts) */
  enum ms_cuda_mode mode;
  int max_batch;            /* rows of the plan; 0: 1 */
  int max_ctx;              /* positions per request; 0: 512 */
  int page_size;            /* KV-cache page, in positions; 0: 16 */
  int n_sms;                /* CTAs of the persistent kernel; 0: every SM */
  int tiles_per_op;         /* see ms_compile_opts; 0: about one task per worker */
  int watchdog_ms;          /* report a stall after this long without a heartbeat; 0: off */
  int hooks_off;            /* 1: the kernel has no hook sites at all (bench baseline) */
  int monitor_mib;          /* device memory for monitors, allocated before the launch (attaches
                             * while the kernel runs only copy into it); 0: 40 + 2 a CTA */
  int fault_lost_trigger;   /* tests: task + 1 whose trigger is never counted, so its event never
                             * fires (a hang for the watchdog to name); 0: none */
};

struct ms_cuda_engine;
struct ms_bpf_map;

/* Uploads the model and the compiled plan. NULL + errno with the reason in log. */
struct ms_cuda_engine *ms_cuda_engine_new(const struct ms_model *m, const struct ms_cuda_opts *o,
                                          struct ms_textbuf *log);
void ms_cuda_engine_free(struct ms_cuda_engine *e);

struct ms_cuda_stats {
  uint64_t steps, tokens, positions;
  double kernel_ms;         /* the decode loop on the device's clock: the persistent kernel's
                             * start to its exit; per-op, the first step's copies to the last's */
  double tokens_per_s;
  uint64_t heartbeats;      /* sum of every SM's heartbeat counter */
  uint64_t queue_full;      /* JIT dispatches that found a worker queue full and retried */
  uint64_t attach_ns_last;  /* the last attach/replace call: upload, publication in the attach
                             * table, and every SM having seen it (or the kernel having ended) */
  /* fed mode (ms_cuda_feed_*): steps with rows handed over and waited for;
   * the device's time for them (from seeing each handover to moving done;
   * per-op: the graph's, timed on the device with events); the handover, the
   * host's time from handing a step over to seeing it done less the
   * device's (the bus both ways and noticing: per step, sum and largest);
   * rows whose token the device drew, and rows the host drew from their
   * logits (asked for, or a draw too close to call) */
  uint64_t fed_steps, device_step_ns, handover_ns, handover_max_ns;
  uint64_t rows_device_drawn, rows_host_drawn;
};

void ms_cuda_get_stats(const struct ms_cuda_engine *e, struct ms_cuda_stats *out);

/* ---- fed mode: the engine's CUDA backend (src/runtime/backend/cuda.c) ----
 * The engine's step machine (admission, batching, KV pages, sampling) runs on
 * the host and hands the device one step at a time; the persistent kernel stays
 * resident between steps and requests (per-op mode: one graph launch a step).
 * The engine's slots are this engine's rows' slots (max_batch of them), and
 * its KV page ids index this engine's pool (max_batch * max_ctx / page_size
 * pages). */

/* One row of a fed step: the request slot (-1: padding), the position, the
 * input token, the slot's generation (for hook contexts) and the KV page of
 * the position; and how the device draws its token: megascope/sample.h's
 * parameters with the request's seed and draw number (its tokens so far),
 * token for token as ms_sample, or host_draws: the host does (penalties,
 * logit bias, logprobs, recorded logits: it gets the row's logits). */
struct ms_cuda_row {
  int32_t slot, pos, token, page;
  uint32_t gen;
  float temperature;        /* <= 0: greedy */
  int32_t top_k;
  float top_p, min_p;
  uint64_t seed, draw;
  int32_t host_draws;
};

/* A request event of the engine's step machine for the device's request
 * hook: phase as megascope/hook.h's enum ms_req_phase, step the engine step
 * it happened in (its hook context's). */
struct ms_cuda_event {
  int32_t phase, slot, token;
  uint32_t gen;
  uint64_t step;
};

/* Launches the resident kernel (megakernel) or builds the step's graph
 * (per-op). 0 or a negative error. */
int ms_cuda_feed_start(struct ms_cuda_engine *e, struct ms_textbuf *log);
/* Hands the device step `step` of n rows (n <= max_batch) and n_ev request
 * events, fired by the device's request hook before the step (megakernel
 * mode; per-op mode has no hook sites). n 0: the events alone. Returns once
 * the copies are queued, without waiting for them (the device finds the rows
 * before the step's sequence word, copied after them on the same stream).
 * One handover in flight at a time: ms_cuda_feed_wait before the next. */
int ms_cuda_feed_step(struct ms_cuda_engine *e, uint64_t step, const struct ms_cuda_row *rows, int n,
                      const struct ms_cuda_event *ev, int n_ev, struct ms_textbuf *log);
/* Waits for the step handed over last. (*tokens)[r] is then the token the
 * device drew for row r, or -1: the host draws it, from (*logits)[r * vocab
 * ..] (a row with host_draws, or a draw too close to call on the device:
 * its expf and sums may round differently from the C library's); valid
 * until the next step. -MS_E_STALL with the watchdog's report in log (a CTA
 * silent, or spinning on an event that does not fire, for watchdog_ms). */
int ms_cuda_feed_wait(struct ms_cuda_engine *e, const int32_t **tokens, const float **logits,
                      struct ms_textbuf *log);
/* Fault injection in fed mode (megakernel), before ms_cuda_feed_start: a
 * task's extra time is its healthy time times cls[class] + worker[worker]
 * (+ slot_coef for the attention of a row of request slot `slot`, -1: none);
 * release_ns[event class] holds the trigger that completes such an event.
 * The tables are the engine's (src/runtime/fault.c) for ms_cuda_plan's
 * classes and ms_cuda_ctas - 1 workers. */
int ms_cuda_set_faults(struct ms_cuda_engine *e, const float *cls, int n_cls, const float *worker, int n_workers,
                       int slot, float slot_coef, const uint64_t *release_ns, int n_ev, struct ms_textbuf *log);
/* The resident kernel's running totals, for the engine's always-on
 * aggregates (megakernel mode; -MS_E_STATE otherwise): per task class of
 * ms_cuda_plan's, cls[4 * c ..] = {tasks, task_ns, queue_ns, wait_ns}
 * (queue_ns: from its event's firing to its start); per event class,
 * ev[2 * c ..] = {tasks, wait_ns}. Copied while the kernel runs. */
int ms_cuda_feed_totals(struct ms_cuda_engine *e, uint64_t *cls, uint64_t *ev);

/* One task of a traced step, in the host's clock (ms_now_ns; the device's
 * clock shifted by the least latency seen from its moving `done` to the host
 * seeing it). */
struct ms_cuda_trace_rec {
  uint64_t t_begin, t_end;
  uint64_t t_ready;    /* its event fired (the step start for a task that waits on none) */
  uint64_t step;       /* the step number handed over */
  uint32_t task;       /* of ms_cuda_plan's */
  uint32_t wait_ns;    /* how long its worker waited for it to be ready */
  int32_t fired;       /* its trigger completed its event */
};
/* Whether the workers record the tasks of the steps handed over from now
 * (megakernel mode; -MS_E_UNSUPP in per-op mode, whose tasks are graph nodes). */
int ms_cuda_feed_trace(struct ms_cuda_engine *e, int on);
/* After ms_cuda_feed_wait of a traced step: fn(user, worker, record) for each
 * of its records, each worker's in the order it ran them; *lost counts the
 * records a worker's ring no longer held. */
int ms_cuda_feed_trace_drain(struct ms_cuda_engine *e,
                             void (*fn)(void *user, int worker, const struct ms_cuda_trace_rec *r), void *user,
                             uint64_t *lost);
/* The workers a persistent kernel on this device would have (n_sms as
 * ms_cuda_opts'); -1 without a device. */
int ms_cuda_workers(int n_sms);
/* What each worker CTA last wrote to its heartbeat (megakernel): the task it
 * runs (-1: none) and the task it waits for (-1: none), for workers 0 .. max;
 * returns how many. Read from host-mapped memory while the kernel runs. */
int ms_cuda_sample(const struct ms_cuda_engine *e, int32_t *running, int32_t *waiting, int max);
/* Ends the resident kernel and waits for it. */
int ms_cuda_feed_stop(struct ms_cuda_engine *e, struct ms_textbuf *log);
/* The device's plan (the one monitors' map read-outs name classes by). */
const struct ms_plan *ms_cuda_plan(const struct ms_cuda_engine *e);
/* CTAs of the persistent kernel (SM indices of per-worker maps). */
int ms_cuda_ctas(const struct ms_cuda_engine *e);

/* Detaches id on the device (its maps keep their last copy). */
int ms_cuda_detach(struct ms_cuda_engine *e, int id);

/* For the engine's CUDA backend: the attachment's programs (m) run on the
 * device with the engine's host maps (maps, n_maps in object order, made for
 * ms_cuda_ctas(e) workers) as the host side their device copies sync into.
 * Neither m nor the maps are taken over: they stay the caller's and must
 * outlive the device's use of them (its detach and ms_cuda_engine_free).
 * replace_shared's o: the new generation's budget (NULL: unchanged). */
int ms_cuda_attach_shared(struct ms_cuda_engine *e, struct ms_monitor *m, struct ms_bpf_map **maps, int n_maps,
                          const struct ms_attach_opts *o, struct ms_textbuf *log);
int ms_cuda_replace_shared(struct ms_cuda_engine *e, int id, struct ms_monitor *m, struct ms_bpf_map **maps,
                           int n_maps, const struct ms_attach_opts *o, struct ms_textbuf *log);
/* Copies id's device maps into its host maps (the kernel keeps running); a
 * copy an SM wrote during is retried, -EAGAIN when every try was (the host
 * maps keep the last whole copy). */
int ms_cuda_sync_maps(struct ms_cuda_engine *e, int id);
/* The same, or -EBUSY at once while an attach, replace or detach is under
 * way (for a thread that must not wait behind one: the engine's driver). */
int ms_cuda_sync_maps_try(struct ms_cuda_engine *e, int id);
/* Coverage of one generation of id, current or replaced. */
int ms_cuda_coverage_of(struct ms_cuda_engine *e, int id, uint32_t generation, struct ms_coverage *out);
/* Frees what the device side keeps of detached attachment id (after its
 * detach its maps' final contents are the caller's); -MS_E_STATE while
 * attached. */
int ms_cuda_forget(struct ms_cuda_engine *e, int id);

#ifdef __cplusplus
}
#endif
#endif
