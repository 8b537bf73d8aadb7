"""SqueezeNet v1.1.

Iandola et al., "SqueezeNet: AlexNet-level accuracy with 50x fewer parameters and <0.5MB
model size", 2016, with the v1.1 changes of the authors' repository (3x3 stem of 64 channels
with stride 2, pooling after fire modules 2 and 4), laid out as torchvision's
``squeezenet1_1``: eight fire modules (squeeze 1x1, then expand 1x1 and expand 3x3
concatenated), max pooling with ``ceil_mode``, a 1x1 classifier conv, ReLU and global
average pooling. 224x224 input.
"""

from __future__ import annotations

from ._builder import GraphBuilder, T

SUMMARY = "SqueezeNet v1.1, ImageNet 224x224 (Iandola et al. 2016)"
# (squeeze, expand1x1, expand3x3) of the eight fire modules; pooling after modules 2 and 4.
FIRES = (
    (16, 64, 64),
    (16, 64, 64),
    (32, 128, 128),
    (32, 128, 128),
    (48, 192, 192),
    (48, 192, 192),
    (64, 256, 256),
    (64, 256, 256),
)
FULL = dict(image=224, stem=64, scale=1.0, classes=1000)
REDUCED = dict(image=48, stem=8, scale=0.125, classes=10)


def _fire(b: GraphBuilder, x: T, squeeze: int, e1: int, e3: int) -> T:
    s = b.relu(b.conv(x, squeeze, 1, bias=True))
    return b.concat(
        [b.relu(b.conv(s, e1, 1, bias=True)), b.relu(b.conv(s, e3, 3, bias=True))], axis=1
    )


def _pool(b: GraphBuilder, x: T) -> T:
    return b.maxpool(x, 3, 2, ceil_mode=True)


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("squeezenet1_1", seed)
    x = b.input("input", (batch, 3, cfg["image"], cfg["image"]))
    x = _pool(b, b.relu(b.conv(x, cfg["stem"], 3, 2, pads=0, bias=True)))
    for i, fire in enumerate(FIRES):
        x = _fire(b, x, *(max(1, round(c * cfg["scale"])) for c in fire))
        if i in (1, 3):
            x = _pool(b, x)
    x = b.relu(b.conv(x, cfg["classes"], 1, bias=True))
    b.output(b.flatten(b.global_avgpool(x)), "logits")
    return b.build(SUMMARY)
