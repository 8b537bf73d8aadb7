"""FoldConstantLayoutTransforms: a constant's layout_transform computed with numpy, equal to
what TVM's own legalized transform computes."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from tvm_rtask.relax_exprs import op_name
from tvm_rtask.relax_passes.fold_layout_transforms import (
    FoldConstantLayoutTransforms,
    _scattered,
    _split_and_permuted,
)

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


def _operators(mod) -> set:
    """The operators ``mod``'s main function still calls."""
    calls = set()
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.add(op_name(e)))
    return calls


def _reference(mod) -> np.ndarray:
    """TVM's own legalized layout_transform, built and run."""
    ex = tvm.compile(mod, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(np.zeros(1, "float32"))).numpy()


@pytest.mark.parametrize("name", sorted(MAPS))
def test_folded_constant_equals_tvms_transform(name):
    mod = _module(*MAPS[name])
    folded = FoldConstantLayoutTransforms()(mod)
    calls = _operators(folded)
    assert "relax.layout_transform" not in calls
    (binding,) = folded["main"].body.blocks[0].bindings
    assert isinstance(binding.value, Constant)
    np.testing.assert_array_equal(binding.value.value.numpy(), _reference(mod))


def test_padding_without_a_pad_value_is_left_alone():
    # 20 rows in blocks of 8 with no pad value: TVM decides what the padding holds
    mod = _module((20, 4), lambda o, i: (o // 8, i, o % 8), None)
    folded = FoldConstantLayoutTransforms()(mod)
    calls = _operators(folded)
    assert "relax.layout_transform" in calls


SPLITS = {
    "OIHW16o": ((32, 8, 3, 3), lambda o, i, h, w: (o // 16, i, h, w, o % 16)),
    "OIHW8i16o": ((48, 32, 1, 1), lambda o, i, h, w: (o // 16, i // 8, h, w, i % 8, o % 16)),
    "transpose": ((6, 7), lambda a, b: (b, a)),
}


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_split_and_permute_path_equals_the_scatter(name):
    """Maps that split axes and permute them take a reshape and a transpose, which give what
    the general path (one destination index per element) gives."""
    shape, fn = SPLITS[name]
    value = RNG.standard_normal(shape).astype("float32")
    index_map = tvm.tirx.IndexMap.from_func(fn, index_dtype="int64")
    fast = _split_and_permuted(value, index_map)
    assert fast is not None
    np.testing.assert_array_equal(fast, _scattered(value, index_map, None))


@pytest.mark.parametrize(
    "shape, fn",
    [
        ((20, 4), lambda o, i: (o // 8, i, o % 8)),  # 20 is not a multiple of 8: padded
        ((8, 4), lambda o, i: (o // 4, i, o % 2)),  # one axis, two factors
        ((8, 4), lambda o, i: (o + i, o)),  # not a split
    ],
)
def test_other_maps_take_the_general_path(shape, fn):
    value = RNG.standard_normal(shape).astype("float32")
    index_map = tvm.tirx.IndexMap.from_func(fn, index_dtype="int64")
    assert _split_and_permuted(value, index_map) is None


def test_reshape_and_transpose_chains_fold_into_one_constant():
    """A bias reshaped to (1, C, 1, 1) and then blocked, and a dense weight transposed, fold
    to the constants TVM's own build of the same module computes."""
    bias = RNG.standard_normal(32).astype("float32")
    weight = RNG.standard_normal((5, 7)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            b4 = bb.emit(relax.op.reshape(relax.const(bias), (1, 32, 1, 1)))
            blocked = bb.emit(
                relax.op.layout_transform(b4, lambda n, c, h, w: (n, c // 16, h, w, c % 16))
            )
            wt = bb.emit(relax.op.permute_dims(relax.const(weight)))
            ws = bb.emit(relax.op.expand_dims(wt, [0]))
            out = bb.emit_output(relax.Tuple([blocked, ws]))
        bb.emit_func_output(out)
    mod = bb.get()
    folded = FoldConstantLayoutTransforms()(mod)
    calls = _operators(folded)
    assert not {"relax.layout_transform", "relax.reshape", "relax.permute_dims"} & calls
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    expected = vm["main"](tvm.runtime.tensor(np.zeros(1, "float32")))
    got = relax.VirtualMachine(tvm.compile(folded, "llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(np.zeros(1, "float32"))
    )
    for e, g in zip(expected, got, strict=True):
        assert np.abs(e.numpy()).max() > 0.1
        np.testing.assert_array_equal(g.numpy(), e.numpy())


def test_batch_norm_arithmetic_of_constants_folds():
    """sqrt(variance + eps), then blocked: what a batch norm in the blocked layout leaves of
    its constants, folded to what TVM's own build computes (bitwise: IEEE add and sqrt)."""
    variance = RNG.uniform(0.5, 2.0, 32).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            std = bb.emit(relax.op.sqrt(relax.op.add(relax.const(variance), relax.const(1e-5))))
            b4 = bb.emit(relax.op.reshape(std, (1, 32, 1, 1)))
            out = bb.emit_output(
                relax.op.layout_transform(b4, lambda n, c, h, w: (n, c // 16, h, w, c % 16))
            )
        bb.emit_func_output(out)
    mod = bb.get()
    folded = FoldConstantLayoutTransforms()(mod)
    calls = _operators(folded)
    assert not {"relax.add", "relax.sqrt", "relax.layout_transform"} & calls
    np.testing.assert_array_equal(_reference(folded), _reference(mod))
    assert np.abs(_reference(mod)).min() > 0.5
