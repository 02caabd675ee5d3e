/* SPDX-License-Identifier: MIT */
/* megascope bench diagnose: the counterexample benchmark. Injects scheduler
 * faults with known root causes (scenario files), observes each run five ways
 * under one telemetry byte budget each, lets each way's diagnoser name the
 * cause and the culprit, and scores them (docs/benchmark.md). */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli.h"
#include "common.h"
#include "opt.h"


static void progress(void *user, const char *msg) {
  (void)user;
  fprintf(stderr, "bench diagnose: %s\n", msg);
}

static int parse_bytes(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v <= 0) return -1;
  if (*end == 'k' || *end == 'K') v *= 1024, end++;
  else if (*end == 'm' || *end == 'M') v *= 1 << 20, end++;
  if (*end || v > (double)(1ull << 40)) return -1;
  *out = (uint64_t)v;
  return 0;
}

static int parse_budgets(const char *s, struct bench_opts *o) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", s);
  o->n_budgets = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (o->n_budgets == BENCH_MAX_BUDGETS || parse_bytes(t, &o->budgets[o->n_budgets])) return -1;
    o->n_budgets++;
  }
  return o->n_budgets ? 0 : -1;
}

/* monitors/ beside the binary (build/megascope -> build/monitors), else $MS_MONITORS. */
static void default_monitors(char *dir, size_t n) {
  const char *env = getenv("MS_MONITORS");
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    snprintf(dir, n, "%s/monitors", dirname(exe));
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/diag_semantic.bpf.o", dir);
    if (!access(probe, R_OK)) return;
  }
  snprintf(dir, n, "%s", env ? env : "build/monitors");
}

static int plot(const struct bench_report *r, const char *png) {
  char dat[PATH_MAX], gp[PATH_MAX], cmd[PATH_MAX + 32];
  snprintf(dat, sizeof dat, "%s.dat", png);
  snprintf(gp, sizeof gp, "%s.gp", png);
  int rc = bench_report_plot(r, dat, gp, png);
  if (rc) {
    fprintf(stderr, "megascope bench diagnose: --plot %s: %s\n", png, ms_strerror(rc));
    return 1;
  }
  snprintf(cmd, sizeof cmd, "gnuplot '%s'", gp);
  if (system(cmd)) {
    fprintf(stderr, "megascope bench diagnose: gnuplot failed or is missing (Debian: gnuplot-nox); data in %s, script in %s\n",
            dat, gp);
    return 1;
  }
  fprintf(stderr, "bench diagnose: plot %s\n", png);
  return 0;
}

struct args {
  const char *scenarios, *heldout, *write, *out, *png, *monitors, *budgets, *headline, *record, *replay;
  long generate, tp;
  uint64_t seed;
  enum ms_backend backend;
  int run, as_json, quiet;
};

/* by enum ms_backend */
static const char *const backend_names[] = {"cpu", "sim", "cuda", NULL};

