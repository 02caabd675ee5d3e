/* SPDX-License-Identifier: MIT */
/* megascope explain's report, as text for an operator or one JSON object. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "explain_cli.h"
#include "megascope/json.h"

static double num(double v) { return isnan(v) || isinf(v) ? NAN : v; }

static void slo_line(const struct explain_args *a, const struct explain_window *w) {
  double slo_ms = (double)a->slo_ns / 1e6;
  if (w->finished)
    printf("SLO: TPOT %.3f ms over %llu requests finished in the window, objective %.3f ms: %s\n", w->tpot_ms,
           (unsigned long long)w->finished, slo_ms, w->tpot_ms > slo_ms ? "MISSED" : "met");
  else
    printf("SLO: no request finished in the window (objective %.3f ms)\n", slo_ms);
}

static long long cov(const struct explain_window *w, const char *k) {
  return json_integer_value(json_object_get(w->coverage, k));
}

static const struct explain_evidence *evidence_of(const struct explain_window *w, int culprit) {
  for (int i = 0; i < w->n_ev; i++)
    if (w->ev[i].culprit == culprit) return &w->ev[i];
  return NULL;
}

static void evidence_text(const struct explain_evidence *ev) {
  if (ev->ended) {
    printf("     evidence: none: the request ended before the capture (its slot now serves generation %lld); "
           "the window's figures above are what there is of it\n", (long long)ev->later_gen);
    return;
  }
  if (!ev->n) {
    printf("     evidence: no task of it ran while the capture was attached\n");
    return;
  }
  printf("     evidence: %zu records (%llu bytes): task time p50 %.0f ns, p99 %.0f ns, max %.0f ns", ev->n,
         (unsigned long long)ev->bytes, ev->p50_ns, ev->p99_ns, ev->max_ns);
  if (!isnan(ev->mean_ctx)) printf("; mean context %.0f", ev->mean_ctx);
  else printf("; mean wait %.0f ns", ev->mean_wait_ns);
  printf("; on %d worker%s; coverage eligible %llu, executed %llu, lost %llu\n", ev->n_workers,
         ev->n_workers == 1 ? "" : "s", (unsigned long long)ev->eligible, (unsigned long long)ev->executed,
         (unsigned long long)ev->lost);
  int req = !isnan(ev->mean_ctx);
  printf("     %8s %6s %10s %12s %12s %10s\n", "step", "worker", "task", "task_ns", req ? "ctx_len" : "ready_ns",
         "wait_ns");
  size_t i;
  json_t *r;
  json_array_foreach(ev->first, i, r) {
    /* ready: from the firing to the begin, signed (the two clocks' stores can cross) */
    long long fifth = req ? json_integer_value(json_array_get(r, 4))
                          : json_integer_value(json_array_get(r, 4)) - json_integer_value(json_array_get(r, 5));
    printf("     %8lld %6lld %10lld %12lld %12lld %10lld\n", json_integer_value(json_array_get(r, 0)),
           json_integer_value(json_array_get(r, 1)), json_integer_value(json_array_get(r, 2)),
           json_integer_value(json_array_get(r, 3)), fifth, json_integer_value(json_array_get(r, 6)));
  }
}

/* The strongest parts that were not named, for a "none" answer. */
static void strongest_text(const struct explain_window *w) {
  const struct ms_explain_result *r = &w->res;
  int best = -1;
  for (int i = 0; i < w->n_cls; i++)
    if (!isnan(r->cls[i].z) && (best < 0 || r->cls[i].z > r->cls[best].z)) best = i;
  if (best >= 0)
    printf("  the strongest class: %s, %.2fx its peers (z %.1f)\n", w->cls[best].name, exp(r->cls[best].effect),
           r->cls[best].z);
  int bw = -1;
  for (int i = 0; i < w->n_workers; i++)
    if (!isnan(r->worker[i].z) && (bw < 0 || r->worker[i].z > r->worker[bw].z)) bw = i;
  if (bw >= 0 && w->n_workers > 1)
    printf("  the strongest worker: %d, %.2fx the others on the same classes (z %.1f)\n", bw, exp(r->worker[bw].effect),
           r->worker[bw].z);
}

