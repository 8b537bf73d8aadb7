"""Candidate fusion patterns of FusionStitching and their scores.

FusionStitching (Zheng et al., "FusionStitching: Boosting Memory Intensive Computations for
Deep Learning Workloads", 2020, section 4) enumerates candidate patterns, scores each with a
cost model and lets a solver pick a non-overlapping set. Three generators:

* **substitution fusion**: maximal regions of memory-bound operators (elementwise,
  broadcast, injective, reduction), cut at compute-bound ones; a region may also take the
  compute-bound operators that feed it as *sources* (GEMM or convolution epilogues, and
  several identical GEMMs of one wave side by side, as an LSTM cell's gate GEMMs);
* **exploratory fusion**: every connected set of up to ``explore_size`` operators;
* **horizontal packing**: independent operators of the same wave in one kernel, alone and
  stitched with the regions of their members.

Every candidate is checked here: it is convex (no path leaves and re-enters it) and it makes
no independent operators dependent, except through operators packed side by side
(:func:`no_new_dependency`). Cycles that only a *combination* of patterns makes are the
solver's job (``stitch_ilp``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import combinations

from ..core import DeviceSpec
from .stitch_graph import COMPUTE, REDUCE, OpGraph

ORDINARY_LAUNCHES = 2


@dataclass(frozen=True)
class Limits:
    """Bounds of the search: pattern size, results per kernel, exploration depth, pack width.

    ``max_outputs`` matters beyond cost: a kernel with several results used outside is a
    multi-output ``call_tir``, which the planner keeps as an ordinary call between rPrograms
    (see docs/fusion.md).
    """

    max_size: int = 48
    max_outputs: int = 8
    explore_size: int = 3
    pack: int = 8


@dataclass(frozen=True)
class Pattern:
    """A set of operators to fuse into one kernel, its score (us saved) and its generator."""

    nodes: frozenset[int]
    score: float
    origin: str


def bits(mask: int):
    """Indices of the set bits of ``mask``."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def to_mask(members) -> int:
    mask = 0
    for m in members:
        mask |= 1 << m
    return mask


def _closure(g: OpGraph, members: list[int]) -> list[int]:
    """Local bitsets: k reaches l through original paths or side-by-side (independent) pairs."""
    n = len(members)
    reach = [1 << k for k in range(n)]
    for k, a in enumerate(members):
        for j, b in enumerate(members):
            if k != j and (g.reaches(a, b) or g.independent(a, b)):
                reach[k] |= 1 << j
    for mid in range(n):
        for k in range(n):
            if (reach[k] >> mid) & 1:
                reach[k] |= reach[mid]
    return reach


def no_new_dependency(g: OpGraph, members: list[int], mask: int) -> bool:
    """Fusing ``members`` orders no two independent operators, except through a side-by-side pair.

    After fusion every external predecessor of the group precedes every member and every
    external successor follows every member. That is allowed when the original graph, with
    the group's independent pairs made mutually reachable, already had that order: a
    predecessor reaches all members, and every member reaches every successor. Fusing
    ``add(a, b)`` into a's branch fails (b would now precede a); packing a, b and the add
    together passes.
    """
    reach = _closure(g, members)
    full = (1 << len(members)) - 1
    ext_preds, ext_succs = set(), set()
    for m in members:
        ext_preds.update(p for p in g.nodes[m].preds if not (mask >> p) & 1)
        ext_succs.update(s for s in g.nodes[m].succs if not (mask >> s) & 1)
    for p in ext_preds:
        covered = 0
        for k, m in enumerate(members):
            if g.reaches(p, m):
                covered |= reach[k]
        if covered != full:
            return False
    for s in ext_succs:
        exits = to_mask(k for k, m in enumerate(members) if g.reaches(m, s))
        if any(not (r & exits) for r in reach):
            return False
    return True


def outputs(g: OpGraph, members, mask: int) -> list[int]:
    """Members whose result is read outside the group (or leaves the dataflow block)."""
    return [
        m
        for m in members
        if g.nodes[m].escaping or any(not (mask >> s) & 1 for s in g.nodes[m].succs)
    ]


