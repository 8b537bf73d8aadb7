"""DepthwiseConv2dNCHW: numerics equal to TVM's unscheduled build (padding, strides read
from the de-interleaved copy, shifted last column tiles, large windows), live outputs, the
one-plane-an-rTask shape the rKernel cutter needs, and what it leaves to Conv2dNCHW."""

import numpy as np
import pytest
import tvm

from tests.backend.cpu.rules.common import (
    LLVM,
    NATIVE,
    assert_close,
    conv_module,
    fused_func,
    random_args,
    run,
)
from tvm_rtask.backend.cpu.rules import (
    RULE_ATTR,
    Conv2dNCHW,
    DepthwiseConv2dNCHW,
    schedule_cpu_func,
    vector_lanes,
)
from tvm_rtask.backend.cpu.rules.depthwise_conv2d import row_tile
from tvm_rtask.backend.cpu.tuned import make_tuned_cpu_rkernel, outer_parallel_extent

CASES = {
    # name: (channels, size, kernel, stride, pad)
    "3x3_pad1_40": (8, 40, 3, 1, 1),  # 40 columns: 16 + 16 + a shifted last vector
    "3x3_s2_pad1_34": (16, 34, 3, 2, 1),  # MobileNet's 3x3/2: 17 columns, 9 MACs each
    "5x5_s2_pad2_28": (12, 28, 5, 2, 2),  # MNASNet's 5x5/2: 14 columns
    "5x5_pad2_14": (24, 14, 5, 1, 2),  # rows narrower than 16 lanes, wider than 8
    "7x7_pad3_20": (8, 20, 7, 1, 3),  # ConvNeXt's window: unrolled along its columns only
    "3x3_s2_odd_31": (4, 31, 3, 2, 1),  # padded width 33: odd, copied in its own order
    "3x3_nopad_s2": (4, 35, 3, 2, 0),  # strided, no padding: a de-interleaved copy alone
}


def _scheduled(case, target):
    channels, size, kernel, stride, pad = CASES[case]
    func = fused_func(conv_module(channels, channels, size, kernel, stride, pad, channels))
    return func, schedule_cpu_func(func, target)


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_unscheduled_build(case, target):
    func, scheduled = _scheduled(case, target)
    assert scheduled is not None
    assert str(scheduled.attrs[RULE_ATTR]) == "DepthwiseConv2dNCHW"
    channels = CASES[case][0]
    assert outer_parallel_extent(scheduled) == channels  # one channel plane an rTask
    args = random_args(func)
    expected = run(func, args, target)
    # live outputs: relu keeps about half, and their scale is that of the inputs
    assert np.mean(expected > 0) > 0.2 and np.max(expected) > 0.5
    assert_close(run(scheduled, args, target), expected)


def test_declines_what_it_leaves_to_others():
    # stride-1 rows narrower than half a vector go to Conv2dNCHW (tiles of several channels)
    narrow = fused_func(conv_module(32, 32, 7, 3, 1, 1, 32))
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    assert vector_lanes(avx512) == 16
    assert DepthwiseConv2dNCHW().apply(narrow, avx512, False) is None
    assert str(schedule_cpu_func(narrow, avx512).attrs[RULE_ATTR]) == "Conv2dNCHW"
    # ungrouped, grouped (two channels a group) and channel-multiplier convolutions
    for module in (
        conv_module(8, 8, 20, 3, 1, 1),
        conv_module(8, 8, 20, 3, 1, 1, 4),
        conv_module(8, 16, 20, 3, 1, 1, 8),
    ):
        assert DepthwiseConv2dNCHW().apply(fused_func(module), LLVM, False) is None
    # a window threshold keeps small strided windows out when asked
    s2 = fused_func(conv_module(16, 16, 34, 3, 2, 1, 16))
    assert DepthwiseConv2dNCHW(min_strided_window=16).apply(s2, LLVM, False) is None
    assert Conv2dNCHW().apply(s2, LLVM, False) is None
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    assert DepthwiseConv2dNCHW().apply(s2, cuda, False) is None


def test_row_tile():
    assert row_tile(112, 9, 32, 8) == 8  # 9 weights + 8 rows fit 32 registers
    assert row_tile(56, 25, 32, 8) == 4  # room for 5: the largest divisor of 56 is 4
    assert row_tile(14, 25, 16, 8) == 1  # no room beside 25 weights on AVX2
    assert row_tile(7, 9, 32, 8) == 7


@pytest.mark.parametrize("max_rtasks", [2, 4])
def test_cut_into_rtasks(max_rtasks):
    func, scheduled = _scheduled("5x5_s2_pad2_28", LLVM)
    kernel = make_tuned_cpu_rkernel(scheduled, max_rtasks)
    assert kernel.num_rtasks == max_rtasks
    args = random_args(func)
    assert_close(run(kernel.func, args), run(func, args))
