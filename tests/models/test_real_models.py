"""torchvision's architectures (tvm_rtask.models.real), seeded weights, against ONNX Runtime.

The committed files hold the architecture only; the tests check that they stay small and
weightless, that the seeded weights keep every activation in range (ONNX Runtime), and that
each reduced model compiled by tvm-rtask (llvm, wavefront, 2 vEUs) matches ONNX Runtime with
relative error < 1e-4. CI compiles the cheapest few; the others, the CUDA builds (sm_90,
nvcc without a GPU) and the full sizes are ``slow``.
"""

import json
import os

import numpy as np
import onnx
import pytest

import tvm_rtask
from tvm_rtask.errors import OptionError
from tvm_rtask.models.real import (
    REAL_MODELS,
    SIZES,
    describe,
    load_real_model,
    real_model_path,
    sample_inputs,
)
from tvm_rtask.testing.onnx_light import assert_outputs_match, onnxruntime_outputs
from tvm_rtask.testing.run import run_executable

# compiled in CI (SE + hard-swish, attention): each 45-70 s on the loaded 2-core machine
IN_CI = ("mobilenet_v3_small", "vit_b_16")


def _case(name):
    return pytest.param(name, marks=[] if name in IN_CI else [pytest.mark.slow])


@pytest.fixture(scope="module")
def reference():
    cache = {}

    def get(name):
        if name not in cache:
            model = load_real_model(name, "reduced", seed=0)
            inputs = sample_inputs(model, seed=1)
            cache[name] = (model, inputs, onnxruntime_outputs(model, inputs))
        return cache[name]

    return get


def test_table_matches_the_committed_files():
    with open(os.path.join(os.path.dirname(real_model_path("resnet18")), "..", "models.json")) as f:
        index = json.load(f)
    assert tuple(index["models"]) == REAL_MODELS
    assert index["source"].startswith("torchvision ")
    for name in REAL_MODELS:
        for size in SIZES:
            path = real_model_path(name, size)
            assert os.path.getsize(path) < 400_000, (name, size)  # no weights: KBs
            info = describe(name, size)
            assert info["input"][:2] == [1, 3] and info["output"][0] == 1
    with pytest.raises(OptionError):
        real_model_path("resnet19")
    with pytest.raises(OptionError):
        real_model_path("resnet18", "tiny")


@pytest.mark.parametrize("size", SIZES)
def test_files_hold_no_weights(size):
    for name in REAL_MODELS:
        graph = onnx.load(real_model_path(name, size)).graph
        floats = [
            t.name
            for t in graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) > 1
        ]
        assert not floats, (name, size, floats[:3])
        assert any(n.op_type == "ConstantOfShape" for n in graph.node), name


def test_seeded_weights_are_deterministic():
    a = load_real_model("squeezenet1_1", seed=3)
    b = load_real_model("squeezenet1_1", seed=3)
    c = load_real_model("squeezenet1_1", seed=4)
    assert a.SerializeToString() == b.SerializeToString()
    assert a.SerializeToString() != c.SerializeToString()
    assert not any(n.op_type == "ConstantOfShape" for n in a.graph.node)
    info = describe("squeezenet1_1", "reduced")
    assert [d.dim_value for d in a.graph.input[0].type.tensor_type.shape.dim] == info["input"]