def is_valid(g: OpGraph, members, limits: Limits, final: bool = True) -> bool:
    """Whether ``members`` can become one kernel (see the module docstring); ``final=False``
    skips the output count, for regions still growing towards their consumers."""
    members = sorted(members)
    if not members or len(members) > limits.max_size:
        return False
    nodes = [g.nodes[m] for m in members]
    if not all(n.fusable for n in nodes):
        return False
    if len(members) == 1:
        return True
    mask = to_mask(members)
    results = len(outputs(g, members, mask))
    if final and results > limits.max_outputs:
        return False
    computes = [n for n in nodes if n.kind == COMPUTE]
    if final and len(computes) > 1 and results == 1:
        # A single-output kernel becomes an rKernel, and the CPU rKernel maker nests the
        # second GEMM / pooling under the first one's chunk loop: rTasks then read each
        # other's intermediates (wrong numbers on nasnet_cifar at num_veu=2). Several
        # compute-bound sources stay in multi-output kernels, which run as ordinary calls.
        return False
    if len({n.func for n in computes}) > 1:
        return False  # only identical GEMMs / convolutions side by side
    for c in computes:
        if g.anc[c.index] & mask:
            return False  # compute-bound operators are cut points: sources only
        if any(g.nodes[d].kind == REDUCE for d in bits(g.desc[c.index] & mask)):
            return False  # no schedule rule takes a GEMM followed by a reduction
    desc = anc = 0
    for m in members:
        desc |= g.desc[m]
        anc |= g.anc[m]
    if desc & anc & ~mask:
        return False  # not convex: the fused kernel would depend on itself
    sources = [m for m in members if not (g.anc[m] & mask)]
    for a, b in combinations(sources, 2):
        if not g.windows_overlap(a, b):
            return False  # side by side only within one wave
    return no_new_dependency(g, members, mask)


def score(g: OpGraph, members, spec: DeviceSpec) -> float:
    """Microseconds saved: launches of all but one member, plus memory traffic no longer
    paid (intermediates neither written nor read back, shared inputs read once).

    A multi-output kernel stays an ordinary call between rPrograms: it is charged
    :data:`ORDINARY_LAUNCHES` launches (its own and the rProgram it splits).
    """
    members = list(members)
    mask = to_mask(members)
    saved = 0
    reads: Counter = Counter()
    sizes: dict = {}
    for m in members:
        node = g.nodes[m]
        inside = sum(1 for s in node.succs if (mask >> s) & 1)
        outside = node.escaping or any(not (mask >> s) & 1 for s in node.succs)
        if inside:
            saved += node.out_bytes * (inside + (0 if outside else 1))
        for key, size in node.inputs.items():
            reads[key] += 1
            sizes[key] = size
        for p in node.preds:
            if not (mask >> p) & 1:
                reads[("node", p)] += 1
                sizes[("node", p)] = g.nodes[p].out_bytes
    saved += sum((count - 1) * sizes[key] for key, count in reads.items())
    launches = len(members) - 1
    if len(outputs(g, members, mask)) > 1:
        launches -= ORDINARY_LAUNCHES
    return launches * spec.launch_overhead_us + saved / (spec.bandwidth_gbs * 1e3)


