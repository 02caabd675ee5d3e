/* SPDX-License-Identifier: MIT */
/* Builds the tiled tensor program of one decode step for a batch bucket.
 *
 * Every activation is a fresh buffer per layer (x.3, xn.3, qkv.3, ...), so within
 * a step each element is written once and the only hazards are read-after-write:
 * that is what lets the compiler derive all dependencies from region overlaps.
 * Hazards across steps are excluded by the step boundary (the next step starts
 * only when every task of this one has finished). */
#include "graph/graph.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kernel_names[MS_K_COUNT] = {
    [MS_K_STEP_START] = "step_start", [MS_K_EMBED] = "embed",
    [MS_K_RMSNORM] = "rmsnorm",       [MS_K_QKV] = "gemv_qkv",
    [MS_K_ROPE] = "rope_kv",          [MS_K_ATTN] = "paged_attention",
    [MS_K_WO] = "gemv_residual",      [MS_K_SWIGLU] = "gemv_swiglu",
    [MS_K_DOWN] = "gemv_residual",    [MS_K_ROUTER] = "moe_router",
    [MS_K_EXPERT_UP] = "moe_expert_swiglu", [MS_K_EXPERT_DOWN] = "moe_expert_down",
    [MS_K_MOE_COMBINE] = "moe_combine", [MS_K_LM_HEAD] = "gemv",
    [MS_K_SAMPLE] = "sample",         [MS_K_EMPTY] = "empty",
    [MS_K_COMM] = "comm_allgather",
};

const char *ms_kernel_name(int k) { return k >= 0 && k < MS_K_COUNT ? kernel_names[k] : "?"; }

static int grow(void **p, int *cap, int need, size_t elt) {
  if (need <= *cap) return 0;
  int n = *cap ? *cap * 2 : 64;
  while (n < need) n *= 2;
  void *q = realloc(*p, (size_t)n * elt);
  if (!q) return -ENOMEM;
  memset((char *)q + (size_t)*cap * elt, 0, (size_t)(n - *cap) * elt);
  *p = q;
  *cap = n;
  return 0;
}

struct builder {
  struct ms_graph *g;
  const struct ms_model *m;
  int B;           /* rows of the bucket */
  int tile_bytes;
  int tile_rows;
  int tiles_per_op;
  int min_tiles;  /* GEMV tasks an operator at least */
  int multiple;   /* GEMV tasks an operator a multiple of this where the size cuts more (1: any count) */
  int tp;           /* tensor-parallel devices, 0 or 1: none */
  int prefill;      /* token rows: attention reads every row's KV (ms_graph_build_tp) */
  int pending_comm; /* a communication buffer the next operator must also read, -1: none */
  int split;        /* each device holds only its share: every column-tiled output is gathered */
  int fuse_norm;    /* pre-norms computed inside their consumers' tasks (ms_graph_tiling) */
  int attn_parts;   /* attention a row and KV group in this many tasks (ms_graph_tiling) */
  int err;
};

static int add_buf(struct builder *b, const char *name, int layer, int cols, int planes, int logical) {
  struct ms_graph *g = b->g;
  if (grow((void **)&g->bufs, &g->cap_bufs, g->n_bufs + 1, sizeof *g->bufs)) {
    b->err = -ENOMEM;
    return 0;
  }
  struct ms_buf_desc *d = &g->bufs[g->n_bufs];
  if (layer >= 0)
    snprintf(d->name, sizeof d->name, "%s.%d", name, layer);
  else
    snprintf(d->name, sizeof d->name, "%s", name);
  d->cols = cols;
  d->planes = planes;
  d->logical = (uint8_t)logical;
  return g->n_bufs++;
}

