/* SPDX-License-Identifier: MIT */
/* Requests: the public request API (submit, wait, cancel, stop, read-outs) and
 * the step start's side of them (retire, admit, the mailbox) with the slots'
 * KV pages. Callers' threads only push to the mailbox and read atomics; slots,
 * pages and the request's engine-side fields are written by the step start
 * (one thread) and the row's sample task. A request is freed when both its
 * references (the caller's, the engine's) are gone. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_impl.h"
#include "runtime/fault.h"
#include "runtime/hooksite.h"

/* ---- a request's life inside the engine ---- */

static void request_free_parts(struct ms_request *r) {
  free(r->prompt);
  free(r->tokens);
  free(r->logits);
  free(r->bias_ids);
  free(r->bias_vals);
  free(r->stop_ids);
  free(r->adj);
  free(r->stamp);
  free(r->lp);
  free(r->top_vals);
  free(r->top_ids);
  free(r);
}

static void request_release(struct ms_request *r) {
  if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1) return;
  if (r->constrain_free) r->constrain_free(r->constrain_user);
  request_free_parts(r);
}

/* Wakes streaming readers (ms_request_wait_tokens) after a token or the end. */
void ms_rt_request_tick(struct ms_request *r) {
  atomic_fetch_add_explicit(&r->tok_seq, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&r->waiters, memory_order_seq_cst)) ms_futex_wake_all(&r->tok_seq);
}

static void request_finish(struct ms_request *r, enum ms_request_state st) {
  r->t_done = ms_eng_now(r->e);
  if (st == MS_REQ_CANCELLED) atomic_store_explicit(&r->finish, MS_FINISH_CANCELLED, memory_order_relaxed);
  ms_tel_request_done(r->e, r, st == MS_REQ_CANCELLED);
  r->slot = -1;
  atomic_store_explicit(&r->state, st, memory_order_release);
  ms_futex_wake_all(&r->state);
  ms_rt_request_tick(r);
  request_release(r);
}

static int cancel_asked(const struct ms_request *r) {
  return atomic_load_explicit(&((struct ms_request *)r)->cancel, memory_order_acquire);
}

int ms_rt_retire(struct ms_engine *e, int cancel_all) {
  int n = 0;
  for (int s = 0; s < e->n_slots; s++) {
    struct slot *sl = &e->slots[s];
    ms_pc_publish(e, sl);  /* the pages the steps so far made whole, before anything is admitted */
    if (!sl->req || (!sl->finishing && !cancel_all && !cancel_asked(sl->req))) continue;
    if (HOOK_ARMED(e, MS_HOOK_REQUEST))
      fire_request_hook(e, 0, atomic_load_explicit(&e->cur, memory_order_relaxed), s, MS_REQ_FINISHED,
                        sl->next_token);
    ms_pc_release(e, sl);
    struct ms_request *r = sl->req;
    int stopped = !sl->finishing && !cancel_all && cancel_asked(r) == 2;  /* ms_request_stop */
    if (stopped) atomic_store_explicit(&r->finish, MS_FINISH_STOP, memory_order_relaxed);
    request_finish(r, sl->finishing || stopped ? MS_REQ_DONE : MS_REQ_CANCELLED);
    sl->req = NULL;
    sl->finishing = 0;
    n++;
  }
  return n;
}

/* A request leaves the queue: admitted, or dropped (cancelled while it waited). */
static void dequeued(struct ms_engine *e) { atomic_fetch_sub_explicit(&e->queued, 1, memory_order_relaxed); }

static int drop_cancelled(struct ms_request *r, void *user) {
  if (!cancel_asked(r)) return 0;
  dequeued(user);
  request_finish(r, MS_REQ_CANCELLED);
  return 1;
}

/* Moves the mailbox into the fair queue; requests cancelled while they waited
 * leave it (a sweep when a cancel of a queued request was counted). */
static void fill_queue(struct ms_engine *e) {
  uint32_t c = atomic_load_explicit(&e->queued_cancels, memory_order_acquire);
  if (c != e->swept) {
    e->swept = c;
    ms_fq_filter(&e->fq, drop_cancelled, e);
  }
  int64_t v;
  while (e->fq.n < e->fq.cap && !ms_mpmc_pop(&e->mail, &v)) {
    struct ms_request *r = (struct ms_request *)(intptr_t)v;
    if (drop_cancelled(r, e)) continue;
    ms_fq_push(&e->fq, r, (uint64_t)r->n_prompt + (uint64_t)r->max_new);  /* room checked above */
  }
}

