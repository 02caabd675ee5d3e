/* SPDX-License-Identifier: MIT */
/* The control socket server: a Unix socket per engine, served by one thread.
 *
 * DESIGN
 * Who runs what. ms_control_new creates the socket (0700 directory, socket mode
 * 0600, stale sockets of dead engines replaced) and starts one server thread.
 * That thread alone owns the clients: it polls the listening socket, an eventfd
 * that wakes it for shutdown, and every client; it reads frames without blocking
 * (a client may send a frame a byte at a time), runs each complete request
 * (commands.c, which calls the engine's monitor and telemetry APIs: those are
 * safe from any thread, take only the hook table's mutex, which workers never
 * take, so a request never stalls a decode step), and writes the reply without
 * blocking. The engine's workers never see this thread.
 * Ordering. A client's requests are answered in order, one at a time: its next
 * frame is read only once the previous reply has been sent. A trace request is
 * answered later (when its seconds are up) while the thread serves the others;
 * there is at most one trace at a time. An attach or replace is answered later
 * too: its object is loaded and verified on a thread of its own
 * (megascope/monitor_job.h), whose descriptor this thread polls with the
 * clients, so one heavy program (up to the verifier's work cap) never holds
 * up the other clients; the attach itself then runs here.
 * Untrusted input. Each peer's uid is checked at accept (SO_PEERCRED). A frame
 * longer than max_message gets an error reply and the client is closed (the
 * stream cannot be resynchronised without reading what the peer claims to
 * send); a frame begun and not finished within message_timeout_ms likewise; a
 * client that vanishes mid-frame is closed and counted.
 * Idle clients. A client with no frame in progress, no reply pending and no
 * trace owed is idle; after idle_timeout it is closed. When max_clients are
 * connected, a new client closes the longest-idle one (idle at least a second,
 * or the idle timeout when shorter) instead of being refused, so idle
 * connections never lock an operator out for longer than that.
 * Out of descriptors. accept() failing with EMFILE (or ENFILE, ENOBUFS,
 * ENOMEM) leaves the listener unpolled for 100 ms: the peer waits in the
 * backlog, the thread does not spin.
 * Retention. Once a second the thread reaps detached attachments and replaced
 * generations whose retention has passed (ms_engine_attach_reap). Malformed JSON, unknown
 * commands and bad arguments get error replies and the connection stays usable.
 * Shutdown. ms_control_free sets stop and writes the eventfd; the thread stops
 * a trace in progress, closes every client and returns; it is joined, then the
 * socket is closed and unlinked. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "control/control_impl.h"
#include "megascope/attach.h"
#include "megascope/telemetry.h"

/* ---- replies ---- */

static void client_close(struct ms_control *c, int i);

/* Queues reply r (taking its buffer and descriptors) as a frame to client cl. */
static void client_queue(struct ms_control *c, struct cclient *cl, struct creply *r) {
  size_t n = r->buf ? r->len : 0;
  char *out = malloc(n + 4);
  if (!out) {
    for (int i = 0; i < r->n_fds; i++) close(r->fds[i]);
    free(r->buf);
    cl->close_after = 1;
    return;
  }
  ms_control_put_u32le((uint8_t *)out, (uint32_t)n);
  if (n) memcpy(out + 4, r->buf, n);
  free(r->buf);
  cl->out = out;
  cl->out_len = n + 4;
  cl->out_off = 0;
  cl->out_t0 = ms_now_ns();
  memcpy(cl->out_fds, r->fds, sizeof(int) * (size_t)r->n_fds);
  cl->n_out_fds = r->n_fds;
  atomic_fetch_add_explicit(&c->requests, 1, memory_order_relaxed);  /* statistics only */
  if (r->is_error) atomic_fetch_add_explicit(&c->errors, 1, memory_order_relaxed);
  memset(r, 0, sizeof *r);
}

