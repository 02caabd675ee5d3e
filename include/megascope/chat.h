/* SPDX-License-Identifier: MIT */
/* Chat templates: OpenAI-style messages rendered into a model's prompt text.
 *
 * A GGUF file carries its chat template as Jinja text (tokenizer.chat_template).
 * megascope does not run Jinja: it recognises the template from markers in the
 * text and renders the same output in C. Each enum value is one real template,
 * reproduced with add_generation_prompt on and no tools:
 *
 *   chatml    <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n
 *             (no default system message; any other ChatML template whose system
 *             text does not come from the messages is refused by detection)
 *   smollm2   chatml, and when messages[0] is not a system message
 *             "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
 *   qwen2     chatml, default system "You are a helpful assistant."
 *   qwen2.5   chatml, default "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
 *   qwen3     chatml, an assistant message before the last user message keeps only
 *             the text after its last </think>; after it, its reasoning is kept
 *   llama3    Llama 3.0: <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>,
 *             content trimmed as Python's str.strip() does
 *   llama3.1  Llama 3.1/3.3: llama3 with a system block that always opens with
 *             "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
 *   llama3.2  llama3.1 with today's date (local time, "%d %b %Y"), as strftime_now
 *   gemma     Gemma 2/3: <start_of_turn>user\n...<end_of_turn>\n, assistant named
 *             model, a system message folded into the first user turn
 *             ("system\n\nuser"; Gemma 2's own template refuses it instead)
 *   llama2    <s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s>
 *   mistral   Mistral-7B-Instruct v0.1: [INST] user [/INST]answer</s>, no system role
 *
 * BOS: the rendered text never starts with the template's BOS text
 * ("<|begin_of_text|>", "<bos>", "<s>"); the caller puts the id
 * ms_chat_bos_id() gives before the encoded text, so the BOS is there once
 * whether or not the tokenizer adds one. (llama2's later turns keep their
 * "<s>", which encodes to the BOS token since specials are kept whole.) */
#ifndef MEGASCOPE_CHAT_H
#define MEGASCOPE_CHAT_H

#include <stddef.h>

#include "megascope/base.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ms_chat_template {
  MS_CHAT_CHATML = 0,
  MS_CHAT_SMOLLM2 = 1,
  MS_CHAT_QWEN2 = 2,
  MS_CHAT_QWEN25 = 3,
  MS_CHAT_QWEN3 = 4,
  MS_CHAT_LLAMA3 = 5,
  MS_CHAT_LLAMA31 = 6,
  MS_CHAT_LLAMA32 = 7,
  MS_CHAT_GEMMA = 8,
  MS_CHAT_LLAMA2 = 9,
  MS_CHAT_MISTRAL = 10,
  MS_CHAT_TEMPLATE_COUNT
};

/* The names ms_chat_template_parse takes, for help and error texts. */
#define MS_CHAT_TEMPLATE_NAMES \
  "chatml, smollm2, qwen2, qwen2.5, qwen3, llama3, llama3.1, llama3.2, gemma, llama2, mistral"

/* 0, or -EINVAL for a name not in MS_CHAT_TEMPLATE_NAMES. */
int ms_chat_template_parse(const char *name, enum ms_chat_template *out);
/* "qwen2.5"; "?" for a value out of range. */
const char *ms_chat_template_name(enum ms_chat_template t);

/* Recognises a Jinja template text. 0, or -ENOENT when it is none of the
 * above; log then quotes its first 60 bytes (escaped) and names the choices. */
int ms_chat_template_detect(const char *jinja, size_t len, enum ms_chat_template *out,
                            struct ms_textbuf *log);
/* The same for a file's tokenizer.chat_template: -ENOENT when the key is
 * absent (or not a string) too, and log says which. */
struct ms_gguf;
int ms_chat_template_from_gguf(const struct ms_gguf *g, enum ms_chat_template *out,
                               struct ms_textbuf *log);

/* The template a model speaks, as `serve` and `run --chat` pick it: the
 * file's tokenizer.chat_template when recognised; the architecture's own turns
 * (gemma for MS_ARCH_GEMMA3, chatml otherwise) when the file names none or
 * path is NULL (a synthetic model). arch is an enum ms_arch. note gets one
 * line saying where the choice came from ("llama2 (from the file's
 * tokenizer.chat_template)"). 0, or -ENOENT when the file carries a template
 * that is not recognised (note then quotes it and names the known ones), or
 * when the file cannot be opened (note says why). */
int ms_chat_template_for_model(const char *path, int arch, enum ms_chat_template *out, char *note, size_t n);

/* One message. content NULL reads as "". */
struct ms_chat_message {
  const char *role;  /* "system", "user" or "assistant" */
  const char *content;
};

/* Renders n >= 1 messages and the generation prompt into *out (malloc'ed,
 * NUL-terminated; the caller frees it). 0, -ENOMEM, or -EINVAL with the
 * message named in log: "messages[2].role: 'tool' is not one of system, user,
 * assistant", or a rule of the template ("messages[1].role: 'user' after
 * 'user': template gemma needs user and assistant turns to alternate"). */
int ms_chat_render(enum ms_chat_template t, const struct ms_chat_message *msgs, int n, char **out,
                   struct ms_textbuf *log);

/* The text that ends a turn the model writes ("<|im_end|>", "<|eot_id|>",
 * "<end_of_turn>", "</s>"): a stop token for generation. */
const char *ms_chat_template_eot(enum ms_chat_template t);
/* The BOS text the template starts with, or NULL (ChatML has none). */
const char *ms_chat_template_bos(enum ms_chat_template t);

struct ms_tokenizer;
/* The id to put before the encoded rendering, or -1: the tokenizer's own BOS
 * (ms_tokenizer_add_bos) when it adds one, else the template's BOS text's id. */
int ms_chat_bos_id(enum ms_chat_template t, const struct ms_tokenizer *tok);
/* The id of ms_chat_template_eot's text in tok, or -ENOENT. */
int ms_chat_eot_id(enum ms_chat_template t, const struct ms_tokenizer *tok);

#ifdef __cplusplus
}
#endif
#endif
