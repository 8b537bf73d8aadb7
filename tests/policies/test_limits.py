"""rProgram size limits: every policy that packs operators together honours them."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.graphs import chain, layered_dags, op
from tvm_rtask.core import OrdinaryCall, RGraph, VDevice
from tvm_rtask.errors import OptionError
from tvm_rtask.policies import AnalyticalCostModel, make_plan
from tvm_rtask.policies.ios import IOSPolicy, choose_merges

COST = AnalyticalCostModel()
LIMITED = ["wavefront", "wavefront_global", "ios", "opara"]


def _widest_wave(graph: RGraph) -> int:
    return max(len(w) for w in graph.waves())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered_dags(max_layers=6, max_width=5), st.integers(1, 6), st.sampled_from(LIMITED))
def test_programs_stay_within_the_operator_limit(graph, limit, policy):
    plan = make_plan(graph, VDevice.cpu(4), policy, cost=COST, max_ops_per_program=limit)
    # a wave larger than the limit still needs one program (wavefront places whole waves)
    bound = max(limit, _widest_wave(graph)) if policy.startswith("wavefront") else limit
    assert all(len(p.ops()) <= bound for p in plan.programs())
    # (make_plan validated the plan: every operator once, dependences in order, no deadlock)


@pytest.mark.parametrize("policy", LIMITED)
def test_kernel_limit_counts_distinct_kernels(policy):
    # 30 operators of 3 kernels in a chain, as in an unrolled RNN
    ops = [op(f"o{i}", [f"o{i - 1}"] if i else ["x"]) for i in range(30)]
    for i, o in enumerate(ops):
        o.func = f"cell_{i % 3}"
    graph = RGraph(ops)
    assert len(make_plan(graph, VDevice.cpu(2), policy, max_kernels_per_program=3).programs()) == 1
    plan = make_plan(graph, VDevice.cpu(2), policy, max_kernels_per_program=2)
    assert len(plan.programs()) == 15  # two operators (two kernels) per program
    for program in plan.programs():
        assert len({graph.op(n).func for n in program.ops()}) <= 2


@pytest.mark.parametrize("policy", ["ios", "opara"])
def test_limits_cut_between_ordinary_calls_too(policy):
    ops = [op(f"o{i}", [f"o{i - 1}"] if i else ["x"]) for i in range(9)]
    ops[4] = op("o4", ["o3"], supported=False)
    plan = make_plan(RGraph(ops), VDevice.cpu(2), policy, max_ops_per_program=3)
    sizes = [len(s.ops()) if not isinstance(s, OrdinaryCall) else 0 for s in plan.steps]
    assert sizes == [3, 1, 0, 3, 1]


def test_ios_merges_are_chosen_in_the_planned_segments():
    graph = chain(6)
    segments = IOSPolicy(max_ops_per_program=2).segments(graph)
    assert segments == [["op0", "op1"], ["op2", "op3"], ["op4", "op5"]]
    # nothing mergeable: no merge, whatever the limits
    assert choose_merges(graph, VDevice.cpu(2), COST, {}, max_ops_per_program=2) == []


@pytest.mark.parametrize("policy", LIMITED)
@pytest.mark.parametrize("bad", [-1, 1.5, "4", True])
def test_bad_limits_are_refused(policy, bad):
    with pytest.raises(OptionError, match="max_ops_per_program"):
        make_plan(chain(3), VDevice.cpu(2), policy, max_ops_per_program=bad)
