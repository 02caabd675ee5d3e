/* SPDX-License-Identifier: MIT */
/* Fault injection inside the runtime (private): what the step machine and the
 * backends call at their marked fault sites. Everything is decided from the engine's fault list,
 * which is read-only once the engine runs, so workers need no locks. Every
 * function is called only when e->faults is set: a healthy engine pays one
 * predictable branch per site. */
#ifndef MS_RUNTIME_FAULT_H
#define MS_RUNTIME_FAULT_H

#include <stdint.h>

#include "megascope/base.h"
#include "megascope/fault.h"

struct ms_engine;
struct ms_plan;
struct plan_rt;
struct worker;

#define MS_FAULT_MAX 8

/* Checks and copies o->faults (log names a bad one) and rebuilds the AOT queues
 * a queue_saturation fault overloads. Called by ms_engine_new once the plans are
 * built, before anything runs. */
int ms_fault_init(struct ms_engine *e, struct ms_textbuf *log);
void ms_fault_free(struct ms_engine *e);

/* Extra time task t takes on `worker` (-1: not known) beyond `base_ns` (its
 * healthy time): slow_class, slow_request (attention of the slow request's
 * row), comm_delay, slow_worker, bandwidth_steal, slow_layer. */
uint64_t ms_fault_extra_ns(const struct ms_engine *e, const struct plan_rt *rt, int t, int worker, uint64_t base_ns);
/* Time task t waits before its body: comm_delay across processes, where the
 * target rank's share leaves that late (its communication task holds the
 * send, asleep) and the other ranks' receives wait for it on the transport,
 * as a rank whose shares are late makes them wait; 0 for every other task. */
uint64_t ms_fault_before_ns(const struct ms_engine *e, const struct plan_rt *rt, int t);

/* late_admission, on the admitting thread: hold_request takes request r (just
 * popped for slot `slot`) when it is the target-th admitted, keeping the slot
 * for it (1: held); slot_reserved says whether a free slot is kept; take_held
 * returns the held request once its delay has passed (or nothing else runs),
 * else NULL; drop_held hands it back for cancelling at a stop. */
struct ms_request;
int ms_fault_hold_request(struct ms_engine *e, struct ms_request *r, int slot);
int ms_fault_slot_reserved(const struct ms_engine *e, int slot);
struct ms_request *ms_fault_take_held(struct ms_engine *e);
struct ms_request *ms_fault_drop_held(struct ms_engine *e);

/* delayed_release: called before a trigger of event ev counts. When this trigger
 * completes an event of the delayed class, the CPU backend spins the delay and
 * returns 0 (count it now); the simulator defers the trigger to now + delay and
 * returns 1 (do not count it now). */
int ms_fault_hold(struct worker *w, struct plan_rt *rt, int ev, uint64_t target, int producer);

/* starve_task: 1 when JIT task t, just popped, must go back to its queue because
 * its starvation has not run out (the simulator is asked to look again then). */
int ms_fault_starved(struct ms_engine *e, struct plan_rt *rt, int t);

/* routing_skew: rows of the step routed to `expert` under the simulator's shape
 * spread with the skew applied; and, after a router task ran its kernel (compute
 * mode, the CPU backend), rewrites that row's choice. */
int ms_fault_routed(const struct ms_engine *e, const struct plan_rt *rt, int expert);
void ms_fault_route_row(struct ms_engine *e, struct plan_rt *rt, int t);

/* The faults as tables, for a backend whose SMs apply them themselves (the
 * CUDA backend's device): the extra time of a task is its healthy time times
 * cls[class] + worker[w] (+ slot_coef for the attention of a row of request
 * slot `slot`), as ms_fault_extra_ns sums it; release_ns[event class] holds
 * the trigger that completes such an event, as ms_fault_hold does. Late
 * admission needs no table (the shared admission applies it). -MS_E_UNSUPP,
 * naming the fault in log, for a type that is not a table (routing_skew,
 * queue_saturation, starve_task, comm_delay, bandwidth_steal). */
struct ms_fault_table {
  float *cls;          /* [n_classes] */
  float *worker;       /* [n_workers] */
  int slot;            /* slow_request's slot, -1: none */
  float slot_coef;
  uint64_t *release_ns; /* [n_ev_classes] */
};
int ms_fault_table_new(const struct ms_engine *e, const struct ms_plan *p, int n_workers, struct ms_fault_table *out,
                       struct ms_textbuf *log);
void ms_fault_table_free(struct ms_fault_table *t);

/* Whether row r of the batch takes the skewed route (deterministic). */
int ms_fault_skewed_row(double share, int r);

#endif
