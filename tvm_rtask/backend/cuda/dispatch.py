"""The CUDA persistent dispatcher: one kernel launch per rProgram, driven by a task table.

Grid = vEUs, block = the largest rTask's threads. vEU ``bx`` walks its row of an int32 table
(a constant input of the kernel) and dispatches on the entry kind:

* ``RUN op start count step``: run rTasks ``start + step * i`` of operator ``op``, then
  ``__syncthreads`` (dependent tasks on one vEU need it; ThreadSync only tracks shared memory);
* ``WAIT offset count``: ``count`` pairs at ``offset`` of a pair list; the block's threads poll
  them in parallel (thread ``t`` takes pairs ``t``, ``t + threads``, ...; bounded, with
  backoff), then ``__syncthreads``. A timeout records the failure in the status words and, by
  default, traps;
* with dependency counters (``sync="counters"``, ``core/counters.py``), a pair is ``(op,
  count)``: wait until operator ``op``'s counter reaches ``(epoch + 1) * count``, and
  ``ARRIVE op count`` adds ``count`` to it after a run (``__syncthreads``, a fence, one atomic
  add by thread 0). Counters only grow, the epoch is read at the start and advanced by the
  last vEU to finish, so nothing is reset and a CUDA graph can replay the kernel;
* with step arrays (``sync="steps"``), a pair is ``(vEU, step)`` and ``SIGNAL count``
  publishes ``step[bx] = count``; the last vEU to finish zeroes the steps.

Each distinct rKernel's body appears once in the kernel, whatever the number of operators
that use it: operators with the same rKernel get contiguous indices. The tensors that live
inside the program are views of per-dtype arenas (``arena.py``): a shared body reads such an
operand's element offset from a constant table indexed by the operator; an operand that is
a program input or output is chosen by a chain of selects over the operators' pointers.
Code size and nvcc time grow with distinct kernels, not operators.
The sync words (counters or steps, a finish counter, the epoch, status) are a constant input
that persists across calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import PointerType, PrimType
from tvm.ir.expr import StringImm

from ...core import RGraph, RProgram
from ...core.counters import Arrive, CounterWait, counter_scripts, task_counts
from ...core.plan import SYNC_MODES
from ...core.script import Run, Signal, Wait, scripts_from_program
from ...tir.common import tensor_buffer
from ..arena import Arena, arena_of
from .body_function import DYNAMIC_SHARED_ATTR, body_function_name, call_name, make_body_function
from .device import device_source
from .rkernel import CUDARKernel, guard_surplus_threads
from .veu_claim import CLAIM_SOURCE, claim_words

NOP, RUN, WAIT, SIGNAL, ARRIVE = 0, 1, 2, 3, 4
# bytes of dynamic shared memory beyond the largest body's buffers: TVM aligns each buffer
# it merges into the dynamic allocation (checked after lowering: body_function.py)
DYNAMIC_SHARED_SLACK = 256
ENTRY_WORDS = 5
STATUS_WORDS = 8

# Device helpers, injected into the generated CUDA source through T.cuda.func_call. Every
# call carries its helper's source text through TVM's passes, so the pointer helpers (a few
# thousand calls in NASNet) have their own short source.
POINTER_SOURCE = device_source("pointer.cuh")
SYNC_SOURCE = device_source("sync.cuh")
# The vEU claim by SM (veu_claim.py) only in kernels that claim: it uses the helpers above.
CLAIM_HELPERS_SOURCE = SYNC_SOURCE + CLAIM_SOURCE


@dataclass
class CUDAProgramCode:
    """What the CUDA dispatcher needs, free of Relax."""

    inputs: list  # TensorDecl of the program's inputs
    outputs: list  # TensorDecl of its outputs, then workspaces kept out of the arenas
    calls: dict[str, tuple[CUDARKernel, list[str]]]  # op -> (rKernel, tensor names)
    num_veu: int
    threads: int
    table: np.ndarray = field(default_factory=lambda: np.zeros((1, 1, ENTRY_WORDS), "int32"))
    pairs: np.ndarray = field(default_factory=lambda: np.zeros((1, 2), "int32"))
    op_index: dict[str, int] = field(default_factory=dict)
    sync: str = "steps"  # "counters" or "steps": what WAIT pairs mean
    # op -> key of its rKernel body; operators with one key share one body (default: own)
    body_of: dict[str, str] = field(default_factory=dict)
    # counters only: the vEU ids are claimed by SM at kernel start (vEU v on SM v % claim_sms,
    # tvm_rtask_claim_veu); 0: vEU = blockIdx.x
    claim_sms: int = 0
    # the other workspaces, packed into arenas (Relax allocates them after ``outputs``)
    arenas: list[Arena] = field(default_factory=list)
    # constant inputs (weights) packed into constant arenas, passed after ``inputs``
    weight_arenas: list[Arena] = field(default_factory=list)
    # distinct rKernel bodies that use shared memory as device functions called by name
    # (body_function.py); the others stay inlined
    body_functions: bool = False

    def all_arenas(self) -> list[Arena]:
        return [*self.weight_arenas, *self.arenas]

    @cached_property
    def placement(self) -> dict[str, tuple[Arena, int]]:
        """Each arena tensor's arena and element offset."""
        return arena_of(self.all_arenas())

    def as_function(self, ops: list[str]) -> bool:
        """Whether the body of ``ops`` is a device function: with ``body_functions``, a body
        that uses shared memory (tiled convolutions, matmuls, reductions: the large bodies
        whose values nvcc kept live across the merged kernel). Small elementwise bodies stay
        inlined: as calls they cost the RNNs more than they saved (docs/cuda-kernels.md)."""
        return self.body_functions and self.calls[ops[0]][0].shared_mem > 0

    @cached_property
    def body_names(self) -> dict[str, str]:
        """First operator of each body that is a device function (:meth:`as_function`) ->
        the function's name (a hash of the body: computed once)."""
        return {
            ops[0]: body_function_name(self.calls[ops[0]][0], self.threads)
            for ops in _op_groups(self)
            if self.as_function(ops)
        }

    @cached_property
    def bodies(self) -> dict[str, tirx.PrimFunc]:
        """The device-function bodies, by name (body_function.py): one per distinct name."""
        funcs = {}
        for op, name in self.body_names.items():
            if name not in funcs:
                funcs[name] = make_body_function(self.calls[op][0], self.threads, name)
        return funcs

    @cached_property
    def offset_table(self) -> tuple[np.ndarray, dict[tuple[str, int], int]]:
        """The constant table of arena offsets for shared bodies, and per (first operator of
        a body, operand) the slot where that operand's offsets start (one per operator of
        the body, in index order). Only operands that are workspaces of one arena in every
        operator of the body get a slot. Computed once: the lowering passes the table as a
        constant, the dispatcher indexes it."""
        where = self.placement
        values: list[int] = []
        slots: dict[tuple[str, int], int] = {}
        for ops in _op_groups(self):
            if len(ops) < 2:
                continue
            names = [self.calls[op][1] for op in ops]
            for k in range(len(names[0])):
                operands = [n[k] for n in names]
                if len(set(operands)) == 1 or not all(t in where for t in operands):
                    continue
                if len({where[t][0].name for t in operands}) != 1:
                    continue
                slots[(ops[0], k)] = len(values)
                values += [where[t][1] for t in operands]
        return np.asarray(values or [0], "int32"), slots