/* Sends what it can of cl's pending frame; -1 when the client is gone. */
static int client_flush(struct cclient *cl) {
  while (cl->out && cl->out_off < cl->out_len) {
    struct iovec iov = {cl->out + cl->out_off, cl->out_len - cl->out_off};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int) * MS_CONTROL_MAX_FDS)];
    } ctl;
    if (cl->n_out_fds) {
      memset(&ctl, 0, sizeof ctl);
      mh.msg_control = ctl.buf;
      mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)cl->n_out_fds);
      struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)cl->n_out_fds);
      memcpy(CMSG_DATA(h), cl->out_fds, sizeof(int) * (size_t)cl->n_out_fds);
    }
    ssize_t k = sendmsg(cl->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    for (int i = 0; i < cl->n_out_fds; i++) close(cl->out_fds[i]);  /* the peer has its copies */
    cl->n_out_fds = 0;
    cl->out_off += (size_t)k;
  }
  if (cl->out) {
    free(cl->out);
    cl->out = NULL;
    cl->last_t = ms_now_ns();
    if (cl->close_after) return -1;
  }
  return 0;
}

/* ---- reading frames ---- */

static void client_reset_frame(struct cclient *cl) {
  free(cl->body);
  cl->body = NULL;
  cl->hdr_got = cl->body_got = cl->body_len = 0;
  cl->msg_t0 = 0;
}

/* Reads what is available; dispatches a complete frame. -1: close the client. */
static int client_read(struct ms_control *c, struct cclient *cl) {
  while (!cl->out && !cl->waiting) {
    uint8_t *dst;
    size_t want;
    if (cl->hdr_got < 4) {
      dst = cl->hdr + cl->hdr_got;
      want = 4 - cl->hdr_got;
    } else {
      dst = (uint8_t *)cl->body + cl->body_got;
      want = cl->body_len - cl->body_got;
    }
    ssize_t k = want ? recv(cl->fd, dst, want, MSG_DONTWAIT) : 0;
    if (want && k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    }
    if (want && k <= 0) {
      if (cl->msg_t0) {
        atomic_fetch_add_explicit(&c->dropped, 1, memory_order_relaxed);
        ms_logf(MS_LOG_INFO, "control: client pid %ld vanished mid-message (%u of %s bytes arrived)", (long)cl->pid,
                cl->hdr_got < 4 ? cl->hdr_got : cl->body_got + 4,
                cl->hdr_got < 4 ? "4+" : "the announced");
      }
      return -1;
    }
    if (!cl->msg_t0) cl->msg_t0 = cl->last_t = ms_now_ns();
    if (cl->hdr_got < 4) {
      cl->hdr_got += (uint32_t)k;
      if (cl->hdr_got < 4) continue;
      uint32_t n = ms_control_get_u32le(cl->hdr);
      if (n > c->max_message) {
        struct creply r = {0};
        ms_control_reply_error(&r, -EMSGSIZE, NULL,
                               "message of %u bytes exceeds the limit of %u bytes; closing the connection", n,
                               c->max_message);
        atomic_fetch_add_explicit(&c->dropped, 1, memory_order_relaxed);
        ms_logf(MS_LOG_INFO, "control: client pid %ld announced a %u-byte message (limit %u); closed",
                (long)cl->pid, n, c->max_message);
        cl->close_after = 1;
        client_reset_frame(cl);
        client_queue(c, cl, &r);
        return 0;
      }
      cl->body_len = n;
      cl->body_got = 0;
      if (!(cl->body = malloc((size_t)n + 1))) return -1;
    } else {
      cl->body_got += (uint32_t)k;
    }
    if (cl->hdr_got == 4 && cl->body_got == cl->body_len) {
      struct creply r = {0};
      cl->body[cl->body_len] = '\0';
      ms_control_dispatch(c, cl, cl->body, cl->body_len, &r);
      client_reset_frame(cl);
      if (r.deferred)
        cl->waiting = 1;
      else
        client_queue(c, cl, &r);
    }
  }
  return 0;
}

/* ---- connections ---- */

/* A short error frame to a client being turned away (best effort, no wait). */
static void send_refusal(int fd, const char *code, const char *msg) {
  char buf[512];
  int n = snprintf(buf + 4, sizeof buf - 4, "{\"ok\":false,\"code\":\"%s\",\"error\":\"%s\"}", code, msg);
  if (n < 0 || n >= (int)sizeof buf - 4) return;
  ms_control_put_u32le((uint8_t *)buf, (uint32_t)n);
  ssize_t k = send(fd, buf, (size_t)n + 4, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)k;
}

