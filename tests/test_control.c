/* SPDX-License-Identifier: MIT */
/* The control socket: framing and base64, every command, and bad input while
 * requests are being decoded — garbage, non-objects, unknown commands and
 * fields, oversized and truncated frames, a client that vanishes mid-frame,
 * objects that are not ELF, detaching twice, too many clients, a peer of
 * another uid (when run as root), stale and live sockets. Throughout, a load
 * thread keeps requests in flight; at the end every one of them must have
 * finished with all its tokens and the server must still answer. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "control/control_impl.h"
#include "megascope/bpf.h"
#include "megascope/control.h"
#include "megascope/engine.h"
#include "megascope/telemetry.h"
#include "megascope/tokenizer.h"
#include "test.h"

/* ---- a load that runs during every check ---- */

struct load {
  struct ms_engine *e;
  _Atomic int stop;
  long finished, bad;
};

static void *load_main(void *arg) {
  struct load *l = arg;
  struct ms_request *r[4] = {0};
  int seq = 0;
  for (long rounds = 0; rounds < 2000000; rounds++) {
    int stopping = atomic_load(&l->stop), live = 0;
    for (int i = 0; i < 4; i++) {
      if (r[i] && ms_request_wait(r[i], 0) == 0) {
        struct ms_request_info info;
        ms_request_get_info(r[i], &info);
        if (info.state == MS_REQ_DONE && info.n_tokens == 24)
          l->finished++;
        else
          l->bad++;
        ms_request_free(r[i]);
        r[i] = NULL;
      }
      if (!r[i] && !stopping) {
        int32_t p[2] = {1 + seq % 200, 7};
        struct ms_request_opts ro = {.sz = sizeof ro, .prompt = p, .n_prompt = 1 + seq++ % 2, .max_new_tokens = 24};
        if (!(r[i] = ms_engine_submit(l->e, &ro))) l->bad++;
      }
      live += r[i] != NULL;
    }
    if (stopping && !live) break;
    struct timespec ts = {0, 500000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

/* ---- raw client helpers ---- */

static void set_path(struct sockaddr_un *sa, const char *path) {
  size_t n = strlen(path);
  if (n >= sizeof sa->sun_path) n = sizeof sa->sun_path - 1;
  memcpy(sa->sun_path, path, n);
  sa->sun_path[n] = '\0';
}

static int raw_connect(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  set_path(&sa, path);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    close(fd);
    return -1;
  }
  return fd;
}

static void send_raw(int fd, const void *p, size_t n) {
  ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
  (void)k;
}

static void send_header(int fd, uint32_t n) {
  uint8_t h[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
  send_raw(fd, h, 4);
}

/* Receives one reply on fd and parses it (NULL on failure). */
static json_t *recv_json(int fd, int *fds, int *n_fds) {
  char *buf = NULL;
  size_t len = 0;
  int rc = ms_control_frame_recv(fd, &buf, &len, MS_CONTROL_MAX_REPLY, fds, n_fds, fds ? MS_CONTROL_MAX_FDS : 0,
                                 10000);
  json_t *j = rc ? NULL : json_loadb(buf, len, 0, NULL);
  free(buf);
  return j;
}

static json_t *call_fd(int fd, const char *req) {
  if (ms_control_frame_send(fd, req, strlen(req), NULL, 0)) return NULL;
  return recv_json(fd, NULL, NULL);
}

/* One request over a fresh connection. */
static json_t *call(const char *path, const char *req) {
  int fd = raw_connect(path);
  if (fd < 0) return NULL;
  json_t *j = call_fd(fd, req);
  close(fd);
  return j;
}

static int is_ok(json_t *j) { return j && json_is_true(json_object_get(j, "ok")); }

static int has_code(json_t *j, const char *code) {
  const char *c = j ? json_string_value(json_object_get(j, "code")) : NULL;
  return j && json_is_false(json_object_get(j, "ok")) && c && !strcmp(c, code);
}

static const char *err_of(json_t *j) {
  const char *e = j ? json_string_value(json_object_get(j, "error")) : NULL;
  return e ? e : "";
}

/* The peer closed: a read returns 0 (or an error) within the timeout. */
static int closed_by_peer(int fd) {
  char c;
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return recv(fd, &c, 1, 0) <= 0;
}

/* {"cmd":CMD,"id":ID,"name":NAME,"object":base64(file)} or NULL. */
static char *object_request(const char *cmd, int id, const char *file) {
  FILE *f = fopen(file, "rb");
  if (!f) return NULL;
  static uint8_t buf[4 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  char *b64 = malloc(ms_base64_encoded_len(n) + 1), *req = malloc(ms_base64_encoded_len(n) + 128);
  ms_base64_encode(buf, n, b64);
  if (id)
    sprintf(req, "{\"cmd\":\"%s\",\"id\":%d,\"name\":\"m%d\",\"object\":\"%s\"}", cmd, id, id, b64);
  else
    sprintf(req, "{\"cmd\":\"%s\",\"name\":\"class_time\",\"object\":\"%s\"}", cmd, b64);
  free(b64);
  return req;
}

static long long coverage_executed(const char *path, int id, long long *gen) {
  json_t *j = call(path, "{\"cmd\":\"list\"}");
  long long ex = -1;
  size_t i;
  json_t *a;
  json_array_foreach(json_object_get(j, "attachments"), i, a) {
    if (json_integer_value(json_object_get(a, "id")) != id) continue;
    ex = json_integer_value(json_object_get(json_object_get(a, "coverage"), "executed"));
    *gen = json_integer_value(json_object_get(a, "generation"));
  }
  json_decref(j);
  return ex;
}

/* ---- the checks ---- */

/* A heavy attach (tests/data/verifier/bad_deep_loop.bpf.c: eight frames and a
 * loop the verifier follows to the run budget, a tenth of a second or more)
 * is verified off the server thread: another client is answered while it
 * runs, and the attach's refusal comes after. Ordering, not time: the other
 * client's reply must be in before the attach's. */
static void test_heavy_attach(const char *path, const char *dir) {
  struct utsname u;
  uname(&u);
  const char *src = getenv("MS_SRC") ? getenv("MS_SRC") : ".";
  char obj[512], cmd[2048];
  snprintf(obj, sizeof obj, "%s/deep.o", dir);
  snprintf(cmd, sizeof cmd, "clang -O2 -g -target bpf -I'%s/include' -I/usr/include/%s-linux-gnu -c "
           "'%s/tests/data/verifier/bad_deep_loop.bpf.c' -o '%s' 2>/dev/null", src, u.machine, src, obj);
  /* clang is a build requirement (the shipped monitors): failing here is a failure */
  CHECKF(system(cmd) == 0, "clang could not build bad_deep_loop.bpf.c: %s", cmd);
  if (access(obj, R_OK)) return;
  char *req = object_request("attach", 0, obj);
  int a = raw_connect(path);
  CHECK(req && a >= 0);
  if (!req || a < 0) goto out;
  uint32_t n = (uint32_t)strlen(req);
  send_header(a, n);
  send_raw(a, req, n);
  json_t *other = call(path, "{\"cmd\":\"list\"}");
  struct pollfd pa = {a, POLLIN, 0};
  int attach_answered = poll(&pa, 1, 0);
  CHECKF(is_ok(other), "another client while an attach verifies: %s", err_of(other));
  CHECKF(attach_answered == 0, "the attach was answered before the other client: verified on the server thread?");
  json_decref(other);
  json_t *ra = recv_json(a, NULL, NULL);
  CHECKF(has_code(ra, "EVERIFY") && strstr(json_string_value(json_object_get(ra, "log")) ?: "", "run budget"),
         "the heavy attach: %s", err_of(ra));
  json_decref(ra);
out:
  if (a >= 0) close(a);
  free(req);
  unlink(obj);
}

static void test_codec(void) {
  const char *in = "megascope\x00\xff";
  char enc[64];
  uint8_t dec[64];
  for (size_t n = 0; n <= 11; n++) {
    ms_base64_encode(in, n, enc);
    CHECK(strlen(enc) == ms_base64_encoded_len(n));
    long k = ms_base64_decode(enc, strlen(enc), dec, sizeof dec);
    CHECK(k == (long)n && !memcmp(dec, in, n));
  }
  ms_base64_encode("ab", 2, enc);
  CHECK(!strcmp(enc, "YWI="));
  CHECK(ms_base64_decode("YW=I", 4, dec, sizeof dec) < 0);  /* padding inside */
  CHECK(ms_base64_decode("YWI", 3, dec, sizeof dec) < 0);   /* length */
  CHECK(ms_base64_decode("Y*I=", 4, dec, sizeof dec) < 0);  /* alphabet */
  CHECK(ms_base64_decode("YWJj", 4, dec, 2) == -E2BIG);

  /* frames over a socket pair, with a descriptor */
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  int devnull = open("/dev/null", O_RDONLY);
  CHECK(ms_control_frame_send(sv[0], "{\"a\":1}", 7, &devnull, 1) == 0);
  char *buf;
  size_t len;
  int fds[4], n_fds = 0;
  CHECK(ms_control_frame_recv(sv[1], &buf, &len, 1024, fds, &n_fds, 4, 1000) == 0);
  CHECK(len == 7 && !strcmp(buf, "{\"a\":1}") && n_fds == 1);
  free(buf);
  if (n_fds == 1) close(fds[0]);
  CHECK(ms_control_frame_send(sv[0], "0123456789", 10, NULL, 0) == 0);
  CHECK(ms_control_frame_recv(sv[1], &buf, &len, 5, NULL, NULL, 0, 1000) == -EMSGSIZE);
  close(sv[0]);
  close(sv[1]);
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  send_header(sv[0], 10);
  send_raw(sv[0], "01234", 5);
  close(sv[0]);  /* the peer leaves mid-frame */
  CHECK(ms_control_frame_recv(sv[1], &buf, &len, 1024, NULL, NULL, 0, 1000) == -ECONNRESET);
  close(sv[1]);
  close(devnull);
}

static void test_tokenizer(void) {
  CHECK(ms_tokenizer_bytes_new(100) == NULL && errno == EINVAL);
  struct ms_tokenizer *t = ms_tokenizer_bytes_new(512);
  CHECK(t != NULL);
  int32_t ids[16];
  CHECK(ms_tokenizer_encode(t, "h\xc3\xa9!", 4, ids, 16) == 4);
  CHECK(ids[0] == 'h' && ids[1] == 0xc3 && ids[2] == 0xa9 && ids[3] == '!');
  CHECK(ms_tokenizer_encode(t, "abcdef", 6, ids, 2) == 6 && ids[1] == 'b');
  int32_t out[] = {'h', 'i', 300, '.'};
  char s[32];
  CHECK(ms_tokenizer_decode(t, out, 4, s, sizeof s) == 10 && !strcmp(s, "hi<|300|>."));
  CHECK(ms_tokenizer_decode(t, out, 4, s, 4) == 10 && !strcmp(s, "hi<"));
  int32_t neg = -1;
  CHECK(ms_tokenizer_decode(t, &neg, 1, s, sizeof s) == -EINVAL);
  ms_tokenizer_free(t);
}

/* Bad input of every kind; each gets its reply (or close) and the server goes on. */
static void test_bad_input(const char *path, struct ms_control *ctl) {
  int fd = raw_connect(path);
  CHECK(fd >= 0);
  json_t *j = call_fd(fd, "this is not json{");
  CHECKF(has_code(j, "EFORMAT") && strstr(err_of(j), "malformed JSON"), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"info\"}");  /* the same connection still works */
  CHECK(is_ok(j) && json_integer_value(json_object_get(j, "protocol")) == MS_CONTROL_PROTOCOL);
  json_decref(j);
  j = call_fd(fd, "[1,2,3]");
  CHECK(has_code(j, "EINVAL"));
  json_decref(j);
  j = call_fd(fd, "{\"command\":\"list\"}");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "\"cmd\""), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"frobnicate\"}");
  CHECKF(has_code(j, "ENOSYS") && strstr(err_of(j), "unknown command \"frobnicate\""), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"list\",\"verbose\":true}");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "unknown field \"verbose\""), "%s", err_of(j));
  json_decref(j);
  /* a long non-ASCII name, clipped inside the message: the reply stays valid UTF-8 JSON */
  char req[512] = "{\"cmd\":\"list\",\"x";
  for (int i = 0; i < 60; i++) strcat(req, "\xc3\xa9");
  strcat(req, "\":1}");
  j = call_fd(fd, req);
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "unknown field"), "%s", err_of(j));
  json_decref(j);
  snprintf(req, sizeof req, "{\"cmd\":\"%s\"}", "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac");
  j = call_fd(fd, req);
  CHECKF(has_code(j, "ENOSYS"), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"detach\",\"id\":\"one\"}");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "\"id\""), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"detach\"}");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "missing field \"id\""), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "empty"), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"attach\",\"object\":\"!!!!\"}");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "base64"), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"attach\",\"object\":\"aGVsbG8gd29ybGQ=\"}");  /* "hello world" */
  CHECKF(j && json_is_false(json_object_get(j, "ok")) && strstr(err_of(j), "cannot load the object"), "%s",
         err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"attach\"}");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "\"object\""), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"detach\",\"id\":4242}");
  CHECKF(has_code(j, "ENOENT"), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"maps\",\"id\":4242}");
  CHECKF(has_code(j, "ENOENT"), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"trace\",\"seconds\":-1}");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "seconds"), "%s", err_of(j));
  json_decref(j);
  j = call_fd(fd, "{\"cmd\":\"schema\",\"rows\":100000}");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "rows"), "%s", err_of(j));
  json_decref(j);
  close(fd);

  struct ms_control_stats before, after;
  ms_control_get_stats(ctl, &before);
  /* oversized: an error reply, then the server closes */
  fd = raw_connect(path);
  send_header(fd, (1u << 20) + 1);
  j = recv_json(fd, NULL, NULL);
  CHECKF(has_code(j, "EMSGSIZE") && strstr(err_of(j), "exceeds the limit"), "%s", err_of(j));
  json_decref(j);
  CHECK(closed_by_peer(fd));
  close(fd);
  /* truncated: a frame begun and never finished times out */
  fd = raw_connect(path);
  send_header(fd, 100);
  send_raw(fd, "{\"cmd\":\"li", 10);
  j = recv_json(fd, NULL, NULL);
  CHECKF(has_code(j, "ETIMEDOUT") && strstr(err_of(j), "truncated message: 14 of"), "%s", err_of(j));
  json_decref(j);
  CHECK(closed_by_peer(fd));
  close(fd);
  /* a client that vanishes mid-frame, and one mid-header */
  fd = raw_connect(path);
  send_header(fd, 100);
  send_raw(fd, "{\"cmd\"", 6);
  close(fd);
  fd = raw_connect(path);
  send_raw(fd, "\x05\x00", 2);
  close(fd);
  /* one that sends a request and leaves before the reply */
  fd = raw_connect(path);
  send_header(fd, 14);
  send_raw(fd, "{\"cmd\":\"list\"}", 14);
  close(fd);
  j = call(path, "{\"cmd\":\"info\"}");
  CHECK(is_ok(j));
  json_decref(j);
  for (int i = 0; i < 100; i++) {  /* the server notices the closes asynchronously */
    ms_control_get_stats(ctl, &after);
    if (after.dropped >= before.dropped + 4) break;
    usleep(10000);
  }
  CHECKF(after.dropped >= before.dropped + 4, "dropped %llu -> %llu", (unsigned long long)before.dropped,
         (unsigned long long)after.dropped);
  CHECK(after.errors > before.errors);
}

