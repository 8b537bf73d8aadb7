"""The CPU persistent dispatcher: one parallel launch per rProgram.

Each vEU is one iteration of a ``T.parallel`` loop (one worker thread of TVM's pool) running
its own list of rTask runs. Dependencies between vEUs use either

* ``fine`` barriers: a step array of one int32 counter per vEU, written with release order by
  ``tvm_rtask_cpu_signal`` and awaited with acquire order by ``tvm_rtask_cpu_wait`` (native
  library, bounded spin), or
* ``global`` barriers: one parallel loop per wave inside one parallel launch point, joined by
  TVM's own ``TVMBackendParallelBarrier``.

A timed-out wait records the failure in a status array; after the launch the function asserts
that the status is clean, so the Relax VM raises instead of hanging.

Before its launch the function calls ``tvm_rtask_cpu_ensure_workers(num_veu)`` (native
library): TVM's thread pool belongs to the calling thread, and a pool with fewer workers than
vEUs would run waiting vEUs one after another on one thread. The call sizes the caller's pool
(any thread, with or without Python); with fine barriers the function raises at once, naming
the fix, when that pool was created earlier with too few workers and cannot grow. The step and
status arrays are allocated per call (stack or TVM workspace of the calling thread), so
concurrent calls from several threads share nothing but the constant parameters.

With fine barriers the workspaces live in one arena per dtype, at offsets that let tensors
the barriers order share bytes (``core/memory.py``); under either barrier an input of a
concatenation may be a view of its block of the output (``concat_views.py``), and the weights
the program reads are views of one constant parameter per dtype (``backend/arena.py``). A
view is declared on its home's data pointer, so that TVM's storage passes see every use of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.ir.expr import StringImm
from tvm.tirx import IntImm

from ...core.memory import Arena
from ...core.script import Run, Signal, Wait
from ...records import TUNED_ATTR
from ...tir.common import TensorDecl, substitute_vars, tensor_buffer
from ..arena import Arena as WeightArena
from .kernel import CHUNK_ANNOTATION
from .rules import RULE_ATTR

STATUS_WORDS = 8
BODY_ATTR = "tvm_rtask.cpu_body"  # marks a body function (build_cpu_dispatcher, subroutines)
# a body of a scheduled kernel, kept out of line by LLVM (body_function_device), as is any
# body called more often than this
OUTLINED_ATTR = "tvm_rtask.cpu_body_outlined"
MAX_INLINED_CALLS = 4
# a body built in a module of its own (parallel_build.py): a public C function its callers
# call by name, so it keeps its global symbol
PUBLIC_BODY_ATTR = "tvm_rtask.cpu_body_public"
# the schedule rule of a body's rKernel (parallel_build.specialise reads it)
BODY_RULE_ATTR = "tvm_rtask.cpu_body_rule"
CPU_PIPELINE = "tvm_rtask.cpu"
TIMEOUT_MESSAGE = (
    "tvm_rtask: a step-array barrier timed out in a persistent CPU kernel (details on stderr). "
    "Either the plan waits for a task that never finishes, or fewer worker threads run than "
    "the plan has vEUs: call tvm_rtask.runtime.set_num_threads(n) with n >= num_veu, or raise "
    "the bound with the option spin_timeout_ms."
)


def pool_message(num_veu: int) -> str:
    """The one-line error of a call whose thread's TVM pool cannot run ``num_veu`` workers."""
    return (
        f"tvm_rtask: this thread's TVM CPU thread pool was created with fewer than {num_veu} "
        f"worker threads (one per vEU of this persistent CPU kernel) and cannot grow: call "
        f"tvm_rtask.runtime.set_num_threads({num_veu}) in this thread before any other parallel "
        f"TVM work, or set TVM_NUM_THREADS>={num_veu} before the process starts."
    )


@dataclass
class KernelCall:
    """An rKernel and the program tensors bound to its parameters, in parameter order."""

    func: tirx.PrimFunc
    args: list[str]
    # the name of ``func`` in the module: with subroutines, its body function is named after
    # it, and every call of the same PrimFunc shares that one body function
    name: str | None = None


