/* SPDX-License-Identifier: MIT */
/* The engine's monitor API: attach, replace, detach and read-outs, over the
 * hook table (src/hook/). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/attach.h"
#include "megascope/plan_ir.h"
#include "megascope/bpf/megascope.h"
#include "megascope/json.h"
#include "runtime/runtime_impl.h"

/* The monitor header's kernel ids are the engine's task bodies. */
#define SAME_OP(x) ((int)MS_OP_##x == (int)MS_K_##x)
_Static_assert(SAME_OP(STEP_START) && SAME_OP(EMBED) && SAME_OP(RMSNORM) && SAME_OP(QKV) && SAME_OP(ROPE) &&
               SAME_OP(ATTN) && SAME_OP(WO) && SAME_OP(SWIGLU) && SAME_OP(DOWN) &&
               SAME_OP(ROUTER) && SAME_OP(EXPERT_UP) && SAME_OP(EXPERT_DOWN) &&
               SAME_OP(MOE_COMBINE) && SAME_OP(LM_HEAD) && SAME_OP(SAMPLE) && SAME_OP(EMPTY) &&
               SAME_OP(COMM) && SAME_OP(COUNT),
               "include/megascope/bpf/megascope.h enum ms_op must match include/megascope/plan_ir.h enum ms_kernel");
#undef SAME_OP

/* A monitor compiled against another plan's class ids is refused (ms_monitor_check_schema). */
static int same_schema(struct ms_engine *e, const struct ms_monitor *m, struct ms_textbuf *log) {
  uint64_t d[2];
  ms_plan_schema_digest(ms_engine_plan(e, 1), d);
  return ms_monitor_check_schema(m, d, log);
}

int ms_engine_attach(struct ms_engine *e, struct ms_monitor *m, const struct ms_attach_opts *o,
                     struct ms_textbuf *log) {
  if (!m) return -EINVAL;
  if (same_schema(e, m, log)) return -EINVAL;
  return ms_hook_attach(e->hooks, m, o, log);
}

int ms_engine_replace(struct ms_engine *e, int id, struct ms_monitor *m, struct ms_textbuf *log) {
  if (!m) return -EINVAL;
  if (same_schema(e, m, log)) return -EINVAL;
  return ms_hook_replace(e->hooks, id, m, NULL, log);
}

int ms_engine_replace_opts(struct ms_engine *e, int id, struct ms_monitor *m, const struct ms_attach_opts *o,
                           struct ms_textbuf *log) {
  if (!m) return -EINVAL;
  if (same_schema(e, m, log)) return -EINVAL;
  return ms_hook_replace(e->hooks, id, m, o, log);
}

int ms_engine_detach(struct ms_engine *e, int id) { return ms_hook_detach(e->hooks, id); }

void ms_engine_set_hooks_enabled(struct ms_engine *e, int on) {
  /* a backend that runs the monitors itself keeps the table's sites off */
  if (e->hooks->runner.take) on = 0;
  atomic_store_explicit(&e->hooks_on, on, memory_order_relaxed);
}

int ms_engine_attach_sync(struct ms_engine *e, int id) { return ms_hook_sync(e->hooks, id); }

static void info_of(struct ms_engine *e, const struct attachment *a, struct ms_attach_info *out) {
  memset(out, 0, sizeof *out);
  out->id = a->id;
  out->attached = a->attached;
  snprintf(out->name, sizeof out->name, "%s", a->cur->mon->name);
  for (int i = 0; i < a->cur->mon->n_progs; i++) out->hooks |= 1u << a->cur->mon->hook[i];
  ms_hook_coverage(e->hooks, a->cur, &out->cov);
  out->opts = a->opts;
  out->n_progs = (uint32_t)a->cur->mon->n_progs;
  out->n_jitted = (uint32_t)a->cur->n_jitted;
  const struct ms_gen *g = a->cur;
  while (g->prev) g = g->prev;
  out->first_generation = g->generation;
}

