/* SPDX-License-Identifier: MIT */
/* The device task bodies: the CUDA twins of src/kernels/ops.c, one per enum
 * ms_kernel (private to src/cuda; included by the kernels that run tasks).
 *
 * Every entry point is called by all MSD_THREADS threads of one CTA (1-D), after
 * the caller has acquired the task's event and passed a CTA barrier; each ends
 * with a barrier, so every output is written when it returns. Activations and
 * the batch metadata are read with plain loads (they change between steps: never
 * through the non-coherent path); weights, immutable for the kernel's life, with
 * __ldg.
 *
 * Semantics follow ops.c exactly: GEMV-type operators (qkv, wo, down, lm_head,
 * gate_up) and the router compute every row of the plan's batch, padding rows
 * included (they hold zeros); embed, rope and attn zero a padding row's output
 * and touch no cache; the expert operators see only the valid rows routed to
 * their expert; moe_combine copies the residual for padding rows. Sums are in
 * f32 in a different order than the CPU's, so results agree to rounding, not
 * bit for bit (ms_cuda_ops_check measures by how much).
 *
 * GEMV: a warp per pair of weight rows (two output columns, or the gate and up
 * rows of one column), 16-byte loads of 8 bf16 per lane, the batch rows (up to
 * MSD_MAXB per pass) staged in shared memory and multiplied in the same pass
 * over the weight rows; shuffle reductions. Rows that are not 16-byte aligned or
 * whose length is not a multiple of 8 take a scalar path.
 *
 * Shared memory: one static area (struct msd_smem, about 33 KiB) reused by every
 * body; a body's uses of it are separated by barriers, and the barrier at the
 * end of msd_task_run separates consecutive tasks. */
#ifndef MS_CUDA_OPS_CUH
#define MS_CUDA_OPS_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/dev.h"

#define MSD_MAXB 8             /* batch rows multiplied per pass over a weight row */
#define MSD_SMEM_FLOATS 8192   /* staging area: 32 KiB */
#define MSD_MAX_EXPERTS 256    /* router logits live in msd_smem.red (ops.c has the same limit) */
#define MSD_MAX_TOPK 32

struct msd_smem {
  float big[MSD_SMEM_FLOATS];  /* staged activations, attention q and scores, rope rows */
  float red[MSD_THREADS];      /* block reductions, attention partial sums, router logits */
  int ival[64];                /* [0, MSD_MAXB) routed rows, [32, 40) per-warp counts, 48 cursor */
};

static __device__ __forceinline__ struct msd_smem *msd_smem(void) {
  __shared__ __align__(16) struct msd_smem s;
  return &s;
}

/* ---- small helpers ---- */

static __device__ __forceinline__ float msd_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

static __device__ __forceinline__ float msd_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

static __device__ __forceinline__ float msd_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum over the CTA; every thread gets it. All threads must call. */
static __device__ float msd_block_sum(float v) {
  float *red = msd_smem()->red;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = msd_warp_sum(v);
  __syncthreads();  /* red may still be read by the previous reduction */
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < MSD_WARPS; i++) s += red[i];
  return s;
}

static __device__ float msd_block_max(float v) {
  float *red = msd_smem()->red;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = msd_warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = red[0];
#pragma unroll
  for (int i = 1; i < MSD_WARPS; i++) s = fmaxf(s, red[i]);
  return s;
}

/* Rows of this step, at most max_rows. */
static __device__ __forceinline__ int msd_n_rows(const struct msd_ctx *x) {
  int n = *x->n_rows;
  return n < x->max_rows ? n : x->max_rows;
}

static __device__ __forceinline__ int msd_row_valid(const struct msd_ctx *x, int r) {
  return r < *x->n_rows && x->row_slot[r] >= 0;
}

static __device__ __forceinline__ int msd_dtype_bytes(int dtype) { return dtype == MS_DTYPE_BF16 ? 2 : 4; }

/* Row r of expert (plane) p of a weight. */
static __device__ __forceinline__ const void *msd_wrow(const struct msd_weight *w, int p, int r) {
  return (const char *)w->data +
         ((int64_t)p * w->plane_stride + (int64_t)r * w->cols) * msd_dtype_bytes(w->dtype);
}

/* The tile's output columns [c0, c1). */
static __device__ __forceinline__ void msd_cols(const struct msd_class *k, const struct ms_task *t, int *c0,
                                                int *c1) {
  *c0 = t->tile[0] * k->tile;
  *c1 = *c0 + k->tile < k->n_out ? *c0 + k->tile : k->n_out;
}

/* The cache entry of (layer, row, pos), or NULL when pos has no page. */
static __device__ __forceinline__ float *msd_kv_at(const struct msd_ctx *x, float *pool, int layer, int row,
                                                   int pos) {
  int pi = pos / x->page_size, slot = x->row_slot[row];
  if (pos < 0 || pi >= x->max_pages || slot < 0) return NULL;
  int page = x->page_table[(int64_t)slot * x->max_pages + pi];
  if (page < 0 || page >= x->pool_pages) return NULL;
  int64_t kvdim = (int64_t)x->cfg.n_kv_heads * x->cfg.head_dim;
  return pool + (((int64_t)layer * x->pool_pages + page) * x->page_size + pos % x->page_size) * kvdim;
}

/* ---- GEMV core ---- */

/* Eight consecutive weights from element c of a row (16-byte aligned). */
static __device__ __forceinline__ void msd_load8(const void *row, int dtype, int c, float *w) {
  if (dtype == MS_DTYPE_BF16) {
    uint4 u = __ldg((const uint4 *)((const uint16_t *)row + c));
    w[0] = __uint_as_float(u.x << 16), w[1] = __uint_as_float(u.x & 0xffff0000u);
    w[2] = __uint_as_float(u.y << 16), w[3] = __uint_as_float(u.y & 0xffff0000u);
    w[4] = __uint_as_float(u.z << 16), w[5] = __uint_as_float(u.z & 0xffff0000u);
    w[6] = __uint_as_float(u.w << 16), w[7] = __uint_as_float(u.w & 0xffff0000u);
  } else {
    float4 a = __ldg((const float4 *)((const float *)row + c)), b = __ldg((const float4 *)((const float *)row + c + 4));
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  }
}

static __device__ __forceinline__ float msd_load1(const void *row, int dtype, int c) {
  return dtype == MS_DTYPE_BF16 ? msd_bf16(__ldg((const unsigned short *)row + c)) : __ldg((const float *)row + c);
}

/* acc[m][b] = wr[m] . xp[b] over cols, for the calling warp; every lane gets the
 * sums. xvec: every xp[b] is 16-byte aligned. */
