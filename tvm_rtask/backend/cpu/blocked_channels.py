"""Convolutions in the blocked channel layout ``NCHW[x]c`` between them (CPU).

In NCHW, a convolution that vectorises over its output channels (``Conv2dPackedNCHW``)
broadcasts each input value from another channel plane and writes each channel vector back
one lane at a time into as many planes. In ``NCHW16c`` (for 16 float32 lanes) the 16
channels of one pixel are one vector: the input values a register tile broadcasts lie
together, and the tile's accumulators are stored as whole vectors. ONNX Runtime (MLAS) and
oneDNN run their x86 convolutions in this layout.

:class:`BlockedChannels` asks TVM's own ``ConvertLayout`` for ``NCHW{lanes}c`` data and
``OIHW{T}o`` kernels on every convolution it can schedule that way (channels in whole
vectors, groups of whole vectors, and depthwise ones: :func:`blocked_layouts`);
``ConvertLayout`` carries the layout through the elementwise operators, pools,
concatenations and reductions between them and changes it back where an operator needs NCHW
(an RGB stem, groups narrower than a vector, a flatten). Groups of 4 or 8 channels are
widened to 16 with zero weights first (``widen_groups.py``). A constant weight's
``layout_transform`` folds at compile time, so the weight arrives packed in panels of ``T``
output channels as ``conv2d_packed``'s does. TOPI cannot legalize a convolution with channel
blocks, so the pass then rewrites each into a call of the PrimFunc ``conv2d_nchwc`` or
``depthwise_conv2d_nchwc`` (TE computes with their own ``op_pattern``, so the bias add,
activation and residual add fuse into them), which
``Conv2dPackedNCHW`` and ``WindowNCHWc`` schedule.
"""

from __future__ import annotations

import re

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, te

from ...fallbacks import LAYOUT_KEPT, note_fallback
from ...relax_exprs import (
    OUT_EWISE_FUSABLE,
    array_const,
    bound_value,
    constant_array,
    four_sided_padding,
    ints,
    op_name,
    rewrite_functions,
    static_shape_of,
)
from ...tir.rules import one_line
from .pack_conv_weights import (
    constant_weight,
    conv2d_over_panels,
    conv_output_size,
    conv_panel,
    pad_spatial,
)
from .widen_groups import MAX_WIDENING, WidenNarrowGroups
from .winograd import WINOGRAD_NAME, conv2d_winograd_nchwc, winograd_tile, winograd_weights

NCHWC_NAME = "conv2d_nchwc"
# A convolution whose output channels are not whole vectors writes NCHW in panels of half
# vectors only up to this many weights: SqueezeNet's 512 -> 1000 classifier at 13x13 ran
# 1075 us so against 704 as Conv2dNCHW's GEMM (an NCHW input, one layout change before it)
HALF_PANEL_MAX_WEIGHTS = 64 * 1024
# A model is blocked when it has at least MIN_BLOCKED_CONVS convolutions to block, and
# ConvertLayout leaves at most MAX_LAYOUT_CHANGES layout changes of computed tensors of more
# than SMALL_TENSOR elements (the model's input and output; a squeeze-and-excitation's
# channel vector costs nothing) or one per CONVS_PER_LAYOUT_CHANGE blocked convolutions:
# more and the model stays in NCHW (ResNeXt-50 kept 32 changes around its grouped
# convolutions, MobileNet v3 32 around its hard-swish, ConvNeXt-T 42, against at most 1 for
# ResNet-50, DenseNet-121, EfficientNet-B0, Inception v3, MobileNet v2 and GoogLeNet)
MIN_BLOCKED_CONVS = 4
SMALL_TENSOR = 4096
MAX_LAYOUT_CHANGES = 2
CONVS_PER_LAYOUT_CHANGE = 16
DEPTHWISE_NAME = "depthwise_conv2d_nchwc"
_DATA = re.compile(r"^NCHW(\d+)c$")
_KERNEL = re.compile(r"^OIHW(\d+)o$")


