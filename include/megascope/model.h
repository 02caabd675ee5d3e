/* SPDX-License-Identifier: MIT */
/* megascope models: configuration, weights, synthetic presets.
 *
 * A model is a Llama-family decoder: Llama-style blocks, Qwen2-style (biases on
 * q, k and v), Qwen3-style (per-head RMSNorm on q and k) or Gemma-3-style blocks
 * (q/k norm, RMSNorm of the attention and FFN outputs before each residual add,
 * GeGLU, scaled embeddings, sliding-window local layers between global ones),
 * with a dense gated FFN or a routed top-k MoE FFN. The architecture's features
 * are fields of the configuration, so the kernels test features, not names.
 * Weight matrices are row-major (rows = outputs, cols = inputs), so a GEMV tile is
 * a contiguous range of rows. Norm weights are always f32. */
#ifndef MEGASCOPE_MODEL_H
#define MEGASCOPE_MODEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of weight matrices. F32, BF16 and F16 are plain arrays; the
 * others are ggml's block formats (32 elements a block, 256 for the K-quants,
 * row-major blocks along a row), stored exactly as GGUF files hold them so the
 * kernels read them in place: Q8_0 {f16 d; int8 q[32]}, Q4_0 {f16 d; uint8
 * qs[16]}, Q4_1 {f16 d, m; uint8 qs[16]}; Q5_0 .. Q8_K as in src/model/quant_k.h. */
enum ms_dtype {
  MS_DTYPE_F32 = 0,
  MS_DTYPE_BF16 = 1,
  MS_DTYPE_F16 = 2,
  MS_DTYPE_Q8_0 = 3,
  MS_DTYPE_Q4_0 = 4,
  MS_DTYPE_Q4_1 = 5,
  MS_DTYPE_Q5_0 = 6,   /* the types below: src/model/quant_k.h has their layouts */
  MS_DTYPE_Q5_1 = 7,
  MS_DTYPE_IQ4_NL = 8,
  MS_DTYPE_Q2_K = 9,   /* K-quants: super-blocks of 256 */
  MS_DTYPE_Q3_K = 10,
  MS_DTYPE_Q4_K = 11,
  MS_DTYPE_Q5_K = 12,
  MS_DTYPE_Q6_K = 13,
  MS_DTYPE_Q8_K = 14,
  MS_DTYPE_COUNT
};

enum ms_arch {
  MS_ARCH_LLAMA = 0,
  MS_ARCH_QWEN3 = 1,
  MS_ARCH_QWEN2 = 2,
  MS_ARCH_GEMMA3 = 3,
  MS_ARCH_COUNT
};

/* The gated FFN's activation: act(gate) * up. */
enum ms_ffn_act {
  MS_ACT_SILU = 0,        /* SwiGLU (llama, qwen) */
  MS_ACT_GELU_TANH = 1,   /* GeGLU, GELU's tanh approximation (gemma) */
  MS_ACT_COUNT
};

/* RoPE pairing: NORM rotates adjacent pairs (2i, 2i+1), as llama.cpp does for
 * `llama` GGUF files; NEOX rotates (i, i + head_dim/2), as for `qwen3`. */
enum ms_rope_style {
  MS_ROPE_NORM = 0,
  MS_ROPE_NEOX = 1,
  MS_ROPE_COUNT
};

/* The widest head the kernels take (RoPE keeps a head's angles on the stack). */
#define MS_MAX_HEAD_DIM 512