@dataclass
class CPUProgramCode:
    """What the dispatcher needs, free of Relax: tensors, kernels and per-vEU scripts."""

    params: list[TensorDecl]
    workspaces: list[TensorDecl]
    calls: dict[str, KernelCall]
    num_veu: int
    scripts: list[list[Run | Wait | Signal]] = field(default_factory=list)
    waves: list[list[list[Run]]] = field(default_factory=list)
    # workspaces packed into shared arenas (core.memory.plan_arenas; fine barriers): each a
    # view at its offset, one allocation per arena instead of one per workspace
    arenas: list[Arena] = field(default_factory=list)
    # constant inputs (weights) packed into arenas (backend.arena.plan_arenas) that are
    # parameters (``params`` holds each arena's decl, not its members): each member a view
    weight_arenas: list[WeightArena] = field(default_factory=list)
    # tensors written in place inside another (name -> (home, element offset)), and the
    # operators (concatenations) that this leaves nothing to do (concat_views.py)
    views: dict[str, tuple[str, int]] = field(default_factory=dict)
    elided: set[str] = field(default_factory=set)
    # filled by build_cpu_dispatcher(subroutines=True): the body functions it calls, by name
    callees: dict[str, tirx.PrimFunc] = field(default_factory=dict)
    # option trace: the rProgram's index in the plan's steps and each operator's index in
    # the plan's graph, written into the timeline's records (runtime/trace.py); None: untraced
    trace_program: int | None = None
    op_ids: dict[str, int] = field(default_factory=dict)


# kinds of the timeline's records (src/trace.c)
TRACE_RTASK, TRACE_WAIT, TRACE_PROGRAM = 0, 1, 2


def _i32(value: int) -> IntImm:
    return IntImm("int32", value)


def _narrow(body: tirx.Stmt, start, step, count, op: str, single: bool) -> tirx.Stmt:
    """``body`` limited to rTasks ``start + step * i`` for ``i < count`` (its chunk loop
    replaced by a loop over ``i``); ``single``: the run is rTask 0 alone, which a kernel
    without a chunk loop may be asked for."""
    found = []

    def narrow(loop):
        if CHUNK_ANNOTATION not in loop.annotations:
            return loop
        found.append(loop)
        dtype = str(loop.extent.ty)
        index = tirx.Var(f"{loop.loop_var.name}_run", dtype)

        def cast(value):
            return IntImm(dtype, value) if isinstance(value, int) else tirx.Cast(dtype, value)

        rtask_id = tirx.Add(cast(start), tirx.Mul(cast(step), index))
        new_body = tvm_ffi.structural_map(
            loop.body, (tirx.Var, lambda v: rtask_id if v.same_as(loop.loop_var) else v)
        )
        return tirx.For(index, IntImm(dtype, 0), cast(count), tirx.ForKind.SERIAL, new_body)

    body = tvm_ffi.structural_map(body, (tirx.For, narrow))
    if not found and not single:
        raise ValueError(f"rKernel of {op} has no chunk loop but other rTasks were requested")
    return body


def _instantiate(call: KernelCall, buffers: dict[str, tirx.Var], run: Run) -> tirx.Stmt:
    """A fresh copy of the rKernel body bound to program buffers, limited to ``run``'s rTasks."""
    func = s_tir.renew_defs(call.func)
    mapping = {param: buffers[name] for param, name in zip(func.params, call.args, strict=True)}
    body = substitute_vars(func.body, mapping)
    single = list(run.ids()) == [0]
    try:
        return _narrow(body, run.start, run.step, run.count, run.op, single)
    except ValueError:
        raise ValueError(
            f"rKernel of {run.op} has no chunk loop but rTasks {run} were requested"
        ) from None


def _has_chunk_loop(func: tirx.PrimFunc) -> bool:
    found = []
    tvm_ffi.structural_map(
        func.body,
        (
            tirx.For,
            lambda loop: found.append(1) or loop if CHUNK_ANNOTATION in loop.annotations else loop,
        ),
    )
    return bool(found)


