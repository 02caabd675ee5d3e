/* SPDX-License-Identifier: MIT */
/* megascope records: the reader of an attachment's ring buffers. It asks the
 * engine for the ring-buffer maps of attachment ID ("records": read-write
 * memfds, one consumer per attachment, and each map's record layout from the
 * object's BTF), maps them, and consumes records while the engine runs,
 * printing each one decoded (fields by name; a map without a record struct in
 * its BTF as the record's u64 words). Between drains it sleeps in poll() on
 * each ring's wake-up eventfd, which the engine signals once a ring is half
 * full (ms_bpf_map_reader_arm), for at most --interval-us (50 ms): a reader
 * that polled every 200 us took a core's share from the workers on a
 * two-core machine. Over the same connection it asks for the
 * attachment's state ten times a second: losses (records dropped because the
 * ring was full, and the coverage's lost count, which includes budget drops)
 * are shown as they happen and at the end; after a replace it drains the old
 * generation's rings and continues with the new ones; once the attachment is
 * detached it drains and stops.
 *
 *   megascope records --socket S ID [--json] [--seconds N] [--max-records N] [--interval-us N]
 *
 * Exit codes: 0 done, 1 the engine refused or could not be reached, 2 usage. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/bpf.h"
#include "megascope/control.h"
#include "megascope/json.h"

struct field {
  char name[64], type[16];
  uint32_t offset, size;
};

struct ring {
  char name[64];
  struct ms_bpf_map_reader *rd;
  int fd;
  int wake_fd;          /* the engine's wake-up eventfd for this ring, -1: poll it */
  struct field *fields;  /* NULL: u64 words */
  int n_fields;
  uint32_t rec_size;
  uint64_t seen_lost;   /* ring-full drops already reported */
};

struct rec_state {
  int as_json;
  uint32_t generation;
  uint64_t records, max_records;
  const struct ring *ring;
};

static volatile sig_atomic_t stopping;
static void on_signal(int sig) { stopping = 1; }

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void rings_free(struct ring *r, int n) {
  for (int i = 0; i < n; i++) {
    ms_bpf_map_reader_free(r[i].rd);
    if (r[i].fd >= 0) close(r[i].fd);
    if (r[i].wake_fd >= 0) close(r[i].wake_fd);
    free(r[i].fields);
    memset(&r[i], 0, sizeof r[i]);
    r[i].fd = r[i].wake_fd = -1;
  }
}

static uint64_t field_uint(const uint8_t *p, uint32_t size) {
  uint64_t v = 0;
  memcpy(&v, p, size);
  return v;
}

static int64_t field_int(const uint8_t *p, uint32_t size) {
  uint64_t v = field_uint(p, size);
  int sh = 64 - 8 * (int)size;
  return sh ? (int64_t)(v << sh) >> sh : (int64_t)v;
}

/* One record: fields by the BTF layout, or the u64 words (a short tail as bytes). */
static int print_record(void *user, const void *data, uint32_t size) {
  struct rec_state *st = user;
  const struct ring *rg = st->ring;
  const uint8_t *p = data;
  if (st->max_records && st->records >= st->max_records) return -ECANCELED;
  st->records++;
  struct ms_json j;
  if (st->as_json) {
    ms_json_init(&j, stdout, 0);
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "map", rg->name);
    ms_json_kuint(&j, "generation", st->generation);
  } else {
    printf("%s", rg->name);
  }
  if (rg->fields) {
    for (int i = 0; i < rg->n_fields; i++) {
      const struct field *f = &rg->fields[i];
      if ((uint64_t)f->offset + f->size > size) continue;
      const uint8_t *v = p + f->offset;
      int is_uint = f->type[0] == 'u' && f->type[1] >= '1' && f->type[1] <= '9' && f->size <= 8;
      int is_int = f->type[0] == 's' && f->type[1] >= '1' && f->type[1] <= '9' && f->size <= 8;
      int is_char = !strncmp(f->type, "char[", 5);
      if (st->as_json) ms_json_key(&j, f->name);
      if (is_uint || is_int) {
        if (st->as_json) {
          if (is_uint)
            ms_json_uint(&j, field_uint(v, f->size));
          else
            ms_json_int(&j, field_int(v, f->size));
        } else if (is_uint) {
          printf(" %s=%" PRIu64, f->name, field_uint(v, f->size));
        } else {
          printf(" %s=%" PRId64, f->name, field_int(v, f->size));
        }
      } else if (is_char) {
        char s[256];
        size_t n = strnlen((const char *)v, f->size < sizeof s - 1 ? f->size : sizeof s - 1);
        memcpy(s, v, n);
        s[n] = 0;
        for (size_t k = 0; k < n; k++)
          if ((unsigned char)s[k] < 0x20 || (unsigned char)s[k] > 0x7e) s[k] = '?';
        if (st->as_json)
          ms_json_str(&j, s);
        else
          printf(" %s=\"%s\"", f->name, s);
      } else {
        char hex[2 * 64 + 1];
        uint32_t n = f->size < 64 ? f->size : 64;
        for (uint32_t k = 0; k < n; k++) snprintf(hex + 2 * k, 3, "%02x", v[k]);
        if (st->as_json)
          ms_json_str(&j, hex);
        else
          printf(" %s=0x%s", f->name, hex);
      }
    }
  } else {
    if (st->as_json) {
      ms_json_key(&j, "words");
      ms_json_arr_begin(&j);
    }
    for (uint32_t off = 0; off + 8 <= size; off += 8) {
      if (st->as_json)
        ms_json_uint(&j, field_uint(p + off, 8));
      else
        printf(" %" PRIu64, field_uint(p + off, 8));
    }
    if (st->as_json) ms_json_arr_end(&j);
  }
  if (st->as_json) {
    ms_json_kuint(&j, "size", size);
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else {
    putchar('\n');
  }
  return 0;
}