static int client_idle(const struct cclient *cl) { return !cl->msg_t0 && !cl->out && !cl->waiting; }

/* At the limit: closes the client idle longest, if one has been idle long
 * enough to give way; 0 when it made room. */
static int make_room(struct ms_control *c, uint64_t now) {
  uint64_t least = 1000000000ull;
  if (c->idle_timeout_ns >= 0 && (uint64_t)c->idle_timeout_ns < least) least = (uint64_t)c->idle_timeout_ns;
  int victim = -1;
  uint64_t longest = 0;
  for (int i = 0; i < c->n_cl; i++) {
    struct cclient *cl = c->cl[i];
    uint64_t idle = now > cl->last_t ? now - cl->last_t : 0;
    if (client_idle(cl) && idle >= least && idle >= longest) {
      victim = i;
      longest = idle;
    }
  }
  if (victim < 0) return -1;
  ms_logf(MS_LOG_INFO, "control: closed client pid %ld, idle %.1f s, to make room for a new one",
          (long)c->cl[victim]->pid, (double)longest / 1e9);
  atomic_fetch_add_explicit(&c->idle_closed, 1, memory_order_relaxed);
  client_close(c, victim);
  return 0;
}

static void accept_clients(struct ms_control *c) {
  for (int round = 0; round < 64; round++) {
    int fd = accept4(c->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
      /* the peer stays in the backlog; polling the listener now would spin */
      c->accept_resume = ms_now_ns() + 100000000ull;
      ms_logf(MS_LOG_DEBUG, "control: accept: %s; retrying in 100 ms", strerror(errno));
    }
    if (fd < 0) return;
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) || len != sizeof cred) {
      atomic_fetch_add_explicit(&c->refused, 1, memory_order_relaxed);
      close(fd);
      continue;
    }
    if (cred.uid != c->uid && cred.uid != 0) {
      char msg[160];
      snprintf(msg, sizeof msg, "permission denied: peer uid %u is neither the engine's uid %u nor root",
               (unsigned)cred.uid, (unsigned)c->uid);
      send_refusal(fd, "EPERM", msg);
      close(fd);
      atomic_fetch_add_explicit(&c->refused, 1, memory_order_relaxed);
      ms_logf(MS_LOG_INFO, "control: refused pid %ld (uid %u)", (long)cred.pid, (unsigned)cred.uid);
      continue;
    }
    if (c->n_cl == c->max_clients && make_room(c, ms_now_ns())) {
      char msg[128];
      snprintf(msg, sizeof msg, "too many clients (%d connected, none idle for long); try again later", c->n_cl);
      send_refusal(fd, "EBUSY", msg);
      close(fd);
      atomic_fetch_add_explicit(&c->refused, 1, memory_order_relaxed);
      continue;
    }
    struct cclient *cl = calloc(1, sizeof *cl);
    if (!cl) {
      close(fd);
      continue;
    }
    cl->fd = fd;
    cl->uid = cred.uid;
    cl->pid = cred.pid;
    cl->last_t = ms_now_ns();
    c->cl[c->n_cl++] = cl;
    atomic_fetch_add_explicit(&c->accepted, 1, memory_order_relaxed);
  }
}

static void client_close(struct ms_control *c, int i) {
  struct cclient *cl = c->cl[i];
  if (c->trace_client == cl) {
    /* nobody is left to receive the trace: stop recording now */
    c->trace_client = NULL;
    if (c->trace_on) ms_engine_trace_stop(c->e);
    c->trace_on = 0;
  }
  ms_monitor_job_free(cl->job); /* a verification under way is cancelled */
  free(cl->load.obj);
  for (int k = 0; k < cl->n_out_fds; k++) close(cl->out_fds[k]);
  close(cl->fd);
  free(cl->body);
  free(cl->out);
  free(cl);
  c->cl[i] = c->cl[--c->n_cl];
}