static int add_class(struct builder *b, const char *op, int layer, int kernel, int launch,
                     const char *region_class, const char *dep_class) {
  struct ms_graph *g = b->g;
  if (grow((void **)&g->classes, &g->cap_classes, g->n_classes + 1, sizeof *g->classes)) {
    b->err = -ENOMEM;
    return 0;
  }
  struct ms_task_class *c = &g->classes[g->n_classes];
  if (layer >= 0)
    snprintf(c->name, sizeof c->name, "blk.%d.%s", layer, op);
  else
    snprintf(c->name, sizeof c->name, "%s", op);
  snprintf(c->op, sizeof c->op, "%s", op);
  c->kernel = (uint8_t)kernel;
  c->launch = (uint8_t)launch;
  c->layer = (int16_t)layer;
  c->region_class = region_class;
  c->dep_class = dep_class;
  c->in = c->in2 = c->aux = c->out = c->out2 = -1;
  return g->n_classes++;
}

static struct ms_proto_task *add_task(struct builder *b, int cls, int x, int y, int z) {
  struct ms_graph *g = b->g;
  if (b->err || grow((void **)&g->tasks, &g->cap_tasks, g->n_tasks + 1, sizeof *g->tasks)) {
    b->err = -ENOMEM;
    return NULL;
  }
  struct ms_proto_task *t = &g->tasks[g->n_tasks++];
  t->cls = (uint16_t)cls;
  t->tile[0] = (int16_t)x;
  t->tile[1] = (int16_t)y;
  t->tile[2] = (int16_t)z;
  g->classes[cls].n_tasks++;
  return t;
}

static void rd(struct ms_proto_task *t, int buf, int r0, int r1, int c0, int c1, int p0, int p1) {
  if (!t) return;
  MS_ASSERT(t->n_reads < MS_MAX_READS);
  t->reads[t->n_reads++] = (struct ms_region){(int16_t)buf, r0, r1, c0, c1, p0, p1};
}

static void wr(struct ms_proto_task *t, int buf, int r0, int r1, int c0, int c1, int p0, int p1) {
  if (!t) return;
  MS_ASSERT(t->n_writes < MS_MAX_WRITES);
  t->writes[t->n_writes++] = (struct ms_region){(int16_t)buf, r0, r1, c0, c1, p0, p1};
}

/* Below this a task's weights are a small model's: a floor under eight is
 * not taken there (the compiler's default task size). */
#define SMALL_TASK_BYTES (64 * 1024)

/* Output rows per GEMV task: the target weight bytes, but at least min_tiles
 * tasks per operator (eight unless the caller says: small models still
 * exercise the scheduler, and a caller's fewer only where each task would
 * still hold SMALL_TASK_BYTES: the synthetic test models keep eight, and with
 * two, explain's statistics on them thinned: `tests/cli_explain.sh`'s
 * saturated queue on `tiny` stood 1.10x instead of 1.12-1.13x and was missed
 * in 3 of 5 windows); a multiple of `align` (a head for q/k/v, so a tile
 * never splits a head). Where the floor decides, the operator's tasks are cut
 * as evenly as `align` allows (15 heads at a floor of two: 3 x 5 heads, not
 * 7 + 7 + 1): explain holds a class to the same operator in the other layers,
 * on each worker, and a short tile landing on one worker in every other layer
 * made half of them look slow. Where the size cuts more than the floor, a
 * caller's floor also makes the count a multiple of it (the CPU's two: an
 * even count), so that an operator's tasks end together on two workers:
 * SmolLM2's LM head was 17 tasks of 84 us, and each step one worker waited
 * out the seventeenth. */
static int gemv_tile_least(struct builder *b, int rows, int cols, int mats, int align, int least) {
  size_t row_bytes = ms_dtype_row_bytes(b->m->cfg.dtype, cols) * (size_t)mats;
  if (least < 8 && (size_t)((rows + least - 1) / least) * row_bytes < SMALL_TASK_BYTES) least = 8;
  int t = (int)((size_t)b->tile_bytes / row_bytes);
  int spread = (rows + least - 1) / least, floored = t > spread;
  if (floored) t = spread;
  if (b->tile_rows > 0) t = b->tile_rows, floored = 0;
  if (b->tiles_per_op > 0) t = (rows + b->tiles_per_op - 1) / b->tiles_per_op + align - 1, floored = 0;
  t = t / align * align;
  if (t < align) t = align;
  int n = (rows + t - 1) / t;
  if (!floored && b->tile_rows <= 0 && b->tiles_per_op <= 0 && n % b->multiple) {
    n += b->multiple - n % b->multiple;  /* an operator's tasks end together on that many workers */
    floored = 1;
  }
  if (floored && t < rows) t = ((rows + n - 1) / n + align - 1) / align * align;
  return t > rows ? rows : t;
}

