/* SPDX-License-Identifier: MIT */
/* The engine: a persistent runtime that runs compiled plans step after step.
 *
 * Worker threads play the SMs. They are created once and run decode steps until
 * the engine is freed; plans are compiled once per batch bucket. Requests enter
 * through a lock-free mailbox and join or leave the batch between steps
 * (continuous batching); their tokens come back through the request object. */
#ifndef MEGASCOPE_ENGINE_H
#define MEGASCOPE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/base.h"
#include "megascope/model.h"
#include "megascope/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ms_mode {
  MS_MODE_MEGAKERNEL = 0,  /* event-driven: tasks start when their event fires */
  MS_MODE_PER_OP = 1,      /* the same tasks, a barrier after every operator */
  MS_MODE_COUNT
};

enum ms_backend {
  MS_BACKEND_CPU = 0,   /* worker threads play the SMs, in real time */
  MS_BACKEND_SIM = 1,   /* a deterministic virtual GPU: N SMs, a virtual clock, a cost model */
  MS_BACKEND_CUDA = 2,  /* the persistent kernel on a GPU (megascope/cuda.h), fed a step at a time */
  MS_BACKEND_COUNT
};

/* The simulator's cost model (docs/design.md, "The simulator"). A task on one SM
 * takes task_fixed_ns + max(bytes / (hbm_gbps / n_sms), flops / (tflops / n_sms)). */
struct ms_sim_params {
  int n_sms;
  double hbm_gbps;         /* memory bandwidth, GB/s, shared evenly by the SMs */
  double tflops;           /* dense bf16 throughput */
  double task_fixed_ns;    /* every task: fetch, decode, prologue, trigger */
  double dispatch_ns;      /* an idle SM picking up a ready task (scheduler latency) */
  double notify_ns;        /* an event firing until a waiting SM sees it */
  double jit_ns;           /* extra dispatch for a JIT task (scheduler warp) */
  double step_ns;          /* the step start: admission, batch metadata */
  double launch_ns;        /* per-op mode: the gap between one kernel and the next */
  int compute;             /* 1: run the kernels (checked against the reference); 0: shapes only */
  double jitter;           /* each task's time varies by up to +-jitter (0.05: 5%), drawn from the seed */
  double link_gbps;        /* tensor parallel: one device's link bandwidth, GB/s */
  double link_latency_ns;  /* tensor parallel: a transfer's fixed latency */
};
/* Presets: "a100" (108 SMs), "h100" and "h200" (132), "b200" (148). -ENOENT otherwise. */
int ms_sim_preset(const char *name, struct ms_sim_params *out);
/* The preset a simulator engine takes when its caller names none (sim.n_sms 0). */
#define MS_SIM_DEFAULT_GPU "h100"
extern const char *const ms_sim_preset_names[];
/* Sets one cost-model parameter by its field name ("hbm_gbps", "task_fixed_ns",
 * ..., "n_sms"): 0, -ENOENT for an unknown name, -EINVAL for a bad value. */
int ms_sim_param_set(struct ms_sim_params *p, const char *name, const char *value);
/* The names ms_sim_param_set knows, NULL-terminated. */
extern const char *const ms_sim_param_names[];

const char *ms_mode_name(enum ms_mode m);
int ms_mode_parse(const char *s, enum ms_mode *out);

struct ms_plan;
struct ms_fault;
struct ms_transport;

