#!/usr/bin/env bash
# Every subcommand answers --help with exit 0, and bad usage with exit 2 and a
# message that names the problem.
set -uo pipefail
MS=$1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# every command the top-level usage lists, and a few subcommands
cmds=$("$MS" --help | awk '/^commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }')
[ "$(wc -w <<<"$cmds")" -ge 20 ] || bad "the usage lists $(wc -w <<<"$cmds") commands"
for cmd in "" $cmds "bench decode" "bench diagnose" "model info"; do
  # the whole output first: grep -q leaving early would kill the writer with SIGPIPE under pipefail
  # shellcheck disable=SC2086
  out=$("$MS" $cmd --help); rc=$?
  if [ $rc -eq 0 ] && grep -q "usage: megascope" <<<"$out"; then ok; else bad "$cmd --help -> rc $rc"; fi
done
expect2() {  # expect exit 2 and a message containing $1
  local want=$1; shift
  local out rc
  out=$("$MS" "$@" 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$want" <<<"$out"; then ok; else bad "$* -> rc $rc: $out"; fi
}
expect2 "unknown command" frobnicate
expect2 "unknown preset" compile --synthetic nosuch
MS_CACHE=/nonexistent expect2 "no model named, and the default, SmolLM2-135M-Instruct, is not in the model cache" run --steps 3
expect2 "--batch" run --synthetic tiny --batch zero
expect2 "--mode" run --synthetic tiny --mode sideways
expect2 "--dtype" compile --synthetic tiny --dtype f8
expect2 "unknown benchmark" bench nosuch
expect2 "unexpected argument" compile --synthetic tiny extra
expect2 "expected one PROGRAM" query
expect2 "--for '5 parsecs': expected a duration" query --for "5 parsecs" 'step { @ = count() }'
expect2 "--slo 'tpot': expected tpot=DURATION" query --slo tpot 'step { @ = count() }'
expect2 "slo tpot=DURATION is required" explain
expect2 "--window '1ms': expected a duration of at least 500ms" explain --slo tpot=1s --window 1ms
# the one option parser (tools/frame/opt.c): every kind's refusal names the option
expect2 "unrecognized option '--frobnicate'" run --synthetic tiny --frobnicate
expect2 "option '--steps' requires an argument" run --synthetic tiny --steps
expect2 "at most 4 --fault" run --synthetic tiny --fault a --fault b --fault c --fault d --fault e
expect2 "--temperature '3': expected a number in \[0, 2\]" serve --synthetic tiny --temperature 3
expect2 "--tolerance 'x': expected a non-negative number" run --synthetic tiny --tolerance x
expect2 "--attn-parts '9': expected an integer in 1..4" run --synthetic tiny --attn-parts 9
expect2 "--model-seed 'x': expected a non-negative integer" cuda run --model-seed x
expect2 "--prompts '1,2,3,4,5,6,7,8,9': at most 8 lengths" bench prefill --synthetic tiny --prompts 1,2,3,4,5,6,7,8,9
expect2 "at most 16 --sim-param" bench sim $(for i in $(seq 17); do printf -- '--sim-param x=1 '; done)
expect2 "--json does not apply to this command" detach --socket /nonexistent --json 1
expect2 "(try 'megascope bench decode --help')" bench decode --bogus
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
