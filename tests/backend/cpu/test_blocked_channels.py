"""BlockedChannels and Conv2dPackedNCHW on ``conv2d_nchwc``: convolutions in channel blocks of
the vector width, the layout carried between them; numerics against TVM's own build of the
NCHW module."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask
from tests.backend.cpu.rules.common import LLVM, NATIVE, called_names
from tvm_rtask.backend.cpu.blocked_channels import (
    DEPTHWISE_NAME,
    NCHWC_NAME,
    BlockedChannels,
    blocked_layouts,
)
from tvm_rtask.backend.cpu.rules import RULE_ATTR, schedule_cpu_func
from tvm_rtask.backend.cpu.rules.base import vector_lanes, vector_registers
from tvm_rtask.errors import OptionError
from tvm_rtask.fallbacks import LAYOUT_KEPT, collecting_fallbacks
from tvm_rtask.relax_exprs import op_name
from tvm_rtask.relax_passes import prepare_pipeline

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})


class Builder:
    """A small NCHW network with constant weights that keep activations alive (scaled by
    fan-in, biases about half positive)."""

    def __init__(self, channels: int, hw: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.bb = relax.BlockBuilder()
        self.x = relax.Var("x", relax.TensorType((1, channels, hw, hw), "float32"))

    def conv(self, y, cin, cout, k, stride=1, groups=1, relu=True):
        w = self.rng.standard_normal((cout, cin // groups, k, k)) / np.sqrt(cin * k * k / groups)
        b = self.rng.standard_normal((1, cout, 1, 1)) * 0.3
        y = self.bb.emit(
            relax.op.nn.conv2d(
                y,
                relax.const(w.astype("float32")),
                strides=(stride, stride),
                padding=(k // 2, k // 2),
                groups=groups,
            )
        )
        y = self.bb.emit(relax.op.add(y, relax.const(b.astype("float32"))))
        return self.bb.emit(relax.op.nn.relu(y)) if relu else y


def _resnet_like(channels=32, hw=16, grouped=True):
    """A stem of 3 channels, max pool, a bottleneck with a strided downsampling 1x1, a
    residual join, a depthwise and a grouped convolution of 24-channel groups (stays NCHW),
    global mean and a dense layer."""
    net = Builder(3, hw * 2)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            y = net.conv(net.x, 3, channels, 3, stride=2)  # RGB stem: NCHW
            y = net.bb.emit(relax.op.nn.max_pool2d(y, pool_size=(3, 3), padding=(1, 1)))
            a = net.conv(y, channels, channels, 1)
            a = net.conv(a, channels, channels, 3, stride=2)
            a = net.conv(a, channels, 4 * channels, 1, relu=False)
            d = net.conv(y, channels, 4 * channels, 1, stride=2, relu=False)
            y = net.bb.emit(relax.op.nn.relu(relax.op.add(a, d)))
            y = net.conv(y, 4 * channels, 4 * channels, 3, groups=4 * channels)  # depthwise
            if grouped:  # stays in NCHW: 24-channel groups
                y = net.conv(y, 4 * channels, 3 * channels, 1)
                y = net.conv(y, 3 * channels, 3 * channels, 3, groups=4)
            y = net.conv(y, int(y.ty.shape[1]), 2 * channels, 1)
            y = net.bb.emit(relax.op.mean(y, axis=[2, 3]))
            w = net.rng.standard_normal((2 * channels, 10)) * 4 / np.sqrt(2 * channels)
            out = net.bb.emit_output(relax.op.matmul(y, relax.const(w.astype("float32"))))
        net.bb.emit_func_output(out)
    return net.bb.get(), (1, 3, hw * 2, hw * 2)


def tvm_reference(mod, x):
    ex = tvm.compile(mod, LLVM)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _conv_call(cin, cout, k, hw=14, groups=1):
    net = Builder(cin, hw)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            out = net.bb.emit_output(net.conv(net.x, cin, cout, k, groups=groups, relu=False))
        net.bb.emit_func_output(out)
    mod = net.bb.get()
    calls = []
    relax.analysis.post_order_visit(
        mod["main"].body,
        lambda e: (
            calls.append(e)
            if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.nn.conv2d"
            else None
        ),
    )
    return calls[0]


@pytest.mark.parametrize(
    "cin, cout, k, groups, expected",
    [
        (64, 128, 3, 1, ["NCHW16c", "OIHW32o", "NCHW16c"]),
        (256, 64, 1, 1, ["NCHW16c", "OIHW32o", "NCHW16c"]),
        (3, 64, 7, 1, ["NCHW", "OIHW32o", "NCHW16c"]),  # an RGB stem: its input stays NCHW
        (24, 64, 3, 1, ["NCHW", "OIHW32o", "NCHW16c"]),
        (144, 24, 1, 1, ["NCHW16c", "OIHW24o", "NCHW"]),  # to 24 channels: half vectors
        (64, 64, 3, 64, ["NCHW16c", "OIHW16o", "NCHW16c"]),  # depthwise
        (64, 64, 3, 4, ["NCHW16c", "OIHW16o", "NCHW16c"]),  # groups of one vector
        (128, 128, 3, 4, ["NCHW16c", "OIHW32o", "NCHW16c"]),  # of two: a panel each
        (64, 64, 3, 8, None),  # groups of 8 channels: widened first (test_widen_groups)
        (96, 96, 3, 4, None),  # of 24: a vector would straddle two groups
        (24, 40, 1, 1, None),  # neither side in whole vectors
    ],
)
def test_blocked_layouts_takes_the_convolutions_the_rule_can_schedule(
    cin, cout, k, groups, expected
):
    assert blocked_layouts(_conv_call(cin, cout, k, groups=groups), 16, 32) == expected


def test_the_pass_blocks_the_convolutions_and_keeps_the_others_in_nchw():
    mod, _ = _resnet_like()
    blocked = prepare_pipeline(target_passes=[BlockedChannels(16, 32, max_layout_changes=4)])(mod)
    names = called_names(blocked)
    assert sum(NCHWC_NAME in n for n in names) >= 4  # the bottleneck's and the last 1x1
    assert any(DEPTHWISE_NAME in n for n in names)
    assert any("conv2d" in n and "nchwc" not in n for n in names)  # stem, grouped
    assert any("layout_transform" in n for n in names)


def test_a_model_with_more_layout_changes_than_allowed_stays_in_nchw():
    """The grouped convolution keeps NCHW inside the blocked part: a change of layout of its
    6144-element input and one of its output, against one allowed (the channel vector
    before the dense layer is too small to count)."""
    mod, _ = _resnet_like()
    blocked = BlockedChannels(16, 32, max_layout_changes=1)
    with collecting_fallbacks() as notes:
        names = called_names(prepare_pipeline(target_passes=[blocked])(mod))
    assert not any("nchwc" in n or "layout_transform" in n for n in names)
    (note,) = notes  # the fallback is said: the model could have been blocked
    assert note["kind"] == LAYOUT_KEPT and "at most 1 pay off" in note["reason"]
    allowed = BlockedChannels(16, 32, max_layout_changes=2)
    assert any("nchwc" in n for n in called_names(prepare_pipeline(target_passes=[allowed])(mod)))


@pytest.mark.parametrize("policy", ["sequential", "wavefront"])
@pytest.mark.parametrize("target", [NATIVE, AVX512], ids=["native", "avx512"])
def test_a_blocked_model_matches_tvms_build(policy, target):
    if target is AVX512 and "avx512f" not in _host_features():
        pytest.skip("AVX-512 code does not run on this CPU")
    mod, shape = _resnet_like(grouped=False)
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    expected = tvm_reference(mod, x)
    assert np.abs(expected).max() > 0.5 and np.std(expected) > 0.1
    ex, plan = tvm_rtask.compile_with_plan(mod, target, policy=policy, cpu_layout="nchwc")
    names = {k for p in plan.programs() for k in p.ops()}
    assert any(NCHWC_NAME in n for n in names), names
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def _host_features() -> set[str]:
    from tvm.target import codegen

    return {str(f) for f in codegen.llvm_get_cpu_features(NATIVE)}


CASES = {
    # name: (cin, cout, hw, k, stride): which schedule of the rule each takes
    "3x3_k_blocked_14": (64, 64, 14, 3, 1),
    "3x3_s2_k_blocked": (32, 64, 28, 3, 2),
    "3x3_rows_of_17": (32, 32, 17, 3, 1),  # no whole tiles: row by row, last tile shifted
    "1x1_k_blocked_7": (256, 128, 7, 1, 1),
    "1x1_pixel_parallel_28": (64, 256, 28, 1, 1),
    "1x1_s2_pixel_parallel": (64, 128, 28, 1, 2),
    "1x1_one_panel_56": (64, 64, 56, 1, 1),
    "1x1_17x17_panels_in_parallel": (64, 192, 17, 1, 1),  # 289 pixels: no tile divides
    "3x3_s2_rgb_stem_to_blocks": (3, 32, 32, 3, 2),  # input NCHW, output blocked
    "1x1_blocks_to_24_channels": (144, 24, 14, 1, 1),  # input blocked, output NCHW
    # grouped (cin, cout, hw, k, stride, groups): a panel reads its own group's blocks
    "grouped_3x3_k_blocked_14": (160, 160, 14, 3, 1, 10),
    "grouped_3x3_s2": (64, 64, 28, 3, 2, 4),
    "grouped_3x3_rows_of_17": (64, 64, 17, 3, 1, 2),  # 32-channel groups, row by row
    "grouped_3x3_panels_of_two_vectors": (128, 128, 8, 3, 1, 4),
    "grouped_widened_from_8": (64, 64, 14, 3, 1, 8),  # zeros between the groups
    "grouped_widened_from_4": (64, 64, 14, 3, 2, 16),
}


def blocked_alone(mod, cin, hw, rule, part="nchwc", winograd=False):
    """``mod`` prepared with the pass told to block even one convolution (3x3 ones as
    Winograd convolutions with ``winograd``), its one operator named ``part`` scheduled for
    this CPU by ``rule``, in TVM's own build; its output and that of TVM's build of
    ``mod``."""
    lanes, registers = vector_lanes(NATIVE), vector_registers(NATIVE)
    blocked = BlockedChannels(
        lanes, registers, max_layout_changes=4, min_blocked_convs=1, winograd=winograd
    )
    prepared = prepare_pipeline(target_passes=[blocked])(mod)
    (gvar,) = [g for g in prepared.get_global_vars() if part in g.name_hint]
    if part != "nchwc":
        assert len(prepared[gvar].params[0].ty.shape) == 5  # it runs in channel blocks
    scheduled = schedule_cpu_func(prepared[gvar], NATIVE)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == rule
    prepared[gvar] = scheduled
    x = np.random.default_rng(1).standard_normal((1, cin, hw, hw)).astype("float32")
    expected = tvm_reference(mod, x)
    assert np.mean(expected > 0) > 0.2 and np.abs(expected).max() > 0.5
    ex = tvm.compile(prepared, NATIVE)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    return got, expected


@pytest.mark.parametrize("case", list(CASES))
def test_each_nchwc_schedule_matches_tvms_build_and_is_the_rules(case):
    cin, cout, hw, k, stride, *groups = CASES[case]
    net = Builder(cin, hw)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            y = net.conv(net.x, cin, cout, k, stride=stride, groups=groups[0] if groups else 1)
            y = net.bb.emit(relax.op.add(y, relax.op.nn.relu(y)))  # an elementwise tail
            out = net.bb.emit_output(y)
        net.bb.emit_func_output(out)
    got, expected = blocked_alone(net.bb.get(), cin, hw, "Conv2dPackedNCHW")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_cpu_layout_is_checked():
    mod, _ = _resnet_like()
    with pytest.raises(OptionError, match="cpu_layout"):
        tvm_rtask.compile(mod, "llvm", cpu_layout="nhwc")


def test_a_model_tvm_cannot_convert_stays_in_nchw_with_a_fallback_noted(monkeypatch, caplog):
    def refuse(*_args):
        def fail(_mod):
            raise tvm.error.InternalError("Layouts must have the same size")

        return fail

    monkeypatch.setattr(relax.transform, "ConvertLayout", refuse)
    mod, _ = _resnet_like()
    with collecting_fallbacks() as notes, caplog.at_level("INFO", logger="tvm_rtask"):
        out = BlockedChannels(16, 32)(mod)
    tvm.ir.assert_structural_equal(out, mod)
    (note,) = notes
    assert note["kind"] == LAYOUT_KEPT and "stays in NCHW" in note["reason"]
    assert "Layouts must have the same size" in note["reason"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{note['kind']} for {note['subject']}: {note['reason']}"
    ]


def _onnx_relu6_chain():
    """An ONNX MobileNet-like chain: 1x1, Clip(0, 6), depthwise 3x3, Clip, 1x1 to 24
    channels; TVM's importer writes each Clip as ``call_tir`` of a max / min."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name, shape):
        fan = int(np.prod(shape[1:]))
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * 2 / np.sqrt(fan)).astype("float32"), name
        )

    inits = [
        weight("w1", (64, 32, 1, 1)),
        weight("w2", (64, 1, 3, 3)),
        weight("w3", (24, 64, 1, 1)),
        numpy_helper.from_array(np.array(0.0, "float32"), "lo"),
        numpy_helper.from_array(np.array(6.0, "float32"), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]),
        helper.make_node("Clip", ["a", "lo", "hi"], ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["c"], group=64, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["d"]),
        helper.make_node("Conv", ["d", "w3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "relu6_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 14, 14])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_clip_keeps_the_blocked_layout_and_matches():
    mod = tvm_rtask.frontend.load(_onnx_relu6_chain())
    blocked = BlockedChannels(16, 32, min_blocked_convs=1)(mod)
    data_transforms = []

    def visit(expr):
        if op_name(expr) == "relax.layout_transform" and not isinstance(
            expr.args[0], tvm.ir.expr.Constant
        ):
            data_transforms.append(expr)

    relax.analysis.post_order_visit(blocked["main"].body, visit)
    # into blocks before the first convolution; none after the last (it writes NCHW)
    assert len(data_transforms) == 1
    lanes, registers = vector_lanes(NATIVE), vector_registers(NATIVE)
    prepared = prepare_pipeline(
        target_passes=[BlockedChannels(lanes, registers, min_blocked_convs=1)]
    )(mod)
    x = np.random.default_rng(1).standard_normal((1, 32, 14, 14)).astype("float32")
    expected = tvm_reference(mod, x)
    assert np.mean(expected > 0) > 0.2 and np.abs(expected).max() > 0.5
    ex = tvm.compile(prepared, NATIVE)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_k_blocked_write_back_and_padding_leave_llvm_nothing_to_copy():
    """A K-blocked convolution (channel blocks of 16, AVX-512): its write-back runs over the
    band's pixels as one loop (a loop of rows around a loop of columns was unrolled whole by
    LLVM, hundreds of vector stores), and the padding copy is a vector per pixel."""
    net = Builder(64, 14)
    with net.bb.function("main", [net.x]):
        with net.bb.dataflow():
            out = net.bb.emit_output(net.conv(net.x, 64, 64, 3))
        net.bb.emit_func_output(out)
    blocked = BlockedChannels(16, 32, max_layout_changes=4, min_blocked_convs=1, winograd=False)
    prepared = prepare_pipeline(target_passes=[blocked])(net.bb.get())
    (gvar,) = [g for g in prepared.get_global_vars() if NCHWC_NAME in g.name_hint]
    scheduled = schedule_cpu_func(prepared[gvar], AVX512)
    assert str(scheduled.attrs[RULE_ATTR]) == "Conv2dPackedNCHW"
    sch = tvm.s_tir.Schedule(scheduled)
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert any("_rf" in n for n in names), names  # the K-blocked schedule
    pads = [n for n in names if n.startswith("pad")]
    (write_back,) = [n for n in names if n.endswith("_local")]
    assert pads
    for name in pads:
        innermost = sch.get(sch.get_loops(sch.get_sblock(name))[-1])
        assert innermost.kind == tvm.tirx.ForKind.VECTORIZED and int(innermost.extent) == 16
    *_, pixels, vectors, lanes = [sch.get(r) for r in sch.get_loops(sch.get_sblock(write_back))]
    assert lanes.kind == tvm.tirx.ForKind.VECTORIZED and vectors.kind == tvm.tirx.ForKind.UNROLLED
    assert pixels.kind == tvm.tirx.ForKind.SERIAL
    assert int(pixels.extent) % 14 == 0 and int(pixels.extent) > 14, pixels.extent


def test_kept_because_blocks_nothing_and_says_why():
    mod, _ = _resnet_like()
    with collecting_fallbacks() as notes:
        kept = prepare_pipeline(target_passes=[BlockedChannels(8, 16, kept_because="a test")])(mod)
    assert not any("nchwc" in n or "layout_transform" in n for n in called_names(kept))
    (note,) = notes
    assert note["kind"] == LAYOUT_KEPT and note["reason"].endswith("NCHW8c: a test")


@pytest.mark.parametrize("mcpu, noted", [("haswell", True), ("skylake-avx512", False)])
def test_the_report_says_when_auto_keeps_nchw(mcpu, noted):
    """``cpu_layout="auto"`` on AVX2 leaves the model in NCHW and the plan's report says so;
    on AVX-512 it blocks, with nothing to say."""
    mod, _ = _resnet_like()
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    report = tvm_rtask.plan(mod, target, num_veu=2).report()
    kept = [f for f in report["fallbacks"] if "cpu_layout='auto' keeps NCHW" in f["reason"]]
    assert bool(kept) == noted
