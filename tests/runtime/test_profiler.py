"""The measured cost model on the CPU: timing, the disk cache, calibration, planning."""

import json

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_rtask.core import RKernel, ROperator, VDevice
from tvm_rtask.runtime import profiler as prof
from tvm_rtask.schedule import AnalyticalCostModel, CalibratedCostModel, calibrate
from tvm_rtask.schedule.cost import roofline_us


def two_branch_module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, 64), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, w))
            b = bb.emit(relax.op.add(x, x))
            c = bb.emit(relax.op.multiply(a, b))
            out = bb.emit_output(c)
        bb.emit_func_output(out)
    return bb.get()


def test_measure_and_cache(tmp_path):
    from tvm_rtask.backend.cpu.rkernel import make_cpu_rkernel
    from tvm_rtask.relax_passes import RTaskPrepare

    mod = RTaskPrepare()(two_branch_module())
    name = next(gv.name_hint for gv, f in mod.functions.items() if "matmul" in gv.name_hint)
    k = make_cpu_rkernel(mod[name], 4)
    p = prof.RKernelProfiler("llvm", cache_dir=tmp_path)
    m = p.measure(k.func, k.num_rtasks, "mm")
    assert m.total_us > 0 and m.rtask_us == pytest.approx(m.total_us / k.num_rtasks)
    assert not m.cached and p.measured == 1
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["key"] == m.key
    again = prof.RKernelProfiler("llvm", cache_dir=tmp_path).measure(k.func, k.num_rtasks, "mm")
    assert again.cached and again.total_us == m.total_us
    # another rTask count or another function is another key
    assert p.key(k.func, 2) != m.key and p.key(mod[name], k.num_rtasks) != m.key
    files[0].write_text("{not json")  # a damaged entry is measured again
    assert not prof.RKernelProfiler("llvm", cache_dir=tmp_path).measure(k.func, 4, "mm").cached


def test_calibrate_recovers_efficiency_factors():
    vd = VDevice.cpu(2)
    ops = [
        ROperator(f"c{i}", "f", ["x"], [f"c{i}"], flops=1e6 * (i + 1), bytes=1.0,
                  rkernels=[RKernel(f"c{i}@2", 2)])
        for i in range(3)
    ] + [
        ROperator(f"m{i}", "f", ["x"], [f"m{i}"], flops=1.0, bytes=1e5 * (i + 1),
                  rkernels=[RKernel(f"m{i}@2", 2)])
        for i in range(3)
    ]  # fmt: skip
    # a device at 25% of peak FLOP rate, 50% of peak bandwidth, 0.3 us per task
    samples = []
    for o in ops:
        c, m = roofline_us(o, o.rkernels[0], vd)
        samples.append((o, o.rkernels[0], max(c / 0.25, m / 0.5) + 0.3))
    model = calibrate(samples, vd)
    ce, me, ov = model.factors["cpu"]
    assert ce == pytest.approx(0.25, rel=0.05) and me == pytest.approx(0.5, rel=0.05)
    assert ov == pytest.approx(0.3)
    # measured kernels use their measurement; others the fitted roofline
    o = ops[0]
    assert model.rtask_us(o, o.rkernels[0], vd) == samples[0][2]
    new = ROperator("n", "f", ["x"], ["n"], flops=4e6, rkernels=[RKernel("n@2", 2)])
    analytical = AnalyticalCostModel(0.0).rtask_us(new, new.rkernels[0], vd)
    assert model.rtask_us(new, new.rkernels[0], vd) == pytest.approx(analytical / ce + ov)
    again = CalibratedCostModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.factors == model.factors and again.measured == model.measured


def test_measured_plan_of_a_module(tmp_path):
    mod = two_branch_module()
    plan = prof.plan_measured(mod, "llvm", "wavefront", num_veu=2, cache_dir=tmp_path)
    plan.validate()
    assert plan.estimated_us >= plan.ideal_us > 0
    assert plan.options["cost_model"] == "calibrated"
    model = prof.measured_cost_model(mod, "llvm", num_veu=2, cache_dir=tmp_path)
    kernels = {k.name for op in plan.graph for k in op.rkernels}
    assert set(model.measured) == kernels
    assert all(t > 0 for t in model.measured.values())
    assert np.isfinite(list(model.factors["cpu"])).all()


def test_cuda_target_needs_a_gpu():
    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present")
    from tvm_rtask.errors import OptionError

    with pytest.raises(OptionError, match="needs a CUDA GPU"):
        prof.RKernelProfiler({"kind": "cuda", "arch": "sm_90"})
