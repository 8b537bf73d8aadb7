"""Opara: stream allocation, the resource-aware launch order, plans in that order."""

from tests.core.graphs import diamond, inception, op
from tvm_rtask.core import RGraph, RKernel, ROperator, VDevice
from tvm_rtask.policies import AnalyticalCostModel, OparaPolicy, make_plan
from tvm_rtask.policies.opara import is_compute_bound

COST = AnalyticalCostModel()


def test_streams_follow_first_successors():
    s = OparaPolicy.streams(inception())
    # stem -> b1 (its first successor) keeps stream 0; the other branches get new ones
    assert s["stem"] == s["b1"] == 0
    assert len({s["b1"], s["b2a"], s["b3a"], s["b4"]}) == 4
    assert s["b2b"] == s["b2a"] and s["b3b"] == s["b3a"]
    # concat is the first successor of b1 only (b2b's first successor too): it takes b1's
    assert s["concat"] == s["b1"]
    d = OparaPolicy.streams(diamond())
    assert d["a"] == d["b"] == d["d"] and d["c"] != d["a"]


def kind(name: str, pattern: str, inputs: list[str], rtasks: int) -> ROperator:
    return ROperator(
        name, "f", inputs, [name], pattern=pattern, flops=1e6, bytes=1e5,
        rkernels=[RKernel(f"{name}@{rtasks}", rtasks, threads=64)],
    )  # fmt: skip


def test_classification_uses_pattern_kinds_not_names():
    assert is_compute_bound(kind("add_that_is_a_conv", "out_ewise_fusable", ["x"], 1))
    assert not is_compute_bound(kind("conv2d_named_but_elemwise", "elemwise", ["x"], 1))
    assert is_compute_bound(kind("x", "opaque", ["x"], 1))
    assert not is_compute_bound(kind("y", "reduce", ["x"], 1))


def test_launch_order_alternates_and_prefers_small_demand():
    g = RGraph(
        [
            kind("c_big", "out_ewise_fusable", ["x"], 8),
            kind("c_small", "out_ewise_fusable", ["x"], 2),
            kind("m_big", "elemwise", ["x"], 6),
            kind("m_small", "injective", ["x"], 1),
            kind("after", "elemwise", ["c_small"], 1),
        ]
    )
    order = OparaPolicy().launch_order(g, VDevice.cpu(4), COST)
    # compute (smallest first), memory (smallest), compute, memory: "after" became ready
    # after c_small and is smaller than m_big
    assert order == ["c_small", "m_small", "c_big", "after", "m_big"]


def test_plan_appends_in_launch_order_with_growing_phases():
    g = inception(rtasks=2)
    vd = VDevice.cpu(4)
    plan = make_plan(g, vd, "opara")
    (prog,) = plan.programs()
    order = OparaPolicy().launch_order(g, vd, COST)
    assert prog.ops() == order
    prog.check_waves(g)
    waves = [next(t.wave for t in prog.tasks() if t.op == o) for o in order]
    assert waves == sorted(waves)


def test_unsupported_ops_split_programs():
    g = RGraph([op("a", ["x"]), op("e", ["a"], supported=False), op("b", ["e"])])
    kinds = [type(s).__name__ for s in make_plan(g, VDevice.cpu(2), "opara").steps]
    assert kinds == ["RProgram", "OrdinaryCall", "RProgram"]


def test_streams_simulation_overlaps_independent_branches():
    from tests.core.graphs import inception
    from tvm_rtask.policies.simulate import ideal_us
    from tvm_rtask.policies.streams import simulate_streams

    graph, vd, cost = inception(), VDevice.cpu(8), AnalyticalCostModel()
    t = simulate_streams(graph, vd, cost)
    assert t.launches == len(graph) and t.streams > 1
    for o in graph:  # an operator never starts before its predecessors end
        assert all(t.start_us[o.name] >= t.end_us[p] for p in graph.preds(o.name))
    serial = sum(cost.launch_us(vd) + cost.kernel_us(o, cost.fastest(o, vd), vd) for o in graph)
    assert ideal_us(graph, vd, cost) <= t.total_us < serial
