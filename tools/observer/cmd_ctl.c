/* SPDX-License-Identifier: MIT */
/* The commands that operate a running engine through its control socket:
 *   attach  --socket S PROG.o [--max-per-step N --sample N --ringbuf-bytes N --interp] [--json]
 *   replace --socket S ID PROG.o [--max-per-step N --sample N --ringbuf-bytes N --interp] [--json]
 *   detach  --socket S ID
 *   ls      --socket S [--json]
 *   maps    --socket S ID [--json] [--fds] [--release]
 *   schema  --socket S [--rows N]
 *   stats   --socket S [--socket S2 ...] [--json]   (several: replicas.h)
 *   trace   --socket S --seconds N --out FILE [--format perfetto|json] [--max-events N]
 *           [--max-bytes N] [--records-per-worker N]
 * Without --socket: $MEGASCOPE_SOCKET, else the one engine socket in the default
 * directory. Exit codes: 0 done, 1 the engine refused or could not be reached,
 * 2 usage. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "ctl_req.h"
#include "opt.h"
#include "replicas.h"
#include "megascope/bpf.h"
#include "megascope/control.h"
#include "megascope/export.h"
#include "megascope/telemetry.h"
#include "megascope/json.h"

#define OBJECT_MAX (12u << 20)  /* base64 of it fits a 16 MiB message */

/* ---- the subcommands and their options ---- */

struct ctl_args {
  const struct ctl_cmd *cmd;
  const char *socket, *out, *name;
  struct cli_sockets sockets;  /* stats: one engine or several */
  const char *pos[2];
  int n_pos, as_json, fds, release;
  struct cli_budget budget;  /* attach, replace: -1 (UINT64_MAX): not given */
  long rows, records;
  double seconds;
  const char *format;
  uint64_t max_events, max_bytes;
};

static int format_opt(void *dst, const char *arg) {
  enum ms_trace_format fmt;
  if (ms_trace_format_parse(arg, &fmt)) {
    fprintf(stderr, "megascope trace: --format '%s': expected perfetto or json\n", arg);
    return -1;
  }
  ((struct ctl_args *)dst)->format = arg;
  return 0;
}

#define CA struct ctl_args
#define SOCKET CLI_OPT_GROUP(CA, socket, cli_socket_opts)
#define JSON(what) CLI_OPT_FLAG(CA, as_json, "json", what)
#define NAME CLI_OPT_STR(CA, name, "name", "NAME", "the monitor's name (default: the file name without .bpf.o)")
static const struct cli_opt attach_opts[] = {
    SOCKET, CLI_OPT_GROUP(CA, budget, cli_budget_opts), NAME, JSON("print the engine's reply as JSON"), {0}};
static const struct cli_opt socket_only_opts[] = {SOCKET, {0}};
static const struct cli_opt ls_opts[] = {SOCKET, JSON("print as JSON"), {0}};
static const struct cli_opt stats_opts[] = {CLI_OPT_GROUP(CA, sockets, cli_sockets_opts), JSON("print as JSON"), {0}};
static const struct cli_opt maps_opts[] = {
    SOCKET, JSON("print as JSON"),
    CLI_OPT_FLAG(CA, fds, "fds",
                 "also receive the maps' shared memory (read-only memfds) and\n"
                 "read their headers from this process"),
    CLI_OPT_FLAG(CA, release, "release",
                 "this is the last read-out of a detached attachment: the engine\n"
                 "frees its programs, maps and memfds once it has answered"),
    {0}};
static const struct cli_opt schema_opts[] = {
    SOCKET, CLI_OPT_INT(CA, rows, "rows", "N", 1, 1 << 20, "the plan of the bucket holding N rows (default 1)"), {0}};
