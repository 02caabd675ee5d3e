#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# OTLP/HTTP JSON export of request spans: `megascope serve --otlp URL` sends, to a
# small receiver (tests/otlp_receiver.py), one SERVER span per completion with
# the events admitted, first_token and finished, and child spans queued,
# prefill and decode, in the shape of an ExportTraceServiceRequest.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
for t in curl python3; do
  command -v "$t" >/dev/null || { echo "skipped: no $t"; exit 77; }
done
tmp=$(mktemp -d)
SERVE_PID="" RECV_PID=""
cleanup() {
  for p in $SERVE_PID $RECV_PID; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
fail() { echo "FAILED: $*"; exit 1; }

mkdir -p "$tmp/captures"
python3 "$SRC/tests/otlp_receiver.py" "$tmp/captures" "$tmp/port" 300 &
RECV_PID=$!
for _ in $(seq 1 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
[ -s "$tmp/port" ] || fail "the receiver did not start"
otlp="http://127.0.0.1:$(cat "$tmp/port")/v1/traces"

start_serve o --synthetic tiny --batch 4 --workers 2 --max-ctx 128 --otlp "$otlp" --otlp-flush-ms 200
grep -q "otlp:   $otlp" "$tmp/o/serve.out" || fail "serve does not say where it exports"
pids=()
for i in 1 2 3 4 5 6; do
  completion "span $i" $((4 + i)) "$tmp/c$i.json" >"$tmp/c$i.status" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for i in 1 2 3 4 5 6; do [ "$(cat "$tmp/c$i.status")" = 200 ] || fail "completion $i"; done
# a chat request carrying a W3C traceparent: its span continues the caller's trace
tp=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
code=$(curl -s -o "$tmp/chat.json" -w '%{http_code}' -H "traceparent: $tp" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}' \
  "$URL/v1/chat/completions")
[ "$code" = 200 ] || fail "the traced chat request: $code"
# exported while serving (flushes every 200 ms), seen in /metrics
exported=0
for _ in $(seq 1 100); do
  curl -s --max-time 10 "$URL/metrics" >"$tmp/metrics.txt"
  exported=$(awk '$1 == "megascope_otlp_requests_exported_total" { print $2 }' "$tmp/metrics.txt")
  [ "${exported:-0}" -ge 7 ] && break
  sleep 0.1
done
[ "${exported:-0}" -ge 7 ] || fail "megascope_otlp_requests_exported_total = $exported"
stop_serve o || fail "clean stop"

python3 - "$tmp/captures" <<'PY' || fail "the captured spans"
import glob, json, os, re, sys, time
roots, children, traced = [], [], []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "capture-*.json"))):
    d = json.load(open(path))
    for rs in d["resourceSpans"]:
        attrs = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
        assert attrs["service.name"]["stringValue"] == "megascope", attrs
        assert attrs["megascope.model"]["stringValue"] == "tiny", attrs
        for ss in rs["scopeSpans"]:
            assert ss["scope"]["name"] == "megascope"
            for s in ss["spans"]:
                if s["traceId"] == "4bf92f3577b34da6a3ce929d0e0e4736":
                    traced.append(s)
                else:
                    (roots if "parentSpanId" not in s else children).append(s)
assert len(roots) == 6, "%d root spans" % len(roots)
now = time.time() * 1e9
by_id = {}
want_tokens = set(range(5, 11))
for s in roots:
    assert re.fullmatch(r"[0-9a-f]{32}", s["traceId"]) and re.fullmatch(r"[0-9a-f]{16}", s["spanId"]), s
    assert s["name"] == "text_completion tiny" and s["kind"] == 2, s["name"]
    t0, t1 = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
    assert abs(t0 - now) < 3600e9 and t0 <= t1, (t0, t1, now)  # Unix time, not the engine clock
    ev = [(e["name"], int(e["timeUnixNano"])) for e in s["events"]]
    assert [n for n, _ in ev] == ["admitted", "first_token", "finished"], ev
    assert all(t0 <= t <= t1 for _, t in ev) and ev == sorted(ev, key=lambda x: x[1]), ev
    a = {x["key"]: x["value"] for x in s["attributes"]}
    out = int(a["gen_ai.usage.output_tokens"]["intValue"])
    assert out == int(a["gen_ai.request.max_tokens"]["intValue"]), a
    want_tokens.discard(out)
    reasons = a["gen_ai.response.finish_reasons"]["arrayValue"]["values"]
    assert reasons == [{"stringValue": "length"}], reasons
    assert a["gen_ai.operation.name"]["stringValue"] == "text_completion", a
    assert a["gen_ai.request.model"]["stringValue"] == "tiny" and a["gen_ai.response.model"]["stringValue"] == "tiny"
    assert a["gen_ai.response.id"]["stringValue"].startswith("cmpl-"), a
    assert s["status"]["code"] == 1
    by_id[s["spanId"]] = s
assert not want_tokens, want_tokens
assert len(children) == 18, len(children)
for c in children:
    p = by_id[c["parentSpanId"]]
    assert c["traceId"] == p["traceId"] and c["name"] in ("queued", "prefill", "decode") and c["kind"] == 1
    assert int(p["startTimeUnixNano"]) <= int(c["startTimeUnixNano"]) <= int(c["endTimeUnixNano"]) <= int(p["endTimeUnixNano"])
chat = [s for s in traced if s["name"] == "chat tiny"]
assert len(chat) == 1 and chat[0]["parentSpanId"] == "00f067aa0ba902b7", traced
a = {x["key"]: x["value"] for x in chat[0]["attributes"]}
assert a["gen_ai.operation.name"]["stringValue"] == "chat" and a["gen_ai.response.id"]["stringValue"].startswith("chatcmpl-")
assert len(traced) == 4 and all(c["parentSpanId"] == chat[0]["spanId"] for c in traced if c is not chat[0])
print("6 requests exported: 6 server spans with 3 events each, 18 phase spans; a traced chat continues its caller's trace")
PY
kill -TERM "$RECV_PID" 2>/dev/null || true
echo "4 passed, 0 failed"
