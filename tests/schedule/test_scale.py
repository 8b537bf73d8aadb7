"""Planning scales: 1,000 operators with wavefront well within the issue's 1 s budget
(CPU time, with slack for a loaded machine), and IOS bounded by its pruning."""

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from planning_time import DEVICES, layered_graph  # noqa: E402

from tvm_rtask.schedule import make_plan  # noqa: E402


@pytest.mark.parametrize("device", ["cpu8", "h100"])
def test_wavefront_plans_1000_operators_quickly(device):
    graph = layered_graph(1000)
    start = time.process_time()
    plan = make_plan(graph, DEVICES[device](), "wavefront")
    spent = time.process_time() - start
    assert plan.report()["operators"] == 1000
    assert spent < 2.5, f"wavefront took {spent:.2f} s of CPU for 1,000 operators"


def test_ios_budget_bounds_a_wide_graph():
    """300 operators, 8 wide: the DP's budget keeps IOS to a few seconds."""
    graph = layered_graph(300)
    start = time.process_time()
    plan = make_plan(graph, DEVICES["cpu8"](), "ios", max_endings=1000)
    spent = time.process_time() - start
    assert spent < 15, f"ios took {spent:.2f} s of CPU for 300 operators"
    assert plan.estimated_us <= make_plan(graph, DEVICES["cpu8"](), "sequential").estimated_us
