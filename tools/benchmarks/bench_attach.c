/* SPDX-License-Identifier: MIT */
/* megascope bench attach: what it costs to ask a running engine a new question.
 *
 * One process runs an engine under a steady load (a load thread keeps --batch
 * requests in flight) and its control server on a private socket; the bench
 * talks to it through that socket exactly as `megascope attach` does. For each
 * round it measures
 *   attach latency:  the attach command sent -> the first executed event, seen
 *                    by polling the attachment's coverage (`executed`) over the
 *                    socket;
 *   replace latency: the replace command sent -> the new generation's first
 *                    executed event;
 * and, from a sampler thread that reads the engine's token counter every
 * millisecond, the decode throughput in the window right after each command
 * against the window before it (the dip). All figures come from this one run.
 *
 * Threads: the load thread submits and reaps requests; the sampler thread
 * records (time, tokens); the main thread drives the rounds. They share only
 * `stop` (atomic) and the sample array (written by the sampler, read after it
 * is joined). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "ctl_req.h"
#include "opt.h"
#include "megascope/control.h"
#include "megascope/engine.h"
#include "megascope/json.h"

#define MAX_SAMPLES (1 << 20)
#define MAX_ROUNDS 100


static void sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)((ms - (double)(time_t)(ms / 1000) * 1000) * 1e6)};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

/* ---- load and sampling ---- */

struct bench {
  struct ms_engine *e;
  int batch, vocab;
  _Atomic int stop;
  uint64_t *t, *tok;   /* samples */
  int n;
  uint64_t failed;     /* requests refused or cancelled */
};

static void *load_main(void *arg) {
  struct bench *b = arg;
  struct ms_request **r = calloc((size_t)b->batch, sizeof *r);
  uint64_t seq = 0;
  while (r && !atomic_load(&b->stop)) {
    for (int i = 0; i < b->batch; i++) {
      if (r[i] && ms_request_wait(r[i], 0) == 0) {
        struct ms_request_info info;
        ms_request_get_info(r[i], &info);
        if (info.state != MS_REQ_DONE) b->failed++;
        ms_request_free(r[i]);
        r[i] = NULL;
      }
      if (!r[i]) {
        int32_t tok = (int32_t)(1 + seq++ % (uint64_t)(b->vocab - 1));
        struct ms_request_opts ro = {.sz = sizeof ro, .prompt = &tok, .n_prompt = 1, .max_new_tokens = 48};
        if (!(r[i] = ms_engine_submit(b->e, &ro))) b->failed++;
      }
    }
    sleep_ms(0.5);
  }
  for (int i = 0; r && i < b->batch; i++)
    if (r[i]) {
      ms_request_wait(r[i], -1);
      ms_request_free(r[i]);
    }
  free(r);
  return NULL;
}

static void *sampler_main(void *arg) {
  struct bench *b = arg;
  while (!atomic_load(&b->stop) && b->n < MAX_SAMPLES) {
    struct ms_engine_stats st;
    ms_engine_get_stats(b->e, &st);
    b->t[b->n] = ms_now_ns();
    b->tok[b->n] = st.tokens;
    b->n++;
    sleep_ms(1);
  }
  return NULL;
}

/* Tokens per second between t0 and t1, interpolated from the samples. */
static double rate(const struct bench *b, uint64_t t0, uint64_t t1) {
  int i0 = -1, i1 = -1;
  for (int i = 0; i < b->n; i++) {
    if (b->t[i] <= t0) i0 = i;
    if (b->t[i] <= t1) i1 = i;
  }
  if (i0 < 0 || i1 <= i0) return 0;
  return (double)(b->tok[i1] - b->tok[i0]) / ((double)(b->t[i1] - b->t[i0]) / 1e9);
}

/* ---- the socket side ---- */

/* One request over a fresh connection, as the CLI makes it; the parsed reply
 * when ok, else NULL with the error printed. */
