#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The engine's CUDA backend through the CLI's front door, end to end, on any
# machine: megascope-emu (beside the binary under test) is the same CLI built
# over the CUDA sources compiled for the CPU (tests/emu), so its --backend cuda
# runs the resident persistent kernel on CPU threads.
#  - run --backend cuda: the tokens equal the CPU engine's (f32 weights, held
#    as bf16 on the device; greedy), --check passes on bf16 weights, --json
#    names the backend, the refusals name what (tp, a fault the device does not
#    apply, --sms on cpu); faults it applies leave the tokens alone;
#  - bench decode --backend cuda: megakernel and per-op alternating, each made
#    afresh for its run (one resident kernel holds every SM), the HBM bound;
#  - bench diagnose on cuda scenarios: every method answers from the device;
#  - serve --backend cuda: the official openai SDK (from .venv) gets a
#    completion, a streamed chat and a seeded draw equal to the CPU server's;
#    a monitor attached over the control socket runs on the device (coverage
#    executed > 0, eligible = executed), its maps read back with the task
#    classes and, for request_time, the requests' tokens; detach; Prometheus'
#    per-class series count the device's tasks; `megascope trace` records the
#    device's tasks (JSON and Perfetto, checked by tests/trace_check.py); the
#    server stops cleanly. serve --backend sim is refused.
set -uo pipefail
MS=$1
here=$(cd "$(dirname "$0")" && pwd)
EMU=$(dirname "$MS")/megascope-emu
MON=${MS_MONITORS:-$(dirname "$MS")/monitors}
PY=$here/../.venv/bin/python
[ -x "$EMU" ] || { echo "SKIP: no megascope-emu beside $MS"; exit 77; }
tmp=$(mktemp -d)
SERVE_PID=
trap 'kill $SERVE_PID 2>/dev/null || true; rm -rf "$tmp"' EXIT
pass=0 fail=0 skipped=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
expect() {  # BIN RC TEXT ARGS...: exit code RC and TEXT in stdout+stderr
  local bin=$1 rc_want=$2 want=$3; shift 3
  local out rc
  out=$("$bin" "$@" 2>&1); rc=$?
  if [ "$rc" -eq "$rc_want" ] && grep -q -- "$want" <<<"$out"; then ok; else bad "$* -> rc $rc (want $rc_want, '$want'): $out"; fi
}
tokens() { python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])'; }

# ---- run ----
args=(run --synthetic tiny --requests 6 --batch 4 --steps 6 --json)
cpu=$("$MS" "${args[@]}" --f32-activations | tokens) || bad "cpu run"
gpu_json=$("$EMU" "${args[@]}" --backend cuda) || bad "cuda run: $gpu_json"
[ -n "$cpu" ] && [ "$(tokens <<<"$gpu_json")" = "$cpu" ] && ok || bad "cuda tokens $(tokens <<<"$gpu_json") != cpu $cpu"
grep -q '"backend":"cuda"' <<<"$gpu_json" && ok || bad "--json does not name the backend: $gpu_json"
expect "$EMU" 0 "check: .*passed" run --synthetic tiny --dtype bf16 --backend cuda --steps 4 --check
expect "$EMU" 0 "check: .*passed" run --synthetic tiny --dtype bf16 --backend cuda --mode per-op --steps 4 --check
expect "$EMU" 1 "does not run tensor parallelism" run --synthetic tiny --backend cuda --tp 2
# faults the device applies leave the tokens alone; the others are refused by name
f_tok=$("$EMU" "${args[@]}" --backend cuda --fault slow_class:blk.0.wo:3 --fault slow_worker:1:2 \
  --fault 'delayed_release:rope->attn:100us' --fault slow_request:0:2 | tokens) || bad "cuda run with faults"
[ "$f_tok" = "$cpu" ] && ok || bad "tokens with faults on cuda: $f_tok != $cpu"
expect "$EMU" 1 "routing_skew is not injected on this backend" run --synthetic tiny-moe --backend cuda \
  --fault routing_skew:0:0.5
expect "$EMU" 1 "the SMs here have workers" run --synthetic tiny --backend cuda --fault slow_worker:99:2
expect "$EMU" 1 "fault injection in per-op mode" run --synthetic tiny --backend cuda --mode per-op \
  --fault slow_class:blk.0.wo:2
expect "$EMU" 2 "is for --backend cuda" run --synthetic tiny --sms 4
expect "$EMU" 2 "expected one of\|'gpu'" run --synthetic tiny --backend gpu
expect "$EMU" 2 "serve on cpu or cuda" serve --synthetic tiny --backend sim
expect "$EMU" 2 "bench sim" bench decode --synthetic tiny --backend sim
bench=$("$EMU" bench decode --synthetic tiny --dtype bf16 --backend cuda --rounds 2 --steps 4 --json 2>/dev/null)
python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["backend"] == "cuda" and d["megakernel_tokens_per_s"] > 0 and d["per_op_tokens_per_s"] > 0, d
assert len(d["rounds_tokens_per_s"]["per_op"]) == 2 and d["read_bound_tokens_per_s"] > 0, d
' <<<"$bench" && ok || bad "bench decode --backend cuda: $bench"
expect "$EMU" 1 "per-op mode has no hook sites" run --synthetic tiny --backend cuda --mode per-op --steps 2 \
  --attach "$MON/class_time.bpf.o"

