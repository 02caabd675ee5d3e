/* SPDX-License-Identifier: MIT */
/* The hook table's control plane: attach, replace, detach, with generations,
 * map instantiation, quiescence-based reclamation, and the freeing of closed
 * generations after their retention (see hook_impl.h). */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "hook/hook_impl.h"

struct ms_hook_table *ms_hook_table_new(int n_workers) {
  struct ms_hook_table *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->n_workers = n_workers;
  t->epoch = calloc((size_t)n_workers, sizeof *t->epoch);
  if (!t->epoch || !ms_hook_helpers()) {
    free(t->epoch);
    free(t);
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_init(&t->mu, NULL);
  t->next_id = 1;
  t->retention_ns = MS_HOOK_RETENTION_DEFAULT_NS;
  return t;
}

/* Frees one generation's maps, native code (of n_progs programs) and
 * coverage, and g itself; not its monitor, which the caller keeps when an
 * attach or replace fails. */
static void gen_release(struct ms_gen *g, int n_progs) {
  for (int i = 0; g->maps && i < g->n_maps; i++) ms_bpf_map_free(g->maps[i]);
  for (int i = 0; g->jits && i < n_progs; i++) ms_bpf_jit_free(g->jits[i]);
  free(g->jits);
  free(g->maps);
  free(g->cov);
  free(g);
}

static void gen_free(struct ms_gen *g) {
  while (g) {
    struct ms_gen *prev = g->prev;
    struct ms_monitor *mon = g->mon;
    gen_release(g, mon->n_progs);
    ms_monitor_free(mon);
    g = prev;
  }
}

void ms_hook_table_free(struct ms_hook_table *t) {
  if (!t) return;
  for (int h = 0; h < MS_HOOK_COUNT; h++) free(atomic_load(&t->set[h]));
  for (int i = 0; i < t->n_atts; i++) {
    gen_free(t->atts[i]->cur);
    free(t->atts[i]);
  }
  free(t->atts);
  free(t->epoch);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

/* Waits until no worker can still be inside a set published before this call. */
static void quiesce(struct ms_hook_table *t) {
  for (int w = 0; w < t->n_workers; w++) {
    uint64_t v = atomic_load_explicit(&t->epoch[w].v, memory_order_seq_cst);
    if (!(v & 1)) continue;
    while (atomic_load_explicit(&t->epoch[w].v, memory_order_seq_cst) == v) sched_yield();
  }
}

/* Compiles a generation's programs to native code, bound to its maps. The JIT
 * verifies again with the same options the monitor was verified with (it
 * compiles nothing unproven); a program it cannot compile runs interpreted,
 * which the attachment's info reports (n_jitted). */
static int gen_jit(struct ms_gen *g, struct ms_monitor *m, struct ms_textbuf *log) {
  g->jits = calloc((size_t)m->n_progs + 1, sizeof *g->jits);
  if (!g->jits) return -ENOMEM;
  for (int i = 0; i < m->n_progs; i++) {
    struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_HOOK, .prog_type = m->type[i],
                                .hook = m->hook[i], .helpers = ms_hook_helpers(),
                                .ctx = ms_hook_verify_ctx(m->type[i], m->hook[i])};
    char why[512] = "";
    struct ms_textbuf jlog = {why, sizeof why, 0, 0};
    struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &vo, .helpers = ms_hook_helpers(),
                                 .maps = g->maps, .n_maps = (size_t)g->n_maps, .log = &jlog};
    g->jits[i] = ms_bpf_jit_new(m->progs[i], &jo);
    if (g->jits[i]) {
      g->n_jitted++;
    } else if (errno == ENOMEM) {
      return -ENOMEM;
    } else {
      ms_textbuf_printf(log, "program '%s': not compiled (%s), it runs interpreted\n",
                        ms_bpf_prog_name(m->progs[i]), ms_strerror(errno));
    }
  }
  return 0;
}

/* Instantiates a generation's maps (memfd shared memory) with global data,
 * and its native code unless the attachment asks for the interpreter. */