/* Deadlines: a trace whose time is up, frames that take too long. */
static void check_deadlines(struct ms_control *c, uint64_t now) {
  if (c->trace_on && now >= c->trace_deadline) {
    struct creply r = {0};
    ms_control_trace_finish(c, &r);
    struct cclient *cl = c->trace_client;
    c->trace_client = NULL;
    if (cl) {
      cl->waiting = 0;
      client_queue(c, cl, &r);
    } else {
      for (int i = 0; i < r.n_fds; i++) close(r.fds[i]);
      free(r.buf);
    }
  }
  uint64_t limit = (uint64_t)c->message_timeout_ms * 1000000ull;
  for (int i = 0; i < c->n_cl; i++) {
    struct cclient *cl = c->cl[i];
    if (cl->out && now > cl->out_t0 && now - cl->out_t0 > 6 * limit) {
      ms_logf(MS_LOG_INFO, "control: client pid %ld does not read its reply; closed", (long)cl->pid);
      atomic_fetch_add_explicit(&c->dropped, 1, memory_order_relaxed);
      client_close(c, i--);
      continue;
    }
    if (client_idle(cl) && c->idle_timeout_ns >= 0 && now > cl->last_t &&
        now - cl->last_t >= (uint64_t)c->idle_timeout_ns) {
      ms_logf(MS_LOG_INFO, "control: client pid %ld idle for %.1f s; closed", (long)cl->pid,
              (double)(now - cl->last_t) / 1e9);
      atomic_fetch_add_explicit(&c->idle_closed, 1, memory_order_relaxed);
      client_close(c, i--);
      continue;
    }
    if (!cl->msg_t0 || cl->out || now < cl->msg_t0 + limit) continue;
    struct creply r = {0};
    uint32_t got = cl->hdr_got < 4 ? cl->hdr_got : cl->body_got + 4;
    ms_control_reply_error(&r, -ETIMEDOUT, NULL,
                           "truncated message: %u of %s bytes arrived within %d ms; closing the connection", got,
                           cl->hdr_got < 4 ? "at least 4" : "the announced", c->message_timeout_ms);
    atomic_fetch_add_explicit(&c->dropped, 1, memory_order_relaxed);
    ms_logf(MS_LOG_INFO, "control: client pid %ld sent a truncated message; closed", (long)cl->pid);
    client_reset_frame(cl);
    cl->close_after = 1;
    client_queue(c, cl, &r);
  }
}

static int poll_timeout(struct ms_control *c, uint64_t now) {
  uint64_t next = now + 1000000000ull;  /* at least once a second */
  if (c->trace_on && c->trace_deadline < next) next = c->trace_deadline;
  if (c->accept_resume > now && c->accept_resume < next) next = c->accept_resume;
  uint64_t limit = (uint64_t)c->message_timeout_ms * 1000000ull;
  for (int i = 0; i < c->n_cl; i++) {
    if (c->cl[i]->msg_t0 && c->cl[i]->msg_t0 + limit < next) next = c->cl[i]->msg_t0 + limit;
    if (c->cl[i]->out && c->cl[i]->out_t0 + 6 * limit < next) next = c->cl[i]->out_t0 + 6 * limit;
    if (client_idle(c->cl[i]) && c->idle_timeout_ns >= 0 && c->cl[i]->last_t + (uint64_t)c->idle_timeout_ns < next)
      next = c->cl[i]->last_t + (uint64_t)c->idle_timeout_ns;
  }
  return next <= now ? 0 : (int)((next - now) / 1000000ull + 1);
}

