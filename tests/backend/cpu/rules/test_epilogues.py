"""Issue 27: the epilogues of EfficientNet-B0, RegNetY-400MF and MobileNetV3-Small (SiLU,
hard-swish, hard-sigmoid, squeeze-and-excitation, depthwise convs with them, a residual
add) compile on llvm under wavefront, match ONNX Runtime, and every convolution is
scheduled by Conv2dNCHW or, with packed weights, Conv2dPackedNCHW (the epilogue inlined
into its write-back, or, for the multiply by a broadcast SE scale, computed in the same
parallel tile), with nothing logged."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tests.backend.cpu.rules.common import LLVM  # noqa: E402
from tests.backend.cpu.rules.epilogues import (  # noqa: E402
    BRANCHES,
    epilogue_model,
    is_se_scale,
)


@pytest.fixture(scope="module")
def model():
    return epilogue_model()


def test_every_convolution_is_scheduled_by_the_rule(model, caplog):
    import tvm_rtask
    from tvm_rtask.backend.cpu.rules import RULE_ATTR, schedule_cpu_func
    from tvm_rtask.relax_passes import RTaskPrepare

    with LLVM:
        prepared = RTaskPrepare()(tvm_rtask.frontend.load(model))
    caplog.clear()  # what the prepare phase noted (the model kept in NCHW) is not the rules'
    rules = {}
    with caplog.at_level(logging.WARNING, logger="tvm_rtask"):
        for gv, func in prepared.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint:
                scheduled = schedule_cpu_func(func, LLVM, name=gv.name_hint)
                rules[gv.name_hint] = scheduled and str(scheduled.attrs[RULE_ATTR])
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert rules and all(
        r in ("Conv2dNCHW", "Conv2dPackedNCHW", "DepthwiseConv2dNCHW") for r in rules.values()
    ), rules
    # the epilogues meant: hard-swish and SE's broadcast multiply fused after a conv
    names = " ".join(rules)
    assert "clip" in names and "sigmoid" in names and "multiply" in names, names
    se = [n for n in rules if is_se_scale(prepared[n])]
    assert len(se) >= 2, names  # sigmoid and hard-sigmoid SE: conv, gate, broadcast multiply


def test_se_tail_runs_in_the_parallel_tile(model):
    """The multiply by the SE scale (read at ``[n, c, 0, 0]``) is not inlined but computed
    under the rule's one parallel loop, which the rKernel cutter needs (in NCHW; with the
    blocked layout, the default, the same models are checked against ONNX Runtime below)."""
    import tvm_rtask
    from tvm_rtask.backend.cpu.rules import schedule_cpu_func
    from tvm_rtask.backend.cpu.tuned import outer_parallel_extent
    from tvm_rtask.relax_passes import RTaskPrepare

    with LLVM:
        prepared = RTaskPrepare(cpu_layout="nchw")(tvm_rtask.frontend.load(epilogue_model(["se"])))
    (func,) = [
        f
        for gv, f in prepared.functions.items()
        if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint and is_se_scale(f)
    ]
    scheduled = schedule_cpu_func(func, LLVM)
    assert scheduled is not None
    assert outer_parallel_extent(scheduled) > 1
    body = scheduled.body.block.body
    assert isinstance(body, tvm.tirx.For) and body.kind == tvm.tirx.ForKind.PARALLEL
    assert "T_multiply" in body.script()  # the tail is inside the parallel loop


def test_epilogue_models_match_onnxruntime_under_wavefront(model, caplog):
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.testing.onnx_light import onnxruntime_outputs, random_inputs, relative_error

    inputs = random_inputs(model)
    reference = onnxruntime_outputs(model, inputs)
    with caplog.at_level(logging.WARNING, logger="tvm_rtask"):
        ex = tvm_rtask.compile(
            tvm_rtask.frontend.load(model), "llvm", policy="wavefront", num_veu=2
        )
    assert not [r for r in caplog.records if "schedule rule" in r.getMessage()]
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(v) for v in inputs.values()]
    )
    outs = [o.numpy() for o in out]
    assert len(outs) == len(BRANCHES)
    for name, actual, expected in zip(BRANCHES, outs, reference, strict=True):
        assert float(np.max(np.abs(expected))) > 0.5, name  # alive activations
        assert np.isfinite(actual).all(), name
        assert relative_error(actual, expected) < 1e-4, (name, relative_error(actual, expected))
