/* SPDX-License-Identifier: MIT */
/* The MPI transport (megascope/mpi.h, the table of megascope/transport.h): the ranks of one engine in
 * several processes, started by mpirun, on Open MPI or any MPI.
 *
 * DESIGN
 * Who calls what. The engine's worker threads call share from the bodies of
 * communication tasks, several at once; worker 0 calls exchange at each step
 * start (and bcast, the step header of a served engine, and gather, its
 * followers' answers to a control message) and the CLI exchange
 * once at the launch check. MPI is initialised with the
 * thread level MPI_THREAD_SERIALIZED at least, and every MPI call here holds
 * `mu`: the calls are all non-blocking (MPI_Isend, MPI_Irecv, MPI_Test), so a
 * thread never holds the lock while it waits, and a waiter
 * lets the others in between polls.
 *
 * Ordering. A share of device d's columns under tag c is one message from rank
 * d to each other rank a step; MPI keeps messages of one (source, tag,
 * communicator) in order, and rank d cannot send step k + 1's before it has
 * finished step k, which received every rank's share of step k, so step k's
 * receive always matches step k's send.
 *
 * Failure. A wait gives up after its timeout (-ETIMEDOUT): the caller names
 * the rank and the event, stops its engine and ends every rank with abort
 * (MPI_Abort). A rank that dies is reported by mpirun, which ends the others.
 * Shutdown: ms_transport_mpi_free calls MPI_Finalize. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megascope/mpi.h"

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int ms_transport_mpi_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") ||
         getenv("MPI_LOCALNRANKS");
}

#ifdef MS_HAVE_MPI
#include <mpi.h>

struct mpi_ctx {
  MPI_Comm comm;
  pthread_mutex_t mu;  /* every MPI call (see DESIGN) */
  int rank, size;
};

/* Polls the requests until all are complete or timeout_ms passed; on a
 * timeout, w->peer is peer[i] of the first request still pending. */
/* Spin, then yield, then sleep sleep_ns: a rank that waits long (the other
 * is slower, or the CPUs are shared) leaves them to the ranks with work. */
static void backoff(int spins, long sleep_ns) {
  if (spins < 200) {
    relax();
  } else if (spins < 2000) {
    sched_yield();
  } else {
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
  }
}

static int poll_all(struct mpi_ctx *c, int n, MPI_Request *req, const int *peer, int timeout_ms,
                    struct ms_transport_wait *w) {
  uint64_t t0 = 0;
  uint32_t polls = 0;
  for (int spins = 0;; spins++) {
    int done = 0;
    pthread_mutex_lock(&c->mu);
    int rc = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
    pthread_mutex_unlock(&c->mu);
    polls++;
    if (rc != MPI_SUCCESS) return -EIO;
    if (done) break;
    uint64_t now = ms_now_ns();
    if (!t0) t0 = now;
    if (timeout_ms > 0 && now - t0 > (uint64_t)timeout_ms * 1000000ull) {
      int missing = -1;
      pthread_mutex_lock(&c->mu);
      for (int i = 0; i < n && missing < 0; i++) {
        int flag = 1;
        if (req[i] != MPI_REQUEST_NULL) MPI_Request_get_status(req[i], &flag, MPI_STATUS_IGNORE);
        if (!flag) missing = peer ? peer[i] : -1;
      }
      pthread_mutex_unlock(&c->mu);
      if (w) *w = (struct ms_transport_wait){.waited_ns = now - t0, .polls = polls, .peer = missing};
      return -ETIMEDOUT;
    }
    backoff(spins, 20000);
  }
  if (w) *w = (struct ms_transport_wait){.waited_ns = t0 ? ms_now_ns() - t0 : 0, .polls = polls, .peer = -1};
  return 0;
}

static int mpi_share(void *ctx, int src, int tag, float *base, int rows, int cols, int stride, int timeout_ms,
                     struct ms_transport_wait *w) {
  struct mpi_ctx *c = ctx;
  MPI_Request req[64];
  MPI_Datatype ty;
  int n = 0, rc = MPI_SUCCESS, peer[64];
  if (src < 0 || src >= c->size || c->size > 64 || rows <= 0 || cols <= 0) return -EINVAL;
  pthread_mutex_lock(&c->mu);
  rc = MPI_Type_vector(rows, cols, stride, MPI_FLOAT, &ty);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&ty);
  if (rc == MPI_SUCCESS) {
    if (src == c->rank) {
      for (int p = 0; p < c->size && rc == MPI_SUCCESS; p++)
        if (p != c->rank) peer[n] = p, rc = MPI_Isend(base, 1, ty, p, tag, c->comm, &req[n++]);
    } else {
      peer[n] = src;
      rc = MPI_Irecv(base, 1, ty, src, tag, c->comm, &req[n++]);
    }
    MPI_Type_free(&ty);  /* the pending operations keep their own reference */
  }
  pthread_mutex_unlock(&c->mu);
  if (rc != MPI_SUCCESS) return -EIO;
  return poll_all(c, n, req, peer, timeout_ms, w);
}

