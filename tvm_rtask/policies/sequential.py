"""The "RammerBase" baseline (Rammer section 6): one rProgram per operator.

It is what an ordinary build does (one launch per operator, operators one after the other),
expressed with the same kernels, so the gain of a policy is measured against it alone.
"""

from __future__ import annotations

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall
from ..core.rprogram import RProgram, RTask
from ..core.vdevice import VDevice
from .cost import CostModel
from .policy import Policy


class SequentialPolicy(Policy):
    """Each supported op: its fastest rKernel's rTasks round-robin over the vEUs; no barriers
    are needed because the program holds one operator."""

    name = "sequential"

    def plan(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> list[RProgram | OrdinaryCall]:
        steps: list[RProgram | OrdinaryCall] = []
        levels = graph.levels()
        n = vdevice.num_veu
        for op in graph:
            if not op.supported:
                steps.append(OrdinaryCall(op.name))
                continue
            kernel = cost.fastest(op, vdevice)
            prog = RProgram(n, f"rprogram_{len(steps)}", clocks=self.sync == "steps")
            for r in range(kernel.num_rtasks):
                prog.append(RTask(op.name, r, kernel.name, levels[op.name]), r % n)
            prog.widths[op.name] = min(kernel.num_rtasks, n)  # alone on the device
            steps.append(prog)
        return steps
