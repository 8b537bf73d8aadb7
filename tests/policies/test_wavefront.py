from dataclasses import replace

import numpy as np
import pytest

from tests.core.graphs import chain, diamond, inception, op
from tvm_rtask.core import (
    DEVICE_SPECS,
    OrdinaryCall,
    RGraph,
    RKernel,
    ROperator,
    RProgram,
    VDevice,
)
from tvm_rtask.policies import AnalyticalCostModel, make_plan, simulate_program
from tvm_rtask.policies.wavefront import WavefrontPolicy, _max_excluding_self, _WaveBuilder

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


def _two_sm_gpu(num_veu: int) -> VDevice:
    """An H100 with two SMs: a wave of fewer rTasks than vEUs runs at a width of its own."""
    return VDevice.cuda(replace(DEVICE_SPECS["h100"], num_sms=2), 256, 32, num_veu=num_veu)


@pytest.mark.parametrize("vd", [VDevice.cpu(5), _two_sm_gpu(5)], ids=["cpu", "gpu"])
def test_builder_time_equals_simulation(vd):
    g = inception(rtasks=3)
    b = _WaveBuilder(g, vd, COST, "p")
    pol = WavefrontPolicy()
    for w, wave in enumerate(g.waves()):
        b.place(w, wave, pol.select_rkernels(wave, g, vd, COST))
        assert b.makespan == pytest.approx(simulate_program(b.program, g, vd, COST).makespan_us)


@pytest.mark.parametrize("veus", [2, 5, 9])
@pytest.mark.parametrize("gpu", [False, True])
def test_builder_time_equals_simulation_with_counters(veus, gpu):
    g = inception(rtasks=3)
    vd = _two_sm_gpu(veus) if gpu else VDevice.cpu(veus)
    b = _WaveBuilder(g, vd, COST, "p", sync="counters")
    pol = WavefrontPolicy()
    for w, wave in enumerate(g.waves()):
        b.place(w, wave, pol.select_rkernels(wave, g, vd, COST))
        timing = simulate_program(b.program, g, vd, COST, sync="counters")
        assert b.makespan == pytest.approx(timing.makespan_us)
    assert b.program.num_barriers == 0  # counters: the waits come from the graph


def test_builder_rollback_with_counters():
    g = chain(3, rtasks=3)
    vd = VDevice.cpu(2)
    b = _WaveBuilder(g, vd, COST, "p", sync="counters")
    b.place(0, ["op0"], {"op0": g.op("op0").rkernels[0]})
    before, makespan, known = b.program.to_dict(), b.makespan, list(b._known_ops)
    token = b.checkpoint()
    b.place(1, ["op1"], {"op1": g.op("op1").rkernels[0]})
    b.rollback(token)
    assert b.program.to_dict() == before and b.makespan == makespan
    assert b._known_ops == known and set(b._closed) == {"op0"}
    b.place(1, ["op1"], {"op1": g.op("op1").rkernels[0]})
    b.program.validate(g, barriers=False)


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


def variants(name: str, inputs: list[str], kernels: list[tuple[int, float]]) -> ROperator:
    """An op with rKernels of (rTasks, us per rTask)."""
    ks = [RKernel(f"{name}@{n}", n, est_us=us) for n, us in kernels]
    return ROperator(name, "f", inputs, [name], rkernels=ks)


def test_select_rkernels_keeps_fastest_when_the_wave_fits():
    # fastest: 2 rTasks of 5 us (10 us of work); efficient: 1 rTask of 8 us
    g = RGraph([variants("a", ["x"], [(2, 5.0), (1, 8.0)]), variants("b", ["x"], [(2, 5.0)])])
    ks = WavefrontPolicy().select_rkernels(["a", "b"], g, VDevice.cpu(4), COST)
    assert ks["a"].name == "a@2"  # 4 rTasks fill the 4 vEUs: no reason to look further


def test_select_rkernels_takes_efficient_when_it_is_faster():
    # 3 ops on 4 vEUs. Fastest: 4 rTasks of 5 us each -> 12 rTasks, 3 rounds = 15 us.
    # Most efficient: 1 rTask of 8 us each -> 3 rTasks side by side = 8 us.
    ops = [variants(n, ["x"], [(4, 5.0), (1, 8.0)]) for n in "abc"]
    g = RGraph(ops)
    ks = WavefrontPolicy().select_rkernels(["a", "b", "c"], g, VDevice.cpu(4), COST)
    assert {k.name for k in ks.values()} == {"a@1", "b@1", "c@1"}
    plan = make_plan(g, VDevice.cpu(4))
    assert plan.estimated_us == pytest.approx(5.0 + 8.0)


