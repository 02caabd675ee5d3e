/* SPDX-License-Identifier: MIT */
/* The engine's state, shared by the runtime's files (private). */
#ifndef MS_RUNTIME_ENGINE_IMPL_H
#define MS_RUNTIME_ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "compile/plan_impl.h"
#include "hook/hook_impl.h"
#include "kernels/ops.h"
#include "megascope/engine.h"
#include "runtime/sync.h"

#define MS_MAX_BUCKETS 13   /* 1 .. 4096 rows */
#define MS_STEP_LOG 1024
#define MS_PRIO_LEVELS 8    /* sched_hint priorities 0..7 */
#define MS_QUEUE_THRESHOLD 64 /* queue_pressure: JIT and mailbox depth declared high */

/* One plan as the runtime holds it: counters, queues and per-task state. */
struct plan_rt {
  struct ms_plan *plan;
  struct ms_exec_ctx x;
  const struct ms_weight *(*cls_w)[3];
  _Atomic uint64_t *counters;   /* [n_events] triggers so far, never reset */
  _Atomic uint64_t *done_gen;   /* [n_tasks] generation + 1 of the last completion */
  int32_t **aot_q, *aot_n;      /* [worker] AOT tasks in plan order */
  int32_t **op_q, *op_n;        /* [worker] per-op mode: tasks by stage, then plan order */
  int32_t **op_end;             /* [worker][stage] end of the stage in op_q */
  int n_stages;
  uint64_t *delay_ns;           /* [n_tasks] injected delays, NULL when none */
  struct ms_mpmc jit[MS_PRIO_LEVELS];  /* JIT tasks whose event fired, by priority */
  _Atomic uint64_t *fire_ns;    /* [n_events] when the event last fired (hooks on) */
  _Atomic uint64_t *fire_gen;   /* [n_events] generation + 1 of that firing */
  uint64_t gen;                 /* runs of this plan so far (worker 0) */
};

struct slot {
  struct ms_request *req;
  int pos;            /* positions fed so far: the next token goes at pos */
  int next_token;
  int finishing;      /* the request is complete: retire at the next step start */
  uint32_t gen;
  int32_t *pages;     /* [max_pages] */
  int n_pages;
};

struct worker {
  struct ms_engine *e;
  int id;
  pthread_t th;
  uint64_t rng;
  _Atomic int32_t running;      /* task running, -1: none (watchdog) */
  _Atomic int32_t waiting;      /* task waiting on its event, -1: none */
  _Atomic uint64_t since;       /* when it started running or waiting */
  _Atomic uint64_t tasks_done;
  uint64_t wait_ns;             /* how long it waited for the task it runs next */
  char pad[64];
};

struct ms_request {
  struct ms_engine *e;
  int32_t *prompt;
  int n_prompt, max_new, stop_eos, record;
  int32_t *tokens;
  float *logits;
  _Atomic int n_tokens, n_logits;
  _Atomic uint32_t state;
  _Atomic int refs;   /* the caller's and the engine's */
  int slot;
  uint32_t generation;
  uint64_t t_submit, t_admit, t_first, t_done;
};

struct ms_engine {
  const struct ms_model *m;
  struct ms_engine_opts o;
  int n_workers;
  struct plan_rt rt[MS_MAX_BUCKETS];
  int n_buckets;

  /* storage shared by all plans (one step runs at a time) */
  float **buf;
  int n_bufs, max_rows;
  float *k_pool, *v_pool;
  int pool_pages, max_pages;
  int32_t *free_pages;
  int n_free;
  struct slot *slots;            /* [max_rows] */
  int *row_slot, *row_pos, *row_token;
  int *admit_slots;              /* slots admitted by the step start in flight */
  int32_t **row_pages;
  float **scratch;

  /* step publication: worker 0 writes cur_* then bumps step_seq (release) */
  _Alignas(64) _Atomic uint32_t step_seq;
  _Atomic(struct plan_rt *) cur;
  _Atomic uint64_t cur_gen;
  _Atomic uint64_t cur_step;     /* atomics only for the watchdog's reads */
  _Atomic int cur_stop;
  uint64_t next_step;            /* worker 0 only */

  /* wake-ups: bumped on every event fire; sleepers counted to skip the syscall */
  _Alignas(64) _Atomic uint32_t progress;
  _Atomic int sleepers;
  struct ms_barrier bar;

  /* the mailbox: requests in */
  struct ms_mpmc mail;
  _Alignas(64) _Atomic uint32_t mail_seq;
  _Atomic int stop_req;

  /* statistics */
  _Atomic uint64_t steps, tokens, positions, stalls;
  pthread_mutex_t log_mu;
  struct ms_step_record step_log[MS_STEP_LOG];
  uint64_t step_log_n;
  char stall_report[8192];

  /* hooks */
  struct ms_hook_table *hooks;
  int hooks_on;                  /* 0: no hook checks at all (bench baseline) */
  uint64_t step_t0;              /* when the step in flight was published */

  struct worker *workers;
  pthread_t watchdog;
  int watchdog_on;
  _Atomic uint32_t wd_stop;
};

/* watchdog.c */
void *ms_watchdog_main(void *arg);
void ms_watchdog_report(struct ms_engine *e, uint64_t idle_ms, char *buf, size_t n);

#endif
