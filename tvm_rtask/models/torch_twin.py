"""The zoo's models as PyTorch modules ("twins") with the same weights.

A twin is made from the ONNX ``ModelProto`` that the zoo's :class:`GraphBuilder` emits, not
from a second, hand-written PyTorch architecture: the builder's graph is the one description
of each model, so the ONNX and the PyTorch versions cannot drift apart. Float initializers
become parameters (BatchNorm's running statistics and scalar constants become buffers), with
the same float32 values; integer initializers (shapes, pads, slice bounds, split sizes) become
Python constants, so every shape is static. ``forward`` runs the graph's nodes in order, one
torch function per ONNX operator (:data:`_OPS`), with no branch on a tensor's value: a twin is
traceable by ``torch.export`` and compiles with ``torch.compile``.

Only what the builder emits is supported (ONNX opset 13 to 17, where these operators did not
change): Add, AveragePool, BatchNormalization, Clip, Concat, Conv, Div, Erf, Flatten, Gather
(scalar index), GlobalAveragePool, Identity, LayerNormalization, MatMul, MaxPool, Mul, Pad
(constant), Relu, Reshape, Sigmoid, Slice (positive steps), Softmax, Split (given sizes),
Tanh and Transpose, 2-D convolution and pooling with any (also asymmetric) pads. Any other
operator raises :class:`UnsupportedOperator`, any other attribute or value
:class:`OptionError`, both one line naming the node, when the twin is made.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from onnx import AttributeProto, ModelProto, helper, numpy_helper

from ..errors import OptionError, UnsupportedOperator

Tensor = torch.Tensor
OPSETS = range(13, 18)


# -- operators ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Op:
    """How to run one ONNX operator.

    ``fn`` takes the node's tensor inputs, then (``static``) the rest of its inputs as Python
    values, then its attributes as keywords: the attributes accepted are ``fn``'s keyword-only
    parameters. ``check`` returns why a node's attributes or constants are not supported.
    """

    fn: Callable[..., Any]
    static: bool = False  # inputs[1:] are constants, given to fn as Python values
    outputs: int | None = 1  # None: as many as the node has (Split)
    check: Callable[[dict, list], str | None] | None = None
    attributes: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        params = inspect.signature(self.fn).parameters.values()
        names = frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
        object.__setattr__(self, "attributes", names)


def _window_padding(x: Tensor, pads: tuple[int, ...], value: float = 0.0):
    """``(x, padding)`` for a 2-D window op: ONNX pads (top, left, bottom, right) as torch's
    symmetric ``padding`` when both sides agree, else applied with ``F.pad`` first (torch's
    window ops have no asymmetric padding; TensorFlow's SAME pads are asymmetric)."""
    top, left, bottom, right = pads
    if (top, left) == (bottom, right):
        return x, (top, left)
    return F.pad(x, (left, right, top, bottom), value=value), (0, 0)


def _conv(
    x: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    *,
    kernel_shape: tuple[int, int],
    strides: tuple[int, ...] = (1, 1),
    pads: tuple[int, ...] = (0, 0, 0, 0),
    group: int = 1,
    dilations: tuple[int, ...] = (1, 1),
) -> Tensor:
    x, padding = _window_padding(x, pads)
    return F.conv2d(x, w, b, strides, padding, dilations, group)


def _max_pool(
    x: Tensor,
    *,
    kernel_shape: tuple[int, int],
    strides: tuple[int, ...] = (1, 1),
    pads: tuple[int, ...] = (0, 0, 0, 0),
    ceil_mode: int = 0,
) -> Tensor:
    x, padding = _window_padding(x, pads, value=-math.inf)
    return F.max_pool2d(x, kernel_shape, strides, padding, ceil_mode=bool(ceil_mode))


def _average_pool(
    x: Tensor,
    *,
    kernel_shape: tuple[int, int],
    strides: tuple[int, ...] = (1, 1),
    pads: tuple[int, ...] = (0, 0, 0, 0),
    count_include_pad: int = 0,
) -> Tensor:
    top, left, bottom, right = pads
    include = bool(count_include_pad)
    if (top, left) == (bottom, right):
        return F.avg_pool2d(x, kernel_shape, strides, (top, left), count_include_pad=include)
    padded, _ = _window_padding(x, pads)
    y = F.avg_pool2d(padded, kernel_shape, strides)
    if include:
        return y
    # Pads applied by hand count as input: divide by each window's share of real input.
    ones, _ = _window_padding(torch.ones_like(x[:1, :1]), pads)
    return y / F.avg_pool2d(ones, kernel_shape, strides)


def _batch_norm(
    x: Tensor,
    scale: Tensor,
    bias: Tensor,
    mean: Tensor,
    var: Tensor,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,  # training only
) -> Tensor:
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=epsilon)