/* The next request in fair order not cancelled while it waited, or NULL. */
static struct ms_request *next_queued(struct ms_engine *e) {
  struct ms_request *r;
  while ((r = ms_fq_pop(&e->fq))) {
    if (!drop_cancelled(r, e)) {
      dequeued(e);
      return r;
    }
  }
  return NULL;
}

int ms_rt_admit(struct ms_engine *e, int *slots) {
  int n = 0;
  fill_queue(e);
  for (int s = 0; s < e->n_slots; s++) {
    if (e->slots[s].req) continue;
    struct ms_request *r;
    if (e->faults && ms_fault_slot_reserved(e, s)) {  /* fault injection (late_admission) */
      if (!(r = ms_fault_take_held(e))) continue;
    } else {
      if (!(r = next_queued(e))) break;
      if (e->faults && ms_fault_hold_request(e, r, s)) continue;
    }
    ms_rt_admit_into(e, s, r);
    slots[n++] = s;
  }
  return n;
}

void ms_rt_admit_into(struct ms_engine *e, int s, struct ms_request *r) {
  struct slot *sl = &e->slots[s];
  sl->req = r;
  sl->pos = ms_pc_admit(e, sl, r);  /* the positions the prefix cache holds */
  sl->next_token = r->prompt[sl->pos];
  sl->finishing = 0;
  sl->admit_seq = e->n_admits++;
  sl->gen++;
  r->slot = s;
  r->generation = sl->gen;
  r->t_admit = ms_eng_now(e);
  if (e->be->info.virtual_clock) r->t_submit = r->t_admit;  /* simulated time starts at admission */
  atomic_store_explicit(&r->state, MS_REQ_ACTIVE, memory_order_release);
}

struct ms_request *ms_rt_request_follow(struct ms_engine *e, const int32_t *prompt, int n_prompt, int max_new,
                                        int record) {
  struct ms_request *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->e = e;
  r->n_prompt = n_prompt;
  r->max_new = max_new;
  r->record = record;  /* its rows' logits are computed as on rank 0 (row_head), kept nowhere */
  r->slot = -1;
  r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
  r->tokens = malloc((size_t)max_new * sizeof *r->tokens);
  if (!r->prompt || !r->tokens) {
    request_free_parts(r);
    return NULL;
  }
  memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *r->prompt);
  atomic_init(&r->refs, 1);  /* no caller holds it */
  atomic_init(&r->state, MS_REQ_QUEUED);
  r->t_submit = ms_now_ns();
  return r;
}

void ms_rt_cancel_mailbox(struct ms_engine *e) {
  int64_t v;
  struct ms_request *held = e->faults ? ms_fault_drop_held(e) : NULL;  /* fault injection (late_admission) */
  if (held) request_finish(held, MS_REQ_CANCELLED);
  struct ms_request *r;
  while ((r = ms_fq_pop(&e->fq))) {
    dequeued(e);
    request_finish(r, MS_REQ_CANCELLED);
  }
  while (!ms_mpmc_pop(&e->mail, &v)) {
    dequeued(e);
    request_finish((struct ms_request *)(intptr_t)v, MS_REQ_CANCELLED);
  }
}

/* Slot sl gets the page that holds position pos if it has none yet (pages in
 * position order: pos / page_size indexes them). */
void ms_rt_kv_reserve(struct ms_engine *e, struct slot *sl, int pos) {
  if (pos / e->o.page_size < sl->n_pages) return;
  MS_ASSERT(sl->n_pages < e->max_pages);
  sl->pages[sl->n_pages++] = ms_pc_page_take(e);
}

/* ---- the request API ---- */

