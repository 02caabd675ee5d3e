/* SPDX-License-Identifier: MIT */
/* megascope cuda: the CUDA backend. info (the device, or why there is none), run
 * (requests through the persistent kernel or the per-op baseline, checked
 * against the CPU engine), ops (each device task body against its CPU twin) and
 * bench (the device report scripts/device-check.sh collects). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/cuda.h"
#include "megascope/cuda_diag.h"
#include "megascope/engine.h"
#include "megascope/json.h"
#include "megascope/monitor.h"

/* A diagnostics buffer on the stack (struct ms_textbuf is caller-given). */
#define LOGBUF(name)                  \
  char name##_b[16384] = "";          \
  struct ms_textbuf name = {name##_b, sizeof name##_b, 0, 0}

struct opts {
  struct cli_model cm;
  int batch, requests, prompt_len, new_tokens, sms, per_op, check, json, watchdog_ms, stop_eos, lost_trigger;
  const char *attach;
};

#define CO struct opts
static const struct cli_opt cuda_opts[] = {
    CLI_OPT_GROUP(CO, cm, cli_model_opts),
    CLI_OPT_TEXT("                       (default: tiny; --dtype defaults to bf16 here, the type the\n"
                 "                       device holds: other types are converted, and --check then\n"
                 "                       differs by the rounding)"),
    CLI_OPT_I32(CO, batch, "batch", "N", 1, 256, "rows of the plan (default 4)"),
    CLI_OPT_I32(CO, requests, "requests", "N", 1, 100000, "requests (default 8; more than --batch: continuous batching)"),
    CLI_OPT_I32(CO, prompt_len, "prompt-len", "N", 1, 100000, "prompt tokens each (default 4)"),
    CLI_OPT_I32(CO, new_tokens, "new", "N", 1, 100000, "tokens generated each (default 16; bench: 64)"),
    CLI_OPT_I32(CO, sms, "sms", "N", 2, 4096, "CTAs of the persistent kernel (default: every SM)"),
    CLI_OPT_FLAG(CO, per_op, "per-op", "run: the per-op baseline instead of the megakernel"),
    CLI_OPT_FLAG(CO, check, "check", "run: compare tokens and logits with the CPU engine"),
    CLI_OPT_FLAG(CO, stop_eos, "stop-eos", "run: a request finishes early on the model's eos token"),
    CLI_OPT_STR(CO, attach, "attach", "P.o", "run: attach a monitor while the kernel runs; print its maps"),
    CLI_OPT_I32(CO, watchdog_ms, "watchdog-ms", "N", 0, 3600000,
                "report a stall after N ms without a heartbeat, or without a finished\n"
                "                       task while a CTA spins on one event (default 5000)"),
    CLI_OPT_I32(CO, lost_trigger, "fault-lost-trigger", "T", 0, 100000000,
                "run: task T's trigger is never counted (its event never fires: a hang\n"
                "                       for the watchdog to report; a test of the watchdog)"),
    CLI_OPT_FLAG(CO, json, "json", "machine-readable output"),
    {0}};
#undef CO

static const char cuda_head[] =
    "usage: megascope cuda info [--json]\n"
    "       megascope cuda run [options]\n"
    "       megascope cuda ops [options]\n"
    "       megascope cuda bench [options]\n\n"
    "The CUDA backend: the plan as one persistent kernel (a scheduler CTA and one worker\n"
    "CTA per SM), monitors run on the device by an eBPF interpreter over the same verified\n"
    "programs. Without a GPU (or a build without nvcc) every subcommand but info fails\n"
    "with the reason.\n\n"
    "  info                 the device, its SMs and HBM bandwidth\n"
    "  run                  --requests prompts of --prompt-len tokens, --new tokens each\n"
    "  ops                  every device task body against its CPU twin (tolerance 1e-3)\n"
    "  bench                decode tokens/s of the megakernel and of per-op kernels in a\n"
    "                       CUDA Graph, fraction of the HBM bound, hook cost detached and\n"
    "                       attached, attach latency on the device\n\n";

/* 0: parsed; -1: --help printed; 2: a usage error, printed. */
static int parse(int argc, char **argv, struct opts *o) {
  char cmd[64];
  snprintf(cmd, sizeof cmd, "cuda %s", argv[0]);
  int rc = cli_parse(cmd, cuda_head, cuda_opts, o, argc, argv, NULL);
  if (rc) return rc > 0 ? -1 : 2;
  if (!o->cm.preset && !o->cm.path) o->cm.preset = "tiny";
  /* the device holds bf16 weights: a synthetic model in bf16 makes the CPU side of
   * --check and of `ops` read the very same weights */
  if (o->cm.preset && !o->cm.dtype) o->cm.dtype = "bf16";
  return 0;
}

static int cmd_info(int json) {
  struct ms_cuda_device d;
  char why[256] = "";
  int ok = ms_cuda_device_info(&d, why, sizeof why) == 0;
  if (json) {
    struct ms_json j;
    ms_json_init(&j, stdout, 1);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "available", ok);
    if (ok) {
      ms_json_kstr(&j, "name", d.name);
      ms_json_kint(&j, "sms", d.sms);
      ms_json_kint(&j, "sm", d.major * 10 + d.minor);
      ms_json_knum(&j, "mem_gib", d.mem_gib);
      ms_json_knum(&j, "peak_gbs", d.peak_gbs);
    } else {
      ms_json_kstr(&j, "reason", why);
    }
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else if (ok) {
    printf("%s: %d SMs, sm_%d%d, %.0f GiB, HBM %.0f GB/s\n", d.name, d.sms, d.major, d.minor, d.mem_gib,
           d.peak_gbs);
  } else {
    printf("no CUDA backend here: %s\n", why);
  }
  return 0;
}

/* Prompts: deterministic tokens of the vocabulary, different per request. */
static struct ms_cuda_request *make_requests(const struct opts *o, int vocab, int with_logits) {
  struct ms_cuda_request *r = calloc((size_t)o->requests, sizeof *r);
  if (!r) return NULL;
  for (int i = 0; i < o->requests; i++) {
    int32_t *p = malloc((size_t)o->prompt_len * sizeof *p);
    r[i].tokens = malloc((size_t)o->new_tokens * sizeof(int32_t));
    if (!p || !r[i].tokens) return NULL;  /* a CLI run: the process exits */
    for (int k = 0; k < o->prompt_len; k++) p[k] = (int32_t)((7 + 131 * i + 17 * k) % vocab);
    r[i].prompt = p;
    r[i].n_prompt = o->prompt_len;
    r[i].max_new = o->new_tokens;
    r[i].stop_at_eos = o->stop_eos;
    if (with_logits)
      r[i].logits = malloc((size_t)(o->prompt_len + o->new_tokens - 1) * (size_t)vocab * sizeof(float));
  }
  return r;
}

static void free_requests(struct ms_cuda_request *r, int n) {
  for (int i = 0; r && i < n; i++) {
    free((void *)r[i].prompt);
    free(r[i].tokens);
    free(r[i].logits);
  }
  free(r);
}

/* The CPU engine on the same model and prompts: tokens must be equal; logits
 * are compared for the report. Returns the number of requests that differ. */
static int check_cpu(const struct opts *o, const struct ms_model *m, const struct ms_cuda_request *r,
                     double *max_diff) {
  LOGBUF(log);
  struct ms_engine_opts eo = {.sz = sizeof eo, .max_batch = o->batch,
                              .max_ctx = o->prompt_len + o->new_tokens + 1};
  struct ms_engine *e = ms_engine_new(m, &eo, &log);
  int bad = 0, V = m->cfg.vocab;
  *max_diff = 0;
  if (!e) {
    fprintf(stderr, "megascope cuda: CPU engine: %s\n", log.buf);
    return o->requests;
  }
  for (int i = 0; i < o->requests; i++) {
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = r[i].prompt, .n_prompt = r[i].n_prompt,
                                 .max_new_tokens = r[i].max_new, .record_logits = r[i].logits != NULL,
                                 .stop_at_eos = r[i].stop_at_eos};
    struct ms_request *q = ms_engine_submit(e, &ro);
    if (!q) {
      bad++;
      continue;
    }
    ms_request_wait(q, -1);
    struct ms_request_info info;
    ms_request_get_info(q, &info);
    int same = info.n_tokens == r[i].n_tokens;
    for (int k = 0; same && k < info.n_tokens; k++) same = info.tokens[k] == r[i].tokens[k];
    if (!same) {
      bad++;
      fprintf(stderr, "megascope cuda: request %d: tokens differ from the CPU engine's\n", i);
    }
    for (int p = 0; r[i].logits && p < info.n_logits && p < r[i].n_prompt + r[i].n_tokens - 1; p++)
      for (int v = 0; v < V; v++) {
        double d = info.logits[(size_t)p * V + v] - r[i].logits[(size_t)p * V + v];
        if (d < 0) d = -d;
        if (d > *max_diff) *max_diff = d;
      }
    ms_request_free(q);
  }
  ms_engine_free(e);
  return bad;
}

