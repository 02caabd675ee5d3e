/* SPDX-License-Identifier: MIT */
/* The compiler: from the tiled tensor program (graph/) to a plan.
 *
 *  1. dependencies: for every region a task reads, the tasks whose written region
 *     overlaps it (pairwise edges; never written by hand);
 *  2. transitive reduction: an edge p->t is dropped when p is already an ancestor
 *     of another predecessor of t (ancestor bitsets, in task order);
 *  3. fusion: consumers with equal predecessor sets share one event, whose
 *     triggers are exactly that set (so producers that release equal successor
 *     sets trigger the same event);
 *  4. normalisation: a producer that would trigger k > 1 events triggers one
 *     fan-out event instead, released to k empty tasks that each trigger one of
 *     the k; every task then waits on at most one event and triggers at most one;
 *     tasks with no successor trigger the end-of-step event;
 *  5. linearisation: tasks are laid out event by event, so each event's successors
 *     are one contiguous range [first, last]; the blocks are ordered by their
 *     earliest task, which keeps producers before consumers. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/plan_ir.h"
#include "graph/graph.h"

struct ivec {
  int *v;
  int n, cap;
};

static int ivec_push(struct ivec *a, int x) {
  if (a->n == a->cap) {
    int cap = a->cap ? a->cap * 2 : 4;
    int *v = realloc(a->v, (size_t)cap * sizeof *v);
    if (!v) return -ENOMEM;
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = x;
  return 0;
}

static void ivecs_free(struct ivec *a, int n) {
  if (!a) return;
  for (int i = 0; i < n; i++) free(a[i].v);
  free(a);
}

/* An event while compiling: trigger and successor task lists (pre-layout ids). */
struct cevent {
  struct ivec trig, succ;
  int key;      /* smallest successor key: the block's place in the layout */
  int new_id;
};

struct compiler {
  const struct ms_graph *g;
  struct ms_textbuf *log;
  int n;                    /* graph tasks */
  struct ivec *preds;       /* [n] */
  struct ivec *out_events;  /* [n + empties] events each task triggers */
  int *wait;                /* [n + empties] pre-layout event each task waits on */
  struct cevent *ev;
  int n_ev, cap_ev;
  /* empty tasks created by normalisation */
  int n_empty, cap_empty;
  int *empty_src;           /* producer each empty task stands behind */
  int64_t pairwise, reduced;
};

static int ev_new(struct compiler *c) {
  if (c->n_ev == c->cap_ev) {
    int cap = c->cap_ev ? c->cap_ev * 2 : 256;
    struct cevent *e = realloc(c->ev, (size_t)cap * sizeof *e);
    if (!e) return -ENOMEM;
    c->ev = e;
    c->cap_ev = cap;
  }
  memset(&c->ev[c->n_ev], 0, sizeof c->ev[0]);
  return c->n_ev++;
}

/* 1. pairwise edges from region overlaps. */
static int derive_edges(struct compiler *c) {
  const struct ms_graph *g = c->g;
  struct ivec *writers = calloc((size_t)g->n_bufs, sizeof *writers);
  int *stamp = malloc((size_t)c->n * sizeof *stamp);
  int rc = -ENOMEM;
  if (!writers || !stamp) goto out;
  for (int i = 0; i < c->n; i++) stamp[i] = -1;
  for (int t = 0; t < c->n; t++) {
    const struct ms_proto_task *pt = &g->tasks[t];
    for (int r = 0; r < pt->n_reads; r++) {
      const struct ivec *w = &writers[pt->reads[r].buf];
      for (int i = 0; i < w->n; i++) {
        int p = w->v[i] >> 2, wi = w->v[i] & 3;
        if (stamp[p] == t || !ms_region_overlap(&pt->reads[r], &g->tasks[p].writes[wi])) continue;
        stamp[p] = t;
        if (ivec_push(&c->preds[t], p)) goto out;
      }
    }
    for (int w = 0; w < pt->n_writes; w++)
      if (ivec_push(&writers[pt->writes[w].buf], t << 2 | w)) goto out;
    c->pairwise += c->preds[t].n;
  }
  rc = 0;
out:
  ivecs_free(writers, g->n_bufs);
  free(stamp);
  return rc;
}

static int cmp_int_desc(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x < y) - (x > y);
}