# ---- bench diagnose on the cuda backend: all six methods answer at every
# budget from the device (heartbeats for PC sampling, the device's trace for the
# trace methods, its monitors' maps); the generator draws only the faults the
# device injects, and a scenario with another is refused by name
"$EMU" bench diagnose --scenarios "$here/../bench/scenarios/cuda_smoke.json" --budgets 4k,64k --headline 64k \
  --monitors "$MON" --quiet --json >"$tmp/diag.json" 2>"$tmp/diag.txt" || bad "bench diagnose on cuda: $(cat "$tmp/diag.txt")"
python3 - "$tmp/diag.json" <<'PY' && ok || bad "bench diagnose on cuda: the report"
import json, sys
a = json.load(open(sys.argv[1]))
methods = ["kernel_timing", "pc_sampling", "task_trace", "sampled_events", "semantic_monitors", "task_profiler"]
assert len(a["scenarios"]) == 2
for s in a["scenarios"]:
    assert "error" not in s and s["backend"] == "cuda" and s["healthy_ns"] > 0, s
    assert "run_to_run_spread" in s, s
    for m in methods:
        ans = s["answers"][m]
        assert [x["budget"] for x in ans] == [4096, 65536], (m, ans)
        assert all(x["coverage"] > 0 or m == "kernel_timing" for x in ans if x["budget"] == 65536), (m, ans)
PY
grep -q "CUDA backend: two healthy runs differ" "$tmp/diag.txt" && ok || bad "no CUDA spread line: $(cat "$tmp/diag.txt")"
"$EMU" bench diagnose --generate 1 --backend cuda --write-scenarios "$tmp/gen.json" || bad "generate --backend cuda"
python3 - "$tmp/gen.json" <<'PY' && ok || bad "generate --backend cuda: $(cat "$tmp/gen.json")"
import json, sys
d = json.load(open(sys.argv[1]))
types = sorted(s["faults"][0]["type"] for s in d if s["faults"])
assert types == sorted(["slow_class", "delayed_release", "slow_request", "slow_worker", "slow_layer",
                        "late_admission"]), types
assert all(s["backend"] == "cuda" for s in d) and len(d) == 7, d
PY
echo '[{"name": "z", "preset": "tiny-moe", "backend": "cuda", "batch": 2, "steps": 2, "seed": 1, "faults": [{"type": "routing_skew", "target": "0", "factor": 0.5}]}]' >"$tmp/bad.json"
expect "$EMU" 2 "routing_skew is not injected on the cuda backend" bench diagnose --scenarios "$tmp/bad.json"

# ---- serve ----
. "$here/serve_lib.sh"
MS=$EMU start_serve cuda --synthetic tiny --dtype bf16 --backend cuda --batch 4 --max-ctx 256 \
  || { bad "serve --backend cuda did not start"; echo "$pass passed, $fail failed"; exit 1; }
grep -q "cuda backend" "$tmp/cuda/serve.out" && ok || bad "the banner: $(cat "$tmp/cuda/serve.out")"
id=$("$MS" attach --socket "$SOCK" "$MON/class_time.bpf.o") && ok || bad "attach: $id"
rid=$("$MS" attach --socket "$SOCK" "$MON/request_time.bpf.o") && ok || bad "attach request_time: $rid"
code=$(completion "hello" 5 "$tmp/c.json")
[ "$code" = 200 ] && grep -q '"completion_tokens":5' "$tmp/c.json" && ok || bad "completion: $code $(cat "$tmp/c.json")"
if "$PY" -c 'import openai' 2>/dev/null; then
  cuda_url=$URL
  "$PY" - "$cuda_url" >"$tmp/sdk.out" 2>&1 <<'EOF' && ok || bad "the openai SDK on cuda: $(cat "$tmp/sdk.out")"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
r = c.completions.create(model="tiny", prompt="abc", max_tokens=4, temperature=0)
assert r.usage.completion_tokens == 4, r
parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
    model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True)]
assert len(parts) >= 2, parts
r = c.completions.create(model="tiny", prompt="xyz", max_tokens=8, temperature=0.9, seed=7)
print(repr(r.choices[0].text))
EOF
else
  echo "SKIP: the openai SDK checks: no openai package in .venv (scripts/deps.sh installs it)"
  skipped=$((skipped + 1))
