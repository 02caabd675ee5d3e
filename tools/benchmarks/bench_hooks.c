/* SPDX-License-Identifier: MIT */
/* megascope bench hooks: what hooks cost, measured in one process. Decode
 * throughput with hook sites off (the baseline), armed with nothing attached, and
 * with the shipped per-class histogram monitor on task_begin and task_end; rounds
 * (run as JIT-compiled native code, and interpreted); rounds are interleaved so
 * drift hits all four alike. And that monitor's task_end program alone: ns
 * per run through the interpreter and through the JIT, in one process. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/bpf.h"
#include "megascope/bpf_jit.h"
#include "megascope/engine.h"
#include "megascope/hook.h"
#include "megascope/json.h"
#include "megascope/attach.h"


/* The object's task_end program run many times on a synthetic context, its
 * maps instantiated here: ns per run through the interpreter and through the
 * JIT, rounds interleaved (best kept), and the interpreter's instructions per
 * run. Returns 0, or -1 when the program cannot be loaded or run. */
struct prog_cost {
  double interp_ns, jit_ns; /* per run; jit_ns 0 without a JIT */
  uint64_t insns;           /* executed per run */
};

static double ns_per_run(const struct ms_bpf_prog *p, const struct ms_bpf_jit *j, struct ms_bpf_run_opts *ro,
                         struct ms_hook_ctx *ctx, uint64_t *insns) {
  enum { RUNS = 200000 };
  struct ms_bpf_run_result res;
  uint64_t n = 0, t0 = ms_now_ns();
  for (int i = 0; i < RUNS; i++) {
    ctx->t_end = 5000 + (uint64_t)(i & 1023) * 977;
    if (j ? ms_bpf_jit_run(j, ro, &res) : ms_bpf_run(p, ro, &res)) return -1;
    n += res.insns;
  }
  if (insns) *insns = n / RUNS;
  return (double)(ms_now_ns() - t0) / RUNS;
}

static int prog_cost(const char *path, int rounds, struct prog_cost *out) {
  char buf[4096];
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_bpf_object *o = ms_bpf_object_open_file(path, &log);
  if (!o) return -1;
  const struct ms_bpf_prog *p = ms_bpf_object_find_prog(o, "megascope/observe/task_end");
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS] = {0};
  struct ms_bpf_jit *j = NULL;
  size_t nm = ms_bpf_object_map_count(o);
  int rc = -1;
  for (size_t i = 0; i < nm && i < MS_BPF_MAX_MAPS; i++)
    if (!(maps[i] = ms_bpf_map_new(ms_bpf_object_map(o, i), 1, &log))) goto out;
  if (!p) goto out;
  struct ms_hook_ctx ctx = {.abi_version = MS_HOOK_ABI_VERSION, .hook = MS_HOOK_TASK_END, .task_class = 7,
                            .t_begin = 1000, .t_end = 5000};
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = ms_monitor_helpers(), .maps = maps, .n_maps = nm,
                               .ctx = &ctx, .ctx_size = sizeof ctx};
  if (ms_bpf_jit_supported()) {
    struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_HOOK, .prog_type = MS_PROG_OBSERVE,
                                .hook = MS_HOOK_TASK_END, .helpers = ms_monitor_helpers(),
                                .ctx = ms_hook_verify_ctx(MS_PROG_OBSERVE, MS_HOOK_TASK_END)};
    struct ms_bpf_jit_opts jo = {.sz = sizeof jo, .verify = &vo, .helpers = ms_monitor_helpers(), .maps = maps,
                                 .n_maps = nm, .log = &log};
    if (!(j = ms_bpf_jit_new(p, &jo))) goto out;
  }
  *out = (struct prog_cost){0};
  for (int r = 0; r < rounds; r++) {
    double it = ns_per_run(p, NULL, &ro, &ctx, &out->insns), jt = j ? ns_per_run(p, j, &ro, &ctx, NULL) : 0;
    if (it < 0 || jt < 0) goto out;
    if (!r || it < out->interp_ns) out->interp_ns = it;
    if (!r || jt < out->jit_ns) out->jit_ns = jt;
  }
  rc = 0;
out:
  ms_bpf_jit_free(j);
  for (size_t i = 0; i < nm && i < MS_BPF_MAX_MAPS; i++) ms_bpf_map_free(maps[i]);
  ms_bpf_object_free(o);
  return rc;
}

