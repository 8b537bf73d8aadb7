"""NCHW pooling as Relax legalizes it (``pool_max`` / ``pool_sum`` + ``pool_avg``: n, c, y,
x spatial; the window's two axes reduction), with its padding producer.

Schedule::

    for p in T.parallel(N * C * H):        # n, c, y fused: the rTask loop
        pad rows of this output row        # only when the padding block really pads
        for x_o in range(W / XV):
            acc[XV] = init
            for ry, rx (unrolled):
                for x_i in vectorized(XV): acc[x_i] = max(acc[x_i], in[..., (x_o*XV + x_i)*s + rx])
            out[...] = acc (/ window)      # epilogue (average) inlined into the write-back

The window loops sit outside the vectorized columns, so each window offset is one (strided)
vector load instead of a scalar reduction per output.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.target import Target

from .base import (
    CPUScheduleRule,
    deinterleave_columns,
    finish_tile_blocks,
    float32_reduction,
    inline_epilogue,
    split_producers,
    vector_lanes,
    with_last_tile_shifted,
)
from .conv2d_nchw import column_stride, width_tile


def _is_pool_nchw(sch: s_tir.Schedule, block) -> bool:
    if get_sblock_info(sch, block).dom_kind() != "SSSSRR":
        return False
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or len(stmt.reads) != 1:
        return False
    ivars = [iv.var for iv in stmt.iter_vars]
    out = stmt.writes[0].region
    return len(out) == 4 and all(r.min.same_as(v) for r, v in zip(out, ivars[:4], strict=True))


class Pool2dNCHW(CPUScheduleRule):
    """Vectorised max / average pooling; see the module docstring."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        found = float32_reduction(self, func, target, _is_pool_nchw)
        if found is None:
            return None
        sch, pool, (n, c, y, x, ry, rx), extents = found
        pads = split_producers(sch, pool)
        if pads is None:
            return None
        x_ext, rx_ext = extents[3], extents[5]
        if extents[2] == 1 and x_ext == 1:  # global pooling: a row sum (RowSum, RowReduction)
            return None
        stride = column_stride(sch, pool)
        lanes = vector_lanes(target)
        if stride > 1 and not pads and x_ext < 2 * lanes:
            # the de-interleaved copy of the whole input costs more than the narrow rows
            # save (Inception v3's 3x3/2 pools at 17 and 8 columns: 42 -> 88, 31 -> 38 us)
            return None
        xv = width_tile(x_ext, lanes)
        xo, xi = sch.split(x, [None, xv])
        sch.reorder(n, c, y, xo, ry, rx, xi)
        acc = sch.cache_write(pool, 0, "local")
        if not inline_epilogue(sch, acc):
            return None
        sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
        # one channel a parallel iteration: its padded (or de-interleaved) input is made
        # once, not once for each output row that reads it
        par = sch.fuse(n, c)
        if stride > 1:
            # the columns of each phase of the stride together (as Conv2dNCHW's strided
            # rows): ``x*s + rx`` is column ``x + rx//s`` of phase ``rx % s``, so a vector of
            # outputs reads one contiguous vector instead of a gather
            if not pads:
                pads = [sch.cache_read(pool, 0, "global")]
            deinterleave_columns(sch, pads[0], stride)
        for pad in pads:
            sch.compute_at(pad, par, preserve_unit_loops=True)
        sch.vectorize(xi)
        if rx_ext <= 7:
            sch.unroll(rx)
        sch.parallel(par)  # before decompose_reduction (see conv2d_nchw)
        init = sch.decompose_reduction(pool, ry)
        finish_tile_blocks(sch, (init, acc), xo, xv)
        return with_last_tile_shifted(sch, xo, xv, x_ext)
