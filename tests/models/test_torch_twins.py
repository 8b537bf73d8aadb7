"""The zoo's PyTorch twins: the same numbers as ONNX Runtime on the ONNX model they are made
from, through ``torch.export`` and tvm-rtask the same numbers as PyTorch, one-line errors for
what the builder never emits (skipped where torch is not installed)."""

import sys

import numpy as np
import pytest

import tvm_rtask
import tvm_rtask.models as zoo
from tvm_rtask.errors import OptionError, UnsupportedOperator
from tvm_rtask.models._builder import GraphBuilder, tf_same_pads
from tvm_rtask.testing.onnx_light import assert_outputs_match, onnxruntime_outputs
from tvm_rtask.testing.run import run_executable

torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (tvm-rtask[torch])")
from tvm_rtask.models.torch_twin import twin  # noqa: E402

# Every model reduced, and the grouped-convolution form of ResNeXt (Conv with group > 1).
VARIANTS = [(name, {}) for name in zoo.names()] + [("resnext29", {"grouped": True})]
# (model, overrides) imported from PyTorch and compiled by tvm-rtask in CI: 3 to 10 s each on
# 2 busy cores; the slow ones take 13 to 50 s.
TVM_IN_CI = [
    ("alexnet", {}),
    ("bert_layer", {}),
    ("deepspeech2", {}),
    ("lstm_tc", {}),
    ("randwire", {}),
    ("resnext29", {"grouped": True}),
    ("seq2seq", {}),
    ("squeezenet", {}),
    ("vit_tiny", {}),
]
TVM_SLOW = [
    ("inception_v3", {}),
    ("nasnet_cifar", {}),
    ("resnext29", {}),
]


def _torch_outputs(net, args) -> list[np.ndarray]:
    with torch.no_grad():
        out = net(*args)
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def test_the_tvm_lists_cover_the_zoo():
    assert sorted({name for name, _ in TVM_IN_CI + TVM_SLOW}) == zoo.names()


@pytest.mark.parametrize("name,overrides", VARIANTS)
def test_twin_matches_onnxruntime(name, overrides):
    net, args = zoo.torch_model(name, batch=2, reduced=True, **overrides)
    model = zoo.onnx_model(name, batch=2, reduced=True, **overrides)
    inputs = zoo.sample_inputs(model)
    assert isinstance(net, torch.nn.Module) and not net.training
    assert [a.numpy().tolist() for a in args] == [v.tolist() for v in inputs.values()]
    actual = _torch_outputs(net, args)
    assert_outputs_match(actual, onnxruntime_outputs(model, inputs), name)
    assert [o.shape for o in actual] == list(net.output_shapes)  # the ONNX declared shapes


def test_window_ops_with_asymmetric_pads_and_ceil_mode_match_onnxruntime():
    """TensorFlow-SAME (asymmetric) pads and ceil_mode on sizes where they change the result;
    several graph outputs come back as a tuple."""
    b = GraphBuilder("windows", seed=3)
    x = b.input("x", (2, 3, 10, 10))
    same = tf_same_pads((10, 10), 3, 2)
    assert same[:2] != same[2:]
    outs = [
        b.conv(x, 4, 3, stride=2, pads=same),
        b.maxpool(x, 3, 2, pads=same),
        b.maxpool(x, 3, 2, ceil_mode=True),
        b.avgpool(x, 3, 2, pads=same),
        b.avgpool(x, 3, 2, pads=same, count_include_pad=True),
        b.avgpool(x, 3, 1, pads=1),
    ]
    for y in outs:
        b.output(y)
    model = b.build()
    inputs = zoo.sample_inputs(model)
    net = twin(model)
    actual = _torch_outputs(net, (torch.from_numpy(inputs["x"]),))
    assert_outputs_match(actual, onnxruntime_outputs(model, inputs), "windows")
    assert [o.shape for o in actual] == [y.shape for y in outs]


def test_weights_are_the_onnx_initializers():
    """Parameters and buffers hold the ONNX weights, float32, under their ONNX names."""
    from onnx import numpy_helper

    model = zoo.onnx_model("deepspeech2", reduced=True, seed=5)
    net = twin(model)
    tensors = dict(net.params.named_parameters()) | dict(net.params.named_buffers())
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert tensors and set(tensors) <= set(weights)
    for name, value in tensors.items():
        assert value.dtype == torch.float32
        np.testing.assert_array_equal(value.detach().numpy(), weights[name])
    buffers = dict(net.params.named_buffers())
    assert {n.rsplit("_", 1)[0] for n in buffers} >= {"bn_m", "bn_var"}
    assert not any(n.startswith(("w_", "lstm_kernel")) for n in buffers)  # weights: parameters
    # Shape, slice and index constants are Python values, not tensors.
    assert not any(v.dtype == np.int64 for n, v in weights.items() if n in tensors)


