/* SPDX-License-Identifier: MIT */
/* Fair shares of the HTTP server (private to src/control): what one client
 * (an address, or an API key) holds queued and running, in engine requests
 * (choices) and tokens (their prompts and max_tokens), against a bound; and
 * the client's id for the engine's fair queue. */
#ifndef MS_CONTROL_SHARE_H
#define MS_CONTROL_SHARE_H

#include <stddef.h>
#include <stdint.h>

struct share_opts {
  int max_requests;       /* choices one client may hold (> 0) */
  uint64_t max_tokens;    /* their tokens (> 0) */
};

/* What one HTTP request holds: taken by share_take, given back by share_give. */
struct share_hold {
  char client[64];
  int requests;
  uint64_t tokens;
  int held;
};

enum share_refusal { SHARE_OK = 0, SHARE_REQUESTS, SHARE_TOKENS };

struct ms_share;
struct ms_share *share_new(const struct share_opts *o);
void share_free(struct ms_share *s);
/* Takes h's requests and tokens for h->client: SHARE_OK, or what is over its
 * share (msg says so, with the figures). */
enum share_refusal share_take(struct ms_share *s, struct share_hold *h, char *msg, size_t n);
/* Gives back what h took (nothing when it took nothing). */
void share_give(struct ms_share *s, struct share_hold *h);
/* Clients holding something now. */
int share_clients(struct ms_share *s);
/* The engine's client id of a client name (FNV-1a, never 0: 0 is "no client"). */
uint64_t share_client_id(const char *client);

#endif