static struct ms_gen *gen_new(struct ms_hook_table *t, struct ms_monitor *m, const struct ms_attach_opts *o,
                              struct ms_textbuf *log) {
  struct ms_gen *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->n_maps = (int)ms_bpf_object_map_count(m->obj);
  g->maps = calloc((size_t)g->n_maps + 1, sizeof *g->maps);
  g->cov = calloc((size_t)t->n_workers, sizeof *g->cov);
  if (!g->maps || !g->cov) goto fail;
  for (int w = 0; w < t->n_workers; w++) atomic_init(&g->cov[w].first_step, UINT64_MAX);
  for (int i = 0; i < g->n_maps; i++) {
    g->maps[i] = ms_bpf_map_new(ms_bpf_object_map(m->obj, (size_t)i), (uint32_t)t->n_workers, log);
    if (!g->maps[i]) goto fail;
    g->bytes += ms_bpf_map_bytes(g->maps[i]);
    size_t n;
    const void *init = ms_bpf_object_map_init(m->obj, (size_t)i, &n);
    if (init && n) {
      uint32_t key = 0;
      for (int w = 0; w < t->n_workers; w++)
        if (ms_bpf_map_update(g->maps[i], &key, init, MS_BPF_ANY, (uint32_t)w)) goto fail;
    }
  }
  /* a runner's programs run where it runs them (the device's interpreter):
   * no native code here */
  if (!o->interpret && !t->runner.take && ms_bpf_jit_supported() && gen_jit(g, m, log)) goto fail;
  g->opts = *o;
  g->mon = m;
  g->t_start = ms_now_ns();
  return g;
fail:
  gen_release(g, m->n_progs);
  return NULL;
}

/* Builds hook h's next set: the current one without `drop`'s entries, plus
 * `add`'s programs on h. NULL (no set) when it would be empty; *err on failure. */
static struct hook_set *set_build(struct ms_hook_table *t, int h, const struct ms_gen *drop,
                                  struct ms_gen *add, int *err) {
  struct hook_set *cur = atomic_load(&t->set[h]);
  int n = cur ? cur->n : 0;
  if (add) n += add->mon->n_progs;
  struct hook_set *s = malloc(sizeof *s + (size_t)n * sizeof s->e[0]);
  if (!s) {
    *err = -ENOMEM;
    return NULL;
  }
  s->n = 0;
  for (int i = 0; cur && i < cur->n; i++)
    if (cur->e[i].gen != drop) s->e[s->n++] = cur->e[i];
  if (add)
    for (int i = 0; i < add->mon->n_progs; i++)
      if (add->mon->hook[i] == h)
        s->e[s->n++] = (struct hook_entry){add, add->mon->progs[i], add->jits ? add->jits[i] : NULL,
                                           add->mon->type[i]};
  if (!s->n) {
    free(s);
    return NULL;
  }
  return s;
}

/* Swaps every hook's set from the generation `drop` to `add` (either may be
 * NULL), then waits for quiescence and frees the old sets. */
static int publish(struct ms_hook_table *t, const struct ms_gen *drop, struct ms_gen *add) {
  struct hook_set *next[MS_HOOK_COUNT], *old[MS_HOOK_COUNT];
  int err = 0;
  for (int h = 0; h < MS_HOOK_COUNT; h++) {
    next[h] = set_build(t, h, drop, add, &err);
    if (err) {
      for (int j = 0; j <= h; j++) free(next[j]);
      return err;
    }
  }
  for (int h = 0; h < MS_HOOK_COUNT; h++)
    old[h] = atomic_exchange_explicit(&t->set[h], next[h], memory_order_seq_cst);
  quiesce(t);
  for (int h = 0; h < MS_HOOK_COUNT; h++) free(old[h]);
  return 0;
}

static void mark_hinted(struct ms_hook_table *t, const struct ms_monitor *m) {
  for (int i = 0; i < m->n_progs; i++)
    if (m->type[i] == MS_PROG_SCHED_HINT) atomic_store(&t->hinted, 1);
}

/* ---- the budget: what attachments hold, the oldest closed freed first ---- */

struct held {
  int attached, retained, fds;
  uint64_t bytes;
};

static void held_count(const struct ms_hook_table *t, struct held *h) {
  *h = (struct held){0};
  for (int i = 0; i < t->n_atts; i++) {
    const struct attachment *a = t->atts[i];
    h->attached += a->attached;
    for (const struct ms_gen *g = a->cur; g; g = g->prev) {
      h->retained += g != a->cur || !a->attached;
      h->fds += g->n_maps;
      h->bytes += g->bytes;
    }
  }
}

static int over_budget(const struct ms_hook_table *t, const struct held *h) {
  const struct ms_attach_budget *b = &t->budget;
  return (b->max_retained > 0 && h->retained > b->max_retained) || (b->max_fds > 0 && h->fds > b->max_fds) ||
         (b->max_bytes && h->bytes > b->max_bytes);
}

static int remove_at(struct ms_hook_table *t, int i);

/* Frees the closed generation that closed first (the last of some
 * attachment's chain); 0 when nothing closed is held. */
