/* SPDX-License-Identifier: MIT */
/* megascope query: a one-line question to a running engine.
 *
 *   query --socket S 'task_end { @[class] = count() }' [--for 2s] [--every 1s] [--json]
 *
 * Fetches the engine's schema, compiles the program here (src/query: no clang),
 * attaches the bundle through the socket's attach (the engine verifies and JIT-
 * compiles it as any monitor), takes read-only descriptors of its maps, prints
 * the aggregations with their coverage every --every and at the end (--for, or
 * Ctrl-C), then detaches. A syntax, name or field error is reported with its
 * column before anything is attached. Exit codes: 0 done, 1 refused or
 * unreachable, 2 usage or a compile error. */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/base.h"
#include "megascope/bpf.h"
#include "megascope/control.h"
#include "megascope/json.h"
#include "megascope/query.h"
#include "query_client.h"
#include "replicas.h"

#define ME "query"
#define SRC_MAX (64u << 10)

struct qargs {
  struct cli_sockets sockets;
  const char *file, *emit, *schema;
  char *src;
  uint64_t for_ns, every_ns, slo_ns;
  long slo_sample;
  int as_json, dump, have_for, delta;
  long top, max_keys;
  struct cli_budget budget;
};

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) {
  (void)sig;
  stop_flag = 1;
}

