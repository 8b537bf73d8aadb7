"""ONNX import: a path or ``onnx.ModelProto`` to a Relax module with constant weights."""

from __future__ import annotations

import os

import tvm
from tvm import relax

from ..errors import FrontendError
from .fold_batch_norm import FoldBatchNorm


def load_onnx(model, shape_dict: dict | None) -> tvm.IRModule:
    """The Relax module of ``model``, weights as constants, batch norms folded
    (``frontend/fold_batch_norm.py``), decomposed for inference.

    ``main``'s parameters carry the ONNX input names unchanged (TVM's own renaming, which
    turns ``input.1`` into ``input_1``, is off): a caller passes inputs by those names.
    """
    import onnx

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise FrontendError(f"model file {path!r} does not exist")
        try:
            model = onnx.load(path)
        except Exception as err:  # onnx raises DecodeError and friends
            raise FrontendError(
                f"{path!r} is not a readable ONNX model (malformed or truncated): {err}"
            ) from err
    try:
        onnx.checker.check_model(model)
    except Exception as err:
        raise FrontendError(f"the ONNX model is invalid: {err}") from err
    from tvm.relax.frontend.onnx import from_onnx

    try:
        mod = from_onnx(
            model, shape_dict=shape_dict, keep_params_in_input=False, sanitize_input_names=False
        )
    except Exception as err:
        raise FrontendError(f"TVM could not import the ONNX model: {err}") from err
    # batch norms of constant statistics folded first (into the convolution's weights where
    # one precedes them), what is left decomposed
    passes = [FoldBatchNorm(), relax.transform.DecomposeOpsForInference()]
    return tvm.transform.Sequential(passes)(mod)
