"""A fast estimate of one *stage*: a set of operators started together after a global
barrier, each operator's rTasks on the vEUs where they start earliest.

Policies that search over many candidate stages (IOS's dynamic program) cannot afford an
rProgram per candidate. :func:`stage_schedule` simulates the stage on ``n`` vEUs that are
all free at time 0, counting a barrier before an operator's first rTask on a vEU whenever a
predecessor inside the stage ran on another vEU (a pessimistic rule: the real program may
know those tasks finished already). The placement it returns can be replayed into an
rProgram (``ProgramBuilder.replay``); with the same vEUs and order, and barriers that are
never more numerous, the real stage takes at most the estimate.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..core.graph import RGraph
from ..core.rkernel import RKernel
from ..core.vdevice import VDevice
from .builder import Placed, _max_excluding_self
from .cost import CostModel


@dataclass
class StagePlan:
    """``ops`` in placement order, each with its rTask count per vEU and local finish."""

    ops: list[str]
    counts: dict[str, np.ndarray]
    starts: dict[str, np.ndarray]
    durations: dict[str, float]
    makespan_us: float

    def placed(self, kernels: dict[str, RKernel]) -> list[Placed]:
        """rTask ids in order of their estimated start (ties: lower vEU first)."""
        out: list[Placed] = []
        for name in self.ops:
            c, s0, d = self.counts[name], self.starts[name], self.durations[name]
            veus = np.repeat(np.arange(len(c)), c)
            rank = np.arange(len(veus)) - np.repeat(np.cumsum(c) - c, c)  # m-th task there
            start = s0[veus] + rank * d
            order = np.lexsort((veus, start))
            k = kernels[name].name
            out.extend(Placed(name, r, k, int(v)) for r, v in enumerate(veus[order].tolist()))
        return out


def distribute(s0: np.ndarray, d: float, k: int) -> np.ndarray:
    """How many of ``k`` rTasks of ``d`` us each go to each vEU when every rTask, one after
    the other, takes the vEU where it starts earliest (vEU v is free from ``s0[v]``; ties go
    to the lower vEU). Exact heap simulation for few rTasks, a water-filling search for many.
    """
    n = len(s0)
    counts = np.zeros(n, dtype=np.int64)
    if d <= 0:
        counts[int(np.argmin(s0))] = k
        return counts
    if k <= 4 * n:
        # only the k earliest vEUs can get one of k rTasks (the earliest unused one is
        # always at least as early as any vEU outside them)
        veus = np.argsort(s0, kind="stable")[:k].tolist() if k < n else range(n)
        heap = [(float(s0[v]), v) for v in veus]
        heapq.heapify(heap)
        for _ in range(k):
            t, v = heapq.heappop(heap)
            counts[v] += 1
            heapq.heappush(heap, (t + d, v))
        return counts

    def count_le(t: float) -> np.ndarray:
        return np.maximum(np.floor((t - s0) / d) + 1, 0)

    lo = float(s0.min()) - d  # no start is <= lo
    hi = float(s0.min()) + (k - 1) * d  # the first vEU alone has k starts <= hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if count_le(mid).sum() >= k:
            hi = mid
        else:
            lo = mid
    counts = count_le(lo).astype(np.int64)
    rest = k - int(counts.sum())
    if rest > 0:  # the k-th start is a tie at hi: lower vEUs first
        nxt = s0 + counts * d
        tied = np.flatnonzero(nxt <= hi)
        if len(tied) < rest:  # rounding: take the earliest next starts
            tied = np.lexsort((np.arange(n), nxt))
        counts[tied[:rest]] += 1
    return counts


def stage_schedule(
    ops: list[str],
    kernels: dict[str, RKernel],
    graph: RGraph,
    vdevice: VDevice,
    cost: CostModel,
    durations: dict | None = None,
) -> StagePlan:
    """Place ``ops`` (topologically ordered) one after the other on free vEUs; see module."""
    n = vdevice.num_veu
    bar = cost.barrier_us(vdevice)
    durations = {} if durations is None else durations
    inside = set(ops)
    counts: dict[str, np.ndarray] = {}
    starts: dict[str, np.ndarray] = {}
    local: dict[str, float] = {}
    widths = depth_widths(ops, kernels, graph, n)
    if n <= _SMALL:
        return _stage_small(ops, kernels, graph, vdevice, cost, durations, bar, widths)
    free = np.zeros(n)
    finish: dict[str, np.ndarray] = {}
    used: dict[str, np.ndarray] = {}
    for name in ops:
        d = _duration(name, kernels, graph, vdevice, cost, durations, widths[name])
        local[name] = d
        preds = [p for p in graph.preds(name) if p in inside]
        if preds:
            dep_fin = np.maximum.reduce([finish[p] for p in preds])
            present = np.logical_or.reduce([used[p] for p in preds])
            needs = (int(present.sum()) - present) > 0
            s0 = np.maximum(free, _max_excluding_self(dep_fin)) + bar * needs
        else:
            s0 = free.copy()
        c = distribute(s0, d, kernels[name].num_rtasks)
        on = c > 0
        end = s0 + c * d
        counts[name], starts[name], used[name] = c, s0, on
        finish[name] = np.where(on, end, -np.inf)
        free = np.where(on, end, free)
    return StagePlan(list(ops), counts, starts, local, float(free.max()) if ops else 0.0)


_SMALL = 24  # up to this many vEUs plain Python lists beat numpy's per-call overhead


def stage_depths(ops: list[str], graph: RGraph) -> dict[str, int]:
    """Each operator's depth inside the stage ``ops`` (topologically ordered): 0 without a
    predecessor in the stage, else one more than its deepest one. ``ios`` puts each depth
    of a stage in a wave of its own."""
    depth: dict[str, int] = {}
    for op in ops:  # predecessors first
        ds = [depth[p] for p in graph.preds(op) if p in depth]
        depth[op] = 1 + max(ds) if ds else 0
    return depth


def depth_widths(
    ops: list[str], kernels: dict[str, RKernel], graph: RGraph, num_veu: int
) -> dict[str, int]:
    """Each operator's width in the stage: the rTasks of the operators at its depth inside
    the stage (at most every vEU), as ``ProgramBuilder.replay`` counts them when IOS puts
    each depth of a stage in a wave of its own (``ios.py``)."""
    depth = stage_depths(ops, graph)
    tasks: dict[int, int] = {}
    for op, d in depth.items():
        tasks[d] = tasks.get(d, 0) + kernels[op].num_rtasks
    return {op: max(1, min(tasks[depth[op]], num_veu)) for op in ops}


def _duration(
    name: str,
    kernels: dict[str, RKernel],
    graph: RGraph,
    vdevice: VDevice,
    cost: CostModel,
    durations: dict,
    width: int,
) -> float:
    """One rTask of ``name`` at ``width`` (cached per operator and width)."""
    key = (name, width)
    d = durations.get(key)
    if d is None:
        d = durations[key] = cost.rtask_us_at(graph.op(name), kernels[name], vdevice, width)
    return d


def _stage_small(
    ops: list[str],
    kernels: dict[str, RKernel],
    graph: RGraph,
    vdevice: VDevice,
    cost: CostModel,
    durations: dict,
    bar: float,
    widths: dict[str, int],
) -> StagePlan:
    """:func:`stage_schedule` with lists: the same rules, for few vEUs."""
    n = vdevice.num_veu
    inside = set(ops)
    free = [0.0] * n
    neg = float("-inf")
    counts: dict[str, np.ndarray] = {}
    starts: dict[str, np.ndarray] = {}
    local: dict[str, float] = {}
    finish: dict[str, list[float]] = {}
    for name in ops:
        d = local[name] = _duration(name, kernels, graph, vdevice, cost, durations, widths[name])
        preds = [finish[p] for p in graph.preds(name) if p in inside]
        if preds:
            fin = [max(col) for col in zip(*preds, strict=True)] if len(preds) > 1 else preds[0]
            present = [f > neg for f in fin]
            others = sum(present)
            top = max(fin)
            i = fin.index(top)
            second = max(fin[:i] + fin[i + 1 :], default=neg)
            s0 = [
                max(free[v], second if v == i else top) + (bar if others - present[v] > 0 else 0.0)
                for v in range(n)
            ]
        else:
            s0 = list(free)
        k = kernels[name].num_rtasks
        c = [0] * n
        if d <= 0:
            c[s0.index(min(s0))] = k
        else:
            heap = list(zip(s0, range(n), strict=True))
            heapq.heapify(heap)
            for _ in range(k):
                t, v = heapq.heappop(heap)
                c[v] += 1
                heapq.heappush(heap, (t + d, v))
        end = [s0[v] + c[v] * d for v in range(n)]
        finish[name] = [end[v] if c[v] else neg for v in range(n)]
        free = [end[v] if c[v] else free[v] for v in range(n)]
        counts[name] = np.array(c, dtype=np.int64)
        starts[name] = np.array(s0)
    return StagePlan(list(ops), counts, starts, local, max(free) if ops else 0.0)
