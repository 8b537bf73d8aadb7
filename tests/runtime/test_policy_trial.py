"""``policy="auto", choose="measure"``: every candidate built and timed here, the fastest kept,
its outputs TVM's own build's; without the target's device the estimate stands, noted."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask
from tests.relax_passes.models import SharedKernels, shared_kernels_inputs
from tvm_rtask.errors import OptionError
from tvm_rtask.fallbacks import NOT_MEASURED, collecting_fallbacks
from tvm_rtask.runtime import policy_trial

RNG = np.random.default_rng(11)


def _inputs():
    return shared_kernels_inputs(RNG)


@pytest.fixture(scope="module")
def measured():
    return tvm_rtask.compile_with_plan(
        SharedKernels, "llvm", policy="auto", choose="measure", num_veu=2, fusion="none"
    )


def test_the_fastest_measured_candidate_is_kept_and_reported(measured):
    _, plan = measured
    choice = plan.report()["policy_choice"]
    assert choice["choose"] == "measure"
    assert set(choice["measured_ms"]) == {"sequential", "wavefront"}
    assert set(choice["estimates_us"]) == {"sequential", "wavefront"}
    fastest = min(choice["measured_ms"], key=choice["measured_ms"].get)
    assert choice["chosen"] == plan.policy == fastest
    assert "measured" in choice["why"]


def test_the_kept_build_computes_what_tvm_builds(measured):
    ex, _ = measured
    args = _inputs()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()
    want = relax.VirtualMachine(tvm.compile(SharedKernels, "llvm"), tvm.cpu())["main"](*args)
    want = want.numpy()
    assert np.abs(want).max() > 1.0  # relu of three 3x3 convolutions stays alive
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_estimate_alone_builds_once_and_says_so():
    _, plan = tvm_rtask.compile_with_plan(SharedKernels, "llvm", num_veu=2, fusion="none")
    choice = plan.report()["policy_choice"]
    assert plan.options["policy"] == "auto"  # the default
    assert "measured_ms" not in choice and choice["chosen"] == plan.policy


def test_an_unknown_way_to_choose_is_an_error_naming_it():
    with pytest.raises(OptionError, match="choose must be one of estimate, measure"):
        tvm_rtask.plan(SharedKernels, "llvm", policy="auto", choose="guess")


def test_interleaved_timing_calls_each_in_turn_and_returns_a_median_each(monkeypatch):
    monkeypatch.setattr(policy_trial, "TRIAL_SECONDS", 0.0)  # MIN_CALLS rounds only
    order: list[str] = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    medians = policy_trial.time_interleaved(calls, sync=lambda: None)
    assert set(medians) == {"a", "b", "c"}
    assert all(m >= 0 for m in medians.values())
    warm = policy_trial.WARMUP * 3
    assert order[:warm] == ["a"] * 2 + ["b"] * 2 + ["c"] * 2
    rounds = [order[i : i + 3] for i in range(warm, len(order) - 2, 3)]
    assert len(rounds) == policy_trial.MIN_CALLS
    assert rounds[0] == ["a", "b", "c"] and rounds[1] == ["b", "c", "a"]
    assert rounds[2] == ["c", "a", "b"]


@pytest.mark.skipif(tvm.cuda(0).exist, reason="the device is here: the trial would run")
def test_without_the_device_the_estimate_stands_with_a_note():
    _, plan = tvm_rtask.compile_with_plan(SharedKernels, "llvm", num_veu=2, fusion="none")

    def never(name):
        raise AssertionError(f"built {name} though nothing can time it")

    with collecting_fallbacks() as notes:
        kept = policy_trial.keep_fastest(
            SharedKernels, tvm.target.Target("cuda"), (None, plan), never
        )
    assert kept[1] is plan
    assert [n["kind"] for n in notes] == [NOT_MEASURED]
    assert "needs the cuda device" in notes[0]["reason"]
