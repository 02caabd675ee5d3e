/* SPDX-License-Identifier: MIT */
/* Watching an engine served across ranks as one (megascope/attach.h, "across
 * ranks"): rank 0's attachments carried to every other rank, and the other
 * ranks' maps and coverage read back into rank 0.
 *
 * DESIGN
 * Who runs what. The control server's thread (rank 0) asks for an operation
 * (attach, detach, sync) and waits for it; rank 0's worker 0 runs it before
 * its next step header, or in its idle loop (lead.c): one control message
 * (bcast, the header's channel, kind CTL) to every other rank, whose worker 0,
 * waiting for that header, applies it (verifies and attaches the object,
 * detaches, copies its maps) and answers (the transport's gather). So a
 * follower's control work happens between two steps, as the step header's
 * does, never while a step runs; no other channel is opened.
 *
 * What rank 0 keeps. For each carried attachment, every other rank's
 * coverage and a mirror of each of its maps: a map of the same definition in
 * this process, written with the follower's copy (ms_bpf_map_restore) at each
 * sync, whose memfd the control server hands over like the engine's own. A
 * reader merges the ranks' maps as it merges replicas (ms_query_maps_of_union:
 * counts and buckets add, min and max take the extreme). A ring buffer's
 * records are not copied but moved: a follower consumes its ring at each read
 * and rank 0 appends them to its copy, where readers find them.
 *
 * Failure. A follower that refuses an attach (its loader, verifier or budget)
 * is named in the log; the ranks that attached detach again, and the caller
 * detaches rank 0's. A follower that does not answer within comm_timeout_ms
 * stops the engine with a report naming it, as a step header not taken does.
 *
 * Locks: `call` lets one operation through at a time; `mu` guards the
 * operation's slot and the carried attachments (their mirrors), which worker 0
 * writes and the control thread reads. Worker 0 never waits for `call`. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megascope/attach.h"
#include "megascope/bpf.h"
#include "megascope/transport.h"
#include "runtime/runtime_impl.h"

enum {
  OP_NONE = 0, OP_ATTACH = 1, OP_DETACH = 2, OP_SYNC = 3, OP_STATS = 4, OP_TRACE_START = 5, OP_TRACE_STOP = 6,
  OP_REPLACE = 7
};

#define CTL_WORDS 4          /* magic, kind CTL, op, id (attach, replace, detach) or count (sync) */
#define ATTACH_WORDS 6       /* attach, replace: max_per_step, sample_every, interpret, ringbuf_bytes (2), size */
#define NAME_BYTES 64
#define MAX_MAPS 64

struct carried {
  int id;                    /* rank 0's attachment */
  int n_maps;
  struct ms_bpf_map **mir;   /* [size][MAX_MAPS]: rank r's maps as last read (row 0 unused) */
  struct ms_coverage *cov;   /* [size]: rank r's coverage as last read */
  uint8_t *seen;             /* [size]: rank r answered for it */
};

/* Another rank's counters, as its last answer to a stats read gave them. */
struct rank_stats {
  int have;
  struct ms_engine_stats st;
  struct ms_comm_stats cs;
  int n_os;
  struct ms_worker_os *os;   /* [n_os] */
};

struct ms_ranks {
  pthread_mutex_t call, mu;
  pthread_cond_t cv;
  int size;
  /* the operation asked for (mu) */
  _Atomic int pending;       /* release by the asker, acquire by worker 0 */
  int op, id, rc;
  uint8_t *msg;
  size_t msg_len;
  uint64_t asked, done;
  char why[2048];
  /* rank 0: what it carried (mu) */
  struct carried *att;
  int n_att;
  int held[64];              /* rank r's attachments held, as its last answer said (-1: none yet) */
  struct rank_stats stats[64];
  struct ms_rank_trace trace[64];  /* rank r's records of the last trace, on rank 0's clock */
  uint64_t t_sent, t_answered;     /* the last control message: sent (before bcast), answered (after gather) */
  /* a follower: rank 0's attachment ids against this rank's (worker 0 alone) */
  int (*local)[2];
  int n_local;
};

static int timeout_ms(const struct ms_engine *e) { return e->o.comm_timeout_ms > 0 ? e->o.comm_timeout_ms : 10000; }

int ms_rt_ranks_init(struct ms_engine *e) {
  const struct ms_transport *tx = e->tx;
  /* a transport without gather (an older table), or more ranks than an
   * answer's arrays hold: rank 0's attachments stay its own */
  if (tx->sz < offsetof(struct ms_transport, gather) + sizeof tx->gather || !tx->gather || tx->size > 64) return 0;
  struct ms_ranks *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  pthread_mutex_init(&r->call, NULL);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->size = e->tx->size;
  for (int p = 0; p < 64; p++) r->held[p] = -1;
  e->ranks = r;
  return 0;
}

static void trace_free(struct ms_rank_trace *t) {
  for (int w = 0; t->rec && w < t->n_workers; w++) free(t->rec[w]);
  free(t->rec);
  free(t->n);
  free(t->dropped);
  *t = (struct ms_rank_trace){0};
}

