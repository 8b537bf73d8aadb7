"""WinogradNCHWc: the Winograd convolution's schedule against TVM's build of the direct
convolution, how it splits the work into tasks, and what it leaves to other rules."""

import numpy as np
import pytest
from tvm import relax

from tests.backend.cpu.rules.common import NATIVE
from tests.backend.cpu.test_blocked_channels import Builder, blocked_alone
from tvm_rtask.backend.cpu.rules import WinogradNCHWc
from tvm_rtask.backend.cpu.rules.winograd_nchwc import MAX_ACC, MIN_TASKS, plan_tiles

CASES = {
    # name: (cin, cout, hw, padding): the tile size and the split each takes
    "f4_bands_56": (16, 32, 56, 1),  # 14 x 14 tiles of 4: bands of tile rows
    "f4_odd_map_35": (32, 48, 35, 1),  # 9 x 9 tiles, the last ones partly outside
    "f4_groups_14": (64, 128, 14, 1),  # 4 x 4 tiles: groups of output channels
    "f2_small_map_7": (64, 64, 7, 1),  # 7x7 in 2x2 tiles
    "f4_unpadded": (16, 16, 18, 0),  # a valid convolution: 16 x 16 outputs
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_winograd_schedule_matches_tvms_build(case):
    cin, cout, hw, padding = CASES[case]
    net = Builder(cin, hw)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            y = net.conv(net.x, cin, cin, 1)  # blocks the input
            w = net.rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)
            y = net.bb.emit(
                relax.op.nn.conv2d(y, relax.const(w.astype("float32")), padding=padding)
            )
            y = net.bb.emit(relax.op.add(y, relax.op.nn.relu(y)))  # an elementwise tail
            out = net.bb.emit_output(y)
        net.bb.emit_func_output(out)
    got, expected = blocked_alone(
        net.bb.get(), cin, hw, "WinogradNCHWc", part="winograd", winograd=True
    )
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize(
    "tiles, out_blocks, alpha, channels",
    [((14, 14), 4, 6, 64), ((4, 4), 16, 6, 256), ((4, 4), 32, 4, 512), ((9, 9), 3, 6, 32)],
)
def test_the_split_makes_enough_tasks_and_register_tiles_that_fit(
    tiles, out_blocks, alpha, channels
):
    band, group, cols, vectors = plan_tiles(*tiles, out_blocks, alpha, channels, 16)
    tiles_h, tiles_w = tiles
    assert tiles_h % band == 0 and out_blocks % group == 0
    assert (tiles_h // band) * (out_blocks // group) >= MIN_TASKS
    assert (band * tiles_w) % cols == 0 and group % vectors == 0
    assert cols * vectors <= MAX_ACC


def test_large_weights_on_small_maps_split_channels_not_rows():
    """512 -> 512 at 7x7 in F(2, 3): 17 MB of transformed weights; bands would each read all
    of them, groups read a share each."""
    band, group, _, _ = plan_tiles(4, 4, 32, 4, 512, 16)
    assert band == 4 and group < 32
    band, group, _, _ = plan_tiles(14, 14, 4, 6, 64, 16)  # 64 channels at 56x56: bands
    assert band < 14 and group == 4


def test_other_functions_are_left_to_the_next_rule():
    from tests.backend.cpu.rules.common import fused_func

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(x)))
        bb.emit_func_output(out)
    assert WinogradNCHWc().apply(fused_func(bb.get()), NATIVE, False) is None
