/* SPDX-License-Identifier: MIT */
/* megascope explain: the built-in drill-down an operator runs on a live
 * engine. A summary first, raw evidence only where the summary says to look.
 *
 *   explain --socket S --slo tpot=50ms [--window 4s] [--evidence 200] [--json]
 *
 * 1. Summary: one query over the window keeps each task's time by (class,
 *    bucket, worker, step % K), each class's bytes a task, each request's
 *    attention time and context, and the steps; meanwhile the engine's stats
 *    are read EXPLAIN_OS_SLICES times for what the OS says of each worker
 *    thread (its run-queue wait) and the TPOT of the requests finished. A
 *    window of fewer than EXPLAIN_MIN_STEPS steps (a starved or idle engine)
 *    is stretched, to four times --window at most, and says so.
 * 2. Judgement (src/explain): classes against the same op in other layers,
 *    layers, workers, devices and requests against their peers, each effect
 *    against the scatter the same window shows among healthy peers; every part
 *    above that noise is a culprit, the broadest first.
 * 3. Evidence: for each culprit (EXPLAIN_MAX_EVIDENCE at most) a capture of
 *    its tasks alone, a ring buffer bounded by the engine's own budget to its
 *    share of --evidence records, then detached.
 * Exit codes: 0 done (whether or not the SLO holds), 1 refused or
 * unreachable, 2 usage. docs/query.md says how it judges and how sure it is. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "explain_cli.h"
#include "opt.h"
#include "megascope/query.h"
#include "query_client.h"

#define ME "explain"

static int window_opt(void *dst, const char *arg) {
  struct explain_args *a = dst;
  if (ms_query_parse_duration(arg, &a->window_ns) || a->window_ns < 500000000ull) {
    fprintf(stderr, "megascope explain: --window '%s': expected a duration of at least 500ms\n", arg);
    return -1;
  }
  return 0;
}

static int slo_opt(void *dst, const char *arg) { return live_parse_slo(ME, arg, &((struct explain_args *)dst)->slo_ns); }

#define EA struct explain_args
static const struct cli_opt explain_opts[] = {
    CLI_OPT_GROUP(EA, socket, cli_socket_opts),
    CLI_OPT_FN("slo", "tpot=DURATION", slo_opt, "the time-per-output-token objective (tpot=50ms)"),
    CLI_OPT_FN("window", "DURATION", window_opt, "how long the summary runs (default 4s)"),
    CLI_OPT_INT(EA, evidence, "evidence", "N", 1, 100000,
                "raw task records captured in all, shared among the culprits (default 200)"),
    CLI_OPT_INT(EA, slices, "slices", "K", 2, 64,
                "parts the window's steps are split into (step % K) for the noise\n"
                "(default: 32, fewer when the classes x workers would need too many keys)"),
    CLI_OPT_FLAG(EA, as_json, "json", "the report as one JSON object"),
    CLI_OPT_LIST(EA, baseline, n_baseline, "baseline", "FILE",
                 "an earlier --json report of this model while healthy: each class is held\n"
                 "against where it stood among its peers there (a standing cost, such as a\n"
                 "first layer's cold RoPE, is then not a culprit); repeat it (up to 8) with\n"
                 "reports of other healthy windows: each class against the median of where it\n"
                 "stood, how far they differed added to its noise"),
    {0}};
#undef EA

static const char explain_head[] =
    "usage: megascope explain [--socket S] --slo tpot=DURATION [options]\n\n"
    "What stands out in a live engine, with raw evidence for it alone: a summary over a\n"
    "window (each class's, worker's and request's task times, what the OS says of each\n"
    "worker thread), each part held against its peers (a class against the same op in\n"
    "the other layers, a layer, a worker against the others, a request against the\n"
    "others given their contexts) by the scatter the same window shows among healthy\n"
    "peers, then a bounded capture of each culprit's tasks.\n\n";

static int parse(int argc, char **argv, struct explain_args *a) {
  *a = (struct explain_args){.window_ns = 4000000000ull, .evidence = 200};
  int rc = cli_parse(ME, explain_head, explain_opts, a, argc, argv, NULL);
  if (rc) return rc;
  if (!a->slo_ns) {
    fprintf(stderr, "megascope explain: --slo tpot=DURATION is required\n");
    return -1;
  }
  return 0;
}

/* ---- the summary ---- */

/* A live query's read-out, parsed; NULL with the reason printed. */
static json_t *readout(struct live *l, const char *sock, const char *what) {
  struct ms_coverage cov;
  if (live_coverage(l, ME, sock, &cov)) return NULL;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    fprintf(stderr, "megascope explain: the %s's read-out: %s\n", what, strerror(errno));
    return NULL;
  }
  struct ms_query_print po = {.sz = sizeof po, .as_json = 1, .final = 1, .id = l->id};
  int rc = ms_query_write(l->q, &l->src, &cov, &po, f);
  fclose(f);
  json_error_t err;
  json_t *j = rc ? NULL : json_loadb(text, len, 0, &err);
  if (rc) fprintf(stderr, "megascope explain: the %s's read-out: %s\n", what, ms_strerror(rc));
  else if (!j)
    fprintf(stderr, "megascope explain: the %s's read-out is not JSON (%s at byte %d of %zu)\n", what, err.text,
            err.position, len);
  free(text);
  return j;
}