def operator_index(ops: list[str], body_of: dict[str, str]) -> dict[str, int]:
    """Operator indices with the operators of one rKernel body contiguous, so a body is
    selected by one range test."""
    groups: dict[str, list[str]] = {}
    for op in ops:
        groups.setdefault(body_of.get(op, op), []).append(op)
    return {op: i for i, op in enumerate(op for group in groups.values() for op in group)}


def _table(scripts, op_index: dict[str, int], wait_pairs, publish) -> tuple[np.ndarray, np.ndarray]:
    """Task table ``[num_veu, entries, 5]`` (NOP-padded) and pair list of per-vEU scripts:
    ``wait_pairs(item)`` gives a wait's pairs (None for other items), ``publish(item)`` the
    row of a signal or an arrival (None for other items)."""
    rows, pairs = [], []
    for script in scripts:
        row = []
        for item in script:
            if isinstance(item, Run):
                row.append([RUN, op_index[item.op], item.start, item.count, item.step])
            elif (waits := wait_pairs(item)) is not None:
                row.append([WAIT, len(pairs), len(waits), 0, 0])
                pairs.extend(waits)
            elif (published := publish(item)) is not None:
                row.append(published)
        rows.append(row)
    width = max((len(r) for r in rows), default=0) or 1
    table = np.zeros((len(scripts), width, ENTRY_WORDS), "int32")
    for v, row in enumerate(rows):
        if row:
            table[v, : len(row)] = row
    pair_array = np.asarray(pairs, "int32").reshape(-1, 2) if pairs else np.zeros((1, 2), "int32")
    return table, pair_array