/* Puts the engine in one of the bench's states: 0 hooks off, 1 armed with
 * nothing attached, 2 the monitor attached as native code, 3 interpreted.
 * *id is the current attachment (-1: none). */
static int set_mode(struct ms_engine *e, int mode, const char *mon_path, int *id, int *attached_as,
                    struct ms_textbuf *log) {
  ms_engine_set_hooks_enabled(e, mode != 0);
  int want = mode >= 2 ? mode : -1;
  if (*attached_as == want) return 0;
  if (*id > 0) ms_engine_detach(e, *id);
  *id = -1;
  *attached_as = -1;
  if (want < 0) return 0;
  struct ms_monitor *mon = ms_monitor_open(mon_path, log);
  if (!mon) return -errno;
  struct ms_attach_opts ao = {.sz = sizeof ao, .interpret = mode == 3};
  *id = ms_engine_attach(e, mon, &ao, log);
  if (*id < 0) {
    ms_monitor_free(mon);
    return *id;
  }
  *attached_as = want;
  return 0;
}

struct hooks_args {
  struct cli_model cm;
  const char *monitor;
  long batch, steps, rounds, workers;
  int as_json;
};

#define HA struct hooks_args
static const struct cli_opt hooks_opts[] = {
    CLI_OPT_GROUP(HA, cm, cli_model_opts),
    CLI_OPT_TEXT("                       (default: smollm2-135m, bf16)"),
    CLI_OPT_STR(HA, monitor, "monitor", "PATH", "monitor object (default: monitors/class_time.bpf.o beside the binary)"),
    CLI_OPT_INT(HA, batch, "batch", "N", 1, 4096, "concurrent requests (default 1)"),
    CLI_OPT_INT(HA, steps, "steps", "N", 1, 1 << 20, "tokens per request per round (default 8)"),
    CLI_OPT_INT(HA, rounds, "rounds", "N", 1, 1000, "interleaved rounds (default 3; the best of each is kept)"),
    CLI_OPT_GROUP(HA, workers, cli_workers_opts),
    CLI_OPT_FLAG(HA, as_json, "json", "print the result as JSON"),
    {0}};
#undef HA

static const char hooks_head[] =
    "usage: megascope bench hooks [options]\n\n"
    "Decode throughput with hooks off, armed with nothing attached, and with a\n"
    "monitor attached, JIT-compiled and interpreted (ratios to the hooks-off run), and\n"
    "the monitor's task_end program alone: ns per run, interpreter vs JIT.\n\n";

