/* SPDX-License-Identifier: MIT */
/* megascope stats over several engines (replicas.h): each engine's stats,
 * then the total. Counters add (steps, tokens, requests, the prefix cache's
 * and the control socket's figures); the prefix cache's hit rate is the
 * total's hits over its queries; TTFT, TPOT and ITL add their counts and sums
 * (the mean is exact). Quantiles: each engine measures its own on its last
 * requests' exact figures; asked with "recent", it sends those figures, and
 * the total's TTFT and TPOT quantiles are measured the same way on all of
 * them together (exact). Where an engine sends none (ITL; a server without
 * "recent"), the histograms add bucket by bucket and the total's quantiles
 * are read from them (interpolated inside a bucket, as /metrics'
 * histogram_quantile would); where the buckets differ, the total says its
 * quantiles are per engine. An engine that cannot be reached is named and
 * left out of the total (exit 1). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "megascope/json.h"
#include "megascope/telemetry.h"
#include "replicas.h"

static const char *const counters[] = {"workers", "steps", "tokens", "positions", "tasks", "stalls",
                                       "requests_finished", "requests_cancelled", "kv_pages_used", "kv_pages"};
static const char *const prefix_counters[] = {"queries", "hits", "hit_requests", "pages_cached", "evictions"};
static const char *const control_counters[] = {"accepted", "refused", "requests", "errors", "dropped", "idle_closed"};
static const char *const latencies[] = {"ttft", "tpot", "itl"};
#define N_OF(a) (sizeof a / sizeof *a)

static uint64_t u(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

static void add_counters(json_t *total, json_t *one, const char *const *keys, size_t n) {
  for (size_t i = 0; i < n; i++)
    json_object_set_new(total, keys[i], json_integer((json_int_t)(u(total, keys[i]) + u(one, keys[i]))));
}

/* The engine's histogram into h when its bounds are this build's: 0, else -1. */
static int hist_of(json_t *lat, struct ms_histogram *h) {
  json_t *hist = json_object_get(lat, "hist");
  json_t *le = json_object_get(hist, "le_s"), *c = json_object_get(hist, "counts");
  if (json_array_size(le) != MS_LAT_BUCKETS || json_array_size(c) != MS_LAT_BUCKETS + 1) return -1;
  for (size_t i = 0; i < MS_LAT_BUCKETS; i++)
    if (fabs(json_number_value(json_array_get(le, i)) - ms_latency_bounds[i]) > 1e-12) return -1;
  memset(h, 0, sizeof *h);
  for (size_t i = 0; i <= MS_LAT_BUCKETS; i++) {
    h->counts[i] = (uint64_t)json_integer_value(json_array_get(c, i));
    h->count += h->counts[i];
  }
  return 0;
}

struct lat_total {
  struct ms_histogram h;   /* the engines' buckets added */
  uint64_t count;
  double sum, min, max;
  int merged;              /* every engine in the total sent the same buckets */
  int exact;               /* every engine sent its recent figures */
  double *recent;          /* all of them, sorted once all are in */
  size_t n_recent;
  int n;                   /* engines added */
};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The engine's recent figures appended; they leave its stats (too long to print). */
static void recent_add(struct lat_total *t, json_t *lat) {
  json_t *r = json_object_get(lat, "recent_s");
  size_t n = json_array_size(r);
  double *more = json_is_array(r) ? realloc(t->recent, (t->n_recent + n + 1) * sizeof *more) : NULL;
  if (!more) {
    t->exact = 0;
    return;
  }
  t->recent = more;
  for (size_t i = 0; i < n; i++) t->recent[t->n_recent++] = json_number_value(json_array_get(r, i));
  qsort(t->recent, t->n_recent, sizeof *t->recent, cmp_double);
  json_object_del(lat, "recent_s");
}

/* Nearest rank over every engine's recent figures: the smallest value with at
 * least q of them at or below it, as each engine measures its own. */
static double recent_q(const struct lat_total *t, double q) {
  if (!t->n_recent) return 0;
  size_t rank = (size_t)ceil(q * (double)t->n_recent);
  return t->recent[rank > 0 ? rank - 1 : 0];
}

static void lat_add(struct lat_total *t, json_t *lat) {
  struct ms_histogram h;
  if (!t->n) t->merged = 1, t->exact = 1, t->min = INFINITY, t->max = 0;
  t->n++;
  if (json_object_get(lat, "recent_s")) recent_add(t, lat);
  else t->exact = 0;
  t->count += u(lat, "count");
  t->sum += json_number_value(json_object_get(lat, "sum_s"));
  json_t *mn = json_object_get(lat, "min_s"), *mx = json_object_get(lat, "max_s");
  if (mn && u(lat, "count") && json_number_value(mn) < t->min) t->min = json_number_value(mn);
  if (mx && json_number_value(mx) > t->max) t->max = json_number_value(mx);
  if (hist_of(lat, &h)) {
    t->merged = 0;
    return;
  }
  for (int i = 0; i <= MS_LAT_BUCKETS; i++) t->h.counts[i] += h.counts[i];
  t->h.count += h.count;
}

