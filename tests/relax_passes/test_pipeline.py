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
