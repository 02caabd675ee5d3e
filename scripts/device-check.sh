#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The CUDA backend's checks and benchmarks on a machine with an NVIDIA GPU, in
# one run that fits a short lease of the device and always leaves a report.
# Every step's budget together is at most 780 s, and the run stops at a
# global deadline, 330 s unless given: a lease of 15 minutes, start included,
# then holds the machine's start (a minute or two), this run and one rerun of
# the same length while the machine is still warm; the run ends by saying
# which steps the deadline left out, as a --steps list for that rerun. The
# JSON report is rewritten before and after every step, so a hang or a kill
# still leaves every finished step's result and names the step that was
# running, with the watchdog's report when the binary printed one. Steps run
# cheapest and most informative first: the device; each operator against its
# CPU twin; a 20 s megakernel smoke run that gates every later step that runs
# the megakernel; the watchdog on a lost trigger; an attach while steps are in
# flight; tokens against the CPU engine; the engine's CUDA backend (with its
# handover figures); the megakernel against the per-op graph at batch 1 (the
# headline figures); the GPU test binaries; the other benchmarks.
#
# Binaries: --bin DIR; else device-bundle/ (scripts/device-bundle.sh, made
# where the Debian packages are; for a bare CUDA image such as the device
# tool's, carry ["device-bundle"]) with its libraries; else a build (BUILD,
# default build-gpu, configured for CUDA_ARCH, default 90, when it is not;
# needs what scripts/deps.sh installs). MODEL: the benchmarks' preset
# (default smollm2-135m).
set -uo pipefail

usage() {
  cat <<'EOF'
usage: scripts/device-check.sh [options]

Runs the CUDA backend's checks and benchmarks on this machine's GPU, each step
under its own deadline and all under a global one, and writes a JSON report
that is rewritten after every step.

  --help             this text
  --dry-run          print each step with its budget ("STEP BUDGET_S") and the
                     total ("total: N s"); run nothing, write nothing
  --report PATH      the JSON report (default: $OUT/device-report.json when OUT
                     is set, else device-report.json in the bundle or build
                     folder); step logs go to device-logs/ beside it
  --steps A,B,...    only these steps (in the usual order)
  --deadline S       the global deadline in seconds (default 330: with the
                     machine's start and one rerun, 15 minutes); a step that
                     would not fit is skipped, and the run ends by naming the
                     steps left out (--steps for the rerun)
  --budget-scale F   every step's budget times F (default 1; an emulated
                     device is slower)
  --bin DIR          the binaries (megascope, test_cuda_*) to run

Environment: BUNDLE (default device-bundle), BUILD (default build-gpu),
CUDA_ARCH (default 90), MODEL (default smollm2-135m).
Exit status: 0 when every step that ran passed, 1 otherwise, 2 on a usage
error.
EOF
}

# ---- arguments -----------------------------------------------------------

DRY=0 REPORT= ONLY= DEADLINE=330 SCALE=1 BIN=
while [ $# -gt 0 ]; do
  case $1 in
    --help|-h) usage; exit 0 ;;
    --dry-run) DRY=1 ;;
    --report|--steps|--deadline|--budget-scale|--bin)
      [ $# -ge 2 ] || { echo "device-check: $1 needs a value (see --help)" >&2; exit 2; }
      case $1 in
        --report) REPORT=$2 ;;
        --steps) ONLY=$2 ;;
        --deadline) DEADLINE=$2 ;;
        --budget-scale) SCALE=$2 ;;
        --bin) BIN=$2 ;;
      esac
      shift ;;
    *) echo "device-check: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $DEADLINE =~ ^[0-9]+$ ]] || { echo "device-check: --deadline takes whole seconds, not '$DEADLINE'" >&2; exit 2; }
[[ $SCALE =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "device-check: --budget-scale takes a number, not '$SCALE'" >&2; exit 2; }
case $REPORT in *" "*) echo "device-check: --report '$REPORT' has a space" >&2; exit 2 ;; esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUNDLE=${BUNDLE:-device-bundle}
BUILD=${BUILD:-build-gpu}
CUDA_ARCH=${CUDA_ARCH:-90}
MODEL=${MODEL:-smollm2-135m}
[ "${BUNDLE#/}" = "$BUNDLE" ] && BUNDLE=$ROOT/$BUNDLE
[ "${BUILD#/}" = "$BUILD" ] && BUILD=$ROOT/$BUILD