@pytest.mark.parametrize("name,overrides", TVM_IN_CI)
def test_pytorch_import_of_the_twin_matches_pytorch(name, overrides):
    _check_tvm(name, overrides)


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides", TVM_SLOW)
def test_slow_pytorch_import_of_the_twin_matches_pytorch(name, overrides):
    _check_tvm(name, overrides)


def _check_tvm(name: str, overrides: dict) -> None:
    """``frontend.load(twin, example_inputs)`` (``torch.export``), tvm-rtask's wavefront
    build on 2 vEUs, the same outputs as PyTorch's."""
    net, args = zoo.torch_model(name, reduced=True, **overrides)
    expected = _torch_outputs(net, args)
    mod = tvm_rtask.frontend.load(net, args)
    assert len(mod["main"].params) == len(args)  # the weights are constants
    ex = tvm_rtask.compile(mod, "llvm", policy="wavefront", num_veu=2)
    inputs = {f"input{i}": a.numpy() for i, a in enumerate(args)}
    assert_outputs_match(run_executable(ex, inputs), expected, name)


@pytest.mark.parametrize("name", ["bert_layer", "deepspeech2", "squeezenet"])
def test_twin_compiles_without_graph_breaks(name):
    """``torch.compile(fullgraph=True)`` refuses a graph break: the whole forward is one
    graph (``aot_eager``: Dynamo and AOTAutograd without Inductor's C++ build)."""
    net, args = zoo.torch_model(name, reduced=True)
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert_outputs_match(_torch_outputs(compiled, args), _torch_outputs(net, args), "aot")


@pytest.mark.slow
def test_twin_under_inductor_matches_onnxruntime():
    """Inductor's own kernels (a C++ compiler builds them: about 40 s)."""
    net, args = zoo.torch_model("bert_layer", reduced=True)
    model = zoo.onnx_model("bert_layer", reduced=True)
    compiled = torch.compile(net)
    with torch.inference_mode():
        actual = _torch_outputs(compiled, args)
    assert_outputs_match(actual, onnxruntime_outputs(model, zoo.sample_inputs(model)), "inductor")


def _one_node_model(op_type: str, **attrs):
    b = GraphBuilder("one_node")
    x = b.input("x", (1, 2, 4, 4))
    b.output(b.node(op_type, [x.name], (1, 2, 2, 2), **attrs), "y")
    return b.build()


@pytest.mark.parametrize(
    "op_type,attrs,error,match",
    [
        ("Exp", {}, UnsupportedOperator, r"node 'n_Exp_1' \(Exp\): the PyTorch twin has no Exp"),
        (
            "MaxPool",
            {"kernel_shape": [2, 2], "strides": [2, 2], "storage_order": 1},
            OptionError,
            r"node 'n_MaxPool_1' \(MaxPool\): .* attribute\(s\) storage_order",
        ),
        (
            "AveragePool",
            {"kernel_shape": [2, 2, 1], "strides": [2, 2, 1]},
            OptionError,
            r"node 'n_AveragePool_1' \(AveragePool\): only 2-D windows",
        ),
    ],
)
def test_what_the_builder_never_emits_is_a_one_line_error(op_type, attrs, error, match):
    with pytest.raises(error, match=match) as info:
        twin(_one_node_model(op_type, **attrs))
    assert "\n" not in str(info.value)


def test_a_constant_that_is_computed_is_an_option_error():
    b = GraphBuilder("computed_shape")
    x = b.input("x", (2, 3))
    shape = b.node("Identity", [b.const([3, 2], np.int64)], (2,))
    b.output(b.node("Reshape", [x.name, shape.name], (3, 2)), "y")
    with pytest.raises(OptionError, match=r"\(Reshape\): input 'identity_1' must be a constant"):
        twin(b.build())


def test_without_torch_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'tvm-rtask\[torch\]'"):
        zoo.torch_model("lstm_tc", reduced=True)
