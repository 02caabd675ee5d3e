/* SPDX-License-Identifier: MIT */
/* Chat templates: detection on the real Jinja texts in tests/data/chat (see its
 * README for where each comes from), exact renderings against what jinja2
 * makes of the same texts (tests/data/chat/render.py; the leading BOS
 * removed, llama3.2's date put in by the test), unknown templates and bad
 * roles refused with the message naming them, names, end-of-turn and BOS
 * texts. With SmolLM2 in the cache, its file's template is detected. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "megascope/chat.h"
#include "megascope/gguf.h"
#include "test.h"

static char *read_template(const char *file, size_t *len) {
  char path[1024];
  const char *src = getenv("MS_SRC") ? getenv("MS_SRC") : ".";
  snprintf(path, sizeof path, "%s/tests/data/chat/%s", src, file);
  char *s = ms_test_slurp(path, len);
  CHECKF(s != NULL, "cannot read %s", path);
  return s;
}

static const struct {
  const char *file;
  enum ms_chat_template want;
} detections[] = {
    {"smollm2-instruct.jinja", MS_CHAT_SMOLLM2},
    {"qwen2-instruct.jinja", MS_CHAT_QWEN2},
    {"qwen2.5-instruct.jinja", MS_CHAT_QWEN25},
    {"qwen3.jinja", MS_CHAT_QWEN3},
    {"chatml.jinja", MS_CHAT_CHATML},
    {"llama-3-instruct.jinja", MS_CHAT_LLAMA3},
    {"llama-3.3-instruct.jinja", MS_CHAT_LLAMA31},
    {"llama-3.2-instruct.jinja", MS_CHAT_LLAMA32},
    {"gemma-2-it.jinja", MS_CHAT_GEMMA},
    {"gemma-3-it.jinja", MS_CHAT_GEMMA},
    {"llama-2-chat.jinja", MS_CHAT_LLAMA2},
    {"mistral-7b-instruct-v0.1.jinja", MS_CHAT_MISTRAL},
};

static void test_detect(void) {
  for (size_t i = 0; i < sizeof detections / sizeof detections[0]; i++) {
    size_t len;
    char *s = read_template(detections[i].file, &len);
    if (!s) continue;
    enum ms_chat_template t = MS_CHAT_TEMPLATE_COUNT;
    char buf[512];
    struct ms_textbuf log = {buf, sizeof buf, 0, 0};
    int rc = ms_chat_template_detect(s, len, &t, &log);
    CHECKF(rc == 0 && t == detections[i].want, "%s: rc %d, %s (want %s)", detections[i].file, rc,
           ms_chat_template_name(t), ms_chat_template_name(detections[i].want));
    CHECK(log.len == 0);
    free(s);
  }
}

/* Templates this renderer would get wrong, so detection must refuse them. */
static const char *const unknown[] = {
    "",
    "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    /* Phi-3 */
    "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}",
    /* ChatML with a default system message of its own */
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are Hermes.<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{{ '<|im_start|>assistant\n' }}",
    /* QwQ: the generation prompt opens a think block */
    "{% for message in messages %}{{'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n'}}"
    "{% endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
    "{% if '</think>' in content %}{% endif %}",
    /* ChatML that trims the contents */
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] | trim + "
    "'<|im_end|>\n'}}{% endfor %}{{ '<|im_start|>assistant\n' }}",
    /* a Llama 3 form with tools of its own (functionary-like) */
    "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] + '<|eot_id|>' }}{% endfor %}{% if tools %}>>>all{% endif %}",
    /* Mistral v0.3's [INST] without the spaces */
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST]' + "
    "message['content'] + '[/INST]' }}{% endif %}{% endfor %}",
};

