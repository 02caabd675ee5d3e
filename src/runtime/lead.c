/* SPDX-License-Identifier: MIT */
/* Serving across ranks (ms_engine_opts.tp_lead): one engine in N processes
 * whose requests enter at rank 0 alone, at any time, and may be cancelled or
 * stopped early there. Rank 0 leads: its step start decides each step as one
 * engine does (retire, admit, chunk the prompts), then sends the other ranks
 * a step header over the transport (bcast) before the layout check of dist.c;
 * a follower's step start waits for that header and applies it instead of
 * deciding, so every rank lays out the same rows (the layout check still
 * verifies it).
 *
 * The header (int32 words): magic, kind (idle, step, stop), the step (two
 * words), the counts, then
 *   - the tokens: for each slot that held a request when the step start
 *     began, (slot, its token count, its last token): what rank 0 drew in the
 *     step before. Followers do not sample: rank 0's token is the answer,
 *     whatever its sampler read (temperature, seed, penalties, logit bias, a
 *     structured output's grammar, which lives in rank 0's HTTP layer); it is
 *     needed on the other ranks only as the next step's input, which is when
 *     the header brings it, so sending it costs no wait;
 *   - the retired slots (finished, cancelled by a client gone, stopped early);
 *   - each slot's rows this step (its prompt chunk, 1 when decoding, 0 empty);
 *   - the admissions: (slot, prompt length, max tokens, the positions rank 0's
 *     prefix cache gave it, whether its logits are kept, the prompt).
 * A follower applies them in rank 0's order (tokens, retire, admit), so its
 * prefix cache sees the same calls and gives the same positions (checked).
 *
 * Liveness. While idle (or paused) rank 0 sends an idle header every second
 * (a quarter of comm_timeout_ms when shorter), so a follower that hears
 * nothing for comm_timeout_ms stops with a report naming rank 0 (its first
 * header gets 60 s more: the ranks' starts differ). When rank 0 stops it
 * sends a stop header; a follower then stops too (ms_engine_lead_stopped
 * says so). A follower that stops or hangs is found by rank 0 at the next
 * share or layout check (dist.c).
 *
 * Between two headers rank 0 may send control messages (kind CTL: an
 * attachment carried to every rank, its maps read back; ranks.c), which a
 * follower applies and answers while it waits for the step header.
 *
 * Threads: all of this runs on worker 0, at the step start; the header's
 * buffers are its alone. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/transport.h"
#include "runtime/runtime_impl.h"

#define HDR_MAGIC MS_HDR_MAGIC
#define HDR_WORDS 8           /* magic, kind, step (2), tokens, retired, admitted, slots */

enum { HDR_IDLE = MS_HDR_IDLE, HDR_STEP = MS_HDR_STEP, HDR_STOP = MS_HDR_STOP, HDR_CTL = MS_HDR_CTL };

static int timeout_ms(const struct ms_engine *e) { return e->o.comm_timeout_ms > 0 ? e->o.comm_timeout_ms : 10000; }

int ms_rt_lead_init(struct ms_engine *e) {
  if (e->lead == MS_LEAD_NONE) return 0;
  e->hdr_cap = HDR_WORDS + (size_t)e->n_slots * 8 + 1024;
  e->hdr = malloc(e->hdr_cap * sizeof *e->hdr);
  e->hdr_mark = calloc((size_t)e->n_slots * 3, sizeof *e->hdr_mark);
  return e->hdr && e->hdr_mark ? ms_rt_ranks_init(e) : -ENOMEM;
}

void ms_rt_lead_free(struct ms_engine *e) {
  ms_rt_ranks_free(e);
  free(e->hdr);
  free(e->hdr_mark);
  e->hdr = NULL;
  e->hdr_mark = NULL;
}

