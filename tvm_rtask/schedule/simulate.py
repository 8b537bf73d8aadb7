"""The vDevice simulator: how long a plan takes under a cost model, and a lower bound.

Each vEU runs its entries in order; an rTask takes ``cost.rtask_us``; a barrier ends when
the tasks it waits for have finished, plus ``cost.barrier_us``. Entries are visited in the
program's execution order, so a wait that can never be satisfied is a DeadlockError.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall, Plan
from ..core.rprogram import Barrier, RProgram, RTask
from ..core.vdevice import VDevice
from .cost import CostModel


@dataclass
class ProgramTiming:
    """Simulated times of one rProgram in microseconds (launch not in the makespan)."""

    makespan_us: float
    busy_us: list[float]
    launch_us: float
    barrier_us: float
    spans: dict[tuple[str, int], tuple[int, float, float]] = field(default_factory=dict)
    """``(op, rtask_id) -> (veu, start, end)``, for Gantt charts."""

    @property
    def total_us(self) -> float:
        return self.launch_us + self.makespan_us

    @property
    def utilisation(self) -> float:
        """Busy fraction of the vEUs over the makespan."""
        if self.makespan_us <= 0:
            return 0.0
        return sum(self.busy_us) / (len(self.busy_us) * self.makespan_us)


def simulate_program(
    program: RProgram, graph: RGraph, vdevice: VDevice, cost: CostModel
) -> ProgramTiming:
    order = program.execution_order()  # raises DeadlockError naming the stuck barriers
    n = program.num_veu
    bar = cost.barrier_us(vdevice)
    clock = [0.0] * n
    busy = [0.0] * n
    finish: list[list[float]] = [[] for _ in range(n)]
    spans: dict[tuple[str, int], tuple[int, float, float]] = {}
    durations: dict[tuple[str, str], float] = {}
    barrier_total = 0.0
    for v, i in order:
        e = program.entries[v][i]
        if isinstance(e, Barrier):
            ready = max((finish[u][j] for u, j in e.waits), default=0.0)
            clock[v] = max(clock[v], ready) + bar
            barrier_total += bar
            continue
        d = _duration(e, graph, vdevice, cost, durations)
        start = clock[v]
        clock[v] = start + d
        busy[v] += d
        finish[v].append(clock[v])
        spans[e.key] = (v, start, clock[v])
    return ProgramTiming(max(clock), busy, cost.launch_us(vdevice), barrier_total, spans)


def _duration(
    t: RTask, graph: RGraph, vdevice: VDevice, cost: CostModel, memo: dict[tuple[str, str], float]
) -> float:
    key = (t.op, t.kernel)
    if key not in memo:
        op = graph.op(t.op)
        memo[key] = cost.rtask_us(op, op.kernel(t.kernel), vdevice)
    return memo[key]


def simulate_plan(
    plan_steps: list[RProgram | OrdinaryCall] | Plan,
    graph: RGraph,
    vdevice: VDevice,
    cost: CostModel,
) -> float:
    """Total microseconds: every step pays a launch; a program its makespan, an ordinary
    call its operator on the whole device."""
    steps = plan_steps.steps if isinstance(plan_steps, Plan) else plan_steps
    total = 0.0
    for s in steps:
        if isinstance(s, OrdinaryCall):
            total += cost.launch_us(vdevice) + cost.ordinary_us(graph.op(s.op), vdevice)
        else:
            total += simulate_program(s, graph, vdevice, cost).total_us
    return total


def ideal_us(graph: RGraph, vdevice: VDevice, cost: CostModel) -> float:
    """A lower bound on any plan (launches not counted): the larger of
    - the critical path with each op taking one rTask of its quickest-per-rTask kernel, and
    - all work (each op's least rTasks x time) spread over the vEUs.
    An ordinary op holds the whole device: its time counts fully in both."""
    n = vdevice.num_veu
    path: dict[str, float] = {}
    work = 0.0
    for op in graph:
        if op.supported:
            path[op.name] = min(cost.rtask_us(op, k, vdevice) for k in op.rkernels)
            work += min(cost.work_us(op, k, vdevice) for k in op.rkernels)
        else:
            t = cost.ordinary_us(op, vdevice)
            path[op.name] = t
            work += t * n
    if not path:
        return 0.0
    return max(graph.critical_path(path.__getitem__), work / n)
