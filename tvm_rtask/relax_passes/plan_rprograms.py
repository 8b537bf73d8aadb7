"""``PlanRPrograms``: make rKernels, build the rOperator graph and plan rPrograms.

The pass asks the target's backend to add each operator's rKernels to the module, and stores
the plan in the module for ``LowerRPrograms`` (:func:`with_plan`, :func:`plan_of`).
"""

from __future__ import annotations

from dataclasses import replace

import tvm
from tvm import relax

from ..backend import as_target, get_backend, target_dict
from ..core import Plan, RGraph
from ..errors import OptionError, remember_errors
from ..fallbacks import ORDINARY_CALL, collecting_fallbacks, note_fallback
from ..options import RTaskOptions, resolve_options
from ..policies import make_plan
from ..policies.cost import COST_RESOLVERS
from ..policies.limits import LIMIT_OPTIONS
from ..policies.registry import get_policy
from .extract import ExtractedGraph, extract_graph
from .fallback_notes import merge_notes, noted_in

PLAN_ATTR = "rtask.plan"

__all__ = [
    "PLAN_ATTR",
    "PlanRPrograms",
    "as_target",
    "plan_of",
    "plan_options",
    "with_plan",
]


def with_plan(mod: tvm.IRModule, plan: Plan) -> tvm.IRModule:
    """``mod`` carrying ``plan`` as JSON in its attribute ``rtask.plan``: plain data, so the
    module still prints, hashes, compares and saves as any IRModule."""
    return mod.with_attr(PLAN_ATTR, plan.to_json())


def plan_of(mod: tvm.IRModule) -> Plan | None:
    """The plan ``mod`` carries (None without ``rtask.plan``), rebuilt from its JSON: a fresh
    object each call, so a caller may modify it (ResNeXt-29's CUDA plan, 83,493 rTasks,
    rebuilds in about 0.5 s, docs/compile-time.md)."""
    attrs = mod.attrs
    if attrs is None or PLAN_ATTR not in attrs:
        return None
    return Plan.from_json(str(attrs[PLAN_ATTR]))


def plan_options(explicit: dict, ctx: tvm.transform.PassContext | None, target) -> RTaskOptions:
    """Options resolved once (keywords, ``rtask.*`` keys, defaults) and checked by the
    target's backend (an option that does not apply to the target is an OptionError).

    ``db`` comes back concrete: a work directory, or False for none; left unset it is the
    shipped record set the target's backend chooses (``Backend.record_set``,
    ``records.sets.resolve_db``)."""
    from ..records.sets import resolve_db

    backend = get_backend(target)
    if isinstance(explicit, RTaskOptions):
        options = explicit
    else:
        options = resolve_options(explicit, ctx.config if ctx is not None else None, backend)
    backend.check_options(options)
    db = resolve_db(options.db, backend.record_set(options))
    return options if db == options.db else replace(options, db=db)


def policy_arguments(options: RTaskOptions, backend) -> dict:
    """The policy's own options plus the backend's rProgram limits when the policy takes
    them (policies/limits.py)."""
    arguments = dict(options.policy_options)
    if set(LIMIT_OPTIONS) <= set(get_policy(options.policy).OPTIONS):
        arguments.update(backend.program_limits(options))
    return arguments


@tvm.transform.module_pass(opt_level=0, name="PlanRPrograms")
class PlanRPrograms:
    """Plan ``main`` into rPrograms with the chosen policy; options as in :class:`RTaskOptions`
    (or an RTaskOptions object), including the policy's own and ``cost=``."""

    def __init__(self, target="llvm", **options) -> None:
        self.target = as_target(target)
        self.options = options.pop("options", None) or options

    @remember_errors
    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        options = plan_options(self.options, ctx, self.target)
        # every fallback taken while the rKernels are made and the plan is chosen goes into
        # the plan (Plan.report()["fallbacks"]), after those the prepare phase noted
        with collecting_fallbacks() as notes:
            planned, plan = self._plan(mod, options)
        plan.fallbacks = merge_notes(noted_in(mod), notes)
        return with_plan(planned, plan)

    def _plan(self, mod: tvm.IRModule, options: RTaskOptions) -> tuple[tvm.IRModule, Plan]:
        """A copy of ``mod`` with its rKernels, and its validated Plan."""
        backend = get_backend(self.target)
        # Work on a copy: rKernels replace or join functions, and a pass must leave its input
        # module as it was (planning one module under two policies must work).
        mod, maker = backend.make_rkernels(mod.clone(), options)
        extracted = extract_graph(mod, maker)
        graph = RGraph(extracted.operators)
        note_ordinary_operators(extracted)
        vdev = maker.vdevice()
        measured = None
        if options.cost == "measured":  # every rKernel timed on the device present (cached)
            resolver = COST_RESOLVERS.get("measured")
            if resolver is None:
                raise OptionError(
                    "cost='measured' is timed by tvm_rtask.runtime.profiler: import it (as "
                    "tvm_rtask.compile and plan do) before running PlanRPrograms"
                )
            cost, measured = resolver(mod, maker, graph, vdev, options, self.target)
        else:
            cost = options.cost_model()
        plan = make_plan(
            graph,
            vdev,
            policy=options.policy,
            cost=cost,
            sync=backend.sync(options),
            ordinary_fallback=options.falls_back_to_ordinary(),
            **policy_arguments(options, backend),
        )
        plan.options = options.to_dict()
        if measured is not None:
            plan.options.update(cost_model="measured", measured_cost=measured)
        plan.target = target_dict(self.target)
        return mod, plan


def note_ordinary_operators(extracted: ExtractedGraph) -> None:
    """Note each call extraction keeps unsupported (an ordinary call between rPrograms),
    with the reason it gave. A binding that calls nothing (packing outputs, taking an
    element, naming a variable again) runs no kernel and is not noted."""
    for op in extracted.operators:
        if not op.supported and isinstance(extracted.bindings[op.name].value, relax.Call):
            note_fallback(ORDINARY_CALL, op.name, op.reason or "no reason given")
