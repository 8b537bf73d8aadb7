"""A model's inputs on the command line: ``--input-shapes``, ``.npz`` files of inputs and
outputs, and the arguments of ``main`` (given by name or position, the rest filled)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import CLIError

FILL_MODES = ("random", "zeros", "ones")
_SHAPE = r"([^\s:]+):\[([\d,\s]*)\]"


@dataclass
class InputInfo:
    name: str
    shape: list[int]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": self.shape, "dtype": self.dtype}


def parse_shapes(text: str | None) -> dict[str, list[int]] | None:
    """tvmc's ``--input-shapes`` syntax: ``"data:[1,3,224,224] mask:[1,128]"``."""
    if not text:
        return None
    shapes = {}
    for m in re.finditer(_SHAPE, text):
        dims = [d for d in m.group(2).replace(" ", "").split(",") if d]
        shapes[m.group(1)] = [int(d) for d in dims]
    leftover = re.sub(_SHAPE, "", text).strip(" ,")
    if not shapes or leftover:
        raise CLIError(
            f"cannot parse --input-shapes {text!r}; expected e.g. 'data:[1,3,224,224] mask:[1,8]'"
        )
    return shapes


def model_inputs(mod) -> list[InputInfo]:
    """The parameters of ``mod["main"]``: name, static shape and dtype of each."""
    from tvm import relax

    infos = []
    for p in mod["main"].params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType):
            raise CLIError(f"input {p.name!r} of the model is not a tensor ({ty})")
        infos.append(InputInfo(p.name, [int(v) for v in ty.shape.values], str(ty.dtype)))
    return infos


def fill_array(shape, dtype, mode: str, rng: np.random.Generator) -> np.ndarray:
    """An input nobody gave: zeros, ones, or random (integers in [0, 128), floats in [-1, 1))."""
    if mode == "zeros":
        return np.zeros(shape, dtype)
    if mode == "ones":
        return np.ones(shape, dtype)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(0, 128, shape).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(dtype)


def read_inputs(path: str | None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file by name (none when ``path`` is empty)."""
    if not path:
        return {}
    if not os.path.isfile(path):
        raise CLIError(f"inputs file {path!r} does not exist")
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except Exception as err:
        raise CLIError(f"cannot read inputs file {path!r} (expected .npz): {err}") from None


def arrange_inputs(
    infos: list[dict] | None, given: dict[str, np.ndarray], fill_mode: str, seed: int = 0
) -> list[np.ndarray]:
    """The arguments of ``main`` in order: given arrays by name (or by position when the
    npz uses numpy's ``arr_0`` names), the rest filled with ``fill_mode``."""
    rng = np.random.default_rng(seed)
    if infos is None:
        if not given:
            raise CLIError("this library has no tvm-rtask metadata: give every input with --inputs")
        return [given[k] for k in sorted(given, key=_natural_key)]
    names = [i["name"] for i in infos]
    positional = given and all(re.fullmatch(r"arr_\d+", k) for k in given)
    if positional:
        given = {names[int(k[4:])]: v for k, v in given.items() if int(k[4:]) < len(names)}
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise CLIError(f"input(s) {unknown} are not inputs of the model; its inputs: {names}")
    args = []
    for info in infos:
        shape, dtype = tuple(info["shape"]), info["dtype"]
        value = given.get(info["name"])
        if value is None:
            value = fill_array(shape, dtype, fill_mode, rng)
        if tuple(value.shape) != shape:
            raise CLIError(
                f"input {info['name']!r} has shape {tuple(value.shape)}, the model expects {shape}"
            )
        args.append(np.ascontiguousarray(value.astype(dtype, copy=False)))
    return args


def _natural_key(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def flatten_outputs(result) -> list[np.ndarray]:
    """The tensors of a VM result (a tensor or nested tuples of them) as numpy arrays."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    out = []
    for r in result:
        out.extend(flatten_outputs(r))
    return out


def save_outputs(path: str, outputs: list[np.ndarray]) -> None:
    """``output_0``, ``output_1``, ... in an ``.npz`` (the tvmc convention)."""
    np.savez(path, **{f"output_{i}": o for i, o in enumerate(outputs)})
