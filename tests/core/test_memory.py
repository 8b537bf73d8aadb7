"""Workspace arenas: tensors share bytes only where the program's barriers order them.

The property test times each program with random rTask durations, honouring only program
order and barriers (not the planner's vector clocks), and checks that two tensors placed on
the same bytes are never in use at the same time.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.graphs import chain, layered_dags, op
from tvm_rtask.core import Barrier, RGraph, RProgram, RTask, VDevice
from tvm_rtask.core.memory import Workspace, access_bounds, plan_arenas, shared_workspaces
from tvm_rtask.policies import make_plan


class Decl:
    def __init__(self, name: str, shape: tuple, dtype: str = "float32") -> None:
        self.name, self.shape, self.dtype = name, shape, dtype


def _accesses(graph: RGraph, program: RProgram) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in program.ops():
        o = graph.op(name)
        for t in {*o.inputs, *o.outputs}:
            out.setdefault(t, []).append(name)
    return out


def check_arenas(arenas, workspaces, bounds) -> None:
    """Two tensors that share bytes are ordered, by the planner's own bounds."""
    sizes = {w.name: w.elements for w in workspaces}
    for arena in arenas:
        members = sorted(arena.offsets.items(), key=lambda kv: kv[1])
        for i, (a, off_a) in enumerate(members):
            for b, off_b in members[i + 1 :]:
                if off_b >= off_a + sizes[a]:
                    continue
                (la, ka), (lb, kb) = bounds[a], bounds[b]
                assert (la <= kb).all() or (lb <= ka).all(), f"{a} and {b} share bytes unordered"


def _timed_spans(program: RProgram, durations: dict) -> dict[tuple[str, int], tuple[float, float]]:
    """Start and end of every rTask when each takes ``durations[key]``, a barrier lets its
    vEU go on once the tasks it names have ended, and nothing else orders the vEUs."""
    ends: dict[tuple[int, int], float] = {}
    spans = {}
    clock = [0.0] * program.num_veu
    index = [0] * program.num_veu
    done = [0] * program.num_veu
    while any(index[v] < len(program.entries[v]) for v in range(program.num_veu)):
        progressed = False
        for v, entries in enumerate(program.entries):
            while index[v] < len(entries):
                e = entries[index[v]]
                if isinstance(e, Barrier):
                    if any((u, j) not in ends for u, j in e.waits):
                        break
                    clock[v] = max([clock[v], *(ends[(u, j)] for u, j in e.waits)])
                else:
                    start, end = clock[v], clock[v] + durations[e.key]
                    spans[e.key] = (start, end)
                    ends[(v, done[v])] = end
                    done[v] += 1
                    clock[v] = end
                index[v] += 1
                progressed = True
        assert progressed, "the program deadlocks"
    return spans


def _check_no_overlap_in_time(program, graph, arenas, sizes, seed):
    rng = random.Random(seed)
    durations = {t.key: rng.choice([0.1, 1.0, 5.0, 50.0]) for t in program.tasks()}
    spans = _timed_spans(program, durations)
    use = {}
    for tensor, ops in _accesses(graph, program).items():
        times = [spans[t.key] for t in program.tasks() if t.op in ops]
        use[tensor] = (min(s for s, _ in times), max(e for _, e in times))
    for arena in arenas:
        members = list(arena.offsets.items())
        for i, (a, off_a) in enumerate(members):
            for b, off_b in members[i + 1 :]:
                if off_a < off_b + sizes[b] and off_b < off_a + sizes[a]:
                    (sa, ea), (sb, eb) = use[a], use[b]
                    assert ea <= sb or eb <= sa, f"{a} and {b} share bytes while both in use"


def test_a_chain_on_one_veu_ping_pongs_two_buffers():
    graph = chain(6, rtasks=1)
    (program,) = make_plan(graph, VDevice.cpu(1), "wavefront").programs()
    decls = [Decl(f"op{i}", (100,)) for i in range(5)]  # op5 is the model's output
    (arena,) = shared_workspaces(program, graph, decls)
    assert arena.size == 112 + 100  # 100 floats, the next 64-byte boundary, 100 floats
    assert arena.offsets["op0"] == arena.offsets["op2"] == arena.offsets["op4"] == 0
    assert arena.offsets["op1"] == arena.offsets["op3"] == 112


