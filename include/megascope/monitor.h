/* SPDX-License-Identifier: MIT */
/* Monitors: verified eBPF objects attached to a running engine's hooks.
 *
 * A monitor is one ELF object (clang -target bpf) whose programs each name a hook
 * in their section; all of its programs share its maps. Attaching instantiates
 * the maps in shared memory (memfd) and publishes the programs at their hooks
 * while the engine runs; replacing swaps in a new object atomically (every hook
 * firing is seen by exactly one generation); detaching waits until no worker is
 * still inside the old programs. Every attachment counts, per worker, the hook
 * firings it was eligible for, executed, throttled (budget or sampling) and lost
 * (ring buffer full or over budget): a result always carries its coverage.
 *
 * This header is the hook's: the monitor object and the records of an
 * attachment. Attaching one to an engine is the runtime's (megascope/attach.h). */
#ifndef MEGASCOPE_MONITOR_H
#define MEGASCOPE_MONITOR_H

#include <stdint.h>
#include <stdio.h>

#include "megascope/base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ms_monitor;

/* Loads an object and verifies every program against the hook its section
 * names. NULL + errno (EINVAL malformed, MS_E_VERIFY rejected) with the reason,
 * in the verifier log's shape, in log. */
struct ms_monitor *ms_monitor_open(const char *path, struct ms_textbuf *log);
struct ms_monitor *ms_monitor_open_mem(const void *buf, size_t size, const char *name,
                                       struct ms_textbuf *log);
void ms_monitor_free(struct ms_monitor *m);
const char *ms_monitor_name(const struct ms_monitor *m);
/* The digests of the schema its ids were compiled against, d[0] its task
 * classes', d[1] its event classes' (megascope/plan.h ms_plan_schema_digest; a
 * "megascope_schema" section of two little-endian u64, as a query's bundle
 * carries it); 0 where the object relies on none. */
void ms_monitor_schema_digest(const struct ms_monitor *m, uint64_t d[2]);
/* 0 when m relies on no schema or on the plan whose digests are `plan`
 * (ms_plan_schema_digest: m's digests unset or the plan's); else -EINVAL, and
 * log says which ids and how to compile it against that plan's schema. Every
 * engine checks it before attaching. The digests, not the plan: the hook's
 * monitors need no compiled plan (the query compiler links them alone). */
int ms_monitor_check_schema(const struct ms_monitor *m, const uint64_t plan[2], struct ms_textbuf *log);
int ms_monitor_prog_count(const struct ms_monitor *m);
/* Hook and program type of program i. */
int ms_monitor_prog_hook(const struct ms_monitor *m, int i, int *type);

struct ms_attach_opts {
  size_t sz;                /* sizeof(struct ms_attach_opts) */
  uint32_t max_per_step;    /* executions per step per worker; 0: no limit */
  uint32_t sample_every;    /* run 1 firing in N, chosen by a hash of the task generation; 0, 1: all */
  uint64_t ringbuf_bytes;   /* ring-buffer bytes per epoch; 0: no limit */
  uint32_t interpret;       /* 1: run with the reference interpreter; 0: the x86-64 JIT
                             * where this host has one (megascope/bpf_jit.h) */
};

struct ms_coverage {
  uint64_t eligible;        /* hook firings while attached */
  uint64_t executed;        /* programs run */
  uint64_t throttled;       /* skipped by the budget or the sampling */
  uint64_t lost;            /* ring-buffer records dropped (full or over budget) */
  uint64_t failed;          /* runs stopped by an error (counted in executed too) */
  uint32_t generation;      /* program generation: grows on replace */
  uint64_t first_step, last_step;  /* the epoch: steps seen */
  uint64_t t_start, t_end;         /* the epoch: engine clock; t_end 0 while open */
};

/* What attachments may hold, beside the retention's time: closed generations
 * kept, and the descriptors (one memfd a map) and map bytes of every
 * generation held, attached or closed. Over a bound, the oldest closed
 * generations are freed first (before their retention); an attach or replace
 * that would still exceed it is refused with -MS_E_LIMIT and a log line naming
 * the figures. Zero: no bound (the default). */
struct ms_attach_budget {
  size_t sz;                /* sizeof(struct ms_attach_budget) */
  int max_retained;         /* closed generations kept for read-outs */
  int max_fds;              /* descriptors of all generations' maps */
  uint64_t max_bytes;       /* bytes of all generations' maps */
};
struct ms_attach_usage {
  int attached;             /* attachments attached */
  int retained;             /* closed generations held (detached attachments' included) */
  int fds;                  /* descriptors their maps hold */
  uint64_t bytes;           /* bytes their maps hold */
  uint64_t freed_early;     /* closed generations freed before their retention, for room */
  uint64_t refused;         /* attaches and replaces refused by the budget */
};

struct ms_attach_info {
  int id;
  int attached;             /* 0 once detached */
  char name[64];            /* the object's name */
  uint32_t hooks;           /* bit per hook its programs attach to */
  struct ms_coverage cov;   /* of the current (or last) generation */
  struct ms_attach_opts opts;
  uint32_t n_progs;         /* programs of the current generation */
  uint32_t n_jitted;        /* of those, running as native code (the rest interpreted) */
  uint32_t first_generation; /* the oldest generation still held (older ones were freed) */
};
/* A coverage record as one JSON object inside a document being written: the
 * counts, the generation, the steps, and "seconds" of its epoch when t_start
 * is known. Every read-out (maps, list, queries) writes coverage this way. */
struct ms_json;
void ms_coverage_write_json(struct ms_json *j, const struct ms_coverage *c);

/* For backends that hold their own maps (the CUDA engine): writes a coverage
 * record and the maps decoded as ms_engine_attach_write (megascope/attach.h) does, with class names
 * from plan p. */
struct ms_bpf_map;
struct ms_plan;
int ms_monitor_write_maps(const char *name, struct ms_bpf_map *const *maps, int n, uint32_t n_workers,
                          const struct ms_coverage *cov, const struct ms_plan *p, FILE *f, int as_json);

/* The helpers monitors run with (Linux's standard ones and megascope's own),
 * for tools that verify or run a monitor's programs outside an engine. */
struct ms_bpf_helpers;
const struct ms_bpf_helpers *ms_monitor_helpers(void);

/* One program verified as a hook program, its type and hook read from its
 * section name (megascope/<type>/<hook>) and the context from the hook ABI's
 * tables (ms_hook_verify_ctx); a section that names none is rejected with the
 * reason and a stats line. abi_version: the object's declared version (0: none). */
struct ms_bpf_prog;
struct ms_verify_stats;
int ms_hook_verify_section(const struct ms_bpf_prog *prog, const struct ms_bpf_helpers *helpers,
                           uint32_t abi_version, int verbose, struct ms_textbuf *log, struct ms_verify_stats *st);

/* A monitor's parts, for such tools: its object, and its maps' definitions. */
struct ms_bpf_object;
const struct ms_bpf_object *ms_monitor_object(const struct ms_monitor *m);

#ifdef __cplusplus
}
#endif
#endif
