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

import math

from tvm import s_tir, tirx
from tvm.target import Target

from ....tir.common import root_children
from .base import CPUScheduleRule, extent_of, normalized_reductions, vector_lanes


def _reduced_axes(sch: s_tir.Schedule, block) -> int:
    """How many trailing iterators ``block`` reduces when it is ``out[s...] += in[s...,
    r...]``: float32, the reduced axes last, one tensor read; 0 when it is not that."""
    stmt = sch.get(block)
    if stmt.init is None or len(stmt.writes) != 1:
        return 0
    out = stmt.writes[0].source
    inputs = [r for r in stmt.reads if not r.source.same_as(out)]
    if len(inputs) != 1:
        return 0
    body = stmt.body
    if not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tirx.Add):
        return 0
    if str(body.buffer.dtype) != "float32":
        return 0
    reduce_kind = tirx.IterVar.CommReduce
    kinds = "".join("R" if iv.iter_type == reduce_kind else "S" for iv in stmt.iter_vars)
    reduced = kinds.count("R")
    if not 0 < reduced < len(kinds) or kinds != "S" * (len(kinds) - reduced) + "R" * reduced:
        return 0
    # the reduced iterators index the read tensor's trailing axes, in order (a sum over a
    # leading axis would gather with a stride)
    region = inputs[0].region
    axes = [iv.var for iv in stmt.iter_vars[-reduced:]]
    trailing = [r.min for r in region[-reduced:]]
    in_order = len(region) >= reduced and all(
        isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(trailing, axes, strict=True)
    )
    return reduced if in_order else 0


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
        found = normalized_reductions(self, func, target)
        if found is None:
            return None
        sch, infos, reductions = found
        if len(reductions) != 1 or infos[0] is not reductions[0]:
            return None
        block = reductions[0].block_rv
        reduced = _reduced_axes(sch, block)
        loops = sch.get_loops(block)
        if not reduced or len(loops) != len(sch.get(block).iter_vars):
            return None
        extents = [extent_of(sch, loop) for loop in loops]
        if any(e is None for e in extents):
            return None
        # normalized: one loop per iterator, the spatial ones first
        spatial, reduce = loops[:-reduced], loops[-reduced:]
        size = math.prod(extents[-reduced:])
        lanes = vector_lanes(target)
        width = row_width(size, lanes, self.accumulators)
        if width is None or size < self.min_vectors * lanes:
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
