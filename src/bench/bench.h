/* SPDX-License-Identifier: MIT */
/* The counterexample benchmark (private to the core and the CLI): scenarios with
 * an injected scheduler fault whose root cause is known, five ways of observing
 * them under one telemetry byte budget each, an automatic diagnoser per way that
 * sees only its own evidence, and the scores. docs/benchmark.md says how it is
 * built and what it measured.
 *
 *   scenario.c  scenario files (JSON), the generator, drawing what a file left out
 *   run.c       engines for a scenario: healthy and faulty runs, magnitude tuning
 *   observe.c   the five observers and the evidence each ships (bytes counted)
 *   diagnose.c  the diagnosers: evidence -> {cause, culprit, confidence}
 *   score.c     per-method totals
 *   report.c    the JSON report, the text table, the plot's data and script
 *   interfere.c real interference: a spinning neighbour, a memory-bandwidth hog,
 *               random preemption, a cold page cache (megascope interfere)
 *   ranks.c     across ranks (mpirun): rank 0's measurements agreed on by every
 *               rank, the followers' evidence merged into rank 0's */
#ifndef MS_BENCH_BENCH_H
#define MS_BENCH_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "megascope/base.h"
#include "megascope/engine.h"
#include "megascope/fault.h"
#include "megascope/transport.h"

#define BENCH_MAX_FAULTS 4
#define BENCH_MAX_BUDGETS 12
#define BENCH_MAX_PARAMS 16
#define BENCH_MAX_DEVICES 8
#define BENCH_MAX_OS_WORKERS 64
#define BENCH_CPU_TILE_BYTES (64 * 1024)  /* the benchmark's CPU engines: weight bytes a GEMV task (bench_engine_new) */

enum bench_method {
  BM_KERNEL_TIMING = 0,   /* (a) time per step */
  BM_PC_SAMPLING = 1,     /* (b) periodic samples of each SM's kernel and stall state, per kernel */
  BM_TASK_TRACE = 2,      /* (c) the engine's task trace, truncated at the budget */
  BM_SAMPLED_EVENTS = 3,  /* (d) fixed-rate sampling of task events */
  BM_SEMANTIC = 4,        /* (e) semantic eBPF monitors, read out within the budget */
  BM_PROFILER = 5,        /* (f) the compiler-native profiler: a full task timeline of the steps a filter
                             chosen at restart keeps, as MPK ships it */
  BM_COUNT
};
const char *bench_method_name(int m);

/* What a file gave for a fault (the rest is drawn from the scenario's seed). */
enum { BF_TARGET = 1, BF_MAGNITUDE = 2, BF_TILE = 4 };

struct bench_fault {
  enum ms_fault_type type;
  char target[64];       /* the culprit by name: "blk.3.wo", "rope->attn", or a number */
  int target_id;         /* resolved against the plan */
  int tile;              /* starve_task: which task of the class */
  double magnitude;      /* factor, or a delay in ns (ms_fault_uses_factor) */
  double severity;       /* the share of the target slowdown the tuning aims at */
  unsigned given;        /* BF_*: what the file gave */
  double slowdown;       /* measured: faulty run time / healthy run time - 1 (with the others: alone) */
};

/* Real interference in a scenario (interfere.c produces it during the faulty
 * runs): a spinning neighbour or a random preemptor on one worker's CPU (the
 * workers are pinned), a long-context request among short ones, a cold page
 * cache under the model file. What the file leaves out is drawn or tuned. */
enum { BI_GIVEN_WHO = 1, BI_GIVEN_SHARE = 2, BI_GIVEN_TOKENS = 4, BI_GIVEN_RANK = 8 };
struct bench_interfere_spec {
  int kind;              /* BI_*; BI_NONE: none */
  int worker;            /* spin, preempt: the worker whose CPU it takes */
  int rank;              /* across ranks: the rank whose worker it is (runs in that rank's process) */
  int slot;              /* long_context: the long request's slot */
  int tokens;            /* long_context: its prompt (tuned when not given) */
  double share;          /* spin, preempt: the share of the CPU it takes (tuned when not given) */
  double severity;       /* the share of the target slowdown the tuning aims at */
  unsigned given;        /* BI_GIVEN_* */
  double slowdown;       /* measured (alone) */
};

