/* SPDX-License-Identifier: MIT */
/* Options and helpers the subcommands share: choosing a model, printing errors. */
#ifndef MS_TOOLS_COMMON_H
#define MS_TOOLS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "megascope/json.h"
#include "megascope/engine.h"
#include "megascope/model.h"

struct cli_model {
  const char *preset;   /* --synthetic */
  const char *dtype;    /* --dtype */
  uint64_t seed;        /* --model-seed */
  int shape_only;       /* set by the caller: shapes without weights (the simulator) */
  const char *path;     /* --model F.gguf */
  int unpacked;         /* set by the caller: a GGUF model without its packed form (a rank
                           packs the rows it reads: cli_dist_pack) */
};

/* The options that fill it: cli_model_opts (opt.h). */

/* The model used when none is named: SmolLM2-135M-Instruct (Q4_1), as
 * scripts/get-smollm2.sh puts it into the model cache ($MS_CACHE, else
 * ~/.cache/megascope). */
#define CLI_DEFAULT_MODEL_NAME "SmolLM2-135M-Instruct"
#define CLI_DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"
/* The model cache's path of `file` into buf. */
void cli_model_cache_path(const char *file, char *buf, size_t n);

/* Loads the model; prints the reason and returns NULL on failure. With
 * neither --model nor --synthetic, cm->path becomes the default model's file
 * (said on stderr), or the failure says how to get it. */
struct ms_model *cli_model_load(struct cli_model *cm);
struct ms_tokenizer;
/* Loads the model and its tokenizer: the file's own with --model, the
 * byte-level one for a synthetic model (*tok is NULL when its vocabulary is
 * under 256 ids). Prints the reason and returns NULL on failure. */
struct ms_model *cli_model_load_tok(struct cli_model *cm, struct ms_tokenizer **tok);

/* The context when none is asked for: the model's trained context, capped so
 * that the KV cache of `slots` requests at full length (f32 keys and values, or f16 with kv_f16)
 * fits in half the memory available now; 512 for a model that names none
 * (the synthetic presets). `why` says which, for the start banner. */
long cli_default_ctx(const struct ms_model *m, long slots, int kv_f16, char *why, size_t n);

/* Strict integer parsing for option values: prints an error naming the option. */
int cli_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_u64(const char *opt, const char *s, uint64_t *out);

struct ms_engine;
/* Generated tokens per second for `batch` one-token prompts of `steps` tokens
 * each, timed from submission to the last completion; -1 when the engine
 * refuses a request (the ones already submitted are waited for and freed). */
double cli_decode_tps(struct ms_engine *e, const struct ms_model *m, int batch, int steps);
/* The same with lockstep set: the engine paused while the requests are
 * submitted, so that they join one step (the ranks of one engine across
 * processes must all admit the same requests in the same step). */
double cli_decode_tps_at(struct ms_engine *e, const struct ms_model *m, int batch, int steps, int lockstep);

/* The control socket as attach, maps and the rest find it (--socket, then
 * $MEGASCOPE_SOCKET, then the one engine socket in the default directory), and
 * one request to it: the parsed reply when it says ok, else NULL with the
 * engine's error and log printed (cmd_ctl.c). fds: up to MS_CONTROL_MAX_FDS
 * descriptors handed over, or NULL. */
typedef struct json_t json_t;
int cli_ctl_socket(const char *me, const char *given, char *buf, size_t size);
json_t *cli_ctl_call(const char *me, const char *path, const char *req, size_t len, int timeout_ms, int *fds,
                     int *n_fds);
/* Why the last cli_ctl_call returned NULL ("" when it did not), one line;
 * *answered: 1 when the engine answered (it refused), 0 when it could not be
 * reached or stopped answering. */
const char *cli_ctl_last_error(int *answered);

/* Tensor parallelism across processes (tools/engine/cli_dist.c). When this process
 * was started by mpirun: the MPI transport, after the launch check (every rank
 * has the same model file, the same megascope executable, the same --tp, equal
 * to the number of ranks, and the same arguments), else NULL with *failed set
 * and the refusal, by name, printed. Without mpirun: NULL, *failed 0. Ranks
 * other than 0 send their stdout to /dev/null. */
struct ms_transport;
struct ms_transport *cli_dist_start(const char *me, int tp, const struct cli_model *cm, int argc, char **argv,
                                    int *failed);
/* The engine stopped because a wait on another rank failed: prints the report
 * and ends every rank (does not return); else returns. */
void cli_dist_check_failed(const char *me, struct ms_transport *t, const struct ms_engine *e);
/* MPI_Finalize; NULL does nothing. */
void cli_dist_end(struct ms_transport *t);
/* A rank's weights: ms_engine_opts.weight_rows_hook with a struct
 * cli_dist_pack as its user. The rows its tasks read packed alone
 * (ms_model_repack_rows; the model loaded with cm.unpacked), and a line on
 * stderr saying how much, against the whole model's packed form. */
struct cli_dist_pack {
  struct ms_model *m;
  int rank;
};
void cli_dist_pack(const struct ms_weight_rows *rows, int n, void *user);
/* With a transport: *p describes m on this rank and eo's weight_rows_hook
 * packs through it (p must outlive the engine); without one, nothing. */
void cli_dist_pack_opts(struct ms_engine_opts *eo, struct cli_dist_pack *p, struct ms_model *m,
                        const struct ms_transport *t);
/* The packed bytes of every rank (ms_model.packed_bytes), through the
 * transport: all[0 .. t->size). Every rank calls it at the same point. 0, or
 * a negative errno. */
int cli_dist_packed_bytes(struct ms_transport *t, const struct ms_model *m, uint64_t *all);
/* The ranks mpirun started (its environment, before any MPI call); 1 without it. */
int cli_dist_ranks(void);

/* The path of a shipped monitor object: <dir of this executable>/monitors/NAME. */
void cli_shipped_monitor(const char *name, char *buf, size_t n);

/* The median of v[0..n), sorting v ascending; 0 when n == 0. */
double cli_median(double *v, int n);

/* Writes a jansson value (json_t *) through the project's JSON writer. */
struct json_t;
void cli_json_emit(struct ms_json *j, struct json_t *v);

#endif