static json_t *request(const char *path, const char *req) {
  char lb[256] = "";
  struct ms_textbuf log = {lb, sizeof lb, 0, 0};
  struct ms_control_client *cl = ms_control_connect(path, &log);
  if (!cl) {
    fprintf(stderr, "megascope bench attach: %s", lb);
    return NULL;
  }
  char *reply = NULL;
  size_t len = 0;
  int rc = ms_control_call(cl, req, strlen(req), &reply, &len, NULL, NULL, 0, 30000);
  ms_control_client_free(cl);
  json_t *j = rc ? NULL : json_loadb(reply, len, 0, NULL);
  if (!j || !json_is_true(json_object_get(j, "ok"))) {
    const char *err = j ? json_string_value(json_object_get(j, "error")) : NULL;
    fprintf(stderr, "megascope bench attach: %s\n", err ? err : rc ? ms_strerror(rc) : "malformed reply");
    json_decref(j);
    j = NULL;
  }
  free(reply);
  return j;
}

/* The executed count of attachment id's current generation (-1 on error). */
static long long executed(const char *path, int id, unsigned *generation) {
  json_t *j = request(path, "{\"cmd\":\"list\"}");
  long long ex = -1;
  size_t i;
  json_t *a;
  json_array_foreach(json_object_get(j, "attachments"), i, a) {
    if (json_integer_value(json_object_get(a, "id")) != id) continue;
    json_t *cov = json_object_get(a, "coverage");
    ex = json_integer_value(json_object_get(cov, "executed"));
    *generation = (unsigned)json_integer_value(json_object_get(a, "generation"));
  }
  json_decref(j);
  return ex;
}

/* Polls until generation gen of id has executed, within 10 s; returns when (or 0). */
static uint64_t first_executed(const char *path, int id, unsigned gen) {
  uint64_t give_up = ms_now_ns() + 10000000000ull;
  for (int polls = 0; polls < 1000000 && ms_now_ns() < give_up; polls++) {
    unsigned g = 0;
    long long ex = executed(path, id, &g);
    if (ex < 0) return 0;
    if (g == gen && ex > 0) return ms_now_ns();
  }
  return 0;
}

static char *attach_request(const char *cmd, int id, const char *path, const char *name) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "megascope bench attach: cannot open %s: %s\n", path, strerror(errno));
    return NULL;
  }
  uint8_t *obj = malloc(12u << 20);
  size_t n = obj ? fread(obj, 1, 12u << 20, f) : 0;
  fclose(f);
  char *b64 = n ? malloc(ms_base64_encoded_len(n) + 1) : NULL;
  struct req r = {0};
  if (b64 && !req_begin(&r, cmd)) {
    ms_base64_encode(obj, n, b64);
    if (id) req_int(&r, "id", id);
    req_str(&r, "name", name);
    req_str(&r, "object", b64);
    if (req_end(&r)) {
      free(r.buf);
      r.buf = NULL;
    }
  }
  char *req = r.buf;
  free(obj);
  free(b64);
  return req;
}

struct round {
  double attach_reply_ms, attach_ms, replace_reply_ms, replace_ms;
  double before_attach, after_attach, before_replace, after_replace;  /* tokens/s */
  double before_quiet, after_quiet;  /* two windows with no command: the noise floor */
  uint64_t t_attach, t_replace, t_quiet;
};

static void summary(struct ms_json *j, const char *key, double *v, int n) {
  double mx = 0;
  for (int i = 0; i < n; i++) mx = v[i] > mx ? v[i] : mx;
  ms_json_key(j, key);
  ms_json_obj_begin(j);
  ms_json_knum(j, "median", cli_median(v, n));
  ms_json_knum(j, "max", mx);
  ms_json_obj_end(j);
}

/* The control server logs each attach at INFO; the bench shows warnings only. */
static void quiet_log(void *user, enum ms_log_level level, const char *msg) {
  if (level <= MS_LOG_WARN) fprintf(stderr, "megascope: %s\n", msg);
}

struct attach_args {
  struct cli_model cm;
  const char *monitor, *replace_with;
  long batch, workers, rounds, window_ms;
  int as_json;
};

