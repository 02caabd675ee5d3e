/* SPDX-License-Identifier: MIT */
/* The K-quants, Q5_0, Q5_1 and IQ4_NL: decoders, quantizers and the 8-bit
 * unpacking. See quant_k.h for the layouts.
 *
 * Within a super-block of 256, element e of the 2-, 3- and 6-bit formats lives
 * in half h = e / 128; r = e % 128 splits into group g = r / 32 and l = r % 32:
 *   Q2_K  q = qs[32 h + l] >> 2g & 3                       scale byte e / 16
 *   Q3_K  q = (qs[32 h + l] >> 2g & 3) - (hmask[l] >> (4h + g) & 1 ? 0 : 4)
 *   Q6_K  q = (ql[64 h + l + 32 (g & 1)] >> 4 (g >> 1) & 15 | (qh[32 h + l] >> 2g & 3) << 4) - 32
 * Q4_K and Q5_K hold 8 groups of 32: group s takes the low (s even) or high
 * nibbles of qs[32 (s / 2) + l], and Q5_K's fifth bit is bit s of qh[l]. Their
 * 6-bit scales and minimums are packed in 12 bytes (get_scale_min_k4 in ggml):
 *   s < 4:  sc = b[s] & 63,                           m = b[s + 4] & 63
 *   s >= 4: sc = b[s + 4] & 15 | (b[s - 4] >> 6) << 4, m = b[s + 4] >> 4 | (b[s] >> 6) << 4
 * Q3_K's sixteen 6-bit scales: low 4 bits from b[i] (i < 8) or b[i - 8] >> 4,
 * high 2 bits from b[8 + i % 4] >> 2 (i / 4). */
#include "model/quant_k.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define QK_K 256

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

int ms_quant_k_handles(enum ms_dtype t) { return t >= MS_DTYPE_Q5_0 && t <= MS_DTYPE_Q8_K; }

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline float h2f(const uint8_t *p) { return ms_f16_to_f32(rd16(p)); }

static inline void wr16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void scale_min_k4(const uint8_t *b, int s, int *sc, int *m) {
  if (s < 4) {
    *sc = b[s] & 63;
    *m = b[s + 4] & 63;
  } else {
    *sc = (b[s + 4] & 15) | (b[s - 4] >> 6) << 4;
    *m = (b[s + 4] >> 4) | (b[s] >> 6) << 4;
  }
}

