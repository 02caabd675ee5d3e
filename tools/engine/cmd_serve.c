/* SPDX-License-Identifier: MIT */
/* megascope serve: the engine as a long-lived process. It speaks the OpenAI
 * API over HTTP (continuous batching), serves /metrics, listens on its control
 * socket for monitors, traces and statistics, and exports request spans over
 * OTLP. It runs until SIGINT or SIGTERM, then stops cleanly: HTTP first (new
 * requests get 503, those in flight have --drain-timeout to finish), then the
 * control socket (unlinked), then the OTLP exporter (flushes what is queued),
 * then the engine.
 *
 * Signals are blocked in every thread (the mask is set before any thread
 * starts and inherited) and taken by the main thread alone with sigtimedwait.
 *
 * Under mpirun with --tp N (docs/design.md, "Serving across ranks") rank 0 is
 * the server above and its engine leads; every other rank runs an engine that
 * follows rank 0's step headers, with no HTTP, control socket or OTLP, until
 * rank 0 stops (exit 0) or a wait on another rank fails (the report, then
 * every rank ends, non-zero). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/chat.h"
#include "megascope/control.h"
#include "megascope/engine.h"
#include "megascope/export.h"
#include "megascope/attach.h"
#include "megascope/plan.h"
#include "megascope/tokenizer.h"
#include "megascope/transport.h"

/* What hostile or greedy clients meet: connections, one request, one
 * client's share, the queue, and the attachments' budget. 0: the default,
 * which for descriptors follows the process's limit (serve_defaults). */
struct serve_limits {
  long conns, conns_client, read_s, idle_s, req_tokens, prompt_tokens, client_reqs, client_tokens, queued;
  long attach_fds, retained;
  uint64_t attach_bytes;
};

#define SL struct serve_limits
static const struct cli_opt limit_opts[] = {
    CLI_OPT_TEXT("\nlimits (0: the default; /metrics counts what each refuses):"),
    CLI_OPT_INT(SL, conns, "max-connections", "N", 0, 1 << 20,
                "HTTP connections held at once; when full, the one idle longest is\n"
                "closed for a new one, or the new one answered 503 if none is idle\n"
                "(default 512, less when the descriptor limit is low)"),
    CLI_OPT_INT(SL, conns_client, "max-connections-per-client", "N", 0, 1 << 20,
                "connections one client (an IPv4 address, an IPv6 /64) holds: its\n"
                "idle one goes first, else 429 (default 128)"),
    CLI_OPT_INT(SL, read_s, "read-timeout", "S", 0, 3600,
                "a request's head must arrive within S seconds of the connect (or of\n"
                "its request line), its body within S more: else 408 and close\n"
                "(default 10)"),
    CLI_OPT_INT(SL, idle_s, "idle-timeout", "S", 0, 86400,
                "close a kept-alive connection with no request for S seconds, or one\n"
                "whose client has read nothing of its answer for S (default 15)"),
    CLI_OPT_INT(SL, req_tokens, "max-request-tokens", "N", 0, 1 << 30,
                "choices x max_tokens one request may ask: more is a 400\n"
                "(default 8192, or 2 x --max-ctx when larger)"),
    CLI_OPT_INT(SL, prompt_tokens, "max-prompt-tokens", "N", 0, 1 << 30,
                "prompt tokens over one request's choices: more is a 400\n"
                "(default 8192, or 2 x --max-ctx when larger)"),
    CLI_OPT_INT(SL, client_reqs, "client-max-requests", "N", 0, 1 << 20,
                "choices one client holds queued and running: more is a 429 with\n"
                "Retry-After (default 128)"),
    CLI_OPT_INT(SL, client_tokens, "client-max-tokens", "N", 0, 1L << 40,
                "prompt and max_tokens tokens one client holds queued and running:\n"
                "more is a 429 (default 65536, or 16 x --max-ctx when larger)"),
    CLI_OPT_INT(SL, queued, "max-queued", "N", 0, 16384,
                "requests waiting for a batch slot, all clients; a full queue\n"
                "answers 429 with Retry-After at once (default 1024). Clients are\n"
                "admitted fairly: one with many queued waits behind its own"),
    CLI_OPT_INT(SL, attach_fds, "attach-fds", "N", 0, 1 << 20,
                "descriptors the attachments' maps may hold, attached and retained:\n"
                "the oldest retained are freed first, then an attach is refused\n"
                "(default: a share of the descriptor limit, at most 4096)"),
    CLI_OPT_U64(SL, attach_bytes, "attach-bytes", "B",
                "bytes of maps the attachments may hold, the same way (default 1 GiB)"),
    CLI_OPT_INT(SL, retained, "max-retained", "N", 0, 1 << 20,
                "detached attachments and replaced generations kept for read-outs\n"
                "beside --detached-retention; the oldest goes first (default 256)"),
    {0}};
