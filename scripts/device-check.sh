#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every GPU test and benchmark of the CUDA backend in one run, for a machine
# with an NVIDIA GPU (sized for under 8 minutes on an H200). Writes one JSON
# report: device, the GPU tests, each task body against its CPU twin, tokens
# against the CPU engine, and the bench (megakernel and per-op CUDA Graph
# tokens/s, fraction of the HBM bound, hook cost detached and attached, attach
# latency on the device).
#
#   scripts/device-check.sh [REPORT.json]     (default: $OUT/device-report.json,
#                                              or the build folder's)
# Two ways to get the binaries:
#  - device-bundle/ (scripts/device-bundle.sh, made where the Debian packages
#    are): used as it is, with its bundled libraries; for a bare CUDA image such
#    as the device tool's (carry ["device-bundle"]);
#  - otherwise a build: BUILD (default build-gpu; reused when configured),
#    CUDA_ARCH (default 90); needs the packages scripts/deps.sh installs.
# MODEL: the bench preset (default smollm2-135m).
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${BUNDLE:-device-bundle}
BUILD=${BUILD:-build-gpu}
CUDA_ARCH=${CUDA_ARCH:-90}
MODEL=${MODEL:-smollm2-135m}
if [ -x "$BUNDLE/bin/megascope" ]; then OUTBASE=$BUNDLE; else OUTBASE=$BUILD; fi
REPORT=${1:-${OUT:-$OUTBASE}/device-report.json}
LOGDIR=$(dirname "$REPORT")/device-logs
mkdir -p "$LOGDIR"
t0=$(date +%s)
say() { echo "device-check [$(( $(date +%s) - t0 ))s]: $*" >&2; }

export PATH=$PATH:/usr/local/cuda/bin
if [ -x "$BUNDLE/bin/megascope" ]; then
  say "using $BUNDLE (commit $(cat "$BUNDLE/COMMIT" 2>/dev/null), sm_$(cat "$BUNDLE/ARCH" 2>/dev/null))"
  BIN=$BUNDLE/bin
  export MS_MONITORS=$PWD/$BUNDLE/monitors
  export LD_LIBRARY_PATH=$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  if [ ! -f "$BUILD/build.ninja" ] && [ ! -f "$BUILD/Makefile" ]; then
    gen=; command -v ninja >/dev/null && gen="-G Ninja"
    say "configuring $BUILD for sm_$CUDA_ARCH"
    cmake -S . -B "$BUILD" $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
      >"$LOGDIR/configure.log" 2>&1 || { say "configure failed (see $LOGDIR/configure.log)"; tail -20 "$LOGDIR/configure.log"; exit 1; }
  fi
  say "building"
  cmake --build "$BUILD" -j "$(nproc)" --target megascope test_cuda_engine test_cuda_ops test_cuda_backend monitors \
    >"$LOGDIR/build.log" 2>&1 || { say "build failed"; tail -30 "$LOGDIR/build.log"; exit 1; }
  BIN=$BUILD
  export MS_MONITORS=$PWD/$BUILD/monitors
fi
MS="$BIN/megascope"
"$MS" cuda info --json >"$LOGDIR/info.json" || true
cat "$LOGDIR/info.json" >&2

status=0
run() {  # name, timeout seconds, command...: output in $LOGDIR/name.log, rc in $LOGDIR/name.rc
  local name=$1 limit=$2; shift 2
  say "$name"
  timeout "$limit" "$@" >"$LOGDIR/$name.log" 2>&1
  local rc=$?
  echo $rc >"$LOGDIR/$name.rc"
  [ $rc -eq 0 ] || { status=1; say "$name failed ($rc)"; tail -15 "$LOGDIR/$name.log" >&2; }
}

run test_cuda_engine 180 "$BIN/test_cuda_engine"
run test_cuda_ops 120 "$BIN/test_cuda_ops"
run test_cuda_backend 180 "$BIN/test_cuda_backend"   # the engine's CUDA backend (fed mode)
run engine_check 90 "$MS" run --synthetic smollm2-135m --dtype bf16 --backend cuda --batch 4 --requests 8 --steps 12 \
  --check --attach "$MS_MONITORS/class_time.bpf.o" --json
run engine_bench 150 "$MS" bench decode --synthetic "$MODEL" --dtype bf16 --backend cuda --batch 1 --steps 64 \
  --rounds 3 --json
run cli_cuda 120 bash tests/cli_cuda.sh "$MS"
for p in tiny tiny-moe tiny-qwen3 tiny-qwen2 tiny-gemma3 smollm2-135m; do
  run "ops_$p" 60 "$MS" cuda ops --synthetic "$p" --dtype bf16 --batch 4
  run "check_$p" 90 "$MS" cuda run --synthetic "$p" --dtype bf16 --batch 4 --requests 8 --new 12 --check --json
done
run bench 240 "$MS" cuda bench --synthetic "$MODEL" --dtype bf16 --batch 1 --requests 4 --new 128 --json
run bench_b8 120 "$MS" cuda bench --synthetic "$MODEL" --dtype bf16 --batch 8 --requests 16 --new 64 --json
# Llama-3.2-1B shapes (synthetic weights), the published megakernels' model, when time allows
if [ $(( $(date +%s) - t0 )) -lt 300 ]; then
  run bench_llama1b 150 "$MS" cuda bench --synthetic llama-3.2-1b --dtype bf16 --batch 1 --requests 2 --new 64 --json
else
  say "skipping the Llama-3.2-1B bench (over 300 s already)"
fi

python3 - "$LOGDIR" "$REPORT" "$status" <<'EOF'
import json, os, sys
d, out, status = sys.argv[1], sys.argv[2], int(sys.argv[3])
def text(n):
    p = os.path.join(d, n)
    return open(p).read() if os.path.exists(p) else ""
def rc(n):
    t = text(n + ".rc").strip()
    return int(t) if t else None
def js(n):
    t = text(n)
    try:
        return json.loads(t[t.index("{"):]) if "{" in t else None
    except ValueError:
        return None
rep = {"device": js("info.json"), "ok": status == 0, "steps": {}}
for f in sorted(os.listdir(d)):
    if f.endswith(".rc"):
        n = f[:-3]
        rep["steps"][n] = {"rc": rc(n), "result": js(n + ".log"), "tail": text(n + ".log")[-1500:]}
rep["bench_batch1"] = rep["steps"].get("bench", {}).get("result")
rep["bench_batch8"] = rep["steps"].get("bench_b8", {}).get("result")
rep["bench_llama1b"] = rep["steps"].get("bench_llama1b", {}).get("result")
json.dump(rep, open(out, "w"), indent=2)
print(json.dumps({"ok": rep["ok"], "bench_batch1": rep["bench_batch1"], "bench_batch8": rep["bench_batch8"],
                  "bench_llama1b": rep["bench_llama1b"]}, indent=2))
EOF
say "report: $REPORT"
exit $status
