"""The entries of an rProgram's per-vEU lists: rTasks and barrier rTasks (Rammer 3.3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RTask:
    """rTask ``rtask_id`` of operator ``op`` with rKernel ``kernel``; ``wave`` is informative."""

    op: str
    rtask_id: int
    kernel: str
    wave: int = 0

    @property
    def key(self) -> tuple[str, int]:
        """Identity of the task inside a program (the kernel and wave do not distinguish)."""
        return (self.op, self.rtask_id)

    def __str__(self) -> str:
        return f"{self.op} rtask {self.rtask_id}"

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "rtask_id": self.rtask_id, "kernel": self.kernel, "wave": self.wave}


@dataclass(frozen=True)
class Barrier:
    """Wait until ``step[veu] > order`` for each ``(veu, order)`` pair (kept sorted)."""

    waits: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "waits", tuple(sorted((int(u), int(j)) for u, j in self.waits)))

    @property
    def array(self) -> np.ndarray:
        """The waits as an ``(n, 2)`` int array (cached: the checks use it on every barrier)."""
        a = self.__dict__.get("_array")
        if a is None:
            a = np.array(self.waits, dtype=np.int64).reshape(-1, 2)
            object.__setattr__(self, "_array", a)
        return a

    def to_dict(self) -> dict[str, Any]:
        # through numpy: a NASNet plan has 2 M pairs (10 s as Python lists of tuples)
        return {"waits": self.array.tolist()}


Entry = RTask | Barrier