static const struct cli_opt trace_opts[] = {
    SOCKET,
    CLI_OPT_DOUBLE(CA, seconds, "seconds", "N", 1e-9, 3600, "how long to record (required; may be fractional)"),
    CLI_OPT_STR(CA, out, "out", "FILE", "where to write the trace (required)"),
    CLI_OPT_FN("format", "F", format_opt, "json (default) or perfetto (several times smaller)"),
    CLI_OPT_U64(CA, max_events, "max-events", "N", "write at most the first N events (slices and counter samples)"),
    CLI_OPT_U64(CA, max_bytes, "max-bytes", "N",
                "keep the file within N bytes (at least 4096); what a budget\n"
                "leaves out is the end of the window, counted as dropped"),
    CLI_OPT_INT(CA, records, "records-per-worker", "N", 1, 1 << 26, "trace buffer per worker (default 262144)"),
    {0}};
#undef SOCKET
#undef JSON
#undef NAME
#undef CA

/* One call to the engine: the request a command builds, what came back. */
struct ctl_call {
  struct req r;
  long id;           /* replace, detach, maps: the attachment */
  int timeout_ms;
  int want_fds;      /* receive descriptors with the reply */
  int fds[MS_CONTROL_MAX_FDS], n_fds;
  json_t *rep;
};

struct ctl_cmd {
  const char *name;
  const char *args;      /* positional arguments in the usage line */
  const char *summary;
  const struct cli_opt *opts;
  int n_pos;             /* positional arguments required */
  const char *request;   /* the protocol's command; NULL: the same name */
  /* Adds the request's fields: 0, 1 (failed, printed), 2 (a usage error). */
  int (*ask)(const struct ctl_args *a, struct ctl_call *c);
  /* Prints the reply: the exit code. */
  int (*show)(const struct ctl_args *a, struct ctl_call *c);
};

static int ask_attach(const struct ctl_args *a, struct ctl_call *c);
static int ask_replace(const struct ctl_args *a, struct ctl_call *c);
static int ask_id(const struct ctl_args *a, struct ctl_call *c);
static int ask_nothing(const struct ctl_args *a, struct ctl_call *c);
static int ask_schema(const struct ctl_args *a, struct ctl_call *c);
static int ask_trace(const struct ctl_args *a, struct ctl_call *c);
static int show_attach(const struct ctl_args *a, struct ctl_call *c);
static int show_replace(const struct ctl_args *a, struct ctl_call *c);
static int show_detach(const struct ctl_args *a, struct ctl_call *c);
static int show_ls(const struct ctl_args *a, struct ctl_call *c);
static int show_maps(const struct ctl_args *a, struct ctl_call *c);
static int show_schema(const struct ctl_args *a, struct ctl_call *c);
static int show_stats(const struct ctl_args *a, struct ctl_call *c);
static int show_trace(const struct ctl_args *a, struct ctl_call *c);

static const struct ctl_cmd ctl_cmds[] = {
    {"attach", "PROG.o", "Loads a monitor object (clang -target bpf), has the engine verify it and attach it\n"
                         "while it runs, and prints the attachment id.",
     attach_opts, 1, NULL, ask_attach, show_attach},
    {"replace", "ID PROG.o", "Replaces attachment ID's programs and maps by another monitor, atomically: every\n"
                             "hook firing is seen by exactly one generation. Budget options set the new\n"
                             "generation's budget; those not given keep the current values.",
     attach_opts, 2, NULL, ask_replace, show_replace},
    {"detach", "ID", "Detaches attachment ID; its final maps and coverage stay readable for the\n"
                     "engine's retention (serve --detached-retention), or until `maps ID --release`.",
     socket_only_opts, 1, NULL, ask_id, show_detach},
    {"ls", "", "Lists attachments: monitor, hooks, generation and coverage (eligible, executed,\n"
               "throttled, lost).",
     ls_opts, 0, "list", ask_nothing, show_ls},
    {"maps", "ID", "Prints every map of attachment ID decoded (histograms as histograms, hashes as\n"
                   "key -> value) with the coverage of every generation.",
     maps_opts, 1, NULL, ask_id, show_maps},
    {"schema", "", "Prints the task schema (versioned JSON) of the engine's plan, with every batch\n"
                   "bucket the engine runs (\"buckets\": rows, tasks and events of each plan).",
     schema_opts, 0, NULL, ask_schema, show_schema},
    {"stats", "", "Prints steps, tokens, requests and TTFT / TPOT quantiles. With --socket given more\n"
                  "than once (replicas of one service): each engine's line, then the total (counters\n"
                  "add; TTFT and TPOT quantiles measured on every engine's recent figures together).",
     stats_opts, 0, NULL, ask_nothing, show_stats},
    {"trace", "", "Records a task trace for N seconds and writes it as Chrome JSON or Perfetto's\n"
                  "protobuf (open either in ui.perfetto.dev): a track per worker, a slice per\n"
                  "task, flow arrows from an event's release to its successors, queue-depth\n"
                  "counters; times are exact integer nanoseconds from the recording's start.",
     trace_opts, 0, NULL, ask_trace, show_trace},
};

