"""``LowerRPrograms``: replace each rProgram's bindings by one call to its persistent PrimFunc.

Tensors produced and consumed inside one rProgram become workspace of the persistent function;
those read later (or leaving the dataflow block) become its outputs. Ordinary calls keep their
original binding. The original Relax Vars are rebound, so the rest of ``main`` is untouched.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..core import OrdinaryCall, Plan, RProgram
from ..errors import PlanError, remember_errors
from ..tir.cpu_dispatch import (
    CPUProgramCode,
    KernelCall,
    TensorDecl,
    build_cpu_dispatcher,
    scripts_from_program,
    waves_from_program,
)
from ..tir.cuda_dispatch import (
    CUDAProgramCode,
    build_cuda_dispatcher,
    program_table,
    sync_words,
)
from ..tir.cuda_rkernel import CUDARKernel
from .dataflow import replace_block, static_shape
from .extract import ExtractedGraph, extract_graph
from .plan import PLAN_ATTR, RKERNEL_SUFFIX, kernel_function


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


def _cpu_program(program: RProgram, plan: Plan, mod, tensors, inputs, outputs, workspaces):
    """The llvm persistent PrimFunc: workspaces live inside it."""
    calls = {}
    for op_name in program.ops():
        op = plan.graph.op(op_name)
        func = kernel_function(mod, op.func, program.kernel_of(op_name))
        calls[op_name] = KernelCall(mod[func], [*op.inputs, *op.outputs])
    code = CPUProgramCode(
        params=[_decl(t, tensors[t]) for t in (*inputs, *outputs)],
        workspaces=[_decl(t, tensors[t]) for t in workspaces],
        calls=calls,
        num_veu=program.num_veu,
    )
    barrier = plan.options.get("barrier", "fine")
    if barrier == "fine":
        code.scripts = scripts_from_program(program)
    else:
        code.waves = waves_from_program(program)
    timeout_us = int(plan.options.get("spin_timeout_ms", 60_000)) * 1000
    return build_cpu_dispatcher(code, barrier=barrier, timeout_us=timeout_us), [], outputs


def _cuda_program(program: RProgram, plan: Plan, mod, tensors, inputs, outputs, workspaces):
    """The CUDA persistent PrimFunc: workspaces are extra outputs (no device malloc inside a
    kernel); the task table, barrier pairs and sync words are constant inputs."""
    op_index = {op: i for i, op in enumerate(program.ops())}
    calls = {}
    for op_name in program.ops():
        op = plan.graph.op(op_name)
        meta = op.kernel(program.kernel_of(op_name))
        kernel = CUDARKernel(
            mod[f"{op.func}{RKERNEL_SUFFIX}"], meta.num_rtasks, meta.threads, meta.shared_mem, False
        )
        calls[op_name] = (kernel, [*op.inputs, *op.outputs])
    table, pairs = program_table(program, op_index)
    code = CUDAProgramCode(
        inputs=[_decl(t, tensors[t]) for t in inputs],
        outputs=[_decl(t, tensors[t]) for t in (*outputs, *workspaces)],
        calls=calls,
        num_veu=program.num_veu,
        threads=int(plan.options.get("cuda_threads", 256)),
        table=table,
        pairs=pairs,
        op_index=op_index,
    )
    timeout_ns = int(plan.options.get("spin_timeout_ms", 60_000)) * 1_000_000
    func = build_cuda_dispatcher(code, timeout_ns=timeout_ns)
    constants = [relax.const(table), relax.const(pairs), relax.const(sync_words(program.num_veu))]
    return func, constants, [*outputs, *workspaces]


def _append_status_check(func: relax.Function, sync_constants: list) -> relax.Function:
    """``main`` followed by ``tvm_rtask.check_status(sync words...)`` (impure, after the
    dataflow block): a barrier timeout in any CUDA rProgram becomes a Python exception."""
    body = func.body
    check = relax.Call(
        relax.ExternFunc("tvm_rtask.check_status"), sync_constants, ty_args=[relax.ObjectType()]
    )
    binding = relax.VarBinding(relax.Var("rtask_status", relax.ObjectType()), check)
    blocks = [*body.blocks, relax.BindingBlock([binding])]
    new_body = relax.SeqExpr(blocks, body.body)
    return relax.Function(func.params, new_body, func.ret_ty, False, func.attrs)


def _lower_program(
    k: int,
    program: RProgram,
    plan: Plan,
    mod: tvm.IRModule,
    extracted: ExtractedGraph,
    consumers: dict,
    builder: relax.BlockBuilder,
) -> list[relax.Binding]:
    tensors = extracted.tensors
    inputs, outputs, workspaces = _program_tensors(program, plan, consumers, extracted.escaping)
    make = _cuda_program if plan.vdevice.spec.kind == "cuda" else _cpu_program
    func, constants, results = make(program, plan, mod, tensors, inputs, outputs, workspaces)
    gvar = builder.add_func(func, f"rprogram_{k}")
    args = relax.Tuple([*(tensors[t] for t in inputs), *constants])
    if len(results) == 1:
        value = relax.op.call_tir(gvar, args, tensors[results[0]].ty)
        return [relax.VarBinding(tensors[results[0]], value)]
    out_tys = [tensors[t].ty for t in results]
    packed = relax.DataflowVar(f"rprogram_{k}_out", relax.TupleType(out_tys))
    bindings = [relax.VarBinding(packed, relax.op.call_tir(gvar, args, out_tys))]
    for i, t in enumerate(outputs):
        bindings.append(relax.VarBinding(tensors[t], relax.TupleGetItem(packed, i)))
    return bindings


@tvm.transform.module_pass(opt_level=0, name="LowerRPrograms")
class LowerRPrograms:
    """Turn the plan stored by ``PlanRPrograms`` into persistent PrimFuncs called from ``main``."""

    @remember_errors
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if mod.attrs is None or PLAN_ATTR not in mod.attrs:
            raise PlanError("LowerRPrograms needs a plan: run PlanRPrograms first")
        plan = Plan.from_json(str(mod.attrs[PLAN_ATTR]), shared=True)
        extracted = extract_graph(mod)
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
        for k, step in enumerate(plan.steps):
            if isinstance(step, OrdinaryCall):
                bindings.append(extracted.bindings[step.op])
                bindings += extracted.unpacked.get(step.op, [])
            else:
                bindings += _lower_program(k, step, plan, mod, extracted, consumers, builder)
        mod = builder.get()
        main = replace_block(mod["main"], extracted.block_index, bindings)
        if plan.vdevice.spec.kind == "cuda" and plan.options.get("check_status", True):
            sync = [
                b.value.args[1].fields[-1]
                for b in bindings
                if isinstance(b.value, relax.Call)
                and b.value.args
                and isinstance(b.value.args[0], tvm.ir.GlobalVar)
                and b.value.args[0].name_hint.startswith("rprogram_")
            ]
            if sync:
                main = _append_status_check(main, sync)
        mod["main"] = main
        return relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))
