/* SPDX-License-Identifier: MIT */
/* The runtime's private header: the engine's state, shared by the runtime's
 * files (src/runtime/), and what each of them offers the others. */
#ifndef MS_RUNTIME_RUNTIME_IMPL_H
#define MS_RUNTIME_RUNTIME_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "megascope/plan_ir.h"
#include "hook/hook_impl.h"
#include "kernels/ops.h"
#include "megascope/engine.h"
#include "megascope/sample.h"
#include "megascope/telemetry.h"
#include "runtime/backend/backend.h"
#include "runtime/sync.h"

#define MS_MAX_BUCKETS 13   /* 1 .. 4096 rows */
#define MS_STEP_LOG 1024
#define MS_PRIO_LEVELS (MS_SCHED_HINT_MAX + 1)  /* sched_hint priorities (megascope/hook.h) */
#define MS_QUEUE_THRESHOLD 64 /* queue_pressure: JIT and mailbox depth declared high */
#define MS_QUEUE_CAP 16384    /* requests queued for a slot, at most (ms_engine_set_max_queued) */
#define MS_QUEUE_DEFAULT 1024

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
  _Atomic uint32_t *fire_dev;   /* [n_events] device of the trigger that completed that firing */
  /* hook ABI v2 passed_over (step.c jit_taken): JIT tasks taken so far, the
   * count when each task was queued, and what it came to when it was taken */
  _Atomic uint64_t jit_pops;
  _Atomic uint64_t *jit_mark;   /* [n_tasks] */
  _Atomic uint32_t *passed;     /* [n_tasks] */
  uint64_t gen;                 /* runs of this plan so far (worker 0) */
  /* tensor parallelism across processes: [n_tasks] 1 for a tile another rank
   * computes (its body is skipped; its share arrives by a communication task);
   * NULL in one process */
  uint8_t *remote;
};

/* A batch row as hooks read it (hooksite.h row_req): copies of the step's
 * layout, atomics so that a late reader races with no plain write. slot is
 * MS_HOOK_NONE32 for a padding row. */
struct hook_row {
  _Atomic uint32_t slot, gen, pos;
};

struct slot {
  struct ms_request *req;
  int pos;            /* positions fed so far: the next token goes at pos */
  int next_token;
  int finishing;      /* the request is complete: retire at the next step start */
  int chunk;          /* rows it has in the step in flight (chunked prefill) */
  uint64_t admit_seq; /* admissions before this request's (the step budget feeds older prompts first) */
  uint32_t gen;
  int32_t *pages;     /* [max_pages] */
  int n_pages;
  /* prefix cache (prefix.c): its first n_hashed pages are known to the
   * cache, the last of them as chain_page (the cache's own page of that
   * content, its own or an earlier one) whose chain hash is chain_hash */
  int n_hashed;
  int32_t chain_page;
  uint32_t chain_epoch;  /* chain_page's epoch when the chain reached it */
  uint64_t chain_hash;
};

/* The always-on aggregate, per worker and class (one writer: the worker). */
struct cls_acc {
  _Atomic uint64_t tasks, task_ns, queue_ns, wait_ns;
};

enum { TR_TASK = 0, TR_QDEPTH = 1 };
/* One trace record (see telemetry.c). */
struct trace_rec {
  uint64_t t_begin, t_end, t_ready, step;
  uint32_t task, cls, wait_ev, fired_ev, depth;
  int32_t row, slot;
  uint32_t req_gen, wait_ns_us;
  uint8_t kind, launch, bucket_log2, waited;
  int32_t pos;                  /* a row task: its position (-1: none) */
  uint32_t cached;              /* its request's prompt positions read from the prefix cache */
};