static const struct ctl_cmd *find_cmd(const char *name) {
  for (size_t i = 0; i < sizeof ctl_cmds / sizeof ctl_cmds[0]; i++)
    if (!strcmp(ctl_cmds[i].name, name)) return &ctl_cmds[i];
  return NULL;
}

static void head_of(const struct ctl_cmd *c, char *buf, size_t n) {
  snprintf(buf, n, "usage: megascope %s --socket S%s%s [options]\n\n%s\n\n", c->name, c->args[0] ? " " : "", c->args,
           c->summary);
}

static void usage(const struct ctl_cmd *c, FILE *f) {
  char head[1024];
  head_of(c, head, sizeof head);
  cli_usage(f, head, c->opts);
}

/* 0: parsed; 1: --help printed; -1: a usage error, printed. */
static int parse(int argc, char **argv, struct ctl_args *a) {
  const char *me = a->cmd->name;
  char head[1024];
  head_of(a->cmd, head, sizeof head);
  a->budget = (struct cli_budget){.max_per_step = -1, .sample = -1, .ringbuf_bytes = UINT64_MAX};
  /* an option of another of these commands: say so, rather than "unrecognized" */
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
    if (strncmp(argv[i], "--", 2)) continue;
    const char *n = argv[i] + 2, *eq = strchr(n, '=');
    size_t len = eq ? (size_t)(eq - n) : strlen(n);
    if (!strcmp(n, "help") || cli_has_opt(a->cmd->opts, n, len)) continue;
    for (size_t k = 0; k < sizeof ctl_cmds / sizeof ctl_cmds[0]; k++)
      if (cli_has_opt(ctl_cmds[k].opts, n, len)) {
        fprintf(stderr, "megascope %s: --%.*s does not apply to this command (try 'megascope %s --help')\n", me,
                (int)len, n, me);
        return -1;
      }
  }
  int first, rc = cli_parse(me, head, a->cmd->opts, a, argc, argv, &first);
  if (rc) return rc;
  for (int i = first; i < argc; i++) {
    if (a->n_pos == a->cmd->n_pos) {
      fprintf(stderr, "megascope %s: unexpected argument '%s'\n", me, argv[i]);
      return -1;
    }
    a->pos[a->n_pos++] = argv[i];
  }
  if (a->n_pos < a->cmd->n_pos) {
    fprintf(stderr, "megascope %s: expected %s\n", me, a->cmd->args);
    return -1;
  }
  if (!strcmp(me, "trace") && (!(a->seconds > 0) || !a->out)) {
    fprintf(stderr, "megascope trace: --seconds and --out are required\n");
    return -1;
  }
  return 0;
}

/* ---- talking to the engine ---- */

/* The socket: --socket, $MEGASCOPE_SOCKET, or the one in the default directory. */
static int find_socket(const char *me, const char *given, char *buf, size_t size) {
  if (given) {
    snprintf(buf, size, "%s", given);
    return 0;
  }
  const char *env = getenv("MEGASCOPE_SOCKET");
  if (env && env[0]) {
    snprintf(buf, size, "%s", env);
    return 0;
  }
  char probe[512];
  if (ms_control_default_path(probe, sizeof probe, 0)) return -1;
  char *dir = dirname(probe);
  DIR *d = opendir(dir);
  int found = 0;
  for (struct dirent *de; d && (de = readdir(d));) {
    size_t n = strlen(de->d_name);
    if (strncmp(de->d_name, "engine-", 7) || n < 5 || strcmp(de->d_name + n - 5, ".sock")) continue;
    if (!found++) snprintf(buf, size, "%s/%s", dir, de->d_name);
  }
  if (d) closedir(d);
  if (found == 1) return 0;
  fprintf(stderr, "megascope %s: no --socket given and %s engine sockets in %s\n", me, found ? "several" : "no",
          dir);
  return -1;
}

