"""The vDevice simulator: how long a plan takes under a cost model, and a lower bound.

Each vEU runs its entries in order; an rTask takes ``cost.rtask_us``; a barrier ends when
the tasks it waits for have finished, plus ``cost.barrier_us``. Entries are visited in the
program's execution order (a topological order of "runs after" on entries), which is the
same as an event-by-event simulation: every entry starts as soon as its vEU and its waits
allow. A wait that can never be satisfied (a missing task, a cycle of barriers) is a
DeadlockError naming the barriers; a program with more vEUs than the device keeps resident
is a CapacityError (its spinning vEUs would wait for vEUs that never start).

Every step of a plan pays one launch; an ordinary call holds the whole device for its
operator's time. :func:`simulate` gives the whole picture (per-step and per-vEU busy, idle
and waiting time, launch and barrier overheads, the ideal bound); :func:`simulate_plan`
only the total.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.counters import CounterWait, counter_scripts, task_counts
from ..core.graph import RGraph
from ..core.plan import OrdinaryCall, Plan
from ..core.rprogram import Barrier, RProgram, RTask
from ..core.script import Run
from ..core.vdevice import VDevice
from ..errors import CapacityError, DeadlockError, PlanError
from .cost import CostModel

Span = tuple[int, float, float]


@dataclass
class ProgramTiming:
    """Simulated times of one rProgram in microseconds (launch not in the makespan).

    ``barrier_us`` is the fixed cost of all barriers together; ``wait_us[v]`` the time vEU v
    spent in barriers beyond that cost, waiting for other vEUs. For each vEU,
    ``busy + wait + barrier overheads + idle = makespan``.
    """

    makespan_us: float
    busy_us: list[float]
    launch_us: float
    barrier_us: float
    spans: dict[tuple[str, int], Span] = field(default_factory=dict)
    """``(op, rtask_id) -> (veu, start, end)``, for Gantt charts."""
    barrier_spans: list[Span] = field(default_factory=list)
    """``(veu, arrival, end)`` of every barrier: waiting plus its fixed cost."""
    wait_us: list[float] = field(default_factory=list)
    num_barriers: int = 0

    @property
    def total_us(self) -> float:
        return self.launch_us + self.makespan_us

    @property
    def idle_us(self) -> list[float]:
        """Per vEU: makespan minus rTask time (waiting, barrier costs and the idle tail)."""
        return [self.makespan_us - b for b in self.busy_us]

    @property
    def utilisation(self) -> float:
        """Busy fraction of the vEUs over the makespan."""
        if self.makespan_us <= 0:
            return 0.0
        return sum(self.busy_us) / (len(self.busy_us) * self.makespan_us)


@dataclass
class StepTiming:
    """One step of a plan on the plan's time line: it starts at ``start_us`` (its launch
    included) and ends at ``end_us``. ``program`` is None for an ordinary call."""

    name: str
    kind: str
    start_us: float
    end_us: float
    launch_us: float
    program: ProgramTiming | None = None

    @property
    def run_start_us(self) -> float:
        """When the kernel starts running, after its launch."""
        return self.start_us + self.launch_us


@dataclass
class PlanTiming:
    """A whole plan simulated on its vDevice (microseconds)."""

    steps: list[StepTiming]
    num_veu: int
    ideal_us: float

    @property
    def total_us(self) -> float:
        return self.steps[-1].end_us if self.steps else 0.0

    @property
    def launches(self) -> int:
        return len(self.steps)

    @property
    def launch_us(self) -> float:
        return sum(s.launch_us for s in self.steps)

    @property
    def barrier_us(self) -> float:
        return sum(s.program.barrier_us for s in self.steps if s.program is not None)

    @property
    def num_barriers(self) -> int:
        return sum(s.program.num_barriers for s in self.steps if s.program is not None)

    @property
    def busy_us(self) -> list[float]:
        """rTask time per vEU; an ordinary call keeps every vEU busy for its duration."""
        busy = [0.0] * self.num_veu
        for s in self.steps:
            if s.program is None:
                for v in range(self.num_veu):
                    busy[v] += s.end_us - s.run_start_us
            else:
                for v, b in enumerate(s.program.busy_us):
                    busy[v] += b
        return busy

    @property
    def wait_us(self) -> list[float]:
        wait = [0.0] * self.num_veu
        for s in self.steps:
            if s.program is not None:
                for v, w in enumerate(s.program.wait_us):
                    wait[v] += w
        return wait

    @property
    def idle_us(self) -> list[float]:
        """Per vEU: total time minus busy time (launches, barriers, waiting, tails)."""
        return [self.total_us - b for b in self.busy_us]

    @property
    def utilisation(self) -> float:
        if self.total_us <= 0:
            return 0.0
        return sum(self.busy_us) / (self.num_veu * self.total_us)

    def summary(self) -> dict[str, Any]:
        """The numbers a benchmark table wants, JSON-ready."""
        return {
            "total_us": self.total_us,
            "ideal_us": self.ideal_us,
            "launches": self.launches,
            "launch_us": self.launch_us,
            "barriers": self.num_barriers,
            "barrier_us": self.barrier_us,
            "busy_us": sum(self.busy_us),
            "wait_us": sum(self.wait_us),
            "idle_us": sum(self.idle_us),
            "utilisation": self.utilisation,
        }


def simulate_program(
    program: RProgram, graph: RGraph, vdevice: VDevice, cost: CostModel, sync: str = "steps"
) -> ProgramTiming:
    """Run one rProgram event by event; raises DeadlockError or CapacityError.

    ``sync="counters"``: the program runs with dependency counters (``core.counters``), its
    barrier entries ignored: a counter wait ends when the last rTask of each operator it
    waits for has finished, plus ``cost.barrier_us``."""
    if program.num_veu > vdevice.capacity:
        raise CapacityError(
            f"rProgram {program.name!r} uses {program.num_veu} vEUs but {vdevice.spec.name} "
            f"keeps only {vdevice.capacity} co-resident: vEUs waiting for vEUs that never "
            "start would deadlock"
        )
    if sync == "counters":
        return _simulate_counters(program, graph, vdevice, cost)
    if sync != "steps":
        raise PlanError(f"sync must be 'steps' or 'counters', not {sync!r}")
    order = program.execution_order()  # raises DeadlockError naming the stuck barriers
    n = program.num_veu
    bar = cost.barrier_us(vdevice)
    clock = [0.0] * n
    busy = [0.0] * n
    wait = [0.0] * n
    finish: list[list[float]] = [[] for _ in range(n)]
    spans: dict[tuple[str, int], Span] = {}
    barrier_spans: list[Span] = []
    durations: dict[tuple[str, str], float] = {}
    joined: dict[int, float] = {}  # a wide barrier object shared by several vEUs: once
    entries = program.entries
    for v, i in order:
        e = entries[v][i]
        if isinstance(e, Barrier):
            ready = joined.get(id(e))
            if ready is None:
                ready = max((finish[u][j] for u, j in e.waits), default=0.0)
                if len(e.waits) >= 16:
                    joined[id(e)] = ready
            arrive = clock[v]
            if ready > arrive:
                wait[v] += ready - arrive
            clock[v] = max(arrive, ready) + bar
            barrier_spans.append((v, arrive, clock[v]))
            continue
        d = _duration(e, graph, vdevice, cost, durations, program.widths)
        start = clock[v]
        clock[v] = start + d
        busy[v] += d
        finish[v].append(clock[v])
        spans[e.key] = (v, start, clock[v])
    return _timing(clock, busy, wait, spans, barrier_spans, bar, cost.launch_us(vdevice))


def _simulate_counters(
    program: RProgram, graph: RGraph, vdevice: VDevice, cost: CostModel
) -> ProgramTiming:
    """Event by event over the counter scripts: a vEU runs until a wait names an operator
    with rTasks left, and resumes when that operator's last rTask finishes."""
    scripts = counter_scripts(program, graph)
    left = task_counts(program)
    n = program.num_veu
    bar = cost.barrier_us(vdevice)
    clock = [0.0] * n
    busy = [0.0] * n
    wait = [0.0] * n
    pos = [0] * n
    done_at: dict[str, float] = {}
    blocked: dict[str, list[int]] = {}
    spans: dict[tuple[str, int], Span] = {}
    barrier_spans: list[Span] = []
    durations: dict[tuple[str, str], float] = {}
    stack = list(range(n - 1, -1, -1))
    while stack:
        v = stack.pop()
        script = scripts[v]
        i = pos[v]
        while i < len(script):
            item = script[i]
            if isinstance(item, CounterWait):
                missing = next((op for op in item.ops if left[op]), None)
                if missing is not None:
                    blocked.setdefault(missing, []).append(v)
                    break
                ready = max(done_at[op] for op in item.ops)
                arrive = clock[v]
                wait[v] += max(0.0, ready - arrive)
                clock[v] = max(arrive, ready) + bar
                barrier_spans.append((v, arrive, clock[v]))
            elif isinstance(item, Run):
                op = item.op
                task = RTask(op, item.start, program.kernel_of(op))
                d = _duration(task, graph, vdevice, cost, durations, program.widths)
                for r in item.ids():
                    start = clock[v]
                    clock[v] = start + d
                    busy[v] += d
                    spans[(op, r)] = (v, start, clock[v])
                left[op] -= item.count
                done_at[op] = max(done_at.get(op, 0.0), clock[v])
                if not left[op]:
                    stack.extend(blocked.pop(op, ()))
            i += 1
        pos[v] = i
    stuck = [v for v in range(n) if pos[v] < len(scripts[v])]
    if stuck:
        v = stuck[0]
        item = scripts[v][pos[v]]
        raise DeadlockError(
            f"rProgram {program.name!r}: vEU {v} waits for {', '.join(item.ops)} forever "
            f"({len(stuck)} vEUs stuck)"
        )
    return _timing(clock, busy, wait, spans, barrier_spans, bar, cost.launch_us(vdevice))


