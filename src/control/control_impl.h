/* SPDX-License-Identifier: MIT */
/* The control server's private parts: client state, replies, and the command
 * table the server thread dispatches to (commands.c). */
#ifndef MS_CONTROL_CONTROL_IMPL_H
#define MS_CONTROL_CONTROL_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "megascope/control.h"
#include "megascope/monitor.h"
#include "megascope/monitor_job.h"
#include "megascope/export.h"
#include "megascope/telemetry.h"

void ms_control_put_u32le(uint8_t *p, uint32_t v);
/* Replaces bytes that are not valid UTF-8 (in place, by '?') so that text from
 * untrusted input (object section names, truncated strings) can go into JSON.
 * Returns how many bytes it replaced. */
size_t ms_control_utf8_clean(char *s);
uint32_t ms_control_get_u32le(const uint8_t *p);

/* A reply being built: JSON bytes and the descriptors that go with them. */
struct creply {
  char *buf;
  size_t len;
  int fds[MS_CONTROL_MAX_FDS];
  int n_fds;
  int is_error;
  int deferred;       /* no reply yet: the command finishes later (trace) */
};

/* One connected client, owned by the server thread. */
struct cclient {
  int fd;
  uid_t uid;
  pid_t pid;
  uint8_t hdr[4];
  uint32_t hdr_got;
  char *body;
  uint32_t body_len, body_got;
  uint64_t msg_t0;    /* engine clock when the frame in progress began; 0: none */
  char *out;          /* frame being sent (header included) */
  size_t out_len, out_off;
  uint64_t out_t0;    /* when out was queued: a peer that never reads is closed */
  int out_fds[MS_CONTROL_MAX_FDS];
  int n_out_fds;      /* still to attach to the next byte sent */
  int close_after;    /* close once out is sent */
  int waiting;        /* a deferred command (trace) owes it a reply */
  uint64_t last_t;    /* engine clock of its last activity (accept, frame, reply sent) */
  int reader_id;      /* the attachment whose ring buffers it consumes ("records"); 0: none */
  /* an attach or replace whose object is being verified off this thread */
  struct ms_monitor_job *job;
  struct cload {
    int replace;        /* 0: attach; 1: replace attachment id */
    long long id;
    char name[64];
    struct ms_attach_opts ao;
    void *obj;          /* the object's bytes, carried to the other ranks of an engine across ranks */
    size_t obj_len;
  } load;
};

struct ms_control {
  struct ms_engine *e;
  char path[108];
  char model[64];
  int lfd, wake_fd;
  uint64_t accept_resume;      /* out of descriptors: the listener is not polled before this */
  pthread_t thread;
  int started;
  _Atomic int stop;                 /* set by ms_control_free; the thread polls it after a wake */
  uint32_t max_message;
  int max_clients, message_timeout_ms;
  int64_t idle_timeout_ns;          /* < 0: never */
  uid_t uid;
  uint64_t t_start;
  struct cclient **cl;              /* [max_clients] server thread only */
  int n_cl;
  /* the one trace in progress (server thread only) */
  struct cclient *trace_client;     /* NULL: the client left, or none */
  int trace_on;
  uint64_t trace_deadline;
  struct ms_trace_write_opts trace_opts;  /* its format and budget */
  /* statistics: written by the server thread, read by anyone */
  _Atomic uint64_t accepted, refused, requests, errors, dropped, idle_closed;
  uint64_t next_reap;               /* engine clock of the next reap of closed attachments */
};

/* The server's counters, as ms_control_get_stats and the "stats" command read
 * them (relaxed: each is a count on its own, read by anyone). */
static inline void ms_control_stats_read(const struct ms_control *c, struct ms_control_stats *out) {
  struct ms_control *m = (struct ms_control *)c;
  out->accepted = atomic_load_explicit(&m->accepted, memory_order_relaxed);
  out->refused = atomic_load_explicit(&m->refused, memory_order_relaxed);
  out->requests = atomic_load_explicit(&m->requests, memory_order_relaxed);
  out->errors = atomic_load_explicit(&m->errors, memory_order_relaxed);
  out->dropped = atomic_load_explicit(&m->dropped, memory_order_relaxed);
  out->idle_closed = atomic_load_explicit(&m->idle_closed, memory_order_relaxed);
}

/* Runs one request (msg is NUL-terminated JSON of len bytes) from client cl and
 * fills r (server thread). */
void ms_control_dispatch(struct ms_control *c, struct cclient *cl, const char *msg, size_t len, struct creply *r);
/* 1 when the server has a handler for command name (commands.c). */
int ms_control_handles(const char *name);
int ms_control_n_handlers(void);
/* Finishes the attach or replace whose verification (cl->job) is done and
 * fills the reply owed for it; frees the job. */
void ms_control_load_finish(struct ms_control *c, struct cclient *cl, struct creply *r);
/* Ends the trace in progress and fills the reply owed for it. */
void ms_control_trace_finish(struct ms_control *c, struct creply *r);
/* An error reply: "error" is the formatted sentence, code the negative errno. */
void ms_control_reply_error(struct creply *r, int code, const char *log, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Read-only descriptors of attachment id's current maps (mapfds.c): the count
 * (at most max), names filled; or a negative error. */
int ms_control_map_fds(struct ms_engine *e, int id, int *fds, char (*names)[64], int max);
/* The same for rank r of an engine across ranks (0: its own). */
int ms_control_map_fds_of_rank(struct ms_engine *e, int id, int rank, int *fds, char (*names)[64], int max);
/* Read-write descriptors of attachment id's current ring-buffer maps, for a
 * consumer (records.c), with "maps": [{name, ring_bytes, decoded, record,
 * size, fields}] written into j (inside an object); the count (at most max),
 * names and *generation filled; or a negative error. rank > 0: another
 * rank's rings of an engine across ranks (rank 0's copies, "NAME@rankR"). */
struct ms_json;
int ms_control_ring_fds(struct ms_engine *e, int id, int rank, struct ms_json *j, int *fds, char (*names)[64],
                        int max, uint32_t *generation);
/* "EINVAL", "ENOENT", "EVERIFY", ... for a negative or positive error code. */
const char *ms_control_code_name(int code);

#endif
