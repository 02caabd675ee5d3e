#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The public BPF conformance suite through the x86-64 JIT
# (`megascope bpf conformance --jit`): every file is verified, compiled and
# run natively; all pass except the non-standard callx group. A program the
# verifier rejects is not run by the JIT but skipped as 'unverified', and a
# wrong expectation is still a failure.
set -uo pipefail
MS=$1
dir="${MS_SHARED:-}/third_party/bpf_conformance/tests"
if [ ! -d "$dir" ]; then
  echo "skipped: $dir is absent"
  exit 77
fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "skipped: the JIT is x86-64 only"
  exit 77
fi
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

out=$("$MS" bpf conformance "$dir" --jit); rc=$?
last=$(tail -n 1 <<<"$out")
echo "$last"
total=$(find "$dir" -maxdepth 1 -name '*.data' | wc -l)
want="$((total - 1)) passed, 0 failed, 1 skipped (callx: callx.data)"
if [ $rc -eq 0 ]; then ok; else bad "exit $rc: $out"; fi
if [ "$last" = "$want" ]; then ok; else bad "closing line '$last', want '$want'"; fi

# the JIT counts instructions as the interpreter does: every verbose line, the
# executed count included, is the same in both modes
vout=$("$MS" bpf conformance "$dir" --jit --verbose)
if grep -q '^PASS add.data (r0 0x3, [1-9][0-9]* insns)$' <<<"$vout"; then ok; else bad "--jit --verbose: $(grep add.data <<<"$vout")"; fi
iout=$("$MS" bpf conformance "$dir" --verbose)
if grep -q '^PASS add.data (r0 0x3, [1-9][0-9]* insns)$' <<<"$iout"; then ok; else bad "interpreter --verbose"; fi
if [ "$(grep '^PASS' <<<"$vout")" = "$(grep '^PASS' <<<"$iout")" ]; then ok; else
  bad "JIT and interpreter counts differ: $(diff <(grep '^PASS' <<<"$iout") <(grep '^PASS' <<<"$vout") | head -5)"; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# a wrong expectation fails under the JIT too
cp "$dir/add.data" "$tmp/"
sed -i 's/^0x3$/0x4/' "$tmp/add.data"
fout=$("$MS" bpf conformance "$tmp" --jit); rc=$?
if [ $rc -eq 1 ] && grep -q '^FAIL add.data: r0 = 0x3, expected 0x4$' <<<"$fout"; then ok; else bad "failing file: rc $rc: $fout"; fi
rm "$tmp/add.data"

# an out-of-bounds read: the interpreter stops it at run time; the JIT never runs it
printf -- '-- asm\nldxdw %%r0, [%%r1+64]\nexit\n-- mem\n00\n-- error\nout of bounds\n' >"$tmp/oob.data"
jout=$("$MS" bpf conformance "$tmp" --jit --verbose); rc=$?
if [ $rc -eq 0 ] && grep -q '^SKIP oob.data: rejected by the verifier: the JIT runs only verified programs$' <<<"$jout" &&
   [ "$(tail -n 1 <<<"$jout")" = "0 passed, 0 failed, 1 skipped (unverified: oob.data)" ]; then ok; else bad "oob: rc $rc: $jout"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
