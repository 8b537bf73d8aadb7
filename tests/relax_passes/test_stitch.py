"""StitchFusion: fewer kernels than FuseOps, independent branches kept, cycles repaired.

The "no new dependency" property is checked by an independent implementation (networkx
reachability over the original graph and the fused graph), not by the pass's own bitsets.
"""

import itertools

import networkx as nx
import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import relax as R

import tvm_rtask
from tvm_rtask.errors import OptionError
from tvm_rtask.relax_passes import extract_graph, prepare_pipeline
from tvm_rtask.relax_passes.stitch import StitchFusion, plan_groups, realise
from tvm_rtask.relax_passes.stitch_graph import COMPUTE, LIGHT, REDUCE, OpGraph
from tvm_rtask.relax_passes.stitch_ilp import find_cycles, greedy_select, ilp_select
from tvm_rtask.relax_passes.stitch_patterns import (
    Limits,
    Pattern,
    is_valid,
    no_new_dependency,
    to_mask,
)
from tvm_rtask.testing.run import run_executable

from .test_fuse import Softmaxish, TwoBranches

RNG = np.random.default_rng(7)


def _prepared(mod):
    return prepare_pipeline("none")(mod)


def _kernels(mod) -> int:
    return sum(1 for op in extract_graph(mod).operators if op.pattern != "tuple")


def _run(mod, inputs):
    return run_executable(tvm.compile(mod, "llvm"), inputs)


def _inputs(mod) -> dict:
    return {
        p.name: RNG.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
        for p in mod["main"].params
    }


def _dag(graph: OpGraph) -> nx.DiGraph:
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(graph)))
    dag.add_edges_from((n.index, s) for n in graph.nodes for s in n.succs)
    return dag


def assert_no_new_dependency(graph: OpGraph, groups: list[frozenset[int]]) -> None:
    """Independent operators stay unordered after fusion, unless the order runs through a
    group holding two independent operators side by side (horizontal packing)."""
    dag = _dag(graph)
    group_of = {m: ("g", k) for k, g in enumerate(groups) for m in g}
    fused = nx.quotient_graph(
        dag, [set(g) for g in groups] + [{i} for i in dag if i not in group_of]
    )
    assert nx.is_directed_acyclic_graph(fused)
    block_of = {i: b for b in fused for i in b}
    fused_reach = {b: nx.descendants(fused, b) for b in fused}
    # Allowed orders: original paths plus both directions of every side-by-side pair.
    allowed = dag.copy()
    for g in groups:
        for a, b in itertools.combinations(g, 2):
            if not nx.has_path(dag, a, b) and not nx.has_path(dag, b, a):
                allowed.add_edges_from([(a, b), (b, a)])
    original = {i: nx.descendants(dag, i) for i in dag}
    closure = {i: nx.descendants(allowed, i) for i in allowed}
    for u, v in itertools.permutations(dag, 2):
        if v in original[u] or u in original[v] or block_of[u] == block_of[v]:
            continue
        if block_of[v] in fused_reach[block_of[u]]:
            assert v in closure[u], (graph.nodes[u].name, graph.nodes[v].name)


# ---------------------------------------------------------------- small graphs


def test_kinds_come_from_op_patterns():
    graph = OpGraph(_prepared(TwoBranches))
    assert [n.kind for n in graph.nodes] == [COMPUTE, COMPUTE, LIGHT, LIGHT]
    assert REDUCE in {n.kind for n in OpGraph(_prepared(Softmaxish)).nodes}


def test_softmax_becomes_one_kernel_with_the_same_numbers():
    plain = _prepared(Softmaxish)
    stitched = StitchFusion()(plain)
    assert _kernels(plain) == 5 and _kernels(stitched) == 1
    inputs = _inputs(plain)
    np.testing.assert_allclose(_run(stitched, inputs)[0], _run(plain, inputs)[0], rtol=1e-6)


def test_fusing_a_join_into_one_branch_is_refused():
    """FuseOps' choice {matmul a, add}: matmul b would now precede matmul a."""
    graph = OpGraph(_prepared(TwoBranches))
    a, b, add, _ = range(4)
    assert not is_valid(graph, {a, add}, Limits())
    with pytest.raises(AssertionError):
        assert_no_new_dependency(graph, [frozenset({a, add})])
    # Both branches side by side order nothing new (is_valid still refuses this one: two
    # GEMMs in a single-output kernel, which the CPU rKernel maker cannot split).
    assert no_new_dependency(graph, [a, b, add], to_mask([a, b, add]))
    assert not no_new_dependency(graph, [a, add], to_mask([a, add]))
    assert_no_new_dependency(graph, [frozenset({a, b, add})])


