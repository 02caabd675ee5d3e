/* SPDX-License-Identifier: MIT */
/* Text in, text out for `megascope run`. See run_text.h. */
#include "run_text.h"
#include "opt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static int chat_template_opt(void *dst, const char *arg) {
  struct run_text *rt = dst;
  enum ms_chat_template t;
  if (ms_chat_template_parse(arg, &t)) {
    fprintf(stderr, "megascope run: --chat-template '%s': expected one of %s\n", arg, MS_CHAT_TEMPLATE_NAMES);
    return -1;
  }
  rt->chat_template = arg;
  rt->chat = 1;
  return 0;
}

#define RT struct run_text
const struct cli_opt run_text_opts[] = {
    CLI_OPT_STR(RT, prompt, "prompt", "TEXT",
                "every request starts from TEXT (tokenized with the model's\n"
                "tokenizer); prints the generated text; stops at eos"),
    CLI_OPT_FLAG(RT, chat, "chat",
                 "render --prompt as one user turn of the model's chat template\n"
                 "(the file's tokenizer.chat_template, as serve picks it); stops\n"
                 "at the template's end of turn too"),
    CLI_OPT_FN("chat-template", "NAME", chat_template_opt, "--chat with this template (" MS_CHAT_TEMPLATE_NAMES ")"),
    CLI_OPT_FLOAT(RT, sp.temperature, "temperature", "X", 0, 100, "sample at temperature X (default 0: greedy)"),
    CLI_OPT_I32(RT, sp.top_k, "top-k", "K", 0, 1 << 30, "sample among the K most probable tokens (default: all)"),
    CLI_OPT_FLOAT(RT, sp.top_p, "top-p", "P", 0, 1, "sample from the nucleus of mass P (default: 1, off)"),
    CLI_OPT_U64(RT, sp.seed, "sample-seed", "S", "seed of the draws; request i uses S + i (default 1)"),
    {0}};
#undef RT

/* Appends the ids of `s` (special tokens kept whole) to ids[*n..max). */
static int encode_part(const struct ms_tokenizer *tok, const char *s, int32_t *ids, int *n, int max) {
  int k = ms_tokenizer_encode(tok, s, strlen(s), ids + *n, max - *n);
  if (k < 0 || k > max - *n) return -1;
  *n += k;
  return 0;
}

/* --chat: the prompt as one user turn of the template, in a malloc'd string;
 * *bos gets the id to put first, rt->stop_id the end of turn. NULL (printed)
 * when the model has no template megascope knows. */
static char *chat_prompt(struct run_text *rt, const struct ms_tokenizer *tok, const struct ms_model *m,
                         const char *path, int *bos) {
  enum ms_chat_template t;
  char note[512], lb[256] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  if (rt->chat_template) {
    ms_chat_template_parse(rt->chat_template, &t);
  } else if (ms_chat_template_for_model(path, (int)m->cfg.arch, &t, note, sizeof note)) {
    fprintf(stderr, "megascope run: --chat: %s; name one with --chat-template\n", note);
    return NULL;
  }
  struct ms_chat_message msg = {"user", rt->prompt};
  char *text = NULL;
  if (ms_chat_render(t, &msg, 1, &text, &log)) {
    fprintf(stderr, "megascope run: --chat: %s\n", lb[0] ? lb : "cannot render the prompt");
    return NULL;
  }
  int eot = ms_chat_eot_id(t, tok);
  if (eot < 0) {
    fprintf(stderr, "megascope run: --chat: template %s ends a turn with '%s', which this vocabulary lacks\n",
            ms_chat_template_name(t), ms_chat_template_eot(t));
    free(text);
    return NULL;
  }
  rt->stop_id = eot;
  *bos = ms_chat_bos_id(t, tok);
  return text;
}

int run_text_encode(struct run_text *rt, const struct ms_tokenizer *tok, const struct ms_model *m, const char *path,
                    int32_t **ids, int *n) {
  int vocab = m->cfg.vocab;
  rt->eos = m->cfg.eos;
  rt->stop_id = -1;
  if (!tok) {
    fprintf(stderr, "megascope run: --prompt: this model has no tokenizer (vocabulary under 256 ids)\n");
    return -1;
  }
  int bos = ms_tokenizer_add_bos(tok), rc = 0;
  char *text = rt->chat ? chat_prompt(rt, tok, m, path, &bos) : NULL;
  if (rt->chat && !text) return -1;
  const char *s = text ? text : rt->prompt;
  int max = (int)strlen(s) + 64;
  *ids = malloc(sizeof **ids * (size_t)max);
  *n = 0;
  if (!*ids) {
    free(text);
    return -1;
  }
  if (bos >= 0) (*ids)[(*n)++] = bos;
  rc = encode_part(tok, s, *ids, n, max);
  free(text);
  for (int i = 0; !rc && i < *n; i++)
    if ((*ids)[i] >= vocab) rc = -1;
  if (!rc && *n == 0) {
    fprintf(stderr, "megascope run: --prompt: the prompt is empty\n");
    rc = -1;
  } else if (rc) {
    fprintf(stderr, "megascope run: --prompt: cannot tokenize the prompt for this model\n");
  }
  if (rc) {
    free(*ids);
    *ids = NULL;
  }
  return rc;
}