static struct ms_cuda_engine *make_engine(const struct opts *o, const struct ms_model *m, int per_op,
                                          int hooks_off) {
  LOGBUF(log);
  struct ms_cuda_opts co = {.sz = sizeof co, .mode = per_op ? MS_CUDA_PER_OP : MS_CUDA_MEGAKERNEL,
                            .max_batch = o->batch, .max_ctx = o->prompt_len + o->new_tokens + 1,
                            .n_sms = o->sms, .watchdog_ms = o->watchdog_ms, .hooks_off = hooks_off,
                            .fault_lost_trigger = o->lost_trigger >= 0 ? o->lost_trigger + 1 : 0};
  struct ms_cuda_engine *e = ms_cuda_engine_new(m, &co, &log);
  if (!e) fprintf(stderr, "megascope cuda: %s", log.buf);
  return e;
}

/* An attach while the kernel runs, and the proof that it did: the steps the
 * kernel had finished when the call was made (made once it has finished one,
 * so the kernel was resident before the call) and when it returned, and the
 * requests then finished (steps_total and executed come at the end). */
struct live_attach {
  int id;
  uint64_t steps_before, steps_after;
  int finished_after;
  double attach_us;
};

static void attach_live(struct ms_cuda_engine *e, const char *path, struct live_attach *la, struct ms_textbuf *log) {
  struct ms_monitor *mon = ms_monitor_open(path, log);
  /* the kernel's first step done (10 s at most: a kernel that never gets
   * there is the watchdog's to report, in the wait after this) */
  for (uint64_t t0 = ms_now_ns(); !ms_cuda_steps_done(e) && ms_now_ns() - t0 < 10000000000ull;) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  la->steps_before = ms_cuda_steps_done(e);
  uint64_t t0 = ms_now_ns();
  la->id = mon ? ms_cuda_attach(e, mon, NULL, log) : -errno;
  la->attach_us = (double)(ms_now_ns() - t0) / 1e3;
  la->steps_after = ms_cuda_steps_done(e);
  la->finished_after = ms_cuda_finished(e);
  if (la->id < 0) {
    fprintf(stderr, "megascope cuda: attach %s: %s", path, log->buf);
    if (mon) ms_monitor_free(mon);
  }
}