/* The last call's failure, for clients of several engines (cli_ctl_last_error). */
static char last_error[512];
static int last_answered;

static void set_error(int answered, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(int answered, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  size_t n = strlen(last_error);
  while (n && last_error[n - 1] == '\n') last_error[--n] = '\0';
  last_answered = answered;
}

/* Sends req and returns the parsed reply when it says ok; prints the engine's
 * error (and log) and returns NULL otherwise. raw: the reply text. */
static json_t *call(const char *me, const char *path, const char *req, size_t len, int timeout_ms, char **raw,
                    int *fds, int *n_fds) {
  char lb[512] = "";
  struct ms_textbuf log = {lb, sizeof lb, 0, 0};
  last_error[0] = '\0';
  last_answered = 0;
  struct ms_control_client *cl = ms_control_connect(path, &log);
  if (!cl) {
    fprintf(stderr, "megascope %s: %s", me, lb);
    set_error(0, "%s", lb);
    return NULL;
  }
  char *reply = NULL;
  size_t rlen = 0;
  int rc = ms_control_call(cl, req, len, &reply, &rlen, fds, n_fds, fds ? MS_CONTROL_MAX_FDS : 0, timeout_ms);
  ms_control_client_free(cl);
  if (rc) {
    const char *why = rc == -ECONNRESET ? "the engine closed the connection" : ms_strerror(rc);
    fprintf(stderr, "megascope %s: no reply from %s: %s\n", me, path, why);
    set_error(0, "no reply: %s", why);
    return NULL;
  }
  json_error_t err;
  json_t *j = json_loadb(reply, rlen, 0, &err);
  if (!j || !json_is_object(j)) {
    fprintf(stderr, "megascope %s: the engine's reply is not a JSON object: %s\n", me, j ? "" : err.text);
    set_error(1, "the engine's reply is not a JSON object");
    json_decref(j);
    free(reply);
    return NULL;
  }
  if (!json_is_true(json_object_get(j, "ok"))) {
    const char *e = json_string_value(json_object_get(j, "error"));
    const char *lg = json_string_value(json_object_get(j, "log"));
    fprintf(stderr, "megascope %s: %s\n", me, e ? e : "the engine refused the request");
    set_error(1, "%s", e ? e : "the engine refused the request");
    if (lg && lg[0]) fprintf(stderr, "%s%s", lg, lg[strlen(lg) - 1] == '\n' ? "" : "\n");
    json_decref(j);
    free(reply);
    if (fds && n_fds)
      while (*n_fds) close(fds[--*n_fds]);
    return NULL;
  }
  if (raw)
    *raw = reply;
  else
    free(reply);
  return j;
}

/* Writes a parsed JSON value with the project's writer (pretty). */

static void print_json(json_t *v) {
  struct ms_json j;
  ms_json_init(&j, stdout, 1);
  cli_json_emit(&j, v);
  ms_json_end(&j);
}

/* Reads an object file and adds "object" (base64) and "name". */
static int req_object(const char *me, struct req *r, const char *path, const char *name) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "megascope %s: cannot open %s: %s\n", me, path, strerror(errno));
    return -1;
  }
  uint8_t *buf = malloc(OBJECT_MAX + 1);
  size_t n = buf ? fread(buf, 1, OBJECT_MAX + 1, f) : 0;
  fclose(f);
  if (!buf || n == 0 || n > OBJECT_MAX) {
    fprintf(stderr, "megascope %s: %s: %s\n", me, path,
            !buf ? "out of memory" : n ? "larger than 12 MiB" : "empty or unreadable");
    free(buf);
    return -1;
  }
  char *b64 = malloc(ms_base64_encoded_len(n) + 1);
  if (!b64) {
    free(buf);
    return -1;
  }
  ms_base64_encode(buf, n, b64);
  free(buf);
  char nm[64];
  if (name) {
    snprintf(nm, sizeof nm, "%s", name);
  } else {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(nm, sizeof nm, "%s", base);
    char *dot = strstr(nm, ".bpf.o");
    if (!dot) dot = strrchr(nm, '.');
    if (dot && dot != nm) *dot = '\0';
  }
  req_str(r, "name", nm);
  req_str(r, "object", b64);
  free(b64);
  return 0;
}