/* An all-gather as point-to-point messages under a tag of its own (rather
 * than MPI_Iallgather), so that a rank that sends nothing is named. */
#define EXCHANGE_TAG 32000

static int mpi_exchange(void *ctx, const void *mine, void *all, size_t bytes, int timeout_ms,
                        struct ms_transport_wait *w) {
  struct mpi_ctx *c = ctx;
  MPI_Request req[128];
  int peer[128], n = 0, rc = MPI_SUCCESS;
  if (bytes > (1u << 30) || c->size > 64) return -EINVAL;
  memcpy((char *)all + (size_t)c->rank * bytes, mine, bytes);
  pthread_mutex_lock(&c->mu);
  for (int p = 0; p < c->size && rc == MPI_SUCCESS; p++) {
    if (p == c->rank) continue;
    peer[n] = p;
    rc = MPI_Irecv((char *)all + (size_t)p * bytes, (int)bytes, MPI_BYTE, p, EXCHANGE_TAG, c->comm, &req[n++]);
    if (rc != MPI_SUCCESS) break;
    peer[n] = p;
    rc = MPI_Isend(mine, (int)bytes, MPI_BYTE, p, EXCHANGE_TAG, c->comm, &req[n++]);
  }
  pthread_mutex_unlock(&c->mu);
  if (rc != MPI_SUCCESS) return -EIO;
  return poll_all(c, n, req, peer, timeout_ms, w);
}

/* Rank root's message to the others, point-to-point under a tag of its own:
 * a receiver probes for it (its length is not known beforehand), then
 * receives it. Only root sends under the tag, in order, and only one thread
 * of a rank receives it, so the message probed is the one received. A wait
 * for it may be long (rank 0 idle between requests sends a header a second):
 * after the spin and yield phases of poll_all it sleeps up to 1 ms between
 * probes. */
#define BCAST_TAG 32001

static int mpi_bcast(void *ctx, int root, void *buf, size_t bytes, size_t *got, int timeout_ms,
                     struct ms_transport_wait *w) {
  struct mpi_ctx *c = ctx;
  MPI_Request req[64];
  int peer[64], n = 0, rc = MPI_SUCCESS;
  if (root < 0 || root >= c->size || c->size > 64 || bytes > (1u << 30)) return -EINVAL;
  if (root == c->rank) {
    pthread_mutex_lock(&c->mu);
    for (int p = 0; p < c->size && rc == MPI_SUCCESS; p++)
      if (p != c->rank) peer[n] = p, rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, p, BCAST_TAG, c->comm, &req[n++]);
    pthread_mutex_unlock(&c->mu);
    if (rc != MPI_SUCCESS) return -EIO;
    return poll_all(c, n, req, peer, timeout_ms, w);
  }
  uint64_t t0 = ms_now_ns();
  uint32_t polls = 0;
  int flag = 0, count = 0;
  MPI_Status st;
  for (int spins = 0;; spins++) {
    pthread_mutex_lock(&c->mu);
    rc = MPI_Iprobe(root, BCAST_TAG, c->comm, &flag, &st);
    pthread_mutex_unlock(&c->mu);
    polls++;
    if (rc != MPI_SUCCESS) return -EIO;
    if (flag) break;
    uint64_t now = ms_now_ns();
    if (timeout_ms > 0 && now - t0 > (uint64_t)timeout_ms * 1000000ull) {
      if (w) *w = (struct ms_transport_wait){.waited_ns = now - t0, .polls = polls, .peer = root};
      return -ETIMEDOUT;
    }
    backoff(spins, now - t0 > 10000000ull ? 1000000 : 20000);
  }
  MPI_Get_count(&st, MPI_BYTE, &count);
  *got = (size_t)count;
  if ((size_t)count > bytes) return -EMSGSIZE;
  pthread_mutex_lock(&c->mu);
  peer[0] = root;
  rc = MPI_Irecv(buf, count, MPI_BYTE, root, BCAST_TAG, c->comm, &req[0]);
  pthread_mutex_unlock(&c->mu);
  if (rc != MPI_SUCCESS) return -EIO;
  rc = poll_all(c, 1, req, peer, timeout_ms, w);
  if (w) w->waited_ns = ms_now_ns() - t0, w->polls += polls;
  return rc;
}

