"""The weights an llvm rProgram reads come as one constant per dtype (compile time, issue 27):
each weight a parameter made the packed entry's argument checks most of a model's LLVM time."""

import numpy as np
import tvm
from tvm import relax, tirx

import tvm_rtask
from tvm_rtask.backend.cpu.dispatch import BODY_ATTR

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((64, 64)).astype("float32")
W2 = RNG.standard_normal((64, 64)).astype("float32")
B1 = RNG.standard_normal((64,)).astype("float32")


def _model() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, relax.const(W1)))
            a = bb.emit(relax.op.nn.relu(relax.op.add(a, relax.const(B1))))
            c = bb.emit_output(relax.op.matmul(a, relax.const(W2)))
        bb.emit_func_output(c)
    return bb.get()


def test_weights_are_one_parameter_and_results_match():
    lowered = tvm_rtask.lower(_model(), "llvm", num_veu=2)
    programs = [
        f
        for gv, f in lowered.functions.items()
        if isinstance(f, tirx.PrimFunc) and gv.name_hint.startswith("rprogram_")
    ]
    assert programs
    # x, the float32 weight arena, the output: not one parameter per weight
    assert sum(len(f.params) for f in programs) <= 3 * len(programs)
    assert all(BODY_ATTR not in (f.attrs or {}) for f in programs)
    names = {p.name for f in programs for p in f.params}
    assert any(n.startswith("rtask_weights_float32") for n in names)

    x = RNG.standard_normal((64, 64)).astype("float32")
    ex = tvm_rtask.build(lowered, "llvm")[0]
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    expected = np.maximum(x @ W1 + B1, 0) @ W2
    assert np.abs(expected).max() > 10  # activations alive
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