/* Deterministic random messages: mutated valid requests, random bytes, random
 * framing. Every one gets a reply or a close; none stops the server. */
static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void test_random_messages(const char *path, struct ms_control *ctl) {
  static const char *const valid[] = {
      "{\"cmd\":\"info\"}", "{\"cmd\":\"list\"}", "{\"cmd\":\"detach\",\"id\":77}",
      "{\"cmd\":\"maps\",\"id\":1,\"fds\":false}", "{\"cmd\":\"schema\",\"rows\":2}",
      "{\"cmd\":\"stats\"}", "{\"cmd\":\"attach\",\"name\":\"x\",\"object\":\"f0VMRgIBAQAAAAAAAAAAAA==\"}",
      "{\"cmd\":\"replace\",\"id\":3,\"object\":\"AAAA\"}", "{\"cmd\":\"trace\",\"seconds\":1e-9}"};
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  int replies = 0, closes = 0;
  for (int i = 0; i < 400; i++) {
    char msg[512];
    size_t n;
    uint64_t kind = rnd(&seed) % 3;
    if (kind == 0) {  /* a valid request with a few bytes changed, inserted or cut */
      const char *v = valid[rnd(&seed) % (sizeof valid / sizeof valid[0])];
      n = strlen(v);
      memcpy(msg, v, n);
      for (int k = (int)(rnd(&seed) % 4); k >= 0; k--) {
        size_t at = rnd(&seed) % n;
        uint64_t op = rnd(&seed) % 3;
        if (op == 0) msg[at] = (char)rnd(&seed);
        else if (op == 1 && n < sizeof msg - 1) { memmove(msg + at + 1, msg + at, n - at); msg[at] = "{}[]\",:0-e"[rnd(&seed) % 11]; n++; }
        else n = at ? at : n;
      }
    } else {  /* random bytes */
      n = rnd(&seed) % 64;
      for (size_t k = 0; k < n; k++) msg[k] = (char)rnd(&seed);
    }
    int fd = raw_connect(path);
    if (fd < 0) continue;
    if (kind == 2) {  /* random framing: a header that may not match, then leave */
      send_header(fd, (uint32_t)(rnd(&seed) % 2 ? n + rnd(&seed) % 8 : rnd(&seed)));
      send_raw(fd, msg, n);
      close(fd);
      continue;
    }
    if (ms_control_frame_send(fd, msg, n, NULL, 0) == 0) {
      json_t *j = recv_json(fd, NULL, NULL);
      if (j && json_object_get(j, "ok")) replies++;
      else closes++;
      json_decref(j);
    }
    close(fd);
  }
  CHECKF(replies > 100, "%d replies, %d closes", replies, closes);
  json_t *j = call(path, "{\"cmd\":\"info\"}");
  CHECK(is_ok(j));
  json_decref(j);
  /* nothing was left attached by a lucky mutation that matters to later checks */
  j = call(path, "{\"cmd\":\"list\"}");
  CHECK(is_ok(j));
  json_decref(j);
  (void)ctl;
}