struct worker {
  struct ms_engine *e;
  int id;
  int device;                   /* the device (tensor parallel) it belongs to: ms_rt_device, at creation */
  uint64_t rng;
  _Atomic int32_t running;      /* task running, -1: none (watchdog) */
  _Atomic int32_t waiting;      /* task waiting on its event, -1: none */
  _Atomic uint64_t since;       /* when it started running or waiting */
  _Atomic uint64_t tasks_done;
  uint64_t wait_ns;             /* how long it waited for the task it runs next */
  /* The step it runs and that step's rows, written by the thread that runs the
   * worker as it starts the step: what its task hooks report, even those that
   * fire after worker 0 published the next step (cur_step has moved on). */
  uint64_t step;
  int rows;
  struct cls_acc *acc;          /* [n_classes] */
  struct cls_acc *ev_acc;       /* [n_ev_classes] */
  struct trace_rec *trace;      /* [trace_cap] while a trace is recorded */
  _Atomic uint32_t trace_n;     /* records published (release) */
  _Atomic uint64_t trace_dropped;
  _Atomic uint64_t trace_session; /* the session trace_n counts for (readers: ms_engine_trace_stats) */
  _Atomic int trace_busy;       /* > 0 while it writes a record: buffers stay put */
  _Atomic int tid;              /* the thread's id (CPU backend, once started; 0: none) */
  /* inter-token latency of the tokens its sample tasks drew (one writer: the
   * worker; relaxed, read by ms_engine_latency) */
  _Atomic uint64_t itl_counts[MS_LAT_BUCKETS + 1];
  _Atomic uint64_t itl_sum_ns;
  int pinned_cpu;               /* pin_workers: the CPU it is bound to; -1: none */
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
  /* Written by workers while the request runs and read by ms_request_get_info
   * from any thread (a server polls it): atomics, plain accesses being
   * seq_cst, except the per-token t_last (relaxed, explicit). */
  _Atomic int slot;
  _Atomic uint32_t generation;
  _Atomic uint64_t t_submit, t_admit, t_first, t_last, t_done;
  struct ms_sample_params sample;  /* from the request options; zero: greedy */
  float presence, frequency;       /* penalties (0: off) */
  int32_t *bias_ids, *stop_ids;    /* [n_bias], [n_stop] (copies) */
  float *bias_vals;
  int n_bias, n_stop;
  float *adj;                      /* [vocab] the adjusted logits (the row's sample task alone) */
  void (*constrain)(void *user, const int32_t *tokens, int n, float *logits, int vocab);
  void (*constrain_free)(void *user);  /* ms_request_opts' structured output; called at the last release */
  void *constrain_user;
  int32_t *stamp;                  /* [vocab] with penalties: the draw that last penalised a token, + 1 */
  int logprobs, top_lp;
  float *lp, *top_vals;            /* [max_new], [max_new * top_lp] */
  int32_t *top_ids;
  _Atomic uint32_t tok_seq;        /* bumped with every token and at the end: ms_request_wait_tokens */
  _Atomic int waiters;             /* threads in ms_request_wait_tokens: skip the wake syscall when 0 */
  _Atomic int cancel;              /* 1: ms_request_cancel, 2: ms_request_stop; read at step start */
  _Atomic int finish;              /* enum ms_finish, set before the state's release */
  uint64_t client;                 /* whose it is (ms_request_opts.client): fair queueing */
  uint64_t fq_tag, fq_seq;         /* its start tag and arrival in the fair queue (step start only) */
  int n_cached;                    /* prompt positions taken from the prefix cache (set at admission) */
};

/* The prefix cache (prefix.c): KV pages keyed by the tokens they hold, as a
 * hash chain over whole pages. A page's key is its tokens and the page before
 * it in its chain (its id and that page's epoch, bumped whenever a page leaves
 * the cache), so a match is exact, never a hash's guess. Touched by the step
 * start alone (admit, layout, retire); the counters are read by any thread. */
struct prefix_cache {
  int on, page_size, n_pages;
  int32_t *ref;                    /* [n_pages] slots holding the page */
  uint8_t *cached;                 /* [n_pages] 1: registered (findable) */
  uint64_t *hash;                  /* [n_pages] chain hash of a registered page */
  int32_t *parent;                 /* [n_pages] the page before it in its chain, -1: first */
  uint32_t *epoch, *parent_epoch;  /* [n_pages] */
  int32_t *tokens;                 /* [n_pages * page_size] the tokens a registered page holds */
  int32_t *head;                   /* [n_buckets] hash buckets: a registered page, -1 */
  int32_t *next;                   /* [n_pages] the bucket's next page */
  int n_buckets;                   /* a power of two */
  int32_t *lru_prev, *lru_next;    /* [n_pages] registered pages no slot holds, oldest first */
  int32_t lru_head, lru_tail;
  int held;                        /* pages with ref > 0 */
  _Atomic uint64_t queries, hits, evictions, hit_requests;
  _Atomic int idle;                /* registered pages no slot holds (the LRU's length) */
};

