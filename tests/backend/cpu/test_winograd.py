"""Winograd convolutions (``backend/cpu/winograd.py``): the transforms against a direct
convolution in numpy, the tile sizes chosen, and which convolutions the channel-block pass
lowers to them."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask
from tests.backend.cpu.test_blocked_channels import Builder, tvm_reference
from tvm_rtask.backend.cpu.blocked_channels import NCHWC_NAME
from tvm_rtask.backend.cpu.winograd import (
    WINOGRAD_NAME,
    winograd_matrices,
    winograd_tile,
    winograd_weights,
)


def _direct_tile(d: np.ndarray, g: np.ndarray, m: int) -> np.ndarray:
    """The ``m x m`` outputs of a 3x3 correlation of one ``(m+2) x (m+2)`` input tile."""
    return np.array([[np.sum(d[y : y + 3, x : x + 3] * g) for x in range(m)] for y in range(m)])


@pytest.mark.parametrize("m", [2, 4])
def test_the_transforms_compute_a_correlation_tile(m):
    rng = np.random.default_rng(m)
    a, b, g_ = winograd_matrices(m)
    d = rng.standard_normal((m + 2, m + 2))
    g = rng.standard_normal((3, 3))
    winograd = a.T @ ((g_ @ g @ g_.T) * (b.T @ d @ b)) @ a
    np.testing.assert_allclose(winograd, _direct_tile(d, g, m), rtol=1e-12, atol=1e-12)


def test_transformed_weights_are_panels_of_channel_vectors():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 8, 3, 3)).astype("float32")
    u = winograd_weights(w, 4, 16)
    assert u.shape == (6, 6, 2, 8, 16) and u.dtype == np.float32
    _, _, g = winograd_matrices(4)
    f, c = 21, 5  # output channel 21: panel 1, lane 5
    np.testing.assert_allclose(u[:, :, 1, c, 5], g @ w[f, c] @ g.T, rtol=1e-6)


@pytest.mark.parametrize(
    "hw, expected",
    [((56, 56), 4), ((14, 14), 4), ((13, 13), 4), ((7, 7), 2), ((35, 17), 4), ((5, 5), None)],
)
def test_the_tile_is_the_largest_that_makes_enough_tiles(hw, expected):
    assert winograd_tile(*hw) == expected


def _chain(cin, cout, hw, stride=1, k=3):
    net = Builder(cin, hw)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            y = net.conv(net.x, cin, cout, 1)  # blocks its input
            y = net.conv(y, cout, cout, k, stride=stride)
            y = net.conv(y, cout, cout, 1)
            y = net.conv(y, cout, cout, 1)
            out = net.bb.emit_output(y)
        net.bb.emit_func_output(out)
    return net.bb.get()


@pytest.mark.parametrize(
    "stride, k, hw, winograd",
    [(1, 3, 16, True), (2, 3, 16, False), (1, 5, 16, False), (1, 3, 4, False)],
    ids=["3x3", "strided", "5x5", "too_few_tiles"],
)
def test_which_convolutions_become_winograd(stride, k, hw, winograd):
    mod = _chain(16, 32, hw, stride, k)
    x = np.random.default_rng(1).standard_normal((1, 16, hw, hw)).astype("float32")
    expected = tvm_reference(mod, x)
    assert np.mean(expected > 0) > 0.2
    for option in (True, False):
        ex, plan = tvm_rtask.compile_with_plan(
            mod, "llvm-native", cpu_layout="nchwc", cpu_winograd=option, num_veu=1
        )
        names = {name for p in plan.programs() for name in p.ops()}
        assert any(WINOGRAD_NAME in n for n in names) == (winograd and option), names
        assert any(NCHWC_NAME in n for n in names)
        got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
