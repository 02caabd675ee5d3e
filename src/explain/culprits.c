/* SPDX-License-Identifier: MIT */
/* Which parts explain names: every part whose effect stands MS_EXPLAIN_Z
 * scatters above its peers (and MS_EXPLAIN_MIN_RATIO at least), a broader part first and the narrower ones it
 * explains left out (a slow layer's classes, a slow device's workers), and
 * the OS's view joined to the worker it concerns. Ordered by the time a step
 * loses to each. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "explain/state.h"
#include "explain/stats.h"

static struct ms_explain_culprit *add(struct ms_explain_result *r, enum ms_explain_kind k, int id, double z,
                                      double ratio, double excess, const char *cause) {
  if (r->n_culprits == MS_EXPLAIN_MAX_CULPRITS) return NULL;
  struct ms_explain_culprit *c = &r->culprits[r->n_culprits++];
  memset(c, 0, sizeof *c);
  c->kind = k, c->id = id, c->z = z, c->ratio = ratio, c->excess_ns_per_step = excess;
  c->confidence = ms_explain_confidence(k, z);
  snprintf(c->cause, sizeof c->cause, "%s", cause);
  return c;
}

static void why(struct ms_explain_culprit *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void why(struct ms_explain_culprit *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why, sizeof c->why, fmt, ap);
  va_end(ap);
}

/* An effect above the noise and above the least ratio named. */
static int stands(double effect, double z) { return !isnan(z) && z >= MS_EXPLAIN_Z && effect >= log(MS_EXPLAIN_MIN_RATIO); }

static double step_ns(const struct ex *x) { return x->in->steps > 0 ? x->in->window_ns / x->in->steps : 0; }

/* A class or layer costs the step enough to be why it is slow. */
static int material(const struct ex *x, const struct ms_explain_effect *e) {
  return e->excess_ns >= MS_EXPLAIN_MIN_STEP_SHARE * step_ns(x);
}

/* ---- the OS's view ---- */

/* Every worker waiting for a CPU (the machine is oversubscribed), or one
 * worker more than the others (another thread shares its CPU): 1 for the
 * workers that were named, so the timing judgement can join them. */
static void cpu_culprits(struct ex *x, const struct ex_cpu *cpu, int *shared, double *shared_z) {
  int known = 0, all = 1;
  double least = INFINITY;
  for (int w = 0; w < x->W && w < EX_MAX_CPU; w++) {
    if (!cpu->known[w]) continue;
    known++;
    /* each beyond the noise and the least ratio: the CPU left to it is 1.25x
     * below a whole one, a fifth of the window gone at least */
    all &= cpu->share[w] / cpu->noise[w] >= MS_EXPLAIN_Z && 1 >= MS_EXPLAIN_MIN_RATIO * (1 - cpu->share[w]);
    least = cpu->share[w] < least ? cpu->share[w] : least;
  }
  if (!known) return;
  if (all) {
    struct ms_explain_culprit *c = add(x->out, MS_EXPLAIN_CPU, -1, least / 0.01, 1 / (1 - cpu->all),
                                       cpu->all * step_ns(x), "CPUs shared with other threads");
    if (c) {
      snprintf(c->name, sizeof c->name, "every worker's CPU");
      why(c, "every worker waited for a CPU: %.0f%% of the window in all, %.0f%% at least (the OS's run-queue "
             "wait); the machine runs more threads than it has CPUs", 100 * cpu->all, 100 * least);
    }
  }
  /* one worker waiting for its CPU beyond the others (also when all of them
   * wait): by 6 scatters and 1.25x theirs, and the CPU left to it 1.25x below
   * what is left to them (as for every worker's: a thread that takes a few per
   * cent of a CPU is there, and not why a step is slow). Not by the time it ran: a worker
   * held up stalls the others on its events, so they all run less together */
  double *others = malloc((size_t)x->W * sizeof *others);
  for (int w = 0; others && known > 1 && w < x->W && w < EX_MAX_CPU; w++) {
    if (!cpu->known[w]) continue;
    int k = 0;
    for (int o = 0; o < x->W && o < EX_MAX_CPU; o++)
      if (o != w && cpu->known[o]) others[k++] = cpu->share[o];
    double base = k ? ex_median(others, (size_t)k) : 0, z = (cpu->share[w] - base) / cpu->noise[w];
    shared[w] = z >= MS_EXPLAIN_Z && cpu->share[w] >= MS_EXPLAIN_MIN_RATIO * base &&
                1 - base >= MS_EXPLAIN_MIN_RATIO * (1 - cpu->share[w]);
    shared_z[w] = z;
  }
  free(others);
}

