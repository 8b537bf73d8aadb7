"""Conv2dNCHW: numerics equal to TVM's unscheduled build (tails, overlapped last tiles,
flattened 1x1 convolutions, strides, padding, row tiles), the shape the rKernel cutter
needs, and whole light models against ONNX Runtime with the rules on."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.backend.cpu.rules.common import (
    HASWELL,
    LLVM,
    NATIVE,
    assert_close,
    conv_module,
    fused_func,
    random_args,
    run,
    stack_reloads,
)
from tvm_rtask.backend.cpu.kernel import CHUNK_ANNOTATION
from tvm_rtask.backend.cpu.rules import (
    RULE_ATTR,
    Conv2dNCHW,
    Pool2dNCHW,
    is_rule_scheduled,
    rules_enabled,
    schedule_cpu_func,
    vector_lanes,
)
from tvm_rtask.backend.cpu.rules.base import narrow_last_tile, overlap_last_tile
from tvm_rtask.backend.cpu.rules.conv2d_nchw import _parallel_pixel_tile, register_tile, width_tile
from tvm_rtask.backend.cpu.tuned import (
    chunk_count,
    is_tuned,
    make_tuned_cpu_rkernel,
    outer_parallel_extent,
)
from tvm_rtask.relax_passes import prepare_pipeline

CASES = {
    # name: (cin, cout, size, kernel, stride, pad)
    "pointwise_13": (32, 24, 13, 1, 1, 0),  # 1x1: one pixel axis of 169, last tile shifted
    "pointwise_55": (16, 16, 55, 1, 1, 0),  # 3025 pixels
    "pointwise_56": (8, 16, 56, 1, 1, 0),  # whole vectors, no shift
    "3x3_pad1_27": (16, 32, 27, 3, 1, 1),  # padding rows per row tile; 27 = 16 + 11 shifted
    "3x3_pad1_14": (8, 12, 14, 3, 1, 1),  # 12 channels: channel block 6 or 4, rows 2
    "3x3_tail": (4, 8, 43, 3, 1, 0),  # 41 columns (prime) and rows
    "3x3_s2": (3, 16, 33, 3, 2, 0),  # strided columns, 16 of them
    "3x3_s2_tail": (3, 8, 47, 3, 2, 0),  # strided, 23 columns: the last vector shifted
    "7x7_s2_pad3": (3, 8, 32, 7, 2, 3),  # Inception's stem
    "5x5_pad2_odd_cout": (4, 6, 9, 5, 1, 2),  # 6 channels, 9 columns: narrower than a vector
    # strided rows narrower than a vector, read from the de-interleaved copy (ResNet-50's
    # 1x1/2 and 3x3/2 convolutions at 14 and 7 columns ran unscheduled)
    "1x1_s2_narrow": (64, 16, 14, 1, 2, 0),  # 7 columns, 64 MACs each
    "3x3_s2_pad1_narrow": (16, 8, 28, 3, 2, 1),  # 14 columns, padded and de-interleaved
    "3x3_pad1_7": (32, 16, 7, 3, 1, 1),  # rows narrower than a vector: 7 rows a tile
}
NATIVE_CASES = (
    "pointwise_13",
    "3x3_pad1_27",
    "3x3_s2_tail",
    "5x5_pad2_odd_cout",
    "1x1_s2_narrow",
    "3x3_pad1_7",
)


def _check(case, target):
    func = fused_func(conv_module(*CASES[case]))
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None, "the rule should match a direct NCHW convolution"
    assert str(scheduled.attrs[RULE_ATTR]) == "Conv2dNCHW" and is_rule_scheduled(scheduled)
    assert not is_tuned(scheduled)  # TUNED_ATTR means "from a tuning database"
    assert outer_parallel_extent(scheduled) > 1
    args = random_args(func)
    assert_close(run(scheduled, args, target), run(func, args, target))
    return scheduled


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_unscheduled_build(case):
    _check(case, LLVM)


@pytest.mark.parametrize("case", NATIVE_CASES)
def test_rule_matches_unscheduled_build_on_this_cpu(case):
    _check(case, NATIVE)


def test_rule_shapes():
    """The tiles the rule chooses: 1x1 convolutions on one pixel axis, no predicated tails,
    shifted last tiles, register tiles of channels x rows."""
    flat = _check("pointwise_13", LLVM).script()
    assert "T.min(" in flat and "T.where" not in flat  # 169 pixels: last tile shifted
    padded = _check("3x3_pad1_27", LLVM).script()
    assert "T.min(" in padded and "T.where" not in padded
    whole = _check("3x3_s2", LLVM).script()
    assert "T.min(" not in whole and "T.where" not in whole  # 16 columns: whole vectors


def test_rule_without_epilogue():
    func = fused_func(conv_module(8, 16, 12, 3, 1, 1, epilogue=False))
    scheduled = schedule_cpu_func(func, LLVM)
    assert scheduled is not None
    args = random_args(func)
    assert_close(run(scheduled, args), run(func, args))


@pytest.mark.parametrize("max_rtasks", [1, 2, 4])
def test_rule_output_is_cut_by_the_tuned_cutter(max_rtasks):
    func = fused_func(conv_module(16, 32, 27, 3, 1, 1))
    scheduled = schedule_cpu_func(func, LLVM)
    kernel = make_tuned_cpu_rkernel(scheduled, max_rtasks)
    extent = outer_parallel_extent(scheduled)
    assert extent == 9  # 27 rows in row tiles of 3
    # chunks of ceil(9 / n): 1 -> 9; 2 -> 5 + 4 (the last guarded); 4 -> 3 chunks of 3
    assert kernel.num_rtasks == {1: 1, 2: 2, 4: 3}[max_rtasks] == chunk_count(9, max_rtasks)
    script = kernel.func.script()
    if max_rtasks > 1:
        assert CHUNK_ANNOTATION in script and "T.parallel" not in script
    assert ("< T.int64(9)" in script) == (max_rtasks == 2)  # the bounds check of 5 + 4
    args = random_args(func)
    assert_close(run(kernel.func, args), run(func, args))


def test_rule_declines_what_it_does_not_schedule():
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    assert Conv2dNCHW().apply(fused_func(conv_module(8, 16, 12, 3, 1, 1)), cuda, False) is None
    already = schedule_cpu_func(fused_func(conv_module(8, 16, 12, 3, 1, 1)), LLVM)
    assert schedule_cpu_func(already, LLVM) is None  # scheduled functions are left alone
    # strided columns are gathered lane by lane: only whole vectors pay, with enough
    # reduction per gather
    assert schedule_cpu_func(fused_func(conv_module(3, 8, 15, 3, 2, 0)), LLVM) is None
    depthwise_s2 = conv_module(16, 16, 34, 3, 2, 1, groups=16)  # 17 columns, 9 MACs each
    assert Conv2dNCHW().apply(fused_func(depthwise_s2), LLVM, False) is None


GROUPED = {
    # name: (cin, cout, size, kernel, stride, pad, groups)
    "depthwise_3x3": (16, 16, 27, 3, 1, 1, 16),
    "grouped_3x3": (8, 8, 12, 3, 1, 1, 4),
    "grouped_1x1": (24, 48, 13, 1, 1, 0, 3),  # one pixel axis
    "grouped_5x5_s2": (6, 12, 37, 5, 2, 2, 3),  # strided, 19 columns
}


@pytest.mark.parametrize("case", sorted(GROUPED))
def test_grouped_and_depthwise_convolutions(case):
    """Grouped convolutions read the weight as [f, rc, ry, rx] too (rc within the group):
    the rule schedules them (grouped 1.6-55x, depthwise 3x3 1.7-2.2x faster than the
    unscheduled TIR, docs/cpu-kernels.md)."""
    func = fused_func(conv_module(*GROUPED[case]))
    for target in (LLVM, NATIVE):
        scheduled = schedule_cpu_func(func, target)
        assert scheduled is not None
        args = random_args(func)
        assert_close(run(scheduled, args, target), run(func, args, target))


@pytest.mark.parametrize(
    "size, pool, scheduled_natively",
    [
        (71, lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=2), True),  # 35 columns
        (27, lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1), True),
        (27, lambda x: relax.op.nn.avg_pool2d(x, pool_size=3, strides=1, padding=1), True),
        (27, lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1), True),
        # strided, unpadded, narrower than two vectors: left unscheduled
        (27, lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=2), False),
        (
            28,
            lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=2, ceil_mode=True),
            True,
        ),
    ],
)
def test_pool_rule_matches_unscheduled_build(size, pool, scheduled_natively):
    """Pool2dNCHW (a default rule, after the row reductions) against the unscheduled TIR:
    one channel a parallel iteration, strided columns de-interleaved."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(pool(x)))
        bb.emit_func_output(out)
    func = fused_func(bb.get())
    scheduled = schedule_cpu_func(func, NATIVE)
    assert (scheduled is not None) == scheduled_natively
    if scheduled is None:
        return
    assert str(scheduled.attrs[RULE_ATTR]) == "Pool2dNCHW"
    args = random_args(func)
    assert_close(run(scheduled, args, NATIVE), run(func, args, NATIVE))
    assert_close(run(schedule_cpu_func(func, LLVM, [Pool2dNCHW()]), args), run(func, args))


