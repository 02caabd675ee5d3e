/* SPDX-License-Identifier: MIT */
/* Text in, text out for `megascope run`: the --prompt, --chat and sampling
 * options, turning the prompt into token ids with the model's tokenizer, and
 * printing what the requests generated as text (with TTFT and TPOT). */
#ifndef MS_TOOLS_RUN_TEXT_H
#define MS_TOOLS_RUN_TEXT_H

#include <stdint.h>
#include <stdio.h>

#include "megascope/chat.h"
#include "megascope/engine.h"
#include "megascope/json.h"
#include "megascope/sample.h"
#include "megascope/tokenizer.h"

struct run_text {
  const char *prompt;          /* --prompt */
  int chat;                    /* --chat: render the prompt as a user turn of the model's template */
  const char *chat_template;   /* --chat-template NAME, or NULL: the model's own */
  int32_t stop_id;             /* --chat: the template's end-of-turn id, or -1 */
  struct ms_sample_params sp;  /* --temperature --top-k --top-p --sample-seed */
  int eos;                     /* the model's end token (not part of the printed text); -1: none */
};

/* The options: run_text_opts (opt.h). */

/* The prompt's ids (BOS first when the tokenizer asks for it; with --chat the
 * rendered user turn, BOS as ms_chat_bos_id says); malloc'd into *ids. path
 * is the model file (NULL: synthetic), where --chat finds its template.
 * Prints the reason and returns -1 on failure. */
int run_text_encode(struct run_text *rt, const struct ms_tokenizer *tok, const struct ms_model *m, const char *path,
                    int32_t **ids, int *n);

/* Sampling and stopping for request i. */
void run_text_request(const struct run_text *rt, long i, struct ms_request_opts *ro);

/* Prints request i's prompt and generated text. */
void run_text_print(const struct run_text *rt, const struct ms_tokenizer *tok, long i,
                    const struct ms_request_info *info, const int32_t *prompt);

/* Adds "texts", "ttft_s", "tpot_s" (per request) and the sampling settings to
 * an open JSON object. */
void run_text_json(struct ms_json *j, const struct run_text *rt, const struct ms_tokenizer *tok,
                   struct ms_request *const *reqs, long n);

#endif
