/* SPDX-License-Identifier: MIT */
/* Fair shares: per-client accounting of what is queued and running, so that
 * one client cannot fill the engine's queue. A client's entry lives while it
 * holds something (at most one per request in flight); a hash table of 256
 * chains under one mutex, taken twice a request. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/share.h"

#define BUCKETS 256

struct entry {
  struct entry *next;
  char client[64];
  int requests;
  uint64_t tokens;
};

struct ms_share {
  struct share_opts o;
  pthread_mutex_t mu;
  struct entry *b[BUCKETS];
  int n;
};

uint64_t share_client_id(const char *client) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)client; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
  return h ? h : 1;
}

struct ms_share *share_new(const struct share_opts *o) {
  struct ms_share *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->o = *o;
  pthread_mutex_init(&s->mu, NULL);
  return s;
}

void share_free(struct ms_share *s) {
  if (!s) return;
  for (int i = 0; i < BUCKETS; i++)
    for (struct entry *e = s->b[i], *next; e; e = next) {
      next = e->next;
      free(e);
    }
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* The client's entry link (where it is, or where it would go). Under mu. */
static struct entry **find(struct ms_share *s, const char *client) {
  struct entry **p = &s->b[share_client_id(client) % BUCKETS];
  while (*p && strcmp((*p)->client, client)) p = &(*p)->next;
  return p;
}

enum share_refusal share_take(struct ms_share *s, struct share_hold *h, char *msg, size_t n) {
  enum share_refusal why = SHARE_OK;
  pthread_mutex_lock(&s->mu);
  struct entry **p = find(s, h->client), *e = *p;
  int have_r = e ? e->requests : 0;
  uint64_t have_t = e ? e->tokens : 0;
  if (have_r + h->requests > s->o.max_requests) {
    why = SHARE_REQUESTS;
    snprintf(msg, n,
             "%s holds %d requests queued and running; %d more would pass its share of %d: retry when some "
             "finish",
             h->client, have_r, h->requests, s->o.max_requests);
  } else if (have_t + h->tokens > s->o.max_tokens) {
    why = SHARE_TOKENS;
    snprintf(msg, n,
             "%s holds %llu tokens (prompts and max_tokens) queued and running; %llu more would pass its share "
             "of %llu: retry when some finish",
             h->client, (unsigned long long)have_t, (unsigned long long)h->tokens,
             (unsigned long long)s->o.max_tokens);
  } else if (!e && !(e = *p = calloc(1, sizeof *e))) {
    why = SHARE_REQUESTS;
    snprintf(msg, n, "out of memory");
  } else {
    if (!e->client[0]) {
      snprintf(e->client, sizeof e->client, "%s", h->client);
      s->n++;
    }
    e->requests += h->requests;
    e->tokens += h->tokens;
    h->held = 1;
  }
  pthread_mutex_unlock(&s->mu);
  return why;
}

void share_give(struct ms_share *s, struct share_hold *h) {
  if (!h->held) return;
  h->held = 0;
  pthread_mutex_lock(&s->mu);
  struct entry **p = find(s, h->client), *e = *p;
  if (e) {
    e->requests -= h->requests;
    e->tokens -= h->tokens;
    if (e->requests <= 0) {
      *p = e->next;
      free(e);
      s->n--;
    }
  }
  pthread_mutex_unlock(&s->mu);
}

int share_clients(struct ms_share *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->n;
  pthread_mutex_unlock(&s->mu);
  return n;
}
