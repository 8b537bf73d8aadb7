"""Concatenations that copy nothing: each input is written in place inside the output.

With batch 1, a concatenation along channels (every axis before the concatenated one of
extent 1) lays each input out as one contiguous block of its output. When every input is a
workspace of the rProgram (written and read only inside it), read by no other such
concatenation and passed once, the input can be a view of the output at its block's
offset: its producer writes there, its other readers read there, and the concatenation's
rTasks have nothing left to do. SqueezeNet's fire modules, GoogLeNet's and Inception's
branches end in such concatenations; ONNX Runtime copies them.

The dispatcher keeps the concatenation's place in every vEU's script (its signals count its
rTasks, which other vEUs may wait for) and emits no run of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...tir.common import TensorDecl

# the PrimFunc names Relax's legalization gives R.concat, unfused with anything else (a
# concatenation of independent branches keeps its own kernel: ``fuse.py``'s ``_join``)
CONCAT_FUNC = re.compile(r"concatenate\d*(_join)?")


@dataclass
class ConcatViews:
    """Tensors that are views of another (name -> (home, element offset)) and the
    concatenations left with nothing to do."""

    views: dict[str, tuple[str, int]] = field(default_factory=dict)
    elided: set[str] = field(default_factory=set)


def _blocks(output: TensorDecl, inputs: list[TensorDecl]) -> list[int] | None:
    """Element offsets of ``inputs`` inside ``output`` when they concatenate into it as
    contiguous blocks, else None."""
    rank = len(output.shape)
    if rank == 0 or any(len(t.shape) != rank or t.dtype != output.dtype for t in inputs):
        return None
    differ = {a for t in inputs for a in range(rank) if t.shape[a] != output.shape[a]}
    axis = min(differ) if differ else 0
    if len(differ) > 1 or any(int(d) != 1 for d in output.shape[:axis]):
        return None
    if sum(int(t.shape[axis]) for t in inputs) != int(output.shape[axis]):
        return None
    inner = 1
    for d in output.shape[axis + 1 :]:
        inner *= int(d)
    offsets, at = [], 0
    for t in inputs:
        offsets.append(at * inner)
        at += int(t.shape[axis])
    return offsets


def concat_views(
    ops: Iterable, tensors: dict[str, TensorDecl], workspaces: Iterable[str]
) -> ConcatViews:
    """Which concatenations among ``ops`` (``ROperator``s of one rProgram) need no copy.

    ``tensors``: every tensor of the program by name; ``workspaces``: the names of those
    that live and die inside it."""
    local = set(workspaces)
    out = ConcatViews()
    for op in ops:
        if not CONCAT_FUNC.fullmatch(op.func) or len(op.outputs) != 1 or not op.inputs:
            continue
        names = list(op.inputs)
        if len(set(names)) != len(names) or any(n not in local or n in out.views for n in names):
            continue
        offsets = _blocks(tensors[op.outputs[0]], [tensors[n] for n in names])
        if offsets is None:
            continue
        for name, offset in zip(names, offsets, strict=True):
            out.views[name] = (op.outputs[0], offset)
        out.elided.add(op.name)
    # a view of a tensor that is itself a view: point at the final home
    for name, (home, offset) in list(out.views.items()):
        while home in out.views:
            home, more = out.views[home]
            offset += more
        out.views[name] = (home, offset)
    return out