def blocked_layouts(call: relax.Call, lanes: int, registers: int) -> list[str] | None:
    """``[data, kernel, out]`` layouts for ``call`` (an NCHW ``conv2d``) in channel blocks of
    ``lanes``, or None to leave it as it is: float32, batch 1, and either

    - depthwise, its channels in whole vectors (``NCHW{lanes}c`` in and out), or
    - grouped, each group's channels whole vectors in and out (:func:`_grouped_layouts`), or
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
    x_shape, w_shape = (static_shape_of(arg) for arg in call.args)
    if x_shape is None or w_shape is None or len(x_shape) != 4 or len(w_shape) != 4:
        return None
    if str(call.args[0].ty.dtype) != "float32" or x_shape[0] != 1:
        return None
    channels, groups, out_channels = x_shape[1], int(attrs.groups), w_shape[0]
    blocked_in, blocked_out = channels % lanes == 0, out_channels % lanes == 0
    if groups != 1:  # depthwise: one input channel a group, one output channel a channel
        if blocked_in and groups == channels == out_channels and w_shape[1] == 1:
            return [f"NCHW{lanes}c", f"OIHW{lanes}o", f"NCHW{lanes}c"]
        return _grouped_layouts(call, lanes, registers)
    if not blocked_out:
        if not blocked_in or out_channels % (lanes // 2):
            return None
        if int(np.prod(w_shape)) > HALF_PANEL_MAX_WEIGHTS:
            return None
        panel_lanes = lanes // 2
    else:
        panel_lanes = lanes
    padding = four_sided_padding(attrs)
    panel = conv_panel(
        w_shape, x_shape, attrs, padding, panel_lanes, registers, pointwise_always=True
    )
    if panel is None or panel % panel_lanes:
        return None
    data = f"NCHW{lanes}c" if blocked_in else "NCHW"
    out = f"NCHW{lanes}c" if blocked_out else "NCHW"
    return [data, f"OIHW{panel}o", out]


def _grouped_layouts(call: relax.Call, lanes: int, registers: int) -> list[str] | None:
    """Layouts of a grouped (not depthwise) convolution whose groups are whole channel
    blocks in and out (RegNet-X's 16-channel groups, ResNeXt-50's last stage's 32): a panel
    of the group's output channels reads the group's input blocks only, so it runs as one
    group's convolution. Groups narrower than a vector are left in NCHW (a vector's lanes
    would read different input channels)."""
    x_shape, w_shape = (static_shape_of(arg) for arg in call.args)
    groups, out_channels = int(call.attrs.groups), w_shape[0]
    group_in, group_out = w_shape[1], out_channels // groups
    if group_in % lanes or group_out % lanes or x_shape[1] != group_in * groups:
        return None
    padding = four_sided_padding(call.attrs)
    group_shape = (group_out, group_in, *w_shape[2:])
    panel = conv_panel(
        group_shape, x_shape, call.attrs, padding, lanes, registers, pointwise_always=True
    )
    if panel is None or panel % lanes or group_out % panel:
        return None
    return [f"NCHW{lanes}c", f"OIHW{panel}o", f"NCHW{lanes}c"]


def _blocks(layout: str) -> int | None:
    """``b`` of ``NCHW{b}c``; None for ``NCHW``."""
    found = _DATA.match(layout)
    return int(found.group(1)) if found else None


def _depthwise_conv2d_nchwc(x: te.Tensor, weight: te.Tensor, strides, padding, dilation):
    n, blocks, _, _, block = (int(d) for d in x.shape)
    _, _, kh, kw, _ = (int(d) for d in weight.shape)
    (sh, sw), (dh, dw) = strides, dilation
    out_h, out_w = conv_output_size(x, (kh, kw), strides, padding, dilation)
    x = pad_spatial(x, padding)
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
    ``conv2d_nchwc`` (depthwise: ``depthwise_conv2d_nchwc``; with ``winograd``, 3x3
    stride-1 ones with a constant weight on maps of enough tiles: ``conv2d_winograd_nchwc``,
    ``winograd.py``)."""

    def __init__(self, mod: tvm.IRModule, winograd: bool = True) -> None:
        super().__init__(mod)
        self.winograd = winograd

    def _oihw_constant(self, expr) -> np.ndarray | None:
        """The float32 OIHW constant an ``OIHW{T}o`` kernel is ``ConvertLayout``'s
        ``layout_transform`` of, or None."""
        value = bound_value(self, expr)
        if op_name(value) == "relax.layout_transform":
            value = value.args[0]
        return constant_weight(self, value)

    def _winograd(self, call, padding) -> relax.Expr | None:
        """The call of ``conv2d_winograd_nchwc`` for a 3x3 stride-1 convolution in channel
        blocks of one width in and out, or None."""
        attrs = call.attrs
        block, x_shape = _blocks(str(attrs.data_layout)), static_shape_of(call.args[0])
        if (
            block is None
            or _blocks(str(attrs.out_layout)) != block
            or x_shape is None
            or len(x_shape) != 5
            or ints(attrs.strides) != [1, 1]
            or ints(attrs.dilation) != [1, 1]
        ):
            return None
        weight = self._oihw_constant(call.args[1])
        if weight is None or weight.shape[2:] != (3, 3) or weight.shape[0] % block:
            return None
        top, left, bottom, right = padding
        m = winograd_tile(x_shape[2] + top + bottom - 2, x_shape[3] + left + right - 2)
        if m is None:
            return None
        return self.builder_.call_te(
            conv2d_winograd_nchwc,
            call.args[0],
            array_const(winograd_weights(weight, m, block)),
            padding,
            m,
            primfunc_name_hint=WINOGRAD_NAME,
            primfunc_attrs={"op_pattern": OUT_EWISE_FUSABLE},
        )

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
        padding = four_sided_padding(attrs)
        groups = int(attrs.groups)
        x_shape = static_shape_of(call.args[0])
        if groups != 1 and (x_shape is None or len(x_shape) != 5):
            return call
        if groups != 1 and groups == x_shape[1] * x_shape[4]:
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
        if groups == 1 and self.winograd:
            winograd = self._winograd(call, padding)
            if winograd is not None:
                return winograd
        return self.builder_.call_te(
            conv2d_over_panels,
            call.args[0],
            call.args[1],
            ints(attrs.strides),
            padding,
            ints(attrs.dilation),
            _blocks(out),
            NCHWC_NAME,
            groups,
            primfunc_name_hint=NCHWC_NAME,
            primfunc_attrs={"op_pattern": OUT_EWISE_FUSABLE},
        )


