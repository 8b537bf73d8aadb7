"""Bad input gets a clear error naming the cause, or a documented fallback; never a hang."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax
from tvm.script import relax as R

import tvm_rtask
from tvm_rtask.errors import CapacityError, FrontendError, OptionError
from tvm_rtask.testing.onnx_light import light_model_path


def test_truncated_onnx_file(tmp_path):
    data = open(light_model_path("squeezenet"), "rb").read()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(FrontendError, match="truncated.onnx"):
        tvm_rtask.compile(str(path), "llvm")


def test_garbage_onnx_file(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x00\xffnot a model at all" * 10)
    with pytest.raises(FrontendError):
        tvm_rtask.frontend.load(str(path))


def test_missing_file():
    with pytest.raises(FrontendError, match="does not exist"):
        tvm_rtask.frontend.load("/nonexistent/model.onnx")


def test_unsupported_onnx_operator():
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match="NoSuchOp"):
        tvm_rtask.frontend.load(model)


def test_dynamic_input_shape_needs_shape_dict():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match="shape_dict"):
        tvm_rtask.frontend.load(model)
    mod = tvm_rtask.frontend.load(model, shape_dict={"x": (3, 4)})
    ex = tvm_rtask.compile(mod, "llvm", num_veu=2)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype("float32")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(out, np.maximum(x, 0))


@pytest.mark.parametrize(
    "options,match",
    [
        ({"policy": "magic"}, "unknown policy"),
        ({"barrier": "sometimes"}, "barrier"),
        ({"num_veu": 0}, "num_veu"),
        ({"rtasks_per_veu": -1}, "rtasks_per_veu"),
        ({"frobnicate": 1}, "unknown option"),
    ],
)
def test_impossible_options(options, match):
    with pytest.raises(OptionError, match=match):
        tvm_rtask.compile(_Relu, "llvm", **options)


def test_more_veus_than_workers():
    with pytest.raises(CapacityError, match="num_veu=4096"):
        tvm_rtask.compile(_Relu, "llvm", num_veu=4096)


def test_unsupported_target_kind_is_refused_clearly():
    with pytest.raises(OptionError, match="rocm"):
        tvm_rtask.compile(_Relu, {"kind": "rocm"})


def test_bare_cuda_means_sm_90_with_an_llvm_host():
    target = tvm_rtask.relax_passes.as_target("cuda")
    assert str(target.arch) == "sm_90" and target.host.kind.name == "llvm"


@tvm.script.ir_module
class _Relu:
    @R.function
    def main(x: R.Tensor((8,), "float32")):
        with R.dataflow():
            y = R.nn.relu(x)
            R.output(y)
        return y


@tvm.register_global_func("tvm_rtask_test.double", override=True)
def _double(x, out):
    out.copyfrom(x.numpy() * 2)


@tvm.script.ir_module
class WithPackedCall:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.call_dps_packed("tvm_rtask_test.double", (a,), R.Tensor((4, 4), "float32"))
            c = R.add(b, a)
            d = R.nn.relu(c)
            R.output(d)
        return d


@pytest.mark.parametrize("barrier", ["fine", "global"])
def test_operator_that_is_not_a_kernel_stays_an_ordinary_call(barrier):
    plan = tvm_rtask.plan(WithPackedCall, "llvm", num_veu=2)
    report = plan.report()
    assert report["ordinary_ops"] == 1
    assert report["rprograms"] >= 2
    ex = tvm_rtask.compile(WithPackedCall, "llvm", barrier=barrier, num_veu=2)
    x = np.random.default_rng(0).standard_normal((4, 4)).astype("float32")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    a = np.maximum(x, 0)
    np.testing.assert_allclose(out, np.maximum(2 * a + a, 0), rtol=1e-6)


def test_onnx_checker_failure_is_a_frontend_error():
    model = onnx.ModelProto()
    with pytest.raises(FrontendError):
        tvm_rtask.frontend.load(model)
