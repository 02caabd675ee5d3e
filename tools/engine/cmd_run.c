/* SPDX-License-Identifier: MIT */
/* megascope run: decode a batch of requests in the persistent runtime, and
 * optionally check every position's logits against the reference forward. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/bpf.h"
#include "megascope/engine.h"
#include "megascope/json.h"
#include "megascope/attach.h"
#include "megascope/query.h"
#include "megascope/reference.h"
#include "megascope/tokenizer.h"
#include "megascope/transport.h"
#include "run_text.h"

struct run_args {
  struct cli_model cm;
  long batch, requests, steps, prompt_len, workers, max_ctx, tile_kb, tile_rows, watchdog_ms, max_batched;
  long attn_parts;
  int shuffle, check, as_json, show_steps, compute, q8, kv_f16;
  struct cli_backend be;
  const char *gpu;
  const char *sim_param[16], *fault[4];
  int n_sim_param, n_fault;
  long tp, comm_timeout_ms;
  const char *attach[8];
  int n_attach;
  const char *replace_with;
  const char *query;     /* --query: attached as attach[query_i] */
  int query_i;
  long attach_at, replace_at, detach_at;
  struct cli_budget budget;  /* of every --attach and the --query */
  uint64_t seed;
  double tolerance;
  enum ms_mode mode;
  struct run_text text;  /* --prompt, --chat, sampling */
};

/* --fault: parsed, then resolved against the plan the run will use. */
static int resolve_faults(const struct ms_model *m, const struct run_args *a, const struct ms_engine_opts *eo,
                          struct ms_fault *out) {
  char buf[1024] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  const struct ms_backend_info *bi = ms_backend_info((enum ms_backend)a->be.backend);
  const int sim = bi->cost_model;  /* workers: its SMs */
  int D = a->tp > 1 ? (int)a->tp : 1, workers = sim ? eo->sim.n_sms * D : (int)a->workers;
  int untiled = !eo->tile_bytes && !eo->tile_rows;  /* the backend's tiling, as the engine will run */
  struct ms_compile_opts co = {.sz = sizeof co, .batch = ms_bucket_for((int)a->batch), .tile_bytes = eo->tile_bytes,
                               .tile_rows = eo->tile_rows, .tiles_per_op = sim ? workers : 0,
                               .min_tiles = eo->min_tiles, .fuse_norm = eo->fuse_norm,
                               .attn_parts = eo->attn_parts ? eo->attn_parts : bi->attn_parts, .tp = D};
  if (untiled) ms_backend_plan_tiling(bi, &co);
  struct ms_plan *p = ms_plan_compile(m, &co, &log);
  int rc = p ? 0 : -1;
  for (int i = 0; !rc && i < a->n_fault; i++) {
    struct bench_fault f;
    rc = bench_fault_spec(a->fault[i], &f, &log) ||
         bench_fault_resolve(&f, p, workers > 0 ? workers : 1024, (int)a->batch, D, &out[i], &log);
  }
  ms_plan_free(p);
  if (rc) fprintf(stderr, "megascope run: %s", buf);
  return rc;
}

static const char *const mode_names[] = {"megakernel", "per-op", NULL};

