"""A two-vEU dispatcher whose vEU 0 waits for a step vEU 1 never reaches (the forced timeout).

Shared by the GPU test that runs it and the CPU test that keeps its call in step with the
dispatcher's parameters (a GPU window found the call one argument short)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import tirx
from tvm.script import relax as R

from tvm_rtask.backend.cuda.dispatch import (
    ENTRY_WORDS,
    WAIT,
    CUDAProgramCode,
    build_cuda_dispatcher,
    sync_words,
)
from tvm_rtask.backend.cuda.rkernel import make_cuda_rkernel, schedule_for_cuda
from tvm_rtask.relax_passes import RTaskPrepare, as_target, extract_graph
from tvm_rtask.tir.common import TensorDecl

TARGET = {"kind": "cuda", "arch": "sm_90"}


@tvm.script.ir_module
class Add:
    @R.function
    def main(x: R.Tensor((1024,), "float32")):
        with R.dataflow():
            y = R.add(x, x)
            R.output(y)
        return y


def broken_plan(timeout_ns: int = 100_000_000) -> tuple[tirx.PrimFunc, dict[str, np.ndarray]]:
    """The dispatcher and the value of each of its parameters, by name (``y`` is the output,
    ``rtask_sync`` the words the timeout is reported in)."""
    target = as_target(TARGET)
    mod = RTaskPrepare()(Add)
    op = extract_graph(mod).operators[0]
    kernel = make_cuda_rkernel(schedule_for_cuda(mod[op.func], target))
    table = np.zeros((2, 1, ENTRY_WORDS), "int32")
    table[0, 0] = [WAIT, 0, 1, 0, 0]
    pairs = np.array([[1, 5]], "int32")
    code = CUDAProgramCode(
        inputs=[TensorDecl("x", (1024,), "float32")],
        outputs=[TensorDecl("y", (1024,), "float32")],
        calls={"add": (kernel, ["x", "x", "y"])},
        num_veu=2,
        threads=256,
        table=table,
        pairs=pairs,
        op_index={"add": 0},
    )
    func = build_cuda_dispatcher(code, timeout_ns=timeout_ns).with_attr("global_symbol", "main")
    values = {
        "x": np.ones(1024, "float32"),
        "rtask_offsets": code.offset_table[0],
        "rtask_table": table,
        "rtask_pairs": pairs,
        "rtask_sync": sync_words(2),
        "y": np.zeros(1024, "float32"),
    }
    return func, values


def parameter_names(func: tirx.PrimFunc) -> list[str]:
    """The names of ``func``'s parameters."""
    return [p.name for p in func.params]


def call_arguments(func: tirx.PrimFunc, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``values`` in the order of ``func``'s parameters; a parameter without a value raises."""
    names = parameter_names(func)
    missing = [n for n in names if n not in values]
    if missing:
        raise KeyError(f"the forced-timeout call gives no value for parameter(s) {missing}")
    return [values[n] for n in names]
