"""Conv2dNCHW: numerics equal to TVM's unscheduled build, the shape the rKernel cutter needs,
and whole light models against ONNX Runtime with the rules on."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R  # noqa: F401  (TVMScript needs R in scope)

from tvm_rtask.backend.cpu.kernel import CHUNK_ANNOTATION
from tvm_rtask.backend.cpu.rules import (
    RULE_ATTR,
    Conv2dNCHW,
    is_rule_scheduled,
    rules_enabled,
    schedule_cpu_func,
    vector_lanes,
)
from tvm_rtask.backend.cpu.rules.conv2d_nchw import width_tile
from tvm_rtask.backend.cpu.tuned import is_tuned, make_tuned_cpu_rkernel, outer_parallel_extent
from tvm_rtask.relax_passes import prepare_pipeline

LLVM = tvm.target.Target("llvm")


def _conv_module(cin, cout, size, kernel, stride, pad, groups=1, epilogue=True):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, cin, size, size), "float32"))
    w = relax.Var("w", relax.TensorType((cout, cin // groups, kernel, kernel), "float32"))
    b = relax.Var("b", relax.TensorType((1, cout, 1, 1), "float32"))
    params = [x, w, b] if epilogue else [x, w]
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, groups=groups))
            if epilogue:
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _fused_func(mod):
    mod = prepare_pipeline()(mod)
    (name,) = [g.name_hint for g in mod.get_global_vars() if g.name_hint != "main"]
    return mod[name]


def _run(func, args):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), LLVM)
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def _args(func, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in func.params
    ]


CASES = {
    # name: (cin, cout, size, kernel, stride, pad)
    "pointwise_13": (32, 24, 13, 1, 1, 0),  # squeeze/expand 1x1, whole row one tile
    "pointwise_55": (16, 16, 55, 1, 1, 0),  # pixel tiles of 11
    "pointwise_56": (8, 16, 56, 1, 1, 0),  # 16-wide tiles, no tail
    "3x3_pad1_27": (16, 32, 27, 3, 1, 1),  # padding block computed per row
    "3x3_pad1_14": (8, 12, 14, 3, 1, 1),  # 12 channels: channel block 4
    "3x3_tail": (4, 8, 43, 3, 1, 0),  # 41 columns (prime): 8-wide tiles with a tail
    "3x3_s2": (3, 16, 33, 3, 2, 0),  # strided columns, 16 of them
    "7x7_s2_pad3": (3, 8, 32, 7, 2, 3),  # Inception's stem
    "5x5_pad2_odd_cout": (4, 6, 9, 5, 1, 2),  # 6 channels, 9 columns
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_unscheduled_build(case):
    func = _fused_func(_conv_module(*CASES[case]))
    scheduled = schedule_cpu_func(func, LLVM)
    assert scheduled is not None, "the rule should match a direct NCHW convolution"
    assert str(scheduled.attrs[RULE_ATTR]) == "Conv2dNCHW" and is_rule_scheduled(scheduled)
    assert not is_tuned(scheduled)  # TUNED_ATTR means "from a tuning database"
    assert outer_parallel_extent(scheduled) > 1
    args = _args(func)
    np.testing.assert_allclose(_run(scheduled, args), _run(func, args), rtol=1e-5, atol=1e-5)


def test_rule_without_epilogue():
    func = _fused_func(_conv_module(8, 16, 12, 3, 1, 1, epilogue=False))
    scheduled = schedule_cpu_func(func, LLVM)
    assert scheduled is not None
    args = _args(func)
    np.testing.assert_allclose(_run(scheduled, args), _run(func, args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("max_rtasks", [1, 2, 4])
def test_rule_output_is_cut_by_the_tuned_cutter(max_rtasks):
    func = _fused_func(_conv_module(16, 32, 27, 3, 1, 1))
    scheduled = schedule_cpu_func(func, LLVM)
    kernel = make_tuned_cpu_rkernel(scheduled, max_rtasks)
    assert kernel.num_rtasks == max_rtasks  # the parallel loop (8 * 27) divides evenly
    if max_rtasks > 1:
        assert CHUNK_ANNOTATION in kernel.func.script()
        assert "T.parallel" not in kernel.func.script()
    args = _args(func)
    np.testing.assert_allclose(_run(kernel.func, args), _run(func, args), rtol=1e-5, atol=1e-5)


def test_rule_declines_what_it_does_not_schedule():
    grouped = _fused_func(_conv_module(8, 8, 12, 3, 1, 1, groups=8))  # depthwise
    assert (
        Conv2dNCHW().apply(grouped, LLVM, False) is None
        or schedule_cpu_func(grouped, LLVM) is not None
    )  # either declined or (when it matches) checked below
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    assert Conv2dNCHW().apply(_fused_func(_conv_module(8, 16, 12, 3, 1, 1)), cuda, False) is None
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((4, 8), "float32"))
    m = relax.Var("m", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [a, m]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(a, m)))
        bb.emit_func_output(out)
    assert schedule_cpu_func(_fused_func(bb.get()), LLVM) is None
    already = schedule_cpu_func(_fused_func(_conv_module(8, 16, 12, 3, 1, 1)), LLVM)
    assert schedule_cpu_func(already, LLVM) is None  # tuned functions are left alone


def test_rule_declines_strided_columns_without_whole_vectors():
    # SqueezeNet's stem (3x3/2, 111 columns): gathers of 37 lanes, 3x slower than unscheduled
    func = _fused_func(_conv_module(3, 8, 47, 3, 2, 0))  # 23 columns
    assert schedule_cpu_func(func, LLVM) is None


def test_pool_rule_matches_unscheduled_build():
    """Pool2dNCHW is not a default rule (measured slower), but must stay correct."""
    from tvm_rtask.backend.cpu.rules import Pool2dNCHW

    for pool in (
        lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=2),
        lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1),
        lambda x: relax.op.nn.avg_pool2d(x, pool_size=3, strides=1, padding=1),
    ):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((1, 8, 27, 27), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(bb.emit(pool(x)))
            bb.emit_func_output(out)
        func = _fused_func(bb.get())
        sch = Pool2dNCHW().apply(func, LLVM, False)
        assert sch is not None
        args = _args(func)
        np.testing.assert_allclose(_run(sch.mod["main"], args), _run(func, args), rtol=1e-5)


def test_grouped_convolution_stays_correct():
    func = _fused_func(_conv_module(8, 8, 12, 3, 1, 1, groups=8))
    scheduled = schedule_cpu_func(func, LLVM)
    if scheduled is None:
        pytest.skip("grouped convolution not matched")
    args = _args(func)
    np.testing.assert_allclose(_run(scheduled, args), _run(func, args), rtol=1e-5, atol=1e-5)


def test_vector_lanes_and_tiles():
    assert vector_lanes(LLVM) == 8  # no mcpu: the AVX2 assumption
    assert vector_lanes(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})) == 8
    assert vector_lanes(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})) == 16
    assert width_tile(56, 8) == 8 and width_tile(32, 8) == 16
    assert width_tile(13, 8) == 13 and width_tile(55, 8) == 11 and width_tile(111, 8) == 37
    assert width_tile(23, 8) == 23 and width_tile(41, 8) == 8  # 41: 8-wide tiles, a tail


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
    ex = tvm_rtask.compile(tvm_rtask.frontend.load(model), "llvm", policy="wavefront")
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

    fused = prepare_pipeline()(_conv_module(8, 16, 12, 3, 1, 1))
    (name,) = [g.name_hint for g in fused.get_global_vars() if g.name_hint != "main"]
    args = _args(fused[name])
    expected = _run(fused[name], args)
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
            np.testing.assert_allclose(_run(func, args), expected, rtol=1e-5, atol=1e-5)