static json_t *map_named(json_t *r, const char *name) {
  size_t i;
  json_t *m;
  json_array_foreach(json_object_get(r, "maps"), i, m) {
    const char *n = json_string_value(json_object_get(m, "name"));
    if (n && !strcmp(n, name)) return m;
  }
  return NULL;
}

/* The schema's classes (names point into w->schema). */
static int load_classes(struct explain_window *w) {
  json_t *tc = json_object_get(json_object_get(w->schema, "schema"), "task_classes");
  w->n_cls = (int)json_array_size(tc);
  if (!(w->cls = calloc((size_t)w->n_cls + 1, sizeof *w->cls))) return -1;
  for (int i = 0; i < w->n_cls; i++) {
    json_t *c = json_array_get(tc, (size_t)i);
    int id = (int)json_integer_value(json_object_get(c, "id"));
    if (id < 0 || id >= w->n_cls) id = i;
    const char *op = json_string_value(json_object_get(c, "op"));
    const char *launch = json_string_value(json_object_get(c, "launch"));
    w->cls[id] = (struct ms_explain_class){json_string_value(json_object_get(c, "name")), op ? op : "",
                                           (int)json_integer_value(json_object_get(c, "layer")), 0,
                                           launch && !strcmp(launch, "aot")};
  }
  return 0;
}

static int class_index(const struct explain_window *w, const char *name) {
  for (int i = 0; name && i < w->n_cls; i++)
    if (w->cls[i].name && !strcmp(w->cls[i].name, name)) return i;
  return -1;
}

/* One --baseline file: each class's log ratio and noise, by name, into
 * lr/nz[class * nf + f]; a report that names none of this engine's classes is
 * an error (the wrong model). */
static int load_baseline(const char *path, struct explain_window *w, double *lr, double *nz, int f, int nf) {
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err), *cls = json_object_get(root, "classes");
  if (!root || !json_is_array(cls) || json_object_get(root, "baseline")) {
    fprintf(stderr, "megascope explain: --baseline %s: %s\n", path,
            !root                 ? err.text
            : json_is_array(cls) ? "a report judged against a baseline itself (its ratios are not its peers')"
                                  : "not an explain --json report (no \"classes\" array)");
    json_decref(root);
    return -1;
  }
  int named = 0;
  for (size_t k = 0; k < json_array_size(cls); k++) {
    json_t *c = json_array_get(cls, k);
    int i = class_index(w, json_string_value(json_object_get(c, "class")));
    double ratio = json_number_value(json_object_get(c, "ratio"));
    double noise = json_number_value(json_object_get(c, "noise"));
    if (i < 0 || !(ratio > 0) || !(noise > 0)) continue;
    lr[(size_t)i * (size_t)nf + (size_t)f] = log(ratio), nz[(size_t)i * (size_t)nf + (size_t)f] = noise, named++;
  }
  json_decref(root);
  if (!named) {
    fprintf(stderr, "megascope explain: --baseline %s: judges none of this engine's classes (another model?)\n",
            path);
    return -1;
  }
  return 0;
}

/* --baseline, once or more: each class against the median of where the
 * reports had it, its noise the mean of theirs (in squares) plus how far
 * they differed (their readings' variance). One healthy window cannot show
 * how far a class moves between windows: on Gemma-3 one layer's RoPE read
 * 0.67x its peers in a baseline's window and 1.2-1.8x in every window of
 * the minutes after, healthy or not, and was named 2.3x slower than where
 * it stood in seven of them. */
static int load_baselines(const struct explain_args *a, struct explain_window *w) {
  int nf = a->n_baseline, rc = -1;
  size_t n = (size_t)w->n_cls * (size_t)nf + 1;
  double *lr = malloc(n * sizeof *lr), *nz = malloc(n * sizeof *nz);
  w->base = malloc(((size_t)w->n_cls + 1) * sizeof *w->base);
  w->base_noise = malloc(((size_t)w->n_cls + 1) * sizeof *w->base_noise);
  if (!lr || !nz || !w->base || !w->base_noise) goto out;
  for (size_t i = 0; i < n; i++) lr[i] = nz[i] = NAN;
  for (int f = 0; f < nf; f++)
    if (load_baseline(a->baseline[f], w, lr, nz, f, nf)) goto out;
  for (int i = 0; i < w->n_cls; i++) {
    double v[EXPLAIN_MAX_BASELINES], mean = 0, var = 0, noise2 = 0;
    int k = 0;
    for (int f = 0; f < nf; f++) {
      size_t at = (size_t)i * (size_t)nf + (size_t)f;
      if (isnan(lr[at])) continue;
      v[k++] = lr[at], mean += lr[at], noise2 += nz[at] * nz[at];
    }
    w->base[i] = w->base_noise[i] = NAN;
    if (!k) continue;
    mean /= k;
    for (int j = 0; j < k; j++) var += (v[j] - mean) * (v[j] - mean);
    w->base_noise[i] = sqrt(noise2 / k + (k > 1 ? var / (k - 1) : 0));
    w->base[i] = cli_median(v, k);
    w->n_base++;
  }
  rc = 0;
out:
  free(lr);
  free(nz);
  return rc;
}

