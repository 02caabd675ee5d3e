#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A picture of a task trace (megascope trace --format json): a few consecutive
decode steps from the middle of the recording, one row per worker, each task a
box from its begin to its end coloured by its op; a class named with --mark is
outlined in black. Written with gnuplot (pngcairo) to OUT.png.

  scripts/trace-png.py TRACE.json OUT.png [--steps 3] [--mark blk.15.gate_up]

Prints what it drew: the steps, the tasks and the span, all from the file."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("out")
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--mark", default="")
a = ap.parse_args()

ev = [e for e in json.load(open(a.trace))["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "task"]
if not ev:
    sys.exit("trace-png: %s holds no task records" % a.trace)
steps = sorted({e["args"]["step"] for e in ev})
# whole steps only: the first and last may be cut by the recording's window
inner = steps[1:-1] if len(steps) > 2 else steps
mid = len(inner) // 2
pick = set(inner[max(0, mid - a.steps // 2):max(0, mid - a.steps // 2) + a.steps])
sel = [e for e in ev if e["args"]["step"] in pick]
t0 = min(e["ts"] for e in sel)
span_us = max(e["ts"] + e["dur"] for e in sel) - t0

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94"]


def op_of(cls):
    p = cls.split(".")
    return p[2] if len(p) >= 3 and p[0] == "blk" else cls


ops = []
for e in sorted(sel, key=lambda e: e["ts"]):
    o = op_of(e["args"]["class"])
    if o not in ops:
        ops.append(o)
color = {o: PALETTE[i % len(PALETTE)] for i, o in enumerate(ops)}
workers = sorted({e["tid"] for e in sel})

with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "boxes.dat")
    with open(data, "w") as f:
        for e in sel:
            x0 = (e["ts"] - t0) / 1000.0
            x1 = x0 + max(e["dur"], 0.2) / 1000.0
            y = workers.index(e["tid"])
            marked = a.mark and e["args"]["class"] == a.mark
            f.write("%.6f %.6f %.3f %.3f 0x%s %d\n" % (x0, x1, y - 0.4, y + 0.4, color[op_of(e["args"]["class"])][1:],
                                                    1 if marked else 0))
    keys = ", ".join("keyentry with boxes fs solid lc rgb '%s' title '%s'" % (color[o], o) for o in ops)
    mark = ""
    if a.mark:
        mark = (", '%s' using (($1+$2)/2):($6 > 0 ? ($3+$4)/2 : NaN):(($2-$1)/2):(($4-$3)/2) "
                "with boxxyerror fs empty border lc rgb 'black' lw 1.5 title '%s'" % (data, a.mark))
    script = """
set terminal pngcairo size 1600,%d font ',10' noenhanced
set output '%s'
set title "%d decode steps (%s) on %d workers: each box a task, begin to end"
set xlabel 'ms from the first task shown'
set ytics (%s)
set yrange [-0.6:%f]
set key outside right top
set style fill solid 1.0 noborder
plot '%s' using (($1+$2)/2):(($3+$4)/2):(($2-$1)/2):(($4-$3)/2):5 with boxxyerror lc rgb variable notitle, \\
     %s%s
""" % (260 + 50 * len(workers), a.out, len(pick), ", ".join(str(s) for s in sorted(pick)), len(workers),
       ", ".join("'worker %d' %d" % (w, i) for i, w in enumerate(workers)), len(workers) - 0.4, data, keys, mark)
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
print("%s: steps %s, %d tasks on %d workers over %.2f ms%s" % (
    a.out, ", ".join(str(s) for s in sorted(pick)), len(sel), len(workers), span_us / 1000.0,
    (", %d of them %s" % (sum(1 for e in sel if e["args"]["class"] == a.mark), a.mark)) if a.mark else ""))
