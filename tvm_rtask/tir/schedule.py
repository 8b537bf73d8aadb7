"""A TIR schedule whose primitives skip the Python-side type check.

``tvm.s_tir.Schedule`` wraps each primitive in ``type_checked``, which binds the call's
signature and checks every argument against its type hints before the FFI call checks them
again. The CPU rules make thousands of primitive calls per model (4,193 for ResNet-18), and
the Python check took about a tenth of planning. The FFI still rejects a wrong argument with
a ``TypeError``, so only the wording of that error changes.
"""

from __future__ import annotations

from tvm import s_tir, tirx


class UncheckedSchedule(s_tir.Schedule):
    """``s_tir.Schedule`` with each ``type_checked`` primitive replaced by the function it
    wraps (``functools.wraps`` keeps it as ``__wrapped__``)."""


for _name, _primitive in vars(s_tir.Schedule).items():
    if callable(_primitive) and hasattr(_primitive, "__wrapped__"):
        setattr(UncheckedSchedule, _name, _primitive.__wrapped__)


def schedule_of(func: tirx.PrimFunc) -> s_tir.Schedule:
    """A schedule of ``func`` for the project's rules (see the module)."""
    return UncheckedSchedule(func)
