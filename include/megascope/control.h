/* SPDX-License-Identifier: MIT */
/* The control plane: how another process operates a running engine.
 *
 * Two doors. The control socket (a Unix stream socket, one per engine) lets the
 * engine's own user attach, replace and detach monitors, read their maps with
 * coverage, the task schema, statistics and a task trace. The HTTP server takes
 * generation requests (POST /v1/completions, OpenAI-style) and serves /metrics
 * in the Prometheus text format.
 *
 * The socket protocol (version MS_CONTROL_PROTOCOL). Every message, either way,
 * is one frame: a u32 little-endian length, then that many bytes of JSON (one
 * object). A request names its command in "cmd"; a reply carries "ok": true and
 * the command's result, or "ok": false with "error" (a sentence naming the
 * problem), "code" (a symbolic errno such as "ENOENT") and, when a program was
 * rejected, "log" (the verifier's or loader's log). Object bytes travel base64
 * encoded in "object". A reply may hand file descriptors over with SCM_RIGHTS
 * (the trace, the maps' shared memory), read-only and sealed where possible;
 * "fds" in the reply lists what each one is. Commands:
 *
 *   info                                   protocol, pid, model, workers
 *   attach  object, name, max_per_step, sample, ringbuf_bytes      -> id
 *   replace id, object, name [, the budget fields of attach]       -> generation
 *   detach  id
 *   list    [id]                           attachments with hooks and coverage (or one)
 *   maps    id [, fds: true] [, release: true]
 *                                          coverage + every map decoded (+ text);
 *                                          release: free the detached attachment
 *                                          once answered (its last read-out)
 *   schema  [rows]                         the plan's versioned task schema
 *   stats                                  steps, tokens, TTFT and TPOT quantiles
 *   trace   seconds [, records_per_worker] the Chrome JSON trace, as a memfd
 *   records id                             the attachment's ring buffers as read-write
 *                                          memfds for one consumer (until it closes
 *                                          its connection), with record layouts from BTF
 *
 * The socket lives in a directory of mode 0700 with mode 0600 itself, and the
 * server checks each peer's uid (SO_PEERCRED): only the engine's user or root is
 * served; anyone else gets an error frame and is closed. Messages larger than the
 * limit, malformed JSON, unknown commands and bad arguments get error replies;
 * a message begun and not finished within the message timeout, or a client that
 * vanishes mid-message, is closed; so is a client idle for the idle timeout, and
 * a full server makes room for a new client by closing its longest-idle one.
 * None of these disturbs the engine. */
#ifndef MEGASCOPE_CONTROL_H
#define MEGASCOPE_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/base.h"
#include "megascope/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MS_CONTROL_PROTOCOL 1
#define MS_CONTROL_MAX_MESSAGE (16u << 20)   /* bytes of JSON a request may carry */
#define MS_CONTROL_MAX_REPLY (1u << 30)      /* bytes of JSON a client accepts */
#define MS_CONTROL_MAX_FDS 16                /* descriptors one reply may hand over */

/* The protocol's commands, declared once: each command's name and the request
 * fields it takes (besides "cmd"). The server refuses any other field and
 * lists these names in "info"; clients build requests from the same table
 * (ms_control_command_takes), so neither side can name a field the other
 * does not know. */
struct ms_control_command {
  const char *name;
  const char *const *fields;  /* NULL-ended */
};
extern const struct ms_control_command ms_control_commands[];
extern const int ms_control_n_commands;
/* The command called name, or NULL. */
const struct ms_control_command *ms_control_command_find(const char *name);
/* 1 when command cmd takes request field `field`. */
int ms_control_command_takes(const char *cmd, const char *field);

/* ---- framing (both sides) ---- */

