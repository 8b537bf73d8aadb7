"""The CUDA rKernel rewrite: blockIdx -> rtask_id, thread remap, guards, coarsening."""

import pytest
import tvm
from tvm.script import relax as R
from tvm.target import Target

from tvm_rtask.backend.cuda.backend import schedule_target as cuda_schedule_target
from tvm_rtask.backend.cuda.rkernel import (
    guard_surplus_threads,
    make_cuda_rkernel,
    schedule_for_cuda,
)
from tvm_rtask.relax_passes import prepare_pipeline

TARGET = cuda_schedule_target(Target({"kind": "cuda", "arch": "sm_90"}, host="llvm"), 256)


@tvm.script.ir_module
class Ops:
    @R.function
    def main(x: R.Tensor((1, 16, 28, 28), "float32"), w: R.Tensor((32, 16, 3, 3), "float32")):
        with R.dataflow():
            y = R.nn.relu(R.nn.conv2d(x, w, padding=1))
            z = R.nn.softmax(R.reshape(y, (32, 784)), axis=1)
            R.output(z)
        return z


@pytest.fixture(scope="module")
def scheduled():
    mod = prepare_pipeline()(Ops)
    return {
        gv.name_hint: schedule_for_cuda(mod[gv], TARGET)
        for gv in mod.get_global_vars()
        if isinstance(mod[gv], tvm.tirx.PrimFunc)
    }


def _blocks(func):
    text = func.script()
    return text.count('"blockIdx'), text.count("vthread")


def test_rewrite_removes_block_and_virtual_threads(scheduled):
    for name, func in scheduled.items():
        kernel = make_cuda_rkernel(func)
        assert _blocks(kernel.func) == (0, 0), name
        assert [p.name for p in kernel.func.params[-2:]] == ["rtask_id", "tid"]
        assert kernel.num_rtasks >= 1 and 1 <= kernel.threads <= 256


def test_rtask_count_is_the_grid_and_coarsening_bounds_it(scheduled):
    conv = next(f for n, f in scheduled.items() if "conv2d" in n)
    text = conv.script()
    full = make_cuda_rkernel(conv)
    assert full.num_rtasks > 4
    assert f'T.thread_binding(T.int64({full.num_rtasks}), thread="blockIdx.x")' in text or (
        "blockIdx.y" in text
    )
    coarse = make_cuda_rkernel(conv, max_rtasks=4)
    assert coarse.num_rtasks <= 4
    assert "tvm_thread_invariant" in coarse.func.script()


def test_softmax_is_a_cross_thread_reduction(scheduled):
    softmax = next(f for n, f in scheduled.items() if "softmax" in n)
    assert make_cuda_rkernel(softmax).cross_thread_reduction


def test_surplus_threads_are_guarded_per_block(scheduled):
    conv = next(f for n, f in scheduled.items() if "conv2d" in n)
    kernel = make_cuda_rkernel(conv)
    tid = kernel.func.params[-1]
    guarded = guard_surplus_threads(kernel.func.body, tid, kernel.threads)
    text = tvm.tirx.PrimFunc(kernel.func.params, guarded).script()
    assert text.count(f"tid < {kernel.threads}") >= 2


@tvm.script.ir_module
class Mean:
    @R.function
    def main(x: R.Tensor((1, 64, 13, 13), "float32")):
        with R.dataflow():
            y = R.mean(x, axis=[2, 3], keepdims=True)
            R.output(y)
        return y


def test_allreduce_gets_the_bound_in_its_condition_not_a_block_predicate():
    mod = prepare_pipeline()(Mean)
    (name,) = [g.name_hint for g in mod.get_global_vars() if g.name_hint != "main"]
    kernel = make_cuda_rkernel(schedule_for_cuda(mod[name], TARGET))
    assert kernel.cross_thread_reduction and kernel.one_dimensional and kernel.threads < 256
    tid = kernel.func.params[-1]
    text = tvm.tirx.PrimFunc(
        kernel.func.params, guard_surplus_threads(kernel.func.body, tid, kernel.threads)
    ).script()
    allreduce = next(line for line in text.splitlines() if "tvm_thread_allreduce" in line)
    assert f"tid < {kernel.threads}" in allreduce


def test_a_primfunc_scheduled_as_two_kernels_is_refused(scheduled):
    from tvm import tirx

    from tvm_rtask.errors import UnsupportedOperator

    conv = next(f for n, f in scheduled.items() if "conv2d" in n)
    twice = tirx.PrimFunc(conv.params, tirx.SeqStmt([conv.body, conv.body]), attrs=conv.attrs)
    # two launches pass intermediates through global memory: one rTask body would race
    with pytest.raises(UnsupportedOperator, match="2 kernels"):
        make_cuda_rkernel(twice)


@tvm.script.ir_module
class ArgmaxAdd:
    @R.function
    def main(a: R.Tensor((4, 10), "float32")):
        with R.dataflow():
            z = R.argmax(a, axis=1)
            w = R.add(z, z)
            R.output(w)
        return w


def test_a_kernel_tvm_will_not_narrow_keeps_int64_and_says_so(caplog):
    """ForceNarrowIndexToInt32 stops in an InternalError on an int64 buffer (argmax's
    indices): the kernel keeps its 64-bit index math, and the fallback is noted with the
    operator's name and TVM's reason, in one WARNING line."""
    from tvm_rtask.fallbacks import INT32_REFUSED, collecting_fallbacks

    mod = prepare_pipeline()(ArgmaxAdd)
    (name,) = [g.name_hint for g in mod.get_global_vars() if g.name_hint != "main"]
    with collecting_fallbacks() as notes, caplog.at_level("WARNING", logger="tvm_rtask"):
        kernel = make_cuda_rkernel(schedule_for_cuda(mod[name], TARGET), name=name)
    assert kernel.num_rtasks >= 1
    (note,) = notes
    assert note == {"kind": INT32_REFUSED, "subject": name, "reason": note["reason"]}
    assert "ForceNarrowIndexToInt32 refused it" in note["reason"]
    assert "InternalError" in note["reason"] and "int64" in note["reason"]
    (record,) = caplog.records
    assert record.getMessage() == f"{INT32_REFUSED} for {name}: {note['reason']}"
