/* SPDX-License-Identifier: MIT */
/* Plan read-outs: statistics, task names, structural validation, the schema. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "megascope/plan_ir.h"
#include "megascope/json.h"

void ms_plan_get_stats(const struct ms_plan *p, struct ms_plan_stats *out) { *out = p->stats; }
int ms_plan_batch(const struct ms_plan *p) { return p->batch; }

int ms_bucket_for(int n) {
  int b = 1;
  while (b < n) b <<= 1;
  return b;
}

void ms_plan_task_name(const struct ms_plan *p, int t, char *buf, size_t n) {
  if (t < 0 || t >= p->n_tasks) {
    snprintf(buf, n, "task#%d", t);
    return;
  }
  const struct ms_task *k = &p->tasks[t];
  const char *name = p->classes[k->cls].name;
  if (k->tile[1] >= 0 && k->tile[2] >= 0)
    snprintf(buf, n, "%s[row %d, %s %d]", name, k->tile[1],
             k->kernel == MS_K_EXPERT_UP || k->kernel == MS_K_EXPERT_DOWN ? "expert" : "head", k->tile[2]);
  else if (k->tile[1] >= 0)
    snprintf(buf, n, "%s[row %d]", name, k->tile[1]);
  else if (k->tile[2] >= 0 && k->kernel == MS_K_COMM)  /* tensor parallel: device tile[2]'s share */
    snprintf(buf, n, "%s[device %d]", name, k->tile[2]);
  else if (k->tile[2] >= 0)
    snprintf(buf, n, "%s[expert %d, tile %d]", name, k->tile[2], k->tile[0]);
  else
    snprintf(buf, n, "%s[tile %d]", name, k->tile[0]);
}

#define FAIL(...)                            \
  do {                                       \
    ms_textbuf_printf(log, __VA_ARGS__);     \
    return -MS_E_FORMAT;                     \
  } while (0)

int ms_plan_validate(const struct ms_plan *p, struct ms_textbuf *log) {
  if (p->n_tasks < 1 || p->tasks[0].kernel != MS_K_STEP_START || p->tasks[0].wait != -1)
    FAIL("plan: task 0 must be the step start and wait on nothing\n");
  for (int t = 1; t < p->n_tasks; t++) {
    const struct ms_task *k = &p->tasks[t];
    if (k->wait < 0 || k->wait >= p->n_events) FAIL("plan: task %d waits on no valid event\n", t);
    if (k->trigger < 0 || k->trigger >= p->n_events) FAIL("plan: task %d triggers no valid event\n", t);
    const struct ms_event *e = &p->events[k->wait];
    if (t < e->first || t > e->last)
      FAIL("plan: task %d waits on event %d but is outside its range [%d, %d]\n", t, k->wait, e->first, e->last);
  }
  for (int e = 0; e < p->n_events; e++) {
    const struct ms_event *ev = &p->events[e];
    int n = p->trig_off[e + 1] - p->trig_off[e];
    if (n != ev->needed || n <= 0) FAIL("plan: event %d needs %d triggers but has %d producers\n", e, ev->needed, n);
    for (int i = p->trig_off[e]; i < p->trig_off[e + 1]; i++) {
      int q = p->trig[i];
      if (p->tasks[q].trigger != e) FAIL("plan: producer %d of event %d triggers %d\n", q, e, p->tasks[q].trigger);
      if (ev->last >= ev->first && q >= ev->first)
        FAIL("plan: producer %d of event %d is not before its successors [%d, %d]\n", q, e, ev->first, ev->last);
    }
    for (int t = ev->first; t <= ev->last; t++)
      if (p->tasks[t].wait != e) FAIL("plan: event %d's range [%d, %d] holds task %d, which waits on %d\n", e, ev->first, ev->last, t, p->tasks[t].wait);
    if ((e == p->end_event) != (ev->last < ev->first))
      FAIL("plan: event %d: only the end-of-step event has no successors\n", e);
  }
  return 0;
}

int ms_plan_write_schema(const struct ms_plan *p, FILE *f, int pretty) {
  struct ms_json j;
  ms_json_init(&j, f, pretty);
  ms_json_obj_begin(&j);
  ms_json_kint(&j, "schema_version", MS_SCHEMA_VERSION);
  ms_json_kstr(&j, "model", p->model->cfg.name);
  ms_json_kint(&j, "batch", p->batch);
  ms_json_kstr(&j, "class_naming", "layer-bound: blk.<layer>.<op>");
  ms_json_key(&j, "task_classes");
  ms_json_arr_begin(&j);
  for (int i = 0; i < p->n_classes; i++) {
    const struct ms_task_class *c = &p->classes[i];
    ms_json_obj_begin(&j);
    ms_json_kint(&j, "id", i);
    ms_json_kstr(&j, "name", c->name);
    ms_json_kstr(&j, "op", c->op);
    ms_json_kstr(&j, "kernel", ms_kernel_name(c->kernel));
    ms_json_kint(&j, "kernel_id", c->kernel);
    ms_json_kint(&j, "layer", c->layer);
    ms_json_kstr(&j, "region_class", c->region_class);
    ms_json_kstr(&j, "dependency_class", c->dep_class);
    ms_json_kstr(&j, "launch", c->launch == MS_LAUNCH_JIT ? "jit" : "aot");
    ms_json_kint(&j, "tasks", c->n_tasks);
    ms_json_kint(&j, "tile_cols", c->tile);
    if (c->norm) ms_json_kbool(&j, "input_norm", 1);  /* the pre-norm fused in (only then: older plans read the same) */
    if (c->parts > 1) ms_json_kint(&j, "position_parts", c->parts);  /* attention cut over positions (as input_norm) */
    ms_json_obj_end(&j);
  }
  ms_json_arr_end(&j);
  ms_json_key(&j, "event_classes");
  ms_json_arr_begin(&j);
  for (int i = 0; i < p->n_ev_classes; i++) {
    ms_json_obj_begin(&j);
    ms_json_kint(&j, "id", i);
    ms_json_kstr(&j, "name", p->ev_classes[i]);
    ms_json_obj_end(&j);
  }
  ms_json_arr_end(&j);
  ms_json_obj_end(&j);
  ms_json_end(&j);
  return ferror(f) ? -EIO : 0;
}

void ms_plan_schema_digest(const struct ms_plan *p, uint64_t d[2]) {
  d[0] = d[1] = MS_SCHEMA_DIGEST_SEED;
  for (int i = 0; i < p->n_classes; i++) d[0] = ms_schema_digest_add(d[0], (size_t)i, p->classes[i].name);
  for (int i = 0; i < p->n_ev_classes; i++) d[1] = ms_schema_digest_add(d[1], (size_t)i, p->ev_classes[i]);
  for (int k = 0; k < 2; k++) d[k] = ms_schema_digest_end(d[k]);
}
