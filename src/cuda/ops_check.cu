/* SPDX-License-Identifier: MIT */
/* ms_cuda_ops_check: every device task body against its CPU twin.
 *
 * One plan is compiled and uploaded; the activations, the KV cache and the batch
 * metadata get the same pseudo-random contents on both sides (valid rows at
 * different positions, one padding row when batch > 1, routes with valid expert
 * ids). Then, class by class in plan order, a few of the class's tasks (first,
 * quartiles, last) run on the device (a CTA per task, msd_task_run) and on the
 * CPU (ms_ops_run); the class's outputs are compared, and the CPU's are copied
 * back to the device so the next class starts from identical inputs again. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "megascope/plan_ir.h"
#include "kernels/ops.h"
}
#include "megascope/cuda.h"
#include "megascope/cuda_diag.h"
#include "megascope/plan.h"
#include "megascope/reference.h"

#include "cuda/ops.cuh"
#include "cuda/upload.h"

#define CHK_TASKS 5    /* tasks per class at most (and CTAs of the scratch) */
#ifndef CHK_CTX        /* tests/emu/ops_emu.cc makes it a variable (long contexts) */
#define CHK_CTX 64     /* positions per request */
#endif
#define CHK_PAGE 16

static __global__ void __launch_bounds__(MSD_THREADS) msd_check_kernel(const struct msd_ctx *x, const int *tasks) {
  msd_task_run(x, tasks[blockIdx.x], (int)blockIdx.x);
}

struct chk {
  const struct ms_model *m;
  const struct ms_plan *p;
  struct ms_textbuf *log;
  struct msd_dev dev;
  int B, n_rows, max_pages;
  float **hb;                      /* [n_bufs] host twins of the device buffers */
  float *before;                   /* a class's output before it ran */
  int32_t *slot, *pos, *tok, *pages;
  int32_t **row_pages;
  float *kp, *vp, *scr;
  size_t pool_floats, layer_floats;
  const struct ms_weight *(*bw)[3];
  struct ms_exec_ctx cx;
  int *dtasks;                     /* device [CHK_TASKS] */
  double tol;
  uint64_t rng;
};

