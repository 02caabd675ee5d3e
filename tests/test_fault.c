/* SPDX-License-Identifier: MIT */
/* Fault injection and the simulator it is measured on: a sim run is a function
 * of its seed (step times, per-class telemetry and hook counts equal across two
 * runs); each fault changes what it claims to and leaves the rest alone (per
 * class and per event class telemetry, the queues a saturation rebuilds); the
 * tensor-parallel plan is valid and fires the comm hook; the CPU backend runs
 * every fault to completion; a fault with a bad target is refused with a reason.
 * Nothing here reads the wall clock. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/fault.h"
#include "megascope/attach.h"
#include "megascope/telemetry.h"
#include "runtime/runtime_impl.h"
#include "runtime/fault.h"
#include "test.h"

#define MAXC 512

static struct ms_model *shape_model(int layers, int experts) {
  struct ms_model_config c;
  ms_preset_config("llama-3.2-1b", MS_DTYPE_BF16, &c);
  c.n_layers = layers;
  if (experts) {
    c.n_experts = experts;
    c.top_k = 2;
    c.expert_ffn_dim = 1024;
  }
  return ms_model_shape(&c);
}

struct run {
  uint64_t sim_ns;
  int n_steps;
  struct ms_step_record steps[64];
  struct ms_class_stat cls[MAXC], ev[64];
  char names[MAXC][48], ev_names[64][64];  /* the stats' names die with the engine */
  int n_cls, n_ev;
  struct ms_coverage cov;
  int aot_max, aot_min;   /* AOT queue lengths of the batch's plan */
};

struct sim_cfg {
  int batch, tokens, tp, sms;
  uint64_t seed;
  double jitter;
  const struct ms_fault *faults;
  int n_faults;
  const char *monitor;  /* attach this shipped monitor for the whole run */
};

static char mon_dir[4096];

/* Runs `batch` requests of `tokens` tokens on a sim engine; 0 when it ran. */
static int sim_run(const struct ms_model *m, const struct sim_cfg *c, struct run *out) {
  char buf[4096] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_engine_opts o = {.sz = sizeof o, .max_batch = c->batch, .max_ctx = c->tokens + 2,
                             .backend = MS_BACKEND_SIM, .seed = c->seed, .faults = c->faults,
                             .n_faults = c->n_faults, .tp = c->tp, .start_paused = 1};
  ms_sim_preset("h100", &o.sim);
  o.sim.n_sms = c->sms;
  o.sim.jitter = c->jitter;
  struct ms_engine *e = ms_engine_new(m, &o, &log);
  if (!e) {
    fprintf(stderr, "engine: %s", buf);
    return -1;
  }
  int id = 0;
  if (c->monitor) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.bpf.o", mon_dir, c->monitor);
    struct ms_monitor *mon = ms_monitor_open(path, &log);
    struct ms_attach_opts ao = {.sz = sizeof ao};
    id = mon ? ms_engine_attach(e, mon, &ao, &log) : -1;
    if (id <= 0) fprintf(stderr, "attach %s: %s", path, buf);
  }
  struct ms_request *r[64];
  for (int i = 0; i < c->batch; i++) {
    int32_t tok = 1 + i;
    struct ms_request_opts ro = {.sz = sizeof ro, .prompt = &tok, .n_prompt = 1, .max_new_tokens = c->tokens};
    r[i] = ms_engine_submit(e, &ro);
  }
  ms_engine_resume(e);  /* the whole batch joins the first step */
  for (int i = 0; i < c->batch; i++) {
    ms_request_wait(r[i], -1);
    ms_request_free(r[i]);
  }
  memset(out, 0, sizeof *out);
  out->sim_ns = ms_engine_sim_now(e);
  out->n_steps = ms_engine_step_log(e, out->steps, 64);
  out->n_cls = ms_engine_class_stats(e, out->cls, MAXC);
  out->n_ev = ms_engine_event_class_stats(e, out->ev, 64);
  for (int i = 0; i < out->n_cls && i < MAXC; i++) {
    snprintf(out->names[i], sizeof out->names[i], "%s", out->cls[i].name);
    out->cls[i].name = out->names[i];
  }
  for (int i = 0; i < out->n_ev && i < 64; i++) {
    snprintf(out->ev_names[i], sizeof out->ev_names[i], "%s", out->ev[i].name);
    out->ev[i].name = out->ev_names[i];
  }
  if (id > 0) ms_engine_attach_coverage(e, id, 0, &out->cov);
  struct plan_rt *rt = &e->rt[0];
  while (rt->plan->batch < c->batch) rt++;
  out->aot_min = 1 << 30;
  for (int w = 0; w < e->n_workers; w++) {
    if (rt->aot_n[w] > out->aot_max) out->aot_max = rt->aot_n[w];
    if (rt->aot_n[w] < out->aot_min) out->aot_min = rt->aot_n[w];
  }
  ms_engine_free(e);
  return 0;
}

