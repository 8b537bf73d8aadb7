"""PyTorch peers' modules carry the ONNX model's weights: outputs against ONNX Runtime's."""

import numpy as np
import pytest

from bench.torch_modules import torch_module

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")


def _compare(name, model):
    from tvm_rtask.models.real import sample_inputs

    feed = sample_inputs(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feed)[0]
    module, source = torch_module(name, model, 2 if name.startswith("torchvision:") else 0)
    with torch.inference_mode():
        got = module(*[torch.from_numpy(v) for v in feed.values()]).numpy()
    assert expected.std() > 0.1  # outputs alive, not two near-zero tensors
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    return source


@pytest.mark.parametrize("name", ["resnet18", "vit_b_16"])
def test_torchvision_module_has_the_onnx_weights(name):
    pytest.importorskip("torchvision")
    from tvm_rtask.models.real import load_real_model

    assert _compare(name, load_real_model(name, "full", seed=3)) == "torchvision"


def test_zoo_model_runs_its_twin():
    from tvm_rtask import models

    assert _compare("vit_tiny", models.onnx_model("vit_tiny", seed=0)) == "twin"


def test_held_out_torchvision_model_exports_and_matches(tmp_path, monkeypatch):
    pytest.importorskip("torchvision")
    pytest.importorskip("onnxscript")
    from bench.peers import load_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = load_model("torchvision:squeezenet1_0", seed=2)
    assert model.graph.input[0].name == "input"
    assert not [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert _compare("torchvision:squeezenet1_0", model) == "torchvision"
    assert list(tmp_path.rglob("squeezenet1_0-2.onnx"))  # cached for the next process


def test_zero_initialised_weights_are_drawn_again():
    pytest.importorskip("torchvision")
    from bench.torch_modules import seeded_torchvision

    head = seeded_torchvision("vit_b_32").heads.head.weight  # torchvision zeroes it
    assert head.abs().max() > 0
