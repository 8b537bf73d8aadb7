"""FoldPadIntoConv: a zero pad of the spatial axes becomes the convolution's own padding;
anything else is left alone. Numbers against TVM's own build of the unchanged module."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_rtask.relax_passes.fold_pad import FoldPadIntoConv

RNG = np.random.default_rng(3)


def pad_conv_module(pad_width, pad_value=0.0, mode="constant", layout="NCHW", padding=(0, 0)):
    shape = (1, 5, 9, 11) if layout == "NCHW" else (1, 9, 11, 5)
    kernel_layout = "OIHW" if layout == "NCHW" else "HWIO"
    channels = 5 + (pad_width[2] + pad_width[3] if layout == "NCHW" else 0)
    w_shape = (4, channels, 3, 3) if layout == "NCHW" else (3, 3, 5, 4)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.pad(x, pad_width=pad_width, pad_value=pad_value, pad_mode=mode))
            w = relax.const(RNG.standard_normal(w_shape).astype("float32"))
            y = bb.emit(
                relax.op.nn.conv2d(
                    p,
                    w,
                    strides=[2, 2],
                    padding=list(padding),
                    data_layout=layout,
                    kernel_layout=kernel_layout,
                )
            )
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), RNG.standard_normal(shape).astype("float32")


def _ops(mod) -> list[str]:
    names = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.append(expr.op.name)

    relax.analysis.post_order_visit(mod["main"], visit)
    return names


def _run(mod, x):
    ex = tvm.compile(mod, "llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize(
    "pad_width, layout, padding",
    [
        ([0, 0, 0, 0, 0, 1, 0, 1], "NCHW", (0, 0)),  # TF "same" before a stride-2 conv
        ([0, 0, 0, 0, 2, 1, 1, 3], "NCHW", (1, 1)),  # added to the conv's own padding
        ([0, 0, 1, 0, 0, 1, 0, 0], "NHWC", (0, 0)),
    ],
)
def test_zero_spatial_pad_folds_into_the_conv(pad_width, layout, padding):
    mod, x = pad_conv_module(pad_width, layout=layout, padding=padding)
    folded = FoldPadIntoConv()(mod)
    assert "relax.nn.pad" not in _ops(folded)
    expected = _run(mod, x)
    assert np.abs(expected).max() > 1.0
    np.testing.assert_allclose(_run(folded, x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "pad_width, value, mode",
    [
        ([0, 0, 0, 0, 0, 1, 0, 1], 1.5, "constant"),  # not a zero pad
        ([0, 0, 1, 1, 0, 1, 0, 1], 0.0, "constant"),  # pads the channels too
        ([0, 0, 0, 0, 1, 1, 1, 1], 0.0, "reflect"),
    ],
)
def test_other_pads_are_left_alone(pad_width, value, mode):
    mod, x = pad_conv_module(pad_width, pad_value=value, mode=mode)
    folded = FoldPadIntoConv()(mod)
    assert "relax.nn.pad" in _ops(folded)
    np.testing.assert_allclose(_run(folded, x), _run(mod, x), rtol=1e-6)