def test_vector_lanes_and_tiles():
    assert vector_lanes(LLVM) == 8  # no mcpu: the AVX2 assumption
    assert vector_lanes(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})) == 8
    assert vector_lanes(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})) == 16
    assert width_tile(56, 8) == 8 and width_tile(27, 16) == 16 and width_tile(13, 16) == 13
    # (channels, rows): most FMAs per load within 24 accumulators, rows dividing the height
    assert register_tile(64, 27, 24, 8) == (8, 3)
    assert register_tile(64, 13, 24, 8) == (8, 1)  # 13 rows: no row tile
    assert register_tile(6, 9, 24, 8) == (6, 3)
    assert register_tile(192, 55, 24, 8, 1) == (8, 1)
    # rows narrower than a vector (7x7): up to 8 rows a tile, so each weight serves 7
    assert register_tile(512, 7, 24, 8, 8) == (2, 7)
    assert register_tile(64, 10, 24, 8, divides=False) == (6, 3) or register_tile(
        64, 10, 24, 8, divides=False
    ) == (8, 3)


def test_overlap_last_tile_refuses_what_it_cannot_shift():
    func = fused_func(conv_module(8, 16, 12, 3, 1, 1))
    var = tvm.tirx.Var("t", "int64")
    assert overlap_last_tile(func, var, 16, 12) is None  # a tile longer than the extent