static int gemv_tile(struct builder *b, int rows, int cols, int mats, int align) {
  return gemv_tile_least(b, rows, cols, mats, align, b->min_tiles);
}

/* 1 when every layer's q, k and v matrices share one type: equal rows are
 * then equal bytes, and equal work, across a q/k/v tile boundary. */
static int qkv_one_type(const struct ms_model *m) {
  for (int l = 0; l < m->cfg.n_layers; l++) {
    const struct ms_layer_weights *L = &m->layers[l];
    if (L->wk.dtype != L->wq.dtype || L->wv.dtype != L->wq.dtype) return 0;
  }
  return 1;
}

/* q/k/v's rows per task. Where the three matrices share one type (SmolLM2's
 * q4_1), a caller's floor under eight holds, the rows cut in equal tiles of
 * whole groups of four rather than whole heads: the CPU's two are SmolLM2's
 * 960 rows as two tiles of 480 (7.5 heads each) instead of fifteen one-head
 * tiles whose fixed cost made them stream at 13 GB/s against 17 for larger
 * tiles; on two workers 1.01-1.04x (docs/performance.md, "q/k/v in two
 * tiles"). Every RoPE task then waits for both, which is why four tiles did
 * not pay. Elsewhere at least eight tasks whatever the floor: the tiles cross
 * matrices of different types and cost differently (SmolLM2 at three tiles:
 * 5.0, 5.5 and 6.3 us), and explain holds a class to the same operator in the
 * other layers on each worker: with three tiles, which of them a worker ran
 * moved from layer to layer with the batch, and every other layer's q/k/v
 * looked slow beside a slow worker (4 of 22 SmolLM2 runs of a held-out set);
 * a worker's share of eight or more averages over them. */
static int qkv_tile(struct builder *b, int rows, int hd) {
  if (b->min_tiles < 8 && qkv_one_type(b->m)) return gemv_tile_least(b, rows, b->m->cfg.dim, 1, 4, b->min_tiles);
  return gemv_tile_least(b, rows, b->m->cfg.dim, 1, hd, b->min_tiles > 8 ? b->min_tiles : 8);
}

/* A task of the operator after an all-gather reads the whole of its logical
 * buffer, so that it depends on every device's communication task. */
static void comm_read(struct builder *b, struct ms_proto_task *t) {
  if (b->pending_comm >= 0) rd(t, b->pending_comm, 0, 1, 0, b->tp, 0, 1);
}

/* One whole-row operator: a task per batch row; with res >= 0, the row of res
 * is added to the result (a post-norm before its residual add). */
static int row_op_res(struct builder *b, const char *op, int layer, int kernel, int in, int res, int out) {
  struct ms_graph *g = b->g;
  int c = add_class(b, op, layer, kernel, MS_LAUNCH_AOT, "row", res >= 0 ? "row+residual" : "row");
  g->classes[c].in = (int16_t)in;
  g->classes[c].in2 = (int16_t)res;
  g->classes[c].out = (int16_t)out;
  g->classes[c].tile = g->bufs[out].cols;
  g->classes[c].n_out = g->bufs[out].cols;
  for (int r = 0; r < b->B; r++) {
    struct ms_proto_task *t = add_task(b, c, 0, r, -1);
    rd(t, in, r, r + 1, 0, g->bufs[in].cols, 0, 1);
    if (res >= 0) rd(t, res, r, r + 1, 0, g->bufs[res].cols, 0, 1);
    comm_read(b, t);
    wr(t, out, r, r + 1, 0, g->bufs[out].cols, 0, 1);
  }
  b->pending_comm = -1;
  return c;
}

