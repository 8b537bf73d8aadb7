"""The whole rTask pipeline as one pass: prepare (legalize, fold, fuse), plan, lower."""

from __future__ import annotations

import tvm

from ..backend import as_target
from .fuse import RTaskPrepare
from .ios_merge import IOSOperatorMerge
from .lower import LowerRPrograms
from .plan import PlanRPrograms, plan_options


def rtask_pipeline(target="llvm", **options) -> tvm.transform.Pass:
    """``Sequential([IOSOperatorMerge, RTaskPrepare, PlanRPrograms, LowerRPrograms])`` for
    ``target`` (IOSOperatorMerge does nothing unless the policy is ``"ios"``).

    Options (``policy``, ``barrier``, ``num_veu``, ...) are checked now, so a typo fails at
    construction rather than deep inside a build.
    """
    target = as_target(target)
    plan_options({k: v for k, v in options.items() if v is not None}, None, target)
    return tvm.transform.Sequential(
        [
            IOSOperatorMerge(target, **options),
            RTaskPrepare(options.get("fusion"), target),
            PlanRPrograms(target, **options),
            LowerRPrograms(),
        ],
        name="RTaskPipeline",
    )