static int scale_q3k(const uint8_t *b, int i) {
  int lo = i < 8 ? b[i] & 15 : b[i - 8] >> 4;
  return (lo | ((b[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32;
}

/* Q5_0 and Q5_1's 5-bit quants, 32 of them. */
static inline void q5_unpack(const uint8_t *qh, const uint8_t *qs, int *q) {
  uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
  for (int j = 0; j < 16; j++) {
    q[j] = (qs[j] & 15) | (int)(h >> j & 1) << 4;
    q[j + 16] = (qs[j] >> 4) | (int)(h >> (j + 16) & 1) << 4;
  }
}

/* 32 quants [32 s, 32 s + 32) of a K-quant super-block (s = 0..7), as the
 * formulas above, the group's loop-invariant parts taken out. */
static inline void q2k_unpack(const uint8_t *qs, int s, int *q) {
  const uint8_t *p = qs + 32 * (s / 4);
  int sh = 2 * (s % 4);
  for (int l = 0; l < 32; l++) q[l] = p[l] >> sh & 3;
}

static inline void q3k_unpack(const uint8_t *b, int s, int *q) {
  const uint8_t *p = b + 32 + 32 * (s / 4);
  int sh = 2 * (s % 4), hb = s;  /* bit 4h + g of hmask is bit s */
  for (int l = 0; l < 32; l++) q[l] = (p[l] >> sh & 3) - (b[l] >> hb & 1 ? 0 : 4);
}

static inline void q6k_unpack(const uint8_t *b, int s, int *q) {
  int h = s / 4, g = s % 4;
  const uint8_t *ql = b + 64 * h + 32 * (g & 1), *qh = b + 128 + 32 * h;
  int lsh = 4 * (g >> 1), hsh = 2 * g;
  for (int l = 0; l < 32; l++) q[l] = ((ql[l] >> lsh & 15) | (qh[l] >> hsh & 3) << 4) - 32;
}

static inline void q45k_unpack(const uint8_t *qs, const uint8_t *qh, int s, int *q) {
  const uint8_t *p = qs + 32 * (s / 2);
  int sh = 4 * (s & 1);
  for (int l = 0; l < 32; l++) q[l] = p[l] >> sh & 15;
  if (qh)
    for (int l = 0; l < 32; l++) q[l] |= (qh[l] >> s & 1) << 4;
}

void ms_quant_k_block_f32(enum ms_dtype t, const uint8_t *b, float *out) {
  int q[32];
  switch (t) {
  case MS_DTYPE_Q5_0: {
    float d = h2f(b);
    q5_unpack(b + 2, b + 6, q);
    for (int j = 0; j < 32; j++) out[j] = d * (float)(q[j] - 16);
    break;
  }
  case MS_DTYPE_Q5_1: {
    float d = h2f(b), m = h2f(b + 2);
    q5_unpack(b + 4, b + 8, q);
    for (int j = 0; j < 32; j++) out[j] = d * (float)q[j] + m;
    break;
  }
  case MS_DTYPE_IQ4_NL: {
    float d = h2f(b);
    for (int j = 0; j < 16; j++) {
      out[j] = d * (float)kvalues_iq4nl[b[2 + j] & 15];
      out[j + 16] = d * (float)kvalues_iq4nl[b[2 + j] >> 4];
    }
    break;
  }
  case MS_DTYPE_Q2_K: {
    float d = h2f(b + 80), dmin = h2f(b + 82);
    for (int s = 0; s < 8; s++, out += 32) {
      q2k_unpack(b + 16, s, q);
      for (int k = 0; k < 2; k++) {
        int sc = b[2 * s + k];
        float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
        for (int l = 16 * k; l < 16 * k + 16; l++) out[l] = dl * (float)q[l] - ml;
      }
    }
    break;
  }
  case MS_DTYPE_Q3_K: {
    float d = h2f(b + 108);
    for (int s = 0; s < 8; s++, out += 32) {
      q3k_unpack(b, s, q);
      for (int k = 0; k < 2; k++) {
        float dl = d * (float)scale_q3k(b + 96, 2 * s + k);
        for (int l = 16 * k; l < 16 * k + 16; l++) out[l] = dl * (float)q[l];
      }
    }
    break;
  }
  case MS_DTYPE_Q4_K:
  case MS_DTYPE_Q5_K: {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *qh = t == MS_DTYPE_Q5_K ? b + 16 : NULL, *qs = b + (qh ? 48 : 16);
    for (int s = 0; s < 8; s++, out += 32) {
      int sc, m;
      scale_min_k4(b + 4, s, &sc, &m);
      float d1 = d * (float)sc, m1 = dmin * (float)m;
      q45k_unpack(qs, qh, s, q);
      for (int l = 0; l < 32; l++) out[l] = d1 * (float)q[l] - m1;
    }
    break;
  }
  case MS_DTYPE_Q6_K: {
    float d = h2f(b + 208);
    for (int s = 0; s < 8; s++, out += 32) {
      q6k_unpack(b, s, q);
      for (int k = 0; k < 2; k++) {
        float dl = d * (float)(int8_t)b[192 + 2 * s + k];
        for (int l = 16 * k; l < 16 * k + 16; l++) out[l] = dl * (float)q[l];
      }
    }
    break;
  }
  case MS_DTYPE_Q8_K: {
    float d;
    memcpy(&d, b, 4);
    for (int e = 0; e < QK_K; e++) out[e] = d * (float)(int8_t)b[4 + e];
    break;
  }
  default:
    break;
  }
}

/* ---- the 8-bit unpacking ---- */

void ms_quant_k_scales(enum ms_dtype t, const uint8_t *b, struct ms_qk_scales *s) {
  for (int k = 0; k < 16; k++) s->sc[k] = 1, s->mn[k] = 0;
  s->dmin = 0.0f;
  switch (t) {
  case MS_DTYPE_Q2_K:
    s->d = h2f(b + 80), s->dmin = h2f(b + 82);
    for (int k = 0; k < 16; k++) s->sc[k] = b[k] & 15, s->mn[k] = b[k] >> 4;
    break;
  case MS_DTYPE_Q3_K:
    s->d = h2f(b + 108);
    for (int k = 0; k < 16; k++) s->sc[k] = (int16_t)scale_q3k(b + 96, k);
    break;
  case MS_DTYPE_Q4_K:
  case MS_DTYPE_Q5_K:
    s->d = h2f(b), s->dmin = h2f(b + 2);
    for (int g = 0; g < 8; g++) {
      int sc, m;
      scale_min_k4(b + 4, g, &sc, &m);
      s->sc[2 * g] = s->sc[2 * g + 1] = (int16_t)sc;
      s->mn[2 * g] = s->mn[2 * g + 1] = (int16_t)m;
    }
    break;
  case MS_DTYPE_Q6_K:
    s->d = h2f(b + 208);
    for (int k = 0; k < 16; k++) s->sc[k] = (int8_t)b[192 + k];
    break;
  default:  /* Q8_K */
    memcpy(&s->d, b, 4);
    break;
  }
}

void ms_quant_k_piece_scales(enum ms_dtype t, const uint8_t *row, int i, struct ms_qk_piece *p) {
  p->sc[0] = p->sc[1] = 1;
  p->mn[0] = p->mn[1] = 0;
  p->dmin = p->m = 0.0f;
  const uint8_t *b = row + (size_t)(i * 32 / ms_dtype_block(t)) * ms_dtype_size(t);
  int s = i % 8;  /* the piece's group of 32 within a super-block */
  switch (t) {
  case MS_DTYPE_Q5_0:
  case MS_DTYPE_IQ4_NL: p->d = h2f(b); break;
  case MS_DTYPE_Q5_1: p->d = h2f(b), p->m = h2f(b + 2); break;
  case MS_DTYPE_Q2_K:
    p->d = h2f(b + 80), p->dmin = h2f(b + 82);
    for (int k = 0; k < 2; k++) {
      p->sc[k] = b[2 * s + k] & 15;
      p->mn[k] = b[2 * s + k] >> 4;
    }
    break;
  case MS_DTYPE_Q3_K:
    p->d = h2f(b + 108);
    for (int k = 0; k < 2; k++) p->sc[k] = (int16_t)scale_q3k(b + 96, 2 * s + k);
    break;
  case MS_DTYPE_Q4_K:
  case MS_DTYPE_Q5_K: {
    int sc, m;
    scale_min_k4(b + 4, s, &sc, &m);
    p->d = h2f(b), p->dmin = h2f(b + 2);
    p->sc[0] = p->sc[1] = (int16_t)sc;
    p->mn[0] = p->mn[1] = (int16_t)m;
    break;
  }
  case MS_DTYPE_Q6_K:
    p->d = h2f(b + 208);
    for (int k = 0; k < 2; k++) p->sc[k] = (int8_t)b[192 + 2 * s + k];
    break;
  case MS_DTYPE_Q8_K: memcpy(&p->d, b, 4); break;
  default: break;
  }
}

void ms_quant_k_piece(enum ms_dtype t, const uint8_t *row, int i, struct ms_qk_piece *p) {
  ms_quant_k_piece_scales(t, row, i, p);
  const uint8_t *b = row + (size_t)(i * 32 / ms_dtype_block(t)) * ms_dtype_size(t);
  int s = i % 8, q[32];
  switch (t) {
  case MS_DTYPE_Q5_0:
  case MS_DTYPE_Q5_1: {
    int q51 = t == MS_DTYPE_Q5_1;
    q5_unpack(b + (q51 ? 4 : 2), b + (q51 ? 8 : 6), q);
    for (int j = 0; j < 32; j++) q[j] -= q51 ? 0 : 16;
    break;
  }
  case MS_DTYPE_IQ4_NL:
    for (int j = 0; j < 16; j++) {
      q[j] = kvalues_iq4nl[b[2 + j] & 15];
      q[j + 16] = kvalues_iq4nl[b[2 + j] >> 4];
    }
    break;
  case MS_DTYPE_Q2_K: q2k_unpack(b + 16, s, q); break;
  case MS_DTYPE_Q3_K: q3k_unpack(b, s, q); break;
  case MS_DTYPE_Q4_K:
  case MS_DTYPE_Q5_K: q45k_unpack(b + (t == MS_DTYPE_Q5_K ? 48 : 16), t == MS_DTYPE_Q5_K ? b + 16 : NULL, s, q); break;
  case MS_DTYPE_Q6_K: q6k_unpack(b, s, q); break;
  case MS_DTYPE_Q8_K:
    for (int j = 0; j < 32; j++) q[j] = (int8_t)b[4 + 32 * s + j];
    break;
  default: memset(q, 0, sizeof q); break;
  }
  for (int j = 0; j < 32; j++) p->q[j] = (int8_t)q[j];
}

/* ---- quantizers ---- */

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
static inline int nearest(float v) { return (int)lrintf(v); }

/* The element of largest magnitude (its sign kept), as ggml's quantizers pick it. */
static float signed_max(const float *x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; j++)
    if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
  return max;
}

/* ggml's quantize_row_q5_0_ref / q5_1_ref. */
static void quant_q5(enum ms_dtype t, const float *x, uint8_t *b) {
  int q51 = t == MS_DTYPE_Q5_1;
  float d, id, min = 0.0f;
  if (q51) {
    float max = -FLT_MAX;
    min = FLT_MAX;
    for (int j = 0; j < 32; j++) min = fminf(min, x[j]), max = fmaxf(max, x[j]);
    d = (max - min) / 31.0f;
  } else {
    d = signed_max(x, 32) / -16.0f;
  }
  id = d != 0.0f ? 1.0f / d : 0.0f;
  wr16(b, ms_f32_to_f16(d));
  if (q51) wr16(b + 2, ms_f32_to_f16(min));
  uint8_t *qh = b + (q51 ? 4 : 2), *qs = qh + 4;
  uint32_t h = 0;
  for (int j = 0; j < 16; j++) {
    float add = q51 ? 0.5f : 16.5f;
    int q0 = (int8_t)((x[j] - min) * id + add), q1 = (int8_t)((x[j + 16] - min) * id + add);
    q0 = q0 < 31 ? q0 : 31, q1 = q1 < 31 ? q1 : 31;
    qs[j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
    h |= (uint32_t)(q0 >> 4 & 1) << j | (uint32_t)(q1 >> 4 & 1) << (j + 16);
  }
  for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

static void quant_iq4nl(const float *x, uint8_t *b) {
  float d = signed_max(x, 32) / -127.0f;
  wr16(b, ms_f32_to_f16(d));
  float dd = h2f(b), id = dd != 0.0f ? 1.0f / dd : 0.0f;
  uint8_t q[32];
  for (int j = 0; j < 32; j++) {
    float v = x[j] * id, best = INFINITY;
    for (int k = 0; k < 16; k++)
      if (fabsf(v - kvalues_iq4nl[k]) < best) best = fabsf(v - kvalues_iq4nl[k]), q[j] = (uint8_t)k;
  }
  for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

/* Groups of `gs` with an unsigned quant 0..nmax, a scale and a minimum each:
 * x ~ d * sc * q - dmin * m. Writes the super-block d, dmin (as f16 into
 * *dh, *mh) and the integer scales and minimums (0..smax); returns through q. */
static void quant_affine(const float *x, int gs, int nmax, int smax, uint8_t *sc, uint8_t *mn, uint8_t *q,
                         uint8_t *dh, uint8_t *mh) {
  int ng = QK_K / gs;
  float scale[16], minv[16], maxs = 0.0f, maxm = 0.0f;
  for (int g = 0; g < ng; g++) {
    float lo = 0.0f, hi = -FLT_MAX;
    for (int j = 0; j < gs; j++) lo = fminf(lo, x[g * gs + j]), hi = fmaxf(hi, x[g * gs + j]);
    scale[g] = (hi - lo) / (float)nmax, minv[g] = -lo;
    maxs = fmaxf(maxs, scale[g]), maxm = fmaxf(maxm, minv[g]);
  }
  wr16(dh, ms_f32_to_f16(maxs / (float)smax));
  wr16(mh, ms_f32_to_f16(maxm / (float)smax));
  float d = h2f(dh), dmin = h2f(mh);
  for (int g = 0; g < ng; g++) {
    sc[g] = (uint8_t)(d > 0.0f ? clampi(nearest(scale[g] / d), 0, smax) : 0);
    mn[g] = (uint8_t)(dmin > 0.0f ? clampi(nearest(minv[g] / dmin), 0, smax) : 0);
    float ds = d * (float)sc[g], dm = dmin * (float)mn[g];
    for (int j = 0; j < gs; j++) q[g * gs + j] = (uint8_t)(ds > 0.0f ? clampi(nearest((x[g * gs + j] + dm) / ds), 0, nmax) : 0);
  }
}

/* Groups of 16 with a signed quant -qmax-1..qmax and a signed integer scale
 * -smax-1..smax: x ~ d * sc * q. */
static void quant_symmetric(const float *x, int qmax, int smax, int8_t *sc, int8_t *q, uint8_t *dh) {
  float scale[16], maxs = 0.0f;
  for (int g = 0; g < 16; g++) {
    scale[g] = signed_max(x + 16 * g, 16) / (float)-(qmax + 1);
    maxs = fmaxf(maxs, fabsf(scale[g]));
  }
  wr16(dh, ms_f32_to_f16(maxs / (float)smax));
  float d = h2f(dh);
  for (int g = 0; g < 16; g++) {
    sc[g] = (int8_t)(d > 0.0f ? clampi(nearest(scale[g] / d), -smax - 1, smax) : 0);
    float ds = d * (float)sc[g];
    for (int j = 0; j < 16; j++)
      q[16 * g + j] = (int8_t)(ds != 0.0f ? clampi(nearest(x[16 * g + j] / ds), -qmax - 1, qmax) : 0);
  }
}

static void quant_q45k(enum ms_dtype t, const float *x, uint8_t *b) {
  uint8_t sc[8], mn[8], q[QK_K];
  int q5 = t == MS_DTYPE_Q5_K;
  quant_affine(x, 32, q5 ? 31 : 15, 63, sc, mn, q, b, b + 2);
  uint8_t *s = b + 4, *qh = b + 16, *qs = b + (q5 ? 48 : 16);
  for (int j = 0; j < 4; j++) {
    s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
    s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
    s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
  }
  memset(qs, 0, 128);
  if (q5) memset(qh, 0, 32);
  for (int e = 0; e < QK_K; e++) {
    int sgrp = e / 32, l = e % 32;
    qs[32 * (sgrp / 2) + l] |= (uint8_t)((q[e] & 15) << (4 * (sgrp & 1)));
    if (q5) qh[l] |= (uint8_t)((q[e] >> 4) << sgrp);
  }
}

static void quant_q2k(const float *x, uint8_t *b) {
  uint8_t sc[16], mn[16], q[QK_K];
  quant_affine(x, 16, 3, 15, sc, mn, q, b + 80, b + 82);
  for (int g = 0; g < 16; g++) b[g] = (uint8_t)(sc[g] | mn[g] << 4);
  memset(b + 16, 0, 64);
  for (int e = 0; e < QK_K; e++) b[16 + 32 * (e / 128) + e % 32] |= (uint8_t)(q[e] << (2 * (e % 128 / 32)));
}

static void quant_q3k(const float *x, uint8_t *b) {
  int8_t sc[16], q[QK_K];
  quant_symmetric(x, 3, 31, sc, q, b + 108);
  memset(b, 0, 108);
  for (int i = 0; i < 16; i++) {
    int u = sc[i] + 32;
    b[96 + (i < 8 ? i : i - 8)] |= (uint8_t)((u & 15) << (i < 8 ? 0 : 4));
    b[96 + 8 + i % 4] |= (uint8_t)((u >> 4) << (2 * (i / 4)));
  }
  for (int e = 0; e < QK_K; e++) {
    int h = e / 128, g = e % 128 / 32, l = e % 32, u = q[e] + 4;  /* 0..7: bit 2 set means no offset */
    b[32 + 32 * h + l] |= (uint8_t)((u & 3) << (2 * g));
    b[l] |= (uint8_t)((u >> 2) << (4 * h + g));
  }
}

static void quant_q6k(const float *x, uint8_t *b) {
  int8_t sc[16], q[QK_K];
  quant_symmetric(x, 31, 127, sc, q, b + 208);
  memset(b, 0, 192);
  memcpy(b + 192, sc, 16);
  for (int e = 0; e < QK_K; e++) {
    int h = e / 128, g = e % 128 / 32, l = e % 32, u = q[e] + 32;
    b[64 * h + l + 32 * (g & 1)] |= (uint8_t)((u & 15) << (4 * (g >> 1)));
    b[128 + 32 * h + l] |= (uint8_t)((u >> 4) << (2 * g));
  }
}

/* ggml's quantize_row_q8_K_ref. */
static void quant_q8k(const float *x, uint8_t *b) {
  float max = signed_max(x, QK_K), d = 0.0f;
  int16_t bsums[16] = {0};
  if (max != 0.0f) {
    float iscale = -127.0f / max;
    for (int e = 0; e < QK_K; e++) {
      int v = nearest(iscale * x[e]);
      b[4 + e] = (uint8_t)(int8_t)(v < 127 ? v : 127);
      bsums[e / 16] = (int16_t)(bsums[e / 16] + (int8_t)b[4 + e]);
    }
    d = 1.0f / iscale;
  } else {
    memset(b + 4, 0, QK_K);
  }
  memcpy(b, &d, 4);
  for (int g = 0; g < 16; g++) wr16(b + 260 + 2 * g, (uint16_t)bsums[g]);
}

void ms_quant_k_block(enum ms_dtype t, const float *x, uint8_t *b) {
  switch (t) {
  case MS_DTYPE_Q5_0:
  case MS_DTYPE_Q5_1: quant_q5(t, x, b); break;
  case MS_DTYPE_IQ4_NL: quant_iq4nl(x, b); break;
  case MS_DTYPE_Q2_K: quant_q2k(x, b); break;
  case MS_DTYPE_Q3_K: quant_q3k(x, b); break;
  case MS_DTYPE_Q4_K:
  case MS_DTYPE_Q5_K: quant_q45k(t, x, b); break;
  case MS_DTYPE_Q6_K: quant_q6k(x, b); break;
  case MS_DTYPE_Q8_K: quant_q8k(x, b); break;
  default: break;
  }
}