static void test_monitors(const char *path, const char *mons) {
  char f1[512], f2[512];
  snprintf(f1, sizeof f1, "%s/class_time.bpf.o", mons);
  snprintf(f2, sizeof f2, "%s/queueing.bpf.o", mons);
  char *att = object_request("attach", 0, f1);
  if (!att || access(f2, R_OK)) {
    SKIP_PART("no shipped monitors in %s: the monitor checks not run", mons);
    free(att);
    return;
  }
  json_t *j = call(path, att);
  free(att);
  CHECKF(is_ok(j), "%s", err_of(j));
  int id = (int)json_integer_value(json_object_get(j, "id"));
  CHECK(id > 0);
  json_t *hooks = json_object_get(j, "hooks");
  CHECK(json_array_size(hooks) == 2);
  json_decref(j);
  long long gen = 0, ex = 0;
  for (int i = 0; i < 500 && (ex = coverage_executed(path, id, &gen)) <= 0; i++) usleep(10000);
  CHECKF(ex > 0 && gen == 1, "executed %lld generation %lld", ex, gen);

  char req[128];
  snprintf(req, sizeof req, "{\"cmd\":\"maps\",\"id\":%d,\"fds\":true}", id);
  int fd = raw_connect(path), fds[MS_CONTROL_MAX_FDS], n_fds = 0;
  ms_control_frame_send(fd, req, strlen(req), NULL, 0);
  j = recv_json(fd, fds, &n_fds);
  close(fd);
  CHECK(is_ok(j));
  json_t *a = json_object_get(j, "attachment");
  CHECK(json_is_object(a));
  const char *text = json_string_value(json_object_get(j, "text"));
  CHECK(text && strstr(text, "hist_class_task_ns") && strstr(text, "eligible"));
  CHECK(n_fds == 2 && json_array_size(json_object_get(j, "fds")) == 2);
  for (int i = 0; i < n_fds; i++) {
    struct ms_bpf_map_reader *r = ms_bpf_map_reader_new(fds[i], 0, NULL);
    CHECK(r && ms_bpf_map_reader_header(r)->magic == MS_BPF_MAP_SHM_MAGIC);
    /* read-only: writing through the descriptor fails */
    CHECK(write(fds[i], "x", 1) < 0);
    ms_bpf_map_reader_free(r);
    close(fds[i]);
  }
  json_decref(j);

  char *rep = object_request("replace", id, f2);
  j = call(path, rep);
  CHECKF(is_ok(j) && json_integer_value(json_object_get(j, "generation")) == 2, "%s", err_of(j));
  json_decref(j);
  for (int i = 0; i < 500 && ((ex = coverage_executed(path, id, &gen)) <= 0 || gen != 2); i++) usleep(10000);
  CHECKF(ex > 0 && gen == 2, "executed %lld generation %lld", ex, gen);

  snprintf(req, sizeof req, "{\"cmd\":\"detach\",\"id\":%d}", id);
  j = call(path, req);
  CHECK(is_ok(j));
  json_decref(j);
  j = call(path, req);  /* twice */
  CHECKF(has_code(j, "ENOENT") && strstr(err_of(j), "detached already"), "%s", err_of(j));
  json_decref(j);
  j = call(path, rep);  /* replacing a detached attachment */
  CHECKF(has_code(j, "ENOENT"), "%s", err_of(j));
  json_decref(j);
  free(rep);
  snprintf(req, sizeof req, "{\"cmd\":\"maps\",\"id\":%d}", id);
  j = call(path, req);  /* the final maps stay readable */
  CHECK(is_ok(j));
  json_decref(j);
}