static __device__ __forceinline__ void msd_warp_dot2(const void *const *wr, int dtype, int cols,
                                                     const float *const *xp, int nb, int xvec,
                                                     float acc[2][MSD_MAXB]) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int b = 0; b < MSD_MAXB; b++) acc[0][b] = acc[1][b] = 0.0f;
  int vec = xvec && (cols & 7) == 0 && ((uintptr_t)wr[0] & 15) == 0 && ((uintptr_t)wr[1] & 15) == 0;
  if (vec) {
#pragma unroll 2
    for (int c = lane * 8; c < cols; c += 256) {
      float w0[8], w1[8];
      msd_load8(wr[0], dtype, c, w0);
      msd_load8(wr[1], dtype, c, w1);
#pragma unroll
      for (int b = 0; b < MSD_MAXB; b++) {
        if (b >= nb) break;
        float4 xa = *(const float4 *)(xp[b] + c), xb = *(const float4 *)(xp[b] + c + 4);
        float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
        float s0 = acc[0][b], s1 = acc[1][b];
#pragma unroll
        for (int j = 0; j < 8; j++) s0 = fmaf(w0[j], xv[j], s0), s1 = fmaf(w1[j], xv[j], s1);
        acc[0][b] = s0, acc[1][b] = s1;
      }
    }
  } else {
    for (int c = lane; c < cols; c += 32) {
      float w0 = msd_load1(wr[0], dtype, c), w1 = msd_load1(wr[1], dtype, c);
#pragma unroll
      for (int b = 0; b < MSD_MAXB; b++) {
        if (b >= nb) break;
        float xv = xp[b][c];
        acc[0][b] = fmaf(w0, xv, acc[0][b]);
        acc[1][b] = fmaf(w1, xv, acc[1][b]);
      }
    }
  }
#pragma unroll
  for (int b = 0; b < MSD_MAXB; b++) {
    if (b >= nb) break;
    acc[0][b] = msd_warp_sum(acc[0][b]);
    acc[1][b] = msd_warp_sum(acc[1][b]);
  }
}

/* One pass over n_groups pairs of weight rows (row(g, wr) names the pair) against
 * nb <= MSD_MAXB input rows xr[b] of cols floats (global memory), staged in
 * shared memory when they fit; emit(g, b, v0, v1) gets the two dot products of
 * group g with input row b (called by lane b of the group's warp). All threads
 * call; ends with a barrier. */
template <class RowFn, class EmitFn>
static __device__ __forceinline__ void msd_gemv_pass(int dtype, int cols, int n_groups, const float *const *xr,
                                                     int nb, RowFn row, EmitFn emit) {
  struct msd_smem *sm = msd_smem();
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, lds = (cols + 3) & ~3;
  const float *xp[MSD_MAXB];
  if (lds * nb <= MSD_SMEM_FLOATS) {
#pragma unroll
    for (int b = 0; b < MSD_MAXB; b++) {
      xp[b] = sm->big + b * lds;
      if (b < nb)
        for (int c = tid; c < cols; c += MSD_THREADS) sm->big[b * lds + c] = xr[b][c];
    }
    __syncthreads();
  } else {
#pragma unroll
    for (int b = 0; b < MSD_MAXB; b++) xp[b] = xr[b < nb ? b : 0];
  }
  int xvec = 1;
#pragma unroll
  for (int b = 0; b < MSD_MAXB; b++)
    if (b < nb) xvec &= ((uintptr_t)xp[b] & 15) == 0;
  for (int g = warp; g < n_groups; g += MSD_WARPS) {
    const void *wr[2];
    row(g, wr);
    float acc[2][MSD_MAXB];
    msd_warp_dot2(wr, dtype, cols, xp, nb, xvec, acc);
#pragma unroll
    for (int b = 0; b < MSD_MAXB; b++)
      if (b < nb && lane == b) emit(g, b, acc[0][b], acc[1][b]);
  }
  __syncthreads();  /* the staging area is reused by the next pass */
}

/* Input rows per pass: as many as fit staged (at least one), else MSD_MAXB unstaged. */
static __device__ __forceinline__ int msd_rows_per_pass(int cols) {
  int lds = (cols + 3) & ~3, n = MSD_SMEM_FLOATS / lds;
  return lds > MSD_SMEM_FLOATS ? MSD_MAXB : n < MSD_MAXB ? n : MSD_MAXB;
}

/* The pass over every row of the plan's batch: rows [0, B) of `in`, ldin apart. */
template <class RowFn, class EmitFn>
static __device__ __forceinline__ void msd_gemv_batch(const struct msd_ctx *x, const float *in, int ldin,
                                                      int dtype, int cols, int n_groups, RowFn row,
                                                      EmitFn emit) {
  int B = x->batch, per = msd_rows_per_pass(cols);
  for (int b0 = 0; b0 < B; b0 += per) {
    int nb = B - b0 < per ? B - b0 : per;
    const float *xr[MSD_MAXB];
#pragma unroll
    for (int b = 0; b < MSD_MAXB; b++) xr[b] = in + (int64_t)(b0 + (b < nb ? b : 0)) * ldin;
    msd_gemv_pass(dtype, cols, n_groups, xr, nb, row,
                  [&](int g, int b, float v0, float v1) { emit(g, b0 + b, v0, v1); });
  }
}

/* The next (at most MSD_MAXB) valid rows at or after *cursor routed to expert e,
 * ascending, into sm->ival[0..n); advances *cursor. All threads call and get the
 * same count and cursor. */
static __device__ int msd_routed_next(const struct msd_ctx *x, int route_buf, int e, int *cursor) {
  struct msd_smem *sm = msd_smem();
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, K = x->cfg.top_k;
  int n_rows = msd_n_rows(x);
  int r = *cursor + tid, flag = 0;
  if (r < n_rows && x->row_slot[r] >= 0) {
    const int32_t *ids = (const int32_t *)msd_buf_row(x, route_buf, 0, r);
    for (int j = 0; j < K; j++) flag |= ids[j] == e;
  }
  unsigned bal = __ballot_sync(0xffffffffu, flag);
  __syncthreads();  /* the previous chunk's rows have been read */
  if (lane == 0) sm->ival[32 + warp] = __popc(bal);
  __syncthreads();
  int off = 0, total = 0;
  for (int w = 0; w < MSD_WARPS; w++) {
    int n = sm->ival[32 + w];
    off += w < warp ? n : 0;
    total += n;
  }
  int idx = off + __popc(bal & ((1u << lane) - 1u));
  if (flag && idx < MSD_MAXB) sm->ival[idx] = r;
  if (flag && idx == MSD_MAXB - 1) sm->ival[48] = r + 1;
  __syncthreads();
  *cursor = total > MSD_MAXB ? sm->ival[48] : *cursor + MSD_THREADS;
  return total < MSD_MAXB ? total : MSD_MAXB;
}