/* 2. transitive reduction with ancestor bitsets. Tasks are in topological order,
 * so every predecessor's ancestor set is complete when a task is reached, and a
 * predecessor can only descend from a predecessor earlier in that order. So,
 * taking a task's predecessors latest first, one is implied exactly when an
 * ancestor set already gathered holds it: one bit test a predecessor against
 * the running union (which is the task's own ancestor set when done), not one
 * a pair of predecessors (a prompt chunk's plan of 64 rows has GEMV tasks with
 * hundreds: pairwise tests were 85% of compiling it). */
static int reduce_edges(struct compiler *c) {
  size_t words = ((size_t)c->n + 63) / 64;
  uint64_t *anc = calloc((size_t)c->n * words, sizeof *anc);
  if (!anc) return -ENOMEM;
  for (int t = 0; t < c->n; t++) {
    struct ivec *p = &c->preds[t];
    uint64_t *at = anc + (size_t)t * words;
    if (p->n > 1) qsort(p->v, (size_t)p->n, sizeof *p->v, cmp_int_desc);
    int keep = 0;
    for (int i = 0; i < p->n; i++) {
      int x = p->v[i];
      MS_ASSERT(x < t);
      if ((at[x >> 6] >> (x & 63)) & 1) continue;  /* a kept, later predecessor descends from x */
      p->v[keep++] = x;
      const uint64_t *ax = anc + (size_t)x * words;
      for (size_t w = 0; w <= (size_t)x >> 6; w++) at[w] |= ax[w];  /* x's ancestors lie below x */
      at[x >> 6] |= 1ull << (x & 63);
    }
    p->n = keep;
    c->reduced += p->n;
  }
  free(anc);
  return 0;
}

/* 3. one event per distinct predecessor set (hash table over sorted lists). */
static uint64_t hash_set(const struct ivec *s) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < s->n; i++) h = (h ^ (uint64_t)(unsigned)s->v[i]) * 1099511628211ull;
  return h ^ (uint64_t)s->n;
}

static int same_set(const struct ivec *a, const struct ivec *b) {
  return a->n == b->n && !memcmp(a->v, b->v, (size_t)a->n * sizeof *a->v);
}

static int fuse_events(struct compiler *c) {
  size_t cap = 1;
  while (cap < (size_t)c->n * 2) cap <<= 1;
  int *table = malloc(cap * sizeof *table);
  if (!table) return -ENOMEM;
  for (size_t i = 0; i < cap; i++) table[i] = -1;
  int rc = 0;
  c->wait[0] = -1;
  for (int t = 1; t < c->n && !rc; t++) {
    struct ivec *p = &c->preds[t];
    if (p->n == 0) ivec_push(p, 0);  /* everything waits for the step start */
    size_t h = hash_set(p) & (cap - 1);
    while (table[h] >= 0 && !same_set(&c->preds[table[h]], p)) h = (h + 1) & (cap - 1);
    if (table[h] < 0) {
      int e = ev_new(c);
      if (e < 0) {
        rc = e;
        break;
      }
      table[h] = t;  /* the set is stored once, in its first consumer */
      c->wait[t] = e;
      for (int i = 0; i < p->n && !rc; i++) rc = ivec_push(&c->ev[e].trig, p->v[i]);
    } else {
      c->wait[t] = c->wait[table[h]];
    }
    if (!rc) rc = ivec_push(&c->ev[c->wait[t]].succ, t);
  }
  free(table);
  return rc;
}

/* 4. normalisation: one trigger per task; the end-of-step event. */
static int normalise(struct compiler *c, int *end_event) {
  int total = c->n;
  for (int e = 0; e < c->n_ev; e++)
    for (int i = 0; i < c->ev[e].trig.n; i++)
      if (ivec_push(&c->out_events[c->ev[e].trig.v[i]], e)) return -ENOMEM;
  for (int p = 0; p < c->n; p++) {
    struct ivec *oe = &c->out_events[p];
    if (oe->n <= 1) continue;
    int f = ev_new(c);
    if (f < 0 || ivec_push(&c->ev[f].trig, p)) return -ENOMEM;
    for (int i = 0; i < oe->n; i++) {
      int e = oe->v[i], k = total + c->n_empty;
      if (k >= 2 * c->n + 16) {
        ms_textbuf_printf(c->log, "compile: normalisation needs more than %d empty tasks\n", c->n + 16);
        return -MS_E_LIMIT;
      }
      if (c->n_empty == c->cap_empty) {
        int cap = c->cap_empty ? c->cap_empty * 2 : 64;
        int *s = realloc(c->empty_src, (size_t)cap * sizeof *s);
        if (!s) return -ENOMEM;
        c->empty_src = s;
        c->cap_empty = cap;
      }
      c->empty_src[c->n_empty++] = p;
      if (ivec_push(&c->ev[f].succ, k)) return -ENOMEM;
      c->wait[k] = f;
      struct ivec *tr = &c->ev[e].trig;
      for (int j = 0; j < tr->n; j++)
        if (tr->v[j] == p) tr->v[j] = k;
      c->out_events[k].n = 0;
      if (ivec_push(&c->out_events[k], e)) return -ENOMEM;
    }
    oe->v[0] = f;
    oe->n = 1;
  }
  int end = ev_new(c);
  if (end < 0) return end;
  for (int t = 0; t < total + c->n_empty; t++)
    if (c->out_events[t].n == 0 && ivec_push(&c->ev[end].trig, t)) return -ENOMEM;
  *end_event = end;
  return 0;
}

