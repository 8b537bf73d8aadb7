"""One BERT-base encoder layer.

Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding", NAACL 2019, BERT-base configuration: hidden 768, 12 attention heads of 64,
feed-forward 3072 with exact (erf) GELU, post-LayerNorm (eps 1e-12) residual blocks, as in
the reference implementation's ``transformer_model``. Sequence length 128. The input is the
layer's hidden states ``(batch, seq, hidden)``; no padding mask (every token attends to every
token). Dropout is the identity at inference.

GELU is written with ``Erf`` (ONNX's ``Gelu`` is opset 20); ``LayerNormalization`` (opset
17) is imported by TVM 0.27 directly.
"""

from __future__ import annotations

import math

from ._builder import GraphBuilder

SUMMARY = "BERT-base encoder layer, sequence 128 (Devlin et al. 2019)"
FULL = dict(seq=128, hidden=768, heads=12, intermediate=3072)
REDUCED = dict(seq=8, hidden=16, heads=2, intermediate=32)


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("bert_base_layer", seed)
    s, d, h = cfg["seq"], cfg["hidden"], cfg["heads"]
    dh = d // h
    x = b.input("hidden_states", (batch, s, d))

    def heads(t):
        return b.transpose(b.reshape(t, (batch, s, h, dh)), (0, 2, 1, 3))

    q = heads(b.linear(x, d, init="uniform"))
    k = heads(b.linear(x, d, init="uniform"))
    v = heads(b.linear(x, d, init="uniform"))
    kt = b.transpose(k, (0, 1, 3, 2))
    scores = b.mul(b.node("MatMul", [q.name, kt.name], (batch, h, s, s)), 1.0 / math.sqrt(dh))
    probs = b.softmax(scores, axis=-1)
    ctx = b.node("MatMul", [probs.name, v.name], (batch, h, s, dh))
    ctx = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (batch, s, d))
    attn = b.layernorm(b.add(b.linear(ctx, d, init="uniform"), x))
    ffn = b.linear(b.gelu(b.linear(attn, cfg["intermediate"], init="uniform")), d, init="uniform")
    b.output(b.layernorm(b.add(ffn, attn)), "output")
    return b.build(SUMMARY)