struct bench_scenario {
  char name[96];
  char preset[32];       /* model preset */
  char gguf[256];        /* a GGUF model file instead (real weights; a bare name: in $MS_CACHE or
                            ~/.cache/megascope) */
  int pin;               /* CPU: workers pinned one to a CPU (ms_engine_opts.pin_workers) */
  char gpu[16];          /* simulator preset */
  enum ms_backend backend;
  int batch, steps, tp, workers;
  uint64_t seed;
  double jitter;         /* simulator: per-task time jitter (default 0.05) */
  int n_layers, n_experts, top_k, expert_ffn_dim;  /* model overrides; 0: the preset's */
  char params[BENCH_MAX_PARAMS][2][32];            /* simulator cost parameters by name */
  int n_params;
  double target;         /* faults are tuned to slow the run by at most this (0.05) */
  int n_faults;
  struct bench_fault faults[BENCH_MAX_FAULTS];
  struct bench_interfere_spec intf;
  char drawn[512];       /* what was drawn from the seed, in words */
  int split;             /* 0: training, 1: held out (which file it came from, not in the file) */
};

/* ---- scenario.c ---- */
int bench_scenarios_read(const char *path, struct bench_scenario **out, int *n, struct ms_textbuf *log);
int bench_scenarios_parse(const char *text, size_t len, struct bench_scenario **out, int *n,
                          struct ms_textbuf *log);
/* per_type scenarios of every fault type plus per_type / 2 healthy ones (at
 * least 1), configurations and seeds drawn from seed; targets and magnitudes
 * left out, to be drawn from each scenario's own seed. */
int bench_scenarios_generate(int per_type, uint64_t seed, enum ms_backend backend, struct bench_scenario **out,
                             int *n);
int bench_scenarios_write(FILE *f, const struct bench_scenario *s, int n);
/* The model of a scenario (shapes only on the simulator without compute; a
 * GGUF file's weights with "gguf"). */
struct ms_model *bench_model(const struct bench_scenario *s, struct ms_textbuf *log);
/* The path a scenario's "gguf" names. */
void bench_gguf_path(const struct bench_scenario *s, char *out, size_t n);
/* Resolves names and draws what the file left out (targets, tiles, severities)
 * from the scenario's seed against plan p; writes what was drawn into s->drawn. */
int bench_scenario_draw(struct bench_scenario *s, const struct ms_plan *p, int n_workers,
                        struct ms_textbuf *log);
/* megascope run --fault TYPE:TARGET:MAGNITUDE (a starved task: CLASS@TILE; a
 * delay with a unit: 20us), then resolved against a plan into an engine fault. */
int bench_fault_spec(const char *spec, struct bench_fault *f, struct ms_textbuf *log);
int bench_fault_resolve(struct bench_fault *f, const struct ms_plan *p, int n_workers, int batch, int tp,
                        struct ms_fault *out, struct ms_textbuf *log);
/* The name of culprit `id` of a kind, for reports. */
void bench_culprit_name(const struct ms_plan *p, enum ms_culprit_kind k, int id, char *buf, size_t n);

/* ---- run.c ---- */
struct bench_opts {
  int n_budgets;
  uint64_t budgets[BENCH_MAX_BUDGETS];  /* telemetry bytes per scenario and method */
  int headline;                         /* index of the budget the summary uses */
  const char *monitors;                 /* directory of the compiled diag_*.bpf.o */
  double exec_ns, record_ns, ring_ns;   /* the simulator's modelled observation costs */
  void (*progress)(void *user, const char *msg);
  void *progress_user;
  const char *record;                   /* a directory: keep every scenario's evidence there (record.c) */
  const char *replay;                   /* a directory: judge its records again instead of running */
  const char *replay_heldout;           /* and the held-out split's records (after replay_n of replay's) */
  int replay_n;
  /* Across ranks (mpirun -np N bench diagnose --tp N): this process is rank
   * tx->rank of tx->size, each running the same scenarios in lockstep; NULL:
   * one process. */
  const struct ms_transport *tx;
};

