/* SPDX-License-Identifier: MIT */
/* The engine's metrics in the Prometheus text exposition format 0.0.4: one
 * uninterrupted group per family, HELP and TYPE before its samples, histograms
 * with cumulative le buckets ending at +Inf (= _count), _sum and _count, label
 * values escaped. Counters come from counters that never go down (coverage is
 * one series per generation, so a replace starts new series instead of
 * changing what an old one counted). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/export.h"
#include "megascope/attach.h"
#include "megascope/telemetry.h"

void ms_prometheus_family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s ", name);
  for (const char *p = help; *p; p++) {
    if (*p == '\\')
      fputs("\\\\", f);
    else if (*p == '\n')
      fputs("\\n", f);
    else
      fputc(*p, f);
  }
  fprintf(f, "\n# TYPE %s %s\n", name, type);
}

void ms_prometheus_label_value(FILE *f, const char *v) {
  fputc('"', f);
  for (const char *p = v; *p; p++) {
    if (*p == '\\')
      fputs("\\\\", f);
    else if (*p == '"')
      fputs("\\\"", f);
    else if (*p == '\n')
      fputs("\\n", f);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

static void counter(FILE *f, const char *name, const char *help, uint64_t v) {
  ms_prometheus_family(f, name, "counter", help);
  fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

void ms_prometheus_histogram_n(FILE *f, const char *name, const char *help, const char *labels,
                               const double *bounds, int n, const uint64_t *counts, double sum) {
  ms_prometheus_family(f, name, "histogram", help);
  const char *sep = labels && labels[0] ? "," : "";
  if (!labels) labels = "";
  uint64_t cum = 0;
  for (int i = 0; i < n; i++) {
    cum += counts[i];
    fprintf(f, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, bounds[i], (unsigned long long)cum);
  }
  cum += counts[n];
  /* +Inf must equal _count: derive both from the buckets of one snapshot */
  fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
  fprintf(f, labels[0] ? "%s_sum{%s} %.9g\n" : "%s_sum%s %.9g\n", name, labels, sum);
  fprintf(f, labels[0] ? "%s_count{%s} %llu\n" : "%s_count%s %llu\n", name, labels, (unsigned long long)cum);
}

void ms_prometheus_histogram(FILE *f, const char *name, const char *help, const struct ms_histogram *h) {
  ms_prometheus_histogram_n(f, name, help, "", ms_latency_bounds, MS_LAT_BUCKETS, h->counts, h->sum);
}

/* Whether a sample's metric name (len bytes) begins with one of families (NULL: every name does). */
static int in_families(const char *name, size_t len, const char *const *families) {
  if (!families) return 1;
  for (; *families; families++)
    if (strlen(*families) <= len && !memcmp(name, *families, strlen(*families))) return 1;
  return 0;
}

int ms_prometheus_relabel(const char *page, size_t len, const char *label, const char *value,
                          const char *const *families, FILE *out) {
  char have[80];
  snprintf(have, sizeof have, "%s=\"", label);
  for (size_t at = 0; at < len;) {
    const char *l = page + at, *nl = memchr(l, '\n', len - at);
    size_t n = nl ? (size_t)(nl - l) + 1 : len - at;
    at += n;
    size_t name = strcspn(l, "{ \n");  /* a metric name has neither */
    if (l[0] == '#' || n < 2 || name >= n || !in_families(l, name, families) || memmem(l, n, have, strlen(have))) {
      fwrite(l, 1, n, out);
      continue;
    }
    fwrite(l, 1, name, out);
    fprintf(out, "{%s=", label);
    ms_prometheus_label_value(out, value);
    if (l[name] == '{') {
      fputc(l[name + 1] == '}' ? '}' : ',', out);
      name += l[name + 1] == '}' ? 2 : 1;
    } else {
      fputc('}', out);
    }
    fwrite(l + name, 1, n - name, out);
  }
  return ferror(out) ? -EIO : 0;
}

