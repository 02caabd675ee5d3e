#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prometheus scrapes a serving engine: /metrics passes `promtool check metrics`;
# Debian's prometheus, started on loopback with a generated configuration (and
# docs/alerts.yml loaded), scrapes it, and the series are read back through its
# HTTP API (/api/v1/query): TTFT and TPOT histograms, step and token counters,
# per-class task time and dependency wait, an attachment's coverage counters.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MON=${MS_MONITORS:-}
for t in prometheus promtool curl python3; do
  command -v "$t" >/dev/null || { echo "skipped: no $t"; exit 77; }
done
[ -n "$MON" ] && [ -f "$MON/class_time.bpf.o" ] || { echo "skipped: no shipped monitors"; exit 77; }
tmp=$(mktemp -d)
SERVE_PID="" PROM_PID=""
cleanup() {
  for p in $PROM_PID $SERVE_PID; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
fail() { echo "FAILED: $*"; exit 1; }

start_serve p --synthetic tiny --batch 4 --workers 2 --max-ctx 128
"$MS" attach --socket "$SOCK" "$MON/class_time.bpf.o" >/dev/null
for i in 1 2 3 4 5 6; do
  [ "$(completion "prompt $i" 12 "$tmp/c$i.json")" = 200 ] || fail "completion $i"
done
curl -s --max-time 30 -D "$tmp/headers" -o "$tmp/metrics.txt" "$URL/metrics"
grep -qi '^content-type: text/plain; version=0.0.4' "$tmp/headers" || fail "content type"
promtool check metrics <"$tmp/metrics.txt" || fail "promtool check metrics"

port=${URL##*:}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $SRC/docs/alerts.yml
scrape_configs:
  - job_name: megascope
    static_configs:
      - targets: ["127.0.0.1:$port"]
YML
api=""
for attempt in 1 2 3 4 5; do  # a port taken between choosing and binding: try another
  pport=$(free_port)
  prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data$attempt" \
    --web.listen-address="127.0.0.1:$pport" >"$tmp/prometheus.log" 2>&1 &
  PROM_PID=$!
  for _ in $(seq 1 300); do  # ready within 30 s
    if curl -sf --max-time 2 "http://127.0.0.1:$pport/-/ready" >/dev/null 2>&1; then
      api="http://127.0.0.1:$pport/api/v1"
      break
    fi
    kill -0 "$PROM_PID" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$api" ] && break
  kill -KILL "$PROM_PID" 2>/dev/null || true
  wait "$PROM_PID" 2>/dev/null || true
done
[ -n "$api" ] || { cat "$tmp/prometheus.log"; fail "prometheus did not start"; }

query() { curl -s --max-time 10 -G "$api/query" --data-urlencode "query=$1"; }
# value QUERY: the first result's value, or nothing
value() {
  query "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)
r = d.get("data", {}).get("result", [])
print(r[0]["value"][1] if d.get("status") == "success" and r else "")'
}
got=""
for _ in $(seq 1 600); do  # the first scrape, within 60 s
  got=$(value 'megascope_steps_total{job="megascope"}')
  [ -n "$got" ] && break
  sleep 0.1
done
[ -n "$got" ] || { cat "$tmp/prometheus.log"; fail "no scrape reached prometheus"; }
echo "megascope_steps_total = $got"

pass=0
check() {  # name query python-condition-on-v
  local v
  v=$(value "$2")
  python3 -c "import sys; v=float(sys.argv[1]); sys.exit(0 if ($3) else 1)" "${v:-nan}" \
    || fail "$1: $2 = '${v}'"
  echo "  $1: $2 = $v"
  pass=$((pass + 1))
}
check up 'up{job="megascope"}' 'v == 1'
check steps 'megascope_steps_total' 'v > 0'
check tokens 'megascope_tokens_generated_total' 'v >= 72'
check ttft_count 'megascope_ttft_seconds_count' 'v >= 6'
check ttft_inf 'megascope_ttft_seconds_bucket{le="+Inf"}' 'v >= 6'
check tpot_p90 'histogram_quantile(0.9, megascope_tpot_seconds_bucket)' 'v > 0'
check class_time 'megascope_class_task_seconds_total{class="blk.0.qkv"}' 'v > 0'
check class_tasks 'megascope_class_tasks_total{class="lm_head"}' 'v > 0'
check dep_wait 'sum(megascope_class_dep_wait_seconds_total)' 'v >= 0'
check coverage 'megascope_attachment_executed_total{monitor="class_time"}' 'v > 0'
check eligible 'megascope_attachment_eligible_total{id="1",monitor="class_time"}' 'v > 0'
check http 'megascope_http_completions_total' 'v >= 6'
# the alert rules were loaded next to the data they watch
curl -s --max-time 10 "$api/rules" | python3 -c '
import json, sys
d = json.load(sys.stdin)
names = {r["name"] for g in d["data"]["groups"] for r in g["rules"]}
need = {"MegascopeTTFTHigh", "MegascopeTPOTHigh", "MegascopeDependencyStalls"}
sys.exit(0 if need <= names else 1)' || fail "alert rules not loaded"
pass=$((pass + 1))

kill -TERM "$PROM_PID"
wait "$PROM_PID" 2>/dev/null || true
PROM_PID=""
stop_serve p || fail "clean stop"
echo "$((pass + 1)) passed, 0 failed"
