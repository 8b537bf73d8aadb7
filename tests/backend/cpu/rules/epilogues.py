"""Small ONNX models with the epilogues of EfficientNet-B0, RegNetY-400MF and
MobileNetV3-Small (issue 27) after their convolutions: SiLU (``x * sigmoid(x)``),
hard-swish, hard-sigmoid times the input, squeeze-and-excitation (global average pool,
1x1 conv, relu, 1x1 conv, sigmoid or hard-sigmoid, multiply with the main branch: the
multiply becomes an epilogue of the second 1x1 conv that reads its output broadcast over
the pixels), depthwise convs with these, and a residual add then relu. One branch per
case, each on its own 1x16x14x14 input, in one model (one compile). Weights are seeded He
normal, batch norms near identity, so activations stay alive."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

CHANNELS, SIZE = 16, 14


class _Graph:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def init(self, array, prefix: str = "w") -> str:
        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv(self, x, cin, cout, k=3, groups=1, bias=True) -> str:
        w = np.sqrt(2.0 / (cin // groups * k * k)) * self.rng.standard_normal(
            (cout, cin // groups, k, k)
        )
        inputs = [x, self.init(w)]
        if bias:
            inputs.append(self.init(0.1 * self.rng.standard_normal(cout), "b"))
        return self.node("Conv", inputs, kernel_shape=[k, k], pads=[k // 2] * 4, group=groups)

    def bn(self, x, c) -> str:
        r = self.rng
        stats = [
            1 + 0.1 * r.standard_normal(c),
            0.1 * r.standard_normal(c),
            0.1 * r.standard_normal(c),
            1 + 0.1 * r.random(c),
        ]
        return self.node("BatchNormalization", [x, *(self.init(s, "bn") for s in stats)])

    def silu(self, x) -> str:
        return self.node("Mul", [x, self.node("Sigmoid", [x])])

    def hardswish(self, x) -> str:
        return self.node("HardSwish", [x])

    def se(self, x, c, squeeze=4, gate="Sigmoid") -> str:
        pooled = self.node("GlobalAveragePool", [x])
        hidden = self.node("Relu", [self.conv(pooled, c, squeeze, k=1)])
        scale = self.conv(hidden, squeeze, c, k=1)
        scale = self.node(gate, [scale], **({"alpha": 1 / 6} if gate == "HardSigmoid" else {}))
        return self.node("Mul", [x, scale])


C = CHANNELS


def _silu_bn(g, x):  # EfficientNet: conv, batch norm, SiLU
    return g.silu(g.bn(g.conv(x, C, 32, bias=False), 32)), 32


def _silu_bias(g, x):  # SiLU right after a conv with bias
    return g.silu(g.conv(x, C, 32)), 32


def _hardswish(g, x):  # MobileNetV3
    return g.hardswish(g.conv(x, C, 32)), 32


def _hardsigmoid_mul(g, x):  # hard-swish spelled as HardSigmoid(x) * x
    c = g.conv(x, C, 24)
    return g.node("Mul", [c, g.node("HardSigmoid", [c], alpha=1 / 6, beta=0.5)]), 24


def _se(g, x):  # EfficientNet's MBConv tail: SiLU, SE, 1x1 projection
    y = g.se(g.silu(g.bn(g.conv(x, C, C, bias=False), C)), C)
    return g.conv(y, C, 24, k=1), 24


def _depthwise_se(g, x):  # depthwise conv, SiLU, SE (EfficientNet / RegNetY)
    return g.se(g.silu(g.bn(g.conv(x, C, C, groups=C, bias=False), C)), C), C


def _depthwise_hardswish_se(g, x):  # MobileNetV3: depthwise, hard-swish, SE with hard-sigmoid
    return g.se(g.hardswish(g.conv(x, C, C, groups=C)), C, gate="HardSigmoid"), C


def _residual(g, x):  # conv, add the block's input, relu (RegNet)
    return g.node("Relu", [g.node("Add", [g.conv(x, C, C), x])]), C


BRANCHES = {
    "silu_bn": _silu_bn,
    "silu_bias": _silu_bias,
    "hardswish": _hardswish,
    "hardsigmoid_mul": _hardsigmoid_mul,
    "se": _se,
    "depthwise_se": _depthwise_se,
    "depthwise_hardswish_se": _depthwise_hardswish_se,
    "residual": _residual,
}


def epilogue_model(branches=tuple(BRANCHES), seed: int = 0):
    """One ONNX model: an input ``<branch>`` of 1x16x14x14 and an output ``<branch>_y`` per
    branch."""
    g = _Graph(seed)
    inputs, outputs = [], []
    for name in branches:
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, C, SIZE, SIZE]))
        out, channels = BRANCHES[name](g, name)
        g.nodes.append(helper.make_node("Identity", [out], [f"{name}_y"]))
        outputs.append(
            helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, channels, SIZE, SIZE])
        )
    graph = helper.make_graph(g.nodes, "epilogues", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def is_se_scale(func) -> bool:
    """The SE scale's conv (on the pooled 1x1 map) with the multiply of the main branch."""
    shapes = [[int(d) for d in p.ty.shape] for p in func.params]
    return shapes[0][2:] == [1, 1] and shapes[-1][2:] == [SIZE, SIZE]  # data in, out