static int free_oldest(struct ms_hook_table *t) {
  int best = -1;
  struct ms_gen *victim = NULL, *after = NULL;
  uint64_t when = UINT64_MAX;
  for (int i = 0; i < t->n_atts; i++) {
    struct attachment *a = t->atts[i];
    struct ms_gen *g = a->cur, *next = NULL;
    for (; g->prev; g = g->prev) next = g;
    if (g == a->cur && a->attached) continue;  /* only the live generation */
    uint64_t end = atomic_load(&g->t_end);
    if (end < when) {
      when = end;
      best = i;
      victim = g;
      after = next;
    }
  }
  if (best < 0) return 0;
  if (after) {  /* an older generation of a chain */
    after->prev = NULL;
    gen_free(victim);
    t->n_freed++;
  } else {  /* a detached attachment's only generation: the attachment goes */
    remove_at(t, best);
  }
  t->n_freed_early++;
  return 1;
}

/* Frees the oldest closed generations until what is held and `fds`, `bytes`,
 * `retained` more fit the budget; 0, or -MS_E_LIMIT when nothing closed is
 * left to free. */
static int make_room(struct ms_hook_table *t, int fds, uint64_t bytes, int retained) {
  for (;;) {
    struct held h;
    held_count(t, &h);
    h.fds += fds;
    h.bytes += bytes;
    h.retained += retained;
    if (!over_budget(t, &h)) return 0;
    if (!free_oldest(t)) return -MS_E_LIMIT;
  }
}

static void bound_text(char *buf, size_t n, uint64_t v) {
  if (v)
    snprintf(buf, n, "%llu", (unsigned long long)v);
  else
    snprintf(buf, n, "no bound");
}

static int refuse(struct ms_hook_table *t, const char *what, int fds, uint64_t bytes, struct ms_textbuf *log) {
  struct held h;
  held_count(t, &h);
  char bf[32], bb[32];
  bound_text(bf, sizeof bf, (uint64_t)(t->budget.max_fds > 0 ? t->budget.max_fds : 0));
  bound_text(bb, sizeof bb, t->budget.max_bytes);
  char need[64] = "";
  if (bytes) snprintf(need, sizeof need, " and %llu map bytes", (unsigned long long)bytes);
  ms_textbuf_printf(log,
                    "%s refused by the attachments' budget: it needs %d descriptors%s, the %d attached hold %d "
                    "and %llu bytes, and the budget is %s descriptors and %s bytes (nothing closed is left to "
                    "free); detach an attachment first\n",
                    what, fds, need, h.attached, h.fds, (unsigned long long)h.bytes, bf, bb);
  t->n_refused++;
  return -MS_E_LIMIT;
}

/* A new generation within the budget: room made before its maps are created
 * (descriptors) and after (bytes); out of descriptors, the oldest closed
 * generations give theirs. NULL with *rc set. */
static struct ms_gen *gen_budgeted(struct ms_hook_table *t, struct ms_monitor *m, const struct ms_attach_opts *o,
                                   int closes, const char *what, struct ms_textbuf *log, int *rc) {
  int fds = (int)ms_bpf_object_map_count(m->obj);
  if (make_room(t, fds, 0, closes)) {
    *rc = refuse(t, what, fds, 0, log);
    return NULL;
  }
  errno = 0;
  struct ms_gen *g = gen_new(t, m, o, log);
  while (!g && (errno == EMFILE || errno == ENFILE) && free_oldest(t)) g = gen_new(t, m, o, log);
  if (!g) {
    *rc = errno ? -errno : -ENOMEM;
    return NULL;
  }
  if (make_room(t, fds, g->bytes, closes)) {
    *rc = refuse(t, what, fds, g->bytes, log);
    gen_release(g, m->n_progs);
    return NULL;
  }
  return g;
}

void ms_hook_set_budget(struct ms_hook_table *t, const struct ms_attach_budget *b) {
  pthread_mutex_lock(&t->mu);
  memset(&t->budget, 0, sizeof t->budget);
  if (b) memcpy(&t->budget, b, b->sz < sizeof t->budget ? b->sz : sizeof t->budget);
  t->budget.sz = sizeof t->budget;
  make_room(t, 0, 0, 0);
  pthread_mutex_unlock(&t->mu);
}

void ms_hook_usage(struct ms_hook_table *t, struct ms_attach_usage *out) {
  struct held h;
  pthread_mutex_lock(&t->mu);
  held_count(t, &h);
  *out = (struct ms_attach_usage){.attached = h.attached, .retained = h.retained, .fds = h.fds, .bytes = h.bytes,
                                  .freed_early = t->n_freed_early, .refused = t->n_refused};
  pthread_mutex_unlock(&t->mu);
}