struct ms_engine_opts {
  size_t sz;               /* sizeof(struct ms_engine_opts) */
  int n_workers;           /* 0: one per online core */
  enum ms_mode mode;
  int max_batch;           /* rows; buckets 1, 2, 4, ... up to it; 0: 16 */
  int max_ctx;             /* positions per request; 0: 512 */
  int page_size;           /* KV-cache page, in positions; 0: 16 */
  int tile_bytes;          /* see ms_compile_opts; 0: default */
  int tile_rows;           /* see ms_compile_opts; 0: default */
  int shuffle;             /* random delays before tasks, random AOT placement */
  uint64_t seed;           /* for shuffle */
  int shuffle_max_us;      /* longest random delay; 0: 50 */
  int watchdog_ms;         /* report a stall after this long without progress; 0: off */
  /* Called for each plan after compiling, before the runtime lays out its queues
   * (tests use it to break a plan on purpose). */
  void (*plan_hook)(struct ms_plan *plan, void *user);
  void *plan_hook_user;
  enum ms_backend backend;
  struct ms_sim_params sim; /* MS_BACKEND_SIM: n_workers becomes sim.n_sms */
  int tiles_per_op;        /* see ms_compile_opts; 0: default (the sim uses n_sms) */
  /* Fault injection (megascope/fault.h): applied to every plan; copied. */
  const struct ms_fault *faults;
  int n_faults;
  int tp;                  /* tensor-parallel devices (>= 2: communication tasks); 0, 1: one.
                              The sim gives each device sim.n_sms SMs. */
  int start_paused;        /* 1: paused before the first step until ms_engine_resume */
  /* CPU kernels: quantize each GEMV's input rows to 8-bit blocks (a scale per 32
   * values) and take integer dot products with block-format weights (Q8_0 ..
   * the K-quants; f32, f16 and bf16 keep f32 activations). Faster; logits move off the f32 reference by about
   * the activations' rounding (kernels/quant.h). Deterministic like the f32 path. */
  int q8_activations;
  /* Chunked prefill: a step takes at most this many token rows; a request in
   * its prompt contributes a chunk of it (up to what the decode rows leave),
   * a request past it one row. Steps with a chunk run the bucket's prefill plan
   * (attention waits for the KV of every row of its layer). 0: off, one
   * position per request per step. */
  int max_batched_tokens;
  /* The step budget (with max_batched_tokens): while a request is past its
   * prompt (its stream is running), a step's prompt chunk is sized from
   * measured step times so the step, and so every running stream's
   * inter-token time, stays near this many microseconds: the step time
   * without a chunk and the time a chunk's row adds are averaged over the
   * last steps (decode rows first, then at least min(4, max_batched_tokens)
   * chunk rows, so a queued prompt always advances, oldest admitted
   * first). With no stream running the chunk fills max_batched_tokens.
   * 0: off (every step fills max_batched_tokens). */
  int step_target_us;
  int prefill_async;       /* 1: compile the prefill plans while the engine serves (a server
                              starts at once; prompts are chunked once they are ready); 0:
                              before ms_engine_new returns */
  int cuda_sms;            /* MS_BACKEND_CUDA: CTAs of the persistent kernel; 0: every SM */
  /* CPU backend: pin worker w to the (w mod n)-th CPU of the n the process may
   * run on, so a worker is a core: what another process on that core takes is
   * that worker's loss alone (ms_engine_worker_os says how much). 0: the OS
   * places the workers. */
  int pin_workers;
  /* Automatic prefix caching: the KV pages a request filled stay after it
   * ends, keyed by the tokens they hold (a hash chain over whole pages), and a
   * later request whose prompt begins with the same pages shares them and
   * computes only the positions past them (at least its last prompt
   * position, whose logits it samples). Shared pages are never written;
   * pages no request holds are evicted least recently used first when a
   * page is needed. The answer is the same, bit for bit: a page holds what
   * the request would have computed. A request that records its logits has
   * none (NaN) for the positions it read from the cache. The CUDA backend
   * keeps it off. 0: off. */
  int prefix_cache;
  /* Tensor parallelism across processes (megascope/transport.h): this process
   * is rank transport->rank of transport->size, each running this engine on the
   * same model with tp = size; it computes its share of every split operator and
   * the communication tasks move the shares. The cpu backend, dense models.
   * NULL: one process. Not owned. */
  const struct ms_transport *transport;
  int comm_timeout_ms;     /* with a transport: a wait on another rank longer than this stops
                              the engine with a report naming the rank (0: 10000) */
  /* With a transport: rank 0 leads (a server). Requests enter at rank 0
   * alone; its step start decides each step (retirements, admissions, prompt
   * chunks) and sends it, with the tokens rank 0 drew in the step before, to
   * the other ranks in a step header, which their step starts apply; they
   * take no requests of their own (ms_engine_submit fails with EPERM) and
   * stop when rank 0 stops (ms_engine_wait_stopped). While idle, rank 0 sends
   * an empty header a second, so a follower that hears nothing for
   * comm_timeout_ms stops with a report naming rank 0. 0: every rank submits
   * the same requests itself (run, bench decode). */
  int tp_lead;
  /* With a transport: called once by ms_engine_new, after the plans it
   * compiles before it returns and before its workers start, with the rows
   * of each matrix this rank's tasks read (over every such plan, min .. max
   * per matrix; a matrix not named is not read by them). The caller, who
   * owns the model, may pack those rows alone (ms_model_repack_rows on a
   * model loaded without its packed form): no kernel reads the weights
   * before the hook returns. A plan compiled later (prefill_async) reads
   * what it needs outside them from the file's layout. NULL: none. */
  void (*weight_rows_hook)(const struct ms_weight_rows *rows, int n, void *user);
  void *weight_rows_user;
  int min_tiles;           /* see ms_compile_opts; 0: the compiler's (the backend sets its own when
                            * the caller sets no tiling: ms_backend_info) */
  int fuse_norm;           /* see ms_compile_opts; only a backend whose info says fuse_norm runs it
                            * (ms_engine_new refuses it elsewhere); set by the CPU backend with its own
                            * tiling */
  int attn_parts;          /* see ms_compile_opts; 0: the backend's (ms_backend_info, whatever the
                            * caller's tiling: the CPU's two); more than the backend merges: refused */
  /* The KV cache in f16, as llama.cpp keeps it by default: half the memory, and
   * half the bytes attention reads at each position. K (after RoPE) and V are
   * rounded to the nearest f16 once, when written; attention computes in f32
   * as with an f32 cache. Logits move off the f32 cache's by that rounding
   * (ms_ref_set_kv_f16 is its reference). A backend whose info says kv_f16
   * runs it (the CPU); elsewhere ms_engine_new refuses it. 0: f32. */
  int kv_f16;
};

