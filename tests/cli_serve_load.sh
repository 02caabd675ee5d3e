#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The serving load benchmark (scripts/serve-load.py) end to end on a synthetic
# model: it starts `megascope serve` itself (and, asked, one with
# --no-prefix-cache and one without the step budget), says that no
# llama-server was given, runs a few streamed requests at concurrency 2 on
# each, and its --json has every server and level with no request failed and
# the figures it prints. No figure is judged: timing is the machine's.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; cat "$tmp/err" 2>/dev/null || true; exit 1; }

timeout 300 python3 "$SRC/scripts/serve-load.py" --megascope "$MS" --serve-args "--synthetic tiny" \
  --ctx 512 --parallel 4 --levels 1,2 --requests 4 --reps 2 --max-tokens 8 --warmup-s 0 --no-prefix-cache \
  --variant budget-off='--step-target-ms 0' --json >"$tmp/out.json" 2>"$tmp/err" || fail "serve-load.py exited $?"
grep -q "llama-server not given: megascope only" "$tmp/err" || fail "no 'megascope only' note"
python3 - "$tmp/out.json" <<'PY' || fail "the JSON"
import json, sys
d = json.load(open(sys.argv[1]))
names = [s["name"] for s in d["servers"]]
assert names == ["megascope", "megascope-no-prefix-cache", "megascope-budget-off"], names
assert d["levels"] == [1, 2] and d["reps"] == 2 and d["llama_server"] is False
seen = set()
for s in d["servers"]:
    assert [lv["concurrency"] for lv in s["levels"]] == [1, 2]
    for lv in s["levels"]:
        assert lv["failed"] == 0 and len(lv["runs"]) == 2, lv
        for r in lv["runs"]:
            assert r["requests"] == 4 and 0 <= r["completion_tokens"] <= 32, r
        m = lv["tokens_per_s"]
        assert 0 < m["min"] <= m["median"] <= m["max"], m
        # a latency is null where no stream of the level had one: the synthetic
        # model's greedy tokens move with the batching, and a stream may end at
        # its first token (no gap between tokens) or before it
        for k in ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "itl_p99"):
            m = lv[k]
            if m["median"] is None:
                assert m["min"] is None and m["max"] is None, (k, m)
            else:
                assert m["min"] <= m["median"] <= m["max"], (k, m)
                seen.add(k)
assert len(seen) == 5, ("latencies no level had", seen)
PY
# the table: a row per server and level
timeout 120 python3 "$SRC/scripts/serve-load.py" --megascope "$MS" --serve-args "--synthetic tiny" \
  --ctx 512 --parallel 4 --levels 2 --requests 2 --reps 1 --max-tokens 4 --warmup-s 0 >"$tmp/out.txt" 2>"$tmp/err" ||
  fail "serve-load.py (table) exited $?"
grep -q "llama-server not given: megascope only" "$tmp/out.txt" || fail "no 'megascope only' note (table)"
grep -Eq "^megascope +2 +[0-9.]+ \[" "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "no table row"; }
echo "cli_serve_load: passed"