/* ---- task bodies ---- */

static __device__ void msd_embed(const struct msd_ctx *x, const struct msd_class *k, const struct ms_task *t) {
  int r = t->tile[1], dim = x->cfg.dim;
  float *out = msd_buf_row(x, k->out, 0, r);
  const struct msd_weight *e = &k->w[0];
  int tok = msd_row_valid(x, r) ? x->row_token[r] : -1;
  if (tok < 0 || tok >= e->rows) {  /* padding (ops.c); a bad token reads nothing */
    for (int i = threadIdx.x; i < dim; i += MSD_THREADS) out[i] = 0.0f;
    return;
  }
  const void *row = msd_wrow(e, 0, tok);
  float scale = x->cfg.mc.embed_scale;  /* gemma: sqrt(dim) */
  for (int i = threadIdx.x; i < dim; i += MSD_THREADS) {
    float v = msd_load1(row, e->dtype, i);
    out[i] = scale > 0 ? v * scale : v;
  }
}

static __device__ void msd_rmsnorm(const struct msd_ctx *x, const struct msd_class *k, const struct ms_task *t) {
  int r = t->tile[1], n = x->buf_cols[k->out];
  const float *in = msd_buf_row(x, k->in, 0, r), *w = (const float *)k->w[0].data;
  float *out = msd_buf_row(x, k->out, 0, r);
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += MSD_THREADS) ss = fmaf(in[i], in[i], ss);
  ss = msd_block_sum(ss);
  float inv = 1.0f / sqrtf(ss / (float)n + x->cfg.norm_eps);
  const float *res = k->in2 >= 0 ? msd_buf_row(x, k->in2, 0, r) : NULL;  /* a post-norm (gemma3) */
  for (int i = threadIdx.x; i < n; i += MSD_THREADS) {
    float v = in[i] * inv * __ldg(w + i);
    out[i] = res ? v + res[i] : v;
  }
}

/* The bias of column i of (q | k | v), whose parts start at 0, r0 and r1. */
static __device__ __forceinline__ float msd_qkv_bias(const struct msd_class *k, int i, int r0, int r1) {
  int m = i < r0 ? 0 : i < r1 ? 1 : 2;
  return __ldg((const float *)k->bias[m].data + (i - (m == 0 ? 0 : m == 1 ? r0 : r1)));
}

/* Output columns [c0, c1) of (q | k | v): two columns per warp; the q/k/v
 * biases (qwen2) added after each dot product, as ops.c's epilogue does. */
static __device__ void msd_qkv(const struct msd_ctx *x, const struct msd_class *k, const struct ms_task *t) {
  int c0, c1;
  msd_cols(k, t, &c0, &c1);
  int n = c1 - c0, ldo = x->buf_cols[k->out], r0 = k->w[0].rows, r1 = r0 + k->w[1].rows;
  float *out = msd_buf_row(x, k->out, 0, 0);
  msd_gemv_batch(
      x, msd_buf_row(x, k->in, 0, 0), x->buf_cols[k->in], k->w[0].dtype, k->w[0].cols, (n + 1) / 2,
      [&](int g, const void **wr) {
        for (int j = 0; j < 2; j++) {
          int i = c0 + (2 * g + j < n ? 2 * g + j : n - 1);
          int m = i < r0 ? 0 : i < r1 ? 1 : 2, base = m == 0 ? 0 : m == 1 ? r0 : r1;
          wr[j] = msd_wrow(&k->w[m], 0, i - base);
        }
      },
      [&](int g, int b, float v0, float v1) {
        int i = c0 + 2 * g;
        float *o = out + (int64_t)b * ldo + i;
        o[0] = k->bias[0].data ? v0 + msd_qkv_bias(k, i, r0, r1) : v0;
        if (2 * g + 1 < n) o[1] = k->bias[0].data ? v1 + msd_qkv_bias(k, i + 1, r0, r1) : v1;
      });
}

/* q/k norm (qwen3, gemma3), RoPE (the layer's base) on the group's q heads and its k head, KV append: a
 * warp per head vector (the group's q heads, then k), rotated from shared memory. */
static __device__ void msd_rope(const struct msd_ctx *x, const struct msd_class *k, const struct ms_task *t) {
  const struct msd_cfg *c = &x->cfg;
  int r = t->tile[1], kh = t->tile[2], hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
  int nq = c->n_heads * hd, nkv = c->n_kv_heads * hd, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float *in = msd_buf_row(x, k->in, 0, r);
  float *qo = msd_buf_row(x, k->out, 0, r) + kh * group * hd;
  if (!msd_row_valid(x, r)) {
    for (int i = tid; i < group * hd; i += MSD_THREADS) qo[i] = 0.0f;
    return;
  }
  int pos = x->row_pos[r], qwen = c->qk_norm, neox = c->rope_style == MS_ROPE_NEOX;
  float *kd = msd_kv_at(x, x->k_pool, k->layer, r, pos), *vd = msd_kv_at(x, x->v_pool, k->layer, r, pos);
  float eps = c->norm_eps, base = ms_layer_rope_base(&c->mc, k->layer);
  float *wt = msd_smem()->big + warp * hd;  /* hd <= MSD_SMEM_FLOATS / MSD_WARPS */
  for (int v = warp; v <= group; v += MSD_WARPS) {
    const float *src = v < group ? in + (kh * group + v) * hd : in + nq + kh * hd;
    float *dst = v < group ? qo + v * hd : kd ? kd + kh * hd : NULL;
    if (!dst) continue;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) {
      float a = src[i];
      wt[i] = a;
      ss = fmaf(a, a, ss);
    }
    if (qwen) {
      const float *nw = (const float *)k->w[v < group ? 0 : 1].data;
      float inv = 1.0f / sqrtf(msd_warp_sum(ss) / (float)hd + eps);
      for (int i = lane; i < hd; i += 32) wt[i] = wt[i] * inv * __ldg(nw + i);
    }
    __syncwarp();
    for (int i = lane; i < hd / 2; i += 32) {
      /* powf as the CPU rounds it: through double, then to float */
      float f = (float)pow((double)base, (double)(-2.0f * (float)i / (float)hd));
      float theta = (float)pos * f, s, co;
      sincosf(theta, &s, &co);
      int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
      float va = wt[a], vb = wt[b];
      dst[a] = va * co - vb * s;
      dst[b] = va * s + vb * co;
    }
    __syncwarp();  /* wt is reused for this warp's next vector */
  }
  if (vd)
    for (int i = tid; i < hd; i += MSD_THREADS) vd[kh * hd + i] = in[nq + nkv + kh * hd + i];
}

/* Attention of heads [g0, g0 + ng) of the group against positions [p0, p0 + n)
 * (p0 > 0: a sliding window): scores in S (ng * n floats), q staged in shared memory. */
