#!/usr/bin/env bash
# The benchmarks run and report the keys the docs and the issues name (small
# sizes: speeds are not asserted, only their presence and sanity), and every
# ratio they print is recomputed here from the figures it is a ratio of: bench
# decode's megakernel / per-op (the median of the per-round ratios, from the
# rounds' own tokens/s, in JSON and in the text a user reads, direction
# included), the fractions of the bounds, bench prefill's speedup and
# tokens/s, bench hooks' ratios to the hooks-off run and the JIT's speedup.
set -euo pipefail
MS=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$MS" bench decode --synthetic tiny --steps 4 --warmup 1 --rounds 3 --json > "$tmp/decode.json"
"$MS" bench decode --synthetic tiny --steps 4 --warmup 1 --rounds 2 --json > "$tmp/decode2.json"
"$MS" bench decode --synthetic tiny --steps 4 --warmup 1 --rounds 1 > "$tmp/decode.txt" 2>"$tmp/decode.err"
# --null: a second megakernel engine in the per-op member (the rounds' own bias)
"$MS" bench decode --synthetic tiny --steps 4 --warmup 1 --rounds 2 --null --json > "$tmp/null.json"
"$MS" bench decode --synthetic tiny --steps 4 --warmup 1 --rounds 1 --null > "$tmp/null.txt" 2>/dev/null
grep -q "^  --null: the per-op member is a second megakernel engine; their ratio is the rounds' own bias$" "$tmp/null.txt" &&
  grep -Eq "^  megakernel2 +[0-9.]+ tokens/s$" "$tmp/null.txt" &&
  grep -Eq "^  megakernel +[0-9.]+ tokens/s +\(megakernel / megakernel2 in one round: median [0-9.]+, " "$tmp/null.txt" ||
  { cat "$tmp/null.txt"; echo "bench decode --null: text"; exit 1; }
grep -q "^bench decode: round 1 of 1$" "$tmp/decode.err" || { cat "$tmp/decode.err"; echo "no progress line"; exit 1; }
# the simulator is refused by name (its figures are bench sim's)
rc=0
"$MS" bench decode --synthetic tiny --backend sim >/dev/null 2>"$tmp/sim.err" || rc=$?
[ $rc -eq 2 ] && grep -q "^megascope bench decode: --backend sim: the simulator's figures are \`bench sim\`'s$" "$tmp/sim.err" ||
  { cat "$tmp/sim.err"; echo "bench decode --backend sim: rc $rc"; exit 1; }
"$MS" bench hooks --synthetic tiny --dtype f32 --steps 4 --rounds 1 \
    --monitor "${MS_MONITORS:-$(dirname "$MS")/monitors}/class_time.bpf.o" > "$tmp/hooks.txt" 2>/dev/null
"$MS" bench prefill --synthetic tiny --prompts 8,24 --rounds 1 --max-batched-tokens 16 --json > "$tmp/prefill.json"
"$MS" bench hooks --synthetic tiny --dtype f32 --steps 4 --rounds 1 \
    --monitor "${MS_MONITORS:-$(dirname "$MS")/monitors}/class_time.bpf.o" --json > "$tmp/hooks.json"
"$MS" bench sim --steps 2 --json > "$tmp/sim.json"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
dec = json.load(open(d + "/decode.json"))
for k in ("megakernel_tokens_per_s", "per_op_tokens_per_s", "ratio", "bandwidth_bound_tokens_per_s", "fraction_of_bound",
          "stream_read_gb_per_s", "read_bound_tokens_per_s", "fraction_of_read_bound", "bytes_per_token"):
    assert dec[k] > 0, k
# three alternating rounds, each engine once per round: the best reported, the
# median of the ratios within a round between their extremes
for k in ("megakernel", "per_op"):
    assert len(dec["rounds_tokens_per_s"][k]) == 3 and max(dec["rounds_tokens_per_s"][k]) == dec[k + "_tokens_per_s"], dec
assert dec["ratio_min"] <= dec["ratio"] <= dec["ratio_max"], dec
def close(a, b, rel=1e-6):  # JSON numbers carry 9 significant digits
    return abs(a - b) <= rel * max(abs(a), abs(b))
rounds = sorted(m / p for m, p in zip(dec["rounds_tokens_per_s"]["megakernel"], dec["rounds_tokens_per_s"]["per_op"]))
assert close(dec["ratio"], rounds[1]) and close(dec["ratio_min"], rounds[0]) and close(dec["ratio_max"], rounds[2]), \
    (dec["ratio"], rounds)
# an even number of rounds: the median is the mean of the middle two
d2 = json.load(open(d + "/decode2.json"))
r2 = sorted(m / p for m, p in zip(d2["rounds_tokens_per_s"]["megakernel"], d2["rounds_tokens_per_s"]["per_op"]))
assert len(r2) == 2 and close(d2["ratio"], (r2[0] + r2[1]) / 2) and close(d2["ratio_min"], r2[0]), (d2["ratio"], r2)
assert close(dec["fraction_of_bound"], dec["megakernel_tokens_per_s"] / dec["bandwidth_bound_tokens_per_s"]), dec
assert close(dec["fraction_of_read_bound"], dec["megakernel_tokens_per_s"] / dec["read_bound_tokens_per_s"]), dec
# the read bound: a step's bytes read (not the 128 MiB stream), with the loads and streams said
assert dec["step_read_gb_per_s"] > 0 and dec["step_read_loads"] in ("avx512", "avx2", "portable"), dec
assert dec["step_read_streams"] in (1, 4, 16), dec
assert close(dec["read_bound_tokens_per_s"], dec["step_read_gb_per_s"] * 1e9 / dec["bytes_per_token"], 1e-5), dec
# the read as a member of each round: the megakernel's fraction of it within each round, median and range
rd = dec["rounds_tokens_per_s"]["read"]
assert len(rd) == 3 and all(r > 0 for r in rd) and close(dec["read_in_rounds_tokens_per_s"], max(rd)), dec
fr = sorted(m / r for m, r in zip(dec["rounds_tokens_per_s"]["megakernel"], rd))
assert close(dec["fraction_of_read_in_round"], fr[1]) and close(dec["fraction_of_read_in_round_min"], fr[0]) and \
    close(dec["fraction_of_read_in_round_max"], fr[2]), (dec, fr)