def test_two_branches_keep_their_wave():
    stitched = StitchFusion()(_prepared(TwoBranches))
    waves = tvm_rtask.core.RGraph(extract_graph(stitched).operators).waves()
    # Either both matmuls run side by side in wave 0, or they share one kernel.
    first = extract_graph(stitched).operators
    matmul_ops = [op for op in first if "matmul" in op.func]
    assert len(waves[0]) == 2 or len(matmul_ops) == 1


@tvm.script.ir_module
class CycleBait:
    """u1 -> v2 and u2 -> v1: packing {u1, v1} and {u2, v2} side by side (each fine on its
    own) makes each pack feed the other. The chain z gives u1 and v1 one common wave."""

    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            u1 = R.exp(x)
            u2 = R.tanh(x)
            v1 = R.sigmoid(u2)
            v2 = R.negative(u1)
            z0 = R.negative(x)
            z1 = R.exp(z0)
            z2 = R.abs(z1)
            z3 = R.sqrt(z2)
            y = R.add(R.add(v1, v2), z3)
            R.output(y)
        return y


def test_ilp_loop_repairs_a_cycle_that_greedy_makes():
    mod = _prepared(CycleBait)
    graph = OpGraph(mod)
    index = {n.name: n.index for n in graph.nodes}
    p1 = frozenset({index["u1"], index["v1"]})
    p2 = frozenset({index["u2"], index["v2"]})
    # Each pattern is fine on its own: convex, no independent operators ordered. (Scores
    # are set by hand: the cost model charges side-by-side packs as ordinary calls.)
    assert is_valid(graph, p1, Limits()) and is_valid(graph, p2, Limits())
    candidates = [Pattern(p, 1.0, "crafted") for p in (p1, p2)]
    greedy = greedy_select(candidates)
    assert len(greedy) == 2 and find_cycles(graph, greedy)  # P1 -> P2 -> P1
    selection = ilp_select(graph, candidates)
    assert selection.cycle_cuts and len(selection.patterns) == 1
    assert not find_cycles(graph, selection.patterns)
    fused = relax.transform.FuseTIR()(realise(mod, graph, selection.patterns))
    inputs = _inputs(mod)
    np.testing.assert_allclose(_run(fused, inputs)[0], _run(mod, inputs)[0], rtol=1e-6)


# ---------------------------------------------------------------- random graphs

UNARY = (R.exp, R.tanh, R.sigmoid, R.negative)


def _random_module(ops: list[tuple[int, int, int]]) -> tvm.IRModule:
    """A DAG of 8x8 tensors: each op (kind, i, j) reads values i and j of those so far."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            values = [x]
            for kind, i, j in ops:
                a, b = values[i % len(values)], values[j % len(values)]
                if kind < len(UNARY):
                    value = UNARY[kind](a)
                elif kind == len(UNARY):
                    value = R.add(a, b)
                elif kind == len(UNARY) + 1:
                    value = R.matmul(a, w)
                else:
                    value = R.subtract(a, R.max(a, axis=1, keepdims=True))
                values.append(bb.emit(value))
            used = {v.name for v in values[1:]}  # every value reaches the output
            out = bb.emit_output(relax.Tuple(values[1:]) if len(used) > 1 else values[-1])
        bb.emit_func_output(out)
    return bb.get()


ops_strategy = st.lists(
    st.tuples(st.integers(0, len(UNARY) + 2), st.integers(0, 30), st.integers(0, 30)),
    min_size=2,
    max_size=14,
)


@settings(max_examples=40, deadline=None)
@given(ops_strategy)
def test_random_dags_keep_independent_operators_independent(ops):
    graph, selection = plan_groups(_prepared(_random_module(ops)))
    assert_no_new_dependency(graph, [p.nodes for p in selection.patterns])


def test_random_dags_compute_the_same_numbers():
    rng = np.random.default_rng(3)
    for _ in range(4):
        ops = [tuple(int(v) for v in rng.integers(0, 31, 3)) for _ in range(12)]
        ops = [(k % (len(UNARY) + 3), i, j) for k, i, j in ops]
        mod = _prepared(_random_module(ops))
        stitched = StitchFusion()(mod)
        assert _kernels(stitched) < _kernels(mod)
        inputs = _inputs(mod)
        for got, want in zip(_run(stitched, inputs), _run(mod, inputs), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- option wiring


def test_fusion_option_reaches_the_pipeline():
    plain = _prepared(Softmaxish)
    with tvm.transform.PassContext(config={"rtask.fusion": "stitch"}):
        planned = tvm_rtask.relax_passes.RTaskPrepare()(Softmaxish)
    assert _kernels(planned) == 1 < _kernels(plain)
    with pytest.raises(OptionError, match="fusion"):
        tvm_rtask.plan(Softmaxish, "llvm", fusion="stitched")