fi
# the always-on aggregates come from the device (at most 100 ms old, and final once the batch drained)
metrics=$(curl -s "$URL/metrics")
n=$(grep -o '^megascope_class_tasks_total{class="blk.0.attn"} [0-9]*' <<<"$metrics" | awk '{print $2}')
[ "${n:-0}" -gt 0 ] && ok || bad "Prometheus per-class tasks on cuda: '$n'"
cov=$("$MS" ls --socket "$SOCK" --json) || bad "ls: $cov"
python3 -c '
import json, sys
want = int(sys.argv[1])
d = json.load(sys.stdin)
atts = d["attachments"] if isinstance(d, dict) else d
a = [x for x in atts if x["id"] == want][0]
c = a["coverage"]
assert c["executed"] > 0 and c["eligible"] == c["executed"], c
' "$id" <<<"$cov" && ok || bad "coverage from the device: $cov"
expect "$MS" 0 "blk.0.attn" maps --socket "$SOCK" "$id"
expect "$MS" 0 "tokens_by_req" maps --socket "$SOCK" "$rid"
"$MS" maps --socket "$SOCK" "$rid" --json | python3 -c '
import json, sys
def maps(v):  # every map object in the reply, wherever it sits
    if isinstance(v, dict):
        if "name" in v and "entries" in v: yield v
        for x in v.values(): yield from maps(x)
    elif isinstance(v, list):
        for x in v: yield from maps(x)
m = [m for m in maps(json.load(sys.stdin)) if m["name"] == "tokens_by_req"][0]
assert sum(e["value"] for e in m["entries"]) >= 5, m
' && ok || bad "request_time counted no tokens on the device: $("$MS" maps --socket "$SOCK" "$rid")"
expect "$MS" 0 "detached" detach --socket "$SOCK" "$id"
# a query compiled here runs on the device
(sleep 0.3; completion "again" 4 "$tmp/q.json" >/dev/null) &
load=$!
expect "$MS" 0 "@us\[0\]" query --socket "$SOCK" --for 2s 'task_end /op == attn/ { @us[tile_z] = hist((t_end - t_begin) / 1000) }'
wait "$load"
# the device's task trace, in both formats, checked by tests/trace_check.py:
# slices on every device worker's track, ordered and disjoint, flows inside
# their producers, the printed counts the file's
for fmt in json perfetto; do
  (sleep 0.2; completion "traced" 6 "$tmp/tr.json" >/dev/null) &
  load=$!
  "$MS" trace --socket "$SOCK" --seconds 1.5 --out "$tmp/t.$fmt" --format $fmt >"$tmp/trace.out" 2>&1 \
    || bad "trace --format $fmt on cuda: $(cat "$tmp/trace.out")"
  wait "$load"
  counts=$(python3 - "$tmp/trace.out" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"(\d+) slices, (\d+) flows,\s+(\d+) counter samples, (\d+) events over the budget dropped", t)
assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, t
print("slices=%s flows=%s counters=%s budget_dropped=%s" % m.groups())
PY
) || { bad "trace on cuda printed: $(cat "$tmp/trace.out")"; continue; }
  # shellcheck disable=SC2086
  python3 "$here/trace_check.py" $fmt "$tmp/t.$fmt" $counts; rc=$?
  if [ $rc -eq 77 ]; then
    echo "SKIP: the device's $fmt trace not decoded (no perfetto package)"
    skipped=$((skipped + 1))
  elif [ $rc -eq 0 ]; then ok; else bad "the device's $fmt trace"; fi
done
python3 - "$tmp/t.json" <<'PY' && ok || bad "the device's JSON trace: workers or requests"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
tids = {e["tid"] for e in ev}
assert len(tids) >= 2, tids  # the emulated device's workers (4 SMs: 3 workers)
assert any(e["args"]["request"] for e in ev), "no slice names its request"
PY
stop_serve cuda && ok || bad "serve --backend cuda did not stop cleanly"

# the seeded draw equals the CPU server's
if [ -s "$tmp/sdk.out" ] && "$PY" -c 'import openai' 2>/dev/null; then
  start_serve cpu --synthetic tiny --dtype bf16 --batch 4 --max-ctx 256 --f32-activations || bad "cpu serve"
  "$PY" - "$URL" >"$tmp/sdk_cpu.out" 2>&1 <<'EOF' || bad "the openai SDK on cpu: $(cat "$tmp/sdk_cpu.out")"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
r = c.completions.create(model="tiny", prompt="xyz", max_tokens=8, temperature=0.9, seed=7)
print(repr(r.choices[0].text))
EOF
  stop_serve cpu
  [ "$(tail -1 "$tmp/sdk.out")" = "$(cat "$tmp/sdk_cpu.out")" ] && ok \
    || bad "seeded draw: cuda $(tail -1 "$tmp/sdk.out") vs cpu $(cat "$tmp/sdk_cpu.out")"
fi
echo "$pass passed, $fail failed, $skipped skipped"
[ "$fail" -eq 0 ] || exit 1
[ "$skipped" -eq 0 ] || exit 77
