"""MergeConvs: convolutions sharing an input become one, numerics unchanged on llvm."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_rtask.relax_passes.merge_convs import CONV2D, MergeConvs


def count_convs(mod) -> int:
    n = 0

    def visit(e):
        nonlocal n
        if isinstance(e, relax.Call) and e.op.same_as(CONV2D):
            n += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return n


def inception_block(weights_as_params: bool):
    """x -> 1x1, 3x3/p1, 5x5/p2 (merged); a 3x3 dilated by 2, a strided 3x3 and a 2x2
    (its padding cannot grow evenly) stay, as does a conv of another input."""
    rng = np.random.default_rng(0)
    c = 4
    specs = [
        ("b1", (3, c, 1, 1), {}),
        ("b3", (5, c, 3, 3), {"padding": (1, 1)}),
        ("b5", (2, c, 5, 5), {"padding": (2, 2)}),
        ("dil", (3, c, 3, 3), {"padding": (2, 2), "dilation": (2, 2)}),
        ("stride", (4, c, 3, 3), {"padding": (1, 1), "strides": (2, 2)}),
        ("even", (2, c, 2, 2), {"padding": (0, 0, 1, 1)}),
    ]
    x = relax.Var("x", relax.TensorType((1, c, 9, 9), "float32"))
    y = relax.Var("y", relax.TensorType((1, c, 9, 9), "float32"))
    values = {n: (0.3 * rng.standard_normal(shape)).astype("float32") for n, shape, _ in specs}
    values["other"] = (0.3 * rng.standard_normal((3, c, 3, 3))).astype("float32")
    params = [x, y]
    wvars = {}
    for name, arr in values.items():
        if weights_as_params:
            wvars[name] = relax.Var(f"w_{name}", relax.TensorType(arr.shape, "float32"))
            params.append(wvars[name])
        else:
            wvars[name] = relax.const(arr)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            outs = []
            for name, _, kw in specs:
                conv = bb.emit(relax.op.nn.conv2d(x, wvars[name], **kw))
                outs.append(bb.emit(relax.op.nn.relu(conv)))
            outs.append(bb.emit(relax.op.nn.conv2d(y, wvars["other"], padding=(1, 1))))
            result = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(result)
    inputs = [rng.standard_normal((1, c, 9, 9)).astype("float32") for _ in range(2)]
    if weights_as_params:
        inputs += list(values.values())
    return bb.get(), inputs


def run(mod, inputs):
    ex = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return [o.numpy() for o in vm["main"](*(tvm.runtime.tensor(v) for v in inputs))]


@pytest.mark.parametrize("weights_as_params", [False, True])
def test_merged_module_matches_unmerged(weights_as_params):
    mod, inputs = inception_block(weights_as_params)
    merged = MergeConvs()(mod)
    # b1, b3, b5 become one conv; dil, stride, even and the other input stay
    assert count_convs(mod) == 7 and count_convs(merged) == 5
    relax.analysis.well_formed(merged)
    want = run(mod, inputs)
    got = run(merged, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_nothing_to_merge_is_unchanged():
    x = relax.Var("x", relax.TensorType((1, 2, 5, 5), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones((2, 2, 3, 3), "float32"))))
            out = bb.emit_output(c)
        bb.emit_func_output(out)
    mod = bb.get()
    assert MergeConvs()(mod).same_as(mod)


def test_inception_v1_branches_merge():
    import tvm_rtask
    from tvm_rtask.testing.onnx_light import load_light_model

    mod = tvm_rtask.frontend.load(load_light_model("inception_v1", seed=0))
    merged = MergeConvs()(mod)
    assert count_convs(merged) < count_convs(mod)  # compiled and checked in the slow test


@pytest.mark.slow
def test_merged_inception_v1_matches_onnxruntime():
    import tvm_rtask
    from tvm_rtask.testing.onnx_light import (
        load_light_model,
        onnxruntime_outputs,
        random_inputs,
        relative_error,
    )

    model = load_light_model("inception_v1", seed=0)
    inputs = random_inputs(model, seed=1)
    merged = MergeConvs()(tvm_rtask.frontend.load(model))
    ex = tvm_rtask.compile(merged, "llvm", policy="ios", num_veu=2)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(v) for v in inputs.values()))
    got = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
    for g, w in zip(got, onnxruntime_outputs(model, inputs), strict=True):
        assert relative_error(g, w) < 1e-4
