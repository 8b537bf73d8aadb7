"""Properties of every plan, over random DAGs, rTask counts and vEU counts.

Every policy's plan validates (also for a global-barrier lowering: ``check_waves``), the
simulator never deadlocks and agrees with the plan's estimate, the makespan is at least the
ideal bound, and wavefront, wavefront_global and ios never exceed sequential.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.graphs import layered_dags, small_dags
from tvm_rtask.core import Barrier, Plan, RGraph, RProgram, VDevice
from tvm_rtask.errors import PlanError
from tvm_rtask.policies import (
    AnalyticalCostModel,
    make_plan,
    policy_names,
    simulate,
    simulate_program,
)

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


POLICIES = ["sequential", "wavefront", "wavefront_global", "ios", "opara", "auto"]
NEVER_SLOWER_THAN_SEQUENTIAL = {"wavefront", "wavefront_global", "ios", "auto"}


def check_all_policies(graph: RGraph, vd: VDevice) -> None:
    seq = make_plan(graph, vd, "sequential", cost=COST)
    for name in POLICIES:
        plan = seq if name == "sequential" else make_plan(graph, vd, name, cost=COST)
        check_plan(plan)
        for p in plan.programs():
            p.check_waves(graph)
        timing = simulate(plan, cost=COST)  # raises DeadlockError if a wait never ends
        assert timing.total_us == pytest.approx(plan.estimated_us, rel=1e-9, abs=1e-9)
        assert timing.total_us + 1e-9 >= timing.ideal_us
        for v in range(vd.num_veu):
            assert timing.idle_us[v] >= -1e-9 and timing.wait_us[v] >= 0
        if name in NEVER_SLOWER_THAN_SEQUENTIAL:
            assert plan.estimated_us <= seq.estimated_us * (1 + TOL), name
        ops = [op for p in plan.programs() for op in p.ops()]
        assert len(ops) == len(set(ops)) == sum(op.supported for op in graph)


def check_all_policies_with_counters(graph: RGraph, vd: VDevice) -> None:
    """Planned for dependency counters: no barrier entries, the counter scripts validate,
    the estimate is the counter simulation's and never above sequential's."""
    seq = make_plan(graph, vd, "sequential", cost=COST, sync="counters")
    for name in POLICIES:
        plan = (
            seq if name == "sequential" else make_plan(graph, vd, name, cost=COST, sync="counters")
        )
        assert plan.sync == "counters"
        assert all(p.num_barriers == 0 for p in plan.programs())
        timing = simulate(plan, cost=COST)
        assert timing.total_us == pytest.approx(plan.estimated_us, rel=1e-9, abs=1e-9)
        assert timing.total_us + 1e-9 >= timing.ideal_us
        if name in NEVER_SLOWER_THAN_SEQUENTIAL - {"wavefront_global"}:
            assert plan.estimated_us <= seq.estimated_us * (1 + TOL), name
        again = Plan.from_json(plan.to_json())
        assert again.to_dict() == plan.to_dict() and again.sync == "counters"
        again.validate("counters")


@SETTINGS
@given(small_dags(), st.integers(1, 8))
def test_small_dags_all_policies_with_counters(graph, veus):
    check_all_policies_with_counters(graph, VDevice.cpu(veus))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered_dags(max_layers=6, max_width=6), st.integers(1, 8))
def test_layered_dags_all_policies_with_counters(graph, veus):
    check_all_policies_with_counters(graph, VDevice.cpu(veus))


# launches on streams, which the step-by-step simulator does not model: tests/core/test_streams.py
STREAM_POLICIES = {"opara_streams"}


def test_every_builtin_policy_is_checked():
    assert set(POLICIES) | STREAM_POLICIES == set(policy_names()) - {"test-everything-sequential"}


@SETTINGS
@given(small_dags(), st.integers(1, 8))
def test_small_dags_all_policies(graph, veus):
    check_all_policies(graph, VDevice.cpu(veus))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered_dags(max_layers=6, max_width=6), st.integers(1, 8))
def test_layered_dags_all_policies(graph, veus):
    check_all_policies(graph, VDevice.cpu(veus))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered_dags(max_layers=5, max_width=5), st.sampled_from(["h100", "v100"]))
def test_cuda_vdevices_all_policies(graph, device):
    check_all_policies(graph, VDevice.cuda(device, threads=128, registers=64, num_veu=48))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layered_dags(max_layers=5, max_width=6),
    st.sampled_from(["h100", "v100"]),
    st.sampled_from([8, 132, 264, 396]),
)
def test_ideal_bound_holds_with_more_veus_than_sms(graph, device, veus):
    """Costs depend on a wave's width: the ideal bound must come from the same model, so no
    policy's estimate falls below it, whether vEUs are fewer or more than the SMs."""
    check_all_policies(graph, VDevice.cuda(device, threads=128, registers=64, num_veu=veus))


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
