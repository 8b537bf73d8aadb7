"""A window over each channel block in NCHWc: depthwise convolutions
(``depthwise_conv2d_nchwc``, made by ``backend/cpu/blocked_channels.py``) and max / average
pooling (TOPI's ``pool2d`` in ``NCHW16c``). One vector is the ``b`` channels of one pixel, so
every lane is useful whatever the row width and the stride, and a strided window reads whole
vectors (no de-interleaved copy, as :class:`DepthwiseConv2dNCHW` needs in NCHW).

Schedule (a register tile of ``P`` output columns of one channel block)::

    for p in T.parallel(N * C/b * H/band):     # a channel block and a band of rows
        pad the band's input rows               # only when the padding block really pads
        for y in range(band):
            for x_o in range(ceil(W / P)):      # last tile shifted back to end at W
                acc[P, b] = 0
                for ry in unroll(KH), rx in unroll(KW):
                    for x_i in unroll(P):
                        for c in vectorized(b):
                            acc[x_i, c] += in[cb, y*s + ry, (x_o*P + x_i)*s + rx, c]
                                           * w[cb, 0, ry, rx, c]
                out[cb, y, x, c] = epilogue(acc)

Each tap loads one weight vector for ``P`` FMAs, each FMA one input vector: the kernel is
bound by memory, as depthwise convolutions are; a pool is the same without the weights
(its average's division inlined into the write-back). A pool does one comparison or add per
loaded vector, so the band's padded copy (a write and a second read of its input) would
cost as much as the pool: its padding is inlined instead, one branch on the tap's row and
column that is taken the same way everywhere but at the borders. Returns None for anything
else.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.target import Target

from .base import (
    CPUScheduleRule,
    epilogue_tail,
    finish_tile_blocks,
    float32_reduction,
    split_producers,
    vector_lanes,
    vector_registers,
    with_last_tile_shifted,
)

# the bands of rows and channel blocks make at least MIN_TASKS parallel tasks where the rows
# allow (two vEUs of two rTasks each, with room to balance)
MIN_TASKS = 8
MIN_COLUMNS = 4


def _channel_block(sch: s_tir.Schedule, block) -> int | None:
    """``b`` when ``block`` is a window over NCHWc channel blocks: ``SSSSSRR``, writing
    ``[n, cb, y, x, c]`` of a last axis ``b`` wide, reading a 5-D input (a pool) and a 5-D
    weight (a depthwise convolution) of that width; else None."""
    if get_sblock_info(sch, block).dom_kind() != "SSSSSRR":
        return None
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or len(stmt.reads) not in (1, 2):
        return None
    ivars = [iv.var for iv in stmt.iter_vars]
    out = stmt.writes[0]
    if len(out.region) != 5 or not all(
        r.min.same_as(v) for r, v in zip(out.region, ivars[:5], strict=True)
    ):
        return None
    width = out.source.shape[4]
    if not isinstance(width, tirx.IntImm):
        return None
    for read in stmt.reads:
        shape = read.source.shape
        if len(shape) != 5 or not isinstance(shape[4], tirx.IntImm):
            return None
        if int(shape[4].value) != int(width.value):
            return None
    return int(width.value)


def band_rows(height: int, blocks: int) -> int:
    """Rows of one task: the most that divide ``height`` while the channel blocks and
    bands still make :data:`MIN_TASKS` tasks (one row at least)."""
    for band in range(height, 0, -1):
        if height % band == 0 and blocks * (height // band) >= MIN_TASKS:
            return band
    return 1


class WindowNCHWc(CPUScheduleRule):
    """Depthwise convolution or pooling in NCHWc: a register tile of columns of one channel
    block; see the module docstring. ``max_cols``: the most columns of a tile;
    ``unroll_window``: windows of up to this many taps are unrolled (a large pooling
    window is a loop); ``inline_pool_padding``: a pool reads its input through the padding's
    condition instead of a padded copy of the band (see the module docstring)."""

    def __init__(
        self, max_cols: int = 8, unroll_window: int = 25, inline_pool_padding: bool = True
    ):
        self.max_cols = max_cols
        self.unroll_window = unroll_window
        self.inline_pool_padding = inline_pool_padding

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        found = float32_reduction(
            self, func, target, lambda sch, block: _channel_block(sch, block) is not None
        )
        if found is None:
            return None
        sch, conv, (n, cb, y, x, c, ry, rx), extents = found
        if _channel_block(sch, conv) != vector_lanes(target):
            return None
        pads = split_producers(sch, conv)
        if pads is None or len(pads) > 1:
            return None
        _, cb_ext, y_ext, x_ext, lanes, ry_ext, rx_ext = extents
        cols = min(self.max_cols, vector_registers(target) - 2, x_ext)
        # a tile that divides the row where one of MIN_COLUMNS or more does (else the last
        # tile shifted back: rows of 17 in tiles of one column would waste the registers)
        dividing = [t for t in range(MIN_COLUMNS, cols + 1) if x_ext % t == 0]
        cols = max(dividing) if dividing else cols
        yo, yi = sch.split(y, [None, band_rows(y_ext, cb_ext)])
        xo, xi = sch.split(x, [None, cols])
        sch.reorder(n, cb, yo, yi, xo, ry, rx, xi, c)
        acc = sch.cache_write(conv, 0, "local")
        handled, tail = epilogue_tail(sch, acc)
        if not handled or tail is not None:
            return None
        sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
        par = sch.fuse(n, cb, yo)
        pool = len(sch.get(conv).reads) == 1
        for pad in pads:
            if pool and self.inline_pool_padding:
                sch.compute_inline(pad)
                continue
            sch.compute_at(pad, par, preserve_unit_loops=True)
            pad_loops = sch.get_loops(pad)
            sch.vectorize(pad_loops[-1])
        sch.vectorize(c)
        sch.unroll(xi)
        if ry_ext * rx_ext <= self.unroll_window:
            sch.unroll(rx)
            sch.unroll(ry)
        sch.parallel(par)
        init = sch.decompose_reduction(conv, ry)
        finish_tile_blocks(sch, (init, acc), xo, lanes)
        return with_last_tile_shifted(sch, xo, cols, x_ext)


__all__ = ["WindowNCHWc", "band_rows"]