static int row_op(struct builder *b, const char *op, int layer, int kernel, int in, int out) {
  return row_op_res(b, op, layer, kernel, in, -1, out);
}

/* Tensor parallel: each of tp devices computed a contiguous share of the
 * columns of `in`; an all-gather makes every share visible to every device
 * before the next operator that reads whole rows runs. One communication task
 * per device reads its share and writes its column of a logical buffer that
 * the next operator also reads (comm_read), so that operator depends on all
 * of them. In one address space (the simulator, split 0) the transfer's cost
 * is the link model and its data is already there; across processes (split)
 * the task moves the share (src/runtime/dist.c). */
static void comm_op(struct builder *b, const char *op, int layer, int in) {
  struct ms_graph *g = b->g;
  int D = b->tp, cols = g->bufs[in].cols;
  int done = add_buf(b, op, layer, D, 1, 1);
  int c = add_class(b, op, layer, MS_K_COMM, MS_LAUNCH_AOT, "device_cols", "device_cols");
  g->classes[c].in = (int16_t)in;
  g->classes[c].out = (int16_t)done;
  g->classes[c].tile = (cols + D - 1) / D;
  g->classes[c].n_out = cols;
  for (int d = 0; d < D; d++) {
    struct ms_proto_task *t = add_task(b, c, 0, -1, d);
    rd(t, in, 0, b->B, d * cols / D, (d + 1) * cols / D, 0, 1);
    wr(t, done, 0, 1, d, d + 1, 0, 1);
  }
  b->pending_comm = done;
}

/* A GEMV operator tiled over output columns; every task reads all rows of `in`
 * (the weight tile is read once for the whole batch), and optionally the matching
 * columns of a residual `res`. */
static int gemv_op(struct builder *b, const char *op, int layer, int kernel, int in, int res,
                   int out, int n_out, int tile) {
  struct ms_graph *g = b->g;
  int c = add_class(b, op, layer, kernel, MS_LAUNCH_AOT, "cols", res >= 0 ? "all_rows+residual" : "all_rows");
  g->classes[c].in = (int16_t)in;
  g->classes[c].in2 = (int16_t)res;
  g->classes[c].out = (int16_t)out;
  g->classes[c].tile = tile;
  g->classes[c].n_out = n_out;
  for (int j = 0, c0 = 0; c0 < n_out; j++, c0 += tile) {
    int c1 = c0 + tile < n_out ? c0 + tile : n_out;
    struct ms_proto_task *t = add_task(b, c, j, -1, -1);
    rd(t, in, 0, b->B, 0, g->bufs[in].cols, 0, 1);
    if (res >= 0) rd(t, res, 0, b->B, c0, c1, 0, 1);
    comm_read(b, t);
    wr(t, out, 0, b->B, c0, c1, 0, 1);
  }
  b->pending_comm = -1;
  return c;
}

