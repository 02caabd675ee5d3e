/* SPDX-License-Identifier: MIT */
/* megascope compile: compile a decode step into a plan and report it. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "opt.h"
#include "megascope/json.h"
#include "megascope/plan.h"


static void print_stats(struct ms_json *j, const char *model, const struct ms_plan *p, int as_json) {
  struct ms_plan_stats s;
  ms_plan_get_stats(p, &s);
  if (!as_json) {
    printf("batch %d: %d tasks (%d AOT, %d JIT, %d empty), %d events, %d task classes, %d event classes\n",
           ms_plan_batch(p), s.tasks, s.aot_tasks, s.jit_tasks, s.empty_tasks, s.events, s.task_classes,
           s.event_classes);
    printf("  edges: %lld pairwise, %lld after transitive reduction, %lld fused (%.1fx fewer than pairwise)\n",
           (long long)s.pairwise_edges, (long long)s.reduced_edges, (long long)s.fused_edges,
           s.fused_edges ? (double)s.pairwise_edges / (double)s.fused_edges : 0.0);
    printf("  metadata %zu bytes; largest event: %d triggers, %d successors; compiled in %.1f ms\n",
           s.metadata_bytes, s.max_event_triggers, s.max_event_successors, s.compile_ms);
    return;
  }
  ms_json_obj_begin(j);
  ms_json_kstr(j, "model", model);
  ms_json_kint(j, "batch", ms_plan_batch(p));
  ms_json_kint(j, "tasks", s.tasks);
  ms_json_kint(j, "aot_tasks", s.aot_tasks);
  ms_json_kint(j, "jit_tasks", s.jit_tasks);
  ms_json_kint(j, "empty_tasks", s.empty_tasks);
  ms_json_kint(j, "events", s.events);
  ms_json_kint(j, "task_classes", s.task_classes);
  ms_json_kint(j, "event_classes", s.event_classes);
  ms_json_kint(j, "pairwise_edges", s.pairwise_edges);
  ms_json_kint(j, "reduced_edges", s.reduced_edges);
  ms_json_kint(j, "fused_edges", s.fused_edges);
  ms_json_kint(j, "max_event_triggers", s.max_event_triggers);
  ms_json_kint(j, "max_event_successors", s.max_event_successors);
  ms_json_kuint(j, "metadata_bytes", s.metadata_bytes);
  ms_json_knum(j, "compile_ms", s.compile_ms);
  ms_json_obj_end(j);
}

struct compile_args {
  struct cli_model cm;
  struct cli_backend be;  /* backend -1: none named */
  long batch, tile_kb, tile_rows, attn_parts;
  int all, as_json, stats;
  const char *schema_out;
};

static int batch_opt(void *dst, const char *arg) {
  struct compile_args *a = dst;
  if (!strcmp(arg, "all")) return a->all = 1, 0;
  return cli_int("--batch", arg, 1, 4096, &a->batch);
}

#define CA struct compile_args
static const struct cli_opt compile_opts[] = {
    CLI_OPT_GROUP(CA, cm, cli_model_opts),
    CLI_OPT_FN("batch", "N|all", batch_opt, "batch bucket (default 1); 'all': every bucket 1..16"),
    CLI_OPT_INT(CA, tile_kb, "tile-kb", "K", 1, 1 << 20,
                "target weight KiB per GEMV task (default 64, or the --backend's)"),
    CLI_OPT_INT(CA, tile_rows, "tile-rows", "N", 1, 1 << 20, "fixed output rows per GEMV task (overrides --tile-kb)"),
    CLI_OPT_INT(CA, attn_parts, "attn-parts", "N", 1, MS_ATTN_MAX_PARTS,
                "each row's attention over a KV group in N tasks over shares of\n"
                "its positions (default 1, or the --backend's: 2 on the CPU)"),
    CLI_OPT_GROUP(CA, be, cli_backend_opts),
    CLI_OPT_FLAG(CA, stats, "stats", "print the plan statistics (the default output)"),
    CLI_OPT_FLAG(CA, as_json, "json", "print them as JSON"),
    CLI_OPT_STR(CA, schema_out, "schema-out", "FILE", "write the task schema (versioned JSON) to FILE"),
    {0}};
#undef CA

static const char compile_head[] =
    "usage: megascope compile (--synthetic PRESET | --model F.gguf) [options]\n\n"
    "Compiles one decode step into an SM-level task graph and reports it. With --backend,\n"
    "tiled as an engine on that backend tiles it when its caller does not: the CPU's\n"
    "tasks by weight bytes, its norms computed inside the operators that read them (`run`\n"
    "on the CPU executes this plan), the simulator's and CUDA's about one task per SM an\n"
    "operator (--sms N says how many; the simulator's default GPU, h100's 132, unless given).\n\n";