/* The engine stops with a report (the first failure's; dist.c's way). */
void ms_rt_lead_failed(struct ms_engine *e, const char *fmt, ...) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&e->tx_failed, &expected, 1)) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&e->log_mu);
    vsnprintf(e->tx_report, sizeof e->tx_report, fmt, ap);
    snprintf(e->stall_report, sizeof e->stall_report, "%s", e->tx_report);
    pthread_mutex_unlock(&e->log_mu);
    va_end(ap);
    atomic_fetch_add(&e->stalls, 1);
  }
  atomic_store_explicit(&e->stop_req, 1, memory_order_release);
}

static int hdr_room(struct ms_engine *e, size_t words) {
  if (words <= e->hdr_cap) return 0;
  int32_t *p = realloc(e->hdr, words * sizeof *p);
  if (!p) return -ENOMEM;
  e->hdr = p;
  e->hdr_cap = words;
  return 0;
}

static void hdr_head(struct ms_engine *e, int kind, int n_tok, int n_ret, int n_adm, int n_slots) {
  int32_t *h = e->hdr;
  h[0] = HDR_MAGIC;
  h[1] = kind;
  h[2] = (int32_t)(uint32_t)e->next_step;
  h[3] = (int32_t)(uint32_t)(e->next_step >> 32);
  h[4] = n_tok;
  h[5] = n_ret;
  h[6] = n_adm;
  h[7] = n_slots;
}

/* ---- rank 0 ---- */

/* Sends the header of `words` words; 0, or a negative errno with *peer the
 * rank that did not take it (-1: unknown). */
static int lead_bcast(struct ms_engine *e, size_t words, int tmo, int *peer) {
  const struct ms_transport *tx = e->tx;
  struct ms_transport_wait w = {.peer = -1};
  int rc = tx->bcast(tx->ctx, 0, e->hdr, words * sizeof *e->hdr, NULL, tmo, &w);
  e->hdr_sent_ns = ms_now_ns();
  *peer = w.peer;
  return rc;
}

/* "rank 1 did not take" or "a rank did not take" */
static const char *who(int peer, char *buf, size_t n) {
  if (peer < 0) return "a rank";
  snprintf(buf, n, "rank %d", peer);
  return buf;
}

void ms_rt_lead_mark(struct ms_engine *e) {
  for (int s = 0; s < e->n_slots; s++) {
    const struct slot *sl = &e->slots[s];
    int64_t *m = e->hdr_mark + 3 * s;
    int n = sl->req ? atomic_load_explicit(&sl->req->n_tokens, memory_order_relaxed) : -1;
    m[0] = n;
    m[1] = n > 0 ? sl->req->tokens[n - 1] : -1;
    m[2] = sl->gen;
  }
}

void ms_rt_lead_idle(struct ms_engine *e) {
  ms_rt_ranks_lead(e);  /* a control message asked for goes at once */
  uint64_t every = (uint64_t)(timeout_ms(e) / 4 < 1000 ? timeout_ms(e) / 4 : 1000) * 1000000ull;
  if (ms_now_ns() - e->hdr_sent_ns < every || atomic_load(&e->tx_failed)) return;
  hdr_head(e, HDR_IDLE, 0, 0, 0, 0);
  int peer, rc = lead_bcast(e, HDR_WORDS, timeout_ms(e), &peer);
  char b[32];
  if (rc)
    ms_rt_lead_failed(e, "rank 0: %s did not take an idle step header (before step %" PRIu64 ") within %d ms: %s\n",
                      who(peer, b, sizeof b), e->next_step, timeout_ms(e),
                      rc == -ETIMEDOUT ? "it hangs or died" : ms_strerror(rc));
}

