"""What the rule tests share: small Relax modules, their fused PrimFunc, building and running
a PrimFunc on the CPU, and the targets the rules are checked on (plain llvm, 8-lane tiles;
this machine's CPU, its own lanes)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_rtask.backend import as_target
from tvm_rtask.relax_passes import prepare_pipeline

LLVM = tvm.target.Target("llvm")
NATIVE = as_target("llvm-native")
# AVX2's sixteen ymm registers, whatever this machine has: the register budget of the rules
HASWELL = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})


def stack_reloads(scheduled, target) -> int:
    """Instructions of the scheduled PrimFunc's (or Schedule's) x86 assembly on ``target``
    that read a ymm operand back from the stack (``... N(%rsp), ... %ymmX``): values, the
    accumulators above all, that LLVM could not keep in registers."""
    import re

    func = scheduled.mod["main"] if hasattr(scheduled, "mod") else scheduled
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    asm = (lib.mod if hasattr(lib, "mod") else lib).inspect_source("s")
    reload = re.compile(r"\((%rsp|%rbp)\)\s*,.*%ymm")
    return sum(1 for line in asm.splitlines() if reload.search(line))


def conv_module(cin, cout, size, kernel, stride, pad, groups=1, epilogue=True, width=None):
    """conv2d (+ bias add + relu) on a ``size`` x ``width`` (default square) input."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, cin, size, width or size), "float32"))
    w = relax.Var("w", relax.TensorType((cout, cin // groups, kernel, kernel), "float32"))
    b = relax.Var("b", relax.TensorType((1, cout, 1, 1), "float32"))
    params = [x, w, b] if epilogue else [x, w]
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, groups=groups))
            if epilogue:
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def matmul_module(m, k, n, batch=None, bias=True, relu=False, gelu=False):
    """``x[(batch,) m, k] @ w[k, n]`` (+ bias[n]) (+ relu) (+ gelu)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*([batch] if batch else []), m, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, n), "float32"))
    b = relax.Var("b", relax.TensorType((n,), "float32"))
    with bb.function("main", [x, w, b] if bias else [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            if bias:
                y = bb.emit(relax.op.add(y, b))
            if relu:
                y = bb.emit(relax.op.nn.relu(y))
            if gelu:
                y = bb.emit(relax.op.nn.gelu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def called_names(mod) -> list[str]:
    """What ``main`` calls, in order: operator names, and the PrimFunc of each call_tir."""
    names = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.append(
                expr.args[0].name_hint if expr.op.name == "relax.call_tir" else expr.op.name
            )

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return names


def fused_func(mod):
    """The one fused PrimFunc of a one-operator module."""
    mod = prepare_pipeline()(mod)
    (name,) = [g.name_hint for g in mod.get_global_vars() if g.name_hint != "main"]
    return mod[name]


def run(func, args, target=LLVM):
    """Build ``func`` alone and run it on ``args`` (numpy arrays; the last one is the
    output); returns the output."""
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def random_args(func, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in func.params
    ]


def assert_close(actual, expected, tol=1e-5):
    """Relative error (max |a - e| / max |e|) within ``tol``."""
    error = float(np.max(np.abs(actual - expected)) / max(float(np.max(np.abs(expected))), 1e-30))
    assert error < tol, error


def softmax_func(shape, axis=-1):
    """The fused PrimFunc of ``softmax(x, axis)`` over an input of ``shape``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x, axis=axis))
        bb.emit_func_output(out)
    return fused_func(bb.get())
