/* SPDX-License-Identifier: MIT */
/* Queries: one-line questions to a running engine, compiled to verified eBPF
 * monitors in the process, without clang (docs/query.md is the reference).
 *
 *     task_end /op == attn && req_gen == 1842/ { @us[tile_z] = hist((t_end - t_begin) / 1000) }
 *
 * The language has bpftrace's shape: probes (a hook, or several separated by
 * commas), an optional predicate between slashes, and a block of aggregations
 * into maps named with '@'. Names are resolved through the engine's schema
 * (task classes, event classes, ops) and the hook ABI's enums (phases, wait
 * reasons, launch modes), so nobody types an id; a field the hook does not
 * define is refused at compile time, naming the field and the hook.
 *
 * The compiler emits one program per probe and hook, over per-worker maps (one
 * per @name), as a program bundle (megascope/bpf.h) that ms_monitor_open_mem
 * and the control socket's attach take as they take a clang object: the same
 * verifier, the same JIT, the same coverage. Reading back is the caller's
 * business (map readers over the socket's memfds, or the engine's own maps);
 * ms_query_write decodes what it reads: values merged over workers, keys named
 * through the schema, histograms and quantiles as such. */
#ifndef MEGASCOPE_QUERY_H
#define MEGASCOPE_QUERY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megascope/base.h"
#include "megascope/bpf.h"
#include "megascope/monitor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- names --------------------------------------------------------------- */

/* The names a query resolves: the task schema's JSON (ms_plan_write_schema, the
 * control socket's "schema" reply). NULL + errno with the reason in log. */
struct ms_query_schema;
struct ms_query_schema *ms_query_schema_parse(const char *json, size_t len, struct ms_textbuf *log);
void ms_query_schema_free(struct ms_query_schema *s);
/* The same names from a compiled plan (an engine's ms_engine_plan). */
struct ms_plan;
struct ms_query_schema *ms_query_schema_of_plan(const struct ms_plan *p, struct ms_textbuf *log);
/* The schema's digests (ms_plan_schema_digest, megascope/plan.h: d[0] its task
 * classes, d[1] its event classes). A bundle from ms_query_bundle carries the
 * first, and the second where a program reads event_class; an engine whose
 * plan's differ refuses it. */
void ms_query_schema_digest(const struct ms_query_schema *s, uint64_t d[2]);
/* 0 when a and b name every task class and event class by the same id alike
 * (a query compiled with one means the same with the other); else -1, and
 * log says the first id they name differently, calling them by their labels. */
int ms_query_schema_same(const struct ms_query_schema *a, const char *label_a, const struct ms_query_schema *b,
                         const char *label_b, struct ms_textbuf *log);

/* ---- compiling ------------------------------------------------------------ */

struct ms_query_opts {
  size_t sz;            /* sizeof(struct ms_query_opts) */
  uint32_t max_keys;    /* keys per map; 0: by aggregation (4096, histograms 1024, quantiles 256) */
  uint32_t ring_bytes;  /* record() ring buffers: bytes (a power of two >= 4096); 0: 256 KiB */
};

struct ms_query;
/* Compiles src against schema s. NULL + errno (EINVAL) with "column N: ..."
 * lines in log for syntax, name and type errors. */
struct ms_query *ms_query_compile(const char *src, const struct ms_query_schema *s, const struct ms_query_opts *o,
                                  struct ms_textbuf *log);
void ms_query_free(struct ms_query *q);
const char *ms_query_source(const struct ms_query *q);

/* The monitor: a program bundle (free *out). */
int ms_query_bundle(const struct ms_query *q, void **out, size_t *len);

/* Its parts, for dumps and size figures. */
size_t ms_query_prog_count(const struct ms_query *q);
const struct ms_bpf_insn *ms_query_prog(const struct ms_query *q, size_t i, size_t *n, const char **section);
size_t ms_query_map_count(const struct ms_query *q);
const struct ms_bpf_map_def *ms_query_map(const struct ms_query *q, size_t i);

/* ---- escalation ------------------------------------------------------------- */

/* A query's trigger, `when @map > 2ms capture 200: <capture part>`: when the
 * largest entry of @map crosses the threshold, the capture part is compiled
 * with $top (and $top2) bound to that entry's keys and attached beside the
 * summary, to write at most `capture` records. */
struct ms_query_trigger {
  int has;
  char map[48];
  const char *op;       /* ">", ">=", "<", "<=", "==", "!=" */
  uint64_t threshold;
  uint32_t capture;     /* 0: no bound but the query's end */
  const char *capture_src;
};
void ms_query_get_trigger(const struct ms_query *q, struct ms_query_trigger *out);

struct ms_query_maps;
/* Checks the trigger against the maps read now: 1 when it fires (the worst
 * entry's value in *value, its keys as the capture part reads them in top[0],
 * top[1]: a quoted name or a number), 0 when not, < 0 on a read error. */
int ms_query_trigger_check(const struct ms_query *q, const struct ms_query_maps *maps, uint64_t *value,
                           char top[2][128]);
/* Bytes one record() record takes in a ring buffer, its header included
 * (the largest, when there are several); 0 without record(). */
uint32_t ms_query_record_bytes(const struct ms_query *q);
/* The most any record() record takes: twelve values and the header. */
#define MS_QUERY_RECORD_MAX_BYTES (12 * 8 + 8)
/* The capture part compiled with $top bound (NULL + errno, columns in log
 * counted in the whole query's text). */
