"""tvm-rtask's outputs against independent references: ONNX Runtime (always) and TVM's own
build (where it agrees with ONNX Runtime).

The models and their seeded weights and inputs live in :mod:`tvm_rtask.models.onnx_light`
(re-exported here, so that a test imports one module for both).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..models.onnx_light import (
    LIGHT_MODELS,
    light_model_path,
    load_light_model,
    materialize_weights,
    random_inputs,
    strip_weights,
)

__all__ = [
    "LIGHT_MODELS",
    "ReferenceCheck",
    "assert_outputs_match",
    "check_against_references",
    "light_model_path",
    "load_light_model",
    "materialize_weights",
    "max_relative_error",
    "onnxruntime_outputs",
    "random_inputs",
    "relative_error",
    "strip_weights",
]


def onnxruntime_outputs(model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs from ONNX Runtime on the CPU: the independent reference."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, inputs)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual - expected| / max |expected| (0 when both are zero)."""
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    diff = float(np.max(np.abs(actual.astype(np.float64) - expected))) if expected.size else 0.0
    return diff / scale if scale else diff


def max_relative_error(actual: list[np.ndarray], expected: list[np.ndarray]) -> float:
    """The largest :func:`relative_error` over outputs; inf when the counts or shapes differ
    or a value is not finite."""
    if len(actual) != len(expected):
        return float("inf")
    worst = 0.0
    for a, e in zip(actual, expected, strict=True):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape or not np.isfinite(a).all():
            return float("inf")
        if e.size:
            worst = max(worst, relative_error(a, e))
    return worst


def assert_outputs_match(actual, expected, label, tolerance: float = 1e-4) -> None:
    """Every output has the reference's shape, is finite and is within ``tolerance`` of it
    (:func:`relative_error`); ``label`` names the case in the failure message."""
    assert len(actual) == len(expected), (label, len(actual), len(expected))
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape, (label, a.shape, e.shape)
        assert np.isfinite(a).all(), label
        assert relative_error(a, e) < tolerance, (label, relative_error(a, e))


@dataclass(frozen=True)
class ReferenceCheck:
    """tvm-rtask's outputs against two references: ONNX Runtime on the CPU (independent, and
    always required) and TVM's own build of the same target (required only where it agrees
    with ONNX Runtime: TVM 0.27's CUDA build of light ShuffleNet is wrong and differs from
    run to run, docs/gpu.md, "What holds now"). The GPU tests assert :attr:`ok`; the GPU window
    records the same fields."""

    ort_rel_err: float  # tvm-rtask against ONNX Runtime
    rel_err: float  # tvm-rtask against TVM's build
    tvm_ort_rel_err: float  # TVM's build against ONNX Runtime
    tolerance: float

    @property
    def tvm_agrees(self) -> bool:
        return self.tvm_ort_rel_err < self.tolerance

    @property
    def ok(self) -> bool:
        return self.ort_rel_err < self.tolerance and (
            self.rel_err < self.tolerance or not self.tvm_agrees
        )


def check_against_references(
    actual, onnx_runtime, tvm_build, tolerance: float = 1e-4
) -> ReferenceCheck:
    """:class:`ReferenceCheck` of ``actual`` (tvm-rtask's outputs) against ONNX Runtime's and
    TVM's; a missing, misshapen or non-finite output is an infinite error."""
    return ReferenceCheck(
        ort_rel_err=max_relative_error(actual, onnx_runtime),
        rel_err=max_relative_error(actual, tvm_build),
        tvm_ort_rel_err=max_relative_error(tvm_build, onnx_runtime),
        tolerance=tolerance,
    )
