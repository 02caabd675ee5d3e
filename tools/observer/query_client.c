/* SPDX-License-Identifier: MIT */
/* See query_client.h. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "ctl_req.h"
#include "megascope/control.h"
#include "query_client.h"

json_t *live_call(const char *me, const char *sock, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *req = NULL;
  int n = vasprintf(&req, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  json_t *rep = cli_ctl_call(me, sock, req, (size_t)n, 30000, NULL, NULL);
  free(req);
  return rep;
}

void live_sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  nanosleep(&ts, NULL);
}

int live_parse_slo(const char *me, const char *arg, uint64_t *ns) {
  if (!strncmp(arg, "tpot=", 5) && !ms_query_parse_duration(arg + 5, ns) && *ns) return 0;
  fprintf(stderr, "megascope %s: --slo '%s': expected tpot=DURATION (tpot=50ms)\n", me, arg);
  return -1;
}

int live_tpot(const char *me, const char *sock, double *sum_s, uint64_t *count) {
  json_t *rep = live_call(me, sock, "{\"cmd\":\"stats\"}");
  if (!rep) return -1;
  json_t *tp = json_object_get(rep, "tpot");
  *sum_s = json_number_value(json_object_get(tp, "sum_s"));
  *count = (uint64_t)json_integer_value(json_object_get(tp, "count"));
  json_decref(rep);
  return 0;
}

struct ms_query_schema *live_schema(const char *me, const char *sock) {
  json_t *rep = live_call(me, sock, "{\"cmd\":\"schema\"}");
  if (!rep) return NULL;
  char *text = json_dumps(json_object_get(rep, "schema"), JSON_COMPACT);
  char lb[1024] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_query_schema *s = text ? ms_query_schema_parse(text, strlen(text), &log) : NULL;
  if (!s) fprintf(stderr, "megascope %s: the engine's schema: %s", me, lb);
  free(text);
  json_decref(rep);
  return s;
}

static int attach_bundle(const char *me, const char *sock, const struct ms_query *q, const char *name,
                         const struct cli_budget *b) {
  void *bundle = NULL;
  size_t len = 0;
  if (ms_query_bundle(q, &bundle, &len)) return -1;
  char *b64 = malloc(ms_base64_encoded_len(len) + 1);
  if (b64) ms_base64_encode(bundle, len, b64);
  free(bundle);
  if (!b64) return -1;
  struct req r;
  json_t *rep = NULL;
  if (!req_begin(&r, "attach")) {
    req_str(&r, "name", name);
    req_int(&r, "max_per_step", b->max_per_step);
    req_int(&r, "sample", b->sample);
    req_uint(&r, "ringbuf_bytes", b->ringbuf_bytes);
    req_bool(&r, "interpret", b->interp);
    req_str(&r, "object", b64);
    if (!req_end(&r)) rep = cli_ctl_call(me, sock, r.buf, r.len, 30000, NULL, NULL);
    free(r.buf);
  }
  free(b64);
  if (!rep) return -1;
  int id = (int)json_integer_value(json_object_get(rep, "id"));
  json_decref(rep);
  if (id <= 0) fprintf(stderr, "megascope %s: the engine's reply to attach names no attachment\n", me);
  return id > 0 ? id : -1;
}

/* Readers over rank `rank`'s maps of the attachment, in the query's map order,
 * into out; *n_ranks: the engine's ranks (rank 0's reply says). */
static int open_rank(struct live *l, const char *me, const char *sock, int rank, struct ms_bpf_map_reader **out,
                     int *n_ranks) {
  int fds[MS_CONTROL_MAX_FDS], n_fds = 0;
  struct req r;
  json_t *rep = NULL;
  if (!req_begin(&r, "maps")) {
    req_int(&r, "id", l->id);
    req_bool(&r, "fds", 1);
    if (rank) req_int(&r, "rank", rank);
    if (!req_end(&r)) rep = cli_ctl_call(me, sock, r.buf, r.len, 30000, fds, &n_fds);
    free(r.buf);
  }
  if (!rep) return -1;
  json_t *names = json_object_get(rep, "fds");
  if (n_ranks) *n_ranks = json_is_integer(json_object_get(rep, "ranks")) ?
                          (int)json_integer_value(json_object_get(rep, "ranks")) : 1;
  int rc = 0;
  for (size_t i = 0; !rc && i < ms_query_map_count(l->q); i++) {
    const char *want = ms_query_map(l->q, i)->name;
    int fd = -1;
    for (int k = 0; k < n_fds; k++) {
      const char *got = json_string_value(json_array_get(names, (size_t)k));
      if (got && !strcmp(got, want)) fd = fds[k];
    }
    char lb[256] = "";
    struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
    if (fd < 0 || !(out[i] = ms_bpf_map_reader_new(fd, 0, &log))) {
      fprintf(stderr, "megascope %s: map %s of attachment %d (rank %d): %s\n", me, want, l->id, rank,
              fd < 0 ? "not handed over" : lb);
      rc = -1;
    }
  }
  for (int k = 0; k < n_fds; k++) close(fds[k]); /* the readers keep their mappings */
  json_decref(rep);
  return rc;
}

