"""Elementwise and other injective operators (a batch norm's scale and shift with its ReLU,
a concatenation, a layout change, a residual add): the output's trailing elements in
vectors, its leading axes in parallel.

Schedule::

    for p in T.parallel(leading):              # the output's leading axes fused: the rTask loop
        for v_o in range(trailing / lanes):     # trailing axes fused until they hold whole vectors
            for v_i in vectorized(lanes):
                out[p, v_o * lanes + v_i] = f(in...[...])   # every producer inlined

Left unscheduled, such an operator was one scalar loop nest (LLVM's loop vectorizer does not
take TVM's flattened indices): DenseNet-121's 58 concatenations with their batch norms and
ReLUs, ``x * scale + shift`` over up to 1,024 channels, took 14% of the model. A
concatenation's ``if_then_else`` chooses its source from the leading axes only, so every lane
of a vector reads the same source. Outputs whose trailing axes hold no whole vector, or that
are not float32, are left to the next rule (the unscheduled TIR).
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.target import Target

from ....tir.common import root_children
from ....tir.schedule import schedule_of
from .base import CPUScheduleRule, extent_of, is_injective, only_injective_blocks, vector_lanes

# leading iterations below which the vectors' loop joins the parallel loop, so that small
# outputs still split over the vEUs (an rTask is a chunk of the parallel loop)
MIN_PARALLEL = 64


def vector_axes(extents: list[int], lanes: int) -> int:
    """How many trailing axes hold whole vectors together: the fewest whose product is a
    multiple of ``lanes``; 0 when even all of them are not."""
    size = 1
    for count, extent in enumerate(reversed(extents), start=1):
        size *= extent
        if size % lanes == 0:
            return count
    return 0


class Elementwise(CPUScheduleRule):
    """See the module docstring."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        if not only_injective_blocks(func):
            return None
        sch = schedule_of(func)
        blocks = root_children(sch)
        if not blocks:
            return None
        *producers, output = blocks
        try:  # every other block is a producer of the last (several outputs: not this rule)
            for block in reversed(producers):
                if not is_injective(sch, block):
                    return None
                sch.compute_inline(block)
        except s_tir.ScheduleError:
            return None
        stmt = sch.get(output)
        if len(stmt.writes) != 1 or str(stmt.writes[0].source.dtype) != "float32":
            return None
        loops = sch.get_loops(output)
        extents = [extent_of(sch, loop) for loop in loops]
        if not loops or len(loops) != len(stmt.iter_vars) or None in extents:
            return None
        lanes = vector_lanes(target)
        trailing = vector_axes(extents, lanes)
        if not trailing:
            return None
        leading = loops[: len(loops) - trailing]
        fused = sch.fuse(*loops[-trailing:]) if trailing > 1 else loops[-1]
        outer, vector = sch.split(fused, [None, lanes])
        sch.vectorize(vector)
        if math.prod(extents[: len(leading)]) < MIN_PARALLEL:
            leading = [*leading, outer]
        par = sch.fuse(*leading) if len(leading) > 1 else leading[0]
        sch.parallel(par)
        return sch


__all__ = ["Elementwise", "vector_axes"]
