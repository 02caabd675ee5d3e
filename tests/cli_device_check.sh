#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/device-check.sh, the run a lent GPU gets, checked on any machine:
#  - --help; --dry-run prints "STEP BUDGET_S" lines and "total: N s" with N
#    their sum and at most 780, writing nothing; an unknown option or step is
#    a usage error (exit 2) that creates no file;
#  - against stand-in binaries: a hung step runs out of its own budget and is
#    named in the report ("hung"), the steps after it still run, a failed
#    smoke run gates the megakernel steps and its watchdog report is kept, a
#    missing test binary is a skipped step; the report is valid JSON;
#  - past the global deadline, the steps left are skipped, said so in the
#    report, and listed as a --steps argument for a rerun;
#  - killed (SIGKILL, no chance to clean up) during a step, the report still
#    holds every finished step's result and names the running one; stopped
#    by SIGTERM, the step is ended and marked killed;
#  - against megascope-emu (the CLI over the emulated CUDA sources): the
#    smoke run passes, the lost-trigger step ends with the watchdog's
#    report naming embed[row 0] (task 1), and an attach while running
#    (attach_live's command, fewer requests) proves it: made after a step,
#    returned with steps left, programs run.
set -uo pipefail
MS=$1
here=$(cd "$(dirname "$0")" && pwd)
DC=$here/../scripts/device-check.sh
EMU=$(dirname "$MS")/megascope-emu
MON=${MS_MONITORS:-$(dirname "$MS")/monitors}
command -v python3 >/dev/null || { echo "SKIP: no python3 to read the reports"; exit 77; }
tmp=$(mktemp -d)
BG=
trap '[ -n "$BG" ] && kill -KILL -- -"$BG" 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# PY EXPR over the report $1 (as r): exits 0 when it holds
holds() { python3 -c "import json,sys; r = json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1"; }

# ---- usage -------------------------------------------------------------------
out=$(bash "$DC" --help 2>&1) && grep -q "usage: scripts/device-check.sh" <<<"$out" && grep -q -- "--dry-run" <<<"$out" \
  && ok || bad "--help: $out"
mkdir -p "$tmp/out"
out=$(OUT=$tmp/out bash "$DC" --dry-run 2>/dev/null); rc=$?
python3 - "$out" <<'PY' && ok || bad "--dry-run (rc $rc): $out"
import re, sys
lines = sys.argv[1].strip().split("\n")
steps = [l.split() for l in lines[:-1]]
assert all(len(s) == 2 and re.fullmatch(r"[a-z0-9_.-]+", s[0]) and s[1].isdigit() for s in steps), steps
m = re.fullmatch(r"total: (\d+) s", lines[-1])
assert m and int(m.group(1)) == sum(int(s[1]) for s in steps) and int(m.group(1)) <= 780, lines[-1]
names = [s[0] for s in steps]
assert names[0] == "info" and names.index("smoke") < names.index("stuck") < names.index("attach_live"), names
assert all(n.startswith("ops_") for n in names[1:names.index("smoke")]), names
PY
[ $rc -eq 0 ] && [ -z "$(ls -A "$tmp/out")" ] && ok || bad "--dry-run wrote $(ls -A "$tmp/out")"
out=$(cd "$tmp" && OUT=$tmp/out bash "$DC" --dry-run --steps smoke,stuck --budget-scale 2 2>/dev/null)
[ "$out" = $'smoke 40\nstuck 30\ntotal: 70 s' ] && ok || bad "--steps smoke,stuck --budget-scale 2: $out"
for args in "--bogus" "report.json" "--steps nosuch" "--deadline soon" "--report"; do
  # shellcheck disable=SC2086
  out=$(cd "$tmp" && bash "$DC" $args 2>&1); rc=$?
  [ $rc -eq 2 ] && ! [ -e "$tmp/--bogus" ] && ! [ -e "$tmp/report.json" ] && ! [ -e "$here/../--bogus" ] && ok \
    || bad "$args: rc $rc, $out"
done

# ---- stand-in binaries: a hang, a failed smoke run, a missing test -----------
mkdir -p "$tmp/bin"
cat >"$tmp/bin/megascope" <<'EOF'
#!/usr/bin/env bash
case "$1 $2" in
  "cuda info") echo '{"available": true, "name": "stand-in", "sms": 2}' ;;
  "cuda ops") [ "$4" = tiny-moe ] && exec sleep 1000; echo "ops check: 3 classes, 0 differ" ;;
  "cuda run") echo "cuda: no heartbeat for 3000 ms (step 7); per CTA:" >&2
              echo "  worker 0: running blk.0.qkv[tile 0] (beats 12)" >&2; exit 1 ;;
  *) exit 3 ;;
esac
EOF
chmod +x "$tmp/bin/megascope"
R=$tmp/r1.json
bash "$DC" --bin "$tmp/bin" --steps info,ops_tiny-moe,ops_tiny-qwen3,smoke,stuck,test_cuda_ops --budget-scale 0.2 \
  --report "$R" >"$tmp/r1.log" 2>&1; rc=$?