int ms_hook_attach(struct ms_hook_table *t, struct ms_monitor *m, const struct ms_attach_opts *o,
                   struct ms_textbuf *log) {
  struct attachment *a = calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  if (o) memcpy(&a->opts, o, o->sz < sizeof a->opts ? o->sz : sizeof a->opts);
  a->opts.sz = sizeof a->opts;
  pthread_mutex_lock(&t->mu);
  int rc = -ENOMEM;
  if (t->n_atts == t->cap_atts) {
    int cap = t->cap_atts ? t->cap_atts * 2 : 8;
    struct attachment **n = realloc(t->atts, (size_t)cap * sizeof *n);
    if (!n) goto fail;
    t->atts = n;
    t->cap_atts = cap;
  }
  struct ms_gen *g = gen_budgeted(t, m, &a->opts, 0, "attach", log, &rc);
  if (!g) goto fail;
  g->att = a;
  g->generation = 1;
  a->cur = g;
  if (t->next_id == INT32_MAX) {
    rc = -MS_E_LIMIT;  /* 2^31 - 1 attachments over the engine's life */
    gen_release(g, m->n_progs);
    goto fail;
  }
  a->id = t->next_id++;
  a->attached = 1;
  mark_hinted(t, m);
  if (t->runner.take && (rc = t->runner.take(t->runner.ctx, a->id, g, 0, log))) {
    gen_release(g, m->n_progs);
    goto fail;
  }
  if ((rc = publish(t, NULL, g))) {
    gen_release(g, m->n_progs);  /* the caller keeps m on failure */
    goto fail;
  }
  t->atts[t->n_atts++] = a;
  pthread_mutex_unlock(&t->mu);
  return a->id;
fail:
  pthread_mutex_unlock(&t->mu);
  free(a);
  return rc;
}

/* Index of attachment id in t->atts (ascending ids: binary search), or -1. */
static int find_index(const struct ms_hook_table *t, int id) {
  int lo = 0, hi = t->n_atts - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2, v = t->atts[mid]->id;
    if (v == id) return mid;
    if (v < id)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return -1;
}

struct attachment *ms_hook_find(struct ms_hook_table *t, int id) {
  int i = find_index(t, id);
  return i < 0 ? NULL : t->atts[i];
}

int ms_hook_count(struct ms_hook_table *t) {
  pthread_mutex_lock(&t->mu);
  int n = t->n_atts;
  pthread_mutex_unlock(&t->mu);
  return n;
}

static int gen_count(const struct ms_gen *g) {
  int n = 0;
  for (; g; g = g->prev) n++;
  return n;
}

/* Removes the attachment at index i and frees it with every generation. */
static int remove_at(struct ms_hook_table *t, int i) {
  struct attachment *a = t->atts[i];
  int n = gen_count(a->cur);
  memmove(&t->atts[i], &t->atts[i + 1], (size_t)(t->n_atts - i - 1) * sizeof *t->atts);
  t->n_atts--;
  if (t->runner.forget) t->runner.forget(t->runner.ctx, a->id);  /* before the maps it borrowed go */
  gen_free(a->cur);
  free(a);
  t->n_freed += (uint64_t)n;
  return n;
}

static int expired(const struct ms_hook_table *t, const struct ms_gen *g, uint64_t now) {
  uint64_t end = atomic_load(&((struct ms_gen *)g)->t_end);
  return end && now >= end && now - end >= t->retention_ns;
}

int ms_hook_reap(struct ms_hook_table *t, uint64_t now) {
  int freed = 0;
  pthread_mutex_lock(&t->mu);
  for (int i = 0; i < t->n_atts; i++) {
    struct attachment *a = t->atts[i];
    if (!a->attached && expired(t, a->cur, now)) {
      freed += remove_at(t, i--);
      continue;
    }
    /* generations close newest first: once one has expired, all older have */
    for (struct ms_gen *g = a->cur; g->prev; g = g->prev)
      if (expired(t, g->prev, now)) {
        int n = gen_count(g->prev);
        gen_free(g->prev);
        g->prev = NULL;
        t->n_freed += (uint64_t)n;
        freed += n;
        break;
      }
  }
  pthread_mutex_unlock(&t->mu);
  return freed;
}

