"""The whole rTask pipeline as one pass: prepare (legalize, fold, fuse), plan, lower."""

from __future__ import annotations

import tvm

from ..backend import as_target, get_backend
from ..errors import remember_errors
from ..options import resolve_options
from .fuse import prepare_pipeline
from .ios_merge import IOSOperatorMerge
from .lower import LowerRPrograms
from .plan import PlanRPrograms, plan_options


@tvm.transform.module_pass(opt_level=0, name="RTaskPrepare")
class RTaskPrepare:
    """Legalize, annotate patterns, fold constants and fuse with the ``fusion`` option;
    FusionStitching (``fusion="stitch"``) scores its patterns with ``target``'s device."""

    def __init__(self, fusion: str | None = None, target="llvm") -> None:
        self.fusion = fusion
        self.target = as_target(target)

    @remember_errors
    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        options = resolve_options({"fusion": self.fusion}, ctx.config)
        device = get_backend(self.target).device_spec(options).name
        return prepare_pipeline(options.fusion, device)(mod)


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