/* K: as many slices as keep the task map under about 64k keys. */
static int slices_for(const struct explain_args *a, int n_cls, int n_workers) {
  if (a->slices) return (int)a->slices;
  long k = 65536L / ((long)(n_cls ? n_cls : 1) * (n_workers ? n_workers : 1) * 3);
  return k > 32 ? 32 : k < 4 ? 4 : (int)k;
}

/* The worker a firing names: across ranks, numbered rank after rank (the
 * query runs on every rank and their maps merge, so rank 1's worker 0 must
 * not add into rank 0's). */
static void worker_expr(const struct explain_window *w, char *out, size_t n) {
  if (w->rank_workers) snprintf(out, n, "(device * %d + worker)", w->rank_workers);
  else snprintf(out, n, "worker");
}

static struct ms_query *summary_query(const struct ms_query_schema *sc, const struct explain_window *w, int K,
                                      int n_cls, struct ms_textbuf *log) {
  char src[1536], wk[48], shares[256] = "";
  worker_expr(w, wk, sizeof wk);
  /* tensor parallel: the communication tasks by the device whose share they carry */
  int comm = 0;
  for (int c = 0; c < w->n_cls; c++) comm |= !strncmp(w->cls[c].op, "comm", 4);
  if (comm)
    snprintf(shares, sizeof shares,
             "task_end /op == comm_allgather/ { @sh[tile_z, class, bucket, step %% %d] = avg(t_end - t_begin); "
             "@shm[tile_z, class, bucket, step %% %d] = min(t_end - t_begin) }\n", K, K);
  snprintf(src, sizeof src,
           "task_end { @t[class, bucket, %s, step %% %d] = avg(t_end - t_begin); "
           "@dev[%s] = max(device) }\n"
           "task_end /work_bytes != 0xffffffffffffffff && work_bytes > 0/ { @wb[class] = avg(work_bytes); "
           "@m[class, bucket, %s, step %% %d] = min((t_end - t_begin) * 65536 / work_bytes) }\n"
           "task_end /op == attn && req_slot != 0xffffffff/ { @r[req_slot, req_gen, step, %s] = avg(t_end - t_begin); "
           "@rm[req_slot, req_gen, step, %s] = min(t_end - t_begin); @rc[req_slot, req_gen, step, %s] = min(ctx_len); "
           "@rh[req_slot, req_gen, step, %s] = max(ctx_len); @rx[req_slot, req_gen] = max(ctx_len) }\n"
           "%s"
           "step /phase == end%s/ { @steps = count() }",  /* every rank ends each step: rank 0's are the steps */
           wk, K, wk, wk, K, wk, wk, wk, wk, shares, w->rank_workers ? " && device == 0" : "");
  /* room for every class in four buckets a slice, and 32k (request, step, worker)
   * cells (a full map drops what does not fit, counted) */
  uint32_t keys = 32768, want = (uint32_t)n_cls * 4u * (uint32_t)K;
  while (keys < want && keys < 65536u) keys <<= 1;
  struct ms_query_opts qo = {.sz = sizeof qo, .max_keys = keys};
  return ms_query_compile(src, sc, &qo, log);
}

/* One read of the engine's stats: each worker's OS counters, the TPOT. */
struct stats_read {
  uint64_t t, steps;
  double tpot_sum;
  uint64_t tpot_n;
  json_t *os;  /* worker_os (owned) */
};

static int read_stats(const char *sock, struct stats_read *s) {
  json_t *rep = live_call(ME, sock, "{\"cmd\":\"stats\"}");
  if (!rep) return -1;
  s->t = ms_now_ns();
  s->steps = (uint64_t)json_integer_value(json_object_get(rep, "steps"));
  json_t *tp = json_object_get(rep, "tpot");
  s->tpot_sum = json_number_value(json_object_get(tp, "sum_s"));
  s->tpot_n = (uint64_t)json_integer_value(json_object_get(tp, "count"));
  s->os = json_incref(json_object_get(rep, "worker_os"));
  json_t *ranks = json_object_get(rep, "ranks"), *rk;
  size_t i;
  if (json_array_size(ranks)) {  /* across ranks: every rank's workers, rank after rank */
    json_decref(s->os);
    s->os = json_array();
    json_array_foreach(ranks, i, rk) json_array_extend(s->os, json_object_get(rk, "worker_os"));
  }
  json_decref(rep);
  return 0;
}

/* The OS's view of one slice: the difference of two reads. */
static void os_slice(const struct stats_read *a, const struct stats_read *b, struct ms_explain_os *out, int n) {
  for (int w = 0; w < n; w++) {
    json_t *x = json_array_get(a->os, (size_t)w), *y = json_array_get(b->os, (size_t)w);
    struct ms_explain_os *o = &out[w];
    memset(o, 0, sizeof *o);
    o->pinned_cpu = x ? (int)json_integer_value(json_object_get(x, "pinned_cpu")) : -1;
    o->last_cpu = y ? (int)json_integer_value(json_object_get(y, "last_cpu")) : -1;
    if (!x || !y || !json_is_true(json_object_get(x, "known")) || !json_is_true(json_object_get(y, "known"))) continue;
#define D(f) ((double)json_integer_value(json_object_get(y, f)) - (double)json_integer_value(json_object_get(x, f)))
    o->known = 1;
    o->wall_ns = (double)(b->t - a->t);
    o->run_ns = D("run_ns");
    o->runqueue_ns = D("runqueue_ns");
    o->preempted = D("preempted");
#undef D
  }
}