static void attention_block(struct builder *b, int l, int x, int *x_out) {
  const struct ms_model_config *cf = &b->m->cfg;
  struct ms_graph *g = b->g;
  int B = b->B, hd = cf->head_dim, group = cf->n_heads / cf->n_kv_heads;
  int nq = cf->n_heads * hd, nkv = cf->n_kv_heads * hd;
  /* Fused, xn is added all the same, unwritten: the buffers are numbered as
   * in a plan that does not fuse (a tp engine's, the simulator's). */
  int xn = add_buf(b, "xn", l, cf->dim, 1, 0);
  if (b->fuse_norm) xn = x;
  int qkv = add_buf(b, "qkv", l, nq + 2 * nkv, 1, 0);
  int qr = add_buf(b, "q_rot", l, nq, 1, 0);
  int kv = add_buf(b, "kv_cache", l, cf->n_kv_heads, 1, 1);
  int att = add_buf(b, "attn_out", l, nq, 1, 0);
  int xo = add_buf(b, "x_mid", l, cf->dim, 1, 0);

  if (!b->fuse_norm) row_op(b, "attn_norm", l, MS_K_RMSNORM, x, xn);
  int cq = gemv_op(b, "qkv", l, MS_K_QKV, xn, -1, qkv, nq + 2 * nkv, qkv_tile(b, nq + 2 * nkv, hd));
  g->classes[cq].norm = (uint8_t)b->fuse_norm;
  if (b->split) comm_op(b, "comm_qkv", l, qkv);

  int c = add_class(b, "rope", l, MS_K_ROPE, MS_LAUNCH_AOT, "row_head", "head_slice");
  g->classes[c].in = (int16_t)qkv;
  g->classes[c].out = (int16_t)qr;
  g->classes[c].out2 = (int16_t)kv;
  g->classes[c].tile = group * hd;
  g->classes[c].n_out = nq;
  for (int r = 0; r < B; r++)
    for (int h = 0; h < cf->n_kv_heads; h++) {
      struct ms_proto_task *t = add_task(b, c, 0, r, h);
      rd(t, qkv, r, r + 1, h * group * hd, (h + 1) * group * hd, 0, 1);
      rd(t, qkv, r, r + 1, nq + h * hd, nq + (h + 1) * hd, 0, 1);
      rd(t, qkv, r, r + 1, nq + nkv + h * hd, nq + nkv + (h + 1) * hd, 0, 1);
      rd(t, g->meta_buf, 0, 1, 0, 1, 0, 1);
      comm_read(b, t);
      wr(t, qr, r, r + 1, h * group * hd, (h + 1) * group * hd, 0, 1);
      wr(t, kv, r, r + 1, h, h + 1, 0, 1);
    }
  b->pending_comm = -1;

  /* With parts, each row's group is that many tasks over shares of its
   * positions (tile_x the part): they write the same columns, so wo waits for
   * all of them, and the last to finish merges their partial softmaxes
   * (kernels/ops.c). On two workers a layer's three SmolLM2 groups were three
   * tasks: one worker ran two while the other waited before wo. Prefill
   * plans alike: a position's logits the same bits in a prompt chunk and a
   * decode step, and a decode row's attention tasks the same size in both
   * (one task taking every share in prompt steps made explain's line of
   * attention time against context name short requests decoding beside a
   * long prompt as slow). */
  c = add_class(b, "attn", l, MS_K_ATTN, MS_LAUNCH_JIT, "row_head", "head_slice+kv");
  g->classes[c].in = (int16_t)qr;
  g->classes[c].out = (int16_t)att;
  g->classes[c].tile = group * hd;
  g->classes[c].n_out = nq;
  g->classes[c].parts = (uint8_t)b->attn_parts;
  for (int r = 0; r < B; r++)
    for (int h = 0; h < cf->n_kv_heads; h++)
      for (int part = 0; part < b->attn_parts; part++) {
        struct ms_proto_task *t = add_task(b, c, part, r, h);
        rd(t, qr, r, r + 1, h * group * hd, (h + 1) * group * hd, 0, 1);
        if (b->prefill)  /* the rows before it in its chunk: statically, all of them */
          rd(t, kv, 0, B, h, h + 1, 0, 1);
        else
          rd(t, kv, r, r + 1, h, h + 1, 0, 1);
        rd(t, g->meta_buf, 0, 1, 0, 1, 0, 1);
        wr(t, att, r, r + 1, h * group * hd, (h + 1) * group * hd, 0, 1);
      }
  if (cf->post_norms) {  /* gemma3: x_mid = x + rmsnorm(wo . attn) */
    int proj = add_buf(b, "attn_proj", l, cf->dim, 1, 0);
    gemv_op(b, "wo", l, MS_K_WO, att, -1, proj, cf->dim, gemv_tile(b, cf->dim, nq, 1, 8));
    if (b->tp > 1) comm_op(b, "comm_attn", l, proj);
    row_op_res(b, "attn_post_norm", l, MS_K_RMSNORM, proj, x, xo);
  } else {
    gemv_op(b, "wo", l, MS_K_WO, att, x, xo, cf->dim, gemv_tile(b, cf->dim, nq, 1, 8));
    if (b->tp > 1) comm_op(b, "comm_attn", l, xo);
  }
  *x_out = xo;
}

