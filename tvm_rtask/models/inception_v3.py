"""Inception-v3.

Szegedy et al., "Rethinking the Inception Architecture for Computer Vision", CVPR 2016,
in torchvision's ``inception_v3`` layout (299x299 input): the stem (conv 3x3/2 32, 3x3 32,
3x3 64, max pool, 1x1 80, 3x3 192, max pool), three InceptionA modules (Mixed_5b-d), the
grid reduction InceptionB (6a), four InceptionC modules with factorised 7x7 convolutions
(6b-e, 128/160/160/192 channels in the 7x7 branches), the reduction InceptionD (7a), two
InceptionE modules with expanded 1x3/3x1 branches (7b-c), global average pooling and a
1000-way classifier. Every conv is conv (no bias) + BatchNorm (eps 1e-3) + ReLU. The
auxiliary classifier is a training-time head and is left out, as torchvision does in eval.

``width`` scales every channel count and ``repeats`` the number of A/B/C/D/E modules (the
reduced variant keeps one of each).
"""

from __future__ import annotations

from ._builder import GraphBuilder, T

SUMMARY = "Inception-v3, ImageNet 299x299 (Szegedy et al. 2016; torchvision layout)"
FULL = dict(image=299, width=1.0, repeats=(3, 1, 4, 1, 2), classes=1000)
REDUCED = dict(image=75, width=1 / 16, repeats=(1, 1, 1, 1, 1), classes=10)
_C7 = (128, 160, 160, 192)
_POOL_A = (32, 64, 64)


class _Net:
    def __init__(self, b: GraphBuilder, width: float):
        self.b, self.width = b, width

    def c(self, n: int) -> int:
        return max(2, round(n * self.width))

    def conv(self, x: T, n: int, k, stride=1, pads=None) -> T:
        b = self.b
        return b.relu(b.batchnorm(b.conv(x, self.c(n), k, stride, pads), eps=1e-3))

    def avg3(self, x: T) -> T:
        # torchvision: F.avg_pool2d(x, 3, 1, 1), padding counted in the average.
        return self.b.avgpool(x, 3, 1, 1, count_include_pad=True)

    def a(self, x: T, pool: int) -> T:
        b1 = self.conv(x, 64, 1)
        b5 = self.conv(self.conv(x, 48, 1), 64, 5)
        b3 = self.conv(self.conv(self.conv(x, 64, 1), 96, 3), 96, 3)
        bp = self.conv(self.avg3(x), pool, 1)
        return self.b.concat([b1, b5, b3, bp], axis=1)

    def b_(self, x: T) -> T:
        b3 = self.conv(x, 384, 3, 2, 0)
        bd = self.conv(self.conv(self.conv(x, 64, 1), 96, 3), 96, 3, 2, 0)
        return self.b.concat([b3, bd, self.b.maxpool(x, 3, 2)], axis=1)

    def c_(self, x: T, c7: int) -> T:
        b1 = self.conv(x, 192, 1)
        b7 = self.conv(x, c7, 1)
        b7 = self.conv(self.conv(b7, c7, (1, 7), 1, (0, 3)), 192, (7, 1), 1, (3, 0))
        bd = self.conv(x, c7, 1)
        for n, k, p in (
            (c7, (7, 1), (3, 0)),
            (c7, (1, 7), (0, 3)),
            (c7, (7, 1), (3, 0)),
            (192, (1, 7), (0, 3)),
        ):
            bd = self.conv(bd, n, k, 1, p)
        bp = self.conv(self.avg3(x), 192, 1)
        return self.b.concat([b1, b7, bd, bp], axis=1)

    def d(self, x: T) -> T:
        b3 = self.conv(self.conv(x, 192, 1), 320, 3, 2, 0)
        b7 = self.conv(x, 192, 1)
        b7 = self.conv(self.conv(b7, 192, (1, 7), 1, (0, 3)), 192, (7, 1), 1, (3, 0))
        b7 = self.conv(b7, 192, 3, 2, 0)
        return self.b.concat([b3, b7, self.b.maxpool(x, 3, 2)], axis=1)

    def e(self, x: T) -> T:
        b1 = self.conv(x, 320, 1)
        b3 = self.conv(x, 384, 1)
        b3 = self.b.concat(
            [self.conv(b3, 384, (1, 3), 1, (0, 1)), self.conv(b3, 384, (3, 1), 1, (1, 0))], 1
        )
        bd = self.conv(self.conv(x, 448, 1), 384, 3)
        bd = self.b.concat(
            [self.conv(bd, 384, (1, 3), 1, (0, 1)), self.conv(bd, 384, (3, 1), 1, (1, 0))], 1
        )
        bp = self.conv(self.avg3(x), 192, 1)
        return self.b.concat([b1, b3, bd, bp], axis=1)


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("inception_v3", seed)
    n = _Net(b, cfg["width"])
    ra, rb, rc, rd, re = cfg["repeats"]
    x = b.input("input", (batch, 3, cfg["image"], cfg["image"]))
    x = n.conv(x, 32, 3, 2, 0)
    x = n.conv(x, 32, 3, 1, 0)
    x = b.maxpool(n.conv(x, 64, 3), 3, 2)
    x = n.conv(x, 80, 1)
    x = b.maxpool(n.conv(x, 192, 3, 1, 0), 3, 2)
    for i in range(ra):
        x = n.a(x, _POOL_A[min(i, 2)])
    for _ in range(rb):
        x = n.b_(x)
    for i in range(rc):
        x = n.c_(x, _C7[min(i, 3)])
    for _ in range(rd):
        x = n.d(x)
    for _ in range(re):
        x = n.e(x)
    x = b.flatten(b.global_avgpool(x))
    b.output(b.linear(x, cfg["classes"]), "logits")
    return b.build(SUMMARY)
