"""RowReduction: softmax and layer norm rows in parallel (TVM's dlight.cpu.Reduction), and
nothing else."""

import numpy as np
import pytest
from tvm import relax

from tests.backend.cpu.rules.common import (
    LLVM,
    NATIVE,
    assert_close,
    conv_module,
    fused_func,
    matmul_module,
    random_args,
    run,
    softmax_func,
)
from tvm_rtask.backend.cpu.rules import RULE_ATTR, RowReduction, schedule_cpu_func
from tvm_rtask.backend.cpu.tuned import outer_parallel_extent


def _module(which: str):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 37, 45), "float32"))
    rng = np.random.default_rng(0)
    with bb.function("main", [x]):
        with bb.dataflow():
            if which == "softmax":
                y = relax.op.nn.softmax(x, axis=-1)
            else:
                gamma, beta = (relax.const(rng.standard_normal(45).astype("float32")) for _ in "gb")
                y = relax.op.nn.layer_norm(x, gamma, beta, axes=[-1])
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("which", ["softmax", "layer_norm"])
@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
def test_rows_run_in_parallel_and_match(which, target):
    func = fused_func(_module(which))
    expected_rule = "RowSoftmax" if which == "softmax" else "RowReduction"
    assert str(schedule_cpu_func(func, target).attrs[RULE_ATTR]) == expected_rule
    scheduled = RowReduction().apply(func, target, False).mod["main"]
    assert outer_parallel_extent(scheduled) == 3 * 37
    args = random_args(func)
    assert_close(run(scheduled, args, target), run(func, args, target))


def test_declines_reductions_of_two_tensors():
    conv = fused_func(conv_module(3, 8, 15, 3, 2, 0))  # input and weight, over the window
    assert RowReduction().apply(conv, LLVM, False) is None
    product = fused_func(matmul_module(3, 16, 24))  # x and w, over k
    assert RowReduction().apply(product, LLVM, False) is None


def test_global_average_pooling_is_scheduled_and_matches():
    bb = relax.BlockBuilder()
    # 5x5: rows shorter than RowSum's four vectors (of 8 or 16 lanes) stay with RowReduction
    x = relax.Var("x", relax.TensorType((1, 24, 5, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(x, axis=[2, 3], keepdims=True))
        bb.emit_func_output(out)
    func = fused_func(bb.get())
    scheduled = schedule_cpu_func(func, NATIVE)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "RowReduction"
    args = random_args(func)
    assert_close(run(scheduled, args, NATIVE), run(func, args, NATIVE))


def test_declines_a_single_row_that_it_would_parallelise_by_element():
    # dlight's Reduction on a batch-1 softmax over [1, 1000] runs its parallel loop over the
    # 1000 outputs and recomputes the row's max and sum for each: 1000x the work
    func = softmax_func((1, 1000))
    assert RowReduction().apply(func, NATIVE, False) is None
    scheduled = schedule_cpu_func(func, NATIVE)
    if scheduled is not None:  # another rule may take it; never one parallel over elements
        assert outer_parallel_extent(scheduled) == 1
    args = random_args(func)
    reference = run(func, args, NATIVE)
    assert np.abs(reference).max() > 1e-4  # a softmax of 1000 values: about 1e-3 each
    if scheduled is not None:
        assert_close(run(scheduled, args, NATIVE), reference)
