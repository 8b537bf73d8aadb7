"""CPU rKernels: an operator's TIR with its outer spatial loop cut into rTask chunks.

On llvm a vEU is one worker thread and an rTask is a contiguous chunk of the operator's
outermost spatial iterations. The chunk loop is annotated with :data:`CHUNK_ANNOTATION`; the
persistent dispatcher (:mod:`tvm_rtask.tir.cpu_dispatch`) later runs a sub-range of it on a vEU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.s_tir.dlight.base.common_schedules import try_inline

CHUNK_ANNOTATION = "rtask.chunk"


@dataclass
class CPURKernel:
    """A scheduled PrimFunc whose annotated chunk loop enumerates its rTasks."""

    func: tirx.PrimFunc
    num_rtasks: int


def _root_children(sch: s_tir.Schedule) -> list:
    return sch.get_child_blocks(sch.get_sblock("root"))


def _leading_spatial_loops(sch: s_tir.Schedule, block) -> list:
    """Outermost loops of ``block`` that each bind one spatial iterator, outermost first."""
    info = get_sblock_info(sch, block)
    loops = sch.get_loops(block)
    prefix = []
    for loop, it in zip(loops, info.iters, strict=False):
        if it.kind != "S" or not sch.get(loop).same_as(sch.get(it.loop_rv)):
            break
        prefix.append(loop)
    return prefix


def _gather_under_anchor(sch: s_tir.Schedule) -> list | None:
    """Put every root block under the anchor's spatial loops; return those loops or None.

    The anchor is the first block that is not injective (the reduction that cannot be
    inlined); consumers are moved after it with ``reverse_compute_at`` and producers before it
    with ``compute_at``, each at the deepest spatial loop that accepts it.
    """
    blocks = _root_children(sch)
    infos = [get_sblock_info(sch, b) for b in blocks]
    anchor_index = next((i for i, b in enumerate(infos) if not b.is_injective()), 0)
    anchor = blocks[anchor_index]
    prefix = _leading_spatial_loops(sch, anchor)
    if not prefix:
        return None
    if len(blocks) == 1:
        return prefix
    if not _linked_to_anchor(sch, blocks, anchor_index):
        return None
    depth = len(prefix)
    for i, block in enumerate(blocks):
        if i == anchor_index:
            continue
        move = sch.reverse_compute_at if i > anchor_index else sch.compute_at
        for d in range(depth - 1, -1, -1):
            try:
                move(block, prefix[d], preserve_unit_loops=True)
            except s_tir.ScheduleError:
                continue
            depth = d + 1
            break
        else:
            return None
    return prefix[:depth]


def _buffers(regions) -> set[int]:
    return {r.source.__chandle__() for r in regions}


def _linked_to_anchor(sch: s_tir.Schedule, blocks: list, anchor_index: int) -> bool:
    """Whether every block after the anchor consumes (through the blocks before it) what the
    anchor writes, and every block before it produces what the anchor (or a later producer)
    reads.

    ``compute_at`` / ``reverse_compute_at`` compute a moved block only over the region the
    anchor's chunk needs or makes. A block unrelated to the anchor, e.g. a second pooling of
    another input that a final add joins with the first, is still accepted by
    ``reverse_compute_at`` but then computed per chunk over the wrong region: rTasks read
    values other rTasks write (seen on NASNet with fused pooling branches). Such a kernel
    stays one rTask.
    """
    stmts = [sch.get(b) for b in blocks]
    made = _buffers(stmts[anchor_index].writes)
    for stmt in stmts[anchor_index + 1 :]:
        if not _buffers(stmt.reads) & made:
            return False
        made |= _buffers(stmt.writes)
    needed = _buffers(stmts[anchor_index].reads)
    for stmt in reversed(stmts[:anchor_index]):
        if not _buffers(stmt.writes) & needed:
            return False
        needed |= _buffers(stmt.reads)
    return True


def make_cpu_rkernel(func: tirx.PrimFunc, max_rtasks: int) -> CPURKernel:
    """Cut ``func`` into at most ``max_rtasks`` rTasks along its outer spatial iterations.

    Injective blocks are inlined first (as dlight does). A function whose blocks cannot all
    be placed under one spatial loop nest stays a single rTask: still correct, just without
    intra-operator parallelism.
    """
    from .cpu_tuned import is_tuned, make_tuned_cpu_rkernel

    if is_tuned(func):  # a MetaSchedule schedule: cut along its own parallel loop
        return make_tuned_cpu_rkernel(func, max_rtasks)
    sch = s_tir.Schedule(func)
    try:
        blocks = _root_children(sch)
        try_inline(sch, [get_sblock_info(sch, b) for b in blocks])
        loops = _gather_under_anchor(sch) if _root_children(sch) else None
    except (s_tir.ScheduleError, ValueError, AttributeError, IndexError):
        loops = None
    if not loops or max_rtasks <= 1:
        return CPURKernel(func.with_attr("rtask.num_rtasks", 1), 1)

    extents = [int(sch.get(loop).extent) for loop in loops]
    count, total = 0, 1
    for extent in extents:
        count, total = count + 1, total * extent
        if total >= max_rtasks:
            break
    fused = sch.fuse(*loops[:count]) if count > 1 else loops[0]
    inner = -(-total // max_rtasks)
    num_rtasks = -(-total // inner)
    if num_rtasks <= 1:
        return CPURKernel(func.with_attr("rtask.num_rtasks", 1), 1)
    outer, _ = sch.split(fused, [num_rtasks, inner])
    sch.annotate(outer, CHUNK_ANNOTATION, 1)
    result = sch.mod["main"].with_attr("rtask.num_rtasks", num_rtasks)
    return CPURKernel(result, num_rtasks)