/* The "records" reply: maps the rings it hands over, each with its wake-up
 * eventfd where the reply names one ("wake": its index among the
 * descriptors, after the rings'). Descriptors it keeps are set to -1 in fds.
 * Returns the count or -1. */
static int rings_open(json_t *rep, int *fds, int n_fds, struct ring *out, int max, int as_json) {
  json_t *maps = json_object_get(rep, "maps"), *m;
  size_t i;
  int n = 0, n_maps = (int)json_array_size(maps);
  json_array_foreach(maps, i, m) {
    if ((int)i >= n_fds || n >= max) break;
    struct ring *r = &out[n];
    memset(r, 0, sizeof *r);
    r->fd = fds[i];
    fds[i] = -1;
    json_int_t w = json_integer_value(json_object_get(m, "wake"));
    r->wake_fd = json_is_integer(json_object_get(m, "wake")) && w >= n_maps && w < n_fds ? fds[w] : -1;
    if (r->wake_fd >= 0) fds[w] = -1;
    snprintf(r->name, sizeof r->name, "%s", json_string_value(json_object_get(m, "name")) ?: "?");
    char lb[256] = "";
    struct ms_textbuf log = {lb, sizeof lb, 0, 0};
    r->rd = ms_bpf_map_reader_new(r->fd, MS_BPF_READER_CONSUME, &log);
    if (!r->rd) {
      fprintf(stderr, "megascope records: cannot consume ring %s: %s", r->name, lb);
      rings_free(out, n + 1);
      return -1;
    }
    r->seen_lost = __atomic_load_n(&ms_bpf_map_reader_header(r->rd)->lost, __ATOMIC_RELAXED);
    json_t *fl = json_object_get(m, "fields"), *x;
    size_t k;
    if (json_is_array(fl) && json_array_size(fl)) {
      r->fields = calloc(json_array_size(fl), sizeof *r->fields);
      if (!r->fields) {
        rings_free(out, n + 1);
        return -1;
      }
      json_array_foreach(fl, k, x) {
        struct field *f = &r->fields[r->n_fields++];
        snprintf(f->name, sizeof f->name, "%s", json_string_value(json_object_get(x, "name")) ?: "?");
        snprintf(f->type, sizeof f->type, "%s", json_string_value(json_object_get(x, "type")) ?: "bytes");
        f->offset = (uint32_t)json_integer_value(json_object_get(x, "offset"));
        f->size = (uint32_t)json_integer_value(json_object_get(x, "size"));
      }
      r->rec_size = (uint32_t)json_integer_value(json_object_get(m, "size"));
    }
    const char *rec = json_string_value(json_object_get(m, "record"));
    long long ring_bytes = (long long)json_integer_value(json_object_get(m, "ring_bytes"));
    const char *how = r->wake_fd >= 0 ? "woken at half full" : "polled";
    if (rec)
      fprintf(stderr,
              "megascope records: ring %s (%lld bytes, %s): records decoded by the BTF as struct %s (%u bytes)\n",
              r->name, ring_bytes, how, rec, r->rec_size);
    else
      fprintf(stderr,
              "megascope records: ring %s (%lld bytes, %s): no record struct in the BTF: records as u64 words\n",
              r->name, ring_bytes, how);
    n++;
  }
  return n;
}