def _activation_ranges(model, inputs):
    """Max |value| of the output and of every intermediate float tensor (ONNX Runtime)."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    outputs = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name in inferred and name not in outputs:
                probe.graph.output.append(inferred[name])
                outputs.add(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), options, ["CPUExecutionProvider"])
    values = session.run(None, inputs)
    return {
        o.name: float(np.max(np.abs(v)))
        for o, v in zip(session.get_outputs(), values, strict=True)
        if v.size and v.dtype.kind == "f"
    }


@pytest.mark.parametrize("name", REAL_MODELS)
def test_reduced_activations_stay_in_range(name, reference):
    model, inputs, _ = reference(name)
    ranges = _activation_ranges(model, inputs)
    assert ranges["logits"] > 0.1, ranges["logits"]
    low = min(ranges, key=ranges.get)
    high = max(ranges, key=ranges.get)
    assert ranges[low] > 1e-3 and ranges[high] < 1e3, (low, ranges[low], high, ranges[high])


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_MODELS)
def test_full_size_activations_stay_in_range(name):
    model = load_real_model(name, "full")
    ranges = _activation_ranges(model, sample_inputs(model))
    assert ranges["logits"] > 0.1, ranges["logits"]
    # deep residual stacks grow without trained BatchNorms (full MNASNet 0.5: 1.6e4)
    assert 1e-3 < min(ranges.values()) and max(ranges.values()) < 1e6


@pytest.mark.parametrize("name", [_case(n) for n in REAL_MODELS])
def test_reduced_model_matches_onnxruntime(name, reference):
    model, inputs, expected = reference(name)
    assert float(np.max(np.abs(expected[0]))) > 0.1  # a reference far from zero
    ex = tvm_rtask.compile(model, "llvm", policy="wavefront", num_veu=2)
    assert_outputs_match(run_executable(ex, inputs), expected, name)


FUSIONS = ("fuseops", "stitch", "none")
LAYOUTS = ("nchwc", "nchw")
POLICIES = ("wavefront", "sequential", "ios", "opara", "wavefront_global")


def _options(i: int) -> dict:
    """The i-th of every fusion x layout x policy x vEU count, with the NaN fill: any read
    of memory no kernel wrote shows as NaN."""
    fusion, layout, policy, veus = (
        FUSIONS[i % 3],
        LAYOUTS[(i // 3) % 2],
        POLICIES[(i // 6) % 5],
        (2, 1)[(i // 30) % 2],
    )
    return {"fusion": fusion, "cpu_layout": layout, "policy": policy, "num_veu": veus}


def _option_cases():
    """CI: each model under one combination, chosen so that the 15 models together meet
    every fusion, layout and policy (model k takes fusion k % 3 and policy k % 5: 15
    distinct pairs); ``slow``: every model under all 60 combinations."""
    cases = []
    for k, name in enumerate(REAL_MODELS):
        ci = k % 3 + 3 * ((k // 3) % 2) + 6 * (k % 5) + 30 * (k % 2)
        for i in range(60):
            marks = [] if i == ci else [pytest.mark.slow]
            cases.append(pytest.param(name, _options(i), marks=marks, id=f"{name}-{i}"))
    return cases


@pytest.mark.parametrize("name, options", _option_cases())
def test_reduced_model_matches_onnxruntime_under_options(name, options, reference):
    """Every option a user can set changes what is built: each combination against ONNX
    Runtime, with every tensor and workspace NaN before each call, called twice (the second
    call meets what the first left in memory)."""
    model, inputs, expected = reference(name)
    ex = tvm_rtask.compile(model, "llvm", nan_fill=True, **options)
    for _ in range(2):
        assert_outputs_match(run_executable(ex, inputs), expected, (name, options))


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_MODELS)
def test_full_size_model_matches_onnxruntime_with_nan_fill(name):
    model = load_real_model(name, "full", seed=0)
    inputs = sample_inputs(model, seed=1)
    expected = onnxruntime_outputs(model, inputs)
    ex = tvm_rtask.compile(model, "llvm", nan_fill=True)
    assert_outputs_match(run_executable(ex, inputs), expected, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_MODELS)
def test_reduced_model_builds_for_cuda_sm90(name, tmp_path):
    """The CUDA build (sm_90) of each reduced model, nvcc -ptx without a GPU: the checks of
    tests/cuda/test_codegen.py. Compile times: docs/compile-time.md."""
    from tests.cuda.test_codegen import NVCC, _check

    if not NVCC:
        pytest.skip("nvcc not found")
    _check(load_real_model(name, "reduced"), "sm_90", tmp_path)