#define RA struct run_args
static const struct cli_opt run_opts[] = {
    CLI_OPT_GROUP(RA, cm, cli_model_opts),
    CLI_OPT_INT(RA, batch, "batch", "N", 1, 4096, "most rows decoded together (default 4)"),
    CLI_OPT_INT(RA, requests, "requests", "N", 1, 1 << 20,
                "requests to send (default: --batch, 1 with --prompt); more than --batch\n"
                "join as earlier ones finish"),
    CLI_OPT_INT(RA, steps, "steps", "N", 1, 1 << 20, "tokens each request generates (default 16)"),
    CLI_OPT_INT(RA, prompt_len, "prompt-len", "N", 1, 1 << 20, "longest prompt; prompts vary from 1 to N (default 8)"),
    CLI_OPT_GROUP(RA, text, run_text_opts),
    CLI_OPT_CHOICE(RA, mode, "mode", "M", mode_names, "megakernel (default) or per-op"),
    CLI_OPT_GROUP(RA, be, cli_backend_opts),
    CLI_OPT_STR(RA, gpu, "gpu", "G", "sim: a100, h100 (default), h200, b200"),
    CLI_OPT_FLAG(RA, compute, "compute", "sim: run the kernels too (default: shapes only, no --check)"),
    CLI_OPT_LIST(RA, sim_param, n_sim_param, "sim-param", "K=V",
                 "sim: set a cost-model parameter (hbm_gbps, tflops, n_sms,\n"
                 "task_fixed_ns, dispatch_ns, notify_ns, jit_ns, step_ns,\n"
                 "launch_ns, jitter, link_gbps, link_latency_ns); repeatable"),
    CLI_OPT_INT(RA, tp, "tp", "N", 1, 64,
                "tensor-parallel devices: all-gathers of communication tasks;\n"
                "under mpirun -np N, N processes, one device each (cpu backend)"),
    CLI_OPT_INT(RA, comm_timeout_ms, "comm-timeout-ms", "N", 1, 1 << 30,
                "under mpirun: stop every rank when one waits on another this long\n"
                "(default 10000)"),
    CLI_OPT_LIST(RA, fault, n_fault, "fault", "T:TARGET:M",
                 "inject a scheduler fault (docs/benchmark.md), e.g.\n"
                 "slow_class:blk.1.wo:2, delayed_release:rope->attn:20us,\n"
                 "starve_task:blk.0.attn@3:50us, comm_delay:1:10us, slow_worker:5:1.2,\n"
                 "slow_layer:1:1.3, late_admission:2:100us; repeatable"),
    CLI_OPT_GROUP(RA, workers, cli_workers_opts),
    CLI_OPT_FLAG(RA, shuffle, "shuffle", "random delays before tasks and random AOT placement"),
    CLI_OPT_U64(RA, seed, "seed", "S", "seed of --shuffle (default 1)"),
    CLI_OPT_INT(RA, max_ctx, "max-ctx", "N", 2, 1 << 20,
                "positions per request (default: the model's trained context,\n"
                "capped by memory as serve caps it; 512 for a synthetic model;\n"
                "at least the longest prompt and --steps)"),
    CLI_OPT_INT(RA, tile_kb, "tile-kb", "K", 1, 1 << 20,
                "target weight KiB per GEMV task (default: the backend's,\n"
                "1024 on the CPU, at least two tasks an operator; 64 elsewhere;\n"
                "given, at least eight tasks an operator)"),
    CLI_OPT_INT(RA, tile_rows, "tile-rows", "N", 1, 1 << 20, "fixed output rows per GEMV task (overrides --tile-kb)"),
    CLI_OPT_INT(RA, attn_parts, "attn-parts", "N", 1, MS_ATTN_MAX_PARTS,
                "each row's attention over a KV group in N tasks over shares\n"
                "of its positions, the last to finish merging them (default:\n"
                "the backend's, 2 on the CPU, 1 elsewhere; cuda runs 1)"),
    CLI_OPT_GROUP(RA, q8, cli_act_opts),
    CLI_OPT_FLAG(RA, kv_f16, "kv-f16",
                 "the KV cache in f16, as llama.cpp keeps it: half its memory and\n"
                 "of attention's reads; --check's reference rounds it alike"),
    CLI_OPT_INT(RA, max_batched, "max-batched-tokens", "N", 0, 4096,
                "chunked prefill: at most N token rows a step, a prompt fed\n"
                "in chunks instead of one position per step (default 0: off)"),
    CLI_OPT_INT(RA, watchdog_ms, "watchdog-ms", "N", 0, 1 << 30, "report a stall after N ms without progress (default 2000)"),
    CLI_OPT_FLAG(RA, check, "check",
                 "compare every position's logits with the reference forward; on\n"
                 "the exact path (f32 activations) unless --q8-activations is\n"
                 "given, then against the reference of the 8-bit activations"),
    CLI_OPT_DOUBLE(RA, tolerance, "tolerance", "X", 0, HUGE_VAL,
                   "largest allowed |logit difference| with --check (default 1e-3;\n"
                   "0.25 with 8-bit activations on block-format weights; 0.1 on\n"
                   "--backend cuda for weights not in bf16: the device holds bf16)"),
    CLI_OPT_FLAG(RA, show_steps, "show-steps", "print every decode step (rows, bucket, admitted, retired, time)"),
    CLI_OPT_LIST(RA, attach, n_attach, "attach", "PROG.o", "attach a monitor while the engine runs (repeatable)"),
    CLI_OPT_INT(RA, attach_at, "attach-at-step", "N", 0, 1L << 40, "attach once N steps have completed (default 0)"),
    CLI_OPT_STR(RA, replace_with, "replace-with", "P.o", "replace the first attachment by another monitor ..."),
    CLI_OPT_INT(RA, replace_at, "replace-at-step", "N", 0, 1L << 40, "... once N steps have completed"),
    CLI_OPT_INT(RA, detach_at, "detach-at-step", "N", 0, 1L << 40, "detach every attachment once N steps have completed"),
    CLI_OPT_STR(RA, query, "query", "PROGRAM",
                "attach a query (docs/query.md) as one more monitor and print\n"
                "its answer with its coverage"),
    CLI_OPT_GROUP(RA, budget, cli_budget_opts),
    CLI_OPT_FLAG(RA, as_json, "json", "print the result as JSON"),
    {0}};
#undef RA

static const char run_head[] =
    "usage: megascope run [--model F.gguf | --synthetic PRESET] [options]\n\n"
    "With no model named it runs SmolLM2-135M-Instruct from the model cache\n"
    "(~/.cache/megascope; scripts/get-smollm2.sh fetches it).\n\n"
    "Decodes requests in the persistent megakernel runtime (continuous batching).\n\n";