#define AA struct attach_args
static const struct cli_opt attach_opts[] = {
    CLI_OPT_GROUP(AA, cm, cli_model_opts),
    CLI_OPT_TEXT("                       (default: tiny)"),
    CLI_OPT_INT(AA, batch, "batch", "N", 1, 256, "requests kept in flight (default 4)"),
    CLI_OPT_GROUP(AA, workers, cli_workers_opts),
    CLI_OPT_INT(AA, rounds, "rounds", "N", 1, MAX_ROUNDS, "attach / replace / detach rounds (default 5)"),
    CLI_OPT_STR(AA, monitor, "monitor", "P.o",
                "monitor to attach (default: monitors/class_time.bpf.o next to\n"
                "this executable)"),
    CLI_OPT_STR(AA, replace_with, "replace-with", "P.o", "monitor to replace it with (default: monitors/queueing.bpf.o)"),
    CLI_OPT_INT(AA, window_ms, "window-ms", "N", 10, 10000, "throughput window before and after each command (default 300)"),
    CLI_OPT_FLAG(AA, as_json, "json", "print the result as JSON"),
    {0}};
#undef AA

static const char attach_head[] =
    "usage: megascope bench attach [options]\n\n"
    "Attach latency (command sent -> first executed event, from the monitor's coverage\n"
    "polled over the control socket), replace latency (-> the new generation's first\n"
    "event) and the decode throughput dip around each, under a steady load, in one run.\n\n";

/* One run of the bench, from the engine's start to its report. */
struct attach_run {
  struct attach_args a;
  char mon[PATH_MAX], rep[PATH_MAX];  /* the monitor attached, the one replacing it */
  char dir[32], path[PATH_MAX];       /* the private socket */
  struct ms_model *m;
  struct bench b;
  struct ms_control *ctl;
  char *att_req, *rep_req;            /* the attach and replace requests */
  struct round R[MAX_ROUNDS];
  int done;                           /* rounds completed */
};

/* The engine and its control server on the private socket: 0, or -1 printed. */
static int start_engine(struct attach_run *x) {
  char lb[2048] = "";
  struct ms_textbuf log = {lb, sizeof lb, 0, 0};
  snprintf(x->path, sizeof x->path, "%s/engine.sock", x->dir);
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = (int)x->a.workers, .max_batch = (int)x->a.batch,
                              .max_ctx = 64};
  if (!(x->b.e = ms_engine_new(x->m, &eo, &log))) {
    fprintf(stderr, "megascope bench attach: %s", lb);
    return -1;
  }
  struct ms_control_opts co = {.sz = sizeof co, .path = x->path, .model_name = x->m->cfg.name};
  if (!(x->ctl = ms_control_new(x->b.e, &co, &log))) {
    fprintf(stderr, "megascope bench attach: %s", lb);
    return -1;
  }
  return 0;
}

/* One round: attach, replace, detach over the socket, each timed to its
 * generation's first executed event, with a window of load after each. 0, or
 * -1 (printed by request). */
static int one_round(struct attach_run *x, struct round *r) {
  const char *path = x->path;
  double window_ms = (double)x->a.window_ms;
  r->t_attach = ms_now_ns();
  json_t *j = request(path, x->att_req);
  if (!j) return -1;
  int id = (int)json_integer_value(json_object_get(j, "id"));
  json_decref(j);
  uint64_t t_reply = ms_now_ns(), t_exec = first_executed(path, id, 1);
  if (!t_exec) return -1;
  r->attach_reply_ms = (double)(t_reply - r->t_attach) / 1e6;
  r->attach_ms = (double)(t_exec - r->t_attach) / 1e6;
  sleep_ms(window_ms * 1.5);
  free(x->rep_req);
  if (!(x->rep_req = attach_request("replace", id, x->rep, "replace_monitor"))) return -1;
  r->t_replace = ms_now_ns();
  if (!(j = request(path, x->rep_req))) return -1;
  json_decref(j);
  t_reply = ms_now_ns();
  if (!(t_exec = first_executed(path, id, 2))) return -1;
  r->replace_reply_ms = (double)(t_reply - r->t_replace) / 1e6;
  r->replace_ms = (double)(t_exec - r->t_replace) / 1e6;
  sleep_ms(window_ms * 1.5);
  char det[64];
  snprintf(det, sizeof det, "{\"cmd\":\"detach\",\"id\":%d}", id);
  if (!(j = request(path, det))) return -1;
  json_decref(j);
  r->t_quiet = ms_now_ns() + (uint64_t)x->a.window_ms * 1250000ull;
  sleep_ms(window_ms * 2.5);
  return 0;
}