static int class_id(const struct run *r, const char *name) {
  for (int i = 0; i < r->n_cls; i++)
    if (!strcmp(r->cls[i].name, name)) return i;
  return -1;
}

static int ev_class_id(const struct run *r, const char *name) {
  for (int i = 0; i < r->n_ev; i++)
    if (!strcmp(r->ev[i].name, name)) return i;
  return -1;
}

static const struct sim_cfg base = {.batch = 4, .tokens = 4, .sms = 16, .seed = 3, .jitter = 0.05};

/* Same seed, same everything: step times, telemetry and hook counts. */
static void test_determinism(const struct ms_model *m) {
  static struct run a, b, c;
  struct sim_cfg cfg = base;
  cfg.monitor = "class_time";
  CHECK(sim_run(m, &cfg, &a) == 0);
  CHECK(sim_run(m, &cfg, &b) == 0);
  CHECK(a.sim_ns == b.sim_ns && a.sim_ns > 0);
  CHECK(a.n_steps == b.n_steps && a.n_steps == 4);
  int same = 1;
  for (int i = 0; i < a.n_steps; i++)
    same &= a.steps[i].t_begin == b.steps[i].t_begin && a.steps[i].t_end == b.steps[i].t_end;
  for (int i = 0; i < a.n_cls; i++)
    same &= a.cls[i].tasks == b.cls[i].tasks && a.cls[i].task_ns == b.cls[i].task_ns &&
            a.cls[i].queue_ns == b.cls[i].queue_ns && a.cls[i].wait_ns == b.cls[i].wait_ns;
  CHECK(same);
  CHECKF(a.cov.eligible == b.cov.eligible && a.cov.executed == b.cov.executed && a.cov.eligible > 0,
         "eligible %llu/%llu", (unsigned long long)a.cov.eligible, (unsigned long long)b.cov.eligible);
  /* another seed moves the jittered times, not the work */
  cfg.seed = 4;
  CHECK(sim_run(m, &cfg, &c) == 0);
  CHECK(c.sim_ns != a.sim_ns);
  CHECK(c.cov.eligible == a.cov.eligible);
}

/* slow_class: that class's tasks take `factor` times longer; the others do not change. */
static void test_slow_class(const struct ms_model *m) {
  static struct run h, f;
  struct sim_cfg cfg = base;
  CHECK(sim_run(m, &cfg, &h) == 0);
  int c = class_id(&h, "blk.1.wo");
  CHECK(c >= 0);
  struct ms_fault fl = {.type = MS_FAULT_SLOW_CLASS, .target = c, .factor = 3};
  cfg.faults = &fl;
  cfg.n_faults = 1;
  CHECK(sim_run(m, &cfg, &f) == 0);
  double ratio = (double)f.cls[c].task_ns / (double)h.cls[c].task_ns;
  CHECKF(ratio > 2.99 && ratio < 3.01, "ratio %g", ratio);
  int others = 1;
  for (int i = 0; i < h.n_cls; i++)
    if (i != c) others &= h.cls[i].task_ns == f.cls[i].task_ns;
  CHECK(others);
  CHECK(f.sim_ns > h.sim_ns);
}

