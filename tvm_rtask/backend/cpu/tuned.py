"""CPU rKernels from MetaSchedule-tuned TIR.

A tuned llvm schedule (``RewriteParallelVectorizeUnroll``) fuses the outer spatial tiles of
the operator into one ``T.parallel`` loop that holds every block. Its iterations are
independent by construction (MetaSchedule already runs them on separate threads), so the
loop is cut into rTask chunks along it: ``num_rtasks`` chunks of ``ceil(extent /
num_rtasks)`` iterations, the last one guarded by a bounds check when they do not divide the
extent (an extent such as 125 or 9 then still splits over 2 or 4 vEUs). Inside a vEU every
loop runs on one worker thread: the parallel kind is removed (a nested parallel launch is not
supported inside the dispatcher's), vectorized and unrolled loops stay.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.tirx import IntImm

from ...records import TUNED_ATTR
from .kernel import CHUNK_ANNOTATION, CPURKernel


def is_tuned(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and TUNED_ATTR in func.attrs


def outer_parallel_extent(func: tirx.PrimFunc) -> int:
    """Extent of the parallel loop that holds the whole body, or 1 when there is none."""
    loop = _outer_loop(func)
    if loop is None or loop.kind != tirx.ForKind.PARALLEL:
        return 1
    return int(loop.extent.value) if isinstance(loop.extent, tirx.IntImm) else 1


def _outer_loop(func: tirx.PrimFunc) -> tirx.For | None:
    body = func.body
    if isinstance(body, s_tir.SBlockRealize):
        body = body.block.body
    return body if isinstance(body, tirx.For) else None


def _serial(stmt):
    """Every parallel loop of ``stmt`` made serial."""

    def visit(loop):
        if loop.kind != tirx.ForKind.PARALLEL:
            return loop
        return tirx.For(
            loop.loop_var,
            loop.min,
            loop.extent,
            tirx.ForKind.SERIAL,
            loop.body,
            annotations=loop.annotations,
        )

    return tvm_ffi.structural_map(stmt, (tirx.For, visit))


def chunk_count(extent: int, max_rtasks: int) -> int:
    """How many chunks of ``ceil(extent / n)`` iterations cover ``extent`` for ``n`` = at
    most ``max_rtasks`` (9 in at most 4: 3 chunks of 3; 125 in 4: 32, 32, 32, 29)."""
    n = min(extent, max(max_rtasks, 1))
    inner = -(-extent // n)
    return -(-extent // inner)


EVEN_ENOUGH = 0.05  # chunks that leave at most this share of the vEUs' time idle


def _idle_share(extent: int, max_rtasks: int) -> float:
    """The share of the chunks' time left idle when ``extent`` iterations are cut into
    chunks for at most ``max_rtasks`` vEUs (3 in 2: 2 and 1, a third idle; 99 in 2: 1%)."""
    count = chunk_count(extent, max_rtasks)
    return -(-extent // count) * count / extent - 1


def make_tuned_cpu_rkernel(func: tirx.PrimFunc, max_rtasks: int) -> CPURKernel:
    """Cut the tuned ``func`` along its outer parallel loop into at most ``max_rtasks``
    (fused with the spatial loop under it where that evens the chunks:
    :func:`_even_outer_loop`)."""
    func = _even_outer_loop(func, max_rtasks)
    extent = outer_parallel_extent(func)
    num_rtasks = chunk_count(extent, max_rtasks)
    body = _serial(func.body)
    if num_rtasks > 1:
        body = tvm_ffi.structural_map(body, (tirx.For, _Chunker(_outer_loop(func), num_rtasks)))
    result = func.with_body(body).with_attr("rtask.num_rtasks", num_rtasks)
    return CPURKernel(result, num_rtasks)


def _even_outer_loop(func: tirx.PrimFunc, max_rtasks: int) -> tirx.PrimFunc:
    """``func`` with its outer parallel loop fused with the loops right under it when the
    chunks of the parallel loop alone would be uneven (more than :data:`EVEN_ENOUGH` idle)
    and those loops are spatial in every block (their iterations independent): a shipped
    record of ConvNeXt-T's 3072 -> 768 matmul parallelises 3 column panels, which 2 vEUs ran
    as 2 and 1; with the 56 rows under them it is 168 iterations, 84 each. Rule kernels
    too: DeiT-Tiny's 768 -> 192 layer, 3 panels over 33 row tiles, is 99 iterations, 50 and
    49. Unchanged where no such nest evens the chunks."""
    extent = outer_parallel_extent(func)
    outer = _outer_loop(func)
    # one chunk (or one vEU) leaves nothing idle: _idle_share is 0 there
    if _idle_share(extent, max_rtasks) <= EVEN_ENOUGH or outer is None:
        return func
    depth, total, node = 1, extent, outer.body
    while isinstance(node, tirx.For) and isinstance(node.extent, tirx.IntImm):
        if not _spatial_in_every_block(node.loop_var, node.body):
            return func
        depth, total = depth + 1, total * int(node.extent.value)
        if _idle_share(total, max_rtasks) <= EVEN_ENOUGH:
            break
        node = node.body
    else:
        return func  # the nest ended before the chunks came out even
    try:
        sch = s_tir.Schedule(func.with_body(_serial(func.body)))
        block = sch.get_child_blocks(sch.get_sblock("root"))[0]
        sch.fuse(*sch.get_loops(block)[:depth])
        fused = sch.mod["main"]
    except (s_tir.ScheduleError, IndexError):
        return func
    loop = _outer_loop(fused)
    if loop is None or not isinstance(loop.extent, tirx.IntImm):
        return func
    parallel = tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.PARALLEL, loop.body,
                        annotations=loop.annotations)  # fmt: skip
    realize = fused.body
    root = realize.block
    root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, parallel,
                        alloc_buffers=root.alloc_buffers)  # fmt: skip
    return fused.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, root))


def _spatial_in_every_block(var: tirx.Var, stmt) -> bool:
    """Whether ``var`` binds only data-parallel block iterators under ``stmt``."""
    ok = [True]

    def visit(realize):
        for iv, value in zip(realize.block.iter_vars, realize.iter_values, strict=True):
            if iv.iter_type != tirx.IterVar.DataPar and _mentions(value, var):
                ok[0] = False
        return realize

    tvm_ffi.structural_map(stmt, (s_tir.SBlockRealize, visit))
    return ok[0]


def _mentions(expr, var: tirx.Var) -> bool:
    found = [False]

    def visit(v):
        if v.same_as(var):
            found[0] = True
        return v

    tvm_ffi.structural_map(expr, (tirx.Var, visit))
    return found[0]


class _Chunker:
    """Rewrite the outer loop ``for i in range(E)`` as ``for c in range(n): for j in
    range(ceil(E / n))`` with ``i = c * ceil(E / n) + j`` (guarded by ``i < E`` when ``n``
    does not divide ``E``); ``c`` carries the chunk annotation."""

    def __init__(self, loop: tirx.For, num_rtasks: int) -> None:
        self.var = loop.loop_var
        self.num_rtasks = num_rtasks
        self.extent = int(loop.extent.value)
        self.inner = -(-self.extent // num_rtasks)

    def __call__(self, loop: tirx.For):
        if not loop.loop_var.same_as(self.var):
            return loop
        dtype = str(self.var.ty)
        chunk = tirx.Var(f"{self.var.name}_rtask", dtype)
        inner = tirx.Var(f"{self.var.name}_in", dtype)
        index = tirx.Add(tirx.Mul(chunk, IntImm(dtype, self.inner)), inner)
        body = tvm_ffi.structural_map(
            loop.body, (tirx.Var, lambda v: index if v.same_as(self.var) else v)
        )
        if self.inner * self.num_rtasks != self.extent:  # the last chunk is shorter
            body = tirx.IfThenElse(tirx.LT(index, IntImm(dtype, self.extent)), body, None)
        inner_loop = tirx.For(
            inner,
            IntImm(dtype, 0),
            IntImm(dtype, self.inner),
            tirx.ForKind.SERIAL,
            body,
            annotations=loop.annotations,
        )
        return tirx.For(
            chunk,
            IntImm(dtype, 0),
            IntImm(dtype, self.num_rtasks),
            tirx.ForKind.SERIAL,
            inner_loop,
            annotations={CHUNK_ANNOTATION: 1},
        )
