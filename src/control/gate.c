/* SPDX-License-Identifier: MIT */
/* The HTTP server's gate: who gets a connection, and for how long.
 *
 * Why not libmicrohttpd's options. Its connection limit refuses the newest
 * connection when full (so idle ones lock everyone out), its timeout is one of
 * inactivity (a byte a second keeps a connection forever: slowloris), its
 * per-address limit cannot close an idle connection to make room, and when
 * accept() fails for want of descriptors it either stops accepting until a
 * connection closes or, with none open, retries at once (a core spins). The
 * gate therefore owns the listening socket and libmicrohttpd serves what the
 * gate hands it (MHD_USE_NO_LISTEN_SOCKET, MHD_add_connection); its
 * notifications (started, closed; the request line through the URI logger;
 * the head, body and answer through the request handler) tell the gate where
 * each connection is.
 *
 * DESIGN
 * Who runs what. One thread (gate_main) accepts, decides, and once every
 * 100 ms sweeps the connections for deadlines. libmicrohttpd's threads report
 * phases (gate_set_phase) and closes (gate_notify). One mutex guards the list
 * and its counts; nobody holds it across a system call but shutdown(2) and a
 * non-blocking send(2) of a refusal.
 * Admission. A client is an IPv4 address or an IPv6 /64. A new connection from
 * a client at max_per_client closes that client's oldest idle connection, or is
 * refused with 429 when all of them are busy; past max_conns in all, an idle
 * connection of the client holding the most is closed (its oldest), or the new
 * one refused with 503. Idle means no request being answered: waiting for one,
 * or reading its head or body; oldest by when that began. So idle or slow
 * connections, however many, never keep out a client whose request is ready,
 * and a flood from a few addresses takes its own connections' places first, not
 * those of a client with one connection whose request is still on its way.
 * While nothing can be closed (every connection answering, or just accepted
 * and not yet announced by libmicrohttpd, or shut down and not yet gone), a
 * client with fewer than 3 connections takes one of 64 places on a margin
 * beyond the bound, so a flood's churn does not shut it out either. When every connection
 * is answering, up to 16 more are taken on reserve places that serve /health
 * and /metrics alone (anything else: 503), one request each (their own idle
 * longest closed for a new one), so a probe or a scraper is answered even then.
 * Deadlines. After connecting, a request's head must be whole within read_ms;
 * after an answer, the next request line must come within idle_ms and its head
 * within read_ms of it; a body must be whole within read_ms of its head. A
 * request begun and not finished is answered 408 before the close. Answers
 * themselves have no deadline here (generation takes what it takes);
 * libmicrohttpd's inactivity timeout (idle_ms) closes a connection whose
 * client stops reading.
 * Closing. The gate never closes a descriptor it has handed over: it shuts
 * the socket down (shutdown(2)) and libmicrohttpd, seeing the end, closes the
 * connection and notifies; the entry is freed then, under the mutex, before
 * libmicrohttpd closes the descriptor, so a shutdown never reaches a reused
 * number. An entry libmicrohttpd has not announced yet (it adds connections on
 * its own thread) is never shut down; one it dropped unannounced is forgotten
 * after 5 s.
 * Out of descriptors. accept() failing with EMFILE/ENFILE closes a spare
 * descriptor, accepts, answers 503 and closes, then reopens the spare; the
 * spare is taken back before every accept, so no connection gets the last
 * descriptor; when it cannot be had, the listening socket is left unpolled
 * for 100 ms.
 * Accepting never spins and never stops for good.
 * Shutdown. gate_stop wakes the thread (eventfd), joins it and closes the
 * listening socket; MHD_stop_daemon then closes the connections (each
 * notified); gate_free frees what is left. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "control/gate.h"
#include "control/openai.h"

#define TICK_NS 100000000ull          /* the sweep's period, and the back-off out of descriptors */
#define UNANNOUNCED_NS 5000000000ull  /* a handed-over socket libmicrohttpd never announced */
#define RESERVE 16                    /* connections beyond the bound, for /health and /metrics alone */
#define MARGIN 64                     /* beyond the bound, for clients with few connections */
#define FEW 3                         /* what few is */
#define CLIENT_BUCKETS 256

/* A client (an address, an IPv6 /64) while it has entries. */
struct gate_client {
  struct gate_client *next;   /* its hash chain */
  uint8_t key[17];            /* family, then the address (IPv6: its /64) */
  int open;                   /* its connections not closing */
  int refs;                   /* its entries */
};

const char *const gate_count_names[GATE_COUNT] = {"accepted", "refused_full",  "refused_client",
                                                  "refused_fds", "evicted",   "timeout_wait",
                                                  "timeout_idle", "timeout_head", "timeout_body"};

