"""Row-wise normalizations (layer norm, and any function of its shape: reductions over the
rows' last axis and element-wise work on the rows): every block under one parallel loop over
the rows, each reduction kept in a vector of partial results.

``RowReduction`` (dlight's ``Reduction``) adds a row's elements one after another, each add
waiting for the one before it. Timed alone on 2 threads, a layer norm over ViT-B/16's
``[1, 197, 768]`` took 172 us against ONNX Runtime's 50 us.

Schedule (rows of ``L`` elements, ``L`` a multiple of the vector's ``lanes``)::

    for row in T.parallel(rows):                       # leading axes fused: the rTask loop
        part[lanes] = 0
        for v in range(L / lanes):
            part[0:lanes] += x[row, v*lanes : (v+1)*lanes]    # rfactor: independent lanes
        mean = sum(part) / L                            # one horizontal sum
        ... (the variance the same way)
        out[row, 0:L] = (x - mean) * ... in vectors     # the injective blocks

The order of the additions changes (relative error about 1e-7). A function with a block
that does not follow the rows, or a row that is not whole vectors, is left to the next rule.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import (
    CPUScheduleRule,
    extent_of,
    loops_below,
    normalized_reductions,
    vector_lanes,
)


def _is_row_block(sch: s_tir.Schedule, block, lead: list[int], length: int) -> bool:
    """The block's iterators are the rows (``lead``), then either nothing, the row's
    elements (spatial) or the row's elements reduced."""
    stmt = sch.get(block)
    extents = [iv.dom.extent for iv in stmt.iter_vars]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return False
    extents = [int(e) for e in extents]
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if extents[: len(lead)] != lead or any(k != tirx.IterVar.DataPar for k in kinds[: len(lead)]):
        return False
    rest = extents[len(lead) :]
    return rest == [] or rest == [length]


class RowPartials(CPUScheduleRule):
    """See the module docstring."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        found = normalized_reductions(self, func, target)
        if found is None:
            return None
        sch, infos, reductions = found
        if not reductions or len(infos) < 2:
            return None
        output = infos[-1].block_rv
        out_vars = sch.get(output).iter_vars
        if any(
            iv.iter_type != tirx.IterVar.DataPar or not isinstance(iv.dom.extent, tirx.IntImm)
            for iv in out_vars
        ):
            return None  # the output is the rows' elements, of static extents
        *lead, length = [int(iv.dom.extent) for iv in out_vars]
        lanes = vector_lanes(target)
        if not lead or length % lanes or length < lanes:
            return None
        for info in infos:
            if not _is_row_block(sch, info.block_rv, lead, length):
                return None
        for info in reductions:
            stmt = sch.get(info.block_rv)
            if len(stmt.iter_vars) != len(lead) + 1 or stmt.iter_vars[-1].iter_type != (
                tirx.IterVar.CommReduce
            ):
                return None
        # reductions: lanes of partial results, one per vector lane (before compute_at: an
        # rfactor needs the block alone under its loops)
        partials = []
        for info in reductions:
            k = sch.get_loops(info.block_rv)[-1]
            _, lane = sch.split(k, [None, lanes])
            # the lanes last in the partial results' buffer: vectors of them are contiguous
            partials.append(sch.rfactor(lane, len(sch.get(info.block_rv).writes[0].region)))
        loops = sch.get_loops(output)
        row = sch.fuse(*loops[: len(lead)]) if len(lead) > 1 else loops[0]
        blocks = [info.block_rv for info in infos[:-1]]
        for block in reversed(self._in_order(sch, blocks, partials)):
            sch.compute_at(block, row, preserve_unit_loops=True)
        # parallel and vectorized before decompose_reduction (TVM 0.27 refuses both after it)
        sch.parallel(row)
        _, k_out = sch.split(sch.get_loops(output)[-1], [None, lanes])
        sch.vectorize(k_out)
        for block in blocks:
            below = sch.get_loops(block)
            if sch.get(block).init is None and len(sch.get(block).iter_vars) == len(lead) + 1:
                _, inner = sch.split(below[-1], [None, lanes])  # an injective row
                sch.vectorize(inner)
        for part in partials:
            # below the row: the lanes (spatial, ``lanes``), the vector steps (reduced) and
            # unit loops, in the rfactor block's iterator order; the lanes go innermost
            below = [lp for lp in loops_below(sch, part, row) if extent_of(sch, lp) != 1]
            if len(below) != 2 or extent_of(sch, below[0]) != lanes:
                return None
            lane, step = below
            sch.reorder(step, lane)
            sch.vectorize(lane)
            init = sch.decompose_reduction(part, step)
            sch.vectorize(sch.get_loops(init)[-1])
        return sch

    @staticmethod
    def _in_order(sch, blocks, partials):
        """The blocks before the output in dataflow order, each rfactor block just before
        the reduction it feeds."""
        ordered = []
        for block in blocks:
            for part in partials:
                consumers = sch.get_consumers(part)
                if any(sch.get(c).same_as(sch.get(block)) for c in consumers):
                    ordered.append(part)
            ordered.append(block)
        return ordered


__all__ = ["RowPartials"]