/* "cpu", "sim", "cuda"; NULL for an unknown id. */
const char *ms_backend_name(enum ms_backend b);
/* The backend by name: 0, or -EINVAL. */
int ms_backend_parse(const char *s, enum ms_backend *out);

/* What a backend is, for a caller that sets options or reads results by it:
 * the runtime answers, and nothing outside it asks which backend runs. */
struct ms_backend_info {
  const char *name;        /* "cpu", "sim", "cuda" (ms_backend_name) */
  const char *label;       /* how a report names it: "CPU", "simulator", "CUDA" */
  int virtual_clock;       /* times are simulated, so a run follows from its seed (ms_engine_sim_now),
                            * not measured; nothing stalls or interferes in real time */
  int cost_model;          /* a cost model gives the times (ms_engine_opts.sim: a GPU preset, its
                            * parameters); tasks run shapes only unless sim.compute */
  int os_workers;          /* the workers are this process's threads: n_workers counts them, pin_workers
                            * binds them, ms_engine_worker_os reads them; else the backend counts them */
  int on_device;           /* the tasks run on an accelerator (ms_backend_device describes it) */
  int device_sms;          /* cuda_sms chooses how many of the device's SMs run */
  int tiles_per_worker;    /* the workers are SMs: plans are tiled about one task per worker per operator */
  int q8_activations;      /* q8_activations is honoured (else activations stay f32) */
  int kv_f16;              /* kv_f16 is honoured (ms_engine_opts) */
  int bf16_weights;        /* weights are held as bf16 (other types converted, with their rounding) */
  int prefix_cache;        /* prefix_cache is honoured (else it is off) */
  int tile_bytes;          /* the GEMV task size its plans are compiled with when the caller sets no
                            * tiling (ms_engine_opts tile_bytes, tile_rows, tiles_per_op); 0: the
                            * compiler's default, or about one task per worker (tiles_per_worker).
                            * A caller compiling a plan of its own (to name faults) compiles it so. */
  int min_tiles;           /* with tile_bytes: GEMV tasks an operator at least (ms_compile_opts) */
  int fuse_norm;           /* with tile_bytes: its plans fuse the pre-norms (ms_compile_opts); its
                            * kernels run such plans */
  int attn_parts;          /* its plans cut attention so (ms_compile_opts) unless the caller says:
                            * whatever the tiling. 0: one task a row and KV group */
  int attn_parts_max;      /* the parts its kernels merge (ms_engine_opts.attn_parts at most); 0: none */
};
/* Backend b's description; NULL for an unknown id. */
const struct ms_backend_info *ms_backend_info(enum ms_backend b);
/* The backend's own tiling (bi's tile_bytes, min_tiles, fuse_norm, attn_parts) into co: the
 * plans an engine on it compiles when its caller tiles nothing, for a caller
 * that compiles one of its own (to name faults, to print a schema). */