void run_text_request(const struct run_text *rt, long i, struct ms_request_opts *ro) {
  ro->temperature = rt->sp.temperature;
  ro->top_k = rt->sp.top_k;
  ro->top_p = rt->sp.top_p;
  ro->sample_seed = rt->sp.seed + (uint64_t)i;
  if (rt->prompt) ro->stop_at_eos = 1;
  if (rt->stop_id >= 0) {
    ro->stop_ids = &rt->stop_id;
    ro->n_stop_ids = 1;
  }
}

/* Decodes ids into a malloc'd string, made valid UTF-8 (U+FFFD for bad bytes
 * and NULs). Control tokens (BOS, EOS, a template's turn markers) are not
 * text: they are left out, as the server leaves them out. */
static char *decode_text(const struct ms_tokenizer *tok, const int32_t *all, int n_all) {
  int32_t *ids = tok ? malloc(sizeof *ids * (size_t)(n_all > 0 ? n_all : 1)) : NULL;
  int n = 0;
  for (int i = 0; ids && i < n_all; i++)
    if (!ms_tokenizer_is_control(tok, all[i])) ids[n++] = all[i];
  long need = ids ? ms_tokenizer_decode(tok, ids, n, NULL, 0) : -1;
  char *raw = need >= 0 ? malloc((size_t)need + 1) : NULL, *out = raw ? malloc(3 * (size_t)need + 1) : NULL;
  size_t o = 0;
  if (!out) {
    free(raw);
    free(ids);
    return NULL;
  }
  ms_tokenizer_decode(tok, ids, n, raw, (size_t)need + 1);
  free(ids);
  for (long i = 0; i < need;) {
    unsigned char c = (unsigned char)raw[i];
    int k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    int ok = c != 0 && k > 0 && i + k <= need;
    for (int j = 1; ok && j < k; j++) ok = ((unsigned char)raw[i + j] & 0xc0) == 0x80;
    if (ok) {
      memcpy(out + o, raw + i, (size_t)k);
      o += (size_t)k;
      i += k;
    } else {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
      i++;
    }
  }
  out[o] = '\0';
  free(raw);
  return out;
}

/* Generated tokens without a final end token. */
static int text_len(const struct run_text *rt, const struct ms_request_info *info) {
  int n = info->n_tokens, last = n > 0 ? info->tokens[n - 1] : -1;
  return n > 0 && ((rt->eos >= 0 && last == rt->eos) || (rt->stop_id >= 0 && last == rt->stop_id)) ? n - 1 : n;
}

void run_text_print(const struct run_text *rt, const struct ms_tokenizer *tok, long i,
                    const struct ms_request_info *info, const int32_t *prompt) {
  char *p = decode_text(tok, prompt, info->n_prompt), *g = decode_text(tok, info->tokens, text_len(rt, info));
  double ttft = info->t_first ? (double)(info->t_first - info->t_submit) / 1e9 : 0;
  double tpot = info->n_tokens > 1 ? (double)(info->t_done - info->t_first) / 1e9 / (info->n_tokens - 1) : 0;
  printf("--- request %ld: %d prompt tokens, %d generated, ttft %.3f s, tpot %.4f s\n", i, info->n_prompt,
         info->n_tokens, ttft, tpot);
  printf("%s%s\n", p ? p : "", g ? g : "");
  free(p);
  free(g);
}

void run_text_json(struct ms_json *j, const struct run_text *rt, const struct ms_tokenizer *tok,
                   struct ms_request *const *reqs, long n) {
  ms_json_kstr(j, "tokenizer", tok ? ms_tokenizer_name(tok) : "none");
  ms_json_knum(j, "temperature", rt->sp.temperature);
  ms_json_kint(j, "top_k", rt->sp.top_k);
  ms_json_knum(j, "top_p", rt->sp.top_p);
  ms_json_kuint(j, "sample_seed", rt->sp.seed);
  const char *keys[] = {"texts", "prompt_tokens", "ttft_s", "tpot_s"};
  for (int k = 0; k < 4; k++) {
    ms_json_key(j, keys[k]);
    ms_json_arr_begin(j);
    for (long i = 0; i < n; i++) {
      struct ms_request_info info;
      ms_request_get_info(reqs[i], &info);
      if (k == 0) {
        char *t = decode_text(tok, info.tokens, text_len(rt, &info));
        ms_json_str(j, t);
        free(t);
      } else if (k == 1) {
        ms_json_int(j, info.n_prompt);
      } else if (k == 2) {
        ms_json_num(j, info.t_first ? (double)(info.t_first - info.t_submit) / 1e9 : 0);
      } else {
        ms_json_num(j, info.n_tokens > 1 ? (double)(info.t_done - info.t_first) / 1e9 / (info.n_tokens - 1) : 0);
      }
    }
    ms_json_arr_end(j);
  }
}
