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
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.target import Target

from .base import (
    CPUScheduleRule,
    float32_reduction,
    inline_epilogue,
    loop_var_of,
    overlap_last_tile,
    split_divisible,
    split_producers,
    vector_lanes,
)


def _is_matmul_kn(sch: s_tir.Schedule, block) -> bool:
    """``out[..., m, n] (+)= A[..., m, k] * B[..., k, n]``: spatial iterators, then one
    reduction; some read indexed ``[k, n]`` by the last two dimensions."""
    info = get_sblock_info(sch, block)
    kinds = info.dom_kind()
    if len(kinds) < 3 or not kinds.endswith("SSR") or "R" in kinds[:-1]:
        return False
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or len(stmt.reads) < 2:
        return False
    ivars = [iv.var for iv in stmt.iter_vars]
    m, n, k = ivars[-3:]
    out = stmt.writes[0].region
    if len(out) < 2 or not (out[-2].min.same_as(m) and out[-1].min.same_as(n)):
        return False
    kn = mk = False
    for read in stmt.reads:
        region = read.region
        if len(region) >= 2 and region[-2].min.same_as(k) and region[-1].min.same_as(n):
            kn = True
        if len(region) >= 2 and region[-2].min.same_as(m) and region[-1].min.same_as(k):
            mk = True
    return kn and mk


class MatmulKN(CPUScheduleRule):
    """Vectorised over the output columns, register-tiled over rows and column vectors; see
    the module docstring. ``acc_vectors``: accumulator vectors of one tile."""

    def __init__(self, acc_vectors: int = 16, max_rows: int = 4, max_col_vectors: int = 4):
        self.acc_vectors = acc_vectors
        self.max_rows = max_rows
        self.max_col_vectors = max_col_vectors

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        found = float32_reduction(self, func, target, _is_matmul_kn)
        if found is None:
            return None
        sch, mm, (*batch, m, n, k), extents = found
        if split_producers(sch, mm) != []:  # only copies are inlined: no padding here
            return None
        m_ext, n_ext = extents[-3], extents[-2]
        lanes = min(vector_lanes(target), n_ext)
        # column vectors per tile: as many as fit, keeping four tiles for the vEUs if it can
        nv = max(1, min(self.max_col_vectors, n_ext // lanes // 4))
        mr = split_divisible(m_ext, max(1, min(self.max_rows, self.acc_vectors // nv)))
        tile = nv * lanes
        mo, mi = sch.split(m, [None, mr])
        no, nin = sch.split(n, [None, tile])
        nvl, ni = sch.split(nin, [nv, lanes])
        # the column tiles are the parallel loop (not fused with the rows: the last tile's
        # shift needs the tile loop's own variable); batches and row tiles run inside
        sch.reorder(no, *batch, mo, k, mi, nvl, ni)
        acc = sch.cache_write(mm, 0, "local")
        if not inline_epilogue(sch, acc):
            return None
        sch.reverse_compute_at(acc, mo, preserve_unit_loops=True)
        par = no
        sch.vectorize(ni)
        sch.unroll(mi)
        sch.unroll(nvl)
        sch.parallel(par)  # before decompose_reduction (see conv2d_nchw)
        init = sch.decompose_reduction(mm, k)
        for block in (init, acc):
            loops = sch.get_loops(block)[2 + len(batch) :]  # under par, batches, m_o
            if sch.get(loops[-1]).kind != tirx.ForKind.VECTORIZED:
                outer, inner = sch.split(loops[-1], [None, lanes])
                sch.vectorize(inner)
                loops = [*loops[:-1], outer]
            for loop in loops[:-1]:
                sch.unroll(loop)
        if n_ext % tile == 0:
            return sch
        return overlap_last_tile(sch.mod["main"], loop_var_of(sch, no), tile, n_ext)