static int add_cell(struct explain_window *w, const struct ms_explain_cell *c) {
  if (w->n_cells == w->cap_cells) {
    size_t cap = w->cap_cells ? 2 * w->cap_cells : 4096;
    struct ms_explain_cell *p = realloc(w->cells, cap * sizeof *p);
    if (!p) return -1;
    w->cells = p, w->cap_cells = cap;
  }
  w->cells[w->n_cells++] = *c;
  return 0;
}

static uint64_t map_bytes(json_t *m) {
  size_t keys = json_array_size(json_object_get(m, "keys"));
  return (uint64_t)json_array_size(json_object_get(m, "entries")) * (8 * (keys ? keys : 1) + 16);
}

static int by_req_cell(const void *a, const void *b) {
  const struct ms_explain_req_cell *x = a, *y = b;
  if (x->request != y->request) return x->request < y->request ? -1 : 1;
  if (x->slice != y->slice) return x->slice < y->slice ? -1 : 1;
  return (x->worker > y->worker) - (x->worker < y->worker);
}

static int find_request(struct explain_window *w, json_t *k, int add) {
  uint32_t slot = (uint32_t)json_integer_value(json_array_get(k, 0)), gen = (uint32_t)json_integer_value(json_array_get(k, 1));
  for (int q = w->n_req - 1; q >= 0; q--)
    if (w->req[q].slot == slot && w->req[q].gen == gen) return q;
  if (!add) return -1;
  w->req[w->n_req] = (struct ms_explain_request){.slot = slot, .gen = gen};
  return w->n_req++;
}

/* The cell of @rm or @rc keyed k (slot, gen, step, worker); NULL when @r has none. */
static struct ms_explain_req_cell *req_cell(struct explain_window *w, json_t *k) {
  struct ms_explain_req_cell key = {.request = find_request(w, k, 0),
                                    .slice = (int)json_integer_value(json_array_get(k, 2)),
                                    .worker = (int)json_integer_value(json_array_get(k, 3))};
  return bsearch(&key, w->req_cells, w->n_req_cells, sizeof key, by_req_cell);
}

/* A (request, step)'s cells (one a worker) from c on: a chunk in all of
 * them when in any (one worker may have run one row of the chunk alone). */
static size_t mark_chunk(struct ms_explain_req_cell *c, size_t n) {
  size_t e = 1;
  int chunk = c[0].ctx < 0;
  for (; e < n && c[e].request == c[0].request && c[e].slice == c[0].slice; e++) chunk |= c[e].ctx != c[0].ctx;
  for (size_t j = 0; chunk && j < e; j++) c[j].ctx = -1;
  return e;
}

/* The requests' attention by (request, step, worker): @r (time), @rm (the
 * fastest task), @rc and @rh (the least and the longest context), keyed alike;
 * @rx each request's longest context. By worker, so that a request is judged
 * on the workers explain does not name. Only a request's decode steps are
 * judged (one row, so one context): a prompt's chunk puts rows of every
 * context in one step, and its attention tasks run beside the chunk's GEMMs,
 * not the decode rows' (on SmolLM2, 5.8 against 12.4 us a task at 48-63 positions). */
static int load_requests(struct explain_window *w, json_t *r, json_t *rm, json_t *rc, json_t *rh, json_t *rx) {
  size_t j;
  json_t *f;
  w->req = calloc(json_array_size(r) + 1, sizeof *w->req);
  w->req_cells = calloc(json_array_size(r) + 1, sizeof *w->req_cells);
  if (!w->req || !w->req_cells) return -1;
  json_array_foreach(r, j, f) {
    json_t *k = json_object_get(f, "key");
    struct ms_explain_req_cell *c = &w->req_cells[w->n_req_cells++];
    c->request = find_request(w, k, 1);
    c->slice = (int)json_integer_value(json_array_get(k, 2));
    c->worker = (int)json_integer_value(json_array_get(k, 3));
    c->n = json_number_value(json_object_get(f, "count"));
    c->sum_ns = json_number_value(json_object_get(f, "sum"));
    c->ctx = -1;  /* until @rc and @rh agree */
  }
  qsort(w->req_cells, w->n_req_cells, sizeof *w->req_cells, by_req_cell);
  json_array_foreach(rm, j, f) {
    struct ms_explain_req_cell *c = req_cell(w, json_object_get(f, "key"));
    if (c) c->min_ns = json_number_value(json_object_get(f, "value"));
  }
  json_array_foreach(rc, j, f) {
    struct ms_explain_req_cell *c = req_cell(w, json_object_get(f, "key"));
    if (c) c->ctx = json_number_value(json_object_get(f, "value"));
  }
  json_array_foreach(rh, j, f) {
    struct ms_explain_req_cell *c = req_cell(w, json_object_get(f, "key"));
    if (c && c->ctx != json_number_value(json_object_get(f, "value"))) c->ctx = -1;  /* a chunk */
  }
  json_array_foreach(rx, j, f) {
    int q = find_request(w, json_object_get(f, "key"), 0);
    if (q >= 0) w->req[q].ctx_max = json_number_value(json_object_get(f, "value"));
  }
  for (size_t i = 0; i < w->n_req_cells;) i += mark_chunk(&w->req_cells[i], w->n_req_cells - i);
  size_t kept = 0;
  for (size_t i = 0; i < w->n_req_cells; i++) {
    struct ms_explain_req_cell *c = &w->req_cells[i];
    if (c->ctx < 0) continue;
    struct ms_explain_request *q = &w->req[c->request];
    q->n += c->n, q->sum_ns += c->sum_ns, q->ctx_sum += c->ctx * c->n;
    w->req_cells[kept++] = *c;
  }
  w->n_req_cells = kept;
  return 0;
}

