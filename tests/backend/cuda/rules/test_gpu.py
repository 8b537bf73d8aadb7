"""On a GPU: what the CUDA rules' kernels compute.

Marked ``gpu``: skipped (tests/conftest.py) where ``tvm.cuda(0)`` does not exist. Each
rule-scheduled convolution, built alone, against the kernel of TVM's default schedules
(dlight) for the same PrimFunc and against the unscheduled PrimFunc on the CPU; whole
models built by tvm-rtask with the rules (the rKernels made of them) against ONNX Runtime
and TVM's default CUDA build.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvm_rtask
from tvm_rtask import models as zoo
from tvm_rtask.backend.cuda.rkernel import schedule_for_cuda
from tvm_rtask.backend.cuda.rules import schedule_cuda_func
from tvm_rtask.relax_passes import as_target
from tvm_rtask.testing.onnx_light import (
    assert_outputs_match,
    load_light_model,
    onnxruntime_outputs,
    random_inputs,
)
from tvm_rtask.testing.run import run_executable

from .convs import CAPPED, TARGET, convs, random_args, run_on_cpu

pytestmark = pytest.mark.gpu
MODELS = ("squeezenet", "resnext29", "resnext29_grouped", "nasnet_cifar")


def _run_on_gpu(func, args: list[np.ndarray]) -> np.ndarray:
    dev = tvm.cuda(0)
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), CAPPED)
    lib = lib.jit() if hasattr(lib, "jit") else lib
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    lib["main"](*tensors)
    dev.sync()
    return tensors[-1].numpy()


@pytest.mark.parametrize("model", MODELS)
def test_rule_kernels_match_dlight_and_the_cpu(model):
    for name, func in convs(model).items():
        args = random_args(func)
        expected = run_on_cpu(func, args)
        scale = np.abs(expected).max()
        ours = _run_on_gpu(schedule_cuda_func(func, CAPPED), [a.copy() for a in args])
        theirs = _run_on_gpu(schedule_for_cuda(func, CAPPED, rules=False), args)
        np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4 * scale, err_msg=name)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * scale, err_msg=name)


def _onnx(model: str):
    if model == "squeezenet":
        return load_light_model("squeezenet")
    grouped = model.startswith("resnext29_grouped")
    name = "resnext29" if model.startswith("resnext29") else model
    extra = {"grouped": True} if grouped else {}
    return zoo.onnx_model(name, reduced=not model.endswith("_full"), **extra)


@pytest.mark.parametrize("policy", ["wavefront", "sequential"])
@pytest.mark.parametrize("model", [*MODELS, "resnext29_full"])
def test_models_with_the_rules_match_onnxruntime_and_tvm(model, policy):
    dev = tvm.cuda(0)
    onnx_model = _onnx(model)
    inputs = random_inputs(onnx_model)
    mod = tvm_rtask.frontend.load(onnx_model)
    expected = onnxruntime_outputs(onnx_model, inputs)
    default = run_executable(tvm.compile(mod, as_target(TARGET)), inputs, dev)
    ours = run_executable(
        tvm_rtask.compile(mod, TARGET, policy=policy, cuda_rules=True), inputs, dev
    )
    assert_outputs_match(ours, expected, (model, policy, "onnxruntime"))
    assert_outputs_match(ours, default, (model, policy, "tvm default"))
