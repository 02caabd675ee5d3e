/* SPDX-License-Identifier: MIT */
/* The judgement behind `megascope explain`: given what a window of a live
 * engine's tasks took (per class, bucket, worker and time slice), what its
 * attention took per request, and what the OS says of each worker thread,
 * which parts stand out against their own peers by more than the scatter the
 * same window shows among healthy peers.
 *
 * Every judgement is relative, so no figure depends on the model or machine:
 *   class    against the same op in the other layers (of the same weight
 *            bytes per task: a Q4_K_M file mixes block types across layers);
 *   layer    the median of its classes' effects;
 *   worker   its tasks against the same classes' tasks on the other workers;
 *   device   the same over a device's workers (tensor parallelism);
 *   request  its attention against the others', given their contexts;
 *   cpu      the time a worker was runnable but another thread had its CPU;
 *   shares   (tensor parallel) the communication tasks that carry a device's
 *            share against those that carry the other devices', on every
 *            device: a device whose shares arrive late.
 * An effect is a log ratio; its noise is the robust scatter (1.4826 x the
 * median absolute deviation) of the same effect among the peers of the same
 * window, and of each part's own effect across the window's time slices. A part
 * is a culprit when its effect is at least MS_EXPLAIN_Z such scatters above
 * its peers. Nothing here reads a clock or a socket: the CLI gathers, this
 * decides, tests/test_explain.c checks it on tables with known answers. */
#ifndef MEGASCOPE_EXPLAIN_H
#define MEGASCOPE_EXPLAIN_H

#include <stddef.h>
#include <stdint.h>

/* How many scatters above the peers a culprit stands, and by how much at
 * least: healthy peers of real models differ by a few per cent in ways that
 * hold for the whole window (the first layer's classes, say), which no
 * scatter among the rest predicts; a smaller difference is not named. */
#define MS_EXPLAIN_Z 6.0
#define MS_EXPLAIN_MIN_RATIO 1.25
/* And what a class or layer must cost a step to be named: a thousandth of it.
 * Below that a part cannot be why the steps are slow, and a light task's fixed
 * cost (the step's first RoPE on a CPU runs its code cold: on SmolLM2 layer 0's
 * RoPE takes 1.12-1.27x its peers in healthy windows, 0.01-0.03% of a step)
 * stands far above its peers' scatter. Shares of a step, so the same for every
 * model: a 2x class of 0.1% of the step is named. */
#define MS_EXPLAIN_MIN_STEP_SHARE 0.001

enum ms_explain_kind {
  MS_EXPLAIN_CLASS = 0,
  MS_EXPLAIN_LAYER = 1,
  MS_EXPLAIN_WORKER = 2,
  MS_EXPLAIN_DEVICE = 3,
  MS_EXPLAIN_REQUEST = 4,  /* id: the request's index in the input */
  MS_EXPLAIN_SLOT = 5,     /* several requests of one batch slot, all slow */
  MS_EXPLAIN_CPU = 6,      /* id: a worker, or -1: every worker */
  MS_EXPLAIN_KIND_COUNT
};
const char *ms_explain_kind_name(enum ms_explain_kind k);

/* A task class of the engine's schema. */
struct ms_explain_class {
  const char *name;         /* blk.7.wo */
  const char *op;           /* wo */
  int layer;                /* -1: none (embed, lm_head, sample: not judged) */
  double work_bytes;        /* mean bytes a task reads (ABI v2 work_bytes; 0: unknown) */
  int aot;                  /* 1: the plan places its tasks on the workers' queues ahead of time (round
                               robin, so each worker an even share); 0: run by whichever worker is free */
};

/* Tasks of one class in one bucket on one worker in one slice of the window.
 * A slice is any partition of the window's steps into n_slices parts (the CLI
 * takes step % n_slices, so a task preempted once lands in one slice of one
 * class and the weighted median over slices passes it over): the more slices,
 * the fewer tasks each holds and the less often a slice is hit. */
struct ms_explain_cell {
  int cls, bucket, worker, slice;
  double n, sum_ns;
  /* The fastest of those tasks (0: not known), as a time or as a time per
   * byte read (the CLI's: a class's last tile is smaller), the same for every
   * peer. Classes are held against their peers by it: a task preempted by
   * another thread takes milliseconds more and moves a mean, never a minimum,
   * while a class slow in its own work is slow in every task. Workers are
   * held by the mean, which sees the theft. */
  double min_ns;
};

/* One request's attention tasks in the window (with req_cells, the sums of
 * its cells). */
struct ms_explain_request {
  uint32_t slot, gen;
  double n, sum_ns, ctx_sum; /* tasks, their time, the sum of their contexts */
  double ctx_max;           /* the longest context it reached (0: ctx_sum / n) */
};

/* One request's attention tasks in one step (slice: the step, or any id the
 * requests of one batch share). Each is held against the window's line for
 * its context, less its step's pace — what the step did to every request in
 * it — so a request is held against the others of its batch. A prompt's chunk
 * puts rows of many contexts in one step: ctx is then the least of them and
 * min_ns its fastest task, the same row (attention grows with the context). */
