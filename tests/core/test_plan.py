import pytest

from tests.core.graphs import diamond, op
from tvm_rtask.core import OrdinaryCall, Plan, RGraph, RProgram, RTask, VDevice
from tvm_rtask.errors import CapacityError, PlanError


def program(name: str, ops: list[tuple[str, int]], num_veu: int = 2) -> RProgram:
    """ops in order, each op's rTasks round-robin, waiting for all earlier tasks."""
    p = RProgram(num_veu, name)
    placed: list[RTask] = []
    for wave, (o, n) in enumerate(ops):
        cur = [RTask(o, i, f"{o}@{n}", wave) for i in range(n)]
        for i, t in enumerate(cur):
            p.wait(t, placed)
            p.append(t, i % num_veu)
        placed += cur
    return p


def graph_with_extern() -> RGraph:
    return RGraph(
        [
            op("a", ["x"]),
            op("b", ["a"]),
            op("e", ["a"], supported=False),
            op("c", ["b", "e"]),
        ]
    )


def test_valid_plan_report_and_json():
    g = graph_with_extern()
    steps = [program("p0", [("a", 2), ("b", 2)]), OrdinaryCall("e"), program("p1", [("c", 2)])]
    plan = Plan(g, VDevice.cpu(2), steps, "manual", 10.0, 5.0, {"k": (1, 2), "obj": object()})
    plan.validate()
    r = plan.report()
    assert r["operators"] == 4 and r["rtasks"] == 6 and r["rprograms"] == 2
    assert r["kernel_launches"] == 3 and r["ordinary_ops"] == 1
    assert r["ordinary_op_names"] == ["e"] and r["veus"] == 2
    assert r["max_ops_per_program"] == 2 and r["max_ops_side_by_side"] == 1
    assert r["barriers"] == steps[0].num_barriers
    again = Plan.from_json(plan.to_json())
    assert again.to_dict() == plan.to_dict()
    assert again.options["k"] == [1, 2] and again.options["obj"].startswith("<object")
    again.validate()


def test_fallbacks_are_reported_and_survive_json():
    g = graph_with_extern()
    steps = [program("p0", [("a", 2), ("b", 2)]), OrdinaryCall("e"), program("p1", [("c", 2)])]
    notes = [
        {"kind": "ordinary call", "subject": "e", "reason": "not a call_tir binding"},
        {"kind": "schedule rule skipped", "subject": "fused_c", "reason": "R failed: X"},
    ]
    plan = Plan(g, VDevice.cpu(2), steps, "manual", fallbacks=[dict(n) for n in notes])
    assert plan.report()["fallbacks"] == notes
    again = Plan.from_json(plan.to_json())
    assert again.fallbacks == notes and again.report()["fallbacks"] == notes
    assert again.to_dict() == plan.to_dict()
    plan.report()["fallbacks"][0]["kind"] = "changed"  # the report is a copy
    assert plan.fallbacks == notes
    # a plan written before fallbacks were recorded still loads, with none
    old = plan.to_dict()
    del old["fallbacks"]
    assert Plan.from_dict(old).fallbacks == [] and Plan.from_dict(old).report()["fallbacks"] == []
    assert Plan(g, VDevice.cpu(2), steps).fallbacks == []  # the default, one list per plan


def test_missing_repeated_and_misplaced_ops():
    g = graph_with_extern()
    vd = VDevice.cpu(2)
    with pytest.raises(PlanError, match="'c' is in no step"):
        Plan(g, vd, [program("p0", [("a", 2), ("b", 2)]), OrdinaryCall("e")]).validate()
    with pytest.raises(PlanError, match="'a' appears in step 0 and step 1"):
        Plan(g, vd, [program("p0", [("a", 2)]), OrdinaryCall("a")]).validate()
    with pytest.raises(PlanError, match="'e' is unsupported"):
        Plan(g, vd, [program("p", [("a", 2), ("b", 2), ("e", 2), ("c", 2)])]).validate()
    late = [OrdinaryCall("e"), program("p0", [("a", 2), ("b", 2), ("c", 2)])]
    with pytest.raises(PlanError, match="'e' \\(step 0\\) reads the output of 'a' \\(step 1\\)"):
        Plan(g, vd, late).validate()
    with pytest.raises(PlanError, match="not in the graph"):
        Plan(diamond(), vd, [OrdinaryCall("zz")]).validate()


def test_programs_are_validated_against_capacity():
    g = RGraph([op("a", ["x"])])
    with pytest.raises(CapacityError):
        Plan(g, VDevice.cpu(2), [program("p", [("a", 2)], num_veu=4)]).validate()