#undef SL

static const char *const metrics_compat_names[] = {"none", "vllm", NULL};

struct serve_args {
  struct cli_model cm;
  struct serve_limits lim;
  struct cli_backend be;
  long batch, workers, max_ctx, max_tokens, watchdog_ms, flush_ms, retention_s, idle_s;
  const char *http, *socket, *otlp, *host, *api_key, *chat_template;
  long port, drain_s, max_batched, step_target_ms, tp, comm_timeout_ms;
  double temperature;
  int port_set, temperature_set, q8, pin;
  int prefix_cache, any_model, metrics_compat, kv_f16;
  const char *served_name;
  const char *fault[4];
  int n_fault;
  int verbose;
};

#define SA struct serve_args
static const struct cli_opt serve_opts[] = {
    CLI_OPT_GROUP(SA, cm, cli_model_opts),
    CLI_OPT_INT(SA, batch, "batch", "N", 1, 4096, "most requests decoded together (default 8)"),
    CLI_OPT_GROUP(SA, workers, cli_workers_opts),
    CLI_OPT_FLAG(SA, pin, "pin-workers",
                 "pin worker w to the w-th CPU the process may run on, so a worker is\n"
                 "a core (explain then names the core another process shares)"),
    CLI_OPT_GROUP(SA, be, cli_backend_opts),
    CLI_OPT_INT(SA, tp, "tp", "N", 1, 64,
                "tensor parallelism across processes: under mpirun -np N, one engine\n"
                "in N processes, one device each (cpu backend). Rank 0 serves HTTP\n"
                "and the control socket and decides every step; the others follow"),
    CLI_OPT_INT(SA, comm_timeout_ms, "comm-timeout-ms", "MS", 1, 1 << 30,
                "under mpirun: stop every rank when one waits on another this long\n"
                "(default 10000)"),
    CLI_OPT_INT(SA, max_ctx, "max-ctx", "N", 2, 1 << 20,
                "positions per request, prompt included (default: the model's\n"
                "trained context, capped so the KV cache of --batch requests fits\n"
                "in half the memory available; 512 for a synthetic model)"),
    CLI_OPT_INT(SA, max_batched, "max-batched-tokens", "N", 0, 4096,
                "token rows a step takes: a prompt is fed in chunks beside the\n"
                "decode rows (chunked prefill; default 64; 0: one position per step).\n"
                "Its plans compile in the background after start"),
    CLI_OPT_INT(SA, step_target_ms, "step-target-ms", "MS", 0, 60000,
                "the step budget: while streams are running, a prompt chunk is sized\n"
                "from measured step times so a step (every stream's inter-token\n"
                "time) stays near MS (default 50; 0: off, chunks fill\n"
                "--max-batched-tokens)"),
    CLI_OPT_GROUP(SA, q8, cli_act_opts),
    CLI_OPT_STR(SA, http, "http", "ADDR:PORT",
                "where to serve HTTP (default 127.0.0.1:8080; port 0: any free\n"
                "port; 'off': no HTTP; IPv6 as [::1]:8080)"),
    CLI_OPT_STR(SA, host, "host", "HOST", "the address to bind: a name (localhost), IPv4 or IPv6 (overrides --http's)"),
    CLI_OPT_INT(SA, port, "port", "N", 0, 65535, "the HTTP port (overrides --http's; 0: any free port)"),
    CLI_OPT_STR(SA, api_key, "api-key", "KEY",
                "require \"Authorization: Bearer KEY\" on every endpoint but /health\n"
                "and /metrics (default: $MEGASCOPE_API_KEY, else none)"),
    CLI_OPT_STR(SA, chat_template, "chat-template", "NAME",
                "render chat messages with this template instead of the one the\n"
                "model file names (" MS_CHAT_TEMPLATE_NAMES ")"),
    CLI_OPT_DOUBLE(SA, temperature, "temperature", "T", 0, 2, "temperature when a request omits it (default 1, as OpenAI's API)"),
    CLI_OPT_INT(SA, drain_s, "drain-timeout", "S", 0, 86400,
                "on SIGTERM, seconds the requests in flight have to finish before\n"
                "they are cancelled (default 30)"),
    CLI_OPT_STR(SA, socket, "socket", "PATH",
                "control socket (default: $XDG_RUNTIME_DIR/megascope/engine-PID.sock,\n"
                "or /run/megascope/engine-PID.sock)"),
    CLI_OPT_STR(SA, otlp, "otlp", "URL",
                "export request spans to an OTLP/HTTP JSON endpoint\n"
                "(e.g. http://127.0.0.1:4318/v1/traces)"),
    CLI_OPT_INT(SA, flush_ms, "otlp-flush-ms", "N", 1, 3600000, "export spans at least this often (default 1000)"),
    CLI_OPT_INT(SA, max_tokens, "max-tokens", "N", 1, 1 << 20,
                "completions' max_tokens when a request omits it (default 16; chat:\n"
                "the rest of the context)"),
    CLI_OPT_INT(SA, watchdog_ms, "watchdog-ms", "N", 0, 1 << 30, "report a stall after N ms without progress (default 5000; 0 off)"),
    CLI_OPT_INT(SA, retention_s, "detached-retention", "S", 0, 365L * 86400,
                "a detached attachment (and a replaced generation) stays\n"
                "readable S seconds, then its programs, maps and memfds are\n"
                "freed; `maps ID --release` frees it at once (default 60)"),
    CLI_OPT_INT(SA, idle_s, "control-idle", "S", 0, 365L * 86400, "close control clients idle for S seconds (default 60; 0: never)"),
    CLI_OPT_LIST(SA, fault, n_fault, "fault", "SPEC",
                 "inject a fault whose cause is known, as `run --fault` takes it\n"
                 "(slow_class:blk.1.wo:2, delayed_release:rope->attn:20us, ...;\n"
                 "repeatable, 4 at most): for trying diagnoses on a live server"),
    {.kind = CLI_FLAG, .name = "verbose", .shrt = 'v', .off = CLI_O(SA, verbose), .set = 1,
     .help = "log connections and protocol details"},
    CLI_OPT_TEXT("\nprefix caching, the served model, metrics:"),
    {.kind = CLI_FLAG, .name = "prefix-cache", .off = CLI_O(SA, prefix_cache), .set = 1,
     .help = "keep the KV pages of prompts after their requests end and share\n"
             "them with later requests that begin the same (the default): a\n"
             "request computes only the positions past its cached prefix"},
    CLI_OPT_FLAG(SA, kv_f16, "kv-f16",
                 "the KV cache in f16, as llama.cpp keeps it: half the memory a\n"
                 "position takes (so twice the default context where memory caps it),\n"
                 "logits moved by its rounding, about 0.02-0.03 (cpu backend)"),
    {.kind = CLI_FLAG, .name = "no-prefix-cache", .off = CLI_O(SA, prefix_cache), .set = 0,
     .help = "compute every prompt from its first token"},
    CLI_OPT_STR(SA, served_name, "served-model-name", "NAME",
                "the model's id in /v1/models, answers and metrics (default: the\n"
                "file's name without .gguf; the preset's for --synthetic)"),
    CLI_OPT_FLAG(SA, any_model, "accept-any-model",
                 "answer requests that name another model (default: 404\n"
                 "model_not_found, as OpenAI answers)"),
    CLI_OPT_CHOICE(SA, metrics_compat, "metrics-compat", "NAME", metrics_compat_names,
                   "none (default), or vllm: /metrics adds vLLM's series (vllm:*, labels\n"
                   "model_name, engine, finished_reason) beside megascope's, for vLLM's\n"
                   "dashboards and the inference gateway's endpoint picker"),
    /* llama-server's and vLLM's spellings of the same options */
    CLI_OPT_ALIAS(NULL, 'm', "model"),
    CLI_OPT_ALIAS("ctx-size", 'c', "max-ctx"),
    CLI_OPT_ALIAS("max-model-len", 0, "max-ctx"),
    CLI_OPT_ALIAS("threads", 't', "workers"),
    CLI_OPT_ALIAS("parallel", 0, "batch"),
    CLI_OPT_ALIAS("-np", 0, "batch"),
    CLI_OPT_ALIAS("max-num-seqs", 0, "batch"),
    CLI_OPT_ALIAS("max-num-batched-tokens", 0, "max-batched-tokens"),
    CLI_OPT_ALIAS("alias", 'a', "served-model-name"),
    CLI_OPT_ALIAS("enable-prefix-caching", 0, "prefix-cache"),
    CLI_OPT_ALIAS("no-enable-prefix-caching", 0, "no-prefix-cache"),
    CLI_OPT_GROUP(SA, lim, limit_opts),
    {0}};
