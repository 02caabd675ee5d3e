#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `megascope verify`: --help, usage errors and unreadable objects (exit 2 with
# a message naming the problem), monitors clang builds from tests/data/verifier
# that verify (exit 0, the stats line, the -v trace, --json), ones that must be
# rejected (exit 1, the reason on stderr and in the log), --section, and an
# object built for a newer hook ABI. Skipped (77) without clang.
set -uo pipefail
MS=$1
SRC=${MS_SRC:-$(dirname "$0")/..}
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect RC TEXT ARGS...: exit code RC and TEXT in stdout+stderr
expect() {
  local rc_want=$1 want=$2; shift 2
  local out rc
  out=$("$MS" "$@" 2>&1); rc=$?
  if [ "$rc" -eq "$rc_want" ] && grep -q -- "$want" <<<"$out"; then ok; else bad "$* -> rc $rc (want $rc_want, '$want'): $out"; fi
}

expect 0 "usage: megascope verify" verify --help
expect 2 "missing PROG.o" verify
expect 2 "unrecognized option '--fast'" verify x.o --fast
expect 2 "one object only" verify a.o b.o
expect 2 "option '--section' requires an argument" verify a.o --section
expect 2 "$tmp/none.o: cannot load the object" verify "$tmp/none.o"
head -c 4096 /dev/urandom >"$tmp/junk.o"
expect 2 "$tmp/junk.o: cannot load the object" verify "$tmp/junk.o"

if ! command -v clang >/dev/null 2>&1; then
  echo "clang not found: skipped"
  exit 77
fi
build() {  # build NAME SRC: $tmp/NAME.o
  clang -O2 -g -target bpf -I"$SRC/include" -I"/usr/include/$(uname -m)-linux-gnu" -c "$2" -o "$tmp/$1.o" ||
    { bad "clang could not build $2"; return 1; }
}

for m in hist_class wait_by_event request_rb loop16 hint_tile; do
  build "$m" "$SRC/tests/data/verifier/$m.bpf.c" || continue
  expect 0 "verified" verify "$tmp/$m.o"
  expect 0 "^processed [0-9]* insns (limit 1000000) max_states_per_insn [0-9]* total_states [0-9]* peak_states [0-9]* time_us [0-9]* max_run_insns [1-9][0-9]* work [0-9]*$" \
    verify "$tmp/$m.o"
done
expect 0 "^0: (61) r[0-9] = \*(u32 \*)(r1 +40)" verify "$tmp/hist_class.o" -v
expect 0 "R0 at exit\|safe\|from [0-9]* to [0-9]*:" verify "$tmp/loop16.o" -v
expect 0 '"verified": true' verify "$tmp/request_rb.o" --json
if "$MS" verify "$tmp/request_rb.o" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d["programs"]) == 2 and all(p["verified"] and p["processed"] > 0 for p in d["programs"])'; then ok; else bad "--json is not the expected JSON"; fi
expect 0 "section megascope/observe/step" verify "$tmp/request_rb.o" --section megascope/observe/step
expect 2 "no program in section 'megascope/observe/comm'" verify "$tmp/request_rb.o" --section megascope/observe/comm
expect 2 "option '--jit-dump' requires an argument" verify "$tmp/request_rb.o" --jit-dump

# --jit-dump: each verified program's x86-64 code, in a file objdump reads
if [ "$(uname -m)" = x86_64 ]; then
  mkdir "$tmp/jit"
  expect 0 "^jit: [0-9]* bytes of x86-64 code in $tmp/jit/" verify "$tmp/hist_class.o" --jit-dump "$tmp/jit"
  n=$(find "$tmp/jit" -name '*.bin' -size +0 | wc -l)
  if [ "$n" -ge 1 ]; then ok; else bad "--jit-dump wrote no code"; fi
  if command -v objdump >/dev/null 2>&1; then
    f=$(find "$tmp/jit" -name '*.bin' | head -1)
    # the entry saves the callee-saved registers it uses, and the code returns
    # (into a variable first: grep -q leaving early would SIGPIPE objdump, which pipefail reports)
    dis=$(objdump -D -b binary -m i386:x86-64 "$f")
    if grep -q "push   %rbp" <<<"$dis" && grep -q "ret" <<<"$dis"; then ok; else bad "objdump of $f"; fi
  fi
  expect 1 "no such file\|No such file" verify "$tmp/hist_class.o" --jit-dump "$tmp/none/deeper"