int bench_hooks(int argc, char **argv) {
  struct hooks_args a = {.cm = {.preset = "smollm2-135m", .dtype = "bf16"}, .batch = 1, .steps = 8, .rounds = 3};
  int prc = cli_parse("bench hooks", hooks_head, hooks_opts, &a, argc, argv, NULL);
  if (prc) return prc > 0 ? 0 : 2;
  struct cli_model cm = a.cm;
  long batch = a.batch, steps = a.steps, rounds = a.rounds, workers = a.workers;
  int as_json = a.as_json;
  char mon_path[PATH_MAX];
  if (a.monitor) snprintf(mon_path, sizeof mon_path, "%s", a.monitor);
  else cli_shipped_monitor("class_time.bpf.o", mon_path, sizeof mon_path);
  if (cm.path) cm.preset = NULL;  /* --model instead of the default preset */
  struct ms_model *m = cli_model_load(&cm);
  if (!m) return 2;
  char buf[16384] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  int rc = 1, id = -1;
  struct ms_monitor *mon = ms_monitor_open(mon_path, &log);
  struct ms_engine_opts eo = {.sz = sizeof eo, .n_workers = (int)workers, .max_batch = (int)batch,
                              .max_ctx = (int)(steps * rounds * 3 + 4)};
  struct ms_engine *e = mon ? ms_engine_new(m, &eo, &log) : NULL;
  if (!e) {
    fprintf(stderr, "megascope bench hooks: %s: %s\n%s", mon ? "engine" : mon_path, ms_strerror(errno), buf);
    goto out;
  }
  static const char *const mode_name[4] = {"hooks off", "armed", "attached (jit)", "attached (interpreter)"};
  double best[4] = {0, 0, 0, 0};
  int attached_as = -1;
  cli_decode_tps(e, m, (int)batch, 2);  /* warm-up */
  for (long r = 0; r < rounds; r++)
    for (int mode = 0; mode < 4; mode++) {
      if (!as_json) fprintf(stderr, "bench hooks: round %ld, %s\n", r + 1, mode_name[mode]);
      int err = set_mode(e, mode, mon_path, &id, &attached_as, &log);
      if (err) {
        fprintf(stderr, "megascope bench hooks: attach %s: %s\n%s", mon_path, ms_strerror(err), buf);
        goto out;
      }
      double tps = cli_decode_tps(e, m, (int)batch, (int)steps);
      if (tps > best[mode]) best[mode] = tps;
    }
  struct ms_coverage cov = {0};
  struct ms_attach_info info[64];
  int n = ms_engine_attach_list(e, info, 64);
  for (int i = 0; i < n; i++) {
    cov.eligible += info[i].cov.eligible;
    cov.executed += info[i].cov.executed;
  }
  struct prog_cost pc = {0};
  if (prog_cost(mon_path, (int)rounds, &pc)) {
    fprintf(stderr, "megascope bench hooks: %s: its task_end program could not be run\n", mon_path);
    goto out;
  }
  if (as_json) {
    struct ms_json j;
    ms_json_init(&j, stdout, 1);
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "model", m->cfg.name);
    ms_json_kstr(&j, "monitor", mon_path);
    ms_json_kint(&j, "batch", batch);
    ms_json_kint(&j, "workers", ms_engine_n_workers(e));
    ms_json_kint(&j, "rounds", rounds);
    ms_json_knum(&j, "off_tokens_per_s", best[0]);
    ms_json_knum(&j, "armed_tokens_per_s", best[1]);
    ms_json_knum(&j, "attached_tokens_per_s", best[2]);
    ms_json_knum(&j, "armed_ratio", best[1] / best[0]);
    ms_json_knum(&j, "attached_ratio", best[2] / best[0]);
    ms_json_knum(&j, "attached_interp_tokens_per_s", best[3]);
    ms_json_knum(&j, "attached_interp_ratio", best[3] / best[0]);
    ms_json_kuint(&j, "attached_program_runs", cov.executed);
    ms_json_kuint(&j, "attached_eligible", cov.eligible);
    ms_json_knum(&j, "interp_ns_per_run", pc.interp_ns);
    ms_json_knum(&j, "interp_ns_per_insn", pc.interp_ns / (double)(pc.insns ? pc.insns : 1));
    ms_json_kuint(&j, "interp_insns_per_run", pc.insns);
    ms_json_knum(&j, "jit_ns_per_run", pc.jit_ns);
    ms_json_knum(&j, "jit_speedup", pc.jit_ns > 0 ? pc.interp_ns / pc.jit_ns : 0);
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else {
    printf("%s, batch %ld, %d workers, best of %ld interleaved rounds\n", m->cfg.name, batch,
           ms_engine_n_workers(e), rounds);
    printf("  hooks off               %9.2f tokens/s\n", best[0]);
    printf("  armed, none             %9.2f tokens/s   ratio %.3f\n", best[1], best[1] / best[0]);
    printf("  attached, JIT           %9.2f tokens/s   ratio %.3f\n", best[2], best[2] / best[0]);
    printf("  attached, interpreter   %9.2f tokens/s   ratio %.3f  (%llu program runs in all)\n", best[3],
           best[3] / best[0], (unsigned long long)cov.executed);
    printf("  task_end program        interpreter %.1f ns per run (%llu instructions, %.2f ns each)\n",
           pc.interp_ns, (unsigned long long)pc.insns, pc.interp_ns / (double)(pc.insns ? pc.insns : 1));
    if (pc.jit_ns > 0)
      printf("                          JIT %.1f ns per run: %.1fx faster\n", pc.jit_ns, pc.interp_ns / pc.jit_ns);
  }
  rc = best[0] > 0 && best[1] > 0 && best[2] > 0 && best[3] > 0 ? 0 : 1;
out:
  ms_monitor_free(mon);
  ms_engine_free(e);
  ms_model_free(m);
  return rc;
}