/* slow_request: only attention tasks change, by about 1/batch of (factor - 1). */
static void test_slow_request(const struct ms_model *m) {
  static struct run h, f;
  struct sim_cfg cfg = base;
  struct ms_fault fl = {.type = MS_FAULT_SLOW_REQUEST, .target = 2, .factor = 9};
  CHECK(sim_run(m, &cfg, &h) == 0);
  cfg.faults = &fl;
  cfg.n_faults = 1;
  CHECK(sim_run(m, &cfg, &f) == 0);
  int ok = 1, seen = 0;
  for (int i = 0; i < h.n_cls; i++) {
    const char *dot = strrchr(h.cls[i].name, '.');
    int attn = dot && !strcmp(dot, ".attn");
    double ratio = (double)f.cls[i].task_ns / (double)h.cls[i].task_ns;
    if (attn) {
      seen++;
      ok &= ratio > 1.5;  /* a quarter of the rows at 9x (the JIT dispatch not scaled) */
    } else {
      ok &= ratio == 1;
    }
  }
  CHECK(ok && seen == 2);
}

/* delayed_release: waits on that event class grow by about delay per step;
 * task times do not change. */
static void test_delayed_release(const struct ms_model *m) {
  static struct run h, f;
  struct sim_cfg cfg = base;
  CHECK(sim_run(m, &cfg, &h) == 0);
  int ec = ev_class_id(&h, "rope->attn");
  CHECK(ec >= 0);
  struct ms_fault fl = {.type = MS_FAULT_DELAYED_RELEASE, .target = ec, .delay_ns = 20000};
  cfg.faults = &fl;
  cfg.n_faults = 1;
  CHECK(sim_run(m, &cfg, &f) == 0);
  /* two layers, four steps: eight delayed firings, each on the critical path */
  double added = (double)(f.sim_ns - h.sim_ns);
  CHECKF(added > 8 * 20000 * 0.9 && added < 8 * 20000 * 1.2, "added %g ns", added);
  int same = 1;
  for (int i = 0; i < h.n_cls; i++) same &= h.cls[i].task_ns == f.cls[i].task_ns;
  CHECK(same);
  CHECK(f.ev[ec].wait_ns > h.ev[ec].wait_ns);
}

/* starve_task: the starved class queues (ready -> begin) for about delay per step. */
static void test_starve(const struct ms_model *m) {
  static struct run h, f;
  struct sim_cfg cfg = base;
  CHECK(sim_run(m, &cfg, &h) == 0);
  int c = class_id(&h, "blk.0.attn");
  struct ms_fault fl = {.type = MS_FAULT_STARVE_TASK, .target = c, .tile = 5, .delay_ns = 30000};
  cfg.faults = &fl;
  cfg.n_faults = 1;
  CHECK(sim_run(m, &cfg, &f) == 0);
  double added = (double)f.cls[c].queue_ns - (double)h.cls[c].queue_ns;
  CHECKF(added > 4 * 30000 * 0.9 && added < 4 * 30000 * 1.1, "queued %g ns more", added);
  CHECK(f.cls[c].task_ns == h.cls[c].task_ns);
  CHECK(f.sim_ns > h.sim_ns);
}

/* queue_saturation: one worker's AOT queue grows; the work does not change. */
static void test_saturation(const struct ms_model *m) {
  static struct run h, f;
  struct sim_cfg cfg = base;
  CHECK(sim_run(m, &cfg, &h) == 0);
  struct ms_fault fl = {.type = MS_FAULT_QUEUE_SATURATION, .target = 5, .factor = 0.1};
  cfg.faults = &fl;
  cfg.n_faults = 1;
  CHECK(sim_run(m, &cfg, &f) == 0);
  CHECKF(f.aot_max > h.aot_max * 2, "aot max %d vs %d", f.aot_max, h.aot_max);
  int same = 1;
  for (int i = 0; i < h.n_cls; i++) same &= h.cls[i].task_ns == f.cls[i].task_ns && h.cls[i].tasks == f.cls[i].tasks;
  CHECK(same);
  CHECK(f.sim_ns > h.sim_ns);
}

/* Tensor parallel: the plan validates, communication tasks run on their
 * device, and comm_delay slows exactly those of one device. */
