"""The tuning work directory: MetaSchedule's JSON database plus a ledger of finished tasks.

MetaSchedule's ``JSONDatabase`` appends each measured record to ``database_tuning_record.json``
as it arrives, so a killed run loses at most the line being written. :func:`repair` drops
such a torn last line (the database refuses to load it), and the ledger
(``rtask_tuning.json``, replaced atomically) says which tasks finished their budget: those are
reused, never re-tuned; a task with records but no ledger entry resumes with the trials it
has left.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

FILES = ("database_workload.json", "database_tuning_record.json")
LEDGER = "rtask_tuning.json"
# MetaSchedule records a failed build or run with this many seconds.
FAILED_SECS = 1e9


def repair(work_dir: str | os.PathLike, dry_run: bool = False) -> int:
    """Drop torn or unparsable lines at the end of the database files; return how many
    (``dry_run``: only count them)."""
    dropped = 0
    for name in FILES:
        path = Path(work_dir, name)
        if not path.exists():
            continue
        lines = path.read_bytes().split(b"\n")
        keep = len(lines)
        while keep and not _valid(lines[keep - 1]):
            keep -= 1
        cut = sum(1 for line in lines[keep:] if line.strip())
        if cut and not dry_run:
            path.write_bytes(b"".join(line + b"\n" for line in lines[:keep]))
        dropped += cut
    return dropped


def _valid(line: bytes) -> bool:
    if not line.strip():
        return False
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def open_database(work_dir: str | os.PathLike, readonly: bool = False):
    """MetaSchedule's JSON database in ``work_dir`` (created if missing, repaired first).

    ``readonly`` (compile) never writes there: a tuner may be appending a line right now, so
    a torn end is repaired in a temporary copy instead.
    """
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    if readonly and repair(work_dir, dry_run=True):
        # JSONDatabase reads its files when made; a read-only one never writes back.
        with tempfile.TemporaryDirectory(prefix="rtask-db-") as copy:
            for name in FILES:
                if Path(work_dir, name).exists():
                    shutil.copy(Path(work_dir, name), Path(copy, name))
            repair(copy)
            return JSONDatabase(work_dir=copy)
    os.makedirs(work_dir, exist_ok=True)
    repair(work_dir)
    return JSONDatabase(work_dir=os.fspath(work_dir))


def valid_records(database, mod, top_k: int) -> list:
    """The best ``top_k`` records of workload ``mod`` that built and ran, best first."""
    if not database.has_workload(mod):
        return []
    records = database.get_top_k(database.commit_workload(mod), top_k)
    return [r for r in records if r.run_secs and mean_secs(r) < FAILED_SECS]


def mean_secs(record) -> float:
    secs = [float(s) for s in record.run_secs]
    return sum(secs) / len(secs)


class Ledger:
    """Which (task, target kind) pairs finished tuning, with their trial counts."""

    def __init__(self, work_dir: str | os.PathLike) -> None:
        self.path = Path(work_dir, LEDGER)
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                self.entries = json.loads(self.path.read_text()).get("tasks", {})
            except ValueError:
                self.entries = {}  # a torn ledger only costs re-checking the database

    @staticmethod
    def key(workload: str, target_kind: str) -> str:
        return f"{target_kind}/{workload}"

    def done(self, workload: str, target_kind: str) -> bool:
        return self.key(workload, target_kind) in self.entries

    def finish(self, workload: str, target_kind: str, **info) -> None:
        """Record a finished task; the file is replaced atomically."""
        self.entries[self.key(workload, target_kind)] = info
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": 1, "tasks": self.entries}, indent=1, sort_keys=True))
        os.replace(tmp, self.path)
