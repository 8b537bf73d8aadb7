"""IOS: ending enumeration against brute force, the dynamic program, parts and budgets."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.graphs import chain, inception, op, small_dags
from tvm_rtask.core import RGraph, VDevice
from tvm_rtask.policies import AnalyticalCostModel, IOSPolicy, make_plan, simulate
from tvm_rtask.policies.ios import _Part, choose_merges

COST = AnalyticalCostModel()


def part_of(graph: RGraph, vd: VDevice, r: int = 3, s: int = 8, budget: int = 10**9) -> _Part:
    names = [o.name for o in graph if o.supported]
    kernels = {n: COST.fastest(graph.op(n), vd) for n in names}
    return _Part(names, graph, kernels, vd, COST, r, s, budget, {}, {})


def groups(part: _Part, ending: int) -> list[set[int]]:
    """Weakly connected components of ``ending`` (brute force)."""
    left = {i for i in range(len(part.names)) if ending >> i & 1}
    comps = []
    while left:
        todo, comp = [left.pop()], set()
        while todo:
            i = todo.pop()
            comp.add(i)
            nbrs = {j for j in left if part.succ[i] >> j & 1 or part.succ[j] >> i & 1}
            left -= nbrs
            todo += nbrs
        comps.append(comp)
    return comps


def brute_endings(part: _Part, state: int, r: int, s: int) -> set[int]:
    members = [i for i in range(len(part.names)) if state >> i & 1]
    out = set()
    for k in range(1, len(members) + 1):
        for subset in itertools.combinations(members, k):
            e = sum(1 << i for i in subset)
            if any(part.succ[i] & state & ~e for i in subset):
                continue  # an operator of E has a successor left in S - E
            gs = groups(part, e)
            if len(gs) <= s and all(len(g) <= r for g in gs):
                out.add(e)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags(max_ops=8, max_edges=8), st.integers(1, 3), st.integers(1, 3), st.data())
def test_endings_match_brute_force(graph, r, s, data):
    part = part_of(graph, VDevice.cpu(3), r, s)
    m = len(part.names)
    if not m:
        return
    # a state is the complement of a prefix-closed set: take the first k in topological order
    k = data.draw(st.integers(0, m - 1))
    state = ((1 << m) - 1) & ~((1 << k) - 1)
    got = part._endings(state)
    assert len(got) == len(set(got))  # each ending once
    assert set(got) == brute_endings(part, state, r, s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags(max_ops=7, max_edges=7), st.integers(1, 4))
def test_dynamic_program_is_optimal(graph, veus):
    """cost(S) = min over endings: compare with an exhaustive search over stage sequences."""
    vd = VDevice.cpu(veus)
    part = part_of(graph, vd)
    m = len(part.names)
    if not m:
        return

    def brute(state: int) -> float:
        if not state:
            return 0.0
        return min(brute(state & ~e) + part._latency(e) for e in brute_endings(part, state, 3, 8))

    full = (1 << m) - 1
    stages = part.stages()
    assert part.memo[full][0] == pytest.approx(brute(full))
    assert sorted(n for st_ in stages for n in st_) == sorted(part.names)


def test_parallel_branches_share_a_stage():
    g = inception(rtasks=2)
    stages = IOSPolicy().schedule(g.names, g, VDevice.cpu(8), COST)
    assert stages[0] == ["stem"] and stages[-1] == ["concat"]
    middle = [n for st_ in stages[1:-1] for n in st_]
    assert sorted(middle) == ["b1", "b2a", "b2b", "b3a", "b3b", "b4"]
    assert len(stages) == 3  # four branches of at most two operators side by side


def test_stages_become_phases_behind_global_barriers():
    g = inception(rtasks=2)
    plan = make_plan(g, VDevice.cpu(8), "ios")
    (prog,) = plan.programs()
    prog.check_waves(g)
    waves = {t.op: t.wave for t in prog.tasks()}
    # stage 0: stem (phase 0); stage 1: depth 0 -> phase 1, depth 1 (b2b, b3b) -> phase 2
    assert waves["stem"] == 0 and waves["b1"] == waves["b2a"] == waves["b4"] == 1
    assert waves["b2b"] == waves["b3b"] == 2 and waves["concat"] == 3
    # every vEU running concat waited (transitively) for every task before it
    timing = simulate(plan)
    concat_start = min(timing.steps[0].program.spans[("concat", i)][1] for i in range(2))
    assert all(
        end <= concat_start
        for (o, _), (_, _, end) in timing.steps[0].program.spans.items()
        if o != "concat"
    )


def test_budget_halves_parts_and_stays_valid():
    g = RGraph(
        [op(f"p{i}", ["x"], 2) for i in range(12)] + [op("sum", [f"p{i}" for i in range(12)])]
    )
    small = make_plan(g, VDevice.cpu(4), "ios", max_endings=5)
    full = make_plan(g, VDevice.cpu(4), "ios")
    small.validate()
    assert full.estimated_us <= small.estimated_us * (1 + 1e-9)
    assert small.estimated_us <= make_plan(g, VDevice.cpu(4), "sequential").estimated_us


def test_parts_and_unsupported_ops():
    g = chain(7)
    plan = make_plan(g, VDevice.cpu(2), "ios", part_size=3)
    assert len(plan.programs()) == 1
    g = RGraph(
        [op("a", ["x"]), op("e", ["a"], supported=False), op("b", ["a"]), op("c", ["e", "b"])]
    )
    plan = make_plan(g, VDevice.cpu(2), "ios")
    assert [type(s).__name__ for s in plan.steps] == ["RProgram", "OrdinaryCall", "RProgram"]


def test_pruning_limits_group_size():
    # a chain of 4 cannot be one group with r=3: at least two stages
    g = chain(4)
    part = part_of(g, VDevice.cpu(2), r=3, s=8)
    assert max(e.bit_count() for e in part._endings(0b1111)) == 3
    assert len(part.stages()) >= 2


class _MergeFriendly(AnalyticalCostModel):
    """Merged operators (named ``a+b``) ten times cheaper per rTask: the DP must merge."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def rtask_us(self, op, kernel, vdevice):
        base = super().rtask_us(op, kernel, vdevice)
        return base * self.factor if "+" in op.name else base


def _fan_out() -> RGraph:
    """x -> a, b (group g0), c (group g1) -> d joins them."""
    return RGraph(
        [
            op("x", []),
            op("a", ["x"]),
            op("b", ["x"]),
            op("c", ["x"]),
            op("d", ["a", "b", "c"]),
        ]
    )


def test_choose_merges_follows_the_cost_of_each_strategy():
    graph, vd = _fan_out(), VDevice.cpu(2)
    tags = {"a": ("g0", 1.0), "b": ("g0", 1.0), "c": ("g1", 1.0)}
    merged = choose_merges(graph, vd, _MergeFriendly(0.1), tags)
    assert [sorted(s) for s in merged] == [["a", "b"]]  # c is in another group
    assert choose_merges(graph, vd, _MergeFriendly(10.0), tags) == []
    assert choose_merges(graph, vd, _MergeFriendly(0.1), {}) == []


def test_merge_scale_makes_padded_kernels_cost_more():
    graph, vd = _fan_out(), VDevice.cpu(2)
    # merged rTasks are 0.9x as long, but padding a 1x1 to 5x5 multiplies its FLOPs by 25
    assert choose_merges(graph, vd, _MergeFriendly(0.9), {"a": ("g", 1.0), "b": ("g", 1.0)})
    assert not choose_merges(graph, vd, _MergeFriendly(0.9), {"a": ("g", 25.0), "b": ("g", 1.0)})
