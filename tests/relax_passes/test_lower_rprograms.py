"""LowerRPrograms: one call per rProgram in main, and refusals when the plan is missing or
does not match the module."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.relax_passes.models import TwoBranches
from tvm_rtask.core import Plan
from tvm_rtask.errors import PlanError, run_keeping_errors
from tvm_rtask.relax_passes import PLAN_ATTR, LowerRPrograms, PlanRPrograms, RTaskPrepare


@pytest.fixture(scope="module")
def planned():
    return PlanRPrograms("llvm", num_veu=2)(RTaskPrepare()(TwoBranches))


def test_main_calls_one_persistent_function_per_rprogram(planned):
    plan = Plan.from_json(str(planned.attrs[PLAN_ATTR]))
    lowered = LowerRPrograms()(planned)
    calls = re.findall(r"R\.call_tir\((?:cls\.)?(rprogram_\d+)", lowered["main"].script())
    assert len(calls) == len(plan.programs()) >= 1
    assert all(isinstance(lowered[c], tvm.tirx.PrimFunc) for c in calls)


def test_lowered_module_computes_the_model(planned):
    from tvm_rtask.api import build

    ex, _ = build(LowerRPrograms()(planned), "llvm")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 8, 8)).astype("float32")
    w = rng.standard_normal((4, 4, 3, 3)).astype("float32")
    args = [tvm.runtime.tensor(a) for a in (x, w)]
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()
    reference = relax.VirtualMachine(tvm.compile(TwoBranches, "llvm"), tvm.cpu())["main"](*args)
    np.testing.assert_allclose(got, reference.numpy(), rtol=1e-5, atol=1e-5)


def test_without_a_plan_it_says_which_pass_is_missing():
    with pytest.raises(PlanError, match="run PlanRPrograms first"):
        run_keeping_errors(LowerRPrograms(), RTaskPrepare()(TwoBranches))


def test_a_module_changed_after_planning_is_refused(planned):
    main = planned["main"]
    block = main.body.blocks[0]
    first = block.bindings[0].var
    broken = planned.clone()
    broken["main"] = relax.Function(
        main.params,
        relax.SeqExpr([relax.DataflowBlock(list(block.bindings)[:1])], first),
        first.ty,
        main.is_pure,
        main.attrs,
    )
    with pytest.raises(PlanError, match="changed between PlanRPrograms and LowerRPrograms"):
        run_keeping_errors(LowerRPrograms(), broken)
