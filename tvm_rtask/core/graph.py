"""The rOperator dataflow graph (Rammer section 3.1) and its waves (section 4.2).

Edges are derived from tensor names only (A -> B iff B reads a tensor A writes), so the
graph is cheap to build from anything that names tensors: a Relax function, a test, JSON.
All algorithms here are O(V + E) so that 10,000-operator graphs stay instant.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionError, PlanError
from .rkernel import RKernel

PATTERNS = (
    "elemwise",
    "broadcast",
    "injective",
    "reduce",
    "out_ewise_fusable",
    "tuple",
    "opaque",
)


@dataclass
class ROperator:
    """One operator of the model (a Relax ``call_tir`` after fusion) and its rKernel variants.

    ``supported=False`` keeps the operator an ordinary kernel launch between rPrograms;
    ``reason`` says why, for the report.
    """

    name: str
    func: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    pattern: str = "opaque"
    flops: float = 0.0
    bytes: float = 0.0
    rkernels: list[RKernel] = field(default_factory=list)
    supported: bool = True
    reason: str = ""

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise OptionError(
                f"operator {self.name!r}: pattern {self.pattern!r} is not one of {PATTERNS}"
            )
        if self.flops < 0 or self.bytes < 0:
            raise OptionError(f"operator {self.name!r}: flops and bytes must be >= 0")
        if self.supported and not self.rkernels:
            raise OptionError(
                f"operator {self.name!r} has no rKernel: give it at least one, "
                "or mark it supported=False with a reason"
            )
        names = [k.name for k in self.rkernels]
        if len(set(names)) != len(names):
            raise OptionError(f"operator {self.name!r}: rKernel names repeat: {names}")

    def kernel(self, name: str) -> RKernel:
        """The rKernel called ``name``; a PlanError lists the variants that exist."""
        for k in self.rkernels:
            if k.name == name:
                return k
        raise PlanError(
            f"operator {self.name!r} has no rKernel {name!r}; "
            f"it has {[k.name for k in self.rkernels]}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "func": self.func,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "pattern": self.pattern,
            "flops": self.flops,
            "bytes": self.bytes,
            "rkernels": [k.to_dict() for k in self.rkernels],
            "supported": self.supported,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ROperator:
        d = dict(d)
        d["rkernels"] = [RKernel.from_dict(k) for k in d.get("rkernels", [])]
        return cls(**d)


class RGraph:
    """A DAG of rOperators kept in a topological order.

    The given order is kept when it already is topological (the model's own order is a
    good launch order); otherwise a stable topological sort (earliest given first) is used.
    """

    def __init__(self, operators: Iterable[ROperator]) -> None:
        given = list(operators)
        index: dict[str, int] = {}
        for i, op in enumerate(given):
            if op.name in index:
                raise PlanError(f"two operators are called {op.name!r}: names must be unique")
            index[op.name] = i
        producer: dict[str, int] = {}
        for i, op in enumerate(given):
            for t in op.outputs:
                j = producer.get(t)
                if j is not None and j != i:
                    raise PlanError(
                        f"tensor {t!r} is written by both {given[j].name!r} and {op.name!r}"
                    )
                producer[t] = i
        preds: list[list[int]] = []
        for i, op in enumerate(given):
            ps: list[int] = []
            seen: set[int] = set()
            for t in op.inputs:
                j = producer.get(t)
                if j is None or j in seen:
                    continue
                seen.add(j)
                if j == i:
                    raise PlanError(
                        f"operators form a cycle: {op.name!r} reads {t!r}, which it writes itself"
                    )
                ps.append(j)
            preds.append(ps)
        order = _topological(given, preds)
        self._ops: list[ROperator] = [given[i] for i in order]
        self._by_name: dict[str, ROperator] = {op.name: op for op in self._ops}
        self._pos: dict[str, int] = {op.name: k for k, op in enumerate(self._ops)}
        self._preds: dict[str, list[str]] = {
            given[i].name: [given[j].name for j in preds[i]] for i in range(len(given))
        }
        self._succs: dict[str, list[str]] = {op.name: [] for op in self._ops}
        for op in self._ops:
            for p in self._preds[op.name]:
                self._succs[p].append(op.name)
        self._producer: dict[str, str] = {t: given[i].name for t, i in producer.items()}
        self._waves: list[list[str]] | None = None

    # -- queries ---------------------------------------------------------------------------
    @property
    def ops(self) -> list[ROperator]:
        """Operators in topological order."""
        return list(self._ops)

    @property
    def names(self) -> list[str]:
        """Operator names in topological order."""
        return [op.name for op in self._ops]

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self) -> Iterator[ROperator]:
        return iter(self._ops)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RGraph) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def op(self, name: str) -> ROperator:
        try:
            return self._by_name[name]
        except KeyError:
            raise PlanError(f"operator {name!r} is not in the graph") from None

    def index(self, name: str) -> int:
        """Position of ``name`` in the topological order."""
        self.op(name)
        return self._pos[name]

    def preds(self, name: str) -> list[str]:
        self.op(name)
        return list(self._preds[name])

    def succs(self, name: str) -> list[str]:
        self.op(name)
        return list(self._succs[name])

    def producer(self, tensor: str) -> str | None:
        """The operator that writes ``tensor``; None for graph inputs and constants."""
        return self._producer.get(tensor)

    def levels(self) -> dict[str, int]:
        """Rammer's BFS level: 0 without predecessors, else 1 + the largest level of a pred."""
        level: dict[str, int] = {}
        for op in self._ops:
            ps = self._preds[op.name]
            level[op.name] = 1 + max(level[p] for p in ps) if ps else 0
        return level

    def waves(self) -> list[list[str]]:
        """Ops grouped by level (the wavefront's BFS fringes); graph order inside a wave."""
        if self._waves is None:
            waves: list[list[str]] = []
            for name, lv in self.levels().items():
                if lv == len(waves):
                    waves.append([])
                waves[lv].append(name)
            self._waves = waves
        return [list(w) for w in self._waves]

    def critical_path(self, weight: Callable[[str], float]) -> float:
        """Length of the heaviest path, each op counted with ``weight(op_name)``."""
        dist: dict[str, float] = {}
        best = 0.0
        for op in self._ops:
            ps = self._preds[op.name]
            d = weight(op.name) + (max(dist[p] for p in ps) if ps else 0.0)
            dist[op.name] = d
            best = max(best, d)
        return best

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"operators": [op.to_dict() for op in self._ops]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RGraph:
        return cls(ROperator.from_dict(o) for o in d["operators"])

    def __repr__(self) -> str:
        return f"RGraph({len(self._ops)} operators, {len(self.waves())} waves)"