/* gate_up (the model's gated activation: SwiGLU or GeGLU) and down, + residual;
 * with post-norms (gemma3) down's output is normed before the residual add.
 * With the norm fused, xn is x itself and gate_up norms it. */
static void dense_ffn(struct builder *b, int l, int xn, int x, int xo) {
  const struct ms_model_config *cf = &b->m->cfg;
  int h = add_buf(b, "ffn_h", l, cf->ffn_dim, 1, 0);
  int cg = gemv_op(b, "gate_up", l, MS_K_SWIGLU, xn, -1, h, cf->ffn_dim, gemv_tile(b, cf->ffn_dim, cf->dim, 2, 8));
  b->g->classes[cg].norm = (uint8_t)b->fuse_norm;
  if (b->split) comm_op(b, "comm_ffn_h", l, h);
  if (cf->post_norms) {
    int proj = add_buf(b, "ffn_proj", l, cf->dim, 1, 0);
    gemv_op(b, "down", l, MS_K_DOWN, h, -1, proj, cf->dim, gemv_tile(b, cf->dim, cf->ffn_dim, 1, 8));
    if (b->tp > 1) comm_op(b, "comm_ffn", l, proj);
    row_op_res(b, "ffn_post_norm", l, MS_K_RMSNORM, proj, x, xo);
    return;
  }
  gemv_op(b, "down", l, MS_K_DOWN, h, x, xo, cf->dim, gemv_tile(b, cf->dim, cf->ffn_dim, 1, 8));
  if (b->tp > 1) comm_op(b, "comm_ffn", l, xo);
}

static void moe_ffn(struct builder *b, int l, int xn, int x, int xo) {
  const struct ms_model_config *cf = &b->m->cfg;
  struct ms_graph *g = b->g;
  int B = b->B, E = cf->n_experts, F = cf->expert_ffn_dim;
  int route = add_buf(b, "route", l, 2 * cf->top_k, 1, 0);
  int eh = add_buf(b, "expert_h", l, F, E, 0);
  int ey = add_buf(b, "expert_y", l, cf->dim, E, 0);
  row_op(b, "router", l, MS_K_ROUTER, xn, route);

  int tu = gemv_tile(b, F, cf->dim, 2, 8), td = gemv_tile(b, cf->dim, F, 1, 8);
  int c = add_class(b, "expert_up", l, MS_K_EXPERT_UP, MS_LAUNCH_JIT, "expert_cols", "routed_rows");
  g->classes[c].in = (int16_t)xn;
  g->classes[c].in2 = (int16_t)route;
  g->classes[c].out = (int16_t)eh;
  g->classes[c].tile = tu;
  g->classes[c].n_out = F;
  for (int e = 0; e < E; e++)
    for (int j = 0, c0 = 0; c0 < F; j++, c0 += tu) {
      struct ms_proto_task *t = add_task(b, c, j, -1, e);
      rd(t, xn, 0, B, 0, cf->dim, 0, 1);
      rd(t, route, 0, B, 0, 2 * cf->top_k, 0, 1);
      wr(t, eh, 0, B, c0, c0 + tu < F ? c0 + tu : F, e, e + 1);
    }
  c = add_class(b, "expert_down", l, MS_K_EXPERT_DOWN, MS_LAUNCH_JIT, "expert_cols", "routed_rows");
  g->classes[c].in = (int16_t)eh;
  g->classes[c].in2 = (int16_t)route;
  g->classes[c].out = (int16_t)ey;
  g->classes[c].tile = td;
  g->classes[c].n_out = cf->dim;
  for (int e = 0; e < E; e++)
    for (int j = 0, c0 = 0; c0 < cf->dim; j++, c0 += td) {
      struct ms_proto_task *t = add_task(b, c, j, -1, e);
      rd(t, eh, 0, B, 0, F, e, e + 1);
      rd(t, route, 0, B, 0, 2 * cf->top_k, 0, 1);
      wr(t, ey, 0, B, c0, c0 + td < cf->dim ? c0 + td : cf->dim, e, e + 1);
    }
  c = add_class(b, "moe_combine", l, MS_K_MOE_COMBINE, MS_LAUNCH_AOT, "cols", "all_experts+residual");
  g->classes[c].in = (int16_t)ey;
  g->classes[c].in2 = (int16_t)x;
  g->classes[c].out = (int16_t)xo;
  g->classes[c].aux = (int16_t)route;
  g->classes[c].tile = td;
  g->classes[c].n_out = cf->dim;
  for (int j = 0, c0 = 0; c0 < cf->dim; j++, c0 += td) {
    int c1 = c0 + td < cf->dim ? c0 + td : cf->dim;
    struct ms_proto_task *t = add_task(b, c, j, -1, -1);
    rd(t, ey, 0, B, c0, c1, 0, E);
    rd(t, route, 0, B, 0, 2 * cf->top_k, 0, 1);
    rd(t, x, 0, B, c0, c1, 0, 1);
    wr(t, xo, 0, B, c0, c1, 0, 1);
  }
}

