/* SPDX-License-Identifier: MIT */
/* megascope query: a one-line question to a running engine.
 *
 *   query --socket S 'task_end { @[class] = count() }' [--for 2s] [--every 1s] [--json]
 *
 * Fetches the engine's schema, compiles the program here (src/query: no clang),
 * attaches the bundle through the socket's attach (the engine verifies and JIT-
 * compiles it as any monitor), takes read-only descriptors of its maps, prints
 * the aggregations with their coverage every --every and at the end (--for, or
 * Ctrl-C), then detaches. A syntax, name or field error is reported with its
 * column before anything is attached. Exit codes: 0 done, 1 refused or
 * unreachable, 2 usage or a compile error. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "megascope/base.h"
#include "megascope/bpf.h"
#include "megascope/control.h"
#include "megascope/json.h"
#include "megascope/query.h"

#define ME "query"
#define SRC_MAX (64u << 10)

static void usage(FILE *f) {
  fprintf(f,
          "usage: megascope query [--socket S] [options] 'PROGRAM'\n"
          "       megascope query [--socket S] [options] -f FILE\n\n"
          "Compiles a query (docs/query.md) to a verified eBPF monitor in this process, attaches\n"
          "it to a running engine, prints its aggregations with their coverage, then detaches:\n\n"
          "  task_end /op == attn/ { @us[tile_z] = hist((t_end - t_begin) / 1000) }\n"
          "  dep_wait /wait_ns > 20us/ { @[event_class] = count() }\n\n"
          "  --socket S           the engine's control socket (default: $MEGASCOPE_SOCKET, else\n"
          "                       the only engine-*.sock in the default directory)\n"
          "  -f, --file FILE      read the program from FILE ('-': standard input)\n"
          "  --for DURATION       stop after DURATION (2s, 500ms, 1m; default: at Ctrl-C)\n"
          "  --every DURATION     also print every DURATION (cumulative since the attach)\n"
          "  --json               print each read-out as one JSON object per line\n"
          "  --top K              print the K largest keys of each map (default: all)\n"
          "  --max-keys N         keys per map (default 4096; histograms 1024, quantiles 256)\n"
          "  --max-per-step N     budget: program runs per step per worker (default: no limit)\n"
          "  --sample N           run 1 hook firing in N, chosen by task generation (default 1)\n"
          "  --interp             run with the reference interpreter, not the JIT\n"
          "  --dump               print the generated programs and maps; attach nothing\n"
          "  --emit FILE          write the monitor (a program bundle that attach and verify\n"
          "                       take) to FILE; attach nothing\n"
          "  --schema FILE        resolve names with this schema (megascope compile\n"
          "                       --schema-out) instead of the engine's\n"
          "  --list               print the hooks with their fields and the names fields take\n"
          "  -h, --help           this text\n");
}

struct qargs {
  const char *socket, *file, *emit, *schema;
  char *src;
  uint64_t for_ns, every_ns;
  int as_json, dump, interp, have_for;
  long top, max_keys, max_per_step, sample;
};

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) {
  (void)sig;
  stop_flag = 1;
}

static char *read_text(const char *path) {
  FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
  if (!f) {
    fprintf(stderr, "megascope query: cannot open %s: %s\n", path, strerror(errno));
    return NULL;
  }
  char *buf = malloc(SRC_MAX + 1);
  size_t n = buf ? fread(buf, 1, SRC_MAX + 1, f) : 0;
  if (f != stdin) fclose(f);
  if (!buf || n > SRC_MAX) {
    fprintf(stderr, "megascope query: %s: %s\n", path, buf ? "longer than 64 KiB" : "out of memory");
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  return buf;
}

static int parse_dur(const char *opt, const char *s, uint64_t *out) {
  if (ms_query_parse_duration(s, out) == 0) return 0;
  fprintf(stderr, "megascope query: %s '%s': expected a duration (2s, 500ms, 20us, 1m)\n", opt, s);
  return -1;
}

static int parse(int argc, char **argv, struct qargs *a) {
  static const struct option opts[] = {
      {"socket", required_argument, 0, 0}, {"file", required_argument, 0, 'f'}, {"for", required_argument, 0, 0},
      {"every", required_argument, 0, 0},  {"json", no_argument, 0, 0},         {"top", required_argument, 0, 0},
      {"max-keys", required_argument, 0, 0}, {"max-per-step", required_argument, 0, 0},
      {"sample", required_argument, 0, 0}, {"interp", no_argument, 0, 0},       {"dump", no_argument, 0, 0},
      {"emit", required_argument, 0, 0},   {"schema", required_argument, 0, 0}, {"help", no_argument, 0, 'h'},
      {"list", no_argument, 0, 0},
      {0, 0, 0, 0}};
  int c, idx;
  optind = 1;
  while ((c = getopt_long(argc, argv, "hf:", opts, &idx)) != -1) {
    int r = 0;
    if (c == 'h') {
      usage(stdout);
      exit(0);
    }
    if (c == 'f') {
      a->file = optarg;
      continue;
    }
    if (c != 0) return -1;
    const char *n = opts[idx].name;
    if (!strcmp(n, "socket")) a->socket = optarg;
    else if (!strcmp(n, "for")) r = parse_dur("--for", optarg, &a->for_ns), a->have_for = 1;
    else if (!strcmp(n, "every")) r = parse_dur("--every", optarg, &a->every_ns);
    else if (!strcmp(n, "json")) a->as_json = 1;
    else if (!strcmp(n, "top")) r = cli_int("--top", optarg, 1, 1 << 20, &a->top);
    else if (!strcmp(n, "max-keys")) r = cli_int("--max-keys", optarg, 1, 1 << 20, &a->max_keys);
    else if (!strcmp(n, "max-per-step")) r = cli_int("--max-per-step", optarg, 0, 0xffffffffL, &a->max_per_step);
    else if (!strcmp(n, "sample")) r = cli_int("--sample", optarg, 1, 0xffffffffL, &a->sample);
    else if (!strcmp(n, "interp")) a->interp = 1;
    else if (!strcmp(n, "dump")) a->dump = 1;
    else if (!strcmp(n, "emit")) a->emit = optarg;
    else if (!strcmp(n, "schema")) a->schema = optarg;
    else if (!strcmp(n, "list")) exit(ms_query_write_reference(stdout) ? 1 : 0);
    if (r) return -1;
  }
  if (a->file && optind < argc) {
    fprintf(stderr, "megascope query: a program and -f FILE: give one\n");
    return -1;
  }
  if (!a->file && optind != argc - 1) {
    fprintf(stderr, "megascope query: expected one PROGRAM (quote it) or -f FILE\n");
    return -1;
  }
  if (a->every_ns && a->every_ns < 10000000ull) {
    fprintf(stderr, "megascope query: --every is at least 10ms\n");
    return -1;
  }
  a->src = a->file ? read_text(a->file) : strdup(argv[optind]);
  return a->src ? 0 : -1;
}

/* ---- compile errors with a caret ---- */

