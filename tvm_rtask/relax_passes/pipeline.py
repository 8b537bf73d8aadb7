"""The rTask pipeline as phase lists, as TVM's ``relax/backend/cuda/pipeline.py`` writes its
own: :func:`prepare_passes` (IOS merges, legalize, fold, fuse), :func:`plan_passes`
(rKernels, graph, policy) and :func:`lower_passes` (one persistent PrimFunc per rProgram).
Every caller that needs part of the pipeline joins phase lists (``api.plan`` takes prepare
and plan); nobody lists the passes again.

Options are resolved once per run, by :class:`RTaskPipeline` (keywords, the PassContext's
``rtask.*`` keys, defaults, then the backend's check), into one :class:`RTaskOptions` that
every pass of every phase receives.
"""

from __future__ import annotations

import tvm

from ..backend import as_target
from ..errors import remember_errors
from ..options import RTaskOptions
from ..policies.cost import CostModel
from .fuse import RTaskPrepare
from .ios_merge import IOSOperatorMerge
from .lower_rprograms import LowerRPrograms
from .plan_rprograms import PlanRPrograms, plan_options

PHASES = ("prepare", "plan", "lower")


def prepare_passes(target, options: RTaskOptions) -> list[tvm.transform.Pass]:
    """IOS's convolution merges (policy ``"ios"`` only; its DP compares with the options' cost
    model when that is an object, else the analytical one), then legalize, fold and fuse."""
    dp_cost = options.cost if isinstance(options.cost, CostModel) else None
    return [
        IOSOperatorMerge(target, cost=dp_cost, options=options),
        RTaskPrepare(target=target, options=options),
    ]


def plan_passes(target, options: RTaskOptions) -> list[tvm.transform.Pass]:
    """rKernels, the rOperator graph and the plan, stored in the module attribute."""
    return [PlanRPrograms(target, options=options)]


def lower_passes(target, options: RTaskOptions) -> list[tvm.transform.Pass]:
    """One persistent PrimFunc per rProgram; the options travel in the plan itself."""
    del target, options
    return [LowerRPrograms()]


_PHASE_PASSES = {"prepare": prepare_passes, "plan": plan_passes, "lower": lower_passes}


@tvm.transform.module_pass(opt_level=0, name="RTaskPipeline")
class RTaskPipeline:
    """The phases named in ``phases`` (in pipeline order) with options resolved once.

    Options are checked when the pass is made, so a typo fails before any work; they are
    resolved again only against the PassContext the pass runs in (its ``rtask.*`` keys)."""

    def __init__(self, target="llvm", phases=PHASES, **options) -> None:
        unknown = [p for p in phases if p not in PHASES]
        if unknown:
            raise ValueError(f"unknown pipeline phase(s) {unknown}; phases: {PHASES}")
        self.target = as_target(target)
        self.phases = [p for p in PHASES if p in phases]
        self.options = {k: v for k, v in options.items() if v is not None}
        plan_options(self.options, None, self.target)

    @remember_errors
    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        options = plan_options(self.options, ctx, self.target)
        passes = [p for phase in self.phases for p in _PHASE_PASSES[phase](self.target, options)]
        return tvm.transform.Sequential(passes, name="RTaskPhases")(mod)


def rtask_pipeline(target="llvm", **options) -> tvm.transform.Pass:
    """The whole pipeline (prepare, plan, lower) for ``target`` as one pass.

    Options (``policy``, ``barrier``, ``num_veu``, ...) are checked now, so a typo fails at
    construction rather than deep inside a build.
    """
    return RTaskPipeline(target, PHASES, **options)
