"""NCHW convolution with output-channel panels (``conv2d_packed``, made by
``backend/cpu/pack_conv_weights.py``): vectors along the output channels, so every lane is
useful whatever the row width and the stride.

Schedule (per register tile of ``T`` channels = ``NC`` vectors x ``P`` output columns)::

    for p in T.parallel(N * F/T * H):        # n, f_o, y fused: the rTask loop
        pad the input rows of output row y   # only when the padding block really pads
        for x_o in range(ceil(W / P)):       # last tile shifted back to end at W
            acc[NC, P, lanes] = 0            # register tile
            for rc, ry, rx:
                for v in unroll(NC):                     # one panel load per vector
                    for x_i in unroll(P):                # one broadcast input per column
                        for f_l in vectorized(lanes):
                            acc[v, x_i, f_l] += in[rc, y*s + ry, (x_o*P + x_i)*s + rx]
                                                * Wp[f_o, rc, ry, rx, v*lanes + f_l]
            for x_i, v: out[f, y, x] = relu(acc + bias)  # channel vectors, epilogue inlined

Every step of the reduction loads ``NC`` weight vectors (contiguous: the panel) and ``P``
input values (broadcast) for ``NC * P`` FMAs. ``P`` is chosen with the registers left after
the weights, to waste the fewest columns of the row (the last tile overlaps the one before
it, as in ``Conv2dNCHW``). A 1x1 convolution without padding (packed on small maps only)
runs on one pixel axis ``p = y*W + x`` instead of row by row, so its tiles cross the rows
(49 pixels: ten tiles of five, where rows of seven took two tiles of four each). Returns
None for anything but a ``conv2d_packed``-shaped block.

Where whole tiles of 4 to 8 columns cover the row (:func:`blocked_columns`), the
reduction is blocked over the input channels instead (K-blocking), so that a block of the
panel's weights is read from L1 by every pixel of a band of rows, not streamed from L2 (or
memory) once per row::

    for p in T.parallel(N * F/T * H/band):   # a panel and a band of rows: the rTask loop
        band_acc[band, W, T] = 0             # in memory (L1)
        for rc_o in range(C / KB):           # KB input channels: weights in L1
            pad the band's input rows of those channels
            for y, x_o:                      # every tile of the band
                acc[P, NC, lanes] = 0        # register tile, as above, over rc_i < KB
                ...
                band_acc[y, x_o*P:, :] += acc
        for y, x, v: out[f, y, x] = relu(band_acc + bias)

Alone, 2 threads: ResNet's ``512 -> 512`` 3x3 at 7x7 1028 -> 728 us, ``512 -> 512`` 3x3/2
from 14x14 1065 -> 779, ``256 -> 256`` at 14x14 688 -> 609; maps of 28x28 and more 5-8%
(docs/cpu-kernels.md, K-blocking).
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.target import Target

from .base import (
    CPUScheduleRule,
    capped_tile_score,
    epilogue_tail,
    extent_of,
    finish_tile_blocks,
    flatten_conv_pixels,
    float32_reduction,
    loops_below,
    split_divisible,
    split_producers,
    unroll_cheap,
    vector_lanes,
    vector_registers,
    with_last_tile_shifted,
)
from .conv2d_nchw import tail_in_tile

# A K-blocked band of rows holds at most BAND_PIXELS output pixels (its accumulators: 25 KB
# with 32-channel panels); the bands and panels make at least MIN_BAND_TASKS parallel tasks
# where the rows allow. A block of input channels takes at most K_BLOCK_BYTES of the panel's
# weights (3x3, 32 channels: 8 input channels, 9 KB; 8 and 32 ran within 2-4% of each other).
BAND_PIXELS = 196
MIN_BAND_TASKS = 8
K_BLOCK_BYTES = 16 * 1024
BLOCKED_MIN_COLUMNS = 4
# An NCHWc 1x1 convolution's pixel tiles go into the parallel loop in tiles of at least this
# many columns that divide its pixels (768 -> 192 at 17x17 in tiles of one pixel: 1.9x slower)
MIN_PIXEL_TILE = 4
# Accumulators of a K-blocked register tile at most (with the broadcasts of its columns
# kept alive across an unrolled kernel row): three vectors x 8 columns ran 27% slower than
# two x 8 at 56x56 (64 -> 192 3x3), three x 7 faster than two x 7 at 7x7 and 14x14.
BLOCKED_MAX_ACC = 21
# K-blocked panels (Conv2dPackedNCHW, rows of whole tiles) beat the GEMM on 1x1 convolutions
# of up to 14x14 output pixels (alone, 2 threads: 1024 -> 256 at 14x14 386 -> 302 us,
# 1024 -> 128 217 -> 155, 1024 -> 2048 1x1/2 to 7x7 908 -> 769), not on 28x28 (128 -> 512:
# 288 -> 377) nor with few input channels (96 -> 576 at 14x14: 80 -> 84).
POINTWISE_BLOCKED_MAX_PIXELS = 196
POINTWISE_BLOCKED_MIN_CHANNELS = 128
# In the models, the projections of MobileNet v2 (384 -> 64, 576 -> 96 at 14x14) and
# DenseNet-121 (C -> 128) ran slower blocked than as GEMMs, though faster alone
# (docs/cpu-kernels.md, K-blocking): few panels, so bands of two rows a task.
POINTWISE_BLOCKED_MIN_OUT_CHANNELS = 256


def blocked_columns(width: int, vectors: int, registers: int, max_cols: int = 8) -> int | None:
    """Columns of a K-blocked register tile over rows of ``width``: the widest tile of
    :data:`BLOCKED_MIN_COLUMNS` to ``max_cols`` columns that divides the row (a shifted last
    tile would add its overlap into the band's accumulators twice) and leaves room in
    ``registers`` for ``vectors`` weights and a broadcast; None when none does (rows of 17
    columns, or 7 with four-vector panels), and for rows too wide for a band of two (147
    columns: one row a task, 2-3% slower than unblocked)."""
    if 2 * width > BAND_PIXELS:
        return None
    most = min(max_cols, (registers - vectors - 2) // vectors, BLOCKED_MAX_ACC // vectors)
    cols = split_divisible(width, most)
    return cols if cols >= BLOCKED_MIN_COLUMNS else None


def blocks_pointwise(
    pixels: int, in_channels: int, out_channels: int, blocked_layout: bool = False
) -> bool:
    """A 1x1 convolution whose rows take K-blocked tiles is blocked (and packed) on maps of
    at most :data:`POINTWISE_BLOCKED_MAX_PIXELS` pixels, reading at least
    :data:`POINTWISE_BLOCKED_MIN_CHANNELS` input channels and writing at least
    :data:`POINTWISE_BLOCKED_MIN_OUT_CHANNELS`."""
    return (
        pixels <= POINTWISE_BLOCKED_MAX_PIXELS
        and in_channels >= POINTWISE_BLOCKED_MIN_CHANNELS
        and (blocked_layout or out_channels >= POINTWISE_BLOCKED_MIN_OUT_CHANNELS)
    )


def band_rows(height: int, width: int, panels: int) -> int:
    """Rows of one K-blocked task: the most that divide ``height`` within
    :data:`BAND_PIXELS` pixels while the panels and bands still make
    :data:`MIN_BAND_TASKS` tasks (one row at least)."""
    for band in range(height, 0, -1):
        if height % band or band * width > BAND_PIXELS:
            continue
        if panels * (height // band) >= MIN_BAND_TASKS:
            return band
    return 1


def k_block(channels: int, kernel_elems: int, panel: int) -> int:
    """Input channels of one K block: the most that divide ``channels`` with their weights
    (``kernel_elems * panel`` floats each) within :data:`K_BLOCK_BYTES`."""
    return split_divisible(channels, max(1, K_BLOCK_BYTES // (4 * kernel_elems * panel)))


def _panel_width(sch: s_tir.Schedule, block) -> tuple[int, int | None] | None:
    """``(T, None)`` when ``block`` is a packed NCHW convolution: ``SSSSRRR``, writing
    ``[n, f, y, x]`` and reading a 5-D weight whose last axis is ``T`` wide; ``(T, b)`` when
    it is one in channel blocks of ``b`` (``conv2d_nchwc``, ``backend/cpu/blocked_channels.py``):
    ``SSSSSRRR``, writing ``[n, f // b, y, x, f % b]``; else None."""
    kind = get_sblock_info(sch, block).dom_kind()
    if kind not in ("SSSSRRR", "SSSSSRRR"):
        return None
    stmt = sch.get(block)
    if len(stmt.writes) != 1:
        return None
    ivars = [iv.var for iv in stmt.iter_vars]
    out = stmt.writes[0].region
    spatial = len(kind) - 3
    if len(out) != spatial or not all(
        r.min.same_as(v) for r, v in zip(out, ivars[:spatial], strict=True)
    ):
        return None
    channel_block = None
    if spatial == 5:
        last = stmt.writes[0].source.shape[4]
        if not isinstance(last, tirx.IntImm):
            return None
        channel_block = int(last.value)
    # the weight: the last 5-D read (an NCHWc convolution reads its input in 5-D first)
    weights = [r.source.shape for r in stmt.reads if len(r.source.shape) == 5]
    if not weights or not isinstance(weights[-1][4], tirx.IntImm):
        return None
    panel = int(weights[-1][4].value)
    if channel_block is not None and panel % channel_block:
        return None
    return panel, channel_block


def pixel_tile(width: int, vectors: int, registers: int, acc_vectors: int, max_cols: int) -> int:
    """Output columns of one register tile: at most ``max_cols`` and ``acc_vectors``
    accumulators (``vectors`` per column), and those, the weight vectors and one broadcast
    within ``registers``; the best :func:`capped_tile_score` (FMAs per load counted up to
    where the FMAs, not the loads, set the pace, times the share of the row's columns not
    computed twice by the shifted last tile); ties go to wider tiles."""
    most = max(1, min(max_cols, min(acc_vectors, registers - vectors - 2) // vectors))
    best, best_key = 1, (0.0, 0)
    for cols in range(1, min(most, width) + 1):
        key = (capped_tile_score(vectors, cols, width, cols), cols)
        if key > best_key:
            best, best_key = cols, key
    return best


def _pointwise(pads: list, extents: list[int]) -> bool:
    """A 1x1 convolution without padding: its output pixels flatten into one axis (each
    reads one input pixel, broadcast; strided or not)."""
    return not pads and extents[5] == 1 and extents[6] == 1


def _input_block(sch: s_tir.Schedule, conv) -> int | None:
    """The channel block of a convolution's input in NCHWc (its first read, 5-D beside the
    5-D weight), None for an NCHW input."""
    reads = [r.source.shape for r in sch.get(conv).reads if len(r.source.shape) == 5]
    if len(reads) != 2 or not isinstance(reads[0][4], tirx.IntImm):
        return None
    return int(reads[0][4].value)


def _fuse_channel_blocks(sch: s_tir.Schedule, conv) -> list:
    """The loops of an NCHWc convolution block (``n, fb, y, x, fl`` spatial, ``rc, ry, rx``
    reduction) as NCHW's ``[n, f, y, x, rc, ry, rx]``: the output channel ``f = fb*b + fl``
    one loop (a loop fusion: a layout transform of the block would make its unit kernel
    axes spatial)."""
    n, fb, y, x, fl, rc, ry, rx = sch.get_loops(conv)
    sch.reorder(fb, fl, y, x)
    return [n, sch.fuse(fb, fl), y, x, rc, ry, rx]


def _flatten_blocked_pixels(sch: s_tir.Schedule, conv, width: int) -> list:
    """As :func:`~.base.flatten_conv_pixels` for an NCHWc convolution block whose channel
    loops :func:`_fuse_channel_blocks` fused: the block's pixels on one axis, the output
    channel one loop."""
    sch.transform_block_layout(
        conv,
        lambda n_, fb, y_, x_, fl, c_, i_, j_: (n_, fb, fl, y_ * width + x_, c_, i_, j_),
    )
    n, fb, fl, p, rc, ry, rx = sch.get_loops(conv)
    f = sch.fuse(fb, fl)
    y = sch.add_unit_loop(p)
    sch.reorder(y, p)
    return [n, f, y, p, rc, ry, rx]


def _channels_last(block: int | None, flat_width: int | None):
    """The accumulator's layout with the output channels innermost: ``[n, y, x, f]``
    (``[n, y, x, fb, fl]`` in channel blocks), the pixels on one axis where ``flat_width``
    is given."""
    if block is None:
        if flat_width is None:
            return lambda n_, f_, y_, x_: (n_, y_, x_, f_)
        return lambda n_, f_, y_, x_: (n_, y_ * flat_width + x_, f_)
    if flat_width is None:
        return lambda n_, fb, y_, x_, fl: (n_, y_, x_, fb, fl)
    return lambda n_, fb, y_, x_, fl: (n_, y_ * flat_width + x_, fb, fl)


def _pixels_flat(block: int | None, width: int):
    """The write-back block's iteration with its pixels on one axis."""
    if block is None:
        return lambda n_, f_, y_, x_: (n_, f_, y_ * width + x_)
    return lambda n_, fb, y_, x_, fl: (n_, fb, y_ * width + x_, fl)


def _write_back_vectors(sch, acc, block, vectors: int, lanes: int, flat: bool):
    """The write-back's loops in channel vectors, pixels outside (vectorized, the vectors
    of a tile unrolled); returns the innermost pixel loop."""
    if block is None:
        if flat:
            wf, wx = sch.get_loops(acc)[-2:]
            sch.reorder(wx, wf)
        else:
            wf, wy, wx = sch.get_loops(acc)[-3:]
            sch.reorder(wy, wx, wf)
        wv, wl = sch.split(wf, [vectors, lanes])
    elif flat:
        wv, wx, wl = sch.get_loops(acc)[-3:]
        sch.reorder(wx, wv, wl)
    else:
        wv, wy, wx, wl = sch.get_loops(acc)[-4:]
        sch.reorder(wy, wx, wv, wl)
    sch.vectorize(wl)
    unroll_cheap(sch, acc, [wv])
    return wx


def _band_pixels_as_one_loop(sch, acc, wx) -> None:
    """The K-blocked write-back's rows and columns (``wx``) fused into one loop over the
    band's pixels. A band spans whole rows, so the index stays affine; as a loop of a few rows
    LLVM unrolled it whole (its cost model folds the indices of short loops), hundreds of
    vector stores that ran no faster (docs/compile-time.md)."""
    loops = sch.get_loops(acc)
    i = [sch.get(loop).same_as(sch.get(wx)) for loop in loops].index(True)
    sch.fuse(loops[i - 1], loops[i])


def pad_in_channel_vectors(sch, pad, loop, lanes: int) -> None:
    """The padding copy of an NCHWc input under ``loop``: a vector per pixel (the borders'
    condition does not depend on the channel), not a scalar loop for LLVM to vectorize, which
    it also copied once per row."""
    shape = sch.get(pad).writes[0].source.shape
    if len(shape) != 5 or not isinstance(shape[4], tirx.IntImm) or int(shape[4]) != lanes:
        return
    loops = loops_below(sch, pad, loop)
    if loops and extent_of(sch, loops[-1]) == lanes:
        sch.vectorize(loops[-1])


class Conv2dPackedNCHW(CPUScheduleRule):
    """Output-channel-vectorised direct convolution over packed weights; see the module
    docstring. ``acc_vectors``: the most accumulator vectors of a tile (with AVX2's 16
    registers, fewer: what is left after the weights and the broadcast); ``max_cols``: the
    most columns (with a 3-wide kernel unrolled, LLVM keeps the broadcasts of neighbouring
    columns alive across it: 12 columns of 2 vectors ran 1.9x slower than 8);
    ``max_unroll_rx``: kernel widths up to this are unrolled; ``k_blocking``: spatial kernels
    whose rows take whole tiles are blocked over the input channels (module docstring);
    ``unroll_write_columns``: the
    write-back's columns unrolled too (each column's channel vectors are stores into ``T``
    channel planes, with the epilogue's loads the same way: unrolled, LLVM took 0.1-0.36 s a
    kernel; as a loop, ResNet-18 compiled in 3.7 s instead of 5.6, and ResNet-18, GoogLeNet,
    ResNet-50 and Inception v3 ran within 0-1.6% of the unrolled build)."""

    def __init__(
        self,
        acc_vectors: int = 20,
        max_cols: int = 8,
        max_unroll_rx: int = 7,
        unroll_write_columns: bool = False,
        flatten: bool = True,
        k_blocking: bool = True,
    ):
        self.k_blocking = k_blocking
        self.flatten = flatten
        self.unroll_write_columns = unroll_write_columns
        self.acc_vectors = acc_vectors
        self.max_cols = max_cols
        self.max_unroll_rx = max_unroll_rx

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        found = float32_reduction(
            self, func, target, lambda sch, block: _panel_width(sch, block) is not None
        )
        if found is None:
            return None
        sch, conv, loops, extents = found
        panel, block = _panel_width(sch, conv)
        # vectors of the target's lanes; of the panel's width when it is narrower (weights
        # packed for AVX2 scheduled for AVX-512)
        lanes = math.gcd(panel, vector_lanes(target))
        if block is not None:
            if block != lanes:  # channel blocks of another vector width
                return None
            # as NCHW's loops n, f, y, x, rc, ry, rx (fused below, once the pixels are)
            ext_n, ext_fb, *rest, ext_fl, ext_rc, ext_ry, ext_rx = extents
            extents = [ext_n, ext_fb * ext_fl, *rest, ext_rc, ext_ry, ext_rx]
        pads = split_producers(sch, conv)
        if pads is None:
            return None
        x_ext, rx_ext = extents[3], extents[6]
        width = x_ext
        vectors = panel // lanes
        pointwise = _pointwise(pads, extents)
        flat = self.flatten and pointwise
        if self.k_blocking and (
            not pointwise
            or blocks_pointwise(extents[2] * x_ext, extents[4], extents[1], block is not None)
        ):
            cols = blocked_columns(x_ext, vectors, vector_registers(target), self.max_cols)
            if cols is not None:
                if block is not None:
                    _fuse_channel_blocks(sch, conv)
                return self._k_blocked(sch, conv, extents, pads, panel, lanes, cols, block)
        if flat:
            # a 1x1 convolution: one pixel axis p = y*W + x, tiled across the rows
            if block is None:
                n, f, y, x, rc, ry, rx = flatten_conv_pixels(sch, conv, width)
            else:
                n, f, y, x, rc, ry, rx = _flatten_blocked_pixels(sch, conv, width)
            x_ext = extents[2] * width
        elif block is not None:
            n, f, y, x, rc, ry, rx = _fuse_channel_blocks(sch, conv)
        else:
            n, f, y, x, rc, ry, rx = loops
        cols = pixel_tile(x_ext, vectors, vector_registers(target), self.acc_vectors, self.max_cols)
        # NCHWc, one pixel axis: the pixel tiles in the parallel loop too (few panels on a
        # large map left the vEUs idle), in tiles that divide the pixels (nothing to shift)
        # (where none of MIN_PIXEL_TILE or more columns divides them, 17x17: the panels in
        # parallel, the last tile shifted back as in NCHW)
        pixel_parallel = flat and block is not None
        if pixel_parallel and x_ext % cols:
            dividing = [c for c in range(MIN_PIXEL_TILE, cols + 1) if x_ext % c == 0]
            pixel_parallel = bool(dividing)
            if dividing:
                cols = max(dividing, key=lambda c: (capped_tile_score(vectors, c, x_ext, c), c))
        fo, fin = sch.split(f, [None, panel])
        fv, fl = sch.split(fin, [vectors, lanes])
        xo, xi = sch.split(x, [None, cols])
        sch.reorder(n, fo, y, xo, rc, ry, rx, fv, xi, fl)
        acc = sch.cache_write(conv, 0, "local")
        # channels innermost in the accumulator, as in the vectors (else a strided gather)
        sch.transform_layout(conv, ("write", 0), _channels_last(block, width if flat else None))
        handled, tail = epilogue_tail(sch, acc)
        if not handled:
            return None
        if flat:
            sch.transform_block_layout(acc, _pixels_flat(block, width))
        sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
        par = sch.fuse(n, fo, y, xo) if pixel_parallel else sch.fuse(n, fo, y)
        for pad in pads:
            sch.compute_at(pad, par, preserve_unit_loops=True)
            pad_in_channel_vectors(sch, pad, par, lanes)
        if tail is not None and not tail_in_tile(sch, tail, par, lanes):
            return None
        # the write-back in channel vectors: bias loads and the activation vectorise, the
        # stores go to one column of F/T rows each (in NCHWc: one vector each)
        wx = _write_back_vectors(sch, acc, block, vectors, lanes, flat)
        if self.unroll_write_columns:
            sch.unroll(wx)
        # vectorize and parallelize before decompose_reduction (see conv2d_nchw)
        sch.vectorize(fl)
        sch.unroll(fv)
        sch.unroll(xi)
        if rx_ext <= self.max_unroll_rx:
            sch.unroll(rx)
        sch.parallel(par)
        init = sch.decompose_reduction(conv, rc)
        if pixel_parallel:
            finish_tile_blocks(sch, (init,), par, lanes)
            return sch
        finish_tile_blocks(sch, (init,), xo, lanes)
        return with_last_tile_shifted(sch, xo, cols, x_ext)

    def _k_blocked(self, sch, conv, extents, pads, panel, lanes, cols, block):
        """The K-blocked schedule (module docstring): ``rfactor`` over the channel blocks
        makes the register tile (its partial sum over one block, computed at the tile loop)
        and the band's accumulation of those partial sums, each a block TVM can place."""
        _, f_ext, y_ext, x_ext, c_ext, ry_ext, rx_ext = extents
        vectors = panel // lanes
        rc = sch.get_loops(conv)[4]
        kb = k_block(c_ext, ry_ext * rx_ext, panel)
        in_block = _input_block(sch, conv)
        if in_block is not None:  # whole channel blocks: the input's vectors, not halves
            kb = in_block * split_divisible(c_ext // in_block, max(1, kb // in_block))
        rco, _ = sch.split(rc, [None, kb])
        tile = sch.rfactor(rco, 0)
        n, f, y, x, rco = sch.get_loops(conv)
        fo, fin = sch.split(f, [None, panel])
        fv, fl = sch.split(fin, [vectors, lanes])
        yo, y = sch.split(y, [None, band_rows(y_ext, x_ext, f_ext // panel)])
        xo, xi = sch.split(x, [None, cols])
        sch.reorder(n, fo, yo, rco, y, xo, fv, xi, fl)
        acc = sch.cache_write(conv, 0, "local")
        sch.transform_layout(conv, ("write", 0), _channels_last(block, None))
        handled, tail = epilogue_tail(sch, acc)
        if not handled:
            return None
        par = sch.fuse(n, fo, yo)
        sch.reverse_compute_at(acc, par, preserve_unit_loops=True)
        sch.compute_at(tile, xo, preserve_unit_loops=True)
        for pad in pads:
            sch.compute_at(pad, rco, preserve_unit_loops=True)
            pad_in_channel_vectors(sch, pad, rco, lanes)
        if tail is not None and not tail_in_tile(sch, tail, par, lanes):
            return None
        wx = _write_back_vectors(sch, acc, block, vectors, lanes, flat=False)
        _band_pixels_as_one_loop(sch, acc, wx)
        # the register tile: channel vectors innermost, as in the unblocked schedule
        if block is None:
            sch.transform_layout(tile, ("write", 0), lambda k, n_, f_, y_, x_: (k, n_, y_, x_, f_))
            _, _, t_f, _, t_x, t_rc, t_ry, t_rx = loops_below(sch, tile, xo)
            t_v, t_l = sch.split(t_f, [vectors, lanes])
        else:  # the tile's loops follow its buffer's axes: fb and fl apart
            sch.transform_layout(
                tile, ("write", 0), lambda k, n_, fb, y_, x_, fl: (k, n_, y_, x_, fb, fl)
            )
            _, _, t_v, _, t_x, t_l, t_rc, t_ry, t_rx = loops_below(sch, tile, xo)
        sch.reorder(t_rc, t_ry, t_rx, t_v, t_x, t_l)
        sch.vectorize(t_l)
        sch.unroll(t_v)
        sch.unroll(t_x)
        if rx_ext <= self.max_unroll_rx:
            sch.unroll(t_rx)
        # the tile's partial sums added to the band's accumulators
        a_v, a_x, a_l = loops_below(sch, conv, xo)
        sch.reorder(a_x, a_v, a_l)
        sch.vectorize(a_l)
        sch.unroll(a_v)
        sch.unroll(a_x)
        sch.parallel(par)
        finish_tile_blocks(sch, (sch.decompose_reduction(tile, t_rc),), xo, lanes)
        # the band's init takes the loop kinds of the addition: channel vectors vectorized
        sch.decompose_reduction(conv, rco)
        return sch