struct ms_model_config {
  char name[64];
  enum ms_arch arch;
  enum ms_rope_style rope_style;
  enum ms_dtype dtype;     /* of the matrices */
  int n_layers;
  int dim;                 /* hidden size */
  int ffn_dim;             /* dense FFN size */
  int n_heads, n_kv_heads, head_dim;
  int vocab;
  int n_experts;           /* 0: dense FFN */
  int top_k;
  int expert_ffn_dim;
  int tied_embeddings;     /* lm_head is the token embedding */
  float rope_base;
  float norm_eps;
  int bos, eos;            /* -1 when none */
  /* Architecture features; zero is llama's. */
  int qk_norm;             /* per-head RMSNorm of q and k before RoPE (qwen3, gemma3) */
  int qkv_bias;            /* biases added to the q, k and v projections (qwen2) */
  int post_norms;          /* RMSNorm of the attention and FFN outputs before the residual add (gemma3) */
  enum ms_ffn_act ffn_act;
  float embed_scale;       /* embedding rows multiplied by it (gemma: sqrt(dim)); 0: 1 */
  float attn_scale;        /* attention scores' scale; 0: 1/sqrt(head_dim) */
  int sliding_window;      /* local layers attend to the last this many positions; 0: every layer global */
  int swa_pattern;         /* with a window, layer l is global when (l + 1) % swa_pattern == 0 (gemma3: 6);
                            * 0: every layer local */
  float rope_base_local;   /* RoPE base of local layers; 0: rope_base */
  float final_softcap;     /* logits = cap * tanh(logits / cap); 0: none */
  int ctx_train;           /* the context the model was trained for (GGUF context_length); 0: unknown */
};

/* "llama", "qwen3", "qwen2", "gemma3": the GGUF spelling. */
const char *ms_arch_name(enum ms_arch a);

struct ms_weight {
  enum ms_dtype dtype;
  int rows, cols;
  const void *data;        /* (rows, cols) row-major */
  /* NULL, or the same weights repacked at load for the CPU's fastest 8-bit
   * path (q8_0, q4_0, q4_1, q5_0, q5_1 on AVX-512 VNNI: rows in fours,
   * src/model/blocks.h), in the model's packed buffer; data stays the layout
   * every other path reads. */
  const void *packed;
  /* The whole groups of four rows the packed form holds: groups [packed_g0,
   * packed_g0 + packed_gn), rows 4 * packed_g0 on; 0, 0: every one. A rank
   * of tensor parallelism across processes packs only the rows its tasks
   * read (ms_model_repack_rows); the kernels read the other rows from data. */
  int packed_g0, packed_gn;
};

struct ms_layer_weights {
  struct ms_weight attn_norm;          /* (1, dim) f32 */
  struct ms_weight wq, wk, wv;         /* (n_heads*hd, dim), (n_kv*hd, dim) x2 */
  struct ms_weight bq, bk, bv;         /* (1, n_heads*hd), (1, n_kv*hd) x2 f32, qkv_bias only */
  struct ms_weight q_norm, k_norm;     /* (1, head_dim) f32, qk_norm only */
  struct ms_weight wo;                 /* (dim, n_heads*hd) */
  struct ms_weight attn_post_norm;     /* (1, dim) f32, post_norms only */
  struct ms_weight ffn_norm;           /* (1, dim) f32 */
  struct ms_weight ffn_post_norm;      /* (1, dim) f32, post_norms only */
  struct ms_weight w_gate, w_up;       /* (ffn, dim) */
  struct ms_weight w_down;             /* (dim, ffn) */
  struct ms_weight router;             /* (n_experts, dim) f32, MoE only */
  struct ms_weight *exp_gate, *exp_up; /* [n_experts] of (expert_ffn, dim) */
  struct ms_weight *exp_down;          /* [n_experts] of (dim, expert_ffn) */
};

struct ms_model {
  struct ms_model_config cfg;
  struct ms_weight tok_embd;           /* (vocab, dim) */
  struct ms_weight out_norm;           /* (1, dim) f32 */
  struct ms_weight lm_head;            /* (vocab, dim); == tok_embd when tied */
  struct ms_layer_weights *layers;     /* [n_layers] */
  void *storage;                       /* owned weight memory */
  size_t storage_bytes;
  void *packed;                        /* owned: what the weights' packed point into */
  size_t packed_bytes;                 /* its size (a huge-page mapping: ms_huge_map) */
  /* Called by ms_model_free when set: releases what the weights point into
   * (the mapping of a GGUF file). */
  void (*release)(void *arg);
  void *release_arg;
};

