"""Extract the rOperator graph from the dataflow block of ``main``.

Each ``call_tir`` binding with static shapes and one tensor output is an rOperator. Every
other binding (tuples, packed calls, calls with symbolic shapes or several outputs) is kept as
an unsupported operator: the planner leaves it an ordinary call between rPrograms, so compile
never fails because one operator is unusual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..core import RKernel, ROperator
from ..errors import UnsupportedOperator
from ..tir.analysis import estimate_bytes, estimate_flops
from .dataflow import as_tir_call, handle, main_dataflow, static_shape, used_vars

PATTERN_NAMES = {
    0: "elemwise",
    1: "broadcast",
    2: "injective",
    3: "reduce",
    4: "out_ewise_fusable",
    7: "tuple",
    8: "opaque",
}


@dataclass
class ExtractedGraph:
    """rOperators plus the Relax objects behind them, for the passes that rewrite ``main``."""

    operators: list[ROperator]
    bindings: dict[str, relax.VarBinding]
    tensors: dict[str, relax.Expr]  # tensor name -> Relax Var or Constant
    block_index: int
    escaping: set[str] = field(default_factory=set)  # tensors visible after the block


class _Names:
    """Unique, readable names for Relax vars and constants, keyed by object identity."""

    def __init__(self) -> None:
        self.by_handle: dict[int, str] = {}
        self.used: set[str] = set()
        self.exprs: dict[str, relax.Expr] = {}

    def __call__(self, expr: relax.Expr) -> str:
        key = handle(expr)
        if key in self.by_handle:
            return self.by_handle[key]
        base = expr.name if isinstance(expr, relax.Var) else "const"
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        self.by_handle[key] = name
        self.exprs[name] = expr
        return name


def _unsupported_reason(mod: tvm.IRModule, value: relax.Expr) -> str:
    call = as_tir_call(value)
    if call is None:
        kind = (
            value.op.name
            if isinstance(value, relax.Call) and hasattr(value.op, "name")
            else (type(value).__name__)
        )
        return f"not a call_tir binding ({kind})"
    if call.has_tir_vars:
        return "call_tir with symbolic TIR arguments"
    if not isinstance(call.out_ty, relax.TensorType) or static_shape(call.out_ty) is None:
        return "output is not one tensor of static shape"
    for arg in call.args:
        if not isinstance(arg, (relax.Var, tvm.ir.expr.Constant)) or static_shape(arg.ty) is None:
            return "an argument is not a tensor of static shape"
    if not isinstance(mod[call.gvar], tvm.tirx.PrimFunc):
        return f"{call.gvar.name_hint} is not a PrimFunc"
    return ""


def extract_graph(
    mod: tvm.IRModule, rkernels_for: Callable[[str], list[RKernel]] | None = None
) -> ExtractedGraph:
    """The rOperator graph of ``main``'s largest dataflow block (deterministic names).

    ``rkernels_for(func_name)`` gives the rKernel variants of a supported operator, or raises
    UnsupportedOperator to keep it an ordinary call; without it each gets one single-rTask
    placeholder. Names depend only on the binding, so two extractions agree.
    """
    func = mod["main"]
    found = main_dataflow(func)
    if found is None:
        return ExtractedGraph([], {}, {}, -1)
    index, block = found
    names = _Names()
    for param in func.params:
        names(param)
    operators, bindings = [], {}
    escaping = set()
    for i, binding in enumerate(block.bindings):
        out = names(binding.var)
        if not isinstance(binding.var, relax.DataflowVar):
            escaping.add(out)
        reason = _unsupported_reason(mod, binding.value)
        call = as_tir_call(binding.value)
        name = f"{i:04d}_{call.gvar.name_hint if call is not None else out}"
        rkernels: list[RKernel] = []
        if not reason:
            try:
                rkernels = (
                    rkernels_for(call.gvar.name_hint)
                    if rkernels_for
                    else [RKernel(name=call.gvar.name_hint, num_rtasks=1)]
                )
            except UnsupportedOperator as err:
                reason = str(err)
        if reason:
            plumbing = isinstance(binding.value, (relax.Tuple, relax.TupleGetItem))
            op = ROperator(
                name=name,
                func=call.gvar.name_hint if call is not None else "",
                inputs=[names(v) for v in used_vars(binding.value)],
                outputs=[out],
                pattern="tuple" if plumbing else "opaque",
                supported=False,
                reason=reason,
            )
        else:
            prim = mod[call.gvar]
            op = ROperator(
                name=name,
                func=call.gvar.name_hint,
                inputs=[names(a) for a in call.args],
                outputs=[out],
                pattern=PATTERN_NAMES.get(int(prim.attrs.get("op_pattern", 8)), "opaque"),
                flops=estimate_flops(prim),
                bytes=estimate_bytes(prim),
                rkernels=rkernels,
            )
        operators.append(op)
        bindings[op.name] = binding
    return ExtractedGraph(operators, bindings, names.exprs, index, escaping)
