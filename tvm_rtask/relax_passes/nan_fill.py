"""Unwritten memory made visible (option ``nan_fill``, a debugging aid).

A kernel that leaves part of its output unwritten returns whatever the memory held: zeros
from a fresh page, the previous call's values, or another tensor's that shared its slot. It
may pass every comparison by luck and fail on another run (``docs/findings.md``,
"Unwritten memory"). With ``nan_fill=True`` every floating-point tensor a kernel of ``main``
writes (an rProgram's outputs and arenas, an ordinary call's outputs) is filled with NaN
just before the kernel runs, so an element the kernel does not write stays NaN. The
backends fill the workspaces that live inside a persistent kernel the same way
(``backend/cpu/dispatch.py``).

:class:`FillOutputsWithNaN` rewrites ``y = call_tir(f, args, out_ty)`` into
``t = full(shape, NaN); y = call_tir_inplace(f, (*args, t), inplace_indices=...)``: the
PrimFunc is unchanged (``call_tir_inplace`` hands it ``t`` as its output parameter), and the
filled tensor comes from Relax's allocator, so its memory is reused as the VM would reuse
it. Integer and boolean outputs are still allocated as before.
"""

from __future__ import annotations

import tvm
from tvm import relax, te

from .dataflow import as_tir_call, main_dataflow, replace_block, static_shape


def _fillable(ty) -> bool:
    """A float tensor of static shape (NaN means nothing to an integer)."""
    dtype = str(getattr(ty, "dtype", ""))
    return dtype.startswith(("float", "bfloat")) and static_shape(ty) is not None


def nan_fill_func(shape: list[int], dtype: str) -> tvm.tirx.PrimFunc:
    """A PrimFunc with one output of ``shape`` and ``dtype``, every element NaN (Relax's
    ``full`` does not legalize in TVM 0.27: topi's ``full`` reads a PrimType as a string)."""
    nan = tvm.tirx.const(float("nan"), dtype)
    out = te.compute(shape, lambda *_: nan, name="nan_fill")
    return te.create_prim_func([out]).without_attr("global_symbol")


def _fill_call(
    builder: relax.BlockBuilder, binding: relax.VarBinding, k: int
) -> list[relax.Binding] | None:
    """Bindings that fill the float outputs of ``binding``'s ``call_tir`` and then run it in
    place on them, or None when it is no ``call_tir`` or has no float output."""
    call = as_tir_call(binding.value)
    if call is None or call.has_tir_vars:
        return None
    out_ty = call.out_ty
    many = isinstance(out_ty, (list, tuple, tvm.ir.Array)) or isinstance(out_ty, relax.TupleType)
    outs = (
        list(out_ty.fields if isinstance(out_ty, relax.TupleType) else out_ty) if many else [out_ty]
    )
    if not any(_fillable(t) for t in outs):
        return None
    args = list(call.args)
    bindings: list[relax.Binding] = []
    inplace = []
    for i, ty in enumerate(outs):
        if not _fillable(ty):
            inplace.append(-1)
            continue
        filled = relax.DataflowVar(f"nan_fill_{k}_{i}", ty)
        fill = builder.add_func(nan_fill_func(list(static_shape(ty)), str(ty.dtype)), "nan_fill")
        bindings.append(relax.VarBinding(filled, relax.op.call_tir(fill, relax.Tuple([]), ty)))
        inplace.append(len(args))
        args.append(filled)
    value = relax.op.call_tir_inplace(
        call.gvar, relax.Tuple(args), inplace, outs if many else outs[0]
    )
    bindings.append(relax.VarBinding(binding.var, value))
    return bindings


@tvm.transform.module_pass(opt_level=0, name="FillOutputsWithNaN")
class FillOutputsWithNaN:
    """Every float output of every ``call_tir`` of ``main``'s dataflow block filled with NaN
    before the call; see the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        found = main_dataflow(mod["main"])
        if found is None:
            return mod
        index, block = found
        builder = relax.BlockBuilder(mod)
        bindings: list[relax.Binding] = []
        for k, binding in enumerate(block.bindings):
            bindings.extend(_fill_call(builder, binding, k) or [binding])
        mod = builder.get()
        mod["main"] = replace_block(mod["main"], index, bindings)
        return relax.transform.Normalize()(mod)