assert dec["null"] is False, dec
nl = json.load(open(d + "/null.json"))
assert nl["null"] is True and len(nl["rounds_tokens_per_s"]["per_op"]) == 2 and nl["per_op_tokens_per_s"] > 0, nl
assert len(nl["rounds_tokens_per_s"]["read"]) == 2 and nl["ratio_min"] <= nl["ratio"] <= nl["ratio_max"], nl
# the text, one round: the ratio printed is the two engines' printed tokens/s divided, in that direction
import re
txt = open(d + "/decode.txt").read()
mk = re.search(r"megakernel +([0-9.]+) tokens/s +\(megakernel / per-op in one round: median ([0-9.]+), ([0-9.]+)-([0-9.]+)\)", txt)
po = re.search(r"per-op +([0-9.]+) tokens/s", txt)
assert mk and po, txt
mk_tps, ratio, po_tps = float(mk.group(1)), float(mk.group(2)), float(po.group(1))
assert float(mk.group(3)) == ratio == float(mk.group(4)), txt  # one round: one ratio
assert abs(ratio - mk_tps / po_tps) <= 0.0005 + 0.01 * (mk_tps / po_tps) * (1 / mk_tps + 1 / po_tps), (ratio, mk_tps, po_tps)
assert (ratio > 1) == (mk_tps > po_tps) or abs(mk_tps - po_tps) < 0.02, (ratio, mk_tps, po_tps)
fr = re.search(r"in a round +([0-9.]+)% of a read of the round's bytes in the same round \(median; ([0-9.]+)-([0-9.]+)%; "
               r"the read best ([0-9.]+) tokens/s\)", txt)
assert fr and float(fr.group(2)) == float(fr.group(1)) == float(fr.group(3)), txt  # one round: one fraction
rd_tps = float(fr.group(4))
assert abs(float(fr.group(1)) / 100 - mk_tps / rd_tps) <= 0.0006 + 0.01 * (mk_tps / rd_tps) * (1 / mk_tps + 1 / rd_tps), \
    (fr.group(0), mk_tps)
assert dec["q8_activations"] is False, dec  # f32 weights: no 8-bit path, whatever the default
# a token moves every weight once (batch 1) and its row's KV cache
assert dec["bytes_per_token"] == dec["weight_bytes_per_step"] + dec["kv_bytes_per_token"], dec
pf = json.load(open(d + "/prefill.json"))
assert [p["tokens"] for p in pf["prompts"]] == [8, 24] and pf["max_batched_tokens"] == 16, pf
for p in pf["prompts"]:
    for k in ("per_step_ttft_ms_median", "chunked_ttft_ms_median", "speedup_median", "chunked_prompt_tokens_per_s"):
        assert p[k] > 0, (k, p)
    assert close(p["speedup_median"], p["per_step_ttft_ms_median"] / p["chunked_ttft_ms_median"]), p
    assert close(p["chunked_prompt_tokens_per_s"], p["tokens"] / (p["chunked_ttft_ms_median"] / 1e3)), p
    assert close(p["per_step_prompt_tokens_per_s"], p["tokens"] / (p["per_step_ttft_ms_median"] / 1e3)), p
    assert p["per_step_ttft_ms_best"] <= p["per_step_ttft_ms_median"] and p["chunked_ttft_ms_best"] <= p["chunked_ttft_ms_median"], p
hk = json.load(open(d + "/hooks.json"))
for k in ("armed_ratio", "attached_ratio", "attached_interp_ratio", "interp_ns_per_insn", "interp_ns_per_run",
          "jit_ns_per_run", "jit_speedup"):
    assert hk[k] > 0, k
assert hk["interp_insns_per_run"] > 0
for k in ("armed", "attached", "attached_interp"):
    assert close(hk[k + "_ratio"], hk[k + "_tokens_per_s"] / hk["off_tokens_per_s"]), (k, hk)
assert close(hk["jit_speedup"], hk["interp_ns_per_run"] / hk["jit_ns_per_run"]), hk
assert close(hk["interp_ns_per_insn"], hk["interp_ns_per_run"] / hk["interp_insns_per_run"]), hk
ht = open(d + "/hooks.txt").read()
off = float(re.search(r"hooks off +([0-9.]+) tokens/s", ht).group(1))
for label in ("armed, none", "attached, JIT", "attached, interpreter"):
    m = re.search(re.escape(label) + r" +([0-9.]+) tokens/s +ratio ([0-9.]+)", ht)
    assert m, (label, ht)
    tps, r = float(m.group(1)), float(m.group(2))
    assert abs(r - tps / off) <= 0.0005 + 0.01 * (tps / off) * (1 / tps + 1 / off), (label, r, tps, off)
assert hk["attached_program_runs"] == hk["attached_eligible"] > 0
sim = json.load(open(d + "/sim.json"))
cases = {(c["model"], c["gpu"]): c for c in sim["cases"]}
q = cases[("qwen3-8b", "a100")]
assert q["megakernel_ms_per_token"] > q["bandwidth_bound_ms"] > 0
assert 0 < q["fraction_of_bandwidth"] <= 1
PY
echo "3 passed, 0 failed"