int ms_rt_lead_send(struct ms_engine *e, int admitted) {
  ms_rt_ranks_lead(e);  /* before the header: the followers apply it between steps */
  int n_tok = 0, n_ret = 0;
  size_t words = HDR_WORDS + (size_t)e->n_slots * 5;
  for (int i = 0; i < admitted; i++) words += 5 + (size_t)e->slots[e->admit_slots[i]].req->n_prompt;
  if (hdr_room(e, words)) {
    ms_rt_lead_failed(e, "rank 0: no memory for step %" PRIu64 "'s header (%zu words)\n", e->next_step, words);
    return -ENOMEM;
  }
  int32_t *p = e->hdr + HDR_WORDS;
  for (int s = 0; s < e->n_slots; s++) {  /* the tokens drawn in the step before */
    const int64_t *m = e->hdr_mark + 3 * s;
    if (m[0] < 0) continue;
    *p++ = s, *p++ = (int32_t)m[0], *p++ = (int32_t)m[1];
    n_tok++;
  }
  for (int s = 0; s < e->n_slots; s++) {  /* retired: gone, or another request in the slot since */
    const int64_t *m = e->hdr_mark + 3 * s;
    if (m[0] >= 0 && (!e->slots[s].req || e->slots[s].gen != (uint32_t)m[2])) *p++ = s, n_ret++;
  }
  for (int s = 0; s < e->n_slots; s++) *p++ = e->slots[s].req ? e->slots[s].chunk : 0;
  for (int i = 0; i < admitted; i++) {
    int s = e->admit_slots[i];
    const struct slot *sl = &e->slots[s];
    const struct ms_request *r = sl->req;
    *p++ = s, *p++ = r->n_prompt, *p++ = r->max_new, *p++ = sl->pos, *p++ = r->record;
    memcpy(p, r->prompt, (size_t)r->n_prompt * sizeof *p);
    p += r->n_prompt;
  }
  hdr_head(e, HDR_STEP, n_tok, n_ret, admitted, e->n_slots);
  int peer, rc = lead_bcast(e, (size_t)(p - e->hdr), timeout_ms(e), &peer);
  char b[32];
  if (rc)
    ms_rt_lead_failed(e, "rank 0: %s did not take step %" PRIu64 "'s header (its admissions, retirements and tokens) "
                      "within %d ms: %s\n", who(peer, b, sizeof b), e->next_step, timeout_ms(e),
                      rc == -ETIMEDOUT ? "it hangs or died" : ms_strerror(rc));
  return rc;
}

void ms_rt_lead_stop(struct ms_engine *e) {
  int peer;
  hdr_head(e, HDR_STOP, 0, 0, 0, 0);
  lead_bcast(e, HDR_WORDS, 2000, &peer);  /* best effort: a rank that cannot hear it stops on its own timeout */
}

/* ---- the other ranks ---- */

/* Rank 0's tokens of the step before: each slot's count is this rank's or one
 * more (then the token is appended, as emit_token does on rank 0). */
static int follow_tokens(struct ms_engine *e, const int32_t *p, int n) {
  uint64_t now = ms_eng_now(e);
  for (int i = 0; i < n; i++, p += 3) {
    int s = p[0], cnt = p[1], tok = p[2];
    struct slot *sl = s >= 0 && s < e->n_slots ? &e->slots[s] : NULL;
    struct ms_request *r = sl ? sl->req : NULL;
    int have = r ? atomic_load_explicit(&r->n_tokens, memory_order_relaxed) : -1;
    if (!r || (cnt != have && (cnt != have + 1 || cnt > r->max_new || tok < 0 || tok >= e->m->cfg.vocab))) {
      ms_rt_lead_failed(e, "rank %d: step %" PRIu64 ": rank 0 drew its token %d for slot %d, which holds %s here%s\n",
                        e->rank, e->next_step, cnt, s, r ? "a request" : "no request",
                        r ? " with another count: the ranks diverged" : ": the ranks diverged");
      return -EPROTO;
    }
    if (cnt == have) continue;
    r->tokens[have] = tok;
    if (have == 0) r->t_first = now;
    atomic_store_explicit(&r->t_last, now, memory_order_relaxed);
    atomic_store_explicit(&r->n_tokens, cnt, memory_order_release);
    atomic_fetch_add_explicit(&e->tokens, 1, memory_order_relaxed);
    sl->next_token = tok;
  }
  return 0;
}

