/* SPDX-License-Identifier: MIT */
/* The control socket's commands: each request is parsed with jansson (it is
 * untrusted input: every field is checked for presence, type and range, and
 * unknown fields are refused so that a typo is an error, not a silent default),
 * run against the engine's monitor and telemetry APIs, and answered with JSON
 * written by the project's streaming writer. Runs on the server thread. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control/control_impl.h"
#include "megascope/hook.h"
#include "megascope/json.h"
#include "megascope/attach.h"
#include "megascope/bpf.h"
#include "megascope/plan.h"
#include "megascope/telemetry.h"

#define VERIFIER_LOG_BYTES (256u << 10)

const char *ms_control_code_name(int code) {
  if (code < 0) code = -code;
  switch (code) {
  case EINVAL: return "EINVAL";
  case ENOENT: return "ENOENT";
  case E2BIG: return "E2BIG";
  case EBUSY: return "EBUSY";
  case EPERM: return "EPERM";
  case EACCES: return "EACCES";
  case ENOMEM: return "ENOMEM";
  case EMSGSIZE: return "EMSGSIZE";
  case ETIMEDOUT: return "ETIMEDOUT";
  case ENOSYS: return "ENOSYS";
  case EEXIST: return "EEXIST";
  case EAGAIN: return "EAGAIN";
  case MS_E_FORMAT: return "EFORMAT";
  case MS_E_VERIFY: return "EVERIFY";
  case MS_E_LIMIT: return "ELIMIT";
  case MS_E_STATE: return "ESTATE";
  case MS_E_UNSUPP: return "EUNSUPP";
  default: return "EIO";
  }
}

/* A reply is written into a memory stream; on failure to allocate it, the
 * reply is a fixed error the client still understands. */
static FILE *reply_open(struct creply *r) {
  free(r->buf);
  r->buf = NULL;
  r->len = 0;
  return open_memstream(&r->buf, &r->len);
}

static void reply_close(struct creply *r, FILE *f) {
  if (f && !fclose(f) && r->buf) {
    /* map and section names come from object files as raw bytes: whatever is
     * not UTF-8 becomes '?', so the reply stays valid JSON */
    ms_control_utf8_clean(r->buf);
    return;
  }
  free(r->buf);
  static const char oom[] = "{\"ok\":false,\"code\":\"ENOMEM\",\"error\":\"out of memory writing the reply\"}";
  r->buf = strdup(oom);
  r->len = r->buf ? sizeof oom - 1 : 0;
  r->is_error = 1;
}

void ms_control_reply_error(struct creply *r, int code, const char *log, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ms_control_utf8_clean(msg);  /* user text was clipped, object text is raw bytes */
  char *clean_log = log && log[0] ? strdup(log) : NULL;
  if (clean_log) ms_control_utf8_clean(clean_log);
  for (int i = 0; i < r->n_fds; i++) close(r->fds[i]);
  r->n_fds = 0;
  r->is_error = 1;
  r->deferred = 0;
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 0);
    ms_json_kstr(&j, "code", ms_control_code_name(code));
    ms_json_kstr(&j, "error", msg);
    if (clean_log) ms_json_kstr(&j, "log", clean_log);
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
  r->is_error = 1;
  free(clean_log);
}

/* ---- argument checks ---- */

/* Refuses fields the command does not take (megascope/control.h's table). */
static int check_fields(json_t *req, const char *cmd, struct creply *r) {
  const char *key;
  json_t *v;
  json_object_foreach(req, key, v) {
    if (!strcmp(key, "cmd") || ms_control_command_takes(cmd, key)) continue;
    ms_control_reply_error(r, -EINVAL, NULL, "unknown field \"%.64s\" for command \"%s\"", key, cmd);
    return -1;
  }
  return 0;
}

/* An integer field in [lo, hi]; absent: *out = def (required: error). */
static int get_int(json_t *req, const char *key, int required, long long lo, long long hi, long long def,
                   long long *out, struct creply *r) {
  json_t *v = json_object_get(req, key);
  if (!v) {
    if (required) {
      ms_control_reply_error(r, -EINVAL, NULL, "missing field \"%s\"", key);
      return -1;
    }
    *out = def;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    ms_control_reply_error(r, -EINVAL, NULL, "field \"%s\" must be an integer in %lld..%lld", key, lo, hi);
    return -1;
  }
  *out = json_integer_value(v);
  return 0;
}

static int get_bool(json_t *req, const char *key, int *out, struct creply *r) {
  json_t *v = json_object_get(req, key);
  *out = 0;
  if (!v) return 0;
  if (!json_is_boolean(v)) {
    ms_control_reply_error(r, -EINVAL, NULL, "field \"%s\" must be true or false", key);
    return -1;
  }
  *out = json_is_true(v);
  return 0;
}

/* A monitor name: printable ASCII, at most 63 bytes; default "monitor". */
static int get_name(json_t *req, char *out, size_t size, struct creply *r) {
  json_t *v = json_object_get(req, "name");
  snprintf(out, size, "monitor");
  if (!v) return 0;
  const char *s = json_string_value(v);
  size_t n = s ? strlen(s) : 0;
  int ok = s && n > 0 && n < size;
  for (size_t i = 0; ok && i < n; i++) ok = s[i] > 0x20 && s[i] < 0x7f;
  if (!ok) {
    ms_control_reply_error(r, -EINVAL, NULL, "field \"name\" must be 1 to %zu printable characters", size - 1);
    return -1;
  }
  snprintf(out, size, "%s", s);
  return 0;
}

/* Decodes "object" and loads (and verifies) the monitor; NULL with the reply
 * filled on failure. */
/* The reply for an object the loader or the verifier refused. */
static void load_refused(struct creply *r, const char *rank, const char *name, int err, const char *log) {
  if (err == MS_E_VERIFY) {
    ms_control_reply_error(r, -err, log, "%s%s: the verifier rejected the program (its log follows)", rank, name);
    return;
  }
  char first[256];
  size_t k = strcspn(log, "\n");
  snprintf(first, sizeof first, "%.*s", (int)(k < sizeof first ? k : sizeof first - 1), log);
  /* a one-line log is the message itself; a longer one goes along */
  ms_control_reply_error(r, -err, log[k] && log[k + 1] ? log : NULL, "%s%s: cannot load the object: %s", rank, name,
                         first[0] ? first : ms_strerror(-err));
}