static void *server_main(void *arg) {
  struct ms_control *c = arg;
  /* the wake-up, the listener, every client, and each client's verification job */
  struct pollfd *pf = calloc(2 * (size_t)c->max_clients + 2, sizeof *pf);
  struct cclient **polled = calloc((size_t)c->max_clients, sizeof *polled);
  if (!pf || !polled) {
    ms_logf(MS_LOG_ERROR, "control: out of memory; the server thread stops");
    goto out;
  }
  /* stop is set before the eventfd is written (seq_cst both sides): a wake-up
   * always finds it set */
  while (!atomic_load(&c->stop)) {
    int n = 0;
    pf[n++] = (struct pollfd){c->wake_fd, POLLIN, 0};
    pf[n++] = (struct pollfd){ms_now_ns() >= c->accept_resume ? c->lfd : -1, POLLIN, 0};
    for (int i = 0; i < c->n_cl; i++) {
      struct cclient *cl = c->cl[i];
      short ev = cl->out ? POLLOUT : cl->waiting ? 0 : POLLIN;
      polled[i] = cl;
      pf[n++] = (struct pollfd){cl->fd, ev, 0};
    }
    int n_polled = c->n_cl;
    for (int i = 0; i < n_polled; i++) {
      struct cclient *cl = polled[i];
      pf[n++] = (struct pollfd){cl->job ? ms_monitor_job_fd(cl->job) : -1, POLLIN, 0};
    }
    int pr = poll(pf, (nfds_t)n, poll_timeout(c, ms_now_ns()));
    if (pr < 0 && errno != EINTR) {
      ms_logf(MS_LOG_ERROR, "control: poll: %s", strerror(errno));
      break;
    }
    /* clients polled this round, by identity (none closed yet) */
    for (int k = 0; pr > 0 && k < n_polled; k++) {
      struct cclient *cl = polled[k];
      short rev = pf[2 + k].revents;
      if (cl->job && (pf[2 + n_polled + k].revents & POLLIN)) { /* its verification is done */
        struct creply r = {0};
        ms_control_load_finish(c, cl, &r);
        cl->waiting = 0;
        cl->last_t = ms_now_ns();
        client_queue(c, cl, &r);
        rev |= POLLOUT;
      }
      if (!rev) continue;
      int gone = 0;
      if (rev & POLLOUT) gone = client_flush(cl) < 0;
      if (!gone && (rev & (POLLIN | POLLHUP | POLLERR)) && !cl->out && !cl->waiting) gone = client_read(c, cl) < 0;
      if (!gone && cl->waiting && (rev & (POLLHUP | POLLERR))) gone = 1;
      if (!gone && cl->out) gone = client_flush(cl) < 0;
      if (gone) {
        for (int i = 0; i < c->n_cl; i++)
          if (c->cl[i] == cl) {
            client_close(c, i);
            break;
          }
      }
    }
    /* accepts come after: making room closes a client polled above */
    if (pr > 0 && (pf[1].revents & POLLIN)) accept_clients(c);
    uint64_t now = ms_now_ns();
    check_deadlines(c, now);
    if (now >= c->next_reap) {
      int freed = ms_engine_attach_reap(c->e);
      if (freed) ms_logf(MS_LOG_DEBUG, "control: freed %d closed generation(s) after their retention", freed);
      c->next_reap = now + 1000000000ull;
    }
    /* replies queued by deadlines go out now if the socket takes them */
    for (int i = 0; i < c->n_cl; i++)
      if (c->cl[i]->out && client_flush(c->cl[i]) < 0) client_close(c, i--);
  }
out:
  if (c->trace_on) ms_engine_trace_stop(c->e);
  c->trace_on = 0;
  while (c->n_cl) client_close(c, c->n_cl - 1);
  free(pf);
  free(polled);
  return NULL;
}

/* ---- the socket ---- */

/* Makes the socket's directory: created 0700 when missing; the default
 * directory must be ours and closed to others. */