void explain_report_text(const struct explain_args *a, const struct explain_window *w) {
  const struct ms_explain_result *r = &w->res;
  slo_line(a, w);
  printf("summary: %.1f s, %.0f steps, %d classes, %d workers, %d requests; %d slices; class peers' scatter "
         "%.1f%%; workers waited %.1f%% of the window for a CPU\n",
         w->window_ns / 1e9, w->steps, w->n_cls, w->n_workers, w->n_req, w->slices, 100 * r->class_noise,
         100 * r->runqueue_share);
  if (a->n_baseline) {
    printf("         classes held against where they stood in ");
    for (int f = 0; f < a->n_baseline; f++) printf("%s%s", f ? ", " : "", a->baseline[f]);
    printf(" (%d of them%s)\n", w->n_base,
           a->n_baseline > 1 ? ": their median, how far they differed added to the noise" : "");
  }
  if (w->rank_workers)  /* across ranks: the workers are every rank's, numbered rank after rank */
    printf("         %d ranks of %d workers: worker n is rank n / %d's worker n %% %d\n", w->n_workers / w->rank_workers,
           w->rank_workers, w->rank_workers, w->rank_workers);
  printf("         coverage eligible %lld, executed %lld, throttled %lld, lost %lld; %llu keys read (%llu bytes)%s\n",
         cov(w, "eligible"), cov(w, "executed"), cov(w, "throttled"), cov(w, "lost"),
         (unsigned long long)w->summary_keys, (unsigned long long)w->summary_bytes,
         w->dropped ? "; some keys did not fit their map (dropped)" : "");
  if (!r->n_culprits) {
    printf("culprits: none stands %.0f scatters above its peers (confidence %.2f)\n", MS_EXPLAIN_Z, r->none_confidence);
    strongest_text(w);
  } else {
    printf("culprits: %d\n", r->n_culprits);
    if (r->n_set_aside)
      printf("         (classes and layers judged without the %d worker%s named: their own trouble is theirs)\n",
             r->n_set_aside, r->n_set_aside > 1 ? "s" : "");
  }
  for (int i = 0; i < r->n_culprits; i++) {
    const struct ms_explain_culprit *c = &r->culprits[i];
    const char *kind = ms_explain_kind_name(c->kind);
    int named = !strncmp(c->name, kind, strlen(kind));  /* "worker 1 (CPU 1)" says its kind */
    printf("  %d. %s%s%s: %s, %.2fx, z %.1f, %+.0f ns per step, confidence %.2f\n", i + 1, named ? "" : kind,
           named ? "" : " ", c->name, c->cause, c->ratio, c->z, c->excess_ns_per_step, c->confidence);
    printf("     %s\n", c->why);
    const struct explain_evidence *ev = evidence_of(w, i);
    if (ev) evidence_text(ev);
  }
  printf("cost: the summary's maps are read in place (%llu bytes); the evidence moved %llu bytes\n",
         (unsigned long long)w->summary_bytes, (unsigned long long)w->evidence_bytes);
}

/* ---- JSON ---- */

static void effect_json(struct ms_json *j, const struct ms_explain_effect *e) {
  ms_json_knum(j, "ratio", num(exp(e->effect)));
  ms_json_knum(j, "z", num(e->z));
  ms_json_knum(j, "noise", num(e->noise));
  ms_json_knum(j, "tasks", e->n);
  ms_json_kint(j, "peers", e->peers);
  ms_json_knum(j, "excess_ns_per_step", num(e->excess_ns));
}