#undef SA

static const char serve_head[] =
    "usage: megascope serve [--model F.gguf | --synthetic PRESET] [options]\n\n"
    "With no model named it serves SmolLM2-135M-Instruct from the model cache\n"
    "(~/.cache/megascope; scripts/get-smollm2.sh fetches it).\n\n"
    "Runs the engine until SIGINT or SIGTERM: the OpenAI API over HTTP (POST /v1/chat/completions\n"
    "and /v1/completions, streamed or not; GET /v1/models; continuous batching), llama-server's\n"
    "/tokenize, /detokenize and /health, Prometheus metrics (GET /metrics), a control socket\n"
    "for monitors, traces and statistics (megascope attach / ls / maps / trace ...), and\n"
    "optionally OTLP/HTTP request spans.\n\n";

/* 0: parsed; 1: --help printed; -1: a usage error, printed. */
static int parse(int argc, char **argv, struct serve_args *a) {
  *a = (struct serve_args){.tp = 1, .batch = 8, .max_tokens = 16, .watchdog_ms = 5000,
                           .flush_ms = 1000, .retention_s = 60, .idle_s = 60, .http = "127.0.0.1:8080",
                           .drain_s = 30, .api_key = getenv("MEGASCOPE_API_KEY"), .max_batched = 64,
                           .step_target_ms = 50, .q8 = 1, .port = -1, .temperature = -1, .prefix_cache = 1};
  int rc = cli_parse("serve", serve_head, serve_opts, a, argc, argv, NULL);
  if (rc) return rc;
  const struct ms_backend_info *be = ms_backend_info((enum ms_backend)a->be.backend);
  if (be->virtual_clock) {
    fprintf(stderr, "megascope serve: --backend %s: the simulator runs in virtual time; serve on cpu or cuda\n",
            be->name);
    return -1;
  }
  if (a->tp > 1 && a->be.backend != MS_BACKEND_CPU) {
    fprintf(stderr, "megascope serve: --tp %ld: tensor parallelism across processes runs on the cpu backend, not %s\n",
            a->tp, be->name);
    return -1;
  }
  if (a->tp > 1 && cli_dist_ranks() == 1) {
    fprintf(stderr, "megascope serve: --tp %ld is %ld processes: start it as `mpirun -np %ld megascope serve --tp %ld "
            "...`\n", a->tp, a->tp, a->tp, a->tp);
    return -1;
  }
  if (a->be.sms && !be->device_sms) {
    fprintf(stderr, "megascope serve: --sms is for --backend cuda\n");
    return -1;
  }
  a->port_set = a->port >= 0;  /* the defaults say "not given" */
  a->temperature_set = a->temperature >= 0;
  if (!a->temperature_set) a->temperature = 0;
  if (a->chat_template) {
    enum ms_chat_template t;
    if (ms_chat_template_parse(a->chat_template, &t)) {
      fprintf(stderr, "megascope serve: --chat-template '%s': expected one of %s\n", a->chat_template,
              MS_CHAT_TEMPLATE_NAMES);
      return -1;
    }
  }
  return 0;
}

