/* SPDX-License-Identifier: MIT */
/* The step budget (ms_engine_opts.step_target_us): while a stream is running
 * and a long prompt is chunked beside it, every step keeps the stream's decode
 * row and takes a chunk sized from the measured step times. The checks count
 * rows through the engine's step log, never time: a target of 1 us is below
 * any step, so the chunk is the floor (4 rows) in every step; the budget off
 * (0) fills max_batched_tokens, as before; a target no step reaches (half an
 * hour) fills it too; a prompt with no stream running fills it whatever the
 * target. The stream has its decode row in every step, and the answers are
 * the same tokens with the budget on and off. */
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_impl.h"
#include "test.h"

#define LONG 300    /* the long prompt */
#define BUDGET 64   /* max_batched_tokens */
#define NEW_A 120   /* the stream's tokens: it outlives the long prompt's chunks at the floor */

struct outcome {
  int steps_with_chunk;  /* steps while the long prompt was chunked beside the stream */
  int all_decode;        /* each of them had the stream's decode row */
  int max_chunk, min_chunk;
  int lone_max;          /* the largest chunk of a step with no stream running */
  int a_tokens, b_tokens;
  int32_t b_first[4];
};

static void run(const struct ms_model *m, int target_us, struct outcome *out) {
  memset(out, 0, sizeof *out);
  out->min_chunk = 1 << 30;
  struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 2, .max_batch = 4, .max_ctx = 512,
                             .max_batched_tokens = BUDGET, .step_target_us = target_us};
  char lb[2048];
  struct ms_textbuf log = {lb, sizeof lb, 0, 0};
  struct ms_engine *e = ms_engine_new(m, &o, &log);
  CHECK(e != NULL);
  if (!e) return;
  int vocab = m->cfg.vocab;
  int32_t pa[6], pb[LONG];
  for (int j = 0; j < 6; j++) pa[j] = (int32_t)((j * 7 + 3) % vocab);
  for (int j = 0; j < LONG; j++) pb[j] = (int32_t)((j * 13 + 11) % vocab);
  /* the stream: its short prompt is one chunk step (measured), then it
   * decodes; the engine pauses at step 5 (the stream running, decode steps
   * measured), and the long prompt joins there, whatever this thread's
   * timing on a loaded machine */
  CHECK(ms_engine_pause_at(e, 5) == 0);
  struct ms_request_opts ra = {.sz = sizeof ra, .prompt = pa, .n_prompt = 6, .max_new_tokens = NEW_A};
  struct ms_request *a = ms_engine_submit(e, &ra);
  CHECK(a != NULL);
  CHECK(ms_engine_wait_paused(e, 20000) == 0);
  struct ms_request_opts rb = {.sz = sizeof rb, .prompt = pb, .n_prompt = LONG, .max_new_tokens = 4};
  struct ms_request *b = ms_engine_submit(e, &rb);
  CHECK(b != NULL);
  CHECK(ms_engine_resume(e) == 0);
  CHECK(ms_request_wait(b, 60000) == 0);
  CHECK(ms_request_wait(a, 60000) == 0);
  struct ms_request_info ia, ib;
  ms_request_get_info(a, &ia);
  ms_request_get_info(b, &ib);
  out->a_tokens = ia.n_tokens;
  out->b_tokens = ib.n_tokens;
  memcpy(out->b_first, ib.tokens, sizeof out->b_first);
  /* then a long prompt alone: no stream to keep smooth, the chunk fills the budget */
  struct ms_request_opts rc = {.sz = sizeof rc, .prompt = pb + 1, .n_prompt = LONG - 1, .max_new_tokens = 2};
  struct ms_request *c = ms_engine_submit(e, &rc);
  CHECK(c != NULL);
  CHECK(ms_request_wait(c, 60000) == 0);
  ms_request_free(c);
  struct ms_step_record *sl = malloc(sizeof *sl * MS_STEP_LOG);
  int n = ms_engine_step_log(e, sl, MS_STEP_LOG);
  out->all_decode = 1;
  for (int i = 0; i < n; i++) {
    CHECK(sl[i].rows <= BUDGET && sl[i].chunk_rows >= 0);
    if (!sl[i].decoding && sl[i].chunk_rows > out->lone_max) out->lone_max = sl[i].chunk_rows;
    if (!sl[i].chunk_rows || sl[i].rows - sl[i].chunk_rows < 2) continue;  /* A's prompt step alone */
    /* two requests: the stream and the long prompt being chunked */
    out->steps_with_chunk++;
    out->all_decode &= sl[i].decoding >= 1;
    if (sl[i].chunk_rows > out->max_chunk) out->max_chunk = sl[i].chunk_rows;
    if (sl[i].chunk_rows < out->min_chunk) out->min_chunk = sl[i].chunk_rows;
  }
  free(sl);
  ms_request_free(a);
  ms_request_free(b);
  ms_engine_free(e);
}

int main(void) {
  struct ms_model_config c;
  CHECK(ms_preset_config("tiny", MS_DTYPE_F32, &c) == 0);
  struct ms_model *m = ms_model_synth(&c, 3);
  CHECK(m != NULL);
  if (!m) TEST_MAIN_END();
  struct outcome floor, off, loose;
  run(m, 1, &floor);
  run(m, 0, &off);
  run(m, 2000000000, &loose);  /* over half an hour: no step reaches it */
  /* the floor: 4 chunk rows a step beside the decode row, until the prompt's
   * end (299 positions before the one that samples, 5 a step); the stream
   * had its row in each */
  CHECK(floor.all_decode);
  CHECK(floor.max_chunk == 4);
  CHECK(floor.steps_with_chunk >= (LONG - 1) / 5);
  CHECK(floor.steps_with_chunk <= (LONG - 1) / 5 + 2);
  /* off, and a target no step reaches: the chunk fills what the decode rows leave */
  CHECK(off.all_decode && loose.all_decode);
  CHECK(off.max_chunk == BUDGET - 2);
  CHECK(loose.max_chunk == BUDGET - 2);
  CHECK(off.steps_with_chunk <= (LONG - 1) / (BUDGET - 1) + 1);
  /* a prompt with no stream running: the whole budget, whatever the target */
  CHECK(floor.lone_max == BUDGET - 1 && off.lone_max == BUDGET - 1 && loose.lone_max == BUDGET - 1);
  /* the same answers whatever the chunks */
  CHECK(floor.a_tokens == NEW_A && off.a_tokens == NEW_A && loose.a_tokens == NEW_A);
  CHECK(floor.b_tokens == 4 && off.b_tokens == 4);
  CHECK(memcmp(floor.b_first, off.b_first, sizeof floor.b_first) == 0);
  CHECK(memcmp(loose.b_first, off.b_first, sizeof off.b_first) == 0);
  ms_model_free(m);
  TEST_MAIN_END();
}
