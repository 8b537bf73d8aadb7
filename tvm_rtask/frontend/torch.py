"""PyTorch import (optional: ``pip install tvm-rtask[torch]``): ``torch.export`` then TVM's
Relax importer, parameters bound as constants, decomposed for inference."""

from __future__ import annotations

import sys

import tvm
from tvm import relax

from ..errors import FrontendError
from .fold_batch_norm import FoldBatchNorm


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message (its class name if none)."""
    for line in str(err).splitlines():
        if line.strip():
            return line.strip()
    return type(err).__name__


def is_torch_model(model) -> bool:
    """A ``torch.nn.Module`` or ``torch.export.ExportedProgram`` (never imports torch: an
    object of those classes exists only once torch is imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    classes = [torch.nn.Module]
    export = getattr(torch, "export", None)
    if export is not None and hasattr(export, "ExportedProgram"):
        classes.append(export.ExportedProgram)
    return isinstance(model, tuple(classes))


def _example_args(example_inputs) -> tuple[tuple, dict]:
    """``torch.export.export``'s positional and keyword arguments from a tensor, a tuple or
    list of them, or a dict of keyword arguments; NumPy arrays become tensors."""
    import numpy as np
    import torch

    def tensor(value):
        return torch.from_numpy(value) if isinstance(value, np.ndarray) else value

    if isinstance(example_inputs, (torch.Tensor, np.ndarray)):
        return (tensor(example_inputs),), {}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(tensor(v) for v in example_inputs), {}
    if isinstance(example_inputs, dict):
        return (), {k: tensor(v) for k, v in example_inputs.items()}
    raise FrontendError(
        f"example inputs must be a tensor, a tuple or list of tensors or a dict of keyword "
        f"arguments, not {type(example_inputs).__name__}"
    )


def load_torch(model, example_inputs) -> tvm.IRModule:
    """The Relax module of a ``torch.nn.Module`` exported with ``example_inputs`` (in eval
    mode, whatever mode it is in; its mode is restored), or of an ``ExportedProgram``.

    ``main`` takes the user inputs (the names of ``forward``'s arguments) and returns one
    tensor, or a tuple for several outputs; parameters and buffers are constants.
    """
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        if example_inputs is not None:
            raise FrontendError(
                "an ExportedProgram was exported with its own inputs: give no example inputs"
            )
        program = model
    else:
        if example_inputs is None:
            raise FrontendError(
                f"a torch.nn.Module ({type(model).__name__}) needs example inputs: "
                "load(module, (x,))"
            )
        args, kwargs = _example_args(example_inputs)
        training = model.training
        model.eval()
        try:
            program = torch.export.export(model, args, kwargs)
        except Exception as err:
            raise FrontendError(
                f"torch.export could not export {type(model).__name__}: {first_line(err)}"
            ) from err
        finally:
            model.train(training)
    from tvm.relax.frontend.torch import from_exported_program

    try:
        mod = from_exported_program(
            program, keep_params_as_input=False, unwrap_unit_return_tuple=True
        )
    except Exception as err:
        raise FrontendError(
            f"TVM could not import the exported PyTorch program: {first_line(err)}"
        ) from err
    # The importer leaves tuple plumbing behind (batch norm's running statistics, max
    # pooling's unused indices as zeros_like): canonicalize, then drop what nobody reads.
    passes = [
        FoldBatchNorm(),
        relax.transform.DecomposeOpsForInference(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ]
    return tvm.transform.Sequential(passes)(mod)