/* Decodes "object" and starts loading and verifying it on a thread of its
 * own (megascope/monitor_job.h): the server thread goes on answering others
 * and polls the job. 0, or an error reply in r. */
static int start_load(struct cclient *cl, json_t *req, const char *name, struct creply *r) {
  json_t *v = json_object_get(req, "object");
  const char *s = json_string_value(v);
  if (!s) {
    ms_control_reply_error(r, -EINVAL, NULL, "missing field \"object\" (the object file's bytes, base64)");
    return -1;
  }
  size_t n = json_string_length(v);
  uint8_t *buf = malloc(n / 4 * 3 + 3);
  if (!buf) {
    ms_control_reply_error(r, -ENOMEM, NULL, "out of memory decoding the object");
    return -1;
  }
  long size = ms_base64_decode(s, n, buf, n / 4 * 3 + 3);
  if (size <= 0) {
    free(buf);
    ms_control_reply_error(r, -EINVAL, NULL, "field \"object\" is not base64 of a non-empty object file");
    return -1;
  }
  cl->job = ms_monitor_job_start(buf, (size_t)size, name, VERIFIER_LOG_BYTES);
  free(cl->load.obj);
  cl->load.obj = buf;  /* an engine across ranks carries these bytes to every rank */
  cl->load.obj_len = (size_t)size;
  if (!cl->job) {
    ms_control_reply_error(r, -errno, NULL, "cannot start verifying the object: %s", ms_strerror(-errno));
    return -1;
  }
  snprintf(cl->load.name, sizeof cl->load.name, "%s", name);
  r->deferred = 1;
  return 0;
}

static void write_hooks(struct ms_json *j, uint32_t hooks) {
  ms_json_key(j, "hooks");
  ms_json_arr_begin(j);
  for (int h = 0; h < MS_HOOK_COUNT; h++)
    if (hooks & (1u << h)) ms_json_str(j, ms_hook_name(h));
  ms_json_arr_end(j);
}

static void write_coverage(struct ms_json *j, const struct ms_coverage *c) {
  ms_json_key(j, "coverage");
  ms_coverage_write_json(j, c);
}

/* ---- commands ---- */

static void cmd_info(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  if (check_fields(req, "info", r)) return;
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 1);
    ms_json_kint(&j, "protocol", MS_CONTROL_PROTOCOL);
    ms_json_kint(&j, "pid", (int64_t)getpid());
    ms_json_kstr(&j, "model", c->model);
    ms_json_kint(&j, "workers", ms_engine_n_workers(c->e));
    ms_json_kint(&j, "ranks", ms_engine_ranks(c->e));  /* across ranks: the socket speaks for all of them */
    ms_json_kstr(&j, "mode", ms_mode_name(ms_engine_mode(c->e)));
    ms_json_knum(&j, "uptime_s", (double)(ms_now_ns() - c->t_start) / 1e9);
    ms_json_key(&j, "commands");
    ms_json_arr_begin(&j);
    for (int i = 0; i < ms_control_n_commands; i++) ms_json_str(&j, ms_control_commands[i].name);
    ms_json_arr_end(&j);
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
}

static uint32_t monitor_hooks(const struct ms_monitor *m) {
  uint32_t hooks = 0;
  for (int i = 0; i < ms_monitor_prog_count(m); i++) {
    int h = ms_monitor_prog_hook(m, i, NULL);
    if (h >= 0 && h < 32) hooks |= 1u << h;
  }
  return hooks;
}

/* The budget fields of attach and replace over *o: a field given sets its
 * value, one absent keeps what *o holds. */
static int get_budget(json_t *req, struct ms_attach_opts *o, struct creply *r) {
  long long mps, sample, rb;
  int interpret = 0;
  if (get_int(req, "max_per_step", 0, 0, UINT32_MAX, o->max_per_step, &mps, r) ||
      get_int(req, "sample", 0, 0, UINT32_MAX, o->sample_every, &sample, r) ||
      get_int(req, "ringbuf_bytes", 0, 0, INT64_MAX, (long long)o->ringbuf_bytes, &rb, r) ||
      get_bool(req, "interpret", &interpret, r))
    return -1;
  o->sz = sizeof *o;
  o->max_per_step = (uint32_t)mps;
  o->sample_every = (uint32_t)sample;
  o->ringbuf_bytes = (uint64_t)rb;
  if (json_object_get(req, "interpret")) o->interpret = (uint32_t)interpret;
  return 0;
}

/* The current options of attachment id when it is attached; -ENOENT otherwise. */
static int live_opts(struct ms_engine *e, long long id, struct ms_attach_opts *o) {
  int n, rc = -ENOENT;
  struct ms_attach_info *info = ms_engine_attach_list_all(e, &n);
  if (!info) return -ENOMEM;
  for (int i = 0; i < n; i++)
    if (info[i].id == id && info[i].attached) {
      *o = info[i].opts;
      rc = 0;
    }
  free(info);
  return rc;
}

static void cmd_attach(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  char name[64];
  struct ms_attach_opts ao = {.sz = sizeof ao};
  if (check_fields(req, "attach", r) || get_name(req, name, sizeof name, r) || get_budget(req, &ao, r))
    return;
  if (start_load(cl, req, name, r)) return;
  cl->load.replace = 0;
  cl->load.ao = ao;
}

/* Across ranks, attachment id (attached here, on rank 0) on every other rank
 * too; when one refuses, rank 0's is detached and freed as well, so the
 * attach fails on all. 0, or -1 with the error reply naming the rank. */
static int carry_to_ranks(struct ms_control *c, int id, const struct cload *ld, struct creply *r) {
  char log[8192] = "";
  struct ms_textbuf tb = {log, sizeof log, 0, 0};
  int rc = ms_engine_ranks_attach(c->e, id, ld->obj, ld->obj_len, ld->name, &ld->ao, &tb);
  if (!rc) return 0;
  ms_engine_detach(c->e, id);
  ms_engine_attach_release(c->e, id);
  size_t k = strcspn(log, "\n");
  ms_control_reply_error(r, rc, log[k] ? log + k + 1 : NULL, "%s: attach failed across ranks, detached on every "
                         "rank: %.*s", ld->name, (int)k, log);
  return -1;
}