static int parse_id(const char *me, const char *s, long *id) {
  char opt[32];
  snprintf(opt, sizeof opt, "ID");
  (void)me;
  return cli_int(opt, s, 1, 0x7fffffffL, id);
}

static const char *hooks_str(json_t *hooks, char *buf, size_t n) {
  size_t i, k = 0;
  json_t *h;
  buf[0] = '\0';
  json_array_foreach(hooks, i, h) {
    int w = snprintf(buf + k, n - k, "%s%s", i ? "," : "", json_string_value(h) ? json_string_value(h) : "?");
    if (w < 0 || (size_t)w >= n - k) break;
    k += (size_t)w;
  }
  return buf;
}

static unsigned long long jnum(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_integer(v) ? (unsigned long long)json_integer_value(v) : 0;
}

/* ---- the subcommands: what each asks ---- */

/* The budget options given, and only those: replace keeps the others. */
static void ask_budget(const struct ctl_args *a, struct req *r) {
  if (a->budget.max_per_step >= 0) req_int(r, "max_per_step", a->budget.max_per_step);
  if (a->budget.sample >= 0) req_int(r, "sample", a->budget.sample);
  if (a->budget.ringbuf_bytes != UINT64_MAX) req_uint(r, "ringbuf_bytes", a->budget.ringbuf_bytes);
  if (a->budget.interp) req_bool(r, "interpret", 1);
}

static int ask_attach(const struct ctl_args *a, struct ctl_call *c) {
  ask_budget(a, &c->r);
  return req_object(a->cmd->name, &c->r, a->pos[0], a->name) ? 1 : 0;
}

static int ask_replace(const struct ctl_args *a, struct ctl_call *c) {
  if (parse_id(a->cmd->name, a->pos[0], &c->id)) return 2;
  req_int(&c->r, "id", c->id);
  ask_budget(a, &c->r);
  return req_object(a->cmd->name, &c->r, a->pos[1], a->name) ? 1 : 0;
}

/* detach, maps: the attachment, and what maps takes. */
static int ask_id(const struct ctl_args *a, struct ctl_call *c) {
  if (parse_id(a->cmd->name, a->pos[0], &c->id)) return 2;
  req_int(&c->r, "id", c->id);
  if (a->fds) req_bool(&c->r, "fds", 1);
  if (a->release) req_bool(&c->r, "release", 1);
  return 0;
}

static int ask_nothing(const struct ctl_args *a, struct ctl_call *c) { return 0; }

static int ask_schema(const struct ctl_args *a, struct ctl_call *c) {
  if (a->rows) req_int(&c->r, "rows", a->rows);
  return 0;
}

static int ask_trace(const struct ctl_args *a, struct ctl_call *c) {
  req_num(&c->r, "seconds", a->seconds);
  if (a->records) req_int(&c->r, "records_per_worker", a->records);
  if (a->format) req_str(&c->r, "format", a->format);
  if (a->max_events) req_uint(&c->r, "max_events", a->max_events);
  if (a->max_bytes) req_uint(&c->r, "max_bytes", a->max_bytes);
  c->timeout_ms = (int)(a->seconds * 1000) + 120000;
  c->want_fds = 1;
  return 0;
}

/* ---- the subcommands: how each shows the reply ---- */

static int show_attach(const struct ctl_args *a, struct ctl_call *c) {
  if (a->as_json) print_json(c->rep);
  else printf("%lld\n", (long long)jnum(c->rep, "id"));
  return 0;
}

