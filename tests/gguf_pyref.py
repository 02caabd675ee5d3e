# SPDX-License-Identifier: MIT
# Cross-checks megascope's GGUF reader and writer against the `gguf` Python
# package (llama.cpp's own reader and writer, an independent implementation).
#   write  MS DIR        megascope writes, gguf-py reads: metadata, tensor table
#                        and every tensor's dequantized values must agree exactly
#   read   MS DIR        gguf-py writes a small llama model (its quantizers), megascope
#                        loads it, dumps every tensor, and runs it against its reference
#   file   MS F.gguf DIR both read an existing file (the real model): metadata, the
#                        tensor table, and a sample of tensors' values
#   blocks MS DIR        random blocks of every block type (their scale fields finite
#                        halves) in a file gguf-py writes: megascope's decoding must give
#                        the same bits as gguf.quants.dequantize
#   mix    MS DIR        a Q4_K_M-style mix assembled with gguf-py from megascope's own
#                        q4_K, q6_K and q8_0 files (q6_K attn_v, ffn_down and output, a
#                        q8_0 embedding, q4_K elsewhere): values agree, and it runs --check
#   f32    IN OUT        rewrites a file with every tensor dequantized to f32 by gguf-py
#                        (for comparisons that take quantization out of the picture)
import json
import subprocess
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import quants

TYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1,
         "q5_0": QT.Q5_0, "q5_1": QT.Q5_1}
# the types megascope writes that need matrix widths of 256 (the tiny-256 preset);
# gguf-py cannot quantize them, so only their values are compared
K_TYPES = {"iq4_nl": QT.IQ4_NL, "q2_k": QT.Q2_K, "q3_k": QT.Q3_K, "q4_k": QT.Q4_K, "q5_k": QT.Q5_K,
           "q6_k": QT.Q6_K, "q8_k": QT.Q8_K}
# byte ranges of each block type's scale fields (f16, or f32 for q8_K), after ggml-common.h
SCALES = {QT.Q8_0: [(0, 2, "f16")], QT.Q4_0: [(0, 2, "f16")], QT.Q4_1: [(0, 2, "f16"), (2, 4, "f16")],
          QT.Q5_0: [(0, 2, "f16")], QT.Q5_1: [(0, 2, "f16"), (2, 4, "f16")], QT.IQ4_NL: [(0, 2, "f16")],
          QT.Q2_K: [(80, 82, "f16"), (82, 84, "f16")], QT.Q3_K: [(108, 110, "f16")],
          QT.Q4_K: [(0, 2, "f16"), (2, 4, "f16")], QT.Q5_K: [(0, 2, "f16"), (2, 4, "f16")],
          QT.Q6_K: [(208, 210, "f16")], QT.Q8_K: [(0, 4, "f32")]}


def ms(*args, **kw):
    return subprocess.run([MS, *args], check=True, capture_output=True, text=True, **kw).stdout


def field_value(f):
    v = f.contents()
    if isinstance(v, list):
        return ("arr", len(v))
    return v


def ours_value(s):
    """megascope model info --json formats values as text."""
    if s.startswith("["):
        return ("arr", int(s[1:].split(" x ")[0]))
    if s.startswith("'"):
        return s[1:-1]
    if s in ("true", "false"):
        return s == "true"
    try:
        return int(s)
    except ValueError:
        return float(s)


def dequant(t):
    if t.tensor_type == QT.Q8_K:  # gguf-py has no Q8_K: {f32 d; int8 qs[256]; int16 bsums[16]}, x = d * q
        b = np.array(t.data, dtype=np.uint8).reshape(-1, 292)
        return (b[:, :4].copy().view(np.float32) * b[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1)
    return quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)


def compare_file(path, tmp, names=None):
    info = json.loads(ms("model", "info", path, "--json"))
    r = gguf.GGUFReader(path)
    assert info["alignment"] == r.alignment, (info["alignment"], r.alignment)
    assert info["data_offset"] == r.data_offset, (info["data_offset"], r.data_offset)
    ours = info["metadata"]
    theirs = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for k, f in theirs.items():
        a, b = ours_value(ours[k]), field_value(f)
        if isinstance(b, float):
            assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (k, a, b)
        elif isinstance(b, str) and len(b) > 60:
            assert b.startswith(a[:-3]) or a == b, (k, a[:40], b[:40])
        else:
            assert a == b, (k, a, b)
    assert len(info["tensors"]) == len(r.tensors)
    by_name = {t.name: t for t in r.tensors}
    for t in info["tensors"]:
        rt = by_name[t["name"]]
        assert t["shape"] == [int(x) for x in rt.shape], (t["name"], t["shape"], rt.shape)
        assert t["type"].lower() == rt.tensor_type.name.lower(), (t["name"], t["type"], rt.tensor_type.name)
        assert t["offset"] + info["data_offset"] == rt.data_offset, t["name"]
        assert t["bytes"] == rt.n_bytes, t["name"]
    checked = 0
    for name in names if names is not None else by_name:
        out = f"{tmp}/t.bin"
        ms("model", "dump", path, name, "--out", out)
        a = np.fromfile(out, dtype=np.float32)
        b = dequant(by_name[name])
        assert a.shape == b.shape, (name, a.shape, b.shape)
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        assert diff == 0.0, (name, diff)
        checked += 1
    return len(theirs), len(r.tensors), checked