# ---- the steps: name, budget in seconds, whether it runs the megakernel --

STEPS=(
  "info 10 0"
  "ops_tiny 15 0" "ops_tiny-moe 15 0" "ops_tiny-qwen3 15 0" "ops_tiny-qwen2 15 0" "ops_tiny-gemma3 15 0"
  "ops_smollm2-135m 30 0"
  "smoke 20 0"
  "stuck 15 1"
  "attach_live 30 1"
  "check_tiny-moe 20 1" "check_tiny-qwen3 20 1" "check_tiny-gemma3 20 1" "check_smollm2-135m 30 1"
  "backend 30 1" "backend_per_op 25 0"
  "bench 75 1"
  "test_cuda_ops 60 0" "test_cuda_engine 90 1" "test_cuda_backend 90 1"
  "bench_b8 45 1" "engine_bench 45 1" "bench_llama1b 45 1"
)

selected() {  # NAME: whether --steps (if given) names it
  [ -z "$ONLY" ] && return 0
  case ",$ONLY," in *",$1,"*) return 0 ;; esac
  return 1
}

if [ -n "$ONLY" ]; then  # a name that is no step is a usage error, said before anything runs
  IFS=, read -ra want <<<"$ONLY"
  for w in "${want[@]}"; do
    found=0
    for s in "${STEPS[@]}"; do [ "${s%% *}" = "$w" ] && found=1; done
    [ $found -eq 1 ] || { echo "device-check: no step '$w' (--dry-run lists them)" >&2; exit 2; }
  done
fi

scaled() { awk -v b="$1" -v f="$SCALE" 'BEGIN { v = int(b * f + 0.5); print v < 1 ? 1 : v }'; }

if [ $DRY -eq 1 ]; then
  total=0
  for s in "${STEPS[@]}"; do
    read -r name budget _ <<<"$s"
    selected "$name" || continue
    b=$(scaled "$budget")
    echo "$name $b"
    total=$((total + b))
  done
  echo "total: $total s"
  echo "device-check: the global deadline is ${DEADLINE}s (--deadline)" >&2
  [ -x "$BUNDLE/bin/megascope" ] || [ -n "$BIN" ] ||
    echo "device-check: no $BUNDLE/bin: a real run builds $BUILD first (up to 300 s, outside the steps)" >&2
  exit 0
fi

# ---- binaries --------------------------------------------------------------

T0=$(date +%s)
say() { echo "device-check [$(($(date +%s) - T0))s]: $*" >&2; }
export PATH=$PATH:/usr/local/cuda/bin
BUILT=
if [ -n "$BIN" ]; then
  BIN=$(cd "$BIN" && pwd) || { echo "device-check: --bin $BIN: no such folder" >&2; exit 2; }
  OUTBASE=$BIN
  export MS_MONITORS=${MS_MONITORS:-$BIN/monitors}
elif [ -x "$BUNDLE/bin/megascope" ]; then
  say "using $BUNDLE (commit $(cat "$BUNDLE/COMMIT" 2>/dev/null), sm_$(cat "$BUNDLE/ARCH" 2>/dev/null))"
  BIN=$BUNDLE/bin OUTBASE=$BUNDLE
  export MS_MONITORS=$BUNDLE/monitors
  export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  BIN=$BUILD OUTBASE=$BUILD BUILT=1
  export MS_MONITORS=$BUILD/monitors
fi
[ -n "$REPORT" ] || REPORT=${OUT:-$OUTBASE}/device-report.json
mkdir -p "$(dirname "$REPORT")" || exit 1
REPORT=$(cd "$(dirname "$REPORT")" && pwd)/$(basename "$REPORT")
LOGDIR=$(dirname "$REPORT")/device-logs
rm -rf "$LOGDIR"
mkdir -p "$LOGDIR" || exit 1
MS=$BIN/megascope

