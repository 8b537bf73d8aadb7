"""IOS: inter-operator scheduling by dynamic programming (Ding et al., "IOS: Inter-Operator
Scheduler for CNN Acceleration", MLSys 2021, section 4, Algorithm 1).

A schedule is a sequence of *stages*; the operators of a stage start together after a global
barrier. IOS finds the best sequence with a dynamic program over the set ``S`` of operators
still to run:

    cost(S) = min over endings E of S of  cost(S - E) + latency(E),    cost({}) = 0,

where an *ending* ``E`` of ``S`` is a non-empty subset none of whose operators has a
successor in ``S - E`` (so ``S - E`` can run first). A stage runs its *groups* (the weakly
connected components of ``E``; operators of a group one after the other, groups side by
side) concurrently. Pruning (section 4.3): at most ``s`` groups of at most ``r`` operators
each (defaults r=3, s=8, as in the paper). Large graphs are cut, in BFS-level order (a
topological order that keeps parallel branches together), into parts of at most
``part_size`` operators (100) scheduled one after the other; a part whose
dynamic program visits more than ``max_endings`` endings is halved, and later parts stay
below the size that ran over (trying larger ones now and then), so the search stays bounded
on wide graphs.

Mapping onto persistent kernels: all stages of a run of supported operators form one
rProgram; every vEU passes a global barrier (waiting for all tasks of the previous stage)
before its first rTask of a stage. Inside a stage, the rTasks of each operator take the
earliest available vEU (``stage.stage_schedule``, also the DP's ``latency(E)``, plus one
barrier) and wait with fine barriers for their predecessors of the same group. The ``wave``
field of an rTask is its *phase*: a stage whose groups are d operators deep spans d phases
(operators ordered by depth in the group), so that a lowering that puts a global barrier
between waves (CPU ``barrier="global"``) stays correct. Operators that cannot be rTasks
split the rProgram and run as ordinary calls, as in every policy.

IOS's other stage strategy, *operator merge* (convolutions that share an input run as one
wider convolution, section 4.2), is a choice of this dynamic program when ``merges`` tags
the mergeable operators: an ending made only of operators of one merge group costs the
less of running them side by side and running them as one convolution (the kernels padded
to the largest, so FLOPs grow by each member's ``scale``). :func:`choose_merges` returns the
sets the DP merged; ``relax_passes.ios_merge`` rewrites exactly those with
``relax_passes.merge_convs`` and plans again.
"""

from __future__ import annotations

from ..core.graph import RGraph, ROperator
from ..core.plan import OrdinaryCall
from ..core.rkernel import RKernel
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from ..errors import OptionError
from .builder import ProgramBuilder
from .cost import CostModel
from .limits import LIMIT_OPTIONS, ProgramLimit, check_limit_options
from .policy import Policy
from .stage import stage_depths, stage_schedule


class _OverBudget(Exception):
    """The dynamic program of one part visited more endings than allowed."""


