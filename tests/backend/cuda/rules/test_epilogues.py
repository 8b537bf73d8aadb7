"""Issue 27 on CUDA (codegen only, no GPU, no nvcc): the epilogue models (SiLU, hard-swish,
hard-sigmoid, squeeze-and-excitation, depthwise, residual) build CUDA source for sm_90 with
the CUDA rules on; the rules take the convolutions whose epilogue they can inline into the
write-back and leave the one with the SE scale's broadcast multiply to dlight, without an
error or a warning."""

from __future__ import annotations

import logging

import pytest
import tvm

pytest.importorskip("onnx")

from tests.backend.cpu.rules.epilogues import epilogue_model, is_se_scale  # noqa: E402

from .convs import CAPPED, TARGET  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return epilogue_model()


def test_rules_take_the_inlinable_epilogues(model, caplog):
    import tvm_rtask
    from tvm_rtask.backend.cuda.rules import RULE_ATTR, schedule_cuda_func
    from tvm_rtask.relax_passes import RTaskPrepare

    prepared = RTaskPrepare(None, TARGET)(tvm_rtask.frontend.load(model))
    rules = {}
    with caplog.at_level(logging.WARNING, logger="tvm_rtask"), CAPPED:
        for gv, func in prepared.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint:
                scheduled = schedule_cuda_func(func, CAPPED, name=gv.name_hint)
                rules[gv.name_hint] = scheduled and str(scheduled.attrs[RULE_ATTR])
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    se = [n for n in rules if is_se_scale(prepared[n])]
    assert len(se) >= 2 and all(rules[n] is None for n in se), rules  # dlight's
    hardswish = [n for n in rules if "clip" in n and n not in se]
    assert hardswish and all(rules[n] for n in hardswish), rules  # inlined: the rules'


def test_epilogue_models_build_cuda_source_for_sm_90(model, caplog):
    import tvm_rtask

    with caplog.at_level(logging.WARNING, logger="tvm_rtask"):
        lowered = tvm_rtask.lower(
            tvm_rtask.frontend.load(model),
            {"kind": "cuda", "arch": "sm_90"},
            verify_occupancy=False,
            cuda_registers=64,
            cuda_rules=True,
            num_veu=16,
        )
        ex, _ = tvm_rtask.build(lowered, {"kind": "cuda", "arch": "sm_90"})
    assert not [r for r in caplog.records if "schedule rule" in r.getMessage()]
    source = tvm_rtask.cuda_source(ex)
    assert source and "__global__" in source
