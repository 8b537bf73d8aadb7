"""MergedParamReads: FuseTIR keeps one read region of a buffer that two parameters of a fused
PrimFunc became (``concat((y, y))`` after the operator that makes ``y``); the pass derives the
regions again from the loads, and ``compute_at`` then computes all that the block reads."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir
from tvm.script import tirx as T

from tvm_rtask.relax_passes.merged_reads import merge_param_reads


@T.prim_func(s_tir=True)
def _doubled_then_concat_with_itself(
    a: T.Buffer((2, 3), "float32"), c: T.Buffer((2, 6), "float32")
):
    """What FuseTIR makes of ``y = 2 * a; concat((y, y), axis=1)``: one read region of ``y``
    for two loads of it (the first parameter's, ``y[i, j - 3]``)."""
    y = T.sblock_alloc_buffer((2, 3))
    for i, j in T.grid(2, 3):
        with T.sblock("doubled"):
            vi, vj = T.axis.remap("SS", [i, j])
            y[vi, vj] = a[vi, vj] * T.float32(2)
    for i, j in T.grid(2, 6):
        with T.sblock("concat"):
            vi, vj = T.axis.remap("SS", [i, j])
            T.reads(y[vi, vj - 3])
            T.writes(c[vi, vj])
            c[vi, vj] = T.if_then_else(3 <= vj, y[vi, vj - 3], y[vi, vj])


def _computed_at_concat(func):
    sch = s_tir.Schedule(func)
    sch.compute_at(sch.get_sblock("doubled"), sch.get_loops(sch.get_sblock("concat"))[1])
    a = np.arange(6, dtype="float32").reshape(2, 3) + 1
    c = tvm.runtime.tensor(np.full((2, 6), np.nan, "float32"))
    tvm.compile(sch.mod["main"], "llvm")(tvm.runtime.tensor(a), c)
    return c.numpy(), np.concatenate([2 * a, 2 * a], axis=1)


def test_one_read_region_for_two_loads_computes_half_of_what_is_read():
    got, want = _computed_at_concat(_doubled_then_concat_with_itself)
    assert not np.array_equal(got, want)  # the defect the pass is for


def test_merged_reads_cover_both_loads():
    fixed = merge_param_reads(_doubled_then_concat_with_itself)
    regions = []

    def visit(block):
        if str(block.name_hint) == "concat":
            regions.extend(block.reads)
        return block

    tvm_ffi.structural_map(fixed.body, (s_tir.SBlock, visit))
    assert len(regions) == 1  # y[vi, vj - 3 : vj + 1]: both loads
    column = regions[0].region[1]
    assert int(column.extent) == 4
    got, want = _computed_at_concat(fixed)
    np.testing.assert_array_equal(got, want)


def test_blocks_with_one_load_per_buffer_are_left_alone():
    @T.prim_func(s_tir=True)
    def scaled(a: T.Buffer((4,), "float32"), c: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("scale"):
                vi = T.axis.remap("S", [i])
                c[vi] = a[vi] * a[vi]

    assert merge_param_reads(scaled).same_as(scaled)