static void test_unknown(void) {
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    enum ms_chat_template t = MS_CHAT_TEMPLATE_COUNT;
    char buf[512];
    struct ms_textbuf log = {buf, sizeof buf, 0, 0};
    int rc = ms_chat_template_detect(unknown[i], strlen(unknown[i]), &t, &log);
    CHECKF(rc == -ENOENT, "unknown[%zu] detected as %s", i, ms_chat_template_name(t));
    CHECKF(strstr(buf, "chat template not recognised: \"") && strstr(buf, "known templates: chatml, smollm2"),
           "unknown[%zu]: %s", i, buf);
  }
  /* the quotation: the first 60 bytes, escaped */
  char buf[512];
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  enum ms_chat_template t;
  ms_chat_template_detect(unknown[2], strlen(unknown[2]), &t, &log);
  CHECKF(strstr(buf, "\"{% for message in messages %}{{'<|' + message['role'] + '|>'\"... (178 bytes)") != NULL,
         "%s", buf);
}

static const struct {
  const char *name;
  struct ms_chat_message m[4];
  int n;
} convs[] = {
    {"one", {{"user", "Hello!"}}, 1},
    {"sys", {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "What is 2+2? "}}, 4},
    {"ws",
     {{"system", "  sys\xc2\xa0"}, {"user", "\xe3\x80\x80 padded \n"}, {"assistant", " ok \xe2\x80\x83"}, {"user", "again"}},
     4},
    {"nosys", {{"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}}, 3},
    {"think", {{"user", "q1"}, {"assistant", "<think>\nreasoning\n</think>\n\nanswer1"}, {"user", "q2"}}, 3},
    {"think_last", {{"user", "q"}, {"assistant", "<think>r</think>\n\na"}}, 2},
};

/* jinja2's renderings (tests/data/chat/render.py) */
static const struct {
  const char *file, *conv, *want;
} renderings[] = {
    {"qwen2-instruct.jinja", "one", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2-instruct.jinja", "sys", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is 2+2? <|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2-instruct.jinja", "ws", "<|im_start|>system\n  sys\xc2""\xa0""<|im_end|>\n<|im_start|>user\n\xe3""\x80""\x80"" padded \n<|im_end|>\n<|im_start|>assistant\n ok \xe2""\x80""\x83""<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2-instruct.jinja", "nosys", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2-instruct.jinja", "think", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nreasoning\n</think>\n\nanswer1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2-instruct.jinja", "think_last", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>r</think>\n\na<|im_end|>\n<|im_start|>assistant\n"},
    {"chatml.jinja", "one", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"},
    {"chatml.jinja", "sys", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is 2+2? <|im_end|>\n<|im_start|>assistant\n"},
    {"chatml.jinja", "ws", "<|im_start|>system\n  sys\xc2""\xa0""<|im_end|>\n<|im_start|>user\n\xe3""\x80""\x80"" padded \n<|im_end|>\n<|im_start|>assistant\n ok \xe2""\x80""\x83""<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"},
    {"chatml.jinja", "nosys", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"},
    {"chatml.jinja", "think", "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nreasoning\n</think>\n\nanswer1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"},
    {"chatml.jinja", "think_last", "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>r</think>\n\na<|im_end|>\n<|im_start|>assistant\n"},
    {"smollm2-instruct.jinja", "one", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"},
    {"smollm2-instruct.jinja", "sys", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is 2+2? <|im_end|>\n<|im_start|>assistant\n"},
    {"smollm2-instruct.jinja", "ws", "<|im_start|>system\n  sys\xc2""\xa0""<|im_end|>\n<|im_start|>user\n\xe3""\x80""\x80"" padded \n<|im_end|>\n<|im_start|>assistant\n ok \xe2""\x80""\x83""<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"},
    {"smollm2-instruct.jinja", "nosys", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"},
    {"smollm2-instruct.jinja", "think", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nreasoning\n</think>\n\nanswer1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"},
    {"smollm2-instruct.jinja", "think_last", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>r</think>\n\na<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2.5-instruct.jinja", "one", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2.5-instruct.jinja", "sys", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is 2+2? <|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2.5-instruct.jinja", "ws", "<|im_start|>system\n  sys\xc2""\xa0""<|im_end|>\n<|im_start|>user\n\xe3""\x80""\x80"" padded \n<|im_end|>\n<|im_start|>assistant\n ok \xe2""\x80""\x83""<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2.5-instruct.jinja", "nosys", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2.5-instruct.jinja", "think", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nreasoning\n</think>\n\nanswer1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen2.5-instruct.jinja", "think_last", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>r</think>\n\na<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen3.jinja", "one", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen3.jinja", "sys", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is 2+2? <|im_end|>\n<|im_start|>assistant\n"},
    {"qwen3.jinja", "ws", "<|im_start|>system\n  sys\xc2""\xa0""<|im_end|>\n<|im_start|>user\n\xe3""\x80""\x80"" padded \n<|im_end|>\n<|im_start|>assistant\n ok \xe2""\x80""\x83""<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen3.jinja", "nosys", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen3.jinja", "think", "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\nanswer1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen3.jinja", "think_last", "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n<|im_start|>assistant\n"},
    {"llama-3-instruct.jinja", "one", "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3-instruct.jinja", "sys", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3-instruct.jinja", "ws", "<|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nagain<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3-instruct.jinja", "nosys", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3-instruct.jinja", "think", "<|start_header_id|>user<|end_header_id|>\n\nq1<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>\nreasoning\n</think>\n\nanswer1<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nq2<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3-instruct.jinja", "think_last", "<|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>r</think>\n\na<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.3-instruct.jinja", "one", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.3-instruct.jinja", "sys", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.3-instruct.jinja", "ws", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nsys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nagain<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.3-instruct.jinja", "nosys", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.3-instruct.jinja", "think", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nq1<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>\nreasoning\n</think>\n\nanswer1<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nq2<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.3-instruct.jinja", "think_last", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>r</think>\n\na<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.2-instruct.jinja", "one", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: @DATE@\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.2-instruct.jinja", "sys", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: @DATE@\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.2-instruct.jinja", "ws", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: @DATE@\n\nsys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nagain<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.2-instruct.jinja", "nosys", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: @DATE@\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.2-instruct.jinja", "think", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: @DATE@\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nq1<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>\nreasoning\n</think>\n\nanswer1<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nq2<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"llama-3.2-instruct.jinja", "think_last", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: @DATE@\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>r</think>\n\na<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"gemma-3-it.jinja", "one", "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n"},
    {"gemma-3-it.jinja", "sys", "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"},
    {"gemma-3-it.jinja", "ws", "<start_of_turn>user\n  sys\xc2""\xa0""\n\npadded<end_of_turn>\n<start_of_turn>model\nok<end_of_turn>\n<start_of_turn>user\nagain<end_of_turn>\n<start_of_turn>model\n"},
    {"gemma-3-it.jinja", "nosys", "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"},
    {"gemma-3-it.jinja", "think", "<start_of_turn>user\nq1<end_of_turn>\n<start_of_turn>model\n<think>\nreasoning\n</think>\n\nanswer1<end_of_turn>\n<start_of_turn>user\nq2<end_of_turn>\n<start_of_turn>model\n"},
    {"gemma-3-it.jinja", "think_last", "<start_of_turn>user\nq<end_of_turn>\n<start_of_turn>model\n<think>r</think>\n\na<end_of_turn>\n<start_of_turn>model\n"},
    {"llama-2-chat.jinja", "one", "[INST] Hello! [/INST]"},
    {"llama-2-chat.jinja", "sys", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] What is 2+2? [/INST]"},
    {"llama-2-chat.jinja", "ws", "[INST] <<SYS>>\n  sys\xc2""\xa0""\n<</SYS>>\n\n\xe3""\x80""\x80"" padded [/INST] ok </s><s>[INST] again [/INST]"},
    {"llama-2-chat.jinja", "nosys", "[INST] Hi [/INST] Hello. </s><s>[INST] Bye [/INST]"},
    {"llama-2-chat.jinja", "think", "[INST] q1 [/INST] <think>\nreasoning\n</think>\n\nanswer1 </s><s>[INST] q2 [/INST]"},
    {"llama-2-chat.jinja", "think_last", "[INST] q [/INST] <think>r</think>\n\na </s>"},
    {"mistral-7b-instruct-v0.1.jinja", "one", "[INST] Hello! [/INST]"},
    {"mistral-7b-instruct-v0.1.jinja", "nosys", "[INST] Hi [/INST]Hello.</s>[INST] Bye [/INST]"},
    {"mistral-7b-instruct-v0.1.jinja", "think", "[INST] q1 [/INST]<think>\nreasoning\n</think>\n\nanswer1</s>[INST] q2 [/INST]"},
    {"mistral-7b-instruct-v0.1.jinja", "think_last", "[INST] q [/INST]<think>r</think>\n\na</s>"},
};

static enum ms_chat_template template_of(const char *file) {
  for (size_t i = 0; i < sizeof detections / sizeof detections[0]; i++)
    if (!strcmp(detections[i].file, file)) return detections[i].want;
  return MS_CHAT_TEMPLATE_COUNT;
}

/* want with "@DATE@" replaced by today's date as "%d %b %Y" writes it. */
static char *with_date(const char *want) {
  char date[32];
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  strftime(date, sizeof date, "%d %b %Y", &tm);
  const char *at = strstr(want, "@DATE@");
  size_t n = strlen(want) + strlen(date) + 1;
  char *s = malloc(n);
  if (!at) snprintf(s, n, "%s", want);
  else snprintf(s, n, "%.*s%s%s", (int)(at - want), want, date, at + 6);
  return s;
}

static void test_render(void) {
  int count = 0;
  for (size_t i = 0; i < sizeof renderings / sizeof renderings[0]; i++) {
    enum ms_chat_template t = template_of(renderings[i].file);
    for (size_t c = 0; c < sizeof convs / sizeof convs[0]; c++) {
      if (strcmp(convs[c].name, renderings[i].conv)) continue;
      char *out = NULL, buf[256] = "";
      struct ms_textbuf log = {buf, sizeof buf, 0, 0};
      int rc = ms_chat_render(t, convs[c].m, convs[c].n, &out, &log);
      char *want = with_date(renderings[i].want);
      CHECKF(rc == 0 && out && !strcmp(out, want), "%s %s: rc %d %s\n got: %s\nwant: %s", ms_chat_template_name(t),
             convs[c].name, rc, buf, out ? out : "(null)", want);
      free(want);
      free(out);
      count++;
    }
  }
  CHECK(count == (int)(sizeof renderings / sizeof renderings[0]));
}

static void expect_refused(enum ms_chat_template t, const struct ms_chat_message *m, int n, const char *msg) {
  char *out = (char *)1, buf[512] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  int rc = ms_chat_render(t, m, n, &out, &log);
  CHECKF(rc == -EINVAL && out == NULL && !strcmp(buf, msg), "%s: rc %d, '%s'", ms_chat_template_name(t), rc, buf);
}

static void test_refused(void) {
  const struct ms_chat_message tool[] = {{"user", "a"}, {"assistant", "b"}, {"tool", "c"}};
  for (int t = 0; t < MS_CHAT_TEMPLATE_COUNT; t++)
    expect_refused((enum ms_chat_template)t, tool, 3, "messages[2].role: 'tool' is not one of system, user, assistant");
  const struct ms_chat_message null_role[] = {{NULL, "a"}};
  expect_refused(MS_CHAT_CHATML, null_role, 1, "messages[0].role: '(null)' is not one of system, user, assistant");
  expect_refused(MS_CHAT_CHATML, tool, 0, "messages: at least one message is needed");
  const struct ms_chat_message two_users[] = {{"system", "s"}, {"user", "a"}, {"user", "b"}};
  expect_refused(MS_CHAT_GEMMA, two_users, 3,
                 "messages[2].role: 'user' where 'assistant' is due: template gemma needs turns that alternate "
                 "user, assistant, user, ...");
  const struct ms_chat_message assistant_first[] = {{"assistant", "a"}};
  expect_refused(MS_CHAT_LLAMA2, assistant_first, 1,
                 "messages[0].role: 'assistant' where 'user' is due: template llama2 needs turns that alternate "
                 "user, assistant, user, ...");
  const struct ms_chat_message late_system[] = {{"user", "a"}, {"system", "s"}};
  expect_refused(MS_CHAT_GEMMA, late_system, 2, "messages[1].role: 'system' is allowed only first with template gemma");
  const struct ms_chat_message sys[] = {{"system", "s"}, {"user", "a"}};
  expect_refused(MS_CHAT_MISTRAL, sys, 2, "messages[0].role: 'system' has no place with template mistral");
  /* the ChatML and Llama 3 families take any order, and NULL content as "" */
  const struct ms_chat_message any[] = {{"assistant", NULL}, {"system", "s"}};
  char *out = NULL;
  CHECK(ms_chat_render(MS_CHAT_CHATML, any, 2, &out, NULL) == 0 && out &&
        !strcmp(out, "<|im_start|>assistant\n<|im_end|>\n<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\n"));
  free(out);
  CHECK(ms_chat_render(MS_CHAT_TEMPLATE_COUNT, any, 2, &out, NULL) == -EINVAL && !out);
}

static void test_names(void) {
  for (int t = 0; t < MS_CHAT_TEMPLATE_COUNT; t++) {
    enum ms_chat_template back = MS_CHAT_TEMPLATE_COUNT;
    const char *name = ms_chat_template_name((enum ms_chat_template)t);
    CHECKF(ms_chat_template_parse(name, &back) == 0 && back == (enum ms_chat_template)t, "%s", name);
    CHECKF(strstr(MS_CHAT_TEMPLATE_NAMES, name) != NULL, "%s not in MS_CHAT_TEMPLATE_NAMES", name);
    CHECK(ms_chat_template_eot((enum ms_chat_template)t) != NULL);
  }
  enum ms_chat_template t;
  CHECK(ms_chat_template_parse("jinja", &t) == -EINVAL && ms_chat_template_parse(NULL, &t) == -EINVAL);
  CHECK(!strcmp(ms_chat_template_name(MS_CHAT_TEMPLATE_COUNT), "?"));
  CHECK(!strcmp(ms_chat_template_eot(MS_CHAT_QWEN25), "<|im_end|>"));
  CHECK(!strcmp(ms_chat_template_eot(MS_CHAT_LLAMA31), "<|eot_id|>"));
  CHECK(!strcmp(ms_chat_template_eot(MS_CHAT_GEMMA), "<end_of_turn>"));
  CHECK(!strcmp(ms_chat_template_eot(MS_CHAT_LLAMA2), "</s>") && !strcmp(ms_chat_template_eot(MS_CHAT_MISTRAL), "</s>"));
  CHECK(ms_chat_template_bos(MS_CHAT_SMOLLM2) == NULL);
  CHECK(!strcmp(ms_chat_template_bos(MS_CHAT_LLAMA32), "<|begin_of_text|>"));
  CHECK(!strcmp(ms_chat_template_bos(MS_CHAT_GEMMA), "<bos>") && !strcmp(ms_chat_template_bos(MS_CHAT_LLAMA2), "<s>"));
}

static void test_smollm2_file(void) {
  const char *home = getenv("HOME");
  char path[1024];
  if (getenv("MS_SMOLLM2")) snprintf(path, sizeof path, "%s", getenv("MS_SMOLLM2"));
  else snprintf(path, sizeof path, "%s/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : ".");
  if (access(path, R_OK)) {
    SKIP_PART("SmolLM2 not cached (%s): its template not checked (scripts/get-smollm2.sh)", path);
    return;
  }
  char buf[512] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_gguf *g = ms_gguf_open(path, &log);
  CHECKF(g != NULL, "%s: %s", path, buf);
  if (!g) return;
  enum ms_chat_template t = MS_CHAT_TEMPLATE_COUNT;
  CHECKF(ms_chat_template_from_gguf(g, &t, &log) == 0 && t == MS_CHAT_SMOLLM2, "%s: %s", ms_chat_template_name(t), buf);
  ms_gguf_free(g);
}

int main(void) {
  test_detect();
  test_unknown();
  test_render();
  test_refused();
  test_names();
  test_smollm2_file();
  TEST_MAIN_END();
}
