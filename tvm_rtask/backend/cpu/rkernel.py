"""CPU rKernels: an operator's TIR with its outer spatial loop cut into rTask chunks.

On llvm a vEU is one worker thread and an rTask is a contiguous chunk of the operator's
outermost spatial iterations. The chunk loop is annotated with :data:`CHUNK_ANNOTATION`; the
persistent dispatcher (:mod:`tvm_rtask.backend.cpu.dispatch`) later runs a sub-range of it on a vEU.
"""

from __future__ import annotations

from collections.abc import Sequence

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.s_tir.dlight.base.common_schedules import try_inline

from ...tir.common import gather_covering, root_children
from ...tir.rules import LOGGER, one_line, operator_name
from ...tir.schedule import schedule_of
from .kernel import CHUNK_ANNOTATION, CPURKernel
from .tuned import is_tuned, make_tuned_cpu_rkernel


def make_cpu_rkernel(func: tirx.PrimFunc, max_rtasks: int) -> CPURKernel:
    """Cut ``func`` into at most ``max_rtasks`` rTasks along its outer spatial iterations
    (:func:`make_cpu_rkernels` for one bound)."""
    return make_cpu_rkernels(func, [max_rtasks])[0]


def make_cpu_rkernels(func: tirx.PrimFunc, bounds: Sequence[int]) -> list[CPURKernel]:
    """``func`` cut into at most ``bound`` rTasks along its outer spatial iterations, for
    each of ``bounds``.

    Injective blocks are inlined first (as dlight does), for one rTask too (left as separate
    passes over memory, DenseNet-121's concatenations with their batch norms took 23.6 ms
    on one vEU against 3.0 on two). A function whose blocks cannot all be placed under one
    spatial loop nest stays a single rTask: still correct, just without intra-operator
    parallelism. The inlining and the gathering under one loop nest (milliseconds per
    block) are done once for all bounds.
    """
    if is_tuned(func):  # a MetaSchedule schedule: cut along its own parallel loop
        return [make_tuned_cpu_rkernel(func, bound) for bound in bounds]
    sch = schedule_of(func)
    whole = func  # one rTask: the function with its injective blocks inlined, where they are
    try:
        blocks = root_children(sch)
        try_inline(sch, [get_sblock_info(sch, b) for b in blocks])
        whole = sch.mod["main"]
        gathered = gather_covering(sch) if root_children(sch) else None
        if gathered is None:
            loops = None
        else:
            sch, loops = gathered
    except s_tir.ScheduleError:  # blocks TVM will not place under one loop nest
        loops = None
    except Exception as error:  # anything else must not fail a compile either: logged
        LOGGER.warning(
            "cutting %s into rTasks failed, one rTask: %s", operator_name(func), one_line(error)
        )
        loops = None
    single = CPURKernel(whole.with_attr("rtask.num_rtasks", 1), 1)
    if not loops:
        return [single for _ in bounds]
    extents = [int(sch.get(loop).extent) for loop in loops]
    return [_cut(sch, loops, extents, bound) or single for bound in bounds]


def _cut(
    sch: s_tir.Schedule, loops: list, extents: list[int], max_rtasks: int
) -> CPURKernel | None:
    """The gathered schedule ``sch`` (left as it is) with its leading spatial ``loops``
    fused as far as ``max_rtasks`` needs and split into rTask chunks; ``None`` for one."""
    if max_rtasks <= 1:
        return None
    count, total = 0, 1
    for extent in extents:
        count, total = count + 1, total * extent
        if total >= max_rtasks:
            break
    inner = -(-total // max_rtasks)
    num_rtasks = -(-total // inner)
    if num_rtasks <= 1:
        return None
    sch = sch.copy()  # its loop handles stay valid in the copy
    fused = sch.fuse(*loops[:count]) if count > 1 else loops[0]
    outer, _ = sch.split(fused, [num_rtasks, inner])
    sch.annotate(outer, CHUNK_ANNOTATION, 1)
    result = sch.mod["main"].with_attr("rtask.num_rtasks", num_rtasks)
    return CPURKernel(result, num_rtasks)
