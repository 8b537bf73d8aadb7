"""``MergeConvs``: IOS's *operator merge* as a Relax rewrite (Ding et al., MLSys 2021,
section 4.2: "merge operators of the same type that share an input").

Convolutions that read the same tensor with the same stride, dilation and layout become one
convolution: each kernel is zero-padded (centred) to the largest kernel size of the group,
the kernels are stacked along the output channels, and the result is split back into the
original outputs. Zero padding of a centred kernel with the padding grown by the same amount
keeps every output element unchanged, so only convolutions whose grown paddings agree are
merged (e.g. 1x1/pad 0, 3x3/pad 1 and 5x5/pad 2 all become 5x5/pad 2).

Run it on the high-level Relax module (before legalization, i.e. before ``RTaskPrepare``).
Constant weights are padded and stacked at compile time; weights that are variables are
padded and concatenated with Relax operators (which ``FoldConstant`` may fold later).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from ..relax_exprs import array_const, constant_array, four_sided_padding
from .dataflow import handle, main_dataflow, static_shape

CONV2D = tvm.ir.Op.get("relax.nn.conv2d")


@dataclass
class _Conv:
    index: int
    var: relax.Var
    data: relax.Expr
    weight: relax.Expr
    kernel: tuple[int, int]
    out_channels: int
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    key: tuple
    call: relax.Call


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _as_conv(index: int, binding: relax.Binding) -> _Conv | None:
    if not isinstance(binding, relax.VarBinding):
        return None
    call = binding.value
    if not isinstance(call, relax.Call) or not call.op.same_as(CONV2D):
        return None
    a = call.attrs
    if int(a.groups) != 1 or str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW":
        return None
    if a.out_layout is not None and str(a.out_layout) not in ("", "NCHW"):
        return None
    data, weight = call.args
    wshape = static_shape(weight.ty)
    if wshape is None or len(wshape) != 4 or static_shape(data.ty) is None:
        return None
    padding = tuple(four_sided_padding(a))
    key = (
        handle(data),
        _ints(a.strides),
        _ints(a.dilation),
        str(a.out_dtype),
        str(weight.ty.dtype),
        wshape[1],
    )
    return _Conv(
        index,
        binding.var,
        data,
        weight,
        (wshape[2], wshape[3]),
        wshape[0],
        padding,
        _ints(a.dilation),
        key,
        call,
    )


def _grown(conv: _Conv, size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """The padding ``conv`` needs once its kernel is padded to ``size``, or None."""
    dh, dw = size[0] - conv.kernel[0], size[1] - conv.kernel[1]
    if dh % 2 or dw % 2:
        return None
    gh, gw = dh // 2 * conv.dilation[0], dw // 2 * conv.dilation[1]
    t, left, b, r = conv.padding
    return (t + gh, left + gw, b + gh, r + gw)


def _merge_groups(convs: list[_Conv], min_group: int) -> list[list[_Conv]]:
    """Convolutions with the same key and the same grown padding, in program order."""
    by_key: dict[tuple, list[_Conv]] = {}
    for c in convs:
        by_key.setdefault(c.key, []).append(c)
    groups = []
    for members in by_key.values():
        if len(members) < min_group:
            continue
        size = (max(c.kernel[0] for c in members), max(c.kernel[1] for c in members))
        by_padding: dict[tuple, list[_Conv]] = {}
        for c in members:
            grown = _grown(c, size)
            if grown is not None:
                by_padding.setdefault(grown, []).append(c)
        groups += [g for g in by_padding.values() if len(g) >= min_group]
    return groups


def _padded_weights(
    bb: relax.BlockBuilder, group: list[_Conv], size: tuple[int, int], serial: int
) -> tuple[relax.Expr, list[relax.Binding]]:
    """The group's kernels zero-padded to ``size`` and stacked along output channels, and the
    bindings that compute them (none for constant kernels: numpy does it now)."""
    if all(isinstance(c.weight, Constant) for c in group):
        arrays = []
        for c in group:
            w = constant_array(c.weight)
            ph, pw = (size[0] - c.kernel[0]) // 2, (size[1] - c.kernel[1]) // 2
            arrays.append(np.pad(w, ((0, 0), (0, 0), (ph, ph), (pw, pw))))
        return array_const(
            np.concatenate(arrays, axis=0).astype(str(group[0].weight.ty.dtype), copy=False)
        ), []
    bindings: list[relax.Binding] = []

    def bind(expr: relax.Expr, name: str) -> relax.Var:
        expr = bb.normalize(expr)
        var = relax.DataflowVar(name, expr.ty)
        bindings.append(relax.VarBinding(var, expr))
        return var

    parts = []
    for k, c in enumerate(group):
        ph, pw = (size[0] - c.kernel[0]) // 2, (size[1] - c.kernel[1]) // 2
        w = c.weight
        if ph or pw:
            w = bind(relax.op.nn.pad(w, [0, 0, 0, 0, ph, ph, pw, pw]), f"merged_w{serial}_{k}")
        parts.append(w)
    return bind(relax.op.concat(parts, axis=0), f"merged_w{serial}"), bindings


def _defined_before(bindings: list[relax.Binding], params: list[relax.Var]) -> list[set[int]]:
    """For each binding index, the handles of the Vars defined before it."""
    seen = {handle(p) for p in params}
    out = []
    for b in bindings:
        out.append(set(seen))
        seen.add(handle(b.var))
    return out


def merge_candidates(func: relax.Function) -> dict[int, tuple[int, float]]:
    """Convolutions of ``func``'s main dataflow block that could merge: binding index ->
    (group number, factor by which its FLOPs grow when padded to the group's kernel)."""
    found = main_dataflow(func)
    if found is None:
        return {}
    bindings = list(found[1].bindings)
    convs = [c for i, b in enumerate(bindings) if (c := _as_conv(i, b)) is not None]
    out = {}
    for g, group in enumerate(_merge_groups(convs, 2)):
        size = (max(c.kernel[0] for c in group), max(c.kernel[1] for c in group))
        for c in group:
            out[c.index] = (g, size[0] * size[1] / (c.kernel[0] * c.kernel[1]))
    return out


def _selected(groups: list[list[_Conv]], select: list[set[int]]) -> list[list[_Conv]]:
    """The parts of ``groups`` named by ``select`` (sets of binding indices)."""
    out = []
    for group in groups:
        for chosen in select:
            part = [c for c in group if c.index in chosen]
            if len(part) >= 2:
                out.append(part)
    return out


def merge_convs_in_function(
    func: relax.Function, min_group: int = 2, select: list[set[int]] | None = None
) -> tuple[relax.Function, int]:
    """``func`` with its mergeable convolutions merged; also how many groups were merged.

    ``select`` (sets of binding indices of the main dataflow block, as
    :func:`merge_candidates` numbers them) merges exactly those sets instead of every group.
    """
    main = main_dataflow(func)
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return func, 0
    bb = relax.BlockBuilder()
    blocks = []
    merged = 0
    for block in body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        bindings = list(block.bindings)
        convs = [c for i, b in enumerate(bindings) if (c := _as_conv(i, b)) is not None]
        defined = _defined_before(bindings, list(func.params))
        plans: dict[int, list[_Conv]] = {}
        groups = _merge_groups(convs, min_group)
        if select is not None:
            groups = _selected(groups, select) if block.same_as(main[1]) else []
        for group in groups:
            first = group[0].index
            ready = [
                c
                for c in group
                if isinstance(c.weight, Constant) or handle(c.weight) in defined[first]
            ]
            if len(ready) >= min_group:
                plans[first] = ready
        if not plans:
            blocks.append(block)
            continue
        rebound: dict[int, relax.Expr] = {}
        out: list[relax.Binding] = []
        for i, b in enumerate(bindings):
            group = plans.get(i)
            if group is not None:
                out += _emit_group(bb, group, rebound, len(out), merged)
                merged += 1
            value = rebound.get(handle(b.var))
            out.append(relax.VarBinding(b.var, value) if value is not None else b)
        blocks.append(relax.DataflowBlock(out))
    if not merged:
        return func, 0
    new = relax.Function(func.params, relax.SeqExpr(blocks, body.body), func.ret_ty,
                         func.is_pure, func.attrs)  # fmt: skip
    return new, merged


def _emit_group(
    bb: relax.BlockBuilder,
    group: list[_Conv],
    rebound: dict[int, relax.Expr],
    position: int,
    serial: int,
) -> list[relax.Binding]:
    size = (max(c.kernel[0] for c in group), max(c.kernel[1] for c in group))
    first = group[0]
    call = first.call  # strides and dtype are part of the group key: take the first's
    weight, bindings = _padded_weights(bb, group, size, serial)
    conv = relax.op.nn.conv2d(
        first.data,
        weight,
        strides=_ints(call.attrs.strides),
        padding=_grown(first, size),
        dilation=first.dilation,
        groups=1,
        data_layout="NCHW",
        kernel_layout="OIHW",
        out_dtype=None if str(call.attrs.out_dtype) in ("", "void") else call.attrs.out_dtype,
    )
    conv = bb.normalize(conv)
    conv_var = relax.DataflowVar(f"merged_conv{serial}", conv.ty)
    out = [*bindings, relax.VarBinding(conv_var, conv)]
    # One strided_slice per member rather than one split: a split legalizes into a kernel
    # with several outputs, which cannot be an rKernel; slices are injective and fuse into
    # their consumers.
    start = 0
    for c in group:
        part = relax.op.strided_slice(
            conv_var, axes=[1], begin=[start], end=[start + c.out_channels]
        )
        start += c.out_channels
        part_var = relax.DataflowVar(f"{c.var.name}_merged", bb.normalize(part).ty)
        out.append(relax.VarBinding(part_var, bb.normalize(part)))
        rebound[handle(c.var)] = part_var
    return out


@tvm.transform.module_pass(opt_level=0, name="MergeConvs")
class MergeConvs:
    """Merge convolutions that share an input (IOS operator merge) in every Relax function.

    ``min_group``: merge only groups of at least this many convolutions; ``select``: merge
    only these sets of binding indices of ``main`` (see :func:`merge_candidates`). After the
    pass, ``last_merged`` holds how many groups it merged.
    """

    def __init__(self, min_group: int = 2, select: list[set[int]] | None = None) -> None:
        self.min_group = max(2, int(min_group))
        self.select = select
        self.last_merged = 0

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.last_merged = 0
        out = None
        for gvar, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function):
                continue
            if self.select is not None and gvar.name_hint != "main":
                continue
            new, n = merge_convs_in_function(func, self.min_group, self.select)
            if n:
                out = out or mod.clone()  # never edit the caller's module in place
                out[gvar] = new
                self.last_merged += n
        return mod if out is None else relax.transform.Normalize()(out)
