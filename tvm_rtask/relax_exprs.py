"""Small questions about Relax expressions that passes in several packages ask (the
``relax_passes`` rewrites and a backend's own Relax passes), and the loop every such rewrite
runs: no tvm_rtask imports, so any layer may use it."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

# TVM's OpPatternKind.kOutEWiseFusable: a call that elementwise consumers fuse into (a
# rewrite's call_te of a matmul or convolution keeps its bias and activation fused)
OUT_EWISE_FUSABLE = 4
# TVM's OpPatternKind.kOpaque: a call FuseOps fuses with nothing
OPAQUE = 8


def op_name(expr) -> str | None:
    """``"relax.matmul"`` for a call of that operator; None for anything else."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def array_const(value) -> relax.Constant:
    """A Relax constant holding the numpy array ``value`` as it is: ``relax.const`` copies an
    array through ``astype`` whenever it is given a dtype (0.13 s of ResNet-18's weights),
    and without one narrows 64-bit arrays to 32 bits."""
    return relax.const(tvm.runtime.tensor(value))


def constant_array(const: relax.Constant) -> np.ndarray:
    """A Relax constant's values as a read-only numpy view of its tensor (DLPack, no copy:
    ``Tensor.numpy()`` copies, about 0.5 s for ViT-B/16's 330 MB of weights at each read)."""
    view = np.from_dlpack(const.value)
    view.flags.writeable = False
    return view


def static_shape_of(expr) -> list[int] | None:
    """The shape of ``expr``'s tensor type when every dimension is a constant, else None."""
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return None
    if not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    return [int(d.value) for d in shape.values]


def ints(values) -> list[int]:
    """An attribute's integers (strides, padding, dilation) as a Python list."""
    return [int(v) for v in values]


def four_sided_padding(attrs) -> list[int]:
    """A convolution's padding as ``[top, left, bottom, right]`` (Relax also allows two
    values, one per axis)."""
    padding = ints(attrs.padding)
    return padding * 2 if len(padding) == 2 else padding


def nchw_conv(attrs) -> bool:
    """A ``relax.nn.conv2d`` on NCHW data with an OIHW kernel, its output NCHW too."""
    return (
        str(attrs.data_layout) == "NCHW"
        and str(attrs.kernel_layout) == "OIHW"
        and str(attrs.out_layout) in ("NCHW", "")
    )


def bound_value(mutator: relax.PyExprMutator, expr):
    """The value ``expr`` is bound to in the function ``mutator`` visits, when it is a
    variable with a binding; else ``expr`` itself."""
    if isinstance(expr, relax.Var):
        value = mutator.lookup_binding(expr)
        if value is not None:
            return value
    return expr


def call_te_padded(
    builder: relax.BlockBuilder, func, *args, name: str, axis: int, size: int, padded: int
) -> relax.Expr:
    """``builder.call_te(func, *args)`` of a product computed ``padded`` wide along ``axis``
    (zero weights appended to whole panels), cut back to ``size``: fusable into its epilogue
    where nothing was padded, else opaque (the slice must not fuse into the product, which its
    rule schedules alone) and followed by the slice."""
    product = builder.call_te(
        func,
        *args,
        primfunc_name_hint=name,
        primfunc_attrs={"op_pattern": OUT_EWISE_FUSABLE if padded == size else OPAQUE},
    )
    if padded == size:
        return product
    wide = builder.emit(product)
    return relax.op.strided_slice(wide, axes=[axis], begin=[0], end=[size])


def rewrite_functions(mod: tvm.IRModule, rewriter: relax.PyExprMutator) -> tvm.IRModule:
    """``mod`` with every Relax function visited by ``rewriter`` (a mutator made for
    ``mod``), and what its builder added (``call_te`` PrimFuncs)."""
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return rewriter.builder_.finalize()