struct gate_conn {
  struct gate_conn *prev, *next;
  int fd;
  int started;                /* libmicrohttpd announced it */
  int closing;                /* shut down by the gate: counted no more */
  int served;                 /* requests answered on it */
  int reserve;                /* taken beyond the bound: /health and /metrics alone, then closed */
  int margin;                 /* taken beyond the bound by a client with few connections */
  enum gate_phase phase;
  uint64_t t_accept, since;   /* since: when the present wait or phase began */
  struct gate_client *cl;
  char client[64];
};

struct ms_gate {
  struct gate_opts o;
  int lfd, wake, spare, port;  /* spare: a descriptor kept for refusing when out of them */
  struct MHD_Daemon *d;
  pthread_t th;
  int running;
  _Atomic int stop;
  pthread_mutex_t mu;         /* the list and the counts below */
  struct gate_conn *head;
  int n_entries, n_open;      /* entries; those not closing */
  int n_reserve, n_margin;    /* of n_open, those on a reserve place, on the margin */
  struct gate_client *clients[CLIENT_BUCKETS];
  _Atomic uint64_t n[GATE_COUNT];
};

/* ---- clients ---- */

/* The client key of an address: IPv4 (also IPv4-mapped IPv6) whole, IPv6 by its /64. */
static void client_key(const struct sockaddr *sa, uint8_t key[17], char *name, size_t n) {
  memset(key, 0, 17);
  if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a)) {
      key[0] = 4;
      memcpy(key + 1, a->s6_addr + 12, 4);
      inet_ntop(AF_INET, key + 1, name, (socklen_t)n);
      return;
    }
    struct in6_addr p = {0};
    memcpy(p.s6_addr, a->s6_addr, 8);
    key[0] = 6;
    memcpy(key + 1, p.s6_addr, 8);
    char buf[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, &p, buf, sizeof buf);
    snprintf(name, n, "%s/64", buf);
  } else if (sa->sa_family == AF_INET) {
    key[0] = 4;
    memcpy(key + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    inet_ntop(AF_INET, key + 1, name, (socklen_t)n);
  } else {
    snprintf(name, n, "local");
  }
}

/* ---- refusals: a whole answer written to a socket the gate will not keep ---- */

static void refuse(int fd, unsigned status, const char *code, const char *msg) {
  char body[512], *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f) {
    oa_write_error(f, status, msg, NULL, code);
    fclose(f);
  }
  int bn = snprintf(body, sizeof body,
                    "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
                    "Content-Length: %zu\r\n\r\n",
                    status, status == 429 ? "Too Many Requests" : "Service Unavailable", buf ? len : 0);
  if (bn > 0 && send(fd, body, (size_t)bn, MSG_NOSIGNAL | MSG_DONTWAIT) == bn && buf)
    (void)!send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  free(buf);
  shutdown(fd, SHUT_WR);
  /* what the client already sent, read away: closing with unread bytes resets the connection */
  char junk[4096];
  for (int i = 0; i < 16 && recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0; i++) {
  }
  close(fd);
}

/* ---- the list and the clients (under mu) ---- */

static struct gate_client **client_slot(struct ms_gate *g, const uint8_t key[17]) {
  uint32_t h = 2166136261u;
  for (int i = 0; i < 17; i++) h = (h ^ key[i]) * 16777619u;
  struct gate_client **p = &g->clients[h % CLIENT_BUCKETS];
  while (*p && memcmp((*p)->key, key, 17)) p = &(*p)->next;
  return p;
}

/* key's client, with one more reference (NULL: out of memory). */
static struct gate_client *client_get(struct ms_gate *g, const uint8_t key[17]) {
  struct gate_client **p = client_slot(g, key);
  if (!*p && (*p = calloc(1, sizeof **p))) memcpy((*p)->key, key, 17);
  if (*p) (*p)->refs++;
  return *p;
}

static void client_put(struct ms_gate *g, struct gate_client *cl) {
  if (--cl->refs) return;
  struct gate_client **p = client_slot(g, cl->key);
  *p = cl->next;
  free(cl);
}

/* c counts no more as open (closing, or gone). */
static void uncount(struct ms_gate *g, struct gate_conn *c) {
  g->n_open--;
  g->n_reserve -= c->reserve;
  g->n_margin -= c->margin;
  c->cl->open--;
}

static void unlink_conn(struct ms_gate *g, struct gate_conn *c) {
  if (c->prev) c->prev->next = c->next;
  else g->head = c->next;
  if (c->next) c->next->prev = c->prev;
  g->n_entries--;
  if (!c->closing) uncount(g, c);
  client_put(g, c->cl);
}

