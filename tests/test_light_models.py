"""The onnx package's light architectures, random weights, against ONNX Runtime.

Each model is compiled by tvm-rtask under both policies and both barrier kinds; the outputs
(and the logits before the final softmax) must match ONNX Runtime with relative error < 1e-4
(max abs difference over max abs reference value).
"""

import pytest

import tvm_rtask
from tvm_rtask.testing.onnx_light import (
    assert_outputs_match,
    load_light_model,
    onnxruntime_outputs,
    random_inputs,
)
from tvm_rtask.testing.run import run_executable

IN_CI = ["squeezenet", "inception_v1", "shufflenet"]
SLOW = ["resnet50", "densenet121", "inception_v2", "bvlc_alexnet", "zfnet512", "vgg19"]
CONFIGS = [(p, b) for p in ("wavefront", "sequential") for b in ("fine", "global")]
# A sequential plan holds one operator per rProgram: no barrier between vEUs, so its two
# barrier kinds build the same waits; in CI it runs once (the slow set runs both).
CI_CONFIGS = [c for c in CONFIGS if c != ("sequential", "global")]


@pytest.fixture(scope="module")
def reference():
    cache = {}

    def get(name):
        if name not in cache:
            model = load_light_model(name, seed=0)
            inputs = random_inputs(model, seed=1)
            cache[name] = (model, inputs, onnxruntime_outputs(model, inputs))
        return cache[name]

    return get


def _check(name, policy, barrier, reference):
    model, inputs, expected = reference(name)
    ex = tvm_rtask.compile(model, "llvm", policy=policy, barrier=barrier, num_veu=2)
    actual = run_executable(ex, inputs)
    assert_outputs_match(actual, expected, (name, policy, barrier))


@pytest.mark.parametrize("policy,barrier", CI_CONFIGS)
@pytest.mark.parametrize("name", IN_CI)
def test_light_model_matches_onnxruntime(name, policy, barrier, reference):
    _check(name, policy, barrier, reference)


@pytest.mark.slow
@pytest.mark.parametrize("policy,barrier", CONFIGS)
@pytest.mark.parametrize("name", SLOW)
def test_slow_light_model_matches_onnxruntime(name, policy, barrier, reference):
    _check(name, policy, barrier, reference)


def test_inception_v1_plan_packs_operators_side_by_side(reference):
    model, _, _ = reference("inception_v1")
    report = tvm_rtask.plan(model, "llvm", policy="wavefront", num_veu=2).report()
    assert report["kernel_launches"] < report["operators"]
    assert report["max_ops_side_by_side"] >= 2
    assert report["barriers"] > 0
    sequential = tvm_rtask.plan(model, "llvm", policy="sequential", num_veu=2).report()
    assert sequential["kernel_launches"] == sequential["operators"]
    assert report["estimated_us"] >= report["ideal_us"] * (1 - 1e-9)
