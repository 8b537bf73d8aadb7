"""rtask_pipeline: one pass for the whole pipeline, options checked when it is made."""

from __future__ import annotations

import pytest
import tvm

import tvm_rtask
from tests.relax_passes.models import TwoBranches
from tvm_rtask.errors import OptionError
from tvm_rtask.relax_passes import PLAN_ATTR


def test_the_pipeline_is_one_sequential_pass():
    pipeline = tvm_rtask.rtask_pipeline("llvm", num_veu=2)
    assert isinstance(pipeline, tvm.transform.Pass)
    lowered = pipeline(TwoBranches)
    assert PLAN_ATTR in lowered.attrs
    assert "rprogram_" in lowered["main"].script()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"policy": "nope"}, "unknown policy"),
        ({"num_veu": 0}, "num_veu"),
        ({"barrier": "global"}, "not implemented on CUDA"),
        ({"r": 2}, "unknown option"),
    ],
)
def test_bad_options_fail_when_the_pipeline_is_made(options, message):
    with pytest.raises(OptionError, match=message):
        tvm_rtask.rtask_pipeline("cuda", **options)


def test_the_phases_are_pass_lists_joined_by_the_pipeline():
    from tvm_rtask.options import resolve_options
    from tvm_rtask.relax_passes import pipeline

    options = resolve_options({"num_veu": 2})
    names = [
        type(p).__name__ if not isinstance(p, tvm.transform.Pass) else p.info.name
        for phase in (pipeline.prepare_passes, pipeline.plan_passes, pipeline.lower_passes)
        for p in phase("llvm", options)
    ]
    assert names == ["IOSOperatorMerge", "RTaskPrepare", "PlanRPrograms", "LowerRPrograms"]
    with pytest.raises(ValueError, match="unknown pipeline phase"):
        pipeline.RTaskPipeline("llvm", ("prepare", "build"))


def test_plan_runs_the_prepare_and_plan_phases_only():
    plan = tvm_rtask.plan(TwoBranches, "llvm", num_veu=2)
    assert plan.vdevice.num_veu == 2 and plan.programs()


@pytest.mark.parametrize("entry", ["pipeline", "plan"])
def test_the_device_option_reaches_fusion_stitching(monkeypatch, entry):
    """FusionStitching scores its patterns for the device the options name, not the arch's
    default: ``device=`` must reach RTaskPrepare through every entry point."""
    from tvm_rtask.relax_passes import fuse

    seen = []
    original = fuse.prepare_pipeline

    def spy(fusion, device, target_passes=()):
        seen.append((fusion, device))
        return original(fusion, device, target_passes)

    monkeypatch.setattr(fuse, "prepare_pipeline", spy)
    target = {"kind": "cuda", "arch": "sm_80"}
    if entry == "pipeline":
        tvm_rtask.relax_passes.pipeline.RTaskPipeline(
            target, ("prepare",), fusion="stitch", device="h100"
        )(TwoBranches)
    else:
        tvm_rtask.plan(TwoBranches, target, fusion="stitch", device="h100")
    assert seen and all(s == ("stitch", "h100") for s in seen)


def test_prepare_alone_takes_the_device_keyword(monkeypatch):
    from tvm_rtask.relax_passes import RTaskPrepare, fuse

    seen = []
    monkeypatch.setattr(fuse, "prepare_pipeline", lambda f, d, *_: seen.append(d) or (lambda m: m))
    RTaskPrepare("stitch", {"kind": "cuda", "arch": "sm_80"}, device="h100")(TwoBranches)
    assert seen == ["h100"]