/* 0: parsed; 1: --help printed; -1: a usage error, printed. */
static int parse(int argc, char **argv, struct run_args *a) {
  *a = (struct run_args){.batch = 4, .requests = -1, .steps = 16, .prompt_len = 8,
                         .watchdog_ms = 2000, .seed = 1, .tolerance = -1,
                         .replace_at = -1, .detach_at = -1, .text.stop_id = -1, .q8 = -1};
  int rc = cli_parse("run", run_head, run_opts, a, argc, argv, NULL);
  if (rc) return rc;
  if (a->requests < 0) a->requests = a->text.prompt ? 1 : a->batch;
  /* 8-bit activations unless told otherwise, but a --check of its own accord
   * checks the exact path: on a deep model a rounding of an activation that
   * flips (the reference's inputs are doubles, the engine's floats) moves the
   * logits by more than any bound that would still catch a wrong task */
  if (a->q8 < 0) a->q8 = !a->check;
  const struct ms_backend_info *be = ms_backend_info((enum ms_backend)a->be.backend);
  if (be->cost_model && a->check && !a->compute) {
    fprintf(stderr, "megascope run: --check on the simulator needs --compute\n");
    return -1;
  }
  if ((a->gpu || a->compute || a->n_sim_param) && !be->cost_model) {
    fprintf(stderr, "megascope run: --gpu, --compute and --sim-param are for --backend sim\n");
    return -1;
  }
  if (a->be.sms && !be->device_sms) {
    fprintf(stderr, "megascope run: --sms is for --backend cuda\n");
    return -1;
  }
  a->cm.shape_only = be->cost_model && !a->compute;
  if (a->replace_with && (!a->n_attach || a->replace_at < 0)) {
    fprintf(stderr, "megascope run: --replace-with needs --attach and --replace-at-step\n");
    return -1;
  }
  return 0;
}

/* Monitors are loaded and verified before the engine starts, so a rejected one
 * fails the command at once, with the verifier's log. */
static struct ms_monitor *load_monitor(const char *path) {
  char buf[16384] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_monitor *m = ms_monitor_open(path, &log);
  if (!m) fprintf(stderr, "megascope run: %s: %s\n%s", path, ms_strerror(errno), buf);
  return m;
}

struct schedule {
  struct ms_monitor *mon[8], *replacement;
  int ids[8], attached, replaced, detached;
};

/* Performs the attach / replace / detach whose step has come; the engine keeps
 * running throughout. Returns -1 on a failed operation. */
static int control_step(struct ms_engine *e, const struct run_args *a, struct schedule *s, uint64_t steps) {
  char buf[4096] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_attach_opts ao = {.sz = sizeof ao, .max_per_step = (uint32_t)a->budget.max_per_step,
                              .sample_every = (uint32_t)a->budget.sample, .ringbuf_bytes = a->budget.ringbuf_bytes,
                              .interpret = (uint32_t)a->budget.interp};
  if (!s->attached && steps >= (uint64_t)a->attach_at) {
    for (int i = 0; i < a->n_attach; i++) {
      s->ids[i] = ms_engine_attach(e, s->mon[i], &ao, &log);
      if (s->ids[i] < 0) {
        fprintf(stderr, "megascope run: attach %s: %s\n%s", a->attach[i], ms_strerror(s->ids[i]), buf);
        return -1;
      }
      s->mon[i] = NULL;  /* the engine owns it */
    }
    s->attached = 1;
  }
  if (s->attached && s->replacement && !s->replaced && steps >= (uint64_t)a->replace_at) {
    int rc = ms_engine_replace(e, s->ids[0], s->replacement, &log);
    if (rc) {
      fprintf(stderr, "megascope run: replace with %s: %s\n%s", a->replace_with, ms_strerror(rc), buf);
      return -1;
    }
    s->replacement = NULL;
    s->replaced = 1;
  }
  if (s->attached && !s->detached && a->detach_at >= 0 && steps >= (uint64_t)a->detach_at) {
    for (int i = 0; i < a->n_attach; i++) ms_engine_detach(e, s->ids[i]);
    s->detached = 1;
  }
  return 0;
}

/* --query: compiled against the engine's own plan, verified as a monitor and
 * added to the attach schedule as its last attachment. */
static struct ms_query *run_query_compile(struct ms_engine *e, struct run_args *a, struct schedule *s) {
  if (a->n_attach == 8) {
    fprintf(stderr, "megascope run: at most 8 --attach, --query counted\n");
    return NULL;
  }
  char buf[8192] = "";
  struct ms_textbuf log = {.buf = buf, .size = sizeof buf};
  struct ms_query_schema *sc = ms_query_schema_of_plan(ms_engine_plan(e, 1), &log);
  struct ms_query *q = sc ? ms_query_compile(a->query, sc, NULL, &log) : NULL;
  ms_query_schema_free(sc);
  void *bundle = NULL;
  size_t len = 0;
  struct ms_monitor *mon = NULL;
  if (q && !ms_query_bundle(q, &bundle, &len)) mon = ms_monitor_open_mem(bundle, len, "query", &log);
  free(bundle);
  if (!mon) {
    fprintf(stderr, "megascope run: --query: %s", buf);
    ms_query_free(q);
    return NULL;
  }
  a->query_i = a->n_attach;
  a->attach[a->n_attach++] = "query";
  s->mon[a->query_i] = mon;
  return q;
}