def body_function(call: KernelCall) -> tirx.PrimFunc:
    """The rKernel as a private function of its tensors' data pointers and ``(start, step,
    count)``: it runs rTasks ``start + step * i``, ``i < count`` (a kernel without a chunk
    loop ignores them: it is only ever run as rTask 0)."""
    func = s_tir.renew_defs(call.func)
    handles, decls, mapping = [], [], {}
    for param in func.params:
        buffer = param.ty
        data = tirx.Var(f"{param.name}_data", param.data.ty)
        new = tirx.decl_buffer(buffer.shape, buffer.dtype, param.name, data=data)
        handles.append(data)
        decls.append(tirx.DeclBuffer(new, data=data))
        mapping[param] = new
    start, step, count = (
        tirx.Var(n, "int32") for n in ("rtask_start", "rtask_step", "rtask_count")
    )
    body = _narrow(substitute_vars(func.body, mapping), start, step, count, call.name, True)
    # the s_tir lowering passes take a function whose body is a root block, as the
    # dispatcher's own; they place the body's allocations at the top of that block
    root = s_tir.SBlock([], [], [], "root", _seq([*decls, body]))
    realize = s_tir.SBlockRealize([], True, root)
    # int32, 0 on success: the lowered body returns -1 where a workspace allocation fails
    new_func = tirx.PrimFunc(
        [*handles, start, step, count], realize, ret_type=tvm.ir.PrimType("int32")
    )
    attrs = {"s_tir": True, "tirx.noalias": True, "tirx.is_scheduled": True, BODY_ATTR: True}
    source = call.func.attrs or {}
    if RULE_ATTR in source or TUNED_ATTR in source:
        attrs[OUTLINED_ATTR] = True  # see body_function_device
    if RULE_ATTR in source:
        attrs[BODY_RULE_ATTR] = str(source[RULE_ATTR])
    return new_func.with_attrs(attrs)


@tirx.transform.prim_func_pass(opt_level=0, name="PrivateBodyFunctions")
def private_body_functions(func, _mod, _ctx):
    """Body functions lose the ``global_symbol`` that Relax's ``AttachGlobalSymbol`` gives
    every PrimFunc: they stay internal functions called with raw pointers, where
    ``MakePackedAPI`` would make them packed entry points their callers cannot call."""
    if func.attrs is None or BODY_ATTR not in func.attrs or "global_symbol" not in func.attrs:
        return func
    if PUBLIC_BODY_ATTR in func.attrs:
        return func
    return func.without_attr("global_symbol")


@tvm.transform.module_pass(opt_level=0, name="BodyFunctionDevice")
def body_function_device(mod, _ctx):
    """What ``MakePackedAPI`` writes around a packed function's lowered body, and a private
    body function lacks: the workspaces it allocates (``TVMBackendAllocWorkspace``, in
    ``LowerTVMBuiltin``) are on CPU device 0, and (for a kernel a rule or a tuning record
    scheduled, :data:`OUTLINED_ATTR`) the body is a compute scope, which TVM's llvm codegen
    outlines into a ``noinline`` function (``<name>_compute_``). Applied after lowering, so
    that the allocations the lowering hoisted to the top of the function are inside.

    Without the scope LLVM inlines bodies into the dispatcher's parallel lambda (those called
    once, and more with constant rTask ranges) and optimises the grown lambda again: ViT-B/16's
    lambdas were 114 K of its 150 K lines of LLVM IR (docs/compile-time.md). An
    unscheduled loop nest (an elementwise kernel, a layout change) called from at most
    :data:`MAX_INLINED_CALLS` runs stays inlinable: specialised on its run's constant rTask
    range it runs faster (DenseNet-121's batch norms, one operator each: the model 3.5%
    faster), while one that many runs call (ViT-B/16's twelve layers) would be copied into
    each (its compile took twice as long)."""
    calls = call_arguments(mod)
    updates = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None or BODY_ATTR not in func.attrs:
            continue
        body = func.body
        if is_outlined(func, len(calls.get(gvar.name_hint, ()))):
            scope = StringImm(f"{gvar.name_hint}_compute_")
            body = tirx.AttrStmt(_i32(0), "compute_scope", scope, body)
        body = _seq([body, tirx.Return(_i32(0))])
        body = tirx.AttrStmt(StringImm("default"), "device_id", _i32(0), body)
        body = tirx.AttrStmt(StringImm("default"), "device_type", _i32(1), body)
        updates[gvar] = func.with_body(body)
    if not updates:
        return mod
    funcs = {gvar: updates.get(gvar, func) for gvar, func in mod.functions.items()}
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


