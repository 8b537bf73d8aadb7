import json

import pytest

from tests.core.graphs import chain, op
from tvm_rtask.core import Barrier, RGraph, RProgram, RTask
from tvm_rtask.errors import CapacityError, DeadlockError, PlanError


def tasks(name: str, n: int, wave: int = 0) -> list[RTask]:
    return [RTask(name, i, f"{name}@{n}", wave) for i in range(n)]


def two_op_program() -> tuple[RGraph, RProgram]:
    """a on vEUs 0 and 1, then b on vEUs 0 and 1, each b task waiting for all of a."""
    g = RGraph([op("a", ["x"], 2), op("b", ["a"], 2)])
    p = RProgram(2, "p")
    a, b = tasks("a", 2), tasks("b", 2, 1)
    p.append(a[0], 0)
    p.append(a[1], 1)
    for t, v in zip(b, [0, 1], strict=True):
        p.wait(t, a)
        p.append(t, v)
    return g, p


def test_append_keeps_last_task_per_veu_and_drops_same_veu_deps():
    p = RProgram(3)
    a = tasks("a", 4)
    for t, v in zip(a, [0, 0, 1, 1], strict=True):
        p.append(t, v)
    b = tasks("b", 3, 1)
    p.wait(b[0], a)
    assert p.append(b[0], 0) == 2
    assert p.entries[0][-2] == Barrier(((1, 1),))  # vEU 0's own a tasks: order covers them
    p.wait(b[1], a)
    p.append(b[1], 0)  # implied by the barrier before b[0]: no new barrier
    assert p.num_barriers == 1
    p.wait(b[2], a)
    p.append(b[2], 2)
    assert p.entries[2] == [Barrier(((0, 1), (1, 1))), b[2]]
    assert p.position(b[2]) == (2, 0) and p.count(2) == 1 and p.count(0) == 4
    assert p.num_tasks == 7 and p.num_barriers == 2 and p.ops() == ["a", "b"]


def test_append_uses_transitive_knowledge():
    p = RProgram(3)
    x, y, z, w = RTask("x", 0, "x"), RTask("y", 0, "y"), RTask("z", 0, "z"), RTask("w", 0, "w")
    p.append(x, 0)
    p.wait(y, [x])
    p.append(y, 1)  # y knows x
    p.wait(z, [x, y])
    p.append(z, 2)
    assert p.entries[2][0] == Barrier(((1, 0),))  # waiting for y implies x
    p.wait(w, [x])
    p.append(w, 2)  # vEU 2 already knows x through y
    assert p.entries[2][-1] == w and p.num_barriers == 2


def test_wait_errors():
    p = RProgram(2)
    a = tasks("a", 2)
    p.append(a[0], 0)
    with pytest.raises(PlanError, match="not in rProgram"):
        p.wait(RTask("b", 0, "b"), [a[1]])
    with pytest.raises(PlanError, match="already"):
        p.append(a[0], 1)
    with pytest.raises(PlanError, match="vEU 5 does not exist"):
        p.append(a[1], 5)


def test_validate_passes_and_rejects_missing_barrier():
    g, p = two_op_program()
    p.validate(g, capacity=2)
    p.entries[0] = [e for e in p.entries[0] if not isinstance(e, Barrier)]
    with pytest.raises(PlanError) as e:
        p.validate(g)
    msg = str(e.value)
    assert "a rtask 1 (vEU 1, order 0) -> b rtask 0 (vEU 0, order 1)" in msg
    assert "covered neither by order nor by a barrier" in msg


def test_validate_rejects_dependency_after_on_same_veu():
    g = RGraph([op("a", ["x"], 1), op("b", ["a"], 1)])
    p = RProgram(1)
    p.append(RTask("b", 0, "b@1"), 0)
    p.append(RTask("a", 0, "a@1"), 0)
    with pytest.raises(PlanError, match=r"a rtask 0 \(vEU 0, order 1\) -> b rtask 0"):
        p.validate(g)