static int follow_admit(struct ms_engine *e, const int32_t *p, const int32_t *end, int n, int *admitted) {
  for (int i = 0; i < n; i++) {
    if (end - p < 5) goto bad;
    int s = p[0], n_prompt = p[1], max_new = p[2], pos = p[3], record = p[4];
    p += 5;
    if (s < 0 || s >= e->n_slots || e->slots[s].req || n_prompt < 1 || max_new < 1 || end - p < n_prompt ||
        n_prompt > e->o.max_ctx || max_new > e->o.max_ctx || n_prompt + max_new - 1 > e->o.max_ctx)
      goto bad;
    for (int j = 0; j < n_prompt; j++)
      if (p[j] < 0 || p[j] >= e->m->cfg.vocab) goto bad;
    struct ms_request *r = ms_rt_request_follow(e, p, n_prompt, max_new, record != 0);
    if (!r) {
      ms_rt_lead_failed(e, "rank %d: no memory for rank 0's request in slot %d (step %" PRIu64 ")\n", e->rank, s,
                        e->next_step);
      return -ENOMEM;
    }
    p += n_prompt;
    ms_rt_admit_into(e, s, r);
    e->admit_slots[(*admitted)++] = s;
    if (e->slots[s].pos != pos) {
      ms_rt_lead_failed(e, "rank %d: step %" PRIu64 ": rank 0's prefix cache gave slot %d's request %d cached "
                        "positions, this rank's %d: the ranks diverged\n", e->rank, e->next_step, s, pos,
                        e->slots[s].pos);
      return -EPROTO;
    }
  }
  return 0;
bad:
  ms_rt_lead_failed(e, "rank %d: step %" PRIu64 "'s header from rank 0 holds an admission this rank cannot take\n",
                    e->rank, e->next_step);
  return -EPROTO;
}

/* Applies a step header of `words` words: 0, or the engine stops (reported). */
static int follow_apply(struct ms_engine *e, size_t words, int *retired, int *admitted) {
  const int32_t *h = e->hdr, *end = e->hdr + words;
  int n_tok = h[4], n_ret = h[5], n_adm = h[6], n_slots = h[7];
  uint64_t step = (uint64_t)(uint32_t)h[2] | (uint64_t)(uint32_t)h[3] << 32;
  if (step != e->next_step || n_slots != e->n_slots || n_tok < 0 || n_tok > n_slots || n_ret < 0 ||
      n_ret > n_slots || n_adm < 0 || n_adm > n_slots ||
      (size_t)(end - h) < HDR_WORDS + (size_t)n_tok * 3 + (size_t)n_ret + (size_t)n_slots) {
    ms_rt_lead_failed(e, "rank %d: rank 0's header is for step %" PRIu64 " of %d slots, this rank is at step %" PRIu64
                      " of %d: the ranks diverged\n", e->rank, step, n_slots, e->next_step, e->n_slots);
    return -EPROTO;
  }
  const int32_t *p = h + HDR_WORDS;
  if (follow_tokens(e, p, n_tok)) return -EPROTO;
  p += 3 * n_tok;
  for (int i = 0; i < n_ret; i++, p++) {
    if (*p < 0 || *p >= e->n_slots || !e->slots[*p].req) {
      ms_rt_lead_failed(e, "rank %d: step %" PRIu64 ": rank 0 retired slot %d, empty here: the ranks diverged\n",
                        e->rank, e->next_step, *p);
      return -EPROTO;
    }
    e->slots[*p].finishing = 1;  /* retired below, as rank 0 retired it */
  }
  const int32_t *chunks = p;
  p += n_slots;
  *retired = ms_rt_retire(e, 0);
  *admitted = 0;
  if (follow_admit(e, p, end, n_adm, admitted)) return -EPROTO;
  for (int s = 0; s < e->n_slots; s++) {
    struct slot *sl = &e->slots[s];
    int c = chunks[s];
    if (sl->req ? c < 1 || sl->pos + c > sl->req->n_prompt + sl->req->max_new : c != 0) {
      ms_rt_lead_failed(e, "rank %d: step %" PRIu64 ": rank 0 gives slot %d %d rows, which does not fit it here: the "
                        "ranks diverged\n", e->rank, e->next_step, s, c);
      return -EPROTO;
    }
    sl->chunk = c;
  }
  return 0;
}