/* What a diagnosis names, and what a scenario injected: a cause and its scope. */
struct bench_culprit {
  int cause;                 /* enum ms_fault_type, -1: none, -2: unknown, BENCH_CAUSE_INTERFERE + BI_*: real */
  enum ms_culprit_kind kind;
  int id;
  char name[80];
};
#define BENCH_MAX_CULPRITS (BENCH_MAX_FAULTS + 1)  /* the faults and one interference */
#define BENCH_CAUSE_INTERFERE 64
#define BENCH_NEAR 4

/* Real clocks: the workers and devices a judgement held at half the threshold
 * or more, named or not, the strongest first (bench_answer_agree reads them). */
struct bench_near {
  int n;
  struct bench_culprit scope[BENCH_NEAR];
  double z[BENCH_NEAR];
};
/* The report's name of a cause ("none", "unknown", "slow_class", "spin", ...). */
const char *bench_cause_name(int cause);

struct bench_answer {
  int cause;                 /* enum ms_fault_type, -1: none (healthy), -2: unknown */
  enum ms_culprit_kind kind;
  int id;                    /* -1: not named */
  char name[80];
  int n_more;                /* further culprits named beside the first (several faults at once) */
  struct bench_culprit more[BENCH_MAX_CULPRITS - 1];
  double confidence;         /* 0..1: calibrated on the training split (bench_calibrate) */
  double raw_confidence;     /* what the diagnoser said */
  uint64_t bytes;            /* telemetry the method shipped */
  double coverage;           /* share of the run's task events its evidence covers, as it knows */
  double perturbation;       /* observed run time / unobserved faulty run time - 1 (sim: modelled) */
  char why[160];             /* the evidence the diagnoser went by */
  int cause_ok, culprit_ok;  /* the cause; the cause and the culprit */
  int scope_ok;              /* the culprit (kind and id) whatever the cause label; healthy: "none" */
  int multi;                 /* judged against several culprits: then wrong_named says whether */
  int wrong_named;           /* a culprit it named is none of them, or a cause it named is not its culprit's */
  int weak;                  /* a weak finding (bench_answer_agree): calibrated as a kind of its own */
};

struct bench_case {
  struct bench_scenario sc;
  int truth_cause;           /* -1: healthy (the first of truth[]) */
  enum ms_culprit_kind truth_kind;
  int truth_id;
  char truth_name[80];
  int n_truth;               /* every culprit injected: an answer must name each, and nothing else */
  int per_device;            /* workers a device (1: a device and its worker are one scope) */
  struct bench_culprit truth[BENCH_MAX_CULPRITS];
  double healthy_ns, faulty_ns;        /* unobserved, paired (same seed); the medians on the CPU */
  double slowdown;                     /* faulty / healthy - 1 (the median of the pairs' ratios on the CPU) */
  double healthy_ns_b, faulty_ns_b;    /* a second pair on the CPU backend (noise) */
  double spread;                       /* CPU: run-to-run spread of healthy pairs (median |h1 / h2 - 1|) */
  int pairs;                           /* real clocks: the paired runs the slowdown is the mean of */
  double slowdown_se;                  /* and its standard error */
  int tune_runs;
  int no_effect;                       /* the tuned fault had no measurable effect: not scored */
  char effect[120];                    /* what the effect was measured by, in words */
  struct bench_answer ans[BM_COUNT][BENCH_MAX_BUDGETS];
  char error[256];           /* non-empty: the scenario could not run */
  int split;                 /* 0: training, 1: held out (bench_run's caller sets it) */
  int ranks;                 /* the processes its engine ran in (mpirun; bench_opts.tx): >1, a device is a
                                rank and the plan holds only its share of a split output (tp_split) */
};

#define BENCH_CAL_BINS 5

