/* SPDX-License-Identifier: MIT */
/* The quantizers of the 32-element formats (the others' are quant_k.c's) and
 * the packed layout of the AVX-512 8-bit GEMV: see blocks.h. */
#include "model/blocks.h"
#include "model/quant_k.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "megascope/base.h"

#define QK 32

/* The CPU test of src/kernels/quant.c's packed paths: every packed form has
 * AVX-512 VNNI and AVX2 kernels. */
static int avx2_here(void) { return ms_cpu_level() >= MS_CPU_AVX2; }

static inline void wr16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static int packs(enum ms_dtype t) {
  return t == MS_DTYPE_Q8_0 || t == MS_DTYPE_Q4_0 || t == MS_DTYPE_Q4_1 || t == MS_DTYPE_Q5_0 || t == MS_DTYPE_Q5_1;
}

static int packs_k(enum ms_dtype t) { return t >= MS_DTYPE_Q2_K && t <= MS_DTYPE_Q6_K; }

/* The groups of w's packed form, [g0, g1); 0 when the range is not inside w's whole groups. */
static size_t groups_of(const struct ms_weight *w, size_t *g0) {
  int a, b;
  ms_quant_packed_groups(w, &a, &b);
  if (w->packed_g0 < 0 || w->packed_gn < 0 || a < 0 || b > w->rows / 4 || b <= a) return 0;
  *g0 = (size_t)a;
  return (size_t)(b - a);
}

size_t ms_quant_packed_bytes(const struct ms_weight *w) {
  enum ms_dtype t = w->dtype;
  size_t g0, G;
  if (!avx2_here() || !w->data || w->rows < 4 || !(G = groups_of(w, &g0))) return 0;
  if (packs_k(t))
    return w->cols % 256 ? 0 : G * (size_t)(w->cols / 256) * (size_t)(4 * (KP_QB(t) + KP_HB(t)) + KP_SB(t));
  if (!packs(t) || w->cols % (2 * QK)) return 0;
  return G * (size_t)(w->cols / (2 * QK)) * (size_t)(PK_QB(t) + PK_SB(t) + PK_HB(t));
}

/* The f16 scale (and minimum scale) of a K-quant super-block, as the file holds them. */
/* Element e (0..31) of a 4- or 5-bit block as its low nibble (the fifth bit apart). */
static uint8_t nib(enum ms_dtype t, const uint8_t *blk, int e) {
  const uint8_t *qs = blk + (t == MS_DTYPE_Q4_0 ? 2 : t == MS_DTYPE_Q4_1 ? 4 : t == MS_DTYPE_Q5_0 ? 6 : 8);
  return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
}

static const uint8_t *k_dbytes(enum ms_dtype t, const uint8_t *b) {
  return t == MS_DTYPE_Q2_K ? b + 80 : t == MS_DTYPE_Q3_K ? b + 108 : t == MS_DTYPE_Q6_K ? b + 208 : b;
}

/* The K-quants' packed form (blocks.h): each value as u = q + K_OFF, bits as the kernel takes them. */
static void repack_k(const struct ms_weight *w, uint8_t *out) {
  enum ms_dtype t = w->dtype;
  size_t g0 = 0, G = groups_of(w, &g0), nsb = (size_t)(w->cols / 256), rb = ms_weight_row_bytes(w);
  size_t qb = KP_QB(t), hb = KP_HB(t), sbb = KP_SB(t), ns = KP_NS(t);
  uint8_t *qr = out, *hr = qr + G * nsb * 4 * qb, *sr = hr + G * nsb * 4 * hb;
  memset(out, 0, G * nsb * (4 * (qb + hb) + sbb));
  for (size_t g = 0; g < G; g++)
    for (size_t s = 0; s < nsb; s++) {
      size_t at = g * nsb + s;
      uint8_t *sc = sr + at * sbb, *dr = sc + 4 * ns * (1 + (size_t)KP_MINS(t));
      for (size_t j = 0; j < 4; j++) {
        const uint8_t *row = (const uint8_t *)w->data + (4 * (g0 + g) + j) * rb, *b = row + s * ms_dtype_size(t);
        struct ms_qk_scales ks;
        ms_quant_k_scales(t, b, &ks);
        memcpy(dr + 2 * j, k_dbytes(t, b), 2);
        if (KP_KMIN(t)) memcpy(dr + 8 + 2 * j, k_dbytes(t, b) + 2, 2);
        for (size_t p = 0; p < 4; p++) {
          if (ns == 8)
            for (size_t c = 0; c < 2; c++) {  /* piece 2p + c: its scale is that of its halves */
              sc[8 * p + 2 * j + c] = (uint8_t)ks.sc[2 * (2 * p + c)];
              sc[32 + 8 * p + 2 * j + c] = (uint8_t)ks.mn[2 * (2 * p + c)];
            }
          else
            for (size_t h = 0; h < 4; h++)
              sc[16 * p + 4 * j + h] = t == MS_DTYPE_Q2_K ? b[4 * p + h] : (uint8_t)(int8_t)ks.sc[4 * p + h];
          uint8_t *qp = qr + (at * 4 + p) * qb, *hp = hr + (at * 4 + p) * hb;
          for (int c = 0; c < 2; c++) {
            struct ms_qk_piece pc;
            ms_quant_k_piece(t, row, (int)(8 * s + 2 * p) + c, &pc);
            for (int e = 0; e < QK; e++) {
              size_t k = (size_t)(QK * c + e);
              int u = pc.q[e] + K_OFF(t);
              if (qb == 128) {
                qp[(j / 2) * 64 + k] |= (uint8_t)((u & 15) << (4 * (j & 1)));
              } else {
                qp[k] |= (uint8_t)((u & 3) << (2 * j));
              }
              if (t == MS_DTYPE_Q5_K || t == MS_DTYPE_Q3_K) {
                if (u >> (t == MS_DTYPE_Q5_K ? 4 : 2) & 1) hp[8 * j + k / 8] |= (uint8_t)(1u << (k % 8));
              } else if (t == MS_DTYPE_Q6_K) {
                hp[k] |= (uint8_t)((u >> 4) << (2 * j));
              }
            }
          }
        }
      }
    }
}

