"""PlanRPrograms: the plan it stores, the options it resolves once, its input left alone."""

from __future__ import annotations

import pytest
import tvm

from tests.relax_passes.models import TwoBranches
from tvm_rtask.core import Plan
from tvm_rtask.errors import OptionError
from tvm_rtask.options import RTaskOptions
from tvm_rtask.relax_passes import PLAN_ATTR, PlanRPrograms, RTaskPrepare


def _plan(mod, target="llvm", **options) -> Plan:
    planned = PlanRPrograms(target, **options)(mod)
    return Plan.from_json(str(planned.attrs[PLAN_ATTR]))


@pytest.fixture(scope="module")
def prepared():
    return RTaskPrepare()(TwoBranches)


def test_the_plan_carries_its_options_and_target(prepared):
    plan = _plan(prepared, num_veu=2, policy="sequential")
    options = RTaskOptions.from_dict(plan.options)
    assert options.policy == "sequential" and options.num_veu == 2
    assert plan.target["kind"] == "llvm"
    assert plan.vdevice.num_veu == 2


def test_policy_options_reach_the_policy(prepared):
    plan = _plan(prepared, num_veu=2, policy="ios", r=1, s=2)
    assert plan.policy_options["r"] == 1 and plan.policy_options["s"] == 2
    assert RTaskOptions.from_dict(plan.options).policy_options == {"r": 1, "s": 2}


def test_a_cost_model_object_reaches_the_policy(prepared):
    from tvm_rtask.policies import AnalyticalCostModel

    class Counting(AnalyticalCostModel):
        calls = 0

        def rtask_us(self, *args, **kwargs):
            Counting.calls += 1
            return super().rtask_us(*args, **kwargs)

    plan = _plan(prepared, num_veu=2, cost=Counting())
    assert Counting.calls > 0
    assert plan.options["cost"] == "Counting"


def test_the_input_module_is_left_as_it_was(prepared):
    before = tvm.ir.save_json(prepared)
    _plan(prepared, num_veu=2)
    assert tvm.ir.save_json(prepared) == before


def test_pass_context_keys_are_options_too(prepared):
    from tvm_rtask.runtime.config import register_config_options

    register_config_options()
    with tvm.transform.PassContext(config={"rtask.policy": "sequential", "rtask.num_veu": 2}):
        plan = _plan(prepared)
    assert plan.policy == "sequential" and plan.vdevice.num_veu == 2


def test_options_that_do_not_apply_fail_before_planning(prepared):
    from tvm_rtask.errors import run_keeping_errors

    with pytest.raises(OptionError, match="CUDA targets only"):
        run_keeping_errors(PlanRPrograms("llvm", cuda_threads=128), prepared)


def test_an_operator_kept_ordinary_is_a_fallback_of_the_plan():
    """A multi-output kernel whose tuple is returned whole stays an ordinary call: the plan
    lists it with extraction's reason (``gv = parts``, which runs no kernel, is not listed)."""
    from tests.relax_passes.test_extract import _split_module
    from tvm_rtask.fallbacks import ORDINARY_CALL, collecting_fallbacks

    prepared = RTaskPrepare("none")(_split_module(return_whole_tuple=True))
    with collecting_fallbacks() as outer:
        plan = _plan(prepared, num_veu=2)
    (note,) = [f for f in plan.fallbacks if f["kind"] == ORDINARY_CALL]
    assert note["subject"].endswith("_split") and "as a whole" in note["reason"]
    assert note in plan.report()["fallbacks"] and note in outer  # an enclosing block too


def test_the_prepare_phases_fallbacks_come_first_in_the_plan(monkeypatch):
    """A fallback a backend's prepare pass takes reaches the plan through the module
    attribute rtask.fallbacks; a module that fell back on nothing gets no attribute."""
    from tvm_rtask.backend.cpu.backend import CPUBackend
    from tvm_rtask.fallbacks import LAYOUT_KEPT, note_fallback
    from tvm_rtask.relax_passes.fallback_notes import FALLBACKS_ATTR, noted_in

    assert noted_in(RTaskPrepare()(TwoBranches)) == []

    @tvm.transform.module_pass(opt_level=0, name="KeepsTheLayout")
    def keeps_the_layout(mod, _ctx):
        note_fallback(LAYOUT_KEPT, "the model's convolutions", "a test says so")
        return mod

    monkeypatch.setattr(CPUBackend, "prepare_passes", lambda self, options: [keeps_the_layout])
    prepared = RTaskPrepare()(TwoBranches)
    kept = {"kind": LAYOUT_KEPT, "subject": "the model's convolutions", "reason": "a test says so"}
    assert FALLBACKS_ATTR in prepared.attrs and noted_in(prepared) == [kept]
    assert _plan(prepared, num_veu=2).fallbacks[0] == kept


def test_the_plan_travels_with_the_module():
    """The plan is JSON in the module's attribute, and the module stays an ordinary IRModule
    (it hashes); ``plan_of`` rebuilds it, also from an edited JSON."""
    import json

    import tvm_ffi

    from tvm_rtask.relax_passes import plan_of

    planned = PlanRPrograms("llvm", num_veu=2)(RTaskPrepare()(TwoBranches))
    tvm_ffi.structural_hash(planned)
    plan = plan_of(planned)
    assert plan.to_json() == str(planned.attrs[PLAN_ATTR])
    edited = json.loads(str(planned.attrs[PLAN_ATTR]))
    edited["policy"] = "edited"
    assert plan_of(planned.with_attr(PLAN_ATTR, json.dumps(edited))).policy == "edited"
    assert plan_of(tvm.IRModule({})) is None