int ms_graph_build(const struct ms_model *m, int batch, int tile_bytes, int tile_rows, int tiles_per_op,
                   struct ms_graph *g,
                   struct ms_textbuf *log) {
  struct ms_graph_tiling t = {.tile_bytes = tile_bytes, .tile_rows = tile_rows, .tiles_per_op = tiles_per_op};
  return ms_graph_build_tp(m, batch, &t, 0, 0, g, log);
}

static int graph_build(const struct ms_model *m, int batch, const struct ms_graph_tiling *tl, int tp, int prefill,
                       int split, struct ms_graph *g, struct ms_textbuf *log);

int ms_graph_build_tp(const struct ms_model *m, int batch, const struct ms_graph_tiling *t, int tp, int prefill,
                      struct ms_graph *g, struct ms_textbuf *log) {
  return graph_build(m, batch, t, tp, prefill, 0, g, log);
}

int ms_graph_build_split(const struct ms_model *m, int batch, const struct ms_graph_tiling *t, int tp, int prefill,
                         struct ms_graph *g, struct ms_textbuf *log) {
  memset(g, 0, sizeof *g);
  if (tp < 2 || m->cfg.n_experts) {
    ms_textbuf_printf(log, "graph: split tensor parallelism needs tp >= 2 (got %d) and a dense model%s\n", tp,
                      m->cfg.n_experts ? " (this one has experts)" : "");
    return -EINVAL;
  }
  return graph_build(m, batch, t, tp, prefill, 1, g, log);
}

