"""Depthwise NCHW convolution (``group_conv2d_nchw`` with one input channel per group and one
output channel per input channel), its padding block and fused epilogue.

Schedule (one channel an rTask, rows of ``YR`` outputs, vectors of output columns)::

    for c in T.parallel(N * C):                 # the rTask loop: one channel plane each
        pad the channel's whole plane once     # de-interleaved by column phase if strided
        for y_o in range(H / YR):
            for x_o in range(ceil(W / XV)):     # last tile shifted back to end at W
                acc[YR, XV] = 0
                for ry in unroll(K), rx in unroll(K), y_i in unroll(YR):
                    for x_i in vectorized(XV):
                        acc[y_i, x_i] += in[c, y*s + ry, x*s + rx] * w[c, 0, ry, rx]
                out[c, y, x] = epilogue(acc)

Why not :class:`Conv2dNCHW`: its tiles hold several channels and pad the input rows of a
row tile for every channel block. A depthwise channel reads only its own plane, so the
rows of one tile were padded again for each row tile (3x the plane for a 5x5 kernel on 14
rows) and the weights of several channels were broadcast where one channel's weights could
stay in registers; with the filter window unrolled, the input vectors of neighbouring
output rows are the same loads. Strided convolutions read a de-interleaved copy made
during the padding (``x*s + rx`` is column ``x + rx//s`` of phase ``rx % s``), which
``Conv2dNCHW`` declines for depthwise kernels.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import (
    CPUScheduleRule,
    deinterleave_columns,
    epilogue_tail,
    finish_tile_blocks,
    float32_reduction,
    split_divisible,
    split_producers,
    vector_lanes,
    vector_registers,
    with_last_tile_shifted,
)
from .conv2d_nchw import _input_read, _is_conv_nchw, column_stride, tail_in_tile, width_tile


def _is_depthwise(sch: s_tir.Schedule, block) -> bool:
    """An NCHW convolution whose reduction over input channels has extent 1 and whose input
    channel is the output channel (``in[n, f + rc, ...]``)."""
    if not _is_conv_nchw(sch, block):
        return False
    stmt = sch.get(block)
    if int(stmt.iter_vars[4].dom.extent) != 1:
        return False
    f_var = stmt.iter_vars[1].var
    channel = stmt.reads[_input_read(sch, block)].region[1].min
    if isinstance(channel, tirx.Add):
        channel = channel.a
    return isinstance(channel, tirx.Var) and channel.same_as(f_var)


def row_tile(rows: int, window: int, registers: int, max_rows: int) -> int:
    """Output rows of a tile: the largest divisor of ``rows`` up to ``max_rows`` whose
    accumulators fit beside the window's weights (``window`` broadcasts) in ``registers``;
    at least 1."""
    room = registers - window - 2
    return split_divisible(rows, max(1, min(max_rows, room)))


class DepthwiseConv2dNCHW(CPUScheduleRule):
    """One channel plane an rTask, padded once; see the module docstring.

    ``max_rows``: the largest row tile. ``unroll_window``: filter windows up to this many
    taps are unrolled whole (their weights held in registers beside the row tile), larger
    ones along their columns only. ``min_strided_window``: strided convolutions with a
    smaller window are declined (none by default: with the copy written phase by phase, a
    3x3/2 kernel runs 1.3-1.6x faster than the unscheduled TIR). ``min_width_vectors``:
    stride-1 rows narrower than this many vectors are left to :class:`Conv2dNCHW`, whose
    tiles of several channels fill part-filled vectors better (7 columns: 1.2x slower
    here)."""

    def __init__(
        self,
        max_rows: int = 8,
        unroll_window: int = 25,
        min_strided_window: int = 0,
        min_width_vectors: float = 0.5,
    ):
        self.max_rows = max_rows
        self.unroll_window = unroll_window
        self.min_strided_window = min_strided_window
        self.min_width_vectors = min_width_vectors

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        found = float32_reduction(self, func, target, _is_depthwise)
        if found is None:
            return None
        sch, conv, (n, f, y, x, rc, ry, rx), extents = found
        pads = split_producers(sch, conv)
        if pads is None or len(pads) > 1:
            return None
        _, _, y_ext, x_ext, _, ry_ext, rx_ext = extents
        stride = column_stride(sch, conv)
        lanes = vector_lanes(target)
        window = ry_ext * rx_ext
        if stride > 1 and window < self.min_strided_window:
            return None
        if stride == 1 and x_ext < self.min_width_vectors * lanes:
            return None
        xv = width_tile(x_ext, lanes)
        unrolled = window if window <= self.unroll_window else rx_ext
        yr = row_tile(y_ext, unrolled, vector_registers(target), self.max_rows)
        yo, yi = sch.split(y, [None, yr])
        xo, xi = sch.split(x, [None, xv])
        sch.reorder(n, f, yo, xo, rc, ry, rx, yi, xi)
        if stride > 1:
            if not pads:
                pads = [sch.cache_read(conv, _input_read(sch, conv), "global")]
            deinterleave_columns(sch, pads[0], stride)
        acc = sch.cache_write(conv, 0, "local")
        handled, tail = epilogue_tail(sch, acc)
        if not handled:
            return None
        sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
        par = sch.fuse(n, f)
        for pad in pads:
            sch.compute_at(pad, par, preserve_unit_loops=True)
        if tail is not None and not tail_in_tile(sch, tail, par, lanes):
            return None
        sch.vectorize(xi)
        sch.unroll(yi)
        sch.unroll(rx)
        if window <= self.unroll_window:
            sch.unroll(ry)
        sch.parallel(par)
        init = sch.decompose_reduction(conv, rc)
        finish_tile_blocks(sch, (init, acc), xo, xv)
        return with_last_tile_shifted(sch, xo, xv, x_ext)


__all__ = ["DepthwiseConv2dNCHW", "row_tile"]