/* The chat template: --chat-template, else the model's own
 * (ms_chat_template_for_model). An unknown template is not fatal: chat
 * requests are then refused with the reason, completions still work. */
static void pick_chat_template(const struct serve_args *a, const struct ms_model *m, struct ms_http_opts *ho,
                               char *note, size_t n) {
  enum ms_chat_template t = MS_CHAT_CHATML;
  ho->chat_ok = 1;
  if (a->chat_template) {
    ms_chat_template_parse(a->chat_template, &t);
    snprintf(note, n, "%s (--chat-template)", ms_chat_template_name(t));
  } else if (ms_chat_template_for_model(a->cm.path, (int)m->cfg.arch, &t, note, n)) {
    char why[400];
    snprintf(why, sizeof why, "%s", note);
    ho->chat_ok = 0;
    snprintf(note, n, "none: %s; chat requests are refused (use --chat-template NAME)", why);
  }
  ho->chat_template = (int)t;
}

/* --fault: named against the plan of the largest bucket, tiled as the
 * backend tiles (class and event class names are the same in every bucket's
 * plan); under --tp a device is a rank, so comm_delay and bandwidth_steal aim at one. */
static int resolve_faults(const struct ms_model *m, const struct serve_args *a, struct ms_fault *out) {
  char buf[1024] = "";
  struct ms_textbuf log = {.buf = buf, .size = sizeof buf};
  int D = a->tp > 1 ? (int)a->tp : 1;
  const struct ms_backend_info *bi = ms_backend_info((enum ms_backend)a->be.backend);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = ms_bucket_for((int)a->batch), .tp = D};
  ms_backend_plan_tiling(bi, &co);
  struct ms_plan *p = ms_plan_compile(m, &co, &log);
  int workers = a->workers ? (int)a->workers : (int)sysconf(_SC_NPROCESSORS_ONLN);
  int rc = p ? 0 : -1;
  for (int i = 0; !rc && i < a->n_fault; i++) {
    struct bench_fault f;
    rc = bench_fault_spec(a->fault[i], &f, &log) ||
         bench_fault_resolve(&f, p, workers > 0 ? workers : 1, (int)a->batch, D, &out[i], &log);
  }
  ms_plan_free(p);
  if (rc) fprintf(stderr, "megascope serve: --fault: %s", buf);
  return rc;
}

