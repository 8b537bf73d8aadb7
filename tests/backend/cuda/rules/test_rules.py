"""The CUDA schedule rules without a GPU: which convolutions they take, what the schedules
are (well-formed, thread cap, independent 1-D blocks an rKernel can be made of), the CUDA
source TVM generates from them, what they compute (run on the CPU with the thread loops made
serial, against the unscheduled PrimFunc), and the option that switches them off."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, tirx
from tvm.script import relax as R
from tvm.target import Target

import tvm_rtask
from tvm_rtask.backend.cuda.backend import CUDABackend, schedule_target
from tvm_rtask.backend.cuda.rkernel import make_cuda_rkernel, schedule_for_cuda
from tvm_rtask.backend.cuda.rules import (
    RULE_ATTR,
    Conv2dNCHW,
    DepthwiseConv2dNCHW,
    Tile,
    choose_tile,
    find_conv,
    rules_enabled,
    schedule_cuda_func,
)
from tvm_rtask.backend.cuda.rules.conv2d_nchw import reduction_step
from tvm_rtask.errors import OptionError
from tvm_rtask.options import resolve_options
from tvm_rtask.relax_passes import RTaskPrepare

from .convs import CAPPED, TARGET, convs, random_args, run_on_cpu, serial_on_cpu

CI_MODELS = ("squeezenet", "resnext29", "resnext29_grouped", "nasnet_cifar")


def _conv(model: str, name: str) -> tirx.PrimFunc:
    """The function ``name`` of ``model``, or the one fused convolution it begins (the
    numbers of the fused epilogue's operators depend on what the preparation folded)."""
    funcs = convs(model)
    if name in funcs:
        return funcs[name]
    (found,) = [f for n, f in funcs.items() if n.startswith(name + "_")]
    return found


def _expected_rule(func) -> str:
    info = find_conv(s_tir.Schedule(func))
    assert info is not None, "every conv2d of these models is an NCHW convolution"
    return "DepthwiseConv2dNCHW" if info.group_channels == 1 else "Conv2dNCHW"


def test_analysis_reads_groups_strides_and_windows():
    direct = convs("squeezenet")["fused_conv2d_add_relu"]  # 3x3/2 stem, 3 -> 64
    info = find_conv(s_tir.Schedule(direct))
    assert (info.groups, info.stride, info.kernel_h) == (1, (2, 2), 3)
    assert info.gemm == (1, 12321, 64, 27)
    grouped = _conv("resnext29_grouped", "fused_conv2d5")
    info = find_conv(s_tir.Schedule(grouped))  # 12 -> 12 in 3 groups, 3x3/2
    assert (info.groups, info.group_channels, info.out_per_group) == (3, 4, 4)
    assert info.stride == (2, 2) and not info.depthwise
    depthwise = convs("nasnet_cifar")["conv2d9"]  # 7x7/2 depthwise
    info = find_conv(s_tir.Schedule(depthwise))
    assert info.depthwise and info.kernel_w == 7 and info.stride == (2, 2)


def test_non_convolutions_are_left_to_dlight():
    mod = RTaskPrepare(None, TARGET)(tvm_rtask.models.get("alexnet", reduced=True)[0])
    others = [f for gv, f in mod.functions.items()
              if isinstance(f, tvm.tirx.PrimFunc) and "conv" not in gv.name_hint]  # fmt: skip
    assert others
    for func in others:
        assert schedule_cuda_func(func, CAPPED) is None
    # and not on an llvm target
    conv = next(iter(convs("squeezenet").values()))
    assert Conv2dNCHW().apply(conv, Target("llvm"), False) is None


@pytest.mark.parametrize("model", CI_MODELS)
def test_every_convolution_gets_a_rule_and_makes_an_rkernel(model):
    """Well-formed, at most 256 threads in one dimension, no cross-thread reduction, no
    global intermediates, a shared-memory stage: blocks that are rTasks."""
    for name, func in convs(model).items():
        scheduled = schedule_cuda_func(func, CAPPED)
        assert scheduled is not None, name
        assert scheduled.attrs[RULE_ATTR] == _expected_rule(func), name
        assert s_tir.analysis.verify_well_formed(scheduled), name
        kernel = make_cuda_rkernel(scheduled)
        assert kernel.threads <= 256 and kernel.one_dimensional, (name, kernel.threads)
        assert not kernel.cross_thread_reduction and not kernel.global_alloc, name
        assert 0 < kernel.shared_mem <= 48 * 1024, (name, kernel.shared_mem)
        assert kernel.num_rtasks >= 1


@pytest.mark.parametrize("cap", [64, 128])
def test_thread_cap_is_respected(cap):
    target = schedule_target(TARGET, cap)
    for model in ("squeezenet", "nasnet_cifar"):
        for name, func in convs(model).items():
            kernel = make_cuda_rkernel(schedule_cuda_func(func, target))
            assert kernel.threads <= cap, (model, name, kernel.threads)


def test_tiles_prefer_4x4_register_tiles_and_fill_the_cap():
    # ResNeXt-29's 8x8 3x3 branch conv: 64 pixels x 256 channels, K = 2304
    tile = choose_tile((1, 64, 256, 2304), 256, 132)
    assert (tile.mi, tile.ji) == (4, 4) and tile.threads <= 256 and tile.tm >= 8
    # tiny outputs still get a whole warp and at most the cap
    tile = choose_tile((1, 16, 4, 24), 256, 132)
    assert 32 <= tile.threads <= 256
    assert isinstance(tile, Tile)
    assert [reduction_step(k) for k in (27, 36, 48, 64, 144, 432, 2304, 100)] == [
        28, 36, 16, 32, 16, 16, 32, 32,
    ]  # fmt: skip


def test_cuda_source_for_every_convolution():
    """Codegen for every convolution of the CI models in one module (TVM's CUDA codegen, no
    nvcc): one kernel each, 128-bit shared loads in the GEMM kernels."""
    funcs = {}
    for model in CI_MODELS:
        for name, func in convs(model).items():
            funcs[f"{model}_{name}"] = schedule_cuda_func(func, CAPPED).with_attr(
                "global_symbol", f"{model}_{name}"
            )
    with CAPPED:
        lib = tvm.tirx.build(tvm.IRModule(funcs), target=CAPPED)
    source = next(m.inspect_source() for m in lib.imports if m.kind == "cuda")
    for name in funcs:
        assert f"{name}_kernel(" in source, name
    assert source.count("*(float4*)(") > len(funcs)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnext29_full", "resnext29_grouped_full"])
def test_full_size_resnext_convolutions_schedule_and_generate_cuda(model):
    funcs = {}
    for name, func in convs(model).items():
        scheduled = schedule_cuda_func(func, CAPPED)
        assert scheduled is not None and s_tir.analysis.verify_well_formed(scheduled), name
        kernel = make_cuda_rkernel(scheduled)
        assert kernel.threads <= 256 and not kernel.cross_thread_reduction, name
        funcs[name] = scheduled.with_attr("global_symbol", name)
    with CAPPED:
        lib = tvm.tirx.build(tvm.IRModule(funcs), target=CAPPED)
    source = next(m.inspect_source() for m in lib.imports if m.kind == "cuda")
    assert all(f"{name}_kernel(" in source for name in funcs)


# What each rule computes, on the CPU: one case per shape of schedule (padding on M and J, a
# strided 3x3 stem with K padded to 28, vector 1x1 fetches, groups, depthwise 7x7/2 and 3x3)
NUMERIC_CASES = [
    ("squeezenet", "fused_conv2d_add_relu"),
    ("squeezenet", "fused_conv2d17_add9_relu9"),
    ("resnext29", "fused_conv2d8"),
    ("resnext29_grouped", "fused_conv2d5"),
    ("nasnet_cifar", "conv2d9"),
    ("nasnet_cifar", "conv2d3"),
]


def _check_numerics(model: str, name: str) -> None:
    func = _conv(model, name)
    scheduled = schedule_cuda_func(func, CAPPED)
    args = random_args(func)
    expected = run_on_cpu(func, args)
    args[-1][:] = np.nan  # every output element must be written
    actual = run_on_cpu(serial_on_cpu(scheduled), args)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("model, name", NUMERIC_CASES)
def test_schedule_computes_the_convolution(model, name):
    _check_numerics(model, name)


@pytest.mark.slow
@pytest.mark.parametrize("model", CI_MODELS)
def test_every_schedule_computes_its_convolution(model):
    for name in convs(model):
        _check_numerics(model, name)


def test_option_cuda_rules_switches_the_rules():
    func = _conv("resnext29_grouped", "fused_conv2d5")
    assert RULE_ATTR in schedule_for_cuda(func, CAPPED, rules=True).attrs
    off = schedule_for_cuda(func, CAPPED, rules=False)
    assert off.attrs is None or RULE_ATTR not in off.attrs
    assert (RULE_ATTR in schedule_for_cuda(func, CAPPED).attrs) == rules_enabled()
    with pytest.raises(OptionError, match="cuda_rules must be True or False"):
        resolve_options({"cuda_rules": "yes"})


@pytest.mark.parametrize("cuda_rules", [True, False])
def test_make_rkernels_follows_the_option(cuda_rules):
    """rKernels are made from the rules' schedules (the rKernel maker turns their blocks into
    rTasks), or from dlight's with the option off."""
    # SqueezeNet: 1x1 and 3x3 convolutions, scheduled in a quarter of NASNet's time
    mod = RTaskPrepare(None, TARGET)(tvm_rtask.models.get("squeezenet", reduced=True)[0])
    options = resolve_options({"cuda_rules": cuda_rules, "num_veu": 132})
    backend = CUDABackend(TARGET)
    scheduled, maker = backend.make_rkernels(mod, options)
    names = [gv.name_hint for gv, f in mod.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint]  # fmt: skip
    assert len(names) >= 4
    for name in names:
        (rkernel,) = maker(name)
        assert rkernel.num_rtasks >= 1 and rkernel.threads <= 256
        attrs = scheduled[name].attrs
        assert (attrs is not None and RULE_ATTR in attrs) == cuda_rules, name
        assert f"{name}_rkernel" in [gv.name_hint for gv in scheduled.get_global_vars()]


def test_rules_are_named_in_order():
    from tvm_rtask.backend.cuda.rules import default_rules

    assert [type(r) for r in default_rules()] == [Conv2dNCHW, DepthwiseConv2dNCHW]


@tvm.script.ir_module
class Unusual:
    """Batch 2, dilation 2, 2 groups, a 2x3 kernel with stride (1, 2), bias and relu."""

    @R.function
    def main(
        x: R.Tensor((2, 8, 13, 14), "float32"),
        w: R.Tensor((6, 4, 2, 3), "float32"),
        b: R.Tensor((1, 6, 1, 1), "float32"),
    ):
        with R.dataflow():
            y = R.nn.conv2d(x, w, strides=(1, 2), padding=(1, 2), dilation=(2, 2), groups=2)
            z = R.nn.relu(R.add(y, b))
            R.output(z)
        return z


@tvm.script.ir_module
class WideDepthwise:
    """Depthwise with 2 outputs per input channel, rows wider than the thread cap."""

    @R.function
    def main(x: R.Tensor((1, 3, 6, 300), "float32"), w: R.Tensor((6, 1, 3, 3), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=(1, 1), groups=3)
            R.output(y)
        return y


@pytest.mark.parametrize(
    "module, expected, rule",
    [
        (Unusual, (2, 2, (2, 2), (1, 2)), "Conv2dNCHW"),
        (WideDepthwise, (1, 3, (1, 1), (1, 1)), "DepthwiseConv2dNCHW"),
    ],
)
def test_batch_dilation_groups_and_odd_sizes(module, expected, rule):
    mod = RTaskPrepare(None, TARGET)(module)
    (func,) = [f for gv, f in mod.functions.items() if "conv2d" in gv.name_hint]
    info = find_conv(s_tir.Schedule(func))
    assert (info.batch, info.groups, info.dilation, info.stride) == expected
    scheduled = schedule_cuda_func(func, CAPPED)
    assert scheduled.attrs[RULE_ATTR] == rule
    assert make_cuda_rkernel(scheduled).threads <= 256
    args = random_args(func)
    expected = run_on_cpu(func, args)
    args[-1][:] = np.nan
    actual = run_on_cpu(serial_on_cpu(scheduled), args)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