def _timing(clock, busy, wait, spans, barrier_spans, bar: float, launch: float) -> ProgramTiming:
    """The timing of a simulated program from its per-vEU clocks, busy and waiting time."""
    return ProgramTiming(
        max(clock),
        busy,
        launch,
        bar * len(barrier_spans),
        spans,
        barrier_spans,
        wait,
        len(barrier_spans),
    )


def _duration(
    t: RTask,
    graph: RGraph,
    vdevice: VDevice,
    cost: CostModel,
    memo: dict[tuple[str, str], float],
    widths: dict[str, int],
) -> float:
    """One rTask at the width its program recorded for the operator (none: every vEU)."""
    key = (t.op, t.kernel)
    if key not in memo:
        op = graph.op(t.op)
        memo[key] = cost.rtask_us_at(op, op.kernel(t.kernel), vdevice, widths.get(t.op))
    return memo[key]


def simulate(
    plan_steps: list[RProgram | OrdinaryCall] | Plan,
    graph: RGraph | None = None,
    vdevice: VDevice | None = None,
    cost: CostModel | None = None,
    sync: str | None = None,
) -> PlanTiming:
    """Simulate a plan (or a list of steps) step by step on one time line.

    With a Plan, ``graph`` and ``vdevice`` default to the plan's own, ``sync`` to what its
    rPrograms run with; ``cost`` to the analytical model.
    """
    if isinstance(plan_steps, Plan):
        steps = plan_steps.steps
        graph = graph or plan_steps.graph
        vdevice = vdevice or plan_steps.vdevice
        sync = sync or plan_steps.sync
    else:
        steps = plan_steps
    sync = sync or "steps"
    if graph is None or vdevice is None:
        raise PlanError("simulate needs the graph and the vDevice of a list of steps")
    if cost is None:
        from .cost import AnalyticalCostModel

        cost = AnalyticalCostModel()
    launch = cost.launch_us(vdevice)
    now = 0.0
    out: list[StepTiming] = []
    for k, s in enumerate(steps):
        if isinstance(s, OrdinaryCall):
            run = cost.ordinary_us(graph.op(s.op), vdevice)
            out.append(StepTiming(s.op, "ordinary", now, now + launch + run, launch))
        else:
            t = simulate_program(s, graph, vdevice, cost, sync)
            name = s.name or f"rprogram_{k}"
            out.append(StepTiming(name, "rprogram", now, now + t.total_us, t.launch_us, t))
        now = out[-1].end_us
    return PlanTiming(out, vdevice.num_veu, ideal_us(graph, vdevice, cost))