static void test_tp_comm(const struct ms_model *m) {
  static struct run h, f;
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 4, .tiles_per_op = 32, .tp = 2};
  char buf[4096] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_plan *p = ms_plan_compile(m, &co, &log);
  CHECK(p != NULL);
  if (p) {
    CHECKF(ms_plan_validate(p, &log) == 0, "%s", buf);
    int comm = 0;
    for (int t = 0; t < p->n_tasks; t++) comm += p->tasks[t].kernel == MS_K_COMM;
    CHECK(comm == 2 * 2 * 2);  /* two layers, two all-gathers each, two devices */
    ms_plan_free(p);
  }
  struct sim_cfg cfg = base;
  cfg.tp = 2;
  cfg.monitor = NULL;
  CHECK(sim_run(m, &cfg, &h) == 0);
  int c = class_id(&h, "blk.1.comm_ffn");
  CHECK(c >= 0);
  struct ms_fault fl = {.type = MS_FAULT_COMM_DELAY, .target = 1, .delay_ns = 10000};
  cfg.faults = &fl;
  cfg.n_faults = 1;
  CHECK(sim_run(m, &cfg, &f) == 0);
  /* one of two devices' tasks, four steps: 4 x 10 us more in the class */
  CHECK(c >= 0 && f.cls[c].task_ns - h.cls[c].task_ns == 4 * 10000);
  CHECK(f.sim_ns > h.sim_ns);
}

