"""Option ``nan_fill``: every float tensor a kernel writes, and every workspace of a
persistent kernel, is NaN before the kernel runs, so an element no kernel wrote cannot pass
by luck. A kernel written here to leave half of its output unwritten shows it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

import tvm_rtask
from tvm_rtask.relax_passes.nan_fill import FillOutputsWithNaN, nan_fill_func

N = 64


@T.prim_func(private=True, s_tir=True)
def half_copy(x: T.Buffer((N,), "float32"), y: T.Buffer((N,), "float32")):
    """Writes y[:N/2] only: the defect nan_fill must expose."""
    for i in range(N // 2):
        with T.sblock("copy"):
            vi = T.axis.spatial(N // 2, i)
            y[vi] = x[vi] * T.float32(2)


@T.prim_func(private=True, s_tir=True)
def add_one(x: T.Buffer((N,), "float32"), y: T.Buffer((N,), "float32")):
    for i in range(N):
        with T.sblock("add"):
            vi = T.axis.spatial(N, i)
            y[vi] = x[vi] + T.float32(1)


def module(chain: bool) -> tvm.IRModule:
    """``half_copy`` alone (its output is the model's) or followed by ``add_one`` (its output
    is then an intermediate: inside one rProgram, a workspace)."""
    bb = relax.BlockBuilder()
    half = bb.add_func(half_copy, "half_copy")
    add = bb.add_func(add_one, "add_one")
    x = relax.Var("x", relax.TensorType((N,), "float32"))
    ty = relax.TensorType((N,), "float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.call_tir(half, (x,), ty))
            if chain:
                y = bb.emit(relax.call_tir(add, (y,), ty))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _outputs(ex, x, calls=2):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return [vm["main"](tvm.runtime.tensor(x)).numpy() for _ in range(calls)]


@pytest.mark.parametrize("chain", [False, True], ids=["output", "workspace"])
@pytest.mark.parametrize("barrier", ["fine", "global"])
def test_unwritten_elements_are_nan(chain, barrier):
    x = np.arange(N, dtype="float32") + 1
    # fusion "none": the two kernels stay two operators of one rProgram, the intermediate
    # one of its workspaces
    ex = tvm_rtask.compile(
        module(chain),
        "llvm",
        policy="wavefront",
        barrier=barrier,
        num_veu=2,
        fusion="none",
        nan_fill=True,
    )
    for out in _outputs(ex, x):
        expected_half = x[: N // 2] * 2 + (1 if chain else 0)
        np.testing.assert_allclose(out[: N // 2], expected_half)
        assert np.isnan(out[N // 2 :]).all()


def test_written_outputs_are_unchanged_by_the_fill():
    x = np.arange(N, dtype="float32")
    mod = module(chain=True)
    plain = _outputs(tvm_rtask.compile(mod, "llvm", nan_fill=False), x, 1)[0]
    filled = _outputs(tvm_rtask.compile(mod, "llvm", nan_fill=True), x, 1)[0]
    np.testing.assert_array_equal(plain[: N // 2], filled[: N // 2])


def test_the_pass_fills_each_float_output_in_place():
    mod = module(chain=True)
    filled = FillOutputsWithNaN()(mod)
    text = filled["main"].script()
    assert text.count("R.call_tir_inplace(") == 2
    assert text.count("nan_fill") >= 2
    out = relax.VirtualMachine(tvm.compile(filled, "llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(np.ones(N, "float32"))
    ).numpy()
    assert np.isnan(out[N // 2 :]).all() and (out[: N // 2] == 3).all()


def test_nan_fill_func_fills_with_nan():
    func = nan_fill_func([3, 5], "float32")
    lib = tvm.tirx.build(tvm.IRModule({"fill": func.with_attr("global_symbol", "fill")}), "llvm")
    out = tvm.runtime.tensor(np.zeros((3, 5), "float32"))
    lib["fill"](out)
    assert np.isnan(out.numpy()).all()


def test_nan_fill_is_a_checked_bool_option():
    from tvm_rtask.errors import OptionError

    with pytest.raises(OptionError, match="nan_fill"):
        tvm_rtask.plan(module(chain=False), "llvm", nan_fill="yes")
