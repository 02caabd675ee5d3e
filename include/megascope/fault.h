/* SPDX-License-Identifier: MIT */
/* Scheduler fault injection: faults whose root cause is known, chosen at run
 * time in the same binary, for the counterexample benchmark (docs/benchmark.md).
 *
 * A fault is plain data handed to the engine in ms_engine_opts (faults,
 * n_faults) and applied by the shared runtime code, so the CPU backend and the
 * simulator inject it the same way: a slow task class, MoE routing skew, a
 * delayed dependency notification, a saturated worker queue, a delayed
 * communication generation, a ready task starved by the scheduler, one slow
 * request; and four the benchmark's diagnosers were not written for: a throttled
 * worker, a neighbour taking one device's memory bandwidth, a slow layer, a
 * request admitted late. Each has one culprit (what a diagnosis must name) and one magnitude
 * (what the benchmark tunes so that the whole run stays within a target of the
 * healthy run's time). The runtime's door: src/runtime/fault.c defines what
 * this header declares and applies the faults; the benchmark chooses them. */
#ifndef MEGASCOPE_FAULT_H
#define MEGASCOPE_FAULT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Fault types. Append-only: reports name them by these numbers and names. */
enum ms_fault_type {
  MS_FAULT_SLOW_CLASS = 0,        /* every task of one class runs `factor` times longer */
  MS_FAULT_ROUTING_SKEW = 1,      /* a `factor` share of the rows also routes to one expert */
  MS_FAULT_DELAYED_RELEASE = 2,   /* events of one class release their successors delay_ns late */
  MS_FAULT_QUEUE_SATURATION = 3,  /* one worker's AOT queue takes a `factor` share of the others' tasks */
  MS_FAULT_COMM_DELAY = 4,        /* one device's communication tasks complete delay_ns late */
  MS_FAULT_STARVE_TASK = 5,       /* one ready JIT task is passed over by the scheduler for delay_ns */
  MS_FAULT_SLOW_REQUEST = 6,      /* one request's attention reads a context `factor` times longer */
  /* Open-ended causes: no diagnoser was written for these (docs/benchmark.md). */
  MS_FAULT_SLOW_WORKER = 7,       /* every task on one worker runs `factor` times longer (a throttled SM) */
  MS_FAULT_BANDWIDTH_STEAL = 8,   /* one device's weight-streaming tasks run `factor` times longer (a neighbour
                                     takes its memory bandwidth) */
  MS_FAULT_SLOW_LAYER = 9,        /* every task of one layer runs `factor` times longer (its weights on a
                                     slower memory tier) */
  MS_FAULT_LATE_ADMISSION = 10,   /* the target-th request admitted (for a batch submitted together: the one of
                                     slot `target`) is held back delay_ns, its slot kept (the KV-page allocator
                                     stalls), unless nothing else runs */
  MS_FAULT_TYPE_COUNT
};

/* What a diagnosis names as the culprit. Append-only. */
enum ms_culprit_kind {
  MS_CULPRIT_NONE = 0,
  MS_CULPRIT_TASK_CLASS = 1,     /* schema class id */
  MS_CULPRIT_EVENT_CLASS = 2,    /* event class id */
  MS_CULPRIT_REQUEST = 3,        /* request slot (the scenario's requests take slots 0..batch-1) */
  MS_CULPRIT_WORKER = 4,         /* worker (SM) index */
  MS_CULPRIT_DEVICE = 5,         /* device index of a tensor-parallel plan */
  MS_CULPRIT_EXPERT = 6,         /* MoE expert index */
  MS_CULPRIT_LAYER = 7,          /* transformer block index */
  MS_CULPRIT_KIND_COUNT
};

struct ms_fault {
  enum ms_fault_type type;
  int target;          /* the culprit, of the kind ms_fault_culprit_kind(type) names */
  int tile;            /* starve_task: which task of the class (its tile-th, in plan order) */
  double factor;       /* slow_class, slow_request, slow_worker, bandwidth_steal, slow_layer: >= 1;
                          routing_skew, queue_saturation: 0..1 */
  uint64_t delay_ns;   /* delayed_release, comm_delay, starve_task, late_admission */
};

const char *ms_fault_type_name(enum ms_fault_type t);   /* "slow_class", ...; "?" otherwise */
int ms_fault_type_parse(const char *s, enum ms_fault_type *out);  /* 0 or -EINVAL */
enum ms_culprit_kind ms_fault_culprit_kind(enum ms_fault_type t);
const char *ms_culprit_kind_name(enum ms_culprit_kind k);  /* "task_class", ... */
/* 1 when the fault's magnitude is `factor`, 0 when it is delay_ns. */
int ms_fault_uses_factor(enum ms_fault_type t);
/* 1 for the types whose magnitude is a slowdown factor >= 1 (not a share). */
int ms_fault_factor_is_slowdown(enum ms_fault_type t);
/* 1 for the types a device applies from tables (the CUDA backend: the task
 * delays, slow_request, delayed_release; late_admission in the shared
 * admission), 0 for those it does not inject. */
int ms_fault_on_device(enum ms_fault_type t);
/* routing_skew under the simulator's shape spread (row r takes experts r ..
 * r+top_k-1 mod n_experts): how many of rows 0..rows-1 change their route when a
 * `share` of them trade their last choice for expert `hot`. 0: the fault does
 * nothing at this batch. */
int ms_fault_skew_moves(double share, int rows, int n_experts, int top_k, int hot);

#ifdef __cplusplus
}
#endif
#endif
