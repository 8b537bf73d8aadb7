"""Dependency counters derived from rPrograms: derivation, validation and what they cost."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.graphs import diamond, inception, layered_dags, op
from tvm_rtask.core import RGraph, RProgram, RTask, VDevice
from tvm_rtask.core.counters import (
    Arrive,
    CounterWait,
    check_counter_scripts,
    counter_scripts,
    counter_stats,
)
from tvm_rtask.core.script import Run
from tvm_rtask.errors import DeadlockError, PlanError
from tvm_rtask.policies import AnalyticalCostModel, make_plan

COST = AnalyticalCostModel()


def _task(graph: RGraph, name: str, i: int) -> RTask:
    return RTask(name, i, graph.op(name).rkernels[0].name)


def _spread(graph: RGraph, num_veu: int) -> RProgram:
    """Every operator's tasks round-robin over all vEUs (the wavefront layout)."""
    prog = RProgram(num_veu, "p")
    for rop in graph:
        n = rop.rkernels[0].num_rtasks
        deps = [_task(graph, p, i) for p in graph.preds(rop.name) for i in range(2)]
        for i in range(n):
            t = _task(graph, rop.name, i)
            prog.wait(t, deps)
            prog.append(t, i % num_veu)
    return prog


def test_diamond_waits_once_per_predecessor_and_arrives_per_run():
    g = diamond(rtasks=2)
    prog = _spread(g, 2)
    prog.validate(g)
    scripts = counter_scripts(prog, g)
    check_counter_scripts(prog, g, scripts)
    # vEU 0: a0, wait a, b0, wait ... ; d waits for b and c, never again for a
    waits = [i for i in scripts[0] if isinstance(i, CounterWait)]
    assert [w.ops for w in waits] == [("a",), ("c", "b")]
    arrivals = {i.op: i.count for i in scripts[0] if isinstance(i, Arrive)}
    assert arrivals == {"a": 1, "b": 1, "c": 1}  # d is waited for by nobody
    stats = counter_stats(prog, g, scripts)
    assert stats["counters"] == 3 and stats["edges"] == 4
    assert stats["wait_pairs"] == 2 * 3  # two vEUs, three distinct waits each


def test_predecessors_that_ran_on_the_same_veu_need_no_wait():
    g = RGraph([op("a", ["x"], 2), op("b", ["a"], 2)])
    prog = RProgram(2, "p")
    for i in range(2):
        prog.append(_task(g, "a", i), 0)
    deps = [_task(g, "a", i) for i in range(2)]
    for i in range(2):
        t = _task(g, "b", i)
        prog.wait(t, deps)
        prog.append(t, 0)
    scripts = counter_scripts(prog, g)
    assert scripts[0] == [Run("a", 0, 2), Run("b", 0, 2)]
    assert scripts[1] == []
    check_counter_scripts(prog, g, scripts)


def test_a_wait_implies_the_ancestors_of_what_it_waits_for():
    g = RGraph([op("a", ["x"], 2), op("b", ["a"], 2), op("c", ["a", "b"], 2)])
    prog = _spread(g, 2)
    scripts = counter_scripts(prog, g)
    check_counter_scripts(prog, g, scripts)
    c_waits = [
        i.ops for s in scripts for k, i in enumerate(s)
        if isinstance(i, CounterWait) and s[k + 1].op == "c"
    ]  # fmt: skip
    assert c_waits and all(w == ("b",) for w in c_waits)  # b complete implies a complete


def test_missing_wait_is_a_plan_error():
    g = diamond(rtasks=2)
    prog = _spread(g, 2)
    scripts = counter_scripts(prog, g)
    broken = [[i for i in s if not (isinstance(i, CounterWait) and "a" in i.ops)] for s in scripts]
    with pytest.raises(PlanError, match="before a is complete"):
        check_counter_scripts(prog, g, broken)


