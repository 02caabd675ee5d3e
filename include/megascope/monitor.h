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
 * (ring buffer full or over budget): a result always carries its coverage. */
#ifndef MEGASCOPE_MONITOR_H
#define MEGASCOPE_MONITOR_H

#include <stdint.h>
#include <stdio.h>

#include "megascope/base.h"
#include "megascope/engine.h"

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

/* Attaches `m` (the engine takes it over on success). Returns the attachment id
 * (> 0) or a negative error. */
int ms_engine_attach(struct ms_engine *e, struct ms_monitor *m, const struct ms_attach_opts *o,
                     struct ms_textbuf *log);
/* Replaces the programs and maps of attachment `id` by `m` (taken over on success). */
int ms_engine_replace(struct ms_engine *e, int id, struct ms_monitor *m, struct ms_textbuf *log);
/* The same with a new budget for the new generation (o NULL: keep the current one). */
int ms_engine_replace_opts(struct ms_engine *e, int id, struct ms_monitor *m, const struct ms_attach_opts *o,
                           struct ms_textbuf *log);
/* Detaches; the attachment's final maps and coverage stay readable until the
 * retention has passed and ms_engine_attach_reap runs, or until
 * ms_engine_attach_release (or the engine is freed). -ENOENT for an unknown or
 * already detached id. */
int ms_engine_detach(struct ms_engine *e, int id);

/* Closed generations (a detached attachment, a replaced generation) stay
 * readable for the retention (default 60 s; 0: until the next reap), then
 * ms_engine_attach_reap frees their programs, maps and memfds. Nothing is freed
 * without a reap: a process that operates the engine calls it now and then (the
 * control server does, at least once a second). Returns the generations freed. */
void ms_engine_set_detached_retention(struct ms_engine *e, uint64_t ns);
int ms_engine_attach_reap(struct ms_engine *e);

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
int ms_engine_set_attach_budget(struct ms_engine *e, const struct ms_attach_budget *b);
struct ms_attach_usage {
  int attached;             /* attachments attached */
  int retained;             /* closed generations held (detached attachments' included) */
  int fds;                  /* descriptors their maps hold */
  uint64_t bytes;           /* bytes their maps hold */
  uint64_t freed_early;     /* closed generations freed before their retention, for room */
  uint64_t refused;         /* attaches and replaces refused by the budget */
};
void ms_engine_attach_usage(struct ms_engine *e, struct ms_attach_usage *out);
/* Frees detached attachment id at once (its last read-out is done). -ENOENT when
 * unknown (or freed already), -MS_E_STATE while attached. */
int ms_engine_attach_release(struct ms_engine *e, int id);

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
/* Copies up to max attachments (attached, and detached ones not yet freed), in
 * id order; returns the count copied. Ids are never reused and not capped. */
int ms_engine_attach_list(struct ms_engine *e, struct ms_attach_info *out, int max);
/* Attachments held now (for sizing the array ms_engine_attach_list fills). */
int ms_engine_attach_count(struct ms_engine *e);
/* Every attachment held, in one snapshot: a malloc'd array of *n (free it);
 * NULL + errno ENOMEM. */
struct ms_attach_info *ms_engine_attach_list_all(struct ms_engine *e, int *n);
/* Coverage of one generation of attachment id (generation 0: the current). */
int ms_engine_attach_coverage(struct ms_engine *e, int id, uint32_t generation, struct ms_coverage *out);
/* A coverage record as one JSON object inside a document being written: the
 * counts, the generation, the steps, and "seconds" of its epoch when t_start
 * is known. Every read-out (maps, list, queries) writes coverage this way. */
struct ms_json;
void ms_coverage_write_json(struct ms_json *j, const struct ms_coverage *c);
/* The maps of attachment id's current generation, in its object's map order
 * (up to max; returns the count, or -ENOENT). They stay valid while the
 * attachment's maps are kept (see ms_engine_detach). */
struct ms_bpf_map;
int ms_engine_attach_maps(struct ms_engine *e, int id, struct ms_bpf_map **out, int max);
/* Brings attachment id's maps up to date where the engine's programs run
 * away from them (the CUDA backend: the device's copies into these maps; it
 * also does so every 100 ms on its own); 0 at once elsewhere. Every read-out
 * here calls it; a reader of the maps' memfds calls it before reading. */
int ms_engine_attach_sync(struct ms_engine *e, int id);
/* The same with the generation's own monitor name (name_size bytes, NUL-terminated). */
int ms_engine_attach_generation(struct ms_engine *e, int id, uint32_t generation, char *name, size_t name_size,
                                struct ms_coverage *out);

/* Writes attachment id: coverage of every generation and every map of the
 * current one, decoded (histograms as histograms, with task- and event-class
 * names from the engine's plans), as JSON (pretty or not) or as text. */
int ms_engine_attach_write(struct ms_engine *e, int id, FILE *f, int as_json);
/* The same, as one JSON value inside a document being written. */
struct ms_json;
int ms_engine_attach_write_json(struct ms_engine *e, int id, struct ms_json *j);

/* For backends that hold their own maps (the CUDA engine): writes a coverage
 * record and the maps decoded as ms_engine_attach_write does, with class names
 * from plan p. */
struct ms_bpf_map;
struct ms_plan;
int ms_monitor_write_maps(const char *name, struct ms_bpf_map *const *maps, int n, uint32_t n_workers,
                          const struct ms_coverage *cov, const struct ms_plan *p, FILE *f, int as_json);

/* Hook sites: hooks_off turns the hook checks off entirely (the baseline of
 * `bench hooks`); otherwise a site with nothing attached costs one relaxed load
 * and a branch. Set before requests are submitted. */
void ms_engine_set_hooks_enabled(struct ms_engine *e, int on);

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