/* ---- workers and devices ---- */

/* "worker 1 (CPU 1)"; across ranks "rank 1 worker 0 (CPU 1)", as an operator
 * finds it (each rank numbers its own workers from 0). */
static void name_worker(char *buf, size_t n, const struct ex *x, int w, const struct ex_cpu *cpu) {
  int rw = x->in->rank_workers;
  char rank[24] = "";
  if (rw > 0) snprintf(rank, sizeof rank, "rank %d ", w / rw);
  if (w < EX_MAX_CPU && cpu->known[w] && cpu->pinned[w] >= 0)
    snprintf(buf, n, "%sworker %d (CPU %d)", rank, rw > 0 ? w % rw : w, cpu->pinned[w]);
  else
    snprintf(buf, n, "%sworker %d", rank, rw > 0 ? w % rw : w);
}

static void worker_culprits(struct ex *x, const struct ex_cpu *cpu, const int *shared, const double *shared_z,
                            const int *dev_named, unsigned char *named) {
  for (int w = 0; w < x->W; w++) {
    const struct ms_explain_effect *e = &x->out->worker[w];
    int slow = stands(e->effect, e->z), cpu_shared = w < EX_MAX_CPU && shared[w];
    if ((!slow && !cpu_shared) || (slow && dev_named[ex_device(x, w)])) continue;
    double share = w < EX_MAX_CPU ? cpu->share[w] : 0, others = 0;
    int k = 0;
    for (int o = 0; o < x->W && o < EX_MAX_CPU; o++)  /* the others' mean wait, for the words */
      if (o != w && cpu->known[o]) others += cpu->share[o], k++;
    others = k ? others / k : share;
    /* slow, and waiting for its CPU beyond the others by the same 6 scatters
     * with the CPU left to it short of theirs by at least half its excess:
     * the other thread is why (below the 1.25x asked of a CPU named alone; on
     * a busy machine a worker 1.27x slow waited 26% against 13%) */
    double left = (1 - others) / (1 - share > 0.01 ? 1 - share : 0.01);
    cpu_shared |= slow && w < EX_MAX_CPU && shared_z[w] >= MS_EXPLAIN_Z && log(left) >= 0.5 * e->effect;
    const char *cause = cpu_shared ? "CPU shared with another thread" : "slow tasks";
    double z = slow ? e->z : shared_z[w];
    struct ms_explain_culprit *c =
        add(x->out, cpu_shared && !slow ? MS_EXPLAIN_CPU : MS_EXPLAIN_WORKER, w, z,
            slow ? exp(e->effect) : left,
            slow ? e->excess_ns : (share - others) * step_ns(x), cause);
    if (!c) return;
    named[w] = 1;
    name_worker(c->name, sizeof c->name, x, w, cpu);
    if (slow && cpu_shared)
      why(c, "its tasks took %.2fx what the same classes took on the other workers (z %.1f), and it waited %.0f%% "
             "of the window for its CPU against the others' %.0f%% (%.0f preemptions): another thread takes its CPU",
          exp(e->effect), e->z, 100 * share, 100 * others, cpu->preempted[w]);
    else if (slow)
      why(c, "its tasks took %.2fx what the same classes took on the other workers (z %.1f over the window's "
             "slices); it waited %.0f%% of the window for its CPU (the others %.0f%%), so the time is its own",
          exp(e->effect), e->z, 100 * share, 100 * others);
    else
      why(c, "it waited %.0f%% of the window for its CPU against the other workers' %.0f%% (z %.1f; %.0f "
             "preemptions): another thread takes its CPU; its tasks' times did not stand out (%.2fx)", 100 * share,
          100 * others, shared_z[w], cpu->preempted[w], isnan(e->effect) ? 1 : exp(e->effect));
  }
}

