"""fast_math: float32 exp and erf as vectorisable arithmetic, accurate to float32's needs."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from scipy import special
from tvm import te

from tests.backend.cpu.rules.common import NATIVE
from tvm_rtask.backend.cpu.rules.fast_math import vectorizable_math

N = 1 << 14


def _apply(op: str, x: np.ndarray) -> tuple[np.ndarray, str]:
    """``op`` of ``x`` through the rewritten, vectorised PrimFunc, and its LLVM IR."""
    a = te.placeholder((x.size,), name="a")
    b = te.compute((x.size,), lambda i: getattr(te, op)(a[i]), name="b")
    func = vectorizable_math(te.create_prim_func([a, b])).with_attr("global_symbol", "f")
    sch = tvm.s_tir.Schedule(func)
    (loop,) = sch.get_loops(sch.get_sblock("b"))
    sch.vectorize(sch.split(loop, [None, 16])[1])
    lib = tvm.tirx.build(sch.mod, target=NATIVE)
    out = tvm.runtime.tensor(np.zeros_like(x))
    lib["f"](tvm.runtime.tensor(x), out)
    return out.numpy(), lib.inspect_source("ll")


def test_exp_is_accurate_over_float32s_range_and_calls_no_libm():
    x = np.linspace(-86.9, 88.7, N, dtype="float32")
    y, ll = _apply("exp", x)
    expected = np.exp(x.astype("float64"))
    assert np.max(np.abs(y - expected) / expected) < 1e-6
    assert "expf" not in ll and "llvm.exp" not in ll


def test_exp_saturates_instead_of_overflowing():
    y, _ = _apply("exp", np.array([-1000.0, -100.0, 100.0, 1000.0] * 4, "float32"))
    assert np.all(np.isfinite(y)) and np.all(y >= 0)


@pytest.mark.parametrize("span", [0.5, 6.0])
def test_erf_is_accurate_near_zero_and_beyond(span):
    from scipy.special import erf

    x = np.linspace(-span, span, N, dtype="float32")
    y, ll = _apply("erf", x)
    expected = erf(x.astype("float64"))
    assert np.max(np.abs(y - expected)) < 5e-7
    nonzero = np.abs(expected) > 1e-6
    assert np.max(np.abs(y - expected)[nonzero] / np.abs(expected[nonzero])) < 2e-6
    assert "erff" not in ll


@pytest.mark.parametrize("op", ["sigmoid", "tanh"])
def test_sigmoid_and_tanh_are_accurate_and_saturate(op):
    x = np.concatenate([np.linspace(-20, 20, N), [-1000.0, 1000.0] * 8]).astype("float32")
    y, ll = _apply(op, x)
    wide = x.astype("float64")
    expected = special.expit(wide) if op == "sigmoid" else np.tanh(wide)
    assert np.all(np.isfinite(y))
    assert np.max(np.abs(y - expected)) < 5e-7
    assert "expf" not in ll and "llvm.exp" not in ll and "tanhf" not in ll


@pytest.mark.parametrize("op", ["exp", "erf", "sigmoid", "tanh"])
def test_each_rewrite_reads_its_argument_once(op):
    # the argument is bound once (a Let): as a plain tree, exp read it 28 times, and an
    # epilogue's inlined bias add and batch norm were copied as often
    a = te.placeholder((64,), name="a")
    b = te.compute((64,), lambda i: getattr(te, op)(a[i] * 2.0 + 1.0), name="b")
    func = vectorizable_math(te.create_prim_func([a, b]))
    loads = []
    tvm_ffi.structural_walk(func.body, (tvm.ir.TensorLoad, loads.append))
    assert len(loads) == 1
