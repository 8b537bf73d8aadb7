"""tir.analysis: what a PrimFunc's blocks iterate over, read without a schedule."""

from tvm import te, tirx

from tvm_rtask.backend.cpu.rules.base import only_injective_blocks
from tvm_rtask.tir.analysis import block_iterator_kinds
from tvm_rtask.tuning.tasks import has_reduction


def _matmul() -> tirx.PrimFunc:
    a = te.placeholder((4, 8), name="a")
    b = te.placeholder((8, 3), name="b")
    k = te.reduce_axis((0, 8), name="k")
    c = te.compute((4, 3), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    return te.create_prim_func([a, b, c])


def _add() -> tirx.PrimFunc:
    a = te.placeholder((4, 8), name="a")
    return te.create_prim_func([a, te.compute((4, 8), lambda i, j: a[i, j] + 1.0, name="c")])


def test_kinds_of_a_reduction_and_of_an_elementwise_function():
    assert block_iterator_kinds(_matmul()) == {tirx.IterVar.DataPar, tirx.IterVar.CommReduce}
    assert block_iterator_kinds(_add()) == {tirx.IterVar.DataPar}
    assert has_reduction(_matmul()) and not has_reduction(_add())
    assert only_injective_blocks(_add()) and not only_injective_blocks(_matmul())
