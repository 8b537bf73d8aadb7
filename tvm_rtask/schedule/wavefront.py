"""Rammer's wavefront scheduling policy (Ma et al., OSDI'20, section 4.2, Algorithm 1).

The graph is cut into waves (BFS fringes). Each wave's operators get an rKernel, and every
rTask goes to the vEU where it can start earliest, waiting (through a barrier) for the
tasks of its predecessors in the same rProgram. After a wave is placed, the wave starts a
new rProgram instead when that is faster: time(program + wave) > time(program) + time(new
program with only the wave), launch included. Operators that cannot be rTasks close the
current rProgram and run as ordinary calls.
"""

from __future__ import annotations

import numpy as np

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall
from ..core.rkernel import RKernel
from ..core.rprogram import Barrier, RProgram, RTask
from ..core.vdevice import VDevice
from .cost import CostModel
from .policy import Policy, register_policy


@register_policy
class WavefrontPolicy(Policy):
    """Rammer's policy: waves side by side in as few rPrograms as pay off."""

    name = "wavefront"

    def select_rkernels(
        self, wave: list[str], graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> dict[str, RKernel]:
        """Hook: the rKernel of each supported op of ``wave``.

        For now the fastest one; Rammer's full rule (the most efficient kernel when the wave
        has more rTasks than vEUs, the fastest otherwise) belongs here.
        """
        return {name: cost.fastest(graph.op(name), vdevice) for name in wave}

    def plan(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> list[RProgram | OrdinaryCall]:
        steps: list[RProgram | OrdinaryCall] = []
        launch = cost.launch_us(vdevice)
        cur = _WaveBuilder(graph, vdevice, cost, f"rprogram_{len(steps)}")
        for w, wave in enumerate(graph.waves()):
            supported = [n for n in wave if graph.op(n).supported]
            ordinary = [n for n in wave if not graph.op(n).supported]
            if supported:
                kernels = self.select_rkernels(supported, graph, vdevice, cost)
                if cur.is_empty():
                    cur.place(w, supported, kernels)
                else:
                    token = cur.checkpoint()
                    without = cur.makespan
                    cur.place(w, supported, kernels)
                    # Only when the wave added more than a launch can a new program win.
                    if cur.makespan > without + launch:
                        alone = _WaveBuilder(graph, vdevice, cost, "")
                        alone.place(w, supported, kernels)
                        if cur.makespan > without + launch + alone.makespan:
                            cur.rollback(token)
                            steps.append(cur.program)
                            alone.program.name = f"rprogram_{len(steps)}"
                            cur = alone
            if ordinary:
                if not cur.is_empty():
                    steps.append(cur.program)
                steps.extend(OrdinaryCall(n) for n in ordinary)
                cur = _WaveBuilder(graph, vdevice, cost, f"rprogram_{len(steps)}")
        if not cur.is_empty():
            steps.append(cur.program)
        return steps


class _WaveBuilder:
    """One rProgram under construction plus its exact simulated times.

    Appending only adds entries at the ends of the vEUs, so times already computed never
    change: the builder's makespan equals ``simulate_program`` of its program, without
    re-simulating the whole program for every wave.
    """

    def __init__(self, graph: RGraph, vdevice: VDevice, cost: CostModel, name: str) -> None:
        self.graph, self.vdevice, self.cost = graph, vdevice, cost
        n = vdevice.num_veu
        self.program = RProgram(n, name)
        self.barrier_us = cost.barrier_us(vdevice)
        self.free = np.zeros(n)
        self.finish: list[list[float]] = [[] for _ in range(n)]
        # op -> (last order per vEU or -1, its finish time or -inf, the task there)
        self.frontier: dict[str, tuple[np.ndarray, np.ndarray, dict[int, RTask]]] = {}
        self._offdiag = ~np.eye(n, dtype=bool)

    @property
    def makespan(self) -> float:
        return float(self.free.max())

    def is_empty(self) -> bool:
        return self.program.is_empty()

    def checkpoint(self) -> tuple:
        return (self.program.checkpoint(), self.free.copy(), set(self.frontier))

    def rollback(self, token: tuple) -> None:
        ptoken, free, ops = token
        self.program.rollback(ptoken)
        self.free = free
        for v, fin in enumerate(self.finish):
            del fin[self.program.count(v) :]
        for op in set(self.frontier) - ops:
            del self.frontier[op]

    def place(self, wave: int, ops: list[str], kernels: dict[str, RKernel]) -> None:
        for name in ops:
            self._place_op(wave, name, kernels[name])

    def _place_op(self, wave: int, name: str, kernel: RKernel) -> None:
        n = self.vdevice.num_veu
        dur = self.cost.rtask_us(self.graph.op(name), kernel, self.vdevice)
        preds = [p for p in self.graph.preds(name) if p in self.frontier]
        dep_order = np.full(n, -1, dtype=np.int64)
        dep_finish = np.full(n, -np.inf)
        deps: list[RTask] = []
        for p in preds:
            order, fin, last = self.frontier[p]
            np.maximum(dep_order, order, out=dep_order)
            np.maximum(dep_finish, fin, out=dep_finish)
            deps.extend(last.values())
        # A first task on v needs a barrier if some dep on another vEU is not known done there;
        # it then starts when the deps on other vEUs have finished, plus the barrier.
        needs = ((self.program.known_matrix() < dep_order) & self._offdiag).any(axis=1)
        ready = _max_excluding_self(dep_finish)
        my_order = np.full(n, -1, dtype=np.int64)
        my_finish = np.full(n, -np.inf)
        my_last: dict[int, RTask] = {}
        for r in range(kernel.num_rtasks):
            start = np.maximum(self.free, ready) + self.barrier_us * needs
            v = int(np.argmin(start))
            task = RTask(name, r, kernel.name, wave)
            if deps:
                self.program.wait(task, deps)
            before = len(self.program.entries[v])
            order = self.program.append(task, v)
            t0 = float(self.free[v])
            if len(self.program.entries[v]) - before == 2:
                b = self.program.entries[v][-2]
                assert isinstance(b, Barrier)
                t0 = max(t0, max(self.finish[u][j] for u, j in b.waits)) + self.barrier_us
            end = t0 + dur
            self.free[v] = end
            self.finish[v].append(end)
            needs[v] = False
            ready[v] = -np.inf
            my_order[v], my_finish[v], my_last[v] = order, end, task
        self.frontier[name] = (my_order, my_finish, my_last)


def _max_excluding_self(x: np.ndarray) -> np.ndarray:
    """``out[v] = max(x[u] for u != v)`` in O(n) via the two largest values."""
    if len(x) == 1:
        return np.full(1, -np.inf)
    i = int(np.argmax(x))
    second = np.max(np.delete(x, i))
    out = np.full(len(x), x[i])
    out[i] = second
    return out