fi

if build bad "$SRC/tests/data/verifier/bad_monitors.bpf.c"; then
  expect 1 "program end_on_begin rejected: insn 1: .*hook task_begin does not define field t_end" verify "$tmp/bad.o"
  expect 1 "insn [0-9]*: exit ; R0 at exit may be 15 (R0=scalar(0..15)): sched_hint must return 0..7" \
    verify "$tmp/bad.o" --section megascope/sched_hint/task_ready
  out=$("$MS" verify "$tmp/bad.o" --json 2>/dev/null); rc=$?
  if [ $rc -eq 1 ] && grep -q '"verified": false' <<<"$out" && grep -q '"error": "insn' <<<"$out"; then ok; else bad "--json of rejections: rc $rc $out"; fi
  # the last line of every program's log is the stats line, the one before it the reason
  "$MS" verify "$tmp/bad.o" --section megascope/observe/request >"$tmp/log" 2>/dev/null
  # (and the summary after the log)
  if tail -1 "$tmp/log" | grep -q "^rejected in " && tail -2 "$tmp/log" | head -1 | grep -q "^processed " &&
     tail -3 "$tmp/log" | head -1 | grep -q "^insn [0-9]*: .* ; unreleased ringbuf reservation from insn"; then ok; else bad "log shape: $(cat "$tmp/log")"; fi
fi

# every program's summary: time, instructions processed and work against their caps, the longest run
expect 0 "^verified in [0-9.]* ms: [0-9]* insns processed (limit 1000000), work [0-9]* (limit 4000000), longest run [0-9]* insns (run budget 100000)$" \
  verify "$tmp/hist_class.o"
if "$MS" verify "$tmp/loop16.o" --json | python3 -c 'import json,sys; p=json.load(sys.stdin)["programs"][0]; assert 0 < p["max_run_insns"] <= p["run_budget"] == 100000 and p["processed"] <= p["work"] <= p["work_limit"]'; then ok; else bad "--json bounds of loop16"; fi

# the adversarial monitor: eight frames, full stacks, a loop counted in a stack slot, longer than a run
if build deep "$SRC/tests/data/verifier/bad_deep_loop.bpf.c"; then
  expect 1 "program too long for one run: a path runs 100001 instructions, more than the run budget of 100000" \
    verify "$tmp/deep.o"
  expect 1 "^rejected in [0-9.]* ms: 100001 insns processed (limit 1000000)" verify "$tmp/deep.o"
fi
if clang -O2 -g -target bpf -DLOOP_N=1000 -I"$SRC/include" -I"/usr/include/$(uname -m)-linux-gnu" \
     -c "$SRC/tests/data/verifier/bad_deep_loop.bpf.c" -o "$tmp/deep1000.o"; then
  expect 0 "longest run [0-9]* insns (run budget 100000)" verify "$tmp/deep1000.o"
else
  bad "clang could not build bad_deep_loop.bpf.c with -DLOOP_N=1000"
fi

# sched_hint programs: no map updates, no ring buffer output, named with the program type
if [ -f "$tmp/bad.o" ]; then
  expect 1 "program hint_updates rejected: .*helper map_update_elem (2) is not allowed in sched_hint programs" \
    verify "$tmp/bad.o"
  expect 1 "program hint_output rejected: .*helper ringbuf_output (130) is not allowed in sched_hint programs" \
    verify "$tmp/bad.o"
fi

cat >"$tmp/newer.bpf.c" <<'C'
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>
const volatile __u32 megascope_abi_version __attribute__((section("megascope_abi"), used)) = MS_HOOK_ABI_VERSION + 1;
SEC("megascope/observe/step") int f(struct ms_hook_ctx *ctx) { return 0; }
char LICENSE[] SEC("license") = "MIT";
C
if build newer "$tmp/newer.bpf.c"; then
  expect 1 "built for hook ABI version 4, newer than this engine's version 3" verify "$tmp/newer.o"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