static void json_attach(struct ms_json *j, struct ms_cuda_engine *e, const struct live_attach *la, int requests,
                        uint64_t steps_total) {
  struct ms_coverage cv = {0};
  ms_cuda_coverage(e, la->id, &cv);
  ms_json_key(j, "attach");
  ms_json_obj_begin(j);
  ms_json_kint(j, "id", la->id);
  ms_json_knum(j, "call_us", la->attach_us);
  ms_json_kuint(j, "steps_before", la->steps_before);
  ms_json_kuint(j, "steps_after", la->steps_after);
  ms_json_kuint(j, "steps_total", steps_total);
  ms_json_kint(j, "finished_after", la->finished_after);
  ms_json_kint(j, "requests", requests);
  ms_json_kuint(j, "executed", cv.executed);
  ms_json_kuint(j, "first_step", cv.first_step);
  /* called after a step was done, returned with steps left to run, and
   * programs ran in them: the kernel was resident all the while */
  ms_json_kbool(j, "while_running", la->id > 0 && la->steps_before > 0 && la->steps_after < steps_total &&
                                        la->finished_after < requests && cv.executed > 0);
  ms_json_obj_end(j);
}

static int cmd_run_cuda(const struct opts *o, const struct ms_model *m) {
  struct ms_cuda_engine *e = make_engine(o, m, o->per_op, 0);
  if (!e) return 1;
  struct ms_cuda_request *r = make_requests(o, m->cfg.vocab, o->check);
  LOGBUF(log);
  int rc = 0;
  struct live_attach la = {0};
  if (!r) {
    fprintf(stderr, "megascope cuda: out of memory\n");
    ms_cuda_engine_free(e);
    return 1;
  }
  if (o->per_op) {
    rc = ms_cuda_generate(e, r, o->requests, &log);
  } else {
    rc = ms_cuda_start(e, r, o->requests, &log);
    if (!rc && o->attach) attach_live(e, o->attach, &la, &log);
    if (!rc) rc = ms_cuda_wait(e, &log);
  }
  if (rc) {
    fprintf(stderr, "megascope cuda: %s%s", log.buf, ms_strerror(rc));
    fputc('\n', stderr);
  }
  struct ms_cuda_stats st;
  ms_cuda_get_stats(e, &st);
  int bad = 0;
  double diff = 0;
  if (!rc && o->check) bad = check_cpu(o, m, r, &diff);
  if (o->json) {
    struct ms_json j;
    ms_json_init(&j, stdout, 1);
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "mode", o->per_op ? "per-op" : "megakernel");
    ms_json_kint(&j, "rc", rc);
    ms_json_kuint(&j, "steps", st.steps);
    ms_json_kuint(&j, "tokens", st.tokens);
    ms_json_knum(&j, "tokens_per_s", st.tokens_per_s);
    ms_json_kuint(&j, "queue_full", st.queue_full);
    ms_json_kuint(&j, "heartbeats", st.heartbeats);
    if (o->check) {
      ms_json_kint(&j, "requests_differing", bad);
      ms_json_knum(&j, "max_abs_logit_diff", diff);
    }
    if (la.id > 0) json_attach(&j, e, &la, o->requests, st.steps);
    if (rc) ms_json_kstr(&j, "report", log.buf);  /* the watchdog's, when it fired */
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else if (!rc) {
    printf("%s: %llu steps, %llu tokens, %.1f tokens/s\n", o->per_op ? "per-op" : "megakernel",
           (unsigned long long)st.steps, (unsigned long long)st.tokens, st.tokens_per_s);
    for (int i = 0; i < o->requests && i < 4; i++) {
      printf("request %d:", i);
      for (int k = 0; k < r[i].n_tokens; k++) printf(" %d", r[i].tokens[k]);
      printf("\n");
    }
    if (o->check)
      printf("check against the CPU engine: %d of %d requests differ, max |logit diff| %.3g\n", bad,
             o->requests, diff);
  }
  if (la.id > 0 && !o->json) ms_cuda_attach_write(e, la.id, stdout, 0);
  free_requests(r, o->requests);
  ms_cuda_engine_free(e);
  return rc || bad ? 1 : 0;
}

