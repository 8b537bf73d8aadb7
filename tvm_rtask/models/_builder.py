"""A small ONNX graph builder that tracks shapes, used by every model of the zoo.

Models are written as plain Python calls (``b.conv(x, 64, 3)``); each call appends ONNX nodes
and seeded random initializers and returns a :class:`T` (tensor name and static shape), so a
model can ask for channel counts and spatial sizes while it is being built, as the
TensorFlow/PyTorch originals do. Only operators that TVM 0.27's ONNX importer supports are
emitted (it has no ``LSTM``/``GRU``/``RNN``; recurrent cells are unrolled in ``_rnn.py``).

Weights are seeded random tensors scaled so that activations neither vanish nor explode
through deep stacks (He-normal convolutions, BatchNorm with positive variances and scales
near one), so comparing against ONNX Runtime tests real arithmetic.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

OPSET = 17  # LayerNormalization is opset 17; ReduceMean still takes ``axes`` as attribute.


@dataclass(frozen=True)
class T:
    """A tensor of the graph being built: its ONNX name and static shape."""

    name: str
    shape: tuple[int, ...]

    @property
    def channels(self) -> int:
        return self.shape[1]

    @property
    def hw(self) -> tuple[int, int]:
        return self.shape[2], self.shape[3]


def _pads4(pads, k: tuple[int, int]) -> tuple[int, int, int, int]:
    """ONNX pads (top, left, bottom, right) from None ("same" for odd kernels), an int, a
    (h, w) pair or a 4-tuple."""
    if pads is None:
        return (k[0] // 2, k[1] // 2, k[0] // 2, k[1] // 2)
    if isinstance(pads, int):
        return (pads, pads, pads, pads)
    if len(pads) == 2:
        return (pads[0], pads[1], pads[0], pads[1])
    return tuple(pads)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def tf_same_pads(size: tuple[int, int], k, stride) -> tuple[int, int, int, int]:
    """TensorFlow's ``padding='SAME'``: output = ceil(size / stride), extra pad at the end."""
    k, stride = _pair(k), _pair(stride)
    before, after = [], []
    for n, kk, s in zip(size, k, stride, strict=True):
        out = -(-n // s)
        total = max((out - 1) * s + kk - n, 0)
        before.append(total // 2)
        after.append(total - total // 2)
    return (before[0], before[1], after[0], after[1])


def _window_out(
    size: int, k: int, stride: int, pad: int, dilation: int = 1, ceil: bool = False
) -> int:
    span = size + pad - dilation * (k - 1) - 1
    return (-(-span // stride) if ceil else span // stride) + 1


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


class GraphBuilder:
    """Collects nodes, initializers, inputs and outputs; :meth:`build` makes the ModelProto."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.graph_name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.initializers: list = []
        self.inputs: list = []
        self.outputs: list = []
        self._names: Counter[str] = Counter()
        self._consts: dict[tuple, str] = {}

    # -- names, inputs, initializers ---------------------------------------------------
    def fresh(self, hint: str) -> str:
        self._names[hint] += 1
        return f"{hint}_{self._names[hint]}"

    def input(self, name: str, shape: Sequence[int]) -> T:
        from onnx import TensorProto, helper

        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return T(name, tuple(shape))

    def output(self, t: T, name: str | None = None) -> T:
        from onnx import TensorProto, helper

        if name is not None and name != t.name:
            t = self.node("Identity", [t.name], t.shape, name=name)
        self.outputs.append(helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape)))
        return t

    def initializer(self, array: np.ndarray, hint: str) -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), name=name))
        return name

    def const(self, value, dtype=np.float32) -> str:
        """A small constant, shared between uses (scalars, shapes, split sizes)."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = self.initializer(array, "const")
        return self._consts[key]

    def weight(self, shape: Sequence[int], fan_in: int, hint: str = "w") -> str:
        """He-normal weight: std sqrt(2 / fan_in)."""
        std = math.sqrt(2.0 / max(fan_in, 1))
        return self.initializer((std * self.rng.standard_normal(shape)).astype(np.float32), hint)

    def uniform(self, shape: Sequence[int], bound: float, hint: str = "w") -> str:
        return self.initializer(self.rng.uniform(-bound, bound, shape).astype(np.float32), hint)

    def bias(self, n: int, hint: str = "b") -> str:
        return self.initializer((0.1 * self.rng.standard_normal(n)).astype(np.float32), hint)

    # -- generic nodes ---------------------------------------------------------------
    def node(
        self,
        op_type: str,
        inputs: Sequence[str],
        shape: Sequence[int],
        name: str | None = None,
        **attrs,
    ) -> T:
        from onnx import helper

        out = name or self.fresh(op_type.lower())
        self.nodes.append(
            helper.make_node(op_type, list(inputs), [out], name=self.fresh("n_" + op_type), **attrs)
        )
        return T(out, tuple(int(d) for d in shape))

    def node_multi(
        self, op_type: str, inputs: Sequence[str], shapes: Sequence[Sequence[int]], **attrs
    ) -> list[T]:
        from onnx import helper

        outs = [self.fresh(op_type.lower()) for _ in shapes]
        self.nodes.append(
            helper.make_node(op_type, list(inputs), outs, name=self.fresh("n_" + op_type), **attrs)
        )
        return [T(o, tuple(s)) for o, s in zip(outs, shapes, strict=True)]

    # -- element-wise --------------------------------------------------------------------
    def unary(self, op_type: str, x: T) -> T:
        return self.node(op_type, [x.name], x.shape)

    def relu(self, x: T) -> T:
        return self.unary("Relu", x)

    def sigmoid(self, x: T) -> T:
        return self.unary("Sigmoid", x)

    def tanh(self, x: T) -> T:
        return self.unary("Tanh", x)

    def clip(self, x: T, lo: float, hi: float) -> T:
        return self.node("Clip", [x.name, self.const(lo), self.const(hi)], x.shape)

    def binary(self, op_type: str, a: T | float, b: T | float) -> T:
        a = a if isinstance(a, T) else T(self.const(a), ())
        b = b if isinstance(b, T) else T(self.const(b), ())
        return self.node(op_type, [a.name, b.name], _broadcast(a.shape, b.shape))

    def add(self, a, b) -> T:
        return self.binary("Add", a, b)

    def mul(self, a, b) -> T:
        return self.binary("Mul", a, b)

    def div(self, a, b) -> T:
        return self.binary("Div", a, b)

    def sum(self, xs: Sequence[T]) -> T:
        """Pairwise Adds, left to right (as ``x1 + x2 + ...`` in the framework originals)."""
        acc = xs[0]
        for x in xs[1:]:
            acc = self.add(acc, x)
        return acc

    def gelu(self, x: T) -> T:
        """Exact GELU, 0.5 x (1 + erf(x / sqrt 2)) (ONNX's Gelu op is opset 20)."""
        e = self.unary("Erf", self.mul(x, 1.0 / math.sqrt(2.0)))
        return self.mul(self.mul(x, 0.5), self.add(e, 1.0))

    # -- convolution and normalisation -------------------------------------------------
    def conv(
        self,
        x: T,
        cout: int,
        k,
        stride=1,
        pads=None,
        group: int = 1,
        bias: bool = False,
        dilation: int = 1,
    ) -> T:
        k, stride = _pair(k), _pair(stride)
        pads = _pads4(pads, k)
        n, cin, h, w = x.shape
        if cin % group or cout % group:
            raise ValueError(f"conv: channels {cin}->{cout} not divisible by group {group}")
        inputs = [x.name, self.weight((cout, cin // group, *k), cin // group * k[0] * k[1])]
        if bias:
            inputs.append(self.bias(cout))
        oh = _window_out(h, k[0], stride[0], pads[0] + pads[2], dilation)
        ow = _window_out(w, k[1], stride[1], pads[1] + pads[3], dilation)
        return self.node(
            "Conv",
            inputs,
            (n, cout, oh, ow),
            kernel_shape=list(k),
            strides=list(stride),
            pads=list(pads),
            group=group,
            dilations=[dilation, dilation],
        )

    def batchnorm(self, x: T, eps: float = 1e-5) -> T:
        c = x.shape[1]
        scale = self.initializer(self.rng.uniform(0.5, 1.5, c).astype(np.float32), "bn_scale")
        beta = self.initializer((0.1 * self.rng.standard_normal(c)).astype(np.float32), "bn_b")
        mean = self.initializer((0.1 * self.rng.standard_normal(c)).astype(np.float32), "bn_m")
        var = self.initializer(self.rng.uniform(0.5, 1.5, c).astype(np.float32), "bn_var")
        return self.node(
            "BatchNormalization", [x.name, scale, beta, mean, var], x.shape, epsilon=eps
        )

    def layernorm(self, x: T, eps: float = 1e-12) -> T:
        d = x.shape[-1]
        gamma = self.initializer(self.rng.uniform(0.5, 1.5, d).astype(np.float32), "ln_g")
        beta = self.initializer((0.1 * self.rng.standard_normal(d)).astype(np.float32), "ln_b")
        return self.node("LayerNormalization", [x.name, gamma, beta], x.shape, axis=-1, epsilon=eps)

    # -- pooling -------------------------------------------------------------------------
    def _pool(self, op_type: str, x: T, k, stride, pads, ceil_mode=False, **attrs) -> T:
        k, stride = _pair(k), _pair(stride)
        pads = _pads4(pads if pads is not None else 0, k)
        n, c, h, w = x.shape
        oh = _window_out(h, k[0], stride[0], pads[0] + pads[2], ceil=ceil_mode)
        ow = _window_out(w, k[1], stride[1], pads[1] + pads[3], ceil=ceil_mode)
        if ceil_mode:
            attrs["ceil_mode"] = 1
        return self.node(
            op_type,
            [x.name],
            (n, c, oh, ow),
            kernel_shape=list(k),
            strides=list(stride),
            pads=list(pads),
            **attrs,
        )

    def maxpool(self, x: T, k, stride, pads=None, ceil_mode: bool = False) -> T:
        return self._pool("MaxPool", x, k, stride, pads, ceil_mode)

    def avgpool(self, x: T, k, stride, pads=None, count_include_pad: bool = False) -> T:
        return self._pool(
            "AveragePool", x, k, stride, pads, count_include_pad=int(count_include_pad)
        )

    def global_avgpool(self, x: T) -> T:
        return self.node("GlobalAveragePool", [x.name], (*x.shape[:2], 1, 1))

    # -- dense ---------------------------------------------------------------------------
    def matmul(self, x: T, w: str, n_out: int) -> T:
        return self.node("MatMul", [x.name, w], (*x.shape[:-1], n_out))

    def linear(self, x: T, n_out: int, bias: bool = True, init: str = "he") -> T:
        """``x @ W (+ b)`` over the last axis; ``init`` "he" or "uniform" (1/sqrt(fan_in))."""
        n_in = x.shape[-1]
        if init == "he":
            w = self.weight((n_in, n_out), n_in)
        else:
            w = self.uniform((n_in, n_out), 1.0 / math.sqrt(n_in))
        y = self.matmul(x, w, n_out)
        if bias:
            y = self.node("Add", [y.name, self.bias(n_out)], y.shape)
        return y

    # -- shapes --------------------------------------------------------------------------
    def concat(self, xs: Sequence[T], axis: int) -> T:
        if len(xs) == 1:
            return xs[0]
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        return self.node("Concat", [x.name for x in xs], shape, axis=axis)

    def flatten(self, x: T) -> T:
        return self.node("Flatten", [x.name], (x.shape[0], int(np.prod(x.shape[1:]))), axis=1)

    def reshape(self, x: T, shape: Sequence[int]) -> T:
        if int(np.prod(shape)) != int(np.prod(x.shape)):
            raise ValueError(f"reshape {x.shape} -> {tuple(shape)} changes the size")
        return self.node("Reshape", [x.name, self.const(list(shape), np.int64)], shape)

    def transpose(self, x: T, perm: Sequence[int]) -> T:
        return self.node("Transpose", [x.name], [x.shape[p] for p in perm], perm=list(perm))

    def split(self, x: T, axis: int, sizes: Sequence[int]) -> list[T]:
        shapes = []
        for s in sizes:
            shape = list(x.shape)
            shape[axis] = s
            shapes.append(shape)
        return self.node_multi(
            "Split", [x.name, self.const(list(sizes), np.int64)], shapes, axis=axis
        )

    def take(self, x: T, index: int, axis: int) -> T:
        """``x[..., index, ...]`` along ``axis`` (the axis disappears): ONNX Gather."""
        shape = [d for i, d in enumerate(x.shape) if i != axis % len(x.shape)]
        return self.node("Gather", [x.name, self.const(index, np.int64)], shape, axis=axis)

    def pad(self, x: T, pads: Sequence[int]) -> T:
        """Zero padding; ``pads`` in ONNX order (all begins, then all ends)."""
        rank = len(x.shape)
        shape = [x.shape[i] + pads[i] + pads[i + rank] for i in range(rank)]
        return self.node("Pad", [x.name, self.const(list(pads), np.int64)], shape)

    def slice(self, x: T, starts, ends, axes) -> T:
        shape = list(x.shape)
        for s, e, a in zip(starts, ends, axes, strict=True):
            shape[a] = len(range(*slice(s, e).indices(x.shape[a])))
        return self.node(
            "Slice",
            [
                x.name,
                self.const(list(starts), np.int64),
                self.const(list(ends), np.int64),
                self.const(list(axes), np.int64),
            ],
            shape,
        )

    def softmax(self, x: T, axis: int = -1) -> T:
        return self.node("Softmax", [x.name], x.shape, axis=axis)

    # -- result --------------------------------------------------------------------------
    def build(self, doc: str = ""):
        """The ModelProto (opset 17, IR version 8), checked by ``onnx.checker``."""
        import onnx
        from onnx import helper

        graph = helper.make_graph(
            self.nodes, self.graph_name, self.inputs, self.outputs, self.initializers
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="tvm_rtask.models",
            doc_string=doc,
        )
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model