/* The rounds, with the load and sampler threads running through them (and
 * joined before it returns): 0, or -1 printed. */
static int run_rounds(struct attach_run *x) {
  pthread_t load, sampler;
  pthread_create(&load, NULL, load_main, &x->b);
  pthread_create(&sampler, NULL, sampler_main, &x->b);
  sleep_ms(3.0 * (double)x->a.window_ms);  /* warm up: the batch fills, plans are hot */
  int rc = 0;
  while (x->done < x->a.rounds && !(rc = one_round(x, &x->R[x->done]))) x->done++;
  atomic_store(&x->b.stop, 1);
  pthread_join(load, NULL);
  pthread_join(sampler, NULL);
  if (rc) fprintf(stderr, "megascope bench attach: round %d failed\n", x->done + 1);
  return rc;
}

/* Each round's throughput around its commands, and the figures the report
 * takes medians of: v[0..3] latencies and replies, v[4], v[5] the dips after
 * attach and replace, v[6] the throughput before attach, v[7] the change
 * between two windows without a command. */
static void round_figures(struct attach_run *x, double v[8][MAX_ROUNDS]) {
  const struct bench *b = &x->b;
  uint64_t w = (uint64_t)x->a.window_ms * 1000000ull;
  for (int i = 0; i < x->done; i++) {
    struct round *r = &x->R[i];
    r->before_attach = rate(b, r->t_attach - w, r->t_attach);
    r->after_attach = rate(b, r->t_attach, r->t_attach + w);
    r->before_replace = rate(b, r->t_replace - w, r->t_replace);
    r->after_replace = rate(b, r->t_replace, r->t_replace + w);
    v[0][i] = r->attach_ms;
    v[1][i] = r->attach_reply_ms;
    v[2][i] = r->replace_ms;
    v[3][i] = r->replace_reply_ms;
    v[4][i] = r->before_attach > 0 ? 1 - r->after_attach / r->before_attach : 0;
    v[5][i] = r->before_replace > 0 ? 1 - r->after_replace / r->before_replace : 0;
    v[6][i] = r->before_attach;
    r->before_quiet = rate(b, r->t_quiet - w, r->t_quiet);
    r->after_quiet = rate(b, r->t_quiet, r->t_quiet + w);
    v[7][i] = r->before_quiet > 0 ? 1 - r->after_quiet / r->before_quiet : 0;
  }
}

static void report_json(const struct attach_run *x, double v[8][MAX_ROUNDS], double base) {
  int done = x->done;
  struct ms_json j;
  ms_json_init(&j, stdout, 1);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "model", x->m->cfg.name);
  ms_json_kstr(&j, "dtype", ms_dtype_name(x->m->cfg.dtype));
  ms_json_kint(&j, "workers", ms_engine_n_workers(x->b.e));
  ms_json_kint(&j, "batch", x->a.batch);
  ms_json_kint(&j, "rounds", done);
  ms_json_kstr(&j, "monitor", x->mon);
  ms_json_kstr(&j, "replace_with", x->rep);
  ms_json_kint(&j, "window_ms", x->a.window_ms);
  ms_json_knum(&j, "baseline_tokens_per_s", base);
  summary(&j, "attach_latency_ms", v[0], done);
  summary(&j, "attach_reply_ms", v[1], done);
  summary(&j, "replace_latency_ms", v[2], done);
  summary(&j, "replace_reply_ms", v[3], done);
  summary(&j, "attach_throughput_dip", v[4], done);
  summary(&j, "replace_throughput_dip", v[5], done);
  summary(&j, "no_command_throughput_change", v[7], done);
  ms_json_kuint(&j, "requests_failed", x->b.failed);
  ms_json_key(&j, "per_round");
  ms_json_arr_begin(&j);
  for (int i = 0; i < done; i++) {
    const struct round *r = &x->R[i];
    ms_json_obj_begin(&j);
    ms_json_knum(&j, "attach_latency_ms", r->attach_ms);
    ms_json_knum(&j, "replace_latency_ms", r->replace_ms);
    ms_json_knum(&j, "tokens_per_s_before_attach", r->before_attach);
    ms_json_knum(&j, "tokens_per_s_after_attach", r->after_attach);
    ms_json_knum(&j, "tokens_per_s_before_replace", r->before_replace);
    ms_json_knum(&j, "tokens_per_s_after_replace", r->after_replace);
    ms_json_obj_end(&j);
  }
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}