/* One timed run: tokens/s of the engine made with the given settings. */
static double timed_run(const struct opts *o, const struct ms_model *m, int per_op, int hooks_off,
                        const char *monitor, double *attach_us, double *steps_per_s) {
  struct ms_cuda_engine *e = make_engine(o, m, per_op, hooks_off);
  if (!e) return -1;
  struct ms_cuda_request *r = make_requests(o, m->cfg.vocab, 0);
  LOGBUF(log);
  double tps = -1;
  int rc;
  if (per_op) {
    rc = ms_cuda_generate(e, r, o->requests, &log);
  } else {
    rc = ms_cuda_start(e, r, o->requests, &log);
    if (!rc && monitor) {
      /* attach latency: the call -> the first firing the device counted */
      struct ms_monitor *mon = ms_monitor_open(monitor, &log);
      uint64_t t0 = ms_now_ns();
      int id = mon ? ms_cuda_attach(e, mon, NULL, &log) : -1;
      struct ms_coverage cv = {0};
      while (id > 0 && !ms_cuda_coverage(e, id, &cv) && !cv.eligible && ms_cuda_finished(e) < o->requests) {
      }
      if (attach_us) *attach_us = id > 0 && cv.eligible ? (double)(ms_now_ns() - t0) / 1e3 : -1;
    }
    if (!rc) rc = ms_cuda_wait(e, &log);
  }
  if (!rc) {
    struct ms_cuda_stats st;
    ms_cuda_get_stats(e, &st);
    tps = st.tokens_per_s;
    if (steps_per_s) *steps_per_s = st.kernel_ms > 0 ? (double)st.steps / (st.kernel_ms / 1e3) : 0;
  } else {
    fprintf(stderr, "megascope cuda bench: %s", log.buf);
  }
  free_requests(r, o->requests);
  ms_cuda_engine_free(e);
  return tps;
}