def test_rules_switch(monkeypatch):
    monkeypatch.setenv("TVM_RTASK_CPU_RULES", "0")
    assert not rules_enabled()
    monkeypatch.setenv("TVM_RTASK_CPU_RULES", "1")
    assert rules_enabled()


@pytest.mark.parametrize(
    "name", ["squeezenet", pytest.param("inception_v1", marks=pytest.mark.slow)]
)
def test_light_model_with_rules_matches_onnxruntime(name, monkeypatch):
    import tvm_rtask
    from tvm_rtask.testing.onnx_light import (
        load_light_model,
        onnxruntime_outputs,
        random_inputs,
        relative_error,
    )

    monkeypatch.setenv("TVM_RTASK_CPU_RULES", "1")
    model = load_light_model(name)
    inputs = random_inputs(model)
    reference = onnxruntime_outputs(model, inputs)
    ex = tvm_rtask.compile(tvm_rtask.frontend.load(model), "llvm-native", policy="wavefront")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()])
    outs = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
    for actual, expected in zip(outs, reference, strict=True):
        assert relative_error(actual, expected) < 1e-4


def test_backend_variants_come_from_the_rule(monkeypatch):
    """make_rkernels: the rule's schedule, cut into distinct rTask counts, each variant the
    operator's numbers; with the rules off the variants are the unscheduled TIR's."""
    from tvm_rtask.backend.cpu.backend import kernel_function
    from tvm_rtask.core import Plan
    from tvm_rtask.relax_passes import PLAN_ATTR, PlanRPrograms

    fused = prepare_pipeline()(conv_module(8, 16, 12, 3, 1, 1))
    (name,) = [g.name_hint for g in fused.get_global_vars() if g.name_hint != "main"]
    args = random_args(fused[name])
    expected = run(fused[name], args)
    for flag in ("1", "0"):
        monkeypatch.setenv("TVM_RTASK_CPU_RULES", flag)
        mod = PlanRPrograms("llvm", num_veu=2)(fused)
        plan = Plan.from_json(str(mod.attrs[PLAN_ATTR]))
        (op,) = [op for op in plan.graph.ops if op.func == name]
        counts = [k.num_rtasks for k in op.rkernels]
        assert len(counts) >= 2 and len(set(counts)) == len(counts), counts
        for kernel in op.rkernels:
            func = mod[kernel_function(mod, op.func, kernel.name)]
            assert (RULE_ATTR in func.attrs) == (flag == "1")
            assert int(func.attrs["rtask.num_rtasks"]) == kernel.num_rtasks
            np.testing.assert_allclose(run(func, args), expected, rtol=1e-5, atol=1e-5)


