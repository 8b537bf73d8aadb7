"""Shipped record sets: tuning records that come with the package, one set per device.

``tvm_rtask/records/shipped/<set>/`` holds a compact MetaSchedule JSON database (the
workloads and the best record of each) and ``manifest.json`` (what was tuned, for which
target, and each operator's tuned time against the CPU rules' on the same machine). A set is
keyed by device:

- ``x86_64-avx2``: llvm targets for x86-64 whose CPU has AVX2 (``mcpu`` haswell and later,
  ``llvm-native`` on such a host, or ``mattr`` with ``+avx2``); plain ``llvm`` (SSE2) has no
  set;
- ``h100``: CUDA ``sm_90``; ``h200`` when the ``device`` option says ``h200``;
- every other target: no set.

``compile`` uses the set matching its target unless told otherwise (option ``db``:
:func:`resolve_db`). A record only ever replaces the operator whose PrimFunc has its
structural hash; every other operator keeps the rules' or the default schedule.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..errors import OptionError
from .database import FILES

logger = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
MANIFEST = "manifest.json"
# The sets the device keys name (a set that was never made is simply absent).
SET_NAMES = ("h100", "h200", "x86_64-avx2")
# ``db`` values that turn the records off (the CLI's ``--db none``).
OFF_WORDS = ("none",)

_told: set[str] = set()  # sets already reported absent or unusable in this process


class RecordSetError(OptionError):
    """A shipped record set cannot be used: its manifest is missing, unreadable or does not
    match its database."""


def set_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    return Path(root or SHIPPED_DIR, name)


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of the set in directory ``path``, checked against its database files;
    :class:`RecordSetError` (one line) when it is missing, unreadable or inconsistent."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise RecordSetError(f"record set {path}: no {MANIFEST}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as err:
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise RecordSetError(f"record set {path}: {MANIFEST} is unreadable ({detail})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("operators"), dict):
        raise RecordSetError(f"record set {path}: {MANIFEST} has no 'operators' table")
    if manifest.get("set") != path.name:
        raise RecordSetError(
            f"record set {path}: {MANIFEST} names set {manifest.get('set')!r}, not {path.name!r}"
        )
    if any(entry.get("kept") for entry in manifest["operators"].values()):
        missing = [name for name in FILES if not (path / name).is_file()]
        if missing:
            raise RecordSetError(f"record set {path}: {', '.join(missing)} missing")
    return manifest


def shipped_set(name: str, root: str | os.PathLike | None = None) -> Path | None:
    """The directory of shipped set ``name`` when it exists and its manifest is sound; None
    (and one log line per process) when it is absent or unusable."""
    path = set_dir(name, root)
    if not path.is_dir():
        _tell(name, logging.INFO, f"no shipped record set {name!r}: the rules' schedules are used")
        return None
    try:
        manifest = read_manifest(path)
    except RecordSetError as err:
        _tell(name, logging.WARNING, f"{err}; ignored, the rules' schedules are used")
        return None
    kept = sum(1 for entry in manifest["operators"].values() if entry.get("kept"))
    if not kept:
        _tell(name, logging.INFO, f"shipped record set {name!r} holds no records")
        return None
    _tell(name, logging.INFO, f"shipped record set {name!r}: {kept} tuned operators ({path})")
    return path


def _tell(name: str, level: int, message: str) -> None:
    if name not in _told:
        _told.add(name)
        logger.log(level, "%s", message)


def resolve_db(db, name: str | None, root=None):
    """The ``db`` option made concrete: a tuning work directory (path) or False (none).

    - a path (``str``): used as given, exactly as before shipped sets existed;
    - ``False`` or ``"none"``: no records, the rules' schedules everywhere;
    - ``None`` (the default): the shipped set ``name`` the target's backend chose
      (``Backend.record_set``), or False when there is none (absent sets are said once, in
      the log).

    Idempotent: a resolved value resolves to itself.
    """
    if db is False or (isinstance(db, str) and db.strip().lower() in OFF_WORDS):
        return False
    if isinstance(db, (str, os.PathLike)):
        return os.fspath(db)
    if db is not None:
        raise OptionError(f"db must be a directory path, False or None, not {db!r}")
    if name is None:
        return False
    path = shipped_set(name, root)
    return os.fspath(path) if path is not None else False


def available() -> list[str]:
    """The names of the sets shipped with this installation (present directories)."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / MANIFEST).is_file())


__all__ = [
    "SET_NAMES",
    "SHIPPED_DIR",
    "RecordSetError",
    "available",
    "read_manifest",
    "resolve_db",
    "shipped_set",
]
