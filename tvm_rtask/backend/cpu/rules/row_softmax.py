"""Softmax over the last axis (TOPI's ``softmax``, as Relax legalizes ``nn.softmax``), rebuilt
with its row maximum and row sum kept in vectors of partial results.

``RowReduction`` (dlight's ``Reduction``) walks each row's maximum and sum one element after
another: every ``max`` and ``add`` waits for the one before it, so a row of 197 (ViT-B/16's
attention, 12 x 197 rows per layer) costs two chains of 197 dependent operations. Timed alone
on 2 threads the ``[1, 12, 197, 197]`` softmax took 750 us against ONNX Runtime's 134 us;
as below, 211 us.

Computed here, per row (``L = V * lanes + tail``)::

    for row in T.parallel(rows):                          # the rTask loop
        part[lanes] = max over v < V of x[row, v*lanes : (v+1)*lanes]   # vector maxima
        m = max(max(part), max(x[row, V*lanes:]))         # one horizontal max, the tail
        e[k] = exp(x[row, k] - m)                         # in vectors, the last shifted
                                                          # back to end at L
        part[lanes] = sum over v < V of e[v*lanes : (v+1)*lanes]        # vector sums
        s = sum(part) + sum(e[V*lanes:])
        out[row, k] = e[k] / s

The sum's order changes (``lanes`` partial sums; relative error about 1e-7). Rows shorter
than one vector are left to the next rule.
"""

from __future__ import annotations

import math

import tvm_ffi
from tvm import s_tir, te, tirx
from tvm.target import Target

from ....tir.rules import loads_of
from ....tir.schedule import schedule_of
from .base import CPUScheduleRule, loop_var_of, overlap_last_tile, vector_lanes

SOFTMAX_BLOCKS = ("T_softmax_maxelem", "T_softmax_exp", "T_softmax_expsum", "T_softmax_norm")


def _softmax_shape(func: tirx.PrimFunc) -> list[int] | None:
    """The input's static shape when ``func`` is exactly TOPI's float32 softmax over the last
    axis: input and output of one shape, its four blocks, the maximum per row."""
    types = [getattr(p, "ty", None) for p in func.params]
    if len(types) != 2 or not all(isinstance(t, tirx.BufferType) for t in types):
        return None
    if any(str(t.dtype) != "float32" for t in types):
        return None
    shapes = [[int(d) if isinstance(d, tirx.IntImm) else None for d in t.shape] for t in types]
    if shapes[0] != shapes[1] or None in shapes[0] or len(shapes[0]) < 2:
        return None
    # the blocks by name, without a schedule: this runs on every function the rules before
    # it left (most are element-wise)
    blocks = {}

    def visit(node):
        if isinstance(node, s_tir.SBlock) and node.name_hint != "root":
            blocks[node.name_hint] = node

    tvm_ffi.structural_walk(func.body, visit)
    if sorted(blocks) != sorted(SOFTMAX_BLOCKS):
        return None
    maxelem = blocks[SOFTMAX_BLOCKS[0]].writes[0].source.ty
    if [int(d) for d in maxelem.shape] != shapes[0][:-1]:
        return None  # softmax over another axis
    if not _reduces_last_axis(blocks[SOFTMAX_BLOCKS[0]], func.params[0]):
        return None  # over another axis of the same length as the last
    return shapes[0]


def _reduces_last_axis(block: s_tir.SBlock, source) -> bool:
    """Whether every read of ``source`` in the row-maximum ``block`` is indexed by its
    spatial iterators in order and its reduction iterator last: the shapes alone cannot tell
    a softmax over the last axis from one over an axis of the same length (fuzzing found it)."""
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == 0]
    reduce = [iv.var for iv in block.iter_vars if int(iv.iter_type) == 2]
    loads = loads_of(block.body, source)
    if len(reduce) != 1 or not loads:
        return False
    expected = [*spatial, reduce[0]]
    return all(
        len(load.indices) == len(expected)
        and all(i.same_as(v) for i, v in zip(load.indices, expected, strict=True))
        for load in loads
    )


def _row_reduce(source, lead, length, lanes, combine, identity, name):
    """Per row: ``lanes`` partial results over the whole vectors, then one scalar result
    with the tail."""
    vectors, tail = divmod(length, lanes)
    v = te.reduce_axis((0, vectors), name=f"{name}_v")
    part = te.compute(
        (*lead, lanes),
        lambda *i: combine(source(*i[:-1], v * lanes + i[-1]), axis=v),
        name=f"{name}_part",
    )
    j = te.reduce_axis((0, lanes), name=f"{name}_j")
    whole = te.compute(lead, lambda *i: combine(part(*i, j), axis=j), name=f"{name}_whole")
    if not tail:
        return whole, [part, whole]
    t = te.reduce_axis((0, tail), name=f"{name}_t")
    rest = te.compute(
        lead, lambda *i: combine(source(*i, vectors * lanes + t), axis=t), name=f"{name}_tail"
    )
    both = te.compute(lead, lambda *i: identity(whole(*i), rest(*i)), name=name)
    return both, [part, whole, rest, both]


def softmax_rows(shape: list[int], lanes: int) -> tirx.PrimFunc:
    """The softmax of ``shape`` over its last axis as in the module docstring, scheduled."""
    *lead, length = shape
    x = te.placeholder(shape, "float32", name="x")
    mx, max_stages = _row_reduce(lambda *i: x(*i), lead, length, lanes, te.max, tirx.max, "row_max")
    e = te.compute(shape, lambda *i: te.exp(x(*i) - mx(*i[:-1])), name="row_exp")
    total, sum_stages = _row_reduce(
        lambda *i: e(*i), lead, length, lanes, te.sum, lambda a, b: a + b, "row_sum"
    )
    out = te.compute(shape, lambda *i: e(*i) / total(*i[:-1]), name="softmax")
    func = te.create_prim_func([x, out])
    sch = schedule_of(func)
    last = sch.get_sblock("softmax")
    loops = sch.get_loops(last)
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    stages = [*max_stages, e, *sum_stages]
    for stage in reversed(stages):
        sch.compute_at(sch.get_sblock(stage.op.name), row, preserve_unit_loops=True)
    # parallel and vectorized before decompose_reduction (TVM 0.27 refuses both after it)
    sch.parallel(row)
    for stage in (max_stages[0], sum_stages[0]):  # the vector partial results
        block = sch.get_sblock(stage.op.name)
        lane, step = sch.get_loops(block)[-2:]
        sch.reorder(step, lane)
        sch.vectorize(lane)
        init = sch.decompose_reduction(block, step)
        sch.vectorize(sch.get_loops(init)[-1])
    tiles = []
    for name in (e.op.name, "softmax"):  # the row in vectors, the last one shifted back
        k = sch.get_loops(sch.get_sblock(name))[-1]
        tile, lane = sch.split(k, [None, lanes])
        sch.vectorize(lane)
        tiles.append(loop_var_of(sch, tile))
    func = sch.mod["main"]
    for tile in tiles if length % lanes else ():
        func = overlap_last_tile(func, tile, lanes, length)
    return func


class RowSoftmax(CPUScheduleRule):
    """See the module docstring."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        shape = _softmax_shape(func)
        lanes = vector_lanes(target)
        if shape is None or shape[-1] < lanes or math.prod(shape[:-1]) < 1:
            return None
        rebuilt = softmax_rows(shape, lanes).without_attr("global_symbol")
        return rebuilt.with_attrs(dict(func.attrs)) if func.attrs is not None else rebuilt


__all__ = ["RowSoftmax", "softmax_rows"]