/* Sends one frame (blocking), with fds attached to its first byte when n_fds > 0. */
int ms_control_frame_send(int sock, const void *buf, size_t len, const int *fds, int n_fds);
/* Receives one frame of at most max bytes within timeout_ms (< 0: no limit):
 * *out is malloc'd and NUL-terminated. Descriptors that came with it are stored
 * in fds (up to max_fds; extra ones are closed) and counted in *n_fds.
 * -EMSGSIZE over max, -ECONNRESET when the peer closed (mid-frame or before),
 * -ETIMEDOUT. */
int ms_control_frame_recv(int sock, char **out, size_t *len, size_t max, int *fds, int *n_fds, int max_fds,
                          int timeout_ms);

/* Base64 (RFC 4648, with padding). encode writes a NUL-terminated string of
 * ms_base64_encoded_len(n) bytes + 1; decode returns the byte count or -EINVAL. */
size_t ms_base64_encoded_len(size_t n);
void ms_base64_encode(const void *in, size_t n, char *out);
long ms_base64_decode(const char *in, size_t n, void *out, size_t out_size);

/* The default socket path for process pid: $XDG_RUNTIME_DIR/megascope/engine-<pid>.sock
 * when XDG_RUNTIME_DIR is set, else /run/megascope/engine-<pid>.sock. */
int ms_control_default_path(char *buf, size_t size, long pid);

/* ---- the server ---- */

struct ms_control_opts {
  size_t sz;                  /* sizeof(struct ms_control_opts) */
  const char *path;           /* socket path; NULL: ms_control_default_path(getpid()) */
  uint32_t max_message;       /* 0: MS_CONTROL_MAX_MESSAGE */
  int max_clients;            /* connected at once; 0: 32 */
  int message_timeout_ms;     /* a frame begun must complete within it; 0: 10000 */
  unsigned socket_mode;       /* 0: 0600. Tests widen it to reach the uid check. */
  const char *model_name;     /* reported by "info" */
  int idle_timeout_ms;        /* a client with no request in progress for this long is
                               * closed; 0: 60000; < 0: never. At max_clients, a new
                               * client closes the longest-idle one (idle at least
                               * min(1 s, idle timeout)) instead of being refused. */
};

struct ms_control;

/* Creates the socket (and its 0700 directory when missing; a stale socket of a
 * dead engine is replaced, a live one is -EADDRINUSE) and starts the server
 * thread. NULL + errno with the reason in log. */
struct ms_control *ms_control_new(struct ms_engine *e, const struct ms_control_opts *o, struct ms_textbuf *log);
/* Stops the server thread, closes every client and unlinks the socket. */
void ms_control_free(struct ms_control *c);
const char *ms_control_path(const struct ms_control *c);

struct ms_control_stats {
  uint64_t accepted;          /* connections served */
  uint64_t refused;           /* connections refused (uid, too many clients) */
  uint64_t requests;          /* frames answered */
  uint64_t errors;            /* error replies sent */
  uint64_t dropped;           /* clients closed mid-message (vanished, timed out, oversized) */
  uint64_t idle_closed;       /* clients closed for idleness (timeout, or room for a new one) */
};
void ms_control_get_stats(const struct ms_control *c, struct ms_control_stats *out);

/* ---- the client ---- */

struct ms_control_client;

/* Connects to a server's socket; NULL + errno with the reason in log. */
struct ms_control_client *ms_control_connect(const char *path, struct ms_textbuf *log);
void ms_control_client_free(struct ms_control_client *c);
int ms_control_client_fd(const struct ms_control_client *c);
/* Sends a request (JSON text) and waits up to timeout_ms (< 0: forever) for
 * its reply: *reply is malloc'd and NUL-terminated; descriptors handed over are
 * stored in fds (up to max_fds), their count in *n_fds (fds may be NULL). */
int ms_control_call(struct ms_control_client *c, const char *req, size_t len, char **reply, size_t *reply_len,
                    int *fds, int *n_fds, int max_fds, int timeout_ms);

/* ---- the HTTP server ---- */

struct ms_tokenizer;
struct ms_otlp;