/* The attach, once its monitor is verified. */
static void finish_attach(struct ms_control *c, struct ms_monitor *m, const struct cload *ld, struct creply *r) {
  const char *name = ld->name;
  struct ms_attach_opts ao = ld->ao;
  uint32_t hooks = monitor_hooks(m);
  char log[4096] = "";
  struct ms_textbuf tb = {log, sizeof log, 0, 0};
  int id = ms_engine_attach(c->e, m, &ao, &tb);
  if (id < 0) {
    ms_monitor_free(m);
    ms_control_reply_error(r, id, log, "%s%s: attach failed: %s", ms_engine_ranks(c->e) > 1 ? "rank 0: " : "", name,
                           ms_strerror(id));
    return;
  }
  if (carry_to_ranks(c, id, ld, r)) return;
  ms_logf(MS_LOG_INFO, "control: attached %s as %d", name, id);
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 1);
    ms_json_kint(&j, "id", id);
    ms_json_kstr(&j, "name", name);
    write_hooks(&j, hooks);
    ms_json_kuint(&j, "generation", 1);
    ms_json_kint(&j, "ranks", ms_engine_ranks(c->e));
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
}

static void cmd_replace(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  long long id;
  char name[64];
  if (check_fields(req, "replace", r) || get_int(req, "id", 1, 1, INT32_MAX, 0, &id, r) ||
      get_name(req, name, sizeof name, r))
    return;
  struct ms_attach_opts ao;
  int live = live_opts(c->e, id, &ao);
  if (live) {
    ms_control_reply_error(r, live, NULL, "no attachment %lld is attached (unknown id, or detached)", id);
    return;
  }
  if (get_budget(req, &ao, r)) return;
  if (start_load(cl, req, name, r)) return;
  cl->load.replace = 1;
  cl->load.id = id;
  cl->load.ao = ao;
}

/* Across ranks, the replace of attachment id (done here, on rank 0) on every
 * other rank too; when one refuses, the attachment is detached on every rank
 * (rank 0's and the others' would run different programs). 0, or -1 with the
 * error reply naming the rank. */
static int replace_on_ranks(struct ms_control *c, long long id, const struct cload *ld, struct creply *r) {
  char log[8192] = "";
  struct ms_textbuf tb = {log, sizeof log, 0, 0};
  int rc = ms_engine_ranks_replace(c->e, (int)id, ld->obj, ld->obj_len, ld->name, &ld->ao, &tb);
  if (!rc) return 0;
  ms_engine_detach(c->e, (int)id);
  size_t k = strcspn(log, "\n");
  ms_control_reply_error(r, rc, log[k] ? log + k + 1 : NULL, "replace %lld with %s failed across ranks, attachment "
                         "%lld detached on every rank: %.*s", id, ld->name, id, (int)k, log);
  return -1;
}

/* The replace, once its monitor is verified (the attachment may have been
 * detached meanwhile: the engine refuses then). */
static void finish_replace(struct ms_control *c, struct ms_monitor *m, const struct cload *ld, struct creply *r) {
  const char *name = ld->name;
  long long id = ld->id;
  struct ms_attach_opts ao = ld->ao;
  struct ms_coverage cov;
  uint32_t hooks = monitor_hooks(m);
  char log[4096] = "";
  struct ms_textbuf tb = {log, sizeof log, 0, 0};
  int rc = ms_engine_replace_opts(c->e, (int)id, m, &ao, &tb);
  if (rc < 0) {
    ms_monitor_free(m);
    ms_control_reply_error(r, rc, log, "replace %lld with %s failed: %s", id, name, ms_strerror(rc));
    return;
  }
  if (replace_on_ranks(c, id, ld, r)) return;
  ms_logf(MS_LOG_INFO, "control: replaced attachment %lld with %s", id, name);
  memset(&cov, 0, sizeof cov);
  ms_engine_attach_coverage(c->e, (int)id, 0, &cov);
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 1);
    ms_json_kint(&j, "id", id);
    ms_json_kstr(&j, "name", name);
    write_hooks(&j, hooks);
    ms_json_kuint(&j, "generation", cov.generation);
    ms_json_kint(&j, "ranks", ms_engine_ranks(c->e));
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
}

static void cmd_detach(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  long long id;
  if (check_fields(req, "detach", r) || get_int(req, "id", 1, 1, INT32_MAX, 0, &id, r)) return;
  /* the other ranks first: their last maps are read as they detach */
  int across = ms_engine_ranks_detach(c->e, (int)id);
  int rc = ms_engine_detach(c->e, (int)id);
  if (!rc && across) {
    ms_control_reply_error(r, across, NULL, "detach %lld: detached on rank 0; the other ranks: %s", id,
                           ms_strerror(across));
    return;
  }
  if (rc == -ENOENT) {
    ms_control_reply_error(r, rc, NULL, "no attachment %lld is attached (unknown id, or detached already)", id);
    return;
  }
  if (rc) {
    ms_control_reply_error(r, rc, NULL, "detach %lld failed: %s", id, ms_strerror(rc));
    return;
  }
  ms_logf(MS_LOG_INFO, "control: detached %lld", id);
  FILE *f = reply_open(r);
  if (f) fprintf(f, "{\"ok\":true,\"id\":%lld}", id);
  reply_close(r, f);
}

/* Across ranks: the sum of every rank's coverage of attachment id (counts
 * add; the steps seen span them all; generation and times are rank 0's), and
 * each rank's beside it ("ranks"). Elsewhere nothing is written. */
static void coverage_add(struct ms_coverage *t, const struct ms_coverage *c) {
  t->eligible += c->eligible;
  t->executed += c->executed;
  t->throttled += c->throttled;
  t->lost += c->lost;
  t->failed += c->failed;
  if (c->first_step < t->first_step) t->first_step = c->first_step;
  if (c->last_step > t->last_step) t->last_step = c->last_step;
}

