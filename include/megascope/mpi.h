/* SPDX-License-Identifier: MIT */
/* The MPI transport (src/dist/mpi.c): the one implementation of the runtime's
 * transport table (megascope/transport.h), for tensor parallelism across
 * processes. dist's door; the CLI fills the engine's options with it. */
#ifndef MEGASCOPE_MPI_H
#define MEGASCOPE_MPI_H

#include "megascope/base.h"
#include "megascope/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The MPI transport of this process (MPI_Init_thread on the first call; the
 * process must have been started by mpirun, or runs as one rank). NULL + errno
 * (ENOTSUP: built without MPI) with the reason in log. */
struct ms_transport *ms_transport_mpi_new(int *argc, char ***argv, struct ms_textbuf *log);
/* MPI_Finalize; NULL does nothing. */
void ms_transport_mpi_free(struct ms_transport *t);
/* Whether this process was started by an MPI launcher (mpirun's environment),
 * read before any MPI call. */
int ms_transport_mpi_launched(void);

#ifdef __cplusplus
}
#endif
#endif
