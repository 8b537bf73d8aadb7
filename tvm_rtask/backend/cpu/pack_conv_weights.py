"""Constant convolution weights packed into output-channel panels at compile time (CPU).

``Conv2dNCHW`` vectorises a convolution along the output columns: a row of 17 columns
(Inception v3's 17x17 layers) fills two 16-lane vectors with 17 useful lanes, a row of 35
three with 35, and a strided row gathers its input lane by lane. Those layers ran at about
half the FLOP rate of the others (docs/cpu-kernels.md, "Conv2dPackedNCHW").

:class:`PackConvWeights` rewrites ``conv2d(x, W)`` (NCHW data, OIHW constant float32 weight,
one group, a spatial kernel) whose output channels are a multiple of ``T`` into a call of the
PrimFunc ``conv2d_packed(x, Wp)`` with ``Wp[f // T, c, i, j, f % T] = W[f, c, i, j]``, computed
once here (numpy). A panel of ``T`` output channels at one ``(c, i, j)`` is then ``T``
contiguous floats: the rule ``Conv2dPackedNCHW`` vectorises along them (every lane useful
whatever the row width or stride) and broadcasts one input value to each. ``T`` is four,
two or one vectors of the target, the most that divides the channels within a quarter of
the vector registers (four on AVX-512, two on AVX2). The products are summed in the same
order as the unpacked convolution's, so outputs agree to rounding of the accumulation order
of the rule that schedules them.

Convolutions whose output rows take whole K-blocked register tiles (``Conv2dPackedNCHW``
blocks them over their input channels) get the panels of :func:`blocked_panel` instead:
two vectors, or three where their tile makes clearly more FMAs a load.

1x1 convolutions stay with ``Conv2dNCHW``, which runs them as GEMMs over the pixel axis, except
on maps of at most 14x14 with many channels (``blocks_pointwise``: blocked), and on small
maps where its tiles of pixel vectors compute much more than the map
(:func:`packs_pointwise`: 49 pixels in 64), which take panels in an even count
(:func:`pointwise_panel`) and run with their pixels flattened; on a map of one pixel
(squeeze and excitation) they take panels in any count, over output channels padded with
zero weights to whole vectors where no panel divides them (:func:`single_pixel_panel`; the
call is then opaque and a slice drops the padding). Convolutions of fewer than
:data:`MIN_INPUT_CHANNELS` input channels (stems) stay unpacked too. The pass runs in
RTaskPrepare as the llvm backend's own pass (``CPUBackend.prepare_passes``), before
legalization; the call carries ``op_pattern`` 4, so the bias add and activation still fuse
into it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, topi

from ...relax_exprs import (
    bound_value,
    call_te_padded,
    constant_array,
    four_sided_padding,
    ints,
    nchw_conv,
    op_name,
    rewrite_functions,
    static_shape_of,
)
from .pack_matmul_weights import panel_width
from .rules.base import panel_vectors
from .rules.conv2d_packed import blocked_columns, blocks_pointwise

PACKED_NAME = "conv2d_packed"
# Fewer input channels than this (a stem on an RGB image) and Conv2dNCHW, vectorised along
# the output columns (strided ones de-interleaved), ran faster than the packed panels, alone
# on 2 threads: 3 -> 64 7x7/2 at 224x224 1002 -> 809 us, 3 -> 32 3x3/2 128 -> 103 us, 3 -> 64
# 3x3/2 unpadded 241 -> 229 us; from 8 input channels up the two were within 7% either way,
# and at 16 the panels won (16 -> 64 3x3 at 55x55: 199 against 245 us).
MIN_INPUT_CHANNELS = 8


PANEL_VECTORS = (4, 2, 3, 1)
# K-blocked panels (docs/cpu-kernels.md, K-blocking): three vectors x 7 columns ran
# up to 12% faster than two x 7 (144 -> 288 3x3 at 14x14: 397 -> 350 us), three x 4 on rows
# of 8 2-4% slower than two x 8 (FMAs per load 1.71 against 1.6: within BLOCKED_MARGIN).
BLOCKED_PANEL_VECTORS = (3, 2)
BLOCKED_MARGIN = 1.1
# Conv2dNCHW runs a 1x1 convolution as a GEMM over the pixel axis, in tiles of up to
# GEMM_TILE_VECTORS vectors with the last one shifted back: where those compute
# POINTWISE_OVERCOMPUTE times the pixels or more (49 pixels: 64), the channel panels waste
# less, on maps of at most POINTWISE_MAX_PIXELS (at 14x14 the panels ran faster alone but
# slower in DenseNet-121 and MobileNet v2; docs/cpu-kernels.md, "Conv2dPackedNCHW").
GEMM_TILE_VECTORS = 4
POINTWISE_OVERCOMPUTE = 1.1
POINTWISE_MAX_PIXELS = 100


def packs_pointwise(pixels: int, lanes: int) -> bool:
    """A 1x1 convolution of ``pixels`` output pixels goes to the channel panels: a small map
    on which the GEMM's pixel tiles would compute :data:`POINTWISE_OVERCOMPUTE` times its
    pixels or more."""
    tile = GEMM_TILE_VECTORS * lanes
    return (
        pixels <= POINTWISE_MAX_PIXELS
        and -(-pixels // tile) * tile >= POINTWISE_OVERCOMPUTE * pixels
    )


def channel_panel(channels: int, lanes: int, registers: int) -> int | None:
    """Output channels per panel: 4, 2, 3 or 1 vectors of ``lanes``, the first that divides
    ``channels`` (at most :func:`~.rules.base.panel_vectors`, so that a register tile keeps room for
    pixels); None when none does. Three vectors only before one (144 channels: 376 -> 320 us
    at 28x28): where two divide, three were as often slower (288 channels at 14x14, 460 ->
    498 us) as faster (96 at 35x35, 651 -> 626 us)."""
    return panel_width(channels, lanes, max_vectors=panel_vectors(registers), choices=PANEL_VECTORS)


def blocked_panel(channels: int, out_width: int, lanes: int, registers: int) -> int | None:
    """Output channels per panel of a convolution that ``Conv2dPackedNCHW`` blocks over its
    input channels: of :data:`BLOCKED_PANEL_VECTORS` vectors that divide the channels, the
    width whose register tile (:func:`~.rules.conv2d_packed.blocked_columns`, whole tiles a
    row) makes the most FMAs per load, the wider panel only where it makes
    :data:`BLOCKED_MARGIN` times those of the narrower; None when no tile covers the rows
    (rows of 17)."""
    best, best_score = None, 0.0
    for vectors in BLOCKED_PANEL_VECTORS:
        if vectors * 8 > registers or channels % (vectors * lanes):
            continue
        cols = blocked_columns(out_width, vectors, registers)
        if cols is None:
            continue
        fmas_a_load = vectors * cols / (vectors + cols)
        if fmas_a_load > best_score:
            best, best_score = vectors * lanes, fmas_a_load / BLOCKED_MARGIN
    return best


def pointwise_panel(channels: int, lanes: int, registers: int) -> int | None:
    """Output channels per panel of a 1x1 convolution: as :func:`channel_panel`, but only
    widths that give an even count of panels (the panels are its parallel loop, and
    nothing else is: 192 channels in three panels of 64 kept one of two vEUs idle a third
    of the time)."""
    most = panel_vectors(registers)
    for vectors in PANEL_VECTORS:
        width = panel_width(channels, lanes, max_vectors=most, choices=(vectors,))
        if width is not None and (channels // width) % 2 == 0:
            return width
    return None


def single_pixel_panel(channels: int, lanes: int, registers: int) -> tuple[int, int]:
    """``(T, padded channels)`` of a 1x1 convolution on a one-pixel map (the squeeze and
    excitation of MobileNet v3, EfficientNet, RegNet-Y: a matrix-vector product over the
    channels): :func:`channel_panel` in any count (the panels are the only parallel loop
    either way), else panels of one vector over the channels padded with zero weights to a
    multiple of ``lanes``. Unpacked, ``Conv2dNCHW`` ran them in scalar code: MobileNet v3's
    ``576 -> 144`` 94-108 us, ``288 -> 72`` 38 us in the model at 1 thread."""
    width = channel_panel(channels, lanes, registers)
    if width is not None:
        return width, channels
    return lanes, -(-channels // lanes) * lanes


def single_pixel(weight_shape, x_shape, attrs, padding) -> bool:
    """Whether a convolution is 1x1 without padding on a map of one output pixel."""
    _, _, kh, kw = weight_shape
    if kh * kw != 1 or any(padding):
        return False
    rows, cols = x_shape[2:4]
    stride_y, stride_x = ints(attrs.strides)
    return (rows - 1) // stride_y == 0 and (cols - 1) // stride_x == 0


def pack_weight(weight: np.ndarray, width: int) -> np.ndarray:
    """``W[f, c, i, j]`` as ``Wp[f // width, c, i, j, f % width]`` (contiguous), zero
    output channels appended up to a multiple of ``width``."""
    f, c, kh, kw = weight.shape
    if f % width:
        weight = np.pad(weight, ((0, width - f % width), (0, 0), (0, 0), (0, 0)))
        f = weight.shape[0]
    return np.ascontiguousarray(
        weight.reshape(f // width, width, c, kh, kw).transpose(0, 2, 3, 4, 1)
    )


def conv_output_size(x: te.Tensor, kernel, strides, padding, dilation) -> tuple[int, int]:
    """Output rows and columns of a convolution of ``x`` (NCHW or NCHWc) with a ``kernel``
    of ``(kh, kw)`` and four-sided ``padding``."""
    h, w = int(x.shape[2]), int(x.shape[3])
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilation
    top, left, bottom, right = padding
    return (
        (h + top + bottom - (kh - 1) * dh - 1) // sh + 1,
        (w + left + right - (kw - 1) * dw - 1) // sw + 1,
    )


def pad_spatial(x: te.Tensor, padding) -> te.Tensor:
    """``x`` (NCHW or NCHWc) padded on its rows and columns (``pad_temp``), or itself."""
    if not any(padding):
        return x
    top, left, bottom, right = padding
    rest = [0] * (len(x.shape) - 4)
    return topi.nn.pad(x, [0, 0, top, left, *rest], [0, 0, bottom, right, *rest], name="pad_temp")


def conv2d_over_panels(
    x: te.Tensor,
    packed: te.Tensor,
    strides,
    padding,
    dilation,
    out_block: int | None = None,
    name: str = PACKED_NAME,
    groups: int = 1,
) -> te.Tensor:
    """A convolution over weights in panels of ``T`` output channels (``packed[f // T, c,
    i, j, f % T]``), its input NCHW or in channel blocks (5-D), its output NCHW or, with
    ``out_block``, in blocks of that many channels. With ``groups``, output channel ``f``
    reads the ``C / groups`` input channels of its group; ``T`` (and ``out_block``) divide a
    group's output channels, so a panel (a channel block) lies in one group."""
    in_block = int(x.shape[4]) if len(x.shape) == 5 else None
    n = int(x.shape[0])
    panels, c_extent, kh, kw, width = (int(d) for d in packed.shape)
    group_out = panels * width // groups
    (sh, sw), (dh, dw) = strides, dilation
    out_h, out_w = conv_output_size(x, (kh, kw), strides, padding, dilation)
    x = pad_spatial(x, padding)
    rc = te.reduce_axis((0, c_extent), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def read(b, c, y, xx):
        return x[b, c // in_block, y, xx, c % in_block] if in_block else x[b, c, y, xx]

    def total(b, f, y, xx, first=0):
        value = read(b, first + rc, y * sh + ry * dh, xx * sw + rx * dw)
        return te.sum(value * packed[f // width, rc, ry, rx, f % width], axis=[rc, ry, rx])

    def first_of(f):  # the first input channel of output channel f's group
        return (f // group_out) * c_extent if groups > 1 else 0

    if out_block is None:
        return te.compute(
            (n, panels * width, out_h, out_w),
            lambda b, f, y, xx: total(b, f, y, xx, first_of(f)),
            name=name,
        )
    # the group's first input channel from the channel block alone: the same for every lane
    blocks_a_group = group_out // out_block
    return te.compute(
        (n, panels * width // out_block, out_h, out_w, out_block),
        lambda b, fb, y, xx, fl: total(
            b, fb * out_block + fl, y, xx, (fb // blocks_a_group) * c_extent if groups > 1 else 0
        ),
        name=name,
    )


def _out_width(in_width: int, kernel: int, attrs, padding: list[int]) -> int:
    """Output columns of a convolution with NCHW ``attrs`` and four-sided ``padding``."""
    stride, dilation = ints(attrs.strides)[-1], ints(attrs.dilation)[-1]
    return (in_width + padding[1] + padding[3] - dilation * (kernel - 1) - 1) // stride + 1


def conv_panel(
    weight_shape,
    x_shape,
    attrs,
    padding: list[int],
    lanes: int,
    registers: int,
    pointwise_always: bool = False,
) -> int | None:
    """The panel width of a convolution (NCHW ``attrs``, four-sided ``padding``) to pack, or
    None to leave it unpacked: :func:`blocked_panel` where its rows take K-blocked tiles,
    else :func:`channel_panel`; a 1x1 convolution only where it is blocked
    (:func:`~.rules.conv2d_packed.blocks_pointwise`) or its map is small
    (:func:`packs_pointwise`), unless ``pointwise_always`` (the blocked channel layout, where
    no GEMM over NCHW planes is left to run it)."""
    channels, in_channels, kh, kw = weight_shape
    out_width = _out_width(x_shape[3], kw, attrs, padding)
    blocked = blocked_panel(channels, out_width, lanes, registers)
    if kh * kw != 1:
        return blocked or channel_panel(channels, lanes, registers)
    if any(padding):
        return None
    stride = ints(attrs.strides)[0]
    pixels = ((x_shape[2] - 1) // stride + 1) * out_width
    if blocked and blocks_pointwise(pixels, in_channels, channels, pointwise_always):
        return blocked
    panel = pointwise_panel(channels, lanes, registers) if packs_pointwise(pixels, lanes) else None
    if panel is None and pointwise_always:  # pixel tiles in parallel too: any count of panels
        return channel_panel(channels, lanes, registers)
    return panel


def constant_weight(mutator: relax.PyExprMutator, expr) -> np.ndarray | None:
    """The float32 OIHW constant ``expr`` is (or is bound to in the function ``mutator``
    visits), or None."""
    expr = bound_value(mutator, expr)
    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    value = constant_array(expr)
    return value if value.ndim == 4 and value.dtype == np.float32 else None


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, lanes: int, registers: int) -> None:
        super().__init__(mod)
        self.lanes = lanes
        self.registers = registers

    def _constant_weight(self, expr) -> np.ndarray | None:
        return constant_weight(self, expr)

    def _panel(self, weight_shape, x_shape, attrs, padding) -> int | None:
        """The panel width of a convolution to pack, or None to leave it unpacked."""
        return conv_panel(weight_shape, x_shape, attrs, padding, self.lanes, self.registers)

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.nn.conv2d":
            return call
        attrs = call.attrs
        if (
            not nchw_conv(attrs)
            or int(attrs.groups) != 1
            or str(attrs.out_dtype) not in ("", "None", "float32")
        ):
            return call
        x, w = call.args
        x_shape = static_shape_of(x)
        if x_shape is None or len(x_shape) != 4 or str(x.ty.dtype) != "float32":
            return call
        weight = self._constant_weight(w)
        if weight is None or weight.shape[1] != x_shape[1]:
            return call
        padding = four_sided_padding(attrs)
        if weight.shape[1] < MIN_INPUT_CHANNELS:  # an image's stem: Conv2dNCHW is faster
            return call
        channels = padded = weight.shape[0]
        if single_pixel(weight.shape, x_shape, attrs, padding):
            width, padded = single_pixel_panel(channels, self.lanes, self.registers)
        else:
            width = self._panel(weight.shape, x_shape, attrs, padding)
        if width is None:
            return call
        return call_te_padded(
            self.builder_,
            conv2d_over_panels,
            x,
            relax.const(pack_weight(weight, width)),
            ints(attrs.strides),
            padding,
            ints(attrs.dilation),
            name=PACKED_NAME,
            axis=1,
            size=channels,
            padded=padded,
        )


@tvm.transform.module_pass(opt_level=0, name="PackConvWeights")
class PackConvWeights:
    """Pack every eligible constant convolution weight into output-channel panels (see the
    module docstring); ``lanes``: float32 lanes of the target's vectors, ``registers``: its
    vector registers."""

    def __init__(self, lanes: int, registers: int) -> None:
        self.lanes = lanes
        self.registers = registers

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(mod, _Rewriter(mod, self.lanes, self.registers))