def cmd_write(tmp):
    for preset in ("tiny", "tiny-qwen3", "tiny-256"):
        ref = None
        for ty in [*TYPES, *K_TYPES] if preset == "tiny-256" else TYPES:
            path = f"{tmp}/{preset}-{ty}.gguf"
            ms("model", "synth", "--preset", preset, "--type", ty, "--out", path)
            keys, tensors, checked = compare_file(path, tmp)
            if ty == "f32":
                ref = {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}
            same = 0
            for t in gguf.GGUFReader(path).tensors if ty in TYPES else []:  # our quantizer against gguf-py's
                q = quants.quantize(ref[t.name], t.tensor_type)
                assert q.tobytes() == np.array(t.data).tobytes(), (preset, ty, t.name)
                same += 1
            bytes_note = (f"{same} tensors' bytes identical to gguf-py's quantizer" if ty in TYPES
                          else "(gguf-py has no quantizer for it)")
            print(f"write {preset} {ty}: {keys} keys, {tensors} tensors, {checked} tensors' values identical, {bytes_note}")


def cmd_blocks(tmp):
    rng = np.random.default_rng(11)
    path = f"{tmp}/blocks.gguf"
    w = gguf.GGUFWriter(path, "blocks")
    rows = 6
    for qt, fields in SCALES.items():
        blck, size = gguf.GGML_QUANT_SIZES[qt]
        nblk = 2 if blck == 256 else 8
        raw = rng.integers(0, 256, (rows, nblk, size), dtype=np.uint8)
        for lo, hi, kind in fields:  # finite scales of varied magnitude and sign
            v = rng.standard_normal((rows, nblk)) * np.exp2(rng.integers(-12, 4, (rows, nblk)))
            dt = np.float16 if kind == "f16" else np.float32
            raw[:, :, lo:hi] = v.astype(dt).view(np.uint8).reshape(rows, nblk, hi - lo)
        w.add_tensor(qt.name.lower(), raw.reshape(rows, nblk * size), raw_shape=(rows, nblk * size), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(path)
    for t in r.tensors:
        out = f"{tmp}/t.bin"
        ms("model", "dump", path, t.name, "--out", out)
        a = np.fromfile(out, dtype=np.float32)
        b = dequant(t)
        assert a.shape == b.shape, (t.name, a.shape, b.shape)
        same = a.view(np.uint32) == b.view(np.uint32)
        assert same.all(), (t.name, int((~same).sum()), a[~same][:4], b[~same][:4])
        ref = "a numpy d * q (gguf-py has no q8_K)" if t.tensor_type == QT.Q8_K else "gguf.quants.dequantize"
        print(f"blocks {t.name}: {a.size} values, the same bits as {ref}")


def copy_fields(r, w):
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY and len(f.types) < 2:  # empty (no merges)
            if k == "tokenizer.ggml.merges":
                w.add_token_merges([])
        elif f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[1])
        else:
            w.add_key_value(k, f.contents(), f.types[0])


