"""Winograd convolutions in channel blocks (``conv2d_winograd_nchwc``, made by
``backend/cpu/winograd.py``): the three stages computed per task, so that the transformed
input and the GEMMs' results stay in the caches.

Schedule (``m x m`` output tiles, ``alpha = m + 2``)::

    for p in T.parallel(N * bands * groups):   # a band of tile rows, a group of
                                               # output channel blocks: the rTask loop
        pad the band's input rows              # a copy: the transform's loads unconditional
        V[alpha, alpha, band tiles, C] = B^T d B          # channel vectors, (e, u) unrolled
        for e, u, f_o, t_o:
            acc[T, F, lanes] = 0                          # register tile
            for rc:                                       # T broadcasts, F weight vectors
                acc[t, f, :] += V[e, u, t_o*T + t, rc] * U[e, u, f_o*F + f, rc, :]
            M[e, u, tiles, channels] = acc
        for tiles, fb, y_i, x_i: out = epilogue(A^T M A)  # positions unrolled, vectorized

A task recomputes the input transform of its band for each group of output channels and
reads the transformed weights of its group: :func:`plan_tiles` weighs the two. Returns None
for any other PrimFunc, and where the epilogue cannot be inlined.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from ....tir.schedule import schedule_of
from ..winograd import (
    GEMM_NAME,
    INPUT_NAME,
    INPUT_ROWS_NAME,
    OUTPUT_ROWS_NAME,
    WINOGRAD_NAME,
)
from .base import CPUScheduleRule, finish_tile_blocks, inline_epilogue, vector_lanes
from .conv2d_packed import pad_in_channel_vectors

# tiles of one band at most (its transformed input: 36 x 16 x C floats, 147 KB at C = 64)
BAND_TILES = 16
# parallel tasks wanted (two rTasks a vEU at 2 threads)
MIN_TASKS = 4
# Tasks split the tile rows into bands or the output channels into groups. Every band reads
# all of the transformed weights, every group recomputes the input transform; the split
# costs least where bands x weight bytes x U_NS_PER_BYTE (about 20 GB/s from memory) plus
# groups x input-transform elements x V_NS_PER_ELEMENT (measured: 66-75 us for 16 tiles of
# 256 channels in F(4, 3)) is least. 512 -> 512 at 7x7 in F(2, 3), 1 thread: four bands
# 2.11 ms (17 MB of weights read four times), four groups 1.3; 64 -> 64 at 56x56: bands.
U_NS_PER_BYTE = 0.05
V_NS_PER_ELEMENT = 0.5
# accumulators of a register tile at most, and its tiles
MAX_ACC = 20
MAX_TILE = 8


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _blocks(sch: s_tir.Schedule):
    """The pad, input-transform (two passes), GEMM and output-transform (two passes) blocks
    of a Winograd PrimFunc, or None."""
    names = {
        "pad_temp": None,
        INPUT_ROWS_NAME: None,
        INPUT_NAME: None,
        GEMM_NAME: None,
        OUTPUT_ROWS_NAME: None,
        WINOGRAD_NAME: None,
    }
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        name = sch.get(block).name_hint
        if name in names:
            names[name] = block
    if any(block is None for block in names.values()):
        return None
    return tuple(names.values())


def plan_tiles(
    tiles_h: int, tiles_w: int, out_blocks: int, alpha: int, channels: int, lanes: int
) -> tuple[int, int, int, int]:
    """``(band, group, cols, vectors)``: tile rows of a task, output channel blocks of a
    task, tiles and channel vectors of a register tile. The split into bands and groups
    makes :data:`MIN_TASKS` tasks where it can, at the least estimated cost (above)."""
    weight_bytes = alpha * alpha * channels * out_blocks * lanes * 4
    input_elements = alpha * alpha * tiles_h * tiles_w * channels
    best_key, band, group = None, tiles_h, out_blocks
    for bands in _divisors(tiles_h):
        rows = tiles_h // bands
        if rows > 1 and rows * tiles_w > BAND_TILES:
            continue
        for groups in _divisors(out_blocks):
            cost = bands * weight_bytes * U_NS_PER_BYTE + groups * input_elements * V_NS_PER_ELEMENT
            key = (min(bands * groups, MIN_TASKS), -cost)
            if best_key is None or key > best_key:
                best_key, band, group = key, rows, out_blocks // groups
    cols = max(d for d in _divisors(band * tiles_w) if d <= MAX_TILE)
    vectors = max(d for d in _divisors(group) if d * cols <= MAX_ACC)
    return band, group, cols, vectors


def _positions_unrolled(sch: s_tir.Schedule, loops) -> None:
    """A transform's two position loops (the first two of ``loops``) unrolled, so that its
    chain of positions folds, and its channel lanes (the last) vectorized."""
    sch.unroll(loops[0])
    sch.unroll(loops[1])
    sch.vectorize(loops[-1])


class WinogradNCHWc(CPUScheduleRule):
    """The Winograd convolution's schedule; see the module docstring."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):  # noqa: D102
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = schedule_of(func)
        try:
            found = _blocks(sch)
        except s_tir.ScheduleError:
            return None
        if found is None:
            return None
        pad, rows, transform, gemm, out_rows, out = found
        lanes = vector_lanes(target)
        shape = [int(d) for d in sch.get(out).writes[0].source.shape]
        if len(shape) != 5 or shape[4] != lanes:
            return None
        m = int(sch.get(gemm).writes[0].source.shape[0]) - 2
        if not inline_epilogue(sch, out):
            return None
        n_, fb, y, x, fl = sch.get_loops(out)
        tiles_h, tiles_w = -(-shape[2] // m), -(-shape[3] // m)
        alpha = m + 2
        channels = int(sch.get(transform).writes[0].source.shape[5])
        band, group, cols, vectors = plan_tiles(tiles_h, tiles_w, shape[1], alpha, channels, lanes)
        ty, iy = sch.split(y, [None, m])
        tx, ix = sch.split(x, [None, m])
        ty_o, ty_i = sch.split(ty, [None, band])
        fb_o, fb_i = sch.split(fb, [None, group])
        sch.reorder(n_, ty_o, fb_o, ty_i, tx, fb_i, iy, ix, fl)
        par = sch.fuse(n_, ty_o, fb_o)
        sch.unroll(iy)
        sch.unroll(ix)
        sch.vectorize(fl)
        # the output transform's first pass per tile and channel block, in registers
        sch.compute_at(out_rows, fb_i, preserve_unit_loops=True)
        _positions_unrolled(sch, sch.get_loops(out_rows)[-7:])
        sch.compute_at(gemm, par, preserve_unit_loops=True)
        sch.compute_at(transform, par, preserve_unit_loops=True)
        # the input transform: channel vectors, the tile's positions unrolled
        e, u, t_n, t_y, t_x, c = sch.get_loops(transform)[-6:]
        cb, cl = sch.split(c, [None, lanes])
        sch.reorder(t_n, t_y, t_x, cb, e, u, cl)
        _positions_unrolled(sch, [e, u, cl])
        sch.compute_at(rows, cb, preserve_unit_loops=True)
        _positions_unrolled(sch, sch.get_loops(rows)[-6:])
        sch.compute_at(pad, par, preserve_unit_loops=True)
        pad_in_channel_vectors(sch, pad, par, lanes)
        # the GEMMs: a register tile of `cols` tiles by `vectors` channel vectors
        e, u, g_n, g_y, g_x, g_fb, g_fl, rc = sch.get_loops(gemm)[-8:]
        tile = sch.fuse(g_n, g_y, g_x)
        t_o, t_i = sch.split(tile, [None, cols])
        f_o, f_i = sch.split(g_fb, [None, vectors])
        sch.reorder(e, u, f_o, t_o, rc, f_i, t_i, g_fl)
        acc = sch.cache_write(gemm, 0, "local")
        sch.reverse_compute_at(acc, t_o, preserve_unit_loops=True)
        sch.vectorize(g_fl)
        sch.unroll(f_i)
        sch.unroll(t_i)
        sch.parallel(par)
        init = sch.decompose_reduction(gemm, rc)
        finish_tile_blocks(sch, (init, acc), t_o, lanes)
        return sch
