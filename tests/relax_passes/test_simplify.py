"""FoldConstantCalls against Relax's own FoldConstant, and RemoveInferenceDropout."""

import numpy as np
import tvm
from tvm import relax

from tvm_rtask.relax_passes.dataflow import as_tir_call
from tvm_rtask.relax_passes.simplify import DivideByConstantAsMultiply, FoldConstantCalls
from tvm_rtask.testing.run import run_executable


def _module(rng):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 3, 3), "float32"))
    w1 = relax.const(rng.standard_normal(4).astype("float32"))
    w2 = relax.const(rng.standard_normal(4).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.reshape(w1, (1, 4, 1, 1)))  # constant only: folded
            b = bb.emit(relax.op.reshape(w2, (1, 4, 1, 1)))  # same PrimFunc, other weight
            c = bb.emit(relax.op.multiply(a, b))  # folded through the folded values
            y = bb.emit(relax.op.add(x, c))  # reads x: stays
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return relax.transform.AnnotateTIROpPattern()(mod)


def _tir_calls(mod):
    return [
        as_tir_call(b.value).gvar.name_hint
        for block in mod["main"].body.blocks
        for b in block.bindings
        if as_tir_call(b.value) is not None
    ]


def test_fold_constant_calls_matches_relax_fold_constant():
    rng = np.random.default_rng(0)
    mod = _module(rng)
    ours = FoldConstantCalls()(mod)
    theirs = relax.transform.FoldConstant()(mod)
    assert len(_tir_calls(mod)) == 5
    assert sorted(_tir_calls(ours)) == sorted(_tir_calls(theirs)) == ["add", "relu"]
    x = rng.standard_normal((2, 4, 3, 3)).astype("float32")
    got = run_executable(tvm.compile(ours, "llvm"), {"x": x})[0]
    want = run_executable(tvm.compile(mod, "llvm"), {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_calls_without_arguments_fold_with_what_reads_them():
    """ONNX shape computations: ``shape_to_tensor`` of a constant shape (a call_tir of no
    arguments), then a cast and a reshape that read only it, all folded in one build."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            shape = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr([3, 4])))
            cast = bb.emit(relax.op.astype(shape, "float32"))
            total = bb.emit(relax.op.sum(cast))  # 7.0, read by the output
            out = bb.emit_output(relax.op.add(x, total))
        bb.emit_func_output(out)
    mod = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(bb.get()))
    assert len(_tir_calls(mod)) == 4
    folded = FoldConstantCalls()(mod)
    assert _tir_calls(folded) == ["add"]
    x_value = np.arange(12, dtype="float32").reshape(2, 6)
    got = run_executable(tvm.compile(folded, "llvm"), {"x": x_value})[0]
    np.testing.assert_array_equal(got, x_value + 7.0)


def test_variables_bound_to_constants_fold_what_reads_them():
    """A batch norm's statistics bound to a variable (what FoldConstantLayoutTransforms leaves
    of a reshaped weight): the calls that read it fold here, not one build each in Relax's
    FoldConstant (62 builds, 8 s of DenseNet-121's preparation)."""
    variance = np.linspace(0.5, 2.0, 8, dtype="float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            var = bb.emit(relax.const(variance.reshape(1, 8)))
            std = bb.emit(relax.op.sqrt(relax.op.add(var, relax.const(1e-5, "float32"))))
            out = bb.emit_output(relax.op.divide(x, std))
        bb.emit_func_output(out)
    mod = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(bb.get()))
    folded = FoldConstantCalls()(mod)
    assert _tir_calls(folded) == ["divide"]
    x_value = np.arange(1, 9, dtype="float32").reshape(1, 8)
    got = run_executable(tvm.compile(folded, "llvm"), {"x": x_value})[0]
    np.testing.assert_allclose(got, x_value / np.sqrt(variance + 1e-5), rtol=1e-6)


def test_fold_constant_calls_leaves_input_module_alone():
    mod = _module(np.random.default_rng(1))
    before = len(_tir_calls(mod))
    FoldConstantCalls()(mod)
    assert len(_tir_calls(mod)) == before


def _divisions(divisor):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    y = relax.Var("y", relax.TensorType((2, 8), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(relax.op.divide(x, relax.const(divisor)))  # a constant: multiplied
            out = bb.emit_output(relax.op.divide(a, y))  # a tensor: stays a division
        bb.emit_func_output(out)
    return bb.get()


def _op_names(mod):
    names = []
    relax.analysis.post_order_visit(
        mod["main"].body,
        lambda e: (
            names.append(e.op.name)
            if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)
            else None
        ),
    )
    return names


def test_division_by_a_constant_becomes_a_multiply():
    rng = np.random.default_rng(3)
    before = _divisions(np.array(1.4142135, "float32"))
    after = DivideByConstantAsMultiply()(before)
    assert _op_names(after).count("relax.divide") == 1 and "relax.multiply" in _op_names(after)
    feed = {
        "x": rng.uniform(-3, 3, (2, 8)).astype("float32"),
        "y": rng.uniform(1, 4, (2, 8)).astype("float32"),
    }
    want = run_executable(tvm.compile(before, "llvm"), feed)[0]
    got = run_executable(tvm.compile(after, "llvm"), feed)[0]
    np.testing.assert_allclose(got, want, rtol=2e-7)  # one rounding apart at most


def test_division_by_zero_stays_a_division():
    after = DivideByConstantAsMultiply()(_divisions(np.array([0.0, 2.0] * 4, "float32")))
    assert _op_names(after).count("relax.divide") == 2
