"""RowSoftmax: softmax rows with their maximum and sum in vectors of partial results."""

import numpy as np
import pytest
from tvm import relax

from tests.backend.cpu.rules.common import (
    LLVM,
    NATIVE,
    assert_close,
    fused_func,
    run,
    softmax_func,
)
from tvm_rtask.backend.cpu.rules import RULE_ATTR, RowSoftmax, schedule_cpu_func
from tvm_rtask.backend.cpu.rules.base import vector_lanes
from tvm_rtask.backend.cpu.tuned import outer_parallel_extent


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
@pytest.mark.parametrize(
    "shape",
    [(1, 3, 7, 37), (2, 64), (1, 1000), (1, 2, 5, 197)],
    ids=["tail", "whole_vectors", "one_row", "attention_row"],
)
def test_matches_the_unscheduledsoftmax_func(shape, target):
    func = softmax_func(shape)
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "RowSoftmax"
    assert outer_parallel_extent(scheduled) == int(np.prod(shape[:-1]))
    # scores spread over several units, so that the softmax is far from uniform
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3).astype("float32")
    expected = run(func, [x, np.zeros(shape, "float32")], target)
    assert expected.max() > 2.0 / shape[-1]  # not a flat row
    np.testing.assert_allclose(expected.sum(axis=-1), 1.0, rtol=1e-5)
    assert_close(run(scheduled, [x, np.zeros(shape, "float32")], target), expected)


def test_declines_other_axes_short_rows_and_other_functions():
    assert RowSoftmax().apply(softmax_func((1, 64, 37), axis=1), NATIVE, False) is None
    # an axis as long as the last one: the row maxima have the right shape, the reads do not
    # (found by the differential fuzzer: the rule took it for a last-axis softmax)
    assert RowSoftmax().apply(softmax_func((1, 3, 16, 16), axis=2), NATIVE, False) is None
    short = vector_lanes(NATIVE) - 1
    assert RowSoftmax().apply(softmax_func((4, short)), NATIVE, False) is None
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.log_softmax(x, axis=-1))
        bb.emit_func_output(out)
    assert RowSoftmax().apply(fused_func(bb.get()), NATIVE, False) is None
