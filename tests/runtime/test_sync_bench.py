"""The synchronisation micro-benchmark: the synthetic rPrograms the backend lowers, the llvm
measurement and its cache; the CUDA measurement on a GPU."""

import json
import math
import os

import pytest
import tvm

from tvm_rtask.core.rprogram import Barrier
from tvm_rtask.runtime import sync_bench as sb

CUDA = {"kind": "cuda", "arch": "sm_90"}
needs_two_cores = pytest.mark.skipif(
    (os.cpu_count() or 1) < 2, reason="a barrier needs two vEUs, i.e. two worker threads"
)


def test_llvm_programs_differ_only_by_barriers_and_launches():
    lowered, options = sb.sync_programs("llvm", num_veu=2, num_ops=4)
    assert options.num_veu == 2 and options.fusion == "none"
    plans = {v: plan for v, (_, plan) in lowered.items()}
    # the same operators, one rTask per vEU each
    ops = {v: [op.name for op in p.graph if op.supported] for v, p in plans.items()}
    assert len(ops["chain"]) == len(ops["independent"]) == len(ops["launches"]) == 4
    for plan in plans.values():
        assert all(p.num_tasks == 2 * len(p.ops()) for p in plan.programs())
    assert sb._barriers_per_veu(plans["chain"]) == 3
    assert sb._barriers_per_veu(plans["independent"]) == 0
    assert [len(p.programs()) for p in plans.values()] == [1, 1, 4]
    # each lowered module calls a persistent function once per rProgram
    for variant, (mod, plan) in lowered.items():
        calls = mod["main"].script().count("R.call_tir(rprogram_")
        assert calls == len(plan.programs()), variant


def test_cuda_programs_lower_without_a_gpu():
    """The CUDA chain's waits are dependency counters (one wait per operator) and step
    arrays; many vEUs share one barrier object (minimal waits are quadratic to plan)."""
    for barrier in ("counter", "fine"):
        lowered, options = sb.sync_programs(CUDA, num_veu=40, barrier=barrier, num_ops=3)
        chain = lowered["chain"][1]
        assert sb._barriers_per_veu(chain) == 2
        (prog,) = chain.programs()
        shared = {id(e) for entries in prog.entries for e in entries if isinstance(e, Barrier)}
        assert len(shared) == 2  # one object per operator boundary, on every vEU
        assert chain.options["barrier"] == barrier
        mod, _ = lowered["chain"]
        assert any(gv.name_hint.startswith("rprogram_") for gv in mod.get_global_vars())


def test_one_veu_has_no_barrier_to_measure():
    lowered, _ = sb.sync_programs("llvm", num_veu=1, num_ops=3)
    assert sb._barriers_per_veu(lowered["chain"][1]) == 0
    # global barriers: one between waves, whatever the vEUs
    assert sb._barriers_per_veu(lowered["chain"][1], "global") == 2


@needs_two_cores
def test_llvm_benchmark_is_finite_and_cached(tmp_path):
    cost = sb.sync_benchmark("llvm", num_veu=2, num_ops=16, rounds=9, cache_dir=tmp_path)
    assert not cost.cached
    # differences of medians, clamped at 0: on a loaded machine the noise can exceed the
    # barriers' cost, so only their sign and finiteness are checked (speed is benchmarked)
    assert math.isfinite(cost.barrier_us) and cost.barrier_us >= 0
    assert math.isfinite(cost.launch_us) and cost.launch_us >= 0
    assert all(t > 0 for t in cost.medians_us.values())
    assert cost.barrier == "fine" and cost.num_veu == 2 and cost.barriers_per_veu == 15
    assert cost.device and "chain" in cost.method
    (path,) = tmp_path.glob("sync-*.json")
    assert json.loads(path.read_text())["key"] == cost.key

    again = sb.sync_benchmark("llvm", num_veu=2, num_ops=16, rounds=9, cache_dir=tmp_path)
    assert again.cached
    assert (again.barrier_us, again.launch_us) == (cost.barrier_us, cost.launch_us)

    # a damaged entry is measured again
    path.write_text("{not json")
    fresh = sb.sync_benchmark("llvm", num_veu=2, num_ops=16, rounds=3, cache_dir=tmp_path)
    assert not fresh.cached and math.isfinite(fresh.barrier_us)


@needs_two_cores
def test_llvm_global_barrier(tmp_path):
    cost = sb.sync_benchmark(
        "llvm", num_veu=2, barrier="global", num_ops=6, rounds=3, cache_dir=tmp_path
    )
    assert cost.barrier == "global" and cost.barriers_per_veu == 5
    assert math.isfinite(cost.barrier_us) and math.isfinite(cost.launch_us)


def test_cuda_without_a_gpu_is_an_option_error(tmp_path):
    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present")
    from tvm_rtask.errors import OptionError

    with pytest.raises(OptionError, match="needs a CUDA GPU"):
        sb.sync_benchmark(CUDA, cache_dir=tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("barrier", ["counter", "fine"])
def test_cuda_benchmark_on_the_gpu(tmp_path, barrier):
    """Counter wait + arrive (default) and step-array wait + signal, at the vDevice's vEUs
    (every co-resident block) for counters and one vEU per SM for step arrays (whose pair
    lists grow with the square of the vEUs)."""
    target = {"kind": "cuda", "arch": _arch()}
    num_veu = None if barrier == "counter" else tvm.cuda(0).multi_processor_count
    cost = sb.sync_benchmark(target, num_veu=num_veu, barrier=barrier, cache_dir=tmp_path)
    assert cost.barrier == barrier and cost.device == tvm.cuda(0).device_name
    assert math.isfinite(cost.barrier_us) and cost.barrier_us > 0
    assert math.isfinite(cost.launch_us) and cost.launch_us > 0
    again = sb.sync_benchmark(target, num_veu=num_veu, barrier=barrier, cache_dir=tmp_path)
    assert again.cached and again.barrier_us == cost.barrier_us


def _arch() -> str:
    major, minor = tvm.cuda(0).compute_version.split(".")
    return f"sm_{major}{minor}"
