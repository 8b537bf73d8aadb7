"""``auto``: the plan of whichever candidate policy the cost model predicts fastest.

Which policy wins changes from model to model (on 2 CPU threads wavefront took 0.57x to
1.20x sequential's time on real models, ``docs/scheduling.md``), and a user should not have
to find out by hand. ``AutoPolicy`` plans the graph with each candidate, simulates each plan
with the same cost model the candidates plan with, and keeps the fastest; ``choice`` records
every candidate's estimate so that ``Plan.report()["policy_choice"]`` says what was chosen and
why. The choice is only as good as the cost model: with ``cost="measured"`` (every rKernel
timed on this machine, ``tvm-rtask profile``) its estimates are measurements of the same
kernels; with the analytical model they are a guess. With ``choose="measure"``
``tvm_rtask.compile`` builds every candidate and keeps the one that runs fastest on the
device present (``runtime/policy_trial.py``): the plan made here is then the first build.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from ..errors import OptionError
from .cost import CostModel
from .limits import LIMIT_OPTIONS
from .policy import Policy
from .simulate import simulate_plan

DEFAULT_CANDIDATES = ("sequential", "wavefront")
# how the candidate is chosen: by the cost model's estimate here, or by timing every
# candidate's build on the device present (tvm_rtask.compile; runtime/policy_trial.py)
CHOOSE = ("estimate", "measure")


class AutoPolicy(Policy):
    """Plans with each of ``candidates`` and keeps the plan with the least estimate (ties go
    to the first candidate). The rProgram limits go to every candidate that takes them."""

    name = "auto"
    # the candidates by name: set by the registry, which collects this class (so this module
    # does not import the registry back)
    policy_by_name: ClassVar[Callable[..., Policy] | None] = None
    OPTIONS: ClassVar[dict[str, Any]] = {
        "candidates": DEFAULT_CANDIDATES,
        "choose": "estimate",
        **LIMIT_OPTIONS,
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        candidates = tuple(self.options["candidates"])
        if not candidates or "auto" in candidates:
            raise OptionError(
                f"policy 'auto': candidates must name other policies, not {candidates!r}"
            )
        self.options["candidates"] = candidates
        if self.options["choose"] not in CHOOSE:
            raise OptionError(
                f"policy 'auto': choose must be one of {', '.join(CHOOSE)}, "
                f"not {self.options['choose']!r}"
            )
        self.choice: dict[str, Any] = {}

    def plan(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> list[RProgram | OrdinaryCall]:
        get_policy = type(self).policy_by_name
        if get_policy is None:
            raise OptionError("policy 'auto' is used through tvm_rtask.policies.get_policy")
        best: tuple[float, str, list] | None = None
        estimates: dict[str, float] = {}
        for name in self.options["candidates"]:
            policy = get_policy(name)
            limits = {k: self.options[k] for k in LIMIT_OPTIONS if k in policy.OPTIONS}
            policy = get_policy(name, **limits)
            policy.sync = self.sync
            steps = policy.plan(graph, vdevice, cost)
            estimates[name] = simulate_plan(steps, graph, vdevice, cost, self.sync)
            if best is None or estimates[name] < best[0]:
                best = (estimates[name], name, steps)
        assert best is not None
        self.choice = {
            "chosen": best[1],
            "estimates_us": estimates,
            "cost": type(cost).__name__,
            "why": f"{best[1]} has the least estimate of "
            + ", ".join(f"{n} {us:.1f} us" for n, us in estimates.items()),
        }
        return best[2]
