"""Choosing the fusion plan: an ILP over candidate patterns, repaired until acyclic.

FusionStitching (section 4.3) maximises the summed scores of the chosen patterns subject to
"overlapping patterns exclude each other", solved here with ``scipy.optimize.milp`` (HiGHS).
Patterns that are each convex can still form a cycle together (P1 feeds P2 and P2 feeds P1);
the fused graph is checked with networkx and every cycle found becomes one more constraint
("not all patterns of this cycle"), until the plan is acyclic.

Overlap constraints are written per operator: the patterns containing one operator sum to
at most 1. That row implies the pairwise constraint ``x_P + x_Q <= 1`` of every two
patterns sharing the operator, with one row per operator instead of one per pair (a dense
model has thousands of overlapping pairs) and a tighter LP relaxation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from .stitch_graph import OpGraph
from .stitch_patterns import Pattern


@dataclass
class Selection:
    """The chosen patterns and the cycle constraints the ILP loop had to add."""

    patterns: list[Pattern]
    cycle_cuts: list[list[int]] = field(default_factory=list)  # pattern indices per cut


def fused_graph(g: OpGraph, chosen: list[Pattern]) -> nx.DiGraph:
    """The graph of kernels: one node per chosen pattern (``("p", i)``), others alone."""
    group = {}
    for i, pattern in enumerate(chosen):
        for m in pattern.nodes:
            group[m] = ("p", i)
    fused = nx.DiGraph()
    for node in g.nodes:
        here = group.get(node.index, ("op", node.index))
        fused.add_node(here)
        for s in node.succs:
            there = group.get(s, ("op", s))
            if there != here:
                fused.add_edge(here, there)
    return fused


def find_cycles(g: OpGraph, chosen: list[Pattern]) -> list[list[int]]:
    """One cycle per non-trivial strongly connected component, as indices into ``chosen``."""
    fused = fused_graph(g, chosen)
    cycles = []
    for component in nx.strongly_connected_components(fused):
        if len(component) < 2:
            continue
        edges = nx.find_cycle(fused.subgraph(component))
        cycles.append(sorted({u[1] for u, _ in edges if u[0] == "p"}))
    return cycles


def greedy_select(patterns: list[Pattern]) -> list[Pattern]:
    """Highest score first, skipping overlaps: the baseline that may leave cycles."""
    taken: set[int] = set()
    chosen = []
    for pattern in sorted(patterns, key=lambda p: -p.score):
        if not pattern.nodes & taken:
            chosen.append(pattern)
            taken |= pattern.nodes
    return chosen


def _solve(patterns: list[Pattern], cuts: list[list[int]]) -> list[int]:
    rows, cols, upper = [], [], []
    by_node: dict[int, list[int]] = {}
    for j, pattern in enumerate(patterns):
        for m in pattern.nodes:
            by_node.setdefault(m, []).append(j)
    for members in by_node.values():
        if len(members) > 1:
            rows.extend([len(upper)] * len(members))
            cols.extend(members)
            upper.append(1)
    for cut in cuts:
        rows.extend([len(upper)] * len(cut))
        cols.extend(cut)
        upper.append(len(cut) - 1)
    n = len(patterns)
    constraints = []
    if upper:
        matrix = coo_array((np.ones(len(rows)), (rows, cols)), shape=(len(upper), n)).tocsr()
        constraints.append(LinearConstraint(matrix, -np.inf, np.array(upper, dtype=float)))
    result = milp(
        c=-np.array([p.score for p in patterns]),
        constraints=constraints,
        integrality=np.ones(n),
        bounds=Bounds(0, 1),
    )
    if result.x is None:
        raise RuntimeError(f"fusion ILP failed: {result.message}")
    return [j for j in range(n) if result.x[j] > 0.5]


def ilp_select(g: OpGraph, patterns: list[Pattern], max_rounds: int = 100) -> Selection:
    """The best non-overlapping, acyclic set of positive-score patterns."""
    patterns = [p for p in patterns if p.score > 0]
    if not patterns:
        return Selection([])
    cuts: list[list[int]] = []
    for _ in range(max_rounds):
        picked = _solve(patterns, cuts)
        chosen = [patterns[j] for j in picked]
        cycles = find_cycles(g, chosen)
        if not cycles:
            return Selection(chosen, cuts)
        cuts.extend([picked[k] for k in cycle] for cycle in cycles)
    # Not converged: drop the patterns of the remaining cycles (always acyclic: singletons).
    bad = {k for cycle in find_cycles(g, chosen) for k in cycle}
    return Selection([p for k, p in enumerate(chosen) if k not in bad], cuts)
