"""Small questions about Relax expressions that passes in several packages ask (the
``relax_passes`` rewrites and a backend's own Relax passes): no tvm_rtask imports, so any
layer may use it."""

from __future__ import annotations

import tvm
from tvm import relax


def op_name(expr) -> str | None:
    """``"relax.matmul"`` for a call of that operator; None for anything else."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def static_shape_of(expr) -> list[int] | None:
    """The shape of ``expr``'s tensor type when every dimension is a constant, else None."""
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return None
    if not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    return [int(d.value) for d in shape.values]


def bound_value(mutator: relax.PyExprMutator, expr):
    """The value ``expr`` is bound to in the function ``mutator`` visits, when it is a
    variable with a binding; else ``expr`` itself."""
    if isinstance(expr, relax.Var):
        value = mutator.lookup_binding(expr)
        if value is not None:
            return value
    return expr