static void carried_free(struct ms_ranks *r, struct carried *c) {
  for (int i = 0; c->mir && i < r->size * MAX_MAPS; i++) ms_bpf_map_free(c->mir[i]);
  free(c->mir);
  free(c->cov);
  free(c->seen);
}

/* The other ranks' copies of c's maps and coverage dropped (a replace). */
static void mirrors_forget(struct ms_ranks *r, struct carried *c) {
  for (int i = 0; i < r->size * MAX_MAPS; i++) ms_bpf_map_free(c->mir[i]), c->mir[i] = NULL;
  memset(c->cov, 0, sizeof *c->cov * (size_t)r->size);
  memset(c->seen, 0, (size_t)r->size);
  c->n_maps = 0;
}

void ms_rt_ranks_free(struct ms_engine *e) {
  struct ms_ranks *r = e->ranks;
  if (!r) return;
  for (int i = 0; i < r->n_att; i++) carried_free(r, &r->att[i]);
  for (int p = 0; p < 64; p++) free(r->stats[p].os), trace_free(&r->trace[p]);
  free(r->att);
  free(r->local);
  free(r->msg);
  pthread_mutex_destroy(&r->call);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
  e->ranks = NULL;
}

int ms_engine_ranks(const struct ms_engine *e) {
  return e->lead == MS_LEAD_LEADER && e->ranks ? e->ranks->size : 1;
}

/* ---- a growing byte buffer (messages and answers) ---- */

struct buf {
  uint8_t *p;
  size_t len, cap;
  int oom;
};

static void put(struct buf *b, const void *data, size_t n) {
  if (b->oom) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  if (data) memcpy(b->p + b->len, data, n);
  else memset(b->p + b->len, 0, n);
  b->len += n;
}

static void put32(struct buf *b, int32_t v) { put(b, &v, sizeof v); }

/* A reader over an answer: every take is checked against the end. */
struct cur {
  const uint8_t *p, *end;
  int bad;
};

static const void *take(struct cur *c, size_t n) {
  if (c->bad || (size_t)(c->end - c->p) < n) {
    c->bad = 1;
    return NULL;
  }
  const void *at = c->p;
  c->p += n;
  return at;
}

static int32_t take32(struct cur *c) {
  const void *at = take(c, 4);
  int32_t v = 0;
  if (at) memcpy(&v, at, 4);
  return v;
}

/* ---- a follower ---- */

static int local_id(const struct ms_ranks *r, int id0) {
  for (int i = 0; i < r->n_local; i++)
    if (r->local[i][0] == id0) return r->local[i][1];
  return 0;
}

static void local_forget(struct ms_ranks *r, int id0) {
  for (int i = 0; i < r->n_local; i++)
    if (r->local[i][0] == id0) memcpy(r->local[i--], r->local[--r->n_local], sizeof *r->local);
}

/* Rank 0's object and options from an attach or replace message, the
 * monitor opened (not yet verified: the engine's attach or replace does it);
 * NULL with the reason in tb. */
static struct ms_monitor *take_object(struct cur *c, int id0, struct ms_attach_opts *o, struct ms_textbuf *tb) {
  const int32_t *w = take(c, ATTACH_WORDS * 4);
  const char *name = take(c, NAME_BYTES);
  const void *obj = w ? take(c, (size_t)(uint32_t)w[5]) : NULL;
  char nm[NAME_BYTES + 1] = "";
  if (!obj || !name) {
    ms_textbuf_printf(tb, "rank 0's control message for attachment %d is cut short\n", id0);
    errno = EPROTO;
    return NULL;
  }
  memcpy(nm, name, NAME_BYTES);
  *o = (struct ms_attach_opts){.sz = sizeof *o, .max_per_step = (uint32_t)w[0], .sample_every = (uint32_t)w[1],
                               .interpret = (uint32_t)w[2],
                               .ringbuf_bytes = (uint64_t)(uint32_t)w[3] | (uint64_t)(uint32_t)w[4] << 32};
  return ms_monitor_open_mem(obj, (size_t)(uint32_t)w[5], nm, tb);
}

/* Rank 0's object, verified and attached here: the answer is (rc, log). */
static void follow_attach(struct ms_engine *e, struct cur *c, int id0, struct buf *ans) {
  struct ms_ranks *r = e->ranks;
  char log[4096] = "";
  struct ms_textbuf tb = {log, sizeof log, 0, 0};
  struct ms_attach_opts o;
  int (*grown)[2] = realloc(r->local, sizeof *r->local * (size_t)(r->n_local + 1));
  if (grown) r->local = grown;
  errno = 0;
  struct ms_monitor *m = grown ? take_object(c, id0, &o, &tb) : NULL;
  int rc = !grown ? -ENOMEM : !m ? -(errno ? errno : EINVAL) : ms_engine_attach(e, m, &o, &tb);
  if (m && rc < 0) ms_monitor_free(m);
  if (rc > 0) {
    r->local[r->n_local][0] = id0;
    r->local[r->n_local++][1] = rc;
    rc = 0;
  }
  put32(ans, rc);
  put(ans, log, strlen(log) + 1);
}

/* Rank 0's replacing object, verified and swapped in for this rank's copy of
 * attachment id0 (the engine's replace: the old program runs until the new
 * one is verified): the answer is (rc, log), as an attach's. */