static void test_reads(const char *path) {
  json_t *j = call(path, "{\"cmd\":\"schema\"}");
  CHECK(is_ok(j) && json_integer_value(json_object_get(json_object_get(j, "schema"), "schema_version")) >= 1);
  json_decref(j);
  j = call(path, "{\"cmd\":\"stats\"}");
  CHECK(is_ok(j) && json_integer_value(json_object_get(j, "steps")) > 0);
  CHECK(json_is_object(json_object_get(j, "ttft")) && json_is_object(json_object_get(j, "tpot")));
  /* every latency's histogram buckets (what clients of several engines add) */
  json_t *hist = json_object_get(json_object_get(j, "tpot"), "hist");
  CHECK(json_array_size(json_object_get(hist, "le_s")) == MS_LAT_BUCKETS &&
        json_array_size(json_object_get(hist, "counts")) == MS_LAT_BUCKETS + 1);
  CHECK(!json_object_get(json_object_get(j, "tpot"), "recent_s"));
  json_decref(j);
  /* "recent": the figures quantiles are measured on, sorted, as many as "quantiles_of" */
  j = call(path, "{\"cmd\":\"stats\",\"recent\":true}");
  json_t *ttft = json_object_get(j, "ttft"), *rec = json_object_get(ttft, "recent_s");
  CHECK(is_ok(j) && json_is_array(rec) &&
        json_array_size(rec) == (size_t)json_integer_value(json_object_get(ttft, "quantiles_of")));
  int sorted = 1;
  for (size_t i = 1; i < json_array_size(rec); i++)
    sorted &= json_number_value(json_array_get(rec, i - 1)) <= json_number_value(json_array_get(rec, i));
  CHECK(sorted);
  json_decref(j);
  j = call(path, "{\"cmd\":\"stats\",\"recent\":1}");
  CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), "\"recent\" must be true or false"), "%s", err_of(j));
  json_decref(j);

  /* a trace, and a second one refused while it records */
  int fa = raw_connect(path);
  const char *tr = "{\"cmd\":\"trace\",\"seconds\":0.3,\"records_per_worker\":65536}";
  ms_control_frame_send(fa, tr, strlen(tr), NULL, 0);
  usleep(50000);
  j = call(path, tr);
  CHECKF(has_code(j, "EBUSY"), "%s", err_of(j));
  json_decref(j);
  j = call(path, "{\"cmd\":\"info\"}");  /* others are served while the trace records */
  CHECK(is_ok(j));
  json_decref(j);
  int fds[MS_CONTROL_MAX_FDS], n_fds = 0;
  j = recv_json(fa, fds, &n_fds);
  close(fa);
  CHECKF(is_ok(j) && n_fds == 1, "%s", err_of(j));
  if (n_fds == 1) {
    struct stat st;
    fstat(fds[0], &st);
    CHECK((long long)st.st_size == json_integer_value(json_object_get(j, "bytes")) && st.st_size > 0);
    char *buf = malloc((size_t)st.st_size + 1);
    CHECK(pread(fds[0], buf, (size_t)st.st_size, 0) == st.st_size);
    json_t *t = json_loadb(buf, (size_t)st.st_size, 0, NULL);
    CHECK(t && json_array_size(json_object_get(t, "traceEvents")) > 10);
    json_decref(t);
    free(buf);
    CHECK(write(fds[0], "x", 1) < 0);  /* sealed */
    close(fds[0]);
  }
  json_decref(j);
  /* a trace whose client leaves: the recording stops, the next one works */
  fa = raw_connect(path);
  ms_control_frame_send(fa, tr, strlen(tr), NULL, 0);
  usleep(20000);
  close(fa);
  j = NULL;
  for (int i = 0; i < 100; i++) {
    json_decref(j);
    fa = raw_connect(path);
    const char *quick = "{\"cmd\":\"trace\",\"seconds\":0.05}";
    ms_control_frame_send(fa, quick, strlen(quick), NULL, 0);
    n_fds = 0;
    j = recv_json(fa, fds, &n_fds);
    close(fa);
    for (int k = 0; k < n_fds; k++) close(fds[k]);
    if (is_ok(j)) break;
    usleep(10000);
  }
  CHECKF(is_ok(j), "%s", err_of(j));
  json_decref(j);
}