/* The defaults that follow the descriptor limit, raised to its hard limit
 * first (as Go and nginx do): a reserve for the engine, its model, the
 * control socket and its 32 clients, then half of what is left for HTTP
 * connections (at most 512) and the rest for attachments' maps (at most 4096). */
static void serve_defaults(struct serve_limits *l) {
  struct rlimit r;
  long have = 1024;
  if (!getrlimit(RLIMIT_NOFILE, &r)) {
    if (r.rlim_cur < r.rlim_max) {
      struct rlimit up = {r.rlim_max, r.rlim_max};
      if (!setrlimit(RLIMIT_NOFILE, &up)) r = up;
    }
    have = r.rlim_cur == RLIM_INFINITY || r.rlim_cur > (1 << 20) ? 1 << 20 : (long)r.rlim_cur;
  }
  long avail = have > 96 + 32 ? have - 96 : 32;
  if (!l->conns) l->conns = avail / 2 < 16 ? 16 : avail / 2 > 512 ? 512 : avail / 2;
  if (!l->attach_fds) {
    long left = avail - l->conns;
    l->attach_fds = left < 16 ? 16 : left > 4096 ? 4096 : left;
  }
  if (!l->attach_bytes) l->attach_bytes = 1ull << 30;
  if (!l->retained) l->retained = 256;
  if (!l->queued) l->queued = 1024;
}

/* The id clients name the model by: --served-model-name, else the file's
 * name without its directory and ".gguf" (llama-server's and vLLM's users
 * name files, not the general.name inside), else the preset's name. */
static void served_id(const struct serve_args *a, const struct ms_model *m, char *id, size_t n) {
  if (a->served_name) {
    snprintf(id, n, "%s", a->served_name);
  } else if (a->cm.path) {
    const char *b = strrchr(a->cm.path, '/');
    b = b ? b + 1 : a->cm.path;
    size_t len = strlen(b);
    if (len > 5 && !strcmp(b + len - 5, ".gguf")) len -= 5;
    snprintf(id, n, "%.*s", (int)len, b);
  } else {
    snprintf(id, n, "%s", a->cm.preset ? a->cm.preset : m->cfg.name);
  }
}

