"""LaunchOnStreams (policy ``opara_streams``): the stream calls ``main`` makes are the plan's
protocol, and the reordered, multi-stream build computes what TVM's own build computes."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask
from tvm_rtask.core.streams import Enter, Fork, Join, Record, stream_actions
from tvm_rtask.errors import PlanError
from tvm_rtask.runtime.streams import StreamGraph, recording


def branchy():
    """x -> a; b and c read a; d joins them; e reads d: results cross streams both ways."""
    rng = np.random.default_rng(3)
    c = 6
    x = relax.Var("x", relax.TensorType((1, c, 10, 10), "float32"))
    w = {k: relax.const((0.4 * rng.standard_normal((c, c, 3, 3))).astype("float32"))
         for k in "abc"}  # fmt: skip
    w["e"] = relax.const((0.3 * rng.standard_normal((c, 2 * c, 3, 3))).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w["a"], padding=(1, 1))))
            b = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(a, w["b"], padding=(1, 1))))
            cc = bb.emit(relax.op.sigmoid(relax.op.nn.conv2d(a, w["c"], padding=(1, 1))))
            d = bb.emit(relax.op.concat([b, cc], axis=1))
            e = bb.emit(relax.op.nn.conv2d(d, w["e"], padding=(1, 1)))
            out = bb.emit_output(relax.Tuple([e, cc]))
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, c, 10, 10)).astype("float32")


def as_calls(actions) -> list[tuple]:
    calls = []
    for a in actions:
        if isinstance(a, Fork):
            calls.append(("fork", a.streams))
        elif isinstance(a, Enter):
            calls.append(("enter", a.stream, *a.waits))
        elif isinstance(a, Record):
            calls.append(("record", a.event))
        elif isinstance(a, Join):
            calls.append(("join",))
    return calls


def outputs(ex, x) -> list[np.ndarray]:
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return [o.numpy() for o in vm["main"](tvm.runtime.tensor(x))]


@pytest.mark.parametrize("fusion", ["fuseops", "none"])
def test_streams_build_matches_tvm_and_makes_the_plans_calls(fusion):
    mod, x = branchy()
    want = outputs(tvm.compile(mod, target="llvm"), x)
    assert all(np.abs(w).max() > 0.5 for w in want)  # alive, not a comparison of zeros
    plan = tvm_rtask.plan(mod, "llvm", policy="opara_streams", fusion=fusion, num_veu=2)
    assert plan.report()["streams"] >= 2
    ex = tvm_rtask.compile(mod, "llvm", policy="opara_streams", fusion=fusion, num_veu=2)
    got = outputs(ex, x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    with recording() as log:
        outputs(ex, x)
    # every step launches a kernel but the output tuple's
    launches = [k for k, step in enumerate(plan.steps) if plan.graph.op(step.op).func]
    assert len(launches) == len(plan.steps) - 1
    expected = as_calls(stream_actions(plan, launches))
    assert log == expected
    assert any(call[0] == "enter" and len(call) > 2 for call in log)  # a wait across streams
    assert any(call[0] == "record" for call in log)


def test_other_policies_make_no_stream_calls():
    mod, x = branchy()
    ex = tvm_rtask.compile(mod, "llvm", policy="sequential", num_veu=2)
    with recording() as log:
        outputs(ex, x)
    assert log == []


def test_cuda_graph_needs_a_cuda_device():
    mod, x = branchy()
    ex = tvm_rtask.compile(mod, "llvm", policy="opara_streams", num_veu=2)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    with pytest.raises(RuntimeError, match="CUDA device"):
        StreamGraph(vm, [tvm.runtime.tensor(x)])


def test_unknown_target_kind_is_a_plan_error():
    from tvm_rtask.core import Plan
    from tvm_rtask.relax_passes.launch_on_streams import launch_on_streams

    mod, _ = branchy()
    plan = tvm_rtask.plan(mod, "llvm", policy="opara_streams", num_veu=2)
    odd = Plan.from_dict({**plan.to_dict(), "target": {"kind": "vulkan"}})
    with pytest.raises(PlanError, match="vulkan"):
        launch_on_streams(mod["main"], 0, {}, odd)