static int cmd_bench_cuda(const struct opts *o, const struct ms_model *m) {
  struct ms_cuda_device d;
  char why[256], mon[512];
  if (ms_cuda_device_info(&d, why, sizeof why)) {
    fprintf(stderr, "megascope cuda bench: %s\n", why);
    return 1;
  }
  cli_shipped_monitor("class_time.bpf.o", mon, sizeof mon);
  double attach_us = -1;
  fprintf(stderr, "megascope cuda bench: megakernel...\n");
  double steps_per_s = 0;
  double mk = timed_run(o, m, 0, 0, NULL, NULL, &steps_per_s);
  fprintf(stderr, "megascope cuda bench: per-op kernels (CUDA Graph)...\n");
  double po = timed_run(o, m, 1, 1, NULL, NULL, NULL);
  fprintf(stderr, "megascope cuda bench: hooks compiled out, and a monitor attached...\n");
  double off = timed_run(o, m, 0, 1, NULL, NULL, NULL);
  double att = timed_run(o, m, 0, 0, mon, &attach_us, NULL);
  /* the HBM bound: every weight byte read once per step */
  double bytes = (double)ms_model_weight_bytes(m);
  if (m->cfg.dtype == MS_DTYPE_F32) bytes /= 2;  /* held as bf16 on the device */
  double frac = d.peak_gbs > 0 ? bytes * steps_per_s / (d.peak_gbs * 1e9) : 0;
  int ok = mk > 0 && po > 0 && off > 0 && att > 0;
  if (!o->json) {
    printf("%s (%d SMs, HBM %.0f GB/s), %s, batch %d, %d requests x %d tokens\n", d.name, d.sms, d.peak_gbs,
           m->cfg.name, o->batch, o->requests, o->new_tokens);
    printf("  megakernel          %10.1f tokens/s  (%.1f steps/s, %.2f of the HBM bound)\n", mk, steps_per_s, frac);
    printf("  per-op, CUDA Graph  %10.1f tokens/s  (megakernel / per-op %.3f)\n", po, po > 0 ? mk / po : 0);
    printf("  hooks compiled out  %10.1f tokens/s\n", off);
    printf("  hooks, detached     %10.1f tokens/s  (cost %.3f)\n", mk, off > 0 && mk > 0 ? 1 - mk / off : 0);
    printf("  monitor attached    %10.1f tokens/s  (cost %.3f; attach -> first firing %.0f us)\n", att,
           off > 0 && att > 0 ? 1 - att / off : 0, attach_us);
    return ok ? 0 : 1;
  }
  struct ms_json j;
  ms_json_init(&j, stdout, 1);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "device", d.name);
  ms_json_kint(&j, "sms", d.sms);
  ms_json_knum(&j, "peak_gbs", d.peak_gbs);
  ms_json_kstr(&j, "model", m->cfg.name);
  ms_json_kint(&j, "batch", o->batch);
  ms_json_kint(&j, "requests", o->requests);
  ms_json_kint(&j, "new_tokens", o->new_tokens);
  ms_json_knum(&j, "weight_bytes_per_step", bytes);
  ms_json_knum(&j, "megakernel_steps_per_s", steps_per_s);
  ms_json_knum(&j, "megakernel_tokens_per_s", mk);
  ms_json_knum(&j, "per_op_graph_tokens_per_s", po);
  ms_json_knum(&j, "megakernel_over_per_op", po > 0 ? mk / po : 0);
  ms_json_knum(&j, "hbm_bound_fraction", frac);
  ms_json_knum(&j, "hooks_compiled_out_tokens_per_s", off);
  ms_json_knum(&j, "hooks_detached_tokens_per_s", mk);
  ms_json_knum(&j, "hooks_attached_tokens_per_s", att);
  ms_json_knum(&j, "detached_cost", off > 0 && mk > 0 ? 1 - mk / off : 0);
  ms_json_knum(&j, "attached_cost", off > 0 && att > 0 ? 1 - att / off : 0);
  ms_json_knum(&j, "attach_latency_us", attach_us);
  ms_json_obj_end(&j);
  ms_json_end(&j);
  return ok ? 0 : 1;
}

int cmd_cuda(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    cli_usage(argc < 2 ? stderr : stdout, cuda_head, cuda_opts);
    return argc < 2 ? 2 : 0;
  }
  const char *sub = argv[1];
  struct opts o = {.batch = 4, .requests = 8, .prompt_len = 4, .new_tokens = 16, .watchdog_ms = 5000,
                   .lost_trigger = -1, .cm = {.seed = 1}};
  int is_bench = !strcmp(sub, "bench");
  if (is_bench) o.new_tokens = 64;
  int prc = parse(argc - 1, argv + 1, &o);
  if (prc) return prc < 0 ? 0 : prc;
  if (!strcmp(sub, "info")) return cmd_info(o.json);
  if (strcmp(sub, "run") && strcmp(sub, "ops") && !is_bench) {
    fprintf(stderr, "megascope cuda: unknown subcommand '%s' (info, run, ops, bench)\n", sub);
    return 2;
  }
  char why[256];
  if (!ms_cuda_available(why, sizeof why)) {
    fprintf(stderr, "megascope cuda %s: %s\n", sub, why);
    return 1;
  }
  struct ms_model *m = cli_model_load(&o.cm);
  if (!m) return 1;
  int rc;
  if (!strcmp(sub, "ops")) {
    LOGBUF(log);
    rc = ms_cuda_ops_check(m, o.batch, &log) ? 1 : 0;
    fputs(log.buf, stdout);
  } else if (is_bench) {
    rc = cmd_bench_cuda(&o, m);
  } else {
    rc = cmd_run_cuda(&o, m);
  }
  ms_model_free(m);
  return rc;
}
