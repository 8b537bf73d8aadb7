"""Fallbacks: the places where a compile takes a less good but safe way, said out loud.

A schedule rule that raises is skipped, a CUDA kernel whose index cannot be narrowed keeps
int64, an operator that cannot be cut into rTasks stays an ordinary call, ... None of these
fails a compile, and none may pass unnoticed either: a model that quietly runs on the slow
path is a bug report nobody can write. Every such place calls :func:`note_fallback`, which

- logs one WARNING line on the ``tvm_rtask`` logger: ``"<kind> for <subject>: <reason>"``;
- records ``{"kind", "subject", "reason"}`` in every :func:`collecting_fallbacks` block that
  is active, so that ``PlanRPrograms`` can store them in the plan (``Plan.report()`` lists
  them under ``"fallbacks"``) and ``api.build`` can add the build's own.

The collections live in a :class:`contextvars.ContextVar`, so two compiles in two threads or
tasks never see each other's notes. A note made in a thread or process that a block did not
start (a forked build worker) is only logged. This module is pure Python (no TVM import), so
that ``core`` and every backend can use it.

The kinds are short constant strings (the constants below), so that notes can be counted and
filtered by kind; the subject names the operator, file or target, the reason says why.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

__all__ = [
    "BUILT_LATE",
    "CPU_CHECK_SKIPPED",
    "INT32_REFUSED",
    "LAYOUT_KEPT",
    "ONE_RTASK",
    "NOT_MEASURED",
    "ORDINARY_CALL",
    "REPLANNED",
    "RULE_SKIPPED",
    "collecting_fallbacks",
    "note_fallback",
]

RULE_SKIPPED = "schedule rule skipped"
"""A schedule rule raised (or returned something unusable) on an operator; the next one ran."""
ONE_RTASK = "one rTask"
"""An operator's kernel could not be cut into several rTasks; it runs as a single one."""
INT32_REFUSED = "int32 narrowing refused"
"""A CUDA rKernel keeps 64-bit indices because TVM would not narrow them."""
LAYOUT_KEPT = "layout kept"
"""A convolution stays in its original layout (not channel blocks / packed weights)."""
ORDINARY_CALL = "ordinary call"
"""An operator stays a normal kernel launch between rPrograms."""
REPLANNED = "replanned"
"""A plan was made again with other limits (a CUDA rProgram that did not fit)."""
BUILT_LATE = "built late"
"""A body the early build or a build process did not deliver is built by the build itself."""
NOT_MEASURED = "policy not measured"
"""``choose="measure"`` without the target's device here: the cost model's choice stands."""
CPU_CHECK_SKIPPED = "CPU check skipped"
"""An artifact's target cannot be read: whether this CPU can run it is not checked."""

LOGGER = logging.getLogger("tvm_rtask")

# Fallbacks that cost only compile time or are a heuristic's deliberate choice: listed in the
# plan's report like every other, logged at INFO rather than WARNING (a user compiling a model
# should not read a warning for a body the build made itself a moment later)
QUIET_KINDS = frozenset({BUILT_LATE, LAYOUT_KEPT})

_ACTIVE: contextvars.ContextVar[tuple[list[dict], ...]] = contextvars.ContextVar(
    "tvm_rtask_fallbacks", default=()
)


def _note(kind: str, subject: str, reason: str) -> dict:
    """The recorded form of one fallback: three one-line strings (a JSON-ready dict)."""
    return {"kind": str(kind), "subject": str(subject), "reason": " ".join(str(reason).split())}


def note_fallback(kind: str, subject: str, reason: str) -> None:
    """Log at WARNING (INFO for :data:`QUIET_KINDS`) on the 'tvm_rtask' logger ("<kind> for
    <subject>: <reason>") and append
    {"kind", "subject", "reason"} to the innermost active collection, if any.

    The note also reaches every enclosing collection (an outer compile sees what its parts
    fell back on). A note already in the innermost collection is neither appended again nor
    logged again: the same rule failing on the same kernel twice in one plan is one fact.
    """
    note = _note(kind, subject, reason)
    active = _ACTIVE.get()
    if active and note in active[-1]:
        return
    level = logging.INFO if kind in QUIET_KINDS else logging.WARNING
    LOGGER.log(level, "%s for %s: %s", note["kind"], note["subject"], note["reason"])
    for collection in active:
        if note not in collection:
            collection.append(note)


@contextlib.contextmanager
def collecting_fallbacks() -> Iterator[list[dict]]:
    """Collect the fallbacks noted inside the block (contextvars-based, nestable; an inner
    block's notes also reach the outer ones).

    The list yielded is filled while the block runs and kept after it ends, in note order
    and without duplicates; what the block raises passes through unchanged.
    """
    collection: list[dict] = []
    token = _ACTIVE.set((*_ACTIVE.get(), collection))
    try:
        yield collection
    finally:
        _ACTIVE.reset(token)
