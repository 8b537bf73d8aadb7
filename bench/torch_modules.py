"""The PyTorch module a PyTorch peer runs, with the same weights as the ONNX model it is timed
against.

- torchvision's classifiers (``tvm_rtask.models.real``): torchvision's own module, as a PyTorch
  user runs it, with BatchNorm folded into the convolutions (``torch.fx``'s ``fuse``, what a
  latency-minded user of eager PyTorch does; the committed ONNX files were exported folded, so
  the weights map one to one) and the ONNX model's seeded weights loaded by name;
- ``torchvision:NAME``, any torchvision classifier outside that set (models nobody here tuned
  for): the module built again with the same seed as :func:`torchvision_onnx` built the one
  it exported, BatchNorm folded the same way;
- the zoo's models: their twins (``tvm_rtask.models.torch_twin``: the same ONNX graph);
- anything else: onnx2torch's conversion of the ONNX graph, where it can convert it.

Each returns ``(module, source)``; a model that cannot have a module raises
:class:`NoTorchModule` with the reason in one line.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

TORCHVISION = "torchvision:"

__all__ = ["NoTorchModule", "torch_module"]


class NoTorchModule(Exception):
    """No PyTorch module for this model here (a package missing, an operator not converted)."""


def _onnx_weights(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _torchvision_module(name: str, model):
    """torchvision's ``name`` (full size), BatchNorm folded, with ``model``'s weights.

    The export kept parameter names (a folded convolution's bias is ``<conv>.weight_bias``);
    the rest (linear layers that became ``MatMul`` against an unnamed ``val_<n>`` holding the
    transposed weight, ViT's class token) are the first unnamed initializers of their shape
    or its transpose, in the module's order."""
    import torch
    import torchvision
    from torch.fx.experimental.optimization import fuse

    module = fuse(getattr(torchvision.models, name)(weights=None).eval())
    weights = _onnx_weights(model)
    state = module.state_dict()
    loaded: dict[str, torch.Tensor] = {}
    unnamed = [
        w
        for w, a in weights.items()
        if w not in state and not w.endswith(".weight_bias") and a.dtype.kind == "f" and a.ndim
    ]
    for key, value in state.items():
        if not value.dtype.is_floating_point:
            continue
        source = key if key in weights else key.removesuffix(".bias") + ".weight_bias"
        if source not in weights:
            shape = tuple(value.shape)
            fits = [w for w in unnamed if weights[w].shape in (shape, shape[::-1])]
            if not fits:
                raise NoTorchModule(f"{name}: no ONNX weight for torchvision's {key}")
            source = fits[0]
            unnamed.remove(source)
        array = weights[source]
        if array.shape != tuple(value.shape) and array.ndim == 2:
            array = array.T
        if array.shape != tuple(value.shape):
            raise NoTorchModule(
                f"{name}: ONNX weight {source} {array.shape} does not fit {key} {value.shape}"
            )
        loaded[key] = torch.from_numpy(np.array(array, copy=True))
    module.load_state_dict(loaded, strict=False)
    return module.eval()


def _torchvision_works() -> bool:
    """torchvision is installed and built for this torch (the GPU machine has none)."""
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        return False
    return True


def seeded_torchvision(name: str, seed: int = 0):
    """torchvision's classifier ``name`` (``weights=None``, eval) with its own initialisation
    under ``torch.manual_seed(seed)``, except parameters it initialises to zeros (ViT's head:
    every output would be 0) drawn from N(0, 0.02); BatchNorm folded (``torch.fx``)."""
    import torch
    import torchvision
    from torch.fx.experimental.optimization import fuse

    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(weights=None).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim > 1 and not param.any():
                param.normal_(0.0, 0.02)
    try:
        return fuse(model)
    except Exception:  # noqa: BLE001 (not traceable by torch.fx: run it unfused)
        return model


def input_size(name: str) -> int:
    """The square input side torchvision's ``name`` is built for (Inception v3: 299)."""
    return 299 if name.startswith("inception") else 224


def torchvision_onnx(name: str, seed: int = 0):
    """``torchvision:NAME`` as an ``onnx.ModelProto``: :func:`seeded_torchvision` exported by
    ``torch.onnx.export`` (the ``torch.export`` exporter, opset 18, its optimiser on), batch 1,
    input ``input``; cached under ``$XDG_CACHE_HOME/tvm-rtask/torchvision`` by torch version and
    seed (exports take 5-60 s). Needs torch, torchvision and onnxscript."""
    import onnx
    import torch

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    path = cache / "tvm-rtask" / "torchvision" / torch.__version__ / f"{name}-{seed}.onnx"
    if not path.exists():
        if importlib.util.find_spec("onnxscript") is None:
            raise NoTorchModule("exporting torchvision models needs onnxscript")
        path.parent.mkdir(parents=True, exist_ok=True)
        size = input_size(name)
        module = seeded_torchvision(name, seed)
        example = (torch.randn(1, 3, size, size),)
        program = torch.onnx.export(
            module, example, dynamo=True, optimize=True, opset_version=18,
            input_names=["input"], output_names=["logits"],
        )  # fmt: skip
        partial = path.with_suffix(".partial")
        program.save(str(partial))
        partial.replace(path)
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    return model


def torch_module(name: str, model, seed: int = 0) -> tuple[object, str]:
    """``(module, source)`` for model ``name`` (its ONNX ``model`` gives the weights)."""
    from tvm_rtask import models as zoo
    from tvm_rtask.models.real import REAL_MODELS

    if name.startswith(TORCHVISION):
        return seeded_torchvision(name.removeprefix(TORCHVISION), seed), "torchvision"

    bare = name.removeprefix("real:")
    dims = model.graph.input[0].type.tensor_type.shape.dim
    full_size = len(dims) == 4 and dims[2].dim_value >= 224  # torchvision's own constructor
    if bare in REAL_MODELS and full_size and _torchvision_works():
        return _torchvision_module(bare, model), "torchvision"
    if name.removeprefix("zoo:") in zoo.names():
        from tvm_rtask.models.torch_twin import twin

        return twin(model), "twin"
    if importlib.util.find_spec("onnx2torch") is None:
        raise NoTorchModule("onnx2torch not installed")
    from onnx2torch import convert

    try:
        return convert(model).eval(), "onnx2torch"
    except Exception as err:
        from tvm_rtask.tir.rules import one_line

        raise NoTorchModule(f"onnx2torch cannot convert the model: {one_line(err)}") from err
