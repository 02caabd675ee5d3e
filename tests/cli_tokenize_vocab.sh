#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# megascope model tokenize --vocab: a vocabulary-only GGUF file (tokenizer.*
# keys and no tensors, as llama.cpp ships its tokenizer tests) tokenizes and
# decodes; the file is written here by a few lines of Python (standard library
# only); a file without a pre-tokenizer warns on stderr; an unsupported one is
# refused by name.
set -euo pipefail
MS=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

write_vocab() {  # path pre|-
  python3 - "$1" "$2" <<'PY'
import struct, sys
path, pre = sys.argv[1], sys.argv[2]
def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b
# GPT-2's byte map: byte b is spelled as one code point
keep = [b for b in range(256) if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or 0xae <= b <= 0xff]
cps, n = {}, 0
for b in range(256):
    if b in keep: cps[b] = b
    else: cps[b] = 256 + n; n += 1
toks = [chr(cps[b]) for b in range(256)] + ["he", "ll", "hell", "hello", "\u0120w", "\u0120wo", "<|end|>"]
types = [1] * (len(toks) - 1) + [3]
merges = ["h e", "l l", "he ll", "hell o", "\u0120 w", "\u0120w o"]
kv = [("general.architecture", 8, s("llama")),
      ("tokenizer.ggml.model", 8, s("gpt2")),
      ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(toks)) + b"".join(s(t) for t in toks)),
      ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(types)) + b"".join(struct.pack("<i", t) for t in types)),
      ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, len(merges)) + b"".join(s(m) for m in merges))]
if pre != "-":
    kv.append(("tokenizer.ggml.pre", 8, s(pre)))
out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
for k, t, v in kv:
    out += s(k) + struct.pack("<I", t) + v
open(path, "wb").write(out)
PY
}

write_vocab "$tmp/v.gguf" gpt-2
ids=$("$MS" model tokenize --vocab "$tmp/v.gguf" --text "hello world<|end|>")
[ "$ids" = "259,261,114,108,100,262" ] || fail "encode: got '$ids'"
text=$("$MS" model tokenize --vocab "$tmp/v.gguf" --decode 259,261,114,108,100,262)
[ "$text" = "hello world<|end|>" ] || fail "decode: got '$text'"
"$MS" model tokenize --vocab "$tmp/v.gguf" --text $'a\xffb' --json > "$tmp/j.json"
python3 - "$tmp/j.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["tokenizer"] == "gpt2/gpt-2", j
assert j["ids"] == [97, 239, 191, 189, 98], j  # the invalid byte read as U+FFFD
PY

write_vocab "$tmp/nopre.gguf" -
"$MS" model tokenize --vocab "$tmp/nopre.gguf" --text "hello, world" > "$tmp/out" 2> "$tmp/err"
[ "$(cat "$tmp/out")" = "259,44,261,114,108,100" ] || fail "no pre: got '$(cat "$tmp/out")'"
grep -q "no key 'tokenizer.ggml.pre'" "$tmp/err" || fail "no warning for a missing pre-tokenizer: $(cat "$tmp/err")"

write_vocab "$tmp/bad.gguf" deepseek-llm
if "$MS" model tokenize --vocab "$tmp/bad.gguf" --text x > /dev/null 2> "$tmp/err"; then fail "deepseek-llm accepted"; fi
grep -q "pre-tokenizer 'deepseek-llm' is not supported (supported: gpt-2," "$tmp/err" || fail "refusal: $(cat "$tmp/err")"
if "$MS" model tokenize --vocab "$tmp/v.gguf" --synthetic tiny --text x 2> /dev/null; then fail "--vocab with a model accepted"; fi
echo "cli_tokenize_vocab: ok"