static json_t *ask(struct ms_control_client *cl, const char *req, int *fds, int *n_fds);

/* The descriptors of a reply that rings_open did not keep. */
static void close_fds(const int *fds, int n) {
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
}

/* Across ranks: every other rank's rings too (rank 0's copies of them, which
 * its reads fill: this reader's "list" every 100 ms reads them), after the
 * n rank 0's. Returns the rings in all, or -1. */
static int other_ranks(struct ms_control_client *cl, long id, long long ranks, struct ring *rings, int n,
                       int as_json) {
  for (long long rank = 1; rank < ranks && n < MS_CONTROL_MAX_FDS; rank++) {
    char req[96];
    int fds[MS_CONTROL_MAX_FDS], n_fds = 0;
    snprintf(req, sizeof req, "{\"cmd\":\"records\",\"id\":%ld,\"rank\":%lld}", id, rank);
    json_t *rep = ask(cl, req, fds, &n_fds);
    if (!rep) return -1;
    int k = rings_open(rep, fds, n_fds, rings + n, MS_CONTROL_MAX_FDS - n, as_json);
    close_fds(fds, n_fds);
    json_decref(rep);
    if (k < 0) return -1;
    n += k;
  }
  return n;
}

/* One request on the open connection; the parsed reply when it says ok. */
static json_t *ask(struct ms_control_client *cl, const char *req, int *fds, int *n_fds) {
  char *reply = NULL;
  size_t len = 0;
  int nf = 0;
  int rc = ms_control_call(cl, req, strlen(req), &reply, &len, fds, fds ? &nf : NULL, fds ? MS_CONTROL_MAX_FDS : 0,
                           30000);
  if (n_fds) *n_fds = nf;
  if (rc) {
    fprintf(stderr, "megascope records: no reply: %s\n", ms_strerror(rc));
    return NULL;
  }
  json_error_t err;
  json_t *j = json_loadb(reply, len, 0, &err);
  free(reply);
  if (!j || !json_is_true(json_object_get(j, "ok"))) {
    const char *e = j ? json_string_value(json_object_get(j, "error")) : err.text;
    fprintf(stderr, "megascope records: %s\n", e ? e : "the engine refused the request");
    json_decref(j);
    for (int i = 0; fds && i < nf; i++) close(fds[i]);
    return NULL;
  }
  return j;
}

/* The attachment's row in "list": attached, generation, coverage lost. */
static int state_of(json_t *list, long id, int *attached, uint32_t *gen, uint64_t *lost) {
  json_t *arr = json_object_get(list, "attachments"), *x;
  size_t i;
  json_array_foreach(arr, i, x) {
    if (json_integer_value(json_object_get(x, "id")) != id) continue;
    *attached = json_is_true(json_object_get(x, "attached"));
    *gen = (uint32_t)json_integer_value(json_object_get(x, "generation"));
    *lost = (uint64_t)json_integer_value(json_object_get(json_object_get(x, "coverage"), "lost"));
    return 0;
  }
  return -1;
}

/* Between drains: sleeps until a ring's producer wakes the reader (the ring
 * half full: ms_bpf_map_reader_arm) or `us` microseconds pass; returns at
 * once when a ring is half full already. A ring handed over without a wake-up
 * eventfd is polled: the sleep is then at most `poll_us`. */
static void wait_rings(struct ring *rings, int n, long us, long poll_us) {
  struct pollfd pf[MS_CONTROL_MAX_FDS];
  int np = 0, full = 0;
  for (int i = 0; i < n && !full; i++) {
    if (rings[i].wake_fd < 0) {
      if (us > poll_us) us = poll_us;
      continue;
    }
    full = ms_bpf_map_reader_arm(rings[i].rd) == 1;
    pf[np++] = (struct pollfd){.fd = rings[i].wake_fd, .events = POLLIN};
  }
  if (!full) {
    struct timespec ts = {us / 1000000, us % 1000000 * 1000};
    ppoll(pf, (nfds_t)np, &ts, NULL);
  }
  for (int i = 0; i < n; i++) {
    if (rings[i].wake_fd < 0) continue;
    ms_bpf_map_reader_disarm(rings[i].rd);
    uint64_t v;
    if (read(rings[i].wake_fd, &v, sizeof v) < 0) continue;  /* EAGAIN: no wake-up was pending */
  }
}