static __device__ void msd_attn_heads(const struct msd_ctx *x, const struct msd_class *k, int r, int kh,
                                      const float *q, float *out, int g0, int ng, int p0, int n, float *S) {
  struct msd_smem *sm = msd_smem();
  int hd = x->cfg.head_dim, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float scale = ms_attn_scale(&x->cfg.mc), *qs = sm->big;
  for (int i = tid; i < ng * hd; i += MSD_THREADS) qs[i] = q[g0 * hd + i];
  __syncthreads();
  /* scores: a warp per position, the k row read once for all ng heads */
  for (int p = warp; p < n; p += MSD_WARPS) {
    const float *kr = msd_kv_at(x, x->k_pool, k->layer, r, p0 + p);
    if (!kr) {  /* no page: the position does not count (never for a consistent table) */
      if (lane == 0)
        for (int g = 0; g < ng; g++) S[(int64_t)g * n + p] = -INFINITY;
      continue;
    }
    kr += kh * hd;
    for (int d0 = 0; d0 < hd; d0 += 256) {
      float kv[8];
#pragma unroll
      for (int j = 0; j < 8; j++) kv[j] = d0 + lane + 32 * j < hd ? kr[d0 + lane + 32 * j] : 0.0f;
      for (int g = 0; g < ng; g++) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
          if (d0 + lane + 32 * j < hd) s = fmaf(qs[g * hd + d0 + lane + 32 * j], kv[j], s);
        s = msd_warp_sum(s);
        if (lane == 0) S[(int64_t)g * n + p] = d0 ? S[(int64_t)g * n + p] + s : s;
      }
    }
    if (lane == 0)
      for (int g = 0; g < ng; g++) S[(int64_t)g * n + p] *= scale;
  }
  __syncthreads();
  /* softmax per head; each thread rewrites only the entries it reads */
  for (int g = 0; g < ng; g++) {
    float *sg = S + (int64_t)g * n, mx = -INFINITY, sum = 0.0f;
    for (int p = tid; p < n; p += MSD_THREADS) mx = fmaxf(mx, sg[p]);
    mx = msd_block_max(mx);
    for (int p = tid; p < n; p += MSD_THREADS) sum += (sg[p] = expf(sg[p] - mx));
    sum = msd_block_sum(sum);
    for (int p = tid; p < n; p += MSD_THREADS) sg[p] = sg[p] / sum;
  }
  __syncthreads();
  /* out[g][d] = sum_p S[g][p] v[p][d]: `parts` threads per output, partial sums in red */
  int no = ng * hd;
  if (no >= MSD_THREADS / 2) {
    for (int o = tid; o < no; o += MSD_THREADS) {
      int g = o / hd, d = o % hd;
      float acc = 0.0f;
      for (int p = 0; p < n; p++) {
        const float *vr = msd_kv_at(x, x->v_pool, k->layer, r, p0 + p);
        if (vr) acc = fmaf(S[(int64_t)g * n + p], vr[kh * hd + d], acc);
      }
      out[(g0 + g) * hd + d] = acc;
    }
  } else {
    int parts = MSD_THREADS / no, part = tid / no, o = tid % no, g = o / hd, d = o % hd;
    float acc = 0.0f;
    if (part < parts)
      for (int p = part; p < n; p += parts) {
        const float *vr = msd_kv_at(x, x->v_pool, k->layer, r, p0 + p);
        if (vr) acc = fmaf(S[(int64_t)g * n + p], vr[kh * hd + d], acc);
      }
    if (part < parts) sm->red[part * no + o] = acc;
    __syncthreads();
    if (tid < no) {
      float s = 0.0f;
      for (int j = 0; j < parts; j++) s += sm->red[j * no + tid];
      out[(g0 + g) * hd + d] = s;
    }
  }
  __syncthreads();  /* qs, S and red are reused by the next heads */
}

/* Paged attention of one row for the q heads sharing kv head kh. */
static __device__ void msd_attn(const struct msd_ctx *x, const struct msd_class *k, const struct ms_task *t,
                                int cta) {
  const struct msd_cfg *c = &x->cfg;
  int r = t->tile[1], kh = t->tile[2], hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
  float *out = msd_buf_row(x, k->out, 0, r) + kh * group * hd;
  if (!msd_row_valid(x, r)) {
    for (int i = threadIdx.x; i < group * hd; i += MSD_THREADS) out[i] = 0.0f;
    return;
  }
  const float *q = msd_buf_row(x, k->in, 0, r) + kh * group * hd;
  int n = x->row_pos[r] + 1, cap = x->max_pages * x->page_size;
  if (n > cap) n = cap;            /* positions without a page: never written */
  if (n > x->max_ctx) n = x->max_ctx;
  if (n < 1) return;
  int p0 = ms_layer_attn_first(&c->mc, k->layer, n);
  n -= p0;                         /* a local layer: the last `window` positions */
  int qlen = (group * hd + 3) & ~3;
  if (qlen + group * n <= MSD_SMEM_FLOATS) {
    msd_attn_heads(x, k, r, kh, q, out, 0, group, p0, n, msd_smem()->big + qlen);
  } else {  /* long context: one head at a time, scores in this CTA's scratch */
    float *S = x->scratch + (int64_t)cta * x->max_ctx;
    for (int g = 0; g < group; g++) msd_attn_heads(x, k, r, kh, q, out, g, 1, p0, n, S);
  }
}

static __device__ __forceinline__ float msd_silu(float v) { return v / (1.0f + expf(-v)); }

/* GELU, tanh approximation (ggml_gelu; ops.c's gelu_tanh) */
static __device__ __forceinline__ float msd_gelu_tanh(float v) {
  return 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
}

/* out[:, c0:c1] = W[c0:c1] . in (+ residual[:, c0:c1]) for wo, down and lm_head
 * (its logits capped as cap * tanh(v / cap) when the model has a cap: gemma). */