/* A worker holding more of the plan's AOT tasks than an even share (a
 * saturated queue): round robin leaves a worker at most a task a step over
 * its part, so 5% over it is a queue the plan did not make (healthy live
 * engines, 2 workers: tiny 1.003x, SmolLM2 1.001x; a slow worker or a
 * neighbour on its CPU leaves its count where the plan put it, 1.001x; SmolLM2
 * with queue_saturation:1:0.1 read 1.07x at z 13). Its tasks need not be
 * slower: the step waits for the worker that holds the most. */
#define EX_QUEUE_MIN_RATIO 1.05
static void queue_culprits(struct ex *x, const struct ex_cpu *cpu, const unsigned char *named) {
  for (int w = 0; x->out->queue && w < x->W; w++) {
    const struct ms_explain_effect *e = &x->out->queue[w];
    if (named[w] || isnan(e->z) || e->z < MS_EXPLAIN_Z || e->effect < log(EX_QUEUE_MIN_RATIO) || !material(x, e))
      continue;
    struct ms_explain_culprit *c = add(x->out, MS_EXPLAIN_WORKER, w, e->z, exp(e->effect), e->excess_ns,
                                       "saturated queue");
    if (!c) return;
    name_worker(c->name, sizeof c->name, x, w, cpu);
    double pace = isnan(x->out->worker[w].effect) ? 1 : exp(x->out->worker[w].effect);
    why(c, "it ran %.0f%% of the tasks the plan places ahead of time, %.2fx an even share of %d workers' (z %.1f "
           "over the window's slices); its tasks took %.2fx what the same classes took on the others%s",
        100 * exp(e->effect) / x->W, exp(e->effect), x->W, e->z, pace,
        pace < 1.05 ? ": no slower, the step waits for it" : "");
  }
}

/* Not a device while another device's worker waits for its CPU (the OS's
 * view): the devices that wait for its shares sleep between them and run their
 * next tasks cold (a neighbour on rank 1's CPU made rank 0's fastest tasks
 * 1.3x rank 1's). */
static void device_culprits(struct ex *x, const int *shared, int *dev_named) {
  for (int d = 0; x->D > 1 && d < x->D; d++) {
    const struct ms_explain_effect *e = &x->out->device[d];
    int other_cpu = 0;
    for (int w = 0; w < x->W && w < EX_MAX_CPU; w++) other_cpu |= shared[w] && ex_device(x, w) != d;
    if (!stands(e->effect, e->z) || other_cpu) continue;
    dev_named[d] = 1;
    struct ms_explain_culprit *c = add(x->out, MS_EXPLAIN_DEVICE, d, e->z, exp(e->effect), e->excess_ns, "slow tasks");
    if (!c) return;
    snprintf(c->name, sizeof c->name, x->in->rank_workers > 0 ? "rank %d" : "device %d", d);
    why(c, "its workers' tasks took %.2fx what the same classes took on the other devices (z %.1f)", exp(e->effect),
        e->z);
  }
}

/* A device whose shares arrive late: the communication tasks that carry them
 * stand above those that carry the other devices' shares, on every device (a
 * share is received where the others wait for it). Not when a device, a
 * worker or one worker's CPU was named (every worker's CPU aside): a device
 * slow in its own tasks sends its shares late, and a worker whose CPU another
 * thread takes is switched out in the middle of its receives, so the shares it
 * receives look late (a neighbour on rank 1's CPU made rank 0's shares 1.3x
 * rank 1's); the gathers are that culprit seen from the other side. Nor when
 * the device's own tasks took half the shares' excess or more beyond its
 * peers': a device a little slower in its own work (below a culprit) sends its
 * shares that much later (rank 0, which serves HTTP beside its worker, 1.18x
 * and its shares 1.37x on a healthy tiny engine, 56 and 67 us a step). */