def test_cyclic_waits_deadlock():
    g = RGraph([op("a", ["x"], 2)])
    p = RProgram(2, "cyc")
    p.append_barrier(0, [(1, 0)])
    p.append(RTask("a", 0, "a@2"), 0)
    p.append_barrier(1, [(0, 0)])
    p.append(RTask("a", 1, "a@2"), 1)
    with pytest.raises(DeadlockError) as e:
        p.validate(g)
    msg = str(e.value)
    assert "barrier before a rtask 0 on vEU 0 waits for vEU 1 order 0" in msg
    assert "barrier before a rtask 1 on vEU 1 waits for vEU 0 order 0" in msg


def test_wait_for_missing_order_deadlocks():
    g = RGraph([op("a", ["x"], 2)])
    p = RProgram(2)
    p.append(RTask("a", 0, "a@2"), 0)
    p.append_barrier(1, [(0, 3)])
    p.append(RTask("a", 1, "a@2"), 1)
    with pytest.raises(DeadlockError, match="vEU 1 waits for vEU 0 order 3 but vEU 0 runs only 1"):
        p.validate(g)
    p.entries[1][0] = Barrier(((7, 0),))
    with pytest.raises(DeadlockError, match="only 2 vEUs"):
        p.validate(g)


def test_capacity():
    g, p = two_op_program()
    with pytest.raises(CapacityError, match="uses 2 vEUs.*only 1"):
        p.validate(g, capacity=1)


def test_incomplete_or_repeated_ops():
    g = RGraph([op("a", ["x"], 3), op("e", ["x"], supported=False)])
    p = RProgram(2)
    p.append(RTask("a", 0, "a@3"), 0)
    p.append(RTask("a", 2, "a@3"), 1)
    with pytest.raises(PlanError, match=r"missing rtask ids \[1\]"):
        p.validate(g)
    p.entries[1].append(RTask("a", 0, "a@3"))
    with pytest.raises(PlanError, match="appears twice"):
        p.validate(g)
    p.entries[1][-1] = RTask("a", 1, "a@other")
    with pytest.raises(PlanError, match="several rKernels"):
        p.validate(g)
    q = RProgram(1)
    q.append(RTask("e", 0, "k"), 0)
    with pytest.raises(PlanError, match="unsupported"):
        q.validate(g)


def test_json_round_trip_and_append_after():
    g, p = two_op_program()
    q = RProgram.from_dict(json.loads(json.dumps(p.to_dict())))
    assert q == p and q.ops() == p.ops() and q.num_barriers == p.num_barriers
    q.validate(g)
    # the rebuilt program knows what the original knew: no redundant barrier
    c = RTask("c", 0, "c")
    q.wait(c, [RTask("a", 0, "")])
    q.append(c, 1)
    assert q.entries[1][-1] == c


def test_older_plans_with_one_dict_per_entry_still_load():
    g, p = two_op_program()
    older = {
        "name": p.name,
        "num_veu": p.num_veu,
        "ops": p.ops(),
        "entries": [
            [{"waits": [list(w) for w in e.waits]} if hasattr(e, "waits") else e.to_dict()
             for e in es]
            for es in p.entries
        ],
    }  # fmt: skip
    assert RProgram.from_dict(older) == p
    compact = p.to_dict()
    assert all(isinstance(e, (list, dict)) for es in compact["entries"] for e in es)
    with pytest.raises(PlanError, match="malformed task entry"):
        RProgram.from_dict(dict(compact, entries=[[[99, 0, 0, 0]], []]))


def test_checkpoint_rollback():
    g, p = two_op_program()
    before = p.to_dict()
    token = p.checkpoint()
    c = tasks("c", 2, 2)
    for t in c:
        p.wait(t, tasks("b", 2))
        p.append(t, 1)
    p.rollback(token)
    assert p.to_dict() == before and p.num_tasks == 4 and "c" not in p.ops()
    p.validate(g)