/* Layout key: graph task t -> 2t; an empty task behind producer p -> 2p + 1. */
static int task_key(const struct compiler *c, int t) {
  return t < c->n ? 2 * t : 2 * c->empty_src[t - c->n] + 1;
}

static int cmp_event_key(const void *a, const void *b, void *ctx) {
  const struct cevent *ev = ctx;
  int x = ev[*(const int *)a].key, y = ev[*(const int *)b].key;
  return (x > y) - (x < y);
}

static const struct compiler *sort_ctx;
static int cmp_task_key(const void *a, const void *b) {
  int x = task_key(sort_ctx, *(const int *)a), y = task_key(sort_ctx, *(const int *)b);
  return (x > y) - (x < y);
}

static int intern_ev_class(struct ms_plan *p, const char *name) {
  for (int i = 0; i < p->n_ev_classes; i++)
    if (!strcmp(p->ev_classes[i], name)) return i;
  void *q = realloc(p->ev_classes, (size_t)(p->n_ev_classes + 1) * sizeof *p->ev_classes);
  if (!q) return -ENOMEM;
  p->ev_classes = q;
  snprintf(p->ev_classes[p->n_ev_classes], sizeof p->ev_classes[0], "%s", name);
  return p->n_ev_classes++;
}

/* The op name a task stands for in event-class names. */
static const char *task_op(const struct compiler *c, int t) {
  return t < c->n ? c->g->classes[c->g->tasks[t].cls].op : "fanout";
}

static int cmp_name(const void *a, const void *b, void *ctx) {
  char (*names)[64] = ctx;
  return strcmp(names[*(const int *)a], names[*(const int *)b]);
}

/* Event-class ids in name order: the same for every bucket's plan, so a monitor's
 * per-class aggregates mean the same whatever batch size ran. */
static void canonical_ev_classes(struct ms_plan *p) {
  int n = p->n_ev_classes, order[256], rank[256];
  char (*sorted)[64] = malloc((size_t)n * sizeof *sorted);
  if (!sorted || n > 256) {
    free(sorted);
    return;
  }
  for (int i = 0; i < n; i++) order[i] = i;
  qsort_r(order, (size_t)n, sizeof *order, cmp_name, p->ev_classes);
  for (int i = 0; i < n; i++) {
    rank[order[i]] = i;
    memcpy(sorted[i], p->ev_classes[order[i]], sizeof sorted[0]);
  }
  memcpy(p->ev_classes, sorted, (size_t)n * sizeof *sorted);
  for (int e = 0; e < p->n_events; e++) p->events[e].cls = (uint16_t)rank[p->events[e].cls];
  free(sorted);
}

