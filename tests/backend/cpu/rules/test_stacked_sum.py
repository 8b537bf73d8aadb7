"""StackedSumToAdd (relax_passes/stacked_sum.py, first in RTaskPrepare): ONNX ``Sum``
of same-shape inputs becomes additions, the residual add then fuses into the convolution's
epilogue, and the outputs still match ONNX Runtime."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _residual_model(inputs=2):
    """conv(x) + r (+ r1 ...) through ONNX ``Sum``, then relu: a bottleneck block's end, as
    the per-operator report cuts it (the residuals are inputs of their own)."""
    rng = np.random.default_rng(0)
    w = (0.2 * rng.standard_normal((8, 8, 3, 3))).astype(np.float32)
    residuals = [f"r{i}" for i in range(inputs - 1)]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Sum", ["c", *residuals], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 8, 12, 12])
            for name in ["x", *residuals]
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _ops(mod):
    from tvm import relax

    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and hasattr(expr.op, "name"):
            found.append(expr.op.name)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


@pytest.mark.parametrize("inputs", [2, 3])
def test_stacked_sum_becomes_adds_and_matches_onnxruntime(inputs):
    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.relax_passes import RTaskPrepare
    from tvm_rtask.relax_passes.stacked_sum import StackedSumToAdd
    from tvm_rtask.testing.onnx_light import onnxruntime_outputs, random_inputs, relative_error

    model = _residual_model(inputs)
    feeds = random_inputs(model)
    mod = tvm_rtask.frontend.load(model)
    assert {"relax.stack", "relax.sum"} <= set(_ops(mod))  # how TVM 0.27 imports Sum
    rewritten = relax.transform.DeadCodeElimination()(StackedSumToAdd()(mod))
    ops = _ops(rewritten)
    assert "relax.stack" not in ops and "relax.sum" not in ops
    assert ops.count("relax.add") == inputs  # the bias add and the sum's
    # the residual add and relu fuse into the convolution: one kernel
    with tvm.target.Target("llvm"):
        prepared = RTaskPrepare()(rewritten)
    kernels = [f for f in prepared.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 1
    ex = tvm_rtask.compile(rewritten, "llvm", policy="sequential", num_veu=2, db=False)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(v) for v in feeds.values()]
    )
    expected = onnxruntime_outputs(model, feeds)[0]
    assert relative_error(out.numpy(), expected) < 1e-5


def test_the_prepare_pipeline_rewrites_the_sum():
    """RTaskPrepare runs the rewrite itself: the imported module's Sum leaves no stack and
    the conv, residual add and relu are one kernel."""
    import tvm

    import tvm_rtask
    from tvm_rtask.relax_passes import RTaskPrepare

    prepared = RTaskPrepare()(tvm_rtask.frontend.load(_residual_model(2)))
    kernels = [f for f in prepared.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(kernels) == 1 and "stack" not in prepared["main"].script()


def test_other_sums_are_left_alone():
    from tvm import relax

    from tvm_rtask.relax_passes.stacked_sum import StackedSumToAdd

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            # a sum over a real axis, and a stack summed over another axis
            a = bb.emit(relax.op.sum(x, axis=[0]))
            b = bb.emit(relax.op.sum(relax.op.stack([x, x], axis=0), axis=[1]))
            out = bb.emit_output(relax.Tuple([a, b]))
        bb.emit_func_output(out)
    mod = bb.get()
    assert _ops(StackedSumToAdd()(mod)).count("relax.sum") == 2