static void report_text(const struct attach_run *x, double v[8][MAX_ROUNDS], double base) {
  int done = x->done;
  printf("%s (%s), %d workers, batch %ld, %d rounds, windows of %ld ms\n", x->m->cfg.name,
         ms_dtype_name(x->m->cfg.dtype), ms_engine_n_workers(x->b.e), x->a.batch, done, x->a.window_ms);
  printf("  attach:  first executed event %.3f ms after the command (median; reply %.3f ms)\n", cli_median(v[0], done),
         cli_median(v[1], done));
  printf("  replace: new generation's first event %.3f ms after the command (median; reply %.3f ms)\n",
         cli_median(v[2], done), cli_median(v[3], done));
  printf("  throughput %.1f tokens/s before; dip %.1f%% after attach, %.1f%% after replace (medians;\n"
         "  between two windows without a command it changes by %.1f%%: the noise floor)\n",
         base, 100 * cli_median(v[4], done), 100 * cli_median(v[5], done), 100 * cli_median(v[7], done));
  printf("  requests failed: %llu\n", (unsigned long long)x->b.failed);
}

/* The whole run after parsing: 0, or 1 (failed, printed). */
static int attach_run(struct attach_run *x) {
  x->att_req = attach_request("attach", 0, x->mon, "attach_monitor");
  x->b.t = malloc(sizeof *x->b.t * MAX_SAMPLES);
  x->b.tok = malloc(sizeof *x->b.tok * MAX_SAMPLES);
  if (!x->att_req || !x->b.t || !x->b.tok || !mkdtemp(x->dir)) return 1;
  if (start_engine(x) || run_rounds(x)) return 1;
  double v[8][MAX_ROUNDS];
  round_figures(x, v);
  double base = cli_median(v[6], x->done);
  if (x->a.as_json) report_json(x, v, base);
  else report_text(x, v, base);
  return x->b.failed ? 1 : 0;
}

int bench_attach(int argc, char **argv) {
  struct attach_run x = {.a = {.batch = 4, .rounds = 5, .window_ms = 300}, .dir = "/tmp/megascope-bench-XXXXXX"};
  int prc = cli_parse("bench attach", attach_head, attach_opts, &x.a, argc, argv, NULL);
  if (prc) return prc > 0 ? 0 : 2;
  if (x.a.monitor) snprintf(x.mon, sizeof x.mon, "%s", x.a.monitor);
  else cli_shipped_monitor("class_time.bpf.o", x.mon, sizeof x.mon);
  if (x.a.replace_with) snprintf(x.rep, sizeof x.rep, "%s", x.a.replace_with);
  else cli_shipped_monitor("queueing.bpf.o", x.rep, sizeof x.rep);
  if (!x.a.cm.preset && !x.a.cm.path) x.a.cm.preset = "tiny";
  ms_log_set(quiet_log, NULL, MS_LOG_WARN);
  if (!(x.m = cli_model_load(&x.a.cm))) return 2;
  x.b = (struct bench){.batch = (int)x.a.batch, .vocab = x.m->cfg.vocab};
  int rc = attach_run(&x);
  ms_control_free(x.ctl);
  ms_engine_free(x.b.e);
  rmdir(x.dir);
  free(x.att_req);
  free(x.rep_req);
  free(x.b.t);
  free(x.b.tok);
  ms_model_free(x.m);
  return rc;
}
