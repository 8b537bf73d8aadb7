"""PackConvWeights and Conv2dPackedNCHW: constant convolution weights as output-channel
panels, scheduled with vectors along the channels; numerics against TVM's own build of the
unpacked convolution."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask
from tests.backend.cpu.rules.common import (
    LLVM,
    NATIVE,
    assert_close,
    called_names,
    fused_func,
    run,
)
from tvm_rtask.backend.cpu.pack_conv_weights import (
    PACKED_NAME,
    PackConvWeights,
    blocked_panel,
    channel_panel,
    pack_weight,
    packs_pointwise,
    pointwise_panel,
    single_pixel,
    single_pixel_panel,
)
from tvm_rtask.backend.cpu.rules import RULE_ATTR, Conv2dPackedNCHW, schedule_cpu_func
from tvm_rtask.backend.cpu.rules.base import vector_lanes, vector_registers
from tvm_rtask.backend.cpu.rules.conv2d_packed import (
    band_rows,
    blocked_columns,
    k_block,
    pixel_tile,
)
from tvm_rtask.backend.cpu.tuned import outer_parallel_extent


def _module(cin, cout, hw, kernel, stride=(1, 1), pad=(0, 0), dilation=(1, 1), groups=1):
    """conv2d with a constant weight + bias + relu; the bias keeps about half of the
    outputs positive, so a wrong convolution cannot hide behind zeros."""
    rng = np.random.default_rng(0)
    kh, kw = kernel
    weight = rng.standard_normal((cout, cin // groups, kh, kw)) / np.sqrt(cin * kh * kw / groups)
    bias = rng.standard_normal((1, cout, 1, 1)) * 0.5
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, cin, *hw), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x,
                    relax.const(weight.astype("float32")),
                    strides=stride,
                    padding=pad,
                    dilation=dilation,
                    groups=groups,
                )
            )
            y = bb.emit(relax.op.add(y, relax.const(bias.astype("float32"))))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


# the AVX-512 machine the K-blocked shapes were chosen on (16 lanes, 32 registers), named so
# that the structural tests below schedule the same on any host
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})


def _packed_func(mod, target):
    """The fused PrimFunc of ``mod`` after PackConvWeights for ``target``."""
    return fused_func(PackConvWeights(vector_lanes(target), vector_registers(target))(mod))


def _reference(mod, x):
    """TVM's own build of the unpacked module."""
    ex = tvm.compile(mod, LLVM)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_pack_weight_puts_each_panel_contiguous():
    weight = np.arange(8 * 3 * 2 * 2, dtype="float32").reshape(8, 3, 2, 2)
    packed = pack_weight(weight, 4)
    assert packed.shape == (2, 3, 2, 2, 4) and packed.flags["C_CONTIGUOUS"]
    for f in range(8):
        assert np.array_equal(packed[f // 4, :, :, :, f % 4], weight[f])


@pytest.mark.parametrize(
    "channels, lanes, registers, width",
    [
        (384, 16, 32, 64),  # AVX-512: up to four vectors
        (96, 16, 32, 32),
        (80, 16, 32, 16),
        (144, 16, 32, 48),  # three vectors where only one would divide otherwise
        (288, 16, 32, 32),  # two before three
        (144, 8, 16, 16),  # AVX2: no room for three
        (384, 8, 16, 16),  # AVX2: at most two vectors, room for the columns
        (24, 8, 16, 8),
        (1000, 16, 32, None),
    ],
)
def test_channel_panel_is_the_first_that_divides_within_the_registers(
    channels, lanes, registers, width
):
    assert channel_panel(channels, lanes, registers) == width


@pytest.mark.parametrize("vectors, registers", [(4, 32), (2, 32), (1, 32), (2, 16), (1, 16)])
@pytest.mark.parametrize("width", [1, 5, 17, 35, 147])
def test_pixel_tile_fits_the_registers_and_the_row(vectors, registers, width):
    cols = pixel_tile(width, vectors, registers, acc_vectors=20, max_cols=8)
    assert 1 <= cols <= min(width, 8)
    assert cols * vectors + vectors + 1 <= registers


def test_spatial_convolutions_become_packed_calls_and_the_others_stay():
    lanes, registers = 16, 32
    packed = PackConvWeights(lanes, registers)(_module(16, 32, (9, 9), (3, 3), pad=(1, 1)))
    assert PACKED_NAME in called_names(packed) and "relax.nn.conv2d" not in called_names(packed)
    for kept in (
        _module(16, 32, (12, 12), (1, 1)),  # 1x1 on 144 pixels: a GEMM for Conv2dNCHW
        _module(16, 48, (7, 7), (1, 1)),  # 1x1 whose panels cannot be an even count
        _module(3, 32, (17, 17), (3, 3), stride=(2, 2), pad=(1, 1)),  # an RGB stem
        _module(16, 32, (9, 9), (3, 3), groups=2),  # grouped
        _module(16, 24, (9, 9), (3, 3)),  # channels not a multiple of the lanes
    ):
        assert "relax.nn.conv2d" in called_names(PackConvWeights(lanes, registers)(kept))


CASES = {
    # name: (cin, cout, (h, w), kernel, stride, pad (top, left, bottom, right), dilation)
    "3x3_pad1_17": (16, 32, (17, 17), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "3x3_s2_valid": (24, 64, (35, 35), (3, 3), (2, 2), (0, 0, 0, 0), (1, 1)),
    "1x7": (16, 32, (17, 17), (1, 7), (1, 1), (0, 3, 0, 3), (1, 1)),
    "7x1": (16, 32, (17, 17), (7, 1), (1, 1), (3, 0, 3, 0), (1, 1)),
    "5x5_pad2": (8, 16, (13, 11), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    "3x3_dilated": (8, 16, (15, 15), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
    "3x3_narrow": (8, 64, (5, 3), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # row < a tile
    "3x3_asymmetric_pad": (8, 16, (16, 16), (3, 3), (2, 2), (0, 0, 1, 1), (1, 1)),
    "3x3_three_vector_panel": (8, 144, (9, 9), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    # 1x1 on small maps: pixels flattened into one axis (the last tile shifted back)
    "1x1_7x7": (64, 128, (7, 7), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    "1x1_s2_to_7x7": (32, 96, (13, 13), (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),
    # K-blocked (rows of whole tiles): 64 input channels in blocks of 8, bands of rows
    "3x3_7x7_k_blocked": (64, 64, (7, 7), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "3x3_s2_to_7x7_k_blocked": (32, 64, (14, 14), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    "3x3_28x28_bands_of_two": (16, 32, (28, 28), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "5x5_35x35_k_blocked": (16, 32, (35, 35), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    "1x3_8x8_k_blocked": (24, 32, (8, 8), (1, 3), (1, 1), (0, 1, 0, 1), (1, 1)),
    "1x1_8x8_k_blocked": (128, 256, (8, 8), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
}


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
@pytest.mark.parametrize("case", list(CASES))
def test_packed_convolution_matches_tvms_build(case, target):
    cin, cout, hw, kernel, stride, pad, dilation = CASES[case]
    mod = _module(cin, cout, hw, kernel, stride, pad, dilation)
    func = _packed_func(mod, target)
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "Conv2dPackedNCHW"
    x = np.random.default_rng(1).standard_normal((1, cin, *hw)).astype("float32")
    expected = _reference(mod, x)
    # the comparison means something: a good share of the outputs alive and large
    assert np.mean(expected > 0) > 0.2 and np.abs(expected).max() > 0.5
    weights = [p for p in func.params[1:-1]]
    args = [x]
    # the fused PrimFunc's constants: the packed weight and the bias, as the pass made them
    packed = PackConvWeights(vector_lanes(target), vector_registers(target))(mod)
    consts = []

    def visit(expr):
        if isinstance(expr, tvm.ir.expr.Constant) and hasattr(expr.value, "numpy"):
            consts.append(expr.value.numpy())

    relax.analysis.post_order_visit(packed["main"].body, visit)
    by_rank = {c.ndim: c for c in consts}
    args += [by_rank[len(w.ty.shape)] for w in weights]
    args.append(np.zeros(expected.shape, "float32"))
    assert_close(run(scheduled, args, target), expected)


def test_panels_narrower_than_the_vectors_are_scheduled_with_their_width():
    """Weights packed for AVX2 (8-channel panels), scheduled for a wider CPU: one vector of
    eight lanes a panel, not a convolution left unscheduled."""
    packed = PackConvWeights(8, 16)(_module(8, 24, (11, 11), (5, 5), pad=(2, 2)))
    func = fused_func(packed)
    assert Conv2dPackedNCHW().apply(func, NATIVE, False) is not None


def test_the_rule_leaves_unpacked_convolutions_to_the_next_rule():
    func = fused_func(_module(16, 32, (9, 9), (3, 3), pad=(1, 1)))
    assert Conv2dPackedNCHW().apply(func, NATIVE, False) is None
    assert str(schedule_cpu_func(func, NATIVE).attrs[RULE_ATTR]) == "Conv2dNCHW"


@pytest.mark.parametrize("policy", ["sequential", "wavefront"])
def test_compiled_model_with_packed_convolutions_matches_tvm(policy):
    """Two packed convolutions and a 1x1 one through the whole pipeline (cut into rTasks
    along the rule's parallel loop), against TVM's build."""
    rng = np.random.default_rng(2)

    def const(*shape, scale=1.0):
        return relax.const((rng.standard_normal(shape) * scale).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 19, 19), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, const(32, 8, 3, 3, scale=0.3), padding=(1, 1)))
            a = bb.emit(relax.op.nn.relu(relax.op.add(a, const(1, 32, 1, 1))))
            b = bb.emit(relax.op.nn.conv2d(a, const(32, 32, 1, 7, scale=0.1), padding=(0, 3)))
            c = bb.emit(relax.op.nn.conv2d(a, const(16, 32, 1, 1, scale=0.2)))
            b = bb.emit(relax.op.nn.relu(relax.op.add(b, const(1, 32, 1, 1))))
            out = bb.emit_output(relax.op.concat([b, c], axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    data = rng.standard_normal((1, 8, 19, 19)).astype("float32")
    expected = _reference(mod, data)
    assert np.mean(expected > 0) > 0.2
    ex = tvm_rtask.compile(mod, "llvm-native", policy=policy, db=False)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    assert_close(got, expected)


def test_small_maps_send_their_1x1_convolutions_to_the_panels():
    # 49 pixels: the GEMM's tiles of four vectors compute 64; 64 pixels: none wasted; 196:
    # measured slower in the models as panels (DenseNet-121's 14x14 layers)
    assert packs_pointwise(49, 16) and packs_pointwise(81, 16)
    assert not packs_pointwise(64, 16) and not packs_pointwise(196, 16)
    assert packs_pointwise(49, 8) and not packs_pointwise(96, 8)


@pytest.mark.parametrize(
    "channels, width",
    [(2048, 64), (192, 32), (320, 32), (64, 32), (96, 48), (160, 16), (48, None), (24, None)],
)
def test_pointwise_panels_come_in_even_counts(channels, width):
    assert pointwise_panel(channels, 16, 32) == width


@pytest.mark.parametrize(
    "channels, lanes, registers, expected",
    [
        (144, 16, 32, (48, 144)),  # three panels: an odd count is fine on one pixel
        (64, 16, 32, (64, 64)),
        (72, 16, 32, (16, 80)),  # no panel divides: one vector, zero channels to 80
        (40, 16, 32, (16, 48)),
        (8, 16, 32, (16, 16)),
        (72, 8, 16, (8, 72)),  # AVX2: one vector divides
    ],
)
def test_single_pixel_panels_pad_the_channels_where_no_panel_divides(
    channels, lanes, registers, expected
):
    assert single_pixel_panel(channels, lanes, registers) == expected


def test_single_pixel_is_a_1x1_convolution_with_one_output_pixel():
    attrs = _module(16, 8, (1, 1), (1, 1))["main"].body.blocks[0].bindings[0].value.attrs
    assert single_pixel((8, 16, 1, 1), (1, 16, 1, 1), attrs, [0, 0, 0, 0])
    assert not single_pixel((8, 16, 1, 1), (1, 16, 2, 1), attrs, [0, 0, 0, 0])
    assert not single_pixel((8, 16, 3, 3), (1, 16, 1, 1), attrs, [1, 1, 1, 1])


@pytest.mark.parametrize("cin, cout", [(576, 144), (288, 72), (144, 40), (16, 8)])
def test_squeeze_and_excitation_convolutions_are_packed_and_match_tvm(cin, cout):
    """1x1 convolutions on a one-pixel map (MobileNet v3's squeeze and excitation) become
    packed calls, their channels padded with zero weights where no panel divides them and
    sliced back; the compiled model against TVM's build, the relu keeping half the outputs."""
    mod = _module(cin, cout, (1, 1), (1, 1))
    lanes, registers = vector_lanes(NATIVE), vector_registers(NATIVE)
    packed = PackConvWeights(lanes, registers)(mod)
    names = called_names(packed)
    assert PACKED_NAME in names and "relax.nn.conv2d" not in names
    width, padded = single_pixel_panel(cout, lanes, registers)
    assert ("relax.strided_slice" in names) == (padded != cout)
    x = np.random.default_rng(3).standard_normal((1, cin, 1, 1)).astype("float32")
    expected = _reference(mod, x)
    assert np.mean(expected > 0) > 0.2 and np.abs(expected).max() > 0.5
    ex = tvm_rtask.compile(mod, "llvm-native", db=False)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert_close(got, expected)


def test_packed_pointwise_convolutions_run_their_panels_in_parallel():
    """A 1x1 packed convolution: the panels are the parallel loop and the pixels one axis."""
    func = _packed_func(_module(64, 128, (7, 7), (1, 1)), NATIVE)
    scheduled = schedule_cpu_func(func, NATIVE)
    assert str(scheduled.attrs[RULE_ATTR]) == "Conv2dPackedNCHW"
    # 128 channels in panels (of 64 with AVX-512, 16 with AVX2): a parallel rTask each,
    # each over all 49 pixels
    panel = pointwise_panel(128, vector_lanes(NATIVE), vector_registers(NATIVE))
    assert outer_parallel_extent(scheduled.with_attr("global_symbol", "main")) == 128 // panel


@pytest.mark.parametrize("width, cols", [(56, 4), (28, 4), (112, 4), (14, 5), (7, 4)])
def test_pixel_tile_takes_a_dividing_tile_once_the_fmas_set_the_pace(width, cols):
    # four vectors x four columns already issue two FMAs a load: five columns would gain
    # nothing on the FMA units and compute 60 columns for 56 (measured 4-17% slower)
    assert pixel_tile(width, 4, 32, acc_vectors=20, max_cols=8) == cols


@pytest.mark.parametrize("k_blocking", [True, False])
def test_rows_of_whole_tiles_are_blocked_over_the_input_channels(k_blocking):
    """512 -> 512 3x3 at 7x7 (ResNet's last stage): two-vector panels, a register tile of
    seven columns (the row), one band of all seven rows a task, and the register tile's
    partial sums (the ``rfactor`` block) added into the band's accumulators; without the
    switch, the row-by-row schedule."""
    func = _packed_func(_module(512, 512, (7, 7), (3, 3), pad=(1, 1)), AVX512)
    assert len(func.params[1].ty.shape) == 5 and int(func.params[1].ty.shape[4]) == 32
    scheduled = Conv2dPackedNCHW(k_blocking=k_blocking).apply(func, AVX512, False)
    scheduled = scheduled if isinstance(scheduled, tvm.tirx.PrimFunc) else scheduled.mod["main"]
    rfactor = 'sblock("conv2d_packed_rf_update")' in scheduled.script()
    extent = outer_parallel_extent(scheduled.with_attr("global_symbol", "main"))
    if k_blocking:
        assert rfactor
        assert extent == 512 // 32  # a panel a task, all rows in one band
    else:
        assert not rfactor
        assert extent == 512 // 32 * 7  # a panel and a row a task


@pytest.mark.parametrize(
    "width, vectors, registers, cols",
    [
        (7, 2, 32, 7),
        (14, 2, 32, 7),
        (56, 2, 32, 8),
        (35, 2, 32, 7),
        (8, 2, 32, 8),
        (7, 3, 32, 7),
        (56, 3, 32, 7),
        (7, 4, 32, None),
        (17, 2, 32, None),
        (147, 2, 32, None),
        (7, 2, 16, None),
        (12, 2, 16, 6),
    ],
)
def test_blocked_columns_divide_the_row_within_the_registers(width, vectors, registers, cols):
    assert blocked_columns(width, vectors, registers) == cols


@pytest.mark.parametrize(
    "height, width, panels, band",
    [
        (7, 7, 16, 7),
        (14, 14, 8, 14),
        (14, 14, 4, 7),
        (28, 28, 1, 2),
        (56, 56, 2, 2),
        (7, 7, 1, 1),
        (35, 35, 3, 5),
    ],
)
def test_bands_hold_few_pixels_and_leave_tasks_for_every_veu(height, width, panels, band):
    assert band_rows(height, width, panels) == band


def test_k_blocks_keep_the_weights_of_a_block_small():
    # 3x3, 32-channel panels: 1152 bytes an input channel, 16 KB at most: 8 of 512
    assert k_block(512, 9, 32) == 8 and k_block(96, 9, 32) == 12 and k_block(3, 49, 64) == 1


def test_1x1_convolutions_are_blocked_on_small_maps_with_many_channels():
    def packed_width(cin, cout, hw, stride=(1, 1)):
        shape = (
            _packed_func(_module(cin, cout, hw, (1, 1), stride=stride), AVX512).params[1].ty.shape
        )
        return int(shape[4]) if len(shape) == 5 else None

    assert packed_width(1024, 256, (14, 14)) == 32  # ResNet-50's third stage
    assert packed_width(1024, 2048, (14, 14), stride=(2, 2)) == 32  # to 7x7
    assert packed_width(384, 64, (14, 14)) is None  # few output channels: the GEMM
    assert packed_width(96, 576, (14, 14)) is None  # few input channels: the GEMM
    assert packed_width(128, 512, (28, 28)) is None  # 784 pixels: the GEMM
    assert packed_width(64, 128, (7, 7)) == 64  # few input channels: flat panels


def test_convolutions_the_rule_blocks_get_the_panels_with_the_most_fmas_a_load():
    assert blocked_panel(512, 7, 16, 32) == 32  # 2 x 7: four-vector panels fit no 7 columns
    assert blocked_panel(384, 7, 16, 32) == 48  # 3 x 7 makes 2.1 FMAs a load, 2 x 7 1.56
    assert blocked_panel(192, 56, 16, 32) == 48  # 3 x 7 against 2 x 8
    assert blocked_panel(384, 8, 16, 32) == 32  # 3 x 4 (1.71) is not 10% above 2 x 8 (1.6)
    assert blocked_panel(512, 17, 16, 32) is None  # rows of 17: the row-by-row schedule
    assert blocked_panel(208, 14, 16, 32) is None  # 13 vectors: neither divides
    assert channel_panel(512, 16, 32) == 64