static void write_ranks_coverage(struct ms_engine *e, struct ms_json *j, int id, struct ms_coverage *total) {
  int n = ms_engine_ranks(e);
  if (n < 2) return;
  ms_json_key(j, "ranks");
  ms_json_arr_begin(j);
  for (int rank = 0; rank < n; rank++) {
    struct ms_coverage cov;
    if (ms_engine_ranks_coverage(e, id, rank, &cov)) continue;  /* not answered yet: left out, and of the total */
    if (rank) coverage_add(total, &cov);
    ms_json_obj_begin(j);
    ms_json_kint(j, "rank", rank);
    write_coverage(j, &cov);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
}

/* Across ranks: the attachments every rank holds (what a refused attach
 * must leave at none). */
static void write_ranks_held(struct ms_engine *e, struct ms_json *j) {
  int n = ms_engine_ranks(e);
  if (n < 2) return;
  ms_json_key(j, "ranks");
  ms_json_arr_begin(j);
  for (int rank = 0; rank < n; rank++) {
    ms_json_obj_begin(j);
    ms_json_kint(j, "rank", rank);
    ms_json_kint(j, "attachments", ms_engine_ranks_held(e, rank));
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
}

static void cmd_list(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  long long only;
  if (check_fields(req, "list", r) || get_int(req, "id", 0, 1, INT32_MAX, 0, &only, r)) return;
  if (ms_engine_ranks(c->e) > 1 && ms_engine_ranks_sync(c->e)) {  /* the other ranks' coverage, now */
    ms_control_reply_error(r, -EPIPE, NULL, "the other ranks did not answer (the engine stopped)");
    return;
  }
  int n;
  struct ms_attach_info *info = ms_engine_attach_list_all(c->e, &n);
  if (!info) {
    ms_control_reply_error(r, -ENOMEM, NULL, "out of memory");
    return;
  }
  if (only) {  /* one attachment (a reader's state poll): the array holds it or nothing */
    int k = 0;
    for (int i = 0; i < n; i++)
      if (info[i].id == only) info[k++] = info[i];
    n = k;
  }
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 1);
    write_ranks_held(c->e, &j);
    ms_json_key(&j, "attachments");
    ms_json_arr_begin(&j);
    for (int i = 0; i < n; i++) {
      ms_json_obj_begin(&j);
      ms_json_kint(&j, "id", info[i].id);
      ms_json_kstr(&j, "name", info[i].name);
      ms_json_kbool(&j, "attached", info[i].attached);
      write_hooks(&j, info[i].hooks);
      ms_json_kuint(&j, "generation", info[i].cov.generation);
      ms_json_kuint(&j, "first_generation", info[i].first_generation);
      /* across ranks "coverage" is every rank's together, "ranks" each one's */
      write_ranks_coverage(c->e, &j, info[i].id, &info[i].cov);
      write_coverage(&j, &info[i].cov);
      ms_json_key(&j, "budget");
      ms_json_obj_begin(&j);
      ms_json_kuint(&j, "max_per_step", info[i].opts.max_per_step);
      ms_json_kuint(&j, "sample", info[i].opts.sample_every ? info[i].opts.sample_every : 1);
      ms_json_kuint(&j, "ringbuf_bytes", info[i].opts.ringbuf_bytes);
      ms_json_obj_end(&j);
      /* how the current generation runs: native code (the JIT) or interpreted */
      ms_json_kuint(&j, "programs", info[i].n_progs);
      ms_json_kuint(&j, "jitted", info[i].n_jitted);
      ms_json_obj_end(&j);
    }
    ms_json_arr_end(&j);
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
  free(info);
}

/* Across ranks, the text of "maps" goes on with every other rank's maps,
 * decoded as rank 0's are, as rank 0 read them just now (merged, they are
 * what `megascope query` prints). */
struct rank_text {
  int rank;
  const char *name;
  struct ms_coverage cov;
  const struct ms_plan *plan;
  FILE *f;
};

/* Under the lock of the engine's copies: calls nothing of the engine. */
static int rank_text(const struct ms_attach_view *v, void *arg) {
  struct rank_text *rt = arg;
  fprintf(rt->f, "rank %d: ", rt->rank);
  return ms_monitor_write_maps(rt->name, v->maps, v->n_maps, v->n_maps ? ms_bpf_map_workers(v->maps[0]) : 1,
                               &rt->cov, rt->plan, rt->f, 0);
}

static void write_ranks_text(struct ms_control *c, int id, FILE *f) {
  int n = ms_engine_ranks(c->e);
  char name[64] = "";
  if (n < 2 || ms_engine_ranks_sync(c->e) || ms_engine_attach_generation(c->e, id, 0, name, sizeof name, NULL))
    return;
  for (int rank = 1; rank < n; rank++) {
    struct rank_text rt = {rank, name, {0}, ms_engine_plan(c->e, 1), f};
    if (!ms_engine_ranks_coverage(c->e, id, rank, &rt.cov)) ms_engine_ranks_visit(c->e, id, rank, rank_text, &rt);
  }
}

/* Across ranks, "maps" with "rank": r > 0 hands over rank r's maps as rank
 * 0 read them just now (its copies of them; megascope/attach.h). */
static void maps_of_rank(struct ms_control *c, long long id, int rank, int want_fds, struct creply *r) {
  int fds[MS_CONTROL_MAX_FDS], n_fds = 0;
  char names[MS_CONTROL_MAX_FDS][64];
  struct ms_coverage cov;
  int rc = ms_engine_ranks_sync(c->e);
  if (!rc) rc = ms_engine_ranks_coverage(c->e, (int)id, rank, &cov);
  if (!rc && want_fds) rc = n_fds = ms_control_map_fds_of_rank(c->e, (int)id, rank, fds, names, MS_CONTROL_MAX_FDS);
  if (rc < 0) {
    ms_control_reply_error(r, rc, NULL, "cannot hand over rank %d's maps of attachment %lld: %s", rank, id,
                           ms_strerror(rc));
    return;
  }
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 1);
    ms_json_kint(&j, "id", id);
    ms_json_kint(&j, "rank", rank);
    write_coverage(&j, &cov);
    ms_json_key(&j, "fds");
    ms_json_arr_begin(&j);
    for (int i = 0; i < n_fds; i++) ms_json_str(&j, names[i]);
    ms_json_arr_end(&j);
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
  if (r->is_error)
    while (n_fds > 0) close(fds[--n_fds]);
  for (int i = 0; i < n_fds; i++) r->fds[i] = fds[i];
  r->n_fds = n_fds;
}