static int make_dir(const char *path, int is_default, struct ms_textbuf *log) {
  char tmp[sizeof((struct sockaddr_un *)0)->sun_path];
  snprintf(tmp, sizeof tmp, "%s", path);
  const char *dir = dirname(tmp);
  struct stat st;
  if (stat(dir, &st)) {
    if (errno != ENOENT || mkdir(dir, 0700)) {
      int err = errno;
      ms_textbuf_printf(log, "control: cannot create directory %s: %s\n", dir, strerror(err));
      return -err;
    }
    if (stat(dir, &st)) return -errno;
  }
  if (!S_ISDIR(st.st_mode)) {
    ms_textbuf_printf(log, "control: %s is not a directory\n", dir);
    return -ENOTDIR;
  }
  if (is_default && (st.st_uid != geteuid() || (st.st_mode & 077))) {
    ms_textbuf_printf(log, "control: directory %s must belong to uid %u with mode 0700 (it has uid %u, mode %04o)\n",
                      dir, (unsigned)geteuid(), (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
    return -EPERM;
  }
  return 0;
}

/* Removes a stale socket at path; -EADDRINUSE when an engine answers there. */
static int clear_stale(const char *path, struct ms_textbuf *log) {
  struct stat st;
  if (lstat(path, &st)) return errno == ENOENT ? 0 : -errno;
  if (!S_ISSOCK(st.st_mode)) {
    ms_textbuf_printf(log, "control: %s exists and is not a socket\n", path);
    return -EEXIST;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int live = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  if (live) {
    ms_textbuf_printf(log, "control: another engine is serving on %s\n", path);
    return -EADDRINUSE;
  }
  if (unlink(path) && errno != ENOENT) return -errno;
  return 0;
}

static int open_socket(struct ms_control *c, unsigned mode, int is_default, struct ms_textbuf *log) {
  int rc = make_dir(c->path, is_default, log);
  if (rc) return rc;
  if ((rc = clear_stale(c->path, log))) return rc;
  c->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (c->lfd < 0) return -errno;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", c->path);
  /* the socket file is born without group/other access; chmod then sets the mode */
  mode_t old = umask(0177);
  rc = bind(c->lfd, (struct sockaddr *)&sa, sizeof sa) ? -errno : 0;
  umask(old);
  if (!rc && chmod(c->path, mode)) rc = -errno;
  if (!rc && listen(c->lfd, 64)) rc = -errno;
  if (rc) ms_textbuf_printf(log, "control: cannot listen on %s: %s\n", c->path, strerror(-rc));
  return rc;
}

struct ms_control *ms_control_new(struct ms_engine *e, const struct ms_control_opts *o, struct ms_textbuf *log) {
  struct ms_control_opts def = {.sz = sizeof def};
  if (!o) o = &def;
  if (!e || o->sz < sizeof *o) {
    errno = EINVAL;
    return NULL;
  }
  struct ms_control *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->e = e;
  c->lfd = c->wake_fd = -1;
  c->uid = geteuid();
  c->t_start = ms_now_ns();
  c->max_message = o->max_message ? o->max_message : MS_CONTROL_MAX_MESSAGE;
  c->max_clients = o->max_clients > 0 ? o->max_clients : 32;
  c->message_timeout_ms = o->message_timeout_ms > 0 ? o->message_timeout_ms : 10000;
  c->idle_timeout_ns = o->idle_timeout_ms < 0 ? -1 : (int64_t)(o->idle_timeout_ms ? o->idle_timeout_ms : 60000) * 1000000;
  snprintf(c->model, sizeof c->model, "%s", o->model_name ? o->model_name : "");
  int rc;
  if (o->path) {
    if (strlen(o->path) >= sizeof c->path || !o->path[0]) {
      ms_textbuf_printf(log, "control: socket path '%s' is empty or longer than %zu bytes\n", o->path,
                        sizeof c->path - 1);
      rc = -ENAMETOOLONG;
      goto fail;
    }
    snprintf(c->path, sizeof c->path, "%s", o->path);
  } else if ((rc = ms_control_default_path(c->path, sizeof c->path, (long)getpid()))) {
    ms_textbuf_printf(log, "control: the default socket path is too long\n");
    goto fail;
  }
  if (!(c->cl = calloc((size_t)c->max_clients, sizeof *c->cl))) {
    rc = -ENOMEM;
    goto fail;
  }
  if ((rc = open_socket(c, o->socket_mode ? o->socket_mode : 0600, !o->path, log))) {
    c->path[0] = '\0';  /* not ours: never unlink it */
    goto fail;
  }
  if ((c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
    rc = -errno;
    goto fail;
  }
  if ((rc = -pthread_create(&c->thread, NULL, server_main, c))) {
    ms_textbuf_printf(log, "control: cannot start the server thread: %s\n", strerror(-rc));
    goto fail;
  }
  c->started = 1;
  return c;
fail:
  ms_control_free(c);
  errno = -rc;
  return NULL;
}

void ms_control_free(struct ms_control *c) {
  if (!c) return;
  if (c->started) {
    atomic_store(&c->stop, 1);
    uint64_t one = 1;
    ssize_t k = write(c->wake_fd, &one, sizeof one);
    (void)k;
    pthread_join(c->thread, NULL);
  }
  if (c->lfd >= 0) {
    close(c->lfd);
    if (c->path[0]) unlink(c->path);
  }
  if (c->wake_fd >= 0) close(c->wake_fd);
  free(c->cl);
  free(c);
}

const char *ms_control_path(const struct ms_control *c) { return c->path; }

void ms_control_get_stats(const struct ms_control *c, struct ms_control_stats *out) {
  ms_control_stats_read(c, out);
}
