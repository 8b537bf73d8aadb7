"""``make_plan``: run a policy, check the result and attach its time estimates."""

from __future__ import annotations

from typing import Any

from ..core.graph import RGraph
from ..core.plan import Plan
from ..core.vdevice import VDevice
from ..errors import OptionError
from .cost import AnalyticalCostModel, CostModel
from .policy import Policy
from .registry import get_policy
from .simulate import ideal_us, simulate_plan


def make_plan(
    graph: RGraph,
    vdevice: VDevice,
    policy: str | Policy = "wavefront",
    cost: CostModel | None = None,
    sync: str = "steps",
    **options: Any,
) -> Plan:
    """A validated Plan; ``options`` go to the policy (unknown ones are an OptionError).

    ``sync`` is what the rPrograms will run with (``Plan.validate``): ``"counters"`` checks
    the dependency counters derived from the placement instead of its barrier entries."""
    cost = cost or AnalyticalCostModel()
    if isinstance(policy, Policy):
        if options:
            raise OptionError("pass options either to the Policy object or to make_plan, not both")
        pol = policy
    else:
        pol = get_policy(policy, **options)
    steps = pol.plan(graph, vdevice, cost)
    plan = Plan(graph, vdevice, steps, policy=pol.name, policy_options=dict(pol.options))
    plan.validate(sync)
    plan.estimated_us = simulate_plan(steps, graph, vdevice, cost)
    plan.ideal_us = ideal_us(graph, vdevice, cost)
    return plan
