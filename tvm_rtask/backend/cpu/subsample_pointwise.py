"""Strided 1x1 convolutions as a subsampling copy and a 1x1 convolution of stride 1 (CPU).

A 1x1 convolution of stride ``s`` reads every ``s``-th column of every ``s``-th row. The
rule ``Conv2dNCHW`` runs stride-1 1x1 convolutions as GEMMs over one pixel axis, but reads a
strided one's columns from a de-interleaved copy of its input rows, row tile by row tile:
ResNet-50's three downsampling convolutions took 4.3 ms of its 33 ms in the model, where
ONNX Runtime takes 2.1 ms. :class:`SubsamplePointwiseStride` rewrites
``conv2d(x, W, strides=s)`` (1x1, no padding, no dilation) into
``conv2d(strided_slice(x, strides=s), W)``: the copy is ``1 / s^2`` of the input, and the
convolution becomes a GEMM. The products and their order are the same, so the outputs are
bitwise equal. The pass runs in RTaskPrepare as the llvm backend's own pass, before
legalization (``CPUBackend.prepare_passes``).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...relax_exprs import ints, nchw_conv, op_name, rewrite_functions, static_shape_of


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.nn.conv2d":
            return call
        attrs = call.attrs
        strides = ints(attrs.strides)
        if (
            not nchw_conv(attrs)
            or strides == [1, 1]
            or any(ints(attrs.padding))
            or ints(attrs.dilation) != [1, 1]
        ):
            return call
        x, w = call.args
        x_shape, w_shape = static_shape_of(x), static_shape_of(w)
        if x_shape is None or w_shape is None or len(x_shape) != 4 or w_shape[2:] != [1, 1]:
            return call
        sliced = self.builder_.emit(
            relax.op.strided_slice(x, axes=[2, 3], begin=[0, 0], end=x_shape[2:], strides=strides)
        )
        return relax.op.nn.conv2d(
            sliced,
            w,
            strides=[1, 1],
            padding=[0, 0, 0, 0],
            dilation=[1, 1],
            groups=int(attrs.groups),
            data_layout="NCHW",
            kernel_layout="OIHW",
            out_dtype=attrs.out_dtype,
        )


@tvm.transform.module_pass(opt_level=0, name="SubsamplePointwiseStride")
class SubsamplePointwiseStride:
    """Rewrite strided 1x1 convolutions (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(mod, _Rewriter(mod))