static char *read_text_max(const char *path, size_t max) {
  FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
  if (!f) {
    fprintf(stderr, "megascope query: cannot open %s: %s\n", path, strerror(errno));
    return NULL;
  }
  char *buf = malloc(max + 1);
  size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
  if (f != stdin) fclose(f);
  if (!buf || n > max) {
    fprintf(stderr, "megascope query: %s: %s (at most %zu KiB)\n", path, buf ? "too long" : "out of memory",
            max >> 10);
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  return buf;
}

static char *read_text(const char *path) { return read_text_max(path, SRC_MAX); }

static int parse_dur(const char *opt, const char *s, uint64_t *out) {
  if (ms_query_parse_duration(s, out) == 0) return 0;
  fprintf(stderr, "megascope query: %s '%s': expected a duration (2s, 500ms, 20us, 1m)\n", opt, s);
  return -1;
}

static int for_opt(void *dst, const char *arg) {
  struct qargs *a = dst;
  a->have_for = 1;
  return parse_dur("--for", arg, &a->for_ns);
}
static int every_opt(void *dst, const char *arg) { return parse_dur("--every", arg, &((struct qargs *)dst)->every_ns); }
static int slo_opt(void *dst, const char *arg) { return live_parse_slo(ME, arg, &((struct qargs *)dst)->slo_ns); }
static int list_opt(void *dst, const char *arg) {
  (void)dst;
  (void)arg;
  exit(ms_query_write_reference(stdout) ? 1 : 0);
}

#define QA struct qargs
static const struct cli_opt query_opts[] = {
    CLI_OPT_GROUP(QA, sockets, cli_sockets_opts),
    {.kind = CLI_STR, .name = "file", .shrt = 'f', .arg = "FILE", .off = CLI_O(QA, file),
     .help = "read the program from FILE ('-': standard input)"},
    CLI_OPT_FN("for", "DURATION", for_opt, "stop after DURATION (2s, 500ms, 1m; default: at Ctrl-C)"),
    CLI_OPT_FN("every", "DURATION", every_opt, "also print every DURATION (cumulative since the attach)"),
    CLI_OPT_FLAG(QA, delta, "delta",
                 "with --every: print what changed in each interval (the last\n"
                 "print is still the whole run's)"),
    CLI_OPT_FLAG(QA, as_json, "json", "print each read-out as one JSON object per line"),
    CLI_OPT_INT(QA, top, "top", "K", 1, 1 << 20, "print the K largest keys of each map (default: all)"),
    CLI_OPT_INT(QA, max_keys, "max-keys", "N", 1, 1 << 20, "keys per map (default 4096; histograms 1024, quantiles 256)"),
    CLI_OPT_GROUP(QA, budget, cli_budget_opts),
    CLI_OPT_FN("slo", "tpot=DURATION", slo_opt,
               "while the TPOT of the requests finished since the last check\n"
               "(every --every, else 500ms) is above DURATION, run the query a\n"
               "second time at --slo-sample beside the sampled one"),
    CLI_OPT_INT(QA, slo_sample, "slo-sample", "N", 1, 0xffffffffL, "the rate in danger: 1 in N (default 1, every firing)"),
    CLI_OPT_FLAG(QA, dump, "dump", "print the generated programs and maps; attach nothing"),
    CLI_OPT_STR(QA, emit, "emit", "FILE",
                "write the monitor (a program bundle that attach and verify\n"
                "take) to FILE; attach nothing"),
    CLI_OPT_STR(QA, schema, "schema", "FILE",
                "resolve names with this schema (megascope compile\n"
                "--backend B --schema-out) instead of the engine's;\n"
                "attaching, refused unless it names the engine's classes"),
    CLI_OPT_FN("list", NULL, list_opt, "print the hooks with their fields and the names fields take"),
    {0}};
#undef QA

static const char query_head[] =
    "usage: megascope query [--socket S]... [options] 'PROGRAM'\n"
    "       megascope query [--socket S]... [options] -f FILE\n\n"
    "Compiles a query (docs/query.md) to a verified eBPF monitor in this process, attaches\n"
    "it to a running engine, prints its aggregations with their coverage, then detaches:\n\n"
    "  task_end /op == attn/ { @us[tile_z] = hist((t_end - t_begin) / 1000) }\n"
    "  dep_wait /wait_ns > 20us/ { @[event_class] = count() }\n\n"
    "With --socket given more than once (replicas of one service, serving the same plan)\n"
    "the program is attached on every engine and the answer is merged as the\n"
    "aggregations mean (counts, sums and buckets add, min and max take the extreme),\n"
    "exactly, with each engine's coverage beside the total; an engine that cannot be\n"
    "reached or stops answering is named in the answer (exit 1), a refusal by one\n"
    "detaches the others.\n\n";

/* 0: parsed; 1: --help printed; -1: a usage error, printed. */
static int parse(int argc, char **argv, struct qargs *a) {
  int first, rc = cli_parse(ME, query_head, query_opts, a, argc, argv, &first);
  if (rc) return rc;
  if (a->file && first < argc) {
    fprintf(stderr, "megascope query: a program and -f FILE: give one\n");
    return -1;
  }
  if (!a->file && first != argc - 1) {
    fprintf(stderr, "megascope query: expected one PROGRAM (quote it) or -f FILE\n");
    return -1;
  }
  if (a->delta && !a->every_ns) {
    fprintf(stderr, "megascope query: --delta needs --every\n");
    return -1;
  }
  if (a->sockets.n > 1 && a->slo_ns) {
    fprintf(stderr, "megascope query: --slo watches one engine's TPOT: give one --socket\n");
    return -1;
  }
  if (a->every_ns && a->every_ns < 10000000ull) {
    fprintf(stderr, "megascope query: --every is at least 10ms\n");
    return -1;
  }
  a->src = a->file ? read_text(a->file) : strdup(argv[first]);
  return a->src ? 0 : -1;
}

/* ---- compile errors with a caret ---- */

static void show_error(const char *src, const char *log) {
  fprintf(stderr, "megascope query: %s", log);
  int col;
  if (sscanf(log, "column %d:", &col) != 1 || col < 1) return;
  /* the line holding the column, and a caret under it */
  const char *p = src, *line = src;
  for (int i = 1; i < col && *p; i++, p++)
    if (*p == '\n') line = p + 1;
  const char *end = strchr(line, '\n');
  int len = end ? (int)(end - line) : (int)strlen(line);
  fprintf(stderr, "  %.*s\n  %*s^\n", len, line, (int)(p - line), "");
}

/* ---- the engine ---- */

/* --schema FILE against live engines: its ids must name what theirs do, or
 * the maps' keys would read as other classes (a CPU engine's plans fuse the
 * pre-norms, so its classes are not a plain `compile`'s). 0 when they name alike. */
static int schema_differs(const char *path, const struct ms_query_schema *file, const struct ms_query_schema *live) {
  char lb[512] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  if (!ms_query_schema_same(file, "the file", live, "the engine's", &log)) return 0;
  fprintf(stderr,
          "megascope query: --schema %s does not name the engine's classes as the engine does: %s"
          "  (write it with `megascope compile --backend B --schema-out` for the engine's backend and tiling,\n"
          "  or leave --schema out to take the engine's own)\n",
          path, lb);
  return -1;
}

static struct ms_query_schema *file_schema(const char *path) {
  char *text = read_text_max(path, 64u << 20);
  if (!text) return NULL;
  char lb[1024] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_query_schema *s = ms_query_schema_parse(text, strlen(text), &log);
  if (!s) fprintf(stderr, "megascope query: %s: %s", path, lb);
  free(text);
  return s;
}

/* ---- dump ---- */

static void dump(const struct ms_query *q) {
  for (size_t i = 0; i < ms_query_map_count(q); i++) {
    const struct ms_bpf_map_def *d = ms_query_map(q, i);
    printf("map %zu %s: type %u, key %u, value %u, max_entries %u%s\n", i, d->name, d->type, d->key_size,
           d->value_size, d->max_entries, d->flags & MS_BPF_MAP_F_RDONLY_PROG ? ", read-only" : "");
  }
  for (size_t i = 0; i < ms_query_prog_count(q); i++) {
    size_t n;
    const char *sec;
    const struct ms_bpf_insn *in = ms_query_prog(q, i, &n, &sec);
    printf("\nprogram %zu (section %s): %zu instructions\n", i, sec, n);
    for (size_t k = 0; k < n;) {
      char line[128];
      int used = ms_bpf_insn_linux(in, n, k, line, sizeof line);
      printf("%5zu: %s\n", k, line);
      k += used > 0 ? (size_t)used : 1;
    }
  }
}

static int write_file(const char *path, const void *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(buf, 1, len, f) == len;
  if (f && fclose(f)) ok = 0;
  if (!ok) fprintf(stderr, "megascope query: cannot write %s: %s\n", path, strerror(errno));
  return ok ? 0 : -1;
}

/* ---- the run ---- */

/* One query's attachments: the summary; the capture part once its trigger
 * fired (bounded, then detached); the same summary at a higher rate while the
 * SLO is in danger. */
struct session {
  const struct qargs *a;
  const char *sock;
  struct ms_query *q, *cap;
  struct live sum, capl, boost;
  int cap_done;
  uint32_t cap_records;
  uint64_t t0;
  double slo_sum;         /* the last stats' TPOT sum (s) and count */
  uint64_t slo_count;
  int slo_seen;
  struct ms_query_snapshot *last;   /* --delta: the previous print's maps and coverage */
  struct ms_coverage last_cov;
};

static void print(struct session *s, struct live *l, const char *part, int final) {
  struct ms_coverage cov = {0};
  if (live_coverage(l, ME, s->sock, &cov)) return;
  struct ms_query_print po = {.sz = sizeof po, .top = (uint32_t)s->a->top, .as_json = s->a->as_json, .final = final,
                              .id = l->id, .part = part, .elapsed_s = (double)(ms_now_ns() - s->t0) / 1e9,
                              .ranks = l->n_ranks > 1 ? l->rank_cov : NULL,
                              .n_ranks = l->n_ranks > 1 ? (size_t)l->n_ranks : 0};
  int interval = s->a->delta && !final && l == &s->sum;
  if (interval) po.n_ranks = 0;  /* each rank's coverage is since the attach: printed with the totals only */
  struct ms_query_snapshot *now = NULL;
  if (interval) po.take = &now;
  if (interval && s->last) {
    po.since = s->last;
    po.since_cov = &s->last_cov;
  }
  if (!s->a->as_json && strcmp(part, "summary")) printf("--- %s (attachment %d), %.1f s\n", part, l->id, po.elapsed_s);
  ms_query_write(l->q, &l->src, &cov, &po, stdout);
  if (interval) { /* the next interval starts at what this one read */
    ms_query_snapshot_free(s->last);
    s->last = now;
    s->last_cov = cov;
  }
}

static void event(struct session *s, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void event(struct session *s, const char *what, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  double t = (double)(ms_now_ns() - s->t0) / 1e9;
  if (!s->a->as_json) {
    fprintf(stderr, "megascope query: %.2f s: %s\n", t, msg);
    return;
  }
  struct ms_json j;
  ms_json_init(&j, stdout, 0);
  ms_json_obj_begin(&j);
  ms_json_kstr(&j, "event", what);
  ms_json_knum(&j, "elapsed_s", t);
  ms_json_kstr(&j, "what", msg);
  ms_json_obj_end(&j);
  ms_json_end(&j);
  fflush(stdout);
}

static uint32_t pow2_at_least(uint64_t v) {
  uint32_t p = 4096;
  while (p < v && p < (1u << 26)) p <<= 1;
  return p;
}

/* The trigger: checked on the summary; when it fires, the capture part is
 * compiled for the worst entry and attached with a ring-buffer budget of
 * `capture` records, so the engine itself stops it there. */
static void check_trigger(struct session *s) {
  struct ms_query_trigger t;
  ms_query_get_trigger(s->q, &t);
  if (!t.has || s->cap || s->cap_done) return;
  uint64_t value = 0;
  char top[2][128];
  if (ms_query_trigger_check(s->q, &s->sum.src, &value, top) != 1) return;
  char lb[4096] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_query_opts qo = {.sz = sizeof qo, .max_keys = (uint32_t)s->a->max_keys};
  /* the ring holds the whole capture, at the largest record size; the budget
   * (of the actual records) stops the records there */
  if (t.capture) qo.ring_bytes = pow2_at_least((uint64_t)MS_QUERY_RECORD_MAX_BYTES * t.capture);
  if (!(s->cap = ms_query_compile_capture(s->q, top, &qo, &log))) {
    fprintf(stderr, "megascope query: the capture part: %s", lb);
    s->cap_done = 1;
    return;
  }
  s->cap_records = t.capture;
  uint32_t rec = ms_query_record_bytes(s->cap);
  /* the engine's ring budget counts record data, not the 8-byte headers */
  uint64_t data = rec > MS_BPF_RINGBUF_HDR_SIZE ? rec - MS_BPF_RINGBUF_HDR_SIZE : 0;
  struct cli_budget b = {.ringbuf_bytes = data * t.capture, .interp = s->a->budget.interp};
  event(s, "trigger", "%s = %llu %s %llu: capture%s%s%s%s (%u records)", t.map, (unsigned long long)value, t.op,
        (unsigned long long)t.threshold, top[0][0] ? " for $top=" : "", top[0], top[1][0] ? ", $top2=" : "",
        top[1], t.capture);
  if (live_attach(&s->capl, ME, s->sock, s->cap, "query-capture", &b)) {
    ms_query_free(s->cap);
    s->cap = NULL;
    s->cap_done = 1;
  }
}

static void finish_capture(struct session *s, int at_end) {
  if (!s->cap || s->cap_done) return;
  if (!at_end && !(s->cap_records && live_records(&s->capl) >= s->cap_records)) return;
  print(s, &s->capl, "capture", 1);
  live_detach(&s->capl, ME, s->sock);
  event(s, "capture_done", "capture detached%s", at_end ? " at the end" : " after its records");
  s->cap_done = 1;
}

/* The SLO: TPOT over the requests that finished since the last check (from the
 * engine's stats); above the SLO the same query runs at --slo-sample beside
 * the summary, and detaches when TPOT is back under it. */
static void check_slo(struct session *s) {
  if (!s->a->slo_ns) return;
  double sum;
  uint64_t count;
  if (live_tpot(ME, s->sock, &sum, &count)) return;
  double window = count > s->slo_count ? (sum - s->slo_sum) / (double)(count - s->slo_count) : -1;
  int first = !s->slo_seen;
  s->slo_sum = sum, s->slo_count = count, s->slo_seen = 1;
  if (first) return; /* the window starts here */
  int danger = window * 1e9 > (double)s->a->slo_ns;
  if (danger && !s->boost.id) {
    struct cli_budget b = {.max_per_step = s->a->budget.max_per_step, .sample = s->a->slo_sample, .interp = s->a->budget.interp};
    if (!live_attach(&s->boost, ME, s->sock, s->q, "query-danger", &b))
      event(s, "danger", "TPOT %.3f ms over the SLO %.3f ms: sampling 1 in %ld (attachment %d)", window * 1e3,
            (double)s->a->slo_ns / 1e6, s->a->slo_sample ? s->a->slo_sample : 1, s->boost.id);
  } else if (!danger && s->boost.id) {
    print(s, &s->boost, "danger", 1);
    live_detach(&s->boost, ME, s->sock);
    if (window >= 0)
      event(s, "safe", "TPOT %.3f ms under the SLO: back to 1 in %ld", window * 1e3, s->a->budget.sample ? s->a->budget.sample : 1);
    else
      event(s, "safe", "no request finished in the window: back to 1 in %ld", s->a->budget.sample ? s->a->budget.sample : 1);
  }
}

static int watch(struct session *s, uint64_t t_enter) {
  const struct qargs *a = s->a;
  struct ms_query_trigger t;
  ms_query_get_trigger(s->q, &t);
  uint64_t check_ns = a->every_ns ? a->every_ns : (t.has || a->slo_ns) ? 500000000ull : 0;
  s->t0 = ms_now_ns();
  uint64_t next_print = a->every_ns ? s->t0 + a->every_ns : UINT64_MAX;
  uint64_t next_check = check_ns ? s->t0 + check_ns : UINT64_MAX;
  uint64_t end = a->have_for ? s->t0 + a->for_ns : UINT64_MAX;
  double first_ms = -1;
  struct ms_coverage cov;
  uint64_t next_alive = 0;
  check_slo(s); /* the baseline of the TPOT window */
  while (!stop_flag) {
    uint64_t now = ms_now_ns();
    /* the attachment is asked for until its first event, then once a second:
     * gone (the engine stopped, or another client detached it) ends the query */
    if (first_ms < 0 || now >= next_alive) {
      if (live_coverage(&s->sum, ME, s->sock, &cov)) {
        fprintf(stderr, "megascope query: attachment %d is gone (the engine stopped, or it was detached)\n",
                s->sum.id);
        s->sum.id = s->capl.id = s->boost.id = 0; /* nothing left to detach */
        return -1;
      }
      if (first_ms < 0 && cov.executed > 0) first_ms = (double)(ms_now_ns() - t_enter) / 1e6;
      next_alive = now + 1000000000ull;
    }
    if (now >= end) break;
    if (now >= next_check) {
      check_trigger(s);
      check_slo(s);
      next_check += check_ns;
    }
    finish_capture(s, 0);
    if (now >= next_print) {
      if (!a->as_json) printf("--- %.1f s\n", (double)(now - s->t0) / 1e9);
      print(s, &s->sum, "summary", 0);
      next_print += a->every_ns;
    }
    uint64_t wake = next_print < end ? next_print : end, nap = first_ms < 0 ? 1000000ull : 20000000ull;
    if (next_check < wake) wake = next_check;
    if (wake > now && wake - now < nap) nap = wake - now;
    live_sleep_ns(nap);
  }
  if (!a->as_json && a->every_ns) printf("--- end, %.1f s\n", (double)(ms_now_ns() - s->t0) / 1e9);
  print(s, &s->sum, "summary", 1);
  finish_capture(s, 1);
  if (s->boost.id) {
    print(s, &s->boost, "danger", 1);
    live_detach(&s->boost, ME, s->sock);
  }
  if (first_ms >= 0) fprintf(stderr, "megascope query: first event %.2f ms after the start\n", first_ms);
  return 0;
}

/* Several engines (replicas.h): one answer, merged. A trigger's capture and
 * --slo's second attachment follow one engine and are refused here. */
static int query_fleet(struct fleet *fleet, const struct qargs *a, const struct ms_query *q,
                       const struct cli_budget *b) {
  struct ms_query_trigger t;
  ms_query_get_trigger(q, &t);
  if (t.has) {
    fprintf(stderr, "megascope query: a trigger (when ... capture) follows one engine: give one --socket\n");
    return 2;
  }
  struct fleet_run fr = {.budget = *b, .for_ns = a->have_for ? a->for_ns : 0, .every_ns = a->every_ns,
                         .delta = a->delta, .as_json = a->as_json, .top = (uint32_t)a->top, .stop = &stop_flag};
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  return fleet_query(fleet, q, &fr);
}

int cmd_query(int argc, char **argv) {
  uint64_t t_enter = ms_now_ns();
  struct qargs a = {0};
  int prc = parse(argc, argv, &a);
  if (prc) {
    free(a.src);
    return prc > 0 ? 0 : 2;
  }
  int rc = 1;
  char sock[512] = "";
  struct ms_query_schema *sc = NULL;
  struct session s = {.a = &a, .sock = sock};
  void *bundle = NULL;
  size_t blen = 0;
  int offline = a.dump || a.emit;
  struct fleet *fleet = NULL;
  struct ms_query_schema *engines = NULL;  /* with --schema, attaching: what the engines name */
  if (a.sockets.n > 1 && !offline) { /* replicas: every engine's schema, the same plan */
    if (!(fleet = fleet_open(ME, a.sockets.path, a.sockets.n, &sc))) goto out;
    if (a.schema) engines = sc, sc = NULL;
  } else if (!a.schema || !offline) {
    if (cli_ctl_socket(ME, a.sockets.n ? a.sockets.path[0] : NULL, sock, sizeof sock)) goto out;
    if (a.schema && !(engines = live_schema(ME, sock))) goto out;
  }
  if (!sc && !(sc = a.schema ? file_schema(a.schema) : live_schema(ME, sock))) goto out;
  if (engines && schema_differs(a.schema, sc, engines)) {
    ms_query_schema_free(engines);
    rc = 2;
    goto out;
  }
  ms_query_schema_free(engines);
  char lb[4096] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_query_opts qo = {.sz = sizeof qo, .max_keys = (uint32_t)a.max_keys};
  if (!(s.q = ms_query_compile(a.src, sc, &qo, &log))) {
    show_error(a.src, lb);
    rc = 2;
    goto out;
  }
  if (ms_query_bundle(s.q, &bundle, &blen)) goto out;
  if (a.dump) dump(s.q);
  if (a.emit && write_file(a.emit, bundle, blen)) goto out;
  if (offline) {
    rc = 0;
    goto out;
  }
  struct cli_budget b = {.max_per_step = a.budget.max_per_step, .sample = a.budget.sample,
                          .ringbuf_bytes = a.budget.ringbuf_bytes, .interp = a.budget.interp};
  if (fleet) {
    rc = query_fleet(fleet, &a, s.q, &b);
    goto out;
  }
  if (live_attach(&s.sum, ME, sock, s.q, "query", &b)) goto out;
  if (!a.as_json)
    fprintf(stderr, "megascope query: attached as %d (%zu programs); %s%s\n", s.sum.id, ms_query_prog_count(s.q),
            a.every_ns ? (a.delta ? "printing each interval's change, " : "printing every interval, ") : "",
            a.have_for ? "and at the end" : "Ctrl-C to stop");
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  rc = watch(&s, t_enter) ? 1 : 0;
  live_detach(&s.sum, ME, sock);
out:
  live_detach(&s.capl, ME, sock);
  live_detach(&s.boost, ME, sock);
  free(bundle);
  ms_query_snapshot_free(s.last);
  ms_query_free(s.cap);
  ms_query_free(s.q);
  ms_query_schema_free(sc);
  fleet_free(fleet);
  free(a.src);
  return rc;
}
