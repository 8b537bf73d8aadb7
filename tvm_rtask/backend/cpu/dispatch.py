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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import StringImm
from tvm.tirx import IntImm

from ...core.script import Run, Signal, Wait
from ...tir.common import TensorDecl, substitute_vars, tensor_buffer
from .kernel import CHUNK_ANNOTATION

STATUS_WORDS = 8
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


@dataclass
class CPUProgramCode:
    """What the dispatcher needs, free of Relax: tensors, kernels and per-vEU scripts."""

    params: list[TensorDecl]
    workspaces: list[TensorDecl]
    calls: dict[str, KernelCall]
    num_veu: int
    scripts: list[list[Run | Wait | Signal]] = field(default_factory=list)
    waves: list[list[list[Run]]] = field(default_factory=list)


def _i32(value: int) -> IntImm:
    return IntImm("int32", value)


def _instantiate(call: KernelCall, buffers: dict[str, tirx.Var], run: Run) -> tirx.Stmt:
    """A fresh copy of the rKernel body bound to program buffers, limited to ``run``'s rTasks."""
    func = s_tir.renew_defs(call.func)
    mapping = {param: buffers[name] for param, name in zip(func.params, call.args, strict=True)}
    body = substitute_vars(func.body, mapping)
    found = []

    def narrow(loop):
        if CHUNK_ANNOTATION not in loop.annotations:
            return loop
        found.append(loop)
        dtype = str(loop.extent.ty)
        index = tirx.Var(f"{loop.loop_var.name}_run", dtype)
        rtask_id = tirx.Add(IntImm(dtype, run.start), tirx.Mul(IntImm(dtype, run.step), index))
        body = tvm_ffi.structural_map(
            loop.body, (tirx.Var, lambda v: rtask_id if v.same_as(loop.loop_var) else v)
        )
        return tirx.For(
            index, IntImm(dtype, 0), IntImm(dtype, run.count), tirx.ForKind.SERIAL, body
        )

    body = tvm_ffi.structural_map(body, (tirx.For, narrow))
    if not found and list(run.ids()) != [0]:
        raise ValueError(f"rKernel of {run.op} has no chunk loop but rTasks {run} were requested")
    return body


def _call(name: str, *args) -> tirx.Stmt:
    return tirx.Evaluate(tirx.call_extern("int32", name, *args))


def _seq(stmts: Sequence[tirx.Stmt]) -> tirx.Stmt:
    stmts = list(stmts)
    if not stmts:
        return tirx.Evaluate(_i32(0))
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def _veu_loop(num_veu: int, per_veu: list[tirx.Stmt], name: str) -> tirx.For:
    veu = tirx.Var(name, "int32")
    branches = [
        tirx.IfThenElse(tirx.EQ(veu, _i32(v)), stmt, None)
        for v, stmt in enumerate(per_veu)
        if stmt is not None
    ]
    return tirx.For(veu, _i32(0), _i32(num_veu), tirx.ForKind.PARALLEL, _seq(branches))


def build_cpu_dispatcher(
    code: CPUProgramCode, barrier: str = "fine", timeout_us: int = 60_000_000
) -> tirx.PrimFunc:
    """Stitch the program's rKernels into one PrimFunc with one parallel launch."""
    buffers = {t.name: tensor_buffer(t) for t in (*code.params, *code.workspaces)}
    step = tirx.decl_buffer((max(code.num_veu, 1),), "int32", "rtask_step")
    status = tirx.decl_buffer((STATUS_WORDS,), "int32", "rtask_status")

    def load(buf, i):
        return tirx.BufferLoad(buf, [_i32(i)])

    def runs(script, veu):
        stmts = []
        for item in script:
            if isinstance(item, Run):
                stmts.append(_instantiate(code.calls[item.op], buffers, item))
            elif isinstance(item, Wait):
                for u, count in item.pairs:
                    stmts.append(
                        _call(
                            "tvm_rtask_cpu_wait",
                            tirx.address_of(load(step, u)),
                            _i32(count),
                            tirx.address_of(load(status, 0)),
                            IntImm("int64", timeout_us),
                            _i32(veu),
                            _i32(u),
                        )
                    )
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
        body = _seq([*reset, _veu_loop(code.num_veu, per_veu, "veu"), check])
        shared = [*(buffers[t.name] for t in code.workspaces), step, status]
    elif barrier == "global":
        loops = []
        for w, wave in enumerate(code.waves):
            per_veu = [runs(script, v) for v, script in enumerate(wave)]
            per_veu += [None] * (code.num_veu - len(per_veu))
            loop = _veu_loop(code.num_veu, per_veu, f"veu_w{w}")
            loops.append(
                tirx.AttrStmt(_i32(0), "pragma_parallel_barrier_when_finish", _i32(1), loop)
            )
        body = tirx.AttrStmt(_i32(0), "pragma_parallel_launch_point", _i32(1), _seq(loops))
        # waves joined by TVM's barrier are correct with any pool size: only sized here
        pre = tirx.Evaluate(ensure)
        shared = [buffers[t.name] for t in code.workspaces]
    else:
        raise ValueError(f"barrier must be 'fine' or 'global', not {barrier!r}")

    # Buffers shared by all vEUs are plain AllocBuffer statements before the launch, not
    # root-block allocations: PlanAndUpdateBufferAllocationLocation moves a block allocation
    # to the lowest common ancestor of its uses, which is the parallel vEU loop, and so would
    # silently give every vEU a private copy of the intermediates they exchange.
    # (the pool is checked first, so that a failing call allocates nothing)
    body = _seq([pre, *(tirx.AllocBuffer(buf) for buf in shared), body])
    root = s_tir.SBlock([], [], [], "root", body)
    realize = s_tir.SBlockRealize([], True, root)
    params = [buffers[t.name] for t in code.params]
    func = tirx.PrimFunc(params, realize)
    return func.with_attrs({"s_tir": True, "tirx.noalias": True, "tirx.is_scheduled": True})