static int show_replace(const struct ctl_args *a, struct ctl_call *c) {
  char hb[256];
  if (a->as_json)
    print_json(c->rep);
  else
    printf("attachment %ld is now %s, generation %llu (hooks %s)\n", c->id,
           json_string_value(json_object_get(c->rep, "name")), jnum(c->rep, "generation"),
           hooks_str(json_object_get(c->rep, "hooks"), hb, sizeof hb));
  return 0;
}

static int show_detach(const struct ctl_args *a, struct ctl_call *c) {
  printf("detached %ld\n", c->id);
  return 0;
}

static void print_attachment(json_t *x) {
  char hb[256];
  json_t *cv = json_object_get(x, "coverage");
  unsigned long long np = jnum(x, "programs"), nj = jnum(x, "jitted");
  const char *exec = nj == 0 ? "interp" : nj == np ? "jit" : "mixed";
  printf("%-4lld %-16s %-9s %4llu %-24s %-6s %12llu %12llu %10llu %8llu\n", (long long)jnum(x, "id"),
         json_string_value(json_object_get(x, "name")),
         json_is_true(json_object_get(x, "attached")) ? "attached" : "detached", jnum(x, "generation"),
         hooks_str(json_object_get(x, "hooks"), hb, sizeof hb), exec, jnum(cv, "eligible"), jnum(cv, "executed"),
         jnum(cv, "throttled"), jnum(cv, "lost"));
}

/* Across ranks: each rank's coverage under the attachment's row (the row's
 * is their sum). */
static void print_ranks(json_t *att) {
  json_t *ranks = json_object_get(att, "ranks"), *rk;
  size_t i;
  json_array_foreach(ranks, i, rk) {
    json_t *cv = json_object_get(rk, "coverage");
#define U(k) (unsigned long long)json_integer_value(json_object_get(cv, k))
    printf("%-4s   rank %-5lld %63llu %12llu %10llu %8llu\n", "", json_integer_value(json_object_get(rk, "rank")),
           U("eligible"), U("executed"), U("throttled"), U("lost"));
#undef U
  }
}

static int show_ls(const struct ctl_args *a, struct ctl_call *c) {
  if (a->as_json) {
    print_json(c->rep);
    return 0;
  }
  json_t *arr = json_object_get(c->rep, "attachments"), *x;
  size_t i;
  printf("%-4s %-16s %-9s %4s %-24s %-6s %12s %12s %10s %8s\n", "ID", "MONITOR", "STATE", "GEN", "HOOKS", "EXEC",
         "ELIGIBLE", "EXECUTED", "THROTTLED", "LOST");
  json_array_foreach(arr, i, x) {
    print_attachment(x);
    print_ranks(x);
  }
  if (!json_array_size(arr)) printf("(no attachments)\n");
  return 0;
}

/* maps --fds: each map's header read through its descriptor. */
static int print_map_fd(const struct ctl_args *a, int i, int fd, const char *nm) {
  char lb[256] = "";
  struct ms_textbuf log = {lb, sizeof lb, 0, 0};
  struct ms_bpf_map_reader *rd = ms_bpf_map_reader_new(fd, 0, &log);
  if (!rd) {
    fprintf(stderr, "megascope maps: cannot read map %s through its descriptor: %s", nm ? nm : "?", lb);
    return 1;
  }
  const struct ms_bpf_map_shm *h = ms_bpf_map_reader_header(rd);
  fprintf(a->as_json ? stderr : stdout,
          "memfd %d (read-only): map %s, type %u, key %u B, value %u B, %u entries max, %u workers\n", i, h->name,
          h->type, h->key_size, h->value_size, h->max_entries, h->n_workers);
  ms_bpf_map_reader_free(rd);
  return 0;
}

