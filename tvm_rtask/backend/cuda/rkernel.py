"""CUDA rKernels: a GPU-scheduled PrimFunc whose thread blocks become rTasks.

The rewrite (Rammer section 4.1.4) takes a kernel scheduled by dlight (or MetaSchedule) and

* removes every ``blockIdx`` loop, binding ``bx = rtask_id % gx``, ``by = rtask_id // gx % gy``,
  ``bz = rtask_id // (gx * gy)``, so ``num_rtasks = gx * gy * gz``;
* removes extent-1 ``vthread`` loops (left in a dispatcher they are merged with its own thread
  loops by UnifyThreadBinding, a silent miscompile, docs/cuda-kernels.md) and keeps longer ones
  (MetaSchedule's tiles), which TVM's InjectVirtualThread lowers with the rProgram;
* maps the kernel's ``threadIdx.{x,y,z}`` shape onto the vEU's 1-D thread index ``tid``
  (``x = tid % nx``, ``y = tid // nx % ny``, ``z = tid // (nx * ny)``); when the vEU has more
  threads than the task, every leaf block gets the predicate ``tid < nx * ny * nz``, so
  surplus threads skip the work but still reach every ``__syncthreads`` between blocks.

The result is a PrimFunc with two extra scalar parameters, ``rtask_id`` and ``tid``, that
the dispatcher substitutes when it inlines the task.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import Call
from tvm.target import Target

from ...errors import UnsupportedOperator
from ...fallbacks import INT32_REFUSED, note_fallback
from ...tir.analysis import allocated_buffers, buffer_bytes, buffer_elements
from ...tir.common import gather_covering, root_children
from ...tir.rules import one_line, operator_name
from ...tir.schedule import schedule_of

BLOCK_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
ALLREDUCE = "tirx.tvm_thread_allreduce"
THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass
class CUDARKernel:
    """An rKernel for CUDA and what the dispatcher and the occupancy model need."""

    func: tirx.PrimFunc  # params: buffers..., rtask_id, tid
    num_rtasks: int
    threads: int
    shared_mem: int  # bytes of static shared memory of one rTask
    cross_thread_reduction: bool  # needs exactly `threads` threads: no surplus allowed
    global_alloc: bool = False  # allocates global memory: cannot live inside a kernel
    one_dimensional: bool = True  # uses threadIdx.x only (its index is the vEU's tid itself)


def schedule_for_cuda(
    func: tirx.PrimFunc,
    target: Target,
    fallback_only: bool = False,
    rules: bool | None = None,
    name: str | None = None,
) -> tirx.PrimFunc:
    """dlight's default GPU schedules (Matmul, GEMV, Reduction, GeneralReduction, Fallback),
    after tvm-rtask's own CUDA rules (``backend/cuda/rules``: convolutions), which win where
    they match; ``rules`` (option ``cuda_rules``) False skips them, None is their default.

    ``name`` (the operator's) names it when a rule fails and is logged.

    ``fallback_only`` uses dlight's Fallback rule alone: every thread reduces serially, so the
    kernel has no cross-thread reduction and can run in a vEU with more threads than it uses.
    """
    import tvm
    from tvm.s_tir import dlight as dl

    from .rules import rules_enabled, schedule_cuda_func

    if func.attrs is not None and func.attrs.get("tirx.is_scheduled", False):
        return func
    if not fallback_only and (rules_enabled() if rules is None else rules):
        with target:
            scheduled = schedule_cuda_func(func, target, name=name)
        if scheduled is not None:
            return scheduled
    mod = tvm.IRModule({"main": func})
    rules = [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction()]
    # dlight's GEMV analysis asserts on some shapes (seen on RandWire, reduced): on failure
    # try without GEMV, then Fallback alone, which schedules any PrimFunc
    attempts = [[]] if fallback_only else [rules, rules[:1] + rules[2:], []]
    for k, chosen in enumerate(attempts):
        try:
            with target:
                return dl.ApplyDefaultSchedule(*chosen, dl.gpu.Fallback())(mod)["main"]
        except (AssertionError, RuntimeError, ValueError, IndexError):
            if k == len(attempts) - 1:
                raise


def schedule_serial_reduction(func: tirx.PrimFunc, threads: int) -> tirx.PrimFunc | None:
    """One output element per thread, reductions serial: a schedule any vEU can host.

    For kernels whose dlight schedule reduces across a 2-D thread block (which a 1-D vEU
    cannot host). Injective blocks are inlined, the rest is gathered under the anchor's
    outer spatial loops (as for CPU rKernels), those loops are fused and split over
    ``blockIdx.x`` x ``threadIdx.x``, and intermediates become thread-local. None when the
    kernel does not have that shape.
    """
    from tvm.s_tir.dlight.analysis import get_sblock_info
    from tvm.s_tir.dlight.base.common_schedules import try_inline

    sch = schedule_of(func)
    try:
        try_inline(sch, [get_sblock_info(sch, b) for b in root_children(sch)])
        gathered = gather_covering(sch)
        if gathered is None:
            return None
        sch, loops = gathered
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        bx, tx = sch.split(fused, [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        outputs = {p.__chandle__() for p in func.params}
        for block in sch.get_child_blocks(tx):
            writes = sch.get(block).writes
            if writes and writes[0].source.__chandle__() not in outputs:
                sch.set_scope(block, 0, "local")
    except (s_tir.ScheduleError, ValueError, AttributeError, IndexError):
        return None
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _int(expr) -> int:
    if not isinstance(expr, tirx.IntImm):
        raise UnsupportedOperator(f"a thread-bound loop has a symbolic extent {expr}")
    return int(expr.value)


def _tag(loop) -> str | None:
    binding = loop.thread_binding
    return None if binding is None else str(binding.thread_tag)


def _extents(func: tirx.PrimFunc) -> tuple[dict[str, int], dict[str, int]]:
    grid: dict[str, int] = {}
    block: dict[str, int] = {}
    loops = []  # collected first: an error raised inside the walk reaches Python untyped
    tvm_ffi.structural_walk(
        func.body, lambda n: loops.append(n) if isinstance(n, tirx.For) and _tag(n) else None
    )
    for loop in loops:
        tag, extent = _tag(loop), _int(loop.extent)
        table = grid if tag in BLOCK_TAGS else block if tag in THREAD_TAGS else None
        if table is None:  # a virtual thread: TVM's InjectVirtualThread lowers it
            continue
        if table.setdefault(tag, extent) != extent:
            raise UnsupportedOperator(f"{tag} bound with extents {table[tag]} and {extent}")
    return grid, block


def _launch_count(func: tirx.PrimFunc) -> int:
    """Kernels in ``func``: blockIdx-bound loop nests not inside another one.

    dlight's fallback may schedule one PrimFunc as several kernels that pass intermediates
    through global memory; run as one rTask body they would race (no grid-wide barrier
    between them), so such a PrimFunc cannot be an rKernel.
    """
    loops = []
    tvm_ffi.structural_walk(
        func.body,
        lambda n: loops.append(n) if isinstance(n, tirx.For) and _tag(n) in BLOCK_TAGS else None,
    )
    inner: set[int] = set()
    for loop in loops:

        def mark(n, outer=loop):
            if isinstance(n, tirx.For) and _tag(n) in BLOCK_TAGS and not n.same_as(outer):
                inner.add(n.__chandle__())

        tvm_ffi.structural_walk(loop.body, mark)
    return sum(1 for loop in loops if loop.__chandle__() not in inner)


def _vars_in(expr) -> list:
    found: list = []
    tvm_ffi.structural_walk(expr, lambda v: found.append(v) if isinstance(v, tirx.Var) else None)
    return found


def _has_cross_thread_reduction(func: tirx.PrimFunc) -> bool:
    """A block reducing over a thread-bound loop (lowered to a warp/block allreduce)."""
    thread_vars: set[int] = set()
    found = [False]

    def visit(node):
        if isinstance(node, tirx.For) and _tag(node) in THREAD_TAGS:
            thread_vars.add(node.loop_var.__chandle__())
        elif isinstance(node, s_tir.SBlockRealize):
            for iv, value in zip(node.block.iter_vars, node.iter_values, strict=True):
                if int(iv.iter_type) != 2:  # CommReduce
                    continue
                used = _vars_in(value)
                if any(v.__chandle__() in thread_vars for v in used):
                    found[0] = True

    tvm_ffi.structural_walk(func.body, visit, order="pre")
    return found[0]


def shared_buffers(func: tirx.PrimFunc) -> dict[str, tuple[int, int]]:
    """Each shared buffer of one thread block as TVM allocates it: name -> (elements, bytes).

    dlight allocates shared buffers with the whole tensor's shape at the root;
    CompactBufferAllocation shrinks them to the region one block touches, and the passes up
    to FlattenBuffer pad them as the schedule's storage alignment asks (a quarter of the
    convolutions' shared memory grows by an eighth), so measure after those: TVM's s_tir
    lowering up to and including FlattenBuffer.
    """
    import tvm

    passes = [
        s_tir.transform.CanonicalizeLoop(),
        s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.LiftThreadBinding(),
        s_tir.transform.ManifestSharedMemoryLocalStage(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerAutoCopy(),
        s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.StmtSimplify(),
        s_tir.transform.InjectPermutedLayout(),
        s_tir.transform.AnnotateIrregularLoop(),
        s_tir.transform.InjectSoftwarePipeline(),
        s_tir.transform.TransformMmaBufferLayout(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
    ]
    lowered = tvm.transform.Sequential(passes)(tvm.IRModule({"main": func}))["main"]
    found: dict[str, tuple[int, int]] = {}
    for buf in allocated_buffers(lowered.body):
        if str(buf.scope()).startswith("shared"):
            numel = buffer_elements(buf)
            if numel is None:
                raise UnsupportedOperator(f"shared buffer {buf.name} has a symbolic shape")
            found[buf.name] = (numel, buffer_bytes(buf))
    return found


def shared_bytes(func: tirx.PrimFunc) -> int:
    """Static shared memory of one thread block, as TVM allocates it."""
    return sum(size for _, size in shared_buffers(func).values())


def _allocates_global_memory(func: tirx.PrimFunc) -> bool:
    """A block allocating a global buffer (dlight's Fallback keeps multi-stage intermediates
    there): a stand-alone kernel is split around it, a persistent kernel cannot hold it."""
    found = [False]

    def visit(node):
        if isinstance(node, s_tir.SBlock):
            for buf in node.alloc_buffers:
                if str(buf.scope()) == "global":
                    found[0] = True

    tvm_ffi.structural_walk(func.body, visit)
    return found[0]


def _substitute(node, var, value):
    return tvm_ffi.structural_map(node, (tirx.Var, lambda v: value if v.same_as(var) else v))


def _lower_cross_thread_reductions(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Lower cross-thread reductions while the kernel still has its own thread loops.

    Inside a dispatcher the pass refuses them (the reduction loops are no longer the
    deepest statements); lowered first, they become ``tvm_thread_allreduce`` over the
    kernel's own thread variables, which the rewrite then maps to the vEU's threads.
    """
    import tvm

    mod = s_tir.transform.LowerCrossThreadReduction()(tvm.IRModule({"main": func}))
    return mod["main"]


def _narrow_to_int32(func: tirx.PrimFunc, name: str | None = None) -> tirx.PrimFunc:
    """The kernel's index math in int32, as TVM's own build has it after NarrowDataType.

    Narrowed here, while every extent (the grid's included) is still a constant: inside the
    dispatcher the block index comes from a table, its range is unknown, and NarrowDataType
    keeps everything 64-bit (63 64-bit multiplies and 25 ``mul.hi.u64`` in one conv).
    A kernel TVM will not narrow keeps its 64-bit indices, noted as a fallback: the pass
    stops in an ``InternalError`` on a constant beyond int32 (an extent >= 2**31) and on an
    int64 buffer (argmax's output); a result the dispatcher's ``renew_defs`` would refuse
    (an IterVar whose variable and domain types differ) is kept out the same way.
    """
    import tvm

    try:
        narrowed = tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]
    except tvm.error.InternalError as error:
        return _keep_64_bits(func, name, "ForceNarrowIndexToInt32 refused it", error)
    # The pass leaves some block iteration variables int64 over an int32 domain, which
    # later passes refuse (IterVar dtype check): retype them.
    stale: dict[int, tirx.Var] = {}

    def find(node):
        if isinstance(node, s_tir.SBlock):
            for iv in node.iter_vars:
                if str(iv.var.ty) != str(iv.dom.extent.ty):
                    stale[iv.var.__chandle__()] = tirx.Var(iv.var.name, str(iv.dom.extent.ty))

    tvm_ffi.structural_walk(narrowed.body, find)
    if stale:
        narrowed = tvm_ffi.structural_map(
            narrowed, (tirx.Var, lambda v: stale.get(v.__chandle__(), v))
        )
    try:
        s_tir.renew_defs(narrowed)  # what the dispatcher will do: it must accept the result
    except tvm.error.InternalError as error:
        return _keep_64_bits(func, name, "the narrowed kernel fails renew_defs", error)
    return narrowed


