"""Convolutions in the blocked channel layout ``NCHW[x]c`` between them (CPU).

In NCHW, a convolution that vectorises over its output channels (``Conv2dPackedNCHW``)
broadcasts each input value from another channel plane and writes each channel vector back
one lane at a time into as many planes. In ``NCHW16c`` (for 16 float32 lanes) the 16
channels of one pixel are one vector: the input values a register tile broadcasts lie
together, and the tile's accumulators are stored as whole vectors. ONNX Runtime (MLAS) and
oneDNN run their x86 convolutions in this layout.

:class:`BlockedChannels` asks TVM's own ``ConvertLayout`` for ``NCHW{lanes}c`` data and
``OIHW{T}o`` kernels on every convolution it can schedule that way (one group, channels in
whole vectors, and depthwise ones: :func:`blocked_layouts`); ``ConvertLayout`` carries the
layout through the elementwise operators, pools, concatenations and reductions between them
and changes it back where an operator needs NCHW (an RGB stem, a grouped convolution, a
flatten). A constant weight's ``layout_transform`` folds at compile time, so the weight
arrives packed in panels of ``T`` output channels as ``conv2d_packed``'s does. TOPI cannot
legalize a convolution with channel blocks, so the pass then rewrites each into a call of
the PrimFunc ``conv2d_nchwc`` or ``depthwise_conv2d_nchwc`` (TE computes with their own
``op_pattern``, so the bias add, activation and residual add fuse into them), which
``Conv2dPackedNCHW`` and ``WindowNCHWc`` schedule.
"""

from __future__ import annotations

import re
import warnings

import tvm
from tvm import relax, te, topi

from ...relax_exprs import OUT_EWISE_FUSABLE, ints, op_name, rewrite_functions, static_shape_of
from .pack_conv_weights import conv_panel

NCHWC_NAME = "conv2d_nchwc"
DEPTHWISE_NAME = "depthwise_conv2d_nchwc"
_DATA = re.compile(r"^NCHW(\d+)c$")
_KERNEL = re.compile(r"^OIHW(\d+)o$")


def _shapes(call: relax.Call):
    x, w = call.args
    return static_shape_of(x), static_shape_of(w)


