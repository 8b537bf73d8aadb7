"""Planning large graphs: 1,000 operators with wavefront, a wide graph with IOS's budget.

Planning *time* is measured by bench/planning_time.py (results in bench/results/), not
asserted here: a loaded machine would make such a test fail for no fault of the code."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from planning_time import DEVICES, layered_graph  # noqa: E402

from tvm_rtask.policies import make_plan  # noqa: E402


@pytest.mark.parametrize("device", ["cpu8", "h100"])
def test_wavefront_plans_1000_operators(device):
    graph = layered_graph(1000)
    plan = make_plan(graph, DEVICES[device](), "wavefront")
    assert plan.report()["operators"] == 1000
    assert plan.report()["max_ops_side_by_side"] > 1


def test_ios_budget_bounds_a_wide_graph():
    """300 operators, 8 wide: parts that run over the budget are halved, and the plan
    stays no worse than sequential."""
    graph = layered_graph(300)
    plan = make_plan(graph, DEVICES["cpu8"](), "ios", max_endings=1000)
    assert plan.report()["operators"] == 300
    assert plan.estimated_us <= make_plan(graph, DEVICES["cpu8"](), "sequential").estimated_us