static double lat_q(const struct lat_total *t, double q) {
  if (t->exact) return recent_q(t, q);
  return t->h.count ? ms_histogram_quantile(&t->h, q) : 0;
}

static int has_q(const struct lat_total *t) { return t->exact || t->merged; }

static const char *q_from(const struct lat_total *t) {
  return t->exact ? "every engine's recent figures, together (nearest rank)"
         : t->merged ? "the engines' histograms, added (interpolated inside a bucket)"
                     : "each engine (the engines' histogram buckets differ)";
}

static void write_lat(struct ms_json *j, const char *key, const struct lat_total *t) {
  ms_json_key(j, key);
  ms_json_obj_begin(j);
  ms_json_kuint(j, "count", t->count);
  ms_json_knum(j, "sum_s", t->sum);
  ms_json_knum(j, "mean_s", t->count ? t->sum / (double)t->count : 0);
  if (has_q(t)) {
    ms_json_knum(j, "p50_s", lat_q(t, 0.5));
    ms_json_knum(j, "p90_s", lat_q(t, 0.9));
    ms_json_knum(j, "p99_s", lat_q(t, 0.99));
  }
  if (t->exact) ms_json_kuint(j, "quantiles_of", t->n_recent);
  ms_json_kstr(j, "quantiles_from", q_from(t));
  if (t->count && t->max > 0) {
    ms_json_knum(j, "min_s", t->min);
    ms_json_knum(j, "max_s", t->max);
  }
  ms_json_obj_end(j);
}

struct rep {
  const char *sock;
  json_t *stats;           /* NULL: not in the total */
  char why[512];
  const char *state;
};


static void write_json(struct rep *r, int n, int in, json_t *total, struct lat_total *lat) {
  struct ms_json j;
  ms_json_init(&j, stdout, 1);
  ms_json_obj_begin(&j);
  ms_json_kint(&j, "engines", n);
  ms_json_kint(&j, "engines_in_total", in);
  ms_json_key(&j, "replicas");
  ms_json_arr_begin(&j);
  for (int i = 0; i < n; i++) {
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "socket", r[i].sock);
    ms_json_kstr(&j, "state", r[i].state);
    ms_json_kbool(&j, "in_total", r[i].stats != NULL);
    if (r[i].why[0]) ms_json_kstr(&j, "error", r[i].why);
    if (r[i].stats) {
      json_object_del(r[i].stats, "ok");
      ms_json_key(&j, "stats");
      cli_json_emit(&j, r[i].stats);
    }
    ms_json_obj_end(&j);
  }
  ms_json_arr_end(&j);
  ms_json_key(&j, "total");
  ms_json_obj_begin(&j);
  const char *k;
  json_t *v;
  json_object_foreach(total, k, v) {
    ms_json_key(&j, k);
    cli_json_emit(&j, v);
  }
  for (size_t i = 0; i < N_OF(latencies); i++) write_lat(&j, latencies[i], &lat[i]);
  ms_json_obj_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}


static void text_lat_line(const char *what, const struct lat_total *t) {
  printf("%s  n=%llu  ", what, (unsigned long long)t->count);
  if (has_q(t))
    printf("p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  ", 1e3 * lat_q(t, 0.5), 1e3 * lat_q(t, 0.9), 1e3 * lat_q(t, 0.99));
  printf("mean %.3f ms  (", t->count ? 1e3 * t->sum / (double)t->count : 0.0);
  if (t->exact) printf("measured on the last %zu of all engines together)\n", t->n_recent);
  else printf("quantiles from %s)\n", q_from(t));
}