def call_arguments(mod: tvm.IRModule) -> dict[str, list[list]]:
    """The arguments of every call the module's PrimFuncs make, by the callee's name."""
    calls: dict[str, list[list]] = {}

    def visit(call):
        if isinstance(call.op, ir.GlobalVar):
            calls.setdefault(call.op.name_hint, []).append(list(call.args))

    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(func.body, (ir.Call, visit))
    return calls


def is_outlined(func: tirx.PrimFunc, calls: int) -> bool:
    """Whether a body function that ``calls`` runs call is kept out of line
    (:func:`body_function_device`): a rule or a tuning record scheduled it, or more than
    :data:`MAX_INLINED_CALLS` runs call it."""
    return OUTLINED_ATTR in func.attrs or calls > MAX_INLINED_CALLS


# TVM passes the llvm build leaves out. On the rules' unrolled register tiles they redo what
# LLVM's optimisation does again (CommonSubexprElim: GVN, HoistIfThenElse: loop unswitching,
# RemoveNoOp: dead code): 12-16% of the build, run time and outputs unchanged
# (docs/compile-time.md, "Cheaper code for LLVM")
SKIPPED_PASSES = ("tirx.RemoveNoOp", "s_tir.HoistIfThenElse")
SKIPPED_CONFIG = {"tirx.disable_cse_tir": True}


def _lower_for_llvm(lower: tvm.transform.Pass) -> tvm.transform.Pass:
    """TVM's ``s_tir`` lowering ``lower`` without :data:`SKIPPED_PASSES` and CSE.

    It runs in a PassContext of its own that keeps the caller's options but not its
    instruments (a timing instrument forgets what it recorded when a context holding it
    exits): they see this pass as one."""

    @tvm.transform.module_pass(opt_level=0, name="LowerForLLVM")
    def lower_for_llvm(mod, ctx):
        inner = tvm.transform.PassContext(
            opt_level=ctx.opt_level,
            required_pass=list(ctx.required_pass),
            disabled_pass=[*ctx.disabled_pass, *SKIPPED_PASSES],
            config={**{str(k): v for k, v in ctx.config.items()}, **SKIPPED_CONFIG},
        )
        with inner:
            return lower(mod)

    return lower_for_llvm


def cpu_pipeline() -> str:
    """The TIR pipeline to build modules with body functions: :func:`private_body_functions`,
    then TVM's default ``s_tir`` lowering less what LLVM redoes (:func:`_lower_for_llvm`),
    and :func:`body_function_device` before its host finalization (registered once, by
    name)."""
    from tvm.tirx.compilation_pipeline import PIPELINE_MAP, register_tir_pipeline

    if CPU_PIPELINE not in PIPELINE_MAP:

        def make():
            lower, finalize_host, finalize_device = tirx.get_tir_pipeline("s_tir")

            def host():
                return tvm.transform.Sequential([body_function_device, finalize_host()])

            passes = [private_body_functions, _lower_for_llvm(lower)]
            return tvm.transform.Sequential(passes), host, finalize_device

        register_tir_pipeline(CPU_PIPELINE, make)
    return CPU_PIPELINE


def body_name(call: KernelCall) -> str:
    return f"{call.name}_body"


def _subroutine_call(
    call: KernelCall, gvar: ir.GlobalVar, buffers: dict[str, tirx.Var], run: Run
) -> tirx.Stmt:
    args = [_pointer(buffers[name]) for name in call.args]
    args += [_i32(run.start), _i32(run.step), _i32(run.count)]
    status = ir.Call(gvar, args, ret_ty="int32")
    # a failed call (its workspace could not be allocated; TVM's error is set) fails the vEU
    return tirx.AssertStmt(
        tirx.EQ(status, _i32(0)),
        StringImm("RuntimeError"),
        [StringImm(f"tvm_rtask: {gvar.name_hint} failed")],
    )


def _call(name: str, *args) -> tirx.Stmt:
    return tirx.Evaluate(tirx.call_extern("int32", name, *args))


