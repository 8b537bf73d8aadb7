"""Launches on several streams: the host's stream calls put around ``main``'s launches.

TVM's Relax VM launches every kernel on the current stream of the FFI environment
(``TVMFFIEnvGetStream``), one after the other. For a plan with streams (``Plan.streams``,
policy ``opara_streams``), :func:`launch_on_streams` turns ``main``'s dataflow block into an
ordinary binding block (the calls are impure) and inserts, from
:func:`tvm_rtask.core.streams.stream_actions`:

* ``tvm_rtask.streams.fork(device_type, n)`` before the first binding;
* ``tvm_rtask.streams.enter(stream, *events)`` before each launch (it switches the
  environment's stream, so the launch that follows goes there);
* ``tvm_rtask.streams.record(event)`` after a launch another stream reads;
* ``tvm_rtask.streams.join(*tensors)`` after the last binding, on every tensor the block
  made: each stays alive to the end of the call, so that memory planning never hands the
  storage of a tensor still read on one stream to a launch on another (the VM frees and
  reuses in host order, which streams do not follow).

``runtime/streams`` implements the four calls (CUDA streams and events; nothing on the CPU);
importing ``tvm_rtask`` in a process with TVM registers them (a VM refuses an executable
whose calls are not registered).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..core import Plan
from ..core.streams import Enter, Fork, Join, Record, check_stream_actions, stream_actions
from ..errors import PlanError

# DLPack device types the runtime knows: the CPU (streams do nothing) and CUDA
DEVICE_TYPES = {"llvm": 1, "c": 1, "cuda": 2}
# Relax calls that launch kernels on the current stream
LAUNCH_OPS = frozenset(
    {
        "relax.call_tir",
        "relax.call_tir_inplace",
        "relax.call_dps_packed",
        "relax.call_pure_packed",
        "relax.call_tir_with_grad",
    }
)


def is_launch(value: relax.Expr) -> bool:
    """Whether a binding's value launches work on the device (a kernel or a packed call)."""
    if not isinstance(value, relax.Call):
        return False
    if isinstance(value.op, relax.ExternFunc):
        return True
    return isinstance(value.op, tvm.ir.Op) and value.op.name in LAUNCH_OPS


def _host_call(name: str, args: list, index: int) -> relax.VarBinding:
    call = relax.Call(relax.ExternFunc(name), args, ty_args=[relax.ObjectType()])
    return relax.VarBinding(relax.Var(f"rtask_stream_{index}", relax.ObjectType()), call)


def launch_on_streams(
    main: relax.Function, block_index: int, launch_at: dict[int, int], plan: Plan
) -> relax.Function:
    """``main`` with the stream calls of ``plan`` around its launches.

    ``launch_at[k]``: the position in block ``block_index`` of step ``k``'s launch (steps
    that launch nothing are absent)."""
    kind = plan.target.get("kind", "llvm")
    if kind not in DEVICE_TYPES:
        raise PlanError(f"launches on several streams: no stream runtime for target {kind!r}")
    for k, pos in launch_at.items():
        value = main.body.blocks[block_index].bindings[pos].value
        if isinstance(value, relax.Call) and getattr(value.op, "name", "") == (
            "relax.call_tir_inplace"
        ):
            raise PlanError(f"step {k} writes its input in place: it cannot run on a stream")
    launches = sorted(launch_at)
    actions = stream_actions(plan, launches)
    check_stream_actions(plan, launches, actions)
    dataflow = main
    main = relax.transform.ToNonDataflow()(tvm.IRModule({"main": dataflow}))["main"]
    old = main.body.blocks[block_index].bindings
    if len(old) != len(dataflow.body.blocks[block_index].bindings):
        raise PlanError("ToNonDataflow changed the bindings of main's block")
    step_at = {pos: k for k, pos in launch_at.items()}
    pending = iter(actions)
    action = next(pending, None)
    out: list[relax.Binding] = []

    def emit(name: str, args: list) -> None:
        out.append(_host_call(name, args, len(out)))

    for pos, binding in enumerate(old):
        if isinstance(action, Fork):
            emit("tvm_rtask.streams.fork", [relax.prim_value(DEVICE_TYPES[kind]),
                                            relax.prim_value(action.streams)])  # fmt: skip
            action = next(pending, None)
        k = step_at.get(pos)
        if k is not None:
            if not isinstance(action, Enter) or action.step != k:
                raise PlanError(f"the stream actions do not launch step {k} at its place")
            waits = [relax.prim_value(e) for e in action.waits]
            emit("tvm_rtask.streams.enter", [relax.prim_value(action.stream), *waits])
            action = next(pending, None)
        out.append(binding)
        if k is not None and isinstance(action, Record):
            emit("tvm_rtask.streams.record", [relax.prim_value(action.event)])
            action = next(pending, None)
    if launches:
        if not isinstance(action, Join):
            raise PlanError("the stream actions do not end with a join")
        made = [b.var for b in old if isinstance(b.var.ty, relax.TensorType | relax.TupleType)]
        emit("tvm_rtask.streams.join", made)
    blocks = list(main.body.blocks)
    blocks[block_index] = relax.BindingBlock(out)
    body = relax.SeqExpr(blocks, main.body.body)
    return relax.Function(main.params, body, main.ret_ty, False, main.attrs)