static __device__ void msd_gemv_residual(const struct msd_ctx *x, const struct msd_class *k,
                                         const struct ms_task *t) {
  int c0, c1;
  msd_cols(k, t, &c0, &c1);
  int n = c1 - c0, ldo = x->buf_cols[k->out];
  float *out = msd_buf_row(x, k->out, 0, 0);
  const float *res = k->in2 >= 0 ? msd_buf_row(x, k->in2, 0, 0) : NULL;
  int ldr = k->in2 >= 0 ? x->buf_cols[k->in2] : 0;
  const struct msd_weight *w = &k->w[0];
  float cap = k->kernel == MS_K_LM_HEAD ? x->cfg.mc.final_softcap : 0.0f;
  msd_gemv_batch(
      x, msd_buf_row(x, k->in, 0, 0), x->buf_cols[k->in], w->dtype, w->cols, (n + 1) / 2,
      [&](int g, const void **wr) {
        wr[0] = msd_wrow(w, 0, c0 + 2 * g);
        wr[1] = msd_wrow(w, 0, c0 + (2 * g + 1 < n ? 2 * g + 1 : 2 * g));
      },
      [&](int g, int b, float v0, float v1) {
        int i = c0 + 2 * g;
        if (cap > 0) v0 = cap * tanhf(v0 / cap), v1 = cap * tanhf(v1 / cap);
        float *o = out + (int64_t)b * ldo + i;
        const float *rs = res ? res + (int64_t)b * ldr + i : NULL;
        o[0] = rs ? v0 + rs[0] : v0;
        if (2 * g + 1 < n) o[1] = rs ? v1 + rs[1] : v1;
      });
}

/* h[:, c0:c1] = act(Wg x) * (Wu x), act SiLU (SwiGLU) or GELU (GeGLU): the gate
 * and up rows of a column share a warp. */
static __device__ void msd_swiglu(const struct msd_ctx *x, const struct msd_class *k, const struct ms_task *t) {
  int c0, c1;
  msd_cols(k, t, &c0, &c1);
  int ldo = x->buf_cols[k->out];
  float *out = msd_buf_row(x, k->out, 0, 0);
  const struct msd_weight *wg = &k->w[0], *wu = &k->w[1];
  int gelu = x->cfg.mc.ffn_act == MS_ACT_GELU_TANH;
  msd_gemv_batch(
      x, msd_buf_row(x, k->in, 0, 0), x->buf_cols[k->in], wg->dtype, wg->cols, c1 - c0,
      [&](int g, const void **wr) {
        wr[0] = msd_wrow(wg, 0, c0 + g);
        wr[1] = msd_wrow(wu, 0, c0 + g);
      },
      [&](int g, int b, float v0, float v1) {
        out[(int64_t)b * ldo + c0 + g] = (gelu ? msd_gelu_tanh(v0) : msd_silu(v0)) * v1;
      });
}

/* Top-k experts by logit (lowest index on ties), weights softmax-normalised over
 * the chosen; route row = [k ids as int32 | k weights]. Every row, as ops.c. */
static __device__ void msd_router(const struct msd_ctx *x, const struct msd_class *k, const struct ms_task *t) {
  struct msd_smem *sm = msd_smem();
  int r = t->tile[1], E = x->cfg.n_experts, K = x->cfg.top_k, lane = threadIdx.x & 31;
  if (E > MSD_MAX_EXPERTS || K > MSD_MAX_TOPK || K > E) return;  /* refused by msd_upload */
  float *route = msd_buf_row(x, k->out, 0, r), *lg = sm->red;
  int32_t *ids = (int32_t *)route;
  const struct msd_weight *w = &k->w[0];
  const float *xr[MSD_MAXB];
#pragma unroll
  for (int b = 0; b < MSD_MAXB; b++) xr[b] = msd_buf_row(x, k->in, 0, r);
  msd_gemv_pass(
      w->dtype, w->cols, (E + 1) / 2, xr, 1,
      [&](int g, const void **wr) {
        wr[0] = msd_wrow(w, 0, 2 * g);
        wr[1] = msd_wrow(w, 0, 2 * g + 1 < E ? 2 * g + 1 : 2 * g);
      },
      [&](int g, int b, float v0, float v1) {
        lg[2 * g] = v0;
        if (2 * g + 1 < E) lg[2 * g + 1] = v1;
      });  /* ends with a barrier: lg is complete */
  if (threadIdx.x < 32) {
    unsigned used = 0;  /* bit j: expert lane + 32 j chosen (E <= 256) */
    int *sid = sm->ival;
    for (int j = 0; j < K; j++) {
      int bi = -1;
      float bv = 0.0f;
      for (int e = lane, q = 0; e < E; e += 32, q++)
        if (!(used >> q & 1u) && (bi < 0 || lg[e] > bv)) bi = e, bv = lg[e];
      for (int o = 16; o > 0; o >>= 1) {
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bi = oi, bv = ov;
      }
      if (bi >= 0 && (bi & 31) == lane) used |= 1u << (bi >> 5);
      if (lane == 0) sid[j] = bi, ids[j] = bi;
    }
    __syncwarp();
    if (lane == 0) {
      float sum = 0.0f;
      for (int j = 0; j < K; j++) sum += (route[K + j] = expf(lg[sid[j]] - lg[sid[0]]));
      for (int j = 0; j < K; j++) route[K + j] /= sum;
    }
  }
}

/* One expert's gate/up tile over the rows routed to it (plane e of the output). */
static __device__ void msd_expert_up(const struct msd_ctx *x, const struct msd_class *k, const struct ms_task *t) {
  int c0, c1, e = t->tile[2], cursor = 0;
  msd_cols(k, t, &c0, &c1);
  const struct msd_weight *wg = &k->w[0], *wu = &k->w[1];
  int n_rows = msd_n_rows(x), *rows = msd_smem()->ival;
  while (cursor < n_rows) {
    int nb = msd_routed_next(x, k->in2, e, &cursor);
    if (!nb) continue;
    const float *xr[MSD_MAXB];
#pragma unroll
    for (int b = 0; b < MSD_MAXB; b++) xr[b] = msd_buf_row(x, k->in, 0, rows[b < nb ? b : 0]);
    msd_gemv_pass(
        wg->dtype, wg->cols, c1 - c0, xr, nb,
        [&](int g, const void **wr) {
          wr[0] = msd_wrow(wg, e, c0 + g);
          wr[1] = msd_wrow(wu, e, c0 + g);
        },
        [&](int g, int b, float v0, float v1) {
          msd_buf_row(x, k->out, e, rows[b])[c0 + g] = msd_silu(v0) * v1;
        });
  }
}

static __device__ void msd_expert_down(const struct msd_ctx *x, const struct msd_class *k,
                                       const struct ms_task *t) {
  int c0, c1, e = t->tile[2], cursor = 0;
  msd_cols(k, t, &c0, &c1);
  int n = c1 - c0;
  const struct msd_weight *w = &k->w[0];
  int n_rows = msd_n_rows(x), *rows = msd_smem()->ival;
  while (cursor < n_rows) {
    int nb = msd_routed_next(x, k->in2, e, &cursor);
    if (!nb) continue;
    const float *xr[MSD_MAXB];
#pragma unroll
    for (int b = 0; b < MSD_MAXB; b++) xr[b] = msd_buf_row(x, k->in, e, rows[b < nb ? b : 0]);
    msd_gemv_pass(
        w->dtype, w->cols, (n + 1) / 2, xr, nb,
        [&](int g, const void **wr) {
          wr[0] = msd_wrow(w, e, c0 + 2 * g);
          wr[1] = msd_wrow(w, e, c0 + (2 * g + 1 < n ? 2 * g + 1 : 2 * g));
        },
        [&](int g, int b, float v0, float v1) {
          float *o = msd_buf_row(x, k->out, e, rows[b]) + c0 + 2 * g;
          o[0] = v0;
          if (2 * g + 1 < n) o[1] = v1;
        });
  }
}