/* A request's arrays (1, or 0 when one could not be had). */
static int request_alloc(struct ms_request *r, const struct ms_request_opts *x, int positions, int vocab) {
  int penal = x->presence_penalty != 0.0f || x->frequency_penalty != 0.0f;
  r->prompt = malloc((size_t)x->n_prompt * sizeof *r->prompt);
  r->tokens = malloc((size_t)x->max_new_tokens * sizeof *r->tokens);
  if (r->record) r->logits = malloc((size_t)positions * (size_t)vocab * sizeof(float));
  if (x->n_bias || penal || x->constrain) r->adj = malloc((size_t)vocab * sizeof *r->adj);
  if (penal) r->stamp = calloc((size_t)vocab, sizeof *r->stamp);
  if (x->n_bias) {
    r->bias_ids = malloc((size_t)x->n_bias * sizeof *r->bias_ids);
    r->bias_vals = malloc((size_t)x->n_bias * sizeof *r->bias_vals);
    if (r->bias_ids && r->bias_vals) {
      memcpy(r->bias_ids, x->bias_ids, (size_t)x->n_bias * sizeof *r->bias_ids);
      memcpy(r->bias_vals, x->bias_vals, (size_t)x->n_bias * sizeof *r->bias_vals);
    }
    r->n_bias = x->n_bias;
  }
  if (x->n_stop_ids) {
    if ((r->stop_ids = malloc((size_t)x->n_stop_ids * sizeof *r->stop_ids)))
      memcpy(r->stop_ids, x->stop_ids, (size_t)x->n_stop_ids * sizeof *r->stop_ids);
    r->n_stop = x->n_stop_ids;
  }
  r->logprobs = x->logprobs || x->top_logprobs > 0;
  r->top_lp = x->top_logprobs;
  if (r->logprobs) r->lp = malloc((size_t)x->max_new_tokens * sizeof *r->lp);
  if (r->top_lp) {
    r->top_ids = malloc((size_t)x->max_new_tokens * (size_t)r->top_lp * sizeof *r->top_ids);
    r->top_vals = malloc((size_t)x->max_new_tokens * (size_t)r->top_lp * sizeof *r->top_vals);
  }
  return r->prompt && r->tokens && (!r->record || r->logits) && (!(x->n_bias || penal || x->constrain) || r->adj) &&
         (!penal || r->stamp) && (!x->n_bias || (r->bias_ids && r->bias_vals)) &&
         (!x->n_stop_ids || r->stop_ids) && (!r->logprobs || r->lp) && (!r->top_lp || (r->top_ids && r->top_vals));
}

struct ms_request *ms_engine_submit(struct ms_engine *e, const struct ms_request_opts *o) {
  if (e->lead == MS_LEAD_FOLLOWER) {  /* requests enter at rank 0, which leads */
    errno = EPERM;
    return NULL;
  }
  if (!o->prompt || o->n_prompt < 1 || o->max_new_tokens < 1) {
    errno = EINVAL;
    return NULL;
  }
  for (int i = 0; i < o->n_prompt; i++)
    if (o->prompt[i] < 0 || o->prompt[i] >= e->m->cfg.vocab) {
      errno = EINVAL;
      return NULL;
    }
  int positions = o->n_prompt + o->max_new_tokens - 1;
  if (positions > e->o.max_ctx) {
    errno = E2BIG;
    return NULL;
  }
  struct ms_request_opts x = {0};  /* the caller's fields, later ones zero */
  memcpy(&x, o, o->sz < sizeof x ? o->sz : sizeof x);
  x.n_prompt = o->n_prompt;  /* the first fields every caller has */
  x.max_new_tokens = o->max_new_tokens;
  if ((x.n_bias && (!x.bias_ids || !x.bias_vals)) || x.n_bias < 0 || (x.n_stop_ids && !x.stop_ids) ||
      x.n_stop_ids < 0 || x.top_logprobs < 0 || x.top_logprobs > 20 || x.presence_penalty != x.presence_penalty ||
      x.frequency_penalty != x.frequency_penalty) {
    errno = EINVAL;
    return NULL;
  }
  for (int i = 0; i < x.n_bias; i++)
    if (x.bias_ids[i] < 0 || x.bias_ids[i] >= e->m->cfg.vocab) {
      errno = EINVAL;
      return NULL;
    }
  struct ms_request *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->e = e;
  r->n_prompt = o->n_prompt;
  r->max_new = o->max_new_tokens;
  r->stop_eos = o->stop_at_eos && e->m->cfg.eos >= 0;
  r->record = o->record_logits;
  r->sample = (struct ms_sample_params){x.temperature, x.top_k, x.top_p, x.sample_seed, x.min_p};
  r->presence = x.presence_penalty;
  r->frequency = x.frequency_penalty;
  r->slot = -1;
  r->client = x.client;
  r->constrain = x.constrain;  /* freed by request_release alone: a refused submit leaves it to the caller */
  r->constrain_free = x.constrain_free;
  r->constrain_user = x.constrain_user;
  int ok = request_alloc(r, &x, positions, e->m->cfg.vocab);
  if (ok) memcpy(r->prompt, o->prompt, (size_t)o->n_prompt * sizeof *r->prompt);
  atomic_init(&r->refs, 2);
  atomic_init(&r->state, MS_REQ_QUEUED);
  r->t_submit = ms_now_ns();
  /* a place in the queue first: the mailbox holds no more than the queue's bound */
  int room = ok && atomic_fetch_add_explicit(&e->queued, 1, memory_order_relaxed) <
                       atomic_load_explicit(&e->max_queued, memory_order_relaxed);
  if (!room && ok) dequeued(e);
  int stopping = atomic_load(&e->stop_req);
  if (!room || stopping || ms_mpmc_push(&e->mail, (int64_t)(intptr_t)r)) {
    if (room) dequeued(e);
    request_free_parts(r);
    errno = !ok ? ENOMEM : stopping ? ESHUTDOWN : EAGAIN;
    return NULL;
  }
  atomic_fetch_add_explicit(&e->mail_seq, 1, memory_order_release);
  ms_futex_wake_all(&e->mail_seq);
  return r;
}