def _seq(stmts: Sequence[tirx.Stmt]) -> tirx.Stmt:
    stmts = list(stmts)
    if not stmts:
        return tirx.Evaluate(_i32(0))
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def _view(tensor: tirx.Var, base: tirx.Var, elem_offset) -> tuple[tirx.Stmt, tirx.Var]:
    """``tensor`` redeclared on ``base``'s data pointer at ``elem_offset``: its declaration
    and the view. Keeping the base's own pointer makes every use of the view a use of the
    base: a pointer bound once before the launch would let ``StorageRewrite`` think the base
    dead after the binding and give its bytes to the step array."""
    view = tirx.decl_buffer(
        tensor.shape, tensor.dtype, tensor.name, data=base.data, elem_offset=elem_offset
    )
    return tirx.DeclBuffer(view, data=base.data), view


def _arena_views(
    arenas: Sequence[Arena | WeightArena], buffers: dict[str, tirx.Var]
) -> tuple[list[tirx.Stmt], list[tirx.Var]]:
    """One buffer per arena (a parameter's, where ``buffers`` has the arena's name) and each
    member as a view of it at its offset (:func:`_view`; a body gets :func:`_pointer`): the
    views' declarations and the arena buffers; ``buffers`` maps each member's name to its
    view after."""
    decls, arena_buffers = [], []
    for arena in arenas:
        buf = buffers.get(arena.name)
        if buf is None:
            buf = tensor_buffer(TensorDecl(arena.name, (max(arena.size, 1),), arena.dtype))
        arena_buffers.append(buf)
        for name, offset in arena.offsets.items():
            decl, buffers[name] = _view(buffers[name], buf, IntImm("int64", offset))
            decls.append(decl)
    return decls, arena_buffers


def _home_views(homes: dict[str, tuple[str, int]], buffers: dict[str, tirx.Var]) -> list[tirx.Stmt]:
    """Each tensor of ``homes`` as a view of its home buffer at an element offset (after the
    home's own offset, where it is an arena view); ``buffers`` maps it to the view after."""
    decls = []
    for name, (home, offset) in homes.items():
        base = buffers[home]
        start = int(base.elem_offset.value) + offset  # arena views and buffers: constants
        decl, buffers[name] = _view(buffers[name], base, start)
        decls.append(decl)
    return decls


def _pointer(buffer: tirx.Var) -> tirx.PrimExpr:
    """The address of a buffer's first element: its data pointer, or for an arena view an
    access pointer at its offset with its extent (``T.address_of`` would let the s_tir
    lowering compact the arena to the elements it sees indexed)."""
    offset = buffer.elem_offset
    if isinstance(offset, IntImm) and offset.value == 0:
        return buffer.data
    return buffer.access_ptr("rw")


def _veu_loop(num_veu: int, per_veu: list[tirx.Stmt], name: str) -> tirx.For:
    veu = tirx.Var(name, "int32")
    branches = [
        tirx.IfThenElse(tirx.EQ(veu, _i32(v)), stmt, None)
        for v, stmt in enumerate(per_veu)
        if stmt is not None
    ]
    return tirx.For(veu, _i32(0), _i32(num_veu), tirx.ForKind.PARALLEL, _seq(branches))


def nan_fill_stmt(buffer: tirx.Var) -> tirx.Stmt | None:
    """Every element of a float ``buffer`` set to NaN (option ``nan_fill``: a workspace that
    a kernel reads before any kernel wrote it then shows as NaN); None for other dtypes."""
    dtype = str(buffer.dtype)
    if not dtype.startswith(("float", "bfloat")):
        return None
    kinds = [str(extent.ty) for extent in buffer.shape]
    loops = [tirx.Var(f"fill{i}", kind) for i, kind in enumerate(kinds)]
    stmt: tirx.Stmt = tirx.BufferStore(buffer, tirx.const(float("nan"), dtype), loops)
    for var, kind, extent in reversed(list(zip(loops, kinds, buffer.shape, strict=True))):
        stmt = tirx.For(var, IntImm(kind, 0), extent, tirx.ForKind.SERIAL, stmt)
    return stmt


