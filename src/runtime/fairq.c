/* SPDX-License-Identifier: MIT */
/* The fair queue: requests waiting for a batch slot, ordered so that a client
 * with many requests queued waits behind its own requests, not in front of
 * other clients' (start-time fair queueing, Goyal et al. 1996, over clients).
 *
 * Each request gets a start tag, max(vtime, its client's finish tag), and moves
 * its client's finish tag on by its cost (its prompt and max_new_tokens: the
 * tokens it may cost); the step start admits the lowest start tag first and
 * sets vtime to it. A client that queues 200 requests has tags far ahead of
 * vtime, so a request from another client, tagged at vtime, is admitted next.
 * Requests of one client keep their order; with one client (every caller that
 * names none) the queue is first-come first-served, as the mailbox was.
 *
 * A client whose finish tag vtime has passed is no different from a new one,
 * so its entry is dropped when the table is scanned; the table holds at most
 * the clients with something queued. Touched by the step start alone (no
 * locks); the heap and the table are allocated once, at their bound. */
#include <errno.h>
#include <stdlib.h>

#include "runtime/runtime_impl.h"

int ms_fq_init(struct fairq *q, int cap) {
  *q = (struct fairq){0};
  q->heap = calloc((size_t)cap, sizeof *q->heap);
  q->cl = calloc((size_t)cap, sizeof *q->cl);
  if (!q->heap || !q->cl) {
    ms_fq_free(q);
    return -ENOMEM;
  }
  q->cap = cap;
  return 0;
}

void ms_fq_free(struct fairq *q) {
  free(q->heap);
  free(q->cl);
  q->heap = NULL;
  q->cl = NULL;
  q->n = q->cap = q->n_cl = 0;
}

static int before(const struct ms_request *a, const struct ms_request *b) {
  return a->fq_tag != b->fq_tag ? a->fq_tag < b->fq_tag : a->fq_seq < b->fq_seq;
}

static void sift_up(struct fairq *q, int i) {
  struct ms_request *r = q->heap[i];
  while (i > 0 && before(r, q->heap[(i - 1) / 2])) {
    q->heap[i] = q->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  q->heap[i] = r;
}

static void sift_down(struct fairq *q, int i) {
  struct ms_request *r = q->heap[i];
  for (;;) {
    int c = 2 * i + 1;
    if (c >= q->n) break;
    if (c + 1 < q->n && before(q->heap[c + 1], q->heap[c])) c++;
    if (!before(q->heap[c], r)) break;
    q->heap[i] = q->heap[c];
    i = c;
  }
  q->heap[i] = r;
}

/* The client's entry (created when absent); entries vtime has passed are dropped on the way. */
static struct fq_client *client_of(struct fairq *q, uint64_t id) {
  struct fq_client *found = NULL;
  for (int i = 0; i < q->n_cl; i++) {
    if (q->cl[i].id == id) {
      found = &q->cl[i];
    } else if (q->cl[i].finish <= q->vtime) {
      q->cl[i--] = q->cl[--q->n_cl];
    }
  }
  if (found) return found;
  if (q->n_cl == q->cap) return NULL;  /* cannot happen: a client here has a request queued */
  q->cl[q->n_cl] = (struct fq_client){id, q->vtime};
  return &q->cl[q->n_cl++];
}

int ms_fq_push(struct fairq *q, struct ms_request *r, uint64_t cost) {
  struct fq_client *c = q->n < q->cap ? client_of(q, r->client) : NULL;
  if (!c) return -ENOSPC;
  r->fq_tag = c->finish > q->vtime ? c->finish : q->vtime;
  r->fq_seq = q->seq++;
  c->finish = r->fq_tag + (cost ? cost : 1);
  q->heap[q->n++] = r;
  sift_up(q, q->n - 1);
  return 0;
}

struct ms_request *ms_fq_pop(struct fairq *q) {
  if (!q->n) return NULL;
  struct ms_request *r = q->heap[0];
  q->heap[0] = q->heap[--q->n];
  if (q->n) sift_down(q, 0);
  if (r->fq_tag > q->vtime) q->vtime = r->fq_tag;
  return r;
}

int ms_fq_filter(struct fairq *q, int (*drop)(struct ms_request *r, void *user), void *user) {
  int kept = 0, n = q->n;
  for (int i = 0; i < n; i++)
    if (!drop(q->heap[i], user)) q->heap[kept++] = q->heap[i];
  q->n = kept;
  for (int i = kept / 2 - 1; i >= 0; i--) sift_down(q, i);
  return n - kept;
}