static void follow_replace(struct ms_engine *e, struct cur *c, int id0, struct buf *ans) {
  char log[4096] = "";
  struct ms_textbuf tb = {log, sizeof log, 0, 0};
  struct ms_attach_opts o;
  int id = local_id(e->ranks, id0), rc;
  errno = 0;
  struct ms_monitor *m = take_object(c, id0, &o, &tb);
  if (!m) rc = -(errno ? errno : EINVAL);
  else if (!id) rc = -ENOENT, ms_textbuf_printf(&tb, "rank %d holds no copy of attachment %d\n", e->rank, id0);
  else rc = ms_engine_replace_opts(e, id, m, &o, &tb);
  if (m && rc < 0) ms_monitor_free(m);
  put32(ans, rc < 0 ? rc : 0);
  put(ans, log, strlen(log) + 1);
}

/* A ring buffer's record, taken from this rank's ring: (size, pad, bytes
 * 8-aligned). */
static int put_record(void *user, const void *data, uint32_t size) {
  struct buf *ans = user;
  put32(ans, (int32_t)size);
  put32(ans, 0);
  size_t at = ans->len;
  put(ans, NULL, ((size_t)size + 7) / 8 * 8);
  if (!ans->oom) memcpy(ans->p + at, data, size);
  return 0;
}

static int put_maps(const struct ms_attach_view *v, void *arg) {
  struct buf *ans = arg;
  put32(ans, v->n_maps);
  put32(ans, 0);
  for (int i = 0; i < v->n_maps; i++) {
    uint64_t n = 0;
    size_t at = ans->len;
    put(ans, &n, sizeof n);
    if (ms_bpf_map_info(v->maps[i])->type == MS_BPF_MAP_RINGBUF) {
      /* its records move to rank 0's copy (consumed here: rank 0's ring holds them now) */
      ms_bpf_ringbuf_consume(v->maps[i], put_record, ans);
      n = ans->oom ? 0 : ans->len - at - sizeof n;
    } else {
      n = ms_bpf_map_bytes(v->maps[i]);
      size_t data = ans->len;
      put(ans, NULL, (size_t)(n + 7) / 8 * 8);
      if (!ans->oom) ms_bpf_map_snapshot(v->maps[i], ans->p + data, (size_t)n);
    }
    if (!ans->oom) memcpy(ans->p + at, &n, sizeof n);
  }
  return 0;
}

/* Attachment id0's state here: (id0, rc, coverage, this rank's clock now,
 * n_maps, pad, then each map's length and bytes, 8-aligned: a copy of its
 * memory, or for a ring buffer the records taken from it since the last
 * read, each (size, pad, bytes)). */
static void follow_state(struct ms_engine *e, int id0, struct buf *ans) {
  int id = local_id(e->ranks, id0);
  struct ms_coverage cov = {0};
  int rc = id ? ms_engine_attach_coverage(e, id, 0, &cov) : -ENOENT;
  uint64_t now = ms_now_ns();  /* rank 0 moves the coverage's times onto its clock by it */
  put32(ans, id0);
  put32(ans, rc);
  put(ans, &cov, sizeof cov);
  put(ans, &now, sizeof now);
  if (rc || ms_engine_attach_visit(e, id, put_maps, ans) < 0) put32(ans, 0), put32(ans, 0);
}

/* Detached, then its last state is put in the answer (its coverage closed),
 * then its maps are freed at once (no control server reaps here: rank 0
 * holds their last copy). */
static void follow_detach(struct ms_engine *e, int id0, struct buf *ans) {
  int id = local_id(e->ranks, id0);
  if (id) ms_engine_detach(e, id);
  follow_state(e, id0, ans);
  if (!id) return;
  ms_engine_attach_release(e, id);
  local_forget(e->ranks, id0);
}

/* This rank's counters: (stats, comm stats, n workers, pad, each worker's
 * ms_worker_os); raw structs: every rank runs the same executable (the launch
 * check). */
static void follow_stats(struct ms_engine *e, struct buf *ans) {
  struct ms_engine_stats st;
  struct ms_comm_stats cs;
  ms_engine_get_stats(e, &st);
  ms_engine_comm_stats(e, &cs);
  put(ans, &st, sizeof st);
  put(ans, &cs, sizeof cs);
  put32(ans, e->n_workers);
  put32(ans, 0);
  for (int w = 0; w < e->n_workers; w++) {
    struct ms_worker_os os = {.pinned_cpu = -1, .last_cpu = -1};
    ms_engine_worker_os(e, w, &os);
    put(ans, &os, sizeof os);
  }
}

/* Rank 0 starts or stops a trace: this rank too. A start answers (rc, this
 * rank's clock now): rank 0 takes the offset of the clocks from it. A stop
 * answers this rank's records: (workers, then each worker's count, dropped
 * and records, raw: the same executable on every rank). */
