"""Zero padding of the spatial axes folded into the convolution that reads it.

Exporters write "same" padding of a strided convolution (TensorFlow's rule, EfficientNet and
MobileNet ports) as an explicit ``nn.pad`` of the bottom and right border followed by a
convolution without padding. ``FuseOps`` then fuses that ``pad`` into the *previous*
operator's epilogue, where it is the worst place for it: the border reads nothing the
previous convolution makes, so a schedule that computes the epilogue per tile of the
convolution never writes it (``docs/findings.md``, "Unwritten memory": such schedules are
now refused, and the operator falls back to a slower one).

:class:`FoldPadIntoConv` rewrites ``conv2d(pad(x), w)`` into ``conv2d(x, w)`` with the pad
added to the convolution's own four-sided padding, when the pad is a constant zero pad of the
two spatial axes only (of the convolution's data layout) with non-negative widths. The
convolution then reads ``x`` through its own padded view (the same values: a zero pad is a
zero pad), and the ``pad`` binding disappears with dead-code elimination when nothing else
reads it. Anything else is left alone.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_exprs import bound_value, four_sided_padding, ints, op_name, rewrite_functions


def _spatial_axes(data_layout: str) -> tuple[int, int] | None:
    """Positions of H and W in a 4-D data layout (``NCHW``, ``NHWC``), None for others."""
    if len(data_layout) != 4 or "H" not in data_layout or "W" not in data_layout:
        return None
    return data_layout.index("H"), data_layout.index("W")


def _zero_spatial_pad(pad_call: relax.Call, axes: tuple[int, int]) -> list[int] | None:
    """``[top, left, bottom, right]`` of a constant zero pad of ``axes`` only, else None."""
    attrs = pad_call.attrs
    if str(attrs.pad_mode) != "constant" or float(attrs.pad_value) != 0.0:
        return None
    width = ints(attrs.pad_width)
    if len(width) != 8 or any(w < 0 for w in width):
        return None
    h, w = axes
    if any(width[2 * d] or width[2 * d + 1] for d in range(4) if d not in axes):
        return None
    return [width[2 * h], width[2 * w], width[2 * h + 1], width[2 * w + 1]]


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.nn.conv2d":
            return call
        padded = bound_value(self, call.args[0])
        if op_name(padded) != "relax.nn.pad":
            return call
        attrs = call.attrs
        axes = _spatial_axes(str(attrs.data_layout))
        extra = None if axes is None else _zero_spatial_pad(padded, axes)
        if extra is None:
            return call
        padding = [a + b for a, b in zip(four_sided_padding(attrs), extra, strict=True)]
        return relax.op.nn.conv2d(
            padded.args[0],
            call.args[1],
            strides=ints(attrs.strides),
            padding=padding,
            dilation=ints(attrs.dilation),
            groups=int(attrs.groups),
            data_layout=str(attrs.data_layout),
            kernel_layout=str(attrs.kernel_layout),
            out_layout=str(attrs.out_layout),
            out_dtype=None if attrs.out_dtype is None else str(attrs.out_dtype),
        )


@tvm.transform.module_pass(opt_level=0, name="FoldPadIntoConv")
class FoldPadIntoConv:
    """``conv2d(pad(x))`` with a zero spatial pad as ``conv2d(x)`` with more padding; see the
    module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _Rewriter(mod)))
