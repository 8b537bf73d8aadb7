"""Convolutions in the blocked channel layout ``NCHW[x]c`` between them (CPU).

In NCHW, a convolution that vectorises over its output channels (``Conv2dPackedNCHW``)
broadcasts each input value from another channel plane and writes each channel vector back
one lane at a time into as many planes. In ``NCHW16c`` (for 16 float32 lanes) the 16
channels of one pixel are one vector: the input values a register tile broadcasts lie
together, and the tile's accumulators are stored as whole vectors. ONNX Runtime (MLAS) and
oneDNN run their x86 convolutions in this layout.

:class:`BlockedChannels` asks TVM's own ``ConvertLayout`` for ``NCHW{lanes}c`` data and
``OIHW{T}o`` kernels on every convolution it can schedule that way (one group, channels in
whole vectors: :func:`blocked_layouts`); ``ConvertLayout`` carries the layout through the
elementwise operators, pools, concatenations and reductions between them and changes it
back where an operator needs NCHW (the stem, a depthwise convolution, a flatten). A
constant weight's ``layout_transform`` folds at compile time, so the weight arrives packed
in panels of ``T`` output channels as ``conv2d_packed``'s does. TOPI cannot legalize a
convolution with channel blocks, so the pass then rewrites each into a call of the PrimFunc
``conv2d_nchwc`` (a TE compute with its own ``op_pattern``, so the bias add, activation and
residual add fuse into it), which ``Conv2dPackedNCHW`` schedules.
"""

from __future__ import annotations

import re
import warnings

import tvm
from tvm import relax, te, topi

from ...relax_exprs import OUT_EWISE_FUSABLE, ints, op_name, rewrite_functions, static_shape_of
from .pack_conv_weights import MIN_INPUT_CHANNELS, conv_panel

NCHWC_NAME = "conv2d_nchwc"
_DATA = re.compile(r"^NCHW(\d+)c$")
_KERNEL = re.compile(r"^OIHW(\d+)o$")


def _shapes(call: relax.Call):
    x, w = call.args
    return static_shape_of(x), static_shape_of(w)


def blocked_layouts(call: relax.Call, lanes: int, registers: int) -> list[str] | None:
    """``[data, kernel]`` layouts for ``call`` (an NCHW ``conv2d``) in channel blocks of
    ``lanes``, or None to leave it in NCHW: one group, float32, at least
    :data:`MIN_INPUT_CHANNELS` input channels, input channels in whole vectors and a panel
    width ``T`` (a multiple of ``lanes``) that divides the output channels."""
    attrs = call.attrs
    if (
        str(attrs.data_layout) != "NCHW"
        or str(attrs.kernel_layout) != "OIHW"
        or str(attrs.out_layout) not in ("NCHW", "")
        or int(attrs.groups) != 1
        or str(attrs.out_dtype) not in ("", "None", "float32")
    ):
        return None
    x_shape, w_shape = _shapes(call)
    if x_shape is None or w_shape is None or len(x_shape) != 4 or len(w_shape) != 4:
        return None
    if str(call.args[0].ty.dtype) != "float32" or x_shape[0] != 1:
        return None
    channels = x_shape[1]
    if channels < MIN_INPUT_CHANNELS or channels % lanes or w_shape[0] % lanes:
        return None
    padding = ints(attrs.padding)
    if len(padding) == 2:
        padding = padding * 2
    panel = conv_panel(w_shape, x_shape, attrs, padding, lanes, registers, pointwise_always=True)
    if panel is None or panel % lanes:
        return None
    return [f"NCHW{lanes}c", f"OIHW{panel}o"]


def _conv2d_nchwc(x: te.Tensor, packed: te.Tensor, strides, padding, dilation) -> te.Tensor:
    n, _, h, w, block = (int(d) for d in x.shape)
    panels, c_extent, kh, kw, width = (int(d) for d in packed.shape)
    (sh, sw), (dh, dw) = strides, dilation
    top, left, bottom, right = padding
    out_h = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    if any(padding):
        x = topi.nn.pad(x, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name="pad_temp")
    rc = te.reduce_axis((0, c_extent), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def element(b, fb, y, xx, fl):
        f = fb * block + fl
        return te.sum(
            x[b, rc // block, y * sh + ry * dh, xx * sw + rx * dw, rc % block]
            * packed[f // width, rc, ry, rx, f % width],
            axis=[rc, ry, rx],
        )

    return te.compute((n, panels * width // block, out_h, out_w, block), element, name=NCHWC_NAME)


@relax.expr_functor.mutator
class _Lowering(relax.PyExprMutator):
    """``conv2d`` calls in ``NCHW{b}c`` / ``OIHW{T}o`` as calls of ``conv2d_nchwc``."""

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.nn.conv2d":
            return call
        attrs = call.attrs
        data = _DATA.match(str(attrs.data_layout))
        kernel = _KERNEL.match(str(attrs.kernel_layout))
        if data is None or kernel is None or str(attrs.out_layout) != str(attrs.data_layout):
            return call
        if int(attrs.groups) != 1:
            return call
        padding = ints(attrs.padding)
        if len(padding) == 2:
            padding = padding * 2
        return self.builder_.call_te(
            _conv2d_nchwc,
            call.args[0],
            call.args[1],
            ints(attrs.strides),
            padding,
            ints(attrs.dilation),
            primfunc_name_hint=NCHWC_NAME,
            primfunc_attrs={"op_pattern": OUT_EWISE_FUSABLE},
        )


@tvm.transform.module_pass(opt_level=0, name="BlockedChannels")
class BlockedChannels:
    """Every convolution :func:`blocked_layouts` accepts in ``NCHW{lanes}c``, the layout
    carried between them by ``ConvertLayout`` (module docstring); ``lanes``: float32 lanes
    of the target's vectors, ``registers``: its vector registers."""

    def __init__(self, lanes: int, registers: int) -> None:
        self.lanes = lanes
        self.registers = registers

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        def layouts(call):
            if op_name(call) != "relax.nn.conv2d":
                return {}
            # a convolution left in NCHW says so: without a desired layout, ConvertLayout
            # tries to give it its input's blocked layout and fails (a depthwise one)
            chosen = blocked_layouts(call, self.lanes, self.registers)
            return {"relax.nn.conv2d": chosen or ["NCHW", "OIHW"]}

        try:
            converted = relax.transform.ConvertLayout({}, layouts)(mod)
        except (tvm.error.InternalError, ValueError, TypeError) as err:
            # TVM's layout inference cannot carry NCHWc through some operator of this
            # model: it stays in NCHW (the packed convolutions then serve it)
            warnings.warn(
                f"tvm_rtask: the model stays in NCHW: ConvertLayout failed: {err}",
                stacklevel=2,
            )
            return mod
        return rewrite_functions(converted, _Lowering(converted))
