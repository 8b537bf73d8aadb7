"""An rProgram under construction with its exact simulated times (shared by the policies).

Appending only adds entries at the ends of the vEUs, so times already computed never
change: the builder's makespan equals ``simulate_program`` of its program without
re-simulating the whole program for every placement. Two ways to add rTasks:

* :meth:`ProgramBuilder.place`: Rammer's ``SelectvEU`` + ``Wait`` + ``Append`` for the rTasks
  of a list of operators: each rTask goes to the vEU where it can start earliest, behind a
  barrier for the predecessor tasks that vEU does not know to be finished yet.
* :meth:`ProgramBuilder.begin_stage` + :meth:`ProgramBuilder.replay`: put rTasks on given
  vEUs after a *global* barrier (every vEU that runs a task of the new stage first waits for
  all tasks of the previous stage), for IOS stages and the wavefront_global variant.

An rTask is costed at its wave's width (``CostModel.rtask_us_at``): the rTasks of its wave
placed in this program so far, those of the same call included, at most every vEU. The
width is recorded per operator (``RProgram.widths``), so that ``simulate_program`` costs
the program exactly as it was built.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..core.graph import RGraph
from ..core.plan import SYNC_MODES
from ..core.rkernel import RKernel
from ..core.rprogram import Barrier, RProgram, RTask
from ..core.vdevice import VDevice
from ..errors import PlanError
from .cost import CostModel


@dataclass(frozen=True)
class Placed:
    """One rTask put on vEU ``veu`` (the builder's log, replayable in another program)."""

    op: str
    rtask_id: int
    kernel: str
    veu: int


class ProgramBuilder:
    """One rProgram plus, per vEU, when it becomes free and when each of its tasks ends."""

    def __init__(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel, name: str, sync: str = "steps"
    ) -> None:
        if sync not in SYNC_MODES:
            raise PlanError(f"sync must be one of {SYNC_MODES}, not {sync!r}")
        self.graph, self.vdevice, self.cost = graph, vdevice, cost
        n = vdevice.num_veu
        self.n = n
        self.sync = sync
        self.counters = sync == "counters"
        self.program = RProgram(n, name, clocks=not self.counters)
        # counters: per vEU, the operators known complete there (a bitset by graph index,
        # with their in-program ancestors, as core.counters derives the waits)
        self._known_ops = [0] * n
        self._closed: dict[str, int] = {}
        self.barrier_us = cost.barrier_us(vdevice)
        self.free = np.zeros(n)
        self.finish: list[list[float]] = [[] for _ in range(n)]
        # op -> (last order per vEU or -1, the finish time there or -inf)
        self.frontier: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.log: list[Placed] = []
        self._offdiag = ~np.eye(n, dtype=bool)
        self._durations: dict[tuple[str, str, int | None], float] = {}
        self._wave_tasks: dict[int, int] = {}  # rTasks of each wave placed so far
        # the stage being filled: last order per vEU (-1: none) and its latest finish
        self._stage_last = np.full(n, -1, dtype=np.int64)
        self._stage_end = 0.0
        # a global barrier every vEU passes before its first task of the stage
        self._gate: tuple[Barrier, float] | None = None
        self._synced = np.zeros(n, dtype=bool)

    # -- state -----------------------------------------------------------------------------
    @property
    def makespan(self) -> float:
        return float(self.free.max())

    def is_empty(self) -> bool:
        return self.program.is_empty()

    def checkpoint(self) -> tuple:
        return (
            self.program.checkpoint(),
            self.free.copy(),
            set(self.frontier),
            len(self.log),
            self._stage_last.copy(),
            self._stage_end,
            self._gate,
            self._synced.copy(),
            list(self._known_ops),
            dict(self._wave_tasks),
        )

    def rollback(self, token: tuple) -> None:
        ptoken, free, ops, nlog, last, end, gate, synced, known_ops, wave_tasks = token
        self._known_ops = known_ops
        self._wave_tasks = wave_tasks
        for op in set(self._closed) - ops:
            del self._closed[op]
        self.program.rollback(ptoken)
        self.free = free
        for v, fin in enumerate(self.finish):
            del fin[self.program.count(v) :]
        for op in set(self.frontier) - ops:
            del self.frontier[op]
        del self.log[nlog:]
        self._stage_last, self._stage_end, self._gate, self._synced = last, end, gate, synced

    def duration(self, name: str, kernel: RKernel, width: int | None = None) -> float:
        """One rTask of ``name`` while ``width`` rTasks (None: every vEU) run side by side."""
        key = (name, kernel.name, width)
        d = self._durations.get(key)
        if d is None:
            op = self.graph.op(name)
            d = self._durations[key] = self.cost.rtask_us_at(op, kernel, self.vdevice, width)
        return d

    def _width(self, name: str, wave: int, width: int, tasks: int) -> int:
        """Record ``name``'s width (``width`` rTasks of its wave, at most every vEU) and
        count its ``tasks`` into the wave."""
        w = self.program.widths[name] = max(1, min(width, self.n))
        self._wave_tasks[wave] = self._wave_tasks.get(wave, 0) + tasks
        return w

    def _deps(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Last order and finish per vEU over the predecessors placed in this program."""
        preds = [self.frontier[p] for p in self.graph.preds(name) if p in self.frontier]
        if not preds:
            return None
        if len(preds) == 1:
            return preds[0]
        order = np.maximum.reduce([p[0] for p in preds])
        finish = np.maximum.reduce([p[1] for p in preds])
        return order, finish

    # -- Rammer: SelectvEU, Wait, Append ----------------------------------------------------
    def place(self, wave: int, ops: list[str], kernels: dict[str, RKernel]) -> None:
        """Place the rTasks of ``ops`` in order, each on its earliest-available vEU."""
        width = self._wave_tasks.get(wave, 0) + sum(kernels[n].num_rtasks for n in ops)
        for name in ops:
            self.place_op(wave, name, kernels[name], width)

    def place_op(self, wave: int, name: str, kernel: RKernel, width: int | None = None) -> None:
        """Place one operator; ``width``: rTasks of its wave running side by side (None: those
        placed so far and its own)."""
        if self._gate is not None:
            raise PlanError("place() after begin_stage(): a staged program takes replay() only")
        if width is None:
            width = self._wave_tasks.get(wave, 0) + kernel.num_rtasks
        width = self._width(name, wave, width, kernel.num_rtasks)
        if self.counters:
            self._place_op_counters(wave, name, kernel, width)
            return
        n = self.n
        dur = self.duration(name, kernel, width)
        deps = self._deps(name)
        if deps is None:
            dep_order = None
            needs = np.zeros(n, dtype=bool)
            starts = self.free.tolist()
        else:
            dep_order, dep_finish = deps
            # A first task on v needs a barrier if a dep on another vEU is not known done
            # there; it then starts when those deps have finished, plus the barrier.
            needs = ((self.program.known_matrix() < dep_order) & self._offdiag).any(axis=1)
            ready = _max_excluding_self(dep_finish)
            starts = (np.maximum(self.free, ready) + self.barrier_us * needs).tolist()
        program = self.program

        def append(task: RTask, v: int, first: bool) -> int:
            if first and dep_order is not None and needs[v]:
                return program.append(task, v, after=dep_order)
            return program.append(task, v)

        self._place_earliest(wave, name, kernel, dur, starts, append)

    def _place_earliest(self, wave, name, kernel, dur, starts, append) -> list[int]:
        """Rammer's SelectvEU + Append: each rTask of ``name`` on the vEU where it can start
        earliest (``starts``: per vEU, for its first task of the operator); ``append(task,
        veu, first)`` puts it in the program behind what it must wait for and returns its
        order. Returns the rTasks each vEU got."""
        n = self.n
        heap = list(zip(starts, range(n), strict=True))
        heapq.heapify(heap)
        my_order = np.full(n, -1, dtype=np.int64)
        my_finish = np.full(n, -np.inf)
        counts = [0] * n
        free, finish, log = self.free, self.finish, self.log
        for r in range(kernel.num_rtasks):
            t0, v = heapq.heappop(heap)
            order = append(RTask(name, r, kernel.name, wave), v, counts[v] == 0)
            counts[v] += 1
            end = t0 + dur
            free[v] = end
            finish[v].append(end)
            log.append(Placed(name, r, kernel.name, v))
            my_order[v], my_finish[v] = order, end
            heapq.heappush(heap, (end, v))
        self._end_op(name, my_order, my_finish)
        return counts

    # -- dependency counters -------------------------------------------------------------
    def _counter_deps(self, name: str) -> tuple[list[str], int, float]:
        """In-program predecessors, the bitset of their own bits, and when the last of their
        tasks finishes (a counter wait for them releases then)."""
        preds = [p for p in self.graph.preds(name) if p in self.frontier]
        own = 0
        ready = -np.inf
        for p in preds:
            own |= 1 << self.graph.index(p)
            ready = max(ready, float(self.frontier[p][1].max()))
        closed = 1 << self.graph.index(name)
        for p in preds:
            closed |= self._closed[p]
        self._closed[name] = closed
        return preds, own, ready

    def _needs_wait(self, v: int, own: int) -> bool:
        """A vEU waits unless every predecessor is known complete there (core.counters)."""
        return own & ~self._known_ops[v] != 0

    def _learn(self, v: int, preds: list[str]) -> None:
        """After a counter wait on ``v`` for ``preds``: they and their ancestors are known."""
        for p in preds:
            self._known_ops[v] |= self._closed[p]

    def _place_op_counters(self, wave: int, name: str, kernel: RKernel, width: int) -> None:
        """Rammer's placement with dependency counters: a vEU's first task of ``name`` waits
        (one counter wait, ``barrier_us``) for the predecessors it does not know complete;
        every task starts no earlier than its predecessors' last task."""
        n = self.n
        dur = self.duration(name, kernel, width)
        preds, own, ready = self._counter_deps(name)
        free = self.free
        if not preds:
            needs = [False] * n
            starts = free.tolist()
        else:
            needs = [self._needs_wait(v, own) for v in range(n)]
            bar = self.barrier_us
            starts = [
                max(f, ready) + (bar if w else 0.0)
                for f, w in zip(free.tolist(), needs, strict=True)
            ]
        program = self.program

        def append(task: RTask, v: int, first: bool) -> int:
            if first and needs[v]:
                self._learn(v, preds)
            return program.append(task, v)

        counts = self._place_earliest(wave, name, kernel, dur, starts, append)
        if kernel.num_rtasks and max(counts) == kernel.num_rtasks:  # all of it on one vEU
            self._known_ops[counts.index(kernel.num_rtasks)] |= self._closed[name]

    def _end_op(self, name: str, order: np.ndarray, finish: np.ndarray) -> None:
        self.frontier[name] = (order, finish)
        np.maximum(self._stage_last, order, out=self._stage_last)
        self._stage_end = max(self._stage_end, float(finish.max()))

    # -- global barriers ----------------------------------------------------------------------
    def begin_stage(self) -> None:
        """Start a new stage: every vEU passes one shared global barrier (waiting for the
        last task of every vEU in the stage before) ahead of its first task of the stage.

        Waiting for the previous stage suffices: every vEU that ran in it passed the
        barrier before that one, so everything earlier is known transitively.
        """
        if self.is_empty():
            return
        if self.counters:
            # no global barrier: dependency counters wait for the predecessors alone
            self._stage_last = np.full(self.n, -1, dtype=np.int64)
            self._stage_end = 0.0
            return
        if (self._stage_last >= 0).any():
            waits = [(u, int(j)) for u, j in enumerate(self._stage_last.tolist()) if j >= 0]
            self._gate = (Barrier(tuple(waits)), self._stage_end)
            self._synced[:] = False
        self._stage_last = np.full(self.n, -1, dtype=np.int64)
        self._stage_end = 0.0

    def replay(self, placed: list[Placed], wave_of: dict[str, int]) -> None:
        """Append rTasks on the given vEUs in the given order (as logged by another builder
        or a stage estimate; one operator's rTasks consecutive). A vEU's first task of the
        stage passes the global barrier; an operator's first task on a vEU waits for the
        predecessor tasks its vEU does not know to be finished yet."""
        widths = self._replay_widths(placed, wave_of)
        if self.counters:
            self._replay_counters(placed, wave_of, widths)
            return
        bar = self.barrier_us
        program, free, finish = self.program, self.free, self.finish
        op: str | None = None
        deps: tuple[np.ndarray, np.ndarray] | None = None
        my_order = my_finish = None
        dur = 0.0
        for p in placed:
            if p.op != op:
                if op is not None:
                    self._end_op(op, my_order, my_finish)
                op = p.op
                deps = self._deps(op)
                dur = self._replay_duration(op, p.kernel, wave_of[op], widths)
                my_order = np.full(self.n, -1, dtype=np.int64)
                my_finish = np.full(self.n, -np.inf)
            v = p.veu
            t = free[v]
            if self._gate is not None and not self._synced[v]:
                gate, ready = self._gate
                program.append_barrier(v, gate)
                self._synced[v] = True
                t = max(t, ready) + bar
            task = RTask(p.op, p.rtask_id, p.kernel, wave_of[p.op])
            if deps is None or my_order[v] >= 0:
                order = program.append(task, v)
            else:
                before = len(program.entries[v])
                order = program.append(task, v, after=deps[0])
                if len(program.entries[v]) - before == 2:
                    b = program.entries[v][-2]
                    t = max(t, max(finish[u][j] for u, j in b.waits)) + bar
            end = t + dur
            free[v] = end
            finish[v].append(end)
            self.log.append(p)
            my_order[v], my_finish[v] = order, end
        if op is not None:
            self._end_op(op, my_order, my_finish)

    def _replay_widths(self, placed: list[Placed], wave_of: dict[str, int]) -> dict[int, int]:
        """Per wave: its rTasks already in the program plus those ``placed`` brings."""
        widths = {w: self._wave_tasks.get(w, 0) for w in {wave_of[p.op] for p in placed}}
        for p in placed:
            widths[wave_of[p.op]] += 1
        return widths

    def _replay_duration(self, op: str, kernel: str, wave: int, widths: dict[int, int]) -> float:
        """Duration of one rTask of ``op`` replayed at its wave's width (recorded, counted)."""
        rkernel = self.graph.op(op).kernel(kernel)
        width = self._width(op, wave, widths[wave], rkernel.num_rtasks)
        return self.duration(op, rkernel, width)

    def _replay_counters(
        self, placed: list[Placed], wave_of: dict[str, int], widths: dict[int, int]
    ) -> None:
        """``replay`` with dependency counters: stages get no global barrier, a vEU's first
        task of an operator waits for the predecessors it does not know complete."""
        bar = self.barrier_us
        program, free, finish = self.program, self.free, self.finish
        runs: list[list[Placed]] = []
        for p in placed:
            if runs and runs[-1][0].op == p.op:
                runs[-1].append(p)
            else:
                runs.append([p])
        for run in runs:
            name = run[0].op
            if name in self.frontier:
                raise PlanError(f"replay: the rTasks of {name} must be consecutive")
            dur = self._replay_duration(name, run[0].kernel, wave_of[name], widths)
            preds, own, ready = self._counter_deps(name)
            my_order = np.full(self.n, -1, dtype=np.int64)
            my_finish = np.full(self.n, -np.inf)
            counts: dict[int, int] = {}
            for p in run:
                v = p.veu
                t = float(free[v])
                if preds:
                    t = max(t, ready)
                    if v not in counts and self._needs_wait(v, own):
                        self._learn(v, preds)
                        t += bar
                order = program.append(RTask(name, p.rtask_id, p.kernel, wave_of[name]), v)
                counts[v] = counts.get(v, 0) + 1
                end = t + dur
                free[v] = end
                finish[v].append(end)
                self.log.append(p)
                my_order[v], my_finish[v] = order, end
            if len(counts) == 1:
                self._known_ops[next(iter(counts))] |= self._closed[name]
            self._end_op(name, my_order, my_finish)


def _max_excluding_self(x: np.ndarray) -> np.ndarray:
    """``out[v] = max(x[u] for u != v)`` in O(n) via the two largest values."""
    if len(x) == 1:
        return np.full(1, -np.inf)
    i = int(np.argmax(x))
    top = x[i]
    x[i] = -np.inf
    second = x.max()
    x[i] = top
    out = np.full(len(x), top)
    out[i] = second
    return out
