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
    lowered = tvm_rtask.lower(TwoBranches, "llvm", num_veu=2)
    ex, plan = tvm_rtask.build(lowered, "llvm")
    assert plan.vdevice.num_veu == 2 and ex is not None


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