void ms_backend_plan_tiling(const struct ms_backend_info *bi, struct ms_compile_opts *co);
/* 1 when backend b injects faults of type fault_type (enum ms_fault_type,
 * megascope/fault.h), 0 when an engine on it refuses them. */
int ms_backend_injects(enum ms_backend b, int fault_type);

/* The accelerator a backend's tasks run on. */
struct ms_device_info {
  char name[128];
  int sms, major, minor;
  double mem_gib;
  double peak_gbs;         /* HBM bandwidth: 2 x memory clock x bus width */
};
/* 0, or -MS_E_UNSUPP with the reason in why (a backend on the host, a build
 * without the device's code, no device). */
int ms_backend_device(enum ms_backend b, struct ms_device_info *out, char *why, size_t n);

struct ms_engine;
struct ms_request;

struct ms_engine *ms_engine_new(const struct ms_model *m, const struct ms_engine_opts *o,
                                struct ms_textbuf *log);
/* Stops the workers after the step in flight; requests not finished are cancelled. */
void ms_engine_free(struct ms_engine *e);

int ms_engine_n_workers(const struct ms_engine *e);
const struct ms_model *ms_engine_model(const struct ms_engine *e);
/* 1 when the GEMVs take 8-bit activations (q8_activations and block-format weights). */
int ms_engine_q8_active(const struct ms_engine *e);

/* The KV cache's bytes for one position of one request (K and V of every
 * layer): f32 values, or f16 with kv_f16 (ms_engine_opts). */
size_t ms_engine_kv_position_bytes(const struct ms_model *m, int kv_f16);
enum ms_mode ms_engine_mode(const struct ms_engine *e);
/* The plan of the bucket holding `rows` rows. */
const struct ms_plan *ms_engine_plan(const struct ms_engine *e, int rows);
/* What each worker runs right now, as the watchdog sees it (on the CUDA
 * backend, each CTA's heartbeat): kernel[w] is the kind (enum ms_kernel) of
 * the task it runs, -1 while it waits on an event, -2 between tasks. Fills up
 * to max and returns the workers (the analog of a PC sample). */
int ms_engine_sample_kernels(const struct ms_engine *e, int *kernel, int max);

