"""AlexNet, as Rammer evaluated it.

Krizhevsky et al., "ImageNet Classification with Deep Convolutional Neural Networks", NIPS
2012, single-tower variant of TensorFlow's ``tf_cnn_benchmarks`` (microsoft/nnfusion
``artifacts/models/alexnet_nchw``): 227x227 input, conv 11x11/4 (64, VALID), max pool 3/2,
conv 5x5 (192), max pool, conv 3x3 (384, 384, 256), max pool, fully connected 4096, 4096 and
a 1000-way classifier, ReLU after every conv and hidden layer, biases everywhere. Dropout is
the identity at inference and is left out. No LRN (as in that benchmark).
"""

from __future__ import annotations

from ._builder import GraphBuilder

SUMMARY = "AlexNet, ImageNet 227x227 (Krizhevsky et al. 2012; tf_cnn_benchmarks layout)"
FULL = dict(image=227, convs=(64, 192, 384, 384, 256), fc=4096, classes=1000)
REDUCED = dict(image=67, convs=(4, 8, 8, 8, 8), fc=16, classes=10)


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("alexnet", seed)
    c1, c2, c3, c4, c5 = cfg["convs"]
    x = b.input("input", (batch, 3, cfg["image"], cfg["image"]))
    x = b.relu(b.conv(x, c1, 11, 4, pads=0, bias=True))
    x = b.maxpool(x, 3, 2)
    x = b.relu(b.conv(x, c2, 5, bias=True))
    x = b.maxpool(x, 3, 2)
    for c in (c3, c4, c5):
        x = b.relu(b.conv(x, c, 3, bias=True))
    x = b.flatten(b.maxpool(x, 3, 2))
    x = b.relu(b.linear(x, cfg["fc"]))
    x = b.relu(b.linear(x, cfg["fc"]))
    b.output(b.linear(x, cfg["classes"]), "logits")
    return b.build(SUMMARY)