def test_unordered_tensors_on_two_veus_keep_their_own_bytes():
    # vEU 0 runs a then b (reads a); vEU 1 runs c then d (reads c); no barrier between them
    program = RProgram(2)
    for name, veu in [("a", 0), ("b", 0), ("c", 1), ("d", 1)]:
        program.append(RTask(name, 0, f"{name}@1"), veu)
    workspaces = [Workspace("a", "float32", 16, 4), Workspace("c", "float32", 16, 4)]
    (arena,) = plan_arenas(program, workspaces, {"a": ["a", "b"], "c": ["c", "d"]})
    assert arena.offsets["a"] != arena.offsets["c"]
    # c waits for b: every task that touches a ends before c writes, so c takes a's bytes
    ordered = RProgram(2)
    ordered.append(RTask("a", 0, "a@1"), 0)
    ordered.append(RTask("b", 0, "b@1"), 0)
    ordered.wait(RTask("c", 0, "c@1"), [RTask("b", 0, "b@1")])
    ordered.append(RTask("c", 0, "c@1"), 1)
    ordered.append(RTask("d", 0, "d@1"), 1)
    (arena,) = plan_arenas(ordered, workspaces, {"a": ["a", "b"], "c": ["c", "d"]})
    assert arena.offsets["a"] == arena.offsets["c"] == 0


def test_a_tensor_waits_for_every_veu_that_read_the_one_it_replaces():
    # a is read by b on both vEUs; e on vEU 0 only knows that b's half on vEU 0 finished
    program = RProgram(2)
    program.append(RTask("a", 0, "a@2"), 0)
    program.append(RTask("a", 1, "a@2"), 1)
    for r, v in [(0, 0), (1, 1)]:
        program.wait(RTask("b", r, "b@2"), [RTask("a", 0, "a@2"), RTask("a", 1, "a@2")])
        program.append(RTask("b", r, "b@2"), v)
    program.append(RTask("e", 0, "e@1"), 0)  # no wait for vEU 1's b: e may overlap it
    workspaces = [Workspace(n, "float32", 32, 4) for n in ("a", "b", "e")]
    accesses = {"a": ["a", "b"], "b": ["b", "e"], "e": ["e"]}
    (arena,) = plan_arenas(program, workspaces, accesses)
    assert arena.offsets["e"] != arena.offsets["a"]
    check_arenas([arena], workspaces, access_bounds(program, accesses))


def test_a_dtype_numpy_does_not_know_stays_out():
    graph = chain(3, rtasks=1)
    (program,) = make_plan(graph, VDevice.cpu(1), "wavefront").programs()
    arenas = shared_workspaces(
        program, graph, [Decl("op0", (8,), "float32"), Decl("op1", (8,), "no_such_dtype")]
    )
    assert [sorted(a.offsets) for a in arenas] == [["op0"]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layered_dags(max_layers=6, max_width=5),
    st.integers(1, 4),
    st.sampled_from(["wavefront", "ios", "opara"]),
    st.integers(0, 2**16),
)
def test_shared_bytes_are_never_in_use_at_once(graph, veus, policy, seed):
    plan = make_plan(graph, VDevice.cpu(veus), policy)
    for program in plan.programs():
        accesses = _accesses(graph, program)
        rng = random.Random(seed)
        workspaces = [
            Workspace(t, "float32", rng.choice([16, 100, 1000]), 4) for t in sorted(accesses)
        ]
        arenas = plan_arenas(program, workspaces, accesses)
        sizes = {w.name: w.elements for w in workspaces}
        check_arenas(arenas, workspaces, access_bounds(program, accesses))
        for trial in range(3):
            _check_no_overlap_in_time(program, graph, arenas, sizes, seed + trial)


def test_the_timing_check_catches_bytes_shared_while_in_use():
    graph = RGraph([op("a", ["x"], 1), op("b", ["a"], 1), op("c", ["x"], 1), op("d", ["c"], 1)])
    program = RProgram(2)
    for name, veu in [("a", 0), ("b", 0), ("c", 1), ("d", 1)]:
        program.append(RTask(name, 0, f"{name}@1"), veu)
    from tvm_rtask.core.memory import Arena

    wrong = [Arena("x", "float32", 16, {"a": 0, "c": 0})]
    with pytest.raises(AssertionError, match="share bytes"):
        _check_no_overlap_in_time(program, graph, wrong, {"a": 16, "c": 16}, seed=0)
