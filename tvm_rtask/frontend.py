"""Model import: ONNX (path or ModelProto) or a Relax IRModule, checked for static shapes."""

from __future__ import annotations

import os

import tvm
from tvm import relax

from .errors import FrontendError


def _load_onnx(model, shape_dict):
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
        mod = from_onnx(model, shape_dict=shape_dict, keep_params_in_input=False)
    except Exception as err:
        raise FrontendError(f"TVM could not import the ONNX model: {err}") from err
    return relax.transform.DecomposeOpsForInference()(mod)


def _check_static(mod: tvm.IRModule) -> None:
    main = mod["main"]
    for param in main.params:
        ty = param.ty
        if isinstance(ty, relax.TensorType):
            dims = getattr(ty.shape, "values", None)
            if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
                raise FrontendError(
                    f"input {param.name!r} has a dynamic shape {ty}; give a static one with "
                    f"shape_dict={{{param.name!r}: (...)}}"
                )


def load(model, shape_dict: dict | None = None) -> tvm.IRModule:
    """An IRModule with a static-shape ``main`` from an ONNX path, ModelProto or IRModule."""
    if isinstance(model, tvm.IRModule):
        mod = model
    elif isinstance(model, (str, os.PathLike)) or type(model).__name__ == "ModelProto":
        mod = _load_onnx(model, shape_dict)
    else:
        raise FrontendError(
            f"cannot load a model from {type(model).__name__}: give an .onnx path, an "
            "onnx.ModelProto or a tvm.IRModule"
        )
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise FrontendError("the module has no 'main' function")
    _check_static(mod)
    return mod
