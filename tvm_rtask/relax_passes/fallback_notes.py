"""Fallback notes carried in a module attribute from the prepare phase to the plan.

``RTaskPrepare`` runs before ``PlanRPrograms``, which collects the fallbacks of rKernel
making and planning (``tvm_rtask.fallbacks``); what the prepare phase fell back on (a model
left in NCHW) would be lost between the two passes, which share nothing but the module. So
``RTaskPrepare`` stores its notes as JSON in the module attribute ``rtask.fallbacks`` and
``PlanRPrograms`` puts them first in the plan's ``fallbacks``. The attribute is only set
when there is a note: a module that fell back on nothing is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import tvm

FALLBACKS_ATTR = "rtask.fallbacks"

__all__ = ["FALLBACKS_ATTR", "merge_notes", "noted_in", "with_notes"]


def merge_notes(*lists: Iterable[dict]) -> list[dict]:
    """The notes of ``lists`` in order, each once (a note may reach several collections)."""
    merged: list[dict] = []
    for notes in lists:
        for note in notes:
            if note not in merged:
                merged.append(dict(note))
    return merged


def noted_in(mod: tvm.IRModule) -> list[dict]:
    """The notes stored in ``mod`` (none when it has no ``rtask.fallbacks`` attribute)."""
    if mod.attrs is None or FALLBACKS_ATTR not in mod.attrs:
        return []
    return [dict(note) for note in json.loads(str(mod.attrs[FALLBACKS_ATTR]))]


def with_notes(mod: tvm.IRModule, notes: list[dict]) -> tvm.IRModule:
    """``mod`` with ``notes`` added to those it carries (``mod`` itself when none)."""
    if not notes:
        return mod
    return mod.with_attr(FALLBACKS_ATTR, json.dumps(merge_notes(noted_in(mod), notes)))