def _keep_64_bits(
    func: tirx.PrimFunc, name: str | None, why: str, error: Exception
) -> tirx.PrimFunc:
    """``func`` as it is, with the refused narrowing noted (operator, TVM's reason)."""
    reason = f"{why}, 64-bit index math kept: {one_line(error)}"
    note_fallback(INT32_REFUSED, operator_name(func, name), reason)
    return func


def make_cuda_rkernel(
    func: tirx.PrimFunc, max_rtasks: int | None = None, name: str | None = None
) -> CUDARKernel:
    """Rewrite a GPU-scheduled PrimFunc into an rKernel (see the module docstring).

    With ``max_rtasks``, a kernel with more thread blocks than that is coarsened: one rTask
    runs ``g`` consecutive blocks in a loop, so that planning and task tables stay
    proportional to the vEU count rather than to the grid size. ``name``: the operator's
    function, for the fallback notes (else named from the PrimFunc's blocks).
    """
    launches = _launch_count(func)
    if launches > 1:
        raise UnsupportedOperator(
            f"scheduled as {launches} kernels (intermediates in global memory)"
        )
    cross_thread = _has_cross_thread_reduction(func)
    if cross_thread:
        func = _lower_cross_thread_reductions(func)
    func = _narrow_to_int32(func, name)
    grid, block = _extents(func)
    gx, gy, gz = (grid.get(t, 1) for t in BLOCK_TAGS)
    nx, ny, nz = (block.get(t, 1) for t in THREAD_TAGS)
    # int32 ids, every block index bounded by its grid extent (floormod even where the
    # rTask id alone would do): the simplifier and NarrowDataType then keep the kernel's own
    # index math in 32 bits, as in TVM's kernel, where blockIdx/threadIdx are int32. The
    # block indices are substituted as expressions, not bound to variables: buffer
    # compaction sees through a bound variable, and a local array's accesses (written with
    # the variable) and its region (with the value) then no longer cancel, so the array is
    # indexed by the rTask id at run time; inline, every index is a constant, as in TVM's.
    rtask_id = tirx.Var("rtask_id", "int32")
    tid = tirx.Var("tid", "int32")

    def i32(v: int):
        return tirx.IntImm("int32", v)

    values = {
        "blockIdx.x": tirx.FloorMod(rtask_id, i32(gx)),
        "blockIdx.y": tirx.FloorMod(tirx.FloorDiv(rtask_id, i32(gx)), i32(gy)),
        "blockIdx.z": tirx.FloorMod(tirx.FloorDiv(rtask_id, i32(gx * gy)), i32(gz)),
        "threadIdx.x": tirx.FloorMod(tid, i32(nx)) if (ny, nz) != (1, 1) else tid,
        "threadIdx.y": tirx.FloorMod(tirx.FloorDiv(tid, i32(nx)), i32(ny)),
        "threadIdx.z": tirx.FloorMod(tirx.FloorDiv(tid, i32(nx * ny)), i32(nz)),
    }

    def strip(loop):
        tag = _tag(loop)
        if tag is None:
            return loop
        if tag in values:
            value = values[tag]
            if str(loop.loop_var.ty) != "int32":
                value = tirx.Cast(str(loop.loop_var.ty), value)
            body = _substitute(loop.body, loop.loop_var, value)
            return _keep_annotations(loop, body)
        if tag.startswith("vthread"):
            if _int(loop.extent) != 1:  # MetaSchedule's tiles: lowered with the rProgram
                return loop
            body = _substitute(loop.body, loop.loop_var, tirx.IntImm(str(loop.loop_var.ty), 0))
            return _keep_annotations(loop, body)
        raise UnsupportedOperator(f"unexpected thread binding {tag}")

    body = tvm_ffi.structural_map(func.body, (tirx.For, strip))
    blocks = gx * gy * gz
    num_rtasks = blocks
    if max_rtasks is not None and blocks > max_rtasks:
        group = -(-blocks // max_rtasks)
        num_rtasks = -(-blocks // group)
        body = _coarsen(body, rtask_id, group, blocks)
    rewritten = tirx.PrimFunc([*func.params, rtask_id, tid], body, attrs=func.attrs)
    return CUDARKernel(
        func=rewritten,
        num_rtasks=num_rtasks,
        threads=nx * ny * nz,
        shared_mem=shared_bytes(func),
        cross_thread_reduction=cross_thread,
        global_alloc=_allocates_global_memory(func),
        one_dimensional=(ny, nz) == (1, 1),
    )


def _keep_annotations(loop, body):
    """``body`` of a removed thread loop, still under the loop's annotations.

    dlight puts ``pragma_auto_unroll_max_step`` / ``pragma_unroll_explicit`` on its
    ``threadIdx`` loop; they make TVM unroll the inner loops (256 FMAs per trip of a conv's
    reduction loop instead of 16). An extent-1 serial loop carries them to the same passes.
    """
    if not loop.annotations:
        return body
    unit = tirx.Var(f"{loop.loop_var.name}_kept", str(loop.loop_var.ty))
    zero = tirx.IntImm(str(loop.loop_var.ty), 0)
    one = tirx.IntImm(str(loop.loop_var.ty), 1)
    return tirx.For(unit, zero, one, tirx.ForKind.SERIAL, body, annotations=dict(loop.annotations))


def _coarsen(body, rtask_id, group: int, blocks: int):
    """``for j in range(group): if block < blocks: body[rtask_id := rtask_id * group + j]``.

    The condition is the same for every thread of the block, which ThreadSync must be told
    (tvm_thread_invariant) to accept the syncs inside.
    """
    dtype = str(rtask_id.ty)
    j = tirx.Var("rtask_block", dtype)
    block = tirx.Add(tirx.Mul(rtask_id, tirx.IntImm(dtype, group)), j)
    inner = _substitute(body, rtask_id, block)
    cond = tirx.call_intrin(
        "bool", "tirx.tvm_thread_invariant", tirx.LT(block, tirx.IntImm(dtype, blocks))
    )
    guarded = tirx.IfThenElse(cond, inner, None)
    return tirx.For(
        j, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, group), tirx.ForKind.SERIAL, guarded
    )


def _is_allreduce(node) -> bool:
    return isinstance(node, Call) and getattr(node.op, "name", "") == ALLREDUCE


def _contains_allreduce(stmt) -> bool:
    found = [False]

    def visit(node):
        if _is_allreduce(node):
            found[0] = True

    tvm_ffi.structural_walk(stmt, visit)
    return found[0]


def guard_surplus_threads(body, tid, threads: int):
    """Keep threads ``tid >= threads`` out of the task's work but in its synchronisation.

    Every non-root block gets the predicate ``tid < threads`` (a surplus thread skips it and
    still reaches the ``__syncthreads`` placed between blocks). A block holding a cross-thread
    allreduce is the exception: every thread of the vEU must enter the allreduce, so there the
    bound joins the allreduce's own condition instead, and surplus threads contribute the
    reduction's identity.
    """
    bound = tirx.LT(tid, tirx.IntImm(str(tid.ty), threads))

    def with_bound(predicate):
        if isinstance(predicate, tirx.IntImm) and int(predicate.value) == 1:
            return bound
        return tirx.And(bound, predicate)

    def guard_allreduce(call):
        if not _is_allreduce(call):
            return call
        size = int(call.args[0].value)
        args = list(call.args)
        args[1 + size] = with_bound(args[1 + size])
        return type(call)(call.op, args, ret_ty=call.ty)

    def guard(realize):
        if not realize.iter_values and realize.block.name_hint == "root":
            return realize
        if _contains_allreduce(realize.block.body):
            return realize
        return s_tir.SBlockRealize(
            realize.iter_values, with_bound(realize.predicate), realize.block
        )

    body = tvm_ffi.structural_map(body, (Call, guard_allreduce))
    return tvm_ffi.structural_map(body, (s_tir.SBlockRealize, guard))
