"""RowPartials: layer norm rows with their sums in vectors of partial results."""

import numpy as np
import pytest
from tvm import relax

from tests.backend.cpu.rules.common import LLVM, NATIVE, assert_close, fused_func, run
from tvm_rtask.backend.cpu.rules import RULE_ATTR, RowPartials, schedule_cpu_func
from tvm_rtask.backend.cpu.tuned import outer_parallel_extent


def _layer_norm(shape):
    rng = np.random.default_rng(0)
    gamma, beta = (relax.const(rng.standard_normal(shape[-1]).astype("float32")) for _ in "gb")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=1e-6)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return fused_func(bb.get())


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
@pytest.mark.parametrize("shape", [(1, 7, 64), (1, 3, 5, 96), (2, 32)])
def test_layer_norm_matches_the_unscheduled_function(shape, target):
    func = _layer_norm(shape)
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "RowPartials"
    assert outer_parallel_extent(scheduled) == int(np.prod(shape[:-1]))
    rng = np.random.default_rng(1)
    # rows with an offset and a spread of their own, so that mean and variance both matter
    x = rng.standard_normal(shape) * rng.uniform(0.5, 4, (*shape[:-1], 1))
    x = (x + rng.uniform(-3, 3, (*shape[:-1], 1))).astype("float32")
    gamma, beta = (rng.standard_normal(shape[-1]).astype("float32") for _ in "gb")
    args = [x, gamma, beta, np.zeros(shape, "float32")]
    expected = run(func, args, target)
    assert np.abs(expected).max() > 0.5
    assert_close(run(scheduled, args, target), expected)


def test_declines_rows_that_are_not_whole_vectors():
    assert RowPartials().apply(_layer_norm((1, 5, 45)), NATIVE, False) is None
