"""RandWire-WS, small regime.

Xie et al., "Exploring Randomly Wired Neural Networks for Image Recognition", ICCV 2019,
Table 2 (small computation regime) with WS(K=4, P=0.75) graphs: conv1 3x3/2 (C/2 channels,
BN), conv2 3x3/2 (C, ReLU-conv-BN), then three randomly wired stages of N/2, N and N nodes at
C, 2C and 4C channels (each stage its own Watts-Strogatz graph, edges oriented from lower to
higher node index), then ReLU, 1x1 conv to 1280 channels, BN, ReLU, global average pooling and
a 1000-way classifier; C = 78, N = 32, 224x224 input.

A node aggregates its inputs by a weighted sum with positive weights (sigmoid of a learned
parameter, fixed numbers at inference: a ``Mul`` by a constant per edge), then applies
ReLU, a 3x3 separable convolution (depthwise + pointwise) and BN. Nodes without
predecessors read the stage input with stride 2; the stage output is the average of the
nodes without successors. The graphs come from ``networkx.watts_strogatz_graph`` with a seed
derived from ``seed`` and the stage, so a given seed always gives the same wiring.
"""

from __future__ import annotations

import numpy as np

from ._builder import GraphBuilder, T

SUMMARY = "RandWire-WS(4, 0.75) small regime, ImageNet 224x224 (Xie et al. 2019)"
FULL = dict(image=224, channels=78, nodes=32, k=4, p=0.75, classes=1000, head=1280)
REDUCED = dict(image=32, channels=8, nodes=4, k=2, p=0.75, classes=10, head=16)


def _dag(n: int, k: int, p: float, seed: int) -> list[list[int]]:
    """Predecessors of each node of a WS graph oriented from lower to higher index."""
    import networkx as nx

    graph = nx.watts_strogatz_graph(n, k, p, seed=seed)
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in graph.edges():
        lo, hi = min(u, v), max(u, v)
        preds[hi].append(lo)
    return [sorted(p) for p in preds]


def _node_op(b: GraphBuilder, x: T, channels: int, stride: int) -> T:
    x = b.relu(x)
    x = b.conv(x, x.channels, 3, stride, group=x.channels)
    return b.batchnorm(b.conv(x, channels, 1, pads=0))


def _stage(b: GraphBuilder, x: T, channels: int, nodes: int, k: int, p: float, seed: int) -> T:
    preds = _dag(nodes, k, p, seed)
    succs = {u for ps in preds for u in ps}
    outs: list[T] = []
    for ps in preds:
        if not ps:
            outs.append(_node_op(b, x, channels, 2))
            continue
        weights = 1.0 / (1.0 + np.exp(-b.rng.standard_normal(len(ps))))
        agg = b.sum([b.mul(outs[u], float(w)) for u, w in zip(ps, weights, strict=True)])
        outs.append(_node_op(b, agg, channels, 1))
    last = [outs[v] for v in range(nodes) if v not in succs]
    return b.mul(b.sum(last), 1.0 / len(last)) if len(last) > 1 else last[0]


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("randwire_ws", seed)
    c, n = cfg["channels"], cfg["nodes"]
    x = b.input("input", (batch, 3, cfg["image"], cfg["image"]))
    x = b.batchnorm(b.conv(x, c // 2, 3, 2))
    x = b.batchnorm(b.conv(b.relu(x), c, 3, 2))
    for i, (nodes, width) in enumerate(((n // 2, c), (n, 2 * c), (n, 4 * c))):
        x = _stage(b, x, width, nodes, cfg["k"], cfg["p"], seed * 1000 + i)
    x = b.relu(b.batchnorm(b.conv(b.relu(x), cfg["head"], 1, pads=0)))
    x = b.flatten(b.global_avgpool(x))
    b.output(b.linear(x, cfg["classes"]), "logits")
    return b.build(SUMMARY)