static void cmd_maps(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  long long id, rank;
  int want_fds, release;
  if (check_fields(req, "maps", r) || get_int(req, "id", 1, 1, INT32_MAX, 0, &id, r) ||
      get_bool(req, "fds", &want_fds, r) || get_bool(req, "release", &release, r) ||
      get_int(req, "rank", 0, 0, ms_engine_ranks(c->e) - 1, 0, &rank, r))
    return;
  if (rank) {
    maps_of_rank(c, id, (int)rank, want_fds, r);
    return;
  }
  struct ms_coverage cov;
  if (ms_engine_attach_coverage(c->e, (int)id, 0, &cov)) {
    ms_control_reply_error(r, -ENOENT, NULL, "no attachment %lld (unknown id, or freed after its retention)", id);
    return;
  }
  if (release && !cov.t_end) {
    ms_control_reply_error(r, -MS_E_STATE, NULL,
                           "attachment %lld is attached: \"release\" frees a detached one after its last read-out",
                           id);
    return;
  }
  int fds[MS_CONTROL_MAX_FDS], n_fds = 0;
  char names[MS_CONTROL_MAX_FDS][64];
  if (want_fds && (n_fds = ms_control_map_fds(c->e, (int)id, fds, names, MS_CONTROL_MAX_FDS)) < 0) {
    ms_control_reply_error(r, n_fds, NULL, "cannot hand over the maps of %lld: %s", id, ms_strerror(n_fds));
    return;
  }
  char *text = NULL;
  size_t text_len = 0;
  FILE *tf = open_memstream(&text, &text_len);
  if (tf) {
    ms_engine_attach_write(c->e, (int)id, tf, 0);
    write_ranks_text(c, (int)id, tf);
    fclose(tf);
  }
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 1);
    ms_json_kint(&j, "id", id);
    ms_json_kint(&j, "ranks", ms_engine_ranks(c->e));  /* rank r's maps: "rank": r */
    ms_json_key(&j, "attachment");
    int rc = ms_engine_attach_write_json(c->e, (int)id, &j);
    if (rc) ms_json_null(&j);
    ms_json_kstr(&j, "text", text ? text : "");
    if (n_fds > 0) {
      ms_json_key(&j, "fds");
      ms_json_arr_begin(&j);
      for (int i = 0; i < n_fds; i++) ms_json_str(&j, names[i]);
      ms_json_arr_end(&j);
    }
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
  free(text);
  if (r->is_error)
    while (n_fds > 0) close(fds[--n_fds]);
  for (int i = 0; i < n_fds; i++) r->fds[i] = fds[i];
  r->n_fds = n_fds > 0 ? n_fds : 0;
  /* the last read-out is written: free the attachment now (descriptors
   * handed over keep their memory alive in the reader) */
  if (release && !r->is_error && !ms_engine_attach_release(c->e, (int)id))
    ms_logf(MS_LOG_INFO, "control: released attachment %lld after its last read-out", id);
}

static void cmd_schema(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  long long rows;
  if (check_fields(req, "schema", r) || get_int(req, "rows", 0, 1, 1 << 20, 1, &rows, r)) return;
  const struct ms_plan *p = ms_engine_plan(c->e, (int)rows);
  if (!p) {
    ms_control_reply_error(r, -EINVAL, NULL, "no plan holds %lld rows (more than the engine's batch)", rows);
    return;
  }
  FILE *f = reply_open(r);
  if (f) {
    fprintf(f, "{\"ok\":true,\"rows\":%lld,\"bucket\":%d,\"buckets\":[", rows, ms_plan_batch(p));
    /* every bucket the engine runs, with the size of its plan: class ids and
     * names are the same in every bucket, task counts are not */
    int k = 0;
    for (const struct ms_plan *b = ms_engine_plan(c->e, 1); b; b = ms_engine_plan(c->e, ms_plan_batch(b) + 1)) {
      struct ms_plan_stats st;
      ms_plan_get_stats(b, &st);
      fprintf(f, "%s{\"bucket\":%d,\"tasks\":%d,\"events\":%d,\"task_classes\":%d,\"event_classes\":%d}",
              k++ ? "," : "", ms_plan_batch(b), st.tasks, st.events, st.task_classes, st.event_classes);
      if (ms_engine_plan(c->e, ms_plan_batch(b) + 1) == b) break;
    }
    fputs("],\"schema\":", f);
    int rc = ms_plan_write_schema(p, f, 0);
    fputs("}", f);
    if (rc) {
      fclose(f);
      ms_control_reply_error(r, rc, NULL, "cannot write the schema: %s", ms_strerror(rc));
      return;
    }
  }
  reply_close(r, f);
}

/* The histogram's buckets ("hist": upper bounds in seconds and the counts,
 * not cumulative, the last one past every bound), which clients that ask
 * several engines add bucket by bucket. */
static void write_buckets(struct ms_json *j, const struct ms_histogram *h) {
  ms_json_key(j, "hist");
  ms_json_obj_begin(j);
  ms_json_key(j, "le_s");
  ms_json_arr_begin(j);
  for (int i = 0; i < MS_LAT_BUCKETS; i++) ms_json_num(j, ms_latency_bounds[i]);
  ms_json_arr_end(j);
  ms_json_key(j, "counts");
  ms_json_arr_begin(j);
  for (int i = 0; i <= MS_LAT_BUCKETS; i++) ms_json_uint(j, h->counts[i]);
  ms_json_arr_end(j);
  ms_json_obj_end(j);
}

