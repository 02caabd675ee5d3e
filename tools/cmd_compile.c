/* SPDX-License-Identifier: MIT */
/* megascope compile: compile a decode step into a plan and report it. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "megascope/json.h"
#include "megascope/plan.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: megascope compile --synthetic PRESET [options]\n\n"
          "Compiles one decode step into an SM-level task graph and reports it.\n\n" CLI_MODEL_HELP
          "  --batch N|all        batch bucket (default 1); 'all': every bucket 1..16\n"
          "  --tile-kb K          target weight KiB per GEMV task (default 64)\n"
          "  --tile-rows N        fixed output rows per GEMV task (overrides --tile-kb)\n"
          "  --stats              print the plan statistics (the default output)\n"
          "  --json               print them as JSON\n"
          "  --schema-out FILE    write the task schema (versioned JSON) to FILE\n"
          "  -h, --help           this text\n");
}

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

int cmd_compile(int argc, char **argv) {
  static const struct option opts[] = {
      {"synthetic", required_argument, 0, 0}, {"dtype", required_argument, 0, 0},
      {"model-seed", required_argument, 0, 0}, {"batch", required_argument, 0, 0},
      {"tile-kb", required_argument, 0, 0},   {"stats", no_argument, 0, 0},
      {"tile-rows", required_argument, 0, 0},
      {"json", no_argument, 0, 0},            {"schema-out", required_argument, 0, 0},
      {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
  struct cli_model cm = {0};
  long batch = 1, tile_kb = 64, tile_rows = 0;
  int all = 0, as_json = 0;
  const char *schema_out = NULL;
  int c, idx;
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
    if (!strcmp(n, "batch")) {
      if (!strcmp(optarg, "all")) all = 1;
      else if (cli_int("--batch", optarg, 1, 4096, &batch)) return 2;
    } else if (!strcmp(n, "tile-kb")) {
      if (cli_int("--tile-kb", optarg, 1, 1 << 20, &tile_kb)) return 2;
    } else if (!strcmp(n, "tile-rows")) {
      if (cli_int("--tile-rows", optarg, 1, 1 << 20, &tile_rows)) return 2;
    } else if (!strcmp(n, "json")) {
      as_json = 1;
    } else if (!strcmp(n, "schema-out")) {
      schema_out = optarg;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "megascope compile: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
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
    struct ms_compile_opts co = {.sz = sizeof co, .batch = b, .tile_bytes = (int)tile_kb * 1024,
                                 .tile_rows = (int)tile_rows};
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