/* "ADDR:PORT" -> addr (in buf), port. */
static int parse_http(const char *s, char *addr, size_t n, int *port) {
  const char *colon = strrchr(s, ':');
  long p;
  if (!colon || colon == s || (size_t)(colon - s) >= n) {
    fprintf(stderr, "megascope serve: --http '%s': expected ADDR:PORT (e.g. 127.0.0.1:8080) or 'off'\n", s);
    return -1;
  }
  if (cli_int("--http port", colon + 1, 0, 65535, &p)) return -1;
  snprintf(addr, n, "%.*s", (int)(colon - s), s);
  *port = (int)p;
  return 0;
}

/* sigtimedwait for up to ms: the signal, or 0. */
static int wait_signal(const sigset_t *sigs, int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  int sig = sigtimedwait(sigs, NULL, &ts);
  return sig > 0 ? sig : 0;
}

/* A rank other than 0 of a served engine: no HTTP, no control socket; its
 * engine follows rank 0's step headers until rank 0 stops (then so does it,
 * exit 0) or a wait on another rank fails (the report, then every rank ends,
 * non-zero). A signal is rank 0's to act on (mpirun passes it to every rank):
 * a first one is noted, a second ends every rank at once. */
static int follow_rank0(struct ms_engine *e, struct ms_transport *tx, const sigset_t *sigs) {
  fprintf(stderr, "megascope serve: rank %d of %d (pid %ld): following rank 0's steps (it serves HTTP and the "
          "control socket)\n", tx->rank, tx->size, (long)getpid());
  int signals = 0;
  while (ms_engine_wait_stopped(e, 0)) {
    int sig = wait_signal(sigs, 200);
    if (!sig) continue;
    if (++signals == 1) {
      fprintf(stderr, "megascope serve: rank %d: %s: rank 0 stops the engine; this rank follows it until then "
              "(a second signal ends every rank now)\n", tx->rank, sig == SIGINT ? "SIGINT" : "SIGTERM");
      continue;
    }
    fprintf(stderr, "megascope serve: rank %d: a second signal: ending every rank now\n", tx->rank);
    fflush(stderr);
    tx->abort(tx->ctx, 1);
  }
  cli_dist_check_failed("serve", tx, e);  /* a failed wait: reported, every rank ended */
  if (ms_engine_lead_stopped(e)) {
    fprintf(stderr, "megascope serve: rank %d: rank 0 stopped serving; this rank stops too\n", tx->rank);
    return 0;
  }
  fprintf(stderr, "megascope serve: rank %d: the engine stopped without word from rank 0\n", tx->rank);
  return 1;
}

static int serve_on(const struct serve_args *ap, struct ms_transport *tx);

int cmd_serve(int argc, char **argv) {
  struct serve_args a;
  int prc = parse(argc, argv, &a);
  if (prc) return prc > 0 ? 0 : 2;
  int dist_failed;
  struct ms_transport *tx = cli_dist_start("serve", (int)a.tp, &a.cm, argc, argv, &dist_failed);
  if (dist_failed) return 2;
  int rc = serve_on(&a, tx);
  cli_dist_end(tx);
  return rc;
}