static void follow_trace(struct ms_engine *e, int start, uint32_t rpw, struct buf *ans) {
  if (start) {
    int rc = ms_engine_trace_start(e, rpw);
    uint64_t now = ms_eng_now(e);
    put32(ans, rc);
    put32(ans, 0);
    put(ans, &now, sizeof now);
    return;
  }
  ms_engine_trace_stop(e);
  put32(ans, e->n_workers);
  put32(ans, 0);
  for (int w = 0; w < e->n_workers; w++) {
    uint32_t n = ms_tel_published(e, w);
    uint64_t dropped = atomic_load(&e->workers[w].trace_dropped);
    put32(ans, (int32_t)n);
    put32(ans, 0);
    put(ans, &dropped, sizeof dropped);
    put(ans, e->workers[w].trace, (size_t)n * sizeof(struct trace_rec));
  }
}

int ms_rt_ranks_follow(struct ms_engine *e, size_t bytes) {
  struct cur c = {(const uint8_t *)e->hdr, (const uint8_t *)e->hdr + bytes, 0};
  const int32_t *h = take(&c, CTL_WORDS * 4);
  struct buf ans = {0};
  int op = h && e->ranks ? h[2] : OP_NONE, arg = h ? h[3] : 0;
  if (op == OP_ATTACH) {
    follow_attach(e, &c, arg, &ans);
  } else if (op == OP_REPLACE) {
    follow_replace(e, &c, arg, &ans);
  } else if (op == OP_DETACH) {
    follow_detach(e, arg, &ans);
  } else if (op == OP_SYNC && arg >= 0) {
    for (int i = 0; i < arg; i++) {
      int id0 = take32(&c);
      if (!c.bad) follow_state(e, id0, &ans);
    }
  }
  if (op == OP_STATS) follow_stats(e, &ans);
  if (op == OP_TRACE_START || op == OP_TRACE_STOP) follow_trace(e, op == OP_TRACE_START, (uint32_t)arg, &ans);
  if (op == OP_DETACH || op == OP_SYNC) {  /* what this rank holds after it, for rank 0's list */
    put32(&ans, -1);
    put32(&ans, ms_engine_attach_count(e));
  } else if (op != OP_ATTACH && op != OP_REPLACE && op != OP_STATS && op != OP_TRACE_START &&
             op != OP_TRACE_STOP) {
    c.bad = 1;
  }
  if (c.bad || ans.oom) {
    ms_rt_lead_failed(e, "rank %d: rank 0's control message (operation %d, %zu bytes) cannot be %s\n", e->rank, op,
                      bytes, ans.oom ? "answered: no memory" : "read");
    free(ans.p);
    return -EPROTO;
  }
  const struct ms_transport *tx = e->tx;
  struct ms_transport_wait w = {.peer = -1};
  int rc = tx->gather(tx->ctx, 0, ans.p, ans.len, NULL, NULL, timeout_ms(e), &w);
  free(ans.p);
  if (rc)
    ms_rt_lead_failed(e, "rank %d: rank 0 did not take this rank's answer to its control message within %d ms: %s\n",
                      e->rank, timeout_ms(e), rc == -ETIMEDOUT ? "it hangs or died" : ms_strerror(rc));
  return rc;
}

/* ---- rank 0 ---- */

static struct carried *carried_find(struct ms_ranks *r, int id) {
  for (int i = 0; i < r->n_att; i++)
    if (r->att[i].id == id) return &r->att[i];
  return NULL;
}

static struct carried *carried_add(struct ms_ranks *r, int id) {
  struct carried *grown = realloc(r->att, sizeof *grown * (size_t)(r->n_att + 1));
  if (!grown) return NULL;
  r->att = grown;
  struct carried *c = &r->att[r->n_att];
  *c = (struct carried){.id = id};
  c->mir = calloc((size_t)r->size * MAX_MAPS, sizeof *c->mir);
  c->cov = calloc((size_t)r->size, sizeof *c->cov);
  c->seen = calloc((size_t)r->size, 1);
  if (!c->mir || !c->cov || !c->seen) {
    carried_free(r, c);
    return NULL;
  }
  r->n_att++;
  return c;
}

/* Rank p's copy of map i of c, written into its mirror (made on first use,
 * of rank 0's own map's definition and rank p's worker count). */
static int mirror_write(struct ms_engine *e, struct carried *c, int p, int i, const uint8_t *bytes, uint64_t n) {
  struct ms_bpf_map **slot = &c->mir[p * MAX_MAPS + i];
  if (!*slot) {
    struct ms_bpf_map *mine[MAX_MAPS];
    int k = ms_engine_attach_maps(e, c->id, mine, MAX_MAPS);
    if (k <= i) return -ENOENT;
    const struct ms_bpf_map_def *def = ms_bpf_map_info(mine[i]);
    const struct ms_bpf_map_shm *h = (const struct ms_bpf_map_shm *)bytes;  /* a copy's header (not a ring's) */
    uint32_t workers = def->type != MS_BPF_MAP_RINGBUF && n >= sizeof *h ? h->n_workers : (uint32_t)e->n_workers;
    if (!(*slot = ms_bpf_map_new(def, workers, NULL))) return -ENOMEM;
  }
  if (ms_bpf_map_info(*slot)->type != MS_BPF_MAP_RINGBUF) return n ? ms_bpf_map_restore(*slot, bytes, (size_t)n) : 0;
  for (uint64_t at = 0; at + 8 <= n;) {  /* rank p's records since the last read, appended */
    uint32_t size;
    memcpy(&size, bytes + at, sizeof size);
    if (size > n - at - 8) return -EPROTO;
    ms_bpf_ringbuf_output(*slot, bytes + at + 8, size);  /* full: counted lost by the copy */
    at += 8 + ((uint64_t)size + 7) / 8 * 8;
  }
  return 0;
}