/* routing_skew: the hot expert gets more rows in the simulator's spread. */
static void test_routing_skew(void) {
  struct ms_model *m = shape_model(2, 8);
  static struct run h, f;
  struct sim_cfg cfg = base;
  cfg.batch = 8;
  CHECK(sim_run(m, &cfg, &h) == 0);
  struct ms_fault fl = {.type = MS_FAULT_ROUTING_SKEW, .target = 6, .factor = 1};
  cfg.faults = &fl;
  cfg.n_faults = 1;
  CHECK(sim_run(m, &cfg, &f) == 0);
  /* the rows move, their total does not: the class's time hardly changes, the schedule does */
  CHECK(f.sim_ns != h.sim_ns);
  /* direct: every row picks expert 6 */
  struct ms_engine_opts o = {.sz = sizeof o, .max_batch = 8, .backend = MS_BACKEND_SIM, .faults = &fl, .n_faults = 1};
  ms_sim_preset("h100", &o.sim);
  o.sim.n_sms = 8;
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  CHECK(e != NULL);
  if (e) {
    struct plan_rt *rt = &e->rt[3];
    int slots[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    rt->x.meta.n_rows = 8;
    rt->x.meta.row_slot = slots;
    CHECK(ms_fault_routed(e, rt, 6) == 8);
    int total = 0;
    for (int x = 0; x < 8; x++) total += ms_fault_routed(e, rt, x);
    CHECK(total == 16);  /* still top-2 per row */
    rt->x.meta.row_slot = e->row_slot;
    rt->x.meta.n_rows = 0;
    ms_engine_free(e);
  }
  ms_model_free(m);
}

static int is_attn(const struct run *r, int cls) { return !strcmp(strrchr(r->cls[cls].name, '.'), ".attn"); }

/* The open-ended faults: slow_layer slows exactly that layer's classes;
 * slow_worker and bandwidth_steal add time only on their worker or device (and
 * bandwidth only to weight-streaming kernels); late_admission holds one request
 * back while the others run, so the run takes more steps and every token is made. */
static void test_open_ended(const struct ms_model *m) {
  static struct run h, f;
  struct sim_cfg cfg = base;
  CHECK(sim_run(m, &cfg, &h) == 0);
  struct ms_fault sl = {.type = MS_FAULT_SLOW_LAYER, .target = 1, .factor = 2};
  cfg.faults = &sl;
  cfg.n_faults = 1;
  CHECK(sim_run(m, &cfg, &f) == 0);
  int ok = 1, slowed = 0;
  for (int i = 0; i < h.n_cls; i++) {
    double ratio = (double)f.cls[i].task_ns / (double)(h.cls[i].task_ns ? h.cls[i].task_ns : 1);
    if (!strncmp(h.cls[i].name, "blk.1.", 6) && h.cls[i].task_ns) {
      slowed++;
      /* 2x the cost; JIT classes (attention) count their dispatch too, which is not scaled */
      ok &= ratio > (is_attn(&h, i) ? 1.4 : 1.99) && ratio < 2.01;
    } else {
      ok &= h.cls[i].task_ns == f.cls[i].task_ns;
    }
  }
  CHECKF(ok && slowed >= 8, "slowed %d", slowed);
  CHECK(f.sim_ns > h.sim_ns);

  struct ms_fault late = {.type = MS_FAULT_LATE_ADMISSION, .target = 2, .delay_ns = 1};
  cfg.faults = &late;
  CHECK(sim_run(m, &cfg, &f) == 0);
  CHECKF(f.n_steps == h.n_steps + 1 && f.sim_ns > h.sim_ns, "steps %d, healthy %d", f.n_steps, h.n_steps);

  struct ms_fault sw = {.type = MS_FAULT_SLOW_WORKER, .target = 3, .factor = 3};
  cfg.faults = &sw;
  CHECK(sim_run(m, &cfg, &f) == 0);
  uint64_t th = 0, tf = 0;
  for (int i = 0; i < h.n_cls; i++) th += h.cls[i].task_ns, tf += f.cls[i].task_ns;
  CHECK(tf > th && f.sim_ns > h.sim_ns);

  /* where the extra time goes, task by task, on a two-device engine */
  struct ms_fault bw = {.type = MS_FAULT_BANDWIDTH_STEAL, .target = 1, .factor = 1.5};
  struct ms_fault both[2] = {sw, bw};
  struct ms_engine_opts o = {.sz = sizeof o, .max_batch = 4, .backend = MS_BACKEND_SIM, .faults = both, .n_faults = 2,
                             .tp = 2};
  ms_sim_preset("h100", &o.sim);
  o.sim.n_sms = 8;
  struct ms_engine *e = ms_engine_new(m, &o, NULL);
  CHECK(e != NULL);
  if (!e) return;
  struct plan_rt *rt = &e->rt[0];
  const struct ms_plan *p = rt->plan;
  int streaming = -1, norm = -1;
  for (int t = 0; t < p->n_tasks; t++) {
    if (p->tasks[t].kernel == MS_K_QKV && streaming < 0) streaming = t;
    if (p->tasks[t].kernel == MS_K_RMSNORM && norm < 0) norm = t;
  }
  CHECK(streaming >= 0 && norm >= 0 && ms_engine_n_workers(e) == 16);
  CHECK(ms_fault_extra_ns(e, rt, norm, 3, 1000) == 2000);        /* slow worker 3, device 0 */
  CHECK(ms_fault_extra_ns(e, rt, norm, 4, 1000) == 0);
  CHECK(ms_fault_extra_ns(e, rt, streaming, 9, 1000) == 500);    /* device 1 streams at 1/1.5 */
  CHECK(ms_fault_extra_ns(e, rt, norm, 9, 1000) == 0);           /* a norm streams no weights */
  CHECK(ms_fault_extra_ns(e, rt, streaming, 2, 1000) == 0);      /* device 0 */
  ms_engine_free(e);
}

/* Every fault runs to completion on the CPU backend (real threads, compute). */
static void test_cpu_backend(void) {
  struct ms_model_config c;
  ms_preset_config("tiny-moe", MS_DTYPE_F32, &c);
  struct ms_model *m = ms_model_synth(&c, 5);
  struct ms_engine_opts probe = {.sz = sizeof probe, .n_workers = 2, .max_batch = 4};
  struct ms_engine *e = ms_engine_new(m, &probe, NULL);
  const struct ms_plan *p = ms_engine_plan(e, 4);
  int attn = -1, up = -1;
  for (int i = 0; i < p->n_classes; i++) {
    if (!strcmp(p->classes[i].name, "blk.1.attn")) attn = i;
    if (!strcmp(p->classes[i].name, "blk.0.expert_up")) up = i;
  }
  ms_engine_free(e);
  struct ms_fault faults[] = {
      {.type = MS_FAULT_SLOW_CLASS, .target = up, .factor = 2},
      {.type = MS_FAULT_ROUTING_SKEW, .target = 1, .factor = 1},
      {.type = MS_FAULT_DELAYED_RELEASE, .target = 0, .delay_ns = 20000},
      {.type = MS_FAULT_QUEUE_SATURATION, .target = 1, .factor = 0.5},
      {.type = MS_FAULT_STARVE_TASK, .target = attn, .tile = 1, .delay_ns = 50000},
      {.type = MS_FAULT_SLOW_REQUEST, .target = 0, .factor = 3},
      {.type = MS_FAULT_SLOW_WORKER, .target = 1, .factor = 2},
      {.type = MS_FAULT_BANDWIDTH_STEAL, .target = 0, .factor = 2},
      {.type = MS_FAULT_SLOW_LAYER, .target = 0, .factor = 2},
      {.type = MS_FAULT_LATE_ADMISSION, .target = 3, .delay_ns = 200000},
  };
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
    struct ms_engine_opts o = {.sz = sizeof o, .n_workers = 2, .max_batch = 4, .max_ctx = 16,
                               .faults = &faults[i], .n_faults = 1};
    e = ms_engine_new(m, &o, NULL);
    CHECK(e != NULL);
    if (!e) continue;
    struct ms_request *r[4];
    for (int j = 0; j < 4; j++) {
      int32_t tok = 2 + j;
      struct ms_request_opts ro = {.sz = sizeof ro, .prompt = &tok, .n_prompt = 1, .max_new_tokens = 6};
      r[j] = ms_engine_submit(e, &ro);
    }
    int made = 0;
    for (int j = 0; j < 4; j++) {
      ms_request_wait(r[j], -1);
      struct ms_request_info info;
      ms_request_get_info(r[j], &info);
      made += info.n_tokens;
      ms_request_free(r[j]);
    }
    CHECKF(made == 24, "%s: %d tokens", ms_fault_type_name(faults[i].type), made);
    ms_engine_free(e);
  }
  ms_model_free(m);
}

