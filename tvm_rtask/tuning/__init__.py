"""MetaSchedule tuning of a model's operators, and the database that compile reads back.

``tune(mod, target, work_dir, trials=...)`` tunes each fused operator with MetaSchedule's
evolutionary search and XGBoost cost model; ``compile(..., db=work_dir)`` then builds the
rKernels from the tuned schedules. Importing this package stays cheap: MetaSchedule (whose
tensor intrinsics take ~20 s to import) is loaded only by the functions that need it.
"""

from __future__ import annotations

_LAZY = {
    "TunedKernels": ("records", "TunedKernels"),
    "load_tuned": ("records", "load_tuned"),
    "tune": ("tuner", "tune"),
    "TuneReport": ("tuner", "TuneReport"),
    "RPCSettings": ("measure", "RPCSettings"),
    "extract_tasks": ("tasks", "extract_tasks"),
    "TuningTask": ("tasks", "TuningTask"),
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tvm_rtask.tuning' has no attribute {name!r}")
    import importlib

    module_name, attr = _LAZY[name]
    if module_name == "records":
        return getattr(importlib.import_module("..records", __name__), attr)
    return getattr(importlib.import_module(f".{module_name}", __name__), attr)