/* One rank's answer to a sync or a detach: its attachments' states (mu held). */
static int take_states(struct ms_engine *e, int p, struct cur *c) {
  struct ms_ranks *r = e->ranks;
  while (!c->bad && c->p < c->end) {
    int id0 = take32(c), rc = take32(c);
    if (id0 == -1) {  /* the last record: the attachments rank p holds */
      r->held[p] = rc;
      continue;
    }
    const struct ms_coverage *cov = take(c, sizeof *cov);
    const uint64_t *then = take(c, sizeof *then);
    int n_maps = take32(c);
    take32(c);
    struct carried *at = carried_find(r, id0);
    if (c->bad || n_maps < 0 || n_maps > MAX_MAPS) return -EPROTO;
    if (at && !rc) {
      /* its times onto this rank's clock: the answer left rank p at *then,
       * and is here now (the message's time is the error) */
      int64_t shift = (int64_t)(ms_now_ns() - *then);
      at->cov[p] = *cov;
      if (cov->t_start) at->cov[p].t_start = cov->t_start + (uint64_t)shift;
      if (cov->t_end) at->cov[p].t_end = cov->t_end + (uint64_t)shift;
      at->seen[p] = 1;
      at->n_maps = n_maps;
    }
    for (int i = 0; i < n_maps; i++) {
      const uint64_t *n = take(c, 8);
      const uint8_t *bytes = n && *n <= (uint64_t)(c->end - c->p) ? take(c, (size_t)(*n + 7) / 8 * 8) : NULL;
      if (!bytes) return -EPROTO;
      if (at && !rc && mirror_write(e, at, p, i, bytes, *n))
        snprintf(r->why, sizeof r->why, "rank %d: its map %d of attachment %d does not fit rank 0's", p, i, id0);
    }
  }
  return c->bad ? -EPROTO : 0;
}

/* Every rank's answer to an attach: rank p's refusal is named (the first). */
static int take_verdicts(struct ms_ranks *r, void **out, size_t *len, int *ok) {
  int rc = 0;
  for (int p = 1; p < r->size; p++) {
    struct cur c = {out[p], (const uint8_t *)out[p] + len[p], 0};
    int v = take32(&c);
    const char *log = (const char *)c.p;
    ok[p] = !c.bad && !v;
    if (ok[p] || rc) continue;
    rc = c.bad ? -EPROTO : v;
    snprintf(r->why, sizeof r->why, "rank %d refused it: %s\n%.*s", p, c.bad ? "its answer is cut short" :
             ms_strerror(v), c.bad ? 0 : (int)strnlen(log, (size_t)(c.end - c.p)), log);
  }
  return rc;
}

/* The message out and every other rank's answer back; 0, or the engine stops. */
static int exchange(struct ms_engine *e, const void *msg, size_t len, void **out, size_t *lens) {
  const struct ms_transport *tx = e->tx;
  struct ms_transport_wait w = {.peer = -1};
  e->ranks->t_sent = ms_eng_now(e);
  int rc = tx->bcast(tx->ctx, 0, (void *)msg, len, NULL, timeout_ms(e), &w);
  if (!rc) rc = tx->gather(tx->ctx, 0, NULL, 0, out, lens, timeout_ms(e), &w);
  e->ranks->t_answered = ms_eng_now(e);
  if (rc) {
    char who[32] = "a rank";
    if (w.peer >= 0) snprintf(who, sizeof who, "rank %d", w.peer);
    snprintf(e->ranks->why, sizeof e->ranks->why, "%s did not take or answer rank 0's control message within %d "
             "ms: %s", who, timeout_ms(e), rc == -ETIMEDOUT ? "it hangs or died" : ms_strerror(rc));
    ms_rt_lead_failed(e, "rank 0: %s\n", e->ranks->why);
  }
  return rc;
}

static void answers_free(struct ms_ranks *r, void **out) {
  for (int p = 0; p < r->size; p++) free(out[p]);
}

/* Rank 0's detach message for id, and what the ranks answer (mu held). */
static int lead_detach(struct ms_engine *e, int id) {
  struct ms_ranks *r = e->ranks;
  int32_t msg[CTL_WORDS] = {MS_HDR_MAGIC, MS_HDR_CTL, OP_DETACH, id};
  void *out[64] = {0};
  size_t lens[64];
  int rc = exchange(e, msg, sizeof msg, out, lens);
  for (int p = 1; !rc && p < r->size; p++) {
    struct cur c = {out[p], (const uint8_t *)out[p] + lens[p], 0};
    rc = take_states(e, p, &c);
  }
  answers_free(r, out);
  return rc;
}

