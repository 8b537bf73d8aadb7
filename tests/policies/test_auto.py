"""Policy ``auto``: the candidate plan with the least estimate, and why, in the report."""

from __future__ import annotations

import pytest

from tests.core.graphs import chain, diamond, inception
from tvm_rtask.core import Plan, VDevice
from tvm_rtask.errors import OptionError
from tvm_rtask.policies import make_plan


@pytest.mark.parametrize(
    "graph", [chain(6), diamond(), inception()], ids=["chain", "diamond", "inception"]
)
@pytest.mark.parametrize("veus", [1, 2, 8])
def test_auto_keeps_the_candidate_with_the_least_estimate(graph, veus):
    vdevice = VDevice.cpu(veus)
    alone = {p: make_plan(graph, vdevice, p).estimated_us for p in ("sequential", "wavefront")}
    plan = make_plan(graph, vdevice, "auto")
    best = min(alone, key=lambda p: (alone[p], p != "sequential"))
    assert plan.policy == best
    assert plan.estimated_us == pytest.approx(alone[best])
    choice = plan.report()["policy_choice"]
    assert choice["chosen"] == best
    assert choice["estimates_us"] == pytest.approx(alone)
    assert choice["cost"] == "AnalyticalCostModel" and best in choice["why"]


def test_the_choice_survives_json():
    plan = make_plan(inception(), VDevice.cpu(2), "auto")
    again = Plan.from_json(plan.to_json())
    assert again.choice == plan.choice and again.policy == plan.policy


def test_a_plain_policy_records_no_choice():
    assert make_plan(diamond(), VDevice.cpu(2), "wavefront").report()["policy_choice"] == {}


def test_candidates_and_limits_are_options():
    graph = chain(8)
    plan = make_plan(
        graph, VDevice.cpu(2), "auto", candidates=("wavefront",), max_ops_per_program=3
    )
    assert plan.policy == "wavefront"
    assert max(len(p.ops()) for p in plan.programs()) <= 3
    with pytest.raises(OptionError, match="candidates"):
        make_plan(graph, VDevice.cpu(2), "auto", candidates=("auto",))