static int by_cell(const void *a, const void *b) {
  const struct ms_explain_cell *x = a, *y = b;
  if (x->cls != y->cls) return x->cls < y->cls ? -1 : 1;
  if (x->bucket != y->bucket) return x->bucket < y->bucket ? -1 : 1;
  if (x->worker != y->worker) return x->worker < y->worker ? -1 : 1;
  return (x->slice > y->slice) - (x->slice < y->slice);
}

/* Each cell's fastest task for its bytes (@m, keyed as @t: ns per 64 KiB
 * read, so a class's small last tile does not pass for a fast task). */
static void load_minima(struct explain_window *w, json_t *m) {
  qsort(w->cells, w->n_cells, sizeof *w->cells, by_cell);
  size_t i;
  json_t *e;
  json_array_foreach(m, i, e) {
    json_t *k = json_object_get(e, "key");
    struct ms_explain_cell key = {.cls = class_index(w, json_string_value(json_array_get(k, 0))),
                                  .bucket = (int)json_integer_value(json_array_get(k, 1)),
                                  .worker = (int)json_integer_value(json_array_get(k, 2)),
                                  .slice = (int)json_integer_value(json_array_get(k, 3))};
    struct ms_explain_cell *c = bsearch(&key, w->cells, w->n_cells, sizeof key, by_cell);
    if (c) c->min_ns = json_number_value(json_object_get(e, "value"));
  }
}

/* The read-out's maps into the judgement's tables. */
static int load_summary(struct explain_window *w, json_t *sum) {
  size_t i;
  json_t *e, *m;
  json_array_foreach(json_object_get(sum, "maps"), i, m) {
    w->summary_keys += json_array_size(json_object_get(m, "entries"));
    w->summary_bytes += map_bytes(m);
  }
  w->dropped = (uint64_t)json_integer_value(json_object_get(sum, "dropped"));
  json_array_foreach(json_object_get(map_named(sum, "@t"), "entries"), i, e) {
    json_t *k = json_object_get(e, "key");
    struct ms_explain_cell c = {
        .cls = class_index(w, json_string_value(json_array_get(k, 0))),
        .bucket = (int)json_integer_value(json_array_get(k, 1)),
        .worker = (int)json_integer_value(json_array_get(k, 2)),
        .slice = (int)json_integer_value(json_array_get(k, 3)),
        .n = json_number_value(json_object_get(e, "count")),
        .sum_ns = json_number_value(json_object_get(e, "sum"))};
    if (c.cls >= 0 && c.worker >= 0 && c.worker < w->n_workers && add_cell(w, &c)) return -1;
  }
  load_minima(w, json_object_get(map_named(sum, "@m"), "entries"));
  /* tensor parallel: the communication tasks by the device whose share they
   * carry (tile_z), sender's and receivers' together */
  json_t *sh = json_object_get(map_named(sum, "@sh"), "entries");
  if (json_array_size(sh) && !(w->shares = calloc(json_array_size(sh), sizeof *w->shares))) return -1;
  json_array_foreach(sh, i, e) {
    json_t *k = json_object_get(e, "key");
    struct ms_explain_share_cell c = {.device = (int)json_integer_value(json_array_get(k, 0)),
                                      .cls = class_index(w, json_string_value(json_array_get(k, 1))),
                                      .bucket = (int)json_integer_value(json_array_get(k, 2)),
                                      .slice = (int)json_integer_value(json_array_get(k, 3)),
                                      .n = json_number_value(json_object_get(e, "count")),
                                      .sum_ns = json_number_value(json_object_get(e, "sum"))};
    if (c.cls >= 0 && c.device >= 0) w->shares[w->n_shares++] = c;
  }
  json_array_foreach(json_object_get(map_named(sum, "@shm"), "entries"), i, e) {  /* the fastest of each */
    json_t *k = json_object_get(e, "key");
    int d = (int)json_integer_value(json_array_get(k, 0)), cls = class_index(w, json_string_value(json_array_get(k, 1)));
    int b = (int)json_integer_value(json_array_get(k, 2)), s = (int)json_integer_value(json_array_get(k, 3));
    for (size_t j = 0; j < w->n_shares; j++)
      if (w->shares[j].device == d && w->shares[j].cls == cls && w->shares[j].bucket == b && w->shares[j].slice == s)
        w->shares[j].min_ns = json_number_value(json_object_get(e, "value"));
  }
  json_array_foreach(json_object_get(map_named(sum, "@wb"), "entries"), i, e) {
    int c = class_index(w, json_string_value(json_array_get(json_object_get(e, "key"), 0)));
    if (c >= 0) w->cls[c].work_bytes = json_number_value(json_object_get(e, "value"));
  }
  json_array_foreach(json_object_get(map_named(sum, "@dev"), "entries"), i, e) {
    int wk = (int)json_integer_value(json_array_get(json_object_get(e, "key"), 0));
    if (wk >= 0 && wk < w->n_workers) w->device[wk] = (int)json_number_value(json_object_get(e, "value"));
  }
  if (load_requests(w, json_object_get(map_named(sum, "@r"), "entries"), json_object_get(map_named(sum, "@rm"), "entries"),
                    json_object_get(map_named(sum, "@rc"), "entries"), json_object_get(map_named(sum, "@rh"), "entries"),
                    json_object_get(map_named(sum, "@rx"), "entries")))
    return -1;
  json_t *steps = json_array_get(json_object_get(map_named(sum, "@steps"), "entries"), 0);
  w->steps = json_number_value(json_object_get(steps, "value"));
  w->coverage = json_incref(json_object_get(sum, "coverage"));
  return 0;
}