/* Calibration learned on the training split: per method, budget, kind of
 * answer (0: "none", 1: a scope named, 2: a weak finding) and bin of the
 * diagnoser's raw confidence, how many answers there were and how many were
 * right. */
#define BENCH_CAL_KINDS 3
struct bench_calibration {
  int learned;
  int n[BM_COUNT][BENCH_MAX_BUDGETS][BENCH_CAL_KINDS][BENCH_CAL_BINS];
  int right[BM_COUNT][BENCH_MAX_BUDGETS][BENCH_CAL_KINDS][BENCH_CAL_BINS];
};

struct bench_report {
  struct bench_opts o;
  int n;
  struct bench_case *cases;
  struct bench_calibration cal;
  double attach_ms[BM_COUNT];  /* time until a new question is answered (see docs) */
  char attach_how[BM_COUNT][48];
};

int bench_run(const struct bench_opts *o, const struct bench_scenario *sc, int n, struct bench_report *out);
void bench_report_free(struct bench_report *r);

/* ---- observe.c: one observed run ---- */
struct bench_features;
struct bench_evidence {
  int method;
  uint64_t budget;
  uint64_t run_ns;             /* the run's time: virtual (sim) or wall (CPU) */
  uint64_t bytes;              /* shipped so far (the semantic read-out adds as it reads) */
  double coverage;
  uint64_t obs_execs, obs_records, obs_ring;  /* observation work, for the modelled cost */
  uint64_t attach_ns;          /* semantic: open, verify and attach on the live engine */
  /* (a) */
  int n_steps;
  double *step_ns;
  /* (b) samples[device][kernel or wait/idle][0]: counts */
  double pc[BENCH_MAX_DEVICES][20];
  /* the workers' threads as the OS saw them over the run (real clocks): run-queue
   * wait, run time, preemptions; os_n workers (0: not known) */
  double os[BENCH_MAX_OS_WORKERS][3];
  int os_n;
  int pc_devices;
  double pc_total;
  /* (c) (d) (e) */
  struct bench_features *feat;
};

struct bench_engine_cfg {
  const struct ms_model *m;
  const struct bench_scenario *sc;
  const struct ms_fault *faults;
  int n_faults;
  int interfere;         /* the scenario's interference runs during this run */
  uint64_t seed;
  const struct ms_transport *tx;  /* across ranks (bench_opts.tx); NULL: one process */
};
/* Builds the engine of a scenario, paused before its first step. */
struct ms_engine *bench_engine_new(const struct bench_engine_cfg *c, struct ms_textbuf *log);
/* Runs the scenario's requests to the end on a paused engine, with its
 * interference when c->interfere; the run's time (0: it stalled or the
 * interference could not start). With ev, what the OS says of the workers'
 * threads over the run goes into ev->os. */
uint64_t bench_engine_drive(struct ms_engine *e, const struct bench_engine_cfg *c);
uint64_t bench_engine_drive_os(struct ms_engine *e, const struct bench_engine_cfg *c, struct bench_evidence *ev);
/* One run observed by method m within budget bytes; 0 or a negative errno. */
int bench_observe(const struct bench_opts *o, const struct bench_engine_cfg *c, int m, uint64_t budget,
                  struct bench_evidence *ev, struct ms_textbuf *log);
void bench_evidence_free(struct bench_evidence *ev);

/* ---- diagnose.c ---- */
/* The diagnosis of method ev->method from its evidence, its healthy reference
 * (the same method on a healthy run of the same configuration) and the plan's
 * schema; the semantic method reads its monitor's rows within the budget here. */
void bench_diagnose(const struct bench_evidence *ref, struct bench_evidence *ev, const struct ms_plan *p,
                    const struct bench_scenario *sc, struct bench_answer *out);
/* The same, sized against what the hypotheses say between healthy runs:
 * alt[] are n_alt more healthy runs of the configuration and null_ref the one
 * they are compared with (real clocks; NULL: ref); each hypothesis family's z
 * is scaled down so that the largest it reached between alt[k] and null_ref
 * stays under half the threshold. n_alt 0: bench_diagnose. */