struct ms_request_opts {
  size_t sz;
  const int32_t *prompt;   /* copied */
  int n_prompt;            /* >= 1 */
  int max_new_tokens;      /* >= 1 */
  int stop_at_eos;         /* finish early on the model's eos token */
  int record_logits;       /* keep the logits of every position (for checks) */
  /* Sampling (megascope/sample.h); all zero is greedy. Draw i of the request
   * depends only on (sample_seed, i), so its text does not depend on scheduling. */
  float temperature;       /* <= 0: greedy */
  int top_k;               /* <= 0: off */
  float top_p;             /* <= 0 or >= 1: off */
  uint64_t sample_seed;
  /* Later fields (read only when sz covers them; zero is off). */
  float min_p;             /* <= 0: off */
  float presence_penalty;  /* subtracted once from the logit of every token generated so far */
  float frequency_penalty; /* subtracted per occurrence in the generated tokens (as vLLM: the prompt is not counted) */
  const int32_t *bias_ids; /* logit_bias: added to those tokens' logits before sampling (copied) */
  const float *bias_vals;
  int n_bias;
  const int32_t *stop_ids; /* tokens that end the request (end of turn); kept as its last token (copied) */
  int n_stop_ids;
  int logprobs;            /* record each generated token's log-probability */
  int top_logprobs;        /* and the ids and log-probabilities of the n most probable (0..20) */
  /* Whose request it is (a server: the client's address or API key, hashed).
   * Queued requests are admitted fairly among clients: one with many queued
   * waits behind its own, not in front of others'. 0 is a client too (every
   * caller that names none: first come, first served). */
  uint64_t client;
  /* A constraint on each draw (structured output: serve's response_format).
   * Before draw n, constrain(user, tokens, n, logits, vocab) gets the n tokens
   * drawn so far and the logits the draw uses (penalties and logit_bias
   * applied: the request's own copy) and forbids a token by setting its logit
   * to -INFINITY, leaving at least one. It runs on the worker that draws, once
   * a draw, never twice at once for one request. logprobs stay the model's.
   * Once the request is accepted the engine owns user: constrain_free(user)
   * when the request is freed (a refused submit leaves it to the caller). */
  void (*constrain)(void *user, const int32_t *tokens, int n, float *logits, int vocab);
  void (*constrain_free)(void *user);
  void *constrain_user;
};

/* How a request ended. */
enum ms_finish {
  MS_FINISH_NONE = 0,      /* still running */
  MS_FINISH_LENGTH = 1,    /* max_new_tokens reached */
  MS_FINISH_STOP = 2,      /* its last token is the model's eos or one of its stop_ids */
  MS_FINISH_CANCELLED = 3, /* ms_request_cancel, or the engine stopped */
};

enum ms_request_state {
  MS_REQ_QUEUED = 0,
  MS_REQ_ACTIVE = 1,
  MS_REQ_DONE = 2,
  MS_REQ_CANCELLED = 3,
  MS_REQ_STATE_COUNT
};

struct ms_request_info {
  enum ms_request_state state;
  int slot;                /* batch slot while active, else -1 */
  uint32_t generation;     /* the slot's generation when admitted */
  int n_prompt;
  int n_tokens;            /* generated so far */
  const int32_t *tokens;   /* [n_tokens] */
  int n_logits;            /* positions with recorded logits */
  const float *logits;     /* (n_logits, vocab): logits after feeding position i (NaN for the
                              first n_cached: read from the prefix cache, not computed) */
  uint64_t t_submit, t_admit, t_first, t_done;  /* ms_now_ns(); 0: not yet */
  enum ms_finish finish;
  /* With logprobs: logprob[i] of tokens[i] under the model's distribution (the
   * logits before penalties, bias and temperature, as vLLM reports them), and
   * with top_logprobs = k the k most probable ids and their log-probabilities,
   * top_ids[i * k + j], most probable first. NULL when not asked for. */
  const float *logprob;
  int top_logprobs;
  const int32_t *top_ids;
  const float *top_lp;
  /* Prompt positions read from the prefix cache, not computed (a whole number
   * of KV pages, at most n_prompt - 1); 0 without a hit. Set at admission. */
  int n_cached;
};

/* Submits a request; NULL + errno (EINVAL, E2BIG when it cannot fit max_ctx,
 * EAGAIN when the queue is full, ESHUTDOWN when the engine is stopping). */