static void write_hist(struct ms_json *j, const char *key, const struct ms_histogram *h) {
  ms_json_key(j, key);
  ms_json_obj_begin(j);
  ms_json_kuint(j, "count", h->count);
  ms_json_knum(j, "sum_s", h->sum);
  ms_json_knum(j, "mean_s", h->count ? h->sum / (double)h->count : 0);
  ms_json_knum(j, "p50_s", h->count ? ms_histogram_quantile(h, 0.5) : 0);
  ms_json_knum(j, "p90_s", h->count ? ms_histogram_quantile(h, 0.9) : 0);
  ms_json_knum(j, "p99_s", h->count ? ms_histogram_quantile(h, 0.99) : 0);
  write_buckets(j, h);
  ms_json_obj_end(j);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* TTFT or TPOT: the histogram's count, sum and mean, and quantiles measured
 * (nearest rank) on the last MS_LAT_RECENT requests' exact figures, with how
 * many they are ("quantiles_of"), not interpolated between bucket edges; the
 * histogram's buckets; with "recent" the figures themselves. */
static void write_latency(struct ms_json *j, const char *key, const struct ms_histogram *h,
                          const struct ms_engine *e, int which, int recent) {
  static const double qs[] = {0.5, 0.9, 0.99};
  static const char *const names[] = {"p50_s", "p90_s", "p99_s"};
  double *v = malloc(MS_LAT_RECENT * sizeof *v);
  int n = v ? ms_engine_latency_recent(e, which, v, MS_LAT_RECENT) : 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  ms_json_key(j, key);
  ms_json_obj_begin(j);
  ms_json_kuint(j, "count", h->count);
  ms_json_knum(j, "sum_s", h->sum);
  ms_json_knum(j, "mean_s", h->count ? h->sum / (double)h->count : 0);
  for (int i = 0; i < 3; i++) {
    int rank = (int)ceil(qs[i] * n);  /* nearest rank: the smallest value with at least q of them at or below */
    ms_json_knum(j, names[i], n ? v[rank > 0 ? rank - 1 : 0] : 0);
  }
  ms_json_kint(j, "quantiles_of", n);
  ms_json_knum(j, "min_s", n ? v[0] : 0);
  ms_json_knum(j, "max_s", n ? v[n - 1] : 0);
  write_buckets(j, h);
  if (recent) { /* the figures themselves, sorted: several engines' quantiles are taken over all of them */
    ms_json_key(j, "recent_s");
    ms_json_arr_begin(j);
    for (int i = 0; i < n; i++) ms_json_num(j, v[i]);
    ms_json_arr_end(j);
  }
  ms_json_obj_end(j);
  free(v);
}

/* What the OS says of each worker thread (ms_engine_worker_os): explain
 * takes a window's difference to tell a shared CPU from slow tasks. */
static void write_os(struct ms_json *j, int w, const struct ms_worker_os *os, int known) {
  ms_json_obj_begin(j);
  ms_json_kint(j, "worker", w);
  ms_json_kint(j, "pinned_cpu", os->pinned_cpu);
  ms_json_kint(j, "last_cpu", os->last_cpu);
  ms_json_kbool(j, "known", known);
  ms_json_kuint(j, "run_ns", os->run_ns);
  ms_json_kuint(j, "runqueue_ns", os->runqueue_ns);
  ms_json_kuint(j, "preempted", os->preempted);
  ms_json_obj_end(j);
}

static void write_worker_os(struct ms_json *j, const struct ms_engine *e, int n) {
  ms_json_key(j, "worker_os");
  ms_json_arr_begin(j);
  for (int w = 0; w < n; w++) {
    struct ms_worker_os os;
    int rc = ms_engine_worker_os(e, w, &os);
    write_os(j, w, &os, rc == 0);
  }
  ms_json_arr_end(j);
}

/* Across ranks: each rank's own counters ("ranks": workers, tasks, stalls,
 * its communication, its workers' OS view) and the whole engine's ("engine":
 * their sums). Steps, tokens and requests above are already the whole
 * engine's (rank 0 decides them); workers, tasks, stalls and worker_os above
 * stay rank 0's, one rank's as a reader of one process expects (explain takes
 * a rank's worker count there and every rank's OS view here). */
static void write_ranks_stats(struct ms_engine *e, struct ms_json *j) {
  int n = ms_engine_ranks(e);
  uint64_t workers = 0, tasks = 0, stalls = 0, wait_ns = 0, received = 0;
  if (n < 2 || ms_engine_ranks_read_stats(e)) return;
  ms_json_key(j, "ranks");
  ms_json_arr_begin(j);
  for (int rank = 0; rank < n; rank++) {
    struct ms_engine_stats st;
    struct ms_comm_stats cs;
    struct ms_worker_os os[64];
    int nw = ms_engine_rank_stats(e, rank, &st, &cs, os, 64);
    if (nw < 0) continue;
    workers += (uint64_t)nw, tasks += st.tasks, stalls += st.stalls, wait_ns += cs.wait_ns, received += cs.received;
    ms_json_obj_begin(j);
    ms_json_kint(j, "rank", rank);
    ms_json_kint(j, "workers", nw);
    ms_json_kuint(j, "tasks", st.tasks);
    ms_json_kuint(j, "stalls", st.stalls);
    ms_json_key(j, "comm");
    ms_json_obj_begin(j);
    ms_json_kuint(j, "sent", cs.sent);
    ms_json_kuint(j, "received", cs.received);
    ms_json_kuint(j, "bytes_received", cs.bytes_received);
    ms_json_kuint(j, "wait_ns", cs.wait_ns);
    ms_json_obj_end(j);
    ms_json_key(j, "worker_os");
    ms_json_arr_begin(j);
    for (int w = 0; w < nw && w < 64; w++) write_os(j, w, &os[w], os[w].last_cpu >= 0);
    ms_json_arr_end(j);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  ms_json_key(j, "engine");
  ms_json_obj_begin(j);
  ms_json_kint(j, "ranks", n);
  ms_json_kuint(j, "workers", workers);
  ms_json_kuint(j, "tasks", tasks);
  ms_json_kuint(j, "stalls", stalls);
  ms_json_kuint(j, "comm_received", received);
  ms_json_kuint(j, "comm_wait_ns", wait_ns);
  ms_json_obj_end(j);
}

static void cmd_stats(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  if (check_fields(req, "stats", r)) return;
  json_t *rq = json_object_get(req, "recent");
  if (rq && !json_is_boolean(rq)) {
    ms_control_reply_error(r, -EINVAL, NULL, "field \"recent\" must be true or false");
    return;
  }
  int recent = json_is_true(rq);
  struct ms_engine_stats st;
  struct ms_latency_stats lat;
  struct ms_control_stats cs;
  ms_engine_get_stats(c->e, &st);
  ms_engine_latency(c->e, &lat);
  ms_control_stats_read(c, &cs);
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 1);
    ms_json_kstr(&j, "model", c->model);
    ms_json_kint(&j, "workers", st.n_workers);
    ms_json_knum(&j, "uptime_s", (double)(ms_now_ns() - c->t_start) / 1e9);
    ms_json_kuint(&j, "steps", st.steps);
    ms_json_kuint(&j, "tokens", st.tokens);
    ms_json_kuint(&j, "positions", st.positions);
    ms_json_kuint(&j, "tasks", st.tasks);
    ms_json_kuint(&j, "stalls", st.stalls);
    ms_json_kuint(&j, "requests_finished", lat.requests_finished);
    ms_json_kuint(&j, "requests_cancelled", lat.requests_cancelled);
    write_latency(&j, "ttft", &lat.ttft, c->e, 0, recent);
    write_latency(&j, "tpot", &lat.tpot, c->e, 1, recent);
    write_hist(&j, "itl", &lat.itl);
    ms_json_kint(&j, "kv_pages_used", st.kv_pages_used);
    ms_json_kint(&j, "kv_pages", st.kv_pages);
    ms_json_key(&j, "prefix_cache");
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "on", st.prefix_cache);
    ms_json_kuint(&j, "queries", st.prefix_queries);
    ms_json_kuint(&j, "hits", st.prefix_hits);
    ms_json_knum(&j, "hit_rate", st.prefix_queries ? (double)st.prefix_hits / (double)st.prefix_queries : 0.0);
    ms_json_kuint(&j, "hit_requests", st.prefix_hit_requests);
    ms_json_kint(&j, "pages_cached", st.prefix_pages_cached);
    ms_json_kuint(&j, "evictions", st.prefix_evictions);
    ms_json_obj_end(&j);
    ms_json_key(&j, "control");
    ms_json_obj_begin(&j);
    ms_json_kuint(&j, "accepted", cs.accepted);
    ms_json_kuint(&j, "refused", cs.refused);
    ms_json_kuint(&j, "requests", cs.requests);
    ms_json_kuint(&j, "errors", cs.errors);
    ms_json_kuint(&j, "dropped", cs.dropped);
    ms_json_kuint(&j, "idle_closed", cs.idle_closed);
    ms_json_obj_end(&j);
    write_worker_os(&j, c->e, st.n_workers);
    write_ranks_stats(c->e, &j);
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
}

