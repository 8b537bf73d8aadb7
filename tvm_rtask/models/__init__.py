"""The model zoo: the networks of the Rammer, IOS and Opara evaluations, built in code.

No download: every model is written with ``onnx.helper`` (through a small shape-tracking
builder) and given seeded random weights, so the same ``seed`` always gives the same model.
Each model is an ONNX ``ModelProto`` first (:func:`onnx_model`; save it with
``onnx.save``) and a Relax ``IRModule`` through :func:`tvm_rtask.frontend.load` (:func:`get`).
With PyTorch installed (``pip install tvm-rtask[torch]``), :func:`torch_model` gives the same
model, weights included, as a ``torch.nn.Module`` made from that ONNX graph (``torch_twin``).

``reduced=True`` gives a small variant of the same architecture (fewer layers, steps and
channels) that compiles and runs in seconds: what the tests use for numerics. Any
configuration value can be overridden by keyword (``get("lstm_tc", layers=2)``); see each
module's ``FULL`` and ``REDUCED`` dictionaries and docstring for the values and the source of
the architecture.

>>> import tvm_rtask.models as zoo
>>> zoo.names()[:3]
['alexnet', 'bert_layer', 'deepspeech2']
>>> mod, inputs = zoo.get("resnext29", batch=1, reduced=True)
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from ..errors import OptionError

__all__ = ["config", "describe", "get", "names", "onnx_model", "sample_inputs", "torch_model"]

# zoo name -> module of this package
_MODULES = {
    "alexnet": "alexnet",
    "bert_layer": "bert",
    "deepspeech2": "deepspeech2",
    "inception_v3": "inception_v3",
    "lstm_tc": "lstm_tc",
    "nasnet_cifar": "nasnet",
    "randwire": "randwire",
    "resnext29": "resnext",
    "seq2seq": "seq2seq",
    "squeezenet": "squeezenet",
    "vit_tiny": "vit",
}


def names() -> list[str]:
    """The zoo's model names, sorted."""
    return sorted(_MODULES)


def _module(name: str) -> ModuleType:
    if name not in _MODULES:
        raise OptionError(f"unknown model {name!r}; the zoo has: {', '.join(names())}")
    return importlib.import_module(f".{_MODULES[name]}", __name__)


def describe(name: str) -> str:
    """One line: the architecture and its source."""
    return _module(name).SUMMARY


def config(name: str, reduced: bool = False, **overrides: Any) -> dict[str, Any]:
    """The configuration ``name`` is built with (full or reduced, with ``overrides``)."""
    module = _module(name)
    cfg = {**module.FULL, **(module.REDUCED if reduced else {})}
    unknown = sorted(set(overrides) - set(cfg))
    if unknown:
        raise OptionError(
            f"model {name!r} has no setting {', '.join(unknown)}; its settings: "
            f"{', '.join(sorted(cfg))}"
        )
    cfg.update(overrides)
    return cfg


def onnx_model(name: str, batch: int = 1, reduced: bool = False, seed: int = 0, **overrides):
    """The model as an ``onnx.ModelProto`` with seeded random weights (static shapes)."""
    if not isinstance(batch, int) or batch < 1:
        raise OptionError(f"batch must be a positive integer, not {batch!r}")
    return _module(name).build(batch=batch, seed=seed, **config(name, reduced, **overrides))


def sample_inputs(model, seed: int = 1) -> dict:
    """Seeded standard-normal arrays for every input of an ONNX model, by input name."""
    from .onnx_light import random_inputs

    return random_inputs(model, seed=seed)


def get(name: str, batch: int = 1, reduced: bool = False, seed: int = 0, **overrides):
    """``(IRModule, inputs)``: the model imported into Relax, and seeded sample inputs
    (a dict of numpy arrays keyed by input name, in the order of ``main``'s parameters)."""
    from .. import frontend

    model = onnx_model(name, batch=batch, reduced=reduced, seed=seed, **overrides)
    return frontend.load(model), sample_inputs(model, seed=seed + 1)


def torch_model(name: str, batch: int = 1, reduced: bool = False, seed: int = 0, **overrides):
    """``(module, example_inputs)``: the model as an eval-mode ``torch.nn.Module`` with the
    weights of :func:`onnx_model` (its twin, made from the same ONNX graph, so the two cannot
    differ), and :func:`get`'s sample inputs as a tuple of tensors.

    Needs PyTorch (``pip install tvm-rtask[torch]``); the module exports with
    ``torch.export`` and compiles with ``torch.compile``.
    """
    try:
        import torch  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "tvm_rtask.models.torch_model needs PyTorch: pip install 'tvm-rtask[torch]'"
        ) from err
    from .torch_twin import example_inputs, twin

    model = onnx_model(name, batch=batch, reduced=reduced, seed=seed, **overrides)
    return twin(model), example_inputs(model, sample_inputs(model, seed=seed + 1))
