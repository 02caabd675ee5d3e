#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What llama-server's and vLLM's users type and read: serve started with their
# option spellings (-c, -t, -np, --alias, listed in --help), the served model's
# id in /v1/models (the name given, else the file's stem or the preset's), a
# request naming another model answered 404 model_not_found as OpenAI answers
# it (--accept-any-model serves it), the prefix cache on by default (a second
# request sharing a prompt prefix reads it from the cache: /metrics, `stats`
# and a query one-liner say so; --no-prefix-cache computes it again), every
# /metrics serving series carrying model_name, and with --metrics-compat vllm every
# series of tests/data/vllm_metrics.txt (taken from vLLM's documentation) with
# its type and label names.
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

# ---- the spellings, in --help and refused when wrong ----
"$MS" serve --help >"$tmp/help.txt"
for want in "also -c, --ctx-size, --max-model-len" "also -t, --threads" "also --parallel, -np, --max-num-seqs" \
  "also -a, --alias" "also -m" "--served-model-name NAME" "--no-prefix-cache" "--metrics-compat NAME" \
  "--accept-any-model" "also --no-enable-prefix-caching"; do
  grep -qF -- "$want" "$tmp/help.txt" || { cat "$tmp/help.txt"; fail "serve --help lacks '$want'"; }
done
rc=0
"$MS" serve --synthetic tiny --metrics-compat prom >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] && grep -q "expected none or vllm" "$tmp/err" || { cat "$tmp/err"; fail "--metrics-compat prom: $rc"; }
rc=0
"$MS" serve --synthetic tiny -c zero >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--max-ctx 'zero'" "$tmp/err" || { cat "$tmp/err"; fail "-c zero: $rc"; }

# token-id prompts: a shared 40-token prefix (two whole pages of 16), then each its own
prompt() { python3 -c "import sys; print([ (7 * i + 3) % 200 + 1 for i in range(40)] + [int(a) for a in sys.argv[1:]])" "$@"; }
post() {  # post BODY OUT: the HTTP status
  curl -s -o "$2" -w '%{http_code}' --max-time 120 -H 'Content-Type: application/json' -d "$1" "$URL/v1/completions"
}

# ---- llama-server's spellings, the cache on (the default), vLLM's series ----
start_serve a --synthetic tiny -c 128 -t 2 -np 4 --alias tiny-chat --metrics-compat vllm
grep -q "model id: tiny-chat; prefix cache on" "$tmp/a/serve.out" || { cat "$tmp/a/serve.out"; fail "banner"; }
grep -q "batch 4, context 128" "$tmp/a/serve.out" || { cat "$tmp/a/serve.out"; fail "-np 4 -c 128"; }
curl -s --max-time 30 "$URL/v1/models" >"$tmp/models.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert [m["id"] for m in d["data"]] == ["tiny-chat"], d' \
  "$tmp/models.json" || fail "/v1/models"
