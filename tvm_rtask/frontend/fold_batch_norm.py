"""Inference batch norms with constant statistics folded into a convolution's weights, or into
one multiply-add per element where no convolution precedes them.

``DecomposeOpsForInference`` writes a batch norm as ``(x - mean) / sqrt(var + eps) * gamma +
beta``: four operations with four per-channel constants in the producer's epilogue, one of
them a vector division per element (the onnx package's ResNet-50: 2.5% of its time at 2
threads, DenseNet-121 2.4-2.6%; docs/frontend.md).

:class:`FoldBatchNorm` runs, on constants only:

1. TVM's ``FoldBatchnormToConv2D``: ``conv2d(x, W) -> batch_norm`` becomes ``conv2d(x, W * s)
   + t`` with ``s = gamma / sqrt(var + eps)``, ``t = beta - mean * s``;
2. :class:`BatchNormAsScaleShift` for the batch norms left (DenseNet's before its ReLU and
   convolution): ``x * s + t``, ``s`` and ``t`` computed here once;
3. ``FoldConstant``, so that the scaled weights are constants before the backends pack them.

A batch norm whose statistics are not constants is left to ``DecomposeOpsForInference``.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import TupleGetItemPattern, is_const, is_op, rewrite_call, wildcard


def _constant(values: np.ndarray) -> relax.Constant:
    return relax.const(np.ascontiguousarray(values, dtype="float32"))


@relax.transform.function_pass(opt_level=0, name="BatchNormAsScaleShift")
class BatchNormAsScaleShift:
    """``batch_norm(x, gamma, beta, mean, var)[0]`` with constant float32 parameters as
    ``x * s + t`` (``s``, ``t`` broadcast along the batch norm's axis)."""

    def __init__(self):
        self.data = wildcard()
        self.params = [is_const() for _ in range(4)]
        self.norm = is_op("relax.nn.batch_norm")(self.data, *self.params)
        self.pattern = TupleGetItemPattern(self.norm, 0)

    def transform_function(self, func, mod, ctx):  # noqa: D102 (the pass's hook)
        if func.attrs is not None and int(func.attrs.get("Primitive", 0)):
            return func

        def rewrite(expr, matches):
            data = matches[self.data]
            rank = getattr(data.ty, "ndim", -1)
            if rank < 1 or str(data.ty.dtype) != "float32":
                return expr
            gamma, beta, mean, var = (matches[p].value.numpy() for p in self.params)
            attrs = matches[self.norm].attrs
            axis = int(attrs.axis) % rank
            scale = gamma / np.sqrt(var + np.float32(float(attrs.epsilon)))
            shift = beta - mean * scale
            broadcast = [1] * rank
            broadcast[axis] = scale.shape[0]
            scaled = relax.op.multiply(data, _constant(scale.reshape(broadcast)))
            return relax.op.add(scaled, _constant(shift.reshape(broadcast)))

        return rewrite_call(self.pattern, rewrite, func)


def FoldBatchNorm() -> tvm.transform.Pass:  # noqa: N802 (a pass constructor, as TVM's)
    """The module docstring's three passes, in order."""
    return tvm.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),
            BatchNormAsScaleShift(),
            relax.transform.FoldConstant(),
        ],
        name="FoldBatchNorm",
    )