static void test_limits(struct ms_engine *e, const char *dir) {
  char path[256];
  snprintf(path, sizeof path, "%s/two.sock", dir);
  struct ms_control_opts o = {.sz = sizeof o, .path = path, .max_clients = 2};
  struct ms_control *c = ms_control_new(e, &o, NULL);
  CHECK(c != NULL);
  int a = raw_connect(path), b = raw_connect(path);
  json_t *j = call_fd(a, "{\"cmd\":\"info\"}");  /* both accepted before the third */
  json_decref(j);
  j = call_fd(b, "{\"cmd\":\"info\"}");
  json_decref(j);
  int third = raw_connect(path);
  j = recv_json(third, NULL, NULL);
  CHECKF(has_code(j, "EBUSY") && strstr(err_of(j), "too many clients"), "%s", err_of(j));
  json_decref(j);
  close(third);
  close(a);
  close(b);
  /* a second server on a live socket is refused */
  errno = 0;
  CHECK(ms_control_new(e, &o, NULL) == NULL && errno == EADDRINUSE);
  ms_control_free(c);
  struct stat st;
  CHECK(stat(path, &st) != 0);  /* unlinked */

  /* a stale socket (nobody listening) is replaced */
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  set_path(&sa, path);
  CHECK(bind(s, (struct sockaddr *)&sa, sizeof sa) == 0);
  close(s);
  c = ms_control_new(e, &o, NULL);
  CHECK(c != NULL);
  j = call(path, "{\"cmd\":\"info\"}");
  CHECK(is_ok(j));
  json_decref(j);
  ms_control_free(c);
  /* a path that is not a socket is left alone */
  FILE *f = fopen(path, "w");
  fclose(f);
  errno = 0;
  CHECK(ms_control_new(e, &o, NULL) == NULL && errno == EEXIST);
  unlink(path);

  /* the default place: $XDG_RUNTIME_DIR/megascope/engine-PID.sock, 0700 and 0600 */
  setenv("XDG_RUNTIME_DIR", dir, 1);
  struct ms_control_opts d = {.sz = sizeof d};
  c = ms_control_new(e, &d, NULL);
  CHECK(c != NULL);
  char want[256];
  snprintf(want, sizeof want, "%s/megascope/engine-%ld.sock", dir, (long)getpid());
  CHECK(c && !strcmp(ms_control_path(c), want));
  char sub[256];
  snprintf(sub, sizeof sub, "%s/megascope", dir);
  CHECK(stat(sub, &st) == 0 && (st.st_mode & 0777) == 0700);
  CHECK(stat(want, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0600);
  ms_control_free(c);
  CHECK(stat(want, &st) != 0);
  chmod(sub, 0755);  /* a default directory open to others is refused */
  errno = 0;
  CHECK(ms_control_new(e, &d, NULL) == NULL && errno == EPERM);
  rmdir(sub);
  unsetenv("XDG_RUNTIME_DIR");
}

/* A peer of another uid is refused by the uid check (the socket is opened to
 * everyone here so that the connect itself succeeds). Root only: its own ctest,
 * test_control_other_uid (`test_control other-uid`), skipped elsewhere. */
static void test_other_uid(struct ms_engine *e, const char *dir) {
  if (geteuid() != 0) {
    SKIP_PART("not root: a peer of another uid cannot be made");
    return;
  }
  char open_dir[256], path[300];
  snprintf(open_dir, sizeof open_dir, "%s/open", dir);
  mkdir(open_dir, 0755);
  chmod(dir, 0755);
  snprintf(path, sizeof path, "%s/s.sock", open_dir);
  struct ms_control_opts o = {.sz = sizeof o, .path = path, .socket_mode = 0666};
  struct ms_control *c = ms_control_new(e, &o, NULL);
  CHECK(c != NULL);
  struct ms_control_stats before, after;
  ms_control_get_stats(c, &before);
  pid_t pid = fork();
  if (pid == 0) {
    if (setgid(65534) || setuid(65534)) _exit(3);
    int fd = raw_connect(path);
    if (fd < 0) _exit(4);
    json_t *j = recv_json(fd, NULL, NULL);
    _exit(has_code(j, "EPERM") && strstr(err_of(j), "peer uid 65534") ? 0 : 5);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  /* the server thread counts the refusal after it answered: wait for it (at most 2 s) */
  for (int i = 0; i < 200; i++) {
    ms_control_get_stats(c, &after);
    if (after.refused != before.refused) break;
    usleep(10000);
  }
  CHECKF(after.refused == before.refused + 1, "refused %llu, before %llu", (unsigned long long)after.refused,
         (unsigned long long)before.refused);
  json_t *j = call(path, "{\"cmd\":\"info\"}");  /* our own uid still gets in */
  CHECK(is_ok(j));
  json_decref(j);
  ms_control_free(c);
  rmdir(open_dir);
  chmod(dir, 0700);
}

/* The protocol's table (megascope/control.h) and the server's handlers name
 * the same commands, and each command takes what its table entry says: an
 * engine refuses a field that is not there with the field's name. */
static void test_table(const char *path) {
  int n = 0;
  for (int i = 0; i < ms_control_n_commands; i++) {
    const struct ms_control_command *c = &ms_control_commands[i];
    CHECKF(ms_control_handles(c->name), "no handler for %s", c->name);
    CHECK(ms_control_command_find(c->name) == c);
    for (int k = 0; c->fields[k]; k++) CHECK(ms_control_command_takes(c->name, c->fields[k]));
    CHECK(!ms_control_command_takes(c->name, "frobnicate"));
    char req[128], want[128];
    snprintf(req, sizeof req, "{\"cmd\":\"%s\",\"frobnicate\":1}", c->name);
    snprintf(want, sizeof want, "unknown field \"frobnicate\" for command \"%s\"", c->name);
    json_t *j = call(path, req);
    CHECKF(has_code(j, "EINVAL") && strstr(err_of(j), want), "%s: %s", c->name, err_of(j));
    json_decref(j);
    n++;
  }
  CHECK(n == ms_control_n_handlers());
  CHECK(!ms_control_handles("frobnicate") && !ms_control_command_find("frobnicate"));
}

static int other_uid_main(void) {
  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_F32, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = 1, .max_batch = 1, .max_ctx = 16};
  struct ms_engine *e = ms_engine_new(m, &eo, NULL);
  char dir[] = "/tmp/megascope-test-control-XXXXXX";
  CHECK(e != NULL && mkdtemp(dir) != NULL);
  if (e) test_other_uid(e, dir);
  ms_engine_free(e);
  ms_model_free(m);
  rmdir(dir);
  TEST_MAIN_END();
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "other-uid")) return other_uid_main();
  test_codec();
  test_tokenizer();

  struct ms_model_config cfg;
  ms_preset_config("tiny", MS_DTYPE_F32, &cfg);
  struct ms_model *m = ms_model_synth(&cfg, 1);
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = 2, .max_batch = 4, .max_ctx = 64};
  struct ms_engine *e = ms_engine_new(m, &eo, NULL);
  CHECK(e != NULL);
  char dir[] = "/tmp/megascope-test-control-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/engine.sock", dir);
  struct ms_control_opts co = {.sz = sizeof co, .path = path, .max_message = 1u << 20,
                               .message_timeout_ms = 300, .model_name = "tiny"};
  char lb[1024] = "";
  struct ms_textbuf log = {lb, sizeof lb, 0, 0};
  struct ms_control *ctl = ms_control_new(e, &co, &log);
  CHECKF(ctl != NULL, "%s", lb);
  if (!ctl) TEST_MAIN_END();
  struct stat st;
  CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);

  struct load ld = {.e = e};
  pthread_t th;
  pthread_create(&th, NULL, load_main, &ld);
  const char *mons = getenv("MS_MONITORS") ? getenv("MS_MONITORS") : "build/monitors";
  test_table(path);
  test_bad_input(path, ctl);
  test_random_messages(path, ctl);
  test_monitors(path, mons);
  test_reads(path);
  test_heavy_attach(path, dir);
  test_bad_input(path, ctl);  /* and again, after all that */
  test_limits(e, dir);
  atomic_store(&ld.stop, 1);
  pthread_join(th, NULL);
  CHECKF(ld.bad == 0 && ld.finished > 0, "%ld finished, %ld failed or short", ld.finished, ld.bad);
  json_t *j = call(path, "{\"cmd\":\"stats\"}");
  CHECK(is_ok(j));
  json_decref(j);

  ms_control_free(ctl);
  CHECK(stat(path, &st) != 0);
  ms_engine_free(e);
  ms_model_free(m);
  rmdir(dir);
  TEST_MAIN_END();
}