static int drain(struct ring *rings, int n, struct rec_state *st) {
  int got = 0;
  for (int i = 0; i < n; i++) {
    st->ring = &rings[i];
    int k = ms_bpf_map_reader_consume(rings[i].rd, print_record, st);
    if (k == -ECANCELED) return -1;
    if (k > 0) got += k;
  }
  return got;
}

struct records_args {
  const char *socket;
  long max_records, interval_us;
  double seconds;
  int as_json;
};

#define RA struct records_args
static const struct cli_opt records_opts[] = {
    CLI_OPT_GROUP(RA, socket, cli_socket_opts),
    CLI_OPT_FLAG(RA, as_json, "json", "one JSON object per record (JSON Lines), then a summary object"),
    CLI_OPT_DOUBLE(RA, seconds, "seconds", "N", 1e-6, 1e7, "stop after N seconds (default: until detached or SIGINT)"),
    CLI_OPT_INT(RA, max_records, "max-records", "N", 1, 0x7fffffffL, "stop after N records"),
    CLI_OPT_INT(RA, interval_us, "interval-us", "N", 10, 1000000,
                "the longest a record waits to be read (default 50000: the engine\n"
                "wakes the reader sooner once a ring is half full; a ring handed\n"
                "over without its wake-up descriptor is polled every 200)"),
    {0}};
#undef RA

static const char records_head[] =
    "usage: megascope records --socket S ID [options]\n\n"
    "Streams the ring-buffer records of attachment ID while the engine runs, decoded by\n"
    "the record struct in the monitor's BTF (a struct named after the map, or after it\n"
    "without its final 's': step_events -> struct step_event), else as u64 words. Losses\n"
    "(ring full, or over the --ringbuf-bytes budget) are counted and shown. One reader per\n"
    "attachment at a time. Stops after --seconds, --max-records, SIGINT, or when the\n"
    "attachment is detached (after draining what it wrote).\n\n";