/* out[:, c0:c1] = residual + sum_j w_j * expert_y[id_j] (padding rows: residual). */
static __device__ void msd_moe_combine(const struct msd_ctx *x, const struct msd_class *k,
                                       const struct ms_task *t) {
  int c0, c1, K = x->cfg.top_k, B = x->batch, E = x->cfg.n_experts;
  msd_cols(k, t, &c0, &c1);
  int n = c1 - c0;
  for (int idx = threadIdx.x; idx < B * n; idx += MSD_THREADS) {
    int r = idx / n, i = c0 + idx % n;
    float v = msd_buf_row(x, k->in2, 0, r)[i];
    if (msd_row_valid(x, r)) {
      const float *route = msd_buf_row(x, k->aux, 0, r);
      const int32_t *ids = (const int32_t *)route;
      for (int j = 0; j < K; j++)
        if (ids[j] >= 0 && ids[j] < E) v += route[K + j] * msd_buf_row(x, k->in, ids[j], r)[i];
    }
    msd_buf_row(x, k->out, 0, r)[i] = v;
  }
}

/* ---- sampling ------------------------------------------------------------
 * Greedy is the argmax (lowest id on ties), as everywhere. Fed mode draws too:
 * megascope/sample.h's draw (src/model/sample.c) for a row, token for token:
 * the same weights w = expf((logit - max) / T), the same order (w descending,
 * ids ascending on ties), the same filters (top-k; top-p with its cut;
 * min-p), the same uniform number (splitmix64 of seed and draw number).
 * Instead of a sort, each decision is a select on that order (msd_select:
 * four radix passes over w's bits counting and summing per digit, then the
 * ties in id order), over weights kept in samp_w. The device's expf may
 * differ from the C library's by an ulp or two and its sums add in another
 * order, so a decision that two such numbers could make differently (a cut
 * or a draw within MSD_SAMPLE_EPS of an edge, a boundary between near-equal
 * weights of different logits) gives the row back to the host: -1 as its
 * token, its logits copied, and the host draws it as the CPU engine does. */

#define MSD_SAMPLE_EPS 1e-6  /* relative; expf's 2 ulp and the sums' order are well inside */

#ifdef MSD_HOST_EMU
/* tests: an expf that differs from the C library's, as the device's may
 * (msd_emu_exp_skew 0: the same) */
inline float msd_emu_exp_skew;
static inline float msd_expf(float x) {
  float y = expf(x);
  if (msd_emu_exp_skew != 0.0f && (__float_as_uint(y) & 1)) y *= 1.0f + msd_emu_exp_skew;
  return y;
}
#else
static __device__ __forceinline__ float msd_expf(float x) { return expf(x); }
#endif

static __device__ uint64_t msd_splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* ms_sample_uniform (src/model/sample.c): integers, then one exact scaling. */
static __device__ double msd_uniform(uint64_t seed, uint64_t counter) {
  uint64_t r = msd_splitmix64(msd_splitmix64(seed) ^ msd_splitmix64(counter ^ 0x5851f42d4c957f2dull));
  return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

/* The sampler's shared memory, in msd_smem.big: per-digit counts and sums,
 * a reduction area, the results thread 0 hands to the others. */
struct msd_samp_smem {
  int cnt[256];
  double sum[256], red[MSD_THREADS];
  int wcnt[MSD_WARPS];
  int pick, found;
  uint32_t prefix;
  double acc;
  int acc_n;
};

static __device__ __forceinline__ struct msd_samp_smem *msd_samp_smem(void) {
  return (struct msd_samp_smem *)msd_smem()->big;
}

/* Sum over the CTA in double, in one fixed tree (every thread gets it). */
static __device__ double msd_block_sum_d(double v) {
  double *red = msd_samp_smem()->red;
  const int tid = threadIdx.x;
  __syncthreads();  /* red may still be read by the previous reduction */
  red[tid] = v;
  __syncthreads();
  for (int o = MSD_THREADS / 2; o > 0; o >>= 1) {
    if (tid < o) red[tid] += red[tid + o];
    __syncthreads();
  }
  return red[0];
}

/* A position of the order (w descending, ids ascending). */
struct msd_sel {
  int id;          /* the element there; -1: past the end */
  int rank;        /* the position */
  float w;
  double before;   /* the sum of w over the positions before it */
};

enum { MSD_SEL_RANK, MSD_SEL_GE, MSD_SEL_GT };

/* Whether the running sum s, with bin (or element) weight x added, reaches
 * the target: RANK counts, GE is "cum >= target" (top-p's nucleus), GT is
 * "cum > target" (the draw). */
static __device__ __forceinline__ int msd_sel_reaches(int mode, double acc, double x, int acc_n, int n, double target) {
  return mode == MSD_SEL_RANK ? acc_n + n > (int)target : mode == MSD_SEL_GE ? acc + x >= target : acc + x > target;
}

/* The position of the order that mode and target name (RANK: position
 * target; GE, GT: the first whose running sum, itself included, reaches
 * target). All threads call; all get *out. */
static __device__ void msd_select(const float *w, int V, int mode, double target, struct msd_sel *out) {
  struct msd_samp_smem *ss = msd_samp_smem();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) ss->prefix = 0, ss->acc = 0, ss->acc_n = 0, ss->pick = 0;
  for (int pass = 0; pass < 4; pass++) {
    const int shift = 24 - 8 * pass;
    const uint32_t hi = pass ? ~0u << (shift + 8) : 0;
    __syncthreads();
    for (int d = tid; d < 256; d += MSD_THREADS) ss->cnt[d] = 0, ss->sum[d] = 0;
    __syncthreads();
    const uint32_t want = ss->prefix;
    for (int i = tid; i < V; i += MSD_THREADS) {
      uint32_t key = __float_as_uint(w[i]);
      if ((key & hi) != want) continue;
      int d = (int)(key >> shift) & 255;
      atomicAdd(&ss->cnt[d], 1);
      atomicAdd(&ss->sum[d], (double)w[i]);
    }
    __syncthreads();
    if (tid == 0 && ss->pick >= 0) {
      int d = 255;
      for (; d >= 0; d--) {
        if (msd_sel_reaches(mode, ss->acc, ss->sum[d], ss->acc_n, ss->cnt[d], target)) break;
        ss->acc += ss->sum[d];
        ss->acc_n += ss->cnt[d];
      }
      ss->pick = d;  /* -1: past the end */
      if (d >= 0) ss->prefix = want | ((uint32_t)d << shift);
    }
  }
  __syncthreads();
  if (ss->pick < 0) {
    out->id = -1, out->rank = ss->acc_n, out->w = 0, out->before = ss->acc;
    return;
  }
  /* the ties of the exact weight W, in id order: the j-th of them */
  const uint32_t W = ss->prefix;
  const float wf = __uint_as_float(W);
  const double acc = ss->acc;
  const int acc_n = ss->acc_n, n_ties = ss->cnt[W & 255];
  int j = mode == MSD_SEL_RANK ? (int)target - acc_n
          : mode == MSD_SEL_GE  ? (int)ceil((target - acc) / (double)wf) - 1
                                : (int)floor((target - acc) / (double)wf);
  j = j < 0 ? 0 : j >= n_ties ? n_ties - 1 : j;
  if (tid == 0) ss->found = -1;
  int running = 0;
  for (int base = 0; base < V; base += MSD_THREADS) {
    int i = base + tid, is = i < V && __float_as_uint(w[i]) == W;
    unsigned b = __ballot_sync(0xffffffffu, is);
    if (lane == 0) ss->wcnt[warp] = __popc(b);
    __syncthreads();
    int before = running, total = 0;
    for (int k = 0; k < MSD_WARPS; k++) {
      if (k < warp) before += ss->wcnt[k];
      total += ss->wcnt[k];
    }
    if (is && before + __popc(b & ((1u << lane) - 1u)) == j) ss->found = i;
    __syncthreads();
    if (ss->found >= 0) break;
    running += total;
  }
  out->id = ss->found;
  out->rank = acc_n + j;
  out->w = wf;
  out->before = acc + (double)j * wf;
}

