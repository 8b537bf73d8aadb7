"""Matrix products whose right operand is ``[k, n]`` (Relax's ``matmul`` of a row-major
weight, ONNX ``Gemm`` / ``MatMul`` after legalization), with the fused epilogue (bias add,
relu): ``out[b, m, n] = sum_k A[b, m, k] * B[b?, k, n]``.

TVM 0.27's ``dlight.cpu.GEMV`` schedules the other layout only (the reduction innermost in
both operands, ``B[n, k]``) and leaves its epilogue outside the parallel loop, so the dense
layers of the light models (``x[1, 1024] @ W[1024, 1000]``) ran as Relax legalized them: for
each output a serial walk down a column of ``W``.

Schedule (per register tile of ``MR`` rows x ``NV`` vectors of columns)::

    for p in T.parallel(ceil(N / (NV*lanes))):     # the rTask loop: column tiles
      for b, m_o in (B, M/MR):
        acc[MR, NV*lanes] = 0
        for k:                                               # B's rows stream, contiguous
            for m_i in unroll(MR):
                for v in unroll(NV):
                    for n_i in vectorized(lanes):
                        acc[m_i, v*lanes + n_i] += A[m, k] * B[k, n]
        out[m, n] = epilogue(acc)                            # inlined into the write-back

A last column tile that does not fit is shifted back to end at ``N`` (``overlap_last_tile``).
With packed weights and at most :data:`PREFETCH_MAX_ROWS` rows, the loop over ``k`` also
prefetches the next panel (:func:`prefetch_next_panel`): few rows do few FMAs per weight.
"""

from __future__ import annotations

import math

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.target import Target

from .base import (
    CPUScheduleRule,
    capped_tile_score,
    float32_reduction,
    inline_epilogue,
    loop_var_of,
    overlap_last_tile,
    panel_vectors,
    split_divisible,
    split_producers,
    unroll_cheap,
    vector_lanes,
    vector_registers,
)


def _packed_width(region, k, n) -> int | None:
    """``T`` when ``region`` reads a packed weight ``Wp[n // T, k, n % T]``, else None."""
    if len(region) != 3 or not region[1].min.same_as(k):
        return None
    outer, inner = region[0].min, region[2].min
    if not (isinstance(outer, tirx.FloorDiv) and isinstance(inner, tirx.FloorMod)):
        return None
    if not (outer.a.same_as(n) and inner.a.same_as(n)):
        return None
    if not (isinstance(outer.b, tirx.IntImm) and isinstance(inner.b, tirx.IntImm)):
        return None
    width = int(outer.b.value)
    return width if int(inner.b.value) == width else None


def _matmul_kn_width(sch: s_tir.Schedule, block) -> int | None:
    """``out[..., m, n] (+)= A[..., m, k] * B[..., k, n]``: spatial iterators, then one
    reduction; some read indexed ``[k, n]`` by the last two dimensions (0 returned), or a
    packed weight ``Wp[n // T, k, n % T]`` (``PackMatmulWeights``: ``T`` returned). None
    when the block is something else."""
    info = get_sblock_info(sch, block)
    kinds = info.dom_kind()
    if len(kinds) < 3 or not kinds.endswith("SSR") or "R" in kinds[:-1]:
        return None
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or len(stmt.reads) < 2:
        return None
    ivars = [iv.var for iv in stmt.iter_vars]
    m, n, k = ivars[-3:]
    out = stmt.writes[0].region
    if len(out) < 2 or not (out[-2].min.same_as(m) and out[-1].min.same_as(n)):
        return None
    width = None
    mk = False
    for read in stmt.reads:
        region = read.region
        if len(region) >= 2 and region[-2].min.same_as(k) and region[-1].min.same_as(n):
            width = 0
        elif (packed := _packed_width(region, k, n)) is not None:
            width = packed
        if len(region) >= 2 and region[-2].min.same_as(m) and region[-1].min.same_as(k):
            mk = True
    return width if mk else None


