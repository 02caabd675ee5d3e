/* SPDX-License-Identifier: MIT */
/* Private to src/query: the schema's names, the syntax tree, the compiled
 * query and what the code generator and the writer share about each map. */
#ifndef MS_QUERY_IMPL_H
#define MS_QUERY_IMPL_H

#include <stdint.h>

#include "megascope/hook.h"
#include "megascope/query.h"

/* ---- schema ---- */
struct q_class {
  char *name, *op, *kernel;
  uint32_t id, kernel_id;
};
struct ms_query_schema {
  struct q_class *classes;
  size_t n_classes;
  char **evclasses; /* by id; NULL where the schema has none */
  size_t n_evclasses;
};

/* ---- syntax ---- */
enum q_node_kind {
  Q_NUM,      /* u: the value */
  Q_FIELD,    /* field: enum ms_hook_field */
  Q_NAME,     /* text: an identifier that is not a field, or a string: resolved by its comparison */
  Q_UNARY,    /* op: '!', '-', '~'; a */
  Q_BINARY,   /* op: Q_OP_*; a, b */
  Q_MATCH,    /* a =~ text (negate: !~) */
};
enum q_op {
  Q_OP_ADD = 1, Q_OP_SUB, Q_OP_MUL, Q_OP_DIV, Q_OP_MOD, Q_OP_AND, Q_OP_OR, Q_OP_XOR, Q_OP_SHL, Q_OP_SHR,
  Q_OP_EQ, Q_OP_NE, Q_OP_LT, Q_OP_LE, Q_OP_GT, Q_OP_GE, Q_OP_LAND, Q_OP_LOR,
};
struct q_node {
  enum q_node_kind kind;
  int col;            /* 1-based column of its first character */
  int op, negate;
  int field;          /* Q_FIELD */
  uint64_t u;         /* Q_NUM */
  char *text;         /* Q_NAME, Q_MATCH */
  struct q_node *a, *b;
  int height;         /* 1 + the higher of a's and b's (a leaf: 1); at most Q_MAX_DEPTH */
};

enum q_agg {
  Q_AGG_COUNT, Q_AGG_SUM, Q_AGG_MIN, Q_AGG_MAX, Q_AGG_AVG, Q_AGG_HIST, Q_AGG_LHIST, Q_AGG_QUANTILE,
  Q_AGG_RECORD, /* raw records into a ring buffer */
  Q_AGG_COUNT_KINDS
};

#define Q_MAX_KEYS 4
#define Q_MAX_QUANTILES 8
#define Q_MAX_MAPS 16
#define Q_MAX_PROBES 16
#define Q_MAX_STMTS 16
#define Q_MAX_FIELDS 12 /* values in one record() */
#define Q_MAX_DEPTH 256 /* how deep an expression nests (parse.c: too_deep) */

/* How a map's keys print: a field whose values have names, or a number. */
enum q_key_kind { Q_KEY_NUM, Q_KEY_SIGNED, Q_KEY_CLASS, Q_KEY_EVCLASS, Q_KEY_OP, Q_KEY_HOOK, Q_KEY_ENUM };

struct q_map {
  char name[48];        /* "@us", "@" */
  enum q_agg agg;
  int n_keys;
  enum q_key_kind key_kind[Q_MAX_KEYS];
  int key_field[Q_MAX_KEYS]; /* the field a key reads, for enum names; -1 */
  char key_text[Q_MAX_KEYS][64];
  char arg_text[128];   /* the aggregated expression, as written */
  int arg_signed;
  int64_t lo, hi, step; /* lhist */
  int n_q;
  double q[Q_MAX_QUANTILES];
  uint32_t value_size, max_entries;
  int n_fields;         /* record(): its values, and what each was, as written */
  char field_text[Q_MAX_FIELDS][48];
  int col;              /* of its first use */
  int hook;             /* the hook of its first use (phase names), -1 before */
  uint32_t array_size;  /* one key whose values the schema bounds: a per-worker array of this
                         * many entries, indexed by the key; 0: a per-worker hash */
};

struct q_stmt {
  int map;              /* index in query->maps */
  struct q_node *keys[Q_MAX_KEYS];
  int n_keys;
  struct q_node *arg;   /* NULL for count() */
  struct q_node *fields[Q_MAX_FIELDS]; /* record() */
  int n_fields;
  int col;
};

/* when @map OP value [capture N]: <the capture part> */
struct q_trigger {
  int has;
  char map[48];
  int op;               /* Q_OP_GT, _GE, _LT, _LE, _EQ, _NE */
  uint64_t threshold;
  uint32_t capture;     /* records the capture part may write; 0: until the query ends */
  size_t capture_at;    /* byte offset of the capture part in src */
};

struct q_probe {
  int hooks[MS_HOOK_COUNT];
  int hook_col[MS_HOOK_COUNT];
  int n_hooks;
  struct q_node *pred;
  struct q_stmt stmts[Q_MAX_STMTS];
  int n_stmts;
};

struct q_prog {
  char name[64], section[64];
  struct ms_bpf_insn *insns;
  size_t n;
};

struct ms_query {
  char *src;
  const struct ms_query_schema *schema; /* during compilation only */
  struct q_probe probes[Q_MAX_PROBES];
  int n_probes;
  struct q_map maps[Q_MAX_MAPS];
  int n_maps;
  /* compiled: maps[0..n_maps) then the zero value and the drop counter */
  struct ms_bpf_map_def defs[Q_MAX_MAPS + 2];
  int n_defs;
  struct q_prog progs[Q_MAX_PROBES * MS_HOOK_COUNT];
  int n_progs;
  int uses_evclass;     /* a program reads event_class: its ids are the schema's (ms_query_bundle) */
  uint32_t max_keys;    /* ms_query_opts.max_keys */
  uint32_t ring_bytes;  /* ms_query_opts.ring_bytes */
  struct q_trigger trigger;
  const char *binds[2]; /* $top, $top2: names or numbers bound while compiling a capture part */
  int bind_is_num[2];
  char bind_text[2][128]; /* what binds point to: the values without their quotes */
  size_t src_offset;    /* columns count from here (a capture part) */
  /* names the writer needs, copied from the schema */
  struct ms_query_schema *names;
};

/* The schema-dependent name tables, copied for the query's life. */
struct ms_query_schema *ms_query_schema_copy(const struct ms_query_schema *s);

int ms_query_parse(struct ms_query *q, struct ms_textbuf *log);
void ms_query_node_free(struct q_node *n);
int ms_query_codegen(struct ms_query *q, struct ms_textbuf *log);

/* The quantile sketch: values below 16 exact, above that 16 buckets per power
 * of two (the top four bits after the leading one), so a bucket's midpoint is
 * within 1/32 of any value in it. */
#define Q_SKETCH_SUB 16
#define Q_SKETCH_BUCKETS (16 + 60 * Q_SKETCH_SUB)
#define Q_HIST_BUCKETS 65 /* [0], then [2^(k-1), 2^k) for k = 1..64 */
#define Q_LHIST_MAX 1000  /* buckets between lo and hi */

/* A field's display name ("class" for task_class) and its parse. */
int ms_query_field_parse(const char *name);
const char *ms_query_field_name(int field);
int ms_query_field_signed(int field);
/* The name of value v of an enum field (phase, wait_reason, launch_mode,
 * queue_kind, comm_phase, hook) as hook spells it, or NULL. */
const char *ms_query_enum_name(int field, int hook, uint64_t v);

#endif