#define DA struct args
static const struct cli_opt diag_opts[] = {
    CLI_OPT_STR(DA, scenarios, "scenarios", "FILE",
                "the scenarios: a JSON array (docs/benchmark.md); the training\n"
                "split when --heldout is given"),
    CLI_OPT_STR(DA, heldout, "heldout", "FILE",
                "the held-out split (scenarios never used while tuning the\n"
                "diagnosers): scored apart and reported beside the training split;\n"
                "with --replay, a directory of the held-out split's records"),
    CLI_OPT_INT(DA, generate, "generate", "N", 1, 1000,
                "N scenarios of every fault type and N healthy ones, with\n"
                "configurations and seeds drawn from --seed; culprits and\n"
                "magnitudes are left to each scenario's seed. Written to\n"
                "--write-scenarios (default stdout) unless --run"),
    CLI_OPT_U64(DA, seed, "seed", "S", "the generator's seed (default 1)"),
    CLI_OPT_CHOICE(DA, backend, "backend", "B", backend_names,
                   "generated scenarios' backend: sim (default), cpu or cuda\n"
                   "(cuda: the fault types the device injects)"),
    CLI_OPT_STR(DA, write, "write-scenarios", "F", "write the scenarios to F"),
    CLI_OPT_FLAG(DA, run, "run", "with --generate: run them too"),
    CLI_OPT_STR(DA, budgets, "budgets", "LIST",
                "telemetry bytes per scenario and method, e.g. 1k,4k,16k\n"
                "(default 1k,4k,16k,64k,256k,1m)"),
    CLI_OPT_STR(DA, headline, "headline", "B", "the budget the summary table uses (default 16k)"),
    CLI_OPT_STR(DA, monitors, "monitors", "DIR", "the compiled diag_*.bpf.o (default: monitors/ beside the binary)"),
    CLI_OPT_FLAG(DA, as_json, "json", "print the JSON report on stdout"),
    CLI_OPT_STR(DA, out, "out", "FILE", "write the JSON report to FILE"),
    CLI_OPT_STR(DA, png, "plot", "PNG",
                "plot accuracy against telemetry bytes with gnuplot (writes\n"
                "PNG.dat and PNG.gp beside it)"),
    CLI_OPT_STR(DA, record, "record", "DIR",
                "keep every scenario's evidence in DIR (case-NNNN.rec: what each\n"
                "diagnoser was given), to be judged again with --replay"),
    CLI_OPT_STR(DA, replay, "replay", "DIR",
                "judge DIR's records with this build's diagnosers instead of\n"
                "running (at the budgets recorded, or those of them --budgets names;\n"
                "a record is read only by a build of the same layout)"),
    CLI_OPT_INT(DA, tp, "tp", "N", 1, 64,
                "across ranks: under mpirun -np N, every rank runs the scenarios\n"
                "(cpu, \"tp\": N) in lockstep as one engine of N devices; rank 0\n"
                "measures, merges every rank's evidence and judges it"),
    CLI_OPT_FLAG(DA, quiet, "quiet", "no progress lines"),
    {0}};
#undef DA

static const char diag_head[] =
    "usage: megascope bench diagnose --scenarios FILE [options]\n"
    "       megascope bench diagnose --generate N [--seed S] [--backend B] [--write-scenarios F] [--run]\n"
    "       megascope bench diagnose --replay DIR [options]\n\n"
    "Runs scenarios with an injected scheduler fault (slow_class, routing_skew,\n"
    "delayed_release, queue_saturation, comm_delay, starve_task, slow_request, and the\n"
    "open-ended slow_worker, bandwidth_steal, slow_layer, late_admission that no\n"
    "diagnoser was written for; or none), each tuned so the whole run stays within its\n"
    "target (5%) of the healthy run, and asks six ways of observing, each under one\n"
    "telemetry byte budget, to name the scope (class, event class, request, worker,\n"
    "device, expert, layer) and the cause: kernel_timing, pc_sampling, task_trace,\n"
    "sampled_events, semantic_monitors, task_profiler. \"unknown cause, scope X\" is a\n"
    "valid answer. A fault whose tuned magnitude has no measurable effect is counted and\n"
    "not scored. Prints per split a table, scope by budget, by fault and a reliability\n"
    "table (stderr with --json).\n"
    "Across ranks: mpirun -np N megascope bench diagnose --tp N --scenarios FILE.\n\n";

/* 0: parsed; 1: --help printed; 2: a usage error, printed. */
static int parse_args(int argc, char **argv, struct args *a) {
  int rc = cli_parse("bench diagnose", diag_head, diag_opts, a, argc, argv, NULL);
  if (rc) return rc > 0 ? 1 : 2;
  if (!!a->scenarios + !!a->generate + !!a->replay != 1 || (a->replay && a->record)) {
    fprintf(stderr, "megascope bench diagnose: give --scenarios FILE, --generate N or --replay DIR\n"
                    "(try 'megascope bench diagnose --help')\n");
    return 2;
  }
  if (a->tp > 1 && !a->scenarios) {
    fprintf(stderr, "megascope bench diagnose: --tp %ld runs --scenarios across ranks (a replay is judged in one "
            "process)\n", a->tp);
    return 2;
  }
  if (a->tp > 1 && cli_dist_ranks() == 1) {
    fprintf(stderr, "megascope bench diagnose: --tp %ld is %ld processes: start it as `mpirun -np %ld megascope bench "
            "diagnose --tp %ld ...`\n", a->tp, a->tp, a->tp, a->tp);
    return 2;
  }
  return 0;
}