/* The query's answer, read from the engine's maps: text to f, or JSON into j. */
static void run_query_write(struct ms_engine *e, const struct ms_query *q, int id, FILE *f, struct ms_json *j) {
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS];
  struct ms_coverage cov;
  struct ms_query_maps src;
  if (ms_engine_attach_maps(e, id, maps, MS_BPF_MAX_MAPS) != (int)ms_query_map_count(q) ||
      ms_engine_attach_coverage(e, id, 0, &cov)) {
    fprintf(stderr, "megascope run: the query's maps are gone\n");
    return;
  }
  ms_query_maps_of_engine(&src, maps);
  struct ms_query_print po = {.sz = sizeof po, .final = 1, .id = id,
                              .elapsed_s = (double)((cov.t_end ? cov.t_end : ms_now_ns()) - cov.t_start) / 1e9};
  if (j) ms_query_write_json(q, &src, &cov, &po, j);
  else ms_query_write(q, &src, &cov, &po, f);
}

/* Whether an attach, replace or detach of the schedule is still to come. */
static int schedule_pending(const struct run_args *a, const struct schedule *s) {
  if (!a->n_attach) return 0;
  if (!s->attached || (s->replacement && !s->replaced)) return 1;
  return a->detach_at >= 0 && !s->detached;
}

/* Waits for the requests while running the attach schedule: the step count
 * polled every 200 us while an action is to come, else asleep on the request.
 * (Polling throughout took a core's share from the workers: SmolLM2 at two
 * workers on two cores decoded at 240-260 tokens/s instead of 350-370.) */
