"""Model import: ONNX (path or ModelProto), PyTorch (``torch.nn.Module`` with example
inputs, or ``torch.export.ExportedProgram``) or a Relax IRModule, checked for static shapes.

Names that are not C identifiers (ONNX's ``gpu_0/data_0``) are made safe wherever they would
reach generated source; ``main``'s parameters keep the model's input names (``names.py``).
"""

from __future__ import annotations

import os

import tvm
from tvm import relax

from ..errors import FrontendError
from .names import make_names_safe


def _check_static(mod: tvm.IRModule, hint: str) -> None:
    main = mod["main"]
    for param in main.params:
        ty = param.ty
        if isinstance(ty, relax.TensorType):
            dims = getattr(ty.shape, "values", None)
            if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
                raise FrontendError(
                    f"input {param.name!r} has a dynamic shape {ty}; "
                    + hint.format(name=param.name)
                )


_ONNX_HINT = "give a static one with shape_dict={{{name!r}: (...)}}"
_TORCH_HINT = "export with static shapes (no dynamic_shapes)"
_IRMODULE_HINT = "give main static input shapes"


def load(model, inputs=None, *, shape_dict: dict | None = None) -> tvm.IRModule:
    """An IRModule with a static-shape ``main`` from an ONNX path or ModelProto, a PyTorch
    module or exported program, or an IRModule.

    ``inputs`` is, for ONNX, the same as ``shape_dict`` (``{input name: shape}``, for inputs
    with dynamic dimensions); for a ``torch.nn.Module``, its example inputs (a tensor, a
    tuple of them, or a dict of keyword arguments), which fix the shapes.
    """
    from .torch import is_torch_model

    if isinstance(model, tvm.IRModule):
        mod, hint = model, _IRMODULE_HINT  # its shapes are its own: inputs are not used
    elif isinstance(model, (str, os.PathLike)) or type(model).__name__ == "ModelProto":
        if inputs is not None and shape_dict is not None:
            raise FrontendError("give the ONNX input shapes once (inputs or shape_dict)")
        from .onnx import load_onnx

        mod, hint = load_onnx(model, shape_dict if inputs is None else inputs), _ONNX_HINT
    elif is_torch_model(model):
        if shape_dict is not None:
            raise FrontendError(
                "shape_dict is for ONNX models; a PyTorch module takes example inputs"
            )
        from .torch import load_torch

        mod, hint = load_torch(model, inputs), _TORCH_HINT
    else:
        raise FrontendError(
            f"cannot load a model from {type(model).__name__}: give an .onnx path, an "
            "onnx.ModelProto, a torch.nn.Module with example inputs, a "
            "torch.export.ExportedProgram or a tvm.IRModule"
        )
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise FrontendError("the module has no 'main' function")
    _check_static(mod, hint)
    return make_names_safe(mod)