/* Names of the built-in presets, NULL-terminated. */
extern const char *const ms_preset_names[];

/* Fills cfg for a preset; -ENOENT for an unknown name. */
int ms_preset_config(const char *name, enum ms_dtype dtype, struct ms_model_config *cfg);

/* A synthetic model with deterministic weights drawn from `seed`. NULL + errno. */
struct ms_model *ms_model_synth(const struct ms_model_config *cfg, uint64_t seed);
/* A model of shapes only (every weight's data is NULL): for compiling and
 * simulating models too large to hold. */
struct ms_model *ms_model_shape(const struct ms_model_config *cfg);
void ms_model_free(struct ms_model *m);

/* Bytes of weights one decode step reads (all matrices and norms, the embedding
 * rows it gathers excluded unless tied, where lm_head reads them all). */
size_t ms_model_weight_bytes(const struct ms_model *m);

/* Repacks the matrices this CPU has a faster layout for (ms_weight.packed),
 * into one owned buffer in transparent huge pages (ms_huge_map), and copies
 * the other matrices there in the file's layout (their data then points into
 * it; MEGASCOPE_NO_HUGEPAGES=1: not); a second call does nothing. 0, or
 * -ENOMEM (the model is unchanged and works as before). */
int ms_model_repack(struct ms_model *m);

/* Rows [r0, r1) of one of a model's matrices (w points into the model): what
 * one process reads of it (ms_engine_opts.weight_rows_hook). */
struct ms_weight_rows {
  const struct ms_weight *w;
  int r0, r1;
};

/* ms_model_repack for a process that reads only some rows of the matrices (a
 * rank of tensor parallelism across processes): each matrix named in rows[0
 * .. n) packs the whole groups of four its rows touch, rounded out (its
 * packed_g0, packed_gn); a matrix not named packs nothing, and no matrix is
 * copied in the file's layout (a rank keeps the file's pages, which every
 * rank of the machine shares, instead of a private copy of all of it). A
 * second call, or a call after ms_model_repack, does nothing. 0, or -ENOMEM
 * (the model is unchanged and works as before). */
int ms_model_repack_rows(struct ms_model *m, const struct ms_weight_rows *rows, int n);
/* The bytes ms_model_repack gives m (its packed_bytes), packed or not: what
 * one process holding the whole model packs. */
size_t ms_model_repack_bytes(const struct ms_model *m);

const char *ms_dtype_name(enum ms_dtype t);
int ms_dtype_parse(const char *s, enum ms_dtype *out);
/* Bytes of one element (f32, bf16, f16) or of one block (the block types). */
size_t ms_dtype_size(enum ms_dtype t);
/* Elements per block: 1 for the plain types, 32 for Q8_0 .. IQ4_NL, 256 for the K-quants. */
int ms_dtype_block(enum ms_dtype t);
/* Bytes of a row of `cols` elements (a weight's cols are a multiple of the
 * block; a partial block counts whole). Every row stride is computed with this
 * (or ms_weight_row_bytes), never cols * size. */
size_t ms_dtype_row_bytes(enum ms_dtype t, int cols);

/* bf16 <-> f32: round to nearest even, NaN kept quiet. */
static inline float ms_bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
  return v.f;
}
static inline uint16_t ms_f32_to_bf16(float f) {
  union { float f; uint32_t u; } v = {.f = f};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* IEEE half <-> f32 (round to nearest even; subnormals, inf and NaN kept). */
float ms_f16_to_f32(uint16_t h);
uint16_t ms_f32_to_f16(float f);

/* Bytes between the starts of two rows of w. */
size_t ms_weight_row_bytes(const struct ms_weight *w);

/* Element r,c of a weight as f32 (slow path for references and tests). */
float ms_weight_get(const struct ms_weight *w, int r, int c);
/* Row r of a weight as f32 (a plain scalar decode: the reference's path). */
void ms_weight_row_f32(const struct ms_weight *w, int r, float *out);

#ifdef __cplusplus
}
#endif
#endif
