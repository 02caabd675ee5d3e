#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes llama.cpp-style tokenizer test vectors (tests/test-tokenizer-0.cpp's
# format) for a real model's vocabulary: NAME.inp holds the texts, each followed
# by "\n__ggml_vocab_test__\n"; NAME.out one line per text, " ID ID ...", the ids
# llama.cpp's llama_tokenize gives (add_special false, parse_special true: no
# BOS, special tokens written out whole are parsed as such, as `megascope model
# tokenize` does). The texts are generated here from a fixed seed: prose, code,
# numbers, whitespace runs, words in 40 scripts, emoji sequences, special tokens
# and look-alikes. Needs llama-cpp-python (scripts/llamacpp-compare.sh setup);
# the vectors are committed under tests/data/tokenizer/ and checked without it
# (tests/cli_tokenizer_vectors.sh).
# Usage: tokenizer_vectors.py MODEL.gguf OUT_PREFIX [N_TEXTS]
import random
import sys

import llama_cpp as L

SEP = "\n__ggml_vocab_test__\n"
rng = random.Random(2026)
WORDS = ("the of and to in is was for on that with as by at from it his an were are which this be or has had not "
         "first one their its new after who they have her she two been other when there all during into school "
         "time may years more most only over city some world would where later up such used many can state about "
         "don't we'll I'm you're it's they've WORLD'S Hello HELLO hello's naïve café résumé").split()
SCRIPTS = [(0xC0, 0x17F), (0x3B1, 0x3C9), (0x430, 0x44F), (0x561, 0x586), (0x5D0, 0x5EA), (0x628, 0x64A),
           (0x710, 0x72F), (0x780, 0x7A5), (0x915, 0x939), (0x995, 0x9B9), (0xA15, 0xA28), (0xA95, 0xAB9),
           (0xB15, 0xB28), (0xB95, 0xBB9), (0xC15, 0xC28), (0xC95, 0xCA8), (0xD15, 0xD28), (0xD9A, 0xDB1),
           (0xE01, 0xE30), (0xE81, 0xE82), (0xF40, 0xF47), (0x1000, 0x102A), (0x10D0, 0x10FA), (0x1100, 0x1112),
           (0x1200, 0x1248), (0x13A0, 0x13F4), (0x1401, 0x166C), (0x1681, 0x169A), (0x16A0, 0x16EA),
           (0x1780, 0x17B3), (0x1820, 0x1878), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x3105, 0x312F),
           (0x4E00, 0x9FFF), (0xA000, 0xA48C), (0xAC00, 0xD7A3), (0xA500, 0xA60B), (0xFF21, 0xFF3A),
           (0x20000, 0x2A6DF), (0x10330, 0x10349), (0x10400, 0x1044F)]
PHRASES = ["Привет, мир!", "Γειά σου Κόσμε", "こんにちは世界", "你好，世界。", "안녕하세요 세계", "مرحبا بالعالم",
           "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Xin chào thế giới", "Merhaba Dünya", "Witaj świecie",
           "Olá, mundo!", "¡Hola, mundo!", "Grüß Gott, Welt", "გამარჯობა მსოფლიო", "Բարեւ աշխարհ", "ሰላም ልዑል",
           "வணக்கம் உலகம்", "ආයුබෝවන් ලෝකය", "မင်္ဂလာပါ", "សួស្តី​ពិភពលោក", "Habari dunia", "Ndewo ụwa"]
EMOJI = ["\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466", "\U0001F1EB\U0001F1F7", "\U0001F44D\U0001F3FD",
         "1\uFE0F\u20E3", "\U0001F3F3\uFE0F\u200D\U0001F308", "\u2764\uFE0F", "\U0001F600\U0001F600",
         "\U0001F9D1\u200D\U0001F4BB", "\U0001F974", "\u263A"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
            "<pad>", "<unk>", "<s>", "</s>"]
LOOKALIKES = ["<|endoftext|", "<|endoftext |>", "<|endof", "endoftext|>", "< |endoftext|>", "<|im_start", "<s",
              "</s >", "<unk", "<0x41>", "<0xZZ>", "\u2581x", "<start_of_turn", "<end_of_turn >", "<bos >",
              "<[PAD]>", "<mask>", "[INST]"]
CODE = ["def f(x):\n    return x**2 + 1\n", "for (int i = 0; i < n; i++) { a[i] += b[i]; }",
        "if x != None and y >= 3.14:\n\tprint(f\"{x!r}\")", "SELECT * FROM t WHERE a = 'b''c';",
        "#include <stdio.h>\nint main(void) { return 0; }", "x = [1,2,3]  # comment\r\n", "a->b->c && !d || e",
        "    \n        indented\n\n\n", "const f = (a, b) => `${a}${b}`;", "<div class=\"x\">&amp;</div>"]


def word(lo, hi):
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 7)))


def sample():
    kind = rng.randrange(9)
    if kind == 0:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))) + rng.choice([".", "!", "?", "", "\n"])
    if kind == 1:
        return rng.choice(CODE)
    if kind == 2:
        return " ".join(rng.choice([str(rng.randint(0, 10**rng.randint(1, 12))), "%.4f" % rng.uniform(-1e4, 1e4),
                                    "1,234,567", "2024-12-01", "3.14159", "0x%x" % rng.getrandbits(32), "١٢٣", "½",
                                    "1e-9", "12345678901234567890"])
                        for _ in range(rng.randint(1, 6)))
    if kind == 3:
        return "".join(rng.choice([" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "a", "b."])
                       for _ in range(rng.randint(1, 12)))
    if kind == 4:
        s = rng.choice(SCRIPTS)
        return " ".join(word(*s) for _ in range(rng.randint(1, 5)))
    if kind == 5:
        return rng.choice(PHRASES) + rng.choice(["", " ", "! ", " 2024", "\n"]) + rng.choice(PHRASES)
    if kind == 6:
        return rng.choice(WORDS) + " " + "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4))) + " ok"
    if kind == 7:
        return rng.choice(WORDS) + rng.choice(["", " "]) + rng.choice(SPECIALS) + rng.choice(["", " ", "\n"]) + \
            rng.choice(WORDS)
    return rng.choice(WORDS) + rng.choice(LOOKALIKES) + rng.choice(WORDS)


def main():
    model_path, prefix = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    texts = ["", " ", "  ", "\n", " Hello", "Hello world", " Hello World!", "   leading spaces", "trailing   "]
    texts += PHRASES[:8] + [f"a{t}b {t}{t} x {t}\ny" for t in SPECIALS] + [sample() for _ in range(n)]
    texts = [t for t in texts if SEP not in t]
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        sys.exit(f"tokenizer_vectors: cannot load {model_path}")
    vocab = L.llama_model_get_vocab(model)
    with open(prefix + ".inp", "w", encoding="utf-8", newline="") as fi, \
            open(prefix + ".out", "w", encoding="utf-8", newline="") as fo:
        for t in texts:
            raw = t.encode()
            buf = (L.llama_token * (len(raw) + 8))()
            k = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, True)
            assert k >= 0, (t, k)
            fi.write(t + SEP)
            fo.write("".join(f" {buf[i]}" for i in range(k)) + "\n")
    L.llama_model_free(model)
    print(f"{prefix}: {len(texts)} texts, llama-cpp-python {L.__version__}")


if __name__ == "__main__":
    main()