/* One family over the per-class aggregate: field 0 tasks, 1 task_ns, 2 queue_ns, 3 wait_ns. */
static void class_family(FILE *f, const char *name, const char *help, const char *label,
                         const struct ms_class_stat *s, int n, int field) {
  ms_prometheus_family(f, name, "counter", help);
  for (int i = 0; i < n; i++) {
    fprintf(f, "%s{%s=", name, label);
    ms_prometheus_label_value(f, s[i].name ? s[i].name : "?");
    if (field == 0)
      fprintf(f, "} %llu\n", (unsigned long long)s[i].tasks);
    else {
      uint64_t ns = field == 1 ? s[i].task_ns : field == 2 ? s[i].queue_ns : s[i].wait_ns;
      fprintf(f, "} %.9g\n", (double)ns / 1e9);
    }
  }
}

static int write_classes(struct ms_engine *e, FILE *f) {
  int n = ms_engine_class_stats(e, NULL, 0), ne = ms_engine_event_class_stats(e, NULL, 0);
  struct ms_class_stat *s = calloc((size_t)(n > ne ? n : ne) + 1, sizeof *s);
  if (!s) return -ENOMEM;
  n = ms_engine_class_stats(e, s, n);
  class_family(f, "megascope_class_tasks_total", "Tasks run, per task class (always-on aggregate).", "class", s, n, 0);
  class_family(f, "megascope_class_task_seconds_total", "Task time (begin to end), per task class.", "class", s, n,
               1);
  class_family(f, "megascope_class_queue_seconds_total", "Queueing time (ready to begin), per task class.", "class",
               s, n, 2);
  class_family(f, "megascope_class_dep_wait_seconds_total",
               "Time workers waited for the events of this class's tasks (dependency wait).", "class", s, n, 3);
  ne = ms_engine_event_class_stats(e, s, ne);
  class_family(f, "megascope_event_class_tasks_total", "Tasks that waited on an event of this event class.",
               "event_class", s, ne, 0);
  class_family(f, "megascope_event_class_dep_wait_seconds_total",
               "Time workers waited on events of this event class.", "event_class", s, ne, 3);
  free(s);
  return 0;
}

/* One series per generation an attachment still holds: a replace starts new
 * series (labels id, generation, monitor: the generation's own monitor), so a
 * new generation's counts never appear under an old generation's labels and
 * each series only grows. A generation freed after its retention ends its
 * series. */
struct gen_row {
  int id;
  uint32_t generation;
  char name[64];
  struct ms_coverage cov;
};

/* Coverage counter k of c, in the order of the families below: eligible,
 * executed, throttled, lost, failed. */
static uint64_t cov_value(const struct ms_coverage *c, int k) {
  return k == 0 ? c->eligible : k == 1 ? c->executed : k == 2 ? c->throttled : k == 3 ? c->lost : c->failed;
}

static void gen_labels(FILE *f, const char *family, int id, uint32_t generation, const char *monitor) {
  fprintf(f, "%s{id=\"%d\",generation=\"%u\",monitor=", family, id, generation);
  ms_prometheus_label_value(f, monitor);
  fputs("} ", f);
}

/* Across ranks: each attachment's coverage on each rank (its current
 * generation: a replace starts it again on every rank), rank 0's live and the
 * others' as read at a step boundary now; the per-generation series above are
 * rank 0's own. Nothing in one process. */
static void write_attachment_ranks(struct ms_engine *e, FILE *f, const struct ms_attach_info *a, int n) {
  int ranks = ms_engine_ranks(e);
  if (ranks < 2 || !n || ms_engine_ranks_sync(e)) return;
  static const struct {
    const char *name, *help;
    int k;  /* cov_value's counter */
  } fam[] = {
      {"megascope_attachment_rank_eligible_total", "Hook firings while attached on one rank (across ranks).", 0},
      {"megascope_attachment_rank_executed_total", "Monitor program runs on one rank (across ranks).", 1},
      {"megascope_attachment_rank_lost_total", "Ring-buffer records dropped on one rank (across ranks).", 3},
  };
  for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
    ms_prometheus_family(f, fam[k].name, "counter", fam[k].help);
    for (int i = 0; i < n; i++)
      for (int r = 0; r < ranks; r++) {
        struct ms_coverage c;
        if (ms_engine_ranks_coverage(e, a[i].id, r, &c)) continue;  /* not carried there, or not read yet */
        fprintf(f, "%s{id=\"%d\",monitor=", fam[k].name, a[i].id);
        ms_prometheus_label_value(f, a[i].name);
        fprintf(f, ",rank=\"%d\"} %llu\n", r, (unsigned long long)cov_value(&c, fam[k].k));
      }
  }
}