int ms_engine_attach_list(struct ms_engine *e, struct ms_attach_info *out, int max) {
  struct ms_hook_table *t = e->hooks;
  pthread_mutex_lock(&t->mu);
  int n = t->n_atts < max ? t->n_atts : max;
  for (int i = 0; i < n; i++) info_of(e, t->atts[i], &out[i]);
  pthread_mutex_unlock(&t->mu);
  return n;
}

int ms_engine_attach_count(struct ms_engine *e) { return ms_hook_count(e->hooks); }

struct ms_attach_info *ms_engine_attach_list_all(struct ms_engine *e, int *n) {
  struct ms_hook_table *t = e->hooks;
  pthread_mutex_lock(&t->mu);
  struct ms_attach_info *out = malloc(sizeof *out * (size_t)(t->n_atts + 1));
  if (out)
    for (int i = 0; i < t->n_atts; i++) info_of(e, t->atts[i], &out[i]);
  *n = out ? t->n_atts : 0;
  pthread_mutex_unlock(&t->mu);
  if (!out) errno = ENOMEM;
  return out;
}

void ms_engine_set_detached_retention(struct ms_engine *e, uint64_t ns) {
  pthread_mutex_lock(&e->hooks->mu);
  e->hooks->retention_ns = ns;
  pthread_mutex_unlock(&e->hooks->mu);
}

int ms_engine_attach_reap(struct ms_engine *e) {
  int n = ms_hook_reap(e->hooks, ms_now_ns());
  ms_rt_ranks_reap(e);  /* what rank 0 read of the other ranks goes with its own */
  return n;
}

int ms_engine_set_attach_budget(struct ms_engine *e, const struct ms_attach_budget *b) {
  if (b && (b->sz < sizeof(size_t) || b->max_retained < 0 || b->max_fds < 0)) return -EINVAL;
  ms_hook_set_budget(e->hooks, b);
  return 0;
}

void ms_engine_attach_usage(struct ms_engine *e, struct ms_attach_usage *out) { ms_hook_usage(e->hooks, out); }

int ms_engine_attach_release(struct ms_engine *e, int id) {
  int rc = ms_hook_release(e->hooks, id);
  ms_rt_ranks_reap(e);
  return rc;
}

int ms_engine_attach_generation(struct ms_engine *e, int id, uint32_t generation, char *name, size_t name_size,
                                struct ms_coverage *out) {
  struct ms_hook_table *t = e->hooks;
  pthread_mutex_lock(&t->mu);
  struct attachment *a = ms_hook_find(t, id);
  int rc = -ENOENT;
  for (struct ms_gen *g = a ? a->cur : NULL; g; g = g->prev)
    if (!generation || g->generation == generation) {
      if (out) ms_hook_coverage(t, g, out);
      if (name && name_size) snprintf(name, name_size, "%s", g->mon->name);
      rc = 0;
      break;
    }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int ms_engine_attach_coverage(struct ms_engine *e, int id, uint32_t generation, struct ms_coverage *out) {
  struct ms_hook_table *t = e->hooks;
  pthread_mutex_lock(&t->mu);
  struct attachment *a = ms_hook_find(t, id);
  int rc = -ENOENT;
  for (struct ms_gen *g = a ? a->cur : NULL; g; g = g->prev)
    if (!generation || g->generation == generation) {
      ms_hook_coverage(t, g, out);
      rc = 0;
      break;
    }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int ms_engine_attach_write(struct ms_engine *e, int id, FILE *f, int as_json) {
  ms_engine_attach_sync(e, id);
  if (!as_json) return ms_hook_write(e->hooks, id, e->rt[0].plan, f, NULL);
  struct ms_json j;
  ms_json_init(&j, f, 1);
  int rc = ms_hook_write(e->hooks, id, e->rt[0].plan, f, &j);
  ms_json_end(&j);
  return rc;
}

int ms_engine_attach_write_json(struct ms_engine *e, int id, struct ms_json *j) {
  ms_engine_attach_sync(e, id);
  return ms_hook_write(e->hooks, id, e->rt[0].plan, j->f, j);
}
