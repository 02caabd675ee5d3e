/* SPDX-License-Identifier: MIT */
/* The HTTP server's gate (private to src/control): the listening socket and
 * the connections as the server admits them. It accepts on a thread of its
 * own, bounds connections in total and per client address, closes the oldest
 * idle connection to make room, holds each request to read deadlines, and
 * hands the sockets it keeps to libmicrohttpd (MHD_add_connection), which
 * serves them. See gate.c for why libmicrohttpd's own options do not do this. */
#ifndef MS_CONTROL_GATE_H
#define MS_CONTROL_GATE_H

#include <microhttpd.h>
#include <stdint.h>
#include <sys/socket.h>

#include "megascope/base.h"

struct gate_opts {
  int max_conns;        /* open connections in all (> 0) */
  int max_per_client;   /* open connections from one client address (> 0) */
  int read_ms;          /* a request's head, then its body, must arrive within this */
  int idle_ms;          /* a kept-alive connection must start its next request within this */
};

/* Why a connection was closed or refused (counters, /metrics' labels). */
enum gate_count {
  GATE_ACCEPTED = 0,
  GATE_REFUSED_FULL,    /* every connection busy: 503 */
  GATE_REFUSED_CLIENT,  /* the client's connections all busy: 429 */
  GATE_REFUSED_FDS,     /* out of descriptors: 503 */
  GATE_EVICTED,         /* an idle or slow connection closed to make room */
  GATE_TIMEOUT_WAIT,    /* no request within the deadline after connecting */
  GATE_TIMEOUT_IDLE,    /* kept alive, no next request within the idle timeout */
  GATE_TIMEOUT_HEAD,    /* a request's head not complete in time: 408 */
  GATE_TIMEOUT_BODY,    /* a request's body not complete in time: 408 */
  GATE_COUNT
};
extern const char *const gate_count_names[GATE_COUNT];

struct gate_stats {
  uint64_t n[GATE_COUNT];
  int open;             /* connections held now */
};

/* Where a connection is in its request (set from its own thread). */
enum gate_phase {
  GATE_PHASE_WAIT = 0,  /* no request begun (just connected, or kept alive after one) */
  GATE_PHASE_HEAD,      /* the request line is in, the header fields are not */
  GATE_PHASE_BODY,      /* the head is in, the body is arriving */
  GATE_PHASE_BUSY,      /* the request is whole: being answered */
};

struct ms_gate;
struct gate_conn;

/* Binds and listens; no thread yet. NULL + errno with the reason in log. */
struct ms_gate *gate_new(const struct sockaddr *addr, socklen_t len, const struct gate_opts *o,
                         struct ms_textbuf *log);
int gate_port(const struct ms_gate *g);
/* Starts accepting for d (started with MHD_USE_NO_LISTEN_SOCKET and
 * MHD_OPTION_NOTIFY_CONNECTION gate_notify, g). 0 or a negative errno. */
int gate_start(struct ms_gate *g, struct MHD_Daemon *d);
/* Stops accepting and closes the listening socket (before MHD_stop_daemon). */
void gate_stop(struct ms_gate *g);
/* After MHD_stop_daemon. */
void gate_free(struct ms_gate *g);

/* libmicrohttpd's connection notifications (cls: the gate). */
void gate_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                 enum MHD_ConnectionNotificationCode code);
/* The connection's entry, or NULL. */
struct gate_conn *gate_conn_of(struct MHD_Connection *c);
void gate_set_phase(struct ms_gate *g, struct gate_conn *c, enum gate_phase p);
/* The client as limits count it: an IPv4 address, or an IPv6 /64 ("2001:db8:0:1::/64"). */
const char *gate_client(const struct gate_conn *c);
/* 1 when c holds a reserve place (every connection was answering): it may ask for /health and /metrics alone. */
int gate_reserved(const struct gate_conn *c);
void gate_get_stats(struct ms_gate *g, struct gate_stats *out);

#endif