def program_table(program: RProgram, op_index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """The step-array task table and its ``(vEU, step)`` pair list."""
    return _table(
        scripts_from_program(program),
        op_index,
        lambda item: [list(p) for p in item.pairs] if isinstance(item, Wait) else None,
        lambda item: [SIGNAL, item.count, 0, 0, 0] if isinstance(item, Signal) else None,
    )


def counter_table(
    program: RProgram, graph: RGraph, op_index: dict[str, int], scripts=None
) -> tuple[np.ndarray, np.ndarray]:
    """The dependency-counter task table and its ``(op, task count)`` pair list."""
    scripts = counter_scripts(program, graph) if scripts is None else scripts
    total = task_counts(program)

    def wait_pairs(item):
        if isinstance(item, CounterWait):
            return [[op_index[op], total[op]] for op in item.ops]
        return None

    def arrival(item):
        if isinstance(item, Arrive):
            return [ARRIVE, op_index[item.op], item.count, 0, 0]
        return None

    return _table(scripts, op_index, wait_pairs, arrival)


def sync_words(num_veu: int, counters: int | None = None, claim_sms: int = 0) -> np.ndarray:
    """Initial sync array: the steps (one per vEU) and a finish counter, or with ``counters``
    one counter per operator, a finish counter, the epoch and the vEU claim words
    (``claim_sms``: SMs of the claim, 0 for none); then the status words."""
    if counters is None:
        return np.zeros(num_veu + 1 + STATUS_WORDS, "int32")
    return np.zeros(counters + 2 + claim_words(claim_sms) + STATUS_WORDS, "int32")


def _i32(v: int):
    return tirx.IntImm("int32", v)


def _invariant(cond):
    return tirx.call_intrin("bool", "tirx.tvm_thread_invariant", cond)


def _sync():
    return tirx.Evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", StringImm("shared")))


def _helper(ty, name: str, *args, source: str = SYNC_SOURCE):
    return tirx.call_intrin(ty, "tirx.cuda.func_call", StringImm(name), *args, StringImm(source))


def _device_call(name: str, *args):
    return tirx.Evaluate(_helper("int32", name, *args))


def _op_groups(code: CUDAProgramCode) -> list[list[str]]:
    """Operators by rKernel body, each group in index order (contiguous indices)."""
    groups: dict[str, list[str]] = {}
    for op in sorted(code.op_index, key=code.op_index.get):
        groups.setdefault(code.body_of.get(op, op), []).append(op)
    for ops in groups.values():
        first = code.op_index[ops[0]]
        if [code.op_index[o] for o in ops] != list(range(first, first + len(ops))):
            raise ValueError("operators sharing an rKernel body need contiguous indices")
    return list(groups.values())


def _selected_pointer(code: CUDAProgramCode, ops: list[str], tensors: list, op_word, ty):
    """The address of the tensor of the operator ``op_word`` among ``ops`` (a chain of
    selects over integers; the last operator's is the default)."""
    address = _helper(
        "uint64", "tvm_rtask_addr", tirx.address_of(tensors[-1]), source=POINTER_SOURCE
    )
    for op, tensor in reversed(list(zip(ops[:-1], tensors[:-1], strict=True))):
        chosen = _helper("uint64", "tvm_rtask_addr", tirx.address_of(tensor), source=POINTER_SOURCE)
        address = tirx.Select(tirx.EQ(op_word, _i32(code.op_index[op])), chosen, address)
    return _helper(ty, "tvm_rtask_ptr", address, source=POINTER_SOURCE)


def dynamic_shared_bytes(code: CUDAProgramCode) -> int:
    """Dynamic shared memory a dispatcher with body functions is launched with: the most any
    of its bodies allocates (measured as TVM compacts it), with room for alignment."""
    used = max((int(f.attrs[DYNAMIC_SHARED_ATTR]) for f in code.bodies.values()), default=0)
    return used + DYNAMIC_SHARED_SLACK if used else 0


def _operands(code: CUDAProgramCode, ops: list[str], buffers: dict, op_word, offsets, arenas):
    """The declarations and, per buffer parameter of the rKernel of ``ops``, the buffer it
    reads for the operator ``op_word``: the tensor itself where all operators share it, an
    arena operand as a view at the operator's offset from the offset table, else a view of
    the operator's own tensor chosen by a chain of selects."""
    kernel, names = code.calls[ops[0]]
    *buffer_params, _, _ = kernel.func.params
    if len(ops) == 1:
        return [], [buffers[n] for n in names]
    decls, operands = [], []
    slots, where = code.offset_table[1], code.placement
    first = _i32(code.op_index[ops[0]])
    for k, param in enumerate(buffer_params):
        tensors = [buffers[code.calls[op][1][k]] for op in ops]
        if all(t.same_as(tensors[0]) for t in tensors):
            operands.append(tensors[0])
            continue
        slot = slots.get((ops[0], k))
        if slot is not None:
            arena = arenas[where[names[k]][0].name]
            offset = tirx.Var(f"{param.name}_offset", "int32")
            index = tirx.Add(_i32(slot), tirx.Sub(op_word, first))
            view = tirx.decl_buffer(
                param.shape, param.dtype, param.name, data=arena.data, elem_offset=offset
            )
            decls += [
                tirx.Bind(offset, tirx.BufferLoad(offsets, [index])),
                tirx.DeclBuffer(view, data=arena.data),
            ]
            operands.append(view)
            continue
        pointer_ty = PointerType(PrimType(str(param.dtype)), "global")
        data = tirx.Var(f"{param.name}_data", pointer_ty)
        view = tirx.decl_buffer(param.shape, param.dtype, param.name, data=data)
        decls += [
            tirx.Bind(data, _selected_pointer(code, ops, tensors, op_word, pointer_ty)),
            tirx.DeclBuffer(view, data=data),
        ]
        operands.append(view)
    return decls, operands


def _inlined_body(
    code: CUDAProgramCode, ops: list[str], buffers: dict, op_word, rtask, tid, offsets, arenas
):
    """One copy of the rKernel of ``ops`` inside the dispatcher, on the operator's tensors."""
    decls, operands = _operands(code, ops, buffers, op_word, offsets, arenas)
    func = s_tir.renew_defs(code.calls[ops[0]][0].func)
    *buffer_params, rtask_param, tid_param = func.params
    mapping = {rtask_param.__chandle__(): rtask, tid_param.__chandle__(): tid}
    mapping.update((p.__chandle__(), b) for p, b in zip(buffer_params, operands, strict=True))
    body = tvm_ffi.structural_map(func.body, (tirx.Var, lambda v: mapping.get(v.__chandle__(), v)))
    return tirx.SeqStmt([*decls, body]) if decls else body


def _body_call(
    code: CUDAProgramCode, ops: list[str], buffers: dict, op_word, rtask, offsets, arenas
):
    """A call of the body function of ``ops`` with the operator's tensors' addresses, then a
    barrier (the next rTask's body reuses the shared memory)."""
    decls, operands = _operands(code, ops, buffers, op_word, offsets, arenas)
    name = call_name(code.body_names[ops[0]])
    args = [tirx.address_of(b) for b in operands]
    call = tirx.Evaluate(tirx.call_extern("int32", name, *args, rtask))
    return tirx.SeqStmt([*decls, call, _sync()])


class _Dispatcher:
    """The pieces of one persistent kernel (see :func:`build_cuda_dispatcher`): its buffers,
    the per-thread variables, and one statement per kind of task-table entry."""

    def __init__(self, code: CUDAProgramCode, timeout_ns: int, trap_on_timeout: bool) -> None:
        if code.sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, got {code.sync!r}")
        self.code = code
        self.counters = counters = code.sync == "counters"
        self.buffers = {
            t.name: tensor_buffer(t, narrow=True) for t in (*code.inputs, *code.outputs)
        }
        self.arena_buffers = {a.name: tensor_buffer(a.decl, narrow=True) for a in code.all_arenas()}
        self.views = self._arena_views()
        self.offsets = tirx.decl_buffer([len(code.offset_table[0])], "int32", "rtask_offsets")
        self.num_veu, self.width = num_veu, width = code.table.shape[0], code.table.shape[1]
        self.table = tirx.decl_buffer([num_veu, width, ENTRY_WORDS], "int32", "rtask_table")
        self.pairs = tirx.decl_buffer([code.pairs.shape[0], 2], "int32", "rtask_pairs")
        self.num_counters = num_counters = len(code.op_index)
        self.claim = claim = code.claim_sms if counters else 0
        words = sync_words(num_veu, num_counters if counters else None, claim).shape[0]
        self.sync = tirx.decl_buffer([words], "int32", "rtask_sync")
        self.status_word = words - STATUS_WORDS
        self.finish_word = num_counters if counters else num_veu
        # int32 throughout, as the ids of an ordinary kernel (64-bit index math costs the
        # rKernels 64-bit multiplies that TVM's kernels do not have)
        self.block = tirx.Var("block", "int32")
        # the vEU this block runs: claimed by SM at the start, or the block index itself
        self.bx = (
            _helper("int32", "tvm_rtask_claimed_veu", source=CLAIM_HELPERS_SOURCE)
            if claim
            else self.block
        )
        self.tx = tirx.Var("tid", "int32")
        self.entry = tirx.Var("entry", "int32")
        self.run_index = tirx.Var("run", "int32")
        self.poll = tirx.Var("poll", "int32")
        self.epoch = tirx.Var("epoch", "int32")
        self.status = self.sync_ptr(_i32(self.status_word))
        self.timeout = tirx.IntImm("int64", timeout_ns)
        self.trap = _i32(int(trap_on_timeout))
        self.first_thread = tirx.EQ(self.tx, _i32(0))
        # the entry's words, loaded once per entry
        self.kind, self.a, self.b, self.c, self.d = (
            tirx.Var(n, "int32") for n in ("kind", "word_a", "word_b", "word_c", "word_d")
        )

    def _arena_views(self) -> list[tirx.Stmt]:
        """Each arena member a buffer of its own over the arena's data, at its offset."""
        views = []
        for a in self.code.all_arenas():
            data = self.arena_buffers[a.name].data
            for t, off in a.members:
                own = tensor_buffer(t, narrow=True)
                view = tirx.decl_buffer(
                    own.shape, own.dtype, own.name, data=data, elem_offset=_i32(off)
                )
                self.buffers[t.name] = view
                views.append(tirx.DeclBuffer(view, data=data))
        return views

    def word(self, k: int):
        return tirx.BufferLoad(self.table, [self.bx, self.entry, _i32(k)])

    def sync_ptr(self, index):
        return tirx.address_of(tirx.BufferLoad(self.sync, [index]))

    def run(self) -> tirx.Stmt:
        """RUN: the rTasks ``c`` of the operator ``a`` names, from ``b`` by ``d``."""
        code, a = self.code, self.a
        op_branches = []
        for ops in _op_groups(code):
            kernel = code.calls[ops[0]][0]
            # the table words themselves, not the entry's bound copies: TVM's buffer
            # compaction sees through a bound variable to its value, so an index written
            # with the variable and a region written with the load would not cancel (local
            # arrays indexed by the rTask id instead of constants)
            rtask = tirx.Add(self.word(2), tirx.Mul(self.word(4), self.run_index))
            if len(ops) == 1:
                selected = tirx.EQ(a, _i32(code.op_index[ops[0]]))
            else:
                lo, hi = code.op_index[ops[0]], code.op_index[ops[-1]]
                selected = tirx.And(tirx.GE(a, _i32(lo)), tirx.LE(a, _i32(hi)))
            args = (code, ops, self.buffers, a, rtask)
            if code.as_function(ops):  # the body function guards its surplus threads itself
                body = _body_call(*args, self.offsets, self.arena_buffers)
            else:
                body = _inlined_body(*args, self.tx, self.offsets, self.arena_buffers)
                if kernel.threads < code.threads:
                    body = guard_surplus_threads(body, self.tx, kernel.threads)
            loop = tirx.For(self.run_index, _i32(0), self.c, tirx.ForKind.SERIAL, body)
            op_branches.append(tirx.IfThenElse(_invariant(selected), loop, None))
        return tirx.SeqStmt([*op_branches, _sync()])

    def wait(self) -> tirx.Stmt:
        """WAIT: thread t polls pairs t, t + threads, ... of this wait."""
        threads, tx, a, b = self.code.threads, self.tx, self.a, self.b
        pair = tirx.Add(a, tirx.Add(tirx.Mul(self.poll, _i32(threads)), tx))
        in_range = tirx.LT(tirx.Add(tirx.Mul(self.poll, _i32(threads)), tx), b)
        waited = tirx.BufferLoad(self.pairs, [pair, _i32(0)])
        count = tirx.BufferLoad(self.pairs, [pair, _i32(1)])
        common = (self.status, self.timeout, self.bx, waited, self.trap)
        if self.counters:
            wait_call = _device_call(
                "tvm_rtask_wait_count", self.sync_ptr(waited), count, self.epoch, *common
            )
        else:
            wait_call = _device_call("tvm_rtask_wait", self.sync_ptr(waited), count, *common)
        rounds = tirx.FloorDiv(tirx.Add(b, _i32(threads - 1)), _i32(threads))
        poll_loop = tirx.For(
            self.poll,
            _i32(0),
            rounds,
            tirx.ForKind.SERIAL,
            tirx.IfThenElse(in_range, wait_call, None),
        )
        return tirx.SeqStmt([poll_loop, _sync()])

    def publish(self) -> tuple[int, tirx.Stmt]:
        """ARRIVE (counters) or SIGNAL (step array): the entry kind and its statement."""
        if self.counters:
            # an ARRIVE always follows its RUN, which ended with __syncthreads: the block's
            # writes are ordered before thread 0's fence and add, no second barrier needed
            call = _device_call("tvm_rtask_arrive", self.sync_ptr(self.a), self.b)
            return ARRIVE, tirx.IfThenElse(self.first_thread, call, None)
        call = _device_call("tvm_rtask_signal", self.sync_ptr(self.bx), self.a)
        return SIGNAL, tirx.SeqStmt([_sync(), tirx.IfThenElse(self.first_thread, call, None)])

    def entries(self) -> tirx.Stmt:
        """The loop over this vEU's task-table entries."""
        publish_kind, publish = self.publish()
        load_entry = [
            tirx.Bind(v, self.word(k))
            for k, v in enumerate((self.kind, self.a, self.b, self.c, self.d))
        ]

        def when(kind: int, stmt: tirx.Stmt) -> tirx.Stmt:
            return tirx.IfThenElse(_invariant(tirx.EQ(self.kind, _i32(kind))), stmt, None)

        dispatch = tirx.SeqStmt(
            [*load_entry, when(RUN, self.run()), when(WAIT, self.wait()),
             when(publish_kind, publish)]
        )  # fmt: skip
        return tirx.For(self.entry, _i32(0), _i32(self.width), tirx.ForKind.SERIAL, dispatch)

    def finish(self) -> tirx.Stmt:
        """Thread 0 marks this vEU finished (counters: and ends the epoch with the last)."""
        if self.counters:
            call = _device_call(
                "tvm_rtask_finish_epoch",
                self.sync_ptr(_i32(self.finish_word)),
                self.sync_ptr(_i32(self.finish_word + 1)),
                _i32(self.num_veu),
                self.epoch,
            )
        else:
            call = _device_call("tvm_rtask_finish", self.sync_ptr(_i32(0)), _i32(self.num_veu))
        return tirx.IfThenElse(self.first_thread, call, None)

    def dynamic_shared(self) -> tuple[list, list[tirx.Stmt]]:
        """The launch's dynamic shared memory, if any body uses it: ``(buffers, statements)``.

        The largest body's shared memory is allocated here so that the launch provides it
        (the bodies' own extern __shared__ arrays start at the same address); its first and
        last bytes are written once, before any body runs, so that TVM neither drops it nor
        compacts it to the bytes touched."""
        dynamic = dynamic_shared_bytes(self.code)
        if not dynamic:
            return [], []
        shared = tirx.decl_buffer([dynamic], "uint8", "rtask_dynamic_shared", scope="shared.dyn")
        zero = tirx.IntImm("uint8", 0)
        ends = [tirx.BufferStore(shared, zero, [_i32(i)]) for i in sorted({0, dynamic - 1})]
        touch = tirx.IfThenElse(tirx.EQ(self.tx, _i32(0)), tirx.SeqStmt(ends), None)
        return [shared], [touch, _sync()]

    def claim_veu(self) -> tirx.Stmt:
        """The claim of a vEU by SM. The claim (side effects, once) and the read of its
        result are separate calls, so that no pass can duplicate the claim by substituting
        a bound value."""
        return tirx.Evaluate(
            _helper(
                "int32",
                "tvm_rtask_claim_veu",
                self.sync_ptr(_i32(self.finish_word + 2)),
                _i32(self.num_veu),
                _i32(self.claim),
                self.epoch,
                self.status,
                self.timeout,
                self.trap,
                source=CLAIM_HELPERS_SOURCE,
            )
        )

    def thread_body(self) -> tuple[list, list[tirx.Stmt]]:
        """What every thread runs, and the shared buffers the block allocates."""
        views = self.views
        shared_allocs, touch = self.dynamic_shared()
        body = [*touch, *views, self.entries(), _sync(), self.finish()]
        # the epoch's read and the claim go at the index the arena views take, counted from
        # the start of the body
        if self.counters:
            read_epoch = _helper(
                "int32", "tvm_rtask_epoch", self.sync_ptr(_i32(self.finish_word + 1))
            )
            body.insert(len(views), tirx.Bind(self.epoch, read_epoch))
        if self.claim:
            body.insert(len(views) + 1, self.claim_veu())
        return shared_allocs, body

    def params(self) -> list:
        """call_tir order: inputs, then constant inputs (weight arenas and the four tables,
        the sync words last), then outputs and the workspace arenas."""
        code, buffers, arenas = self.code, self.buffers, self.arena_buffers
        return [
            *(buffers[t.name] for t in code.inputs),
            *(arenas[a.name] for a in code.weight_arenas),
            self.offsets,
            self.table,
            self.pairs,
            self.sync,
            *(buffers[t.name] for t in code.outputs),
            *(arenas[a.name] for a in code.arenas),
        ]


def build_cuda_dispatcher(
    code: CUDAProgramCode,
    timeout_ns: int,
    trap_on_timeout: bool = False,
) -> tirx.PrimFunc:
    """The persistent kernel of one rProgram (see the module docstring).

    ``trap_on_timeout``: a timed-out wait aborts the kernel (``__trap``), so
    the next synchronisation raises, instead of leaving the status for a host check.
    """
    kernel = _Dispatcher(code, timeout_ns, trap_on_timeout)
    shared_allocs, thread_body = kernel.thread_body()
    tx, block = kernel.tx, kernel.block
    threads = tirx.For(
        tx,
        _i32(0),
        _i32(code.threads),
        tirx.ForKind.THREAD_BINDING,
        tirx.SeqStmt(thread_body),
        thread_binding=tirx.IterVar(None, tx, 1, "threadIdx.x"),
    )
    grid = tirx.For(
        block,
        _i32(0),
        _i32(kernel.num_veu),
        tirx.ForKind.THREAD_BINDING,
        threads,
        thread_binding=tirx.IterVar(None, block, 1, "blockIdx.x"),
    )
    root = s_tir.SBlock([], [], [], "root", grid, alloc_buffers=shared_allocs)
    func = tirx.PrimFunc(kernel.params(), s_tir.SBlockRealize([], True, root))
    return func.with_attrs({"s_tir": True, "tirx.noalias": False, "tirx.is_scheduled": True})
