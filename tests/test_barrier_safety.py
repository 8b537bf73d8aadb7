"""Plans that would deadlock are refused; a broken plan at run time errors instead of hanging."""

import threading

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import tvm_rtask
from tvm_rtask.backend.cpu.dispatch import (
    CPUProgramCode,
    KernelCall,
    Run,
    TensorDecl,
    Wait,
    build_cpu_dispatcher,
)
from tvm_rtask.backend.cpu.rkernel import make_cpu_rkernel
from tvm_rtask.core import Barrier, Plan
from tvm_rtask.errors import CapacityError, PlanError
from tvm_rtask.relax_passes import PlanRPrograms, RTaskPrepare, extract_graph
from tvm_rtask.runtime import native
from tvm_rtask.testing.onnx_light import load_light_model


@pytest.fixture(scope="module")
def inception_plan():
    return tvm_rtask.plan(load_light_model("inception_v1"), "llvm", num_veu=2)


def _drop_one_barrier(plan: Plan) -> tuple[Plan, int]:
    data = plan.to_dict()
    broken = Plan.from_dict(data)
    for k, step in enumerate(broken.steps):
        if not hasattr(step, "entries"):
            continue
        for entries in step.entries:
            for i, item in enumerate(entries):
                if isinstance(item, Barrier):
                    del entries[i]
                    return broken, k
    raise AssertionError("the plan has no barrier to drop")


def test_plan_without_one_barrier_is_rejected_naming_the_dependency(inception_plan):
    inception_plan.validate()
    broken, k = _drop_one_barrier(inception_plan)
    with pytest.raises(PlanError, match="covered neither by order nor by a barrier") as info:
        broken.steps[k].validate(broken.graph, broken.vdevice.capacity)
    assert "rtask" in str(info.value)


def test_plan_with_more_veus_than_workers_is_rejected(inception_plan):
    program = inception_plan.programs()[0]
    with pytest.raises(CapacityError, match=str(program.num_veu)):
        program.validate(inception_plan.graph, capacity=program.num_veu - 1)


@tvm.script.ir_module
class _Add:
    @R.function
    def main(x: R.Tensor((64,), "float32")):
        with R.dataflow():
            y = R.add(x, x)
            R.output(y)
        return y


def _broken_program(timeout_ms: int):
    """A 2-vEU persistent kernel whose vEU 0 waits for a step vEU 1 never signals."""
    mod = RTaskPrepare()(_Add)
    op = extract_graph(mod).operators[0]
    kernel = make_cpu_rkernel(mod[op.func], 2)
    decl = TensorDecl("x", (64,), "float32")
    code = CPUProgramCode(
        params=[decl, TensorDecl("y", (64,), "float32")],
        workspaces=[],
        calls={"add": KernelCall(kernel.func, ["x", "x", "y"])},
        num_veu=2,
        scripts=[[Wait(((1, 5),)), Run("add", 0)], [Run("add", 1)]],
    )
    func = build_cpu_dispatcher(code, "fine", timeout_us=timeout_ms * 1000)
    native.load()
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")


def test_broken_plan_times_out_with_an_error_instead_of_hanging():
    lib = _broken_program(timeout_ms=200)
    tvm_rtask.runtime.set_num_threads(2)
    x = tvm.runtime.tensor(np.ones(64, "float32"))
    y = tvm.runtime.empty((64,), "float32", tvm.cpu())
    with pytest.raises(Exception, match="barrier timed out"):
        lib["main"](x, y)


def test_fewer_threads_than_veus_at_run_time_errors_instead_of_hanging():
    """A thread whose TVM pool was created with one worker (it cannot grow) would run the
    vEU loop serially: the call must fail at once, naming the fix, not hang or time out."""
    ex = tvm_rtask.compile(load_light_model("squeezenet"), "llvm", num_veu=2, spin_timeout_ms=200)
    inputs = [tvm.runtime.tensor(np.ones((1, 3, 224, 224), "float32"))]
    outcome = {}

    def run():
        tvm.get_global_func("runtime.config_threadpool")(-3, 1, ["0"])  # a 1-worker pool
        vm = relax.VirtualMachine(ex, tvm.cpu())
        try:
            vm["main"](*inputs)
            outcome["result"] = "finished"
        except Exception as err:  # the VM raises the dispatcher's assertion
            outcome["result"] = str(err)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the persistent kernel hung"
    assert "cannot grow" in outcome["result"]
    assert "set_num_threads(2)" in outcome["result"]


def test_plan_pass_and_json_round_trip(inception_plan):
    again = Plan.from_json(inception_plan.to_json())
    assert again.to_dict() == inception_plan.to_dict()
    assert again.report() == inception_plan.report()
    assert PlanRPrograms  # the pass is public API
