"""Tuning tasks: the distinct fused PrimFuncs of a model, as MetaSchedule workloads.

A task is keyed by the structural hash of its PrimFunc, so an operator used by several
bindings (or several models) is tuned once. ``task_module`` is the single place that turns a
PrimFunc into the IRModule MetaSchedule hashes: tuning and lookup must build it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from ..records.workload import TASK_SYMBOL, task_module, workload_key  # noqa: F401 - re-exported
from ..relax_passes.dataflow import as_tir_call, main_dataflow
from ..tir.analysis import block_iterator_kinds, estimate_flops

# MetaSchedule's builder only exports functions with a global symbol (a private PrimFunc from
# FuseTIR has none, and the build fails in a later pass): the task module names it "main".


@dataclass
class TuningTask:
    """One distinct operator: its PrimFunc, how often ``main`` calls it, and its FLOPs."""

    name: str
    func: tirx.PrimFunc
    calls: int
    flops: float

    @property
    def key(self) -> str:
        return workload_key(self.func)


def has_reduction(func: tirx.PrimFunc) -> bool:
    """True when some block reduces: matmul, conv, pooling, softmax. Purely injective
    operators (reshape, add) gain little from tuning and are left to the defaults."""
    return tirx.IterVar.CommReduce in block_iterator_kinds(func)


def extract_tasks(mod: tvm.IRModule, include_injective: bool = False) -> list[TuningTask]:
    """The distinct PrimFuncs that ``main``'s dataflow block calls, in first-call order.

    ``mod`` is the fused module the rTask pipeline plans (``RTaskPrepare``'s output), so the
    keys match what ``PlanRPrograms`` looks up.
    """
    found = main_dataflow(mod["main"])
    if found is None:
        return []
    tasks: dict[str, TuningTask] = {}
    for binding in found[1].bindings:
        call = as_tir_call(binding.value)
        if call is None or call.has_tir_vars:
            continue
        func = mod[call.gvar]
        if not isinstance(func, tirx.PrimFunc):
            continue
        if not include_injective and not has_reduction(func):
            continue
        key = workload_key(func)
        if key in tasks:
            tasks[key].calls += 1
        else:
            tasks[key] = TuningTask(call.gvar.name_hint, func, 1, estimate_flops(func))
    return list(tasks.values())


def preparation_target(target):
    """What a model is prepared for when its operators are tuned for ``target``: its
    backend's ``tuning_preparation`` (CUDA's own target; llvm's generic one)."""
    from ..backend import get_backend

    return get_backend(target).tuning_preparation()


def prepared(mod, fusion: str | None = None, target="llvm") -> tvm.IRModule:
    """``mod`` (ONNX path, ModelProto or Relax module) after the rTask pipeline's preparation
    for ``target``: the PrimFuncs ``compile`` will look records up for (CUDA keeps NCHW where
    the CPU blocks channels, so operators prepared for one target miss the other's)."""
    from .. import frontend
    from ..relax_passes import RTaskPrepare

    return RTaskPrepare(fusion, target=target)(frontend.load(mod))


__all__ = [
    "TuningTask",
    "extract_tasks",
    "has_reduction",
    "preparation_target",
    "prepared",
    "task_module",
]
