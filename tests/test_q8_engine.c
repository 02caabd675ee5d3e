/* SPDX-License-Identifier: MIT */
/* The engine with 8-bit activations (ms_engine_opts.q8_activations) on the
 * tiny presets with their matrices quantized in memory to q8_0, q4_0 and q4_1
 * (tiny-moe's experts too; routers and norms stay f32, as in GGUF files):
 *   - the logits stay within Q8_TOL of the double-precision reference, and
 *     move off it by more than the f32 path does (the mode is really on);
 *   - they are the same bits for every worker count, mode, shuffled
 *     interleaving, tiling, batch bucket, and on the simulator;
 *   - with the option off, the same models still meet the f32 path's 1e-3.
 * Q8_TOL: these models' logits have a standard deviation of about 1; the
 * largest difference measured is 0.076 (each GEMV input rounded to 8 bits
 * per 32-value block, through two layers), and the check allows 0.25. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "model/blocks.h"
#include "megascope/engine.h"
#include "megascope/reference.h"
#include "ref_check.h"
#include "test.h"

#define NREQ 4
#define STEPS 12
#define Q8_TOL 0.25

struct qmodel {
  struct ms_model *m;
  void *bufs[512];
  int n;
};

/* w's rows quantized to t (its data replaced; the buffer kept in q). */
static void quantize(struct qmodel *q, struct ms_weight *w, enum ms_dtype t) {
  size_t rb = ms_dtype_row_bytes(t, w->cols);
  uint8_t *out = malloc(rb * (size_t)w->rows);
  float *row = malloc(sizeof(float) * (size_t)w->cols);
  for (int r = 0; r < w->rows; r++) {
    ms_weight_row_f32(w, r, row);
    ms_quant_row(t, row, w->cols, out + (size_t)r * rb);
  }
  free(row);
  w->data = out;
  w->dtype = t;
  q->bufs[q->n++] = out;
}

static int qmodel_new(struct qmodel *q, const char *preset, enum ms_dtype t) {
  struct ms_model_config c;
  *q = (struct qmodel){0};
  if (ms_preset_config(preset, MS_DTYPE_F32, &c) || !(q->m = ms_model_synth(&c, 5))) return -1;
  struct ms_model *m = q->m;
  int tied = m->lm_head.data == m->tok_embd.data;
  quantize(q, &m->tok_embd, t);
  if (tied)
    m->lm_head = m->tok_embd;
  else
    quantize(q, &m->lm_head, t);
  for (int l = 0; l < c.n_layers; l++) {
    struct ms_layer_weights *L = &m->layers[l];
    struct ms_weight *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
      if (mats[i]->data) quantize(q, mats[i], t);
    for (int e = 0; e < c.n_experts; e++) {
      quantize(q, &L->exp_gate[e], t);
      quantize(q, &L->exp_up[e], t);
      quantize(q, &L->exp_down[e], t);
    }
  }
  return 0;
}

static void qmodel_free(struct qmodel *q) {
  ms_model_free(q->m);
  for (int i = 0; i < q->n; i++) free(q->bufs[i]);
}

struct result {
  int32_t tokens[NREQ][STEPS];
  float *logits;   /* NREQ x (prompt + STEPS) x vocab, zero past a request's positions */
  double max_diff; /* against the reference */
};

static int prompt_of(int i, int vocab, int32_t *out) {
  int n = 1 + (3 * i) % 5;
  for (int j = 0; j < n; j++) out[j] = (int32_t)((i * 37 + j * 11 + 3) % vocab);
  return n;
}