static void show_error(const char *src, const char *log) {
  fprintf(stderr, "megascope query: %s", log);
  int col;
  if (sscanf(log, "column %d:", &col) != 1 || col < 1) return;
  /* the line holding the column, and a caret under it */
  const char *p = src, *line = src;
  for (int i = 1; i < col && *p; i++, p++)
    if (*p == '\n') line = p + 1;
  const char *end = strchr(line, '\n');
  int len = end ? (int)(end - line) : (int)strlen(line);
  fprintf(stderr, "  %.*s\n  %*s^\n", len, line, (int)(p - line), "");
}

/* ---- the engine ---- */

static char *json_req(const char *cmd, int id, const char *extra) {
  char *buf;
  if (asprintf(&buf, "{\"cmd\":\"%s\"%s%.0d%s}", cmd, id ? ",\"id\":" : "", id, extra ? extra : "") < 0) return NULL;
  return buf;
}

static struct ms_query_schema *engine_schema(const char *sock) {
  char *req = json_req("schema", 0, NULL);
  json_t *rep = req ? cli_ctl_call(ME, sock, req, strlen(req), 10000, NULL, NULL) : NULL;
  free(req);
  if (!rep) return NULL;
  char *text = json_dumps(json_object_get(rep, "schema"), JSON_COMPACT);
  char lb[1024] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_query_schema *s = text ? ms_query_schema_parse(text, strlen(text), &log) : NULL;
  if (!s) fprintf(stderr, "megascope query: the engine's schema: %s", lb);
  free(text);
  json_decref(rep);
  return s;
}

static struct ms_query_schema *file_schema(const char *path) {
  char *text = read_text(path);
  if (!text) return NULL;
  char lb[1024] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_query_schema *s = ms_query_schema_parse(text, strlen(text), &log);
  if (!s) fprintf(stderr, "megascope query: %s: %s", path, lb);
  free(text);
  return s;
}