/* Across ranks every scenario is one engine of --tp devices on the cpu
 * backend: the others are refused by name. 0 or 2. */
static int check_ranks(const struct args *a, const struct bench_scenario *sc, int n) {
  for (int i = 0; a->tp > 1 && i < n; i++) {
    if (sc[i].backend != MS_BACKEND_CPU || sc[i].tp != a->tp) {
      fprintf(stderr, "megascope bench diagnose: --tp %ld: scenario %s runs %s with \"tp\" %d; across ranks every "
              "scenario runs on the cpu backend with \"tp\": %ld\n", a->tp, sc[i].name,
              ms_backend_name(sc[i].backend), sc[i].tp, a->tp);
      return 2;
    }
  }
  return 0;
}

static int write_scenarios(const char *path, const struct bench_scenario *s, int n) {
  FILE *f = path ? fopen(path, "w") : stdout;
  if (!f) {
    fprintf(stderr, "megascope bench diagnose: %s: %s\n", path, strerror(errno));
    return 1;
  }
  int rc = bench_scenarios_write(f, s, n);
  if (path && fclose(f)) rc = -EIO;
  return rc ? 1 : 0;
}

/* Runs the scenarios (across ranks: on every rank, rank 0 reporting) and
 * prints the report. */
static int run_and_report(const struct args *a, struct bench_opts *o, struct bench_scenario *sc, int n) {
  int lead = !o->tx || o->tx->rank == 0, rc = 0;
  if (!lead) o->progress = NULL;
  struct bench_report r;
  rc = bench_run(o, sc, n, &r);
  if (rc) {
    fprintf(stderr, "megascope bench diagnose: %s\n", ms_strerror(rc));
    return 1;
  }
  if (!lead) {  /* a follower: rank 0 judged and reports */
    bench_report_free(&r);
    return 0;
  }
  bench_report_text(&r, a->as_json ? stderr : stdout);
  if (a->as_json) bench_report_json(&r, stdout);
  if (a->out) {
    FILE *f = fopen(a->out, "w");
    if (!f || bench_report_json(&r, f) || fclose(f)) {
      fprintf(stderr, "megascope bench diagnose: --out %s: %s\n", a->out, strerror(errno));
      rc = 1;
    }
  }
  if (a->png && plot(&r, a->png)) rc = 1;
  int failed = 0;
  for (int i = 0; i < r.n; i++)
    if (r.cases[i].error[0]) {
      failed++;
      fprintf(stderr, "megascope bench diagnose: %s: %s%s", r.cases[i].sc.name, r.cases[i].error,
              r.cases[i].error[strlen(r.cases[i].error) - 1] == '\n' ? "" : "\n");
    }
  if (failed) {
    fprintf(stderr, "megascope bench diagnose: %d of %d scenarios could not run\n", failed, r.n);
    rc = 1;
  }
  bench_report_free(&r);
  return rc;
}

