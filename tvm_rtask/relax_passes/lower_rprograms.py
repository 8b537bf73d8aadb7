"""``LowerRPrograms``: replace each rProgram's bindings by one call to its persistent PrimFunc.

Tensors produced and consumed inside one rProgram become workspace of the persistent function;
those read later (or leaving the dataflow block) become its outputs. Ordinary calls keep their
original binding. The original Relax Vars are rebound, so the rest of ``main`` is untouched.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant

from ..backend import ProgramIO, get_backend
from ..core import OrdinaryCall, Plan, RProgram
from ..errors import PlanError, remember_errors
from ..options import RTaskOptions
from ..relax_exprs import constant_array
from ..tir.common import TensorDecl
from .dataflow import replace_block, static_shape
from .extract import ExtractedGraph, extract_graph
from .launch_on_streams import is_launch, launch_on_streams
from .nan_fill import FillOutputsWithNaN
from .plan_rprograms import plan_of


def _decl(name: str, expr: relax.Expr) -> TensorDecl:
    ty = expr.ty
    return TensorDecl(name, static_shape(ty), str(ty.dtype))


def _program_tensors(program: RProgram, plan: Plan, consumers: dict, escaping: set):
    """Inputs, outputs and workspaces of a program, each in first-use order."""
    ops = program.ops()
    inside = set(ops)
    produced = [t for op in ops for t in plan.graph.op(op).outputs]
    produced_set = set(produced)
    inputs: list[str] = []
    for op in ops:
        for t in plan.graph.op(op).inputs:
            if t not in produced_set and t not in inputs:
                inputs.append(t)
    outputs = [
        t for t in produced if t in escaping or any(c not in inside for c in consumers.get(t, ()))
    ]
    if not outputs:
        outputs = produced[-1:]
    workspaces = [t for t in produced if t not in outputs]
    return inputs, outputs, workspaces


def _lower_program(
    k: int,
    program: RProgram,
    plan: Plan,
    mod: tvm.IRModule,
    extracted: ExtractedGraph,
    consumers: dict,
    builder: relax.BlockBuilder,
    backend,
    options: RTaskOptions,
) -> list[relax.Binding]:
    tensors = extracted.tensors
    inputs, outputs, workspaces = _program_tensors(program, plan, consumers, extracted.escaping)
    io = ProgramIO(
        *([_decl(t, tensors[t]) for t in names] for names in (inputs, outputs, workspaces)),
        constant_values={
            t: constant_array(tensors[t]) for t in inputs if isinstance(tensors[t], Constant)
        },
    )
    lowered = backend.lower_program(program, plan, options, mod, io)
    gvar = builder.add_func(_bind_callees(builder, lowered), f"rprogram_{k}")
    passed = inputs if lowered.call_inputs is None else lowered.call_inputs
    args = relax.Tuple([*(tensors[t] for t in passed), *lowered.constants])
    results = lowered.results
    if len(results) == 1:
        value = relax.op.call_tir(gvar, args, tensors[results[0]].ty)
        return [relax.VarBinding(tensors[results[0]], value)]
    out_tys = [
        tensors[t].ty if isinstance(t, str) else relax.TensorType(list(t.shape), t.dtype)
        for t in results
    ]
    packed = relax.DataflowVar(f"rprogram_{k}_out", relax.TupleType(out_tys))
    bindings = [relax.VarBinding(packed, relax.op.call_tir(gvar, args, out_tys))]
    for i, t in enumerate(outputs):
        bindings.append(relax.VarBinding(tensors[t], relax.TupleGetItem(packed, i)))
    return bindings


def _bind_callees(builder: relax.BlockBuilder, lowered) -> tvm.tirx.PrimFunc:
    """Add the lowered program's callees to the module, once per name, and return its
    function calling them through the module's GlobalVars: a callee that an earlier rProgram
    added already (the same rKernel's body function) is shared, and a GlobalVar the backend
    made for a callee (a TIR call of a PrimFunc) becomes the module's."""
    func = lowered.func
    if not lowered.callees:
        return func
    existing = {gv.name_hint: gv for gv in builder.get().get_global_vars()}
    for name, callee in lowered.callees.items():
        if name not in existing:
            existing[name] = builder.add_func(callee, name)
    wanted = {name: existing[name] for name in lowered.callees}

    def rebind(gv):
        found = wanted.get(gv.name_hint)
        return gv if found is None or found.same_as(gv) else found

    return tvm_ffi.structural_map(func, (tvm.ir.GlobalVar, rebind))


@tvm.transform.module_pass(opt_level=0, name="LowerRPrograms")
class LowerRPrograms:
    """Turn the plan stored by ``PlanRPrograms`` into persistent PrimFuncs called from ``main``."""

    @remember_errors
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        plan = plan_of(mod)
        if plan is None:
            raise PlanError("LowerRPrograms needs a plan: run PlanRPrograms first")
        options = RTaskOptions.from_dict(plan.options)
        if not plan.target:
            raise PlanError("the plan names no target: make it with PlanRPrograms")
        backend = get_backend(tvm.target.Target(plan.target))
        extracted = extract_graph(mod, estimates=False)
        # names, inputs and outputs: a tensor named differently by the two extractions would
        # bind the wrong Relax value to a kernel argument (seen with constants once)
        signature = [(op.name, op.inputs, op.outputs) for op in extracted.operators]
        if signature != [(op.name, op.inputs, op.outputs) for op in plan.graph.ops]:
            raise PlanError("the module changed between PlanRPrograms and LowerRPrograms")
        consumers: dict[str, set[str]] = {}
        for op in plan.graph.ops:
            for t in op.inputs:
                consumers.setdefault(t, set()).add(op.name)
        builder = relax.BlockBuilder(mod)
        bindings: list[relax.Binding] = []
        launch_at: dict[int, int] = {}  # step -> the position of its launch in the block
        for k, step in enumerate(plan.steps):
            first = len(bindings)
            if isinstance(step, OrdinaryCall):
                bindings.append(extracted.bindings[step.op])
                bindings += extracted.unpacked.get(step.op, [])
            else:
                bindings += _lower_program(
                    k, step, plan, mod, extracted, consumers, builder, backend, options
                )
            if is_launch(bindings[first].value):
                launch_at[k] = first
        mod = builder.get()
        main = replace_block(mod["main"], extracted.block_index, bindings)
        if plan.streams:
            main = launch_on_streams(main, extracted.block_index, launch_at, plan)
        calls = [
            b.value
            for b in bindings
            if isinstance(b.value, relax.Call)
            and b.value.args
            and isinstance(b.value.args[0], tvm.ir.GlobalVar)
            and b.value.args[0].name_hint.startswith("rprogram_")
        ]
        main = backend.finish_main(main, calls, options)
        mod["main"] = main
        mod = relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))
        return FillOutputsWithNaN()(mod) if options.nan_fill else mod