def build_cpu_dispatcher(
    code: CPUProgramCode,
    barrier: str = "fine",
    timeout_us: int = 60_000_000,
    subroutines: bool = False,
    nan_fill: bool = False,
) -> tirx.PrimFunc:
    """Stitch the program's rKernels into one PrimFunc with one parallel launch.

    ``subroutines=False``: each run of an rKernel is an inlined copy of its body (one per
    vEU that runs it). ``True``: each distinct rKernel PrimFunc becomes one private body
    function (:func:`body_function`, named by :func:`body_name`, collected in
    ``code.callees``) and every run is a call of it with its rTask range; the caller adds the
    callees to the module. LLVM's time grows faster than linearly with a function, and
    the copies grow with the vEU count, so this is what the llvm backend builds.
    ``nan_fill``: the workspaces shared by the vEUs filled with NaN before the launch."""
    weights = [t for arena in code.weight_arenas for t, _ in arena.members]
    buffers = {t.name: tensor_buffer(t) for t in (*code.params, *weights, *code.workspaces)}
    views, _ = _arena_views(code.weight_arenas, buffers)
    workspace_views, arena_buffers = _arena_views(code.arenas, buffers)
    views += workspace_views
    views += _home_views(code.views, buffers)
    placed = {name for arena in code.arenas for name in arena.offsets} | set(code.views)
    gvars: dict[str, ir.GlobalVar] = {}

    def instantiate(call: KernelCall, run: Run) -> tirx.Stmt:
        if not subroutines:
            return _instantiate(call, buffers, run)
        if call.name is None:
            raise ValueError(f"subroutines need the name of {run.op}'s rKernel PrimFunc")
        if list(run.ids()) != [0] and not _has_chunk_loop(call.func):
            raise ValueError(
                f"rKernel of {run.op} has no chunk loop but rTasks {run} were requested"
            )
        name = body_name(call)
        if name not in gvars:
            gvars[name] = ir.GlobalVar(name)
            code.callees[name] = body_function(call)
        return _subroutine_call(call, gvars[name], buffers, run)

    step = tirx.decl_buffer((max(code.num_veu, 1),), "int32", "rtask_step")
    status = tirx.decl_buffer((STATUS_WORDS,), "int32", "rtask_status")

    def load(buf, i):
        return tirx.BufferLoad(buf, [_i32(i)])

    traced = code.trace_program is not None

    def timed(stmt: tirx.Stmt, kind: int, veu: int, a: int, b: int) -> tirx.Stmt:
        """``stmt`` between the timeline's begin and end calls (option ``trace``)."""
        if not traced:
            return stmt
        args = [_i32(kind), _i32(code.trace_program), _i32(veu), _i32(a), _i32(b)]
        return _seq([_call("tvm_rtask_trace_begin"), stmt, _call("tvm_rtask_trace_end", *args)])

    def run_stmts(item: Run, veu: int) -> list[tirx.Stmt]:
        if not traced:
            return [instantiate(code.calls[item.op], item)]
        # traced: one call per rTask, so that each has its own start and end
        op_id = code.op_ids[item.op]
        return [
            timed(instantiate(code.calls[item.op], Run(item.op, r)), TRACE_RTASK, veu, op_id, r)
            for r in item.ids()
        ]

    # workspaces outside the arenas: allocated on their own before the launch
    loose = [buffers[t.name] for t in code.workspaces if t.name not in placed]
    shared_workspaces = [*arena_buffers, *loose]

    def publish() -> list[tirx.Stmt]:
        """Calls that make the shared workspaces escape between two runs that no wait or
        signal separates (``tvm_rtask_cpu_publish``, src/step_array.c): else LLVM, with the
        body functions inlined, may read a consumer's input before the producer wrote it
        (found by the differential fuzzer with one vEU; docs/findings.md)."""
        return [_call("tvm_rtask_cpu_publish", buf.data) for buf in shared_workspaces]

    def runs(script, veu, after_run: bool = False):
        stmts = []
        for item in script:
            if isinstance(item, Run):
                if item.op in code.elided:
                    continue
                if after_run:
                    stmts += publish()
                stmts += run_stmts(item, veu)
                after_run = True
                continue
            after_run = False
            if isinstance(item, Wait):
                for u, count in item.pairs:
                    wait = _call(
                        "tvm_rtask_cpu_wait",
                        tirx.address_of(load(step, u)),
                        _i32(count),
                        tirx.address_of(load(status, 0)),
                        IntImm("int64", timeout_us),
                        _i32(veu),
                        _i32(u),
                    )
                    stmts.append(timed(wait, TRACE_WAIT, veu, u, count))
            elif isinstance(item, Signal):
                stmts.append(
                    _call(
                        "tvm_rtask_cpu_signal", tirx.address_of(load(step, veu)), _i32(item.count)
                    )
                )
        return _seq(stmts) if stmts else None

    ensure = tirx.call_extern("int32", "tvm_rtask_cpu_ensure_workers", _i32(code.num_veu))
    if barrier == "fine":
        # a pool that cannot run every vEU on its own thread fails the call at once
        pool_check = tirx.AssertStmt(
            tirx.EQ(ensure, _i32(0)),
            StringImm("RuntimeError"),
            [StringImm(pool_message(code.num_veu))],
        )
        reset = [tirx.BufferStore(step, _i32(0), [_i32(v)]) for v in range(code.num_veu)]
        reset += [tirx.BufferStore(status, _i32(0), [_i32(i)]) for i in range(STATUS_WORDS)]
        per_veu = [runs(script, v) for v, script in enumerate(code.scripts)]
        per_veu += [None] * (code.num_veu - len(per_veu))
        # The Python wrapper of AssertStmt names its arguments (kind, condition, ...) but
        # forwards them in order to a constructor that takes (condition, kind, ...).
        check = tirx.AssertStmt(
            tirx.EQ(load(status, 0), _i32(0)),
            StringImm("RuntimeError"),
            [StringImm(TIMEOUT_MESSAGE)],
        )
        pre = pool_check
        body = _seq([*views, *reset, _veu_loop(code.num_veu, per_veu, "veu"), check])
        shared = [*shared_workspaces, step, status]
    elif barrier == "global":
        loops = []
        for w, wave in enumerate(code.waves):
            per_veu = [runs(script, v) for v, script in enumerate(wave)]
            per_veu += [None] * (code.num_veu - len(per_veu))
            loop = _veu_loop(code.num_veu, per_veu, f"veu_w{w}")
            loops.append(
                tirx.AttrStmt(_i32(0), "pragma_parallel_barrier_when_finish", _i32(1), loop)
            )
        if code.num_veu == 1:
            # one vEU: its waves one after the other on the calling thread. TVM's code
            # generator drops the extent-1 parallel loop and then fails on a launch point
            # with no parallel loop inside ('Cannot find parallel loop within parallel
            # launch'; found by the differential fuzzer)
            waves = [runs(wave[0], 0, after_run=w > 0) for w, wave in enumerate(code.waves) if wave]
            body = _seq([s for s in waves if s is not None])
        else:
            body = tirx.AttrStmt(_i32(0), "pragma_parallel_launch_point", _i32(1), _seq(loops))
        body = _seq([*views, body])
        # waves joined by TVM's barrier are correct with any pool size: only sized here
        pre = tirx.Evaluate(ensure)
        shared = loose
    else:
        raise ValueError(f"barrier must be 'fine' or 'global', not {barrier!r}")

    # Buffers shared by all vEUs are plain AllocBuffer statements before the launch, not
    # root-block allocations: PlanAndUpdateBufferAllocationLocation moves a block allocation
    # to the lowest common ancestor of its uses, which is the parallel vEU loop, and so would
    # silently give every vEU a private copy of the intermediates they exchange.
    # (the pool is checked first, so that a failing call allocates nothing)
    fills = [nan_fill_stmt(buf) for buf in shared] if nan_fill else []
    body = timed(body, TRACE_PROGRAM, -1, 0, 0)  # the launch and join included
    body = _seq([pre, *(tirx.AllocBuffer(buf) for buf in shared), *filter(None, fills), body])
    root = s_tir.SBlock([], [], [], "root", body)
    realize = s_tir.SBlockRealize([], True, root)
    params = [buffers[t.name] for t in code.params]
    func = tirx.PrimFunc(params, realize)
    return func.with_attrs({"s_tir": True, "tirx.noalias": True, "tirx.is_scheduled": True})