/* One server; tx: the transport to the other ranks, or NULL. */
static int serve_on(const struct serve_args *ap, struct ms_transport *tx) {
  struct serve_args a = *ap;
  char addr[256] = "";
  int port = 0, use_http = strcmp(a.http, "off") != 0 || a.host || a.port_set;
  if (strcmp(a.http, "off") && parse_http(a.http, addr, sizeof addr, &port)) return 2;
  if (!strcmp(a.http, "off")) snprintf(addr, sizeof addr, "127.0.0.1"), port = 8080;
  if (a.host) snprintf(addr, sizeof addr, "%s", a.host);
  if (a.port_set) port = (int)a.port;
  cli_log_init(a.verbose);
  /* a GGUF brings its own tokenizer; synthetic models get the byte-level one */
  struct ms_tokenizer *tok = NULL;
  a.cm.unpacked = tx != NULL;  /* a rank packs the rows it reads once its engine knows them */
  struct ms_model *m = cli_model_load_tok(&a.cm, &tok);
  if (!m) return 2;
  char ctx_why[320] = "--max-ctx";
  if (!a.max_ctx) a.max_ctx = cli_default_ctx(m, a.batch, a.kv_f16, ctx_why, sizeof ctx_why);

  /* every thread started from here on inherits the blocked signals */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  int rc = 1;
  struct ms_engine *e = NULL;
  struct ms_control *ctl = NULL;
  struct ms_http *http = NULL;
  struct ms_otlp *otlp = NULL;
  char lb[4096] = "", chat_note[768] = "";
  struct ms_textbuf log = {lb, sizeof lb, 0, 0};
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = (int)a.workers, .max_batch = (int)a.batch,
                              .max_ctx = (int)a.max_ctx, .watchdog_ms = (int)a.watchdog_ms,
                              .max_batched_tokens = (int)a.max_batched, .prefill_async = 1,
                              .step_target_us = (int)a.step_target_ms * 1000,
                              .q8_activations = a.q8, .kv_f16 = a.kv_f16, .backend = (enum ms_backend)a.be.backend,
                              .cuda_sms = (int)a.be.sms, .pin_workers = a.pin,
                              .prefix_cache = a.prefix_cache, .tp = (int)a.tp, .transport = tx,
                              .comm_timeout_ms = (int)a.comm_timeout_ms, .tp_lead = tx != NULL};
  struct cli_dist_pack pack;
  cli_dist_pack_opts(&eo, &pack, m, tx);
  char model_id[128];
  served_id(&a, m, model_id, sizeof model_id);
  struct ms_fault faults[4];
  eo.faults = faults;
  eo.n_faults = a.n_fault;
  if (a.n_fault && resolve_faults(m, &a, faults)) goto out;
  if (!(e = ms_engine_new(m, &eo, &log))) {
    fprintf(stderr, "megascope serve: cannot start the engine: %s", lb);
    goto out;
  }
  if (tx && tx->rank != 0) {
    rc = follow_rank0(e, tx, &sigs);
    goto out;
  }
  ms_engine_set_detached_retention(e, (uint64_t)a.retention_s * 1000000000ull);
  serve_defaults(&a.lim);
  struct ms_attach_budget ab = {.sz = sizeof ab, .max_retained = (int)a.lim.retained,
                                .max_fds = (int)a.lim.attach_fds, .max_bytes = a.lim.attach_bytes};
  ms_engine_set_attach_budget(e, &ab);
  ms_engine_set_max_queued(e, (int)a.lim.queued);
  struct ms_control_opts co = {.sz = sizeof co, .path = a.socket, .model_name = model_id,
                               .idle_timeout_ms = a.idle_s ? (int)(a.idle_s > 2000000 ? 2000000000 : a.idle_s * 1000) : -1};
  if (!(ctl = ms_control_new(e, &co, &log))) {
    fprintf(stderr, "megascope serve: %s", lb[0] ? lb : "cannot create the control socket\n");
    goto out;
  }
  if (a.otlp) {
    struct ms_otlp_opts oo = {.sz = sizeof oo, .url = a.otlp, .model_name = model_id,
                              .flush_ms = (int)a.flush_ms};
    if (!(otlp = ms_otlp_new(&oo, &log))) {
      fprintf(stderr, "megascope serve: %s", lb[0] ? lb : "cannot start the OTLP exporter\n");
      goto out;
    }
  }
  if (use_http) {
    struct ms_http_opts ho = {.sz = sizeof ho, .addr = addr, .port = port, .model_name = model_id,
                              .tok = tok, .otlp = otlp, .control = ctl, .max_tokens_default = (int)a.max_tokens,
                              .api_key = a.api_key, .temperature_default = (float)a.temperature,
                              .temperature_set = a.temperature_set, .max_ctx = (int)a.max_ctx,
                              .max_connections = (int)a.lim.conns,
                              .max_connections_per_client = (int)a.lim.conns_client,
                              .read_timeout_ms = (int)a.lim.read_s * 1000, .idle_timeout_ms = (int)a.lim.idle_s * 1000,
                              .max_request_tokens = (int)a.lim.req_tokens, .max_prompt_tokens = (int)a.lim.prompt_tokens,
                              .client_max_requests = (int)a.lim.client_reqs,
                              .client_max_tokens = a.lim.client_tokens,
                              .accept_any_model = a.any_model, .metrics_compat = a.metrics_compat};
    pick_chat_template(&a, m, &ho, chat_note, sizeof chat_note);
    if (!(http = ms_http_new(e, &ho, &log))) {
      fprintf(stderr, "megascope serve: %s", lb[0] ? lb : "cannot start the HTTP server\n");
      goto out;
    }
  }
  printf("megascope serve: %s (%s), %s backend, %d workers, batch %ld, context %ld, pid %ld\n", m->cfg.name,
         ms_dtype_name(m->cfg.dtype), ms_backend_name((enum ms_backend)a.be.backend), ms_engine_n_workers(e),
         a.batch, a.max_ctx, (long)getpid());
  if (a.cm.path) printf("  model:  %s\n", a.cm.path);
  if (tx)
    printf("  ranks:  %d processes, tensor parallel (--tp %ld): this rank (0) serves and decides every step, "
           "the others follow\n", tx->size, a.tp);
  printf("  context: %ld positions a request (%s); KV cache in %s\n", a.max_ctx, ctx_why, a.kv_f16 ? "f16" : "f32");
  if (http) {
    printf("  http:   http://%s:%d  (POST /v1/chat/completions, /v1/completions; GET /v1/models, /metrics)\n",
           ms_http_host(http), ms_http_port(http));
    printf("  chat:   %s\n", chat_note);
    if (a.api_key && a.api_key[0]) printf("  auth:   an API key is required (Bearer)\n");
  }
  char pc_off[64];  /* a backend without the prefix cache */
  snprintf(pc_off, sizeof pc_off, "off (not on the %s backend yet)", ms_backend_name((enum ms_backend)a.be.backend));
  printf("  model id: %s%s; prefix cache %s\n", model_id,
         a.any_model ? " (requests may name any model)" : "",
         !a.prefix_cache ? "off" : !ms_backend_info((enum ms_backend)a.be.backend)->prefix_cache ? pc_off : "on");
  long rows = a.be.backend == MS_BACKEND_CPU ? a.max_batched : 0;  /* the others keep one position a step */
  if (rows > 1 && a.step_target_ms)
    printf("  steps:  up to %ld token rows; prompt chunks sized for %ld ms steps while streams run\n", rows,
           a.step_target_ms);
  else if (rows > 1)
    printf("  steps:  up to %ld token rows (step budget off)\n", rows);
  printf("  socket: %s\n", ms_control_path(ctl));
  if (otlp) printf("  otlp:   %s\n", a.otlp);
  if (!tok) printf("  note:   vocabulary of %d ids < 256: prompts must be arrays of token ids\n", m->cfg.vocab);
  printf("ready; stop with SIGINT or SIGTERM\n");
  fflush(stdout);

  int sig = 0;
  char report[1024];
  while (!(sig = wait_signal(&sigs, 200))) {
    if (tx && ms_engine_comm_failed(e, report, sizeof report)) {
      /* the engine stopped and cancelled every request: HTTP answers them
       * with an error, then the report and every rank ends, non-zero */
      if (http) ms_http_drain(http, 2000);
      cli_dist_check_failed("serve", tx, e);
    }
  }
  printf("megascope serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  fflush(stdout);
  if (http) {
    int cut = ms_http_drain(http, (int)a.drain_s * 1000);
    printf("megascope serve: drained (%d request%s cancelled after --drain-timeout %lds)\n", cut,
           cut == 1 ? "" : "s", a.drain_s);
    fflush(stdout);
  }
  cli_dist_check_failed("serve", tx, e);  /* across ranks, a wait that failed while draining */
  rc = 0;
out:
  ms_http_free(http);
  ms_control_free(ctl);
  ms_otlp_free(otlp);
  if (e) {
    struct ms_engine_stats st;
    ms_engine_get_stats(e, &st);
    if (!rc)
      printf("megascope serve: stopped after %llu steps, %llu tokens\n", (unsigned long long)st.steps,
             (unsigned long long)st.tokens);
  }
  ms_engine_free(e);
  ms_tokenizer_free(tok);
  ms_model_free(m);
  return rc;
}
