#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""How far two CPU workers' statistics move between healthy runs, against how
far a throttled worker moves them: the floor under which a slow worker cannot
be told from a healthy machine by one window.

Runs `megascope run` on a model with two workers, healthy and with
slow_worker:W:F on each worker, for each window length, with one query
attached, and prints per run three statistics of worker 0 against worker 1:
  mean  the median over the weight kernels of log(mean task time w0 / w1)
        (the benchmark's kernel-by-kernel worker judgement reads this);
  min   the same with each kernel's fastest task;
  rel   the share of the events of several triggers released by worker 0 (the
        worker that ends an operator's last tile is the one the others wait for).
Then, per window length, the healthy runs' standard deviation of each and the
throttled runs' mean shift, in those standard deviations.

  scripts/worker-floor.py [--model F.gguf] [--steps 12,48,192] [--runs 5]
                          [--factor 1.05] [--tile-kb 64] [--megascope BIN] [--json]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

KERNELS = ["qkv", "wo", "gate_up", "down", "lm_head"]
QUERY = ("task_end { @mean[worker, op] = avg(t_end - t_begin); @min[worker, op] = min(t_end - t_begin) } "
         "dep_release /event_needed > 1/ { @rel[worker] = count() }")


def one_run(args, steps, fault):
    cmd = [args.megascope, "run", "--model", args.model, "--workers", "2", "--batch", "4", "--steps", str(steps),
           "--prompt-len", "16", "--tile-kb", str(args.tile_kb), "--query", QUERY, "--json"]
    if fault:
        cmd += ["--fault", fault]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("worker-floor: %s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()[-400:]))
    maps = {m["name"]: m["entries"] for m in json.loads(p.stdout)["query"]["maps"]}
    out = {}
    for name in ("@mean", "@min"):
        t = {(e["key"][0], e["key"][1]): e["value"] for e in maps[name]}
        r = [math.log(t[(0, k)] / t[(1, k)]) for k in KERNELS if t.get((0, k), 0) > 0 and t.get((1, k), 0) > 0]
        out[name[1:]] = statistics.median(r) if r else float("nan")
    rel = {e["key"][0] if isinstance(e["key"], list) else e["key"]: e["value"] for e in maps["@rel"]}
    total = rel.get(0, 0) + rel.get(1, 0)
    out["rel"] = rel.get(0, 0) / total if total else float("nan")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/megascope/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--steps", default="12,48,192", help="window lengths in decode steps")
    ap.add_argument("--runs", type=int, default=5, help="runs of each condition")
    ap.add_argument("--factor", type=float, default=1.05, help="the throttled worker's task time factor")
    ap.add_argument("--tile-kb", type=int, default=64,
                    help="weight KiB a GEMV task (default 64, as the benchmark's CPU engines)")
    ap.add_argument("--megascope", default="build/megascope")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        sys.exit("worker-floor: no model at %s (scripts/get-smollm2.sh fetches it)" % args.model)
    report = []
    for steps in [int(s) for s in args.steps.split(",")]:
        cond = {"healthy": None, "slow 0": "slow_worker:0:%g" % args.factor, "slow 1": "slow_worker:1:%g" % args.factor}
        runs = {name: [] for name in cond}
        for _ in range(args.runs):  # the conditions alternate, so a drift of the machine meets all three alike
            for name, fault in cond.items():
                runs[name].append(one_run(args, steps, fault))
                print("worker-floor: %d steps, %s: %d of %d" % (steps, name, len(runs[name]), args.runs),
                      file=sys.stderr)
        row = {"steps": steps, "runs": runs, "separation": {}}
        for stat in ("mean", "min", "rel"):
            h = [r[stat] for r in runs["healthy"]]
            sd = statistics.stdev(h) if len(h) > 1 else float("nan")
            mu = statistics.mean(h)
            row["separation"][stat] = {
                "healthy_sd": sd,
                "slow0_shift_sd": (statistics.mean(r[stat] for r in runs["slow 0"]) - mu) / sd if sd > 0 else None,
                "slow1_shift_sd": (statistics.mean(r[stat] for r in runs["slow 1"]) - mu) / sd if sd > 0 else None,
            }
        report.append(row)
    if args.json:
        print(json.dumps({"model": os.path.basename(args.model), "factor": args.factor, "windows": report}))
        return
    print("worker 0 against worker 1, slow_worker factor %g, %s" % (args.factor, os.path.basename(args.model)))
    for row in report:
        print("\n%d steps a window" % row["steps"])
        for name, rs in row["runs"].items():
            print("  %-8s mean %s   min %s   rel %s" % (name, " ".join("%+.3f" % r["mean"] for r in rs),
                                                      " ".join("%+.3f" % r["min"] for r in rs),
                                                      " ".join("%.3f" % r["rel"] for r in rs)))
        for stat, s in row["separation"].items():
            f = lambda v: "-" if v is None else "%+.1f" % v
            print("  %-4s healthy sd %.3f; throttled worker 0 moves it %s sd, worker 1 %s sd" %
                  (stat, s["healthy_sd"], f(s["slow0_shift_sd"]), f(s["slow1_shift_sd"])))


if __name__ == "__main__":
    main()
