"""Rammer's wavefront scheduling policy (Ma et al., OSDI'20, section 4.2, Algorithm 1).

The graph is cut into waves (BFS fringes). For each wave:

* ``SelectRKernels``: the fastest rKernel of every operator; when their rTasks are more than
  the vEUs, the most efficient rKernels (least rTasks x time) instead, kept only when the
  wave's estimated time with them is better.
* ``SelectvEU`` / ``Wait`` / ``Append``: every rTask goes to the vEU where it can start
  earliest, behind a barrier for the tasks of its predecessors in the same rProgram that
  the vEU does not already know to be finished.
* After the wave is placed, it starts a new rProgram instead when that is faster:
  time(P1) > time(Pcurr) + time(P2), where P1 is the current program with the wave, Pcurr
  the program without it and P2 a new program with only the wave (launch included).

Operators that cannot be rTasks close the current rProgram and run as ordinary calls.

``wavefront_global`` is the same policy with a global barrier between waves (every vEU
waits for every task of the previous wave) instead of fine-grained barriers, for comparison.
"""

from __future__ import annotations

from typing import ClassVar

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall
from ..core.rkernel import RKernel
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from .builder import ProgramBuilder, _max_excluding_self
from .cost import CostModel
from .limits import LIMIT_OPTIONS, ProgramLimit, check_limit_options
from .policy import Policy

# Kept for code that imported the builder from here.
_WaveBuilder = ProgramBuilder
__all__ = ["WavefrontGlobalPolicy", "WavefrontPolicy", "_WaveBuilder", "_max_excluding_self"]


class WavefrontPolicy(Policy):
    """Rammer's policy: waves side by side in as few rPrograms as pay off."""

    name = "wavefront"
    global_barrier: ClassVar[bool] = False
    # A wave that would push an rProgram past a limit (policies/limits.py) starts a new one.
    OPTIONS: ClassVar[dict] = dict(LIMIT_OPTIONS)

    def __init__(self, **options) -> None:
        super().__init__(**options)
        check_limit_options(self.name, self.options)

    def select_rkernels(
        self, wave: list[str], graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> dict[str, RKernel]:
        """Rammer's ``SelectRKernels``: the rKernel of each supported op of ``wave``.

        If the fastest rKernels' rTasks cannot more than fill the vEUs, keep them (each
        rTask gets a vEU of its own). Otherwise try the most efficient rKernels and keep them
        only when the wave, placed alone on the vDevice, is estimated to finish sooner.
        """
        ops = [graph.op(name) for name in wave]
        fastest = {op.name: cost.fastest(op, vdevice) for op in ops}
        if sum(k.num_rtasks for k in fastest.values()) <= vdevice.num_veu:
            return fastest
        efficient = {op.name: cost.most_efficient(op, vdevice) for op in ops}
        if all(efficient[n] is fastest[n] for n in wave):
            return fastest
        if self._alone(wave, efficient, graph, vdevice, cost).makespan < (
            self._alone(wave, fastest, graph, vdevice, cost).makespan
        ):
            return efficient
        return fastest

    def _alone(
        self,
        wave: list[str],
        kernels: dict[str, RKernel],
        graph: RGraph,
        vdevice: VDevice,
        cost: CostModel,
        level: int = 0,
    ) -> ProgramBuilder:
        """The wave placed alone in a new rProgram."""
        b = ProgramBuilder(graph, vdevice, cost, "", self.sync)
        b.place(level, wave, kernels)
        return b

    def _extend(
        self, cur: ProgramBuilder, level: int, wave: list[str], kernels: dict[str, RKernel]
    ) -> ProgramBuilder | None:
        """Add the wave to ``cur``; return the wave alone when it was computed on the way."""
        cur.place(level, wave, kernels)
        return None

    def plan(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> list[RProgram | OrdinaryCall]:
        steps: list[RProgram | OrdinaryCall] = []
        launch = cost.launch_us(vdevice)
        cur = ProgramBuilder(graph, vdevice, cost, f"rprogram_{len(steps)}", self.sync)
        limit = ProgramLimit(graph, self.options)  # counts what cur holds
        for w, wave in enumerate(graph.waves()):
            supported = [n for n in wave if graph.op(n).supported]
            ordinary = [n for n in wave if not graph.op(n).supported]
            if supported:
                kernels = self.select_rkernels(supported, graph, vdevice, cost)
                if limit.would_exceed(supported):
                    steps.append(cur.program)
                    cur = ProgramBuilder(graph, vdevice, cost, f"rprogram_{len(steps)}", self.sync)
                    limit.reset()
                limit.add(supported)
                if cur.is_empty():
                    cur.place(w, supported, kernels)
                else:
                    token = cur.checkpoint()
                    without = cur.makespan
                    alone = self._extend(cur, w, supported, kernels)
                    # Only when the wave added more than a launch can a new program win.
                    if cur.makespan > without + launch:
                        alone = alone or self._alone(supported, kernels, graph, vdevice, cost, w)
                        if cur.makespan > without + launch + alone.makespan:
                            cur.rollback(token)
                            steps.append(cur.program)
                            alone.program.name = f"rprogram_{len(steps)}"
                            cur = alone
                            limit.reset()
                            limit.add(supported)
            if ordinary:
                if not cur.is_empty():
                    steps.append(cur.program)
                steps.extend(OrdinaryCall(n) for n in ordinary)
                cur = ProgramBuilder(graph, vdevice, cost, f"rprogram_{len(steps)}", self.sync)
                limit.reset()
        if not cur.is_empty():
            steps.append(cur.program)
        return steps


class WavefrontGlobalPolicy(WavefrontPolicy):
    """Wavefront with a global barrier between waves instead of fine-grained barriers.

    Each wave is placed as if alone on the vDevice (earliest-available vEU), then appended
    after one barrier that every vEU of the wave passes and that waits for all tasks of the
    previous wave. A barrier costs less than a launch, so waves split rPrograms only at
    ordinary calls; the comparison with ``wavefront`` isolates the value of fine barriers.
    """

    name = "wavefront_global"
    global_barrier = True

    def _extend(
        self, cur: ProgramBuilder, level: int, wave: list[str], kernels: dict[str, RKernel]
    ) -> ProgramBuilder:
        alone = self._alone(wave, kernels, cur.graph, cur.vdevice, cur.cost, level)
        cur.begin_stage()
        cur.replay(alone.log, dict.fromkeys(wave, level))
        return alone