/* The connection to close for room: idle (not answering) and announced, of
 * client cl (NULL: any client, on a regular place (reserve 0) or a reserve one
 * (1)); of those, the one whose client holds the most connections, and of its,
 * the one idle longest. NULL when none is idle. A client with one connection
 * so loses it only when every client is down to one. */
static struct gate_conn *idle_victim(const struct ms_gate *g, const struct gate_client *cl, int reserve) {
  struct gate_conn *best = NULL;
  for (struct gate_conn *c = g->head; c; c = c->next) {
    if (!c->started || c->closing || c->phase == GATE_PHASE_BUSY) continue;
    if (cl ? c->cl != cl : c->reserve != reserve) continue;
    if (!best || c->cl->open > best->cl->open || (c->cl->open == best->cl->open && c->since < best->since))
      best = c;
  }
  return best;
}

/* Shuts c down (libmicrohttpd closes it); a request begun gets 408 first. */
static void close_conn(struct ms_gate *g, struct gate_conn *c, enum gate_count why) {
  if (c->phase == GATE_PHASE_HEAD || c->phase == GATE_PHASE_BODY) {
    static const char t408[] = "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    (void)!send(c->fd, t408, sizeof t408 - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  shutdown(c->fd, SHUT_RDWR);
  c->closing = 1;
  uncount(g, c);
  atomic_fetch_add_explicit(&g->n[why], 1, memory_order_relaxed);  /* statistics only */
  ms_logf(MS_LOG_DEBUG, "http: closed a connection from %s (%s)", c->client, gate_count_names[why]);
}

/* ---- accepting ---- */

/* Room for connection c of client c->cl (an idle one closed for it; on the
 * margin or a reserve place when none can be), or the refusal's status (429,
 * 503). Under mu. */
static unsigned make_room(struct ms_gate *g, struct gate_conn *c, char *msg, size_t n) {
  struct gate_client *cl = c->cl;
  const char *client = c->client;
  int few = cl->open < FEW;  /* a client with few other connections (its last one may not be gone yet) */
  if (cl->open >= g->o.max_per_client) {
    struct gate_conn *v = idle_victim(g, cl, 0);
    if (!v) {
      snprintf(msg, n, "too many connections from %s (%d, all busy); retry when one is answered", client,
               g->o.max_per_client);
      return 429;
    }
    close_conn(g, v, GATE_EVICTED);
  }
  /* connections shut down and not yet closed by libmicrohttpd still have its
   * threads: as many as max_conns (more for a client with no other connection) */
  if (g->n_entries - g->n_open >= g->o.max_conns + (few ? MARGIN : 0)) {
    snprintf(msg, n, "the server is closing connections to make room; retry in a moment");
    return 503;
  }
  if (g->n_open - g->n_reserve - g->n_margin < g->o.max_conns) return 0;
  struct gate_conn *v = idle_victim(g, NULL, 0), *r = NULL;
  if (v) {
    close_conn(g, v, GATE_EVICTED);
  } else if (few && g->n_margin < MARGIN) {
    c->margin = 1;  /* nothing to close yet (answering, or not announced): a flood does not shut it out */
  } else if (g->n_reserve < RESERVE || (r = idle_victim(g, NULL, 1))) {
    if (r) close_conn(g, r, GATE_EVICTED);
    c->reserve = 1;  /* every connection is answering: this one may ask for /health or /metrics */
  } else {
    snprintf(msg, n, "the server's %d connections are all busy; retry in a moment", g->o.max_conns);
    return 503;
  }
  return 0;
}

static void link_conn(struct ms_gate *g, struct gate_conn *c) {
  c->next = g->head;
  if (g->head) g->head->prev = c;
  g->head = c;
  g->n_entries++;
  g->n_open++;
  g->n_reserve += c->reserve;
  g->n_margin += c->margin;
  c->cl->open++;
}

/* Takes connection fd in, or answers it with a refusal and closes it. */
static void admit(struct ms_gate *g, int fd, const struct sockaddr *sa, socklen_t len) {
  struct gate_conn *c = calloc(1, sizeof *c);
  uint8_t key[17];
  char msg[200] = "the server is out of memory";
  unsigned status = 503;
  if (c) {
    client_key(sa, key, c->client, sizeof c->client);
    c->fd = fd;
    c->t_accept = c->since = ms_now_ns();
    pthread_mutex_lock(&g->mu);
    for (struct gate_conn *o = g->head; o; o = o->next)
      if (!o->started && o->fd == fd) {  /* an entry libmicrohttpd dropped unannounced: its number is reused */
        unlink_conn(g, o);
        free(o);
        break;
      }
    if ((c->cl = client_get(g, key)) && !(status = make_room(g, c, msg, sizeof msg)))
      link_conn(g, c);
    else if (c->cl)
      client_put(g, c->cl);
    pthread_mutex_unlock(&g->mu);
  }
  if (status) {
    free(c);
    refuse(fd, status, status == 429 ? "too_many_connections" : "overloaded", msg);
    atomic_fetch_add_explicit(&g->n[status == 429 ? GATE_REFUSED_CLIENT : GATE_REFUSED_FULL], 1,
                              memory_order_relaxed);
    return;
  }
  atomic_fetch_add_explicit(&g->n[GATE_ACCEPTED], 1, memory_order_relaxed);
  if (MHD_add_connection(g->d, fd, sa, len) != MHD_YES) {  /* it closed fd */
    pthread_mutex_lock(&g->mu);
    unlink_conn(g, c);
    pthread_mutex_unlock(&g->mu);
    free(c);
  }
}

/* Out of descriptors: one pending connection answered 503 through the
 * spare descriptor, which accept_some() holds whenever it calls this. 0 when
 * it did; -1 when it did not or the spare could not be had again (back off). */
static int shed(struct ms_gate *g) {
  close(g->spare);
  g->spare = -1;
  int fd = accept4(g->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {
    refuse(fd, 503, "overloaded", "the server is out of file descriptors; retry in a moment");
    atomic_fetch_add_explicit(&g->n[GATE_REFUSED_FDS], 1, memory_order_relaxed);
  }
  g->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd >= 0 && g->spare >= 0 ? 0 : -1;
}

/* Accepts what is pending (64 at most a round). 1: back off from the socket a while.
 * The spare is taken back before each accept: when another thread took the
 * number shed() freed, the spare stayed closed, the process sat one below its
 * limit, and the next connection was admitted on the last descriptor instead
 * of answered 503 (a /health sent 4.5 s into a flood of 300 on 192
 * descriptors was answered 15 s later, when libmicrohttpd's timeout closed the
 * flood). So a connection is admitted only while one descriptor is held back. */
static int accept_some(struct ms_gate *g) {
  for (int i = 0; i < 64; i++) {
    if (g->spare < 0) g->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (g->spare < 0) return 1;  /* out of descriptors with none held back: shed() could not answer */
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int fd = accept4(g->lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      admit(g, fd, (struct sockaddr *)&ss, len);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EMFILE || errno == ENFILE) {
      if (shed(g)) return 1;
      continue;
    }
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : 1;  /* ENOBUFS, ENOMEM: wait a tick */
  }
  return 0;
}

/* ---- deadlines ---- */

/* The clock is read under the mutex: a phase set between a reading taken
 * before it and the lock would stamp `since` after `now`, and the unsigned
 * age would wrap into a deadline long past (a request whose head had just
 * come in was answered 408 so, with the gate's thread descheduled between
 * the two on a busy machine). */
static void sweep(struct ms_gate *g) {
  uint64_t read_ns = (uint64_t)g->o.read_ms * 1000000ull, idle_ns = (uint64_t)g->o.idle_ms * 1000000ull;
  pthread_mutex_lock(&g->mu);
  uint64_t now = ms_now_ns();
  for (struct gate_conn *c = g->head, *next; c; c = next) {
    next = c->next;
    if (!c->started) {
      if (now - c->t_accept > UNANNOUNCED_NS) {
        unlink_conn(g, c);
        free(c);
      }
      continue;
    }
    if (c->closing || c->phase == GATE_PHASE_BUSY) continue;
    int kept = c->phase == GATE_PHASE_WAIT && c->served;
    if (kept && c->reserve) {  /* a reserve place serves one request */
      close_conn(g, c, GATE_EVICTED);
      continue;
    }
    uint64_t limit = kept ? idle_ns : read_ns;
    if (now <= c->since || now - c->since <= limit) continue;
    enum gate_count why = c->phase == GATE_PHASE_BODY   ? GATE_TIMEOUT_BODY
                          : c->phase == GATE_PHASE_HEAD ? GATE_TIMEOUT_HEAD
                          : kept                        ? GATE_TIMEOUT_IDLE
                                                        : GATE_TIMEOUT_WAIT;
    close_conn(g, c, why);
  }
  pthread_mutex_unlock(&g->mu);
}

static void *gate_main(void *arg) {
  struct ms_gate *g = arg;
  uint64_t next_sweep = 0, resume = 0;
  while (!atomic_load_explicit(&g->stop, memory_order_acquire)) {
    uint64_t now = ms_now_ns();
    struct pollfd p[2] = {{g->wake, POLLIN, 0}, {now >= resume ? g->lfd : -1, POLLIN, 0}};
    int rc = poll(p, 2, (int)(TICK_NS / 1000000ull));
    if (rc > 0 && (p[1].revents & POLLIN) && accept_some(g)) resume = ms_now_ns() + TICK_NS;
    now = ms_now_ns();
    if (now >= next_sweep) {
      sweep(g);
      next_sweep = now + TICK_NS;
    }
  }
  return NULL;
}

/* ---- life cycle ---- */

struct ms_gate *gate_new(const struct sockaddr *addr, socklen_t len, const struct gate_opts *o,
                         struct ms_textbuf *log) {
  struct ms_gate *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->o = *o;
  g->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  g->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
  g->lfd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1, err = 0;
  if (g->wake < 0 || g->lfd < 0) err = errno;
  if (!err && addr->sa_family == AF_INET6) setsockopt(g->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (!err && (setsockopt(g->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(g->lfd, addr, len) ||
               listen(g->lfd, 1024)))
    err = errno;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (!err && getsockname(g->lfd, (struct sockaddr *)&ss, &sl)) err = errno;
  if (err) {
    ms_textbuf_printf(log, "http: cannot listen: %s\n", strerror(err));
    if (g->lfd >= 0) close(g->lfd);
    if (g->wake >= 0) close(g->wake);
    if (g->spare >= 0) close(g->spare);
    free(g);
    errno = err;
    return NULL;
  }
  g->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
  pthread_mutex_init(&g->mu, NULL);
  return g;
}

int gate_port(const struct ms_gate *g) { return g->port; }

int gate_start(struct ms_gate *g, struct MHD_Daemon *d) {
  g->d = d;
  int rc = pthread_create(&g->th, NULL, gate_main, g);
  if (rc) return -rc;
  g->running = 1;
  return 0;
}

void gate_stop(struct ms_gate *g) {
  if (!g) return;
  atomic_store_explicit(&g->stop, 1, memory_order_release);
  if (g->running) {
    uint64_t one = 1;
    (void)!write(g->wake, &one, sizeof one);
    pthread_join(g->th, NULL);
    g->running = 0;
  }
  if (g->lfd >= 0) close(g->lfd);
  g->lfd = -1;
}

void gate_free(struct ms_gate *g) {
  if (!g) return;
  gate_stop(g);
  for (struct gate_conn *c = g->head, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  for (int i = 0; i < CLIENT_BUCKETS; i++)
    for (struct gate_client *cl = g->clients[i], *next; cl; cl = next) {
      next = cl->next;
      free(cl);
    }
  close(g->wake);
  if (g->spare >= 0) close(g->spare);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

/* ---- what libmicrohttpd and the handlers report ---- */

void gate_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                 enum MHD_ConnectionNotificationCode code) {
  struct ms_gate *g = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    pthread_mutex_lock(&g->mu);
    for (struct gate_conn *c = g->head; c; c = c->next)
      if (!c->started && c->fd == ci->connect_fd) {
        c->started = 1;
        *socket_context = c;
        break;
      }
    pthread_mutex_unlock(&g->mu);
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
    struct gate_conn *c = *socket_context;
    pthread_mutex_lock(&g->mu);
    unlink_conn(g, c);
    pthread_mutex_unlock(&g->mu);
    free(c);
    *socket_context = NULL;
  }
}

struct gate_conn *gate_conn_of(struct MHD_Connection *mc) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

void gate_set_phase(struct ms_gate *g, struct gate_conn *c, enum gate_phase p) {
  if (!c) return;
  pthread_mutex_lock(&g->mu);
  /* the first request's head counts from the connect: a slow request line gains nothing */
  if (!(p == GATE_PHASE_HEAD && !c->served)) c->since = ms_now_ns();
  if (p == GATE_PHASE_WAIT && c->phase != GATE_PHASE_WAIT) c->served++;
  c->phase = p;
  pthread_mutex_unlock(&g->mu);
}

const char *gate_client(const struct gate_conn *c) { return c ? c->client : "unknown"; }
int gate_reserved(const struct gate_conn *c) { return c && c->reserve; }

void gate_get_stats(struct ms_gate *g, struct gate_stats *out) {
  for (int i = 0; i < GATE_COUNT; i++) out->n[i] = atomic_load_explicit(&g->n[i], memory_order_relaxed);
  pthread_mutex_lock(&g->mu);
  out->open = g->n_open;
  pthread_mutex_unlock(&g->mu);
}
