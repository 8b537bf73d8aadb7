"""WindowNCHWc: depthwise convolutions and pools over NCHWc channel blocks, scheduled inside
a model the blocked-layout pass prepared; numerics against TVM's own build of the NCHW
module."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from tests.backend.cpu.rules.common import NATIVE, fused_func
from tests.backend.cpu.test_blocked_channels import Builder, blocked_alone
from tvm_rtask.backend.cpu.rules import WindowNCHWc
from tvm_rtask.backend.cpu.rules.window_nchwc import MIN_TASKS, band_rows

DEPTHWISE_CASES = {
    # name: (channels, hw, k, stride)
    "dw_3x3_112": (32, 112, 3, 1),
    "dw_3x3_s2": (64, 28, 3, 2),
    "dw_5x5_7": (128, 7, 5, 1),
    "dw_3x3_rows_of_17": (16, 17, 3, 1),
}


@pytest.mark.parametrize("case", list(DEPTHWISE_CASES))
def test_depthwise_convolutions_match_tvms_build(case):
    channels, hw, k, stride = DEPTHWISE_CASES[case]
    net = Builder(channels, hw)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            y = net.conv(net.x, channels, channels, k, stride=stride, groups=channels)
            out = net.bb.emit_output(y)
        net.bb.emit_func_output(out)
    got, expected = blocked_alone(net.bb.get(), channels, hw, "WindowNCHWc")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize(
    "kind, size, stride, pad",
    # 7x7: a window left a loop; 3x3/1 padded: GoogLeNet's and Inception's branch pools
    [("max", 3, 2, 1), ("avg", 3, 2, 1), ("avg", 7, 1, 0), ("max", 3, 1, 1), ("avg", 3, 1, 1)],
)
def test_pools_between_blocked_convolutions_stay_blocked_and_match(kind, size, stride, pad):
    net = Builder(32, 14)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            y = net.conv(net.x, 32, 32, 3)
            pool = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
            y = net.bb.emit(
                pool(y, pool_size=(size, size), strides=(stride, stride), padding=(pad, pad))
            )
            out = net.bb.emit_output(net.conv(y, 32, 64, 1))
        net.bb.emit_func_output(out)
    got, expected = blocked_alone(net.bb.get(), 32, 14, "WindowNCHWc", part="pool")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("height, blocks", [(112, 2), (56, 9), (7, 60), (17, 1), (1, 3)])
def test_bands_make_enough_tasks_where_the_rows_allow(height, blocks):
    band = band_rows(height, blocks)
    assert height % band == 0
    assert blocks * (height // band) >= MIN_TASKS or band == 1


def test_an_nchw_depthwise_convolution_is_left_to_the_next_rule():
    net = Builder(32, 14)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            out = net.bb.emit_output(net.conv(net.x, 32, 32, 3, groups=32))
        net.bb.emit_func_output(out)
    assert WindowNCHWc().apply(fused_func(net.bb.get()), NATIVE, False) is None
