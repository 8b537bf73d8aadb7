"""Convolution rules with a relayout stitched after them (fusion="stitch"): the channel
shuffle's or the image-to-tokens reshape/transpose reads elements other parallel tiles
write. Found by the differential fuzzer: garbage in the last element (the last tile's own
copy of the convolution's output), a third of the outputs wrong (the relayout computed in
each channel's tile), or no build at all. Compared with TVM's own build, NaN-filled."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask


def _module(kind: str):
    """The module and its input, from a generator seeded per kind (the same under xdist)."""
    rng = np.random.default_rng({"shuffle": 4, "tokens": 2, "dw_tokens": 3}[kind])
    c, h = (2, 3) if kind != "dw_tokens" else (4, 5)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, h), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if kind == "dw_tokens":
                w = rng.standard_normal((c, 1, 3, 3)).astype("float32")
                y = bb.emit(
                    relax.op.nn.conv2d(
                        x, relax.const(w), strides=[2, 2], padding=[1, 1, 1, 1], groups=c
                    )
                )
            else:
                w = rng.standard_normal((c, c, 1, 1)).astype("float32")
                y = bb.emit(relax.op.nn.conv2d(x, relax.const(w)))
            if kind == "shuffle":
                y = bb.emit(relax.op.reshape(y, (1, 2, c // 2, h, h)))
                y = bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3, 4]))
                y = bb.emit(relax.op.reshape(y, (1, c, h, h)))
                w2 = rng.standard_normal((1, c, 1, 1)).astype("float32")
                y = bb.emit(relax.op.nn.conv2d(y, relax.const(w2)))
            else:
                hw = (h + 1) // 2 if kind == "dw_tokens" else h
                y = bb.emit(relax.op.reshape(y, (1, c, hw * hw)))
                y = bb.emit(relax.op.permute_dims(y, [0, 2, 1]))
                y = bb.emit(relax.op.reshape(y, (1, hw * hw * c // 2, 2)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, c, h, h)).astype("float32")


@pytest.mark.parametrize("kind", ["shuffle", "tokens", "dw_tokens"])
@pytest.mark.parametrize("num_veu", [1, 2])
def test_stitched_relayout_after_a_convolution_matches_tvm(kind, num_veu):
    mod, x = _module(kind)
    expected = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(x)
    ).numpy()
    assert np.abs(expected).max() > 0.5
    ex = tvm_rtask.compile(
        mod,
        "llvm",
        fusion="stitch",
        policy="sequential",
        cpu_layout="nchw",
        num_veu=num_veu,
        nan_fill=True,
    )
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for _ in range(2):
        actual = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