def _layer_norm(
    x: Tensor, scale: Tensor, bias: Tensor | None = None, *, axis: int = -1, epsilon: float = 1e-5
) -> Tensor:
    return F.layer_norm(x, x.shape[axis:], scale, bias, epsilon)


def _clip(x: Tensor, lo: float | None = None, hi: float | None = None) -> Tensor:
    return x if lo is None and hi is None else torch.clamp(x, lo, hi)


def _gather(x: Tensor, index: int, *, axis: int = 0) -> Tensor:
    return x.select(axis, index)


def _expand(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    # ONNX's Expand broadcasts both ways: the result has the larger of each dimension
    return torch.broadcast_to(x, torch.broadcast_shapes(x.shape, tuple(shape)))


def _reshape(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    # ONNX's 0 copies the input's dimension (allowzero = 0).
    return x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(shape)])


def _flatten(x: Tensor, *, axis: int = 1) -> Tensor:
    return x.reshape(math.prod(x.shape[:axis]), -1)


def _transpose(x: Tensor, *, perm: tuple[int, ...] | None = None) -> Tensor:
    return x.permute(perm if perm is not None else tuple(reversed(range(x.dim()))))


def _concat(*xs: Tensor, axis: int) -> Tensor:
    return torch.cat(xs, axis)


def _split(x: Tensor, sizes: tuple[int, ...], *, axis: int = 0) -> list[Tensor]:
    return list(torch.split(x, list(sizes), dim=axis))


def _pad(x: Tensor, pads: tuple[int, ...], value: float | None = None) -> Tensor:
    # ONNX: all begins, then all ends, first axis first; torch: (begin, end) last axis first.
    rank = x.dim()
    torch_pads = [p for d in reversed(range(rank)) for p in (pads[d], pads[d + rank])]
    return F.pad(x, torch_pads, value=0.0 if value is None else value)


def _slice(
    x: Tensor,
    starts: tuple[int, ...],
    ends: tuple[int, ...],
    axes: tuple[int, ...] | None = None,
    steps: tuple[int, ...] | None = None,
) -> Tensor:
    index = [slice(None)] * x.dim()
    axes = axes if axes is not None else tuple(range(len(starts)))
    steps = steps if steps is not None else (1,) * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        index[axis] = slice(start, end, step)
    return x[tuple(index)]


def _global_average_pool(x: Tensor) -> Tensor:
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


def _softmax(x: Tensor, *, axis: int = -1) -> Tensor:
    return torch.softmax(x, axis)


def _check_window(attrs: dict, static: list) -> str | None:
    if len(attrs.get("kernel_shape", ())) != 2:
        return "only 2-D windows with a kernel_shape attribute are supported"
    return None


def _check_gather(attrs: dict, static: list) -> str | None:
    return None if isinstance(static[0], int) else "only a scalar constant index is supported"


def _check_split(attrs: dict, static: list) -> str | None:
    return None if static and static[0] is not None else "the split sizes must be given"


