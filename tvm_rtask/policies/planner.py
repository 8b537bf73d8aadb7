"""``make_plan``: run a policy, check the result and attach its time estimates."""

from __future__ import annotations

from typing import Any

from ..core.graph import RGraph
from ..core.plan import SYNC_MODES, OrdinaryCall, Plan
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from ..errors import OptionError
from ..fallbacks import ORDINARY_CALL, note_fallback
from .cost import AnalyticalCostModel, CostModel
from .policy import Policy
from .registry import get_policy
from .simulate import ideal_us, simulate_plan, simulate_program


def make_plan(
    graph: RGraph,
    vdevice: VDevice,
    policy: str | Policy = "wavefront",
    cost: CostModel | None = None,
    sync: str = "steps",
    ordinary_fallback: bool = False,
    **options: Any,
) -> Plan:
    """A validated Plan; ``options`` go to the policy (unknown ones are an OptionError).

    ``sync`` is what the rPrograms will run with (``Plan.validate``): ``"counters"`` checks
    the dependency counters derived from the placement instead of its barrier entries.
    ``ordinary_fallback``: an rProgram the cost model predicts slower than its operators as
    ordinary kernels is replaced by them (:func:`fall_back_to_ordinary`)."""
    cost = cost or AnalyticalCostModel()
    if isinstance(policy, Policy):
        if options:
            raise OptionError("pass options either to the Policy object or to make_plan, not both")
        pol = policy
    else:
        pol = get_policy(policy, **options)
    if sync not in SYNC_MODES:
        raise OptionError(f"sync must be one of {SYNC_MODES}, not {sync!r}")
    pol.sync = sync  # the builders place for the synchronisation that will run
    steps = pol.plan(graph, vdevice, cost)
    if ordinary_fallback:
        steps = fall_back_to_ordinary(steps, graph, vdevice, cost, sync)
    choice = dict(getattr(pol, "choice", {}))  # policy "auto": what it chose and why
    name = choice.get("chosen", pol.name)
    plan = Plan(graph, vdevice, steps, policy=name, policy_options=dict(pol.options), choice=choice)
    plan.sync = sync
    plan.streams = pol.launch_streams(graph)
    plan.validate(sync)
    own = pol.estimate_us(graph, vdevice, cost, steps)
    plan.estimated_us = simulate_plan(steps, graph, vdevice, cost, sync) if own is None else own
    plan.ideal_us = ideal_us(graph, vdevice, cost)
    return plan


def fall_back_to_ordinary(
    steps: list, graph: RGraph, vdevice: VDevice, cost: CostModel, sync: str = "steps"
) -> list:
    """Each rProgram predicted slower than its operators run as ordinary kernels (one launch
    each, in topological order) becomes those ordinary calls, so the plan's estimate is never
    above running every operator ordinarily. How far that holds on the device is how far the
    cost model is calibrated (``runtime.measured_cost_model``). Each such operator is noted
    as a fallback (``tvm_rtask.fallbacks``) with both estimates."""
    out: list = []
    for step in steps:
        if isinstance(step, RProgram):
            ops = sorted(step.ops(), key=graph.index)
            persistent = simulate_program(step, graph, vdevice, cost, sync).total_us
            ordinary = sum(
                cost.launch_us(vdevice) + cost.ordinary_us(graph.op(op), vdevice) for op in ops
            )
            if ordinary < persistent:
                reason = (
                    f"its rProgram is predicted slower ({persistent:.1f} us) than its "
                    f"{len(ops)} operators as ordinary kernels ({ordinary:.1f} us)"
                )
                for op in ops:
                    note_fallback(ORDINARY_CALL, op, reason)
                out += [OrdinaryCall(op) for op in ops]
                continue
        out.append(step)
    return out
