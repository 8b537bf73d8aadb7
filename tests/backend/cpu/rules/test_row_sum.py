"""RowSum: sums and means over trailing axes with the additions vectorised (partial sums
per lane, one horizontal sum per row), against TVM's unscheduled build; what it leaves to
RowReduction."""

import numpy as np
import pytest
from tvm import relax

from tests.backend.cpu.rules.common import LLVM, NATIVE, assert_close, fused_func, random_args, run
from tvm_rtask.backend.cpu.rules import RULE_ATTR, RowSum, schedule_cpu_func
from tvm_rtask.backend.cpu.rules.row_sum import row_width
from tvm_rtask.backend.cpu.tuned import outer_parallel_extent


def _module(shape, op="mean", axis=(2, 3), then_relu=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            reduce = relax.op.mean if op == "mean" else relax.op.sum
            y = bb.emit(reduce(x, axis=list(axis), keepdims=True))
            if then_relu:
                y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


CASES = {
    # name: (shape, op, axis, relu after)
    "se_mean_112": ((1, 32, 112, 112), "mean", (2, 3), False),  # EfficientNet's first SE
    "mean_14": ((1, 24, 14, 14), "mean", (2, 3), False),  # 196: 49 partial sums
    "sum_last_axis": ((2, 6, 320), "sum", (2,), False),  # one trailing axis, batch 2
    "mean_then_relu": ((1, 16, 9, 11), "mean", (2, 3), True),  # 99 = 3 x 33, an epilogue
}


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_the_unscheduled_build(case, target):
    shape, op, axis, relu = CASES[case]
    func = fused_func(_module(shape, op, axis, relu))
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "RowSum"
    rows = int(np.prod(shape[: len(shape) - len(axis)]))
    assert outer_parallel_extent(scheduled) == rows
    assert "T.vectorized" in scheduled.script()
    args = random_args(func)
    expected = run(func, args, target)
    assert np.max(np.abs(expected)) > 1e-3  # a sum of standard normals: not all near zero
    assert_close(run(scheduled, args, target), expected, tol=1e-5)


def test_declines_short_rows_and_other_reductions():
    short = fused_func(_module((1, 24, 5, 5)))  # 25 < 4 vectors of 8 or 16
    assert RowSum().apply(short, NATIVE, False) is None
    assert str(schedule_cpu_func(short, NATIVE).attrs[RULE_ATTR]) == "RowReduction"
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 128), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x, axis=-1))  # two reductions
        bb.emit_func_output(out)
    assert RowSum().apply(fused_func(bb.get()), NATIVE, False) is None
    leading = fused_func(_module((64, 8, 4), "sum", (0,)))  # reduces a leading axis
    assert RowSum().apply(leading, NATIVE, False) is None


def test_row_width():
    assert row_width(12544, 16, 4) == 64  # four vectors of partial sums
    assert row_width(3136, 16, 4) == 64
    assert row_width(196, 16, 4) == 49  # no multiple of 16 divides 196
    assert row_width(169, 16, 4) == 13
    assert row_width(4 * 97, 16, 4) is None  # divisors 1, 2, 4: under half a vector
    assert row_width(2 * 8, 8, 4) == 16