/* 5. linearisation and the plan's arrays. */
static int layout(struct compiler *c, int end, struct ms_plan *p) {
  int total = c->n + c->n_empty;
  int *order = malloc((size_t)c->n_ev * sizeof *order);
  int *newidx = malloc((size_t)total * sizeof *newidx);
  int rc = -ENOMEM;
  if (!order || !newidx) goto out;
  int n_order = 0;
  for (int e = 0; e < c->n_ev; e++) {
    if (e == end) continue;
    sort_ctx = c;
    qsort(c->ev[e].succ.v, (size_t)c->ev[e].succ.n, sizeof(int), cmp_task_key);
    c->ev[e].key = task_key(c, c->ev[e].succ.v[0]);
    order[n_order++] = e;
  }
  qsort_r(order, (size_t)n_order, sizeof *order, cmp_event_key, c->ev);
  order[n_order++] = end;

  p->n_tasks = total;
  p->n_events = c->n_ev;
  p->tasks = calloc((size_t)total, sizeof *p->tasks);
  p->graph_index = malloc((size_t)total * sizeof *p->graph_index);
  p->events = calloc((size_t)c->n_ev, sizeof *p->events);
  p->trig_off = calloc((size_t)c->n_ev + 1, sizeof *p->trig_off);
  if (!p->tasks || !p->events || !p->trig_off || !p->graph_index) goto out;

  int next = 0;
  newidx[0] = next++;  /* the step start waits on nothing and comes first */
  for (int i = 0; i < n_order; i++) {
    struct cevent *e = &c->ev[order[i]];
    e->new_id = i;
    for (int j = 0; j < e->succ.n; j++) newidx[e->succ.v[j]] = next++;
  }
  MS_ASSERT(next == total);

  int empty_cls = p->n_classes - 1;
  for (int t = 0; t < total; t++) {
    struct ms_task *nt = &p->tasks[newidx[t]];
    p->graph_index[newidx[t]] = t < c->n ? t : -1;
    if (t < c->n) {
      const struct ms_proto_task *pt = &c->g->tasks[t];
      nt->cls = pt->cls;
      memcpy(nt->tile, pt->tile, sizeof nt->tile);
    } else {
      nt->cls = (uint16_t)empty_cls;
      nt->tile[0] = 0;
      nt->tile[1] = nt->tile[2] = -1;
    }
    nt->kernel = p->classes[nt->cls].kernel;
    nt->launch = p->classes[nt->cls].launch;
    nt->wait = c->wait[t] < 0 ? -1 : c->ev[c->wait[t]].new_id;
    nt->trigger = c->out_events[t].n ? c->ev[c->out_events[t].v[0]].new_id : c->ev[end].new_id;
  }
  int64_t fused = 0;
  for (int i = 0; i < n_order; i++) {
    struct cevent *e = &c->ev[order[i]];
    struct ms_event *ne = &p->events[i];
    ne->needed = e->trig.n;
    ne->first = e->succ.n ? newidx[e->succ.v[0]] : 0;
    ne->last = e->succ.n ? newidx[e->succ.v[e->succ.n - 1]] : -1;
    fused += e->trig.n + e->succ.n;
    if (e->trig.n > p->stats.max_event_triggers) p->stats.max_event_triggers = e->trig.n;
    if (e->succ.n > p->stats.max_event_successors) p->stats.max_event_successors = e->succ.n;
    char name[64];
    snprintf(name, sizeof name, "%s->%s", task_op(c, e->trig.v[0]),
             e->succ.n ? task_op(c, e->succ.v[0]) : "step_end");
    int ec = intern_ev_class(p, name);
    if (ec < 0) goto out;
    ne->cls = (uint16_t)ec;
    p->trig_off[i + 1] = p->trig_off[i] + e->trig.n;
  }
  p->trig = malloc((size_t)p->trig_off[n_order] * sizeof *p->trig + 1);
  if (!p->trig) goto out;
  for (int i = 0; i < n_order; i++) {
    struct cevent *e = &c->ev[order[i]];
    for (int j = 0; j < e->trig.n; j++) p->trig[p->trig_off[i] + j] = newidx[e->trig.v[j]];
  }
  p->end_event = c->ev[end].new_id;
  p->stats.fused_edges = fused;
  canonical_ev_classes(p);
  rc = 0;
out:
  free(order);
  free(newidx);
  return rc;
}

static int copy_graph_tables(const struct ms_graph *g, struct ms_plan *p) {
  p->n_classes = g->n_classes + 1;
  p->classes = calloc((size_t)p->n_classes, sizeof *p->classes);
  p->bufs = calloc((size_t)g->n_bufs, sizeof *p->bufs);
  if (!p->classes || !p->bufs) return -ENOMEM;
  memcpy(p->classes, g->classes, (size_t)g->n_classes * sizeof *p->classes);
  struct ms_task_class *e = &p->classes[g->n_classes];
  snprintf(e->name, sizeof e->name, "empty");
  snprintf(e->op, sizeof e->op, "empty");
  e->kernel = MS_K_EMPTY;
  e->launch = MS_LAUNCH_AOT;
  e->layer = -1;
  e->region_class = "none";
  e->dep_class = "fanout";
  e->in = e->in2 = e->aux = e->out = e->out2 = -1;
  memcpy(p->bufs, g->bufs, (size_t)g->n_bufs * sizeof *p->bufs);
  p->n_bufs = g->n_bufs;
  p->meta_buf = g->meta_buf;
  return 0;
}

