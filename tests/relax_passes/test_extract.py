"""extract_graph: multi-output kernels are one rOperator with several outputs."""

import numpy as np
import tvm
from tvm import relax

import tvm_rtask
from tvm_rtask.relax_passes import extract_graph, prepare_pipeline
from tvm_rtask.testing.run import run_executable


def _split_module(return_whole_tuple: bool):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, 2, axis=1))  # one kernel, two outputs
            if return_whole_tuple:
                out = bb.emit_output(parts)
            else:
                a = bb.emit(relax.op.nn.relu(relax.TupleGetItem(parts, 0)))
                b = bb.emit(relax.op.negative(relax.TupleGetItem(parts, 1)))
                out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    return bb.get()


def test_multi_output_kernel_is_one_operator_and_runs_in_an_rprogram():
    mod = _split_module(return_whole_tuple=False)
    graph = extract_graph(prepare_pipeline("none")(mod))
    split = [op for op in graph.operators if len(op.outputs) == 2]
    assert len(split) == 1 and split[0].supported
    assert not [op for op in graph.operators if op.pattern == "tuple"]  # no TupleGetItem ops
    ex, plan = tvm_rtask.compile_with_plan(mod, "llvm", fusion="none", num_veu=2)
    assert plan.report()["kernel_launches"] == 1
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    got = run_executable(ex, {"x": x})
    want = run_executable(tvm.compile(mod, "llvm"), {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_a_tuple_used_as_a_whole_stays_an_ordinary_call():
    mod = _split_module(return_whole_tuple=True)
    op = extract_graph(prepare_pipeline("none")(mod)).operators[0]
    assert not op.supported and "as a whole" in op.reason
    x = np.random.default_rng(1).standard_normal((4, 6)).astype("float32")
    got = run_executable(tvm_rtask.compile(mod, "llvm", fusion="none", num_veu=2), {"x": x})
    want = run_executable(tvm.compile(mod, "llvm"), {"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_tensor_names_do_not_depend_on_which_operators_are_supported():
    """An operator the target's rKernel maker refuses (planning) is supported in the
    lowering's extraction: its constants must still take the same names, or a later
    operator's constant argument would be bound to the wrong value."""
    from tvm_rtask.core import RKernel
    from tvm_rtask.errors import UnsupportedOperator

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.add(x, relax.const(np.full(4, 1.0, "float32"))))
            out = bb.emit_output(relax.op.multiply(a, relax.const(np.full(4, 3.0, "float32"))))
        bb.emit_func_output(out)
    mod = prepare_pipeline("none")(bb.get())

    def refuse_add(name):
        if name.startswith("add"):
            raise UnsupportedOperator(f"{name}: refused for the test")
        return [RKernel(name=name, num_rtasks=1)]

    planned, lowered = extract_graph(mod, refuse_add), extract_graph(mod)
    assert [op.supported for op in planned.operators] == [False, True]
    assert [(o.inputs, o.outputs) for o in planned.operators] == [
        (o.inputs, o.outputs) for o in lowered.operators
    ]
    const = planned.operators[1].inputs[1]
    assert planned.tensors[const].same_as(lowered.tensors[const])
    np.testing.assert_array_equal(lowered.tensors[const].value.numpy(), np.full(4, 3.0))


def test_an_extraction_without_estimates_names_the_same_graph():
    """Lowering extracts again without flop and byte estimates: the same operators and
    tensors, the estimates left at zero."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(np.ones((16, 4), "float32"))
            out = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    mod = prepare_pipeline("none")(bb.get())
    full, bare = extract_graph(mod), extract_graph(mod, estimates=False)
    assert [(o.name, o.inputs, o.outputs) for o in full.operators] == [
        (o.name, o.inputs, o.outputs) for o in bare.operators
    ]
    assert all(o.flops > 0 for o in full.operators)
    assert all(o.flops == 0 and o.bytes == 0 for o in bare.operators)
