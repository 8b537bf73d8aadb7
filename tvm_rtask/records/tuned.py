"""Read tuned schedules back: the best records of each operator, as PrimFuncs.

``PlanRPrograms(db=...)`` asks :class:`TunedKernels` for an operator's tuned PrimFuncs and
makes its rKernels from them. Several records are kept, not only the best: records whose
outer parallel loops differ give rKernels with different rTask counts, each with its
measured time (Rammer's fastest and most efficient kernels).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import tvm_ffi
from tvm import s_tir, tirx

from ..errors import OptionError
from . import TUNED_ATTR
from .database import FILES, mean_secs, open_database, valid_records
from .workload import task_module

# a line of MetaSchedule's workload file: ["<structural hash>", "<the module, base64>"]
_WORKLOAD_LINE = re.compile(rb'^\["(\d+)",')


def workload_hashes(work_dir: str | os.PathLike) -> set[int] | None:
    """The structural hashes that the database's workloads are keyed by, read from the first
    field of each line (a millisecond; the database parses every workload's module, about
    60 ms for the shipped set); None when a line is not of that form."""
    path = Path(work_dir, FILES[0])
    if not path.exists():
        return set()
    hashes = set()
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        found = _WORKLOAD_LINE.match(line)
        if found is None:
            return None
        hashes.add(int(found.group(1)))
    return hashes


@dataclass
class TunedSchedule:
    """A tuned PrimFunc and what its record says: time of one call and the tuning cores."""

    func: tirx.PrimFunc
    us: float
    cores: int


class TunedKernels:
    """The tuning records of a work directory, looked up by PrimFunc. The database is opened
    when an operator's workload is among its hashes (most models meet none of the shipped
    records)."""

    def __init__(self, work_dir: str | os.PathLike, kind: str = "llvm", top_k: int = 8) -> None:
        if not os.path.isdir(work_dir):
            raise OptionError(f"db={os.fspath(work_dir)!r}: no such tuning work directory")
        self.work_dir = os.fspath(work_dir)
        self.kind = kind
        self.top_k = top_k
        self._hashes = workload_hashes(work_dir)
        self._database = None

    @property
    def database(self):
        """MetaSchedule's database of the work directory, opened on first use."""
        if self._database is None:
            self._database = open_database(self.work_dir, readonly=True)
        return self._database

    def schedules(self, func: tirx.PrimFunc) -> list[TunedSchedule]:
        """Tuned versions of ``func``, fastest first (empty when it was never tuned)."""
        mod = task_module(func)
        if self._hashes is not None and tvm_ffi.structural_hash(mod) % 2**64 not in self._hashes:
            return []
        out = []
        for record in valid_records(self.database, mod, self.top_k):
            # MetaSchedule keys workloads without the target: skip another target's records
            if record.target is None or record.target.kind.name != self.kind:
                continue
            sch = s_tir.Schedule(record.workload.mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)
            tuned = sch.mod["main"].without_attr("global_symbol").with_attr(TUNED_ATTR, True)
            cores = int(record.target.attrs.get("num-cores", 1))
            out.append(TunedSchedule(tuned, 1e6 * mean_secs(record), cores))
        return out

    def best(self, func: tirx.PrimFunc) -> tirx.PrimFunc | None:
        found = self.schedules(func)[:1]
        return found[0].func if found else None


def load_tuned(work_dir: str | os.PathLike, kind: str = "llvm", top_k: int = 8) -> TunedKernels:
    return TunedKernels(work_dir, kind, top_k)
