"""The key of a tuning workload: the module MetaSchedule tunes and looks up for a PrimFunc."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

TASK_SYMBOL = "main"


def task_module(func: tirx.PrimFunc) -> tvm.IRModule:
    """The IRModule MetaSchedule tunes and looks up for ``func`` (one ``main`` with a symbol)."""
    return tvm.IRModule({TASK_SYMBOL: func.with_attr("global_symbol", TASK_SYMBOL)})


def workload_key(func: tirx.PrimFunc) -> str:
    """A stable text key of the workload (MetaSchedule's structural hash, in hex)."""
    return f"{tvm_ffi.structural_hash(task_module(func)) & (2**64 - 1):016x}"