/* Whether some weight within MSD_SAMPLE_EPS of element e's comes from a
 * different logit: the device and the C library may order the two
 * differently. All threads call. */
static __device__ int msd_near_tie(const float *lg, const float *w, int V, int e) {
  if (e < 0) return 0;
  const float le = lg[e], we = w[e];
  double n = 0;
  for (int i = threadIdx.x; i < V; i += MSD_THREADS)
    n += lg[i] != le && fabs((double)w[i] - (double)we) <= MSD_SAMPLE_EPS * (double)we;
  return msd_block_sum_d(n) > 0;
}

/* How many weights are at least c, and whether one lies within EPS of c. */
static __device__ int msd_count_at_least(const float *w, int V, double c, int *near) {
  double n = 0, m = 0;
  for (int i = threadIdx.x; i < V; i += MSD_THREADS) {
    n += w[i] >= c;
    m += fabs((double)w[i] - c) <= MSD_SAMPLE_EPS * c;
  }
  n = msd_block_sum_d(n);
  *near |= msd_block_sum_d(m) > 0;
  return (int)n;
}

/* Whether target lies within EPS x scale of either edge of position s. */
static __device__ __forceinline__ int msd_near_edge(const struct msd_sel *s, double target, double scale) {
  double e = MSD_SAMPLE_EPS * scale;
  return fabs(s->before - target) <= e || fabs(s->before + (double)s->w - target) <= e;
}

/* The token of row r as ms_sample draws it (f: its parameters; mx its
 * largest logit), or -1 when a decision is too close to call. All threads. */
static __device__ int msd_draw(const struct msd_ctx *x, const float *lg, const struct msd_feed_row *f, int r,
                               float mx) {
  const int V = x->cfg.vocab;
  float *w = x->samp_w + (int64_t)r * V;
  const float inv_t = 1.0f / f->temperature;
  double z = 0;
  for (int i = threadIdx.x; i < V; i += MSD_THREADS) {
    w[i] = msd_expf((lg[i] - mx) * inv_t);
    z += w[i];
  }
  z = msd_block_sum_d(z);  /* also the barrier after the weights' writes */
  if (!(z > 0) || z != z || z > 1e300) return -1;
  const int top_p_on = f->top_p > 0.0f && f->top_p < 1.0f;
  int L = V, amb = 0;
  double zl = z;  /* what top-p's mass is of */
  struct msd_sel s;
  if (f->top_k > 0 && f->top_k < V) {
    msd_select(w, V, MSD_SEL_RANK, f->top_k, &s);  /* the first one out */
    amb |= msd_near_tie(lg, w, V, s.id);
    L = f->top_k;
    zl = s.before;
  } else if ((top_p_on || f->min_p > 0.0f) && V > 1) {
    double cut = top_p_on ? (1.0 - f->top_p) / (V - 1) * z : 0.0;
    if (f->min_p > 0.0f && f->min_p > cut) cut = f->min_p;
    L = msd_count_at_least(w, V, cut, &amb);
  }
  if (top_p_on) {
    double want = f->top_p * zl;
    msd_select(w, V, MSD_SEL_GE, want, &s);
    amb |= msd_near_edge(&s, want, zl) || msd_near_tie(lg, w, V, s.id);
    int keep = s.id < 0 ? V : s.rank + 1;
    if (keep < L) L = keep;
  }
  if (f->min_p > 0.0f && L > 1) {  /* the most probable weighs expf(0) = 1: the floor is min_p */
    int m = msd_count_at_least(w, V, (double)f->min_p, &amb);
    if (m < L) L = m > 1 ? m : 1;
  }
  double mass = z;
  if (L < V) {
    msd_select(w, V, MSD_SEL_RANK, L, &s);
    mass = s.before;
  }
  double u = msd_uniform(f->seed, f->draw) * mass;
  msd_select(w, V, MSD_SEL_GT, u, &s);
  amb |= s.id < 0 || s.rank >= L || msd_near_edge(&s, u, mass) || msd_near_tie(lg, w, V, s.id);
  return amb ? -1 : s.id;
}

/* The sample task of row r: the argmax (lowest index on ties); fed mode draws
 * with the row's parameters instead, and copies the logits of a row whose
 * token is the host's (-1) to logits_out. The kernel's own requests
 * (feed_rows NULL) get the argmax, and every row's logits when logits_out is
 * set. Padding rows get -1. */