/* Attaches the summary, reads the OS's view EXPLAIN_OS_SLICES times over the
 * window (more while the window has too few steps), reads the maps out and
 * detaches. */
static int summarize(const struct explain_args *a, const char *sock, const struct ms_query_schema *sc,
                     struct explain_window *w) {
  char lb[2048] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_query *q = summary_query(sc, w, w->slices, w->n_cls, &log);
  struct live l = {0};
  struct cli_budget b = {0};
  struct stats_read s[EXPLAIN_MAX_OS_SLICES + 1] = {{0}};
  json_t *sum = NULL;
  int rc = -1, i = 0;
  if (!q) {
    fprintf(stderr, "megascope explain: the summary query: %s", lb);
    goto out;
  }
  if (read_stats(sock, &s[0]) || live_attach(&l, ME, sock, q, "explain-summary", &b)) goto out;
  if (!a->as_json)
    fprintf(stderr, "megascope explain: summary attached as %d for %.1f s (%d slices)\n", l.id,
            (double)a->window_ns / 1e9, w->slices);
  while (++i <= EXPLAIN_MAX_OS_SLICES) {
    live_sleep_ns(a->window_ns / EXPLAIN_OS_SLICES);
    if (read_stats(sock, &s[i])) goto out;
    os_slice(&s[i - 1], &s[i], &w->os[(size_t)(i - 1) * (size_t)w->n_workers], w->n_workers);
    if (i >= EXPLAIN_OS_SLICES && s[i].steps - s[0].steps >= EXPLAIN_MIN_STEPS) break;
    if (i == EXPLAIN_OS_SLICES && !a->as_json)
      fprintf(stderr, "megascope explain: %llu steps so far; stretching the window (to %.1f s at most)\n",
              (unsigned long long)(s[i].steps - s[0].steps), 4 * (double)a->window_ns / 1e9);
  }
  if (i > EXPLAIN_MAX_OS_SLICES) i = EXPLAIN_MAX_OS_SLICES;
  w->n_os = i;
  if (!(sum = readout(&l, sock, "summary"))) goto out;
  w->window_ns = (double)(s[i].t - s[0].t);
  w->finished = s[i].tpot_n - s[0].tpot_n;
  w->tpot_ms = w->finished ? (s[i].tpot_sum - s[0].tpot_sum) / (double)w->finished * 1e3 : 0;
  if ((rc = load_summary(w, sum))) fprintf(stderr, "megascope explain: out of memory for the summary's tables\n");
out:
  live_detach(&l, ME, sock);
  for (int k = 0; k <= EXPLAIN_MAX_OS_SLICES; k++) json_decref(s[k].os);
  json_decref(sum);
  ms_query_free(q);
  return rc;
}

/* ---- the evidence ---- */

static int by_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double pct(const double *v, size_t n, double q) {
  if (!n) return NAN;
  size_t k = (size_t)ceil(q * (double)n);
  return v[k ? k - 1 : 0];
}

static int fits(int r, size_t n) { return r > 0 && (size_t)r < n; }

/* The capture's predicate for a culprit; 0 when it has none (the OS's view
 * is the CPU culprits' evidence). A request's records carry its context in
 * the fifth field, the others their queueing. */