/* The tiling of an engine on backend be, which a caller that tiles nothing
 * gets (ms_backend_info): its task bytes, or one task per SM an operator. 0,
 * or 2 with the reason on stderr. */
static int backend_tiling(const struct cli_backend *be, struct ms_compile_opts *co) {
  const struct ms_backend_info *info = ms_backend_info((enum ms_backend)be->backend);
  if (!info) return 2;
  if (info->tiles_per_worker) {
    long sms = be->sms;
    if (!sms && be->backend == MS_BACKEND_SIM) {  /* the simulator's default GPU, as `run --backend sim` */
      struct ms_sim_params sp;
      if (!ms_sim_preset(MS_SIM_DEFAULT_GPU, &sp)) sms = sp.n_sms;
    }
    if (!sms) {  /* CUDA: how many SMs is the device's to say */
      fprintf(stderr, "megascope compile: --backend %s tiles about one task per SM an operator: give --sms N\n",
              info->name);
      return 2;
    }
    co->tiles_per_op = (int)sms;
  } else if (info->tile_bytes) {
    ms_backend_plan_tiling(info, co);
  }
  return 0;
}

int cmd_compile(int argc, char **argv) {
  struct compile_args a = {.batch = 1, .be = {.backend = -1}};
  int prc = cli_parse("compile", compile_head, compile_opts, &a, argc, argv, NULL);
  if (prc) return prc > 0 ? 0 : 2;
  struct cli_model cm = a.cm;
  long batch = a.batch, tile_kb = a.tile_kb, tile_rows = a.tile_rows;
  int all = a.all, as_json = a.as_json;
  const char *schema_out = a.schema_out;
  struct ms_compile_opts tiling = {.tile_bytes = 64 * 1024};
  const struct ms_backend_info *bi = a.be.backend >= 0 ? ms_backend_info((enum ms_backend)a.be.backend) : NULL;
  if (a.be.sms && (!bi || !bi->tiles_per_worker)) {
    fprintf(stderr, "megascope compile: --sms is the SMs of --backend sim or cuda%s\n",
            bi ? ", not of this one" : ": name the backend");
    return 2;
  }
  if (a.be.backend >= 0 && !tile_kb && !tile_rows && backend_tiling(&a.be, &tiling)) return 2;
  if (bi) tiling.attn_parts = bi->attn_parts;  /* whatever the tiling, as the engine */
  if (a.attn_parts) tiling.attn_parts = (int)a.attn_parts;
  if (tile_kb) tiling.tile_bytes = (int)tile_kb * 1024;
  struct ms_model *m = cli_model_load(&cm);
  if (!m) return 2;
  int rc = 1;
  struct ms_json j;
  ms_json_init(&j, stdout, 1);
  if (as_json && all) {
    ms_json_obj_begin(&j);
    ms_json_kstr(&j, "model", m->cfg.name);
    ms_json_key(&j, "buckets");
    ms_json_arr_begin(&j);
  }
  for (int b = all ? 1 : (int)batch; b <= (all ? 16 : (int)batch); b *= 2) {
    char logbuf[1024] = "";
    struct ms_textbuf log = {logbuf, sizeof logbuf, 0, 0};
    struct ms_compile_opts co = {.sz = sizeof co, .batch = b, .tile_bytes = tiling.tile_bytes,
                                 .tile_rows = (int)tile_rows, .tiles_per_op = tiling.tiles_per_op,
                                 .min_tiles = tiling.min_tiles, .fuse_norm = tiling.fuse_norm,
                                 .attn_parts = tiling.attn_parts};
    struct ms_plan *p = ms_plan_compile(m, &co, &log);
    if (!p) {
      fprintf(stderr, "megascope compile: %s", logbuf[0] ? logbuf : "failed\n");
      goto out;
    }
    print_stats(&j, m->cfg.name, p, as_json);
    if (schema_out && b == (all ? 1 : (int)batch)) {
      FILE *f = fopen(schema_out, "w");
      if (!f || ms_plan_write_schema(p, f, 1) || fclose(f)) {
        fprintf(stderr, "megascope compile: cannot write schema to %s\n", schema_out);
        ms_plan_free(p);
        goto out;
      }
    }
    ms_plan_free(p);
    if (!all) break;
  }
  if (as_json && all) {
    ms_json_arr_end(&j);
    ms_json_obj_end(&j);
  }
  if (as_json) ms_json_end(&j);
  rc = 0;
out:
  ms_model_free(m);
  return rc;
}
