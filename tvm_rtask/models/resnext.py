"""ResNeXt-29 (16x64d) for CIFAR-10, 32x32 images.

Xie et al., "Aggregated Residual Transformations for Deep Neural Networks", CVPR 2017,
Sec. 5 and Table 7: a 3x3 stem conv of 64 channels, then three stages of three bottleneck
blocks (29 layers = 9 blocks x 3 + stem + classifier) with outputs 256, 512 and 1024 channels,
cardinality 16 and a bottleneck width of 64 per group at the first stage, doubled at each
down-sampling (stride 2 in the first block of stages 2 and 3); projection shortcuts (1x1
conv + BN) where the shape changes; global average pooling and a 10-way classifier.

``grouped=False`` (default) builds each block in the paper's equivalent form (b): 16 parallel
branches (1x1 conv, 3x3 conv) concatenated before the 1x1 expansion. This is the form Rammer
evaluated (microsoft/nnfusion ``artifacts/models/resnext_nchw``, after the taki0112
implementation) and it exposes the branches as independent operators. ``grouped=True`` uses
form (c), one grouped convolution (``Conv`` with ``group=16``, supported by TVM's importer).
The Rammer artifact's stage outputs are 64/128/256 and its shortcuts average-pool and
zero-pad; this module follows the paper (``widths`` changes the stage outputs).
"""

from __future__ import annotations

from ._builder import GraphBuilder, T

SUMMARY = "ResNeXt-29 16x64d, CIFAR-10 (Xie et al. 2017)"
FULL = dict(
    image=32,
    stem=64,
    widths=(256, 512, 1024),
    cardinality=16,
    bottleneck_width=64,
    blocks=3,
    classes=10,
    grouped=False,
)
REDUCED = dict(
    image=16, stem=8, widths=(8, 16, 16), cardinality=3, bottleneck_width=2, blocks=1, classes=10
)


def _cbr(b: GraphBuilder, x: T, cout: int, k: int, stride: int = 1, group: int = 1) -> T:
    return b.relu(b.batchnorm(b.conv(x, cout, k, stride, group=group)))


def _block(b, x: T, out: int, card: int, width: int, stride: int, grouped: bool) -> T:
    if grouped:
        y = _cbr(b, x, card * width, 1)
        y = _cbr(b, y, card * width, 3, stride, group=card)
    else:
        branches = [_cbr(b, _cbr(b, x, width, 1), width, 3, stride) for _ in range(card)]
        y = b.concat(branches, axis=1)
    y = b.batchnorm(b.conv(y, out, 1))
    shortcut = x
    if stride != 1 or x.channels != out:
        shortcut = b.batchnorm(b.conv(x, out, 1, stride, pads=0))
    return b.relu(b.add(y, shortcut))


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("resnext29", seed)
    x = b.input("input", (batch, 3, cfg["image"], cfg["image"]))
    x = _cbr(b, x, cfg["stem"], 3)
    for stage, out in enumerate(cfg["widths"]):
        width = cfg["bottleneck_width"] * 2**stage
        for block in range(cfg["blocks"]):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _block(b, x, out, cfg["cardinality"], width, stride, cfg["grouped"])
    x = b.flatten(b.global_avgpool(x))
    b.output(b.linear(x, cfg["classes"]), "logits")
    return b.build(SUMMARY)