static int attach(const struct qargs *a, const char *sock, const void *bundle, size_t len) {
  char *b64 = malloc(ms_base64_encoded_len(len) + 1);
  if (!b64) return -1;
  ms_base64_encode(bundle, len, b64);
  char extra[160];
  snprintf(extra, sizeof extra, ",\"name\":\"query\",\"max_per_step\":%ld,\"sample\":%ld,\"interpret\":%s,\"object\":\"",
           a->max_per_step, a->sample, a->interp ? "true" : "false");
  char *req;
  int n = asprintf(&req, "{\"cmd\":\"attach\"%s%s\"}", extra, b64);
  free(b64);
  if (n < 0) return -1;
  json_t *rep = cli_ctl_call(ME, sock, req, strlen(req), 30000, NULL, NULL);
  free(req);
  if (!rep) return -1;
  int id = (int)json_integer_value(json_object_get(rep, "id"));
  json_decref(rep);
  return id > 0 ? id : -1;
}

static void detach(const char *sock, int id) {
  char *req = json_req("detach", id, NULL);
  json_t *rep = req ? cli_ctl_call(ME, sock, req, strlen(req), 10000, NULL, NULL) : NULL;
  free(req);
  json_decref(rep);
}

/* Readers over the attachment's maps, in the query's map order. */
static int open_maps(const struct ms_query *q, const char *sock, int id, struct ms_bpf_map_reader **readers) {
  int fds[MS_CONTROL_MAX_FDS], n_fds = 0;
  char *req = json_req("maps", id, ",\"fds\":true");
  json_t *rep = req ? cli_ctl_call(ME, sock, req, strlen(req), 10000, fds, &n_fds) : NULL;
  free(req);
  if (!rep) return -1;
  json_t *names = json_object_get(rep, "fds");
  int rc = 0;
  for (size_t i = 0; i < ms_query_map_count(q) && !rc; i++) {
    const char *want = ms_query_map(q, i)->name;
    int fd = -1;
    for (int k = 0; k < n_fds; k++)
      if (!strcmp(json_string_value(json_array_get(names, (size_t)k)) ?: "", want)) fd = fds[k];
    char lb[256] = "";
    struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
    if (fd < 0 || !(readers[i] = ms_bpf_map_reader_new(fd, 0, &log))) {
      fprintf(stderr, "megascope query: map %s of attachment %d: %s\n", want, id, fd < 0 ? "not handed over" : lb);
      rc = -1;
    }
  }
  for (int k = 0; k < n_fds; k++) close(fds[k]); /* the readers keep their mappings */
  json_decref(rep);
  return rc;
}

static int coverage(const char *sock, int id, struct ms_coverage *out) {
  char *req = json_req("list", 0, NULL);
  json_t *rep = req ? cli_ctl_call(ME, sock, req, strlen(req), 10000, NULL, NULL) : NULL;
  free(req);
  if (!rep) return -1;
  json_t *arr = json_object_get(rep, "attachments"), *att;
  size_t i;
  int found = -1;
  json_array_foreach(arr, i, att) {
    if (json_integer_value(json_object_get(att, "id")) != id) continue;
    json_t *c = json_object_get(att, "coverage");
#define U(k) (uint64_t) json_integer_value(json_object_get(c, k))
    *out = (struct ms_coverage){.eligible = U("eligible"), .executed = U("executed"), .throttled = U("throttled"),
                                .lost = U("lost"), .failed = U("failed"), .generation = (uint32_t)U("generation"),
                                .first_step = U("first_step"), .last_step = U("last_step")};
#undef U
    found = 0;
  }
  json_decref(rep);
  return found;
}

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  nanosleep(&ts, NULL);
}

/* ---- dump ---- */

static void dump(const struct ms_query *q) {
  for (size_t i = 0; i < ms_query_map_count(q); i++) {
    const struct ms_bpf_map_def *d = ms_query_map(q, i);
    printf("map %zu %s: type %u, key %u, value %u, max_entries %u%s\n", i, d->name, d->type, d->key_size,
           d->value_size, d->max_entries, d->flags & MS_BPF_MAP_F_RDONLY_PROG ? ", read-only" : "");
  }
  for (size_t i = 0; i < ms_query_prog_count(q); i++) {
    size_t n;
    const char *sec;
    const struct ms_bpf_insn *in = ms_query_prog(q, i, &n, &sec);
    printf("\nprogram %zu (section %s): %zu instructions\n", i, sec, n);
    for (size_t k = 0; k < n;) {
      char line[128];
      int used = ms_bpf_insn_linux(in, n, k, line, sizeof line);
      printf("%5zu: %s\n", k, line);
      k += used > 0 ? (size_t)used : 1;
    }
  }
}

