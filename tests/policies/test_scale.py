"""Planning large graphs: 1,000 operators with wavefront, a wide graph with IOS's budget.

Planning *time* is not asserted here: a loaded machine would make such a test fail for no
fault of the code (a measurement: bench/results/planning_time-2026-11-21.md)."""

import random

import pytest

from tvm_rtask.core import RGraph, RKernel, ROperator, VDevice
from tvm_rtask.policies import make_plan

DEVICES = {
    "cpu8": lambda: VDevice.cpu(8),
    "h100": lambda: VDevice.cuda("h100", threads=256, registers=64, num_veu=132),
}


def layered_graph(n: int, seed: int = 0, width: int = 8, rtasks: int = 4) -> RGraph:
    """A random layered DAG of ``n`` operators, like a wide CNN: layers of 1-``width``
    operators, each reading 1-3 operators of the previous layer; ``rtasks`` rTasks per
    operator, seeded FLOPs and bytes."""
    rng = random.Random(seed)
    ops: list[ROperator] = []
    prev: list[str] = []
    k = 0
    while k < n:
        layer = []
        for _ in range(min(rng.randint(1, width), n - k)):
            name = f"op{k}"
            inputs = rng.sample(prev, min(len(prev), rng.randint(1, 3))) if prev else ["x"]
            ops.append(
                ROperator(
                    name,
                    "f",
                    inputs,
                    [name],
                    pattern=rng.choice(["out_ewise_fusable", "elemwise", "injective"]),
                    flops=rng.uniform(1e5, 1e8),
                    bytes=rng.uniform(1e4, 1e7),
                    rkernels=[RKernel(f"{name}@{rtasks}", rtasks, threads=256)],
                )
            )
            layer.append(name)
            k += 1
        prev = layer
    return RGraph(ops)


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