int cmd_records(int argc, char **argv) {
  struct records_args a = {0};  /* interval 0: not given */
  int first, prc = cli_parse("records", records_head, records_opts, &a, argc, argv, &first);
  if (prc) return prc > 0 ? 0 : 2;
  const char *socket_arg = a.socket;
  long max_records = a.max_records, interval_us = a.interval_us ? a.interval_us : 50000, id = 0;
  long poll_us = a.interval_us ? a.interval_us : 200;  /* rings without a wake-up descriptor */
  double seconds = a.seconds;
  int as_json = a.as_json;
  if (first != argc - 1) {
    fprintf(stderr, "megascope records: expected ID (try 'megascope records --help')\n");
    return 2;
  }
  if (cli_int("ID", argv[first], 1, 0x7fffffffL, &id)) return 2;
  char path[512];
  if (cli_ctl_socket("records", socket_arg, path, sizeof path)) return 1;
  char lb[512] = "";
  struct ms_textbuf log = {lb, sizeof lb, 0, 0};
  struct ms_control_client *cl = ms_control_connect(path, &log);
  if (!cl) {
    fprintf(stderr, "megascope records: %s", lb);
    return 1;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  signal(SIGPIPE, on_signal);
  char req[96];
  snprintf(req, sizeof req, "{\"cmd\":\"records\",\"id\":%ld}", id);
  int fds[MS_CONTROL_MAX_FDS], n_fds = 0, rc = 1;
  struct ring rings[MS_CONTROL_MAX_FDS];
  int n_rings = 0;
  for (int i = 0; i < MS_CONTROL_MAX_FDS; i++) rings[i].fd = -1;
  struct rec_state st = {.as_json = as_json, .max_records = (uint64_t)max_records};
  json_t *rep = ask(cl, req, fds, &n_fds);
  if (!rep) goto out;
  st.generation = (uint32_t)json_integer_value(json_object_get(rep, "generation"));
  n_rings = rings_open(rep, fds, n_fds, rings, MS_CONTROL_MAX_FDS, as_json);
  close_fds(fds, n_fds);
  if (n_rings > 0) n_rings = other_ranks(cl, id, json_integer_value(json_object_get(rep, "ranks")), rings, n_rings,
                                         as_json);
  json_decref(rep);
  if (n_rings <= 0) goto out;
  uint64_t t0 = now_ns(), next_state = t0, lost_ring = 0, lost_cov0 = UINT64_MAX, lost_cov = 0, lost_before = 0;
  /* what the rings dropped before this reader took them */
  for (int i = 0; i < n_rings; i++) lost_before += rings[i].seen_lost;
  int attached = 1, gens = 1;
  rc = 0;
  while (!stopping) {
    if (drain(rings, n_rings, &st) < 0) break;
    for (int i = 0; i < n_rings; i++) {
      uint64_t l = __atomic_load_n(&ms_bpf_map_reader_header(rings[i].rd)->lost, __ATOMIC_RELAXED);
      if (l != rings[i].seen_lost) {
        if (!as_json)
          fprintf(stderr, "megascope records: ring %s: %" PRIu64 " records lost (ring full)\n", rings[i].name,
                  l - rings[i].seen_lost);
        lost_ring += l - rings[i].seen_lost;
        rings[i].seen_lost = l;
      }
    }
    uint64_t now = now_ns();
    if (seconds > 0 && now - t0 >= (uint64_t)(seconds * 1e9)) break;
    if (!attached) break;  /* detached: drained once more above */
    if (now >= next_state) {
      next_state = now + 100000000ull;
      char lreq[64];
      snprintf(lreq, sizeof lreq, "{\"cmd\":\"list\",\"id\":%ld}", id);
      json_t *ls = ask(cl, lreq, NULL, NULL);
      uint32_t gen = 0;
      uint64_t lost = 0;
      if (!ls || state_of(ls, id, &attached, &gen, &lost)) {
        json_decref(ls);
        if (ls) fprintf(stderr, "megascope records: attachment %ld is gone\n", id);
        rc = ls ? 0 : 1;
        break;
      }
      json_decref(ls);
      if (lost_cov0 == UINT64_MAX) lost_cov0 = lost;
      lost_cov = lost;
      if (attached && gen != st.generation) {
        /* replaced: finish the old generation's rings, then read the new ones */
        if (drain(rings, n_rings, &st) < 0) break;
        rings_free(rings, n_rings);
        json_t *r2 = ask(cl, req, fds, &n_fds);
        if (!r2) {
          rc = 1;
          break;
        }
        st.generation = (uint32_t)json_integer_value(json_object_get(r2, "generation"));
        n_rings = rings_open(r2, fds, n_fds, rings, MS_CONTROL_MAX_FDS, as_json);
        close_fds(fds, n_fds);
        json_decref(r2);
        if (n_rings <= 0) {
          rc = 1;
          break;
        }
        lost_cov0 = UINT64_MAX;
        gens++;
      }
    }
    wait_rings(rings, n_rings, interval_us, poll_us);
  }
  drain(rings, n_rings, &st);
  fflush(stdout);
  double secs = (double)(now_ns() - t0) / 1e9;
  uint64_t lost_during = lost_cov0 == UINT64_MAX ? 0 : lost_cov - lost_cov0;
  if (as_json) {
    struct ms_json j;
    ms_json_init(&j, stdout, 0);
    ms_json_obj_begin(&j);
    ms_json_key(&j, "summary");
    ms_json_obj_begin(&j);
    ms_json_kint(&j, "id", id);
    ms_json_kuint(&j, "records", st.records);
    ms_json_kuint(&j, "lost_ring_full", lost_ring);
    ms_json_kuint(&j, "lost_coverage", lost_during);
    ms_json_kuint(&j, "lost_before_reader", lost_before);
    ms_json_kuint(&j, "generations", (uint64_t)gens);
    ms_json_knum(&j, "seconds", secs);
    ms_json_obj_end(&j);
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else {
    fprintf(stderr,
            "megascope records: %" PRIu64 " records in %.2f s from attachment %ld (%d generation%s); lost while "
            "reading: %" PRIu64 " (ring full), %" PRIu64 " (coverage, budget drops included); before the reader "
            "took the rings: %" PRIu64 "\n",
            st.records, secs, id, gens, gens == 1 ? "" : "s", lost_ring, lost_during, lost_before);
  }
out:
  rings_free(rings, n_rings > 0 ? n_rings : 0);
  ms_control_client_free(cl);
  return rc;
}
