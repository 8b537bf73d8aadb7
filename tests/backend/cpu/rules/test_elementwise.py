"""Elementwise: injective operators with their trailing elements in vectors and their leading
axes in parallel, against TVM's unscheduled build; what it leaves to the unscheduled TIR."""

import numpy as np
import pytest
from tvm import relax

from tests.backend.cpu.rules.common import LLVM, NATIVE, assert_close, fused_func, random_args, run
from tvm_rtask.backend.cpu.rules import RULE_ATTR, Elementwise, schedule_cpu_func
from tvm_rtask.backend.cpu.rules.base import vector_lanes
from tvm_rtask.backend.cpu.rules.elementwise import vector_axes
from tvm_rtask.backend.cpu.tuned import make_tuned_cpu_rkernel, outer_parallel_extent


def _module(kind: str, dtype: str = "float32"):
    bb = relax.BlockBuilder()

    def var(name, shape):
        return relax.Var(name, relax.TensorType(shape, dtype))

    if kind == "concat_bn_relu":  # DenseNet's pre-activation in channel blocks
        xs = [var("a", (1, 2, 4, 6, 16)), var("b", (1, 1, 4, 6, 16)), var("c", (1, 1, 4, 6, 16))]
        scale, shift = var("s", (1, 4, 1, 1, 16)), var("t", (1, 4, 1, 1, 16))
        params = [*xs, scale, shift]
    elif kind == "bn_relu_nchw":  # 14 x 14 = 196 elements a plane: not whole vectors
        x, scale, shift = var("x", (1, 8, 14, 14)), var("s", (1, 8, 1, 1)), var("t", (1, 8, 1, 1))
        params = [x, scale, shift]
    elif kind == "transpose":  # trailing axes from a gather
        params = [var("x", (1, 4, 8, 16))]
    elif kind in ("odd_add", "int_add"):
        params = [var("x", (1, 3, 5, 7)), var("y", (1, 3, 5, 7))]
    with bb.function("main", params):
        with bb.dataflow():
            if kind == "concat_bn_relu":
                y = bb.emit(relax.op.concat(xs, axis=1))
                y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.multiply(y, scale), shift)))
            elif kind == "bn_relu_nchw":
                y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.multiply(x, scale), shift)))
            elif kind == "transpose":
                y = bb.emit(relax.op.permute_dims(params[0], [0, 2, 3, 1]))
            else:
                y = bb.emit(relax.op.add(*params))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
@pytest.mark.parametrize("kind", ["concat_bn_relu", "bn_relu_nchw", "transpose"])
def test_matches_the_unscheduled_build(kind, target):
    func = fused_func(_module(kind))
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "Elementwise"
    assert "T.vectorized" in scheduled.script()
    assert outer_parallel_extent(scheduled) >= 4  # splits over the vEUs
    args = random_args(func)
    expected = run(func, args, target)
    assert np.mean(expected != 0) > 0.3  # relu leaves about half: not all zeros
    assert_close(run(scheduled, args, target), expected, tol=1e-7)  # the same arithmetic


def test_rtask_chunks_cover_the_output():
    """Cut into rTasks as the backend cuts it (the parallel loop in chunks), every chunk run
    in turn writes what the unscheduled operator writes."""
    func = fused_func(_module("concat_bn_relu"))
    scheduled = schedule_cpu_func(func, NATIVE)
    kernel = make_tuned_cpu_rkernel(scheduled, 3)
    assert kernel.num_rtasks == 3
    args = random_args(func)
    assert_close(run(kernel.func, args, NATIVE), run(func, args, NATIVE), tol=1e-7)


def test_declines_what_it_cannot_vectorize():
    # 3 x 5 x 7 = 105 elements: no trailing axes hold whole vectors
    assert Elementwise().apply(fused_func(_module("odd_add")), NATIVE, False) is None
    assert schedule_cpu_func(fused_func(_module("odd_add")), NATIVE) is None
    # not float32
    assert Elementwise().apply(fused_func(_module("int_add", "int32")), NATIVE, False) is None
    # a reduction is another rule's
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.sum(x, axis=[2, 3]))
        bb.emit_func_output(out)
    assert Elementwise().apply(fused_func(bb.get()), NATIVE, False) is None


def test_vector_axes_fuses_the_fewest_trailing_axes():
    assert vector_axes([1, 4, 56, 56, 16], 16) == 1
    assert vector_axes([1, 8, 14, 14], 8) == 3  # 14 and 196 are not 8k; 8 x 196 is
    assert vector_axes([1, 3, 5, 7], 8) == 0
    assert vector_axes([2, 64], vector_lanes(NATIVE)) == 1