/* Requests waiting for a slot, in fair order (fairq.c): start-time fair
 * queueing over clients. Touched by the step start alone. */
struct fq_client {
  uint64_t id, finish;             /* a client and the finish tag of its last queued request */
};
struct fairq {
  struct ms_request **heap;        /* [cap] a min-heap by (fq_tag, fq_seq) */
  int n, cap;
  struct fq_client *cl;            /* [cap] clients whose finish tag is ahead of vtime */
  int n_cl;
  uint64_t vtime;                  /* the start tag of the request admitted last */
  uint64_t seq;
};
int ms_fq_init(struct fairq *q, int cap);
void ms_fq_free(struct fairq *q);
/* Queues r for its client (r->client) at a cost (its tokens); 0, or -ENOSPC when full. */
int ms_fq_push(struct fairq *q, struct ms_request *r, uint64_t cost);
/* The request with the lowest start tag (NULL: none); the virtual time moves to it. */
struct ms_request *ms_fq_pop(struct fairq *q);
/* Removes the requests `drop` returns 1 for (after calling it); returns how many. */
int ms_fq_filter(struct fairq *q, int (*drop)(struct ms_request *r, void *user), void *user);

struct ms_engine {
  const struct ms_model *m;
  struct ms_engine_opts o;
  int n_workers;
  /* tensor parallelism across processes (dist.c): the transport (NULL: one
   * process), this engine's rank, and whether a wait on another rank failed
   * (set once by the worker that saw it, read relaxed: it only stops work) */
  const struct ms_transport *tx;
  int rank;
  _Atomic int tx_failed;
  char tx_report[1024];
  /* ms_engine_comm_stats; relaxed adds by the workers (counts, never orders) */
  _Atomic uint64_t tx_sent, tx_received, tx_bytes, tx_wait_ns;
  /* the rows of each matrix this rank's tasks read, over the plans compiled
   * until ms_rt_dist_weights handed them to weight_rows_hook (wrows_handed) */
  struct ms_weight_rows *wrows;  /* [n_wrows] */
  int n_wrows, wrows_handed;
  /* serving across ranks (lead.c, ms_engine_opts.tp_lead): this engine's
   * part, and the step header's state, the step start's alone */
  enum { MS_LEAD_NONE, MS_LEAD_LEADER, MS_LEAD_FOLLOWER } lead;
  int32_t *hdr;                  /* [hdr_cap] the header being built or received */
  size_t hdr_cap;                /* int32s */
  int64_t *hdr_mark;             /* [n_slots][3] the leader, at the step start: a slot's tokens (-1:
                                    empty), its last token, its generation */
  uint64_t hdr_sent_ns;          /* the leader: when it sent its last header */
  int hdr_heard;                 /* the follower: a header came from rank 0 */
  int lead_stopped;              /* the follower: rank 0's header said stop */
  struct ms_ranks *ranks;        /* ranks.c: rank 0's attachments carried to the followers (NULL: none) */
  _Atomic uint32_t stopped;      /* the stop step is published: ms_engine_wait_stopped */
  struct plan_rt rt[MS_MAX_BUCKETS];
  struct plan_rt rt_prefill[MS_MAX_BUCKETS];  /* chunked prefill: one per bucket, compiled lazily */
  int n_buckets;
  int n_slots;                   /* batch slots (requests decoded together): bucket_for(max_batch) */