static float rnd(struct chk *c) {  /* splitmix64, uniform in [-1, 1) */
  uint64_t z = (c->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int ck(struct chk *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  ms_textbuf_printf(c->log, "cuda: %s: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
  return -EIO;
}

static int push(struct chk *c, void *dst, const void *src, size_t bytes, const char *what) {
  return ck(c, cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), what);
}

static int pull(struct chk *c, void *dst, const void *src, size_t bytes, const char *what) {
  return ck(c, cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), what);
}

/* Routes of every row of buffer b: distinct valid ids, expert 0 or E-1 first
 * (so some experts get several rows and some none), positive weights summing to 1. */
static void set_routes(struct chk *c, int b) {
  int E = c->m->cfg.n_experts, K = c->m->cfg.top_k;
  for (int r = 0; r < c->B; r++) {
    float *row = c->hb[b] + (size_t)r * (size_t)c->p->bufs[b].cols, sum = 0.0f;
    int32_t *ids = (int32_t *)row;
    for (int j = 0; j < K; j++) {
      int e = j == 0 ? (r % 2 ? E - 1 : 0) : (r + j) % E, used = 1;
      while (used) {
        used = 0;
        for (int i = 0; i < j; i++) used |= ids[i] == e;
        if (used) e = (e + 1) % E;
      }
      ids[j] = e;
      sum += (row[K + j] = 0.25f + fabsf(rnd(c)));
    }
    for (int j = 0; j < K; j++) row[K + j] /= sum;
  }
}

/* Host state, and the same on the device. */
static int setup(struct chk *c) {
  const struct ms_plan *p = c->p;
  const struct ms_model_config *cf = &c->m->cfg;
  int B = c->B, rc;
  c->n_rows = B > 1 ? B - 1 : 1;
  for (int r = 0; r < B; r++) {
    const int first[3] = {37, 0, CHK_CTX - 1};
    c->slot[r] = r < c->n_rows ? B - 1 - r : -1;
    c->pos[r] = r < 3 ? first[r] : (5 + 11 * r) % CHK_CTX;
    c->tok[r] = (31 * r + 7) % cf->vocab;
  }
  int pool_pages = c->dev.h.pool_pages;
  for (int i = 0; i < B * c->max_pages; i++) c->pages[i] = pool_pages - 1 - i;
  for (int r = 0; r < B; r++) c->row_pages[r] = c->slot[r] >= 0 ? c->pages + (size_t)c->slot[r] * c->max_pages : NULL;
  for (int b = 0; b < p->n_bufs; b++) {
    size_t n = c->dev.buf_bytes[b] / sizeof(float);
    for (size_t i = 0; i < n; i++) c->hb[b][i] = rnd(c);
  }
  for (int k = 0; k < p->n_classes; k++)
    if (p->classes[k].kernel == MS_K_ROUTER) set_routes(c, p->classes[k].out);
  for (size_t i = 0; i < c->pool_floats; i++) c->kp[i] = rnd(c), c->vp[i] = rnd(c);
  const struct msd_ctx *h = &c->dev.h;
  for (int b = 0; b < p->n_bufs; b++)
    if (c->dev.buf_bytes[b] && (rc = push(c, c->dev.bufs[b], c->hb[b], c->dev.buf_bytes[b], "cudaMemcpy(buffer)")))
      return rc;
  if ((rc = push(c, h->n_rows, &c->n_rows, sizeof(int32_t), "cudaMemcpy(n_rows)")) ||
      (rc = push(c, h->row_slot, c->slot, (size_t)B * sizeof(int32_t), "cudaMemcpy(row_slot)")) ||
      (rc = push(c, h->row_pos, c->pos, (size_t)B * sizeof(int32_t), "cudaMemcpy(row_pos)")) ||
      (rc = push(c, h->row_token, c->tok, (size_t)B * sizeof(int32_t), "cudaMemcpy(row_token)")) ||
      (rc = push(c, h->page_table, c->pages, (size_t)B * c->max_pages * sizeof(int32_t), "cudaMemcpy(page_table)")) ||
      (rc = push(c, h->k_pool, c->kp, c->pool_floats * sizeof(float), "cudaMemcpy(k_pool)")) ||
      (rc = push(c, h->v_pool, c->vp, c->pool_floats * sizeof(float), "cudaMemcpy(v_pool)")))
    return rc;
  c->cx = (struct ms_exec_ctx){};
  c->cx.m = c->m;
  c->cx.plan = p;
  c->cx.buf = c->hb;
  c->cx.max_rows = B;
  c->cx.cls_w = (const struct ms_weight *const(*)[3])c->bw;
  c->cx.meta.n_rows = c->n_rows;
  c->cx.meta.row_slot = c->slot;
  c->cx.meta.row_pos = c->pos;
  c->cx.meta.row_token = c->tok;
  c->cx.meta.row_pages = c->row_pages;
  c->cx.k_pool = c->kp;
  c->cx.v_pool = c->vp;
  c->cx.page_size = CHK_PAGE;
  c->cx.pool_pages = pool_pages;
  c->cx.scratch = &c->scr;
  return 0;
}

/* Largest |cpu - dev| over n floats, and the largest |cpu| where the CPU wrote
 * something (over all of it when it wrote nothing). */
static void diff(const float *cpu, const float *dev, const float *before, size_t n, double *max_abs,
                 double *scale) {
  double all = 0.0, changed = 0.0;
  int any = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)cpu[i] - (double)dev[i]), a = fabs((double)cpu[i]);
    if (!(d <= *max_abs)) *max_abs = d;  /* NaN counts as a difference */
    if (a > all) all = a;
    if (memcmp(&cpu[i], &before[i], sizeof(float))) {
      any = 1;
      if (a > changed) changed = a;
    }
  }
  double s = any ? changed : all;
  if (s > *scale) *scale = s;
}

/* The router's rows: ids equal (or a near tie of the logits), weights within tolerance. */
static int cmp_router(struct chk *c, const struct ms_task_class *k, const float *dev, double *max_abs,
                      double *scale) {
  const struct ms_model_config *cf = &c->m->cfg;
  int K = cf->top_k, E = cf->n_experts, ld = c->p->bufs[k->out].cols, ok = 1;
  const struct ms_weight *w = c->bw[k - c->p->classes][0];
  for (int r = 0; r < c->B; r++) {
    const float *hr = c->hb[k->out] + (size_t)r * ld, *dr = dev + (size_t)r * ld;
    const int32_t *hi = (const int32_t *)hr, *di = (const int32_t *)dr;
    int same = 1;
    for (int j = 0; j < K; j++) same &= hi[j] == di[j];
    if (same) {
      diff(hr + K, dr + K, hr + K, (size_t)K, max_abs, scale);
      continue;
    }
    /* a near tie: the two picks' logits (in double) within rounding of each other */
    const float *xn = c->hb[k->in] + (size_t)r * c->p->bufs[k->in].cols;
    double big = 0.0, gap = 0.0;
    for (int j = 0; j < K; j++) {
      if (di[j] < 0 || di[j] >= E) {
        gap = INFINITY;
        continue;
      }
      double a = 0.0, b = 0.0;
      for (int i = 0; i < cf->dim; i++) {
        a += (double)ms_weight_get(w, hi[j], i) * xn[i];
        b += (double)ms_weight_get(w, di[j], i) * xn[i];
      }
      big = fmax(big, fmax(fabs(a), fabs(b)));
      gap = fmax(gap, fabs(a - b));
    }
    int tie = gap <= 1e-5 * big + 1e-6;
    ms_textbuf_printf(c->log, "  %s row %d: ids differ (%s, logit gap %.2e)\n", k->name, r,
                      tie ? "a near tie: accepted" : "not a tie", gap);
    ok &= tie;
  }
  return ok;
}