void bench_diagnose_null(const struct bench_evidence *ref, const struct bench_evidence *null_ref,
                         const struct bench_evidence *const *alt, int n_alt, struct bench_evidence *ev,
                         const struct ms_plan *p, const struct bench_scenario *sc, struct bench_answer *out);
/* The same, and (near non-NULL) the workers and devices it held near the threshold. */
void bench_diagnose_near(const struct bench_evidence *ref, const struct bench_evidence *null_ref,
                         const struct bench_evidence *const *alt, int n_alt, struct bench_evidence *ev,
                         const struct ms_plan *p, const struct bench_scenario *sc, struct bench_answer *out,
                         struct bench_near *near);
/* a becomes what a and b (the same evidence judged against two healthy
 * references) agree on: the culprits both name (per_device 1: a device and its
 * one worker are one scope), at the lower confidence; a worker or device one
 * names and the other, saying "none", held at half the threshold or more
 * (na, nb: bench_diagnose_near; NULL: none held); where they name nothing in
 * common, the worker or device both held there (or named), as a weak finding
 * (confidence under 0.5 before calibration), else "none": as sure as the less
 * sure "none" where both said it, else as sure as the surer of them is wrong. */
void bench_answer_agree(struct bench_answer *a, const struct bench_answer *b, const struct bench_near *na,
                        const struct bench_near *nb, const struct ms_plan *p, int per_device);

/* ---- features (observe.c): the tables the trace, sampling and semantic methods fill ---- */
struct bench_stat {
  double n, sum, sumsq, max;
  double qsum, qmax;          /* queue (ready -> begin) for task rows */
  double ratio, ratio_n;      /* worker rows: the sum of their tasks' times against their classes' means,
                                 over ratio_n tasks (communication aside: its time is the link's) */
  double work;                /* expert rows: the rows their tasks processed (ABI v2; 0: not known) */
  double last;                /* request rows: when their last attention task ended (0: not known) */
  uint8_t have;               /* the row was shipped (the semantic read-out charges on read) */
};

/* FS_WTOP: the two workers queueing most (n: the worker, sum: its queue time);
 * FS_BTOP: the two whose tasks ran longest against their classes' means (n:
 * the worker, sum: the excess, in tasks);
 * FS_DEVBUSY: per device, its workers' task time;
 * FS_OSWORKER: per worker, what the operating system says of its thread over
 * the run (ms_engine_worker_os; real clocks): sum the time it was runnable but
 * waited for its CPU, ratio the time it ran, max how often it was preempted. */
enum bench_section {
  FS_CLASS = 0, FS_OP, FS_EVCLASS, FS_WORKER, FS_REQUEST, FS_EXPERT, FS_DEVICE, FS_WTOP, FS_BTOP, FS_DEVBUSY,
  FS_OSWORKER, FS_WOP, FS_COUNT
};
/* FS_WOP: per worker and kernel (row w x MS_K_COUNT + k), its tasks and their time */

struct bench_features {
  int n[FS_COUNT];
  struct bench_stat *row[FS_COUNT];
  int lazy;                   /* semantic: rows become `have` only when read (bench_feat_read) */
  int per_device;             /* workers per device (the worker -> device map of ms_rt_device) */
  uint64_t budget, *bytes;    /* the read-out's budget and its running count */
  double coverage;
};
struct bench_features *bench_feat_new(const struct ms_plan *p, int n_workers, int n_slots, int n_devices);
void bench_feat_free(struct bench_features *f);
/* Reads row i of a section (charging its bytes once); 1 when it is available. */
int bench_feat_read(struct bench_features *f, int sec, int i);
extern const unsigned bench_row_bytes[FS_COUNT];

/* ---- record.c: a run's evidence kept, and judged again ---- */
/* DIR/case-NNNN.rec: the case (after its effect was measured), then one group
 * per method and budget: the fresh healthy runs (real clocks: nf of them, the
 * one before the faulty run and the one after), the references and the faulty
 * run's evidence, as the diagnosers were given them. */