int ms_request_wait(struct ms_request *r, int timeout_ms) {
  uint64_t until = timeout_ms >= 0 ? ms_now_ns() + (uint64_t)timeout_ms * 1000000ull : UINT64_MAX;
  for (;;) {
    uint32_t s = atomic_load_explicit(&r->state, memory_order_acquire);
    if (s == MS_REQ_DONE || s == MS_REQ_CANCELLED) return 0;
    uint64_t now = ms_now_ns();
    if (now >= until) return -ETIMEDOUT;
    uint64_t left_ms = (until - now) / 1000000ull + 1;
    ms_futex_wait(&r->state, s, left_ms > 100 ? 100 : (int)left_ms);
  }
}

int ms_request_wait_tokens(struct ms_request *r, int seen, int timeout_ms) {
  uint64_t until = timeout_ms >= 0 ? ms_now_ns() + (uint64_t)timeout_ms * 1000000ull : UINT64_MAX;
  atomic_fetch_add_explicit(&r->waiters, 1, memory_order_seq_cst);
  int rc = 0;
  for (;;) {
    /* read the sequence before the condition: a token after the check bumps it */
    uint32_t seq = atomic_load_explicit(&r->tok_seq, memory_order_seq_cst);
    uint32_t st = atomic_load_explicit(&r->state, memory_order_acquire);
    if (st == MS_REQ_DONE || st == MS_REQ_CANCELLED ||
        atomic_load_explicit(&r->n_tokens, memory_order_acquire) > seen)
      break;
    uint64_t now = ms_now_ns();
    if (now >= until) {
      rc = -ETIMEDOUT;
      break;
    }
    uint64_t left_ms = (until - now) / 1000000ull + 1;
    ms_futex_wait(&r->tok_seq, seq, left_ms > 100 ? 100 : (int)left_ms);
  }
  atomic_fetch_sub_explicit(&r->waiters, 1, memory_order_relaxed);
  return rc;
}

static void request_end_early(struct ms_request *r, int how) {
  int none = 0;
  if (!atomic_compare_exchange_strong_explicit(&r->cancel, &none, how, memory_order_acq_rel, memory_order_acquire))
    return;
  /* a queued request leaves the queue at the next step start, not when its turn comes */
  if (atomic_load_explicit(&r->state, memory_order_acquire) == MS_REQ_QUEUED)
    atomic_fetch_add_explicit(&r->e->queued_cancels, 1, memory_order_release);
  /* an idle worker 0 sleeps on the mailbox: wake it to retire the request */
  atomic_fetch_add_explicit(&r->e->mail_seq, 1, memory_order_release);
  ms_futex_wake_all(&r->e->mail_seq);
}

void ms_request_cancel(struct ms_request *r) {
  if (r) request_end_early(r, 1);
}

void ms_request_stop(struct ms_request *r) {
  if (r) request_end_early(r, 2);
}

void ms_request_get_info(const struct ms_request *r, struct ms_request_info *out) {
  struct ms_request *w = (struct ms_request *)r;
  out->state = atomic_load_explicit(&w->state, memory_order_acquire);
  out->slot = r->slot;
  out->generation = r->generation;
  out->n_prompt = r->n_prompt;
  out->n_tokens = atomic_load_explicit(&w->n_tokens, memory_order_acquire);
  out->tokens = r->tokens;
  out->n_logits = atomic_load_explicit(&w->n_logits, memory_order_acquire);
  out->logits = r->logits;
  out->t_submit = r->t_submit;
  out->t_admit = r->t_admit;
  out->t_first = r->t_first;
  out->t_done = r->t_done;
  out->finish = (enum ms_finish)atomic_load_explicit(&w->finish, memory_order_relaxed);
  if (out->state != MS_REQ_DONE && out->state != MS_REQ_CANCELLED) out->finish = MS_FINISH_NONE;
  out->logprob = r->lp;
  out->top_logprobs = r->top_lp;
  out->top_ids = r->top_ids;
  out->top_lp = r->top_vals;
  out->n_cached = out->state == MS_REQ_QUEUED ? 0 : r->n_cached;
}

void ms_request_free(struct ms_request *r) {
  if (r) request_release(r);
}
