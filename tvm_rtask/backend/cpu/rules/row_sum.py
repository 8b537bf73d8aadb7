"""A sum over trailing axes (global average pooling, the mean of a squeeze-and-excitation
block), with its injective epilogue: the rows in parallel, the reduction vectorised.

Schedule::

    for row in T.parallel(rows):                 # n, c fused: the rTask loop
        part[L] = 0
        for k_o in range(K / L):                  # L = lanes x accumulators
            for k_i in vectorized(L):
                part[k_i] += x[row, k_o * L + k_i]    # independent vector adds
        out[row] = epilogue(sum(part))            # one horizontal sum per row

``RowReduction`` (dlight's ``Reduction``) adds the row's elements one after another: every
add waits for the one before it, so a 56x56 mean is 3,136 dependent adds (EfficientNet-B0's
first squeeze-and-excitation mean took 119 us of its 7 ms in the model). Here the partial
sums are ``rfactor``-ed over ``L`` lanes, several vectors of them, so the adds are
independent. The order of the additions changes (relative error about 1e-7).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.target import Target

from ....tir.common import root_children
from .base import CPUScheduleRule, extent_of, vector_lanes


def _is_row_sum(sch: s_tir.Schedule, block) -> bool:
    """``out[s...] += in[s..., r...]``: float32, the reduced axes last, one tensor read."""
    stmt = sch.get(block)
    if stmt.init is None or len(stmt.writes) != 1:
        return False
    out = stmt.writes[0].source
    if len([r for r in stmt.reads if not r.source.same_as(out)]) != 1:
        return False
    body = stmt.body
    if not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tirx.Add):
        return False
    if str(body.buffer.dtype) != "float32":
        return False
    reduce_kind = tirx.IterVar.CommReduce
    kinds = "".join("R" if iv.iter_type == reduce_kind else "S" for iv in stmt.iter_vars)
    reduced = kinds.count("R")
    if not 0 < reduced < len(kinds) or kinds != "S" * (len(kinds) - reduced) + "R" * reduced:
        return False
    # the reduced iterators index the read tensor's trailing axes, in order (a sum over a
    # leading axis would gather with a stride)
    (read,) = [r for r in stmt.reads if not r.source.same_as(out)]
    axes = [iv.var for iv in stmt.iter_vars[-reduced:]]
    trailing = [r.min for r in read.region[-reduced:]]
    return len(read.region) >= reduced and all(
        isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(trailing, axes, strict=True)
    )


def row_width(size: int, lanes: int, accumulators: int) -> int | None:
    """Partial sums per row: the largest multiple of ``lanes`` up to ``accumulators``
    vectors that divides ``size``; else the largest divisor from half a vector up (49 of a
    7x7 map: three vectors and a lane); None when there is none."""
    most = lanes * accumulators
    for width in range(most, lanes - 1, -lanes):
        if size % width == 0:
            return width
    for width in range(min(most, size), lanes // 2 - 1, -1):
        if size % width == 0:
            return width
    return None


class RowSum(CPUScheduleRule):
    """See the module docstring. ``accumulators``: vectors of partial sums per row;
    ``min_vectors``: rows shorter than this many vectors are left to the next rule."""

    def __init__(self, accumulators: int = 4, min_vectors: int = 4):
        self.accumulators = accumulators
        self.min_vectors = min_vectors

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos:
            return None
        reductions = [info for info in infos if not info.is_injective()]
        if len(reductions) != 1 or infos[0] is not reductions[0]:
            return None
        block = reductions[0].block_rv
        if not _is_row_sum(sch, block):
            return None
        loops = sch.get_loops(block)
        stmt = sch.get(block)
        kinds = [iv.iter_type == tirx.IterVar.CommReduce for iv in stmt.iter_vars]
        if len(loops) != len(kinds):
            return None
        extents = [extent_of(sch, loop) for loop in loops]
        if any(e is None for e in extents):
            return None
        spatial = [lp for lp, r in zip(loops, kinds, strict=True) if not r]
        reduce = [lp for lp, r in zip(loops, kinds, strict=True) if r]
        size = 1
        for r, e in zip(kinds, extents, strict=True):
            if r:
                size *= e
        lanes = vector_lanes(target)
        width = row_width(size, lanes, self.accumulators)
        if width is None or size < self.min_vectors * lanes or not spatial:
            return None
        epilogue = [b for b in root_children(sch) if not sch.get(b).same_as(sch.get(block))]
        r = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
        _, ri = sch.split(r, [None, width])
        part = sch.rfactor(ri, len(spatial))
        loops = sch.get_loops(part)
        par = sch.fuse(*loops[: len(spatial)]) if len(spatial) > 1 else loops[0]
        try:  # the sum and its epilogue (the mean's divide) row by row, in order
            for later in [block, *epilogue]:
                sch.reverse_compute_at(later, par, preserve_unit_loops=True)
        except s_tir.ScheduleError:
            return None
        sch.set_scope(part, 0, "local")
        k_o, k_i = sch.get_loops(part)[-2:]
        sch.vectorize(k_i)
        sch.parallel(par)
        init = sch.decompose_reduction(part, k_o)
        sch.vectorize(sch.get_loops(init)[-1])
        return sch


__all__ = ["RowSum"]