static int write_attachments(struct ms_engine *e, FILE *f) {
  int n, n_rows = 0, cap = 0;
  struct ms_attach_info *a = ms_engine_attach_list_all(e, &n);
  if (!a) return -ENOMEM;
  for (int i = 0; i < n; i++) cap += (int)(a[i].cov.generation - a[i].first_generation + 1);
  struct gen_row *rows = calloc((size_t)cap + 1, sizeof *rows);
  if (!rows) {
    free(a);
    return -ENOMEM;
  }
  for (int i = 0; i < n; i++)
    for (uint32_t g = a[i].first_generation; g <= a[i].cov.generation; g++) {
      struct gen_row *row = &rows[n_rows];
      if (ms_engine_attach_generation(e, a[i].id, g, row->name, sizeof row->name, &row->cov)) continue;
      row->id = a[i].id;
      row->generation = g;
      n_rows++;
    }
  static const struct {
    const char *name, *help;
  } fam[] = {
      {"megascope_attachment_eligible_total", "Hook firings while attached (coverage denominator), per generation."},
      {"megascope_attachment_executed_total", "Monitor program runs, per generation."},
      {"megascope_attachment_throttled_total", "Firings skipped by the budget or the sampling, per generation."},
      {"megascope_attachment_lost_total", "Ring-buffer records dropped (full or over budget), per generation."},
      {"megascope_attachment_failed_total", "Program runs stopped by an error, per generation."},
  };
  for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
    ms_prometheus_family(f, fam[k].name, "counter", fam[k].help);
    for (int i = 0; i < n_rows; i++) {
      gen_labels(f, fam[k].name, rows[i].id, rows[i].generation, rows[i].name);
      fprintf(f, "%llu\n", (unsigned long long)cov_value(&rows[i].cov, (int)k));
    }
  }
  /* gauges of the current generation */
  ms_prometheus_family(f, "megascope_attachment_generation", "gauge", "Current program generation (grows on replace).");
  for (int i = 0; i < n; i++) {
    gen_labels(f, "megascope_attachment_generation", a[i].id, a[i].cov.generation, a[i].name);
    fprintf(f, "%u\n", a[i].cov.generation);
  }
  ms_prometheus_family(f, "megascope_attachment_attached", "gauge",
                       "1 while attached, 0 once detached (until freed after its retention).");
  for (int i = 0; i < n; i++) {
    gen_labels(f, "megascope_attachment_attached", a[i].id, a[i].cov.generation, a[i].name);
    fprintf(f, "%d\n", a[i].attached ? 1 : 0);
  }
  ms_prometheus_family(f, "megascope_attachment_jitted_programs", "gauge",
                       "Programs of the current generation running as JIT-compiled native code (the rest interpreted).");
  for (int i = 0; i < n; i++) {
    gen_labels(f, "megascope_attachment_jitted_programs", a[i].id, a[i].cov.generation, a[i].name);
    fprintf(f, "%u\n", a[i].n_jitted);
  }
  write_attachment_ranks(e, f, a, n);
  free(rows);
  free(a);
  return 0;
}

/* Across ranks (rank 0 serves /metrics for the whole engine): every rank's
 * tasks, stalls and workers into st's, and one series a rank of each beside
 * (rank="r"); the other counters are already the whole engine's (rank 0
 * decides its steps, tokens and requests). Nothing in one process. */