static void share_culprits(struct ex *x) {
  for (int i = 0; i < x->out->n_culprits; i++) {
    const struct ms_explain_culprit *c = &x->out->culprits[i];
    if (c->kind == MS_EXPLAIN_WORKER || c->kind == MS_EXPLAIN_DEVICE || (c->kind == MS_EXPLAIN_CPU && c->id >= 0))
      return;
  }
  for (int d = 0; x->D > 1 && d < x->D; d++) {
    const struct ms_explain_effect *e = &x->out->share[d];
    if (!stands(e->effect, e->z) || !material(x, e) || x->out->device[d].excess_ns >= 0.5 * e->excess_ns) continue;
    struct ms_explain_culprit *c = add(x->out, MS_EXPLAIN_DEVICE, d, e->z, exp(e->effect), e->excess_ns, "late shares");
    if (!c) return;
    snprintf(c->name, sizeof c->name, x->in->rank_workers > 0 ? "rank %d" : "device %d", d);
    why(c, "the communication tasks that carry its shares took %.2fx those that carry the other %s' (z %.1f, "
           "sender and receivers together, %.0f us a step more): its shares arrive late, and its own tasks do not "
           "explain it (%.2fx its peers', %.0f us a step)",
        exp(e->effect), x->in->rank_workers > 0 ? "ranks" : "devices", e->z, e->excess_ns / 1e3,
        isnan(x->out->device[d].effect) ? 1 : exp(x->out->device[d].effect), x->out->device[d].excess_ns / 1e3);
  }
}

/* ---- layers and classes ---- */

static void layer_culprits(struct ex *x, int *layer_named) {
  for (int l = 0; l < x->out->n_layers; l++) {
    const struct ms_explain_effect *e = &x->out->layer[l];
    if (!stands(e->effect, e->z) || !material(x, e)) continue;
    layer_named[l] = 1;
    struct ms_explain_culprit *c = add(x->out, MS_EXPLAIN_LAYER, l, e->z, exp(e->effect), e->excess_ns, "slow tasks");
    if (!c) return;
    snprintf(c->name, sizeof c->name, "layer %d", l);
    /* with a baseline its classes' effects are against where they stood there */
    why(c, "the median of its classes took %.2fx their peers in the other layers%s (z %.1f, peer scatter %.1f%%)",
        exp(e->effect), x->in->class_base ? ", against where they stood in the baseline" : "", e->z,
        100 * x->sigma);
  }
}

/* Whether a worker, a device or a worker's CPU was named (the first turn). */
static int machine_named(const struct ex *x) {
  for (int i = 0; i < x->out->n_culprits; i++)
    if (x->out->culprits[i].kind == MS_EXPLAIN_WORKER || x->out->culprits[i].kind == MS_EXPLAIN_DEVICE ||
        x->out->culprits[i].kind == MS_EXPLAIN_CPU)
      return 1;
  return 0;
}