static void evidence_json(struct ms_json *j, const struct explain_evidence *ev) {
  ms_json_key(j, "evidence");
  if (!ev) {
    ms_json_null(j);
    return;
  }
  ms_json_obj_begin(j);
  ms_json_kstr(j, "query", ev->query);
  ms_json_kuint(j, "records", ev->n);
  ms_json_kuint(j, "bytes", ev->bytes);
  ms_json_kbool(j, "ended", ev->ended);  /* a request gone before the capture: no record could come */
  ms_json_knum(j, "task_ns_p50", num(ev->p50_ns));
  ms_json_knum(j, "task_ns_p99", num(ev->p99_ns));
  ms_json_knum(j, "wait_ns_mean", num(ev->mean_wait_ns));
  ms_json_knum(j, "ctx_mean", num(ev->mean_ctx));
  ms_json_kint(j, "workers", ev->n_workers);
  ms_json_key(j, "coverage");
  ms_json_obj_begin(j);
  ms_json_kuint(j, "eligible", ev->eligible);
  ms_json_kuint(j, "executed", ev->executed);
  ms_json_kuint(j, "lost", ev->lost);
  ms_json_obj_end(j);
  ms_json_obj_end(j);
}

static void culprits_json(struct ms_json *j, const struct explain_window *w) {
  const struct ms_explain_result *r = &w->res;
  ms_json_key(j, "culprit");  /* the first, for one-line scripts */
  if (r->n_culprits) ms_json_str(j, r->culprits[0].name);
  else ms_json_null(j);
  ms_json_key(j, "culprits");
  ms_json_arr_begin(j);
  for (int i = 0; i < r->n_culprits; i++) {
    const struct ms_explain_culprit *c = &r->culprits[i];
    ms_json_obj_begin(j);
    ms_json_kstr(j, "kind", ms_explain_kind_name(c->kind));
    ms_json_kint(j, "id", c->id);
    ms_json_kstr(j, "name", c->name);
    ms_json_kstr(j, "cause", c->cause);
    ms_json_knum(j, "ratio", num(c->ratio));
    ms_json_knum(j, "z", num(c->z));
    ms_json_knum(j, "confidence", c->confidence);
    ms_json_knum(j, "excess_ns_per_step", num(c->excess_ns_per_step));
    ms_json_kstr(j, "why", c->why);
    evidence_json(j, evidence_of(w, i));
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  ms_json_knum(j, "none_confidence", r->none_confidence);
}

static void parts_json(struct ms_json *j, const struct explain_window *w) {
  const struct ms_explain_result *r = &w->res;
  ms_json_key(j, "classes");
  ms_json_arr_begin(j);
  for (int i = 0; i < w->n_cls; i++) {
    ms_json_obj_begin(j);
    ms_json_kstr(j, "class", w->cls[i].name);
    ms_json_kstr(j, "op", w->cls[i].op);
    ms_json_kint(j, "layer", w->cls[i].layer);
    ms_json_knum(j, "work_bytes", w->cls[i].work_bytes);
    effect_json(j, &r->cls[i]);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  ms_json_key(j, "layers");
  ms_json_arr_begin(j);
  for (int l = 0; l < r->n_layers; l++) {
    ms_json_obj_begin(j);
    ms_json_kint(j, "layer", l);
    effect_json(j, &r->layer[l]);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  ms_json_key(j, "workers");
  ms_json_arr_begin(j);
  for (int i = 0; i < w->n_workers; i++) {
    double rq = 0, wall = 0, pre = 0, ran = 0;
    for (int s = 0; s < w->n_os; s++) {
      const struct ms_explain_os *o = &w->os[(size_t)s * (size_t)w->n_workers + (size_t)i];
      if (o->known) rq += o->runqueue_ns, wall += o->wall_ns, pre += o->preempted, ran += o->run_ns;
    }
    ms_json_obj_begin(j);
    ms_json_kint(j, "worker", i);
    ms_json_kint(j, "device", w->device[i]);
    ms_json_kint(j, "pinned_cpu", w->os[i].pinned_cpu);
    ms_json_knum(j, "runqueue_share", wall > 0 ? rq / wall : NAN);
    ms_json_knum(j, "run_share", wall > 0 ? ran / wall : NAN);
    ms_json_knum(j, "preempted", pre);
    effect_json(j, &r->worker[i]);
    if (r->queue) {  /* its share of the plan's AOT tasks against an even share (a saturated queue) */
      ms_json_key(j, "queue");
      ms_json_obj_begin(j);
      effect_json(j, &r->queue[i]);
      ms_json_obj_end(j);
    }
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  if (r->n_devices > 1) {  /* tensor parallel: each device, its tasks and its shares against the others' */
    ms_json_key(j, "devices");
    ms_json_arr_begin(j);
    for (int d = 0; d < r->n_devices; d++) {
      ms_json_obj_begin(j);
      ms_json_kint(j, "device", d);
      effect_json(j, &r->device[d]);
      ms_json_key(j, "shares");
      ms_json_obj_begin(j);
      effect_json(j, &r->share[d]);
      ms_json_obj_end(j);
      ms_json_obj_end(j);
    }
    ms_json_arr_end(j);
  }
  ms_json_key(j, "requests");
  ms_json_arr_begin(j);
  for (int i = 0; i < w->n_req; i++) {
    ms_json_obj_begin(j);
    ms_json_kuint(j, "slot", w->req[i].slot);
    ms_json_kuint(j, "gen", w->req[i].gen);
    ms_json_knum(j, "ctx", w->req[i].n > 0 ? w->req[i].ctx_sum / w->req[i].n : NAN);
    ms_json_knum(j, "ctx_max", w->req[i].ctx_max);
    effect_json(j, &r->request[i]);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
}

void explain_report_json(const struct explain_args *a, const struct explain_window *w) {
  struct ms_json j;
  ms_json_init(&j, stdout, 1);
  ms_json_obj_begin(&j);
  ms_json_key(&j, "slo");
  ms_json_obj_begin(&j);
  ms_json_knum(&j, "tpot_objective_ms", (double)a->slo_ns / 1e6);
  ms_json_knum(&j, "tpot_ms", w->finished ? w->tpot_ms : NAN);
  ms_json_kuint(&j, "requests_finished", w->finished);
  ms_json_kbool(&j, "missed", w->finished && w->tpot_ms * 1e6 > (double)a->slo_ns);
  ms_json_obj_end(&j);
  ms_json_knum(&j, "window_s", w->window_ns / 1e9);
  ms_json_knum(&j, "steps", w->steps);
  ms_json_kint(&j, "slices", w->slices);
  if (w->rank_workers) ms_json_kint(&j, "rank_workers", w->rank_workers);  /* worker n: rank n / it, worker n % it */
  if (a->n_baseline) {  /* the classes' ratios below are then against where they stood there */
    ms_json_key(&j, "baseline");
    ms_json_arr_begin(&j);
    for (int f = 0; f < a->n_baseline; f++) ms_json_str(&j, a->baseline[f]);
    ms_json_arr_end(&j);
    ms_json_kint(&j, "baseline_classes", w->n_base);
  }
  ms_json_knum(&j, "class_noise", w->res.class_noise);
  ms_json_knum(&j, "runqueue_share", w->res.runqueue_share);
  /* the workers named, whose cells the class and layer judgement left out */
  ms_json_key(&j, "classes_without_workers");
  ms_json_arr_begin(&j);
  for (int i = 0; w->res.set_aside && i < w->n_workers; i++)
    if (w->res.set_aside[i]) ms_json_int(&j, i);
  ms_json_arr_end(&j);
  ms_json_key(&j, "summary_coverage");
  ms_json_obj_begin(&j);
  const char *k;
  json_t *v;
  json_object_foreach(w->coverage, k, v) ms_json_kint(&j, k, json_integer_value(v));
  ms_json_obj_end(&j);
  ms_json_kuint(&j, "summary_keys", w->summary_keys);
  ms_json_kuint(&j, "summary_bytes", w->summary_bytes);
  ms_json_kuint(&j, "dropped_keys", w->dropped);
  ms_json_kuint(&j, "evidence_bytes", w->evidence_bytes);
  culprits_json(&j, w);
  parts_json(&j, w);
  ms_json_obj_end(&j);
  ms_json_end(&j);
}