def test_missing_arrival_and_cycles_are_reported():
    g = diamond(rtasks=2)
    prog = _spread(g, 2)
    scripts = counter_scripts(prog, g)
    no_arrival = [[i for i in s if not (isinstance(i, Arrive) and i.op == "b")] for s in scripts]
    with pytest.raises(PlanError, match="add 0 to its counter"):
        check_counter_scripts(prog, g, no_arrival)
    # an arrival must follow the run it counts (the CUDA lowering relies on that run's sync)
    moved = [list(s) for s in scripts]
    k = next(k for k, i in enumerate(moved[0]) if isinstance(i, Arrive))
    moved[0].insert(0, moved[0].pop(k))
    with pytest.raises(PlanError, match="without running"):
        check_counter_scripts(prog, g, moved)
    # vEU 0 waits for b before running its own a task: b needs a, a never completes
    cycle = [list(s) for s in scripts]
    cycle[0].insert(0, CounterWait(("b",)))
    with pytest.raises(DeadlockError, match="vEU 0 waits for b"):
        check_counter_scripts(prog, g, cycle)


def test_tasks_run_twice_or_not_at_all_are_reported():
    g = diamond(rtasks=2)
    prog = _spread(g, 2)
    scripts = counter_scripts(prog, g)
    twice = [list(s) for s in scripts]
    twice[1].append(Run("d", 0))
    with pytest.raises(PlanError, match="runs twice"):
        check_counter_scripts(prog, g, twice)
    missing = [list(s) for s in scripts]
    missing[1] = [i for i in missing[1] if not (isinstance(i, Run) and i.op == "d")]
    with pytest.raises(PlanError, match="run 7 of 8"):
        check_counter_scripts(prog, g, missing)


@pytest.mark.parametrize("policy", ["sequential", "wavefront", "ios", "opara"])
def test_waits_grow_with_edges_not_with_producer_veus(policy):
    """Step arrays wait for every producer vEU; counters for each predecessor operator."""
    g = inception(rtasks=24)
    vd = VDevice.cuda("h100", threads=128, registers=64, num_veu=24)
    plan = make_plan(g, vd, policy, cost=COST)
    for prog in plan.programs():
        scripts = counter_scripts(prog, plan.graph)
        check_counter_scripts(prog, plan.graph, scripts)
        stats = counter_stats(prog, plan.graph, scripts)
        step_pairs = sum(len(e.waits) for es in prog.entries for e in es if hasattr(e, "waits"))
        assert stats["counters"] <= stats["operators"]
        # each vEU waits at most once per dependency edge
        assert stats["wait_pairs"] <= stats["edges"] * prog.num_veu
        assert stats["wait_pairs"] <= step_pairs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered_dags(), st.integers(1, 6), st.sampled_from(["wavefront", "ios", "opara"]))
def test_counter_scripts_of_every_plan_check(graph, num_veu, policy):
    plan = make_plan(graph, VDevice.cpu(num_veu), policy, cost=COST)
    for prog in plan.programs():
        check_counter_scripts(prog, plan.graph, counter_scripts(prog, plan.graph))


def test_plans_validate_the_synchronisation_that_runs():
    g = inception(rtasks=4)
    plan = make_plan(g, VDevice.cpu(3), "wavefront", cost=COST, sync="counters")
    plan.validate("counters")
    # planned for counters: no barrier entries, which the step-array check refuses
    assert all(p.num_barriers == 0 for p in plan.programs())
    with pytest.raises(PlanError, match="covered neither by order nor by a barrier"):
        plan.validate("steps")
    steps = make_plan(g, VDevice.cpu(3), "wavefront", cost=COST, sync="steps")
    prog = steps.programs()[0]
    # a barrier dropped: the step-array check refuses it, counters do not need it
    v, i = next((v, i) for v, es in enumerate(prog.entries) for i, e in enumerate(es)
                if hasattr(e, "waits"))  # fmt: skip
    del prog.entries[v][i]
    with pytest.raises(PlanError):
        steps.validate("steps")
    steps.validate("counters")
    with pytest.raises(PlanError, match="sync must be"):
        steps.validate("atomics")
