/* SPDX-License-Identifier: MIT */
/* The CLI's side of tensor parallelism across processes: the MPI transport
 * when mpirun started this process, and the launch check every rank passes
 * before it builds its engine, so that a mismatched launch is refused at the
 * start, by name, instead of exchanging wrong shares. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "megascope/engine.h"
#include "megascope/mpi.h"

/* What every rank must share, rank by rank. */
struct launch_id {
  char model[192];        /* --model's path, or the preset's name */
  uint64_t model_size;    /* bytes of the file (0 for a preset) */
  uint64_t model_hash;    /* the file's first 4 MiB (header, metadata, tensor table) and its size */
  uint64_t exe_size, exe_hash;  /* this executable */
  uint64_t args_hash;     /* the command line after the executable */
  int32_t tp, ranks;
};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Hash of the first `most` bytes of a file (all when 0), and its size. */
static int hash_file(const char *path, size_t most, uint64_t *size, uint64_t *hash) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    if (fd >= 0) close(fd);
    return -1;
  }
  size_t n = most && (size_t)st.st_size > most ? most : (size_t)st.st_size;
  void *p = n ? mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (n && p == MAP_FAILED) return -1;
  *size = (uint64_t)st.st_size;
  *hash = fnv(fnv(1469598103934665603ull, p, n), size, sizeof *size);
  if (n) munmap(p, n);
  return 0;
}

static void launch_id_of(struct launch_id *id, int tp, int ranks, const struct cli_model *cm, int argc, char **argv) {
  memset(id, 0, sizeof *id);
  snprintf(id->model, sizeof id->model, "%s", cm->path ? cm->path : cm->preset ? cm->preset : "?");
  if (cm->path) hash_file(cm->path, 4u << 20, &id->model_size, &id->model_hash);
  hash_file("/proc/self/exe", 0, &id->exe_size, &id->exe_hash);
  uint64_t h = 1469598103934665603ull;
  for (int i = 1; i < argc; i++) h = fnv(h, argv[i], strlen(argv[i]) + 1);
  id->args_hash = h;
  id->tp = tp;
  id->ranks = ranks;
}

/* The first difference of rank r from rank 0, printed; 0 when none. */
static int launch_differs(const char *me, const struct launch_id *all, int r) {
  const struct launch_id *a = &all[0], *b = &all[r];
  if (b->tp != a->tp) {
    fprintf(stderr, "megascope %s: refused: rank %d was started with --tp %d, rank 0 with --tp %d\n", me, r, b->tp,
            a->tp);
    return 1;
  }
  if (strcmp(a->model, b->model) || a->model_size != b->model_size || a->model_hash != b->model_hash) {
    fprintf(stderr,
            "megascope %s: refused: rank %d's model is not rank 0's: %s (%" PRIu64 " bytes, header hash %016" PRIx64
            ") against %s (%" PRIu64 " bytes, header hash %016" PRIx64 ")\n",
            me, r, b->model, b->model_size, b->model_hash, a->model, a->model_size, a->model_hash);
    return 1;
  }
  if (a->exe_size != b->exe_size || a->exe_hash != b->exe_hash) {
    fprintf(stderr,
            "megascope %s: refused: rank %d runs another megascope than rank 0 (executable of %" PRIu64
            " bytes, hash %016" PRIx64 ", against %" PRIu64 " bytes, hash %016" PRIx64 "): one version on every rank\n",
            me, r, b->exe_size, b->exe_hash, a->exe_size, a->exe_hash);
    return 1;
  }
  if (a->args_hash != b->args_hash) {
    fprintf(stderr, "megascope %s: refused: rank %d was started with other arguments than rank 0\n", me, r);
    return 1;
  }
  return 0;
}

