#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What an operator types cannot crash the query compiler: a predicate of 12,000
# nested parentheses (and deep unary and binary chains) is refused with the
# depth and the column named, by `run --query` and by `query -f` against a live
# `megascope serve`, which keeps serving; an expression at the limit compiles.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
for t in curl python3; do
  command -v "$t" >/dev/null || { echo "skipped: no $t"; exit 77; }
done
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
serve_scratch
fail() { echo "FAILED: $*"; exit 1; }

python3 - "$tmp" <<'PY'
import sys
d = sys.argv[1]
def q(pred): return "task_end /" + pred + "/ { @n = count() }\n"
open(d + "/parens.q", "w").write(q("(" * 12000 + "t_end > t_begin" + ")" * 12000))
open(d + "/unary.q", "w").write(q("!" * 12000 + "(t_end > t_begin)"))
open(d + "/chain.q", "w").write(q("t_end" + " + 1" * 12000 + " > 0"))
open(d + "/limit.q", "w").write(q("(" * 256 + "t_end > t_begin" + ")" * 256))
PY

refused() {  # refused RC OUT: a refusal (exit 1 or 2, not a signal), the depth and a column named
  local rc=$1 out=$2
  [ "$rc" -eq 1 ] || [ "$rc" -eq 2 ] || { cat "$out"; fail "exit $rc, expected a refusal (1 or 2), not a crash"; }
  grep -q 'column [0-9]*: expression nested too deeply: more than 256 levels' "$out" || { cat "$out"; fail "no depth and column"; }
}

for f in parens unary chain; do
  rc=0
  "$MS" run --synthetic tiny --steps 2 --query "$(cat "$tmp/$f.q")" >"$tmp/run-$f.out" 2>&1 || rc=$?
  refused "$rc" "$tmp/run-$f.out"
done
"$MS" run --synthetic tiny --steps 2 --query "$(cat "$tmp/limit.q")" >"$tmp/run-limit.out" 2>&1 ||
  { cat "$tmp/run-limit.out"; fail "256 levels of parentheses were refused"; }

start_serve d --synthetic tiny --workers 2
for f in parens unary chain; do
  rc=0
  "$MS" query --socket "$SOCK" -f "$tmp/$f.q" --for 100ms >"$tmp/q-$f.out" 2>&1 || rc=$?
  refused "$rc" "$tmp/q-$f.out"
done
"$MS" query --socket "$SOCK" -f "$tmp/limit.q" --for 100ms >"$tmp/q-limit.out" 2>&1 ||
  { cat "$tmp/q-limit.out"; fail "query -f at the limit failed"; }
[ "$(completion "hello" 4 "$tmp/c.json")" = 200 ] || fail "serve stopped answering"
stop_serve d
echo "query depth: refused at 12,000 levels (run --query, query -f), served on"
