"""Direct NCHW convolution as Relax legalizes it (``conv2d_nchw``: n, f, y, x spatial; rc,
ry, rx reduction), with its padding producer and fused epilogue (bias add, relu).

Schedule (per register tile of ``FI`` channels x ``YR`` rows x ``XV`` columns)::

    for p in T.parallel(N * H/YR * F/FI):       # the rTask loop: n, y_o, f_o (padded convs,
                                                # so each padded row block is made once) or
                                                # n, f_o, y_o (unpadded)
        pad the input rows of these YR rows     # only when the padding block really pads
        for x_o in range(ceil(W / XV)):         # last tile shifted back to end at W
            acc[FI, YR, XV] = 0                 # register tile
            for rc, ry, rx:                     # reduction, weights stream, input rows reused
                for f_i in unroll(FI):
                    for y_i in unroll(YR):
                        for x_i in vectorized(XV):   # output columns: contiguous in and out
                            acc[f_i, y_i, x_i] += in[rc, y*s + ry, x*s + rx] * w[f, rc, ry, rx]
            out[f, y, x] = relu(acc + bias)     # epilogue inlined into the write-back

The accumulator is a ``local`` cache of the output (``cache_write``), so after unrolling
LLVM keeps it in registers; the epilogue is reverse-inlined into the cache's write-back.
Every step of the reduction loads ``FI`` weights (broadcast) and ``YR`` input vectors for
``FI * YR`` FMAs: the tile is the one with the most FMAs per load within the registers.

1x1 convolutions (stride 1, no padding) run on one pixel axis ``p = y*W + x`` as GEMMs: the
parallel loop holds channel groups, each pixel tile of ``YR`` vectors meets every channel
block of its group (the input is read once, the group's weights stay in L2). Where a channel
plane is not a whole number of vectors (13x13: 169 floats), each tile's input strip is first
copied into a buffer of its own, so that no pixel vector straddles two cache lines.

Where the pixel tiles do not divide the plane and the channel groups are what runs in
parallel, the last tile runs after the others and computes only the vectors past them
(``base.narrow_last_tile``): 196 pixels in tiles of 4 vectors compute 208 pixels instead of
256 (docs/cpu-kernels.md).

Columns: ``XV`` is one vector (the target's lanes) when the row is at least that wide; when
the vector does not divide the row, the last tile starts at ``W - XV`` and recomputes a few
columns of the one before (``overlap_last_tile``) instead of running a predicated tail,
which TVM 0.27 scalarizes. A row narrower than a vector is one tile of ``W`` lanes.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.target import Target

from .base import (
    CPUScheduleRule,
    deinterleave_columns,
    epilogue_tail,
    extent_of,
    finish_tile_blocks,
    flatten_conv_pixels,
    float32_reduction,
    loop_var_of,
    loops_below,
    narrow_last_tile,
    split_producers,
    vector_lanes,
    vector_registers,
    vectorize_whole,
    with_last_tile_shifted,
)


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


def _input_read(sch: s_tir.Schedule, conv) -> int:
    """Index of the input among the reads of the convolution block (not the weight
    ``[f, rc, ry, rx]``, not the output it accumulates into)."""
    stmt = sch.get(conv)
    ivars = [iv.var for iv in stmt.iter_vars]
    weight = [ivars[1], *ivars[4:]]
    out = stmt.writes[0].source
    for i, read in enumerate(stmt.reads):
        region = read.region
        if read.source.same_as(out) or len(region) != 4:
            continue
        if all(r.min.same_as(v) for r, v in zip(region, weight, strict=True)):
            continue
        return i
    raise ValueError("no input read")


def width_tile(width: int, lanes: int) -> int:
    """Output columns per register tile: one vector of ``lanes``, or the whole row when it is
    narrower (wider tiles of odd widths, e.g. 27, measured several times slower: LLVM splits
    them into pieces; a tile that does not divide the row overlaps the one before it)."""
    return min(width, lanes)


def column_stride(sch: s_tir.Schedule, conv) -> int:
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


def register_tile(
    channels: int,
    rows: int,
    acc_vectors: int,
    max_channel_block: int,
    max_rows: int = 4,
    divides: bool = True,
    pixels: tuple[int, int] | None = None,
    block_multiple: int = 1,
) -> tuple[int, int]:
    """``(FI, YR)``: divisors of the channels and the rows with ``FI * YR`` accumulator
    vectors within ``acc_vectors``, with the most FMAs per load (``FI*YR / (FI+YR)``); ties go
    to more channels (fewer padded input rows to make). ``pixels = (P, lanes)``: ``YR``
    vectors of ``lanes`` along a pixel axis of ``P`` whose last tile is shifted back, so
    ``ceil(P / (YR*lanes)) * YR*lanes`` pixels are computed: FMAs per load are divided by
    that overcompute (49 pixels: 2 tiles of 3 vectors compute 96, 2 tiles of 2 compute 64).
    ``block_multiple``: only ``FI`` whose block count ``channels / FI`` is a multiple of it
    ((1, 1) when none is)."""
    best, best_key = (1, 1), (0.0, 0)
    for fi in range(1, min(channels, max_channel_block) + 1):
        if channels % fi or (channels // fi) % block_multiple:
            continue
        for yr in range(1, min(rows, max_rows) + 1):
            if (divides and rows % yr) or fi * yr > acc_vectors:
                continue
            key = (_tile_efficiency(fi, yr, pixels), fi)
            if key > best_key:
                best, best_key = (fi, yr), key
    return best


def _tile_efficiency(fi: int, yr: int, pixels: tuple[int, int] | None) -> float:
    """FMAs per load of an ``FI x YR`` tile, divided by the pixel overcompute."""
    waste = 1.0
    if pixels is not None:
        tile = yr * pixels[1]
        waste = -(-pixels[0] // tile) * tile / pixels[0]
    return fi * yr / (fi + yr) / waste


PARALLEL_TILE_KEEP = 0.6  # a tile that splits in parallel groups may lose this much


def _parallel_pixel_tile(channels, rows, acc_vectors, max_block, max_rows, pixels):
    """:func:`register_tile` for a 1x1 convolution, preferring a block count that splits in
    4, then 2 parallel groups while the tile keeps :data:`PARALLEL_TILE_KEEP` of the best
    tile's FMAs per load."""
    best = register_tile(
        channels, rows, acc_vectors, max_block, max_rows, divides=False, pixels=pixels
    )
    if (channels // best[0]) % 2 == 0:
        return best
    floor = PARALLEL_TILE_KEEP * _tile_efficiency(*best, pixels)
    for multiple in (4, 2):
        tile = register_tile(
            channels,
            rows,
            acc_vectors,
            max_block,
            max_rows,
            divides=False,
            pixels=pixels,
            block_multiple=multiple,
        )
        if (channels // tile[0]) % multiple == 0 and _tile_efficiency(*tile, pixels) >= floor:
            return tile
    return best


def _aligned_strip(sch: s_tir.Schedule, conv, width: int, tile_loop, lanes: int) -> None:
    """Copy the input strip of each pixel tile of a flattened 1x1 convolution (every input
    channel, the tile's pixels) into a buffer of its own before the channel blocks read
    it, so that no pixel vector straddles two cache lines where an input channel plane is
    not a whole number of vectors (13x13: 676 bytes; docs/cpu-kernels.md)."""
    strip = sch.cache_read(conv, _input_read(sch, conv), "global")
    flat_pixels = lambda n_, c_, h_, w_: (n_, c_, h_ * width + w_)  # noqa: E731
    sch.transform_layout(strip, ("write", 0), flat_pixels)
    sch.transform_block_layout(strip, flat_pixels)
    sch.compute_at(strip, tile_loop, preserve_unit_loops=True)
    vectorize_whole(sch, sch.get_loops(strip)[-1], lanes)


def tail_in_tile(sch: s_tir.Schedule, tail, par, lanes: int) -> bool:
    """The epilogue left after the write-back (``epilogue_tail``: e.g. the multiply by a
    squeeze-and-excitation scale, read at ``[n, c, 0, 0]`` and broadcast over the pixels)
    computed in the parallel tile that makes its input. Its pixel loops (the last two) are
    fused and vectorized when whole vectors divide them, else left to LLVM's loop
    vectorizer (a vector across two channels would gather the per-channel scale). False
    when TVM cannot place it there."""
    try:
        sch.reverse_compute_at(tail, par, preserve_unit_loops=True)
    except s_tir.ScheduleError:
        return False
    below = loops_below(sch, tail, par)
    if not below:
        return True
    pixels = below[-2:] if len(below) >= 3 else below[-1:]
    vectorize_whole(sch, sch.fuse(*pixels) if len(pixels) > 1 else pixels[0], lanes)
    return True


class Conv2dNCHW(CPUScheduleRule):
    """Register-tiled, vectorised direct convolution; see the module docstring.

    ``acc_vectors``: accumulator vectors of one tile (channels x rows, one vector of columns
    each); None: 24 with AVX-512's 32 vector registers, 12 with 16 (AVX2, SSE), where 24 and 16
    left LLVM reloading accumulators from the stack inside the reduction (haswell, 3x3 at 64 to
    256 channels: 36-111 ymm reloads; with 12: at most 1, as with 10 or 8;
    ``tests/backend/cpu/rules/test_conv2d_nchw.py``). ``max_channel_block`` / ``max_rows``: the
    largest ``FI`` / ``YR`` (``narrow_rows`` for rows narrower than a vector). The switches keep
    the rule's earlier choices reachable for paired measurements (the per-operator reports,
    ``docs/cpu-kernels.md``): ``narrow_strided`` (strided rows narrower than a vector
    scheduled), ``pixels_outer`` (1x1: pixel tiles outside the channel blocks), ``pixel_waste``
    (1x1: the tile counts the shifted last tile's overcompute), ``aligned_strips`` (1x1: input
    strips copied where the channel planes are not whole vectors: alone, ``512 -> 1000`` at
    13x13 784 -> 619 us, ``768 -> 192`` at 17x17 435 -> 359), ``narrow_tail`` (1x1, channel
    groups in parallel: the last pixel tile run apart, only its vectors past the other tiles;
    ``base.narrow_last_tile``); ``min_strided_macs``: fewer MACs an output than this and a
    strided convolution is declined.
    """

    def __init__(
        self,
        acc_vectors: int | None = None,
        max_channel_block: int = 8,
        max_rows: int = 4,
        flatten: bool = True,
        pad_once: bool = True,
        deinterleave: bool = True,
        narrow_strided: bool = True,
        pixels_outer: bool = True,
        min_strided_macs: int = 16,
        narrow_rows: int = 8,
        pixel_waste: bool = True,
        pixel_parallel: bool = True,
        min_pixel_tiles: int = 4,
        aligned_strips: bool = True,
        narrow_tail: bool = True,
    ):
        self.narrow_tail = narrow_tail
        self.aligned_strips = aligned_strips
        self.pixel_parallel = pixel_parallel
        self.min_pixel_tiles = min_pixel_tiles
        self.pixel_waste = pixel_waste
        self.narrow_rows = narrow_rows
        self.min_strided_macs = min_strided_macs
        self.pixels_outer = pixels_outer
        self.narrow_strided = narrow_strided
        self.deinterleave = deinterleave
        self.pad_once = pad_once
        self.flatten = flatten
        self.acc_vectors = acc_vectors
        self.max_channel_block = max_channel_block
        self.max_rows = max_rows

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        found = float32_reduction(self, func, target, _is_conv_nchw)
        if found is None:
            return None
        sch, conv, (n, f, y, x, rc, ry, rx), extents = found
        acc_vectors = self.acc_vectors
        if acc_vectors is None:
            acc_vectors = 24 if vector_registers(target) >= 32 else 12
        # producers: plain copies are inlined, a real padding block is computed per row tile
        pads = split_producers(sch, conv)
        if pads is None:
            return None
        _, f_ext, y_ext, x_ext, _, _, rx_ext = extents
        lanes = vector_lanes(target)
        xv = width_tile(x_ext, lanes)
        vector = xv  # the pixel vector of a flattened 1x1 convolution (its tile: YR of them)
        strided = column_stride(sch, conv) > 1
        macs = extents[4] * extents[5] * rx_ext  # per output
        if strided and (
            macs < self.min_strided_macs
            or (xv % lanes and not (self.narrow_strided and self.deinterleave and macs >= 64))
        ):
            # strided columns gathered lane by lane: only worth it in whole vectors and with
            # enough reduction per gather (a 3x3/2 depthwise conv was 1.9x slower). Rows
            # narrower than a vector are read contiguously from the de-interleaved copy:
            # scheduled when each output has 64 MACs or more (ResNet-50's 1x1/2 convolutions
            # at 14 and 7 columns ran unscheduled, 15-76x slower than ONNX Runtime)
            return None
        # strided rows: one row a tile (SqueezeNet's 3x3/2 stem: 3 rows 4.8x slower); rows
        # narrower than a vector: up to ``narrow_rows`` of them (each a part-filled vector, so
        # a weight broadcast serves more of them)
        max_rows = self.max_rows
        if x_ext < lanes and not strided:
            max_rows = max(max_rows, self.narrow_rows)
        fi_ext, yr_ext = register_tile(
            f_ext,
            y_ext,
            acc_vectors,
            self.max_channel_block,
            1 if strided and not self.deinterleave else max_rows,
        )
        flat = self.flatten and not pads and not strided and extents[5] == 1 and rx_ext == 1
        if flat:
            # a 1x1 convolution reads its input pixels contiguously: one pixel axis p = y*W + x
            width = x_ext
            n, f, y, x, rc, ry, rx = flatten_conv_pixels(sch, conv, width)
            x_ext = y_ext * x_ext
            xv = width_tile(x_ext, lanes)
            # ``YR`` counts vectors along the pixel axis: any number that fits. The channel
            # blocks are what runs in parallel (in 4 or 2 groups, pixels_outer below): a
            # smaller block whose count splits in 4 or 2 is taken over the best tile when it
            # keeps most of that tile's FMAs per load (232 channels in blocks of 8 are 29
            # blocks: one thread)
            fi_ext, yr_ext = _parallel_pixel_tile(
                f_ext,
                max(x_ext // xv, 1),
                acc_vectors,
                self.max_channel_block,
                self.max_rows,
                (x_ext, xv) if self.pixel_waste else None,
            )
            fo, fi = sch.split(f, [None, fi_ext])
            yo = y
            xo, xin = sch.split(x, [None, yr_ext * xv])
            yi, xi = sch.split(xin, [yr_ext, xv])
            vector = xv
            xv *= yr_ext
        else:
            fo, fi = sch.split(f, [None, fi_ext])
            yo, yi = sch.split(y, [None, yr_ext])
            xo, xi = sch.split(x, [None, xv])
        # input rows made per row tile (padded, or de-interleaved below): row tiles outside,
        # the rows made once for every channel block (and for ``groups`` groups of them, so
        # that a few row tiles still give the vEUs four rTasks)
        rows_made = bool(pads) or (strided and self.deinterleave)
        groups = 1
        if rows_made and self.pad_once:
            blocks, tiles = f_ext // fi_ext, -(-y_ext // yr_ext)
            groups = next((g for g in (1, 2, 4) if blocks % g == 0 and tiles * g >= 4), 1)
            fg, fo = sch.split(fo, [groups, None])
            outer = (n, yo, fg, fo)
        else:
            outer = (n, yo, fo) if rows_made else (n, fo, yo)
        # the innermost tile loop: the register tile's accumulators are written back under it
        tile_loop = xo
        pixels_outer = flat and self.pixels_outer and not rows_made and x_ext > xv
        tiles = -(-x_ext // xv)
        pixel_parallel = (
            pixels_outer
            and self.pixel_parallel
            and extents[0] == 1
            and x_ext > f_ext
            and tiles >= self.min_pixel_tiles
        )
        if pixel_parallel:
            # more pixels than output channels: the pixel tiles run in parallel, each
            # meeting every channel block, so each thread reads its part of the input
            # once (channel groups in parallel read all of it in every group: SqueezeNet's
            # 128 -> 16 at 55x55 took 190 us in the model against 50 us alone)
            outer = (n, yo, xo)
            sch.reorder(*outer, fo, rc, ry, rx, fi, yi, xi)
            tile_loop = fo
        elif pixels_outer:
            # a 1x1 convolution as a GEMM: each pixel tile (its input strip, C x YR vectors)
            # meets every channel block of its group before the next tile, so the input is
            # read once and the weights (C x F / G) stay in L2; channel blocks outside the
            # pixel tiles read the whole input again for each block (ResNet-50's 256 -> 128
            # at 56x56: 3.2 MB of input, 16 times)
            blocks = f_ext // fi_ext
            groups = next((g for g in (4, 2) if blocks % g == 0), 1)
            fg, fo = sch.split(fo, [groups, None])
            outer = (n, yo, fg)
            sch.reorder(*outer, xo, fo, rc, ry, rx, fi, yi, xi)
            tile_loop = fo
        else:
            sch.reorder(*outer, xo, rc, ry, rx, fi, yi, xi)
        if strided and self.deinterleave:
            # the input rows a row tile reads, copied (or padded) with the columns of each
            # phase of the stride together: ``x*s + rx`` becomes column ``x + rx//s`` of phase
            # ``rx % s``, so a vector of outputs reads one contiguous vector
            stride = column_stride(sch, conv)
            if not pads:
                pads = [sch.cache_read(conv, _input_read(sch, conv), "global")]
            deinterleave_columns(sch, pads[0], stride)
        acc = sch.cache_write(conv, 0, "local")
        handled, tail = epilogue_tail(sch, acc)
        if not handled:
            return None
        if flat:
            sch.transform_layout(
                conv, ("write", 0), lambda n_, f_, y_, x_: (n_, f_, y_ * width + x_)
            )
            sch.transform_block_layout(acc, lambda n_, f_, y_, x_: (n_, f_, y_ * width + x_))
        sch.reverse_compute_at(acc, tile_loop, preserve_unit_loops=True)
        # padded: the rows of one row tile are padded once, for every channel block (fused
        # with the channel blocks, they were padded again for each)
        par = sch.fuse(*outer[:3]) if rows_made and self.pad_once else sch.fuse(*outer)
        for pad in pads:
            sch.compute_at(pad, par, preserve_unit_loops=True)
        if self.aligned_strips and flat and pixels_outer and x_ext % lanes:
            _aligned_strip(sch, conv, width, par if pixel_parallel else xo, lanes)
        if tail is not None and not tail_in_tile(sch, tail, par, lanes):
            return None
        # vectorize and parallelize before decompose_reduction: TVM 0.27 refuses to vectorize
        # or parallelize a loop over the update block once its init is split off ("does not
        # have compact dataflow")
        lanes_tile = extent_of(sch, xi)
        sch.vectorize(xi)
        sch.unroll(fi)
        sch.unroll(yi)
        if rx_ext is not None and rx_ext <= 7:
            sch.unroll(rx)
        sch.parallel(par)
        init = sch.decompose_reduction(conv, rc)
        finish_tile_blocks(sch, (init, acc), tile_loop, lanes_tile)
        # the last column tile overlaps the one before it (see the module docstring); with
        # the pixel tiles in parallel their loop is the parallel loop (``n`` and the row
        # loop have extent 1, so the fused variable counts the tiles)
        result = with_last_tile_shifted(sch, par if pixel_parallel else xo, xv, x_ext)
        if (
            result is not None
            and self.narrow_tail
            and pixels_outer
            and not pixel_parallel
            and x_ext % xv
            and vector == lanes
        ):
            # the shifted last tile recomputes most of the one before it: run it apart,
            # only its vectors past the other tiles (196 pixels in tiles of 64: 208
            # computed instead of 256)
            # ``result`` is the shifted function (tiles of ``xv`` do not divide ``x_ext``)
            try:
                narrowed = narrow_last_tile(result, loop_var_of(sch, xo), xv, x_ext, lanes)
            except (RuntimeError, ValueError, TypeError):  # TVM's errors: keep the shifted tile
                narrowed = None
            return result if narrowed is None else narrowed
        return result