/* Readers over the attachment's maps on every rank; src merges the ranks. */
static int open_maps(struct live *l, const char *me, const char *sock) {
  size_t n_maps = ms_query_map_count(l->q);
  int n_ranks = 1;
  struct ms_bpf_map_reader **first = calloc(n_maps ? n_maps : 1, sizeof *first);
  if (!first) return -1;
  int rc = open_rank(l, me, sock, 0, first, &n_ranks);
  if (n_ranks < 1 || n_ranks > 64) n_ranks = 1;
  l->n_ranks = n_ranks;
  l->n_readers = n_maps * (size_t)n_ranks;
  l->readers = calloc(l->n_readers ? l->n_readers : 1, sizeof *l->readers);
  l->rank_src = calloc((size_t)n_ranks, sizeof *l->rank_src);
  l->rank_cov = calloc((size_t)n_ranks, sizeof *l->rank_cov);
  if (!l->readers || !l->rank_src || !l->rank_cov) rc = -1;
  for (size_t i = 0; i < n_maps; i++) {
    if (l->readers) l->readers[i] = first[i];
    else ms_bpf_map_reader_free(first[i]);
  }
  free(first);
  for (int rank = 1; !rc && rank < n_ranks; rank++)
    rc = open_rank(l, me, sock, rank, l->readers + n_maps * (size_t)rank, NULL);
  if (rc) return -1;
  if (n_ranks == 1) return ms_query_maps_of_readers(&l->src, l->readers) ? -1 : 0;
  for (int rank = 0; rank < n_ranks; rank++)
    ms_query_maps_of_readers(&l->rank_src[rank], l->readers + n_maps * (size_t)rank);
  l->u = (struct ms_query_union){.q = l->q, .srcs = l->rank_src, .n = (size_t)n_ranks};
  return ms_query_maps_of_union(&l->src, &l->u) ? -1 : 0;
}

int live_attach(struct live *l, const char *me, const char *sock, const struct ms_query *q, const char *name,
                const struct cli_budget *b) {
  memset(l, 0, sizeof *l);
  l->q = q;
  if ((l->id = attach_bundle(me, sock, q, name, b)) < 0) {
    l->id = 0;
    return -1;
  }
  if (open_maps(l, me, sock)) {
    live_detach(l, me, sock);
    return -1;
  }
  return 0;
}

int live_coverage(const struct live *l, const char *me, const char *sock, struct ms_coverage *out) {
  static const char req[] = "{\"cmd\":\"list\"}";
  json_t *rep = cli_ctl_call(me, sock, req, strlen(req), l->timeout_ms ? l->timeout_ms : 30000, NULL, NULL);
  if (!rep) return -1;
  json_t *arr = json_object_get(rep, "attachments"), *att;
  size_t i;
  int found = -1;
  json_array_foreach(arr, i, att) {
    if (json_integer_value(json_object_get(att, "id")) != l->id) continue;
    json_t *c = json_object_get(att, "coverage");
#define U(k) (uint64_t) json_integer_value(json_object_get(c, k))
    *out = (struct ms_coverage){.eligible = U("eligible"), .executed = U("executed"), .throttled = U("throttled"),
                                .lost = U("lost"), .failed = U("failed"), .generation = (uint32_t)U("generation"),
                                .first_step = U("first_step"), .last_step = U("last_step")};
    /* across ranks: "coverage" is every rank's together, "ranks" each one's */
    json_t *ranks = json_object_get(att, "ranks"), *rk;
    size_t k;
    json_array_foreach(ranks, k, rk) {
      long long rank = json_integer_value(json_object_get(rk, "rank"));
      if (!l->rank_cov || rank < 0 || rank >= l->n_ranks) continue;
      c = json_object_get(rk, "coverage");
      l->rank_cov[rank] = (struct ms_coverage){.eligible = U("eligible"), .executed = U("executed"),
                                               .throttled = U("throttled"), .lost = U("lost"), .failed = U("failed"),
                                               .generation = (uint32_t)U("generation"),
                                               .first_step = U("first_step"), .last_step = U("last_step")};
    }
#undef U
    found = 0;
  }
  json_decref(rep);
  if (found) fprintf(stderr, "megascope %s: attachment %d is not in the engine's list\n", me, l->id);
  return found;
}

static int count_one(void *user, const void *data, uint32_t size) {
  (void)data;
  (void)size;
  ++*(size_t *)user;
  return 0;
}

size_t live_records(const struct live *l) {
  size_t n = 0;
  for (size_t i = 0; l->readers && i < ms_query_map_count(l->q); i++)  /* src: every rank's, merged */
    if (ms_query_map(l->q, i)->type == MS_BPF_MAP_RINGBUF) l->src.ring(l->src.user, i, count_one, &n);
  return n;
}

void live_detach(struct live *l, const char *me, const char *sock) {
  struct req r;
  if (l->id > 0 && !req_begin(&r, "detach")) {
    req_int(&r, "id", l->id);
    if (!req_end(&r)) json_decref(cli_ctl_call(me, sock, r.buf, r.len, 30000, NULL, NULL));
    free(r.buf);
  }
  for (size_t i = 0; l->readers && i < l->n_readers; i++) ms_bpf_map_reader_free(l->readers[i]);
  free(l->readers);
  free(l->rank_src);
  free(l->rank_cov);
  l->readers = NULL;
  l->rank_src = NULL;
  l->rank_cov = NULL;
  l->n_readers = 0;
  l->n_ranks = 0;
  l->id = 0;
}
