#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope records: the shipped step_trace monitor read while completions are
# served, at the engine's own step rate, loses nothing: every program run wrote
# one record and the reader got every one (records == executed, lost 0), each
# decoded by the BTF struct (step, phase, rows, bucket; phases alternate, steps
# never go back); it follows a replace to the new generation and stops by
# itself once the attachment is detached. A ring buffer whose record struct is
# not in the BTF is shown as u64 words; signed, narrow and char fields decode by
# their BTF types. A second reader is refused. The reader is handed each
# ring's wake-up eventfd (it sleeps in poll(), not polling). The monitor
# is also compiled from another directory with `megascope cflags`.
set -euo pipefail
MS=$1
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MON=${MS_MONITORS:-}
[ -n "$MON" ] && [ -f "$MON/step_trace.bpf.o" ] || { echo "skipped: no shipped monitors (MS_MONITORS)"; exit 77; }
for t in curl python3 clang; do
  command -v "$t" >/dev/null || { echo "skipped: no $t"; exit 77; }
done
tmp=$(mktemp -d)
SERVE_PID=""
REC_PID=""
cleanup() {
  [ -n "$REC_PID" ] && kill "$REC_PID" 2>/dev/null || true
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then kill -KILL "$SERVE_PID"; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=tests/serve_lib.sh
source "$SRC/tests/serve_lib.sh"
fail() { echo "FAILED: $*"; exit 1; }
pass=0

# cflags: the include path from any directory
(cd "$tmp" && clang $("$MS" cflags) -Wall -Werror -c "$SRC/monitors/step_trace.bpf.c" -o "$tmp/step_trace.bpf.o") \
  || fail "clang \$(megascope cflags) from $tmp"
[ -f "$("$MS" cflags --include-dir)/megascope/bpf/megascope.h" ] || fail "cflags --include-dir"
grep -q 'MS_OP_LM_HEAD = 13' "$("$MS" cflags --include-dir)/megascope/bpf/megascope.h" || fail "no kernel ids"
pass=$((pass + 1))
# the same ring buffer without its record struct in the BTF
grep -v 'step_events_record SEC' "$SRC/monitors/step_trace.bpf.c" >"$tmp/plain_ring.bpf.c"
(cd "$tmp" && clang $("$MS" cflags) -c plain_ring.bpf.c -o plain_ring.bpf.o) || fail "compile plain_ring"

# a record with signed, narrow and char fields
cat >"$tmp/typed_ring.bpf.c" <<'C'
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>
struct typed_rec {
  __s32 neg;
  char tag[6];
  __u16 small;
  __u32 pad;  /* every byte written: the verifier refuses uninitialised stack */
  __u64 step;
};
struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 4096);
} typed SEC(".maps");
const volatile struct typed_rec typed_record SEC("megascope_types");
MS_HOOK_ABI_DECLARE();
SEC("megascope/observe/step")
int on_step(struct ms_hook_ctx *ctx) {
  struct typed_rec r = {.neg = -5, .tag = "hi", .small = 7, .pad = 0, .step = ctx->step};
  bpf_ringbuf_output(&typed, &r, sizeof r, 0);
  return 0;
}
char LICENSE[] SEC("license") = "Dual MIT/GPL";
C
(cd "$tmp" && clang $("$MS" cflags) -c typed_ring.bpf.c -o typed_ring.bpf.o) || fail "compile typed_ring"

start_serve rec --synthetic tiny --workers 2 --batch 4
ID=$("$MS" attach --socket "$SOCK" "$tmp/step_trace.bpf.o")
"$MS" records --socket "$SOCK" "$ID" --json >"$tmp/rec.jsonl" 2>"$tmp/rec.err" &
REC_PID=$!
for _ in $(seq 1 200); do  # the reader holds the rings before the first request
  grep -q 'ring step_events' "$tmp/rec.err" 2>/dev/null && break
  kill -0 "$REC_PID" 2>/dev/null || fail "records exited: $(cat "$tmp/rec.err")"
  sleep 0.05
done
python3 - "$SOCK" "$ID" <<'PY' || fail "a second reader was not refused"
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
b = json.dumps({"cmd": "records", "id": int(sys.argv[2])}).encode()
s.sendall(struct.pack("<I", len(b)) + b)
n = struct.unpack("<I", s.recv(4, socket.MSG_WAITALL))[0]
r = json.loads(s.recv(n, socket.MSG_WAITALL))
assert not r["ok"] and r["code"] == "EBUSY" and "already have a reader" in r["error"], r
PY
pass=$((pass + 1))  # a second reader is refused (EBUSY) while the first holds the rings
# the ring came with its wake-up eventfd: the reader sleeps in poll() instead of polling
grep -q 'ring step_events (4096 bytes, woken at half full)' "$tmp/rec.err" || fail "no wake-up: $(cat "$tmp/rec.err")"
pass=$((pass + 1))
# requests at the default rate: four clients, 40 requests of 24 tokens
for c in 1 2 3 4; do
  (for i in $(seq 1 10); do
     code=$(completion "c$c r$i" 24 "$tmp/c$c.json")
     [ "$code" = 200 ] || echo "request failed: $code" >>"$tmp/failed"
   done) &
