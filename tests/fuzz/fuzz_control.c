/* SPDX-License-Identifier: MIT */
/* libFuzzer target over the control socket's request handling: one input is
 * the JSON body of one request frame, dispatched exactly as the server thread
 * dispatches it (ms_control_dispatch) against a small idle engine. The oracle:
 * every request gets a reply that is a JSON object with a boolean "ok", and an
 * error reply carries "error" and "code" strings (a reply a client cannot parse
 * is a bug, and the target aborts). Attachments a lucky input makes are
 * detached again and a trace it starts is finished at once, so inputs stay
 * independent.
 *
 * Built by scripts/fuzz_control.sh with clang -fsanitize=fuzzer,address,undefined;
 * tests/test_control_fuzz_corpus.c includes this file and replays a corpus
 * (tests/fuzz/control/ and attach requests made from the shipped monitors,
 * damaged) through LLVMFuzzerTestOneInput without libFuzzer. */
#include <jansson.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/control_impl.h"
#include "megascope/engine.h"
#include "megascope/model.h"
#include "megascope/attach.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct ms_control *fuzz_control(void) {
  static struct ms_control *c;
  if (c) return c;
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_F32, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);  /* lives as long as the process */
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = 1, .max_batch = 2, .max_ctx = 32};
  struct ms_engine *e = m ? ms_engine_new(m, &eo, NULL) : NULL;
  if (!e) abort();
  c = calloc(1, sizeof *c);
  if (!c) abort();
  c->e = e;
  c->lfd = c->wake_fd = -1;
  c->max_message = MS_CONTROL_MAX_MESSAGE;
  c->max_clients = 1;
  c->message_timeout_ms = 1000;
  c->t_start = ms_now_ns();
  snprintf(c->model, sizeof c->model, "tiny");
  return c;
}

static void fail(const char *why, const struct creply *r) {
  fprintf(stderr, "fuzz_control: %s\nreply (%zu bytes): %.*s\n", why, r->len, (int)(r->len < 4096 ? r->len : 4096),
          r->buf ? r->buf : "");
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (4u << 20)) return 0;
  struct ms_control *c = fuzz_control();
  char *msg = malloc(size + 1);
  if (!msg) return 0;
  memcpy(msg, data, size);
  msg[size] = '\0';
  struct cclient cl = {.fd = -1, .uid = getuid(), .pid = getpid()};
  struct creply r;
  ms_control_dispatch(c, &cl, msg, size, &r);
  free(msg);
  if (r.deferred && cl.job) { /* an attach or replace verifying off the thread: wait for it, as poll would */
    struct pollfd pw = {ms_monitor_job_fd(cl.job), POLLIN, 0};
    while (poll(&pw, 1, -1) < 0) {
    }
    r.deferred = 0;
    ms_control_load_finish(c, &cl, &r);
  } else if (r.deferred) {
    if (!c->trace_on || c->trace_client != &cl) fail("a deferred reply without a trace in progress", &r);
    c->trace_client = NULL;
    ms_control_trace_finish(c, &r);
  }
  if (c->trace_on) fail("a trace left running", &r);
  json_error_t err;
  json_t *j = r.buf ? json_loadb(r.buf, r.len, 0, &err) : NULL;
  if (!j || !json_is_object(j)) fail(j ? "the reply is not an object" : "the reply is not JSON", &r);
  json_t *ok = json_object_get(j, "ok");
  if (!json_is_boolean(ok)) fail("the reply has no boolean ok", &r);
  if (json_is_false(ok) && (!json_is_string(json_object_get(j, "error")) || !json_is_string(json_object_get(j, "code"))))
    fail("an error reply without error and code", &r);
  if (json_is_false(ok) != (r.is_error != 0)) fail("is_error disagrees with ok", &r);
  /* keep inputs independent: undo an attach */
  json_t *id = json_object_get(j, "id");
  if (json_is_true(ok) && json_is_integer(id) && json_object_get(j, "hooks") &&
      json_integer_value(id) > 0 && json_integer_value(id) < INT32_MAX)
    ms_engine_detach(c->e, (int)json_integer_value(id));
  json_decref(j);
  for (int i = 0; i < r.n_fds; i++) close(r.fds[i]);
  free(r.buf);
  return 0;
}