static int capture_source(const struct explain_window *w, const struct ms_explain_culprit *c, char *src, size_t n) {
  /* seven fields each: (step, worker, task, time, then t_begin and t_ready
   * apart, since the firing's clock can land after the task began and an
   * unsigned difference would wrap; a request's: its context and generation),
   * then the wait */
  char wk[48], rec[160], req_rec[160];
  worker_expr(w, wk, sizeof wk);
  snprintf(rec, sizeof rec, "record(step, %s, task_index, t_end - t_begin, t_begin, t_ready, wait_ns)", wk);
  snprintf(req_rec, sizeof req_rec, "record(step, %s, task_index, t_end - t_begin, ctx_len, req_gen, wait_ns)", wk);
  switch (c->kind) {
  case MS_EXPLAIN_CLASS: return fits(snprintf(src, n, "task_end /class == \"%s\"/ { @ev = %s }", c->name, rec), n);
  case MS_EXPLAIN_LAYER: return fits(snprintf(src, n, "task_end /class =~ \"blk.%d.*\"/ { @ev = %s }", c->id, rec), n);
  case MS_EXPLAIN_WORKER:
    if (w->rank_workers)
      return fits(snprintf(src, n, "task_end /device == %d && worker == %d/ { @ev = %s }", c->id / w->rank_workers,
                      c->id % w->rank_workers, rec), n);
    return fits(snprintf(src, n, "task_end /worker == %d/ { @ev = %s }", c->id, rec), n);
  case MS_EXPLAIN_DEVICE: return fits(snprintf(src, n, "task_end /device == %d/ { @ev = %s }", c->id, rec), n);
  case MS_EXPLAIN_REQUEST:  /* @gen: the slot's newest request, to tell one that ended */
    return fits(snprintf(src, n,
                    "task_end /op == attn && req_slot == %u && req_gen == %u/ { @ev = %s }\n"
                    "task_end /op == attn && req_slot == %u/ { @gen = max(req_gen) }",
                    w->req[c->id].slot, w->req[c->id].gen, req_rec, w->req[c->id].slot), n);
  case MS_EXPLAIN_SLOT:
    return fits(snprintf(src, n, "task_end /op == attn && req_slot == %d/ { @ev = %s }", c->id, req_rec), n);
  default: return 0;
  }
}

static void summarize_evidence(struct explain_evidence *ev, json_t *rd, int is_request) {
  json_t *m = map_named(rd, "@ev"), *recs = json_object_get(m, "records"), *cov = json_object_get(rd, "coverage");
  ev->n = json_array_size(recs);
  ev->bytes = (uint64_t)json_integer_value(json_object_get(m, "bytes"));
  ev->eligible = (uint64_t)json_integer_value(json_object_get(cov, "eligible"));
  ev->executed = (uint64_t)json_integer_value(json_object_get(cov, "executed"));
  ev->lost = (uint64_t)json_integer_value(json_object_get(cov, "lost"));
  double *d = malloc((ev->n ? ev->n : 1) * sizeof *d), wait = 0, fifth = 0;
  size_t i;
  json_t *r;
  ev->first = json_array();
  json_array_foreach(recs, i, r) {
    if (d) d[i] = (double)json_integer_value(json_array_get(r, 3));
    fifth += (double)json_integer_value(json_array_get(r, 4));
    wait += (double)json_integer_value(json_array_get(r, 6));
    int wk = (int)json_integer_value(json_array_get(r, 1)), seen = 0;
    for (int k = 0; k < ev->n_workers; k++) seen |= ev->workers[k] == wk;
    if (!seen && ev->n_workers < 64) ev->workers[ev->n_workers++] = wk;
    if (i < 5) json_array_append(ev->first, r);
  }
  if (d) qsort(d, ev->n, sizeof *d, by_double);
  ev->p50_ns = d ? pct(d, ev->n, 0.5) : NAN;
  ev->p99_ns = d ? pct(d, ev->n, 0.99) : NAN;
  ev->max_ns = d && ev->n ? d[ev->n - 1] : NAN;
  ev->mean_wait_ns = ev->n ? wait / (double)ev->n : NAN;
  ev->mean_ctx = ev->n && is_request ? fifth / (double)ev->n : NAN;
  free(d);
  /* a request's slot served a later one and it none: it ended before the
   * capture, and the window's figures are all there is of it */
  json_t *g = json_array_get(json_object_get(map_named(rd, "@gen"), "entries"), 0);
  ev->later_gen = g ? (int64_t)json_number_value(json_object_get(g, "value")) : -1;
}

/* One culprit's capture: attached until `want` records are in or the time is
 * up, read out, detached. */
static int capture(const char *sock, const struct ms_query_schema *sc, struct explain_evidence *ev, long want,
                   uint64_t time_ns, int is_request) {
  char lb[2048] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  uint32_t rec = 8 * 7 + 8, ring = 4096;
  while (ring < (uint64_t)rec * (uint64_t)want && ring < (1u << 26)) ring <<= 1;
  struct ms_query_opts qo = {.sz = sizeof qo, .ring_bytes = ring};
  struct ms_query *q = ms_query_compile(ev->query, sc, &qo, &log);
  if (!q) {
    fprintf(stderr, "megascope explain: the evidence query: %s", lb);
    return -1;
  }
  struct live l = {0};
  /* the engine's ring budget counts record data, not the 8-byte headers */
  struct cli_budget b = {.ringbuf_bytes = (uint64_t)(rec - 8) * (uint64_t)want};
  int rc = live_attach(&l, ME, sock, q, "explain-evidence", &b);
  uint64_t t0 = ms_now_ns();
  while (!rc && live_records(&l) < (size_t)want && ms_now_ns() - t0 < time_ns) live_sleep_ns(10000000ull);
  json_t *rd = rc ? NULL : readout(&l, sock, "evidence");
  live_detach(&l, ME, sock);
  ms_query_free(q);
  if (!rd) return -1;
  summarize_evidence(ev, rd, is_request);
  json_decref(rd);
  return 0;
}

