"""Cheap static measures of a PrimFunc for the analytical cost model."""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx


def block_iterator_kinds(func: tirx.PrimFunc) -> set[int]:
    """The kinds (``tirx.IterVar.DataPar``, ``CommReduce``, ...) of every block iterator of
    ``func``: whether anything reduces, without building a schedule (about a millisecond
    each). The walk visits blocks only; an untyped walk calls Python for every node."""
    kinds: set[int] = set()

    def visit(block: s_tir.SBlock) -> None:
        kinds.update(int(v.iter_type) for v in block.iter_vars)

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, visit))
    return kinds


_ARITH = (
    tirx.Add,
    tirx.Sub,
    tirx.Mul,
    tirx.Div,
    tirx.FloorDiv,
    tirx.Max,
    tirx.Min,
    tirx.Select,
)


def _count_arith(expr) -> int:
    count = [0]

    def visit(node):
        if isinstance(node, _ARITH) and "float" in str(node.ty):
            count[0] += 1

    tvm_ffi.structural_walk(expr, visit)
    return count[0]


def _flops(stmt, scale: int) -> int:
    if isinstance(stmt, tirx.For):
        extent = stmt.extent
        factor = int(extent.value) if isinstance(extent, tirx.IntImm) else 1
        return _flops(stmt.body, scale * factor)
    if isinstance(stmt, tirx.SeqStmt):
        return sum(_flops(s, scale) for s in stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        return _flops(stmt.block, scale)
    if isinstance(stmt, s_tir.SBlock):
        return _flops(stmt.body, scale)
    if isinstance(stmt, tirx.IfThenElse):
        return _flops(stmt.then_case, scale) + (
            _flops(stmt.else_case, scale) if stmt.else_case is not None else 0
        )
    if isinstance(stmt, tirx.BufferStore):
        return scale * max(_count_arith(stmt.value), 1)
    body = getattr(stmt, "body", None)
    return _flops(body, scale) if body is not None else 0


def estimate_flops(func: tirx.PrimFunc) -> float:
    """Floating-point operations of one call: arithmetic nodes of each store times its loops.

    A store without arithmetic (a copy) counts one, so data movement is not free.
    """
    return float(_flops(func.body, 1))


def buffer_elements(buf) -> int | None:
    """Number of elements of a buffer with a static shape (None when it is symbolic)."""
    numel = 1
    for dim in buf.ty.shape:
        if not isinstance(dim, tirx.IntImm):
            return None
        numel *= int(dim.value)
    return numel


def buffer_bytes(buf) -> int:
    """Size in bytes of a buffer with a static shape (0 when it is symbolic)."""
    numel = buffer_elements(buf)
    if numel is None:
        return 0
    dtype = tvm_ffi.dtype(str(buf.ty.dtype))
    return numel * max(dtype.bits * dtype.lanes // 8, 1)


def allocated_buffers(stmt) -> list:
    """The buffers ``stmt`` allocates: SBlock ``alloc_buffers`` and ``AllocBuffer``
    statements, in visiting order."""
    found = []

    def visit(node):
        if isinstance(node, s_tir.SBlock):
            found.extend(node.alloc_buffers)
        elif isinstance(node, tirx.AllocBuffer):
            found.append(node.buffer)

    tvm_ffi.structural_walk(stmt, visit)
    return found


def estimate_bytes(func: tirx.PrimFunc) -> float:
    """Bytes read and written through the function's parameters (each touched once)."""
    return float(sum(buffer_bytes(p) for p in func.params if _is_buffer(p)))


def _is_buffer(var) -> bool:
    return isinstance(getattr(var, "ty", None), tirx.BufferType)
