import numpy as np
import pytest

from tests.core.graphs import chain, diamond, inception, op
from tvm_rtask.core import OrdinaryCall, RGraph, RKernel, ROperator, RProgram, VDevice
from tvm_rtask.schedule import AnalyticalCostModel, make_plan, simulate_program
from tvm_rtask.schedule.wavefront import WavefrontPolicy, _max_excluding_self, _WaveBuilder

COST = AnalyticalCostModel()


def test_inception_branches_run_side_by_side():
    plan = make_plan(inception(rtasks=2), VDevice.cpu(8), "wavefront")
    r = plan.report()
    assert r["rprograms"] < r["operators"]
    assert r["max_ops_side_by_side"] == 4
    (prog,) = plan.programs()
    wave1 = {t.op for t in prog.tasks() if t.wave == 1}
    assert wave1 == {"b1", "b2a", "b3a", "b4"}
    # the four branches use eight different vEUs at the same time
    timing = simulate_program(prog, plan.graph, plan.vdevice, COST)
    starts = {timing.spans[(o, i)][1] for o in wave1 for i in range(2)}
    assert len(starts) == 1
    seq = make_plan(inception(rtasks=2), VDevice.cpu(8), "sequential")
    assert plan.estimated_us < seq.estimated_us


def timed(name: str, n: int, us: float, inputs: list[str]) -> ROperator:
    return ROperator(name, "f", inputs, [name], rkernels=[RKernel(f"{name}@{n}", n, est_us=us)])


def test_next_wave_fills_idle_veus_of_the_program():
    # wave 0: a (one 100 us rTask) next to s (eight 1 us rTasks); wave 1: b reads only s,
    # so in the same program it runs beside a and costs nothing extra.
    g = RGraph([timed("a", 1, 100.0, ["x"]), timed("s", 8, 1.0, ["x"]), timed("b", 8, 1.0, ["s"])])
    plan = make_plan(g, VDevice.cpu(8))
    assert len(plan.programs()) == 1
    assert plan.estimated_us == pytest.approx(5.0 + 100.0)  # one launch + a


def test_wave_starts_a_new_program_when_that_is_faster():
    class FreeLaunch(AnalyticalCostModel):
        def launch_us(self, vdevice):
            return 0.0

        def barrier_us(self, vdevice):
            return 50.0

    plan = make_plan(diamond(), VDevice.cpu(4), cost=FreeLaunch())
    assert [p.ops() for p in plan.programs()] == [["a"], ["b", "c"], ["d"]]
    assert plan.report()["barriers"] == 0


def test_unsupported_op_closes_the_program():
    g = RGraph(
        [op("a", ["x"]), op("e", ["a"], supported=False), op("b", ["a"]), op("c", ["b", "e"])]
    )
    plan = make_plan(g, VDevice.cpu(4))
    kinds = [type(s).__name__ for s in plan.steps]
    assert kinds == ["RProgram", "OrdinaryCall", "RProgram"]
    assert plan.steps[0].ops() == ["a", "b"] and plan.steps[1] == OrdinaryCall("e")
    assert plan.steps[2].ops() == ["c"]


def test_builder_time_equals_simulation():
    g = inception(rtasks=3)
    vd = VDevice.cpu(5)
    b = _WaveBuilder(g, vd, COST, "p")
    pol = WavefrontPolicy()
    for w, wave in enumerate(g.waves()):
        b.place(w, wave, pol.select_rkernels(wave, g, vd, COST))
        assert b.makespan == pytest.approx(simulate_program(b.program, g, vd, COST).makespan_us)


def test_builder_rollback():
    g = chain(3, rtasks=3)
    vd = VDevice.cpu(2)
    b = _WaveBuilder(g, vd, COST, "p")
    b.place(0, ["op0"], {"op0": g.op("op0").rkernels[0]})
    before, makespan = b.program.to_dict(), b.makespan
    token = b.checkpoint()
    b.place(1, ["op1"], {"op1": g.op("op1").rkernels[0]})
    b.rollback(token)
    assert b.program.to_dict() == before and b.makespan == makespan
    assert set(b.frontier) == {"op0"}
    b.place(1, ["op1"], {"op1": g.op("op1").rkernels[0]})
    b.program.validate(g)


def test_long_chain_stays_in_one_program_quickly():
    plan = make_plan(chain(1000, rtasks=4), VDevice.cpu(4))
    assert len(plan.programs()) == 1
    assert isinstance(plan.steps[0], RProgram) and plan.steps[0].num_tasks == 4000


def test_max_excluding_self():
    x = np.array([3.0, 7.0, 1.0, 7.0])
    assert list(_max_excluding_self(x)) == [7.0, 7.0, 7.0, 7.0]
    assert list(_max_excluding_self(np.array([1.0, 5.0]))) == [5.0, 1.0]
    assert list(_max_excluding_self(np.array([2.0]))) == [-np.inf]
