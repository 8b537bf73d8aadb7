import pytest

from tests.core.graphs import diamond, op
from tvm_rtask.core import (
    Barrier,
    OrdinaryCall,
    RGraph,
    RKernel,
    ROperator,
    RProgram,
    RTask,
    VDevice,
)
from tvm_rtask.errors import CapacityError, DeadlockError
from tvm_rtask.policies import (
    AnalyticalCostModel,
    ideal_us,
    simulate,
    simulate_plan,
    simulate_program,
)

COST = AnalyticalCostModel()


def timed(name: str, n: int, us: float, inputs: list[str]) -> ROperator:
    return ROperator(name, "f", inputs, [name], rkernels=[RKernel(f"{name}@{n}", n, est_us=us)])


def test_barrier_waits_for_the_slowest_task():
    g = RGraph([timed("a", 2, 10.0, ["x"]), timed("s", 1, 30.0, ["x"]), timed("b", 1, 5.0, ["a"])])
    vd = VDevice.cpu(3)  # barrier 1 us, launch 5 us
    p = RProgram(3)
    a = [RTask("a", i, "a@2") for i in range(2)]
    p.append(a[0], 0)
    p.append(RTask("s", 0, "s@1"), 1)
    p.append(a[1], 1)  # starts at 30
    b = RTask("b", 0, "b@1")
    p.wait(b, a)
    p.append(b, 2)
    t = simulate_program(p, g, vd, COST)
    assert t.makespan_us == pytest.approx(40.0 + 1.0 + 5.0)
    assert t.busy_us == [10.0, 40.0, 5.0] and t.barrier_us == 1.0 and t.launch_us == 5.0
    assert t.spans[("b", 0)] == (2, 41.0, 46.0)
    assert t.total_us == pytest.approx(51.0)
    assert 0 < t.utilisation <= 1


def test_deadlock_is_an_error():
    g = RGraph([timed("a", 2, 1.0, ["x"])])
    p = RProgram(2)
    p.append_barrier(0, [(1, 0)])
    p.append(RTask("a", 0, "a@2"), 0)
    p.append_barrier(1, [(0, 0)])
    p.append(RTask("a", 1, "a@2"), 1)
    with pytest.raises(DeadlockError, match="cycle"):
        simulate_program(p, g, VDevice.cpu(2), COST)


def test_plan_time_and_ordinary_calls():
    g = RGraph([timed("a", 3, 2.0, ["x"]), ROperator("e", "", ["a"], ["e"], supported=False)])
    vd = VDevice.cpu(2)
    p = RProgram(2)
    for i in range(3):
        p.append(RTask("a", i, "a@3"), i % 2)
    e_us = COST.ordinary_us(g.op("e"), vd)
    total = simulate_plan([p, OrdinaryCall("e")], g, vd, COST)
    assert total == pytest.approx(5.0 + 4.0 + 5.0 + e_us)


def test_ideal_bound():
    vd = VDevice.cpu(2)
    g = RGraph([timed("a", 4, 3.0, ["x"]), timed("b", 1, 1.0, ["a"])])
    assert ideal_us(g, vd, COST) == pytest.approx(13.0 / 2)  # work bound beats the 4 us path
    g = RGraph([timed("a", 1, 3.0, ["x"]), timed("b", 1, 1.0, ["a"])])
    assert ideal_us(g, vd, COST) == pytest.approx(4.0)  # critical path
    assert ideal_us(diamond(), vd, COST) > 0
    assert ideal_us(RGraph([op("e", ["x"], supported=False)]), vd, COST) > 0


def test_plan_timing_accounts_for_every_microsecond():
    g = RGraph([timed("a", 2, 10.0, ["x"]), timed("s", 1, 30.0, ["x"]), timed("b", 1, 5.0, ["a"])])
    vd = VDevice.cpu(3)
    p = RProgram(3, "p")
    a = [RTask("a", i, "a@2") for i in range(2)]
    p.append(a[0], 0)
    p.append(RTask("s", 0, "s@1"), 1)
    p.append(a[1], 1)
    b = RTask("b", 0, "b@1")
    p.wait(b, a)
    p.append(b, 2)
    g2 = RGraph([*g.ops, ROperator("e", "", ["b"], ["e"], flops=1e6, supported=False)])
    e_us = COST.ordinary_us(g2.op("e"), vd)
    t = simulate([p, OrdinaryCall("e")], g2, vd, COST)
    prog = t.steps[0].program
    assert prog.wait_us == [0.0, 0.0, 40.0] and prog.num_barriers == 1
    assert prog.barrier_spans == [(2, 0.0, 41.0)]
    assert prog.idle_us == [36.0, 6.0, 41.0]
    for v in range(3):  # busy + waiting + barrier costs + idle tail = makespan
        tail = prog.makespan_us - max(s[2] for s in prog.spans.values() if s[0] == v)
        bars = sum(e - a for u, a, e in prog.barrier_spans if u == v)
        assert prog.busy_us[v] + bars + tail == pytest.approx(prog.makespan_us)
    assert t.launches == 2 and t.launch_us == 10.0 and t.barrier_us == 1.0
    assert t.steps[1].start_us == pytest.approx(51.0)
    assert t.total_us == pytest.approx(51.0 + 5.0 + e_us)
    assert t.total_us == pytest.approx(simulate_plan([p, OrdinaryCall("e")], g2, vd, COST))
    assert t.busy_us[0] == pytest.approx(10.0 + e_us)  # an ordinary call holds every vEU
    assert t.ideal_us == pytest.approx(ideal_us(g2, vd, COST))
    s = t.summary()
    assert s["total_us"] == t.total_us and 0 < s["utilisation"] <= 1


def test_deadlock_names_the_missing_task():
    g = RGraph([timed("a", 2, 1.0, ["x"])])
    p = RProgram(2, "prog")
    p.append(RTask("a", 0, "a@2"), 0)
    p.append_barrier(1, [(0, 3)])
    p.append(RTask("a", 1, "a@2"), 1)
    with pytest.raises(
        DeadlockError, match="barrier before a rtask 1 on vEU 1 waits for vEU 0 order 3"
    ):
        simulate_program(p, g, VDevice.cpu(2), COST)


def test_more_veus_than_resident_is_a_capacity_error():
    g = RGraph([timed("a", 4, 1.0, ["x"])])
    p = RProgram(4, "wide")
    for i in range(4):
        p.append(RTask("a", i, "a@4"), i)
    with pytest.raises(CapacityError, match="'wide' uses 4 vEUs but cpu keeps only 2"):
        simulate_program(p, g, VDevice.cpu(2), COST)


def test_shared_global_barrier_is_simulated_once_and_right():
    n = 20  # wide enough for the shared-barrier caches
    g = RGraph([timed("a", n, 1.0, ["x"]), timed("b", n, 2.0, ["a"])])
    p = RProgram(n, "g")
    for v in range(n):
        p.append(RTask("a", v, f"a@{n}"), v)
    gate = Barrier(tuple((v, 0) for v in range(n)))
    for v in range(n):
        p.append_barrier(v, gate)
        p.append(RTask("b", v, f"b@{n}"), v)
    p.validate(g)
    t = simulate_program(p, g, VDevice.cpu(n), COST)
    assert t.makespan_us == pytest.approx(1.0 + 1.0 + 2.0)
    assert t.num_barriers == n and all(e is gate for e in (p.entries[v][1] for v in range(n)))
    from tvm_rtask.core import RProgram as RP

    q = RP.from_dict(p.to_dict())
    assert q.entries[0][1] is q.entries[5][1]  # equal wide barriers are one object again
    q.validate(g)