def simulate_plan(
    plan_steps: list[RProgram | OrdinaryCall] | Plan,
    graph: RGraph,
    vdevice: VDevice,
    cost: CostModel,
    sync: str = "steps",
) -> float:
    """Total microseconds: every step pays a launch; a program its makespan, an ordinary
    call its operator on the whole device."""
    steps = plan_steps.steps if isinstance(plan_steps, Plan) else plan_steps
    total = 0.0
    for s in steps:
        if isinstance(s, OrdinaryCall):
            total += cost.launch_us(vdevice) + cost.ordinary_us(graph.op(s.op), vdevice)
        else:
            total += simulate_program(s, graph, vdevice, cost, sync).total_us
    return total


def ideal_us(graph: RGraph, vdevice: VDevice, cost: CostModel) -> float:
    """A lower bound on any plan (launches not counted), from the same cost model as the
    estimates: the larger of
    - the critical path with each op taking one rTask of its quickest-per-rTask kernel, at
      width 1 (an rTask alone has an SM to itself: the least time any width gives it), and
    - all work (each op's least rTasks x time with every vEU busy) spread over the vEUs:
      at a smaller width an rTask is quicker only by the share of the device it gets, so the
      vEU-time per unit of device is least with every vEU busy.
    An ordinary op holds the whole device: its time counts fully in both."""
    n = vdevice.num_veu
    path: dict[str, float] = {}
    work = 0.0
    for op in graph:
        if op.supported:
            path[op.name] = min(cost.rtask_us_at(op, k, vdevice, 1) for k in op.rkernels)
            work += min(cost.work_us(op, k, vdevice) for k in op.rkernels)
        else:
            t = cost.ordinary_us(op, vdevice)
            path[op.name] = t
            work += t * n
    if not path:
        return 0.0
    return max(graph.critical_path(path.__getitem__), work / n)
