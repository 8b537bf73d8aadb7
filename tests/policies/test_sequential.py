from tests.core.graphs import diamond, op
from tvm_rtask.core import OrdinaryCall, RGraph, VDevice
from tvm_rtask.policies import make_plan


def test_one_program_per_op_round_robin():
    plan = make_plan(diamond(rtasks=3), VDevice.cpu(2), "sequential")
    assert [p.ops() for p in plan.programs()] == [["a"], ["b"], ["c"], ["d"]]
    assert plan.report()["barriers"] == 0
    p = plan.programs()[0]
    assert [p.count(v) for v in range(2)] == [2, 1]
    assert [t.wave for t in plan.programs()[3].tasks()] == [2, 2, 2]


def test_ordinary_calls_in_graph_order():
    g = RGraph([op("a", ["x"]), op("e", ["a"], supported=False), op("b", ["e"])])
    plan = make_plan(g, VDevice.cpu(2), "sequential")
    assert plan.steps[1] == OrdinaryCall("e") and len(plan.steps) == 3