struct ms_request *ms_engine_submit(struct ms_engine *e, const struct ms_request_opts *o);
/* The most requests queued for a slot (default 1024, at most 16384): a submit
 * beyond it fails at once with EAGAIN. Returns the bound set. */
int ms_engine_set_max_queued(struct ms_engine *e, int n);
/* Waits until the request is done or cancelled: 0, or -ETIMEDOUT (timeout_ms < 0: forever). */
int ms_request_wait(struct ms_request *r, int timeout_ms);
void ms_request_get_info(const struct ms_request *r, struct ms_request_info *out);
/* Waits until the request has more than `seen` tokens or has finished: 0, or
 * -ETIMEDOUT. For streaming: wake on every token. */
int ms_request_wait_tokens(struct ms_request *r, int seen, int timeout_ms);
/* Asks the engine to drop the request: a queued one never starts, a running one
 * is retired at the next step start (its slot and KV pages freed, counted as
 * cancelled). Idempotent; a finished request stays finished. */
void ms_request_cancel(struct ms_request *r);
/* Ends a request early as done (MS_FINISH_STOP): the caller matched a stop
 * string in its text. Retired at the next step start like a cancel, but counted
 * as finished. */
void ms_request_stop(struct ms_request *r);
/* Frees a finished request (one still running is freed when it finishes). */
void ms_request_free(struct ms_request *r);

struct ms_engine_stats {
  uint64_t steps;
  uint64_t tokens;         /* generated tokens (prompt positions excluded) */
  uint64_t positions;      /* rows processed, prompt positions included */
  uint64_t tasks;          /* tasks executed */
  uint64_t stalls;         /* watchdog reports */
  int n_workers;
  /* As of the last step start: */
  int running;             /* requests holding a batch slot */
  int waiting;             /* requests queued for one */
  int kv_pages_used, kv_pages;  /* KV-cache pages held by requests, and the pool's size */
  /* The prefix cache (ms_engine_opts.prefix_cache): prompt tokens looked up
   * (every admitted request's prompt, vLLM's "queries") and those found
   * cached ("hits"); pages cached that no request holds (evictable, not
   * counted in kv_pages_used); pages evicted; requests that found at least
   * one page. */
  uint64_t prefix_queries, prefix_hits, prefix_evictions, prefix_hit_requests;
  int prefix_pages_cached;
  int prefix_cache;        /* 1: the engine keeps one */
  /* Requests put back in the queue to make room (none: the KV pool holds
   * every slot's whole context, so a running request is never preempted). */
  uint64_t preemptions;
};
void ms_engine_get_stats(const struct ms_engine *e, struct ms_engine_stats *out);

struct ms_step_record {
  uint64_t step;
  int rows, bucket;
  int admitted, retired;
  uint64_t t_begin, t_end;
  int decoding;            /* rows of requests past their prompt (each draws a token) */
  int chunk_rows;          /* prompt rows beyond one a request (chunked prefill) */
};
/* What the operating system says of one worker thread (CPU backend; the
 * others fill cpu = -1 and zeros): the CPU it is pinned to (-1: not pinned)
 * and the one it last ran on, its run time, the time it was runnable but
 * waited for a CPU (another thread had it: /proc's schedstat), and how often
 * it was preempted (involuntary context switches). Counters since the worker
 * started; a window is the difference of two reads. */
struct ms_worker_os {
  int pinned_cpu, last_cpu;
  uint64_t run_ns, runqueue_ns;
  uint64_t preempted;
};
/* 0, -EINVAL for a worker out of range, or -ENOENT when the OS does not say
 * (no /proc, no schedstat: then the fields it did read are filled). */
int ms_engine_worker_os(const struct ms_engine *e, int worker, struct ms_worker_os *out);

/* Copies up to `max` of the most recent step records, oldest first; returns the count. */
int ms_engine_step_log(const struct ms_engine *e, struct ms_step_record *out, int max);

