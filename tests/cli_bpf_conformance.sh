#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The public BPF conformance suite through `megascope bpf conformance`: every
# file passes except the non-standard callx group, reported as the one skip;
# the closing line has its exact shape; a wrong expectation is a failure (exit 1).
set -uo pipefail
MS=$1
dir="${MS_SHARED:-}/third_party/bpf_conformance/tests"
if [ ! -d "$dir" ]; then
  echo "skipped: $dir is absent"
  exit 77
fi
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

out=$("$MS" bpf conformance "$dir"); rc=$?
last=$(tail -n 1 <<<"$out")
echo "$last"
total=$(find "$dir" -maxdepth 1 -name '*.data' | wc -l)
want="$((total - 1)) passed, 0 failed, 1 skipped (callx: callx.data)"
if [ $rc -eq 0 ]; then ok; else bad "exit $rc"; fi
if [ "$last" = "$want" ]; then ok; else bad "closing line '$last', want '$want'"; fi
if [ "$(wc -l <<<"$out")" -eq 1 ]; then ok; else bad "non-verbose output has more than the closing line"; fi

# --verbose: one line per file, then the same closing line
vout=$("$MS" bpf conformance "$dir" --verbose)
if [ "$(grep -c '^PASS ' <<<"$vout")" -eq $((total - 1)) ] && grep -q '^SKIP callx.data: ' <<<"$vout" &&
   [ "$(tail -n 1 <<<"$vout")" = "$want" ]; then ok; else bad "--verbose"; fi

# --json: counts agree, callx is the one skip
jout=$("$MS" bpf conformance "$dir" --json)
if grep -q "\"passed\": $((total - 1)), \"failed\": 0, \"skipped\": 1" <<<"$jout" &&
   [ "$(grep -c '"status": "skip"' <<<"$jout")" -eq 1 ] &&
   grep -q '"name": "callx.data", "status": "skip", "group": "callx"' <<<"$jout"; then ok; else bad "--json"; fi

# a failing file makes the run fail, and is named
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$dir/add.data" "$dir/callx.data" "$tmp/"
sed -i 's/^0x3$/0x4/' "$tmp/add.data"
fout=$("$MS" bpf conformance "$tmp"); rc=$?
if [ $rc -eq 1 ] && grep -q '^FAIL add.data: r0 = 0x3, expected 0x4$' <<<"$fout" &&
   [ "$(tail -n 1 <<<"$fout")" = "0 passed, 1 failed, 1 skipped (callx: callx.data)" ]; then ok; else bad "failing dir: rc $rc: $fout"; fi

# an -- error file passes when the program fails, fails when it runs clean
printf -- '-- asm\nldxdw %%r0, [%%r1+64]\nexit\n-- mem\n00\n-- error\nout of bounds\n' >"$tmp/oob.data"
printf -- '-- asm\nmov %%r0, 1\nexit\n-- error\nshould fail\n' >"$tmp/clean.data"
rm "$tmp/add.data" "$tmp/callx.data"
eout=$("$MS" bpf conformance "$tmp" --verbose); rc=$?
if [ $rc -eq 1 ] && grep -q '^PASS oob.data: run: insn 0: invalid read' <<<"$eout" &&
   grep -q '^FAIL clean.data: expected an error' <<<"$eout"; then ok; else bad "-- error: $eout"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