def test_validate_10000_tasks_on_100_veus():
    """100 ops in a chain, 100 rTasks each, rotated over 100 vEUs: every task waits for the
    99 other vEUs (about a million barrier pairs, the worst case for the checks)."""
    n_ops, n = 100, 100
    g = chain(n_ops, rtasks=n)
    p = RProgram(n)
    for i in range(n_ops):
        for r, t in enumerate(tasks(f"op{i}", n, i)):
            v = (r + i) % n
            if i:
                p.append_barrier(v, [(u, i - 1) for u in range(n) if u != v])
            p.append(t, v)
    p.validate(g, capacity=n)
    assert p.num_tasks == 10_000 and p.num_barriers == 9_900
    # the same program with one wait missing is rejected
    p.entries[5][1] = Barrier(p.entries[5][1].waits[1:])
    with pytest.raises(PlanError, match="op0 rtask"):
        p.validate(g)


def test_append_after_orders_equals_wait():
    g = RGraph([op("a", ["x"], 4), op("b", ["a"], 1)])
    by_wait, by_after = RProgram(3), RProgram(3)
    a = tasks("a", 4)
    for p in (by_wait, by_after):
        for t, v in zip(a, [0, 0, 1, 2], strict=True):
            p.append(t, v)
    b = RTask("b", 0, "b@1", 1)
    by_wait.wait(b, a)
    by_wait.append(b, 0)
    by_after.append(b, 0, after=[1, 0, 0])
    assert by_after == by_wait
    assert by_after.entries[0][2] == Barrier(((1, 0), (2, 0)))
    by_after.validate(g)
    with pytest.raises(PlanError, match="one order per vEU"):
        by_after.append(RTask("c", 0, "c"), 1, after=[0, 0])
    with pytest.raises(PlanError, match="not in rProgram"):
        by_after.append(RTask("c", 0, "c"), 1, after=[-1, -1, 5])


def test_shared_barrier_and_rollback():
    n = 20
    g = RGraph([op("a", ["x"], n), op("b", ["a"], n), op("c", ["b"], n)])
    p = RProgram(n)
    for v in range(n):
        p.append(RTask("a", v, f"a@{n}"), v)
    gate = Barrier(tuple((v, 0) for v in range(n)))
    token = p.checkpoint()
    for v in range(n):
        p.append_barrier(v, gate)
        p.append(RTask("b", v, f"b@{n}"), v)
    assert (p.known_matrix() >= 0).all()  # everybody knows all of a
    p.rollback(token)
    assert p.num_barriers == 0 and (p.known_matrix()[1:, 0] == -1).all()
    for v in range(n):
        p.append_barrier(v, gate)
        p.append(RTask("b", v, f"b@{n}"), v)
    gate2 = Barrier(tuple((v, 1) for v in range(n)))
    for v in range(n):
        p.append_barrier(v, gate2)
        p.append(RTask("c", v, f"c@{n}"), v)
    p.validate(g)
    with pytest.raises(PlanError, match="reads"):
        p.check_waves(g)  # every task has the default wave 0


def test_check_waves():
    g = RGraph([op("a", ["x"], 2), op("b", ["a"], 2)])
    p = RProgram(2, "w")
    a, b = tasks("a", 2, wave=0), tasks("b", 2, wave=1)
    for t, v in zip(a, [0, 1], strict=True):
        p.append(t, v)
    for t, v in zip(b, [0, 1], strict=True):
        p.wait(t, a)
        p.append(t, v)
    p.check_waves(g)
    same = RProgram(2, "same")
    for t, v in zip(a, [0, 1], strict=True):
        same.append(t, v)
    for t, v in zip(tasks("b", 2, wave=0), [0, 1], strict=True):
        same.wait(t, a)
        same.append(t, v)
    same.validate(g)  # fine barriers make it correct ...
    with pytest.raises(PlanError, match="'same': b \\(wave 0\\) reads a \\(wave 0\\)"):
        same.check_waves(g)  # ... but a lowering with global barriers only would race
    backwards = RProgram(2, "back")
    backwards.append(RTask("a", 0, "a@2", 3), 0)
    backwards.append(RTask("a", 1, "a@2", 1), 0)
    with pytest.raises(PlanError, match="vEU 0 runs a rtask 1 \\(wave 1\\) after a rtask 0"):
        backwards.check_waves(g)
