"""The public entry points: ``compile``, ``plan`` and ``rtask_pipeline``."""

from __future__ import annotations

from dataclasses import replace

import tvm

from . import frontend, native, progress
from .backend import as_target, get_backend
from .backend.base import build_follows
from .backend.cuda.source import cuda_source
from .core import Plan
from .errors import PlanError, run_keeping_errors
from .fallbacks import REPLANNED, collecting_fallbacks, note_fallback
from .options import RTaskOptions
from .relax_passes import plan_of, rtask_pipeline
from .relax_passes.fallback_notes import merge_notes
from .relax_passes.pipeline import RTaskPipeline
from .runtime import policy_trial
from .runtime import profiler as _profiler  # noqa: F401 - registers cost="measured"
from .runtime.config import register_config_options

register_config_options()

__all__ = ["build", "compile", "compile_with_plan", "cuda_source", "lower", "plan"]


def _options(policy, barrier, options) -> dict:
    merged = dict(options)
    if policy is not None:
        merged["policy"] = policy
    if barrier is not None:
        merged["barrier"] = barrier
    return merged


def plan(mod, target="llvm", policy: str | None = None, **options) -> Plan:
    """Plan ``mod`` without building it: the rOperator graph, rPrograms and estimates.

    ``policy`` defaults to ``rtask.policy`` from the PassContext, else ``"auto"``.
    """
    with progress.importing(mod):
        mod = frontend.load(mod)
    target = as_target(target)
    seq = RTaskPipeline(target, ("prepare", "plan"), **_options(policy, None, options))
    with progress.pass_stages():
        planned = run_keeping_errors(seq, mod)
    result = plan_of(planned)
    progress.log_plan(result)
    return result


def compile(  # noqa: A001 - the name users expect, as tvm.compile
    mod, target="llvm", policy: str | None = None, barrier: str | None = None, **options
):
    """Compile ``mod`` into a Relax executable whose operators run as persistent kernels.

    ``policy`` (default ``"auto"``: sequential or wavefront, as the cost model ranks them;
    ``choose="measure"``: as they run here) and ``barrier`` (default ``"fine"``) may also
    come from PassContext keys ``rtask.policy`` / ``rtask.barrier``. The returned executable runs
    with ``tvm.relax.VirtualMachine(ex, tvm.cpu())``. TVM's CPU thread pool is grown to the
    plan's vEU count, because every vEU must have a worker thread running at the same time.
    """
    return compile_with_plan(mod, target, policy, barrier, **options)[0]


def compile_with_plan(
    mod, target="llvm", policy: str | None = None, barrier: str | None = None, **options
):
    """:func:`compile`, also returning the Plan it compiled (no second planning run).

    When the backend finds the built kernels wanting (CUDA: a persistent kernel spills
    registers, option ``spills="replan"``), it is planned and built again with the options
    the backend asks for, at most ``MAX_REPLANS`` times; each time is a fallback, noted and
    listed in the returned plan's ``fallbacks``. With ``policy="auto", choose="measure"``
    every candidate policy is built and timed on the device present and the fastest kept
    (``runtime/policy_trial.py``)."""
    tvm_target = as_target(target)
    with progress.importing(mod):
        mod = frontend.load(mod)
    ex, plan = _compile_replanning(mod, tvm_target, policy, barrier, options)
    if plan.policy_options.get("choose") != "measure":
        return ex, plan
    candidate_options = _without_auto_options(options)
    with collecting_fallbacks() as noted:
        ex, plan = policy_trial.keep_fastest(
            mod,
            tvm_target,
            (ex, plan),
            lambda name: _compile_replanning(mod, tvm_target, name, barrier, candidate_options),
        )
    return ex, _with_fallbacks(plan, noted)


# policy "auto"'s own options: a candidate built alone must not get them
_AUTO_ONLY = ("candidates", "choose")


def _without_auto_options(options: dict) -> dict:
    kept = {k: v for k, v in options.items() if k not in _AUTO_ONLY}
    if isinstance(kept.get("policy_options"), dict):
        own = kept["policy_options"]
        kept["policy_options"] = {k: v for k, v in own.items() if k not in _AUTO_ONLY}
    return kept


def _compile_replanning(mod, tvm_target, policy, barrier, options: dict):
    """Lower and build, planned again as the backend asks (``compile_with_plan``)."""
    backend = get_backend(tvm_target)
    given = frozenset(k for k, v in options.items() if v is not None)
    replans: list[dict] = []
    with build_follows():
        for _ in range(MAX_REPLANS):
            ex, plan = build(lower(mod, tvm_target, policy, barrier, **options), tvm_target)
            more = backend.replan_options(plan, RTaskOptions.from_dict(plan.options), given)
            if not more:
                return ex, _with_fallbacks(plan, replans)
            with collecting_fallbacks() as noted:
                note_fallback(
                    REPLANNED,
                    f"the {tvm_target.kind.name} plan",
                    f"planned again with {more}: {_why_replanned(plan)}",
                )
            replans += noted
            options = {**options, **more}
        ex, plan = build(lower(mod, tvm_target, policy, barrier, **options), tvm_target)
        return ex, _with_fallbacks(plan, replans)


# A CUDA plan goes from 4 to 1 vEU per SM in 3 steps at most.
MAX_REPLANS = 3


def _why_replanned(plan: Plan) -> str:
    spilled = {k: u for k, u in plan.kernel_usage.items() if u.get("spill_stores")}
    return (
        ", ".join(
            f"{k} spilled {u['spill_stores']} bytes at {u['registers']} registers"
            for k, u in spilled.items()
        )
        or "the backend asked"
    )


def lower(
    mod, target="llvm", policy: str | None = None, barrier: str | None = None, **options
) -> tvm.IRModule:
    """The module after :func:`rtask_pipeline`: ``main`` calls one persistent PrimFunc per
    rProgram; the plan is in the module attribute ``rtask.plan``. :func:`build` finishes it."""
    with progress.importing(mod):
        mod = frontend.load(mod)
    native.load()
    opts = _options(policy, barrier, options)
    with progress.pass_stages():
        return run_keeping_errors(rtask_pipeline(as_target(target), **opts), mod)


def build(lowered: tvm.IRModule, target="llvm"):
    """Build a module from :func:`lower` for ``target``: ``(executable, plan)``. The plan's
    ``fallbacks`` (``report()["fallbacks"]``) are those of planning, then the build's own
    (an llvm body the early build did not deliver, built late)."""
    tvm_target = as_target(target)
    planned = plan_of(lowered)
    if planned is None:
        raise PlanError("build needs a module from tvm_rtask.lower (it has no rtask.plan)")
    options = RTaskOptions.from_dict(planned.options)
    progress.log_plan(planned, "build")
    # the build's fallbacks come after the plan is in the module: added to the Plan returned
    with progress.stage("build"), collecting_fallbacks() as notes:
        ex = get_backend(tvm_target).build(lowered, planned, options)
    return ex, _with_fallbacks(planned, notes)


def _with_fallbacks(plan: Plan, notes: list[dict]) -> Plan:
    """``plan`` with ``notes`` after its own fallbacks (a copy; ``plan`` itself when there is
    nothing to add)."""
    merged = merge_notes(plan.fallbacks, notes)
    return plan if merged == plan.fallbacks else replace(plan, fallbacks=merged)