def test_select_rkernels_keeps_fastest_when_efficient_is_not_better():
    # 2 ops on 2 vEUs. Fastest: 2 rTasks of 4 us -> 2 rounds = 8 us; efficient: 1 rTask of
    # 7.9 us each -> side by side = 7.9 us, better; then make it worse: 1 rTask of 9 us.
    good = RGraph([variants(n, ["x"], [(2, 4.0), (1, 7.9)]) for n in "ab"])
    bad = RGraph([variants(n, ["x"], [(2, 4.0), (1, 9.0)]) for n in "ab"])
    pol, vd = WavefrontPolicy(), VDevice.cpu(2)
    assert pol.select_rkernels(["a", "b"], good, vd, COST)["a"].name == "a@1"
    # 9 us alone vs 8 us: the efficient kernels would be slower, keep the fastest
    assert cost_name(pol.select_rkernels(["a", "b"], bad, vd, COST)) == ["a@2", "b@2"]


def cost_name(ks):
    return sorted(k.name for k in ks.values())


def test_global_variant_puts_a_global_barrier_between_waves():
    g = inception(rtasks=2)
    vd = VDevice.cpu(8)
    plan = make_plan(g, vd, "wavefront_global")
    (prog,) = plan.programs()
    prog.check_waves(g)
    timing = simulate_program(prog, g, vd, COST)
    ends: dict[int, float] = {}
    starts: dict[int, float] = {}
    for t in prog.tasks():
        _, s, e = timing.spans[t.key]
        ends[t.wave] = max(ends.get(t.wave, 0.0), e)
        starts[t.wave] = min(starts.get(t.wave, float("inf")), s)
    for w in range(1, max(ends) + 1):
        assert starts[w] >= ends[w - 1] + COST.barrier_us(vd)  # nobody starts early
    fine = make_plan(g, vd, "wavefront")
    assert fine.estimated_us <= plan.estimated_us + 1e-9


def test_global_variant_starts_new_programs_only_at_ordinary_calls():
    g = RGraph(
        [op("a", ["x"]), op("e", ["a"], supported=False), op("b", ["a"]), op("c", ["b", "e"])]
    )
    kinds = [type(s).__name__ for s in make_plan(g, VDevice.cpu(4), "wavefront_global").steps]
    assert kinds == ["RProgram", "OrdinaryCall", "RProgram"]
    assert len(make_plan(chain(50), VDevice.cpu(4), "wavefront_global").programs()) == 1


def test_kernel_cap_counts_distinct_kernels_not_operators():
    # 40 operators in a chain, but only two distinct kernels (as in an unrolled RNN)
    ops = [op(f"o{i}", [f"o{i - 1}"] if i else ["x"]) for i in range(40)]
    for i, o in enumerate(ops):
        o.func = f"cell_{i % 2}"
    graph, vd, cost = RGraph(ops), VDevice.cpu(2), AnalyticalCostModel()
    two = make_plan(graph, vd, "wavefront", cost=cost, max_kernels_per_program=2)
    assert two.report()["rprograms"] == 1
    for o in ops:
        o.func = f"kernel_{o.name}"  # now every operator is a kernel of its own
    capped = make_plan(RGraph(ops), vd, "wavefront", cost=cost, max_kernels_per_program=8)
    assert capped.report()["rprograms"] == 5
    for program in capped.programs():
        assert len({capped.graph.op(n).func for n in program.ops()}) <= 8


@pytest.mark.parametrize("sync", ["steps", "counters"])
def test_each_operator_is_costed_at_its_waves_width_and_the_program_keeps_it(sync):
    g = inception(rtasks=3)
    vd = _two_sm_gpu(9)
    b = _WaveBuilder(g, vd, COST, "p", sync=sync)
    pol = WavefrontPolicy()
    waves = g.waves()
    for w, wave in enumerate(waves):
        kernels = pol.select_rkernels(wave, g, vd, COST)
        b.place(w, wave, kernels)
        width = min(sum(k.num_rtasks for k in kernels.values()), 9)
        assert all(b.program.widths[name] == width for name in wave)
    token = b.checkpoint()
    b.rollback(token)
    again = RProgram.from_dict(b.program.to_dict(), clocks=sync == "steps")
    assert again.widths == b.program.widths
    timing = simulate_program(again, g, vd, COST, sync=sync)
    assert timing.makespan_us == pytest.approx(b.makespan)
    # without the widths, every rTask would be costed with all vEUs busy: slower here
    again.widths = {}
    assert simulate_program(again, g, vd, COST, sync=sync).makespan_us > b.makespan


def test_a_rolled_back_operator_loses_its_width():
    g = chain(3, rtasks=3)
    b = _WaveBuilder(g, _two_sm_gpu(4), COST, "p", sync="counters")
    b.place(0, ["op0"], {"op0": g.op("op0").rkernels[0]})
    token = b.checkpoint()
    b.place(1, ["op1"], {"op1": g.op("op1").rkernels[0]})
    assert set(b.program.widths) == {"op0", "op1"}
    b.rollback(token)
    assert set(b.program.widths) == {"op0"} and b._wave_tasks == {0: 3}