def _weight_is_shared(sch: s_tir.Schedule, block) -> bool:
    """The ``[k, n]`` operand (or packed weight) has no batch dimension: every batch reads
    the same matrix, so batches may be tiled as rows."""
    stmt = sch.get(block)
    ivars = [iv.var for iv in stmt.iter_vars]
    n, k = ivars[-2], ivars[-1]
    for read in stmt.reads:
        region = read.region
        if len(region) == 2 and region[0].min.same_as(k) and region[1].min.same_as(n):
            return True
        if _packed_width(region, k, n) is not None:
            return True
    return False


def _is_matmul_kn(sch: s_tir.Schedule, block) -> bool:
    return _matmul_kn_width(sch, block) is not None


def flatten_rows(sch: s_tir.Schedule, block, extents: list[int]):
    """The accumulator write-back of ``block`` (its epilogue inlined), with ``block``, its
    accumulator and the write-back indexed by one row ``(b..., m)`` flattened: a product of
    ``x[1, H, W, K]`` by a shared weight (ConvNeXt's and Swin's channels-last layers) tiles
    its ``H * W`` rows as one matrix's, where tiles of each ``W`` rows overlapped (ConvNeXt-T
    7 x 7 x 3072 @ 3072 x 768: 12 rows computed for each 7). None when the epilogue does not
    inline (the block is left as it was only then: the caller gives up)."""
    acc = sch.cache_write(block, 0, "local")
    if not inline_epilogue(sch, acc):
        return None
    spatial = extents[:-1]  # batch dimensions, rows, columns

    def row(*ivs):
        flat = ivs[0]
        for iv, extent in zip(ivs[1:-1], spatial[1:-1], strict=True):
            flat = flat * extent + iv
        return flat

    dtype = str(sch.get(block).iter_vars[0].var.ty)
    outputs = len(spatial)

    def index_map(func, ndim):
        return tirx.IndexMap.from_func(func, ndim=ndim, index_dtype=dtype)

    sch.transform_layout(block, ("write", 0), index_map(lambda *ivs: (row(*ivs), ivs[-1]), outputs))
    sch.transform_block_layout(
        block, index_map(lambda *ivs: (row(*ivs[:-1]), ivs[-2], ivs[-1]), outputs + 1)
    )
    sch.transform_block_layout(acc, index_map(lambda *ivs: (row(*ivs), ivs[-1]), outputs))
    return acc


# Products of at most PREFETCH_MAX_ROWS rows do few FMAs per weight they read, and their
# panels come from memory on every call: the loop over k prefetches the next panel
# (ViT-B/32's 50 x 768 x 3072, weights evicted before each call, 1 thread: 2256 -> 1887 us;
# 197 rows, where a panel feeds 33 row tiles, gained nothing and lost 14% at 2 threads).
PREFETCH_MAX_ROWS = 64
CACHE_LINE_FLOATS = 16


def _packed_weight(block) -> tirx.Buffer:
    """The packed weight ``Wp[n // T, k, n % T]`` that the product ``block`` reads."""
    n, k = (iv.var for iv in block.iter_vars[-2:])
    return next(r.source for r in block.reads if _packed_width(r.region, k, n) is not None)


def prefetch_next_panel(func, weight, panel, row_tile, k, row_tiles: int) -> tirx.PrimFunc:
    """``func`` with the loop over ``k`` prefetching (into L2) row ``k`` of the panel after
    ``panel``: one cache line a step, the row tiles taking the lines in turn, or every
    line of the row where there are fewer row tiles than lines (a product of one row)."""
    panels, _, width = (int(d) for d in weight.shape)
    lines = max(1, width // CACHE_LINE_FLOATS)
    dtype = str(panel.ty)
    nxt = tirx.Min(panel + tirx.IntImm(dtype, 1), tirx.IntImm(dtype, panels - 1))
    if row_tiles >= lines:
        starts = [tirx.FloorMod(row_tile, tirx.IntImm(dtype, lines)) * CACHE_LINE_FLOATS]
    else:
        starts = [tirx.IntImm(dtype, line * CACHE_LINE_FLOATS) for line in range(lines)]

    def prefetch(start):
        address = tirx.call_intrin(
            "handle", "tirx.address_of", tirx.BufferLoad(weight, [nxt, k, start])
        )
        read, l2, data = (tirx.IntImm("int32", v) for v in (0, 2, 1))
        return tirx.Evaluate(
            tirx.call_llvm_intrin("void", "llvm.prefetch.p0", address, read, l2, data)
        )

    def visit(node):
        if not node.loop_var.same_as(k):
            return node
        body = tirx.SeqStmt([*(prefetch(s) for s in starts), node.body])
        return tirx.For(
            node.loop_var,
            node.min,
            node.extent,
            node.kind,
            body,
            node.thread_binding,
            node.annotations,
        )

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, visit)))