# ---- the report --------------------------------------------------------------
# Written by this shell alone (a bare CUDA image may have no python): each
# step's fields in $LOGDIR/NAME.{status,rc,secs,budget}, its output in
# NAME.out (stdout) and NAME.log (stderr), NAME.json when NAME.out was found
# whole JSON as the step ended; the report is remade from them, into a
# temporary file renamed over the last one, before and after every step and
# on a signal (which runs nothing but this shell's own commands).

json_str() {  # TEXT: a JSON string (control bytes dropped, quotes and backslashes escaped)
  printf '%s' "$1" | LC_ALL=C tr -d '\000-\010\013\014\016-\037\177-\377' |
    LC_ALL=C sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' | LC_ALL=C awk 'BEGIN { ORS = "" } { if (NR > 1) print "\\n"; print }' |
    { printf '"'; cat; printf '"'; }
}

valid_json() {  # FILE [RC]: one whole JSON document: python3 says so, or (without it) the
  [ -s "$1" ] || return 1  # binary that wrote it exited 0 and it opens with a brace
  if command -v python3 >/dev/null; then python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$1" 2>/dev/null; return; fi
  [ "${2:-1}" = 0 ] && [ "$(LC_ALL=C tr -d ' \n\t' <"$1" | head -c 1)" = "{" ]
}

field() { [ -f "$LOGDIR/$1.$2" ] && cat "$LOGDIR/$1.$2"; }

# The watchdog's report in a step's output, if it printed one.
watchdog_report() {
  cat "$LOGDIR/$1.log" "$LOGDIR/$1.out" 2>/dev/null |
    awk '/cuda: (stuck|no heartbeat)/ { on = 1 } on { print; if (++n >= 40) exit }'
}

write_report() {  # RUNNING: the step in flight ("" none)
  local running=$1 tmp=$REPORT.tmp first=1 name budget mega st
  {
    printf '{\n  "commit": %s,\n' "$(json_str "$(cat "$BUNDLE/COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse HEAD 2>/dev/null)")"
    printf '  "elapsed_s": %d,\n  "deadline_s": %d,\n' $(($(date +%s) - T0)) "$DEADLINE"
    printf '  "device": '
    if [ -f "$LOGDIR/info.json" ]; then cat "$LOGDIR/info.out"; else printf 'null'; fi
    printf ',\n  "running": %s,\n' "$(if [ -n "$running" ]; then json_str "$running"; else printf 'null'; fi)"
    printf '  "hung": %s,\n' "$(if [ -n "${HUNG:-}" ]; then json_str "$HUNG"; else printf 'null'; fi)"
    printf '  "steps": {'
    for s in "${STEPS[@]}"; do
      read -r name budget mega <<<"$s"
      st=$(field "$name" status) || continue
      [ $first -eq 1 ] || printf ','
      first=0
      printf '\n    %s: {"status": %s, "rc": %s, "seconds": %s, "budget_s": %s' "$(json_str "$name")" \
        "$(json_str "$st")" "$(field "$name" rc || echo null)" "$(field "$name" secs || echo null)" \
        "$(field "$name" budget || echo null)"
      [ -f "$LOGDIR/$name.note" ] && printf ', "note": %s' "$(json_str "$(cat "$LOGDIR/$name.note")")"
      if [ -f "$LOGDIR/$name.json" ]; then
        printf ', "result": '
        cat "$LOGDIR/$name.out"
      fi
      local wd
      wd=$(watchdog_report "$name")
      [ -n "$wd" ] && printf ', "watchdog": %s' "$(json_str "$wd")"
      [ -f "$LOGDIR/$name.log" ] && printf ', "tail": %s' "$(json_str "$(tail -c 1500 "$LOGDIR/$name.log")")"
      printf '}'
    done
    printf '\n  },\n  "ok": %s\n}\n' "$(if [ "$FAILED" -eq 0 ]; then echo true; else echo false; fi)"
  } >"$tmp" && mv -f "$tmp" "$REPORT"
}