def substitution_patterns(g: OpGraph, limits: Limits) -> list[frozenset[int]]:
    """Memory-bound regions grown in topological order, each alone and with its GEMM sources."""
    region_of: dict[int, int] = {}
    regions: dict[int, set[int]] = {}
    for node in g.nodes:
        if not node.memory_bound:
            continue
        joined = None
        for r in sorted({region_of[p] for p in node.preds if p in region_of}):
            if joined is None and is_valid(g, regions[r] | {node.index}, limits, final=False):
                regions[r].add(node.index)
                joined = r
            elif joined is not None and is_valid(
                g, regions[joined] | regions[r], limits, final=False
            ):
                regions[joined] |= regions.pop(r)
            else:
                continue
            for m in regions[joined]:
                region_of[m] = joined
        if joined is None:
            regions[node.index] = {node.index}
            region_of[node.index] = node.index
    found = []
    for region in regions.values():
        if len(region) > 1:
            found.append(frozenset(region))
        producers: dict[str, set[int]] = {}
        for m in region:
            for p in g.nodes[m].preds:
                if g.nodes[p].kind == COMPUTE:
                    producers.setdefault(g.nodes[p].func, set()).add(p)
        for sources in producers.values():
            if is_valid(g, region | sources, limits, final=False):
                found.append(frozenset(region | sources))
                continue
            found.extend(
                frozenset(region | {c})
                for c in sources
                if is_valid(g, region | {c}, limits, final=False)
            )
    return found


def exploratory_patterns(g: OpGraph, limits: Limits) -> list[frozenset[int]]:
    """Every valid connected set of 2..``size`` operators (bounded exploratory fusion)."""
    seen: set[frozenset[int]] = set()
    found = []
    for node in g.nodes:
        if not node.fusable:
            continue
        frontier = [frozenset([node.index])]
        for _ in range(limits.explore_size - 1):
            grown = []
            for group in frontier:
                neighbours = {x for m in group for x in g.nodes[m].preds + g.nodes[m].succs}
                for x in sorted(neighbours - group):
                    candidate = group | {x}
                    if candidate in seen:
                        continue
                    seen.add(candidate)
                    if is_valid(g, candidate, limits, final=False):
                        grown.append(candidate)
            found.extend(grown)
            frontier = grown
    return found


def horizontal_patterns(g: OpGraph, limits: Limits) -> list[frozenset[int]]:
    """Independent operators of one wave (and one callee, for compute-bound ones) packed."""
    buckets: dict[tuple, list[int]] = {}
    for node in g.nodes:
        if node.fusable:
            key = (g.asap[node.index], node.func if node.kind == COMPUTE else "")
            buckets.setdefault(key, []).append(node.index)
    found = []
    for members in buckets.values():
        current: list[int] = []
        for m in members:
            if current and (
                len(current) >= limits.pack or not is_valid(g, current + [m], limits, False)
            ):
                if len(current) > 1:
                    found.append(frozenset(current))
                current = []
            current.append(m)
        if len(current) > 1:
            found.append(frozenset(current))
    return found


def stitched_packs(
    g: OpGraph, packs: list[frozenset[int]], regions: list[frozenset[int]], limits: Limits
) -> list[frozenset[int]]:
    """Each horizontal pack united with the largest region around each of its members."""
    largest: dict[int, frozenset[int]] = {}
    for region in regions:
        for m in region:
            if len(region) > len(largest.get(m, ())):
                largest[m] = region
    found = []
    for pack in packs:
        union = set(pack)
        for m in pack:
            union |= largest.get(m, frozenset())
        if len(union) > len(pack) and is_valid(g, union, limits, final=False):
            found.append(frozenset(union))
    return found


def candidate_patterns(g: OpGraph, spec: DeviceSpec, limits: Limits | None = None) -> list[Pattern]:
    """All candidates of the three generators that are valid kernels, with their scores.

    The generators work on structure alone; the output count is checked last, so that a
    region may grow through operators whose results it only later consumes itself.
    """
    limits = limits or Limits()
    regions = substitution_patterns(g, limits)
    packs = horizontal_patterns(g, limits)
    generated = [
        ("substitution", regions),
        ("horizontal", packs),
        ("stitched", stitched_packs(g, packs, regions, limits)),
        ("exploratory", exploratory_patterns(g, limits)),
    ]
    patterns: dict[frozenset[int], Pattern] = {}
    for origin, groups in generated:
        for group in groups:
            if len(group) > 1 and group not in patterns and is_valid(g, group, limits):
                patterns[group] = Pattern(group, score(g, group, spec), origin)
    return list(patterns.values())
