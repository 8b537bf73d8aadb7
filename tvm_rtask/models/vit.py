"""A small vision transformer: DeiT-Tiny.

Touvron et al., "Training data-efficient image transformers & distillation through
attention", ICML 2021, DeiT-Ti: the ViT of Dosovitskiy et al. (ICLR 2021) at hidden size 192,
3 heads of 64, 12 pre-LayerNorm blocks (eps 1e-6), MLP ratio 4 with exact (erf) GELU, 16x16
patches of a 224x224 image, a class token and learned position embeddings, the classifier
on the class token (no distillation token). Written as timm writes it: one ``qkv`` product,
reshaped to ``(3, batch, heads, tokens, 64)`` and taken apart with ``Gather``, ``q`` scaled
before ``q @ k^T``. About 1.3 GFLOPs at batch 1: attention, layer norms and reshapes are a
larger share of the time than in ViT-B/16, where the dense layers dominate.
"""

from __future__ import annotations

import math

import numpy as np

from ._builder import GraphBuilder, T

SUMMARY = "DeiT-Tiny vision transformer, 224x224, 12 blocks of width 192 (Touvron et al. 2021)"
FULL = dict(image=224, patch=16, hidden=192, heads=3, layers=12, mlp=768, classes=1000)
REDUCED = dict(image=32, patch=8, hidden=32, heads=2, layers=2, mlp=64, classes=10)


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("deit_tiny", seed)
    d, h, p = cfg["hidden"], cfg["heads"], cfg["patch"]
    dh = d // h
    grid = cfg["image"] // p
    s = grid * grid + 1  # the patches and the class token
    image = b.input("input", (batch, 3, cfg["image"], cfg["image"]))
    patches = b.conv(image, d, p, stride=p, pads=0, bias=True)
    tokens = b.transpose(b.reshape(patches, (batch, d, grid * grid)), (0, 2, 1))
    cls = b.uniform((1, 1, d), 1.0, "cls_token")
    cls = b.node("Expand", [cls, b.const([batch, 1, d], np.int64)], (batch, 1, d))
    position = T(b.uniform((1, s, d), 1.0, "pos_embed"), (1, s, d))
    x = b.add(b.concat([cls, tokens], axis=1), position)
    for _ in range(cfg["layers"]):
        x = b.add(x, _attention(b, b.layernorm(x, 1e-6), batch, s, h, dh))
        y = b.layernorm(x, 1e-6)
        y = b.linear(b.gelu(b.linear(y, cfg["mlp"], init="uniform")), d, init="uniform")
        x = b.add(x, y)
    x = b.layernorm(x, 1e-6)
    first = b.node("Gather", [x.name, b.const(0, np.int64)], (batch, d), axis=1)
    b.output(b.linear(first, cfg["classes"], init="uniform"), "logits")
    return b.build(SUMMARY)


def _attention(b: GraphBuilder, x, batch: int, s: int, h: int, dh: int):
    d = h * dh
    qkv = b.reshape(b.linear(x, 3 * d, init="uniform"), (batch, s, 3, h, dh))
    qkv = b.transpose(qkv, (2, 0, 3, 1, 4))  # (3, batch, heads, tokens, dh)
    q, k, v = (
        b.node("Gather", [qkv.name, b.const(i, np.int64)], (batch, h, s, dh), axis=0)
        for i in range(3)
    )
    q = b.mul(q, 1.0 / math.sqrt(dh))
    scores = b.node("MatMul", [q.name, b.transpose(k, (0, 1, 3, 2)).name], (batch, h, s, s))
    probs = b.softmax(scores, axis=-1)
    ctx = b.node("MatMul", [probs.name, v.name], (batch, h, s, dh))
    ctx = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (batch, s, d))
    return b.linear(ctx, d, init="uniform")