int ms_hook_release(struct ms_hook_table *t, int id) {
  pthread_mutex_lock(&t->mu);
  int i = find_index(t, id), rc = -ENOENT;
  if (i >= 0) rc = t->atts[i]->attached ? -MS_E_STATE : (remove_at(t, i), 0);
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int ms_hook_replace(struct ms_hook_table *t, int id, struct ms_monitor *m, const struct ms_attach_opts *o,
                    struct ms_textbuf *log) {
  pthread_mutex_lock(&t->mu);
  struct attachment *a = ms_hook_find(t, id);
  int rc = -ENOENT;
  if (!a || !a->attached) goto out;
  struct ms_attach_opts opts = a->opts;
  if (o) {
    memset(&opts, 0, sizeof opts);
    memcpy(&opts, o, o->sz < sizeof opts ? o->sz : sizeof opts);
    opts.sz = sizeof opts;
  }
  struct ms_gen *g = gen_budgeted(t, m, &opts, 1, "replace", log, &rc);
  if (!g) goto out;
  g->att = a;
  g->generation = a->cur->generation + 1;
  mark_hinted(t, m);
  if (t->runner.take && (rc = t->runner.take(t->runner.ctx, id, g, 1, log))) {
    gen_release(g, m->n_progs);
    goto out;
  }
  if ((rc = publish(t, a->cur, g))) {
    gen_release(g, m->n_progs);
    goto out;
  }
  atomic_store(&a->cur->t_end, ms_now_ns());
  g->prev = a->cur;
  a->cur = g;
  a->opts = opts;
  rc = 0;
  make_room(t, 0, 0, 0);  /* the closed generation over the count: the oldest goes */
out:
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int ms_hook_detach(struct ms_hook_table *t, int id) {
  pthread_mutex_lock(&t->mu);
  struct attachment *a = ms_hook_find(t, id);
  int rc = -ENOENT;
  if (a && a->attached && t->runner.drop) t->runner.drop(t->runner.ctx, id);
  if (a && a->attached && !(rc = publish(t, a->cur, NULL))) {
    a->attached = 0;
    atomic_store(&a->cur->t_end, ms_now_ns());
    make_room(t, 0, 0, 0);  /* over the count of closed generations: the oldest goes */
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

void ms_gen_coverage(const struct ms_gen *g, int n_workers, struct ms_coverage *out) {
  memset(out, 0, sizeof *out);
  out->generation = g->generation;
  out->first_step = UINT64_MAX;
  for (int w = 0; w < n_workers; w++) {
    struct cov_slot *c = &g->cov[w];
    /* A live slot's worker counts a firing eligible, then executed or
     * throttled. Read in that order, a firing between the loads made the
     * sum look like more ran than was eligible (a soak read -6): so the
     * outcomes first (acquire: their firings' eligible counts come with
     * them), then eligible, then the outcomes again, until they held still
     * (a few tries): eligible then exceeds them by the firing in flight, at
     * most one. */
    uint64_t x, th, e;
    for (int tries = 0;; tries++) {
      x = atomic_load_explicit(&c->executed, memory_order_acquire);
      th = atomic_load_explicit(&c->throttled, memory_order_acquire);
      e = atomic_load_explicit(&c->eligible, memory_order_acquire);
      if (tries == 8 || (x == atomic_load_explicit(&c->executed, memory_order_acquire) &&
                         th == atomic_load_explicit(&c->throttled, memory_order_acquire)))
        break;
    }
    out->eligible += e;
    out->executed += x;
    out->throttled += th;
    out->lost += atomic_load_explicit(&c->lost, memory_order_relaxed);
    out->failed += atomic_load_explicit(&c->failed, memory_order_relaxed);
    uint64_t f = atomic_load_explicit(&c->first_step, memory_order_relaxed);
    uint64_t l = atomic_load_explicit(&c->last_step, memory_order_relaxed);
    if (f < out->first_step) out->first_step = f;
    if (f != UINT64_MAX && l > out->last_step) out->last_step = l;
  }
  if (out->first_step == UINT64_MAX) out->first_step = 0;
  out->t_start = g->t_start;
  out->t_end = atomic_load(&((struct ms_gen *)g)->t_end);
}

void ms_hook_coverage(struct ms_hook_table *t, const struct ms_gen *g, struct ms_coverage *out) {
  ms_gen_coverage(g, t->n_workers, out);
  struct ms_coverage c;
  if (t->runner.coverage && g->att && !t->runner.coverage(t->runner.ctx, g->att->id, g->generation, &c)) *out = c;
}

int ms_hook_sync(struct ms_hook_table *t, int id) {
  return t->runner.sync ? t->runner.sync(t->runner.ctx, id) : 0;
}
