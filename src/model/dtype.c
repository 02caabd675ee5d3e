/* SPDX-License-Identifier: MIT */
/* The element types: each dtype's name, its bytes per element or per block and
 * its elements per block, and the half-precision conversions. Kept apart from
 * the models (model.c) and the block formats (blocks.c, quant_k.c), which all
 * read it, so that those files call down into this one and never back. */
#include "megascope/model.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>

static const struct {
  const char *name;
  size_t size;  /* bytes per element or per block */
  int block;    /* elements per block */
} dtypes[MS_DTYPE_COUNT] = {
    [MS_DTYPE_F32] = {"f32", 4, 1},    [MS_DTYPE_BF16] = {"bf16", 2, 1},
    [MS_DTYPE_F16] = {"f16", 2, 1},    [MS_DTYPE_Q8_0] = {"q8_0", 34, 32},
    [MS_DTYPE_Q4_0] = {"q4_0", 18, 32}, [MS_DTYPE_Q4_1] = {"q4_1", 20, 32},
    [MS_DTYPE_Q5_0] = {"q5_0", 22, 32}, [MS_DTYPE_Q5_1] = {"q5_1", 24, 32},
    [MS_DTYPE_IQ4_NL] = {"iq4_nl", 18, 32}, [MS_DTYPE_Q2_K] = {"q2_k", 84, 256},
    [MS_DTYPE_Q3_K] = {"q3_k", 110, 256}, [MS_DTYPE_Q4_K] = {"q4_k", 144, 256},
    [MS_DTYPE_Q5_K] = {"q5_k", 176, 256}, [MS_DTYPE_Q6_K] = {"q6_k", 210, 256},
    [MS_DTYPE_Q8_K] = {"q8_k", 292, 256},
};

const char *ms_dtype_name(enum ms_dtype t) {
  return (unsigned)t < MS_DTYPE_COUNT ? dtypes[t].name : "?";
}

int ms_dtype_parse(const char *s, enum ms_dtype *out) {
  for (int t = 0; t < MS_DTYPE_COUNT; t++)
    if (!strcasecmp(s, dtypes[t].name)) {  /* ggml writes "q4_K" */
      *out = (enum ms_dtype)t;
      return 0;
    }
  return -EINVAL;
}

size_t ms_dtype_size(enum ms_dtype t) { return (unsigned)t < MS_DTYPE_COUNT ? dtypes[t].size : 0; }

int ms_dtype_block(enum ms_dtype t) { return (unsigned)t < MS_DTYPE_COUNT ? dtypes[t].block : 0; }

size_t ms_dtype_row_bytes(enum ms_dtype t, int cols) {
  if ((unsigned)t >= MS_DTYPE_COUNT) return 0;
  size_t blk = (size_t)dtypes[t].block;
  return ((size_t)cols + blk - 1) / blk * dtypes[t].size;  /* a partial block counts whole */
}

size_t ms_weight_row_bytes(const struct ms_weight *w) { return ms_dtype_row_bytes(w->dtype, w->cols); }

float ms_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);            /* inf, NaN */
  } else if (exp) {
    u = sign | ((exp + 112) << 23) | (man << 13);    /* normal: rebias 15 -> 127 */
  } else if (man) {
    int e = -1;                                       /* subnormal: normalise */
    do {
      e++;
      man <<= 1;
    } while (!(man & 0x400u));
    u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  } else {
    u = sign;
  }
  union { uint32_t u; float f; } v = {.u = u};
  return v.f;
}

uint16_t ms_f32_to_f16(float f) {
  union { float f; uint32_t u; } v = {.f = f};
  uint32_t sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* rounds past 65504: inf */
  if (a >= 0x38800000u) {                                   /* normal half */
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);             /* round to nearest even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
  }
  if (a < 0x33000000u) return (uint16_t)sign;               /* below half the least subnormal */
  /* subnormal half: value = man * 2^-24; shift the implicit-one mantissa into place */
  uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;  /* 14..24 */
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return (uint16_t)(sign | q);
}