FILE *bench_record_begin(const char *dir, int idx, const struct bench_case *c, int workers,
                         const struct bench_opts *o);
int bench_record_group(FILE *f, int meth, int b, const struct bench_evidence *fresh, int nf,
                       const struct bench_evidence *const *ref, int nref, const struct bench_evidence *ev);
int bench_record_end(FILE *f);
/* How many cases DIR's records number (the highest index + 1), or a negative errno. */
int bench_replay_count(const char *dir);
/* The budgets DIR's records were taken at, into o. */
int bench_replay_budgets(const char *dir, struct bench_opts *o);
/* Opens case idx and reads its case; bmap[b]: where recorded budget b
 * stands in o's, -1 when o does not ask for it (every budget o asks for must
 * have been recorded). NULL with why filled in. */
FILE *bench_replay_begin(const char *dir, int idx, const struct bench_opts *o, struct bench_case *c, int *workers,
                         int *bmap, char *why, size_t n);
/* The next group: 0, 1 at the record's end, or a negative errno (the caller
 * frees what was read either way). */
int bench_replay_group(FILE *f, int *meth, int *b, struct bench_evidence *fresh, int *nf,
                       struct bench_evidence *ref, int max_ref, int *nref, struct bench_evidence *ev);

/* ---- ranks.c: across ranks ---- */
/* Every rank runs the same scenarios; whatever depends on a clock or on a
 * measurement is rank 0's, agreed on so that the ranks never diverge: n bytes
 * at v become rank 0's on every rank. 0 or a negative errno (then every rank
 * must stop). tx NULL: nothing to do. */
int bench_ranks_agree(const struct ms_transport *tx, void *v, size_t n);
/* The first failure of any rank (rc on every rank: the same verdict). */
int bench_ranks_agree_rc(const struct ms_transport *tx, int rc);
/* One observed run's evidence, every rank's merged into rank 0's ev (the
 * followers send theirs; their ev is left as it was): the tables the
 * diagnosers read add up across ranks (classes, operators, events, requests,
 * the devices' rows: each rank's workers are its device), each rank's workers
 * follow the ranks before it (worker w of rank r is r x workers + w), the PC
 * samples add (each rank samples its own device), the bytes shipped add. The
 * run's time and the step times stay rank 0's (every rank ran the same steps in
 * lockstep). 0 or a negative errno. */
int bench_ranks_merge(const struct ms_transport *tx, struct bench_evidence *ev);
/* The features' top workers (FS_WTOP, FS_BTOP) again, from FS_WORKER. */
void bench_feat_tops(struct bench_features *f);

/* ---- score.c ---- */
/* What the report counts a scenario as: its fault type, -1 healthy, an
 * interference (BENCH_TYPE_INTERFERE + BI_*), several culprits (BENCH_TYPE_MULTI). */
#define BENCH_TYPE_INTERFERE 64
#define BENCH_TYPE_MULTI 96
int bench_case_type(const struct bench_case *c);
const char *bench_type_name(int type);
/* Every type the report lists, in order; their count. */
int bench_types(int *out, int max);
struct bench_totals {
  int n;
  int no_effect;             /* scenarios left out: their fault had no measurable effect */
  double cause_accuracy, culprit_accuracy, scope_accuracy, false_confidence, telemetry_bytes, perturbation;
};
/* split: 0 training, 1 held out, -1 both. */
void bench_score(const struct bench_report *r, int split, int method, int budget_idx, struct bench_totals *out);
/* The same over the cases of one fault type (-1: healthy, -2: all). */
void bench_score_type(const struct bench_report *r, int split, int method, int budget_idx, int type,
                      struct bench_totals *out);
/* Reliability: the answers at a budget by stated confidence in n_bins equal
 * bins, with how many there were and how many were right (the scope and, when
 * named, the cause). */
void bench_reliability(const struct bench_report *r, int split, int method, int budget_idx, int n_bins, int *n,
                       int *right);