int bench_diagnose_main(int argc, char **argv) {
  struct args a = {.seed = 1, .backend = MS_BACKEND_SIM, .tp = 1};
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc == 1 ? 0 : rc;
  struct bench_opts o = {.exec_ns = 200, .record_ns = 20, .ring_ns = 100};
  char mondir[PATH_MAX];
  if (parse_budgets(a.budgets ? a.budgets : "1k,4k,16k,64k,256k,1m", &o)) {
    fprintf(stderr, "megascope bench diagnose: --budgets '%s': expected byte counts like 1k,4k,16k (at most %d)\n",
            a.budgets, BENCH_MAX_BUDGETS);
    return 2;
  }
  if (a.replay && !a.budgets && bench_replay_budgets(a.replay, &o)) {
    fprintf(stderr, "megascope bench diagnose: --replay %s: no records (case-NNNN.rec) it can read there\n", a.replay);
    return 2;
  }
  uint64_t head = 16 << 10;
  if (a.headline && parse_bytes(a.headline, &head)) {
    fprintf(stderr, "megascope bench diagnose: --headline '%s': expected a byte count\n", a.headline);
    return 2;
  }
  for (int b = 0; b < o.n_budgets; b++)
    if (o.budgets[b] <= head) o.headline = b;
  if (a.monitors)
    snprintf(mondir, sizeof mondir, "%s", a.monitors);
  else
    default_monitors(mondir, sizeof mondir);
  o.monitors = mondir;
  if (!a.quiet) o.progress = progress;

  if (a.record && mkdir(a.record, 0755) && errno != EEXIST) {
    fprintf(stderr, "megascope bench diagnose: --record %s: %s\n", a.record, strerror(errno));
    return 2;
  }
  o.record = a.record;
  o.replay = a.replay;
  struct bench_scenario *sc = NULL;
  int n = 0;
  char buf[8192] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  if (a.replay) {
    if ((n = bench_replay_count(a.replay)) <= 0) {
      fprintf(stderr, "megascope bench diagnose: --replay %s: %s\n", a.replay,
              n ? ms_strerror(n) : "no records (case-NNNN.rec) there");
      return 2;
    }
    o.replay_n = n;
    if (a.heldout) {  /* the held-out split's records, judged after the training split's */
      int nh = bench_replay_count(a.heldout);
      if (nh <= 0) {
        fprintf(stderr, "megascope bench diagnose: --heldout %s: %s\n", a.heldout,
                nh ? ms_strerror(nh) : "no records (case-NNNN.rec) there");
        return 2;
      }
      o.replay_heldout = a.heldout;
      n += nh;
    }
  } else if (a.generate) {
    if (bench_scenarios_generate((int)a.generate, a.seed, a.backend, &sc, &n)) return 1;
    if (!a.run) {
      rc = write_scenarios(a.write, sc, n);
      free(sc);
      return rc;
    }
  } else if (bench_scenarios_read(a.scenarios, &sc, &n, &log)) {
    fprintf(stderr, "megascope bench diagnose: %s: %s", a.scenarios, buf);
    return 2;
  }
  if (a.heldout && !a.replay) {
    /* the held-out split: scored apart, beside the training split */
    struct bench_scenario *h = NULL, *all;
    int nh = 0;
    if (bench_scenarios_read(a.heldout, &h, &nh, &log)) {
      fprintf(stderr, "megascope bench diagnose: --heldout %s: %s", a.heldout, buf);
      free(sc);
      return 2;
    }
    if (!(all = realloc(sc, sizeof *sc * (size_t)(n + nh)))) {
      free(sc);
      free(h);
      return 1;
    }
    sc = all;
    for (int i = 0; i < nh; i++) {
      sc[n + i] = h[i];
      sc[n + i].split = 1;
    }
    n += nh;
    free(h);
  }
  if (a.write && (rc = write_scenarios(a.write, sc, n))) {
    free(sc);
    return rc;
  }
  if ((rc = check_ranks(&a, sc, n))) {
    free(sc);
    return rc;
  }
  /* under mpirun: the launch check (the same executable, arguments and --tp
   * on every rank), then every rank runs the scenarios */
  struct cli_model cm = {.preset = "bench diagnose"};
  int dist_failed;
  struct ms_transport *tx = cli_dist_start("bench diagnose", (int)a.tp, &cm, argc, argv, &dist_failed);
  if (dist_failed) {
    free(sc);
    return 2;
  }
  o.tx = tx;
  if (tx && tx->rank != 0) o.record = NULL;  /* rank 0 keeps the merged evidence */
  rc = run_and_report(&a, &o, sc, n);
  free(sc);
  cli_dist_end(tx);
  return rc;
}