/* The sample rows: the token of ms_argmax (-1 for padding) and the logits copy. */
static int cmp_sample(struct chk *c, const struct ms_task_class *k, const int *tasks, int n) {
  int V = c->m->cfg.vocab, rc, ok = 1;
  int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)c->B);
  float *lg = (float *)malloc(sizeof(float) * (size_t)c->B * (size_t)V);
  if (!tok || !lg) {
    free(tok);
    free(lg);
    return -ENOMEM;
  }
  if ((rc = pull(c, tok, c->dev.h.sampled, sizeof(int32_t) * (size_t)c->B, "cudaMemcpy(sampled)")) ||
      (rc = pull(c, lg, c->dev.h.logits_out, sizeof(float) * (size_t)c->B * (size_t)V, "cudaMemcpy(logits_out)"))) {
    free(tok);
    free(lg);
    return rc;
  }
  for (int i = 0; i < n; i++) {
    int r = c->p->tasks[tasks[i]].tile[1], valid = r < c->n_rows && c->slot[r] >= 0;
    const float *hl = c->hb[k->in] + (size_t)r * (size_t)V;
    int want = valid ? ms_argmax(hl, V) : -1;
    if (tok[r] != want) {
      ms_textbuf_printf(c->log, "  %s row %d: token %d, CPU %d\n", k->name, r, tok[r], want);
      ok = 0;
    }
    if (valid && memcmp(lg + (size_t)r * V, hl, sizeof(float) * (size_t)V)) {
      ms_textbuf_printf(c->log, "  %s row %d: logits_out is not the row's logits\n", k->name, r);
      ok = 0;
    }
  }
  free(tok);
  free(lg);
  return ok;
}

/* Tasks of class k to run: first, quartiles, last (distinct). */
static int pick(const struct ms_plan *p, int k, int *out) {
  int n = 0, total = 0;
  for (int t = 0; t < p->n_tasks; t++) total += p->tasks[t].cls == k;
  if (!total) return 0;
  int want[CHK_TASKS] = {0, total / 4, total / 2, 3 * total / 4, total - 1};
  for (int i = 0, seen = 0, t = 0; t < p->n_tasks && i < CHK_TASKS; t++) {
    if (p->tasks[t].cls != k) continue;
    while (i < CHK_TASKS && want[i] < seen) i++;
    if (i < CHK_TASKS && want[i] == seen) out[n++] = t, i++;
    seen++;
  }
  return n;
}

