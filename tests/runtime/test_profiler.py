"""The measured cost model on the CPU: timing, the disk cache, calibration, planning."""

import json

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_rtask.core import RKernel, ROperator, VDevice
from tvm_rtask.policies import AnalyticalCostModel, CalibratedCostModel, calibrate
from tvm_rtask.policies.cost import roofline_us
from tvm_rtask.runtime import profiler as prof


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


def test_rounds_and_blocks_give_the_time_of_one_rtask(tmp_path, monkeypatch):
    """8 blocks, 2 at once: 4 rounds of 25 us; an rTask of 2 blocks takes 50 us."""
    p = prof.RKernelProfiler("llvm", cache_dir=tmp_path, use_cache=False)
    monkeypatch.setattr(p, "_time", lambda func: 100.0)
    func = tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0))
    m = p.measure(func, 4, "k", concurrent=2, blocks=8)
    assert (m.total_us, m.rtask_us, m.blocks, m.concurrent) == (100.0, 50.0, 8, 2)
    m = p.measure(func, 4, "k")  # llvm: rTasks one after the other
    assert m.rtask_us == 25.0 and m.blocks == 4 and m.concurrent == 1


def test_llvm_standalone_rkernel_is_the_rkernel_itself():
    from tvm_rtask.backend import as_target, get_backend
    from tvm_rtask.core import RGraph
    from tvm_rtask.options import resolve_options
    from tvm_rtask.relax_passes import RTaskPrepare, extract_graph

    target = as_target("llvm")
    backend = get_backend(target)
    prepared = RTaskPrepare(None, target)(two_branch_module())
    mod, maker = backend.make_rkernels(prepared.clone(), resolve_options({}))
    graph = RGraph(extract_graph(mod, maker).operators)
    for op in graph:
        for k in op.rkernels:
            func, blocks, concurrent = backend.standalone_rkernel(
                mod, maker, op.func, k, maker.vdevice()
            )
            assert (blocks, concurrent) == (k.num_rtasks, 1)
            assert func.same_as(mod[op.func]) == (k is op.rkernels[0])


def test_cuda_standalone_rkernel_builds_without_a_gpu():
    """The scheduled kernel of each CUDA rKernel, its thread blocks and the blocks that run
    at once: what the profiler times on a GPU (built here as TVM builds it)."""
    from tvm_rtask.backend import as_target, get_backend
    from tvm_rtask.core import RGraph
    from tvm_rtask.options import resolve_options
    from tvm_rtask.relax_passes import RTaskPrepare, extract_graph

    target = as_target({"kind": "cuda", "arch": "sm_90"})
    backend = get_backend(target)
    prepared = RTaskPrepare(None, target)(two_branch_module())
    mod, maker = backend.make_rkernels(prepared.clone(), resolve_options({}))
    graph = RGraph(extract_graph(mod, maker).operators)
    vd = maker.vdevice()
    kernels = [(op, k) for op in graph if op.supported for k in op.rkernels]
    assert kernels
    for op, k in kernels:
        func, blocks, concurrent = backend.standalone_rkernel(mod, maker, op.func, k, vd)
        assert blocks >= k.num_rtasks and 0 < concurrent <= vd.spec.num_sms * 32
        assert "rtask_id" not in [p.name for p in func.params]
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
        assert lib is not None


def test_measured_cost_option_plans_with_the_profile(tmp_path, monkeypatch):
    """cost="measured": PlanRPrograms times the module's rKernels and the barrier/launch
    benchmark (cached), and the plan records it; the graph is the analytical plan's."""
    import tvm_rtask

    monkeypatch.setenv(prof.CACHE_ENV, str(tmp_path))
    mod = two_branch_module()
    measured = tvm_rtask.plan(mod, "llvm", num_veu=2, cost="measured", db=False)
    analytical = tvm_rtask.plan(mod, "llvm", num_veu=2, db=False)
    assert measured.options["cost"] == "measured" and measured.options["cost_model"] == "measured"
    summary = measured.options["measured_cost"]
    assert summary["kernels"] == len({k.name for op in measured.graph for k in op.rkernels})
    assert summary["barrier_us"] >= 0 and summary["launch_us"] >= 0
    assert "cost_model" not in analytical.options
    assert [op.name for op in measured.graph] == [op.name for op in analytical.graph]
    same = {
        k: v
        for k, v in measured.options.items()
        if k not in ("cost", "cost_model", "measured_cost")
    }
    assert same == {k: v for k, v in analytical.options.items() if k != "cost"}
    # everything came from the cache the second time
    again = tvm_rtask.plan(mod, "llvm", num_veu=2, cost="measured", db=False)
    assert again.options["measured_cost"]["kernels_cached"] == summary["kernels"]


@pytest.mark.gpu
def test_cuda_rkernels_timed_on_the_gpu(tmp_path):
    """Each CUDA rKernel's scheduled kernel timed alone at its occupancy; cached by the
    GPU's name."""
    major, minor = tvm.cuda(0).compute_version.split(".")
    target = {"kind": "cuda", "arch": f"sm_{major}{minor}"}
    p = prof.RKernelProfiler(target, cache_dir=tmp_path)
    graph, vdevice, samples = prof.profile_module(two_branch_module(), target, profiler=p)
    assert samples and all(np.isfinite(t) and t > 0 for _, _, t in samples)
    assert p.measured == len({k.name for _, k, _ in samples}) and p.hits == 0
    assert tvm.cuda(0).device_name in p.backend.host_fingerprint()
    again = prof.RKernelProfiler(target, cache_dir=tmp_path)
    _, _, cached = prof.profile_module(two_branch_module(), target, profiler=again)
    assert again.measured == 0 and [t for *_, t in cached] == [t for *_, t in samples]
    profile = prof.profile_model(two_branch_module(), target, cache_dir=tmp_path)
    assert profile.sync is not None and profile.sync.barrier == "counter"
    assert profile.model.barrier_overhead_us == profile.sync.barrier_us
    assert all(m.concurrent >= 1 and m.blocks >= m.num_rtasks for m in profile.measurements)
