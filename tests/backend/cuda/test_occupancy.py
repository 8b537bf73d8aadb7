"""The co-residency check of persistent kernels (``verify_occupancy``), through nvcc."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from tvm import relax

import tvm_rtask

TARGET = {"kind": "cuda", "arch": "sm_90"}


def _conv_relu():
    """One 3x3 convolution + ReLU that dlight schedules with 128 threads per block."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 32, 32), "float32"))
    weight = np.random.default_rng(0).random((32, 16, 3, 3), "float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), padding=1))
            z = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(z)
    return bb.get()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_capacity_counts_the_persistent_kernels_own_block_size():
    """The vEUs of a model whose kernels all use 128 threads are blocks of 128 threads: the
    check must not count them as blocks of the cuda_threads default (256), which refused a
    plan that fits (a GPU window's one-operator builds of RandWire)."""
    mod = _conv_relu()
    plan = tvm_rtask.plan(mod, TARGET, policy="sequential")
    assert plan.vdevice.threads == 128
    ex = tvm_rtask.compile(mod, TARGET, policy="sequential")
    assert ex is not None