static int fetch_evidence(const struct explain_args *a, const char *sock, const struct ms_query_schema *sc,
                          struct explain_window *w) {
  int n = 0;
  for (int i = 0; i < w->res.n_culprits && n < EXPLAIN_MAX_EVIDENCE; i++) {
    struct explain_evidence *ev = &w->ev[n];
    memset(ev, 0, sizeof *ev);
    ev->culprit = i;
    if (capture_source(w, &w->res.culprits[i], ev->query, sizeof ev->query)) n++;
  }
  w->n_ev = n;
  for (int i = 0; i < n; i++) {
    long want = a->evidence / n > 0 ? a->evidence / n : 1;
    enum ms_explain_kind k = w->res.culprits[w->ev[i].culprit].kind;
    int is_request = k == MS_EXPLAIN_REQUEST || k == MS_EXPLAIN_SLOT;
    if (capture(sock, sc, &w->ev[i], want, (uint64_t)a->window_ns / 2, is_request)) return -1;
    if (k == MS_EXPLAIN_REQUEST)
      w->ev[i].ended = !w->ev[i].n && w->ev[i].later_gen > (int64_t)w->req[w->res.culprits[w->ev[i].culprit].id].gen;
    w->evidence_bytes += w->ev[i].bytes;
  }
  return 0;
}

/* ---- the command ---- */

static void window_free(struct explain_window *w) {
  for (int i = 0; i < w->n_ev; i++) json_decref(w->ev[i].first);
  ms_explain_result_free(&w->res);
  json_decref(w->schema);
  json_decref(w->coverage);
  free(w->cls);
  free(w->cells);
  free(w->shares);
  free(w->req);
  free(w->req_cells);
  free(w->os);
  free(w->device);
  free(w->base);
  free(w->base_noise);
}

int cmd_explain(int argc, char **argv) {
  struct explain_args a;
  int prc = parse(argc, argv, &a);
  if (prc) return prc > 0 ? 0 : 2;
  char sock[512];
  if (cli_ctl_socket(ME, a.socket, sock, sizeof sock)) return 1;
  int rc = 1;
  struct explain_window w = {0};
  struct ms_query_schema *sc = live_schema(ME, sock);
  json_t *st = live_call(ME, sock, "{\"cmd\":\"stats\"}");
  w.schema = live_call(ME, sock, "{\"cmd\":\"schema\"}");
  if (!sc || !st || !w.schema || load_classes(&w)) goto out;
  if (a.n_baseline && load_baselines(&a, &w)) goto out;
  w.n_workers = (int)json_integer_value(json_object_get(st, "workers"));
  if (w.n_workers < 1) w.n_workers = 1;
  long long n_ranks = json_integer_value(json_object_get(json_object_get(st, "engine"), "ranks"));
  if (n_ranks > 1) {  /* across ranks: "workers" is rank 0's; the window is every rank's */
    w.rank_workers = w.n_workers;
    w.n_workers *= (int)n_ranks;
  }
  w.slices = slices_for(&a, w.n_cls, w.n_workers);
  w.os = calloc((size_t)EXPLAIN_MAX_OS_SLICES * (size_t)w.n_workers, sizeof *w.os);
  w.device = calloc((size_t)w.n_workers, sizeof *w.device);
  if (!w.os || !w.device || summarize(&a, sock, sc, &w)) goto out;
  w.in = (struct ms_explain_input){.classes = w.cls, .n_classes = w.n_cls, .cells = w.cells, .n_cells = w.n_cells,
                                   .requests = w.req, .n_requests = w.n_req, .req_cells = w.req_cells,
                                   .n_req_cells = w.n_req_cells, .req_cells_by_worker = 1, .os = w.os,
                                   .n_os_slices = w.n_os, .device = w.device, .n_workers = w.n_workers,
                                   .n_slices = w.slices, .window_ns = w.window_ns, .steps = w.steps,
                                   .rank_workers = w.rank_workers, .share_cells = w.shares,
                                   .n_share_cells = w.n_shares, .class_base = w.base,
                                   .class_base_noise = w.base_noise};
  int jrc = ms_explain_judge(&w.in, &w.res);
  if (jrc) {
    fprintf(stderr, "megascope explain: the judgement: %s\n", ms_strerror(jrc));
    goto out;
  }
  if (fetch_evidence(&a, sock, sc, &w)) goto out;
  if (a.as_json) explain_report_json(&a, &w);
  else explain_report_text(&a, &w);
  rc = 0;
out:
  json_decref(st);
  window_free(&w);
  ms_query_schema_free(sc);
  return rc;
}
