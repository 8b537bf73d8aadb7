"""NASNet-A for CIFAR-10, 6@768.

Zoph et al., "Learning Transferable Architectures for Scalable Image Recognition", CVPR
2018, built as TF-slim's ``build_nasnet_cifar`` (``tensorflow/models`` research/slim
``nets/nasnet``; the graph Rammer evaluated, microsoft/nnfusion
``artifacts/models/nasnet_cifar_nchw``): a 3x3 stem of 96 channels (32 x stem multiplier 3)
with BatchNorm, 18 NASNet-A normal cells in three stacks of N = 6 with a reduction cell
before stacks 2 and 3, filters 32, 64, 128 per branch (a normal cell concatenates 6 branches:
6 x 128 = 768 channels in the penultimate layer, hence "6@768"), then ReLU, global average
pooling and a 10-way classifier. Cells follow slim's ``NasNetANormalCell`` and
``NasNetAReductionCell`` (operations, hidden-state indices and unused-state concatenation),
with ``_reduce_prev_layer``'s factorized reduction, separable convolutions applied twice
(ReLU, depthwise, pointwise, BN) and TensorFlow's ``SAME`` padding (asymmetric at stride 2).
Drop-path and the auxiliary head are training-only and left out.
"""

from __future__ import annotations

from ._builder import GraphBuilder, T, tf_same_pads

SUMMARY = "NASNet-A 6@768, CIFAR-10 (Zoph et al. 2018; TF-slim nasnet_cifar)"
FULL = dict(image=32, cells_per_stack=6, filters=32, stem_multiplier=3.0, classes=10)
REDUCED = dict(image=16, cells_per_stack=1, filters=4, stem_multiplier=1.0, classes=10)

NORMAL = (
    (
        "separable_5x5_2",
        "separable_3x3_2",
        "separable_5x5_2",
        "separable_3x3_2",
        "avg_pool_3x3",
        "none",
        "avg_pool_3x3",
        "avg_pool_3x3",
        "separable_3x3_2",
        "none",
    ),
    (1, 0, 0, 0, 0, 0, 0),
    (0, 1, 1, 1, 0, 1, 1, 1, 0, 0),
)
REDUCTION = (
    (
        "separable_5x5_2",
        "separable_7x7_2",
        "max_pool_3x3",
        "separable_7x7_2",
        "avg_pool_3x3",
        "separable_5x5_2",
        "none",
        "avg_pool_3x3",
        "separable_3x3_2",
        "max_pool_3x3",
    ),
    (1, 1, 1, 0, 0, 0, 0),
    (0, 1, 0, 1, 0, 1, 3, 2, 2, 0),
)
BN_EPS = 1e-5  # nasnet_cifar_arg_scope


def _bn(b: GraphBuilder, x: T) -> T:
    return b.batchnorm(x, BN_EPS)


def _conv1x1_bn(b: GraphBuilder, x: T, filters: int, stride: int = 1) -> T:
    return _bn(b, b.conv(x, filters, 1, stride, pads=0))


def _separable(b: GraphBuilder, x: T, k: int, stride: int, filters: int) -> T:
    """slim ``separable_conv2d`` (depth multiplier 1, SAME): depthwise then pointwise."""
    x = b.conv(x, x.channels, k, stride, tf_same_pads(x.hw, k, stride), group=x.channels)
    return b.conv(x, filters, 1, pads=0)


def _stacked_separable(b: GraphBuilder, x: T, k: int, stride: int, filters: int) -> T:
    for _ in range(2):  # "separable_KxK_2"
        x = _bn(b, _separable(b, b.relu(x), k, stride, filters))
        stride = 1
    return x


def _factorized_reduction(b: GraphBuilder, x: T, filters: int, stride: int) -> T:
    if stride == 1:
        return _conv1x1_bn(b, x, filters)
    path1 = b.conv(b.avgpool(x, 1, stride), filters // 2, 1, pads=0)
    n, c, h, w = x.shape
    shifted = b.slice(b.pad(x, [0, 0, 0, 0, 0, 0, 1, 1]), [1, 1], [h + 1, w + 1], [2, 3])
    path2 = b.conv(b.avgpool(shifted, 1, stride), filters // 2, 1, pads=0)
    return _bn(b, b.concat([path1, path2], axis=1))


def _apply_op(b: GraphBuilder, x: T, op: str, stride: int, filters: int) -> T:
    if op.startswith("separable"):
        return _stacked_separable(b, x, int(op.split("_")[1][0]), stride, filters)
    if op == "none":
        if stride > 1 or x.channels != filters:
            x = _conv1x1_bn(b, b.relu(x), filters, stride)
        return x
    kind = op.split("_")[0]
    pads = tf_same_pads(x.hw, 3, stride)
    # TF's SAME average pooling divides by the number of valid (unpadded) elements.
    y = b.maxpool(x, 3, stride, pads) if kind == "max" else b.avgpool(x, 3, stride, pads)
    if x.channels != filters:
        y = _conv1x1_bn(b, y, filters)
    return y


def _cell(b: GraphBuilder, kind, net: T, prev: T | None, filters: int, stride: int) -> T:
    ops, used, indices = kind
    # _reduce_prev_layer
    if prev is None:
        prev = net
    elif prev.hw != net.hw:
        prev = _factorized_reduction(b, b.relu(prev), filters, 2)
    elif prev.channels != filters:
        prev = _conv1x1_bn(b, b.relu(prev), filters)
    states = [_conv1x1_bn(b, b.relu(net), filters), prev]
    for it in range(5):
        left, right = indices[2 * it], indices[2 * it + 1]
        h1 = _apply_op(b, states[left], ops[2 * it], stride if left < 2 else 1, filters)
        h2 = _apply_op(b, states[right], ops[2 * it + 1], stride if right < 2 else 1, filters)
        states.append(b.add(h1, h2))
    final = states[-1]
    out = []
    for idx, is_used in enumerate(used):
        if is_used:
            continue
        s = states[idx]
        if s.hw != final.hw or s.channels != final.channels:
            s = _factorized_reduction(b, s, final.channels, 2 if s.hw != final.hw else 1)
        out.append(s)
    return b.concat(out, axis=1)


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("nasnet_a_cifar", seed)
    x = b.input("input", (batch, 3, cfg["image"], cfg["image"]))
    net = _bn(b, b.conv(x, int(cfg["filters"] * cfg["stem_multiplier"]), 3))
    outputs: list[T | None] = [None, net]
    num_cells = 3 * cfg["cells_per_stack"]
    reductions = [int(p / 3 * num_cells) for p in (1, 2)]  # calc_reduction_layers
    scaling = 1
    for cell in range(num_cells):
        if cell in reductions:
            scaling *= 2
            net = _cell(b, REDUCTION, net, outputs[-2], cfg["filters"] * scaling, 2)
            outputs.append(net)
        net = _cell(b, NORMAL, net, outputs[-2], cfg["filters"] * scaling, 1)
        outputs.append(net)
    x = b.flatten(b.global_avgpool(b.relu(net)))
    b.output(b.linear(x, cfg["classes"]), "logits")
    return b.build(SUMMARY)
