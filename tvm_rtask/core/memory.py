"""Workspace memory of an rProgram: tensors share bytes where the program orders them.

A tensor that lives and dies inside one rProgram (a workspace) may reuse the memory of
another one when every rTask that touches it is guaranteed to run after every rTask that
touched the other: guaranteed by the vEUs' own program order and the barriers, read off the
vector clock before each rTask (``RProgram.task_clocks``), never by the waves a policy had
in mind. With fine barriers a vEU may run several operators ahead of another, so two
tensors that a sequential liveness analysis would let share memory may not share it here.

Why it matters on the CPU: without reuse every intermediate of a model gets bytes of its
own, the kernels write to memory that is cold in the caches, and MobileNet v2's wavefront
program ran 10-15% slower under fine barriers than the same waves under TVM's global
barriers, whose sequential waves ``StorageRewrite`` folds into a handful of buffers
(``docs/cpu-kernels.md``).

Pure Python and numpy, like the rest of ``core``: the backends turn a :class:`MemoryPlan`
into one allocation per dtype and views at the planned offsets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from .rprogram import RProgram


@dataclass
class Arena:
    """One buffer of ``dtype`` (``size`` elements) and its members' element offsets."""

    name: str
    dtype: str
    size: int = 0
    offsets: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Workspace:
    """What the planner needs of a tensor: its name, dtype, elements and bytes per element."""

    name: str
    dtype: str
    elements: int
    itemsize: int


def access_bounds(
    program: RProgram, accesses: Mapping[str, Iterable[str]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per tensor ``(last, known)``: ``last[u]`` the last order of vEU ``u`` that touches it
    (-1: none), ``known[u]`` the last order of ``u`` finished before every task that
    touches it starts. Tensor A's tasks all finish before B's start iff ``last_A <=
    known_B`` everywhere. ``accesses``: tensor -> the operators that read or write it (each
    of an operator's rTasks counts as touching all of its tensors)."""
    before, where = program.task_clocks()
    n = program.num_veu
    rows_of: dict[str, list[tuple[int, int, int]]] = {}
    for (op, _), place in where.items():
        rows_of.setdefault(op, []).append(place)
    out = {}
    for tensor, ops in accesses.items():
        places = [p for op in ops for p in rows_of.get(op, ())]
        last = np.full(n, -1, dtype=np.int64)
        if not places:  # touched by no task here: ordered with nothing
            out[tensor] = (np.full(n, np.iinfo(np.int64).max // 2), np.full(n, -1))
            continue
        veus = np.array([p[0] for p in places])
        orders = np.array([p[1] for p in places])
        np.maximum.at(last, veus, orders)
        known = before[[p[2] for p in places]].min(axis=0)
        out[tensor] = (last, known)
    return out


def plan_arenas(
    program: RProgram,
    workspaces: list[Workspace],
    accesses: Mapping[str, Iterable[str]],
    align_bytes: int = 64,
    prefix: str = "rtask_arena",
) -> list[Arena]:
    """Place ``workspaces`` in one arena per dtype, each at the lowest aligned offset where
    it overlaps only tensors that the program orders entirely before or after it (largest
    first, a greedy best-known heuristic for offset assignment)."""
    bounds = access_bounds(program, accesses)
    arenas = []
    for dtype in sorted({w.dtype for w in workspaces}):
        group = sorted(
            (w for w in workspaces if w.dtype == dtype), key=lambda w: (-w.elements, w.name)
        )
        itemsize = group[0].itemsize
        align = max(align_bytes // itemsize, 1)
        last = np.stack([bounds[w.name][0] for w in group])
        known = np.stack([bounds[w.name][1] for w in group])
        # ordered[a, b]: every task of a finishes before any task of b starts
        ordered = (last[:, None, :] <= known[None, :, :]).all(axis=-1)
        apart = ordered | ordered.T
        arena = Arena(f"{prefix}_{dtype}", dtype)
        placed: list[tuple[int, int, int]] = []  # (offset, end, index)
        for i, w in enumerate(group):
            busy = sorted((lo, hi) for lo, hi, k in placed if not apart[i, k])
            offset = 0
            for lo, hi in busy:
                if offset + w.elements <= lo:
                    break
                offset = max(offset, -(-hi // align) * align)
            placed.append((offset, offset + w.elements, i))
            arena.offsets[w.name] = offset
            arena.size = max(arena.size, offset + w.elements)
        arenas.append(arena)
    return arenas


def shared_workspaces(
    program: RProgram,
    graph,
    decls,
    align_bytes: int = 64,
    aliases: Mapping[str, tuple[str, int]] | None = None,
) -> list[Arena]:
    """Arenas for a program's workspaces ``decls`` (anything with ``name``, ``shape`` and
    ``dtype``), the operators of ``graph`` saying which tensors each task touches. A dtype
    numpy does not know keeps its tensors out (the caller allocates them one by one).
    ``aliases``: tensors that are views of another (name -> (home, element offset)); they
    take no bytes of their own, and whoever touches them touches their home."""
    aliases = aliases or {}
    workspaces = []
    for t in decls:
        if t.name in aliases:
            continue
        try:
            itemsize = np.dtype(str(t.dtype)).itemsize
        except TypeError:
            continue
        elements = int(np.prod([int(d) for d in t.shape], dtype=np.int64))
        workspaces.append(Workspace(t.name, str(t.dtype), elements, itemsize))
    names = {w.name for w in workspaces}
    accesses: dict[str, list[str]] = {name: [] for name in names}
    for op_name in program.ops():
        op = graph.op(op_name)
        for tensor in {*op.inputs, *op.outputs}:
            home = aliases[tensor][0] if tensor in aliases else tensor
            if home in names:
                accesses[home].append(op_name)
    return plan_arenas(program, workspaces, accesses, align_bytes)