/* One class: run, compare, resync. 1 agree, 0 differ, < 0 error. */
static int check_class(struct chk *c, int ki) {
  const struct ms_task_class *k = &c->p->classes[ki];
  int tasks[CHK_TASKS], n = pick(c->p, ki, tasks), rc, ok = 1, V = c->m->cfg.vocab;
  if (!n) return 1;
  int out = k->out;
  size_t bytes = c->dev.buf_bytes[out], lofs = (size_t)(k->layer > 0 ? k->layer : 0) * c->layer_floats;
  if (k->kernel == MS_K_SAMPLE) {  /* a tie in the first row: the lowest index wins */
    float *row = c->hb[k->in], mx = row[0];
    for (int i = 1; i < V; i++) mx = fmaxf(mx, row[i]);
    row[V / 3] = row[2 * V / 3] = mx + 1.0f;
    if ((rc = push(c, c->dev.bufs[k->in], c->hb[k->in], c->dev.buf_bytes[k->in], "cudaMemcpy(logits)"))) return rc;
  }
  if (k->kernel == MS_K_EXPERT_UP || k->kernel == MS_K_EXPERT_DOWN || k->kernel == MS_K_MOE_COMBINE) {
    int route = k->kernel == MS_K_MOE_COMBINE ? k->aux : k->in2;
    set_routes(c, route);
    if ((rc = push(c, c->dev.bufs[route], c->hb[route], c->dev.buf_bytes[route], "cudaMemcpy(route)"))) return rc;
  }
  if (bytes) memcpy(c->before, c->hb[out], bytes);
  /* device */
  if ((rc = push(c, c->dtasks, tasks, sizeof(int) * (size_t)n, "cudaMemcpy(tasks)"))) return rc;
#ifdef MSD_HOST_EMU  /* the CTAs on the CPU (tests/emu/cta_emu.h, tests/test_ops_host.c) */
  const char *why = NULL;
  if (msd_emu_launch(n, [&] { msd_check_kernel(c->dev.d, c->dtasks); }, &why)) {
    ms_textbuf_printf(c->log, "class %s (%s): %s\n", k->name, k->op, why);
    return -EIO;
  }
#else
  msd_check_kernel<<<n, MSD_THREADS>>>(c->dev.d, c->dtasks);
#endif
  if ((rc = ck(c, cudaGetLastError(), "launch")) || (rc = ck(c, cudaDeviceSynchronize(), k->name))) return rc;
  /* CPU */
  for (int i = 0; i < n; i++)
    if (k->kernel != MS_K_SAMPLE) ms_ops_run(&c->cx, tasks[i], 0);
  double max_abs = 0.0, scale = 0.0;
  float *dev = (float *)malloc(bytes > c->layer_floats * sizeof(float) ? bytes : c->layer_floats * sizeof(float));
  if (!dev) return -ENOMEM;
  if (k->kernel == MS_K_SAMPLE) {
    ok = cmp_sample(c, k, tasks, n);
  } else if ((rc = pull(c, dev, c->dev.bufs[out], bytes, "cudaMemcpy(output)")) == 0) {
    if (k->kernel == MS_K_ROUTER)
      ok = cmp_router(c, k, dev, &max_abs, &scale);
    else
      diff(c->hb[out], dev, c->before, bytes / sizeof(float), &max_abs, &scale);
    if (k->kernel == MS_K_ROPE) {  /* and this layer's cache (the CPU's is the "before" of nothing: whole) */
      float *pools[2] = {c->kp + lofs, c->vp + lofs}, *dpools[2] = {c->dev.h.k_pool + lofs, c->dev.h.v_pool + lofs};
      for (int i = 0; i < 2 && !rc; i++)
        if (!(rc = pull(c, dev, dpools[i], c->layer_floats * sizeof(float), "cudaMemcpy(kv cache)")))
          diff(pools[i], dev, pools[i], c->layer_floats, &max_abs, &scale);
      /* resync the cache */
      for (int i = 0; i < 2 && !rc; i++) rc = push(c, dpools[i], pools[i], c->layer_floats * sizeof(float), "cudaMemcpy(kv cache)");
    }
  }
  free(dev);
  if (ok < 0) return ok;
  if (rc) return rc;
  if (bytes && (rc = push(c, c->dev.bufs[out], c->hb[out], bytes, "cudaMemcpy(resync)"))) return rc;
  if (k->kernel != MS_K_SAMPLE) ok = ok && (max_abs == 0.0 || max_abs <= c->tol * scale);
  ms_textbuf_printf(c->log, "class %s (%s): %d tasks, max_abs %.2e (scale %.2e) %s\n", k->name, k->op, n,
                    max_abs, scale, ok ? "ok" : "DIFFERS");
  return ok;
}

static void chk_free(struct chk *c) {
  if (c->hb)
    for (int b = 0; b < c->p->n_bufs; b++) free(c->hb[b]);
  free(c->hb);
  free(c->before);
  free(c->slot), free(c->pos), free(c->tok), free(c->pages), free(c->row_pages);
  free(c->kp), free(c->vp), free(c->scr);
  free(c->bw);
  if (c->dtasks) cudaFree(c->dtasks);
  msd_release(&c->dev);
}