FAILED=0 HUNG= RUNNING= MEGA_OK=1 STEP_PID= NO_DEVICE=
on_signal() {
  if [ -n "$STEP_PID" ]; then  # the step's commands: this script's own children, ended first
    pkill -TERM -P "$STEP_PID" 2>/dev/null
    kill -TERM "$STEP_PID" 2>/dev/null
    wait "$STEP_PID" 2>/dev/null
  fi
  [ -n "$RUNNING" ] && echo killed >"$LOGDIR/$RUNNING.status"
  FAILED=1
  write_report "$RUNNING"
  say "stopped by a signal during ${RUNNING:-no step}; report: $REPORT"
  exit 1
}
trap on_signal TERM INT HUP

# ---- what each step runs and how it is judged --------------------------------
# step_NAME runs the step's commands with its limit (under `timeout`), stdout
# to NAME.out, stderr to NAME.log; its status: 0 passed, 1 failed, 124/137 its
# limit ran out.

lim() { timeout -k 5 "$LIMIT" "$@"; }

ops_step() { lim "$MS" cuda ops --synthetic "$1" --dtype bf16 --batch 4; }
check_step() {
  lim "$MS" cuda run --synthetic "$1" --dtype bf16 --batch 4 --requests 8 --new 12 --check --json --watchdog-ms 3000
}

run_step() {  # NAME
  local name=$1 out=$LOGDIR/$1.out log=$LOGDIR/$1.log
  case $name in
    info) lim "$MS" cuda info --json >"$out" 2>"$log" || return
      command -v nvidia-smi >/dev/null && timeout 5 nvidia-smi >>"$log" 2>&1
      return 0 ;;
    ops_*) ops_step "${name#ops_}" >"$log" 2>&1 ;;
    smoke) check_step tiny >"$out" 2>"$log" ;;
    check_*) check_step "${name#check_}" >"$out" 2>"$log" ;;
    stuck)  # a lost trigger: the run must end with the watchdog naming it, within the budget
      lim "$MS" cuda run --synthetic tiny --dtype bf16 --batch 4 --requests 4 --new 8 --json --watchdog-ms 2000 \
        --fault-lost-trigger 1 >"$out" 2>"$log"
      local rc=$?
      [ $rc -eq 124 ] || [ $rc -eq 137 ] && return $rc
      grep -q "cuda: stuck:" "$out" "$log" && grep -q "not yet triggered: embed\[row 0\] (task 1)" "$out" "$log" ;;
    attach_live)  # attached while steps are in flight: the JSON's attach.while_running
      lim "$MS" cuda run --synthetic "$MODEL" --dtype bf16 --batch 4 --requests 64 --new 48 --json --watchdog-ms 5000 \
        --attach "$MS_MONITORS/class_time.bpf.o" >"$out" 2>"$log" || return
      grep -q '"while_running": *true' "$out" ;;
    backend|backend_per_op)  # the engine's CUDA backend; its log line has the handover figures
      local mode=megakernel
      [ "$name" = backend_per_op ] && mode=per-op
      lim "$MS" run --synthetic "$MODEL" --dtype bf16 --backend cuda --mode $mode --batch 4 --requests 8 --steps 24 \
        --check --json >"$out" 2>"$log" || return
      grep -q "steps handed over" "$log" ;;
    test_cuda_*) [ -x "$BIN/$name" ] || { echo "no $BIN/$name" >"$LOGDIR/$name.note"; return 77; }
      lim "$BIN/$name" >"$log" 2>&1 ;;
    bench) lim "$MS" cuda bench --synthetic "$MODEL" --dtype bf16 --batch 1 --requests 4 --new 128 --json >"$out" 2>"$log" ;;
    bench_b8) lim "$MS" cuda bench --synthetic "$MODEL" --dtype bf16 --batch 8 --requests 16 --new 64 --json >"$out" 2>"$log" ;;
    engine_bench) lim "$MS" bench decode --synthetic "$MODEL" --dtype bf16 --backend cuda --batch 1 --steps 64 \
      --rounds 3 --json >"$out" 2>"$log" ;;
    bench_llama1b) lim "$MS" cuda bench --synthetic llama-3.2-1b --dtype bf16 --batch 1 --requests 2 --new 64 --json \
      >"$out" 2>"$log" ;;
    *) echo "device-check: no step $name" >&2; return 1 ;;
  esac
}

# ---- the run -----------------------------------------------------------------