/* Rank p's answer to a stats read (mu held). */
static int take_stats(struct ms_ranks *r, int p, struct cur *c) {
  struct rank_stats *rs = &r->stats[p];
  const struct ms_engine_stats *st = take(c, sizeof *st);
  const struct ms_comm_stats *cs = take(c, sizeof *cs);
  int n = take32(c);
  take32(c);
  const struct ms_worker_os *os = n >= 0 && n <= 4096 ? take(c, (size_t)n * sizeof *os) : NULL;
  if (c->bad || !os) return -EPROTO;
  struct ms_worker_os *mine = realloc(rs->os, (size_t)(n ? n : 1) * sizeof *mine);
  if (!mine) return -ENOMEM;
  memcpy(mine, os, (size_t)n * sizeof *mine);
  *rs = (struct rank_stats){.have = 1, .st = *st, .cs = *cs, .n_os = n, .os = mine};
  return 0;
}

/* Rank p's answer to a trace start: the offset of its clock from this
 * rank's, as NTP takes it: it read its clock between the message's send and
 * its answer's arrival here, so at their middle, give or take half the round
 * trip (the bound kept). */
static int take_trace_start(struct ms_ranks *r, int p, struct cur *c) {
  int rc = take32(c);
  take32(c);
  const uint64_t *then = take(c, sizeof *then);
  if (c->bad) return -EPROTO;
  if (rc) {
    snprintf(r->why, sizeof r->why, "rank %d cannot start its trace: %s", p, ms_strerror(rc));
    return rc;
  }
  trace_free(&r->trace[p]);
  r->trace[p].shift = (int64_t)((r->t_sent + r->t_answered) / 2 - *then);
  r->trace[p].err_ns = (r->t_answered - r->t_sent) / 2;
  return 0;
}

static int take_trace_stop(struct ms_ranks *r, int p, struct cur *c) {
  struct ms_rank_trace *t = &r->trace[p];
  int n = take32(c);
  take32(c);
  if (c->bad || n < 0 || n > 4096) return -EPROTO;
  int64_t shift = t->shift;
  uint64_t err = t->err_ns;
  trace_free(t);
  t->shift = shift, t->err_ns = err;
  t->rec = calloc((size_t)n + 1, sizeof *t->rec);
  t->n = calloc((size_t)n + 1, sizeof *t->n);
  t->dropped = calloc((size_t)n + 1, sizeof *t->dropped);
  if (!t->rec || !t->n || !t->dropped) return -ENOMEM;
  t->n_workers = n;
  for (int w = 0; w < n; w++) {
    uint32_t k = (uint32_t)take32(c);
    take32(c);
    const uint64_t *dropped = take(c, sizeof *dropped);
    const struct trace_rec *rec = take(c, (size_t)k * sizeof *rec);
    if (!dropped || !rec) return -EPROTO;
    if (!(t->rec[w] = malloc((size_t)(k ? k : 1) * sizeof *rec))) return -ENOMEM;
    memcpy(t->rec[w], rec, (size_t)k * sizeof *rec);
    for (uint32_t i = 0; i < k; i++) {  /* onto rank 0's clock */
      t->rec[w][i].t_begin += (uint64_t)shift, t->rec[w][i].t_end += (uint64_t)shift;
      t->rec[w][i].t_ready += (uint64_t)shift;
    }
    t->n[w] = k;
    t->dropped[w] = *dropped;
  }
  t->have = 1;
  return 0;
}

static int lead_run(struct ms_engine *e) {
  struct ms_ranks *r = e->ranks;
  void *out[64] = {0};
  size_t lens[64];
  int ok[64] = {0};
  int rc = exchange(e, r->msg, r->msg_len, out, lens), verdicts = r->op == OP_ATTACH || r->op == OP_REPLACE;
  if (!rc && verdicts && (rc = take_verdicts(r, out, lens, ok))) {
    /* the ranks that took it let it go; a replace refused by one rank leaves
     * none with the attachment, rather than ranks running different programs */
    struct carried *c = carried_find(r, r->id);
    char why[sizeof r->why];
    memcpy(why, r->why, sizeof why);  /* the refusal, not what the last reads say */
    lead_detach(e, r->id);
    memcpy(r->why, why, sizeof why);
    if (c) carried_free(r, c), *c = r->att[--r->n_att];
  } else if (!rc && r->op == OP_REPLACE) {
    struct carried *c = carried_find(r, r->id);
    if (c) mirrors_forget(r, c);  /* the new program's maps may differ: read afresh at the next sync */
  }
  for (int p = 1; !rc && !verdicts && p < r->size; p++) {
    struct cur c = {out[p], (const uint8_t *)out[p] + lens[p], 0};
    rc = r->op == OP_STATS ? take_stats(r, p, &c) : r->op == OP_TRACE_START ? take_trace_start(r, p, &c)
         : r->op == OP_TRACE_STOP ? take_trace_stop(r, p, &c) : take_states(e, p, &c);
    if (rc && !r->why[0]) snprintf(r->why, sizeof r->why, "rank %d's answer cannot be read", p);
  }
  answers_free(r, out);
  return rc;
}

