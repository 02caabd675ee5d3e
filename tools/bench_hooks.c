/* SPDX-License-Identifier: MIT */
/* megascope bench hooks: what hooks cost, measured in one process. Decode
 * throughput with hook sites off (the baseline), armed with nothing attached, and
 * with the shipped per-class histogram monitor on task_begin and task_end; rounds
 * are interleaved so drift hits all three alike. And the interpreter's cost per
 * executed instruction, on that monitor's task_end program. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "megascope/bpf.h"
#include "megascope/engine.h"
#include "megascope/hook.h"
#include "megascope/json.h"
#include "megascope/monitor.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: megascope bench hooks [options]\n\n"
          "Decode throughput with hooks off, armed with nothing attached, and with a\n"
          "monitor attached (ratios to the hooks-off run), and the interpreter's ns per\n"
          "executed eBPF instruction.\n\n" CLI_MODEL_HELP
          "                       (default: smollm2-135m, bf16)\n"
          "  --monitor PATH       monitor object (default: monitors/class_time.bpf.o beside the binary)\n"
          "  --batch N            concurrent requests (default 1)\n"
          "  --steps N            tokens per request per round (default 8)\n"
          "  --rounds N           interleaved rounds (default 3; the best of each is kept)\n"
          "  --workers N          worker threads (default: one per core)\n"
          "  --json               print the result as JSON\n"
          "  -h, --help           this text\n");
}

/* ns per instruction of the object's task_end program, over many runs on a
 * synthetic context, its maps instantiated here. */
static double interp_ns_per_insn(const char *path, uint64_t *insns_per_run) {
  char buf[4096];
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_bpf_object *o = ms_bpf_object_open_file(path, &log);
  if (!o) return -1;
  const struct ms_bpf_prog *p = ms_bpf_object_find_prog(o, "megascope/observe/task_end");
  struct ms_bpf_map *maps[MS_BPF_MAX_MAPS] = {0};
  size_t nm = ms_bpf_object_map_count(o);
  double ns = -1;
  for (size_t i = 0; i < nm && i < MS_BPF_MAX_MAPS; i++)
    if (!(maps[i] = ms_bpf_map_new(ms_bpf_object_map(o, i), 1, &log))) goto out;
  if (!p) goto out;
  struct ms_hook_ctx ctx = {.abi_version = MS_HOOK_ABI_VERSION, .hook = MS_HOOK_TASK_END, .task_class = 7,
                            .t_begin = 1000, .t_end = 5000};
  struct ms_bpf_run_opts ro = {.sz = sizeof ro, .helpers = ms_monitor_helpers(), .maps = maps, .n_maps = nm,
                               .ctx = &ctx, .ctx_size = sizeof ctx};
  struct ms_bpf_run_result res;
  const int runs = 200000;
  uint64_t insns = 0, t0 = ms_now_ns();
  for (int i = 0; i < runs; i++) {
    ctx.t_end = 5000 + (uint64_t)(i & 1023) * 977;
    if (ms_bpf_run(p, &ro, &res)) goto out;
    insns += res.insns;
  }
  ns = (double)(ms_now_ns() - t0) / (double)insns;
  *insns_per_run = insns / runs;
out:
  for (size_t i = 0; i < nm && i < MS_BPF_MAX_MAPS; i++) ms_bpf_map_free(maps[i]);
  ms_bpf_object_free(o);
  return ns;
}

int bench_hooks(int argc, char **argv) {
  static const struct option opts[] = {
      {"synthetic", required_argument, 0, 0}, {"dtype", required_argument, 0, 0},
      {"model-seed", required_argument, 0, 0}, {"monitor", required_argument, 0, 0},
      {"batch", required_argument, 0, 0},     {"steps", required_argument, 0, 0},
      {"rounds", required_argument, 0, 0},    {"workers", required_argument, 0, 0},
      {"json", no_argument, 0, 0},            {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  struct cli_model cm = {.preset = "smollm2-135m", .dtype = "bf16"};
  long batch = 1, steps = 8, rounds = 3, workers = 0;
  int as_json = 0, c, idx;
  char mon_path[PATH_MAX];
  cli_shipped_monitor("class_time.bpf.o", mon_path, sizeof mon_path);
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
    if (c == 'h') {
      usage(stdout);
      return 0;
    }
    if (c != 0) {
      usage(stderr);
      return 2;
    }
    const char *n = opts[idx].name;
    int r = cli_model_opt(&cm, n, optarg);
    if (r < 0) return 2;
    if (r) continue;
    if (!strcmp(n, "monitor")) snprintf(mon_path, sizeof mon_path, "%s", optarg);
    else if (!strcmp(n, "batch")) r = cli_int("--batch", optarg, 1, 4096, &batch);
    else if (!strcmp(n, "steps")) r = cli_int("--steps", optarg, 1, 1 << 20, &steps);
    else if (!strcmp(n, "rounds")) r = cli_int("--rounds", optarg, 1, 1000, &rounds);
    else if (!strcmp(n, "workers")) r = cli_int("--workers", optarg, 1, 1024, &workers);
    else if (!strcmp(n, "json")) as_json = 1;
    if (r) return 2;
  }
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
  double best[3] = {0, 0, 0};
  cli_decode_tps(e, m, (int)batch, 2);  /* warm-up */
  for (long r = 0; r < rounds; r++)
    for (int mode = 0; mode < 3; mode++) {
      if (!as_json) fprintf(stderr, "bench hooks: round %ld, %s\n", r + 1, mode == 0 ? "hooks off" : mode == 1 ? "armed" : "attached");
      ms_engine_set_hooks_enabled(e, mode != 0);
      if (mode == 2 && id < 0) {
        id = ms_engine_attach(e, mon, NULL, &log);
        if (id < 0) {
          fprintf(stderr, "megascope bench hooks: attach: %s\n%s", ms_strerror(id), buf);
          goto out;
        }
        mon = NULL;
      }
      if (mode == 1 && id > 0) {
        ms_engine_detach(e, id);  /* armed, nothing attached */
        id = -1;
        mon = ms_monitor_open(mon_path, &log);
        if (!mon) goto out;
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
  uint64_t ipr = 0;
  double nspi = interp_ns_per_insn(mon_path, &ipr);
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
    ms_json_kuint(&j, "attached_program_runs", cov.executed);
    ms_json_kuint(&j, "attached_eligible", cov.eligible);
    ms_json_knum(&j, "interp_ns_per_insn", nspi);
    ms_json_kuint(&j, "interp_insns_per_run", ipr);
    ms_json_obj_end(&j);
    ms_json_end(&j);
  } else {
    printf("%s, batch %ld, %d workers, best of %ld interleaved rounds\n", m->cfg.name, batch,
           ms_engine_n_workers(e), rounds);
    printf("  hooks off          %9.2f tokens/s\n", best[0]);
    printf("  armed, none        %9.2f tokens/s   ratio %.3f\n", best[1], best[1] / best[0]);
    printf("  monitor attached   %9.2f tokens/s   ratio %.3f  (%llu program runs)\n", best[2], best[2] / best[0],
           (unsigned long long)cov.executed);
    printf("  interpreter        %9.2f ns per instruction (%llu instructions per run)\n", nspi,
           (unsigned long long)ipr);
  }
  rc = best[0] > 0 && best[1] > 0 && best[2] > 0 && nspi > 0 ? 0 : 1;
out:
  ms_monitor_free(mon);
  ms_engine_free(e);
  ms_model_free(m);
  return rc;
}