struct ms_explain_req_cell {
  int request;              /* index in the input's requests */
  int slice;
  double ctx;               /* the tasks' context (positions): the least of them */
  double n, sum_ns;
  double min_ns;            /* the fastest of them (0: not known) */
  int worker;               /* the worker that ran them, when the input's req_cells_by_worker */
};

/* What the OS said of a worker thread over one time slice of the window
 * (differences of ms_engine_worker_os); known = 0: nothing. */
struct ms_explain_os {
  int known, pinned_cpu, last_cpu;
  double wall_ns, run_ns, runqueue_ns, preempted;
};

/* Communication tasks (tensor parallel) that carry device `device`'s share of
 * class cls's gather, in one bucket and slice, over every worker of every
 * device: the sender's task and each receiver's. Each share is sent once and
 * received on every other device, so the shares' tasks are alike unless one
 * device's arrive late (a receiver's task lasts until the share is there). */
struct ms_explain_share_cell {
  int device, cls, bucket, slice;
  double n, sum_ns;
  /* The fastest of those tasks (0: not known), which the shares are held
   * against each other by: a share that leaves late is late every time, while
   * a rank held up now and then (rank 0 serving HTTP beside its worker) makes
   * some receives long and not the fastest. */
  double min_ns;
};

struct ms_explain_input {
  const struct ms_explain_class *classes;
  int n_classes;
  const struct ms_explain_cell *cells;
  size_t n_cells;
  const struct ms_explain_request *requests;
  int n_requests;
  const struct ms_explain_req_cell *req_cells;  /* NULL: each request's mean */
  size_t n_req_cells;
  /* 1: a cell holds one worker's tasks of its (request, slice), so a request
   * is judged again on the workers not named (a worker whose CPU another
   * thread took stalls the attention tasks it ran, whichever request's they
   * were); 0: a cell holds every worker's */
  int req_cells_by_worker;
  const struct ms_explain_os *os;  /* [n_os_slices][n_workers], slice-major, or NULL */
  int n_os_slices;
  const int *device;               /* [n_workers]: each worker's device; NULL: all 0 */
  int n_workers;
  int n_slices;
  double window_ns, steps;
  /* An engine across processes (serve --tp N under mpirun): each rank's
   * workers, numbered rank after rank (worker n is rank n / rank_workers's
   * worker n % rank_workers), and a device is a rank; the culprits are named
   * so. 0: one process. */
  int rank_workers;
  const struct ms_explain_share_cell *share_cells;  /* NULL: shares not judged */
  size_t n_share_cells;
  /* A reference taken while healthy (explain --baseline): each class's log
   * ratio to its peers then and the scatter it was held against; NAN (or
   * NULL) where none. A class is then judged by how far it moved from where
   * it stood: a first layer's standing cold cost is not a fault. */
  const double *class_base, *class_base_noise;  /* [n_classes] */
};

/* One part's judgement (every judged part has one, culprit or not). */
struct ms_explain_effect {
  double effect;            /* log ratio against the peers (exp: the ratio) */
  double noise;             /* the scatter it is held against */
  double z;                 /* effect / noise, NAN when not judged */
  double n;                 /* tasks it covers */
  double excess_ns;         /* time per step above what the peers' rate gives */
  int peers;
};

struct ms_explain_culprit {
  enum ms_explain_kind kind;
  int id;                   /* class, layer, worker, device, request index, slot; cpu: worker or -1 */
  char name[96];
  char cause[48];           /* "slow tasks", "shared CPU", "long context", ... */
  double ratio, z, confidence, excess_ns_per_step;
  char why[256];
};

#define MS_EXPLAIN_MAX_CULPRITS 16

struct ms_explain_result {
  int n_culprits;
  struct ms_explain_culprit culprits[MS_EXPLAIN_MAX_CULPRITS];  /* strongest first */
  double none_confidence;   /* no culprit: how sure (the noise against a 1.5x effect) */
  double class_noise;       /* the scatter of class effects among peers */
  double runqueue_share;    /* every worker's run-queue wait over their wall time */
  /* Every part's effect, for reports: [n_classes], [n_layers], [n_workers],
   * [n_devices], [n_requests]; share: [n_devices], each device's shares
   * against the others' (tensor parallel). */
  struct ms_explain_effect *cls, *layer, *worker, *device, *request, *share;
  /* [n_workers]: each worker's share of the AOT tasks against an even share
   * (a saturated queue: a worker holding more of the plan's tasks than its
   * part, each no slower); NAN z where not judged (one worker, several
   * devices, no AOT class) */
  struct ms_explain_effect *queue;
  int n_layers, n_devices;
  /* [n_workers]: 1 for a worker named a culprit (its own pace, or its CPU
   * shared), whose cells the class and layer judgement then left out: a worker
   * switched in and out by another thread runs its first tasks after each
   * switch cold, which reads as a slow class it does not have. */
  unsigned char *set_aside;
  int n_set_aside;
};

/* Judges; 0 or -ENOMEM. The result's arrays are freed by ms_explain_result_free. */
int ms_explain_judge(const struct ms_explain_input *in, struct ms_explain_result *out);
void ms_explain_result_free(struct ms_explain_result *r);

/* Confidence that a culprit of this z is right, and that "none" is, from the
 * reliability of the training split (docs/query.md, "How sure explain is"). */
double ms_explain_confidence(enum ms_explain_kind k, double z);

#endif
