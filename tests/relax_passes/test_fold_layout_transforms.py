"""FoldConstantLayoutTransforms: a constant's layout_transform computed with numpy, equal to
what TVM's own legalized transform computes."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from tvm_rtask.relax_exprs import op_name
from tvm_rtask.relax_passes.fold_layout_transforms import FoldConstantLayoutTransforms

RNG = np.random.default_rng(0)

MAPS = {
    # the blocked layout's weights (OIHW -> OIHW{T}o) and data (NCHW -> NCHW{b}c)
    "OIHW16o": ((32, 8, 3, 3), lambda o, i, h, w: (o // 16, i, h, w, o % 16), None),
    "NCHW8c": ((1, 24, 5, 5), lambda n, c, h, w: (n, c // 8, h, w, c % 8), None),
    # 20 channels in blocks of 8: the last block padded with the pad value
    "padded": ((20, 4, 1, 1), lambda o, i, h, w: (o // 8, i, h, w, o % 8), 0.0),
    "transpose": ((6, 7), lambda a, b: (b, a), None),
}


def _module(shape, index_map, pad_value):
    value = RNG.standard_normal(shape).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(
                relax.op.layout_transform(relax.const(value), index_map, pad_value=pad_value)
            )
        bb.emit_func_output(y)
    return bb.get()


def _reference(mod) -> np.ndarray:
    """TVM's own legalized layout_transform, built and run."""
    ex = tvm.compile(mod, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(np.zeros(1, "float32"))).numpy()


@pytest.mark.parametrize("name", sorted(MAPS))
def test_folded_constant_equals_tvms_transform(name):
    mod = _module(*MAPS[name])
    folded = FoldConstantLayoutTransforms()(mod)
    calls = []
    relax.analysis.post_order_visit(folded["main"], lambda e: calls.append(op_name(e)))
    assert "relax.layout_transform" not in calls
    (binding,) = folded["main"].body.blocks[0].bindings
    assert isinstance(binding.value, Constant)
    np.testing.assert_array_equal(binding.value.value.numpy(), _reference(mod))


def test_padding_without_a_pad_value_is_left_alone():
    # 20 rows in blocks of 8 with no pad value: TVM decides what the padding holds
    mod = _module((20, 4), lambda o, i: (o // 8, i, o % 8), None)
    folded = FoldConstantLayoutTransforms()(mod)
    calls = []
    relax.analysis.post_order_visit(folded["main"], lambda e: calls.append(op_name(e)))
    assert "relax.layout_transform" in calls
