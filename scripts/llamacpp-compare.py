#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# The llama.cpp side of the comparisons in scripts/llamacpp-compare.sh, through
# llama-cpp-python's bindings of llama.cpp's C API (no Python-level sampling or
# caching: llama_decode on batches we build).
#
#   logits   MODEL IDS OUT.bin          teacher-forced logits of the comma-separated ids
#                                       (one batch, every position's logits, f32 KV cache), raw f32
#   tokenize MODEL TEXT                 ids (special tokens parsed, no BOS added)
#   bench    MODEL THREADS BATCH STEPS  decode tokens/s: BATCH sequences, each fed a
#                                       1-token prompt, then STEPS llama_decode calls of
#                                       BATCH tokens (one per sequence, greedy argmax),
#                                       after an unmeasured warm-up; prints JSON
#   prompt   MODEL THREADS N ROUNDS     prompt processing (llama-bench -p N): N prompt tokens in
#                                       one llama_decode (n_batch = N), logits of the last only;
#                                       seconds per round and tokens/s of the best; prints JSON
import json
import sys
import time

import numpy as np
import llama_cpp as L


def load(path, n_ctx, n_seq, threads, n_batch=512, kv_f32=False):
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    # No extra buffer types (the AMX repack): on this CPU's VM a batch of more
    # than one token through them crashes inside llama_decode.
    mp.use_extra_bufts = False
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        sys.exit(f"llamacpp-compare: cannot load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = max(n_batch, n_seq)
    cp.n_ubatch = max(n_batch, n_seq)
    cp.n_seq_max = n_seq
    cp.n_threads = threads
    cp.n_threads_batch = threads
    if kv_f32:  # llama.cpp keeps its KV cache in f16 unless told otherwise
        cp.type_k = cp.type_v = 0  # GGML_TYPE_F32
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("llamacpp-compare: cannot create a context")
    return model, ctx


def n_vocab(model):
    return L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))


def fill(batch, toks, poss, seqs, want_logits):
    batch.n_tokens = len(toks)
    for i, (t, p, s) in enumerate(zip(toks, poss, seqs)):
        batch.token[i] = t
        batch.pos[i] = p
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = s
        batch.logits[i] = 1 if want_logits(i) else 0


def cmd_logits(path, ids, out):
    ids = [int(x) for x in ids.split(",")]
    model, ctx = load(path, n_ctx=max(64, len(ids) + 8), n_seq=1, threads=2, n_batch=max(64, len(ids)), kv_f32=True)
    V = n_vocab(model)
    batch = L.llama_batch_init(len(ids), 0, 1)
    fill(batch, ids, range(len(ids)), [0] * len(ids), lambda i: True)
    if L.llama_decode(ctx, batch):
        sys.exit("llamacpp-compare: llama_decode failed")
    rows = [np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(V,)).copy() for i in range(len(ids))]
    np.stack(rows).astype(np.float32).tofile(out)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)


def cmd_tokenize(path, text):
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 8))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, True)
    print(",".join(str(buf[i]) for i in range(n)))
    L.llama_model_free(model)


def decode_round(ctx, batch, model, B, steps, start_pos):
    """steps llama_decode calls of B tokens (one per sequence); returns seconds."""
    V = n_vocab(model)
    toks = [1 + i % (V - 1) for i in range(B)]
    t0 = time.perf_counter()
    for s in range(steps):
        fill(batch, toks, [start_pos + s] * B, range(B), lambda i: True)
        if L.llama_decode(ctx, batch):
            sys.exit("llamacpp-compare: llama_decode failed")
        toks = [int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(V,)))) for i in range(B)]
    return time.perf_counter() - t0


def cmd_bench(path, threads, B, steps):
    threads, B, steps = int(threads), int(B), int(steps)
    warm = 2
    model, ctx = load(path, n_ctx=B * (steps + warm + 4), n_seq=B, threads=threads)
    batch = L.llama_batch_init(B, 0, B)
    decode_round(ctx, batch, model, B, warm, 0)       # warm-up: weights paged in, threads up
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    secs = decode_round(ctx, batch, model, B, steps, 0)
    print(json.dumps({"engine": "llama.cpp", "llama_cpp_python": L.__version__, "threads": threads, "batch": B,
                      "steps": steps, "seconds": secs, "tokens_per_s": B * steps / secs}))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)


def cmd_prompt(path, threads, n, rounds):
    threads, n, rounds = int(threads), int(n), int(rounds)
    model, ctx = load(path, n_ctx=n + 8, n_seq=1, threads=threads, n_batch=n)
    V = n_vocab(model)
    toks = [(i * 7919 + 13) % V for i in range(n)]  # the ids bench prefill feeds megascope
    batch = L.llama_batch_init(n, 0, 1)
    secs = []
    for r in range(rounds + 1):  # round 0 warms up
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        fill(batch, toks, range(n), [0] * n, lambda i: i == n - 1)
        t0 = time.perf_counter()
        if L.llama_decode(ctx, batch):
            sys.exit("llamacpp-compare: llama_decode failed")
        if r:
            secs.append(time.perf_counter() - t0)
    print(json.dumps({"engine": "llama.cpp", "llama_cpp_python": L.__version__, "threads": threads, "tokens": n,
                      "seconds": secs, "tokens_per_s": n / min(secs)}))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)


def cmd_quantize(src, out, ftype):
    """llama.cpp's own quantizer (llama-quantize): src (an f32 GGUF) -> out in ftype (Q4_K_M...)."""
    L.llama_backend_init()
    p = L.llama_model_quantize_default_params()
    p.ftype = getattr(L, "LLAMA_FTYPE_MOSTLY_" + ftype.upper())
    p.nthread = 2
    if L.llama_model_quantize(src.encode(), out.encode(), p):
        sys.exit(f"llamacpp-compare: llama_model_quantize {src} -> {ftype} failed")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "logits" and len(sys.argv) == 5:
        cmd_logits(*sys.argv[2:])
    elif cmd == "tokenize" and len(sys.argv) == 4:
        cmd_tokenize(*sys.argv[2:])
    elif cmd == "bench" and len(sys.argv) == 6:
        cmd_bench(*sys.argv[2:])
    elif cmd == "prompt" and len(sys.argv) == 6:
        cmd_prompt(*sys.argv[2:])
    elif cmd == "quantize" and len(sys.argv) == 5:
        cmd_quantize(*sys.argv[2:])
    else:
        sys.exit("usage: llamacpp-compare.py logits MODEL IDS OUT | tokenize MODEL TEXT | bench MODEL THREADS BATCH STEPS"
                 " | prompt MODEL THREADS N ROUNDS | quantize F32.gguf OUT.gguf FTYPE")