  /* storage shared by all plans (one step runs at a time) */
  float **buf;
  int n_bufs, max_rows;          /* rows of a step: n_slots, or max_batched_tokens' bucket */
  void *k_pool, *v_pool;         /* f32, or f16 with o.kv_f16 */
  float **kv_stage;              /* o.kv_f16: [worker] (ms_exec_ctx.kv_stage) */
  int pool_pages, max_pages;
  int32_t *free_pages;           /* pages no slot holds and the prefix cache does not know */
  int n_free;
  struct prefix_cache pc;
  struct slot *slots;            /* [n_slots] */
  int *row_slot, *row_pos, *row_token;
  uint8_t *row_head;             /* [max_rows] the row samples (meta.row_head) */
  float *row_rope;               /* [max_rows][2][head_dim] the rows' RoPE rotations (meta.row_rope) */
  int *admit_slots;              /* slots admitted by the step start in flight */
  int32_t **row_pages;
  float **scratch;               /* [worker] max_ctx x (n_heads / n_kv_heads) floats (kernels/ops.h) */
  void **q8;                     /* [worker] 8-bit activation rows; NULL: off */
  struct ms_q8_held *q8_held;    /* [worker] what each holds (kernels/ops.h) */
  struct ms_normed *normed;      /* [worker] fuse_norm: the normed input rows of a class (kernels/ops.h) */
  float *attn_part;              /* attn_parts: the parts' slots (kernels/ops.h, ms_exec_ctx) */
  uint64_t *attn_done;           /* attn_parts: parts done a row and KV group */
  int q8_rows, q8_cols;

  /* The layout as hooks read it, under a seqlock (as on the device): worker 0
   * makes layout_seq odd while it rewrites hook_rows for a new step, even when
   * hook_rows and layout_step describe that step. A hook fired after its task's
   * trigger can read them while the next step is being laid out. */
  _Atomic uint32_t layout_seq;
  _Atomic uint64_t layout_step;
  struct hook_row *hook_rows;    /* [max_rows] */

  /* The step in flight, written by the step start (ms_rt_step_begin) before
   * the backend's publish_step; atomics only for the watchdog's reads. */
  _Alignas(64) _Atomic(struct plan_rt *) cur;
  _Atomic uint64_t cur_gen;
  _Atomic uint64_t cur_step;
  _Atomic int cur_stop;          /* the published step is the stop: the backend's SMs end */
  uint64_t next_step;            /* the step start only */

  /* the mailbox: requests in; the step start moves them to the fair queue */
  struct ms_mpmc mail;
  _Alignas(64) _Atomic uint32_t mail_seq;
  _Atomic int stop_req;
  struct fairq fq;
  _Atomic int queued;            /* submitted, not yet admitted or dropped (mailbox + fair queue) */
  _Atomic int max_queued;        /* a submit beyond it fails with EAGAIN */
  _Atomic uint32_t queued_cancels; /* bumped by a cancel of a queued request: the step start sweeps */
  uint32_t swept;                /* queued_cancels at the last sweep (step start only) */

  /* statistics */
  _Atomic uint64_t steps, tokens, positions, stalls;
  _Atomic int stat_running, stat_pages_used;  /* written at step start (worker 0) */
  pthread_mutex_t log_mu;
  struct ms_step_record step_log[MS_STEP_LOG];
  uint64_t step_log_n;
  char stall_report[8192];

  /* hooks */
  struct ms_hook_table *hooks;
  _Atomic int hooks_on;          /* 0: no hook checks at all (bench baseline); relaxed */
  uint64_t step_t0;              /* when the step in flight was published */

  /* telemetry (telemetry.c) */
  int n_classes, n_ev_classes;
  const struct ms_plan *names;   /* the plan whose class names read-outs use */
  struct ms_histogram ttft, tpot; /* under log_mu */
  uint64_t req_done, req_cancelled;
  float recent_lat[2][MS_LAT_RECENT];  /* under log_mu: the last requests' TTFT, TPOT (s), a ring */
  uint64_t n_recent_lat[2];
  _Atomic int trace_on;
  _Atomic uint64_t trace_session;
  uint32_t trace_cap;
  uint64_t trace_t0, trace_t1;    /* the recording window: start, stop (set by trace_start, trace_stop) */

  /* the backend (backend_*.c): its table, and the context its start made
   * (NULL before the start and after the stop) */
  const struct ms_backend_ops *be;
  void *be_ctx;
  int shape_only;                /* no kernels, no KV cache: timing only (the backend says) */

  /* pausing at a step boundary (ms_engine_pause_at): the step start of
   * pause_at waits on pause_seq until resumed; paused says it is waiting */
  _Atomic uint64_t pause_at;
  _Atomic uint32_t paused, pause_seq;