static void class_culprits(struct ex *x, const int *layer_named) {
  int waits_named = x->D > 1 && machine_named(x);
  for (int i = 0; i < x->C; i++) {
    const struct ms_explain_effect *e = &x->out->cls[i];
    if (!stands(e->effect, e->z) || !material(x, e)) continue;
    /* a communication task's time is the other devices' shares arriving: with
     * a worker, a device or a CPU named on an engine of several devices, a
     * slow one is that culprit seen from the devices waiting for it (a
     * neighbour on rank 1's CPU made rank 0's first gather 1.3x its peers) */
    if (waits_named && !strncmp(x->in->classes[i].op, "comm", 4)) continue;
    /* across processes (each rank's shares judged): a gather lasts until the
     * other ranks have done what comes before it, so against its peers in
     * other layers it reads what they do there, not the communication (on a
     * healthy tiny engine the step's first gather, which waits for the ranks
     * that follow rank 0's step header, stood 2.9x its peer); a late
     * communication is its device's late shares */
    if (x->in->rank_workers > 0 && !strncmp(x->in->classes[i].op, "comm", 4)) continue;
    int l = x->in->classes[i].layer;
    double z = e->z;
    /* inside a slow layer, only what stands out beyond the layer's own effect */
    if (l >= 0 && l < x->out->n_layers && layer_named[l]) {
      double beyond = e->effect - x->out->layer[l].effect;
      z = beyond / e->noise;
      if (!stands(beyond, z)) continue;
    }
    struct ms_explain_culprit *c = add(x->out, MS_EXPLAIN_CLASS, i, z, exp(e->effect), e->excess_ns, "slow tasks");
    if (!c) return;
    snprintf(c->name, sizeof c->name, "%s", x->in->classes[i].name);
    const double *base = x->in->class_base;
    if (base && isfinite(base[i]))
      why(c, "against its %d peers (%s in the other layers) its tasks took %.2fx where they stood in the "
             "baseline (%.2fx) over %.0f tasks; z %.1f%s", e->peers, x->in->classes[i].op, exp(e->effect),
          exp(base[i]), e->n, z, x->out->n_set_aside ? " (on the workers not named)" : "");
    else
      why(c, "its tasks took %.2fx the median of its %d peers (%s in the other layers) over %.0f tasks; z %.1f "
             "against the peers' scatter of %.1f%%%s", exp(e->effect), e->peers, x->in->classes[i].op, e->n, z,
          100 * x->sigma, x->out->n_set_aside ? " (on the workers not named)" : "");
  }
}

/* ---- requests ---- */

static double request_ctx(const struct ms_explain_request *r) { return r->ctx_max > 0 ? r->ctx_max : r->ctx_sum / r->n; }

/* The longest context among the judged requests other than i. */
static double others_longest(const struct ex *x, const struct ex_req *rq, int i) {
  double m = 0;
  for (int j = 0; j < x->in->n_requests; j++)
    if (j != i && !isnan(rq->time[j]) && request_ctx(&x->in->requests[j]) > m) m = request_ctx(&x->in->requests[j]);
  return m;
}

/* Whether a part is already named beside the requests: a lone request must
 * then stand twice as far out. A worker named for its CPU (another thread
 * took it) stalls whatever tasks it held (held-out 7: a Gemma-3 request 1.62x,
 * z 7.0, beside a worker preempted at random, the other requests of its slot
 * 1.15x and 0.95x; the requests are judged on the other workers' tasks when
 * the cells say whose, but a neighbour's switch also stalls the events the
 * other workers wait on); a slow class, layer, worker or device stretches the steps
 * unevenly, and a request alive for part of the window met only some of them
 * (CI: a SmolLM2 request 1.33x, z 7.4, beside blk.15.gate_up 3x at z 108, on a
 * quiet machine). In the 90 held-out explain runs kept, no request was named
 * beside a culprit that was not a CPU, right or wrong. */
static int part_named(const struct ex *x) {
  for (int c = 0; c < x->out->n_culprits; c++)
    if (x->out->culprits[c].kind != MS_EXPLAIN_REQUEST && x->out->culprits[c].kind != MS_EXPLAIN_SLOT) return 1;
  return 0;
}

/* Slow: above what its context gives. Beyond twice the others' longest context
 * the line, fitted on theirs, predicts nothing: such a request is long, not slow */
static int judged_slow(const struct ex *x, const struct ex_req *rq, int i) {
  const struct ms_explain_effect *e = &x->out->request[i];
  return !isnan(e->z) && request_ctx(&x->in->requests[i]) <= 2 * others_longest(x, rq, i);
}

