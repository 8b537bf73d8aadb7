import pytest

from tests.core.graphs import diamond
from tvm_rtask.core import RGraph, VDevice
from tvm_rtask.errors import OptionError
from tvm_rtask.policies import (
    IOSPolicy,
    OparaPolicy,
    Policy,
    SequentialPolicy,
    WavefrontPolicy,
    get_policy,
    make_plan,
    policy_names,
    register_policy,
)


def test_registry():
    assert {"wavefront", "wavefront_global", "ios", "opara", "sequential"} <= set(policy_names())
    assert isinstance(get_policy("Wavefront"), WavefrontPolicy)
    assert isinstance(get_policy("sequential"), SequentialPolicy)
    assert isinstance(get_policy("ios", r=2), IOSPolicy)
    assert isinstance(get_policy("opara"), OparaPolicy)
    with pytest.raises(OptionError, match="unknown policy 'rammer2'.*ios.*opara.*sequential"):
        get_policy("rammer2")
    with pytest.raises(OptionError, match="option r must be an integer >= 1"):
        get_policy("ios", r=0)
    with pytest.raises(OptionError, match="no option barrier"):
        get_policy("wavefront", barrier="global")


def test_custom_policy_plugs_in():
    @register_policy
    class Everything(Policy):
        name = "test-everything-sequential"
        OPTIONS = {"unused": 1}

        def plan(self, graph, vdevice, cost):
            return SequentialPolicy().plan(graph, vdevice, cost)

    plan = make_plan(diamond(), VDevice.cpu(2), "test-everything-sequential", unused=2)
    assert plan.policy == "test-everything-sequential" and plan.policy_options == {"unused": 2}
    plan = make_plan(diamond(), VDevice.cpu(2), Everything())
    with pytest.raises(OptionError):
        make_plan(diamond(), VDevice.cpu(2), Everything(), unused=3)


def test_make_plan_fills_estimates():
    plan = make_plan(diamond(), VDevice.cpu(4))
    assert plan.policy == "wavefront" and plan.estimated_us >= plan.ideal_us > 0
    assert make_plan(RGraph([]), VDevice.cpu(1)).steps == []