static void cmd_trace(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  if (check_fields(req, "trace", r)) return;
  json_t *v = json_object_get(req, "seconds");
  double secs = v && json_is_number(v) ? json_number_value(v) : -1;
  if (!(secs > 0 && secs <= 3600)) {
    ms_control_reply_error(r, -EINVAL, NULL, "field \"seconds\" must be a number in (0, 3600]");
    return;
  }
  long long rpw, max_events, max_bytes;
  if (get_int(req, "records_per_worker", 0, 1, 1 << 26, 0, &rpw, r)) return;
  if (get_int(req, "max_events", 0, 0, 1LL << 40, 0, &max_events, r)) return;
  if (get_int(req, "max_bytes", 0, 0, 1LL << 40, 0, &max_bytes, r)) return;
  if (max_bytes && max_bytes < 4096) {
    ms_control_reply_error(r, -EINVAL, NULL, "field \"max_bytes\" must be 0 (no limit) or at least 4096");
    return;
  }
  struct ms_trace_write_opts wo = {.sz = sizeof wo, .max_events = (uint64_t)max_events,
                                   .max_bytes = (uint64_t)max_bytes};
  v = json_object_get(req, "format");
  if (v && (!json_is_string(v) || ms_trace_format_parse(json_string_value(v), &wo.format))) {
    ms_control_reply_error(r, -EINVAL, NULL, "field \"format\" must be \"json\" or \"perfetto\"");
    return;
  }
  if (c->trace_on) {
    ms_control_reply_error(r, -EBUSY, NULL, "a trace is already being recorded; try again when it ends");
    return;
  }
  int rc = ms_engine_trace_start(c->e, (uint32_t)rpw);
  if (rc) {
    ms_control_reply_error(r, rc, NULL, "cannot start the trace: %s%s", ms_strerror(rc),
                           rc == -MS_E_UNSUPP ? " (the CUDA backend traces its megakernel's tasks, not per-op "
                                                "mode's graph: trace those with a monitor, e.g. step_trace.bpf.o)"
                                              : "");
    return;
  }
  c->trace_on = 1;
  c->trace_opts = wo;
  c->trace_client = cl;
  c->trace_deadline = ms_now_ns() + (uint64_t)(secs * 1e9);
  r->deferred = 1;
}

void ms_control_load_finish(struct ms_control *c, struct cclient *cl, struct creply *r) {
  int err = 0;
  const char *log = "";
  struct ms_monitor *m = ms_monitor_job_take(cl->job, &err, &log);
  if (!m) load_refused(r, ms_engine_ranks(c->e) > 1 ? "rank 0: " : "", cl->load.name, -err, log ? log : "");
  else if (cl->load.replace) finish_replace(c, m, &cl->load, r);
  else finish_attach(c, m, &cl->load, r);
  ms_monitor_job_free(cl->job);
  cl->job = NULL;
  free(cl->load.obj);
  cl->load.obj = NULL;
}

void ms_control_trace_finish(struct ms_control *c, struct creply *r) {
  ms_engine_trace_stop(c->e);
  c->trace_on = 0;
  struct ms_trace_stats ts;
  ms_engine_trace_stats(c->e, &ts);
  int fd = memfd_create("megascope-trace", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    ms_control_reply_error(r, -errno, NULL, "cannot create the trace's memfd: %s", strerror(errno));
    return;
  }
  int dfd = dup(fd);
  FILE *tf = dfd >= 0 ? fdopen(dfd, "w") : NULL;
  struct ms_trace_written tw = {0};
  int rc = tf ? ms_engine_trace_save(c->e, tf, &c->trace_opts, &tw) : -errno;
  if (tf && fclose(tf) && !rc) rc = -EIO;
  if (!tf && dfd >= 0) close(dfd);
  struct stat st;
  if (!rc && fstat(fd, &st)) rc = -errno;
  if (rc) {
    close(fd);
    ms_control_reply_error(r, rc, NULL, "cannot write the trace: %s", ms_strerror(rc));
    return;
  }
  /* the reader gets a file nobody can change any more */
  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 1);
    ms_json_kuint(&j, "records", ts.records);
    ms_json_kuint(&j, "dropped", ts.dropped);
    ms_json_kuint(&j, "bytes", (uint64_t)st.st_size);
    ms_json_kstr(&j, "format", ms_trace_format_name(c->trace_opts.format));
    ms_json_kuint(&j, "slices", tw.slices);
    ms_json_kuint(&j, "counters", tw.counters);
    ms_json_kuint(&j, "flows", tw.flows);
    ms_json_kuint(&j, "budget_dropped", tw.budget_dropped);
    ms_json_kuint(&j, "outside_window", tw.outside);
    ms_json_kuint(&j, "window_ns", tw.window_ns);
    ms_json_kuint(&j, "kept_ns", tw.kept_ns);
    ms_json_key(&j, "fds");
    ms_json_arr_begin(&j);
    ms_json_str(&j, "trace");
    ms_json_arr_end(&j);
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
  if (r->is_error) {
    close(fd);
    return;
  }
  r->fds[0] = fd;
  r->n_fds = 1;
}

