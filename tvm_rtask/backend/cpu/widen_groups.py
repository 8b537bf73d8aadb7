"""Grouped convolutions whose groups are narrower than a vector, widened to groups of one
vector with zero weights between them (CPU, the blocked channel layout).

In ``NCHW16c`` a vector holds 16 channels of a pixel. A convolution of 8-channel groups
(RegNet-Y's) has lanes 0-7 of an output vector read input channels 0-7 and lanes 8-15 read
8-15: no broadcast serves both halves, so it cannot run in channel blocks and keeps its
model in NCHW, with a layout change around every such convolution. Written as a convolution
of 16-channel groups whose weight is block-diagonal (``W'[f, j] = W[f, j - offset]`` inside
the output channel's own group, zero outside), it computes the same sums with the zeros
added in, at ``16 / 8 = 2`` times the multiplications, and takes the blocked schedule of
groups of whole vectors. :data:`MAX_WIDENING` bounds that factor.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ...relax_exprs import array_const, bound_value, constant_array, op_name, static_shape_of

# Widened at most this many times (16-lane vectors: groups of 4 or 8 channels). ResNeXt-50's
# first stage (groups of 4) widened four times, the whole model then in channel blocks: -3.9%
# at 1 thread, -3.3% at 2, against the model in NCHW (docs/cpu-kernels.md, "Grouped
# convolutions").
MAX_WIDENING = 4


def widened_weight(weight: np.ndarray, groups: int, lanes: int) -> np.ndarray:
    """``weight`` (``[F, C / groups, kh, kw]``, groups of equal width in and out) as the
    weight of ``C / lanes`` groups of ``lanes`` channels: each output channel's taps at its
    own group's input channels, zeros at the other groups' of its vector."""
    out_channels, width, kh, kw = weight.shape
    wide = np.zeros((out_channels, lanes, kh, kw), dtype=weight.dtype)
    f = np.arange(out_channels)
    first = (f // width) * width % lanes  # the group's first input channel within its vector
    for j in range(width):
        wide[f, first + j] = weight[f, j]
    return wide


def widening(call: relax.Call, lanes: int) -> int | None:
    """How many times :func:`widened_weight` multiplies the work of ``call`` (an NCHW
    ``conv2d`` of float32 at batch 1, groups of equal width that divides ``lanes``,
    neither depthwise nor already whole vectors); None when it does not apply."""
    attrs = call.attrs
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW":
        return None
    x_shape, w_shape = (static_shape_of(arg) for arg in call.args)
    if x_shape is None or w_shape is None or len(x_shape) != 4 or x_shape[0] != 1:
        return None
    groups, (out_channels, width) = int(attrs.groups), w_shape[:2]
    if groups == 1 or width == 1 or out_channels != x_shape[1] or width * groups != x_shape[1]:
        return None
    if width >= lanes or lanes % width or x_shape[1] % lanes:
        return None
    return lanes // width


@relax.expr_functor.mutator
class WidenNarrowGroups(relax.PyExprMutator):
    """Every grouped ``conv2d`` with a constant weight whose :func:`widening` is at most
    ``max_widening`` as a convolution of groups of ``lanes`` channels (module docstring)."""

    def __init__(self, mod: tvm.IRModule, lanes: int, max_widening: int = MAX_WIDENING) -> None:
        super().__init__(mod)
        self.lanes = lanes
        self.max_widening = max_widening

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.nn.conv2d":
            return call
        factor = widening(call, self.lanes)
        weight = bound_value(self, call.args[1])
        if factor is None or factor > self.max_widening:
            return call
        if not isinstance(weight, tvm.ir.expr.Constant):
            return call
        attrs = call.attrs
        wide = widened_weight(constant_array(weight), int(attrs.groups), self.lanes)
        return relax.op.nn.conv2d(
            call.args[0],
            array_const(wide),
            strides=attrs.strides,
            padding=attrs.padding,
            dilation=attrs.dilation,
            groups=int(static_shape_of(call.args[0])[1]) // self.lanes,
            data_layout="NCHW",
            kernel_layout="OIHW",
            out_dtype=attrs.out_dtype,
        )
