"""The stage estimate: water-filling equals the rTask-by-rTask greedy, replay never exceeds it."""

import heapq
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.graphs import inception, layered_dags
from tvm_rtask.core import DEVICE_SPECS, VDevice
from tvm_rtask.policies import AnalyticalCostModel, ProgramBuilder, simulate_program
from tvm_rtask.policies.stage import depth_widths, distribute, stage_depths, stage_schedule

COST = AnalyticalCostModel()


def greedy(s0: list[float], d: float, k: int) -> list[int]:
    heap = [(t, v) for v, t in enumerate(s0)]
    heapq.heapify(heap)
    counts = [0] * len(s0)
    for _ in range(k):
        t, v = heapq.heappop(heap)
        counts[v] += 1
        heapq.heappush(heap, (t + d, v))
    return counts


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=12),
    st.integers(1, 8),
    st.integers(1, 300),
)
def test_water_filling_equals_greedy(s0, d, k):
    # integer times: both sides exact, ties included
    got = distribute(np.array(s0, dtype=float), float(d), k)
    assert got.tolist() == greedy([float(t) for t in s0], float(d), k)
    assert got.sum() == k


def test_distribute_zero_duration_and_ties():
    assert distribute(np.array([3.0, 1.0, 1.0]), 0.0, 5).tolist() == [0, 5, 0]
    assert distribute(np.zeros(4), 1.0, 6).tolist() == [2, 2, 1, 1]
    assert distribute(np.zeros(2), 0.5, 101).tolist() == [51, 50]


def _device(veus: int) -> VDevice:
    if veus < 30:
        return VDevice.cpu(veus)
    # two SMs: rTasks share an SM at the widths of the stage's depths (stage.depth_widths)
    spec = DEVICE_SPECS["h100"] if veus == 30 else replace(DEVICE_SPECS["h100"], num_sms=2)
    return VDevice.cuda(spec, 128, 64, num_veu=30 if veus == 30 else 12)


@settings(max_examples=40, deadline=None)
@given(layered_dags(max_layers=4, max_width=5), st.sampled_from([3, 30, 31]))
def test_replayed_stage_never_exceeds_the_estimate(graph, veus):
    vd = _device(veus)
    ops = [o.name for o in graph if o.supported]
    kernels = {n: COST.fastest(graph.op(n), vd) for n in ops}
    # the largest prefix whose predecessors are all supported
    inside: list[str] = []
    for n in ops:
        if all(graph.op(p).supported for p in graph.preds(n)):
            inside.append(n)
    est = stage_schedule(inside, kernels, graph, vd, COST)
    b = ProgramBuilder(graph, vd, COST, "p")
    b.replay(est.placed(kernels), stage_depths(inside, graph))  # one wave per depth, as ios does
    widths = depth_widths(inside, kernels, graph, vd.num_veu)
    assert all(b.program.widths[n] == widths[n] for n in inside)
    t = simulate_program(b.program, graph, vd, COST).makespan_us if inside else 0.0
    assert t <= est.makespan_us * (1 + 1e-9) + 1e-9
    assert b.makespan == pytest.approx(t)


def test_small_and_numpy_paths_agree():
    g = inception(rtasks=7)
    ops = g.names
    for n in (4, 30):
        vd = VDevice.cpu(n) if n < 30 else VDevice.cuda("h100", 128, 64, num_veu=n)
        kernels = {o: COST.fastest(g.op(o), vd) for o in ops}
        a = stage_schedule(ops, kernels, g, vd, COST)
        # the same stage through the other implementation
        import tvm_rtask.policies.stage as stage

        saved = stage._SMALL
        stage._SMALL = 0 if n < 30 else 10**6
        try:
            b = stage_schedule(ops, kernels, g, vd, COST)
        finally:
            stage._SMALL = saved
        assert a.makespan_us == pytest.approx(b.makespan_us)
        for o in ops:
            assert a.counts[o].tolist() == b.counts[o].tolist()
