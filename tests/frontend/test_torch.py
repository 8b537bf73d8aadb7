"""PyTorch import: ``frontend.load(module, example_inputs)`` through ``torch.export`` and TVM's
Relax importer, checked against PyTorch (skipped where torch is not installed)."""

import numpy as np
import pytest
import tvm

import tvm_rtask
from tvm_rtask.errors import FrontendError
from tvm_rtask.frontend.names import unsafe_names
from tvm_rtask.testing.onnx_light import assert_outputs_match
from tvm_rtask.testing.run import run_executable

torch = pytest.importorskip("torch")


class ConvNet(torch.nn.Module):
    """Two independent convolution branches (a wave for the planner), batch norm, pooling
    and a linear layer."""

    def __init__(self):
        super().__init__()
        self.left = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.right = torch.nn.Conv2d(3, 8, 1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)
        with torch.no_grad():  # statistics that are not the identity
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, image):
        y = torch.relu(self.bn(self.left(image) + self.right(image)))
        y = torch.nn.functional.max_pool2d(y, 2)
        return self.fc(y.flatten(1))


@pytest.fixture(scope="module")
def net_and_input():
    torch.manual_seed(0)
    return ConvNet().eval(), torch.randn(2, 3, 8, 8)


def test_parameters_are_constants_and_shapes_static(net_and_input):
    net, x = net_and_input
    mod = tvm_rtask.frontend.load(net, (x,))
    main = mod["main"]
    assert [p.name for p in main.params] == ["image"]  # forward's argument, no weights
    assert "params" not in main.attrs
    assert [int(d) for d in main.params[0].ty.shape] == [2, 3, 8, 8]
    assert [int(d) for d in main.ret_ty.shape] == [2, 10]  # one output: no 1-tuple
    assert "batch_norm" not in main.script()  # decomposed for inference
    assert unsafe_names(mod) == []


def test_numerics_match_pytorch(net_and_input):
    net, x = net_and_input
    with torch.no_grad():
        expected = [net(x).numpy()]
    mod = tvm_rtask.frontend.load(net, x)
    inputs = {"image": x.numpy()}
    assert_outputs_match(run_executable(tvm.compile(mod, "llvm"), inputs), expected, "tvm")
    ex = tvm_rtask.compile(mod, "llvm", policy="wavefront", num_veu=2)
    assert_outputs_match(run_executable(ex, inputs), expected, "rtask wavefront")


def test_training_mode_is_exported_for_inference_and_restored(net_and_input):
    net, x = net_and_input
    net.train()
    try:
        mod = tvm_rtask.frontend.load(net, (x,))
        assert net.training
    finally:
        net.eval()
    with torch.no_grad():
        expected = [net(x).numpy()]  # running statistics, not the batch's
    out = run_executable(tvm.compile(mod, "llvm"), {"image": x.numpy()})
    assert_outputs_match(out, expected, "exported in eval mode")


def test_an_exported_program_and_keyword_inputs():
    class Scale(torch.nn.Module):
        def forward(self, a, b):
            return a * 2 + b, a - b

    a, b = torch.randn(3, 4), torch.randn(3, 4)
    mod = tvm_rtask.frontend.load(torch.export.export(Scale(), (a, b)))
    outputs = run_executable(tvm.compile(mod, "llvm"), {"a": a.numpy(), "b": b.numpy()})
    np.testing.assert_allclose(outputs[0], (a * 2 + b).numpy(), rtol=1e-6)
    np.testing.assert_allclose(outputs[1], (a - b).numpy(), rtol=1e-6)
    keyword = tvm_rtask.frontend.load(Scale(), {"a": a.numpy(), "b": b.numpy()})
    assert [p.name for p in keyword["main"].params] == ["a", "b"]


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # torch.export cannot trace a branch on a value
            return x + 1
        return x - 1


@pytest.mark.parametrize(
    "model,inputs,shape_dict,match",
    [
        (DataDependent(), (torch.randn(4),), None, "torch.export could not export DataDependent"),
        (DataDependent(), None, None, "needs example inputs"),
        (DataDependent(), "x", None, "example inputs must be"),
        (DataDependent(), (torch.randn(4),), {"x": (4,)}, "shape_dict is for ONNX"),
    ],
)
def test_errors_are_one_line_naming_the_cause(model, inputs, shape_dict, match):
    with pytest.raises(FrontendError, match=match) as info:
        tvm_rtask.frontend.load(model, inputs, shape_dict=shape_dict)
    assert "\n" not in str(info.value)


def test_dynamic_shapes_are_refused():
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(Double(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    with pytest.raises(FrontendError, match="dynamic shape.*static shapes"):
        tvm_rtask.frontend.load(program)


def test_other_objects_are_not_taken_for_torch_models():
    with pytest.raises(FrontendError, match="does not exist"):
        tvm_rtask.frontend.load("/nonexistent/model.onnx")  # with torch imported
    with pytest.raises(FrontendError, match="cannot load a model from int"):
        tvm_rtask.frontend.load(3)