/* The followers' answers to rank root, point-to-point under a tag of its
 * own: root probes each rank in turn for its message's length, then receives
 * it. One thread of root gathers at a time (worker 0), and a follower sends
 * one answer a control message, so the message probed is the one received. */
#define GATHER_TAG 32002

static int probe_len(struct mpi_ctx *c, int src, int timeout_ms, size_t *len, struct ms_transport_wait *w) {
  uint64_t t0 = ms_now_ns();
  MPI_Status st;
  int flag = 0, count = 0;
  for (int spins = 0;; spins++) {
    pthread_mutex_lock(&c->mu);
    int rc = MPI_Iprobe(src, GATHER_TAG, c->comm, &flag, &st);
    pthread_mutex_unlock(&c->mu);
    if (rc != MPI_SUCCESS) return -EIO;
    if (flag) break;
    uint64_t now = ms_now_ns();
    if (timeout_ms > 0 && now - t0 > (uint64_t)timeout_ms * 1000000ull) {
      if (w) *w = (struct ms_transport_wait){.waited_ns = now - t0, .peer = src};
      return -ETIMEDOUT;
    }
    backoff(spins, 20000);
  }
  MPI_Get_count(&st, MPI_BYTE, &count);
  *len = (size_t)count;
  return 0;
}

static int mpi_gather(void *ctx, int root, const void *buf, size_t bytes, void **out, size_t *len, int timeout_ms,
                      struct ms_transport_wait *w) {
  struct mpi_ctx *c = ctx;
  MPI_Request req;
  int rc = MPI_SUCCESS;
  if (root < 0 || root >= c->size || bytes > (1u << 30)) return -EINVAL;
  if (root != c->rank) {
    pthread_mutex_lock(&c->mu);
    rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, root, GATHER_TAG, c->comm, &req);
    pthread_mutex_unlock(&c->mu);
    return rc == MPI_SUCCESS ? poll_all(c, 1, &req, &root, timeout_ms, w) : -EIO;
  }
  for (int p = 0; p < c->size; p++) out[p] = NULL, len[p] = 0;
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    int err = probe_len(c, p, timeout_ms, &len[p], w);
    if (!err && !(out[p] = malloc(len[p] ? len[p] : 1))) err = -ENOMEM;
    if (err) return err;
    pthread_mutex_lock(&c->mu);
    rc = MPI_Irecv(out[p], (int)len[p], MPI_BYTE, p, GATHER_TAG, c->comm, &req);
    pthread_mutex_unlock(&c->mu);
    if (rc != MPI_SUCCESS) return -EIO;
    if ((err = poll_all(c, 1, &req, &p, timeout_ms, w))) return err;
  }
  return 0;
}

static void mpi_abort(void *ctx, int code) {
  struct mpi_ctx *c = ctx;
  MPI_Abort(c->comm, code);
  abort();  /* MPI_Abort does not return; should it, nothing may go on */
}

struct ms_transport *ms_transport_mpi_new(int *argc, char ***argv, struct ms_textbuf *log) {
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    ms_textbuf_printf(log, "mpi: MPI_Init_thread failed\n");
    errno = EIO;
    return NULL;
  }
  if (inited) MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    ms_textbuf_printf(log, "mpi: the MPI library gives thread level %d; the workers need MPI_THREAD_SERIALIZED\n",
                      provided);
    errno = ENOTSUP;
    return NULL;
  }
  struct ms_transport *t = calloc(1, sizeof *t);
  struct mpi_ctx *c = calloc(1, sizeof *c);
  if (!t || !c) {
    free(t);
    free(c);
    errno = ENOMEM;
    return NULL;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  pthread_mutex_init(&c->mu, NULL);
  *t = (struct ms_transport){.sz = sizeof *t, .name = "mpi", .rank = c->rank, .size = c->size, .ctx = c,
                             .share = mpi_share, .exchange = mpi_exchange, .abort = mpi_abort,
                             .bcast = mpi_bcast, .gather = mpi_gather};
  return t;
}

void ms_transport_mpi_free(struct ms_transport *t) {
  if (!t) return;
  struct mpi_ctx *c = t->ctx;
  MPI_Comm_free(&c->comm);
  pthread_mutex_destroy(&c->mu);
  free(c);
  free(t);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

#else /* built without MPI */

struct ms_transport *ms_transport_mpi_new(int *argc, char ***argv, struct ms_textbuf *log) {
  (void)argc;
  (void)argv;
  ms_textbuf_printf(log, "mpi: this megascope was built without MPI (install libopenmpi-dev and rebuild)\n");
  errno = ENOTSUP;
  return NULL;
}

void ms_transport_mpi_free(struct ms_transport *t) { (void)t; }

#endif