def blocked_layouts(call: relax.Call, lanes: int, registers: int) -> list[str] | None:
    """``[data, kernel, out]`` layouts for ``call`` (an NCHW ``conv2d``) in channel blocks of
    ``lanes``, or None to leave it as it is: float32, batch 1, and either

    - depthwise, its channels in whole vectors (``NCHW{lanes}c`` in and out), or
    - one group, with a panel width ``T`` that divides the output channels: the input in
      channel blocks where its channels are whole vectors (else NCHW: an RGB stem, 24
      channels), the output where its channels are (else NCHW, in panels of half vectors:
      a projection to 24 channels); at least one of the two blocked.

    A convolution with a side in NCHW then meets its NCHW neighbours without a layout
    change (MobileNet v2's 24-channel residual chain)."""
    attrs = call.attrs
    if (
        str(attrs.data_layout) != "NCHW"
        or str(attrs.kernel_layout) != "OIHW"
        or str(attrs.out_layout) not in ("NCHW", "")
        or str(attrs.out_dtype) not in ("", "None", "float32")
    ):
        return None
    x_shape, w_shape = _shapes(call)
    if x_shape is None or w_shape is None or len(x_shape) != 4 or len(w_shape) != 4:
        return None
    if str(call.args[0].ty.dtype) != "float32" or x_shape[0] != 1:
        return None
    channels, groups, out_channels = x_shape[1], int(attrs.groups), w_shape[0]
    blocked_in, blocked_out = channels % lanes == 0, out_channels % lanes == 0
    if groups != 1:  # depthwise: one input channel a group, one output channel a channel
        if blocked_in and groups == channels == out_channels and w_shape[1] == 1:
            return [f"NCHW{lanes}c", f"OIHW{lanes}o", f"NCHW{lanes}c"]
        return None
    if not blocked_out:
        if not blocked_in or out_channels % (lanes // 2):
            return None
        panel_lanes = lanes // 2
    else:
        panel_lanes = lanes
    padding = ints(attrs.padding)
    if len(padding) == 2:
        padding = padding * 2
    panel = conv_panel(
        w_shape, x_shape, attrs, padding, panel_lanes, registers, pointwise_always=True
    )
    if panel is None or panel % panel_lanes:
        return None
    data = f"NCHW{lanes}c" if blocked_in else "NCHW"
    out = f"NCHW{lanes}c" if blocked_out else "NCHW"
    return [data, f"OIHW{panel}o", out]


def _blocks(layout: str) -> int | None:
    """``b`` of ``NCHW{b}c``; None for ``NCHW``."""
    found = _DATA.match(layout)
    return int(found.group(1)) if found else None


def _conv2d_nchwc(
    x: te.Tensor, packed: te.Tensor, strides, padding, dilation, out_block
) -> te.Tensor:
    """A convolution over weights in panels of ``T`` output channels, its input and output
    each in NCHW or in channel blocks (5-D; ``out_block``: the output's block, or None)."""
    in_block = int(x.shape[4]) if len(x.shape) == 5 else None
    n, h, w = (int(x.shape[i]) for i in (0, 2, 3))
    panels, c_extent, kh, kw, width = (int(d) for d in packed.shape)
    (sh, sw), (dh, dw) = strides, dilation
    top, left, bottom, right = padding
    out_h = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    if any(padding):
        before, after = [0, 0, top, left], [0, 0, bottom, right]
        if in_block:
            before, after = before + [0], after + [0]
        x = topi.nn.pad(x, before, after, name="pad_temp")
    rc = te.reduce_axis((0, c_extent), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def read(b, c, y, xx):
        return x[b, c // in_block, y, xx, c % in_block] if in_block else x[b, c, y, xx]

    def total(b, f, y, xx):
        value = read(b, rc, y * sh + ry * dh, xx * sw + rx * dw)
        return te.sum(value * packed[f // width, rc, ry, rx, f % width], axis=[rc, ry, rx])

    if out_block is None:
        return te.compute((n, panels * width, out_h, out_w), total, name=NCHWC_NAME)
    return te.compute(
        (n, panels * width // out_block, out_h, out_w, out_block),
        lambda b, fb, y, xx, fl: total(b, fb * out_block + fl, y, xx),
        name=NCHWC_NAME,
    )


def _depthwise_conv2d_nchwc(x: te.Tensor, weight: te.Tensor, strides, padding, dilation):
    n, blocks, h, w, block = (int(d) for d in x.shape)
    _, _, kh, kw, _ = (int(d) for d in weight.shape)
    (sh, sw), (dh, dw) = strides, dilation
    top, left, bottom, right = padding
    out_h = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    if any(padding):
        x = topi.nn.pad(x, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name="pad_temp")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    return te.compute(
        (n, blocks, out_h, out_w, block),
        lambda b, cb, y, xx, c: te.sum(
            x[b, cb, y * sh + ry * dh, xx * sw + rx * dw, c] * weight[cb, 0, ry, rx, c],
            axis=[ry, rx],
        ),
        name=DEPTHWISE_NAME,
    )


@relax.expr_functor.mutator
class _Lowering(relax.PyExprMutator):
    """``conv2d`` calls with ``OIHW{T}o`` kernels and a side in ``NCHW{b}c`` as calls of
    ``conv2d_nchwc`` (depthwise: ``depthwise_conv2d_nchwc``)."""

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.nn.conv2d":
            return call
        attrs = call.attrs
        data, out = str(attrs.data_layout), str(attrs.out_layout)
        if _KERNEL.match(str(attrs.kernel_layout)) is None or (
            _blocks(data) is None and _blocks(out) is None
        ):
            return call
        if any(side != "NCHW" and _blocks(side) is None for side in (data, out)):
            return call
        padding = ints(attrs.padding)
        if len(padding) == 2:
            padding = padding * 2
        groups = int(attrs.groups)
        if groups != 1:
            x_shape = static_shape_of(call.args[0])
            if x_shape is None or len(x_shape) != 5 or groups != x_shape[1] * x_shape[4]:
                return call
            return self.builder_.call_te(
                _depthwise_conv2d_nchwc,
                call.args[0],
                call.args[1],
                ints(attrs.strides),
                padding,
                ints(attrs.dilation),
                primfunc_name_hint=DEPTHWISE_NAME,
                primfunc_attrs={"op_pattern": OUT_EWISE_FUSABLE},
            )
        return self.builder_.call_te(
            _conv2d_nchwc,
            call.args[0],
            call.args[1],
            ints(attrs.strides),
            padding,
            ints(attrs.dilation),
            _blocks(out),
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
            return {"relax.nn.conv2d": chosen or ["NCHW", "OIHW", "NCHW"]}

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