struct ms_plan *ms_plan_compile(const struct ms_model *m, const struct ms_compile_opts *o,
                                struct ms_textbuf *log) {
  uint64_t t0 = ms_now_ns();
  struct ms_graph g;
  struct compiler c = {0};
  struct ms_plan *p = calloc(1, sizeof *p);
  int rc = -ENOMEM, end = -1;
  if (!p) goto out_nograph;
#define OPT(f) (o->sz >= offsetof(struct ms_compile_opts, f) + sizeof(int) ? o->f : 0)  /* older callers: 0 */
  struct ms_graph_tiling tiling = {.tile_bytes = o->tile_bytes, .tile_rows = OPT(tile_rows),
                                   .tiles_per_op = OPT(tiles_per_op), .min_tiles = OPT(min_tiles),
                                   .fuse_norm = OPT(fuse_norm), .attn_parts = OPT(attn_parts)};
  if (tiling.attn_parts < 0 || tiling.attn_parts > MS_ATTN_MAX_PARTS) {
    ms_textbuf_printf(log, "attn_parts %d: expected 0 to %d\n", tiling.attn_parts, MS_ATTN_MAX_PARTS);
    rc = -EINVAL;
    goto out_nograph;
  }
  rc = (OPT(tp_split) ? ms_graph_build_split : ms_graph_build_tp)(m, o->batch, &tiling, OPT(tp), OPT(prefill), &g,
                                                                   log);
#undef OPT
  if (rc) goto out_nograph;
  p->model = m;
  p->batch = o->batch;
  c.g = &g;
  c.log = log;
  c.n = g.n_tasks;
  /* Normalisation adds at most one empty task per (producer, event) pair, bounded
   * by the number of distinct predecessor sets per producer: size generously. */
  c.preds = calloc((size_t)c.n, sizeof *c.preds);
  c.out_events = calloc((size_t)c.n * 2 + 16, sizeof *c.out_events);
  c.wait = malloc(((size_t)c.n * 2 + 16) * sizeof *c.wait);
  rc = -ENOMEM;
  if (!c.preds || !c.out_events || !c.wait) goto out;
  if ((rc = copy_graph_tables(&g, p)) || (rc = derive_edges(&c)) || (rc = reduce_edges(&c)) ||
      (rc = fuse_events(&c)) || (rc = normalise(&c, &end)))
    goto out;
  if (c.n_empty > c.n + 16) {
    ms_textbuf_printf(log, "compile: %d empty tasks exceed the normalisation bound\n", c.n_empty);
    rc = -MS_E_LIMIT;
    goto out;
  }
  if ((rc = layout(&c, end, p))) goto out;

  struct ms_plan_stats *s = &p->stats;
  s->tasks = p->n_tasks;
  s->events = p->n_events;
  s->task_classes = p->n_classes;
  s->event_classes = p->n_ev_classes;
  s->empty_tasks = c.n_empty;
  p->classes[p->n_classes - 1].n_tasks = c.n_empty;
  for (int t = 0; t < p->n_tasks; t++)
    p->tasks[t].launch == MS_LAUNCH_JIT ? s->jit_tasks++ : s->aot_tasks++;
  s->pairwise_edges = c.pairwise;
  s->reduced_edges = c.reduced;
  s->metadata_bytes = (size_t)p->n_tasks * sizeof *p->tasks + (size_t)p->n_events * sizeof *p->events +
                      (size_t)p->n_classes * sizeof *p->classes +
                      (size_t)(p->trig_off[p->n_events] + p->n_events + 1) * sizeof(int32_t);
  s->compile_ms = (double)(ms_now_ns() - t0) / 1e6;
  rc = ms_plan_validate(p, log);
out:
  ivecs_free(c.preds, c.n);
  ivecs_free(c.out_events, c.n * 2 + 16);
  free(c.wait);
  free(c.empty_src);
  if (c.ev)
    for (int e = 0; e < c.n_ev; e++) {
      free(c.ev[e].trig.v);
      free(c.ev[e].succ.v);
    }
  free(c.ev);
  ms_graph_free(&g);
out_nograph:
  if (rc) {
    if (rc == -ENOMEM) ms_textbuf_printf(log, "compile: out of memory\n");
    ms_plan_free(p);
    errno = -rc > MS_E_FIRST ? EINVAL : -rc;
    return NULL;
  }
  return p;
}

void ms_plan_free(struct ms_plan *p) {
  if (!p) return;
  free(p->classes);
  free(p->ev_classes);
  free(p->tasks);
  free(p->graph_index);
  free(p->events);
  free(p->trig_off);
  free(p->trig);
  free(p->bufs);
  free(p);
}