/* A bad fault is refused, and the log says which and why. */
static void test_refused(const struct ms_model *m) {
  char buf[4096] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_fault fl = {.type = MS_FAULT_COMM_DELAY, .target = 0, .delay_ns = 1};
  struct ms_engine_opts o = {.sz = sizeof o, .max_batch = 1, .backend = MS_BACKEND_SIM, .faults = &fl, .n_faults = 1};
  ms_sim_preset("h100", &o.sim);
  o.sim.n_sms = 4;
  CHECK(ms_engine_new(m, &o, &log) == NULL && errno == EINVAL);
  CHECKF(strstr(buf, "comm_delay: target 0 out of range") != NULL, "%s", buf);
  struct ms_fault st = {.type = MS_FAULT_STARVE_TASK, .target = 1, .delay_ns = 1};
  o.faults = &st;
  buf[0] = 0;
  log.len = 0;
  CHECK(ms_engine_new(m, &o, &log) == NULL);
  CHECKF(strstr(buf, "is not JIT") != NULL, "%s", buf);
  enum ms_fault_type t;
  CHECK(ms_fault_type_parse("routing_skew", &t) == 0 && t == MS_FAULT_ROUTING_SKEW);
  CHECK(ms_fault_type_parse("nope", &t) == -EINVAL);
  CHECK(!strcmp(ms_culprit_kind_name(ms_fault_culprit_kind(MS_FAULT_QUEUE_SATURATION)), "worker"));
}

/* Every cost parameter can be set by name. */
static void test_sim_params(void) {
  struct ms_sim_params p;
  ms_sim_preset("a100", &p);
  CHECK(ms_sim_param_set(&p, "hbm_gbps", "2000") == 0 && p.hbm_gbps == 2000);
  CHECK(ms_sim_param_set(&p, "n_sms", "64") == 0 && p.n_sms == 64);
  CHECK(ms_sim_param_set(&p, "jitter", "0.1") == 0 && p.jitter == 0.1);
  CHECK(ms_sim_param_set(&p, "link_latency_ns", "1500") == 0 && p.link_latency_ns == 1500);
  CHECK(ms_sim_param_set(&p, "bogus", "1") == -ENOENT);
  CHECK(ms_sim_param_set(&p, "n_sms", "1.5") == -EINVAL);
  CHECK(ms_sim_param_set(&p, "tflops", "x") == -EINVAL);
  int n = 0;
  for (const char *const *s = ms_sim_param_names; *s; s++) n++;
  CHECK(n == 13);
}

int main(void) {
  const char *d = getenv("MS_MONITORS");
  snprintf(mon_dir, sizeof mon_dir, "%s", d ? d : "build/monitors");
  struct ms_model *m = shape_model(2, 0);
  test_determinism(m);
  test_slow_class(m);
  test_slow_request(m);
  test_delayed_release(m);
  test_starve(m);
  test_saturation(m);
  test_tp_comm(m);
  test_open_ended(m);
  test_refused(m);
  ms_model_free(m);
  test_routing_skew();
  test_cpu_backend();
  test_sim_params();
  TEST_MAIN_END();
}
