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


def make_tuned_cpu_rkernel(func: tirx.PrimFunc, max_rtasks: int) -> CPURKernel:
    """Cut the tuned ``func`` along its outer parallel loop into at most ``max_rtasks``."""
    extent = outer_parallel_extent(func)
    num_rtasks = chunk_count(extent, max_rtasks)
    body = _serial(func.body)
    if num_rtasks > 1:
        body = tvm_ffi.structural_map(body, (tirx.For, _Chunker(_outer_loop(func), num_rtasks)))
    result = func.with_body(body).with_attr("rtask.num_rtasks", num_rtasks)
    return CPURKernel(result, num_rtasks)


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
