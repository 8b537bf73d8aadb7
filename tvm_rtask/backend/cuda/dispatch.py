"""The CUDA persistent dispatcher: one kernel launch per rProgram, driven by a task table.

Grid = vEUs, block = the largest rTask's threads. Each operator's rKernel body appears once in
the kernel, whatever the number of vEUs and rTasks: vEU ``bx`` walks its row of an int32
table (a constant input of the kernel) and dispatches on the entry kind:

* ``RUN op start count step``: run rTasks ``start + step * i`` of operator ``op``, then
  ``__syncthreads`` (dependent tasks on one vEU need it; ThreadSync only tracks shared memory);
* ``WAIT offset count``: the barrier's ``count`` (vEU, step) pairs sit at ``offset`` in a
  pair list; the block's threads poll them in parallel (thread ``t`` takes pairs ``t``,
  ``t + threads``, ...; bounded, with backoff), then ``__syncthreads``. A timeout records the
  failure in the status words and lets every vEU drain instead of hanging;
* ``SIGNAL count``: ``__syncthreads``, then thread 0 publishes ``step[bx] = count`` after a
  ``__threadfence`` (release).

At the end the last vEU to finish zeroes the step counters, so the same kernel can be replayed,
also under a CUDA graph. The sync words (steps, a finish counter, status) live in a constant
input that persists across calls and starts at zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import StringImm

from ...core import RProgram
from ...core.script import Run, Signal, Wait, scripts_from_program
from ...tir.common import tensor_buffer
from .rkernel import CUDARKernel, guard_surplus_threads

NOP, RUN, WAIT, SIGNAL = 0, 1, 2, 3
ENTRY_WORDS = 5
STATUS_WORDS = 8

# Device helpers, injected into the generated CUDA source through T.cuda.func_call.
SYNC_SOURCE = r"""
#ifndef TVM_RTASK_SYNC_DEFINED
#define TVM_RTASK_SYNC_DEFINED
__device__ __forceinline__ unsigned long long tvm_rtask_now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Any thread: wait until step[0] >= target (acquire). Returns 0, or 1 on failure.
__device__ __noinline__ int tvm_rtask_wait(int* step, int target, int* status,
                                           long long timeout_ns, int waiter, int waited,
                                           int trap) {
  volatile int* vstep = step;
  volatile int* vstatus = status;
  unsigned long long start = tvm_rtask_now_ns();
  unsigned int backoff = 32;
  while (true) {
    int seen = *vstep;
    if (seen >= target) { __threadfence(); return 0; }
    if (vstatus[0] != 0) return 1;
    if ((long long)(tvm_rtask_now_ns() - start) > timeout_ns) {
      if (atomicCAS(status, 0, 1) == 0) {
        status[1] = waiter; status[2] = waited; status[3] = target; status[4] = seen;
        __threadfence();
        if (trap) {
          printf("tvm_rtask: barrier timeout: vEU %d waited for vEU %d to reach step %d "
                 "(it reached %d); aborting the kernel\n", waiter, waited, target, seen);
        }
      }
      if (trap) __trap();
      return 1;
    }
    __nanosleep(backoff);
    if (backoff < 1024) backoff <<= 1;
  }
}
// Thread 0 of a vEU: publish step = value (release).
__device__ __forceinline__ int tvm_rtask_signal(int* step, int value) {
  __threadfence();
  atomicExch(step, value);
  return 0;
}
// Thread 0 of a vEU at the end: the last of num_veu zeroes the steps for the next replay.
__device__ __noinline__ int tvm_rtask_finish(int* steps, int num_veu) {
  __threadfence();
  if (atomicAdd(&steps[num_veu], 1) == num_veu - 1) {
    for (int v = 0; v <= num_veu; ++v) steps[v] = 0;
    __threadfence();
  }
  return 0;
}
#endif
"""


@dataclass
class CUDAProgramCode:
    """What the CUDA dispatcher needs, free of Relax."""

    inputs: list  # TensorDecl of the program's inputs
    outputs: list  # TensorDecl of its outputs, workspaces last (Relax allocates them all)
    calls: dict[str, tuple[CUDARKernel, list[str]]]  # op -> (rKernel, tensor names)
    num_veu: int
    threads: int
    table: np.ndarray = field(default_factory=lambda: np.zeros((1, 1, ENTRY_WORDS), "int32"))
    pairs: np.ndarray = field(default_factory=lambda: np.zeros((1, 2), "int32"))
    op_index: dict[str, int] = field(default_factory=dict)


def program_table(program: RProgram, op_index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """The task table ``[num_veu, entries, 5]`` (NOP-padded) and the barrier pair list."""
    rows, pairs = [], []
    for script in scripts_from_program(program):
        row = []
        for item in script:
            if isinstance(item, Run):
                row.append([RUN, op_index[item.op], item.start, item.count, item.step])
            elif isinstance(item, Wait):
                row.append([WAIT, len(pairs), len(item.pairs), 0, 0])
                pairs.extend([u, count] for u, count in item.pairs)
            elif isinstance(item, Signal):
                row.append([SIGNAL, item.count, 0, 0, 0])
        rows.append(row)
    width = max((len(r) for r in rows), default=0) or 1
    table = np.zeros((program.num_veu, width, ENTRY_WORDS), "int32")
    for v, row in enumerate(rows):
        if row:
            table[v, : len(row)] = row
    pair_array = np.asarray(pairs, "int32").reshape(-1, 2) if pairs else np.zeros((1, 2), "int32")
    return table, pair_array


def sync_words(num_veu: int) -> np.ndarray:
    """Initial sync array: step counters, the finish counter, then the status words."""
    return np.zeros(num_veu + 1 + STATUS_WORDS, "int32")


def _i32(v: int):
    return tirx.IntImm("int32", v)


def _invariant(cond):
    return tirx.call_intrin("bool", "tirx.tvm_thread_invariant", cond)


def _sync():
    return tirx.Evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", StringImm("shared")))


def _device_call(name: str, *args):
    call = tirx.call_intrin(
        "int32", "tirx.cuda.func_call", StringImm(name), *args, StringImm(SYNC_SOURCE)
    )
    return tirx.Evaluate(call)


def _substitute_params(kernel: CUDARKernel, buffers: dict, names: list[str], rtask, tid):
    func = s_tir.renew_defs(kernel.func)
    *buffer_params, rtask_param, tid_param = func.params
    mapping = {p.__chandle__(): buffers[n] for p, n in zip(buffer_params, names, strict=True)}
    mapping[rtask_param.__chandle__()] = rtask
    mapping[tid_param.__chandle__()] = tid
    return tvm_ffi.structural_map(func.body, (tirx.Var, lambda v: mapping.get(v.__chandle__(), v)))


def build_cuda_dispatcher(
    code: CUDAProgramCode,
    timeout_ns: int,
    trap_on_timeout: bool = False,
) -> tirx.PrimFunc:
    """The persistent kernel of one rProgram (see the module docstring).

    ``trap_on_timeout``: a timed-out wait aborts the kernel (``__trap``), so
    the next synchronisation raises, instead of leaving the status for a host check.
    """
    buffers = {t.name: tensor_buffer(t, narrow=True) for t in (*code.inputs, *code.outputs)}
    num_veu, width = code.table.shape[0], code.table.shape[1]
    table = tirx.decl_buffer([num_veu, width, ENTRY_WORDS], "int32", "rtask_table")
    pairs = tirx.decl_buffer([code.pairs.shape[0], 2], "int32", "rtask_pairs")
    sync = tirx.decl_buffer([num_veu + 1 + STATUS_WORDS], "int32", "rtask_sync")
    # int32 throughout, as the ids of an ordinary kernel (64-bit index math costs the
    # rKernels 64-bit multiplies that TVM's kernels do not have)
    bx = tirx.Var("veu", "int32")
    tx = tirx.Var("tid", "int32")
    entry = tirx.Var("entry", "int32")
    run_index = tirx.Var("run", "int32")
    poll = tirx.Var("poll", "int32")

    def word(k: int):
        return tirx.BufferLoad(table, [bx, entry, _i32(k)])

    def sync_ptr(index):
        return tirx.address_of(tirx.BufferLoad(sync, [index]))

    kind, a, b, c, d = (word(k) for k in range(ENTRY_WORDS))

    op_branches = []
    for op, index in code.op_index.items():
        kernel, names = code.calls[op]
        rtask = tirx.Add(b, tirx.Mul(d, run_index))
        body = _substitute_params(kernel, buffers, names, rtask, tx)
        if kernel.threads < code.threads:
            body = guard_surplus_threads(body, tx, kernel.threads)
        loop = tirx.For(run_index, _i32(0), c, tirx.ForKind.SERIAL, body)
        op_branches.append(tirx.IfThenElse(_invariant(tirx.EQ(a, _i32(index))), loop, None))
    run = tirx.SeqStmt([*op_branches, _sync()])

    # WAIT: thread t polls pairs t, t + threads, ... of this barrier.
    pair = tirx.Add(a, tirx.Add(tirx.Mul(poll, _i32(code.threads)), tx))
    in_range = tirx.LT(tirx.Add(tirx.Mul(poll, _i32(code.threads)), tx), b)
    waited_veu = tirx.BufferLoad(pairs, [pair, _i32(0)])
    wait_call = _device_call(
        "tvm_rtask_wait",
        sync_ptr(waited_veu),
        tirx.BufferLoad(pairs, [pair, _i32(1)]),
        sync_ptr(_i32(num_veu + 1)),
        tirx.IntImm("int64", timeout_ns),
        bx,
        waited_veu,
        _i32(int(trap_on_timeout)),
    )
    rounds = tirx.FloorDiv(tirx.Add(b, _i32(code.threads - 1)), _i32(code.threads))
    wait = tirx.SeqStmt(
        [
            tirx.For(
                poll,
                _i32(0),
                rounds,
                tirx.ForKind.SERIAL,
                tirx.IfThenElse(in_range, wait_call, None),
            ),
            _sync(),
        ]
    )

    first_thread = tirx.EQ(tx, _i32(0))
    signal = tirx.SeqStmt(
        [
            _sync(),
            tirx.IfThenElse(
                first_thread,
                _device_call("tvm_rtask_signal", sync_ptr(bx), a),
                None,
            ),
        ]
    )
    dispatch = tirx.SeqStmt(
        [
            tirx.IfThenElse(_invariant(tirx.EQ(kind, _i32(RUN))), run, None),
            tirx.IfThenElse(_invariant(tirx.EQ(kind, _i32(WAIT))), wait, None),
            tirx.IfThenElse(_invariant(tirx.EQ(kind, _i32(SIGNAL))), signal, None),
        ]
    )
    entries = tirx.For(entry, _i32(0), _i32(width), tirx.ForKind.SERIAL, dispatch)
    finish = tirx.IfThenElse(
        first_thread, _device_call("tvm_rtask_finish", sync_ptr(_i32(0)), _i32(num_veu)), None
    )
    threads = tirx.For(
        tx,
        _i32(0),
        _i32(code.threads),
        tirx.ForKind.THREAD_BINDING,
        tirx.SeqStmt([entries, _sync(), finish]),
        thread_binding=tirx.IterVar(None, tx, 1, "threadIdx.x"),
    )
    grid = tirx.For(
        bx,
        _i32(0),
        _i32(num_veu),
        tirx.ForKind.THREAD_BINDING,
        threads,
        thread_binding=tirx.IterVar(None, bx, 1, "blockIdx.x"),
    )
    root = s_tir.SBlock([], [], [], "root", grid)
    # call_tir order: inputs (the three tables are constant inputs), then outputs.
    params = [
        *(buffers[t.name] for t in code.inputs),
        table,
        pairs,
        sync,
        *(buffers[t.name] for t in code.outputs),
    ]
    func = tirx.PrimFunc(params, s_tir.SBlockRealize([], True, root))
    return func.with_attrs({"s_tir": True, "tirx.noalias": False, "tirx.is_scheduled": True})