  /* fault injection (fault.c): NULL when healthy; read-only while running */
  struct ms_faults *faults;

  /* chunked prefill: plans compiled by prefill_th; prefill_ready is the rows of
   * the largest ready (0: none yet), each smaller one ready before it */
  _Atomic int prefill_ready;
  /* the step budget (step.c, plan_chunks): measured step times, worker 0
   * only: a step without a chunk (ns), and what a chunk's prompt row adds
   * to a step (ns); 0: not measured yet */
  double est_step_ns, est_row_ns;
  uint64_t n_admits;             /* admissions so far (slot.admit_seq) */
  pthread_t prefill_th;
  int prefill_thread;

  struct worker *workers;        /* [n_workers] the SMs, whoever runs them */
  pthread_t watchdog;
  int watchdog_on;
  _Atomic uint32_t wd_stop;
};

/* The engine clock: the backend's (real time, or virtual time). Valid from
 * the backend's start to its stop: nothing reads it outside those. */
static inline uint64_t ms_eng_now(const struct ms_engine *e) { return e->be->now(e->be_ctx); }
/* Fault injection's two calls into the backend (src/runtime/fault.c): a held
 * trigger (defer_trigger) and a JIT task due later (poll_at). */
static inline int ms_eng_defer_trigger(struct ms_engine *e, struct worker *w, int producer, uint64_t delay_ns) {
  return e->be->defer_trigger(e->be_ctx, w, producer, delay_ns);
}
static inline void ms_eng_poll_at(struct ms_engine *e, uint64_t at) { e->be->poll_at(e->be_ctx, at); }