static int wait_all(struct ms_engine *e, const struct run_args *a, struct schedule *s, struct ms_request **reqs) {
  for (long i = 0; i < a->requests; i++) {
    while (ms_request_wait(reqs[i], schedule_pending(a, s) ? 0 : -1) == -ETIMEDOUT) {
      struct ms_engine_stats st;
      ms_engine_get_stats(e, &st);
      if (control_step(e, a, s, st.steps)) return -1;
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
  }
  if (a->n_attach && !s->attached) {
    fprintf(stderr, "megascope run: the run ended before step %ld: nothing was attached\n", a->attach_at);
    return -1;
  }
  if (s->replacement && !s->replaced) {
    fprintf(stderr, "megascope run: the run ended before step %ld: nothing was replaced\n", a->replace_at);
    return -1;
  }
  return 0;
}

/* Prompt i: length 1 + (7i mod prompt_len), tokens from a fixed hash of (i, j), so
 * every run of the same arguments feeds the same text. */
static int make_prompt(long i, long prompt_len, int vocab, int32_t *out) {
  int n = 1 + (int)((7 * i) % prompt_len);
  for (int j = 0; j < n; j++) {
    uint64_t h = (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(j + 1) * 0xc2b2ae3d27d4eb4full;
    h ^= h >> 29;
    out[j] = (int32_t)(h % (uint64_t)vocab);
  }
  return n;
}

/* Each checked position's largest |logit difference|, for their median. */
struct pos_diffs {
  double *d;
  size_t n, cap;
};

static void pos_diffs_add(struct pos_diffs *p, double d) {
  if (p->n == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 256;
    double *q = realloc(p->d, cap * sizeof *q);
    if (!q) return;  /* the median then leaves it out; the maximum still counts it */
    p->d = q, p->cap = cap;
  }
  p->d[p->n++] = d;
}

/* The median, a NaN counted in as the largest (sorted as it is, qsort's order
 * would be undefined); 0 with none. */
static double pos_diffs_median(struct pos_diffs *p) {
  for (size_t i = 0; i < p->n; i++)
    if (p->d[i] != p->d[i]) p->d[i] = INFINITY;
  return cli_median(p->d, (int)p->n);
}

/* Teacher-forces the reference (of the 8-bit activations when q8) on the
 * request's prompt and tokens and returns the largest |logit difference| over
 * every recorded position, each position's into pd. */
static double check_request(const struct ms_model *m, const struct ms_request_info *info,
                            const int32_t *prompt, long max_ctx, int q8, int kv_f16, int *argmax_mismatch,
                            struct pos_diffs *pd) {
  struct ms_ref *ref = ms_ref_new(m, (int)max_ctx);
  if (ref) ms_ref_set_q8(ref, q8), ms_ref_set_kv_f16(ref, kv_f16);
  float *lg = malloc(sizeof(float) * (size_t)m->cfg.vocab);
  double worst = INFINITY;
  if (!ref || !lg) goto out;
  worst = 0;
  for (int pos = 0; pos < info->n_logits; pos++) {
    int tok = pos < info->n_prompt ? prompt[pos] : info->tokens[pos - info->n_prompt];
    if (ms_ref_step(ref, tok, lg)) {
      worst = INFINITY;
      break;
    }
    const float *got = info->logits + (size_t)pos * (size_t)m->cfg.vocab;
    double here = 0;
    for (int v = 0; v < m->cfg.vocab; v++) {
      double d = fabs((double)got[v] - (double)lg[v]);
      if (!(d <= here)) here = d;  /* NaN propagates as the worst */
    }
    if (!(here <= worst)) worst = here;
    pos_diffs_add(pd, here);
    if (pos >= info->n_prompt - 1 && ms_argmax(lg, m->cfg.vocab) != info->tokens[pos - info->n_prompt + 1])
      (*argmax_mismatch)++;
  }
out:
  free(lg);
  ms_ref_free(ref);
  return worst;
}

static void print_steps(const struct ms_engine *e) {
  struct ms_step_record *log = malloc(sizeof *log * 1024);
  int n = log ? ms_engine_step_log(e, log, 1024) : 0;
  printf("%6s %5s %7s %9s %8s %9s %10s\n", "step", "rows", "bucket", "admitted", "retired", "ms", "tokens/s");
  for (int i = 0; i < n; i++) {
    double ms = (double)(log[i].t_end - log[i].t_begin) / 1e6;
    printf("%6llu %5d %7d %9d %8d %9.2f %10.1f\n", (unsigned long long)log[i].step, log[i].rows, log[i].bucket,
           log[i].admitted, log[i].retired, ms, ms > 0 ? log[i].rows / ms * 1e3 : 0.0);
  }
  free(log);
}

/* One run's state, from the model to the report. */
struct run {
  struct run_args a;
  struct ms_transport *tx;   /* the other ranks, or NULL */
  struct ms_model *m;
  struct ms_tokenizer *tok;
  int32_t *text_ids;         /* --prompt, tokenized */
  int n_text;
  struct ms_fault faults[4];
  struct schedule sch;
  struct ms_engine *e;
  int start_paused;
  struct ms_query *q;
  struct ms_request **reqs;  /* (requests) */
  int32_t *prompts;          /* (requests, prompt_len) */
  struct ms_engine_stats st;
  struct cli_dist_pack pack; /* across ranks: this rank's weights (cli_dist_pack) */
  uint64_t packed[64];       /* [ranks] each rank's packed bytes (ms_model.packed_bytes) */
  double secs, worst;        /* the decode's wall time; the largest |logit diff| */
  double median;             /* --check: the median over positions of each one's largest */
  int mismatches, ok;
};

/* The model, its tokenizer and the prompt's ids; max_ctx when not given: 0, or
 * 2 (printed). */
static int run_load(struct run *r) {
  struct run_args *a = &r->a;
  a->cm.unpacked = r->tx != NULL;  /* a rank packs the rows it reads once its engine knows them */
  if (!(r->m = cli_model_load_tok(&a->cm, &r->tok))) return 2;
  if (a->text.prompt && run_text_encode(&a->text, r->tok, r->m, a->cm.path, &r->text_ids, &r->n_text)) return 2;
  if (a->text.prompt) a->prompt_len = r->n_text;
  if (!a->max_ctx) {
    char why[320];
    a->max_ctx = cli_default_ctx(r->m, a->batch, a->kv_f16, why, sizeof why);
    if (a->max_ctx < a->prompt_len + a->steps) a->max_ctx = a->prompt_len + a->steps;
  }
  return 0;
}

/* --backend sim: the GPU preset and the cost model's --sim-param: 0, or -1 printed. */
static int run_sim_opts(const struct run_args *a, struct ms_sim_params *sim) {
  if (ms_sim_preset(a->gpu ? a->gpu : MS_SIM_DEFAULT_GPU, sim)) {
    fprintf(stderr, "megascope run: --gpu '%s': expected a100, h100, h200 or b200\n", a->gpu);
    return -1;
  }
  sim->compute = a->compute;
  for (int i = 0; i < a->n_sim_param; i++) {
    char k[64];
    const char *eq = strchr(a->sim_param[i], '=');
    snprintf(k, sizeof k, "%.*s", eq ? (int)(eq - a->sim_param[i]) : 0, a->sim_param[i]);
    if (!eq || ms_sim_param_set(sim, k, eq + 1)) {
      fprintf(stderr, "megascope run: --sim-param '%s': expected NAME=VALUE with a cost-model parameter\n",
              a->sim_param[i]);
      return -1;
    }
  }
  return 0;
}

/* The engine's options from the arguments, the faults resolved against the
 * plan: 0, or -1 printed. */
static int run_engine_opts(struct run *r, struct ms_engine_opts *eo) {
  const struct run_args *a = &r->a;
  *eo = (struct ms_engine_opts){.sz = sizeof *eo, .n_workers = (int)a->workers, .mode = a->mode,
                                .max_batch = (int)a->batch, .max_ctx = (int)a->max_ctx,
                                .tile_bytes = (int)a->tile_kb * 1024, .tile_rows = (int)a->tile_rows,
                                .shuffle = a->shuffle,
                                .seed = a->seed, .watchdog_ms = (int)a->watchdog_ms, .backend = a->be.backend,
                                .q8_activations = a->q8, .max_batched_tokens = (int)a->max_batched,
                                .attn_parts = (int)a->attn_parts, .kv_f16 = a->kv_f16};
  const struct ms_backend_info *be = ms_backend_info((enum ms_backend)a->be.backend);
  if (be->cost_model && run_sim_opts(a, &eo->sim)) return -1;
  eo->tp = (int)a->tp;
  eo->cuda_sms = (int)a->be.sms;
  eo->transport = r->tx;
  eo->comm_timeout_ms = (int)a->comm_timeout_ms;
  cli_dist_pack_opts(eo, &r->pack, r->m, r->tx);
  /* the simulator: every request waits in the mailbox before the first step, so
   * the batches (and the run) follow from the seed, not from host timing; so do
   * the ranks of one engine, which must all admit the same requests each step */
  eo->start_paused = (be->virtual_clock || r->tx) && a->requests <= 1000;
  eo->faults = r->faults;
  eo->n_faults = a->n_fault;
  if (a->n_fault && resolve_faults(r->m, a, eo, r->faults)) return -1;
  return 0;
}

/* The monitors loaded and verified, the engine started, the --query compiled
 * and what attaches at step 0 attached: 0, or -1 printed. */
static int run_start(struct run *r) {
  struct run_args *a = &r->a;
  char logbuf[2048] = "";
  struct ms_textbuf log = {logbuf, sizeof logbuf, 0, 0};
  struct ms_engine_opts eo;
  if (run_engine_opts(r, &eo)) return -1;
  for (int i = 0; i < a->n_attach; i++)
    if (!(r->sch.mon[i] = load_monitor(a->attach[i]))) return -1;
  if (a->replace_with && !(r->sch.replacement = load_monitor(a->replace_with))) return -1;
  r->e = ms_engine_new(r->m, &eo, &log);
  if (!r->e) {
    fprintf(stderr, "megascope run: %s", logbuf);
    return -1;
  }
  r->start_paused = eo.start_paused;
  r->packed[0] = r->m->packed_bytes;
  if (r->tx && cli_dist_packed_bytes(r->tx, r->m, r->packed)) {
    fprintf(stderr, "megascope run: rank %d: the ranks' packed bytes: no answer\n", r->tx->rank);
    return -1;
  }
  if (a->query && !(r->q = run_query_compile(r->e, a, &r->sch))) return -1;
  if (a->n_attach && a->attach_at == 0 && control_step(r->e, a, &r->sch, 0)) return -1;
  return 0;
}

/* Request i: the --prompt's ids or a made-up prompt; NULL when refused (printed). */
static struct ms_request *run_submit(struct run *r, long i) {
  const struct run_args *a = &r->a;
  int32_t *pr = r->prompts + i * a->prompt_len;
  int n = a->text.prompt ? r->n_text : make_prompt(i, a->prompt_len, r->m->cfg.vocab, pr);
  if (a->text.prompt) memcpy(pr, r->text_ids, sizeof *pr * (size_t)r->n_text);
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = pr, .n_prompt = n,
                               .max_new_tokens = (int)a->steps, .record_logits = a->check};
  run_text_request(&a->text, i, &ro);
  struct ms_request *req = ms_engine_submit(r->e, &ro);
  if (!req)
    fprintf(stderr, "megascope run: request %ld refused: %s%s\n", i, ms_strerror(errno),
            errno == E2BIG ? " (prompt + steps exceed --max-ctx)" : "");
  return req;
}

/* Every request submitted and decoded to its end, the attach schedule run
 * between steps; secs: the time it took. 0, or -1 printed. */
static int run_decode(struct run *r) {
  const struct run_args *a = &r->a;
  r->reqs = calloc((size_t)a->requests, sizeof *r->reqs);
  r->prompts = malloc((size_t)a->requests * (size_t)a->prompt_len * sizeof *r->prompts);
  if (!r->reqs || !r->prompts) return -1;
  uint64_t t0 = ms_now_ns();
  for (long i = 0; i < a->requests; i++)
    if (!(r->reqs[i] = run_submit(r, i))) return -1;
  if (r->start_paused) ms_engine_resume(r->e);
  if (wait_all(r->e, a, &r->sch, r->reqs)) return -1;
  uint64_t t1 = ms_now_ns();
  cli_dist_check_failed("run", r->tx, r->e);
  ms_engine_get_stats(r->e, &r->st);
  r->secs = (double)(t1 - t0) / 1e9;
  return 0;
}

/* --check: every request's logits against the reference; the tolerance when
 * not given; ok unless the check failed. */
static void run_check(struct run *r) {
  struct run_args *a = &r->a;
  const struct ms_model *m = r->m;
  const struct ms_backend_info *be = ms_backend_info((enum ms_backend)a->be.backend);
  struct pos_diffs pd = {0};
  r->ok = 1;
  if (a->check && (!r->tx || r->tx->rank == 0))  /* every rank has the same logits: rank 0 checks them */
    for (long i = 0; i < a->requests; i++) {
      struct ms_request_info info;
      ms_request_get_info(r->reqs[i], &info);
      double d = check_request(m, &info, r->prompts + i * a->prompt_len, a->max_ctx, ms_engine_q8_active(r->e),
                               a->kv_f16, &r->mismatches, &pd);
      if (!(d <= r->worst)) r->worst = d;
    }
  r->median = pos_diffs_median(&pd);
  free(pd.d);
  if (a->tolerance < 0)  /* each path its own: f32 accumulation differs, 8-bit inputs do, or the
                          * device's bf16 copies of other weight types do (0.03 on tiny's f32) */
    a->tolerance = ms_engine_q8_active(r->e) ? 0.25
                   : be->bf16_weights && m->cfg.dtype != MS_DTYPE_BF16 ? 0.1
                   /* an f32 K or V value near a tie rounds to the other f16 than the reference's
                    * double does: 0.008-0.012 on SmolLM2 over 16-64 positions, 0.025 over 200 */
                   : a->kv_f16 ? 0.05
                               : 1e-3;
  if (a->check && !(r->worst <= a->tolerance)) r->ok = 0;
}

/* ---- the report ---- */

static void json_steps(const struct ms_engine *e, struct ms_json *j) {
  struct ms_step_record *log = malloc(sizeof *log * 1024);
  int n = log ? ms_engine_step_log(e, log, 1024) : 0;
  ms_json_key(j, "steps");
  ms_json_arr_begin(j);
  for (int i = 0; i < n; i++) {
    ms_json_obj_begin(j);
    ms_json_kuint(j, "step", log[i].step);
    ms_json_kint(j, "rows", log[i].rows);
    ms_json_kint(j, "bucket", log[i].bucket);
    ms_json_kint(j, "admitted", log[i].admitted);
    ms_json_kint(j, "retired", log[i].retired);
    ms_json_knum(j, "ms", (double)(log[i].t_end - log[i].t_begin) / 1e6);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  free(log);
}

static void json_tokens(struct ms_request *const *reqs, long n, struct ms_json *j) {
  ms_json_key(j, "tokens");
  ms_json_arr_begin(j);
  for (long i = 0; i < n; i++) {
    struct ms_request_info info;
    ms_request_get_info(reqs[i], &info);
    ms_json_arr_begin(j);
    for (int k = 0; k < info.n_tokens; k++) ms_json_int(j, info.tokens[k]);
    ms_json_arr_end(j);
  }
  ms_json_arr_end(j);
}

/* The run's figures: what ran, how fast, on the simulator its simulated time. */
static void json_figures(const struct run *r, struct ms_json *j) {
  const struct run_args *a = &r->a;
  const struct ms_engine_stats *st = &r->st;
  ms_json_kstr(j, "model", r->m->cfg.name);
  ms_json_kstr(j, "dtype", ms_dtype_name(r->m->cfg.dtype));
  ms_json_kstr(j, "mode", ms_mode_name(a->mode));
  ms_json_kstr(j, "backend", ms_backend_name(a->be.backend));
  ms_json_kint(j, "workers", ms_engine_n_workers(r->e));
  if (r->tx) ms_json_kint(j, "ranks", r->tx->size);
  if (r->tx || r->packed[0]) {  /* weights packed (never the simulator's: shapes alone) */
    /* each rank's packed weights (across ranks: its rows alone), and the whole model's */
    ms_json_key(j, "packed_bytes");
    ms_json_arr_begin(j);
    for (int i = 0; i < (r->tx ? r->tx->size : 1); i++) ms_json_uint(j, r->packed[i]);
    ms_json_arr_end(j);
    ms_json_kuint(j, "packed_bytes_whole", ms_model_repack_bytes(r->m));
  }
  ms_json_kint(j, "batch", a->batch);
  ms_json_kint(j, "requests", a->requests);
  ms_json_kbool(j, "shuffle", a->shuffle);
  ms_json_kbool(j, "q8_activations", a->q8);
  ms_json_kbool(j, "kv_f16", a->kv_f16);
  ms_json_kuint(j, "seed", a->seed);
  ms_json_kuint(j, "engine_steps", st->steps);
  ms_json_kuint(j, "positions", st->positions);
  ms_json_kuint(j, "tasks_executed", st->tasks);
  ms_json_kuint(j, "generated_tokens", st->tokens);
  ms_json_knum(j, "seconds", r->secs);
  ms_json_knum(j, "tokens_per_s", (double)st->tokens / r->secs);
  if (ms_backend_info((enum ms_backend)a->be.backend)->virtual_clock) {
    double sim_s = (double)ms_engine_sim_now(r->e) / 1e9;
    ms_json_kstr(j, "gpu", a->gpu ? a->gpu : "h100");
    ms_json_knum(j, "sim_seconds", sim_s);
    ms_json_knum(j, "sim_tokens_per_s", (double)st->tokens / sim_s);
    ms_json_knum(j, "sim_ms_per_step", sim_s * 1e3 / (double)(st->steps ? st->steps : 1));
  }
}

static void run_json(const struct run *r) {
  const struct run_args *a = &r->a;
  struct ms_json j;
  ms_json_init(&j, stdout, 0);
  ms_json_obj_begin(&j);
  json_figures(r, &j);
  if (a->check) {
    ms_json_knum(&j, "max_abs_logit_diff", r->worst);
    ms_json_knum(&j, "median_abs_logit_diff", r->median);  /* over positions, of each one's largest */
    ms_json_knum(&j, "tolerance", a->tolerance);
    ms_json_kint(&j, "reference_argmax_mismatches", r->mismatches);
    ms_json_kbool(&j, "check_passed", r->ok);
  }
  if (a->show_steps) json_steps(r->e, &j);
  if (a->n_attach) {
    ms_json_key(&j, "attachments");
    ms_json_arr_begin(&j);
    for (int i = 0; i < a->n_attach; i++)
      if (!a->query || i != a->query_i) ms_engine_attach_write_json(r->e, r->sch.ids[i], &j);
    ms_json_arr_end(&j);
  }
  if (r->q) {
    ms_json_key(&j, "query");
    run_query_write(r->e, r->q, r->sch.ids[a->query_i], NULL, &j);
  }
  if (a->text.prompt) run_text_json(&j, &a->text, r->tok, r->reqs, a->requests);
  json_tokens(r->reqs, a->requests, &j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}

/* The first requests' tokens (or text, with --prompt). */
static void print_requests(const struct run *r) {
  const struct run_args *a = &r->a;
  for (long i = 0; i < a->requests && i < 8; i++) {
    struct ms_request_info info;
    ms_request_get_info(r->reqs[i], &info);
    if (a->text.prompt) {
      run_text_print(&a->text, r->tok, i, &info, r->prompts + i * a->prompt_len);
      continue;
    }
    printf("  request %ld (prompt %d): ", i, info.n_prompt);
    for (int k = 0; k < info.n_tokens && k < 16; k++) printf("%d ", info.tokens[k]);
    printf("%s\n", info.n_tokens > 16 ? "..." : "");
  }
}

static void run_print(const struct run *r) {
  const struct run_args *a = &r->a;
  const struct ms_model *m = r->m;
  const struct ms_engine_stats *st = &r->st;
  const struct ms_backend_info *be = ms_backend_info((enum ms_backend)a->be.backend);
  if (a->show_steps) print_steps(r->e);
  printf("%s (%s%s) %s%s%s, %d workers: %ld requests, %llu tokens in %.3f s (%.1f tokens/s), %llu steps, %llu tasks\n",
         m->cfg.name, ms_dtype_name(m->cfg.dtype), a->q8 && be->q8_activations ? ", 8-bit activations" : "",
         ms_mode_name(a->mode), be->os_workers ? "" : " on ", be->os_workers ? "" : be->name,
         ms_engine_n_workers(r->e), a->requests,
         (unsigned long long)st->tokens, r->secs, (double)st->tokens / r->secs, (unsigned long long)st->steps,
         (unsigned long long)st->tasks);
  print_requests(r);
  if (a->check)
    printf("check: max |logit diff| vs reference %.3g (tolerance %.3g), median over positions %.3g: %s\n",
           r->worst, a->tolerance, r->median, r->ok ? "passed" : "FAILED");
  for (int i = 0; i < a->n_attach; i++)
    if (r->q && i == a->query_i) run_query_write(r->e, r->q, r->sch.ids[i], stdout, NULL);
    else ms_engine_attach_write(r->e, r->sch.ids[i], stdout, 0);
}

static void run_free(struct run *r) {
  for (int i = 0; i < 8; i++) ms_monitor_free(r->sch.mon[i]);
  ms_monitor_free(r->sch.replacement);
  ms_query_free(r->q);
  if (r->reqs)
    for (long i = 0; i < r->a.requests; i++) ms_request_free(r->reqs[i]);
  ms_engine_free(r->e);
  free(r->reqs);
  free(r->prompts);
  free(r->text_ids);
  ms_tokenizer_free(r->tok);
  ms_model_free(r->m);
}

/* One run; tx: the transport to the other ranks, or NULL. */
static int cmd_run_on(const struct run_args *ap, struct ms_transport *tx) {
  struct run r = {.a = *ap, .tx = tx};
  int rc = run_load(&r);
  if (!rc) rc = run_start(&r) || run_decode(&r) ? 1 : 0;
  if (!rc) {
    run_check(&r);
    if (r.a.as_json) run_json(&r);
    else run_print(&r);
    rc = r.ok ? 0 : 1;
  }
  run_free(&r);
  return rc;
}

int cmd_run(int argc, char **argv) {
  struct run_args a;
  int prc = parse(argc, argv, &a);
  if (prc) return prc > 0 ? 0 : 2;
  int dist_failed;
  struct ms_transport *tx = cli_dist_start("run", (int)a.tp, &a.cm, argc, argv, &dist_failed);
  if (dist_failed) return 2;
  int rc = cmd_run_on(&a, tx);
  cli_dist_end(tx);
  return rc;
}
