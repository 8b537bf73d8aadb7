import pytest

from tests.core.graphs import diamond, op
from tvm_rtask.core import OrdinaryCall, RGraph, RKernel, ROperator, RProgram, RTask, VDevice
from tvm_rtask.errors import DeadlockError
from tvm_rtask.schedule import AnalyticalCostModel, ideal_us, simulate_plan, simulate_program

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