extern "C" int ms_cuda_ops_check(const struct ms_model *m, int batch, struct ms_textbuf *log) {
  int ndev = 0, rc = 0, bad = 0, ran = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    ms_textbuf_printf(log, "cuda: no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return -MS_E_UNSUPP;
  }
  if (batch < 1 || !m) {
    ms_textbuf_printf(log, "cuda: ops check: batch %d\n", batch);
    return -EINVAL;
  }
  struct ms_compile_opts co = {};
  co.sz = sizeof co;
  co.batch = batch;
  struct ms_plan *p = ms_plan_compile(m, &co, log);
  if (!p) return errno ? -errno : -EINVAL;
  struct chk c = {};
  c.m = m, c.p = p, c.log = log, c.B = batch, c.rng = 0x5eed;
  c.max_pages = (CHK_CTX + CHK_PAGE - 1) / CHK_PAGE;
  c.tol = m->cfg.dtype == MS_DTYPE_BF16 ? 1e-3 : 3e-2;
  struct msd_upload_opts uo = {CHK_TASKS, batch, CHK_CTX, CHK_PAGE, 0, 1};
  const struct ms_model_config *cf = &m->cfg;
  if ((rc = msd_upload(m, p, &uo, &c.dev, log))) goto out;
  c.layer_floats = (size_t)c.dev.h.pool_pages * CHK_PAGE * (size_t)cf->n_kv_heads * (size_t)cf->head_dim;
  c.pool_floats = (size_t)cf->n_layers * c.layer_floats;
  {
    size_t most = 0;
    for (int b = 0; b < p->n_bufs; b++) most = c.dev.buf_bytes[b] > most ? c.dev.buf_bytes[b] : most;
    c.hb = (float **)calloc((size_t)p->n_bufs, sizeof *c.hb);
    c.before = (float *)malloc(most + sizeof(float));
    int fail = !c.hb || !c.before;
    for (int b = 0; b < p->n_bufs && !fail; b++)
      if (c.dev.buf_bytes[b]) fail |= !(c.hb[b] = (float *)malloc(c.dev.buf_bytes[b]));
    c.slot = (int32_t *)malloc(sizeof(int32_t) * (size_t)batch);
    c.pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)batch);
    c.tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)batch);
    c.pages = (int32_t *)malloc(sizeof(int32_t) * (size_t)batch * (size_t)c.max_pages);
    c.row_pages = (int32_t **)calloc((size_t)batch, sizeof *c.row_pages);
    c.kp = (float *)malloc(sizeof(float) * c.pool_floats);
    c.vp = (float *)malloc(sizeof(float) * c.pool_floats);
    c.scr = (float *)calloc(ms_ops_scratch_floats(m, CHK_CTX), sizeof(float));
    c.bw = (const struct ms_weight *(*)[3])calloc((size_t)p->n_classes, sizeof *c.bw);
    if (fail || !c.slot || !c.pos || !c.tok || !c.pages || !c.row_pages || !c.kp || !c.vp || !c.scr || !c.bw) {
      ms_textbuf_printf(log, "cuda: ops check: out of host memory\n");
      rc = -ENOMEM;
      goto out;
    }
  }
  ms_ops_bind_weights(p, m, c.bw);
  if ((rc = ck(&c, cudaMalloc(&c.dtasks, sizeof(int) * CHK_TASKS), "cudaMalloc(tasks)")) || (rc = setup(&c)))
    goto out;
  ms_textbuf_printf(log, "ops check: %s (%s), batch %d (%d valid rows), %.1f MiB on the device%s\n", cf->name,
                    ms_dtype_name(cf->dtype), batch, c.n_rows, (double)c.dev.total_bytes / (1 << 20),
                    cf->dtype == MS_DTYPE_BF16 ? "" : "; weights rounded to bf16 on the device: loose tolerance");
#ifdef MSD_HOST_EMU  /* every task's prefetch stays inside the weight arena (its padding included) */
  msd_emu_prefetch_lo = (uintptr_t)c.dev.warena;
  msd_emu_prefetch_hi = msd_emu_prefetch_lo + c.dev.weight_bytes;
  msd_emu.err[0] = 0;
  for (int t = 0; t < p->n_tasks && !msd_emu.err[0]; t++) {
    msd_task_prefetch(c.dev.d, t, 0, 1);
    if (msd_emu.err[0]) ms_textbuf_printf(log, "task %d (%s): %s\n", t, p->classes[p->tasks[t].cls].name, msd_emu.err);
  }
  msd_emu_prefetch_lo = msd_emu_prefetch_hi = 0;
  if (msd_emu.err[0]) {
    rc = -MS_E_VERIFY;
    goto out;
  }
#endif
  for (int k = 0; k < p->n_classes; k++) {
    int kern = p->classes[k].kernel;
    if (kern == MS_K_STEP_START || kern == MS_K_EMPTY || kern == MS_K_COMM) continue;
    int r = check_class(&c, k);
    if (r < 0) {
      rc = r;
      goto out;
    }
    ran++;
    bad += !r;
  }
  ms_textbuf_printf(log, "ops check: %d classes, %d differ\n", ran, bad);
  rc = bad ? -MS_E_VERIFY : 0;
out:
  chk_free(&c);
  ms_plan_free(p);
  return rc;
}
