"""Direct NCHW convolution as Relax legalizes it (``conv2d_nchw``: n, f, y, x spatial; rc,
ry, rx reduction), with its padding producer and fused epilogue (bias add, relu).

Schedule (per output tile of ``FI`` channels x ``XV`` columns of one row)::

    for p in T.parallel(N * F/FI * H):          # n, f_o, y fused: the rTask loop
        pad rows of this output row             # only when the padding block really pads
        for x_o in range(ceil(W / XV)):         # loop-partition hint: no tail predicate
            acc[FI, XV] = 0                     # register block
            for rc, ry, rx:                     # reduction, weights stream, input row reused
                for f_i in unroll(FI):
                    for x_i in vectorized(XV):  # output columns: contiguous in and out
                        acc[f_i, x_i] += in[rc, y*s + ry, (x_o*XV + x_i)*s + rx] * w[f, rc, ry, rx]
            out[f, y, x] = relu(acc + bias)     # epilogue inlined into the write-back

The accumulator is a ``local`` cache of the output (``cache_write``), so after unrolling
LLVM keeps it in registers; the epilogue is reverse-inlined into the cache's write-back.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.target import Target

from .base import (
    CPUScheduleRule,
    extent_of,
    inline_epilogue,
    is_copy,
    single_reduction,
    split_divisible,
    vector_lanes,
)

PARTITION_HINT = "pragma_loop_partition_hint"


def _is_conv_nchw(sch: s_tir.Schedule, block) -> bool:
    info = get_sblock_info(sch, block)
    if info.dom_kind() != "SSSSRRR":
        return False
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or len(stmt.reads) < 2:
        return False
    ivars = [iv.var for iv in stmt.iter_vars]
    out = stmt.writes[0].region
    if len(out) != 4 or not all(r.min.same_as(v) for r, v in zip(out, ivars[:4], strict=True)):
        return False
    # the weight: [f, rc, ry, rx]
    expect = [ivars[1], *ivars[4:]]
    for read in stmt.reads:
        region = read.region
        if len(region) == 4 and all(r.min.same_as(v) for r, v in zip(region, expect, strict=True)):
            return True
    return False


def width_tile(width: int, lanes: int) -> int:
    """Output columns per register tile, chosen so that no tile has a tail: a multiple of the
    lanes that divides the row, else the whole row when it fits two vectors, else a divisor
    in (lanes/2, 2 lanes], else the smallest divisor in (2 lanes, 5 lanes] (111 -> 37: a
    wide vector LLVM splits), else the lanes (the tail tile is then scalarized: see
    docs/kernel-quality.md)."""
    for tile in (2 * lanes, lanes):
        if width % tile == 0:
            return tile
    if width <= 2 * lanes:
        return width
    for tile in range(2 * lanes, lanes // 2, -1):
        if width % tile == 0:
            return tile
    for tile in range(2 * lanes + 1, 5 * lanes + 1):
        if width % tile == 0:
            return tile
    return lanes


def _column_stride(sch: s_tir.Schedule, conv) -> int:
    """Stride of the input columns (``x * s + rx``); 1 when it cannot be read."""
    stmt = sch.get(conv)
    x_var = stmt.iter_vars[3].var
    for read in stmt.reads:
        index = read.region[-1].min if len(read.region) == 4 else None
        if isinstance(index, tirx.Add):
            index = index.a
        if (
            isinstance(index, tirx.Mul)
            and index.a.same_as(x_var)
            and isinstance(index.b, tirx.IntImm)
        ):
            return int(index.b.value)
    return 1


class Conv2dNCHW(CPUScheduleRule):
    """Register-blocked, vectorised direct convolution; see the module docstring.

    ``acc_vectors``: accumulator registers of one tile (output channels x columns), counted
    in vectors of the target's lanes.
    """

    def __init__(self, acc_vectors: int = 6, max_channel_block: int = 8) -> None:
        self.acc_vectors = acc_vectors
        self.max_channel_block = max_channel_block

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        conv = single_reduction(sch)
        if conv is None or not _is_conv_nchw(sch, conv):
            return None
        if str(sch.get(conv).writes[0].source.dtype) != "float32":
            return None
        # producers: plain copies are inlined, a real padding block is computed per row below
        pads = []
        for producer in sch.get_producers(conv):
            if is_copy(sch, producer):
                sch.compute_inline(producer)
            else:
                pads.append(producer)
        if any(sch.get_producers(p) for p in pads):
            return None
        n, f, y, x, rc, ry, rx = sch.get_loops(conv)
        extents = [extent_of(sch, loop) for loop in (n, f, y, x, rc, ry, rx)]
        if any(e is None for e in extents):
            return None
        _, f_ext, _, x_ext, _, _, rx_ext = extents
        lanes = vector_lanes(target)
        xv = min(width_tile(x_ext, lanes), x_ext)
        if _column_stride(sch, conv) > 1 and xv % lanes:
            # strided columns are gathered lane by lane: only worth it in whole vectors
            # (SqueezeNet's 3x3/2 stem, 111 columns: 3x slower than unscheduled; Inception's
            # 7x7/2 stem, 112 columns: 2.4x faster)
            return None
        budget = self.acc_vectors * lanes
        fi_ext = split_divisible(f_ext, max(1, min(self.max_channel_block, budget // xv)))
        fo, fi = sch.split(f, [None, fi_ext])
        xo, xi = sch.split(x, [None, xv])
        sch.reorder(n, fo, y, xo, rc, ry, rx, fi, xi)
        outer = (n, fo, y)
        acc = sch.cache_write(conv, 0, "local")
        if not inline_epilogue(sch, acc):
            return None
        sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
        par = sch.fuse(*outer)
        for pad in pads:
            sch.compute_at(pad, par, preserve_unit_loops=True)
        # vectorize and parallelize before decompose_reduction: TVM 0.27 refuses to vectorize
        # or parallelize a loop over the update block once its init is split off ("does not
        # have compact dataflow")
        sch.vectorize(xi)
        sch.unroll(fi)
        if rx_ext is not None and rx_ext <= 7:
            sch.unroll(rx)
        sch.parallel(par)
        init = sch.decompose_reduction(conv, rc)
        for block in (init, acc):
            loops = sch.get_loops(block)[2:]  # under par, x_o
            if loops and sch.get(loops[-1]).kind != tirx.ForKind.VECTORIZED:
                if extent_of(sch, loops[-1]) == xv:
                    sch.vectorize(loops[-1])
            for loop in loops[:-1]:
                sch.unroll(loop)
        if x_ext % xv:
            # a tail tile (only where no tile divides the row, e.g. 111): TVM 0.27's
            # LoopPartition pass leaves this nest whole, so the predicated vectorized loop is
            # scalarized, and the schedule primitive ``loop_partition`` segfaults on it
            sch.annotate(xo, PARTITION_HINT, 1)
        return sch
