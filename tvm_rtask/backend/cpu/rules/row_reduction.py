"""Row-wise reductions (softmax, layer norm): TVM's own ``dlight.cpu.Reduction``, kept to the
functions it was written for.

``dlight.cpu.Reduction`` runs the rows in parallel, moves every block under the row loop and
vectorises the injective blocks. It also accepts any other reduction whose blocks share
leading spatial axes, convolutions included, where it is no gain (a strided convolution that
``Conv2dNCHW`` declines on purpose). :class:`RowReduction` applies it only when every block
reduces one tensor (not two, as a convolution or a product does) over its last axes, and
only when the parallel loop it makes runs over the rows: with one row (a batch-1 softmax over
``[1, 1000]``) dlight parallelises the output's elements instead and recomputes the whole
row's max, exponentials and sum for each of them (1,000 x 1,000 exponentials: 0.94 ms against
ONNX Runtime's 5 us). Such a function, and one of symbolic extents, is left to the next rule.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir.dlight.cpu import Reduction
from tvm.target import Target

from ..tuned import outer_parallel_extent
from .base import CPUScheduleRule, normalized_reductions, uses_any


class RowReduction(CPUScheduleRule):
    """``dlight.cpu.Reduction`` where each reduction block reduces one tensor over its
    trailing axes (softmax, layer norm, global average pooling)."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        found = normalized_reductions(self, func, target)
        if found is None:
            return None
        sch, _, reductions = found
        if not reductions:
            return None
        rows = None
        for info in reductions:
            if "R" in info.dom_kind().rstrip("R"):  # a reduction axis before a spatial one
                return None
            # one tensor reduced (softmax's max and sum, layer norm's moments, a mean; what
            # else they read is per row): convolutions and products reduce two
            stmt = sch.get(info.block_rv)
            reduce = tirx.IterVar.CommReduce
            axes = [iv.var for iv in stmt.iter_vars if iv.iter_type == reduce]
            reduced = {
                read.source.name
                for read in stmt.reads
                if any(uses_any(r.min, axes) for r in read.region)
            }
            if len(reduced) != 1:
                return None
            count = 1
            for extent in (iv.dom.extent for iv in stmt.iter_vars if iv.iter_type != reduce):
                if not isinstance(extent, tirx.IntImm):
                    return None
                count *= int(extent.value)
            rows = count if rows is None else min(rows, count)
        scheduled = Reduction().apply(func, target, tunable)
        if scheduled is None:
            return None
        if outer_parallel_extent(scheduled.mod["main"]) != rows:
            return None  # parallel over something else than the rows (see the docstring)
        return scheduled
