"""Reading and rebuilding the dataflow block of a Relax function.

Every pass of tvm-rtask works on the one dataflow block of ``main`` that holds the model's
``call_tir`` bindings. These helpers find that block, tell which bindings are ``call_tir``
calls, and put a rewritten block back.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@dataclass
class TirCall:
    """A ``call_tir`` binding taken apart: callee, tensor arguments, output type."""

    gvar: tvm.ir.GlobalVar
    args: list[relax.Expr]
    out_ty: object
    has_tir_vars: bool


def as_tir_call(value: relax.Expr) -> TirCall | None:
    """The parts of ``R.call_tir(gvar, (args...), out_ty)``, or None for any other value."""
    if not isinstance(value, relax.Call) or not value.op.same_as(CALL_TIR):
        return None
    args = value.args[1]
    arg_list = list(args.fields) if isinstance(args, relax.Tuple) else [args]
    out_ty = value.ty_args[0] if value.ty_args else value.ty
    return TirCall(value.args[0], arg_list, out_ty, len(value.args) > 2)


def main_dataflow(func: relax.Function) -> tuple[int, relax.DataflowBlock] | None:
    """Index and block of the dataflow block with the most bindings, or None."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return None
    best = None
    for i, block in enumerate(body.blocks):
        if isinstance(block, relax.DataflowBlock):
            if best is None or len(block.bindings) > len(best[1].bindings):
                best = (i, block)
    return best


def replace_block(
    func: relax.Function, index: int, bindings: list[relax.Binding]
) -> relax.Function:
    """``func`` with its ``index``-th block's bindings replaced."""
    body = func.body
    blocks = list(body.blocks)
    blocks[index] = relax.DataflowBlock(bindings)
    new_body = relax.SeqExpr(blocks, body.body)
    return relax.Function(func.params, new_body, func.ret_ty, func.is_pure, func.attrs)


def with_own_callees(
    mod: tvm.IRModule, index: int, callees: dict[int, tuple[tvm.tirx.PrimFunc, str]]
) -> tvm.IRModule:
    """``mod`` whose ``call_tir`` bindings ``i`` of ``main``'s block ``index`` call a PrimFunc of
    their own, ``callees[i] = (func, name hint)``: a change to one call site only (an op
    pattern, a block annotation) without touching the other calls of the shared PrimFunc."""
    if not callees:
        return mod
    builder = relax.BlockBuilder(mod)
    bindings = list(mod["main"].body.blocks[index].bindings)
    for i, (func, name) in sorted(callees.items()):
        binding = bindings[i]
        call = as_tir_call(binding.value)
        gvar = builder.add_func(func, name)
        value = relax.op.call_tir(gvar, relax.Tuple(call.args), call.out_ty)
        bindings[i] = relax.VarBinding(binding.var, value)
    mod = builder.get()
    mod["main"] = replace_block(mod["main"], index, bindings)
    # Without normalizing, FuseOps' BlockBuilder cannot find the rebuilt main in its
    # de-duplication map and aborts (seen on ShuffleNet).
    return relax.transform.Normalize()(mod)


def handle(obj) -> int:
    """Identity of an FFI object (``==`` on Relax Vars is not identity)."""
    return obj.__chandle__()


def used_vars(expr: relax.Expr) -> list[relax.Var]:
    """Free variables read by ``expr``, in first-use order, each once."""
    seen: dict[int, relax.Var] = {}
    for var in relax.analysis.free_vars(expr):
        seen.setdefault(handle(var), var)
    return list(seen.values())


def static_shape(ty) -> tuple[int, ...] | None:
    """Shape of a tensor type when every dimension is a constant, else None."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    if values is None:
        return None
    dims = []
    for dim in values:
        if not isinstance(dim, tvm.tirx.IntImm):
            return None
        dims.append(int(dim.value))
    return tuple(dims)