static int write_file(const char *path, const void *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(buf, 1, len, f) == len;
  if (f && fclose(f)) ok = 0;
  if (!ok) fprintf(stderr, "megascope query: cannot write %s: %s\n", path, strerror(errno));
  return ok ? 0 : -1;
}

/* ---- the run ---- */

static int watch(const struct qargs *a, const char *sock, const struct ms_query *q, int id, uint64_t t_enter) {
  size_t nm = ms_query_map_count(q);
  struct ms_bpf_map_reader **readers = calloc(nm, sizeof *readers);
  int rc = readers ? open_maps(q, sock, id, readers) : -1;
  struct ms_query_maps src;
  ms_query_maps_of_readers(&src, readers);
  uint64_t t0 = ms_now_ns(), next = a->every_ns ? t0 + a->every_ns : UINT64_MAX;
  uint64_t end = a->have_for ? t0 + a->for_ns : UINT64_MAX;
  double first_ms = -1;
  struct ms_coverage cov = {0};
  while (!rc && !stop_flag) {
    uint64_t now = ms_now_ns();
    if (first_ms < 0 && !coverage(sock, id, &cov) && cov.executed > 0) first_ms = (double)(ms_now_ns() - t_enter) / 1e6;
    if (now >= end) break;
    if (now >= next) {
      if (coverage(sock, id, &cov)) {
        rc = -1;
        break;
      }
      struct ms_query_print po = {.sz = sizeof po, .top = (uint32_t)a->top, .as_json = a->as_json, .id = id,
                                  .elapsed_s = (double)(now - t0) / 1e9};
      if (!a->as_json) printf("--- %.1f s\n", po.elapsed_s);
      ms_query_write(q, &src, &cov, &po, stdout);
      next += a->every_ns;
    }
    uint64_t wake = next < end ? next : end, nap = first_ms < 0 ? 1000000ull : 50000000ull;
    if (wake > now && wake - now < nap) nap = wake - now;
    sleep_ns(nap);
  }
  if (!rc && !coverage(sock, id, &cov)) {
    struct ms_query_print po = {.sz = sizeof po, .top = (uint32_t)a->top, .as_json = a->as_json, .final = 1,
                                .id = id, .elapsed_s = (double)(ms_now_ns() - t0) / 1e9};
    if (!a->as_json && a->every_ns) printf("--- end, %.1f s\n", po.elapsed_s);
    ms_query_write(q, &src, &cov, &po, stdout);
    if (first_ms >= 0) fprintf(stderr, "megascope query: first event %.2f ms after the start\n", first_ms);
  }
  for (size_t i = 0; readers && i < nm; i++) ms_bpf_map_reader_free(readers[i]);
  free(readers);
  return rc;
}

int cmd_query(int argc, char **argv) {
  uint64_t t_enter = ms_now_ns();
  struct qargs a = {0};
  if (parse(argc, argv, &a)) {
    usage(stderr);
    free(a.src);
    return 2;
  }
  int rc = 1, id = -1;
  char sock[512] = "";
  struct ms_query_schema *s = NULL;
  struct ms_query *q = NULL;
  void *bundle = NULL;
  size_t blen = 0;
  int offline = a.dump || a.emit;
  if (!a.schema || !offline) {
    if (cli_ctl_socket(ME, a.socket, sock, sizeof sock)) goto out;
  }
  if (!(s = a.schema ? file_schema(a.schema) : engine_schema(sock))) goto out;
  char lb[4096] = "";
  struct ms_textbuf log = {.buf = lb, .size = sizeof lb};
  struct ms_query_opts qo = {.sz = sizeof qo, .max_keys = (uint32_t)a.max_keys};
  if (!(q = ms_query_compile(a.src, s, &qo, &log))) {
    show_error(a.src, lb);
    rc = 2;
    goto out;
  }
  if (ms_query_bundle(q, &bundle, &blen)) goto out;
  if (a.dump) dump(q);
  if (a.emit && write_file(a.emit, bundle, blen)) goto out;
  if (offline) {
    rc = 0;
    goto out;
  }
  if ((id = attach(&a, sock, bundle, blen)) < 0) goto out;
  if (!a.as_json)
    fprintf(stderr, "megascope query: attached as %d (%zu programs); %s\n", id, ms_query_prog_count(q),
            a.have_for ? "printing at the end" : "Ctrl-C to stop");
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  rc = watch(&a, sock, q, id, t_enter) ? 1 : 0;
  detach(sock, id);
out:
  free(bundle);
  ms_query_free(q);
  ms_query_schema_free(s);
  free(a.src);
  return rc;
}
