"""Arenas: tensors packed into one buffer per dtype at fixed offsets (CUDA: the workspaces of
an rProgram and the weights it reads; llvm: the weights it reads).

Without them each workspace is a parameter of the persistent kernel: NASNet's rPrograms took
about 800 pointer parameters each, and TVM's host passes (MakePackedAPI's per-argument
checks, their simplification and lowering) spent seconds on them. With arenas the kernel
takes the program's inputs and outputs plus one pointer per dtype, and a workspace is a view
of its arena at a constant element offset. An rKernel body shared by several operators reads
a workspace operand's offset from a constant table indexed by the operator (see
``dispatch.py``), instead of choosing between pointer parameters.

The model's weights that a program reads are packed the same way, into constant arenas
(``arena_tensor``): they were most of the remaining parameters (NASNet: about 500 per
rProgram).

Offsets are aligned to 256 bytes (the alignment of TVM's own allocations, enough for every
vector access a scheduled kernel makes), and an arena stays below 2**31 elements so that
its indices are int32 like the rest of the kernel's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..tir.common import TensorDecl

ALIGN_BYTES = 256
MAX_ELEMENTS = 2**31 - 1


@dataclass
class Arena:
    """One buffer of ``dtype`` holding ``members`` (workspace, element offset)."""

    name: str
    dtype: str
    members: list[tuple[TensorDecl, int]] = field(default_factory=list)
    size: int = 0  # elements

    @property
    def decl(self) -> TensorDecl:
        return TensorDecl(self.name, (max(self.size, 1),), self.dtype)

    @property
    def offsets(self) -> dict[str, int]:
        """Member name -> element offset (as ``core.memory.Arena``)."""
        return {t.name: off for t, off in self.members}


def _numel(t: TensorDecl) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


def _itemsize(dtype: str) -> int:
    return max(1, np.dtype(dtype).itemsize) if dtype != "bool" else 1


def plan_arenas(workspaces: list[TensorDecl], prefix: str = "rtask_arena") -> list[Arena]:
    """Pack ``workspaces`` (first-use order) into arenas, one per dtype (more when one would
    pass 2**31 elements). Tensors of a dtype numpy does not know stay out (returned in no
    arena; the caller keeps them as parameters)."""
    arenas: list[Arena] = []
    current: dict[str, Arena] = {}
    for t in workspaces:
        try:
            item = _itemsize(t.dtype)
        except TypeError:
            continue
        if ALIGN_BYTES % item:
            continue
        align = ALIGN_BYTES // item
        n = _numel(t)
        arena = current.get(t.dtype)
        start = 0 if arena is None else -(-arena.size // align) * align
        if arena is None or start + n > MAX_ELEMENTS:
            if n > MAX_ELEMENTS:
                continue
            arena = Arena(f"{prefix}_{t.dtype}_{len(arenas)}", t.dtype)
            arenas.append(arena)
            current[t.dtype] = arena
            start = 0
        arena.members.append((t, start))
        arena.size = start + n
    return arenas


def arena_of(arenas: list[Arena]) -> dict[str, tuple[Arena, int]]:
    """Workspace name -> (its arena, its element offset)."""
    return {t.name: (a, off) for a in arenas for t, off in a.members}


def arena_tensor(arena: Arena, values: dict[str, np.ndarray]):
    """The contents of an arena of constants as a TVM tensor (for ``relax.const``): each
    member's values at its offset, zeros between them. Written in place through a DLPack
    view of the tensor: a numpy array turned into a tensor is copied once more (0.26 s of
    ViT-B/16's 330 MB)."""
    import tvm

    tensor = tvm.runtime.empty((max(arena.size, 1),), arena.dtype)
    out = np.from_dlpack(tensor)
    end = 0
    for t, off in sorted(arena.members, key=lambda member: member[1]):
        data = np.asarray(values[t.name], dtype=arena.dtype).reshape(-1)
        out[end:off] = 0
        out[off : off + data.size] = data
        end = off + data.size
    out[end:] = 0
    return tensor