static __device__ void msd_sample(const struct msd_ctx *x, const struct msd_class *k, const struct ms_task *t) {
  struct msd_smem *sm = msd_smem();
  int r = t->tile[1], V = x->cfg.vocab, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (!msd_row_valid(x, r)) {
    if (tid == 0) x->sampled[r] = -1;
    return;
  }
  const float *lg = msd_buf_row(x, k->in, 0, r);
  const struct msd_feed_row *f = x->feed_rows ? &x->feed_rows[r] : NULL;
  float *copy = x->logits_out && !f ? x->logits_out + (int64_t)r * V : NULL;
  int bi = -1;
  float bv = 0.0f;
  for (int i = tid; i < V; i += MSD_THREADS) {
    float v = lg[i];
    if (copy) copy[i] = v;
    if (bi < 0 || v > bv) bi = i, bv = v;
  }
  for (int o = 16; o > 0; o >>= 1) {
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bi = oi, bv = ov;
  }
  __syncthreads();  /* ival and red may still be read by the previous body */
  if (lane == 0) sm->ival[32 + warp] = bi, sm->red[warp] = bv;
  __syncthreads();
  bi = sm->ival[32], bv = sm->red[0];
  for (int w = 1; w < MSD_WARPS; w++) {
    int oi = sm->ival[32 + w];
    float ov = sm->red[w];
    if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bi = oi, bv = ov;
  }
  int tok = bi;
  if (f && (f->flags & MSD_ROW_HOST))
    tok = -1;
  else if (f && f->temperature > 0.0f)
    tok = msd_draw(x, lg, f, r, bv);
  if (tok < 0 && f && x->logits_out) {
    float *dst = x->logits_out + (int64_t)r * V;
    for (int i = tid; i < V; i += MSD_THREADS) dst[i] = lg[i];
  }
  if (tid == 0) x->sampled[r] = tok;
}

/* ---- entry points ---- */

/* Runs task t (any kernel; step start, empty and comm do nothing here) on the
 * calling CTA; cta indexes the attention scratch. All MSD_THREADS threads call;
 * returns after a barrier. */
static __device__ void msd_task_run(const struct msd_ctx *x, int t, int cta) {
  const struct ms_task *tk = &x->tasks[t];
  const struct msd_class *k = &x->classes[tk->cls];
  switch (tk->kernel) {
  case MS_K_EMBED: msd_embed(x, k, tk); break;
  case MS_K_RMSNORM: msd_rmsnorm(x, k, tk); break;
  case MS_K_QKV: msd_qkv(x, k, tk); break;
  case MS_K_ROPE: msd_rope(x, k, tk); break;
  case MS_K_ATTN: msd_attn(x, k, tk, cta); break;
  case MS_K_WO:
  case MS_K_DOWN:
  case MS_K_LM_HEAD: msd_gemv_residual(x, k, tk); break;
  case MS_K_SWIGLU: msd_swiglu(x, k, tk); break;
  case MS_K_ROUTER: msd_router(x, k, tk); break;
  case MS_K_EXPERT_UP: msd_expert_up(x, k, tk); break;
  case MS_K_EXPERT_DOWN: msd_expert_down(x, k, tk); break;
  case MS_K_MOE_COMBINE: msd_moe_combine(x, k, tk); break;
  case MS_K_SAMPLE: msd_sample(x, k, tk); break;
  default: break;  /* step start (the scheduler's), empty, comm */
  }
  __syncthreads();
}

/* Asks L2 for [p, p + bytes): bulk prefetches of up to 16 KiB spread over the
 * calling threads (sm_90), else one prefetch per 128-byte line. The range is
 * widened to 16 bytes; msd_upload pads the weight arena for that. */
static __device__ __forceinline__ void msd_prefetch_range(const void *p, int64_t bytes, int tid, int nthreads) {
  if (!p || bytes <= 0) return;
  uint64_t a = (uint64_t)__cvta_generic_to_global(p);
#if defined(MSD_HOST_EMU)  /* on the CPU (tests/emu/cta_emu.h): no cache to warm; the test checks the range */
  (void)tid, (void)nthreads;
  msd_emu_prefetch((uintptr_t)a, bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t lo = a & ~(uint64_t)15, hi = (a + (uint64_t)bytes + 15) & ~(uint64_t)15;
  for (uint64_t c = lo + (uint64_t)tid * 16384; c < hi; c += (uint64_t)nthreads * 16384) {
    uint32_t n = (uint32_t)(hi - c < 16384 ? hi - c : 16384);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(c), "r"(n) : "memory");
  }
#else
  uint64_t lo = a & ~(uint64_t)127, hi = a + (uint64_t)bytes;
  for (uint64_t c = lo + (uint64_t)tid * 128; c < hi; c += (uint64_t)nthreads * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c));
#endif
}

static __device__ __forceinline__ void msd_prefetch_rows(const struct msd_weight *w, int plane, int r0, int r1,
                                                         int tid, int nthreads) {
  if (!w->data || r1 <= r0) return;
  msd_prefetch_range(msd_wrow(w, plane, r0), (int64_t)(r1 - r0) * w->cols * msd_dtype_bytes(w->dtype), tid,
                     nthreads);
}

/* Warms L2 with the weight rows task t will read (nothing for tasks without
 * weights). Cheap; any subset of a CTA's threads may call, tid in [0, nthreads). */
static __device__ void msd_task_prefetch(const struct msd_ctx *x, int t, int tid, int nthreads) {
  if (t < 0 || t >= x->n_tasks || nthreads <= 0) return;
  const struct ms_task *tk = &x->tasks[t];
  const struct msd_class *k = &x->classes[tk->cls];
  int c0, c1;
  msd_cols(k, tk, &c0, &c1);
  switch (tk->kernel) {
  case MS_K_RMSNORM: msd_prefetch_rows(&k->w[0], 0, 0, 1, tid, nthreads); break;
  case MS_K_QKV:
    for (int m = 0, base = 0; m < 3; base += k->w[m].rows, m++) {
      int lo = c0 > base ? c0 : base, hi = c1 < base + k->w[m].rows ? c1 : base + k->w[m].rows;
      msd_prefetch_rows(&k->w[m], 0, lo - base, hi - base, tid, nthreads);
    }
    break;
  case MS_K_WO:
  case MS_K_DOWN:
  case MS_K_LM_HEAD: msd_prefetch_rows(&k->w[0], 0, c0, c1, tid, nthreads); break;
  case MS_K_SWIGLU:
    msd_prefetch_rows(&k->w[0], 0, c0, c1, tid, nthreads);
    msd_prefetch_rows(&k->w[1], 0, c0, c1, tid, nthreads);
    break;
  case MS_K_ROUTER: msd_prefetch_rows(&k->w[0], 0, 0, k->w[0].rows, tid, nthreads); break;
  case MS_K_EXPERT_UP:
    msd_prefetch_rows(&k->w[0], tk->tile[2], c0, c1, tid, nthreads);
    msd_prefetch_rows(&k->w[1], tk->tile[2], c0, c1, tid, nthreads);
    break;
  case MS_K_EXPERT_DOWN: msd_prefetch_rows(&k->w[0], tk->tile[2], c0, c1, tid, nthreads); break;
  default: break;
  }
}

#endif