def _check_slice(attrs: dict, static: list) -> str | None:
    steps = static[3] if len(static) > 3 else None
    return None if steps is None or min(steps) > 0 else "only positive steps are supported"


_OPS: dict[str, _Op] = {
    "Add": _Op(lambda a, b: a + b),
    "AveragePool": _Op(_average_pool, check=_check_window),
    "BatchNormalization": _Op(_batch_norm),
    "Clip": _Op(_clip, static=True),
    "Concat": _Op(_concat),
    "Conv": _Op(_conv, check=_check_window),
    "Div": _Op(lambda a, b: a / b),
    "Erf": _Op(lambda x: torch.erf(x)),
    "Expand": _Op(_expand, static=True),
    "Flatten": _Op(_flatten),
    "Gather": _Op(_gather, static=True, check=_check_gather),
    "GlobalAveragePool": _Op(_global_average_pool),
    "Identity": _Op(lambda x: x),
    "LayerNormalization": _Op(_layer_norm),
    "MatMul": _Op(lambda a, b: torch.matmul(a, b)),
    "MaxPool": _Op(_max_pool, check=_check_window),
    "Mul": _Op(lambda a, b: a * b),
    "Pad": _Op(_pad, static=True),
    "Relu": _Op(lambda x: torch.relu(x)),
    "Reshape": _Op(_reshape, static=True),
    "Sigmoid": _Op(lambda x: torch.sigmoid(x)),
    "Slice": _Op(_slice, static=True, check=_check_slice),
    "Softmax": _Op(_softmax),
    "Split": _Op(_split, static=True, outputs=None, check=_check_split),
    "Tanh": _Op(lambda x: torch.tanh(x)),
    "Transpose": _Op(_transpose),
}


# -- the module -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Step:
    """One node, ready to run: its function, tensor input names, constants and attributes."""

    fn: Callable[..., Any]
    inputs: tuple[str, ...]  # "" for an omitted optional input
    static: tuple[Any, ...]
    attrs: dict[str, Any]
    outputs: tuple[str, ...]


def _python_value(array: np.ndarray) -> Any:
    """An integer or float constant as a Python scalar or tuple (a static value)."""
    return array.item() if array.ndim == 0 else tuple(array.reshape(-1).tolist())


def _attribute_value(attr: AttributeProto) -> Any:
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    return tuple(value) if isinstance(value, list) else value


def _safe_name(name: str, container: torch.nn.Module) -> str:
    """An attribute name of ``container`` for an ONNX tensor name: an identifier, not yet
    taken (``torch.nn.Module`` has attributes of its own: ``training``, ``forward``)."""
    base = re.sub(r"\W", "_", name)
    base = base if base and not base[0].isdigit() else f"t_{base}"
    candidate, n = base, 1
    while hasattr(container, candidate):
        n += 1
        candidate = f"{base}_{n}"
    return candidate