class _Part:
    """The dynamic program over one part (``names`` in topological order, bit i = names[i])."""

    def __init__(
        self,
        names: list[str],
        graph: RGraph,
        kernels: dict[str, RKernel],
        vdevice: VDevice,
        cost: CostModel,
        r: int,
        s: int,
        budget: int,
        durations: dict[tuple[str, int], float],
        latencies: dict[tuple[str, ...], float],
        merges: dict[str, tuple[str, float]] | None = None,
    ) -> None:
        self.names = names
        self.merges = merges or {}
        self.merged: set[int] = set()  # endings whose best strategy is operator merge
        self.graph, self.kernels, self.vdevice, self.cost = graph, kernels, vdevice, cost
        self.r, self.s, self.budget = r, s, budget
        self.durations = durations
        self.bar = cost.barrier_us(vdevice)
        index = {n: i for i, n in enumerate(names)}
        m = len(names)
        self.succ = [0] * m
        self.preds: list[list[int]] = [[] for _ in range(m)]
        for i, n in enumerate(names):
            for p in graph.preds(n):
                j = index.get(p)
                if j is not None:
                    self.succ[j] |= 1 << i
                    self.preds[i].append(j)
        self.memo: dict[int, tuple[float, int]] = {0: (0.0, 0)}
        self.latencies: dict[int, float] = {}
        self.shared = latencies  # by operator names: survives a part's split
        self.visited = 0

    def stages(self) -> list[list[str]]:
        """The best stages, first to last, each in placement order (by depth, then index)."""
        full = (1 << len(self.names)) - 1
        self._best(full)
        out = []
        self.merged_stages: list[list[str]] = []
        state = full
        while state:
            _, ending = self.memo[state]
            out.append(self.ordered(ending))
            if ending in self.merged:
                self.merged_stages.append(out[-1])
            state &= ~ending
        out.reverse()
        self.merged_stages.reverse()
        return out

    def _best(self, state: int) -> float:
        hit = self.memo.get(state)
        if hit is not None:
            return hit[0]
        best, choice = float("inf"), 0
        for ending in self._endings(state):
            c = self._best(state & ~ending) + self._latency(ending)
            if c < best:
                best, choice = c, ending
        self.memo[state] = (best, choice)
        return best

    def _endings(self, state: int) -> list[int]:
        """Endings of ``state`` that obey the pruning, each generated once: operators are
        added in decreasing index order, and an operator may join only when all its
        successors in ``state`` are in already."""
        succ, preds, r, s = self.succ, self.preds, self.r, self.s
        cap = r * s
        sinks = [i for i in _bits(state) if not succ[i] & state]
        out: list[int] = []

        def grow(ending: int, size: int, last: int, cands: list[int], groups: list[int]) -> None:
            for x in cands:
                if x >= last:
                    continue
                self.visited += 1
                if self.visited > self.budget:
                    raise _OverBudget
                bit = 1 << x
                joined = bit
                rest = []
                for g in groups:
                    if g & succ[x]:
                        joined |= g
                    else:
                        rest.append(g)
                if joined.bit_count() > r:
                    continue  # groups only grow: no superset of this ending is allowed
                new_ending = ending | bit
                new_groups = [*rest, joined]
                if len(new_groups) <= s:
                    out.append(new_ending)
                if size + 1 >= cap:
                    continue
                more = [
                    p for p in preds[x] if (state >> p) & 1 and not succ[p] & state & ~new_ending
                ]
                nxt = sorted({*(c for c in cands if c < x), *more}, reverse=True)
                grow(new_ending, size + 1, x, nxt, new_groups)

        grow(0, 0, len(self.names), sorted(sinks, reverse=True), [])
        return out

    def ordered(self, ending: int) -> list[str]:
        """Operators of a stage by depth inside their group, then topological index."""
        depth: dict[int, int] = {}
        for i in _bits(ending):  # increasing index: predecessors first
            ds = [depth[p] for p in self.preds[i] if (ending >> p) & 1]
            depth[i] = 1 + max(ds) if ds else 0
        return [self.names[i] for i in sorted(depth, key=lambda i: (depth[i], i))]

    def _latency(self, ending: int) -> float:
        t = self.latencies.get(ending)
        if t is None:
            ops = tuple(self.ordered(ending))
            t = self.shared.get(ops)
            if t is None:
                plan = stage_schedule(
                    list(ops), self.kernels, self.graph, self.vdevice, self.cost, self.durations
                )
                t = self.shared[ops] = plan.makespan_us + self.bar
            merged = self._merged_latency(ops)
            if merged < t:
                t = merged
                self.merged.add(ending)
            self.latencies[ending] = t
        return t

    def _merged_latency(self, ops: tuple[str, ...]) -> float:
        """The stage run as one merged convolution, or infinity when ``ops`` cannot merge
        (not all tagged, or tagged in different groups)."""
        tags = [self.merges.get(n) for n in ops]
        if len(ops) < 2 or None in tags or len({t[0] for t in tags}) != 1:
            return float("inf")
        members = [self.graph.op(n) for n in ops]
        kernels = [self.kernels[n] for n in ops]
        op = ROperator(
            name="+".join(ops),
            func="",
            pattern="out_ewise_fusable",
            flops=sum(m.flops * t[1] for m, t in zip(members, tags, strict=True)),
            bytes=sum(m.bytes for m in members),
            rkernels=[
                RKernel(
                    name="merged",
                    num_rtasks=sum(k.num_rtasks for k in kernels),
                    threads=max(k.threads for k in kernels),
                    shared_mem=max(k.shared_mem for k in kernels),
                )
            ],
        )
        plan = stage_schedule(
            [op.name], {op.name: op.rkernels[0]}, RGraph([op]), self.vdevice, self.cost
        )
        return plan.makespan_us + self.bar


def _bits(x: int) -> list[int]:
    """Indices of the set bits of ``x``, increasing."""
    out = []
    i = 0
    while x:
        if x & 1:
            out.append(i)
        x >>= 1
        i += 1
    return out


