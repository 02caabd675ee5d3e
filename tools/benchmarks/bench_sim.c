/* SPDX-License-Identifier: MIT */
/* megascope bench sim: the simulator's calibration against published figures,
 * and the megakernel against the per-op baseline, in simulated time. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/engine.h"
#include "megascope/json.h"


struct sim_case {
  const char *model, *gpu, *published;
};

static const struct sim_case cases[] = {
    {"qwen3-8b", "a100", "MPK: 12.5 ms/token; bound about 10 ms"},
    {"llama-3.2-1b", "h100", "HazyResearch: under 1 ms/token, 78% of bandwidth"},
    {"llama-3.2-1b", "b200", "HazyResearch: under 1 ms/token"},
};

/* The options (one run per process: the overrides are read by preset()). */
static struct sim_args {
  long steps;
  int as_json, n_ov;
  const char *ov[16];
} args = {.steps = 8};

#define SA struct sim_args
static const struct cli_opt sim_opts[] = {
    CLI_OPT_INT(SA, steps, "steps", "N", 1, 4096, "tokens per run (default 8)"),
    CLI_OPT_LIST(SA, ov, n_ov, "sim-param", "K=V",
                 "override a cost-model parameter of every preset (repeatable)"),
    CLI_OPT_FLAG(SA, as_json, "json", "print the result as JSON"),
    {0}};
#undef SA

static const char sim_head[] =
    "usage: megascope bench sim [--steps N] [--json]\n\n"
    "Simulates published configurations (shapes only, bf16 weights) on the virtual\n"
    "GPU and reports ms per token for the megakernel and the per-op baseline beside\n"
    "the bandwidth bound and the published figures:\n"
    "  qwen3-8b on a100, batch 1      (MPK: 12.5 ms per token, bound about 10 ms)\n"
    "  llama-3.2-1b on h100, batch 1  (HazyResearch: under 1 ms, 78% of bandwidth)\n"
    "  llama-3.2-1b on b200, batch 1\n\n";

/* A preset with the --sim-param overrides; -1 (printed) on a bad one. */
static int preset(const char *gpu, struct ms_sim_params *p) {
  ms_sim_preset(gpu, p);
  for (int i = 0; i < args.n_ov; i++) {
    char k[64];
    const char *eq = strchr(args.ov[i], '=');
    snprintf(k, sizeof k, "%.*s", eq ? (int)(eq - args.ov[i]) : 0, args.ov[i]);
    if (!eq || ms_sim_param_set(p, k, eq + 1)) {
      fprintf(stderr, "megascope bench sim: --sim-param '%s': expected NAME=VALUE with a cost-model parameter\n",
              args.ov[i]);
      return -1;
    }
  }
  return 0;
}

/* Simulated ns per decode step for one request of `steps` tokens. */
static double sim_step_ns(const struct ms_model *m, const char *gpu, enum ms_mode mode, int steps, int *tasks) {
  char buf[2048] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_engine_opts o = {.sz = sizeof o, .mode = mode, .max_batch = 1, .max_ctx = steps + 2,
                             .backend = MS_BACKEND_SIM};
  if (preset(gpu, &o.sim)) return -1;
  struct ms_engine *e = ms_engine_new(m, &o, &log);
  if (!e) {
    fprintf(stderr, "megascope bench sim: %s", buf);
    return -1;
  }
  struct ms_plan_stats ps;
  ms_plan_get_stats(ms_engine_plan(e, 1), &ps);
  *tasks = ps.tasks;
  int32_t tok = 1;
  struct ms_request_opts ro = {.sz = sizeof ro, .prompt = &tok, .n_prompt = 1, .max_new_tokens = steps};
  struct ms_request *r = ms_engine_submit(e, &ro);
  ms_request_wait(r, -1);
  struct ms_engine_stats st;
  ms_engine_get_stats(e, &st);
  double ns = (double)ms_engine_sim_now(e) / (double)(st.steps ? st.steps : 1);
  ms_request_free(r);
  ms_engine_free(e);
  return ns;
}

int bench_sim(int argc, char **argv) {
  int prc = cli_parse("bench sim", sim_head, sim_opts, &args, argc, argv, NULL);
  if (prc) return prc > 0 ? 0 : 2;
  long steps = args.steps;
  int as_json = args.as_json;
  struct ms_json j;
  ms_json_init(&j, stdout, 1);
  if (as_json) {
    ms_json_obj_begin(&j);
    ms_json_key(&j, "cases");
    ms_json_arr_begin(&j);
  }
  int rc = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct cli_model cm = {.preset = cases[i].model, .dtype = "bf16", .shape_only = 1};
    struct ms_model *m = cli_model_load(&cm);
    struct ms_sim_params sp;
    if (preset(cases[i].gpu, &sp)) return 2;
    if (!m) return 2;
    if (!as_json) fprintf(stderr, "bench sim: %s on %s...\n", cases[i].model, cases[i].gpu);
    int tasks = 0;
    double mk = sim_step_ns(m, cases[i].gpu, MS_MODE_MEGAKERNEL, (int)steps, &tasks);
    double po = sim_step_ns(m, cases[i].gpu, MS_MODE_PER_OP, (int)steps, &tasks);
    double bound = (double)ms_model_weight_bytes(m) / sp.hbm_gbps;  /* ns */
    if (mk <= 0 || po <= 0) rc = 1;
    if (as_json) {
      ms_json_obj_begin(&j);
      ms_json_kstr(&j, "model", cases[i].model);
      ms_json_kstr(&j, "gpu", cases[i].gpu);
      ms_json_kint(&j, "sms", sp.n_sms);
      ms_json_kint(&j, "tasks", tasks);
      ms_json_kuint(&j, "weight_bytes", ms_model_weight_bytes(m));
      ms_json_knum(&j, "megakernel_ms_per_token", mk / 1e6);
      ms_json_knum(&j, "per_op_ms_per_token", po / 1e6);
      ms_json_knum(&j, "megakernel_vs_per_op_speedup", po / mk);
      ms_json_knum(&j, "bandwidth_bound_ms", bound / 1e6);
      ms_json_knum(&j, "fraction_of_bandwidth", bound / mk);
      ms_json_kstr(&j, "published", cases[i].published);
      ms_json_obj_end(&j);
    } else {
      printf("%-13s %-5s %6d tasks: megakernel %7.3f ms/token (%4.1f%% of bandwidth), per-op %7.3f ms "
             "(%.2fx), bound %6.3f ms | published: %s\n",
             cases[i].model, cases[i].gpu, tasks, mk / 1e6, 100 * bound / mk, po / 1e6, po / mk, bound / 1e6,
             cases[i].published);
    }
    ms_model_free(m);
  }
  if (as_json) {
    ms_json_arr_end(&j);
    ms_json_obj_end(&j);
    ms_json_end(&j);
  }
  return rc;
}