done
wait_clients() { for j in $(jobs -p); do [ "$j" = "$REC_PID" ] || [ "$j" = "$SERVE_PID" ] || wait "$j"; done; }
wait_clients
[ ! -s "$tmp/failed" ] || fail "$(cat "$tmp/failed")"
# replace: the reader follows to generation 2
"$MS" replace --socket "$SOCK" "$ID" "$tmp/step_trace.bpf.o" >/dev/null
code=$(completion "after replace" 16 "$tmp/r.json")
[ "$code" = 200 ] || fail "request after replace: $code"
sleep 0.5
"$MS" detach --socket "$SOCK" "$ID" >/dev/null
for _ in $(seq 1 100); do kill -0 "$REC_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$REC_PID" 2>/dev/null && fail "records did not stop after the detach"
wait "$REC_PID" || fail "records exited $?: $(cat "$tmp/rec.err")"
REC_PID=""
"$MS" maps --socket "$SOCK" "$ID" --json >"$tmp/maps.json"
python3 - "$tmp/rec.jsonl" "$tmp/maps.json" <<'PY' || fail "records check"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
summary = lines[-1]["summary"]
recs = lines[:-1]
att = json.load(open(sys.argv[2]))["attachment"]
gens = {g["generation"]: g for g in att["generations"]}
executed = sum(g["executed"] for g in gens.values())
lost = sum(g["lost"] for g in gens.values())
# nothing lost without being counted: at the default rate the reader keeps up
# on an idle machine (0 lost); on a loaded one (the reader waits for a CPU)
# the rings may fill, and every record lost is counted, per generation too
assert lost == summary["lost_ring_full"] and summary["lost_coverage"] == 0, (lost, summary)
assert len(recs) == summary["records"] and len(recs) + lost == executed, (len(recs), summary, executed)
assert summary["generations"] == 2 and {r["generation"] for r in recs} == {1, 2}, summary
for g in (1, 2):
    rs = [r for r in recs if r["generation"] == g]
    assert len(rs) + gens[g]["lost"] == gens[g]["executed"], (g, len(rs), gens[g])
    steps = [r["step"] for r in rs]
    assert steps == sorted(steps), "steps go back"
    if not gens[g]["lost"]:
        assert all(r["phase"] == i % 2 for i, r in enumerate(rs)), "begin/end do not alternate"
    assert all(1 <= r["rows"] <= r["bucket"] <= 64 and r["size"] == 32 for r in rs)  # prefill: up to 64 token rows
print(f"  {len(recs)} records, {executed} runs, {lost} lost and counted; generations {sorted(gens)}")
PY
pass=$((pass + 1))

# no record struct: u64 words, said so
ID2=$("$MS" attach --socket "$SOCK" "$tmp/plain_ring.bpf.o")
"$MS" records --socket "$SOCK" "$ID2" --max-records 4 >"$tmp/plain.txt" 2>"$tmp/plain.err" &
REC_PID=$!
code=$(completion "words" 8 "$tmp/w.json")
[ "$code" = 200 ] || fail "request: $code"
for _ in $(seq 1 100); do kill -0 "$REC_PID" 2>/dev/null || break; sleep 0.1; done
wait "$REC_PID" || fail "records (words) exited $?"
REC_PID=""
grep -q 'records as u64 words' "$tmp/plain.err" || fail "no 'u64 words' notice: $(cat "$tmp/plain.err")"
[ "$(wc -l <"$tmp/plain.txt")" -eq 4 ] || fail "expected 4 records: $(cat "$tmp/plain.txt")"
grep -Eq '^step_events [0-9]+ [0-9]+ [0-9]+ [0-9]+$' "$tmp/plain.txt" || fail "words: $(cat "$tmp/plain.txt")"
pass=$((pass + 1))
# signed, narrow and char fields by their BTF types (struct typed_rec, found as <map>_rec)
ID3=$("$MS" attach --socket "$SOCK" "$tmp/typed_ring.bpf.o")
"$MS" records --socket "$SOCK" "$ID3" --json --max-records 2 >"$tmp/typed.jsonl" 2>"$tmp/typed.err" &
REC_PID=$!
code=$(completion "typed" 8 "$tmp/t.json")
[ "$code" = 200 ] || fail "request: $code"
for _ in $(seq 1 100); do kill -0 "$REC_PID" 2>/dev/null || break; sleep 0.1; done
wait "$REC_PID" || fail "records (typed) exited $?"
REC_PID=""
grep -q 'struct typed_rec (24 bytes)' "$tmp/typed.err" || fail "typed: $(cat "$tmp/typed.err")"
python3 - "$tmp/typed.jsonl" <<'PY' || fail "typed fields"
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r["neg"] == -5 and r["tag"] == "hi" and r["small"] == 7 and r["size"] == 24, r
PY
pass=$((pass + 1))
stop_serve rec
echo "$pass passed, 0 failed"