[ $rc -eq 1 ] && ok || bad "a run with a hang and a failure: rc $rc: $(tail -5 "$tmp/r1.log")"
holds "$R" 'r["device"]["name"] == "stand-in" and r["steps"]["info"]["status"] == "ok" and not r["ok"]' && ok \
  || bad "the device in the report: $(cat "$R")"
holds "$R" 'r["steps"]["ops_tiny-moe"]["status"] == "timeout" and r["hung"] == "ops_tiny-moe" and r["running"] is None' && ok \
  || bad "the hung step: $(cat "$R")"
holds "$R" 'r["steps"]["ops_tiny-qwen3"]["status"] == "ok" and r["steps"]["ops_tiny-moe"]["budget_s"] == 3' && ok \
  || bad "the step after the hang: $(cat "$R")"
holds "$R" 'r["steps"]["smoke"]["status"] == "failed" and "no heartbeat for 3000 ms" in r["steps"]["smoke"]["watchdog"]' \
  && ok || bad "the smoke run's watchdog report: $(cat "$R")"
holds "$R" 'r["steps"]["stuck"]["status"] == "gated" and r["steps"]["test_cuda_ops"]["status"] == "skipped"' && ok \
  || bad "gated and skipped steps: $(cat "$R")"

# ---- the global deadline: the steps it left out, named for a rerun ------------
# (the hung step comes first, with a budget past the deadline: it starts with at least 10 s left,
# however slowly the script starts, and its limit is what was left, so nothing after it fits)
R=$tmp/r2.json
bash "$DC" --bin "$tmp/bin" --steps ops_tiny-moe,ops_tiny-qwen3,smoke --budget-scale 2 --deadline 16 \
  --report "$R" >"$tmp/r2.log" 2>&1
grep -q -- "to run them: --steps ops_tiny-qwen3,smoke$" "$tmp/r2.log" && ok || bad "the rerun line: $(cat "$tmp/r2.log")"
holds "$R" 'r["hung"] == "ops_tiny-moe" and all(r["steps"][s]["status"] == "skipped" and "deadline" in r["steps"][s]["note"] for s in ("ops_tiny-qwen3", "smoke"))' \
  && ok || bad "steps past the deadline: $(cat "$R")"

# ---- killed during a step ----------------------------------------------------
for sig in KILL TERM; do
  R=$tmp/r-$sig.json
  setsid bash "$DC" --bin "$tmp/bin" --steps info,ops_tiny,ops_tiny-moe,smoke --budget-scale 20 --report "$R" \
    >"$tmp/k.log" 2>&1 &
  BG=$!
  for _ in $(seq 1 200); do
    [ -f "$R" ] && holds "$R" 'r["running"] == "ops_tiny-moe"' 2>/dev/null && break
    sleep 0.1
  done
  if [ $sig = KILL ]; then kill -KILL -- -"$BG"; else kill -TERM "$BG"; fi
  wait "$BG" 2>/dev/null
  BG=
  holds "$R" 'r["running"] == "ops_tiny-moe" and r["device"]["name"] == "stand-in" and r["steps"]["ops_tiny"]["status"] == "ok"' \
    && ok || bad "SIG$sig during ops_tiny-moe: $(cat "$R")"
  [ $sig = TERM ] && { holds "$R" 'r["steps"]["ops_tiny-moe"]["status"] == "killed" and "smoke" not in r["steps"]' \
    && ok || bad "SIGTERM: the step is not marked killed: $(cat "$R")"; }
done

# ---- the emulated device -----------------------------------------------------
if [ -x "$EMU" ] && [ -f "$MON/class_time.bpf.o" ]; then
  mkdir -p "$tmp/emu"
  ln -s "$EMU" "$tmp/emu/megascope"
  ln -s "$MON" "$tmp/emu/monitors"
  R=$tmp/emu.json
  MODEL=tiny bash "$DC" --bin "$tmp/emu" --steps info,smoke,stuck --budget-scale 15 --deadline 3000 --report "$R" \
    >"$tmp/emu.log" 2>&1; rc=$?
  [ $rc -eq 0 ] && ok || bad "the emulated run: rc $rc: $(tail -20 "$tmp/emu.log"; cat "$R")"
  holds "$R" 'r["ok"] and r["steps"]["smoke"]["result"]["requests_differing"] == 0' && ok \
    || bad "the emulated smoke run: $(cat "$R")"
  holds "$R" '"not yet triggered: embed[row 0] (task 1)" in r["steps"]["stuck"]["watchdog"]' && ok \
    || bad "the emulated lost trigger: $(cat "$R")"
  # attach_live's proof, on a smaller run than the step's (which takes minutes here): the call is
  # made once a step is done and returns with steps left, and the programs ran
  "$EMU" cuda run --synthetic tiny --dtype bf16 --batch 4 --requests 8 --new 12 --json --watchdog-ms 5000 \
    --attach "$MON/class_time.bpf.o" >"$tmp/attach.json" 2>"$tmp/attach.log"
  holds "$tmp/attach.json" 'r["attach"]["while_running"] and r["attach"]["steps_before"] >= 1 and r["attach"]["steps_after"] < r["steps"] and r["attach"]["executed"] > 0' \
    && ok || bad "cuda run --attach: $(cat "$tmp/attach.json" "$tmp/attach.log")"
else
  bad "no megascope-emu or monitors beside $MS (the build makes both)"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
