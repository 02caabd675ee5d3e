/* SPDX-License-Identifier: MIT */
/* The tensor program of one decode step, tiled: operators become task classes,
 * tiles become proto-tasks that name the regions they read and write. The compiler
 * turns this into a plan; nothing here knows about events. */
#ifndef MS_GRAPH_GRAPH_H
#define MS_GRAPH_GRAPH_H

#include "megascope/base.h"
#include "megascope/graph_ir.h"
#include "megascope/model.h"

#define MS_MAX_READS 5
#define MS_MAX_WRITES 2

/* A box over a buffer: rows (batch), columns, planes (experts). Half-open. */
struct ms_region {
  int16_t buf;
  int32_t r0, r1, c0, c1, p0, p1;
};

struct ms_proto_task {
  uint16_t cls;
  int16_t tile[3];
  uint8_t n_reads, n_writes;
  struct ms_region reads[MS_MAX_READS];
  struct ms_region writes[MS_MAX_WRITES];
};

struct ms_graph {
  struct ms_task_class *classes;
  int n_classes, cap_classes;
  struct ms_buf_desc *bufs;
  int n_bufs, cap_bufs;
  struct ms_proto_task *tasks;  /* in operator order: a topological order */
  int n_tasks, cap_tasks;
  int meta_buf;
};

int ms_graph_build(const struct ms_model *m, int batch, int tile_bytes, int tile_rows, int tiles_per_op,
                   struct ms_graph *g,
                   struct ms_textbuf *log);
/* How GEMV operators are cut into tasks (each field as ms_compile_opts says). */
struct ms_graph_tiling {
  int tile_bytes, tile_rows, tiles_per_op;
  int min_tiles;  /* tasks an operator at least; 0: eight */
  int fuse_norm;  /* the norms before qkv, a dense gate_up and the LM head computed inside
                     their tasks (ms_task_class.norm) instead of as a task of their own;
                     one device only (not tp), and not a MoE FFN's */
  int attn_parts; /* attention a row and KV group in this many tasks (ms_compile_opts) */
};
/* The same for a plan of tp >= 2 tensor-parallel devices: an all-gather of
 * communication tasks (one per device) after every wo and down. With prefill,
 * the rows are token rows of chunked prefill: a request's chunk is a run of
 * consecutive rows at consecutive positions, so a row's attention reads the KV
 * cache the rope tasks of the rows before it write in the same step; each
 * attention task then reads (depends on) the KV of every row of its layer and
 * head. */
int ms_graph_build_tp(const struct ms_model *m, int batch, const struct ms_graph_tiling *t, int tp, int prefill,
                      struct ms_graph *g, struct ms_textbuf *log);
/* The same for devices that each hold only their share of every split output
 * (tensor parallelism across processes, tp_split in ms_compile_opts): an
 * all-gather after every column-tiled operator (qkv, wo, gate_up, down,
 * lm_head), each read by the next operator, so every device computes its tiles
 * alone and every other task on whole rows it has. Dense models only. */
int ms_graph_build_split(const struct ms_model *m, int batch, const struct ms_graph_tiling *t, int tp, int prefill,
                         struct ms_graph *g, struct ms_textbuf *log);
void ms_graph_free(struct ms_graph *g);

static inline int ms_region_overlap(const struct ms_region *a, const struct ms_region *b) {
  return a->buf == b->buf && a->r0 < b->r1 && b->r0 < a->r1 && a->c0 < b->c1 && b->c0 < a->c1 &&
         a->p0 < b->p1 && b->p0 < a->p1;
}

#endif
