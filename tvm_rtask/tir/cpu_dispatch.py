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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import StringImm
from tvm.tirx import IntImm

from ..core import Barrier, RProgram, RTask
from .cpu_rkernel import CHUNK_ANNOTATION

STATUS_WORDS = 8
TIMEOUT_MESSAGE = (
    "tvm_rtask: a step-array barrier timed out in a persistent CPU kernel (details on stderr). "
    "Either the plan waits for a task that never finishes, or fewer worker threads run than "
    "the plan has vEUs: call tvm_rtask.runtime.set_num_threads(n) with n >= num_veu, or raise "
    "the bound with the option spin_timeout_ms."
)


@dataclass(frozen=True)
class Run:
    """Run rTasks ``start, start + step, ...`` (``count`` of them) of one operator's rKernel.

    A run is emitted as one loop, so a vEU that runs every ``num_veu``-th rTask of an
    operator (the usual wavefront placement) costs one copy of the kernel, not one per rTask.
    """

    op: str
    start: int
    count: int = 1
    step: int = 1

    def ids(self) -> range:
        return range(self.start, self.start + self.count * self.step, self.step)


@dataclass(frozen=True)
class Wait:
    """Wait until ``step[veu] >= count`` for each pair."""

    pairs: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Signal:
    """Publish ``step[own vEU] = count`` (the number of rTasks this vEU has finished)."""

    count: int


@dataclass
class KernelCall:
    """An rKernel and the program tensors bound to its parameters, in parameter order."""

    func: tirx.PrimFunc
    args: list[str]


@dataclass
class TensorDecl:
    """A tensor of the program: a parameter of the persistent function or a workspace."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class CPUProgramCode:
    """What the dispatcher needs, free of Relax: tensors, kernels and per-vEU scripts."""

    params: list[TensorDecl]
    workspaces: list[TensorDecl]
    calls: dict[str, KernelCall]
    num_veu: int
    scripts: list[list[Run | Wait | Signal]] = field(default_factory=list)
    waves: list[list[list[Run]]] = field(default_factory=list)


def _decl(tensor: TensorDecl) -> tirx.Var:
    """A buffer with int64 extents, as Relax's legalized kernels declare theirs.

    Its name must be a C identifier: CUDA source names kernel parameters after buffers, and
    model inputs such as ONNX's ``gpu_0/data_0`` are not.
    """
    shape = [IntImm("int64", int(n)) for n in tensor.shape]
    name = re.sub(r"\W", "_", tensor.name)
    if not name or name[0].isdigit():
        name = f"t_{name}"
    return tirx.decl_buffer(shape, tensor.dtype, name)


def _i32(value: int) -> IntImm:
    return IntImm("int32", value)


def _substitute_vars(node, mapping: dict) -> object:
    """Replace every occurrence of the Vars in ``mapping`` (buffers included)."""
    by_handle = {id_of(k): v for k, v in mapping.items()}

    def visit(var):
        return by_handle.get(id_of(var), var)

    return tvm_ffi.structural_map(node, (tirx.Var, visit))


def id_of(obj) -> int:
    """A stable identity for an FFI object (``==`` on Vars builds an expression)."""
    return obj.__chandle__()


def _instantiate(call: KernelCall, buffers: dict[str, tirx.Var], run: Run) -> tirx.Stmt:
    """A fresh copy of the rKernel body bound to program buffers, limited to ``run``'s rTasks."""
    func = s_tir.renew_defs(call.func)
    mapping = {param: buffers[name] for param, name in zip(func.params, call.args, strict=True)}
    body = _substitute_vars(func.body, mapping)
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
    buffers = {t.name: _decl(t) for t in (*code.params, *code.workspaces)}
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

    if barrier == "fine":
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
        shared = [buffers[t.name] for t in code.workspaces]
    else:
        raise ValueError(f"barrier must be 'fine' or 'global', not {barrier!r}")

    # Buffers shared by all vEUs are plain AllocBuffer statements before the launch, not
    # root-block allocations: PlanAndUpdateBufferAllocationLocation moves a block allocation
    # to the lowest common ancestor of its uses, which is the parallel vEU loop, and so would
    # silently give every vEU a private copy of the intermediates they exchange.
    body = _seq([*(tirx.AllocBuffer(buf) for buf in shared), body])
    root = s_tir.SBlock([], [], [], "root", body)
    realize = s_tir.SBlockRealize([], True, root)
    params = [buffers[t.name] for t in code.params]
    func = tirx.PrimFunc(params, realize)
    return func.with_attrs({"s_tir": True, "tirx.noalias": True, "tirx.is_scheduled": True})


def _runs(tasks: list, cut_after: set[int], first_order: int = 0) -> list[tuple[Run, int]]:
    """Group consecutive rTasks of one operator with evenly spaced ids into runs.

    Returns ``(run, order of its last task)`` pairs; a run ends at every order in
    ``cut_after`` so that a signal can follow that task.
    """
    out: list[tuple[Run, int]] = []
    for offset, task in enumerate(tasks):
        order = first_order + offset
        if out:
            last, last_order = out[-1]
            step = task.rtask_id - last.start if last.count == 1 else last.step
            follows = step > 0 and task.rtask_id == last.start + last.count * step
            if last.op == task.op and follows and last_order not in cut_after:
                out[-1] = (Run(last.op, last.start, last.count + 1, step), order)
                continue
        out.append((Run(task.op, task.rtask_id), order))
    return out


def scripts_from_program(program: RProgram) -> list[list[Run | Wait | Signal]]:
    """Per-vEU scripts for fine barriers: runs, waits before them, signals after waited tasks."""
    waited: list[set[int]] = [set() for _ in range(program.num_veu)]
    for entries in program.entries:
        for item in entries:
            if isinstance(item, Barrier):
                for u, order in item.waits:
                    waited[u].add(order)
    return [_script(entries, waited[veu]) for veu, entries in enumerate(program.entries)]


def _script(entries: list, waited: set[int]) -> list[Run | Wait | Signal]:
    """One vEU's script: its tasks as runs, a Wait per barrier, a Signal after waited tasks."""
    script: list[Run | Wait | Signal] = []
    segments: list[list] = [[]]
    for item in entries:
        if isinstance(item, Barrier):
            segments.append(item)
            segments.append([])
        else:
            segments[-1].append(item)
    order = 0
    for segment in segments:
        if isinstance(segment, Barrier):
            script.append(Wait(tuple((u, j + 1) for u, j in segment.waits)))
            continue
        for run, last in _runs(segment, waited, order):
            script.append(run)
            if last in waited:
                script.append(Signal(last + 1))
        order += len(segment)
    return script


def waves_from_program(program: RProgram) -> list[list[list[Run]]]:
    """Per-wave, per-vEU runs for global barriers (one parallel loop per wave)."""
    wave_ids = sorted(
        {t.wave for entries in program.entries for t in entries if isinstance(t, RTask)}
    )
    position = {w: i for i, w in enumerate(wave_ids)}
    waves: list[list[list]] = [[[] for _ in range(program.num_veu)] for _ in wave_ids]
    for veu, entries in enumerate(program.entries):
        last = -1
        for item in entries:
            if not isinstance(item, RTask):
                continue
            if item.wave < last:
                raise ValueError(
                    f"vEU {veu} runs {item.op} (wave {item.wave}) after a task of wave {last}: "
                    "global barriers need each vEU's tasks in wave order"
                )
            last = item.wave
            waves[position[item.wave]][veu].append(item)
    return [[[run for run, _ in _runs(tasks, set())] for tasks in wave] for wave in waves]
