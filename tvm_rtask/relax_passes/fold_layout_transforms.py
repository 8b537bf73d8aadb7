"""``layout_transform`` of a constant (a weight) replaced by its value, computed with numpy.

The blocked CPU layout (``backend/cpu/blocked_channels.py``) asks ``ConvertLayout`` for
``OIHW{T}o`` weights, which leaves one ``layout_transform`` per convolution weight. Folded
after legalization (``FoldConstantCalls``), each is a PrimFunc that LLVM compiles and the JIT
loads before it runs once: 0.6 s of SqueezeNet 1.1's preparation went into the machine code
of its 25 layout transforms. Their index maps are affine in the indices (``//``, ``%``,
``+``, ``*`` by constants), so numpy moves the elements directly: the output index of every
input element is the map evaluated on index grids. The usual maps only split axes and permute
them (``o -> (o // 16, ..., o % 16)``), and for those a reshape and a transpose do the same
without index arrays (a scatter through one int64 index per element took 0.2 s of ResNet-18's
preparation).

A map with anything else in it, or a transform that pads without a pad value, is left to
the later folding. The reshapes and transposes that lead to a layout transform (a bias
reshaped to ``(1, C, 1, 1)``, then blocked) fold here too, as numpy views and copies: left
to ``FoldConstantCalls`` they were nine more functions for LLVM and its JIT on ResNet-18. So
does the arithmetic of constants that a batch norm in the blocked layout leaves (DenseNet-121:
186 calls, 1.5 s of LLVM and JIT).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.expr import Constant

from ..relax_exprs import (
    array_const,
    bound_value,
    constant_array,
    ints,
    op_name,
    rewrite_functions,
    static_shape_of,
)

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


def _axis_part(expr: tirx.PrimExpr, variables: list) -> tuple[int, str, int] | None:
    """``(axis, part, factor)`` of a final index that is a whole variable (``"whole"``), its
    quotient (``"outer"``) or remainder (``"inner"``) by a constant; else None."""
    part, factor = "whole", 0
    if isinstance(expr, tirx.FloorDiv | tirx.FloorMod) and isinstance(expr.b, tirx.IntImm):
        part = "outer" if isinstance(expr, tirx.FloorDiv) else "inner"
        expr, factor = expr.a, int(expr.b.value)
    axis = next((i for i, var in enumerate(variables) if var.same_as(expr)), None)
    return None if axis is None else (axis, part, factor)


def _split_and_permuted(value: np.ndarray, index_map: tirx.IndexMap) -> np.ndarray | None:
    """``value`` laid out by ``index_map`` when the map only splits axes by divisors of their
    extents and permutes the pieces (a reshape and a transpose); else None."""
    variables = list(index_map.initial_indices)
    parts = [_axis_part(e, variables) for e in index_map.final_indices]
    if any(p is None for p in parts) or len(set(parts)) != len(parts):
        return None
    shape: list[int] = []
    position: dict[tuple[int, str], int] = {}
    for axis, extent in enumerate(value.shape):
        uses = {(part, factor) for a, part, factor in parts if a == axis}
        factors = {factor for _, factor in uses}
        if uses == {("whole", 0)}:
            position[axis, "whole"] = len(shape)
            shape.append(extent)
        elif {part for part, _ in uses} == {"outer", "inner"} and len(factors) == 1:
            (factor,) = factors
            if factor <= 0 or extent % factor:
                return None
            position[axis, "outer"], position[axis, "inner"] = len(shape), len(shape) + 1
            shape += [extent // factor, factor]
        else:
            return None
    order = [position[axis, part] for axis, part, _ in parts]
    return np.ascontiguousarray(value.reshape(shape).transpose(order))


def transformed(value: np.ndarray, index_map: tirx.IndexMap, pad_value=None) -> np.ndarray | None:
    """``value`` laid out by ``index_map`` (``out[map(i)] = value[i]``), or None when the map
    is not affine or the output has elements no input fills and no ``pad_value`` says what."""
    fast = _split_and_permuted(value, index_map)
    return fast if fast is not None else _scattered(value, index_map, pad_value)


def _scattered(value: np.ndarray, index_map: tirx.IndexMap, pad_value) -> np.ndarray | None:
    """``transformed``'s general path: every element stored at its mapped flat index."""
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


# operators that only move a constant's elements (``_moved`` gives their numpy equivalent):
# the biases reach a blocked layout_transform through a reshape, and a dense layer's weight
# through permute_dims
_RESHAPES = ("relax.reshape", "relax.expand_dims", "relax.squeeze")
_MOVES = ("relax.layout_transform", "relax.permute_dims", *_RESHAPES)
# IEEE operations numpy computes exactly as the legalized kernels do (broadcasting alike): a
# batch norm in the blocked layout leaves sqrt(variance + eps) of its constants
_ARITHMETIC = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.sqrt": np.sqrt,
}


def _moved(call: relax.Call, value: np.ndarray) -> np.ndarray | None:
    name = op_name(call)
    if name == "relax.layout_transform":
        return transformed(value, call.attrs.index_map, call.attrs.pad_value)
    if name in _RESHAPES:
        shape = static_shape_of(call)
        return None if shape is None else value.reshape(shape)
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        return value.transpose(None if axes is None else ints(axes))  # made contiguous below
    return None


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        name = op_name(call)
        if name not in _MOVES and name not in _ARITHMETIC:
            return call
        # a data movement's later arguments are attributes (reshape's target shape)
        args = [bound_value(self, a) for a in call.args[: 1 if name in _MOVES else None]]
        if not args or not all(isinstance(a, Constant) for a in args):
            return call
        values = [constant_array(a) for a in args]
        if name in _ARITHMETIC:
            with np.errstate(all="ignore"):  # a NaN or inf is folded as TVM would compute it
                out = _ARITHMETIC[name](*values)
        else:
            out = _moved(call, values[0])
        dtype = getattr(call.ty, "dtype", None)
        if out is None or str(out.dtype) != str(dtype) or list(out.shape) != static_shape_of(call):
            return call
        return array_const(np.ascontiguousarray(out))


@tvm.transform.module_pass(opt_level=0, name="FoldConstantLayoutTransforms")
class FoldConstantLayoutTransforms:
    """Every ``layout_transform``, ``reshape``, ``expand_dims``, ``squeeze`` or
    ``permute_dims`` of a constant, and every ``add``, ``subtract``, ``multiply``, ``divide``
    or ``sqrt`` of constants, replaced by the constant it makes (see the module; chains fold
    in one visit); the rest of the module unchanged."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(mod, _Folder(mod))
