"""Cutting a scheduled (tuned) CPU kernel into rTasks: along its outer parallel loop, fused
with the spatial loops under it where the parallel loop alone would split unevenly."""

from __future__ import annotations

from tvm import s_tir, te, tirx

from tests.backend.cpu.rules.common import assert_close, random_args, run
from tvm_rtask.backend.cpu.tuned import make_tuned_cpu_rkernel, outer_parallel_extent


def _parallel_outer(compute) -> tirx.PrimFunc:
    """``compute`` scheduled as a tuned kernel is: its outer loop parallel."""
    func = te.create_prim_func(compute())
    sch = s_tir.Schedule(func)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    sch.parallel(sch.get_loops(block)[0])
    return sch.mod["main"]


def _elementwise():
    a = te.placeholder((3, 56), "float32", "a")
    return [a, te.compute((3, 56), lambda i, j: a[i, j] * 2.0 + 1.0, name="c")]


def _row_sums():
    a = te.placeholder((3, 56), "float32", "a")
    k = te.reduce_axis((0, 56), "k")
    return [a, te.compute((3,), lambda i: te.sum(a[i, k], axis=k), name="s")]


def test_three_parallel_iterations_over_two_rtasks_are_fused_with_the_rows_under_them():
    func = _parallel_outer(_elementwise)
    assert outer_parallel_extent(func) == 3
    kernel = make_tuned_cpu_rkernel(func, 2)
    assert kernel.num_rtasks == 2
    text = kernel.func.script()
    assert "84" in text  # 168 iterations, 84 for each rTask
    args = random_args(func)
    assert_close(run(kernel.func, args), run(func, args))


def test_a_reduction_under_the_parallel_loop_is_never_fused_into_the_chunks():
    func = _parallel_outer(_row_sums)
    kernel = make_tuned_cpu_rkernel(func, 2)
    assert kernel.num_rtasks == 2
    assert "84" not in kernel.func.script()  # 3 rows in chunks of 2 and 1, guarded
    args = random_args(func)
    assert_close(run(kernel.func, args), run(func, args))


def test_an_even_split_is_left_as_it_was():
    func = _parallel_outer(_elementwise)
    kernel = make_tuned_cpu_rkernel(func, 3)
    assert kernel.num_rtasks == 3 and "168" not in kernel.func.script()
