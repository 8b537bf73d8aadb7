"""``layout_transform`` of a constant (a weight) replaced by its value, computed with numpy.

The blocked CPU layout (``backend/cpu/blocked_channels.py``) asks ``ConvertLayout`` for
``OIHW{T}o`` weights, which leaves one ``layout_transform`` per convolution weight. Folded
after legalization (``FoldConstantCalls``), each is a PrimFunc that LLVM compiles and the JIT
loads before it runs once: 0.6 s of SqueezeNet 1.1's preparation went into the machine code
of its 25 layout transforms. Their index maps are affine in the indices (``//``, ``%``,
``+``, ``*`` by constants), so numpy moves the elements directly: the output index of every
input element is the map evaluated on index grids.

A map with anything else in it, or a transform that pads without a pad value, is left to
the later folding.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.expr import Constant

from ..relax_exprs import op_name, rewrite_functions

_BINARY = {
    tirx.Add: np.add,
    tirx.Sub: np.subtract,
    tirx.Mul: np.multiply,
    tirx.FloorDiv: np.floor_divide,
    tirx.FloorMod: np.mod,
}


def _evaluate(expr: tirx.PrimExpr, env: dict) -> np.ndarray | None:
    """``expr`` over the integer arrays of ``env`` (its variables), or None when it is not
    affine integer arithmetic."""
    if isinstance(expr, tirx.Var):
        return next((value for var, value in env.items() if var.same_as(expr)), None)
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    for kind, fn in _BINARY.items():
        if isinstance(expr, kind):
            a, b = _evaluate(expr.a, env), _evaluate(expr.b, env)
            return None if a is None or b is None else fn(a, b)
    return None


def transformed(value: np.ndarray, index_map: tirx.IndexMap, pad_value=None) -> np.ndarray | None:
    """``value`` laid out by ``index_map`` (``out[map(i)] = value[i]``), or None when the map
    is not affine or the output has elements no input fills and no ``pad_value`` says what."""
    shape = [int(d) for d in index_map.map_shape(list(value.shape))]
    grids = np.indices(value.shape, dtype=np.int64, sparse=True)
    env = dict(zip(index_map.initial_indices, grids, strict=True))
    indices = [_evaluate(e, env) for e in index_map.final_indices]
    if any(i is None for i in indices):
        return None
    if int(np.prod(shape)) != value.size and pad_value is None:
        return None
    fill = 0 if pad_value is None else pad_value.value
    out = np.full(shape, fill, dtype=value.dtype)
    # one flat destination index per element (the maps' grids broadcast to the input shape)
    flat = np.broadcast_to(np.ravel_multi_index(indices, shape), value.shape)
    out.reshape(-1)[flat.reshape(-1)] = value.reshape(-1)
    return out


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.layout_transform":
            return call
        (data,) = call.args
        attrs = call.attrs
        if not isinstance(data, Constant):
            return call
        out = transformed(data.value.numpy(), attrs.index_map, attrs.pad_value)
        return call if out is None else relax.const(out, data.value.dtype)


@tvm.transform.module_pass(opt_level=0, name="FoldConstantLayoutTransforms")
class FoldConstantLayoutTransforms:
    """Every ``layout_transform`` of a constant replaced by the constant it makes (see the
    module); the rest of the module unchanged."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(mod, _Folder(mod))
