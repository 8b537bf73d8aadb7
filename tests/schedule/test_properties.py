"""Properties of every plan, over random DAGs, rTask counts and vEU counts."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.graphs import layered_dags, small_dags
from tvm_rtask.core import Barrier, Plan, RGraph, RProgram, VDevice
from tvm_rtask.errors import PlanError
from tvm_rtask.schedule import AnalyticalCostModel, make_plan, simulate_program

COST = AnalyticalCostModel()
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOL = 1e-9


def check_plan(plan: Plan) -> None:
    plan.validate()
    for p in plan.programs():
        simulate_program(p, plan.graph, plan.vdevice, COST)  # no deadlock
    assert plan.estimated_us + TOL * max(1.0, plan.ideal_us) >= plan.ideal_us
    again = Plan.from_json(plan.to_json())
    assert again.to_dict() == plan.to_dict()
    again.validate()


def check_graph(graph: RGraph, veus: int) -> None:
    vd = VDevice.cpu(veus)
    wave = make_plan(graph, vd, "wavefront", cost=COST)
    seq = make_plan(graph, vd, "sequential", cost=COST)
    check_plan(wave)
    check_plan(seq)
    assert wave.estimated_us <= seq.estimated_us * (1 + TOL)
    ops = [op for p in wave.programs() for op in p.ops()]
    assert len(ops) == len(set(ops)) == sum(op.supported for op in graph)


@SETTINGS
@given(small_dags(), st.integers(1, 8))
def test_small_dags(graph, veus):
    check_graph(graph, veus)


@SETTINGS
@given(layered_dags(), st.integers(1, 8))
def test_layered_dags(graph, veus):
    check_graph(graph, veus)


@settings(max_examples=60, deadline=None)
@given(layered_dags(max_layers=5, max_width=6), st.sampled_from(["h100", "v100"]))
def test_cuda_vdevices(graph, device):
    vd = VDevice.cuda(device, threads=128, registers=64, num_veu=48)
    wave = make_plan(graph, vd, "wavefront", cost=COST)
    check_plan(wave)
    assert wave.estimated_us <= make_plan(graph, vd, "sequential").estimated_us * (1 + TOL)


@settings(max_examples=60, deadline=None)
@given(small_dags(), st.integers(1, 6))
def test_program_round_trip_keeps_barrier_knowledge(graph, veus):
    for p in make_plan(graph, VDevice.cpu(veus)).programs():
        q = RProgram.from_dict(p.to_dict())
        assert q == p
        assert (q.known_matrix() == p.known_matrix()).all()


@settings(max_examples=30, deadline=None)
@given(layered_dags(), st.integers(1, 8))
def test_plans_are_deterministic(graph, veus):
    a = make_plan(graph, VDevice.cpu(veus))
    b = make_plan(RGraph.from_dict(graph.to_dict()), VDevice.cpu(veus))
    assert a.to_dict() == b.to_dict()


@settings(max_examples=100, deadline=None)
@given(layered_dags(), st.integers(2, 8), st.data())
def test_every_barrier_pair_is_needed(graph, veus, data):
    """append() keeps no redundant wait, so dropping any pair must fail validation."""
    plan = make_plan(graph, VDevice.cpu(veus))
    barriers = [
        (p, v, i)
        for p in plan.programs()
        for v, es in enumerate(p.entries)
        for i, e in enumerate(es)
        if isinstance(e, Barrier)
    ]
    if not barriers:
        return
    p, v, i = data.draw(st.sampled_from(barriers))
    waits = p.entries[v][i].waits
    k = data.draw(st.integers(0, len(waits) - 1))
    p.entries[v][i] = Barrier(waits[:k] + waits[k + 1 :])
    with pytest.raises(PlanError, match="covered neither by order nor by a barrier"):
        p.validate(plan.graph)
