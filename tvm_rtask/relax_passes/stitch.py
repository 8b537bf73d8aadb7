"""``StitchFusion``: FusionStitching's fusion plan, realised with TVM's own FuseTIR.

The plan (which bindings of ``main``'s dataflow block become one kernel) comes from
``stitch_patterns`` (candidates and scores) and ``stitch_ilp`` (the ILP with its cycle
repair). Each chosen group is then written the way ``relax.transform.FuseOps`` writes its
groups: a private Relax function with attribute ``Primitive`` whose body calls the members'
PrimFuncs, called from ``main`` (through ``TupleGetItem`` when several of its results are
used outside). ``relax.transform.FuseTIR`` turns every such function into one PrimFunc, so
the fused kernels are the same kind of TIR FuseOps produces; see docs/fusion.md.
"""

from __future__ import annotations

import networkx as nx
import tvm
from tvm import relax

from ..core import get_spec
from .dataflow import as_tir_call, handle, main_dataflow, replace_block
from .merged_reads import MergedParamReads
from .stitch_graph import OpGraph
from .stitch_ilp import Selection, fused_graph, ilp_select
from .stitch_patterns import Limits, Pattern, candidate_patterns, outputs, to_mask


def plan_groups(
    mod: tvm.IRModule, device: str = "cpu", limits: Limits | None = None
) -> tuple[OpGraph, Selection]:
    """The operator graph of ``main`` and the chosen patterns."""
    graph = OpGraph(mod)
    patterns = candidate_patterns(graph, get_spec(device), limits)
    return graph, ilp_select(graph, patterns)


def _group_function(block: relax.DataflowBlock, members: list[int], results: list[int]):
    """A ``Primitive`` Relax function computing ``results`` from the members' bindings, and
    the arguments to call it with (the members' external inputs, constants included)."""
    local: dict[int, relax.Var] = {}
    params, args = [], []
    bindings = []
    for m in members:
        binding = block.bindings[m]
        call = as_tir_call(binding.value)
        new_args = []
        for arg in call.args:
            key = handle(arg)
            if key not in local:
                local[key] = relax.Var(f"p{len(params)}", arg.ty)
                params.append(local[key])
                args.append(arg)
            new_args.append(local[key])
        var_type = relax.Var if m in results else relax.DataflowVar
        var = var_type(binding.var.name, binding.var.ty)
        local[handle(binding.var)] = var
        value = relax.op.call_tir(call.gvar, relax.Tuple(new_args), call.out_ty)
        bindings.append(relax.VarBinding(var, value))
    values = [local[handle(block.bindings[m].var)] for m in results]
    result = values[0] if len(values) == 1 else relax.Tuple(values)
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], result)
    func = relax.Function(params, body, result.ty).with_attr("Primitive", True)
    return func, args


def _group_name(block: relax.DataflowBlock, members: list[int]) -> str:
    names = []
    for m in members:
        name = as_tir_call(block.bindings[m].value).gvar.name_hint
        if name not in names:
            names.append(name)
    return "stitched_" + "_".join(names[:3])[:48]


def realise(mod: tvm.IRModule, graph: OpGraph, chosen: list[Pattern]) -> tvm.IRModule:
    """``mod`` with every chosen group turned into one call of a ``Primitive`` function,
    bindings reordered topologically on the fused graph; FuseTIR is not run here."""
    if not chosen:
        return mod
    block = graph.block
    builder = relax.BlockBuilder(mod)
    group_bindings: dict[tuple, list[relax.Binding]] = {}
    for i, pattern in enumerate(chosen):
        members = sorted(pattern.nodes)
        results = outputs(graph, members, to_mask(members))
        func, args = _group_function(block, members, results)
        gvar = builder.add_func(func, _group_name(block, members))
        call = relax.Call(gvar, args)
        if len(results) == 1:
            out = block.bindings[results[0]].var
            group_bindings[("p", i)] = [relax.VarBinding(out, call)]
            continue
        ty = relax.TupleType([block.bindings[m].var.ty for m in results])
        packed = relax.DataflowVar(f"{_group_name(block, members)}_out", ty)
        items = [
            relax.VarBinding(block.bindings[m].var, relax.TupleGetItem(packed, k))
            for k, m in enumerate(results)
        ]
        group_bindings[("p", i)] = [relax.VarBinding(packed, call), *items]
    fused = fused_graph(graph, chosen)
    first = {}
    for node in fused:
        first[node] = node[1] if node[0] == "op" else min(chosen[node[1]].nodes)
    order = nx.lexicographical_topological_sort(fused, key=lambda node: first[node])
    bindings = []
    for node in order:
        if node[0] == "op":
            bindings.append(block.bindings[node[1]])
        else:
            bindings.extend(group_bindings[node])
    result = builder.get()
    result["main"] = replace_block(mod["main"], graph.block_index, bindings)
    return relax.transform.Normalize()(result)


@tvm.transform.module_pass(opt_level=0, name="StitchFusion")
class StitchFusion:
    """FusionStitching on ``main``: memory-bound operators stitched (vertically and side by
    side) into few kernels, chosen by an ILP, without making independent branches dependent.

    Expects legalized TIR with op patterns (``AnnotateTIROpPattern``). ``device`` names the
    device table entry whose launch overhead and bandwidth score the patterns.
    """

    def __init__(self, device: str = "cpu", limits: Limits | None = None) -> None:
        self.device = device
        self.limits = limits

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if main_dataflow(mod["main"]) is None:
            return mod
        graph, selection = plan_groups(mod, self.device, self.limits)
        if not selection.patterns:
            return mod
        mod = realise(mod, graph, selection.patterns)
        mod = MergedParamReads()(relax.transform.FuseTIR()(mod))
        return relax.transform.DeadCodeElimination()(mod)