def cmd_mix(tmp):
    src = {}
    for ty in ("q4_k", "q6_k", "q8_0"):
        path = f"{tmp}/mix-{ty}.gguf"
        ms("model", "synth", "--preset", "tiny-256", "--type", ty, "--out", path)
        src[ty] = gguf.GGUFReader(path)
    path = f"{tmp}/tiny-256-q4_k_m.gguf"
    w = gguf.GGUFWriter(path, src["q4_k"].fields["general.architecture"].contents())
    copy_fields(src["q4_k"], w)
    tensors = {ty: {t.name: t for t in r.tensors} for ty, r in src.items()}
    used = {}
    for name in tensors["q4_k"]:
        ty = "q8_0" if name == "token_embd.weight" else \
             "q6_k" if any(k in name for k in ("attn_v", "ffn_down", "output.weight")) else "q4_k"
        t = tensors[ty][name]
        w.add_tensor(name, np.array(t.data), raw_shape=np.array(t.data).shape, raw_dtype=t.tensor_type)
        used[t.tensor_type.name] = used.get(t.tensor_type.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    keys, n, checked = compare_file(path, tmp)
    for q8 in ([], ["--q8-activations", "--tolerance", "0.25"]):
        run = json.loads(ms("run", "--model", path, "--batch", "3", "--steps", "6", "--check", "--json", *q8))
        assert run["check_passed"], run["max_abs_logit_diff"]
        print(f"mix {dict(sorted(used.items()))}: {checked} of {n} tensors' values identical to gguf-py's; "
              f"run --check{' --q8-activations' if q8 else ''} max |logit diff| {run['max_abs_logit_diff']:.3g}")


def bytes_vocab():
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    cps, n = {}, 0
    for b in range(256):
        if b in printable:
            cps[b] = b
        else:
            cps[b] = 256 + n
            n += 1
    return [chr(cps[b]) for b in range(256)]


def cmd_read(tmp):
    rng = np.random.default_rng(7)
    dim, ffn, nh, nkv, hd, layers, vocab = 64, 96, 4, 2, 16, 2, 256
    for ty in ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
        path = f"{tmp}/py-{ty}.gguf"
        w = gguf.GGUFWriter(path, "llama")
        w.add_name("py-tiny")
        w.add_context_length(256)
        w.add_embedding_length(dim)
        w.add_block_count(layers)
        w.add_feed_forward_length(ffn)
        w.add_head_count(nh)
        w.add_head_count_kv(nkv)
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(bytes_vocab())
        w.add_token_types([1] * vocab)
        w.add_token_merges([])
        w.add_bos_token_id(1)

        def mat(name, rows, cols):
            a = (rng.standard_normal((rows, cols)) * (1.0 / np.sqrt(cols))).astype(np.float32)
            if ty == "f32":
                w.add_tensor(name, a)
            elif ty == "f16":
                w.add_tensor(name, a.astype(np.float16))
            else:
                q = quants.quantize(a, TYPES[ty])
                w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=TYPES[ty])

        def norm(name, n):
            w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

        mat("token_embd.weight", vocab, dim)
        for l in range(layers):
            norm(f"blk.{l}.attn_norm.weight", dim)
            mat(f"blk.{l}.attn_q.weight", nh * hd, dim)
            mat(f"blk.{l}.attn_k.weight", nkv * hd, dim)
            mat(f"blk.{l}.attn_v.weight", nkv * hd, dim)
            mat(f"blk.{l}.attn_output.weight", dim, nh * hd)
            norm(f"blk.{l}.ffn_norm.weight", dim)
            mat(f"blk.{l}.ffn_gate.weight", ffn, dim)
            mat(f"blk.{l}.ffn_up.weight", ffn, dim)
            mat(f"blk.{l}.ffn_down.weight", dim, ffn)
        norm("output_norm.weight", dim)
        mat("output.weight", vocab, dim)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        keys, tensors, checked = compare_file(path, tmp)
        info = json.loads(ms("model", "info", path, "--json"))
        assert "model" in info, info.get("model_error")
        m = info["model"]
        assert (m["layers"], m["dim"], m["ffn_dim"], m["heads"], m["kv_heads"], m["vocab"]) == (layers, dim, ffn, nh, nkv, vocab), m
        run = json.loads(ms("run", "--model", path, "--batch", "2", "--steps", "8", "--check", "--json"))
        assert run["check_passed"], run["max_abs_logit_diff"]
        print(f"read gguf-py {ty}: {keys} keys, {tensors} tensors, {checked} values identical; "
              f"run --check max |logit diff| {run['max_abs_logit_diff']:.3g}")


def cmd_file(path, tmp):
    r = gguf.GGUFReader(path)
    names = [t.name for t in r.tensors if t.name.startswith("blk.0.") or "norm" in t.name or t.name == "token_embd.weight"]
    keys, tensors, checked = compare_file(path, tmp, names)
    print(f"file {path}: {keys} keys, {tensors} tensors agree; {checked} tensors' values identical")


def cmd_f32(src, dst):
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[1])
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, dequant(t).reshape([int(x) for x in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if sys.argv[1] == "f32":
        cmd_f32(sys.argv[2], sys.argv[3])
        sys.exit(0)
    MS = sys.argv[2]
    if sys.argv[1] == "write":
        cmd_write(sys.argv[3])
    elif sys.argv[1] == "blocks":
        cmd_blocks(sys.argv[3])
    elif sys.argv[1] == "mix":
        cmd_mix(sys.argv[3])
    elif sys.argv[1] == "read":
        cmd_read(sys.argv[3])
    else:
        cmd_file(sys.argv[3], sys.argv[4])