static int graph_build(const struct ms_model *m, int batch, const struct ms_graph_tiling *tl, int tp, int prefill,
                       int split, struct ms_graph *g, struct ms_textbuf *log) {
  memset(g, 0, sizeof *g);
  if (batch < 1 || batch > 4096) {
    ms_textbuf_printf(log, "batch %d out of range 1..4096\n", batch);
    return -EINVAL;
  }
  const struct ms_model_config *cf = &m->cfg;
  if (tp > 64) {
    ms_textbuf_printf(log, "tp %d out of range 1..64\n", tp);
    return -EINVAL;
  }
  if (tl->min_tiles < 0) {
    ms_textbuf_printf(log, "min_tiles %d: expected 0 (eight) or more\n", tl->min_tiles);
    return -EINVAL;
  }
  struct builder b = {.g = g, .m = m, .B = batch, .tile_bytes = tl->tile_bytes > 0 ? tl->tile_bytes : 64 * 1024,
                     .tile_rows = tl->tile_rows, .tiles_per_op = tl->tiles_per_op,
                     .min_tiles = tl->min_tiles > 0 ? tl->min_tiles : 8, .tp = tp, .pending_comm = -1,
                     .multiple = tl->min_tiles > 0 ? tl->min_tiles : 1,
                     .prefill = prefill, .split = split,
                     .fuse_norm = tl->fuse_norm && tp <= 1 && !split,
                     .attn_parts = tl->attn_parts > 1 ? tl->attn_parts : 1};
  struct ms_graph *G = g;

  G->meta_buf = add_buf(&b, "batch_meta", -1, 1, 1, 1);
  int c = add_class(&b, "step_start", -1, MS_K_STEP_START, MS_LAUNCH_AOT, "meta", "none");
  G->classes[c].out = (int16_t)G->meta_buf;
  struct ms_proto_task *t = add_task(&b, c, 0, -1, -1);
  wr(t, G->meta_buf, 0, 1, 0, 1, 0, 1);

  int x = add_buf(&b, "x", 0, cf->dim, 1, 0);
  c = add_class(&b, "embed", -1, MS_K_EMBED, MS_LAUNCH_AOT, "row", "meta");
  G->classes[c].out = (int16_t)x;
  G->classes[c].tile = G->classes[c].n_out = cf->dim;
  for (int r = 0; r < batch; r++) {
    t = add_task(&b, c, 0, r, -1);
    rd(t, G->meta_buf, 0, 1, 0, 1, 0, 1);
    wr(t, x, r, r + 1, 0, cf->dim, 0, 1);
  }

  for (int l = 0; l < cf->n_layers && !b.err; l++) {
    int xm, xn2, xo;
    attention_block(&b, l, x, &xm);
    xn2 = add_buf(&b, "xn_ffn", l, cf->dim, 1, 0);  /* as xn: added whether fused or not */
    if (b.fuse_norm && !cf->n_experts)  /* gate_up norms it (the router and experts read xn_ffn) */
      xn2 = xm;
    else
      row_op(&b, "ffn_norm", l, MS_K_RMSNORM, xm, xn2);
    xo = add_buf(&b, "x", l + 1, cf->dim, 1, 0);
    if (cf->n_experts)
      moe_ffn(&b, l, xn2, xm, xo);
    else
      dense_ffn(&b, l, xn2, xm, xo);
    if (b.tp > 1 && cf->n_experts) comm_op(&b, "comm_ffn", l, xo);
    x = xo;
  }

  int xf = add_buf(&b, "x_final", -1, cf->dim, 1, 0);  /* as xn */
  if (b.fuse_norm) xf = x;
  int logits = add_buf(&b, "logits", -1, cf->vocab, 1, 0);
  int tokens = add_buf(&b, "tokens", -1, 1, 1, 1);
  if (!b.fuse_norm) row_op(&b, "out_norm", -1, MS_K_RMSNORM, x, xf);
  c = gemv_op(&b, "lm_head", -1, MS_K_LM_HEAD, xf, -1, logits, cf->vocab, gemv_tile(&b, cf->vocab, cf->dim, 1, 8));
  G->classes[c].norm = (uint8_t)b.fuse_norm;
  if (b.split) comm_op(&b, "comm_logits", -1, logits);
  c = add_class(&b, "sample", -1, MS_K_SAMPLE, MS_LAUNCH_AOT, "row", "row+meta");
  G->classes[c].in = (int16_t)logits;
  G->classes[c].out = (int16_t)tokens;
  G->classes[c].tile = G->classes[c].n_out = 1;
  for (int r = 0; r < batch; r++) {
    t = add_task(&b, c, 0, r, -1);
    rd(t, logits, r, r + 1, 0, cf->vocab, 0, 1);
    rd(t, G->meta_buf, 0, 1, 0, 1, 0, 1);
    comm_read(&b, t);
    wr(t, tokens, r, r + 1, 0, 1, 0, 1);
  }
  if (b.err) {
    ms_textbuf_printf(log, "graph: out of memory\n");
    ms_graph_free(g);
    return b.err;
  }
  return 0;
}

void ms_graph_free(struct ms_graph *g) {
  free(g->classes);
  free(g->bufs);
  free(g->tasks);
  memset(g, 0, sizeof *g);
}