class IOSPolicy(Policy):
    """IOS stages (dynamic program with pruning) as global-barrier phases of rPrograms."""

    name = "ios"
    DP_OPTIONS = {"r": 3, "s": 8, "part_size": 100, "max_endings": 5_000}
    OPTIONS = {**DP_OPTIONS, **LIMIT_OPTIONS}

    def __init__(self, **options) -> None:
        super().__init__(**options)
        check_limit_options(self.name, self.options)
        for key in self.DP_OPTIONS:
            value = self.options[key]
            if not isinstance(value, int) or value < 1:
                raise OptionError(
                    f"policy 'ios': option {key} must be an integer >= 1, not {value!r}"
                )

    def schedule(
        self,
        names: list[str],
        graph: RGraph,
        vdevice: VDevice,
        cost: CostModel,
        kernels: dict[str, RKernel] | None = None,
        merges: dict[str, tuple[str, float]] | None = None,
    ) -> list[list[str]]:
        """The IOS stages of ``names`` (supported operators in topological order).

        With ``merges`` (operator -> (merge group, FLOP scale when merged)) the DP may run a
        stage as one merged operator; those stages are left in ``self.merged_stages``.
        """
        kernels = kernels or {n: cost.fastest(graph.op(n), vdevice) for n in names}
        self.merged_stages: list[list[str]] = []
        durations: dict[tuple[str, int], float] = {}
        latencies: dict[tuple[str, ...], float] = {}
        out: list[list[str]] = []
        limit = size = self.options["part_size"]
        cap, streak = limit + 1, 0  # cap: the smallest part size that ran over lately
        start = 0
        while start < len(names):
            part = names[start : start + size]
            try:
                out += self._part(part, graph, kernels, vdevice, cost, durations, latencies, merges)
            except _OverBudget:
                cap, streak = len(part), 0
                size = max(1, len(part) // 2)  # a part of one operator never runs over
                continue
            start += len(part)
            streak += 1
            if streak % 8 == 0:  # now and then, try larger parts again
                cap = min(limit + 1, 2 * cap)
            size = max(1, min(limit, cap - 1, 2 * size))
        return out

    def _part(
        self,
        names: list[str],
        graph: RGraph,
        kernels: dict[str, RKernel],
        vdevice: VDevice,
        cost: CostModel,
        durations: dict[tuple[str, int], float],
        latencies: dict[tuple[str, ...], float],
        merges: dict[str, tuple[str, float]] | None = None,
    ) -> list[list[str]]:
        o = self.options
        part = _Part(
            names,
            graph,
            kernels,
            vdevice,
            cost,
            o["r"],
            o["s"],
            o["max_endings"],
            durations,
            latencies,
            merges,
        )
        stages = part.stages()
        self.merged_stages += part.merged_stages
        return stages

    def plan(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> list[RProgram | OrdinaryCall]:
        steps: list[RProgram | OrdinaryCall] = []
        for part in self.segments(graph):
            if isinstance(part, OrdinaryCall):
                steps.append(part)
            else:
                steps.append(self._program(part, graph, vdevice, cost, f"rprogram_{len(steps)}"))
        return steps

    def segments(self, graph: RGraph) -> list[list[str] | OrdinaryCall]:
        """The graph cut into rPrograms' operator lists (in :meth:`order`) and ordinary calls:
        an unsupported operator or a program limit (policies/limits.py) ends a segment."""
        parts: list[list[str] | OrdinaryCall] = []
        segment: list[str] = []
        limit = ProgramLimit(graph, self.options)
        for name in self.order(graph):
            supported = graph.op(name).supported
            if segment and (not supported or limit.would_exceed([name])):
                parts.append(segment)
                segment = []
                limit.reset()
            if supported:
                segment.append(name)
                limit.add([name])
            else:
                parts.append(OrdinaryCall(name))
        if segment:
            parts.append(segment)
        return parts

    @staticmethod
    def order(graph: RGraph) -> list[str]:
        """The graph in BFS-level order (graph order inside a level): still topological,
        and operators that may run side by side are neighbours, so cutting it into parts
        keeps parallel branches in the same part even when the model lists them apart."""
        return [n for wave in graph.waves() for n in wave]

    def _program(
        self, names: list[str], graph: RGraph, vdevice: VDevice, cost: CostModel, name: str
    ) -> RProgram:
        kernels = {n: cost.fastest(graph.op(n), vdevice) for n in names}
        builder = ProgramBuilder(graph, vdevice, cost, name, self.sync)
        durations: dict[tuple[str, int], float] = {}
        phase = 0
        for stage in self.schedule(names, graph, vdevice, cost, kernels):
            est = stage_schedule(stage, kernels, graph, vdevice, cost, durations)
            depth = stage_depths(stage, graph)  # placement order puts predecessors first
            builder.begin_stage()
            builder.replay(est.placed(kernels), {op: phase + d for op, d in depth.items()})
            phase += 1 + max(depth.values())
        return builder.program


def choose_merges(
    graph: RGraph,
    vdevice: VDevice,
    cost: CostModel,
    merges: dict[str, tuple[str, float]],
    **options,
) -> list[list[str]]:
    """The operator sets IOS's dynamic program chooses to run merged (section 4.2).

    ``merges`` tags each mergeable operator with its group (operators of one group read the
    same input and may become one convolution) and the factor by which its FLOPs grow when
    its kernel is padded to the group's largest. ``options`` are the policy's: the segments
    are those :class:`IOSPolicy` plans with the same options.
    """
    policy = IOSPolicy(**options)
    chosen: list[list[str]] = []
    for segment in policy.segments(graph):
        if not isinstance(segment, OrdinaryCall) and any(n in merges for n in segment):
            policy.schedule(segment, graph, vdevice, cost, merges=merges)
            chosen += policy.merged_stages
    return chosen
