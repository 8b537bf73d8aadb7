"""Batch norms of constant statistics: into the convolution's weights where one precedes them,
else one multiply-add; outputs against ONNX Runtime's, activations alive."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import tvm_rtask
from tvm_rtask.testing.onnx_light import onnxruntime_outputs

RNG = np.random.default_rng(7)


def _bn_params(prefix: str, channels: int) -> list:
    values = {
        "g": RNG.uniform(0.5, 2.0, channels),
        "b": RNG.normal(0.0, 1.0, channels),
        "m": RNG.normal(0.0, 1.0, channels),
        "v": RNG.uniform(0.2, 3.0, channels),  # var far from 1: a missed fold shows
    }
    return [
        numpy_helper.from_array(v.astype("float32"), f"{prefix}_{k}") for k, v in values.items()
    ]


def _model() -> onnx.ModelProto:
    """conv -> BN -> ReLU -> BN (pre-activation, no conv before it) -> ReLU -> conv."""
    w1 = numpy_helper.from_array(RNG.normal(0, 0.3, (8, 3, 3, 3)).astype("float32"), "w1")
    w2 = numpy_helper.from_array(RNG.normal(0, 0.3, (4, 8, 1, 1)).astype("float32"), "w2")
    bn = lambda x, p, y: helper.make_node(  # noqa: E731
        "BatchNormalization", [x, f"{p}_g", f"{p}_b", f"{p}_m", f"{p}_v"], [y], epsilon=1e-3
    )
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        bn("c1", "bn1", "n1"),
        helper.make_node("Relu", ["n1"], ["r1"]),
        bn("r1", "bn2", "n2"),
        helper.make_node("Relu", ["n2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 10, 10])],
        [w1, w2, *_bn_params("bn1", 8), *_bn_params("bn2", 8)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def _ops(mod) -> list[str]:
    names = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.append(expr.op.name)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return names


def test_batch_norms_fold_into_weights_or_one_multiply_add():
    ops = _ops(tvm_rtask.frontend.load(_model()))
    assert "relax.nn.batch_norm" not in ops and "relax.divide" not in ops
    assert ops.count("relax.multiply") == 1  # the pre-activation one; the first is in w1


@pytest.mark.parametrize("policy", ["sequential", "wavefront"])
def test_folded_model_matches_onnxruntime(policy):
    model = _model()
    x = RNG.normal(0, 1, (1, 3, 10, 10)).astype("float32")
    (expected,) = onnxruntime_outputs(model, {"x": x})
    assert expected.std() > 0.5
    ex = tvm_rtask.compile(tvm_rtask.frontend.load(model), "llvm", policy=policy)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