static void write_text(struct rep *r, int n, int in, json_t *total, struct lat_total *lat) {
  for (int i = 0; i < n; i++) {
    json_t *s = r[i].stats;
    printf("replica %s: ", r[i].sock);
    if (!s) {
      printf("%s (%s); not in the total\n", r[i].state, r[i].why);
      continue;
    }
    json_t *tt = json_object_get(s, "ttft"), *tp = json_object_get(s, "tpot");
    printf("%s, %llu workers, up %.1f s; steps %llu, tokens %llu, requests %llu finished, %llu cancelled; "
           "TTFT p50 %.3f ms p99 %.3f ms; TPOT p50 %.3f ms p99 %.3f ms\n",
           json_string_value(json_object_get(s, "model")), (unsigned long long)u(s, "workers"),
           json_number_value(json_object_get(s, "uptime_s")), (unsigned long long)u(s, "steps"),
           (unsigned long long)u(s, "tokens"), (unsigned long long)u(s, "requests_finished"),
           (unsigned long long)u(s, "requests_cancelled"), 1e3 * json_number_value(json_object_get(tt, "p50_s")),
           1e3 * json_number_value(json_object_get(tt, "p99_s")), 1e3 * json_number_value(json_object_get(tp, "p50_s")),
           1e3 * json_number_value(json_object_get(tp, "p99_s")));
  }
  if (!in) {
    printf("total of 0 of %d engines: none answered\n", n);
    return;
  }
  printf("total of %d of %d engines: %s, %llu workers\n", in, n, json_string_value(json_object_get(total, "model")),
         (unsigned long long)u(total, "workers"));
  printf("steps %llu, tokens %llu, positions %llu, tasks %llu, stalls %llu\n", (unsigned long long)u(total, "steps"),
         (unsigned long long)u(total, "tokens"), (unsigned long long)u(total, "positions"),
         (unsigned long long)u(total, "tasks"), (unsigned long long)u(total, "stalls"));
  printf("requests: %llu finished, %llu cancelled\n", (unsigned long long)u(total, "requests_finished"),
         (unsigned long long)u(total, "requests_cancelled"));
  json_t *pc = json_object_get(total, "prefix_cache");
  if (json_is_true(json_object_get(pc, "on")))
    printf("prefix cache: %.1f%% hit rate (%llu of %llu prompt tokens cached; %llu requests hit), %llu pages kept, "
           "%llu evicted\n",
           100.0 * json_number_value(json_object_get(pc, "hit_rate")), (unsigned long long)u(pc, "hits"),
           (unsigned long long)u(pc, "queries"), (unsigned long long)u(pc, "hit_requests"),
           (unsigned long long)u(pc, "pages_cached"), (unsigned long long)u(pc, "evictions"));
  else
    printf("prefix cache: off\n");
  text_lat_line("TTFT", &lat[0]);
  text_lat_line("TPOT", &lat[1]);
}

/* Adds one engine's stats into the total. */
static void add_engine(json_t *total, json_t *s, struct lat_total *lat) {
  const char *model = json_string_value(json_object_get(s, "model"));
  const char *have = json_string_value(json_object_get(total, "model"));
  if (!have) json_object_set_new(total, "model", json_string(model ? model : "?"));
  else if (!model || strcmp(have, model)) json_object_set_new(total, "model", json_string("(several models)"));
  add_counters(total, s, counters, N_OF(counters));
  json_t *pc = json_object_get(total, "prefix_cache"), *spc = json_object_get(s, "prefix_cache");
  if (json_is_true(json_object_get(spc, "on"))) json_object_set_new(pc, "on", json_true());
  add_counters(pc, spc, prefix_counters, N_OF(prefix_counters));
  uint64_t q = u(pc, "queries");
  json_object_set_new(pc, "hit_rate", json_real(q ? (double)u(pc, "hits") / (double)q : 0.0));
  add_counters(json_object_get(total, "control"), json_object_get(s, "control"), control_counters,
               N_OF(control_counters));
  for (size_t i = 0; i < N_OF(latencies); i++) lat_add(&lat[i], json_object_get(s, latencies[i]));
}

int stats_replicas(const char *const *socks, int n, int as_json) {
  struct rep *r = calloc((size_t)n, sizeof *r);
  json_t *total = json_object();
  if (!r || !total) {
    free(r);
    json_decref(total);
    return 1;
  }
  json_object_set_new(total, "prefix_cache", json_pack("{s:b}", "on", 0));
  json_object_set_new(total, "control", json_object());
  struct lat_total lat[N_OF(latencies)] = {0};
  int in = 0, rc = 0;
  for (int i = 0; i < n; i++) {
    r[i].sock = socks[i];
    for (int k = 0; k < i; k++)
      if (!strcmp(socks[k], socks[i])) {
        fprintf(stderr, "megascope stats: --socket %s is given twice (it would count twice)\n", socks[i]);
        rc = 2;
      }
  }
  static const char req[] = "{\"cmd\":\"stats\",\"recent\":true}", plain[] = "{\"cmd\":\"stats\"}";
  for (int i = 0; i < n && !rc; i++) {
    char me[600];
    snprintf(me, sizeof me, "stats (%s)", socks[i]);
    r[i].stats = cli_ctl_call(me, socks[i], req, strlen(req), 60000, NULL, NULL);
    if (!r[i].stats && strstr(cli_ctl_last_error(NULL), "\"recent\"")) /* a server without it: histograms */
      r[i].stats = cli_ctl_call(me, socks[i], plain, strlen(plain), 60000, NULL, NULL);
    if (!r[i].stats) {
      int answered;
      snprintf(r[i].why, sizeof r[i].why, "%s", cli_ctl_last_error(&answered));
      r[i].state = answered ? "refused" : "unreachable";
      continue;
    }
    r[i].state = "answering";
    add_engine(total, r[i].stats, lat);
    in++;
  }
  if (!rc) {
    if (as_json) write_json(r, n, in, total, lat);
    else write_text(r, n, in, total, lat);
    rc = in == n ? 0 : 1;
  }
  for (int i = 0; i < n; i++) json_decref(r[i].stats);
  for (size_t i = 0; i < N_OF(latencies); i++) free(lat[i].recent);
  json_decref(total);
  free(r);
  return rc;
}