def _topological(ops: list[ROperator], preds: list[list[int]]) -> list[int]:
    """Keep the given order if it is topological, else Kahn's algorithm taking the earliest."""
    n = len(ops)
    if all(j < i for i in range(n) for j in preds[i]):
        return list(range(n))
    indeg = [len(p) for p in preds]
    succs: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for j in preds[i]:
            succs[j].append(i)
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    if len(order) < n:
        raise PlanError(f"operators form a cycle: {' -> '.join(_find_cycle(ops, preds, indeg))}")
    return order


def _find_cycle(ops: list[ROperator], preds: list[list[int]], indeg: list[int]) -> list[str]:
    """Walk predecessors among the ops Kahn could not free; every such op has one, so it loops."""
    left = {i for i in range(len(ops)) if indeg[i] > 0}
    start = min(left)
    seen: dict[int, int] = {}
    path: list[int] = []
    i = start
    while i not in seen:
        seen[i] = len(path)
        path.append(i)
        i = next(j for j in preds[i] if j in left)
    cycle = path[seen[i] :]
    cycle.reverse()  # walked against the edges; report along them
    k = cycle.index(min(cycle))
    cycle = cycle[k:] + cycle[:k]  # start at the op given first
    names = [ops[j].name for j in cycle]
    return names + [names[0]]