/* Hands over the ring buffers of attachment id to one consumer (the client
 * that asked, until it disconnects), with their record layouts. */
static void cmd_records(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r) {
  long long id, rank;
  if (check_fields(req, "records", r) || get_int(req, "id", 1, 1, INT32_MAX, 0, &id, r) ||
      get_int(req, "rank", 0, 0, ms_engine_ranks(c->e) - 1, 0, &rank, r))
    return;
  /* across ranks, "rank": r > 0 hands over rank r's rings as rank 0's copies
   * (its records move there at every read, e.g. the reader's "list") */
  if (rank && ms_engine_ranks_sync(c->e)) {
    ms_control_reply_error(r, -EPIPE, NULL, "the other ranks did not answer (the engine stopped)");
    return;
  }
  for (int i = 0; i < c->n_cl; i++)
    if (c->cl[i] != cl && c->cl[i]->reader_id == id) {
      ms_control_reply_error(r, -EBUSY, NULL,
                             "attachment %lld's ring buffers already have a reader (pid %ld); a ring buffer has one "
                             "consumer",
                             id, (long)c->cl[i]->pid);
      return;
    }
  struct ms_coverage cov;
  if (ms_engine_attach_coverage(c->e, (int)id, 0, &cov)) {
    ms_control_reply_error(r, -ENOENT, NULL, "no attachment %lld (unknown id, or freed after its retention)", id);
    return;
  }
  int fds[MS_CONTROL_MAX_FDS], n = 0;
  char names[MS_CONTROL_MAX_FDS][64];
  uint32_t gen = 0;
  FILE *f = reply_open(r);
  if (f) {
    struct ms_json j;
    ms_json_init(&j, f, 0);
    ms_json_obj_begin(&j);
    ms_json_kbool(&j, "ok", 1);
    ms_json_kint(&j, "id", id);
    ms_json_kbool(&j, "attached", cov.t_end == 0);
    ms_json_kint(&j, "ranks", ms_engine_ranks(c->e));  /* rank r's rings: "rank": r */
    n = ms_control_ring_fds(c->e, (int)id, (int)rank, &j, fds, names, MS_CONTROL_MAX_FDS, &gen);
    ms_json_kuint(&j, "generation", gen);
    ms_json_kuint(&j, "lost", cov.lost);
    ms_json_key(&j, "fds");
    ms_json_arr_begin(&j);
    for (int i = 0; i < n; i++) ms_json_str(&j, names[i]);
    ms_json_arr_end(&j);
    ms_json_obj_end(&j);
  }
  reply_close(r, f);
  if (n < 0 || (n == 0 && !r->is_error) || r->is_error) {
    for (int i = 0; i < n; i++) close(fds[i]);
    if (n < 0)
      ms_control_reply_error(r, n, NULL, "cannot hand over the ring buffers of %lld: %s", id, ms_strerror(n));
    else if (!r->is_error)
      ms_control_reply_error(r, -EINVAL, NULL, "attachment %lld has no ring-buffer map", id);
    return;
  }
  for (int i = 0; i < n; i++) r->fds[i] = fds[i];
  r->n_fds = n;
  cl->reader_id = (int)id;
  ms_logf(MS_LOG_INFO, "control: pid %ld reads the ring buffers of attachment %lld (generation %u)", (long)cl->pid,
          id, gen);
}

/* Each command's handler; the names and fields are megascope/control.h's
 * table (ms_control_commands), which test_control_table holds against this. */
static const struct {
  const char *name;
  void (*fn)(struct ms_control *c, struct cclient *cl, json_t *req, struct creply *r);
} handlers[] = {{"info", cmd_info},     {"attach", cmd_attach}, {"replace", cmd_replace},
                {"detach", cmd_detach}, {"list", cmd_list},     {"maps", cmd_maps},
                {"schema", cmd_schema}, {"stats", cmd_stats},   {"trace", cmd_trace},
                {"records", cmd_records}};
#define N_HANDLERS (sizeof handlers / sizeof handlers[0])

int ms_control_n_handlers(void) { return (int)N_HANDLERS; }

int ms_control_handles(const char *name) {
  for (size_t i = 0; i < N_HANDLERS; i++)
    if (!strcmp(handlers[i].name, name)) return 1;
  return 0;
}

void ms_control_dispatch(struct ms_control *c, struct cclient *cl, const char *msg, size_t len, struct creply *r) {
  json_error_t err;
  memset(r, 0, sizeof *r);
  if (len == 0) {
    ms_control_reply_error(r, -EINVAL, NULL, "empty message: expected a JSON object with \"cmd\"");
    return;
  }
  json_t *req = json_loadb(msg, len, JSON_REJECT_DUPLICATES, &err);
  if (!req) {
    ms_control_reply_error(r, -MS_E_FORMAT, NULL, "malformed JSON at line %d column %d: %s", err.line, err.column,
                           err.text);
    return;
  }
  const char *cmd = json_string_value(json_object_get(req, "cmd"));
  if (!json_is_object(req)) {
    ms_control_reply_error(r, -EINVAL, NULL, "a request must be a JSON object with \"cmd\"");
  } else if (!cmd) {
    ms_control_reply_error(r, -EINVAL, NULL, "the request has no \"cmd\" string");
  } else {
    size_t i = 0;
    while (i < N_HANDLERS && strcmp(cmd, handlers[i].name)) i++;
    if (i < N_HANDLERS && ms_control_command_find(cmd)) {
      handlers[i].fn(c, cl, req, r);
    } else {
      char names[160] = "";
      for (int k = 0; k < ms_control_n_commands; k++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? " " : "", ms_control_commands[k].name);
      ms_control_reply_error(r, -ENOSYS, NULL, "unknown command \"%.64s\" (commands: %s)", cmd, names);
    }
  }
  json_decref(req);
}
