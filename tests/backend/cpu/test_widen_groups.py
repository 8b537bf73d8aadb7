"""WidenNarrowGroups: grouped convolutions of groups narrower than a vector as groups of one
vector with zero weights between them; the same sums, checked against numpy and against
TVM's build of the grouped module."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.backend.cpu.rules.common import LLVM, called_names
from tests.backend.cpu.test_blocked_channels import Builder, _conv_call, tvm_reference
from tvm_rtask.backend.cpu.blocked_channels import NCHWC_NAME, BlockedChannels
from tvm_rtask.backend.cpu.widen_groups import WidenNarrowGroups, widened_weight, widening
from tvm_rtask.relax_exprs import rewrite_functions


def _grouped_reference(x: np.ndarray, weight: np.ndarray, groups: int) -> np.ndarray:
    """A 1x1 grouped convolution in numpy: each group's channels against its own weights."""
    out_channels, width = weight.shape[:2]
    group_out = out_channels // groups
    out = np.empty((out_channels, *x.shape[1:]), dtype=np.float64)
    for g in range(groups):
        rows = slice(g * group_out, (g + 1) * group_out)
        out[rows] = np.einsum("oc,chw->ohw", weight[rows, :, 0, 0], x[g * width : (g + 1) * width])
    return out


@pytest.mark.parametrize("width", [2, 4, 8])
def test_the_widened_weight_computes_the_grouped_sums(width):
    rng = np.random.default_rng(0)
    channels, lanes = 32, 16
    groups = channels // width
    weight = rng.standard_normal((channels, width, 1, 1))
    x = rng.standard_normal((channels, 3, 3))
    wide = widened_weight(weight, groups, lanes)
    assert wide.shape == (channels, lanes, 1, 1)
    # a block-diagonal weight: each output channel's taps at its own group's channels only
    assert np.count_nonzero(wide) == np.count_nonzero(weight)
    np.testing.assert_allclose(
        _grouped_reference(x, wide, channels // lanes), _grouped_reference(x, weight, groups)
    )


@pytest.mark.parametrize(
    "cin, groups, expected",
    [
        (64, 8, 2),  # RegNet-Y's groups of 8
        (64, 16, 4),  # ResNeXt-50's first stage: groups of 4
        (64, 4, None),  # groups of 16 are whole vectors already
        (64, 64, None),  # depthwise
        (96, 4, None),  # groups of 24: no vector holds a whole number of them
        (40, 5, None),  # groups of 8 in 40 channels: not whole vectors
    ],
)
def test_widening_is_the_factor_of_the_work(cin, groups, expected):
    assert widening(_conv_call(cin, cin, 3, groups=groups), 16) == expected


def _grouped_chain(channels: int, groups: int, hw: int = 12):
    """1x1 -> grouped 3x3 -> 1x1 with a residual add from the first, relus between: the
    RegNet block."""
    net = Builder(channels, hw)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            a = net.conv(net.x, channels, channels, 1)
            y = net.conv(a, channels, channels, 3, groups=groups)
            y = net.conv(y, channels, channels, 1, relu=False)
            out = net.bb.emit_output(net.bb.emit(relax.op.nn.relu(relax.op.add(y, a))))
        net.bb.emit_func_output(out)
    return net.bb.get()


def _grouped_convs(mod) -> list[int]:
    groups = []
    relax.analysis.post_order_visit(
        mod["main"].body,
        lambda e: (
            groups.append(int(e.attrs.groups))
            if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.nn.conv2d"
            else None
        ),
    )
    return groups


def test_the_rewrite_keeps_the_outputs_of_tvms_build():
    mod = _grouped_chain(64, 16)  # groups of 4
    widened = rewrite_functions(mod, WidenNarrowGroups(mod, 16, max_widening=4))
    assert _grouped_convs(widened) == [1, 4, 1]
    x = np.random.default_rng(1).standard_normal((1, 64, 12, 12)).astype("float32")
    expected = tvm_reference(mod, x)
    assert np.mean(expected > 0) > 0.2 and np.abs(expected).max() > 0.5
    np.testing.assert_allclose(
        tvm_reference(widened, x), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max()
    )


def test_max_widening_bounds_the_rewrite_and_one_turns_it_off():
    mod = _grouped_chain(64, 16)  # groups of 4: 4 times the work
    assert _grouped_convs(rewrite_functions(mod, WidenNarrowGroups(mod, 16, 2))) == [1, 16, 1]
    narrow = BlockedChannels(16, 32, min_blocked_convs=1, max_widening=1)(_grouped_chain(64, 8))
    blocked = BlockedChannels(16, 32, min_blocked_convs=1)(_grouped_chain(64, 8))
    # the narrow groups' two layout changes, and the input's and output's: all left in NCHW
    assert _grouped_convs(narrow) == [1, 8, 1]
    assert _grouped_convs(blocked) == []  # widened to groups of 16 channels, then blocked
    names = called_names(blocked)
    assert sum(NCHWC_NAME in n for n in names) == 3, names


def test_a_model_left_in_nchw_keeps_its_narrow_groups():
    """Widening pays only in channel blocks: a model that stays in NCHW (here: too few
    convolutions to block) keeps the grouped convolution as it was."""
    mod = _grouped_chain(64, 8)
    out = BlockedChannels(16, 32)(mod)  # 3 convolutions < 4
    tvm.ir.assert_structural_equal(out, mod)


def test_the_widened_module_builds_for_plain_llvm_too():
    mod = _grouped_chain(32, 4)  # groups of 8
    widened = rewrite_functions(mod, WidenNarrowGroups(mod, 16))
    x = np.random.default_rng(2).standard_normal((1, 32, 12, 12)).astype("float32")
    got = relax.VirtualMachine(tvm.compile(widened, LLVM), tvm.cpu())["main"](
        tvm.runtime.tensor(x)
    ).numpy()
    np.testing.assert_allclose(got, tvm_reference(mod, x), rtol=1e-5, atol=1e-4)
