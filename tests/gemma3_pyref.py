#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# An independent forward of a gemma3 GGUF in numpy, on the weights as gguf-py
# dequantizes them (llama.cpp's gemma3 graph: embeddings x sqrt(dim), q/k norm,
# NEOX RoPE with base 1e6 on every sixth layer and 1e4 on the sliding-window ones,
# post-attention and post-FFN norms before the residual adds, GeGLU, tied
# output), whole-sequence causal attention, float64. Prints the top 5 next
# tokens after <bos> + the given ids as "top5 id,id,...". Gemma-3-270M only
# (its sizes are fixed here). Usage: gemma3_pyref.py FILE ID,ID,...
import sys, numpy as np, gguf
from gguf.quants import dequantize
r = gguf.GGUFReader(sys.argv[1])
T = {t.name: t for t in r.tensors}
def W(n):
    t = T[n]; a = dequantize(t.data, t.tensor_type).astype(np.float32)
    return a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 and len(t.shape) > 1 else a
ids = [2] + [int(x) for x in sys.argv[2].split(",")]
E = W("token_embd.weight").reshape(262144, 640)
dim, H, hd, L, eps = 640, 4, 256, 18, 1e-6
def rms(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
def rope(x, pos, base):  # x (n, heads, hd), NEOX
    i = np.arange(hd // 2); f = base ** (-2.0 * i / hd); th = pos[:, None] * f[None, :]
    c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
    a, b = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], -1)
def gelu(x): return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
n = len(ids); pos = np.arange(n, dtype=np.float64)
x = E[ids].astype(np.float64) * np.sqrt(640.0)
for l in range(L):
    p = f"blk.{l}."
    g = lambda s: W(p + s).astype(np.float64)
    h = rms(x, g("attn_norm.weight"))
    q = (h @ g("attn_q.weight").reshape(1024, 640).T).reshape(n, H, hd)
    k = (h @ g("attn_k.weight").reshape(256, 640).T).reshape(n, 1, hd)
    v = (h @ g("attn_v.weight").reshape(256, 640).T).reshape(n, 1, hd)
    q = rms(q, g("attn_q_norm.weight")); k = rms(k, g("attn_k_norm.weight"))
    glob = (l + 1) % 6 == 0
    base = 1e6 if glob else 1e4
    q, k = rope(q, pos, base), rope(k, pos, base)
    s = np.einsum("qhd,kd->hqk", q, k[:, 0]) / 16.0
    mask = np.tril(np.ones((n, n), bool))
    if not glob: mask &= (np.arange(n)[:, None] - np.arange(n)[None, :]) < 512
    s = np.where(mask, s, -np.inf); s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
    o = np.einsum("hqk,kd->qhd", s, v[:, 0]).reshape(n, 1024)
    o = o @ g("attn_output.weight").reshape(640, 1024).T
    x = x + rms(o, g("post_attention_norm.weight"))
    h = rms(x, g("ffn_norm.weight"))
    f = gelu(h @ g("ffn_gate.weight").reshape(2048, 640).T) * (h @ g("ffn_up.weight").reshape(2048, 640).T)
    f = f @ g("ffn_down.weight").reshape(640, 2048).T
    x = x + rms(f, g("post_ffw_norm.weight"))
x = rms(x[-1], W("output_norm.weight").astype(np.float64))
lg = E.astype(np.float64) @ x
top = np.argsort(-lg)[:5]
print("top5", ",".join(str(int(t)) for t in top), " ".join("%.3f" % lg[t] for t in top))
