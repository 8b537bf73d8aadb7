"""The measured timeline (option ``trace``): every rTask and wait of the plan recorded once,
inside its rProgram's call, drawn by the Gantt charts, broken down, and absent from the
untraced build."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask
from tests.relax_passes.models import SharedKernels, shared_kernels_inputs
from tvm_rtask.errors import OptionError
from tvm_rtask.runtime.trace import PROGRAM, RTASK, WAIT, Timeline, trace_call
from tvm_rtask.viz import gantt

RNG = np.random.default_rng(5)


def _inputs():
    return shared_kernels_inputs(RNG)


@pytest.fixture(scope="module", params=["wavefront", "sequential"])
def traced(request):
    ex, plan = tvm_rtask.compile_with_plan(
        SharedKernels, "llvm", policy=request.param, num_veu=2, fusion="none", trace=True
    )
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = _inputs()
    return plan, trace_call(lambda: vm["main"](*args), plan, warmup=1)


def test_every_rtask_is_recorded_once_inside_its_program(traced):
    plan, timeline = traced
    r = timeline.records
    names = {plan.graph.index(op.name): op.name for op in plan.graph}
    recorded = sorted((int(p), names[int(a)], int(b)) for _, p, _, a, b, *_ in r[r[:, 0] == RTASK])
    expected = sorted(
        (k, t.op, t.rtask_id)
        for k, step in enumerate(plan.steps)
        if hasattr(step, "tasks")
        for t in step.tasks()
    )
    assert recorded == expected
    for k in {p for p, _, _ in expected}:
        (call,) = r[(r[:, 0] == PROGRAM) & (r[:, 1] == k)]
        inner = r[(r[:, 0] != PROGRAM) & (r[:, 1] == k)]
        assert call[5] <= inner[:, 5].min() and inner[:, 6].max() <= call[6]
    assert (r[:, 6] >= r[:, 5]).all()
    assert set(r[r[:, 0] != PROGRAM][:, 2]) <= {0, 1}


def test_waits_are_those_of_the_vEU_scripts(traced):
    from tvm_rtask.core.script import Wait, scripts_from_program

    plan, timeline = traced
    r = timeline.records
    for k, step in enumerate(plan.steps):
        if not hasattr(step, "tasks"):
            continue
        pairs = sorted(
            (v, u, count)
            for v, script in enumerate(scripts_from_program(step))
            for item in script
            if isinstance(item, Wait)
            for u, count in item.pairs
        )
        waits = r[(r[:, 0] == WAIT) & (r[:, 1] == k)]
        assert sorted((int(w[2]), int(w[3]), int(w[4])) for w in waits) == pairs


def test_breakdown_accounts_for_the_call(traced):
    _, timeline = traced
    b = timeline.breakdown()
    assert b["total_us"] > 0
    assert sum(b["share"].values()) == pytest.approx(1.0, abs=0.02)
    for p in b["programs"]:
        for busy, wait, idle in zip(p["busy_us"], p["wait_us"], p["idle_us"], strict=True):
            assert busy + wait + idle == pytest.approx(p["span_us"], rel=1e-6, abs=1e-3)


def test_operator_errors_cover_every_traced_operator(traced):
    plan, timeline = traced
    errors = timeline.operator_errors()
    traced_ops = {op for st in timeline.timing().steps if st.program for op, _ in st.program.spans}
    assert set(errors) == traced_ops
    assert all(e["measured_us"] > 0 and e["simulated_us"] > 0 for e in errors.values())


def test_the_gantt_chart_draws_the_measured_timeline(traced, tmp_path):
    plan, timeline = traced
    timing = gantt(plan, tmp_path / "measured.png", timing=timeline.timing())
    assert (tmp_path / "measured.png").stat().st_size > 1000
    assert timing.total_us == pytest.approx(timeline.timing().total_us)
    gantt(plan, tmp_path / "measured.svg", timing=timeline.timing())
    assert "time (us, measured" in (tmp_path / "measured.svg").read_text()


def test_timeline_round_trips_through_json(traced, tmp_path):
    _, timeline = traced
    timeline.save(tmp_path / "t.json")
    again = Timeline.load(tmp_path / "t.json")
    np.testing.assert_array_equal(again.records, timeline.records)
    assert again.breakdown()["total_us"] == pytest.approx(timeline.breakdown()["total_us"])


def test_the_untraced_build_calls_no_trace_function():
    plain = tvm_rtask.lower(SharedKernels, "llvm", num_veu=2, fusion="none")
    traced = tvm_rtask.lower(SharedKernels, "llvm", num_veu=2, fusion="none", trace=True)
    assert "tvm_rtask_trace" not in plain.script()
    assert "tvm_rtask_trace_begin" in traced.script()


def test_trace_call_refuses_an_untraced_plan():
    ex, plan = tvm_rtask.compile_with_plan(SharedKernels, "llvm", num_veu=2)
    with pytest.raises(OptionError, match="trace=True"):
        trace_call(lambda: None, plan)


def test_cuda_plans_a_traced_build():  # the kernel's side: tests/backend/cuda/test_trace.py
    plan = tvm_rtask.plan(SharedKernels, {"kind": "cuda", "arch": "sm_90"}, trace=True)
    assert plan.options["trace"] is True