/* 1 when an answer is right in everything it asserts. */
int bench_answer_right(const struct bench_answer *a);
/* Learns the calibration from the training split's scored answers and states
 * every answer's confidence as the training accuracy of its bin, shrunk toward
 * 0 for small bins (right / (n + 2): an empty bin says 0). The held-out split is calibrated by what the
 * training split learned, never by itself. Without training cases, nothing
 * changes. */
void bench_calibrate(struct bench_report *r);

/* ---- interfere.c: real interference ---- */
enum bench_interference {
  BI_NONE = 0,
  BI_SPIN = 1,          /* a thread spinning on one CPU: a noisy neighbour */
  BI_MEMBW = 2,         /* a thread streaming through a buffer far larger than the caches, on one CPU */
  BI_PREEMPT = 3,       /* a thread on one CPU that wakes at random and spins a burst of a few ms,
                           at real-time priority where permitted */
  BI_COLD = 4,          /* the model file's pages dropped from the page cache before it is mapped */
  BI_LONG_CONTEXT = 5,  /* one request with a long prompt among short ones (a request, not a thread) */
  BI_COUNT
};
#define BENCH_INTERFERE_MAX_S 3600.0  /* no interferer runs longer */
const char *bench_interference_name(int k);    /* "spin", ...; "?" */
int bench_interference_parse(const char *s, int *k);  /* 0 or -EINVAL */
/* The CPU ms_engine_opts.pin_workers gives worker w: the (w mod n)-th of the n
 * CPUs this process may run on; -1 when the OS does not say. */
int bench_worker_cpu(int w);

struct bench_interfere_opts {
  int kind;              /* BI_SPIN, BI_MEMBW, BI_PREEMPT */
  int cpu;               /* the CPU its thread runs on; -1: where the OS puts it */
  double seconds;        /* it stops by itself after this long (0: BENCH_INTERFERE_MAX_S) */
  size_t buffer_bytes;   /* membw: the buffer streamed through (default 256 MiB) */
  double burst_us_lo, burst_us_hi;  /* preempt: each burst spins this long, uniformly (default 2500..5000) */
  double gap_us;         /* preempt: the mean gap between bursts, exponential (default 20000) */
  double duty;           /* spin: the share of every 10 ms it spins (0 or 1: all of it) */
  uint64_t seed;         /* preempt: the gaps and bursts */
};
/* Fills what o leaves at 0 with the defaults above. */
void bench_interfere_defaults(struct bench_interfere_opts *o);

struct bench_interfere_stats {
  double wall_s, cpu_s;  /* how long its thread ran, and the CPU time it used */
  double bytes;          /* membw: bytes read plus bytes written */
  uint64_t bursts;       /* preempt: bursts spun */
  char policy[64];       /* preempt: the scheduling policy it got */
  size_t file_pages, resident_before, resident_after;  /* cold: the file's pages in the page cache */
};

struct bench_interferer;
/* Starts one interferer's thread and returns once it runs (pinned, its buffer
 * touched, its priority set); NULL + errno with the reason in log. */
struct bench_interferer *bench_interfere_start(const struct bench_interfere_opts *o, struct ms_textbuf *log);
/* Stops and joins it, frees what it holds, and says what it did (st may be
 * NULL); NULL does nothing. */
void bench_interfere_stop(struct bench_interferer *x, struct bench_interfere_stats *st);
/* Drops path's pages from the page cache (posix_fadvise DONTNEED: pages another
 * process maps stay) and counts the resident pages before and after. 0 or a
 * negative errno. */
int bench_evict_file(const char *path, struct bench_interfere_stats *st, struct ms_textbuf *log);

/* ---- report.c ---- */
int bench_report_json(const struct bench_report *r, FILE *f);
int bench_report_text(const struct bench_report *r, FILE *f);
/* The plot: accuracy against telemetry bytes, one line per method. Writes the
 * data and a gnuplot script that draws png_path. */
int bench_report_plot(const struct bench_report *r, const char *dat_path, const char *gp_path,
                      const char *png_path);

#endif