struct ms_query *ms_query_compile_capture(const struct ms_query *q, const char top[2][128], const struct ms_query_opts *o,
                                          struct ms_textbuf *log);

/* ---- reading ---------------------------------------------------------------- */

/* How the writer reads map i of the query (in ms_query_map order): its entries
 * as ms_bpf_map_foreach gives them (values of every worker, worker-major) and
 * how many workers it has. ms_bpf_map and ms_bpf_map_reader both fit. */
struct ms_query_maps {
  int (*foreach)(void *user, size_t map, ms_bpf_map_entry_fn fn, void *fn_user);
  uint32_t (*n_workers)(void *user, size_t map);
  /* a ring buffer's records, oldest first (readers leave them in place) */
  int (*ring)(void *user, size_t map, ms_bpf_ringbuf_fn fn, void *fn_user);
  void *user;
};

struct ms_query_print {
  size_t sz;            /* sizeof(struct ms_query_print) */
  uint32_t top;         /* keys printed per map, largest first; 0: all */
  int as_json;          /* one JSON object per call (one line unless pretty) */
  int pretty;
  int final;            /* the last read-out (JSON "final") */
  double elapsed_s;     /* since the attach, printed with the results */
  int id;               /* the attachment, printed */
  const char *part;     /* "summary", "capture", "danger": which attachment of a query; NULL: none */
  const struct ms_query_snapshot *since; /* print what changed since this read-out; NULL: all */
  const struct ms_coverage *since_cov;   /* and the coverage since then (with since) */
  struct ms_query_snapshot **take;       /* set: *take receives the maps as this read-out read
                                          * them (before any subtraction), the next one's since */
  /* replicas (ms_query_maps_of_union): each engine's part, written beside the
   * total (the coverage given to the writer is then the total) */
  const struct ms_query_replica *replicas;
  size_t n_replicas;
  /* an engine across ranks (megascope/attach.h): each rank's coverage, rank
   * i at [i], written beside the total, which is theirs together */
  const struct ms_coverage *ranks;
  size_t n_ranks;
};

/* One engine of a question asked of several (what the writer says of it). */
enum ms_query_replica_state {
  MS_QUERY_REPLICA_ANSWERING = 0,
  MS_QUERY_REPLICA_GONE = 1,        /* stopped answering in the window: its maps as it left them */
  MS_QUERY_REPLICA_UNREACHABLE = 2, /* never attached */
  MS_QUERY_REPLICA_STATE_COUNT
};
struct ms_query_replica {
  const char *name;         /* its control socket */
  enum ms_query_replica_state state; /* written "answering", "gone", "unreachable" */
  const char *why;          /* what failed, or NULL */
  int id;                   /* its attachment; 0: none */
  int in_total;             /* its maps and coverage are in the total */
  int has_cov;              /* cov was read (as last read, when gone) */
  struct ms_coverage cov;
};

/* Every map's merged values at one read-out (ms_query_print.take), for
 * printing intervals: a read-out with `since` set shows each entry's change (counts, sums, means,
 * histograms and sketches subtract; min and max cannot, and print their value
 * since the attach), entries that did not change left out. */
struct ms_query_snapshot;
void ms_query_snapshot_free(struct ms_query_snapshot *s);

/* Writes the query's maps, decoded, with the coverage cov. */
int ms_query_write(const struct ms_query *q, const struct ms_query_maps *maps, const struct ms_coverage *cov,
                   const struct ms_query_print *po, FILE *f);

/* The same as one JSON value inside a document being written. */
struct ms_json;
int ms_query_write_json(const struct ms_query *q, const struct ms_query_maps *maps, const struct ms_coverage *cov,
                        const struct ms_query_print *po, struct ms_json *j);

/* Map sources over in-process maps (maps[i] for map i) and over readers. */
int ms_query_maps_of_engine(struct ms_query_maps *out, struct ms_bpf_map **maps);
int ms_query_maps_of_readers(struct ms_query_maps *out, struct ms_bpf_map_reader **readers);

/* ---- replicas --------------------------------------------------------------- */

/* One question to several engines (replicas of one service, serving the same
 * plan, so the same schema): their maps of one compiled query as one source
 * for ms_query_write. Each engine's workers become workers of the merged maps,
 * engine after engine, so the read-out merges engines exactly as it merges one
 * engine's workers: counts, sums, the sums and counts of averages, the buckets
 * of histograms and quantile sketches add (quantiles keep their sketch's
 * bound), min and max take the extreme of the engines that saw a value. Ring
 * buffers' records come engine after engine. A source with no foreach is left
 * out. u (and the sources it points to) must outlive out. */
struct ms_query_union {
  const struct ms_query *q;
  const struct ms_query_maps *srcs;  /* [n]: engine i's maps */
  size_t n;
};
int ms_query_maps_of_union(struct ms_query_maps *out, const struct ms_query_union *u);
/* Adds c into a total of several engines' coverage: counts add, the
 * generation is the highest; steps are each engine's own and stay 0. */
void ms_query_coverage_add(struct ms_coverage *total, const struct ms_coverage *c);

/* The reference tables (hooks and their fields, the names fields compare
 * with) as Markdown: `megascope query --list`, and docs/query.md holds them. */
int ms_query_write_reference(FILE *f);

/* Durations as queries and their CLIs spell them: "250ms", "2s", "20us",
 * "100ns", "1m"; a bare number is seconds for CLIs. ns in *out; -EINVAL. */
int ms_query_parse_duration(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
