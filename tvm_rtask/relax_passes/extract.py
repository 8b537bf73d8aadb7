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
    # the TupleGetItem bindings a multi-output operator absorbed, for when it stays ordinary
    unpacked: dict[str, list[relax.VarBinding]] = field(default_factory=dict)


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


def _tuple_outputs(block: relax.DataflowBlock, body: relax.Expr) -> dict[int, list]:
    """Multi-output ``call_tir`` bindings whose tuple is only ever taken apart: binding index
    -> the ``TupleGetItem`` binding of each field (None for a field nobody reads).

    Such a call becomes one rOperator with several outputs (the fields' variables), and the
    ``TupleGetItem`` bindings disappear into it. A tuple used as a whole (passed on,
    returned) keeps the call an ordinary one.
    """
    producer: dict[int, int] = {}
    fields: dict[int, dict[int, int]] = {}
    whole: set[int] = set()
    for i, binding in enumerate(block.bindings):
        value = binding.value
        call = as_tir_call(value)
        if call is not None and isinstance(call.out_ty, relax.TupleType):
            producer[handle(binding.var)] = i
            fields[i] = {}
            continue
        if isinstance(value, relax.TupleGetItem) and handle(value.tuple_value) in producer:
            j = producer[handle(value.tuple_value)]
            if value.index in fields[j]:
                whole.add(j)  # the same field taken twice: keep it simple, stay ordinary
            fields[j][value.index] = i
            continue
        for var in used_vars(value):
            if handle(var) in producer:
                whole.add(producer[handle(var)])
    for var in used_vars(body):
        if handle(var) in producer:
            whole.add(producer[handle(var)])
    out = {}
    for j, taken in fields.items():
        call = as_tir_call(block.bindings[j].value)
        n = len(call.out_ty.fields)
        if j not in whole:
            out[j] = [taken.get(k) for k in range(n)]
    return out


def _static_tensors(ty) -> bool:
    if isinstance(ty, relax.TupleType):
        return len(ty.fields) > 0 and all(_static_tensors(f) for f in ty.fields)
    return isinstance(ty, relax.TensorType) and static_shape(ty) is not None


def _unsupported_reason(mod: tvm.IRModule, value: relax.Expr, multi: bool = False) -> str:
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
    if isinstance(call.out_ty, relax.TupleType):
        if not multi:
            return "several outputs, and the output tuple is used as a whole"
        if not _static_tensors(call.out_ty):
            return "an output is not a tensor of static shape"
    elif not _static_tensors(call.out_ty):
        return "output is not one tensor of static shape"
    for arg in call.args:
        if not isinstance(arg, (relax.Var, tvm.ir.expr.Constant)) or static_shape(arg.ty) is None:
            return "an argument is not a tensor of static shape"
    if not isinstance(mod[call.gvar], tvm.tirx.PrimFunc):
        return f"{call.gvar.name_hint} is not a PrimFunc"
    return ""


def _field_names(block, binding, taken: list, names: _Names, escaping: set) -> list[str]:
    """Tensor names of a multi-output call's fields: the ``TupleGetItem`` variables, or a
    fresh variable for a field nobody reads (the kernel still writes it)."""
    out = []
    for k, index in enumerate(taken):
        if index is None:
            var = relax.DataflowVar(f"{binding.var.name}_{k}", binding.var.ty.fields[k])
        else:
            var = block.bindings[index].var
        name = names(var)
        if not isinstance(var, relax.DataflowVar):
            escaping.add(name)
        out.append(name)
    return out


def extract_graph(
    mod: tvm.IRModule,
    rkernels_for: Callable[[str], list[RKernel]] | None = None,
    estimates: bool = True,
) -> ExtractedGraph:
    """The rOperator graph of ``main``'s largest dataflow block (deterministic names).

    ``rkernels_for(func_name)`` gives the rKernel variants of a supported operator, or raises
    UnsupportedOperator to keep it an ordinary call; without it each gets one single-rTask
    placeholder. A maker with ``multi_output = False`` keeps multi-output kernels ordinary.
    Names depend only on the binding, so two extractions agree. ``estimates=False`` leaves
    each operator's flops and bytes at zero (lowering reads the plan's: walking every
    PrimFunc again cost tens of milliseconds).
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
    multi = _tuple_outputs(block, func.body.body)
    absorbed: dict[int, int] = {}  # TupleGetItem binding -> its multi-output call binding
    unpacked: dict[str, list[relax.VarBinding]] = {}
    for i, binding in enumerate(block.bindings):
        if i in absorbed:
            continue
        out = names(binding.var)
        if not isinstance(binding.var, relax.DataflowVar):
            escaping.add(out)
        call = as_tir_call(binding.value)
        if call is not None:
            # name the arguments (constants too) whether or not the operator is supported:
            # the planning and lowering extractions must give every tensor the same name
            for arg in call.args:
                names(arg)
        reason = _unsupported_reason(mod, binding.value, i in multi)
        if not reason and i in multi and not getattr(rkernels_for, "multi_output", True):
            reason = "several outputs, which this target's rKernels do not support"
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
        outputs = [out]
        if i in multi and call is not None:
            outputs = _field_names(block, binding, multi[i], names, escaping)
            absorbed.update({k: i for k in multi[i] if k is not None})
            unpacked[name] = [block.bindings[k] for k in multi[i] if k is not None]
        if reason:
            plumbing = isinstance(binding.value, (relax.Tuple, relax.TupleGetItem))
            op = ROperator(
                name=name,
                func=call.gvar.name_hint if call is not None else "",
                inputs=[names(a) for a in call.args]
                if call is not None
                else [names(v) for v in used_vars(binding.value)],
                outputs=outputs,
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
                outputs=outputs,
                pattern=PATTERN_NAMES.get(int(prim.attrs.get("op_pattern", 8)), "opaque"),
                flops=estimate_flops(prim) if estimates else 0.0,
                bytes=estimate_bytes(prim) if estimates else 0.0,
                rkernels=rkernels,
            )
        operators.append(op)
        bindings[op.name] = binding
    return ExtractedGraph(operators, bindings, names.exprs, index, escaping, unpacked)