void ms_rt_ranks_lead(struct ms_engine *e) {
  struct ms_ranks *r = e->ranks;
  if (!r || !atomic_load_explicit(&r->pending, memory_order_acquire)) return;
  pthread_mutex_lock(&r->mu);
  r->rc = atomic_load(&e->tx_failed) ? -EPIPE : lead_run(e);
  r->done = r->asked;
  atomic_store_explicit(&r->pending, 0, memory_order_relaxed);
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* Hands the message (taken over) to worker 0 and waits for its answer. An
 * engine that stops meanwhile answers -EPIPE. 0 or a negative error with the
 * reason in why. */
static int ranks_call(struct ms_engine *e, int op, int id, struct buf *msg, char *why, size_t why_n) {
  struct ms_ranks *r = e->ranks;
  if (msg->oom) {
    free(msg->p);
    return -ENOMEM;
  }
  pthread_mutex_lock(&r->call);
  pthread_mutex_lock(&r->mu);
  free(r->msg);
  r->msg = msg->p;
  r->msg_len = msg->len;
  r->op = op;
  r->id = id;
  r->why[0] = 0;
  uint64_t ticket = ++r->asked;
  atomic_store_explicit(&r->pending, 1, memory_order_release);
  ms_futex_wake_all(&e->mail_seq);   /* worker 0 idle, or paused: it looks now */
  ms_futex_wake_all(&e->pause_seq);
  int rc = 0;
  while (r->done < ticket) {
    if (atomic_load_explicit(&e->stopped, memory_order_acquire)) {
      atomic_store_explicit(&r->pending, 0, memory_order_relaxed);
      rc = -EPIPE;
      snprintf(r->why, sizeof r->why, "the engine stopped");
      break;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
  }
  if (!rc) rc = r->rc;
  if (why) snprintf(why, why_n, "%s", r->why);
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_unlock(&r->call);
  return rc;
}

static int carried(const struct ms_engine *e) { return ms_engine_ranks(e) > 1; }

/* An attach or replace (op) of attachment id carried to every other rank: the
 * options, the name and the object in one message (take_object reads it);
 * 0, or the error with the refusing rank's reason in log. */
static int carry_object(struct ms_engine *e, int op, int id, const void *obj, size_t size, const char *name,
                        const struct ms_attach_opts *o, struct ms_textbuf *log) {
  struct buf m = {0};
  char nm[NAME_BYTES] = {0}, why[2048] = "";
  snprintf(nm, sizeof nm, "%s", name ? name : "");
  int32_t head[CTL_WORDS + ATTACH_WORDS] = {MS_HDR_MAGIC, MS_HDR_CTL, op, id, (int32_t)o->max_per_step,
                                            (int32_t)o->sample_every, (int32_t)o->interpret,
                                            (int32_t)(uint32_t)o->ringbuf_bytes,
                                            (int32_t)(uint32_t)(o->ringbuf_bytes >> 32), (int32_t)size};
  put(&m, head, sizeof head);
  put(&m, nm, sizeof nm);
  put(&m, obj, size);
  int rc = ranks_call(e, op, id, &m, why, sizeof why);
  if (rc) ms_textbuf_printf(log, "%s", why[0] ? why : ms_strerror(rc));
  return rc;
}

int ms_engine_ranks_attach(struct ms_engine *e, int id, const void *obj, size_t size, const char *name,
                           const struct ms_attach_opts *o, struct ms_textbuf *log) {
  if (!carried(e)) return 0;
  struct ms_ranks *r = e->ranks;
  if (!obj || !size || size > (1u << 30) || !o) return -EINVAL;
  pthread_mutex_lock(&r->mu);
  int added = carried_find(r, id) || carried_add(r, id);
  pthread_mutex_unlock(&r->mu);
  if (!added) return -ENOMEM;
  return carry_object(e, OP_ATTACH, id, obj, size, name, o, log);
}

int ms_engine_ranks_replace(struct ms_engine *e, int id, const void *obj, size_t size, const char *name,
                            const struct ms_attach_opts *o, struct ms_textbuf *log) {
  if (!carried(e)) return 0;
  struct ms_ranks *r = e->ranks;
  if (!obj || !size || size > (1u << 30) || !o) return -EINVAL;
  pthread_mutex_lock(&r->mu);
  int known = carried_find(r, id) != NULL;
  pthread_mutex_unlock(&r->mu);
  if (!known) {
    ms_textbuf_printf(log, "attachment %d was not carried to the other ranks", id);
    return -ENOENT;
  }
  return carry_object(e, OP_REPLACE, id, obj, size, name, o, log);
}

int ms_engine_ranks_detach(struct ms_engine *e, int id) {
  if (!carried(e)) return 0;
  struct ms_ranks *r = e->ranks;
  pthread_mutex_lock(&r->mu);
  int known = carried_find(r, id) != NULL;
  pthread_mutex_unlock(&r->mu);
  if (!known) return 0;
  struct buf m = {0};
  int32_t head[CTL_WORDS] = {MS_HDR_MAGIC, MS_HDR_CTL, OP_DETACH, id};
  put(&m, head, sizeof head);
  return ranks_call(e, OP_DETACH, id, &m, NULL, 0);
}

void ms_rt_ranks_reap(struct ms_engine *e) {
  struct ms_ranks *r = e->ranks;
  if (!carried(e)) return;
  struct ms_coverage cov;
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n_att; i++)
    if (ms_engine_attach_coverage(e, r->att[i].id, 0, &cov) == -ENOENT) {  /* freed on rank 0 */
      carried_free(r, &r->att[i]);
      r->att[i--] = r->att[--r->n_att];
    }
  pthread_mutex_unlock(&r->mu);
}

int ms_engine_ranks_sync(struct ms_engine *e) {
  if (!carried(e)) return 0;
  struct ms_ranks *r = e->ranks;
  struct buf m = {0};
  pthread_mutex_lock(&r->mu);
  int32_t head[CTL_WORDS] = {MS_HDR_MAGIC, MS_HDR_CTL, OP_SYNC, r->n_att};
  put(&m, head, sizeof head);
  for (int i = 0; i < r->n_att; i++) put32(&m, r->att[i].id);
  pthread_mutex_unlock(&r->mu);
  return ranks_call(e, OP_SYNC, 0, &m, NULL, 0);
}

int ms_engine_ranks_held(struct ms_engine *e, int rank) {
  if (!rank) return ms_engine_attach_count(e);
  if (!carried(e) || rank < 0 || rank >= e->ranks->size) return -ENOENT;
  pthread_mutex_lock(&e->ranks->mu);
  int n = e->ranks->held[rank];
  pthread_mutex_unlock(&e->ranks->mu);
  return n >= 0 ? n : -ENOENT;
}

int ms_engine_ranks_coverage(struct ms_engine *e, int id, int rank, struct ms_coverage *out) {
  if (!rank) return ms_engine_attach_coverage(e, id, 0, out);
  if (!carried(e) || rank < 0 || rank >= e->ranks->size) return -ENOENT;
  struct ms_ranks *r = e->ranks;
  pthread_mutex_lock(&r->mu);
  struct carried *c = carried_find(r, id);
  int rc = c && c->seen[rank] ? 0 : -ENOENT;
  if (!rc) *out = c->cov[rank];
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int ms_engine_ranks_visit(struct ms_engine *e, int id, int rank,
                          int (*fn)(const struct ms_attach_view *v, void *arg), void *arg) {
  if (!rank) return ms_engine_attach_visit(e, id, fn, arg);
  if (!carried(e) || rank < 0 || rank >= e->ranks->size) return -ENOENT;
  struct ms_ranks *r = e->ranks;
  pthread_mutex_lock(&r->mu);
  struct carried *c = carried_find(r, id);
  int rc = -ENOENT;
  if (c && c->seen[rank]) {
    int n = 0;
    while (n < c->n_maps && c->mir[rank * MAX_MAPS + n]) n++;
    struct ms_attach_view v = {c->cov[rank].generation, NULL, c->mir + rank * MAX_MAPS, n};
    rc = fn(&v, arg);
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int ms_engine_ranks_read_stats(struct ms_engine *e) {
  if (!carried(e)) return 0;
  struct buf m = {0};
  int32_t head[CTL_WORDS] = {MS_HDR_MAGIC, MS_HDR_CTL, OP_STATS, 0};
  put(&m, head, sizeof head);
  return ranks_call(e, OP_STATS, 0, &m, NULL, 0);
}

int ms_engine_rank_stats(struct ms_engine *e, int rank, struct ms_engine_stats *st, struct ms_comm_stats *cs,
                         struct ms_worker_os *os, int max_os) {
  if (!rank) {
    if (st) ms_engine_get_stats(e, st);
    if (cs) ms_engine_comm_stats(e, cs);
    for (int w = 0; os && w < e->n_workers && w < max_os; w++) {
      os[w] = (struct ms_worker_os){.pinned_cpu = -1, .last_cpu = -1};
      ms_engine_worker_os(e, w, &os[w]);
    }
    return e->n_workers;
  }
  if (!carried(e) || rank < 0 || rank >= e->ranks->size) return -ENOENT;
  struct ms_ranks *r = e->ranks;
  pthread_mutex_lock(&r->mu);
  const struct rank_stats *rs = &r->stats[rank];
  int n = rs->have ? rs->n_os : -ENOENT;
  if (rs->have) {
    if (st) *st = rs->st;
    if (cs) *cs = rs->cs;
    for (int w = 0; os && w < rs->n_os && w < max_os; w++) os[w] = rs->os[w];
  }
  pthread_mutex_unlock(&r->mu);
  return n;
}

int ms_rt_ranks_trace(struct ms_engine *e, int start, uint32_t records_per_worker) {
  if (!carried(e)) return 0;
  struct buf m = {0};
  int32_t head[CTL_WORDS] = {MS_HDR_MAGIC, MS_HDR_CTL, start ? OP_TRACE_START : OP_TRACE_STOP,
                             (int32_t)records_per_worker};
  put(&m, head, sizeof head);
  return ranks_call(e, start ? OP_TRACE_START : OP_TRACE_STOP, 0, &m, NULL, 0);
}

const struct ms_rank_trace *ms_rt_ranks_trace_of(const struct ms_engine *e, int rank) {
  if (!carried(e) || rank < 1 || rank >= e->ranks->size || !e->ranks->trace[rank].have) return NULL;
  return &e->ranks->trace[rank];
}
