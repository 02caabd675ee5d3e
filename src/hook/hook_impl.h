/* SPDX-License-Identifier: MIT */
/* The engine side of hooks (private): monitors, attachments with their
 * generations and per-worker coverage, and the hook table the runtime fires.
 *
 * DESIGN
 * Who runs what. Workers fire hooks (ms_hook_fire) from the scheduler's
 * transitions; a control thread (the CLI, the socket server) attaches, replaces
 * and detaches under the table's mutex. Workers never take the mutex.
 * Publication. Each hook has an immutable set of (generation, program) entries,
 * published with a release store of its pointer; a firing loads it with acquire
 * inside the worker's hook epoch.
 * Reclamation (QSBR). A worker's epoch is odd while it is inside a hook; a control
 * operation swaps the set pointers (seq_cst), then waits until every worker's
 * epoch is even or has moved on (seq_cst loads), so no worker can still hold an
 * old set; only then is the old set freed. An older generation's programs and
 * maps are kept, read-only, for its final read-out: a detached attachment and a
 * replaced generation are freed by ms_hook_reap once they have been closed for
 * the table's retention, or at once by ms_hook_release (the last read-out);
 * both run under the mutex, after the quiescence that closed them, so no
 * worker and no reader can still hold them. The budget (count, descriptors,
 * bytes) frees the oldest closed generations first when a bound is passed,
 * and refuses an attach or replace that would pass it with nothing closed
 * left to free. Ids grow from 1 and are never
 * reused; the attachment array holds the live and retained ones, in id order.
 * Coverage. Each generation has per-worker counters written only by that worker
 * (relaxed stores) and summed by readers; a firing is counted by the generation
 * whose set it loaded, so old + new add up to what was eligible. */
#ifndef MS_HOOK_HOOK_IMPL_H
#define MS_HOOK_HOOK_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "megascope/bpf.h"
#include "megascope/bpf_jit.h"
#include "megascope/hook.h"
#include "megascope/monitor.h"

struct ms_monitor {
  struct ms_bpf_object *obj;
  char name[64];
  int n_progs;
  const struct ms_bpf_prog **progs;
  int *hook, *type;
};

struct cov_slot {
  _Atomic uint64_t eligible, executed, throttled, lost, failed;
  _Atomic uint64_t first_step, last_step;
  uint64_t step_key, step_execs;   /* the per-step budget, this worker's only */
  char pad[8];
};

struct ms_gen {
  struct attachment *att;
  struct ms_monitor *mon;
  struct ms_bpf_map **maps;
  int n_maps;                      /* one memfd each */
  uint64_t bytes;                  /* the maps' memfd bytes */
  struct ms_bpf_jit **jits;        /* [mon->n_progs]: native code, NULL where interpreted */
  int n_jitted;
  uint32_t generation;
  struct ms_attach_opts opts;      /* its budget (replace may set a new one); read by workers */
  struct cov_slot *cov;            /* [n_workers] */
  _Atomic uint64_t ring_bytes;     /* this epoch, against opts.ringbuf_bytes */
  uint64_t t_start;
  _Atomic uint64_t t_end;
  struct ms_gen *prev;             /* the generation it replaced */
};

struct attachment {
  int id;
  int attached;
  struct ms_attach_opts opts;
  struct ms_gen *cur;
};

struct hook_entry {
  struct ms_gen *gen;
  const struct ms_bpf_prog *prog;
  const struct ms_bpf_jit *jit;    /* NULL: run prog with the interpreter */
  int type;
};

struct hook_set {
  int n;
  struct hook_entry e[];
};

struct epoch_slot {
  _Atomic uint64_t v;
  char pad[56];
};

/* What runs the table's programs when its own hook sites do not: the
 * engine's CUDA backend, whose device fires the hooks. The table stays the
 * registry (ids, generations, maps, budgets, names); the runner takes each new
 * generation (its monitor and maps, which it borrows) before the table
 * publishes it, and a refusal fails the attach or replace (the caller keeps
 * the monitor); it lets go of an attachment before the table unpublishes it,
 * leaving the final contents in the table's maps. Both run under the table's
 * lock. */
