"""CUDA rKernels made from MetaSchedule records, without a GPU.

The records are MetaSchedule's own CUDA schedules (its design space for the tuning target,
postprocessors applied, as ``tune`` would measure them) with a made-up time: what is checked
is that a compile with ``db`` runs the record's schedule as rKernels (its grid and block,
its virtual threads lowered), and that the persistent kernel compiles to the instruction mix
of TVM's own build of the same tuned PrimFuncs, not which schedule is faster.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import tvm_rtask
from tvm_rtask.backend import get_backend
from tvm_rtask.backend.cuda.rkernel import _extents
from tvm_rtask.core import RProgram
from tvm_rtask.records import TUNED_ATTR, load_tuned
from tvm_rtask.tuning.tasks import extract_tasks, prepared, task_module

NVCC = shutil.which("nvcc")
TARGET = {"kind": "cuda", "arch": "sm_90"}
# no register probe (an optimised nvcc run per kernel) and no occupancy check: source only
OPTIONS = {"verify_occupancy": False, "cuda_registers": 128, "num_veu": 8, "policy": "wavefront"}
RECORD_SECS = 5e-6  # made up: no GPU measured it
# MetaSchedule's TuneContext imports every tensor intrinsic (CUDA's alone: 30-70 s of
# TVMScript on a CI core): paid once, on the worker of the tuning tests
pytestmark = pytest.mark.xdist_group("tuning")


def two_matmuls():
    """Two independent products of different shapes (so one wave, two distinct rKernels),
    each with a relu, joined by an add; weights and inputs of unit scale."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((128, 256)).astype("float32"), "m1"),
        numpy_helper.from_array(rng.standard_normal((256, 256)).astype("float32"), "m2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "m1"], ["a"]),
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("MatMul", ["y", "m2"], ["b"]),
        helper.make_node("Relu", ["b"], ["rb"]),
        helper.make_node("Add", ["ra", "rb"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_matmuls",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 128]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [64, 256])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def metaschedule_schedule(func, target, seed: int):
    """The first schedule from MetaSchedule's CUDA design space of ``func`` (multi-level
    tiling with virtual threads, shared-memory staging, explicit unrolling) that its
    postprocessors accept (the GPU-code check refuses some samples), from ``seed`` on."""
    from tvm.s_tir import meta_schedule as ms

    for rand_state in range(seed, seed + 50):
        context = ms.TuneContext(
            mod=task_module(func),
            target=target,
            space_generator="post-order-apply",
            search_strategy="replay-trace",
            task_name="record",
            rand_state=rand_state,
        )
        sch = context.generate_design_space()[0]
        sch.enter_postproc()
        if all(p.apply(sch) for p in context.space_generator.postprocs):
            return sch
    raise AssertionError(f"no schedule of 50 passed MetaSchedule's postprocessors: {func}")


def metaschedule_record(database, func, target, seed: int) -> None:
    """A record of :func:`metaschedule_schedule`'s schedule with a made-up time."""
    from tvm.s_tir import meta_schedule as ms

    mod = task_module(func)
    sch = metaschedule_schedule(func, target, seed)
    database.commit_tuning_record(
        ms.database.TuningRecord(
            sch.trace,
            database.commit_workload(mod),
            [RECORD_SECS],
            target,
            ms.arg_info.ArgInfo.from_prim_func(func),
        )
    )


def write_records(model, work_dir) -> list:
    """A work directory of one record per operator of ``model`` for the CUDA tuning target
    (as ``tune`` prepares it); returns the operators' tasks."""
    from tvm.s_tir import meta_schedule as ms

    target = get_backend(TARGET).tuning_target()
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    tasks = extract_tasks(prepared(model, None, target))
    for seed, task in enumerate(tasks, start=1):
        metaschedule_record(database, task.func, target, seed)
    return tasks


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    model = two_matmuls()
    work_dir = tmp_path_factory.mktemp("cuda-records")
    tasks = write_records(model, work_dir)
    assert len(tasks) == 2, [t.name for t in tasks]
    tuned = load_tuned(work_dir, "cuda")
    return model, work_dir, {task.name: tuned.best(task.func) for task in tasks}


def test_the_cuda_tuning_target_has_what_metaschedule_requires():
    target = get_backend(TARGET).tuning_target()
    assert int(target.attrs["max_threads_per_block"]) == 1024
    assert int(target.attrs["max_shared_memory_per_block"]) == 48 * 1024
    assert str(target.arch) == "sm_90"
    assert (
        get_backend({**TARGET, "max_threads_per_block": 512})
        .tuning_target()
        .attrs["max_threads_per_block"]
        == 512
    )  # the user's value stays


def test_the_records_are_metaschedule_tiles_with_virtual_threads(records):
    _, _, best = records
    for name, func in best.items():
        assert func is not None and TUNED_ATTR in func.attrs, name
        assert "vthread" in func.script(), name  # what an rKernel must now carry


def _matmul_kernels(plan) -> dict[str, tuple[int, int]]:
    return {
        op.func: (kernel.num_rtasks, kernel.threads)
        for op in plan.graph
        for kernel in op.rkernels
        if "matmul" in op.func
    }


@pytest.mark.parametrize("body_functions", [True, False])
def test_a_compile_with_db_runs_the_records_as_rkernels(records, body_functions, tmp_path):
    model, work_dir, best = records
    options = {**OPTIONS, "cuda_body_functions": body_functions}
    builds = {}
    for db in (None, work_dir):
        lowered = tvm_rtask.lower(model, TARGET, db=db, **options)
        ex, plan = tvm_rtask.build(lowered, TARGET)
        builds[db is not None] = (tvm_rtask.cuda_source(ex), plan)
    source, plan = builds[True]
    expected = {}
    for name, func in best.items():
        grid, block = _extents(func)
        expected[name] = (int(np.prod(list(grid.values()))), int(np.prod(list(block.values()))))
    assert _matmul_kernels(plan) == expected
    assert _matmul_kernels(builds[False][1]) != expected  # dlight's are other schedules
    # both products in one rProgram: two distinct rKernels side by side in one kernel
    (program,) = [s for s in plan.steps if isinstance(s, RProgram)]
    assert {plan.graph.op(op).func for op in program.ops()} >= set(best)
    assert "vthread" not in source
    if NVCC is None:
        return
    from tests.backend.cuda.test_ptx_parity import _counts, _ptx, _spills, _with_callees

    ours, report = _ptx(source, tmp_path, "rtask")
    kernels = {
        name: func.with_attr("global_symbol", name).without_attr(TUNED_ATTR)
        for name, func in best.items()
    }
    target = tvm.target.Target(TARGET, host="llvm")
    with target:
        lib = tvm.tirx.build(tvm.IRModule(kernels), target=target)
    theirs, _ = _ptx(
        next(m.inspect_source() for m in lib.imports if m.kind == "cuda"), tmp_path, "tvm"
    )
    (kernel,) = [k for k in ours if re.fullmatch(r"rprogram_\d+_kernel", k)]
    mine = _counts(_with_callees(ours, kernel))
    tvms = [_counts(theirs[f"{name}_kernel"]) for name in best]
    # the records' unrolled FMAs, as many as TVM's own kernels of the same schedules have,
    # fed from their shared-memory tiles (how nvcc splits those loads into vector widths
    # differs by 5-7% either way between the three builds: not compared)
    assert mine["fma"] == sum(t["fma"] for t in tvms) > 0, (mine, tvms)
    assert mine["ld.shared.bytes"] > 0 and all(t["ld.shared.bytes"] > 0 for t in tvms)
    spills = _spills(report)
    assert all(spills.get(fn, 0) == 0 for fn in ours if fn.startswith("rtask_body_")), spills
    if not body_functions:
        assert spills.get(kernel, 0) == 0, spills
