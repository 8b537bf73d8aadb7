"""The model zoo: valid ONNX, deterministic, batched; numerics through tvm-rtask against ONNX
Runtime (reduced variants; relative error < 1e-4); the full-size variants built and planned
(slow)."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import tvm_rtask
import tvm_rtask.models as zoo
from tvm_rtask.errors import OptionError
from tvm_rtask.models._builder import GraphBuilder
from tvm_rtask.models._rnn import BasicLSTMCell, GateWiseLSTMCell, time_steps
from tvm_rtask.testing.onnx_light import assert_outputs_match, onnxruntime_outputs
from tvm_rtask.testing.run import run_executable

NAMES = [
    "alexnet",
    "bert_layer",
    "deepspeech2",
    "inception_v3",
    "lstm_tc",
    "nasnet_cifar",
    "randwire",
    "resnext29",
    "seq2seq",
    "squeezenet",
    "vit_tiny",
]
# (model, overrides, policy, barrier): compiled by tvm-rtask and run in CI; the policies and
# barrier kinds are spread over the models so that each is exercised.
IN_CI = [
    ("alexnet", {}, "wavefront", "fine"),
    ("bert_layer", {}, "wavefront", "global"),
    ("deepspeech2", {}, "wavefront", "fine"),
    ("lstm_tc", {}, "sequential", "fine"),
    ("seq2seq", {}, "wavefront", "fine"),
    ("squeezenet", {}, "wavefront", "fine"),
    ("resnext29", {"grouped": True}, "wavefront", "global"),
    ("vit_tiny", {}, "sequential", "fine"),
]
# Convolution-heavy reduced variants take 30 s to several minutes to compile on 2 cores.
SLOW = [
    ("resnext29", {}, "wavefront", "fine"),
    ("randwire", {}, "wavefront", "fine"),
    ("inception_v3", {}, "wavefront", "fine"),
    ("nasnet_cifar", {}, "wavefront", "fine"),
]


def _check_numerics(name, overrides, policy, barrier):
    model = zoo.onnx_model(name, reduced=True, **overrides)
    inputs = zoo.sample_inputs(model)
    expected = onnxruntime_outputs(model, inputs)
    ex = tvm_rtask.compile(model, "llvm", policy=policy, barrier=barrier, num_veu=2)
    actual = run_executable(ex, inputs)
    assert_outputs_match(actual, expected, name)


def test_names():
    assert zoo.names() == NAMES
    for name in NAMES:
        assert zoo.describe(name)


@pytest.mark.parametrize("name", NAMES)
def test_reduced_model_is_valid_onnx_and_batched(name):
    model = zoo.onnx_model(name, batch=2, reduced=True)
    onnx.checker.check_model(model, full_check=True)  # includes shape inference
    assert model.opset_import[0].version == 17
    inputs = zoo.sample_inputs(model)
    assert len(inputs) == 1
    (x,) = inputs.values()
    batch_axis = 1 if name in ("lstm_tc", "seq2seq") else 0  # (steps, batch, features)
    assert x.shape[batch_axis] == 2
    outputs = onnxruntime_outputs(model, inputs)
    assert all(np.isfinite(o).all() and np.abs(o).max() > 0 for o in outputs)
    # The declared output shapes are the ones ONNX Runtime produces.
    for info, out in zip(model.graph.output, outputs, strict=True):
        assert [d.dim_value for d in info.type.tensor_type.shape.dim] == list(out.shape)


def test_models_are_deterministic_per_seed():
    a = zoo.onnx_model("randwire", reduced=True, seed=3).SerializeToString()
    b = zoo.onnx_model("randwire", reduced=True, seed=3).SerializeToString()
    c = zoo.onnx_model("randwire", reduced=True, seed=4).SerializeToString()
    assert a == b
    assert a != c


def test_get_returns_a_relax_module_and_named_inputs():
    mod, inputs = zoo.get("bert_layer", batch=3, reduced=True)
    assert isinstance(mod, tvm.IRModule)
    params = mod["main"].params
    assert [p.name for p in params] == list(inputs)
    assert inputs["hidden_states"].shape == (3, 8, 16)
    assert inputs["hidden_states"].dtype == np.float32


def test_full_configs_follow_the_papers():
    assert zoo.config("lstm_tc") == {"layers": 10, "hidden": 256, "steps": 100}
    s2s = zoo.config("seq2seq")
    assert (s2s["encoder_layers"], s2s["decoder_layers"], s2s["hidden"]) == (8, 4, 128)
    r = zoo.config("resnext29")
    assert (r["cardinality"], r["bottleneck_width"], r["blocks"], r["image"]) == (16, 64, 3, 32)
    n = zoo.config("nasnet_cifar")
    # 6@768: N = 6 cells per stack; a normal cell of the last stack concatenates 6 branches
    # of filters * 4 channels.
    assert n["cells_per_stack"] == 6 and 6 * n["filters"] * 4 == 768
    b = zoo.config("bert_layer")
    assert (b["hidden"], b["heads"], b["intermediate"]) == (768, 12, 3072)


def test_bad_names_and_settings_are_option_errors():
    with pytest.raises(OptionError, match="unknown model 'resnet9000'"):
        zoo.get("resnet9000")
    with pytest.raises(OptionError, match="has no setting depth"):
        zoo.onnx_model("lstm_tc", depth=3)
    with pytest.raises(OptionError, match="batch"):
        zoo.onnx_model("lstm_tc", batch=0)


def _array(b: GraphBuilder, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in b.initializers if t.name == name)


@pytest.mark.parametrize("cell_class", [BasicLSTMCell, GateWiseLSTMCell])
def test_unrolled_lstm_cell_is_onnx_lstm(cell_class):
    """The unrolled cells compute what ONNX's own LSTM operator computes (forget bias 0),
    checked in ONNX Runtime: an independent reference for the recurrent models."""
    steps, batch, n_in, hidden = 4, 2, 5, 3
    b = GraphBuilder("unrolled", seed=7)
    x = b.input("x", (steps, batch, n_in))
    cell = cell_class(b, n_in, hidden, forget_bias=0.0)
    state = None
    for xt in time_steps(b, x, axis=0):
        h, state = cell(xt, state)
    b.output(h, "h")
    unrolled = b.build()

    if cell_class is BasicLSTMCell:
        kernel, bias = _array(b, cell.kernel), _array(b, cell.bias)
        wx = [kernel[:n_in, g * hidden : (g + 1) * hidden] for g in range(4)]  # i, j, f, o
        wh = [kernel[n_in:, g * hidden : (g + 1) * hidden] for g in range(4)]
        bs = [bias[g * hidden : (g + 1) * hidden] for g in range(4)]
    else:
        wx = [_array(b, w) for w in cell.w]
        wh = [_array(b, u) for u in cell.u]
        bs = [_array(b, v) for v in cell.bias]
    order = (0, 3, 2, 1)  # ONNX gate order i, o, f, c(= j)
    w = np.concatenate([wx[g].T for g in order])[None]
    r = np.concatenate([wh[g].T for g in order])[None]
    bb = np.concatenate([*(bs[g] for g in order), np.zeros(4 * hidden, np.float32)])[None]
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h"], hidden_size=hidden)],
        "onnx_lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, batch, n_in])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, batch, hidden])],
        [
            numpy_helper.from_array(a.astype(np.float32), n)
            for a, n in ((w, "W"), (r, "R"), (bb, "B"))
        ],
    )
    reference = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    reference.ir_version = 8  # what the installed onnxruntime accepts
    inputs = {"x": np.random.default_rng(0).standard_normal((steps, batch, n_in), np.float32)}
    (got,) = onnxruntime_outputs(unrolled, inputs)
    (want,) = onnxruntime_outputs(reference, inputs)
    np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,overrides,policy,barrier", IN_CI)
def test_reduced_model_matches_onnxruntime(name, overrides, policy, barrier):
    _check_numerics(name, overrides, policy, barrier)


def test_reduced_randwire_plans_into_one_rprogram():
    report = tvm_rtask.plan(zoo.get("randwire", reduced=True)[0], "llvm", num_veu=2).report()
    assert report["rprograms"] == 1
    assert report["max_ops_side_by_side"] >= 2


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides,policy,barrier", SLOW)
def test_slow_reduced_model_matches_onnxruntime(name, overrides, policy, barrier):
    _check_numerics(name, overrides, policy, barrier)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_full_size_model_plans(name):
    mod, inputs = zoo.get(name)
    report = tvm_rtask.plan(mod, "llvm", policy="wavefront", num_veu=2).report()
    assert report["operators"] > 0
    assert report["kernel_launches"] <= report["operators"]
    assert report["estimated_us"] >= report["ideal_us"] * (1 - 1e-9)