static int show_maps(const struct ctl_args *a, struct ctl_call *c) {
  if (a->as_json) {
    print_json(c->rep);
  } else {
    const char *t = json_string_value(json_object_get(c->rep, "text"));
    fputs(t ? t : "", stdout);
  }
  json_t *names = json_object_get(c->rep, "fds");
  int rc = 0;
  for (int i = 0; i < c->n_fds; i++)
    if (print_map_fd(a, i, c->fds[i], json_string_value(json_array_get(names, (size_t)i)))) rc = 1;
  return rc;
}

/* The plan's schema, with every bucket the engine runs beside it. */
static int show_schema(const struct ctl_args *a, struct ctl_call *c) {
  json_t *sc = json_object_get(c->rep, "schema"), *bk = json_object_get(c->rep, "buckets");
  if (json_is_object(sc) && bk) json_object_set(sc, "buckets", bk);
  print_json(sc);
  return 0;
}

static void print_prefix_cache(json_t *pc) {
  if (json_is_true(json_object_get(pc, "on")))
    printf("prefix cache: %.1f%% hit rate (%llu of %llu prompt tokens cached; %llu requests hit), %llu pages "
           "kept, %llu evicted\n",
           100.0 * json_number_value(json_object_get(pc, "hit_rate")), jnum(pc, "hits"), jnum(pc, "queries"),
           jnum(pc, "hit_requests"), jnum(pc, "pages_cached"), jnum(pc, "evictions"));
  else if (pc)
    printf("prefix cache: off\n");
}

/* TTFT or TPOT: a latency's quantiles, in ms. */
static void print_latency(const char *what, json_t *h) {
  printf("%s  n=%llu  p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  mean %.3f ms  (measured on the last %lld)\n", what,
         jnum(h, "count"), 1e3 * json_number_value(json_object_get(h, "p50_s")),
         1e3 * json_number_value(json_object_get(h, "p90_s")), 1e3 * json_number_value(json_object_get(h, "p99_s")),
         1e3 * json_number_value(json_object_get(h, "mean_s")), (long long)jnum(h, "quantiles_of"));
}

/* Across ranks: a line a rank (its own workers, tasks and waits on the
 * others), then the whole engine's; the lines above are rank 0's workers and
 * tasks beside the whole engine's steps, tokens and requests. */
static void print_ranks_stats(json_t *rep) {
  json_t *ranks = json_object_get(rep, "ranks"), *rk, *all = json_object_get(rep, "engine");
  size_t i;
  json_array_foreach(ranks, i, rk) {
    json_t *cm = json_object_get(rk, "comm");
    printf("rank %llu: %llu workers, tasks %llu, stalls %llu; shares received %llu, waited %.3f s\n",
           jnum(rk, "rank"), jnum(rk, "workers"), jnum(rk, "tasks"), jnum(rk, "stalls"), jnum(cm, "received"),
           (double)jnum(cm, "wait_ns") / 1e9);
  }
  if (all)
    printf("every rank (%llu): %llu workers, tasks %llu, stalls %llu; shares received %llu, waited %.3f s\n",
           jnum(all, "ranks"), jnum(all, "workers"), jnum(all, "tasks"), jnum(all, "stalls"),
           jnum(all, "comm_received"), (double)jnum(all, "comm_wait_ns") / 1e9);
}

static int show_stats(const struct ctl_args *a, struct ctl_call *c) {
  json_t *rep = c->rep;
  if (a->as_json) {
    print_json(rep);
    return 0;
  }
  printf("%s, %lld workers, up %.1f s\n", json_string_value(json_object_get(rep, "model")),
         (long long)jnum(rep, "workers"), json_number_value(json_object_get(rep, "uptime_s")));
  printf("steps %llu, tokens %llu, positions %llu, tasks %llu, stalls %llu\n", jnum(rep, "steps"), jnum(rep, "tokens"),
         jnum(rep, "positions"), jnum(rep, "tasks"), jnum(rep, "stalls"));
  printf("requests: %llu finished, %llu cancelled\n", jnum(rep, "requests_finished"),
         jnum(rep, "requests_cancelled"));
  print_ranks_stats(rep);
  print_prefix_cache(json_object_get(rep, "prefix_cache"));
  print_latency("TTFT", json_object_get(rep, "ttft"));
  print_latency("TPOT", json_object_get(rep, "tpot"));
  return 0;
}