int ms_rt_follow(struct ms_engine *e, int *retired, int *admitted) {
  const struct ms_transport *tx = e->tx;
  /* the first header waits for rank 0's start too (its model, its plans) */
  uint64_t limit = (uint64_t)timeout_ms(e) + (e->hdr_heard ? 0 : 60000), waited = 0;
  for (;;) {
    if (atomic_load_explicit(&e->stop_req, memory_order_acquire)) return 0;
    struct ms_transport_wait w = {.peer = -1};
    size_t got = 0;
    int rc = tx->bcast(tx->ctx, 0, e->hdr, e->hdr_cap * sizeof *e->hdr, &got, 200, &w);
    if (rc == -ETIMEDOUT && (waited += w.waited_ns / 1000000ull) < limit) continue;
    if (rc == -EMSGSIZE) {
      if (!hdr_room(e, got / sizeof *e->hdr + 1)) continue;
      ms_rt_lead_failed(e, "rank %d: no memory for rank 0's header of %zu bytes (step %" PRIu64 ")\n", e->rank, got,
                        e->next_step);
      return 0;
    }
    if (rc) {
      ms_rt_lead_failed(e, "rank %d: rank 0 sent no step header for %" PRIu64 " ms (it sends one at least every second "
                        "while it runs, idle or not), before step %" PRIu64 ": %s\n", e->rank, waited, e->next_step,
                        rc == -ETIMEDOUT ? "it hangs or died" : ms_strerror(rc));
      return 0;
    }
    waited = 0;
    e->hdr_heard = 1;
    limit = (uint64_t)timeout_ms(e);
    if (got >= 2 * sizeof *e->hdr && e->hdr[0] == HDR_MAGIC && e->hdr[1] == HDR_CTL) {
      if (ms_rt_ranks_follow(e, got)) return 0;  /* rank 0's control message (ranks.c), between steps */
      continue;
    }
    if (got < HDR_WORDS * sizeof *e->hdr || e->hdr[0] != HDR_MAGIC) {
      ms_rt_lead_failed(e, "rank %d: rank 0 sent %zu bytes that are no step header (before step %" PRIu64 ")\n",
                        e->rank, got, e->next_step);
      return 0;
    }
    if (e->hdr[1] == HDR_IDLE) continue;
    if (e->hdr[1] == HDR_STOP) {
      e->lead_stopped = 1;
      return 0;
    }
    return !follow_apply(e, got / sizeof *e->hdr, retired, admitted);
  }
}

int ms_engine_wait_stopped(struct ms_engine *e, int timeout_ms) {
  uint64_t until = timeout_ms >= 0 ? ms_now_ns() + (uint64_t)timeout_ms * 1000000ull : UINT64_MAX;
  while (!atomic_load_explicit(&e->stopped, memory_order_acquire)) {
    uint64_t now = ms_now_ns();
    if (now >= until) return -ETIMEDOUT;
    uint64_t left = (until - now) / 1000000ull + 1;
    ms_futex_wait(&e->stopped, 0, left > 100 ? 100 : (int)left);
  }
  return 0;
}

int ms_engine_lead_stopped(const struct ms_engine *e) {
  /* written by worker 0 before its release store of stopped */
  return atomic_load_explicit(&((struct ms_engine *)e)->stopped, memory_order_acquire) && e->lead_stopped;
}
