#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What a query costs, measured in one sitting (docs/query.md, docs/performance.md):
#  1. Enter to first event: N times `megascope query` (a new process each time:
#     schema, compile, attach, first executed event seen over the socket)
#     against `megascope serve` while two clients keep completions in flight;
#     median and worst, and every completion must have succeeded.
#  2. Decode throughput with a typical query attached against detached, and
#     ns per run of its task_end program (JIT and interpreter): `bench hooks`
#     with the query's bundle as the monitor, rounds interleaved in one process.
#  3. Generated code size against the same questions written in C
#     (bench/query_equiv/*.bpf.c) compiled with clang -O2.
# Usage: scripts/query-bench.sh [BUILD_DIR] [ATTACHES]
set -euo pipefail
B=${1:-build}
N=${2:-100}
MS="$B/megascope"
SRC=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
SERVE_PID=""
cleanup() {
  touch "$tmp/stop"
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then kill -TERM "$SERVE_PID"; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=tests/serve_lib.sh
MS=$MS source "$SRC/tests/serve_lib.sh"

echo "== 1. Enter to first event, $N queries against serve --synthetic tiny under load"
start_serve b --synthetic tiny
load() {
  local i=0
  while [ ! -e "$tmp/stop" ]; do
    i=$((i + 1))
    code=$(completion "load $1 $i" 24 "$tmp/load$1.json")
    echo "$code" >>"$tmp/codes"
  done
}
load 1 &
l1=$!
load 2 &
l2=$!
sleep 0.5
: >"$tmp/first"
for i in $(seq 1 "$N"); do
  "$MS" query --socket "$SOCK" --for 100ms 'task_end /op == attn/ { @[class] = count() }' \
    >/dev/null 2>"$tmp/q.err" || { cat "$tmp/q.err"; exit 1; }
  grep -o 'first event [0-9.]* ms' "$tmp/q.err" | awk '{print $3}' >>"$tmp/first" || true
done
touch "$tmp/stop"
wait "$l1" "$l2" || true
python3 - "$tmp/first" "$tmp/codes" "$N" <<'EOF'
import statistics, sys
v = [float(x) for x in open(sys.argv[1]) if x.strip()]
codes = [x.strip() for x in open(sys.argv[2]) if x.strip()]
bad = [c for c in codes if c != "200"]
n = int(sys.argv[3])
print(f"queries {n}: first event seen in {len(v)}; Enter to first event median {statistics.median(v):.1f} ms, "
      f"worst {max(v):.1f} ms, best {min(v):.1f} ms")
print(f"completions meanwhile: {len(codes)}, failed {len(bad)}")
sys.exit(1 if bad or len(v) < n else 0)
EOF
stop_serve b
SERVE_PID=""

echo "== 2. decode throughput, query attached vs detached (bench hooks, one process)"
"$MS" compile --synthetic smollm2-135m --batch 1 --schema-out "$tmp/schema.json" >/dev/null
Q='task_begin { @began[class] = count() } task_end { @ns[class] = hist(t_end - t_begin) }'
echo "query: $Q"
"$MS" query --schema "$tmp/schema.json" --emit "$tmp/q.msbpf" "$Q"
"$MS" bench hooks --monitor "$tmp/q.msbpf" --rounds 3
echo "the same question in the shipped hand-written monitor (class_time.bpf.o), for comparison:"
"$MS" bench hooks --rounds 3

echo "== 3. code size: the query's programs against the same question in C (clang -O2)"
ARCH=$(uname -m)
for pair in "class_count:task_end { @[class] = count() }" "class_hist:task_end { @[class] = hist(t_end - t_begin) }"; do
  name=${pair%%:*}
  q=${pair#*:}
  clang -O2 -g -target bpf -I"$SRC/include" -I"/usr/include/$ARCH-linux-gnu" \
    -c "$SRC/bench/query_equiv/$name.bpf.c" -o "$tmp/$name.o"
  c_insns=$("$MS" bpf objdump "$tmp/$name.o" | grep -o ', [0-9]* insns' | awk '{print $2}')
  "$MS" query --schema "$tmp/schema.json" --emit "$tmp/$name.msbpf" "$q"
  q_insns=$("$MS" bpf objdump "$tmp/$name.msbpf" | grep -o ', [0-9]* insns' | awk '{print $2}')
  echo "$q: query $q_insns instruction slots, the same in C with clang -O2 $c_insns"
done