void ms_quant_repack(const struct ms_weight *w, void *out) {
  enum ms_dtype t = w->dtype;
  if (packs_k(t)) {
    repack_k(w, out);
    return;
  }
  size_t g0 = 0, G = groups_of(w, &g0), np = (size_t)(w->cols / (2 * QK)), rb = ms_weight_row_bytes(w);
  size_t bs = ms_dtype_size(t), qb = PK_QB(t), sb = PK_SB(t), hb = PK_HB(t);
  uint8_t *q = out, *sc = q + G * np * qb, *hi = sc + G * np * sb;
  memset(hi, 0, G * np * hb);  /* the high bits are or-ed in; every other byte is written */
  for (size_t g = 0; g < G; g++)
    for (size_t p = 0; p < np; p += 2) {  /* a quad (pairs p, p + 1), or the last pair */
      size_t at = g * np + p, nk = p + 1 < np ? 4 : 2, vb = 16 * nk;  /* blocks; bytes a step */
      uint8_t *qq = q + at * qb, *ss = sc + at * sb, *hh = hi + at * hb;
      for (size_t j = 0; j < 4; j++)
        for (size_t k = 0; k < nk; k++) {
          size_t L = nk * j + k;  /* the lane: row j, block 2p + k */
          const uint8_t *blk = (const uint8_t *)w->data + (4 * (g0 + g) + j) * rb + (2 * p + k) * bs;
          memcpy(ss + 2 * L, blk, 2);                             /* d */
          if (sb == 32) memcpy(ss + 8 * nk + 2 * L, blk + 2, 2);  /* m, after the 4 nk d */
          uint32_t qh = 0;
          uint8_t u[QK];  /* the block's values as stored: Q8_0's + 128, or the low nibbles */
          if (hb) memcpy(&qh, blk + (t == MS_DTYPE_Q5_0 ? 2 : 4), 4);
          for (int e = 0; e < QK; e++) u[e] = t == MS_DTYPE_Q8_0 ? blk[2 + e] ^ 0x80 : nib(t, blk, e);
          for (size_t st = 0; st < 8; st++) {  /* step st: values 4 st .. 4 st + 3 at bytes 4L .. 4L + 3 */
            if (t == MS_DTYPE_Q8_0)
              memcpy(qq + st * vb + 4 * L, u + 4 * st, 4);
            else if (st < 4)  /* steps st and st + 4 in the low and the high nibbles */
              for (size_t e = 0; e < 4; e++)
                qq[st * vb + 4 * L + e] = (uint8_t)(u[4 * st + e] | u[4 * st + 16 + e] << 4);
            /* bits 4L .. 4L + 3 of step st's word: one nibble of byte L / 2 */
            if (hb) hh[st * (vb / 8) + L / 2] |= (uint8_t)(((qh >> (4 * st)) & 15) << (4 * (L & 1)));
          }
        }
    }
}

/* ---- quantizers (ggml's reference rounding) ---- */

static void quant_q8_0(const float *x, uint8_t *b) {
  float amax = 0.0f;
  for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
  float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  wr16(b, ms_f32_to_f16(d));
  for (int j = 0; j < QK; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static void quant_q4_0(const float *x, uint8_t *b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < QK; j++)
    if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
  float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  wr16(b, ms_f32_to_f16(d));
  for (int j = 0; j < QK / 2; j++) {
    int q0 = (int8_t)(x[j] * id + 8.5f), q1 = (int8_t)(x[j + QK / 2] * id + 8.5f);
    q0 = q0 < 15 ? q0 : 15;
    q1 = q1 < 15 ? q1 : 15;
    b[2 + j] = (uint8_t)(q0 | q1 << 4);
  }
}

static void quant_q4_1(const float *x, uint8_t *b) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < QK; j++) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  float d = (max - min) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  wr16(b, ms_f32_to_f16(d));
  wr16(b + 2, ms_f32_to_f16(min));
  for (int j = 0; j < QK / 2; j++) {
    int q0 = (int8_t)((x[j] - min) * id + 0.5f), q1 = (int8_t)((x[j + QK / 2] - min) * id + 0.5f);
    q0 = q0 < 15 ? q0 : 15;
    q1 = q1 < 15 ? q1 : 15;
    b[4 + j] = (uint8_t)(q0 | q1 << 4);
  }
}

int ms_quant_row(enum ms_dtype t, const float *x, int n, void *out) {
  uint8_t *o = out;
  int blk = ms_dtype_block(t);
  if (blk <= 0 || n < 0 || n % blk) return -EINVAL;
  size_t bs = ms_dtype_size(t);
  for (int i = 0; i < n / blk; i++, x += blk, o += bs) {
    switch (t) {
    case MS_DTYPE_F32: memcpy(o, x, sizeof(float)); break;
    case MS_DTYPE_BF16: wr16(o, ms_f32_to_bf16(*x)); break;
    case MS_DTYPE_F16: wr16(o, ms_f32_to_f16(*x)); break;
    case MS_DTYPE_Q8_0: quant_q8_0(x, o); break;
    case MS_DTYPE_Q4_0: quant_q4_0(x, o); break;
    case MS_DTYPE_Q4_1: quant_q4_1(x, o); break;
    default:
      if (!ms_quant_k_handles(t)) return -EINVAL;
      ms_quant_k_block(t, x, o);
      break;
    }
  }
  return 0;
}
