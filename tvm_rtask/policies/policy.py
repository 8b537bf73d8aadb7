"""Policies turn an rOperator graph, a vDevice and a cost model into plan steps.

Like dlight's schedule rules, a policy is an object with one method; ``registry.py`` looks
policies up (and compares them) by name.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from ..errors import OptionError
from .cost import CostModel


class Policy:
    """Base class. ``OPTIONS`` maps each accepted option to its default; others are refused
    so that a misspelt option is an error rather than silently ignored."""

    name: ClassVar[str] = ""
    OPTIONS: ClassVar[dict[str, Any]] = {}
    # what the planned rPrograms will synchronise with (set by make_plan): the builders
    # place and time waits as they will run ("steps" or "counters")
    sync: str = "steps"

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            known = ", ".join(sorted(self.OPTIONS)) or "none"
            raise OptionError(
                f"policy {self.name!r} has no option {', '.join(unknown)}; its options: {known}"
            )
        self.options: dict[str, Any] = {**self.OPTIONS, **options}

    def plan(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> list[RProgram | OrdinaryCall]:
        raise NotImplementedError

    def launch_streams(self, graph: RGraph) -> dict[str, int]:
        """The stream of each operator, where the plan's steps launch on several streams
        (``Plan.streams``); empty: one stream, the caller's."""
        del graph
        return {}

    def estimate_us(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel, steps: list
    ) -> float | None:
        """The policy's own estimate of its plan, where the step-by-step simulator does not
        model how it runs (several streams); None: the simulator's."""
        del graph, vdevice, cost, steps
        return None

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"