st=$(post "{\"model\": \"gpt-4o\", \"prompt\": $(prompt 5), \"max_tokens\": 4}" "$tmp/404.json")
[ "$st" = 404 ] || { cat "$tmp/404.json"; fail "another model: $st"; }
python3 - "$tmp/404.json" <<'PY' || fail "the 404's shape"
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert e["code"] == "model_not_found" and e["type"] == "invalid_request_error" and e["param"] is None, e
assert "`gpt-4o` does not exist" in e["message"] and "tiny-chat" in e["message"], e
PY
[ "$(post "{\"model\": \"tiny-chat\", \"prompt\": $(prompt 5 6), \"max_tokens\": 6, \"temperature\": 0}" "$tmp/r1.json")" = 200 ] ||
  { cat "$tmp/r1.json"; fail "first request"; }
[ "$(post "{\"prompt\": $(prompt 9 9 9), \"max_tokens\": 6, \"temperature\": 0}" "$tmp/r2.json")" = 200 ] ||
  { cat "$tmp/r2.json"; fail "second request"; }
# the answer's usage says so too, as OpenAI's and vLLM's do
python3 - "$tmp/r1.json" "$tmp/r2.json" <<'PY' || fail "usage.prompt_tokens_details.cached_tokens"
import json, sys
c = [json.load(open(p))["usage"]["prompt_tokens_details"]["cached_tokens"] for p in sys.argv[1:]]
assert c == [0, 32], c
PY
# which requests hit: a one-liner over the request hook (ABI v3's cached_tokens), while a third is served
"$MS" query --socket "$SOCK" --for 3s --json \
  'request /phase == admitted/ { @cached[req_slot, req_gen] = max(cached_tokens); @prompt[req_slot, req_gen] = max(prompt_tokens) }' \
  >"$tmp/query.json" &
QPID=$!
sleep 1
[ "$(post "{\"prompt\": $(prompt 1 2 3 4), \"max_tokens\": 4, \"temperature\": 0}" "$tmp/r3.json")" = 200 ] ||
  { cat "$tmp/r3.json"; fail "third request"; }
wait "$QPID" || { cat "$tmp/query.json"; fail "the query"; }
python3 - "$tmp/query.json" <<'PY' || { cat "$tmp/query.json"; fail "the query's answer"; }
import json, sys
d = json.load(open(sys.argv[1]))
maps = {m["name"]: m for m in d["maps"]} if "maps" in d else d
def values(name):
    m = maps["@" + name] if "@" + name in maps else maps[name]
    return [e["value"] for e in m["entries"]] if isinstance(m, dict) and "entries" in m else list(m.values())
assert values("cached") == [32] and values("prompt") == [44], d
PY
"$MS" stats --socket "$SOCK" >"$tmp/stats.txt"
grep -Eq '^prefix cache: [0-9.]+% hit rate \(64 of 129 prompt tokens cached; 2 requests hit\)' "$tmp/stats.txt" ||
  { cat "$tmp/stats.txt"; fail "stats: the hit rate"; }
curl -s --max-time 30 -o "$tmp/metrics.txt" "$URL/metrics"
python3 - "$tmp/metrics.txt" "$SRC/tests/data/vllm_metrics.txt" tiny-chat <<'PY' || fail "/metrics"
import re, sys
page, listing, model = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
types, samples = {}, []
for line in page.splitlines():
    if line.startswith("# TYPE "):
        _, _, name, t = line.split(" ", 3)
        types[name] = t
    elif line and not line.startswith("#"):
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        assert m, line
        labels = dict(re.findall(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        samples.append((m.group(1), labels, float(m.group(4))))
# every serving series carries the served model's name; the engine's internals and the server's own do not
serving = ("megascope_num_requests_", "megascope_kv_cache_usage_perc", "megascope_prompt_tokens_total",
           "megascope_generation_tokens_total", "megascope_request_", "megascope_e2e_request_latency_seconds",
           "megascope_ttft_seconds", "megascope_tpot_seconds", "megascope_inter_token_latency_seconds",
           "megascope_num_preemptions_total", "megascope_prefix_cache_", "megascope_requests_finished_total",
           "megascope_requests_cancelled_total", "megascope_tokens_generated_total", "vllm:")
bad = [s for s in samples if (s[1].get("model_name") == model) != s[0].startswith(serving)]
assert not bad, bad[:5]
assert sum(1 for s in samples if s[0].startswith(serving)) >= 60
def family(sample):
    for suf in ("_bucket", "_sum", "_count"):
        if sample.endswith(suf) and sample[: -len(suf)] in types:
            return sample[: -len(suf)]
    return sample
want = []
for line in open(listing):
    if line.strip() and not line.startswith("#"):
        name, t, labels, _ = line.split()
        want.append((name, t, labels.split(",")))
assert len(want) >= 19, len(want)
for name, t, labels in want:
    assert types.get(name) == t, (name, types.get(name), t)
    mine = [s for s in samples if family(s[0]) == name]
    assert mine, name
    for s, l, v in mine:
        assert set(l) - {"le"} >= set(labels), (s, l, labels)
value = {(s, tuple(sorted((k, v) for k, v in l.items() if k != "model_name"))): v for s, l, v in samples}
def one(name, **kw):
    return value[(name, tuple(sorted(kw.items())))]
# the same quantities under both names
assert one("vllm:prefix_cache_hits_total", engine="0") == one("megascope_prefix_cache_hits_total") == 64
assert one("vllm:prefix_cache_queries_total", engine="0") == one("megascope_prefix_cache_queries_total") == 129
assert one("vllm:num_preemptions_total", engine="0") == 0
assert sum(one("vllm:request_success_total", engine="0", finished_reason=r) for r in ("stop", "length", "abort")) == 3
assert one("vllm:prompt_tokens_total", engine="0") == one("megascope_prompt_tokens_total") == 129
assert one("vllm:request_prompt_tokens_count", engine="0") == one("megascope_request_prompt_tokens_count") == 3
assert one("vllm:request_prompt_tokens_sum", engine="0") == 129
gen = one("megascope_generation_tokens_total")
assert one("vllm:generation_tokens_total", engine="0") == gen == one("vllm:request_generation_tokens_sum", engine="0")
# inter-token latency: every token but each request's first
assert one("vllm:inter_token_latency_seconds_count", engine="0") == one("megascope_inter_token_latency_seconds_count") == gen - 3
for s, l, v in samples:
    assert not (s.startswith("vllm:") and l.get("engine") != "0"), (s, l)
print("metrics ok: %d families, %d vLLM series checked" % (len(types), len(want)))
PY
stop_serve a || fail "stop a"

# ---- the cache off, the preset's name, any model accepted, no vLLM series ----
start_serve b --synthetic tiny --max-ctx 128 --workers 2 --batch 4 --no-prefix-cache --accept-any-model
grep -q "model id: tiny (requests may name any model); prefix cache off" "$tmp/b/serve.out" ||
  { cat "$tmp/b/serve.out"; fail "banner b"; }
[ "$(post "{\"model\": \"gpt-4o\", \"prompt\": $(prompt 5 6), \"max_tokens\": 6, \"temperature\": 0}" "$tmp/s1.json")" = 200 ] ||
  { cat "$tmp/s1.json"; fail "any model"; }
[ "$(post "{\"prompt\": $(prompt 9 9 9), \"max_tokens\": 6, \"temperature\": 0}" "$tmp/s2.json")" = 200 ] || fail "b: second"
# the same text with the cache and without
python3 - "$tmp/r1.json" "$tmp/s1.json" "$tmp/r2.json" "$tmp/s2.json" <<'PY' || fail "cached and uncached answers differ"
import json, sys
t = [json.load(open(p))["choices"][0]["text"] for p in sys.argv[1:]]
assert t[0] == t[1] and t[2] == t[3], t
PY
curl -s --max-time 30 -o "$tmp/metrics_b.txt" "$URL/metrics"
grep -q '^vllm:' "$tmp/metrics_b.txt" && fail "vLLM series without --metrics-compat"
grep -q '^megascope_prefix_cache_hits_total{model_name="tiny"} 0$' "$tmp/metrics_b.txt" || fail "b: hits"
"$MS" stats --socket "$SOCK" | grep -q '^prefix cache: off$' || fail "b: stats"
stop_serve b || fail "stop b"
echo "cli_metrics_compat: ok"