def test_1x1_channel_blocks_split_into_parallel_groups():
    """232 channels in the best blocks of 8 are 29 blocks: one parallel group, one thread. A
    block whose count splits in 4 (or 2) is taken while it keeps most FMAs per load."""

    pixels = (196, 16)
    best = register_tile(232, 12, 24, 16, 4, divides=False, pixels=pixels)
    assert (232 // best[0]) % 2 == 1  # the unconstrained tile: an odd block count
    fi, _ = _parallel_pixel_tile(232, 12, 24, 16, 4, pixels)
    assert (232 // fi) % 2 == 0
    assert _parallel_pixel_tile(256, 12, 24, 16, 4, pixels) == register_tile(
        256, 12, 24, 16, 4, divides=False, pixels=pixels
    )  # 256 channels already split: unchanged


def test_1x1_convolution_with_an_odd_channel_count_runs_in_parallel():
    func = fused_func(conv_module(24, 232, 14, 1, 1, 0))
    scheduled = schedule_cpu_func(func, NATIVE)
    assert scheduled is not None and outer_parallel_extent(scheduled) >= 2
    args = random_args(func)
    assert_close(run(scheduled, args, NATIVE), run(func, args, NATIVE))


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
def test_1x1_with_more_pixels_than_channels_runs_its_pixel_tiles_in_parallel(target):
    """128 -> 16 channels at 55x55 (SqueezeNet's squeeze layers): the parallel loop is the
    pixel tiles (each thread reads its part of the input), its last tile shifted to end at
    pixel 3025; with fewer pixels than channels the channel groups stay parallel."""
    func = fused_func(conv_module(128, 16, 55, 1, 1, 0))
    scheduled = schedule_cpu_func(func, target)
    par = outer_parallel_extent(scheduled)
    assert par > 4  # pixel tiles: channel groups of 16 channels would be at most 4
    plain = Conv2dNCHW(pixel_parallel=False).apply(func, target, False)
    assert outer_parallel_extent(plain) <= 4
    script = scheduled.script()
    assert "T.min(" in script and "T.where" not in script
    args = random_args(func)
    assert_close(run(scheduled, args, target), run(func, args, target))
    wide = schedule_cpu_func(fused_func(conv_module(64, 256, 7, 1, 1, 0)), target)
    assert outer_parallel_extent(wide) <= 4  # 49 pixels, 256 channels: channel groups


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
@pytest.mark.parametrize(
    "channels_in, channels_out, size",
    [(64, 40, 13), (32, 16, 15), (48, 256, 14)],
    ids=["pixel-tiles-parallel", "small", "channel-groups-parallel"],
)
def test_1x1_on_planes_of_partial_vectors_reads_aligned_strips(
    target, channels_in, channels_out, size
):
    """Channel planes that are not whole vectors (13x13: 169 floats): each pixel tile's
    input strip is copied into a buffer of its own (``x_global``) before its channel
    blocks read it, the last tile still shifted back; the numerics are unchanged."""
    func = fused_func(conv_module(channels_in, channels_out, size, 1, 1, 0))
    scheduled = schedule_cpu_func(func, target)
    assert is_rule_scheduled(scheduled)
    script = scheduled.script()
    assert 'T.sblock("x_global")' in script and "T.min(" in script
    plain = Conv2dNCHW(aligned_strips=False).apply(func, target, False)
    assert 'T.sblock("x_global")' not in plain.script()
    args = random_args(func)
    assert_close(run(scheduled, args, target), run(func, args, target))


def test_1x1_on_planes_of_whole_vectors_reads_the_input_in_place():
    func = fused_func(conv_module(64, 40, 16, 1, 1, 0))  # 256 pixels: whole vectors
    assert 'T.sblock("x_global")' not in schedule_cpu_func(func, NATIVE).script()


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
@pytest.mark.parametrize(
    "channels_in, channels_out, size",
    [(96, 576, 14), (160, 960, 7), (48, 256, 13), (64, 384, 17)],
    ids=["196px", "49px", "169px", "289px"],
)
def test_1x1_last_pixel_tile_runs_apart_computing_only_what_is_left(
    target, channels_in, channels_out, size
):
    """Channel groups in parallel, pixel tiles that do not divide the plane: the last tile
    runs after the others (buffers of its own, ``_tail``) with a predicate on each vector,
    instead of recomputing most of the tile before it; the numerics are unchanged."""
    func = fused_func(conv_module(channels_in, channels_out, size, 1, 1, 0))
    scheduled = schedule_cpu_func(func, target)
    assert str(scheduled.attrs[RULE_ATTR]) == "Conv2dNCHW"
    script = scheduled.script()
    assert "_tail" in script and "T.where" in script
    plain = Conv2dNCHW(narrow_tail=False).apply(func, target, False)
    assert "_tail" not in plain.script() and "T.where" not in plain.script()
    args = random_args(func)
    expected = run(func, args, target)
    assert float(np.abs(expected).max()) > 1e-2  # outputs alive
    assert_close(run(scheduled, args, target), expected)
    assert_close(run(plain, args, target), expected)


def test_narrow_last_tile_leaves_parallel_and_single_tiles_alone():
    """Pixel tiles in parallel (128 -> 16 at 55x55): the tile loop is the parallel loop,
    whose iterations are the rTasks (a tail after it would run on one thread)."""
    func = fused_func(conv_module(128, 16, 55, 1, 1, 0))
    scheduled = schedule_cpu_func(func, NATIVE)
    assert "_tail" not in scheduled.script()
    loop = [v for v in _loop_vars(scheduled) if v[1] == tvm.tirx.ForKind.PARALLEL][0][0]
    assert narrow_last_tile(scheduled, loop, 64, 3025, 16) is None


def _loop_vars(func):
    import tvm_ffi

    found = []

    def each(node):
        found.append((node.loop_var, node.kind))
        return node

    tvm_ffi.structural_map(func.body, (tvm.tirx.For, each))
    return found


@pytest.mark.parametrize("case", ["pointwise_13", "pointwise_55", "pointwise_56"])
def test_1x1_write_back_is_written_in_vectors(case):
    """A 1x1 convolution's register tile spans several vectors of its flattened pixel axis;
    its write-back (the accumulators to the output, with the epilogue) is a loop of vectors,
    as its init is, not a scalar loop left to LLVM's vectorizer."""
    scheduled = _check(case, LLVM)
    sch = tvm.s_tir.Schedule(scheduled)
    write_backs = [
        b
        for b in sch.get_child_blocks(sch.get_sblock("root"))
        if sch.get(b).name_hint.endswith("_local")
    ]
    assert write_backs
    for block in write_backs:
        innermost = sch.get(sch.get_loops(block)[-1])
        assert innermost.kind == tvm.tirx.ForKind.VECTORIZED, sch.get(block).name_hint


@pytest.mark.parametrize(
    "cin, cout, size, kernel, stride, pad",
    [(64, 64, 56, 3, 1, 1), (256, 256, 14, 3, 1, 1), (64, 256, 56, 1, 1, 0)],
    ids=["3x3_64", "3x3_256", "1x1_64_256"],
)
def test_tiles_fit_avx2_registers(cin, cout, size, kernel, stride, pad):
    """On AVX2's 16 registers the default tile keeps its accumulators in registers (at most
    one ymm reload from the stack; 24 accumulators, the AVX-512 tile, reload 26-111)."""
    func = fused_func(conv_module(cin, cout, size, kernel, stride, pad))
    assert stack_reloads(Conv2dNCHW().apply(func, HASWELL, False), HASWELL) <= 1
    assert stack_reloads(Conv2dNCHW(acc_vectors=24).apply(func, HASWELL, False), HASWELL) > 10
