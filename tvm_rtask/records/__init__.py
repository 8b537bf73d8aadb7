"""Tuning records: the MetaSchedule database a tuning run writes and compile reads back.

Below both the tuner (``tvm_rtask.tuning``, which prepares models through the Relax passes)
and the backends (which build rKernels from the records), so neither imports the other.
Importing this package is cheap; MetaSchedule is loaded only when a database is opened.
"""

from __future__ import annotations

__all__ = ["TUNED_ATTR", "TunedKernels", "load_tuned"]

# Set on PrimFuncs that come from a tuning record.
TUNED_ATTR = "rtask.tuned"


def __getattr__(name: str):
    if name in ("TunedKernels", "load_tuned"):
        from . import tuned

        return getattr(tuned, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