if [ -n "$BUILT" ]; then
  if [ ! -f "$BUILD/build.ninja" ] && [ ! -f "$BUILD/Makefile" ]; then
    gen=
    command -v ninja >/dev/null && gen="-G Ninja"
    say "configuring $BUILD for sm_$CUDA_ARCH"
    # shellcheck disable=SC2086
    timeout 120 cmake -S "$ROOT" -B "$BUILD" $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
      >"$LOGDIR/configure.log" 2>&1 || { say "configure failed (see $LOGDIR/configure.log)"; exit 1; }
  fi
  say "building"
  timeout 300 cmake --build "$BUILD" -j "$(nproc)" --target megascope test_cuda_engine test_cuda_ops \
    test_cuda_backend monitors >"$LOGDIR/build.log" 2>&1 || { say "build failed (see $LOGDIR/build.log)"; exit 1; }
fi
[ -x "$MS" ] || { echo "device-check: no $MS" >&2; exit 1; }

write_report ""
for s in "${STEPS[@]}"; do
  read -r name budget mega <<<"$s"
  selected "$name" || continue
  budget=$(scaled "$budget")
  echo "$budget" >"$LOGDIR/$name.budget"
  left=$((DEADLINE - ($(date +%s) - T0)))
  if [ -n "$NO_DEVICE" ] || { [ "$mega" -eq 1 ] && [ $MEGA_OK -eq 0 ]; }; then
    echo gated >"$LOGDIR/$name.status"
    echo "${NO_DEVICE:-the megakernel smoke run failed}" >"$LOGDIR/$name.note"
    write_report ""
    continue
  fi
  if [ $left -lt $((budget < 10 ? budget : 10)) ]; then  # less than its budget (or 10 s) left: skip, say so
    echo skipped >"$LOGDIR/$name.status"
    echo "the global deadline: ${left}s left of ${DEADLINE}s" >"$LOGDIR/$name.note"
    say "$name skipped (${left}s left)"
    write_report ""
    continue
  fi
  LIMIT=$((budget < left ? budget : left))
  echo running >"$LOGDIR/$name.status"
  RUNNING=$name
  write_report "$name"
  say "$name (up to ${LIMIT}s)"
  t1=$(date +%s)
  (trap - TERM INT HUP; run_step "$name") &  # waited for, so that a signal is handled at once
  STEP_PID=$!
  wait $STEP_PID
  rc=$?
  STEP_PID= RUNNING=
  echo $(($(date +%s) - t1)) >"$LOGDIR/$name.secs"
  echo $rc >"$LOGDIR/$name.rc"
  valid_json "$LOGDIR/$name.out" "$rc" && : >"$LOGDIR/$name.json"
  case $rc in
    0) echo ok >"$LOGDIR/$name.status" ;;
    77) echo skipped >"$LOGDIR/$name.status" ;;
    124|137) echo timeout >"$LOGDIR/$name.status"
      HUNG=${HUNG:+$HUNG,}$name
      FAILED=1
      say "$name ran out of its ${LIMIT}s" ;;
    *) echo failed >"$LOGDIR/$name.status"
      FAILED=1
      say "$name failed ($rc)"
      tail -5 "$LOGDIR/$name.log" 2>/dev/null >&2 ;;
  esac
  [ "$name" = smoke ] && [ $rc -ne 0 ] && MEGA_OK=0
  if [ "$name" = info ] && grep -q '"available": *false' "$LOGDIR/info.out" 2>/dev/null; then
    NO_DEVICE="no device: $(sed -n 's/.*"reason": *"\([^"]*\)".*/\1/p' "$LOGDIR/info.out")"
    FAILED=1
    say "$NO_DEVICE"
  fi
  write_report ""
done
left_out=
for s in "${STEPS[@]}"; do  # what the deadline left out, for a rerun
  read -r name _ <<<"$s"
  [ "$(field "$name" status)" = skipped ] && [ ! -f "$LOGDIR/$name.rc" ] && left_out=${left_out:+$left_out,}$name
done
[ -n "$left_out" ] && say "left out by the deadline; to run them: --steps $left_out"
say "report: $REPORT"
exit $FAILED