struct ms_transport *cli_dist_start(const char *me, int tp, const struct cli_model *cm, int argc, char **argv,
                                    int *failed) {
  *failed = 0;
  if (!ms_transport_mpi_launched()) return NULL;
  char buf[1024] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_transport *t = ms_transport_mpi_new(&argc, &argv, &log);
  if (!t) {
    if (tp <= 1) return NULL;  /* one process after all: --tp asks for nothing across ranks */
    fprintf(stderr, "megascope %s: --tp %d under mpirun: %s", me, tp, buf);
    *failed = 1;
    return NULL;
  }
  if (t->size == 1 && tp <= 1) {
    ms_transport_mpi_free(t);
    return NULL;
  }
  struct launch_id mine, *all = calloc((size_t)t->size, sizeof *all);
  int bad = !all;
  if (all) {
    launch_id_of(&mine, tp, t->size, cm, argc, argv);
    struct ms_transport_wait w = {.peer = -1};
    int rc = t->exchange(t->ctx, &mine, all, sizeof mine, 60000, &w);
    if (rc) {  /* a rank that never answers would hold MPI_Finalize too: end every rank */
      fprintf(stderr, "megascope %s: rank %d: the launch check had no answer from rank %d: %s\n", me, t->rank, w.peer,
              ms_strerror(rc));
      fflush(stderr);
      t->abort(t->ctx, 2);
    }
    for (int r = 1; !bad && r < t->size; r++)
      if (t->rank == 0) bad = launch_differs(me, all, r);  /* rank 0 says it; the others see it below */
    if (!bad && all[0].tp != t->size) {  /* the same on every rank: rank 0 says it */
      if (t->rank == 0)
        fprintf(stderr,
                "megascope %s: refused: --tp %d across %d ranks: each rank is one device, so --tp must equal the "
                "number of ranks (mpirun -np %d)\n", me, all[0].tp, t->size, all[0].tp);
      bad = 1;
    }
    for (int r = 1; bad == 0 && r < t->size; r++) bad = memcmp(&all[r], &all[0], sizeof all[0]) != 0;
  }
  free(all);
  if (bad) {
    *failed = 1;
    ms_transport_mpi_free(t);
    return NULL;
  }
  if (t->rank != 0 && !freopen("/dev/null", "w", stdout)) {
    fprintf(stderr, "megascope %s: rank %d: /dev/null: %s\n", me, t->rank, strerror(errno));
  }
  return t;
}

void cli_dist_check_failed(const char *me, struct ms_transport *t, const struct ms_engine *e) {
  char report[1024];
  if (!t || !e || !ms_engine_comm_failed(e, report, sizeof report)) return;
  fprintf(stderr, "megascope %s: stopped: %s", me, report);
  fflush(stderr);
  t->abort(t->ctx, 3);
}

void cli_dist_end(struct ms_transport *t) { ms_transport_mpi_free(t); }

void cli_dist_pack(const struct ms_weight_rows *rows, int n, void *user) {
  const struct cli_dist_pack *p = user;
  if (p->m->packed) return;  /* an earlier engine on this model (bench decode's second) packed it */
  int rc = ms_model_repack_rows(p->m, rows, n);
  double mib = 1.0 / (1 << 20), whole = (double)ms_model_repack_bytes(p->m);
  if (!rc && !whole) return;  /* nothing packs here (f32, bf16 models): nothing to say */
  if (rc)
    fprintf(stderr, "megascope: rank %d: no memory to pack its rows: the weights as the file lays them out\n",
            p->rank);
  else
    fprintf(stderr, "megascope: rank %d: packed %.1f MiB (its rows of the split matrices; the whole model packs "
            "%.1f MiB)\n", p->rank, (double)p->m->packed_bytes * mib, whole * mib);
}

void cli_dist_pack_opts(struct ms_engine_opts *eo, struct cli_dist_pack *p, struct ms_model *m,
                        const struct ms_transport *t) {
  if (!t) return;
  *p = (struct cli_dist_pack){.m = m, .rank = t->rank};
  eo->weight_rows_hook = cli_dist_pack;
  eo->weight_rows_user = p;
}

int cli_dist_packed_bytes(struct ms_transport *t, const struct ms_model *m, uint64_t *all) {
  uint64_t mine = m->packed_bytes;
  struct ms_transport_wait w = {.peer = -1};
  return t->exchange(t->ctx, &mine, all, sizeof mine, 60000, &w);
}

int cli_dist_ranks(void) {
  const char *s = getenv("OMPI_COMM_WORLD_SIZE");
  if (!s) s = getenv("PMI_SIZE");
  int n = s ? atoi(s) : 1;
  return n > 1 ? n : 1;
}