/* Injected delay before a task of the plan for `rows` (fault injection, tests). */
int ms_engine_set_task_delay(struct ms_engine *e, int rows, int task, uint64_t ns);

/* Pausing at a step boundary: the step start of global step `step` (0: the
 * first) waits before it retires or admits anything until ms_engine_resume (or
 * a later ms_engine_pause_at, which lets a paused engine go on to that step).
 * Pause at 0 before submitting, then resume, and a batch of requests joins one
 * step (on the simulator, a run is then a function of its seed); pause later to
 * attach a monitor at a known step. */
int ms_engine_pause_at(struct ms_engine *e, uint64_t step);
/* Waits until the engine is paused at the requested step: 0, or -ETIMEDOUT
 * (timeout_ms < 0: forever). */
int ms_engine_wait_paused(struct ms_engine *e, int timeout_ms);
int ms_engine_resume(struct ms_engine *e);

/* The simulated clock of a sim engine (ns since it started); 0 for the CPU backend. */
uint64_t ms_engine_sim_now(const struct ms_engine *e);
/* The simulator's analog of PC sampling: fn(user, sm, kernel) for every SM
 * every period_ns of virtual time (kernel as ms_engine_sample_kernels gives
 * it). Set while the engine is paused; the engine's backend must be sim. */
void ms_sim_sampler(struct ms_engine *e, uint64_t period_ns, void (*fn)(void *user, int sm, int kernel), void *user);

/* Tensor parallelism across processes: what the communication tasks of this
 * rank moved and waited for since the engine started (all 0 in one process). */
struct ms_comm_stats {
  uint64_t sent, received;   /* shares: each send goes to every other rank */
  uint64_t bytes_received;
  uint64_t wait_ns;          /* summed over receiving tasks: from the first poll that found the share
                                missing to its arrival (a worker's time spent waiting on another rank) */
};
void ms_engine_comm_stats(const struct ms_engine *e, struct ms_comm_stats *out);

/* An engine served across ranks (tp_lead), seen from rank 0 (which serves
 * its control socket and /metrics): the ranks it speaks for, the transport's
 * size on a leading rank 0, else 1 (megascope/attach.h, "across ranks"). */
int ms_engine_ranks(const struct ms_engine *e);
/* Every other rank's counters read now, at a step boundary (its
 * ms_engine_get_stats, ms_engine_comm_stats, each worker's ms_worker_os):
 * 0, or a negative error (-EPIPE: the engine stopped). Nothing elsewhere. */
int ms_engine_ranks_read_stats(struct ms_engine *e);
/* Rank r's counters: rank 0's own now, another rank's as last read. os (may
 * be NULL) gets up to max_os workers'. Returns the rank's workers, or -ENOENT
 * (not read yet, or no such rank). */
int ms_engine_rank_stats(struct ms_engine *e, int rank, struct ms_engine_stats *st, struct ms_comm_stats *cs,
                         struct ms_worker_os *os, int max_os);

/* Tensor parallelism across processes: 1 when the engine stopped because a
 * wait on another rank failed (it timed out, or the ranks disagreed on a step),
 * with the report, naming the rank and the event, in buf; else 0. */
int ms_engine_comm_failed(const struct ms_engine *e, char *buf, size_t n);
/* Waits until the engine's workers stopped on their own or were told to
 * (a follower of tp_lead: rank 0 stopped, or a wait on another rank failed):
 * 0, or -ETIMEDOUT (timeout_ms < 0: forever). */
int ms_engine_wait_stopped(struct ms_engine *e, int timeout_ms);
/* Tensor parallelism across processes: 1 when this follower's engine stopped
 * because rank 0 said it stops (its step header), else 0. */
int ms_engine_lead_stopped(const struct ms_engine *e);

/* The last watchdog report ("" when none); returns the stall count. */
uint64_t ms_engine_last_stall(const struct ms_engine *e, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
