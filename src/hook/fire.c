/* SPDX-License-Identifier: MIT */
/* Firing a hook: budgets, sampling, coverage, and the run of each attached
 * program; megascope's helper table (Linux's standard helpers, ring-buffer
 * helpers that count what they lose, and megascope's own). */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "core/admit.h"
#include "hook/hook_impl.h"

/* What a helper of ours needs to know about the run it serves. */
struct run_user {
  struct ms_gen *gen;
  uint32_t worker;
};

static struct ms_bpf_helpers *helpers;
static ms_bpf_helper_fn std_output, std_reserve;
static pthread_once_t helpers_once = PTHREAD_ONCE_INIT;

static void count(_Atomic uint64_t *c) {
  /* one writer per slot (the worker): no read-modify-write needed. The store
   * is a release so that a reader who sees a firing counted executed or
   * throttled sees it counted eligible too (ms_gen_coverage); free on x86. */
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_release);
}

static int over_ring_budget(struct run_user *u, uint64_t size) {
  uint64_t budget = u->gen->opts.ringbuf_bytes;
  if (!budget) return 0;
  uint64_t before = atomic_fetch_add_explicit(&u->gen->ring_bytes, size, memory_order_relaxed);
  return before + size > budget;
}

static uint64_t h_ringbuf_output(struct ms_bpf_exec *x, uint64_t map, uint64_t data, uint64_t size,
                                 uint64_t flags, uint64_t a5) {
  struct run_user *u = ms_bpf_exec_env(x)->user;
  if (u && over_ring_budget(u, size)) {
    count(&u->gen->cov[u->worker].lost);
    return (uint64_t)-EAGAIN;
  }
  uint64_t r = std_output(x, map, data, size, flags, a5);
  if ((int64_t)r < 0 && u) count(&u->gen->cov[u->worker].lost);
  return r;
}

static uint64_t h_ringbuf_reserve(struct ms_bpf_exec *x, uint64_t map, uint64_t size, uint64_t flags,
                                  uint64_t a4, uint64_t a5) {
  struct run_user *u = ms_bpf_exec_env(x)->user;
  if (u && over_ring_budget(u, size)) {
    count(&u->gen->cov[u->worker].lost);
    return 0;
  }
  uint64_t r = std_reserve(x, map, size, flags, a4, a5);
  if (!r && u) count(&u->gen->cov[u->worker].lost);
  return r;
}

static uint64_t h_log2(struct ms_bpf_exec *x, uint64_t v, uint64_t a2, uint64_t a3, uint64_t a4,
                       uint64_t a5) {
  return v ? (uint64_t)(63 - __builtin_clzll(v)) : 0;
}

static void helpers_init(void) {
  helpers = ms_bpf_helpers_new();
  if (!helpers || ms_bpf_helpers_add_std(helpers)) return;
  std_output = ms_bpf_helpers_fn(helpers, MS_BPF_FN_RINGBUF_OUTPUT);
  std_reserve = ms_bpf_helpers_fn(helpers, MS_BPF_FN_RINGBUF_RESERVE);
  ms_bpf_helpers_set(helpers, ms_bpf_helper_proto_std(MS_BPF_FN_RINGBUF_OUTPUT), h_ringbuf_output);
  ms_bpf_helpers_set(helpers, ms_bpf_helper_proto_std(MS_BPF_FN_RINGBUF_RESERVE), h_ringbuf_reserve);
  static const struct ms_bpf_helper_proto log2_proto = {
      MS_HELPER_LOG2, "ms_log2", MS_BPF_RET_INTEGER, {MS_BPF_ARG_ANYTHING}, 0};
  ms_bpf_helpers_set(helpers, &log2_proto, h_log2);
}

const struct ms_bpf_helpers *ms_hook_helpers(void) {
  pthread_once(&helpers_once, helpers_init);
  return helpers;
}

/* Budget and sampling (core/admit.h, the device's too): whether this firing runs. */
static int admitted(struct ms_gen *g, struct cov_slot *c, const struct ms_hook_ctx *ctx, uint64_t key) {
  const struct ms_attach_opts *o = &g->opts;
  return ms_hook_sampled(key, (uint32_t)g->att->id, o->sample_every) &&
         ms_hook_step_admit(&c->step_key, &c->step_execs, ctx->step, o->max_per_step);
}

static int run_entry(const struct hook_entry *he, struct ms_hook_ctx *ctx, uint64_t key) {
  struct ms_gen *g = he->gen;
  struct cov_slot *c = &g->cov[ctx->worker];
  count(&c->eligible);
  if (atomic_load_explicit(&c->first_step, memory_order_relaxed) == UINT64_MAX)
    atomic_store_explicit(&c->first_step, ctx->step, memory_order_relaxed);
  atomic_store_explicit(&c->last_step, ctx->step, memory_order_relaxed);
  if (!admitted(g, c, ctx, key)) {
    count(&c->throttled);
    return -1;
  }
  struct run_user u = {g, ctx->worker};
  struct ms_bpf_env env = {.worker = ctx->worker, .user = &u};
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = ms_hook_helpers(), .maps = g->maps,
                               .n_maps = (size_t)g->n_maps, .ctx = ctx, .ctx_size = sizeof *ctx,
                               .insn_budget = MS_HOOK_RUN_BUDGET, .env = &env};
  struct ms_bpf_run_result res;
  int rc = he->jit ? ms_bpf_jit_run(he->jit, &ro, &res) : ms_bpf_run(he->prog, &ro, &res);
  count(&c->executed);
  if (rc) {
    count(&c->failed);
    return -1;
  }
  return he->type == MS_PROG_SCHED_HINT ? (int)(res.r0 & 7) : -1;
}

int ms_hook_fire(struct ms_hook_table *t, struct ms_hook_ctx *ctx) {
  uint64_t sample_key = ms_hook_sample_key(ctx);  /* core/admit.h: what names the firing */
  struct epoch_slot *ep = &t->epoch[ctx->worker];
  uint64_t v = atomic_load_explicit(&ep->v, memory_order_relaxed);
  atomic_store_explicit(&ep->v, v + 1, memory_order_seq_cst);  /* odd: inside */
  struct hook_set *s = atomic_load_explicit(&t->set[ctx->hook], memory_order_seq_cst);
  int prio = -1;
  if (s)
    for (int i = 0; i < s->n; i++) {
      int p = run_entry(&s->e[i], ctx, sample_key);
      if (p > prio) prio = p;
    }
  atomic_store_explicit(&ep->v, v + 2, memory_order_release);  /* even: outside */
  return prio;
}
