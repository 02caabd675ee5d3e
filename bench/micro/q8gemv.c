/* SPDX-License-Identifier: MIT */
/* The engine's 8-bit GEMV (ms_q8_gemv on ms_quant_repack's packed form) on one
 * matrix of random Q8_0 or Q4_1 weights, outside the engine: the best of many
 * calls, one thread. Small matrices stay in the caches (the tile's own speed);
 * large ones stream from memory. Build against a build tree and run (ROWS COLS
 * TYPE [INPUTS]; TYPE 0: Q8_0, 1: Q4_1; INPUTS default 1):
 *   gcc -O2 -march=native -Isrc -Iinclude -o /tmp/q8gemv bench/micro/q8gemv.c \
 *     build/libms_model.a build/libms_kernels.a build/libms_model.a build/libms_base.a -lm -lpthread
 *   taskset -c 0 /tmp/q8gemv 1536 576 1 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/quant.h"
#include "model/blocks.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float frand(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: q8gemv ROWS COLS TYPE(0: q8_0, 1: q4_1) [INPUTS]\n");
    return 2;
  }
  int rows = atoi(argv[1]), cols = atoi(argv[2]), nb = argc > 4 ? atoi(argv[4]) : 1;
  enum ms_dtype t = atoi(argv[3]) ? MS_DTYPE_Q4_1 : MS_DTYPE_Q8_0;
  if (rows < 4 || cols < 64 || cols % 64 || nb < 1) {
    fprintf(stderr, "q8gemv: ROWS >= 4, COLS a multiple of 64, INPUTS >= 1\n");
    return 2;
  }
  size_t rb = ms_dtype_row_bytes(t, cols);
  uint8_t *data = malloc(rb * (size_t)rows);
  float *src = malloc(sizeof(float) * (size_t)cols), *x = malloc(sizeof(float) * (size_t)cols * (size_t)nb);
  float *y = malloc(sizeof(float) * (size_t)rows * (size_t)nb);
  srand(1);
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) src[c] = frand();
    ms_quant_row(t, src, cols, data + rb * (size_t)r);
  }
  for (int i = 0; i < cols * nb; i++) x[i] = frand();
  struct ms_weight w = {.dtype = t, .rows = rows, .cols = cols, .data = data};
  size_t pb = ms_quant_packed_bytes(&w);
  void *pk = pb ? aligned_alloc(64, (pb + 63) & ~(size_t)63) : NULL;
  if (pk) ms_quant_repack(&w, pk), w.packed = pk;
  void *ab = aligned_alloc(64, (ms_q8_act_bytes(cols, nb) + 63) & ~(size_t)63);
  struct ms_q8_act a;
  ms_q8_quantize(&a, ab, x, cols, nb, cols, 32, 1);
  double best = 1e9;
  int reps = rb * (size_t)rows > (64u << 20) ? 20 : 2000;
  for (int k = 0; k < reps; k++) {
    double t0 = now();
    ms_q8_gemv(&w, 0, rows, &a, y, rows, 2);
    double t1 = now();
    if (t1 - t0 < best) best = t1 - t0;
  }
  printf("%s %dx%d, %d input%s, %s: %.1f us, %.2f GB/s of weights, %.1f GMAC/s\n", ms_dtype_name(t), rows, cols, nb,
         nb == 1 ? "" : "s", pk ? "packed" : "file layout", best * 1e6, (double)rb * rows / best / 1e9,
         (double)rows * cols * nb / best / 1e9);
  free(data), free(src), free(x), free(y), free(pk), free(ab);
  return 0;
}