struct ms_hook_runner {
  void *ctx;
  int (*take)(void *ctx, int id, struct ms_gen *g, int replace, struct ms_textbuf *log);
  void (*drop)(void *ctx, int id);
  /* a generation's coverage as the runner counts it: 0, or nonzero to fall
   * back on the table's counts */
  int (*coverage)(void *ctx, int id, uint32_t generation, struct ms_coverage *out);
  int (*sync)(void *ctx, int id);  /* the runner's map contents into the table's maps */
  void (*forget)(void *ctx, int id);  /* a detached attachment is freed (release, reap) */
};

struct ms_hook_table {
  _Atomic(struct hook_set *) set[MS_HOOK_COUNT];
  struct ms_hook_runner runner;    /* .take NULL: the hook sites run the programs */
  int n_workers;
  struct epoch_slot *epoch;        /* [n_workers] */
  pthread_mutex_t mu;
  struct attachment **atts;        /* live and retained, ascending id */
  int n_atts, cap_atts;
  int next_id;                     /* ids are never reused */
  uint64_t retention_ns;           /* closed generations stay readable this long */
  uint64_t n_freed;                /* generations freed by reap or release (statistics) */
  struct ms_attach_budget budget;  /* bounds beside the retention; zero fields: none */
  uint64_t n_freed_early, n_refused; /* budget statistics */
  _Atomic int hinted;              /* a sched_hint program was ever attached */
};

struct ms_hook_table *ms_hook_table_new(int n_workers);
void ms_hook_table_free(struct ms_hook_table *t);

int ms_hook_attach(struct ms_hook_table *t, struct ms_monitor *m, const struct ms_attach_opts *o,
                   struct ms_textbuf *log);
/* o: the new generation's budget; NULL keeps the current one. */
int ms_hook_replace(struct ms_hook_table *t, int id, struct ms_monitor *m, const struct ms_attach_opts *o,
                    struct ms_textbuf *log);
int ms_hook_detach(struct ms_hook_table *t, int id);
struct attachment *ms_hook_find(struct ms_hook_table *t, int id);  /* under t->mu */
/* Frees what has been closed for longer than t->retention_ns at engine clock
 * `now`: detached attachments (whole) and replaced generations. Returns how
 * many generations it freed. */
int ms_hook_reap(struct ms_hook_table *t, uint64_t now);
/* Frees detached attachment id now (its last read-out is done); -ENOENT when
 * unknown, -MS_E_STATE while it is still attached. */
int ms_hook_release(struct ms_hook_table *t, int id);
/* Attachments held (live and retained). */
int ms_hook_count(struct ms_hook_table *t);
/* The budget (under the mutex; frees closed generations over the new bounds). */
void ms_hook_set_budget(struct ms_hook_table *t, const struct ms_attach_budget *b);
void ms_hook_usage(struct ms_hook_table *t, struct ms_attach_usage *out);
#define MS_HOOK_RETENTION_DEFAULT_NS (60ull * 1000000000ull)
void ms_gen_coverage(const struct ms_gen *g, int n_workers, struct ms_coverage *out);
/* Generation g's coverage as every read-out reports it: the table's counts,
 * or the runner's for a generation it ran. */
void ms_hook_coverage(struct ms_hook_table *t, const struct ms_gen *g, struct ms_coverage *out);
/* Brings id's maps up to date from the runner (0 at once without one). */
int ms_hook_sync(struct ms_hook_table *t, int id);

/* Runs the programs attached to ctx->hook for ctx->worker, the sampled firings
 * chosen by what names the firing (core/admit.h). Returns the largest
 * sched_hint priority returned (0-7), or -1 when none ran. */
int ms_hook_fire(struct ms_hook_table *t, struct ms_hook_ctx *ctx);

/* Writes attachment id's coverage and decoded maps (names from plan p). */
struct ms_plan;
struct ms_json;
/* j: write a JSON value into j; NULL: text to f. */
int ms_hook_write(struct ms_hook_table *t, int id, const struct ms_plan *p, FILE *f, struct ms_json *j);

/* The helper table monitors are verified against and run with. */
const struct ms_bpf_helpers *ms_hook_helpers(void);

static inline int ms_hook_armed(struct ms_hook_table *t, int hook) {
  /* the one relaxed load and branch a hook site costs with nothing attached */
  return __builtin_expect(atomic_load_explicit(&t->set[hook], memory_order_relaxed) != NULL, 0);
}

#endif