static inline uint64_t ms_rt_rng_next(uint64_t *s) {  /* xorshift64 */
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* The bucket (plan index) of a step of `rows` rows: log2, rounded up. */
static inline int ms_rt_bucket_index(int rows) {
  int i = 0;
  while ((1 << i) < rows) i++;
  return i;
}

/* step.c: the step machine every backend runs */
int ms_rt_step_begin(struct ms_engine *e);   /* 0 when a stop was published */
void ms_rt_step_end(struct ms_engine *e);    /* the bookkeeping after a step's end event */
/* A task's life in three parts: start and body when it begins, finish (its
 * trigger) when it ends. */
uint64_t ms_rt_task_start(struct worker *w, struct plan_rt *rt, int t, uint64_t gen);
void ms_rt_task_body(struct worker *w, struct plan_rt *rt, int t);
void ms_rt_task_finish(struct worker *w, struct plan_rt *rt, int t, uint64_t gen, uint64_t t0);
void ms_rt_dep_wait(struct worker *w, struct plan_rt *rt, int t, uint64_t gen, int ev);
/* The hook site of a task's hooks (task_ready, task_assign, task_begin,
 * task_end, dep_wait, dep_release; t < 0: the end-of-step wait, no task), and
 * at a communication task's start and end its comm hook: each context filled
 * once (hooksite.h) and handed to the hook table. arg: the task's start
 * (task_begin, task_end) or the depth of the queue it joined (task_assign).
 * Returns the sched_hint priority, or -1. */
int ms_rt_task_hook(struct worker *w, int hook, struct plan_rt *rt, int t, uint64_t gen, int ev, uint64_t arg);
int ms_rt_jit_pop(struct ms_engine *e, struct plan_rt *rt, int64_t *t);
int ms_rt_jit_empty(struct plan_rt *rt);
/* Counts one trigger of ev now (no fault hold); 1 when it completed the event. */
int ms_rt_trigger_now(struct worker *w, struct plan_rt *rt, int ev, uint64_t gen, int producer);
/* Whether a row of r needs its logits on the host (penalties or logit bias
 * change what is drawn; logprobs and recorded logits keep them). */
int ms_rt_needs_logits(const struct ms_request *r);
/* The sample task of one row, its token drawn elsewhere with the request's
 * sampler (the CUDA backend's device): the bookkeeping of ms_rt_task_body's. */
void ms_rt_sample_drawn(struct worker *w, struct plan_rt *rt, int row, int tok);

/* requests.c: requests in and out, slots and KV pages (the step start's side) */
int ms_rt_retire(struct ms_engine *e, int cancel_all);  /* finished (or all) slots out; how many */
int ms_rt_admit(struct ms_engine *e, int *slots);       /* queued requests into free slots; how many */
void ms_rt_admit_into(struct ms_engine *e, int s, struct ms_request *r);  /* r into free slot s */
/* A follower's copy of rank 0's request (the engine's reference alone):
 * what its rows need, prompt and length; NULL when out of memory. */
struct ms_request *ms_rt_request_follow(struct ms_engine *e, const int32_t *prompt, int n_prompt, int max_new,
                                        int record);
void ms_rt_cancel_mailbox(struct ms_engine *e);
/* Slots holding a request (a read of the engine's state: the step start, the
 * admission's fault site). */
static inline int ms_rt_active_slots(const struct ms_engine *e) {
  int n = 0;
  for (int s = 0; s < e->n_slots; s++)
    if (e->slots[s].req) n++;
  return n;
}
void ms_rt_kv_reserve(struct ms_engine *e, struct slot *sl, int pos);  /* a page for position pos */

/* prefix.c: the prefix cache over the KV pages (a no-op when it is off) */
int ms_pc_init(struct ms_engine *e);
void ms_pc_free(struct ms_engine *e);
int32_t ms_pc_page_take(struct ms_engine *e);        /* a page for a slot: free, else the LRU's oldest */
/* Admission: the slot's cached prefix (its pages taken, pos set); how many positions. */
int ms_pc_admit(struct ms_engine *e, struct slot *sl, struct ms_request *r);
void ms_pc_publish(struct ms_engine *e, struct slot *sl);  /* its whole pages written so far become findable */
void ms_pc_release(struct ms_engine *e, struct slot *sl);  /* its pages back: cached ones kept, LRU */
int ms_pc_pages_held(const struct ms_engine *e);     /* pages slots hold */
void ms_rt_request_tick(struct ms_request *r);          /* a token: wake streaming readers */

/* plans.c: the runtime's view of each plan, and the storage plans share */
int ms_rt_plan_init(struct ms_engine *e, struct plan_rt *rt, int batch, int prefill, struct ms_textbuf *log);
void ms_rt_plan_free(struct ms_engine *e, struct plan_rt *rt);
int ms_rt_storage_alloc(struct ms_engine *e, const struct ms_plan *p);
void ms_rt_storage_free(struct ms_engine *e);
void *ms_rt_prefill_main(void *e);   /* compiles the prefill plans (a thread, or inline) */
/* The device (tensor parallel) worker w belongs to. */
int ms_rt_device(const struct ms_engine *e, int worker);
/* Tensor parallelism across processes (dist.c). */
int ms_rt_dist_check(struct ms_engine *e, struct ms_textbuf *log);   /* at creation: what it needs */
int ms_rt_dist_plan(struct ms_engine *e, struct plan_rt *rt);        /* the remote tiles of a plan */
void ms_rt_dist_weights(struct ms_engine *e);  /* before the workers start: the rows read, to weight_rows_hook */
void ms_rt_comm_run(struct worker *w, struct plan_rt *rt, int t);    /* a communication task's body */
int ms_rt_dist_agree(struct ms_engine *e, int bucket, int rows, int chunked); /* 0: every rank lays out this step */
/* lead.c: serving across ranks, rank 0 leading with a step header each step */
int ms_rt_lead_init(struct ms_engine *e);          /* the header's buffers (after the slots) */
void ms_rt_lead_free(struct ms_engine *e);
void ms_rt_lead_mark(struct ms_engine *e);         /* the leader, before it retires: the slots as the step left them */
void ms_rt_lead_idle(struct ms_engine *e);         /* the leader, idle or paused: an empty header now and then */
int ms_rt_lead_send(struct ms_engine *e, int admitted);  /* the leader: the step decided; 0, or the engine stops */
void ms_rt_lead_stop(struct ms_engine *e);         /* the leader, stopping: the last header */
/* The engine stops with a report (the first failure's), printf-style. */
void ms_rt_lead_failed(struct ms_engine *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The messages on the step header's channel: magic, kind, ... (lead.c; a
 * control message of ranks.c is kind CTL) */
#define MS_HDR_MAGIC 0x4d534831  /* "MSH1" */
enum { MS_HDR_IDLE = 0, MS_HDR_STEP = 1, MS_HDR_STOP = 2, MS_HDR_CTL = 3 };
/* ranks.c: watching the ranks as one engine (megascope/attach.h, "across ranks") */
int ms_rt_ranks_init(struct ms_engine *e);         /* with the lead's buffers */
void ms_rt_ranks_free(struct ms_engine *e);
void ms_rt_ranks_lead(struct ms_engine *e);        /* the leader's worker 0, before a header: the control
                                                      message asked for, and its answers */
void ms_rt_ranks_reap(struct ms_engine *e);        /* rank 0: forgets what it read of attachments freed here */
int ms_rt_ranks_follow(struct ms_engine *e, size_t bytes);
/* rank 0: the other ranks start (stop) their trace too; after a stop, rank
 * r's records of it, moved onto rank 0's clock (NULL: none) */
struct ms_rank_trace {
  int have, n_workers;
  int64_t shift;                 /* added to its times: rank 0's clock minus its own */
  uint64_t err_ns;               /* the bound on that offset's error (half the round trip) */
  uint32_t *n;                   /* [n_workers] records */
  uint64_t *dropped;             /* [n_workers] */
  struct trace_rec **rec;        /* [n_workers][n[w]] */
};
int ms_rt_ranks_trace(struct ms_engine *e, int start, uint32_t records_per_worker);
const struct ms_rank_trace *ms_rt_ranks_trace_of(const struct ms_engine *e, int rank);  /* a follower: rank 0's control message in
                                                               e->hdr, applied and answered; 0 or the engine stops */
/* The follower's step start: waits for rank 0's header and applies it (the
 * tokens, retirements, admissions, each slot's chunk); 1: a step to lay
 * out, 0: the engine stops (rank 0 stopped, a failure, or its own stop). */
int ms_rt_follow(struct ms_engine *e, int *retired, int *admitted);


/* telemetry.c */
int ms_tel_init(struct ms_engine *e);
void ms_tel_free(struct ms_engine *e);
/* A task's end, in two parts around its trigger: ms_tel_task counts it in the
 * aggregates and, while a trace is recorded, fills its record into *rec (1:
 * filled, the worker inside the trace until the publish); ms_tel_publish then
 * writes that record with the event its trigger completed (fired_ev), after
 * the queue depths the trigger recorded. */
int ms_tel_task(struct worker *w, const struct plan_rt *rt, int t, uint64_t t0, uint64_t t1, struct trace_rec *rec);
void ms_tel_publish(struct worker *w, const struct trace_rec *rec, uint32_t fired_ev);
void ms_tel_qdepth(struct worker *w, uint32_t depth);
/* Records of worker w in the current session (0 when it has not seen it). */
uint32_t ms_tel_published(const struct ms_engine *e, int w);
/* Around a trace record's writing (the worker is the only writer of its count):
 * trace_start frees buffers only when no worker is inside. enter: 0 when no
 * trace is recorded (and the worker is not inside). */
int ms_tel_enter(struct worker *w);
void ms_tel_leave(struct worker *w);
/* A task record as every backend writes it: task t of plan p, the request
 * slot of its row (-1: none) with its generation; fired_ev none. */
void ms_tel_fill(struct trace_rec *r, const struct ms_plan *p, int t, uint64_t t0, uint64_t t1, uint64_t ready,
                 uint64_t step, uint64_t wait_ns, int slot, uint32_t req_gen);
/* The worker's next free trace record (NULL, counted as dropped, when full). */
struct trace_rec *ms_tel_slot(struct worker *w);
void ms_tel_request_done(struct ms_engine *e, const struct ms_request *r, int cancelled);

/* watchdog.c */
void *ms_watchdog_main(void *arg);
void ms_watchdog_report(struct ms_engine *e, uint64_t idle_ms, char *buf, size_t n);

/* Whether hook sites are checked at all (a relaxed load: the switch needs no ordering). */
#define HOOKS_ON(e) atomic_load_explicit(&(e)->hooks_on, memory_order_relaxed)

#endif