/* A batch slot whose requests are slow together (an injected slow request, a
 * tenant's adapter, a row whose place in the step is cursed): each request's
 * effect is noisy (the requests scatter 5-25% around the line), but the
 * slot's median over its m requests scatters sqrt(m) times less, or as much as
 * the slots' medians scatter among themselves, whichever is more (the
 * requests of one slot share its row's place in every step, so they need not
 * be independent). Named when that median stands as a part does (6 scatters,
 * 1.25x). named[s] = 1 for each slot named. */
#define EX_MAX_SLOT 256
static void slot_culprits(struct ex *x, const struct ex_req *rq, unsigned char *named) {
  const struct ms_explain_input *in = x->in;
  double *v = malloc(((size_t)in->n_requests + 1) * sizeof *v), med[EX_MAX_SLOT], excess[EX_MAX_SLOT];
  int m[EX_MAX_SLOT], slots = 0;
  if (!v) return;
  for (int s = 0; s < EX_MAX_SLOT; s++) {
    int k = 0;
    excess[s] = 0;
    for (int i = 0; i < in->n_requests; i++)
      if (in->requests[i].slot == (uint32_t)s && judged_slow(x, rq, i)) {
        v[k++] = x->out->request[i].effect;
        excess[s] += x->out->request[i].excess_ns;
      }
    m[s] = k;
    med[s] = k ? ex_median(v, (size_t)k) : NAN;
    slots += k > 0;
  }
  if (slots >= 4) {
    for (int s = 0, j = 0; s < EX_MAX_SLOT; s++)
      if (m[s]) v[j++] = med[s];
    double center = ex_median(v, (size_t)slots);  /* sorts v: the same values, as the MAD needs */
    double among = ex_mad_sd(v, (size_t)slots, center);
    for (int s = 0; s < EX_MAX_SLOT; s++) {
      if (m[s] < 2) continue;
      double noise = rq->noise / sqrt(m[s]), effect = med[s] - center;
      noise = among > noise ? among : noise;
      double z = effect / noise;
      if (!stands(effect, z)) continue;
      struct ms_explain_culprit *c = add(x->out, MS_EXPLAIN_SLOT, s, z, exp(effect), excess[s], "slow attention");
      if (!c) break;
      named[s] = 1;
      snprintf(c->name, sizeof c->name, "batch slot %d", s);
      why(c, "its %d requests' attention took %.2fx what their contexts give, the median of them (z %.1f against "
             "the other slots'): what is slow stays with the slot", m[s], exp(effect), z);
    }
  }
  free(v);
}