struct ms_http_opts {
  size_t sz;                  /* sizeof(struct ms_http_opts) */
  const char *addr;           /* a host name, IPv4 or IPv6 address to bind; NULL: 127.0.0.1 */
  int port;                   /* 0: any free port (ms_http_port tells which) */
  const char *model_name;     /* "model" in answers and GET /v1/models */
  const struct ms_tokenizer *tok;  /* text <-> ids; NULL: prompts are token ids only */
  struct ms_otlp *otlp;       /* finished requests are exported as spans; may be NULL */
  struct ms_control *control; /* its statistics join /metrics; may be NULL */
  int max_connections;        /* open connections in all; 0: 512 */
  int max_tokens_default;     /* completions' max_tokens when a request omits it; 0: 16 */
  /* The OpenAI API (later fields; zero is the default): */
  const char *api_key;        /* NULL: none; else "Authorization: Bearer KEY" on all but /health, /metrics */
  int chat_template;          /* enum ms_chat_template for /v1/chat/completions */
  int chat_ok;                /* 0: chat requests are refused (no template known) */
  float temperature_default;  /* when a request omits it (OpenAI: 1) */
  int temperature_set;        /* 0: temperature_default is 1 */
  int max_ctx;                /* the engine's context (positions per request) */
  /* Connections and fair shares (later fields; zero is the default). A client
   * is an IPv4 address or an IPv6 /64. */
  int max_connections_per_client; /* 0: 128 */
  int read_timeout_ms;        /* a request's head, then its body, must arrive within it; 0: 10000 */
  int idle_timeout_ms;        /* a kept-alive connection's next request, and a client that stops
                                 reading an answer; 0: 15000 */
  int max_request_tokens;     /* n x max_tokens over a request's prompts; 0: max(8192, 2 x max_ctx) */
  int max_prompt_tokens;      /* prompt tokens over a request's choices; 0: max(8192, 2 x max_ctx) */
  int client_max_requests;    /* choices one client holds queued and running; 0: 128 */
  long long client_max_tokens; /* their prompts and max_tokens; 0: max(65536, 16 x max_ctx) */
  /* Later fields (zero is the default). */
  int accept_any_model;       /* 0: a request naming a model other than model_name gets 404
                                 model_not_found, as OpenAI answers; 1: any name is served */
  int metrics_compat;         /* 1: /metrics adds vLLM's series (vllm:*) beside megascope's */
};

struct ms_http;

/* Starts serving (its own threads). NULL + errno with the reason in log. */
struct ms_http *ms_http_new(struct ms_engine *e, const struct ms_http_opts *o, struct ms_textbuf *log);
/* Stops admission (new generation requests get 503, /health says draining),
 * waits up to timeout_ms for the requests in flight to finish, then cancels
 * the rest (a stream gets an error event, a waiting client 503). Returns the
 * number cancelled. */
int ms_http_drain(struct ms_http *h, int timeout_ms);
/* Drains with no wait, then stops. */
void ms_http_free(struct ms_http *h);
int ms_http_port(const struct ms_http *h);
/* The address bound, as it can be put in a URL ("127.0.0.1", "[::1]"). */
const char *ms_http_host(const struct ms_http *h);

struct ms_http_stats {
  uint64_t completions;       /* answered 200 (streams included) */
  uint64_t rejected;          /* answered 4xx / 5xx */
  uint64_t scrapes;           /* GET /metrics */
  uint64_t cancelled;         /* generations cut short: the client left or the server stopped */
  /* later fields */
  int connections;            /* open now */
  uint64_t conn_refused;      /* connections refused (all busy, the client's all busy, no descriptors) */
  uint64_t conn_closed;       /* connections closed by a deadline or to make room */
  uint64_t over_share;        /* requests answered 429: the client's share, or the queue, was full */
};
void ms_http_get_stats(const struct ms_http *h, struct ms_http_stats *out);

#ifdef __cplusplus
}
#endif
#endif
