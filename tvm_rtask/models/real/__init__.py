"""torchvision's classifiers as committed architecture-only ONNX files, with seeded weights.

Fifteen real architectures (ResNet-18/50, ResNeXt-50 32x4d, MobileNet v2 and v3 small,
EfficientNet-B0, RegNetY-400MF, ShuffleNet v2 1.0x, SqueezeNet 1.1, DenseNet-121, GoogLeNet,
Inception v3, MNASNet 0.5, ConvNeXt-T, ViT-B/16) exported once from torchvision by
a one-time exporter (removed; git history keeps ``bench/export_real_models.py``) at two sizes:

- ``"full"``: torchvision's model, 1x3x224x224 (Inception v3 299x299), 1000 classes;
- ``"reduced"``: the same operator kinds, a small input and, where torchvision's constructors
  allow it, fewer and narrower layers, 10 classes: what the tests compile.

The files hold no weights: each weight is a ``ConstantOfShape`` node of its shape, which
:func:`load_real_model` replaces by seeded random values (He-scaled convolutions and dense
layers, normalisation scales near one: ``tvm_rtask.models.onnx_light.materialize_weights``),
so no PyTorch is needed to use them. ``models.json`` next to this file lists each model's
input, output, configuration, operator counts and the torchvision version.

>>> from tvm_rtask.models.real import REAL_MODELS, load_real_model
>>> model = load_real_model("resnet18", size="reduced", seed=0)   # onnx.ModelProto
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from ...errors import OptionError

__all__ = [
    "REAL_MODELS",
    "SIZES",
    "describe",
    "load_real_model",
    "real_model_path",
    "sample_inputs",
]

# torchvision's names, in the order of models.json
REAL_MODELS = (
    "resnet18",
    "resnet50",
    "resnext50_32x4d",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "regnet_y_400mf",
    "shufflenet_v2_x1_0",
    "squeezenet1_1",
    "densenet121",
    "googlenet",
    "inception_v3",
    "mnasnet0_5",
    "convnext_tiny",
    "vit_b_16",
)
SIZES = ("reduced", "full")

_HERE = os.path.dirname(os.path.abspath(__file__))


def _check(name: str, size: str) -> None:
    if name not in REAL_MODELS:
        raise OptionError(f"unknown real model {name!r}; known: {', '.join(REAL_MODELS)}")
    if size not in SIZES:
        raise OptionError(f"size must be one of {', '.join(SIZES)}, not {size!r}")


def real_model_path(name: str, size: str = "reduced") -> str:
    """Path of the architecture-only ONNX file (``ConstantOfShape`` weights)."""
    _check(name, size)
    return os.path.join(_HERE, size, f"{name}.onnx")


@functools.cache
def _index() -> dict[str, Any]:
    with open(os.path.join(_HERE, "models.json")) as f:
        return json.load(f)


def describe(name: str, size: str | None = None) -> dict[str, Any]:
    """What ``models.json`` records about ``name``: summary, reduced configuration and, per
    size, input and output shapes, parameters, operator counts; with ``size``, that size's."""
    _check(name, size or "reduced")
    entry = _index()["models"][name]
    return dict(entry[size]) if size else dict(entry)


def load_real_model(name: str, size: str = "reduced", seed: int = 0):
    """``name`` at ``size`` as an ``onnx.ModelProto`` with seeded random weights.

    The graph input is ``input`` (1x3xHxW float32), the output ``logits`` (torchvision's
    classifiers end in a linear layer: no softmax to saturate). The same ``seed`` gives the
    same weights.
    """
    import onnx

    from ..onnx_light import materialize_weights

    model = onnx.load(real_model_path(name, size))
    materialize_weights(model, seed)
    onnx.checker.check_model(model)
    return model


def sample_inputs(model, seed: int = 1):
    """Seeded standard-normal values for the model's input, by name."""
    from ..onnx_light import random_inputs

    return random_inputs(model, seed=seed)
