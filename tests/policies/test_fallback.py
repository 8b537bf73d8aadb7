"""``ordinary_fallback``: an rProgram predicted slower than ordinary kernels is replaced."""

from hypothesis import HealthCheck, given, settings

from tests.core.graphs import inception, layered_dags, op
from tvm_rtask.core import OrdinaryCall, RGraph, RProgram, VDevice
from tvm_rtask.fallbacks import ORDINARY_CALL, collecting_fallbacks
from tvm_rtask.policies import AnalyticalCostModel, make_plan
from tvm_rtask.policies.simulate import simulate_plan

VD = VDevice.cuda("h100", threads=128, registers=64, num_veu=24)


class FastOrdinary(AnalyticalCostModel):
    """Ordinary kernels (say, a vendor library's) ten times faster than the rKernels."""

    def ordinary_us(self, op, vdevice):
        return 0.1 * super().ordinary_us(op, vdevice)


def _all_ordinary_us(graph, vd, cost) -> float:
    return simulate_plan([OrdinaryCall(op.name) for op in graph], graph, vd, cost)


def _heavy_branches() -> RGraph:
    """Two convolution-sized branches and a join: work dwarfs the launches."""
    return RGraph(
        [
            op("a", ["x"], 48, flops=2e10),
            op("b", ["x"], 48, flops=2e10),
            op("c", ["a", "b"], 48, flops=2e10),
        ]
    )


def test_programs_that_lose_to_ordinary_kernels_become_ordinary_calls():
    g, cost = _heavy_branches(), FastOrdinary()
    packed = make_plan(g, VD, "wavefront", cost=cost)
    with collecting_fallbacks() as notes:
        guarded = make_plan(g, VD, "wavefront", cost=cost, ordinary_fallback=True)
    assert packed.estimated_us > _all_ordinary_us(g, VD, cost)
    assert all(isinstance(s, OrdinaryCall) for s in guarded.steps)
    # each operator that falls back is said, with both estimates
    assert [n["subject"] for n in notes] == [s.op for s in guarded.steps]
    assert all(n["kind"] == ORDINARY_CALL and "predicted slower" in n["reason"] for n in notes)
    assert guarded.estimated_us <= _all_ordinary_us(g, VD, cost) + 1e-9
    guarded.validate("counters")
    assert [s.op for s in guarded.steps if isinstance(s, OrdinaryCall)]


def test_programs_that_win_are_kept():
    g, cost = inception(rtasks=24), AnalyticalCostModel()
    packed = make_plan(g, VD, "wavefront", cost=cost)
    with collecting_fallbacks() as notes:
        guarded = make_plan(g, VD, "wavefront", cost=cost, ordinary_fallback=True)
    assert guarded.estimated_us <= packed.estimated_us + 1e-9
    assert any(isinstance(s, RProgram) for s in guarded.steps)
    noted = {n["subject"] for n in notes}
    assert noted == {s.op for s in guarded.steps if isinstance(s, OrdinaryCall)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered_dags())
def test_a_guarded_plan_is_never_estimated_above_ordinary_kernels(graph):
    cost = AnalyticalCostModel()
    for policy in ("wavefront", "ios", "opara"):
        plan = make_plan(graph, VD, policy, cost=cost, ordinary_fallback=True)
        plan.validate()
        unguarded = make_plan(graph, VD, policy, cost=cost)
        assert plan.estimated_us <= unguarded.estimated_us + 1e-6
        ordinary = [OrdinaryCall(op.name) for op in graph]
        # every program is at most its operators' ordinary time, ordinary calls are equal
        assert plan.estimated_us <= simulate_plan(ordinary, graph, VD, cost) + 1e-6


def test_the_fallback_is_on_by_default_only_with_a_measured_cost_model():
    from tvm_rtask.options import resolve_options
    from tvm_rtask.policies import CalibratedCostModel

    assert not resolve_options({}).falls_back_to_ordinary()
    assert resolve_options({"cost": "measured"}).falls_back_to_ordinary()
    calibrated = CalibratedCostModel()
    assert resolve_options({"cost": calibrated}).falls_back_to_ordinary()
    assert not resolve_options(
        {"cost": "measured", "ordinary_fallback": False}
    ).falls_back_to_ordinary()
    assert resolve_options({"ordinary_fallback": True}).falls_back_to_ordinary()