static void write_ranks(struct ms_engine *e, FILE *f, struct ms_engine_stats *st) {
  int n = ms_engine_ranks(e);
  if (n < 2 || ms_engine_ranks_read_stats(e)) return;
  struct ms_engine_stats rs[64];
  struct ms_comm_stats cs[64];
  int nw[64];
  for (int r = 0; r < n && r < 64; r++) nw[r] = ms_engine_rank_stats(e, r, &rs[r], &cs[r], NULL, 0);
  static const char *const name[] = {"megascope_rank_tasks_total", "megascope_rank_workers",
                                     "megascope_rank_comm_received_total", "megascope_rank_comm_wait_seconds_total"};
  static const char *const help[] = {"Tasks executed on one rank of an engine across ranks.",
                                     "Worker threads of one rank.",
                                     "Shares of other ranks received by one rank's communication tasks.",
                                     "Time one rank's workers waited for other ranks' shares."};
  static const char *const type[] = {"counter", "gauge", "counter", "counter"};
  for (int k = 0; k < 4; k++) {
    ms_prometheus_family(f, name[k], type[k], help[k]);
    for (int r = 0; r < n && r < 64; r++) {
      if (nw[r] < 0) continue;
      fprintf(f, "%s{rank=\"%d\"} ", name[k], r);
      if (k == 3) fprintf(f, "%.9f\n", (double)cs[r].wait_ns / 1e9);
      else
        fprintf(f, "%llu\n", (unsigned long long)(k == 0 ? rs[r].tasks : k == 1 ? (uint64_t)nw[r] : cs[r].received));
    }
  }
  st->tasks = st->stalls = 0;
  st->n_workers = 0;
  for (int r = 0; r < n && r < 64; r++)
    if (nw[r] >= 0) st->tasks += rs[r].tasks, st->stalls += rs[r].stalls, st->n_workers += nw[r];
}

int ms_prometheus_write_engine(struct ms_engine *e, FILE *f) {
  struct ms_engine_stats st;
  struct ms_latency_stats lat;
  ms_engine_get_stats(e, &st);
  ms_engine_latency(e, &lat);
  write_ranks(e, f, &st);
  ms_prometheus_histogram(f, "megascope_ttft_seconds", "Time to first token (submit to first generated token).", &lat.ttft);
  ms_prometheus_histogram(f, "megascope_tpot_seconds", "Time per output token after the first, per request.", &lat.tpot);
  counter(f, "megascope_requests_finished_total", "Requests finished.", lat.requests_finished);
  counter(f, "megascope_requests_cancelled_total", "Requests cancelled.", lat.requests_cancelled);
  counter(f, "megascope_steps_total", "Decode steps run.", st.steps);
  counter(f, "megascope_tokens_generated_total", "Tokens generated (prompt positions excluded).", st.tokens);
  counter(f, "megascope_positions_total", "Rows processed, prompt positions included.", st.positions);
  counter(f, "megascope_tasks_total", "Tasks executed (across ranks: on every rank).", st.tasks);
  counter(f, "megascope_stalls_total", "Stalls reported by the watchdog (across ranks: on every rank).", st.stalls);
  ms_prometheus_histogram(f, "megascope_inter_token_latency_seconds",
                          "Time between a request's successive tokens, per token after its first.", &lat.itl);
  counter(f, "megascope_num_preemptions_total",
          "Running requests put back in the queue for room (none: the KV pool holds every slot's context).",
          st.preemptions);
  counter(f, "megascope_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          st.prefix_queries);
  counter(f, "megascope_prefix_cache_hits_total", "Prompt tokens found in the prefix cache (not computed).",
          st.prefix_hits);
  counter(f, "megascope_prefix_cache_hit_requests_total", "Requests that found at least one cached page.",
          st.prefix_hit_requests);
  counter(f, "megascope_prefix_cache_evictions_total", "Cached KV pages evicted for room.", st.prefix_evictions);
  ms_prometheus_family(f, "megascope_prefix_cache_pages", "gauge",
                       "KV pages the prefix cache keeps that no request holds (evictable).");
  fprintf(f, "megascope_prefix_cache_pages %d\n", st.prefix_pages_cached);
  ms_prometheus_family(f, "megascope_workers", "gauge",
                       "Worker threads (the engine's SMs; across ranks: every rank's).");
  fprintf(f, "megascope_workers %d\n", st.n_workers);
  int rc = write_classes(e, f);
  if (!rc) rc = write_attachments(e, f);
  return rc ? rc : ferror(f) ? -EIO : 0;
}