static void request_culprits(struct ex *x, const struct ex_req *rq) {
  const struct ms_explain_input *in = x->in;
  unsigned char slot_named[EX_MAX_SLOT] = {0};
  int strict = part_named(x);
  slot_culprits(x, rq, slot_named);
  int first = x->out->n_culprits;
  for (int i = 0; i < in->n_requests; i++) {
    const struct ms_explain_effect *e = &x->out->request[i];
    const struct ms_explain_request *r = &in->requests[i];
    if (isnan(e->z) || (r->slot < EX_MAX_SLOT && slot_named[r->slot])) continue;
    double ctx = request_ctx(r), t = rq->time[i], lt = log(t) - rq->t_center, zt = lt / rq->t_noise;
    double t_typ = exp(rq->t_center);
    int slow = judged_slow(x, rq, i) && stands(e->effect, strict ? e->z / 2 : e->z);
    /* long: at least twice the window's median context (a tiny model's
     * requests add next to nothing to their steps, and a ratio of two such
     * times read 23856x for a request at the median context) */
    int long_ctx = !slow && stands(lt, zt) && ctx >= 2 * exp(rq->ctx_center);
    if (!slow && !long_ctx) continue;
    struct ms_explain_culprit *c =
        add(x->out, MS_EXPLAIN_REQUEST, i, slow ? e->z : zt, slow ? exp(e->effect) : t / t_typ,
            slow ? e->excess_ns : (t - t_typ) * r->n / (in->steps > 0 ? in->steps : 1),
            slow ? "slow attention" : "long context");
    if (!c) return;
    snprintf(c->name, sizeof c->name, "request slot %u gen %u", r->slot, r->gen);
    if (slow)
      why(c, "its attention tasks took %.2fx what the other requests' line gives for its %.0f positions (z %.1f)",
          exp(e->effect), ctx, e->z);
    else
      why(c, "its context (%.0f positions) is %.1fx the window's median; its attention takes %.2fx a typical "
             "request's in each step (z %.1f), as that context predicts", ctx, ctx / exp(rq->ctx_center), t / t_typ, zt);
  }
  /* several slow requests of one slot (too few slots to judge the slots): the slot, not each request */
  for (int a = first; a < x->out->n_culprits; a++) {
    struct ms_explain_culprit *ca = &x->out->culprits[a];
    if (ca->kind != MS_EXPLAIN_REQUEST || strcmp(ca->cause, "slow attention")) continue;
    uint32_t slot = in->requests[ca->id].slot;
    int same = 0;
    for (int b = a + 1; b < x->out->n_culprits; b++) {
      struct ms_explain_culprit *cb = &x->out->culprits[b];
      if (cb->kind == MS_EXPLAIN_REQUEST && !strcmp(cb->cause, "slow attention") && in->requests[cb->id].slot == slot) {
        same++;
        if (cb->z < ca->z) ca->z = cb->z;  /* the slot's weakest request */
        ca->excess_ns_per_step += cb->excess_ns_per_step;
        *cb = x->out->culprits[--x->out->n_culprits];
        b--;
      }
    }
    if (!same) continue;
    ca->kind = MS_EXPLAIN_SLOT;
    ca->id = (int)slot;
    ca->confidence = ms_explain_confidence(MS_EXPLAIN_SLOT, ca->z);
    snprintf(ca->name, sizeof ca->name, "batch slot %u", slot);
    why(ca, "%d requests in this slot each took about %.2fx what their contexts give for attention (the weakest "
            "z %.1f): what is slow stays with the slot", same + 1, ca->ratio, ca->z);
  }
}

static int by_excess(const void *a, const void *b) {
  const struct ms_explain_culprit *x = a, *y = b;
  if (x->excess_ns_per_step != y->excess_ns_per_step) return x->excess_ns_per_step < y->excess_ns_per_step ? 1 : -1;
  return (x->z < y->z) - (x->z > y->z);
}

int ex_worker_culprits(struct ex *x, const struct ex_cpu *cpu, unsigned char *named) {
  size_t n = (size_t)(x->W < EX_MAX_CPU ? EX_MAX_CPU : x->W);
  int *shared = calloc(n, sizeof *shared), *dev_named = calloc((size_t)x->D + 1, sizeof *dev_named);
  double *shared_z = calloc(n, sizeof *shared_z);
  if (shared && shared_z && dev_named) {
    cpu_culprits(x, cpu, shared, shared_z);
    device_culprits(x, shared, dev_named);
    worker_culprits(x, cpu, shared, shared_z, dev_named, named);
    queue_culprits(x, cpu, named);
    share_culprits(x);
  }
  free(shared);
  free(shared_z);
  free(dev_named);
  int k = 0;
  for (int w = 0; w < x->W; w++) k += named[w];
  return k;
}

void ex_part_culprits(struct ex *x, const struct ex_req *rq) {
  int *layer_named = calloc((size_t)x->out->n_layers + 1, sizeof *layer_named);
  if (layer_named) {
    layer_culprits(x, layer_named);
    class_culprits(x, layer_named);
    request_culprits(x, rq);
  }
  free(layer_named);
  qsort(x->out->culprits, (size_t)x->out->n_culprits, sizeof *x->out->culprits, by_excess);
  /* "none": as sure as a 1.5x class would have stood out of this window's scatter */
  double z15 = log(1.5) / x->sigma;
  x->out->none_confidence = x->out->n_culprits ? 0 : ms_explain_confidence(MS_EXPLAIN_KIND_COUNT, z15);
}
