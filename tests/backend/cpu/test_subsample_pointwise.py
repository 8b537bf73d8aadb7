"""SubsamplePointwiseStride: strided 1x1 convolutions become a strided_slice and a stride-1
1x1 convolution (a GEMM for Conv2dNCHW), with bitwise-equal outputs; everything else is
left alone."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask
from tests.backend.cpu.rules.common import NATIVE, called_names, conv_module
from tvm_rtask.backend.cpu.subsample_pointwise import SubsamplePointwiseStride


def _ops(mod) -> list[str]:
    return [n for n in called_names(mod) if n.startswith("relax.")]


@pytest.mark.parametrize("size, width", [(28, 28), (15, 21)])  # even and odd, not square
def test_strided_1x1_becomes_a_slice_and_a_gemm(size, width):
    mod = conv_module(32, 48, size, 1, 2, 0, width=width)
    rewritten = SubsamplePointwiseStride()(mod)
    assert _ops(rewritten) == [
        "relax.strided_slice",
        "relax.nn.conv2d",
        "relax.add",
        "relax.nn.relu",
    ]
    convs = []
    relax.analysis.post_order_visit(
        rewritten["main"].body,
        lambda e: (
            convs.append(e)
            if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.nn.conv2d"
            else None
        ),
    )
    assert [int(s) for s in convs[0].attrs.strides] == [1, 1]
    rng = np.random.default_rng(0)
    args = [
        rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
        for p in mod["main"].params
    ]
    outs = []
    for module in (mod, rewritten):
        ex = tvm.compile(module, NATIVE)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        outs.append(vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy())
    assert outs[0].shape == (1, 48, (size + 1) // 2, (width + 1) // 2)
    assert np.mean(outs[0] > 0) > 0.2 and outs[0].max() > 0.5  # live outputs
    np.testing.assert_array_equal(outs[1], outs[0])


def test_other_convolutions_are_left_alone():
    for module in (
        conv_module(8, 8, 16, 1, 1, 0),  # stride 1
        conv_module(8, 8, 16, 3, 2, 1),  # 3x3
        conv_module(8, 8, 16, 1, 2, 1),  # padded
    ):
        assert "relax.strided_slice" not in _ops(SubsamplePointwiseStride()(module))


def test_whole_compile_uses_the_gemm():
    """In tvm_rtask.compile (llvm, rules on) the strided 1x1 convolution matches TVM's own
    build of the original module."""
    mod = conv_module(64, 32, 14, 1, 2, 0)
    rng = np.random.default_rng(1)
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32"))
        for p in mod["main"].params
    ]
    expected = relax.VirtualMachine(tvm.compile(mod, NATIVE), tvm.cpu())["main"](*args).numpy()
    ex = tvm_rtask.compile(mod, NATIVE, policy="sequential", num_veu=2)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