static int run(const struct ms_model *m, struct ms_engine_opts o, int check, struct result *res) {
  int vocab = m->cfg.vocab, per = 8 + STEPS;
  o.sz = sizeof o;
  if (!o.max_batch) o.max_batch = NREQ;
  o.max_ctx = 64;
  memset(res, 0, sizeof *res);
  res->logits = calloc((size_t)NREQ * (size_t)per * (size_t)vocab, sizeof(float));
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  if (!e || !res->logits) return -1;
  struct ms_request *r[NREQ];
  int32_t prompts[NREQ][8];
  for (int i = 0; i < NREQ; i++) {
    int n = prompt_of(i, vocab, prompts[i]);
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = prompts[i], .n_prompt = n,
                                 .max_new_tokens = STEPS, .record_logits = 1};
    r[i] = ms_engine_submit(e, &ro);
  }
  for (int i = 0; i < NREQ; i++) {
    ms_request_wait(r[i], -1);
    struct ms_request_info info;
    ms_request_get_info(r[i], &info);
    memcpy(res->tokens[i], info.tokens, sizeof res->tokens[i]);
    if (info.n_tokens != STEPS || info.state != MS_REQ_DONE) res->max_diff = INFINITY;
    memcpy(res->logits + (size_t)i * (size_t)per * (size_t)vocab, info.logits,
           sizeof(float) * (size_t)info.n_logits * (size_t)vocab);
    if (check) {
      double d = test_ref_diff(m, &info, prompts[i]);
      if (!(d <= res->max_diff)) res->max_diff = d;
    }
    ms_request_free(r[i]);
  }
  ms_engine_free(e);
  return 0;
}

static void check_model(const char *preset, enum ms_dtype t) {
  struct qmodel q;
  CHECK(qmodel_new(&q, preset, t) == 0);
  const char *tn = ms_dtype_name(t);
  size_t bytes = (size_t)NREQ * (8 + STEPS) * (size_t)q.m->cfg.vocab * sizeof(float);
  struct result off, base, other;
  CHECK(run(q.m, (struct ms_engine_opts){.n_workers = 2}, 1, &off) == 0);
  CHECKF(off.max_diff <= 1e-3, "%s %s, f32 activations: max diff %g", preset, tn, off.max_diff);
  CHECK(run(q.m, (struct ms_engine_opts){.n_workers = 2, .q8_activations = 1}, 1, &base) == 0);
  CHECKF(base.max_diff <= Q8_TOL && base.max_diff > 10 * off.max_diff, "%s %s, 8-bit activations: max diff %g",
         preset, tn, base.max_diff);
  if (getenv("MS_Q8_VERBOSE"))
    printf("%s %s: max |logit diff| vs reference: f32 activations %.3g, 8-bit %.3g\n", preset, tn, off.max_diff,
           base.max_diff);
  /* the simulator: attention in the CPU's two parts, for the same sums */
  struct ms_engine_opts sim = {.backend = MS_BACKEND_SIM, .q8_activations = 1, .attn_parts = 2};
  ms_sim_preset("h100", &sim.sim);
  sim.sim.compute = 1;
  struct ms_engine_opts variants[] = {
      {.n_workers = 1, .q8_activations = 1},
      {.n_workers = 3, .q8_activations = 1},
      {.n_workers = 2, .mode = MS_MODE_PER_OP, .q8_activations = 1},
      {.n_workers = 3, .shuffle = 1, .seed = 4, .q8_activations = 1},
      {.n_workers = 2, .tile_rows = 8, .q8_activations = 1},
      {.n_workers = 2, .tiles_per_op = 7, .q8_activations = 1},
      {.n_workers = 2, .max_batch = 16, .q8_activations = 1},
      sim};
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
    CHECK(run(q.m, variants[v], 0, &other) == 0);
    CHECKF(!memcmp(base.tokens, other.tokens, sizeof base.tokens) && !memcmp(base.logits, other.logits, bytes),
           "%s %s variant %zu: tokens or logits differ", preset, tn, v);
    free(other.logits);
  }
  /* attention in three parts: other sums, the same tokens, as near the reference */
  CHECK(run(q.m, (struct ms_engine_opts){.n_workers = 2, .q8_activations = 1, .attn_parts = 3}, 1, &other) == 0);
  CHECKF(!memcmp(base.tokens, other.tokens, sizeof base.tokens) && other.max_diff <= Q8_TOL,
         "%s %s, attention in three parts: max diff %g", preset, tn, other.max_diff);
  free(other.logits);
  free(off.logits);
  free(base.logits);
  qmodel_free(&q);
}

int main(void) {
  const char *presets[] = {"tiny", "tiny-qwen3", "tiny-moe"};
  enum ms_dtype types[] = {MS_DTYPE_Q8_0, MS_DTYPE_Q4_0, MS_DTYPE_Q4_1};
  for (int p = 0; p < 3; p++)
    for (int t = 0; t < 3; t++) check_model(presets[p], types[t]);
  TEST_MAIN_END();
}
