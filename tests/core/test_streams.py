"""The stream protocol of a multi-stream plan (policy ``opara_streams``): every result that
crosses streams is waited for, over random DAGs; a protocol with a wait removed is refused."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.graphs import diamond, inception, layered_dags, small_dags
from tvm_rtask.core import OrdinaryCall, Plan, VDevice
from tvm_rtask.core.streams import (
    Enter,
    Fork,
    Join,
    Record,
    check_stream_actions,
    stream_actions,
)
from tvm_rtask.errors import PlanError
from tvm_rtask.policies import AnalyticalCostModel, OparaPolicy, make_plan

COST = AnalyticalCostModel()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def streams_plan(graph, veus: int = 8) -> Plan:
    return make_plan(graph, VDevice.cpu(veus), "opara_streams", cost=COST)


def launches(plan: Plan) -> list[int]:
    return list(range(len(plan.steps)))


def test_diamond_waits_once_across_streams():
    plan = streams_plan(diamond())
    order = [s.op for s in plan.steps]
    assert order[0] == "a" and order[-1] == "d" and sorted(order) == ["a", "b", "c", "d"]
    assert all(isinstance(s, OrdinaryCall) for s in plan.steps)
    assert plan.streams == OparaPolicy.streams(plan.graph) and len(set(plan.streams.values())) == 2
    actions = stream_actions(plan, launches(plan))
    check_stream_actions(plan, launches(plan), actions)
    assert isinstance(actions[0], Fork) and actions[0].streams == 2
    assert isinstance(actions[-1], Join)
    # c runs on the second stream after a's event; d on a's stream after c's event
    enters = {plan.steps[a.step].op: a for a in actions if isinstance(a, Enter)}
    assert enters["c"].stream == 1 and enters["c"].waits
    assert enters["d"].stream == 0 and enters["d"].waits
    assert sum(isinstance(a, Record) for a in actions) == 2


def test_report_and_json_keep_the_streams():
    plan = streams_plan(inception())
    assert plan.report()["streams"] == 4
    again = Plan.from_json(plan.to_json())
    assert again.streams == plan.streams
    assert plan.estimated_us > 0


def _check_plan_and_mutants(plan: Plan) -> None:
    plan.validate()
    ks = launches(plan)
    actions = stream_actions(plan, ks)
    check_stream_actions(plan, ks, actions)
    assert Plan.from_json(plan.to_json()).streams == plan.streams
    # every wait the protocol makes is needed: without it a dependence is unordered
    for i, action in enumerate(actions):
        if isinstance(action, Enter):
            for e in action.waits:
                waits = tuple(w for w in action.waits if w != e)
                broken = [*actions[:i], dataclasses.replace(action, waits=waits), *actions[i + 1 :]]
                with pytest.raises(PlanError, match="no wait between them"):
                    check_stream_actions(plan, ks, broken)
    if len(set(plan.streams.values())) > 1:
        with pytest.raises(PlanError, match="join"):
            check_stream_actions(plan, ks, [a for a in actions if not isinstance(a, Join)])


@SETTINGS
@given(small_dags())
def test_small_dags_protocol_orders_every_dependence(graph):
    _check_plan_and_mutants(streams_plan(graph))


@SETTINGS
@given(layered_dags(max_layers=6, max_width=6), st.integers(1, 8))
def test_layered_dags_protocol_orders_every_dependence(graph, veus):
    _check_plan_and_mutants(streams_plan(graph, veus))


def test_protocol_refuses_a_launch_out_of_place():
    plan = streams_plan(diamond())
    ks = launches(plan)
    actions = stream_actions(plan, ks)
    swapped = [actions[0], *actions[2:3], actions[1], *actions[3:]]
    with pytest.raises(PlanError):
        check_stream_actions(plan, ks, swapped)