/* The trace the engine wrote into the descriptor it sent, copied to path:
 * its size, or -1 (printed). */
static off_t copy_trace(int fd, const char *path) {
  FILE *out = fopen(path, "wb");
  if (!out) {
    fprintf(stderr, "megascope trace: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  char buf[1 << 16];
  off_t off = 0;
  ssize_t k;
  while ((k = pread(fd, buf, sizeof buf, off)) > 0) {
    fwrite(buf, 1, (size_t)k, out);
    off += k;
  }
  if (!fclose(out) && k == 0) return off;
  fprintf(stderr, "megascope trace: writing %s failed\n", path);
  return -1;
}

static int show_trace(const struct ctl_args *a, struct ctl_call *c) {
  json_t *rep = c->rep;
  if (c->n_fds < 1) {
    fprintf(stderr, "megascope trace: the engine's reply carried no trace\n");
    return 1;
  }
  off_t off = copy_trace(c->fds[0], a->out);
  if (off < 0) return 1;
  printf("wrote %s (%s): %llu task records (%llu dropped: buffers full), %llu slices, %llu flows,\n"
         "  %llu counter samples, %llu events over the budget dropped (the file covers %.6f s of\n"
         "  %.6f s), %llu records outside the window, %lld bytes\n",
         a->out, json_string_value(json_object_get(rep, "format")), jnum(rep, "records"), jnum(rep, "dropped"),
         jnum(rep, "slices"), jnum(rep, "flows"), jnum(rep, "counters"), jnum(rep, "budget_dropped"),
         (double)jnum(rep, "kept_ns") / 1e9, (double)jnum(rep, "window_ns") / 1e9, jnum(rep, "outside_window"),
         (long long)off);
  return 0;
}

/* ---- one command: ask, call, show ---- */

static int run_ctl(const struct ctl_args *a) {
  const struct ctl_cmd *cmd = a->cmd;
  char path[512];
  if (a->sockets.n > 1) return stats_replicas(a->sockets.path, a->sockets.n, a->as_json);
  if (find_socket(cmd->name, a->sockets.n ? a->sockets.path[0] : a->socket, path, sizeof path)) return 1;
  struct ctl_call c = {.timeout_ms = 60000, .want_fds = a->fds};
  if (req_begin(&c.r, cmd->request ? cmd->request : cmd->name)) return 1;
  int rc = cmd->ask(a, &c);
  if (!rc && req_end(&c.r)) rc = 1;
  if (rc) {
    if (c.r.f) fclose(c.r.f);
    free(c.r.buf);
    if (rc == 2) usage(cmd, stderr);
    return rc;
  }
  c.rep = call(cmd->name, path, c.r.buf, c.r.len, c.timeout_ms, NULL, c.want_fds ? c.fds : NULL,
               c.want_fds ? &c.n_fds : NULL);
  free(c.r.buf);
  if (!c.rep) return 1;
  rc = cmd->show(a, &c);
  for (int i = 0; i < c.n_fds; i++) close(c.fds[i]);
  json_decref(c.rep);
  return rc;
}

/* Every control command's entry: argv[0] names it. */
int cmd_ctl(int argc, char **argv) {
  struct ctl_args a = {.cmd = find_cmd(argv[0])};
  if (!a.cmd) return 2;
  int prc = parse(argc, argv, &a);
  if (prc) return prc > 0 ? 0 : 2;
  return run_ctl(&a);
}

/* For the other socket clients of the CLI (cmd_query.c): the socket lookup and
 * one request/reply, with the errors printed as these commands print them. */
int cli_ctl_socket(const char *me, const char *given, char *buf, size_t size) {
  return find_socket(me, given, buf, size);
}
json_t *cli_ctl_call(const char *me, const char *path, const char *req, size_t len, int timeout_ms, int *fds,
                     int *n_fds) {
  return call(me, path, req, len, timeout_ms, NULL, fds, n_fds);
}
const char *cli_ctl_last_error(int *answered) {
  if (answered) *answered = last_answered;
  return last_error;
}
