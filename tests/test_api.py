"""The public entry points: plan, lower, build, compile_with_plan."""

from __future__ import annotations

import pytest

import tvm_rtask
from tests.relax_passes.models import TwoBranches
from tvm_rtask.errors import OptionError, PlanError


def test_compile_with_plan_returns_the_plan_it_built():
    ex, plan = tvm_rtask.compile_with_plan(TwoBranches, "llvm", policy="sequential", num_veu=2)
    assert plan.policy == "sequential" and ex is not None
    assert len(plan.programs()) == len(plan.steps) - len(plan.ordinary_calls())


def test_lower_then_build_is_compile():
    import tvm_ffi

    from tvm_rtask.relax_passes import plan_of

    lowered = tvm_rtask.lower(TwoBranches, "llvm", num_veu=2)
    tvm_ffi.structural_hash(lowered)  # the plan is plain data in an attribute
    ex, plan = tvm_rtask.build(lowered, "llvm")
    assert plan.vdevice.num_veu == 2 and ex is not None
    assert plan.to_json() == plan_of(lowered).to_json()


def test_build_needs_a_lowered_module():
    with pytest.raises(PlanError, match="tvm_rtask.lower"):
        tvm_rtask.build(TwoBranches, "llvm")


def test_plan_checks_options_before_any_work():
    with pytest.raises(OptionError, match="CUDA targets only"):
        tvm_rtask.plan(TwoBranches, "llvm", verify_occupancy=False)
    with pytest.raises(OptionError, match="not supported"):
        tvm_rtask.plan(TwoBranches, {"kind": "opencl"})


def test_policy_options_reach_plan():
    plan = tvm_rtask.plan(TwoBranches, "llvm", policy="ios", num_veu=2, r=1)
    assert plan.policy_options["r"] == 1


def test_a_replan_and_the_builds_fallbacks_are_in_the_plan_returned(monkeypatch):
    """The backend asks for one more plan (as CUDA does after a spill): the plan returned
    lists the replan, and a fallback the build takes is added to it (the module's JSON
    keeps only planning's)."""
    from tvm_rtask.backend.cpu.backend import CPUBackend
    from tvm_rtask.fallbacks import BUILT_LATE, REPLANNED, note_fallback
    from tvm_rtask.relax_passes import plan_of

    asked = []

    def replan_once(self, plan, options, given=frozenset()):
        asked.append(plan.vdevice.num_veu)
        return {"num_veu": 1} if len(asked) == 1 else None

    build = CPUBackend.build

    def build_late(self, lowered, plan, options):
        note_fallback(BUILT_LATE, "fused_body", "a test says so")
        return build(self, lowered, plan, options)

    monkeypatch.setattr(CPUBackend, "replan_options", replan_once)
    monkeypatch.setattr(CPUBackend, "build", build_late)
    _, plan = tvm_rtask.compile_with_plan(TwoBranches, "llvm", num_veu=2)
    assert asked == [2, 1] and plan.vdevice.num_veu == 1
    kinds = [f["kind"] for f in plan.report()["fallbacks"]]
    assert kinds.count(BUILT_LATE) == 1 and kinds[-1] == REPLANNED
    (replan,) = [f for f in plan.fallbacks if f["kind"] == REPLANNED]
    assert replan["subject"] == "the llvm plan" and "{'num_veu': 1}" in replan["reason"]
    lowered = tvm_rtask.lower(TwoBranches, "llvm", num_veu=1)
    assert plan_of(lowered).fallbacks == []