class TorchTwin(torch.nn.Module):
    """A ``torch.nn.Module`` that computes an ONNX model of the zoo with its weights.

    ``forward(*inputs)`` takes the graph's inputs in order and returns its output (a tuple if
    there are several). Nodes are checked when the twin is made, not when it runs.
    """

    def __init__(self, model: ModelProto) -> None:
        super().__init__()
        graph = model.graph
        _check_opset(model)
        arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.input_names = tuple(i.name for i in graph.input if i.name not in arrays)
        self.output_names = tuple(o.name for o in graph.output)
        self.output_shapes = tuple(
            tuple(d.dim_value for d in o.type.tensor_type.shape.dim) for o in graph.output
        )
        buffers = _buffer_names(graph)
        self.steps = [_step(node, arrays) for node in graph.node]
        used = {n for step in self.steps for n in step.inputs} | set(self.output_names)
        self.params = torch.nn.Module()  # the weights, under readable names
        self._tensors: dict[str, str] = {}  # ONNX name -> attribute of self.params
        for name, array in arrays.items():
            if name not in used:
                continue  # a constant read only as a Python value
            if array.dtype != np.float32:
                raise OptionError(
                    f"initializer {name!r} is {array.dtype} and used as a tensor; the PyTorch "
                    "twin supports float32 tensors (integers only as shapes and indices)"
                )
            attr = _safe_name(name, self.params)
            value = torch.from_numpy(array.copy())
            if name in buffers or array.ndim == 0:
                self.params.register_buffer(attr, value)
            else:
                self.params.register_parameter(attr, torch.nn.Parameter(value))
            self._tensors[name] = attr

    def forward(self, *inputs: Tensor) -> Tensor | tuple[Tensor, ...]:
        if len(inputs) != len(self.input_names):
            raise TypeError(
                f"the model takes {len(self.input_names)} input(s) "
                f"({', '.join(self.input_names)}), not {len(inputs)}"
            )
        values: dict[str, Tensor] = dict(zip(self.input_names, inputs, strict=True))
        for name, attr in self._tensors.items():
            values[name] = getattr(self.params, attr)
        for step in self.steps:
            args = [values[n] if n else None for n in step.inputs]
            out = step.fn(*args, *step.static, **step.attrs)
            outs = out if isinstance(out, list) else [out]
            values.update(zip(step.outputs, outs, strict=True))
        results = tuple(values[n] for n in self.output_names)
        return results[0] if len(results) == 1 else results


def _check_opset(model: ModelProto) -> None:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version not in OPSETS:
            raise OptionError(
                f"the PyTorch twin reads ONNX opsets {OPSETS.start} to {OPSETS.stop - 1}, "
                f"not {opset.version}"
            )


def _buffer_names(graph) -> set[str]:
    """BatchNorm's running mean and variance: statistics (buffers), not weights."""
    return {n.input[i] for n in graph.node if n.op_type == "BatchNormalization" for i in (3, 4)}


def _step(node, arrays: dict[str, np.ndarray]) -> _Step:
    """The node as a :class:`_Step`, or a one-line error saying what is not supported."""
    where = f"node {node.name!r} ({node.op_type})"
    op = _OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if op is None:
        domain = f" of domain {node.domain!r}" if node.domain not in ("", "ai.onnx") else ""
        raise UnsupportedOperator(
            f"{where}: the PyTorch twin has no {node.op_type}{domain} operator; it supports "
            f"{', '.join(_OPS)}"
        )
    attrs = {a.name: _attribute_value(a) for a in node.attribute}
    unknown = sorted(set(attrs) - op.attributes)
    if unknown:
        raise OptionError(
            f"{where}: the PyTorch twin does not support the attribute(s) {', '.join(unknown)}"
        )
    inputs, static = (node.input[:1], node.input[1:]) if op.static else (node.input, [])
    for name in static:
        if name and name not in arrays:
            raise OptionError(f"{where}: input {name!r} must be a constant (an initializer)")
    values = [_python_value(arrays[n]) if n else None for n in static]
    why = op.check(attrs, values) if op.check else None
    if why:
        raise OptionError(f"{where}: {why}")
    if op.outputs is not None and len(node.output) != op.outputs:
        raise OptionError(f"{where}: only {op.outputs} output(s) supported, not {len(node.output)}")
    return _Step(op.fn, tuple(inputs), tuple(values), attrs, tuple(node.output))


def twin(model: ModelProto) -> TorchTwin:
    """The eval-mode PyTorch twin of an ONNX model of the zoo (any ``GraphBuilder`` model)."""
    return TorchTwin(model).eval()


def example_inputs(model: ModelProto, inputs: dict[str, np.ndarray]) -> tuple[Tensor, ...]:
    """Named numpy inputs (:func:`tvm_rtask.models.sample_inputs`) as the twin's arguments."""
    names = [i.name for i in model.graph.input if i.name in inputs]
    return tuple(torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in names)