def _scalar_bound(func) -> str | None:
    """``"maximum"`` / ``"minimum"`` when ``func`` is an elementwise max / min of a tensor and
    a 0-d tensor (how TVM's ONNX importer writes Clip: ``call_tir`` of ``topi.maximum``);
    else None."""
    if not isinstance(func, tvm.tirx.PrimFunc) or len(func.params) != 3:
        return None
    blocks = []
    tvm_ffi.structural_map(func.body, (s_tir.SBlock, lambda b: blocks.append(b) or b))
    real = [b for b in blocks if b.name_hint != "root"]
    if len(real) != 1 or not isinstance(real[0].body, tvm.tirx.BufferStore):
        return None
    value = real[0].body.value
    kinds = {tvm.tirx.Max: "maximum", tvm.tirx.Min: "minimum"}
    kind = next((k for t, k in kinds.items() if isinstance(value, t)), None)
    if kind is None or len(real[0].reads) != 2 or len(real[0].reads[1].region) != 0:
        return None
    return kind


def _count(mod: tvm.IRModule, matches) -> int:
    """How many expressions of ``mod``'s Relax functions ``matches`` accepts."""
    found = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(
                func.body, lambda e: found.append(e) if matches(e) else None
            )
    return len(found)


@relax.expr_functor.mutator
class _ScalarBoundsAsOps(relax.PyExprMutator):
    """``call_tir`` of a max / min with a 0-d tensor as Relax's ``maximum`` / ``minimum``,
    which ``ConvertLayout`` carries through (a ``call_tir`` keeps its NCHW: MobileNet v2's
    ReLU6 took the layout back and forth around every convolution)."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod_ = mod

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.call_tir" or not isinstance(call.args[0], relax.GlobalVar):
            return call
        kind = _scalar_bound(self.mod_[call.args[0]])
        args = call.args[1]
        if kind is None or not isinstance(args, relax.Tuple) or len(args.fields) != 2:
            return call
        return getattr(relax.op, kind)(args.fields[0], args.fields[1])


_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum")


@relax.expr_functor.mutator
class _OperandsOfFullRank(relax.PyExprMutator):
    """An operand of an elementwise binary operator with fewer axes than the other (a batch
    norm's ``[C, 1, 1]`` scale) with the missing leading axes added, which does not change
    the broadcast (a constant reshaped here, any other operand by a ``reshape`` that folds
    later): ``ConvertLayout`` carries a layout only through operands of the same rank
    (DenseNet-121's pre-activations went back to NCHW around every convolution)."""

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        name = op_name(call)
        if name is None or name.rpartition(".")[2] not in _BINARY or len(call.args) != 2:
            return call
        args = list(call.args)
        shapes = [static_shape_of(a) for a in args]
        if any(shape is None for shape in shapes):
            return call
        for i, arg in enumerate(args):
            shape, other = shapes[i], len(shapes[1 - i])
            if not 0 < len(shape) < other:
                continue
            full = (1,) * (other - len(shape)) + tuple(shape)
            if isinstance(arg, tvm.ir.expr.Constant):
                args[i] = array_const(constant_array(arg).reshape(full))
            else:
                args[i] = relax.op.reshape(arg, full)
        if all(a.same_as(b) for a, b in zip(args, call.args, strict=True)):
            return call
        return getattr(relax.op, name.rpartition(".")[2])(*args)


def _data_layout_changes(mod: tvm.IRModule) -> int:
    """``layout_transform`` calls of tensors computed from a function's parameters (the
    model's data; those of weights and other constants fold at compile time), of more than
    :data:`SMALL_TENSOR` elements (a squeeze-and-excitation's channel vector costs
    nothing)."""
    changes = 0
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        data = {p for p in func.params}
        bindings = [b for block in func.body.blocks for b in block.bindings]
        for binding in bindings:
            if any(v in data for v in relax.analysis.free_vars(binding.value)):
                data.add(binding.var)
                shape = static_shape_of(binding.var) or []
                if (
                    op_name(binding.value) == "relax.layout_transform"
                    and int(np.prod(shape)) > SMALL_TENSOR
                ):
                    changes += 1
    return changes


@tvm.transform.module_pass(opt_level=0, name="BlockedChannels")
class BlockedChannels:
    """Every convolution :func:`blocked_layouts` accepts in ``NCHW{lanes}c``, the layout
    carried between them by ``ConvertLayout`` (module docstring); ``lanes``: float32 lanes
    of the target's vectors, ``registers``: its vector registers. The model stays in NCHW
    where it has fewer than ``min_blocked_convs`` convolutions to block, or the conversion
    leaves more than ``max_layout_changes`` changes of layout (or one per
    :data:`CONVS_PER_LAYOUT_CHANGE` blocked convolutions). Grouped convolutions of groups
    narrower than a vector are widened first, up to ``max_widening`` times the work
    (``widen_groups.py``; 1: never). With ``kept_because`` the pass blocks nothing: where
    the model has convolutions to block, it notes that it stays in NCHW and why (a
    ``layout kept`` fallback in the plan's report), as ``cpu_layout="auto"`` does on AVX2."""

    def __init__(
        self,
        lanes: int,
        registers: int,
        max_layout_changes: int = MAX_LAYOUT_CHANGES,
        min_blocked_convs: int = MIN_BLOCKED_CONVS,
        max_widening: int = MAX_WIDENING,
        kept_because: str | None = None,
        winograd: bool = True,
    ) -> None:
        self.winograd = winograd
        self.kept_because = kept_because
        self.max_widening = max_widening
        self.lanes = lanes
        self.registers = registers
        self.max_layout_changes = max_layout_changes
        self.min_blocked_convs = min_blocked_convs

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        def layouts(call):
            if op_name(call) != "relax.nn.conv2d":
                return {}
            # a convolution left in NCHW says so: without a desired layout, ConvertLayout
            # tries to give it its input's blocked layout and fails (a depthwise one)
            chosen = blocked_layouts(call, self.lanes, self.registers)
            return {"relax.nn.conv2d": chosen or ["NCHW", "OIHW", "NCHW"]}

        def blockable(expr) -> bool:
            return op_name(expr) == "relax.nn.conv2d" and (
                blocked_layouts(expr, self.lanes, self.registers) is not None
            )

        original = mod
        if self.kept_because is not None:
            candidates = _count(mod, blockable)
            if candidates >= self.min_blocked_convs:
                note_fallback(
                    LAYOUT_KEPT,
                    f"the model's {candidates} blockable convolutions",
                    f"{self._kept()}: {self.kept_because}",
                )
            return original
        if self.max_widening > 1:  # narrow groups as groups of whole vectors
            mod = rewrite_functions(mod, WidenNarrowGroups(mod, self.lanes, self.max_widening))
        candidates = _count(mod, blockable)
        if candidates < self.min_blocked_convs:
            return original  # nothing to gain (ViT's patch embedding)
        mod = relax.transform.DeadCodeElimination()(rewrite_functions(mod, _ScalarBoundsAsOps(mod)))
        mod = rewrite_functions(mod, _OperandsOfFullRank(mod))
        subject, kept = f"the model's {candidates} blockable convolutions", self._kept()
        try:
            converted = relax.transform.ConvertLayout({}, layouts)(mod)
        except (tvm.error.InternalError, ValueError, TypeError, MemoryError) as err:
            # TVM's layout inference cannot carry NCHWc through some operator of this
            # model: it stays in NCHW (the packed convolutions then serve it)
            note_fallback(
                LAYOUT_KEPT,
                subject,
                f"{kept}: TVM's ConvertLayout failed: {one_line(err)}",
            )
            return original
        changes = _data_layout_changes(converted)
        blocked = _count(
            converted,
            lambda e: op_name(e) == "relax.nn.conv2d" and str(e.attrs.out_layout) != "NCHW",
        )
        allowed = max(self.max_layout_changes, blocked // CONVS_PER_LAYOUT_CHANGE)
        if changes > allowed:
            # operators TVM keeps in NCHW between the blocked convolutions (grouped
            # convolutions, squeeze-and-excitation on channel counts not whole vectors):
            # each costs a pass over its tensor both ways, more than the blocks gain
            note_fallback(
                LAYOUT_KEPT,
                subject,
                f"{kept}: converted, it changes layout {changes} times between operators "
                f"(at most {allowed} pay off)",
            )
            return original
        return rewrite_functions(converted, _Lowering(converted, self.winograd))

    def _kept(self) -> str:
        """What a fallback of this pass leaves: the reason's first words."""
        return f"the model stays in NCHW, not NCHW{self.lanes}c"
