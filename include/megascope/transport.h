/* SPDX-License-Identifier: MIT */
/* A transport between the ranks of one engine spread over processes: tensor
 * parallelism across processes (docs/design.md, "Tensor parallelism across
 * processes"). The runtime calls it through this table alone, from the bodies
 * of the plan's communication tasks and from the step start (the layout
 * check; a served engine's step header, bcast; its control messages,
 * bcast and gather); the one
 * implementation, ms_transport_mpi_new (megascope/mpi.h), runs on MPI
 * (src/dist/mpi.c), built when the MPI development files are found. The
 * runtime's door: the table is what the runtime calls, and dist, above the
 * runtime, fills it.
 *
 * Every rank runs the same plan. A communication task of device d moves d's
 * share of a buffer's columns: on rank d it is sent to every other rank, on
 * every other rank it is received from d. Calls come from several worker
 * threads at once; each is non-blocking underneath (MPI_Isend and MPI_Irecv,
 * polled with MPI_Test) and gives up after timeout_ms with
 * -ETIMEDOUT, so a rank that died or hangs stops the others instead of
 * holding them forever. */
#ifndef MEGASCOPE_TRANSPORT_H
#define MEGASCOPE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a wait on another rank stands: filled by share and exchange, for the
 * caller's reports and hooks. */
struct ms_transport_wait {
  uint64_t waited_ns;  /* from the first poll that found the data missing to its arrival (0: there at once) */
  uint32_t polls;      /* MPI_Test calls */
  int peer;            /* after a failure: the rank whose part was missing (-1: unknown) */
};

struct ms_transport {
  size_t sz;           /* sizeof(struct ms_transport) */
  const char *name;    /* "mpi" */
  int rank, size;      /* this process among size ranks */
  void *ctx;
  /* Device src's share: rows x cols floats, `stride` floats from a row to the
   * next, at base. rank == src: sent to every other rank (its sends complete
   * before the call returns, so base may be written again); otherwise received
   * from src into base. tag tells one share of a step from another (the same
   * tag in the same order on every rank). 0, -ETIMEDOUT after timeout_ms, or
   * another negative errno; w (may be NULL) says how long it waited. */
  int (*share)(void *ctx, int src, int tag, float *base, int rows, int cols, int stride, int timeout_ms,
               struct ms_transport_wait *w);
  /* Every rank's `bytes` bytes of mine, in rank order, into all (size x bytes):
   * every rank calls it in the same order. 0, -ETIMEDOUT (w->peer: a rank that
   * sent nothing), or a negative errno. */
  int (*exchange)(void *ctx, const void *mine, void *all, size_t bytes, int timeout_ms,
                  struct ms_transport_wait *w);
  /* Ends every rank's process with code (MPI_Abort): after a failure this rank
   * reported, so that no rank waits for it forever. Does not return. */
  void (*abort)(void *ctx, int code);
  /* Rank root's message of any length to every other rank; one root's
   * messages arrive in the order sent. On root: bytes bytes of buf go to every
   * other rank (the sends complete before the call returns). Elsewhere: the
   * next message is received into buf, which holds bytes bytes, and *got is
   * its length; -EMSGSIZE when it does not fit (the message stays for the next
   * call, *got its length). 0, -ETIMEDOUT after timeout_ms (w->peer: the rank
   * missing), or a negative errno. The step header of a served engine
   * (docs/design.md, "Serving across ranks"). Appended: a caller checks sz. */
  int (*bcast)(void *ctx, int root, void *buf, size_t bytes, size_t *got, int timeout_ms,
               struct ms_transport_wait *w);
  /* Every other rank's message of any length to rank root (a follower's
   * answer to rank 0's control message: its monitor's verdict, its maps).
   * Off root: bytes bytes of buf go to root (the send completes before the
   * call returns). On root: each other rank p's message is received into a
   * buffer malloc'd for it, out[p] (size entries; out[root] is NULL), of
   * len[p] bytes; the caller frees them (also after a failure). 0,
   * -ETIMEDOUT (w->peer: a rank that sent nothing), or a negative errno.
   * Appended: a caller checks sz. */
  int (*gather)(void *ctx, int root, const void *buf, size_t bytes, void **out, size_t *len, int timeout_ms,
                struct ms_transport_wait *w);
};

#ifdef __cplusplus
}
#endif
#endif