BATCH_PARALLEL = 4  # batches from which a product without a shared operand runs by batch


def _column_vectors(n: int, lanes: int, most: int, acc_vectors: int, max_rows: int) -> int:
    """Vectors of columns per tile when the column tiles need not run in parallel: the
    best :func:`capped_tile_score` of its rows and vectors over the ``n`` columns."""
    best, best_key = 1, (0.0, 0)
    for nv in range(1, most + 1):
        tile = nv * lanes
        if tile > n:
            break
        rows = max(1, min(max_rows, acc_vectors // nv))
        key = (capped_tile_score(rows, nv, n, tile), nv)
        if key > best_key:
            best, best_key = nv, key
    return best


class MatmulKN(CPUScheduleRule):
    """Vectorised over the output columns, register-tiled over rows and column vectors; see
    the module docstring. ``acc_vectors``: accumulator vectors of one tile, ``max_rows``: its
    most rows; None: from the target's vector registers. With AVX-512's 32, 24 vectors in up
    to six rows: six rows of four vectors ran 1-15% faster than four on every transformer and
    ConvNeXt shape measured (ViT-B/16's 197x768 @ 768x3072: 3.43 -> 2.91 ms, 2 threads);
    seven spill. With 16 (SSE, AVX2), 12 in up to six rows of at most two vectors
    (:func:`~.base.panel_vectors`): 12 accumulators, 2 weight vectors and a broadcast fit the
    16 registers, where four rows of four spilled the accumulators inside the ``k`` loop
    (docs/cpu-kernels.md). ``max_col_vectors``: the most column vectors of a tile (None:
    the panel's). ``prefetch_max_rows``: products of packed weights with at most this many
    rows prefetch the next panel (0: none)."""

    def __init__(
        self,
        acc_vectors: int | None = None,
        max_rows: int | None = None,
        max_col_vectors: int | None = None,
        prefetch_max_rows: int = PREFETCH_MAX_ROWS,
    ):
        self.prefetch_max_rows = prefetch_max_rows
        self.acc_vectors = acc_vectors
        self.max_rows = max_rows
        self.max_col_vectors = max_col_vectors

    def _tile_limits(self, target: Target) -> tuple[int, int, int]:
        """Accumulator vectors, rows and column vectors of a tile on ``target``."""
        registers = vector_registers(target)
        wide = registers >= 32
        acc = self.acc_vectors if self.acc_vectors is not None else (24 if wide else 12)
        rows = self.max_rows if self.max_rows is not None else 6
        cols = self.max_col_vectors
        return acc, rows, cols if cols is not None else panel_vectors(registers)

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        found = float32_reduction(self, func, target, _is_matmul_kn)
        if found is None:
            return None
        sch, mm, (*batch, m, n, k), extents = found
        if split_producers(sch, mm) != []:  # only copies are inlined: no padding here
            return None
        m_ext, n_ext = extents[-3], extents[-2]
        # the panel width before the rows are flattened: after it the left operand reads
        # ``x[0, row // W, row % W, k]``, which _matmul_kn_width does not take for ``[m, k]``
        # (ConvNeXt-T's 28 x 28 x 768 @ 768 x 192 then ran 48-column tiles across 64-column
        # panels, 4.2x slower)
        packed = _matmul_kn_width(sch, mm)
        acc = None
        if math.prod(extents[: len(batch)]) > 1 and _weight_is_shared(sch, mm):
            # [B..., M, K] @ [K, N] (channels-last convolutions' layers, a sequence-first
            # transformer's projections): every batch's rows are one matrix's rows
            acc = flatten_rows(sch, mm, extents)
            if acc is None:
                return None
            m, n, k = sch.get_loops(mm)
            batch, m_ext = [], math.prod(extents[:-2])
        lanes = min(vector_lanes(target), n_ext)
        if packed:  # the panel is the column tile: its k rows are contiguous
            if packed % lanes:  # packed for narrower vectors than this target's
                if lanes % packed:
                    return None
                lanes = packed
            nv = packed // lanes
        batch_ext = math.prod(extents[: len(batch)])
        by_batch = not packed and batch_ext >= BATCH_PARALLEL and not _weight_is_shared(sch, mm)
        acc_vectors, max_rows, max_cols = self._tile_limits(target)
        if by_batch:
            # the batches are the parallel loop (attention's heads): the column tile needs
            # no count of its own, so it is the one that wastes the fewest FMAs
            nv = _column_vectors(n_ext, lanes, max_cols, acc_vectors, max_rows)
        elif not packed:
            # column vectors per tile: as many as fit, keeping four tiles for the vEUs
            nv = max(1, min(max_cols, n_ext // lanes // 4))
        rows = max(1, min(max_rows, acc_vectors // nv))
        mr = split_divisible(m_ext, rows)
        if mr < rows and m_ext >= rows:  # e.g. 197 rows: overlap the last row tile instead
            mr = rows
        tile = nv * lanes
        mo, mi = sch.split(m, [None, mr])
        no, nin = sch.split(n, [None, tile])
        nvl, ni = sch.split(nin, [nv, lanes])
        # the column tiles are the parallel loop (not fused with the rows: the last tile's
        # shift needs the tile loop's own variable); batches and row tiles run inside.
        # Or the batches are, with column and row tiles inside
        outer = [*batch, no] if by_batch else [no, *batch]
        sch.reorder(*outer, mo, k, mi, nvl, ni)
        if acc is None:
            acc = sch.cache_write(mm, 0, "local")
            if not inline_epilogue(sch, acc):
                return None
        sch.reverse_compute_at(acc, mo, preserve_unit_loops=True)
        par = (sch.fuse(*batch) if len(batch) > 1 else batch[0]) if by_batch else no
        sch.vectorize(ni)
        sch.unroll(mi)
        sch.unroll(nvl)
        sch.parallel(par)  # before decompose_reduction (see conv2d_nchw)
        init = sch.decompose_reduction(mm, k)
        for block in (init, acc):
            # under the parallel loop, the other outer loops and m_o
            loops = sch.get_loops(block)[3 if by_batch else 2 + len(batch) :]
            if sch.get(loops[-1]).kind != tirx.ForKind.VECTORIZED:
                outer, inner = sch.split(loops[-1], [None, lanes])
                sch.vectorize(inner)
                loops = [*loops[:-1], outer]
            unroll_cheap(sch, block, loops[:-1])
        func = sch.mod["main"]
        if m_ext % mr:
            func = overlap_last_tile(func, loop_var_of(sch, mo), mr, m_ext)
        if func is not None and n_ext % tile:
            func = overlap_last_tile(func, loop_var_of(sch, no), tile, n_ext)
        one_matrix = all(e == 1 for e in extents[: len(batch)])
        if func is not None and packed and one_matrix and m_ext <= self.prefetch_max_rows:
            weight = _packed_weight(sch.get(mm))
            loops = (loop_var_of(sch, par), loop_var_of(sch, mo), loop_var_of(sch, k))
            func = prefetch_next_panel(func, weight, *loops, -(-m_ext // mr))
        return sch if func is sch.mod["main"] else func
