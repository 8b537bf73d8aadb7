"""The CUDA timeline (option ``trace``) without a GPU: the record slots, the traced kernel's
source, its registers and spills against the untraced one (ptxas, where nvcc is), and the
timeline made of CUDA-shaped records."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import tvm_rtask
from tests.relax_passes.models import SharedKernels, TwoBranches
from tvm_rtask.backend.cuda import status
from tvm_rtask.backend.cuda.dispatch import RUN, WAIT, trace_slots
from tvm_rtask.runtime import trace
from tvm_rtask.runtime.trace import PROGRAM, RTASK, TRACE_WORDS, Timeline

NVCC = shutil.which("nvcc")
TARGET = {"kind": "cuda", "arch": "sm_90"}
# no register probe (an optimised nvcc run per kernel) and no occupancy check: source only
OPTIONS = {"verify_occupancy": False, "cuda_registers": 64, "num_veu": 8}


def test_each_veu_has_a_slot_for_its_call_each_wait_and_each_rtask():
    table = np.zeros((3, 4, 5), "int32")
    table[0, 0] = [RUN, 0, 0, 3, 1]  # three rTasks
    table[0, 1] = [WAIT, 0, 2, 0, 0]
    table[0, 2] = [RUN, 1, 0, 2, 1]
    table[1, 0] = [RUN, 0, 3, 1, 1]
    # vEU 2 runs nothing: only its call
    assert trace_slots(table).tolist() == [0, 1 + 1 + 5, 1 + 1 + 5 + 1 + 1, 10]


@pytest.fixture(scope="module")
def builds():
    out = {}
    for traced in (False, True):
        lowered = tvm_rtask.lower(TwoBranches, TARGET, trace=traced, **OPTIONS)
        ex, plan = tvm_rtask.build(lowered, TARGET)
        out[traced] = (lowered, tvm_rtask.cuda_source(ex), plan)
    return out


def test_the_untraced_kernel_has_no_trace_at_all(builds):
    lowered, source, _ = builds[False]
    assert "trace" not in source
    assert "collect_cuda_trace" not in lowered["main"].script()


def test_the_traced_kernel_records_every_rtask_wait_and_call(builds):
    lowered, source, plan = builds[True]
    main = lowered["main"].script()
    calls = re.findall(r"R\.call_tir\((rprogram_\d+)", main)
    assert len(calls) == len(plan.programs())
    assert "tvm_rtask.collect_cuda_trace" in main
    # one record call site each for rTasks (per distinct body), waits and the call
    body_sites = len(re.findall(r"tvm_rtask_trace_end\(", source))
    assert body_sites >= 3
    assert "%globaltimer" in source
    # the untraced source's kernels, each still there
    assert _kernels(builds[False][1]) == _kernels(source)


def _kernels(source: str) -> set[str]:
    return set(re.findall(r"__global__ void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\(", source))


def test_the_trace_table_counts_every_event_of_the_plan(builds):
    lowered, _, plan = builds[True]
    from tvm_rtask.backend.cuda.dispatch import counter_table, operator_index

    for program in plan.programs():
        funcs = {op: plan.graph.op(op).func for op in program.ops()}
        index = operator_index(program.ops(), funcs)
        table, _ = counter_table(program, plan.graph, index)
        slots = trace_slots(table)
        rtasks = sum(1 for _ in program.tasks())
        waits = int((table[..., 0] == WAIT).sum())
        assert slots[-1] == rtasks + waits + program.num_veu


@pytest.mark.skipif(not NVCC, reason="nvcc not found: ptxas cannot report spills")
def test_the_trace_adds_no_spills_to_the_body_functions(builds):
    """The rKernel bodies that are device functions keep their registers: no spill traced
    or not. (The dispatcher itself, with its inlined small bodies, spills a few more bytes
    traced: docs/scheduling.md.)"""
    from tvm_rtask.backend.cuda.compile_cache import compile_source
    from tvm_rtask.backend.cuda.occupancy import parse_function_spills

    spills = {
        t: parse_function_spills(compile_source(builds[t][1], "sm_90").report) for t in builds
    }
    bodies = [name for name in spills[True] if name.startswith("rtask_body_")]
    assert bodies, "TwoBranches has body functions (its convolutions use shared memory)"
    for name in bodies:
        assert spills[True][name] == spills[False][name] == 0, name


def test_a_cuda_timeline_spans_its_veus_calls():
    """Records as a traced CUDA kernel writes them (a call record per vEU, %globaltimer ns)
    become the same timeline as the CPU's."""
    _, plan = tvm_rtask.compile_with_plan(SharedKernels, "llvm", num_veu=2, fusion="none")
    program = plan.programs()[0]
    k = plan.steps.index(program)
    names = {op.name: plan.graph.index(op.name) for op in plan.graph}
    rows, t = [], 1_000_000
    for veu in range(program.num_veu):
        rows.append([PROGRAM, k, veu, 0, 0, t + 10 * veu, t + 5_000, 0])
    for n, task in enumerate(program.tasks()):
        veu = n % program.num_veu
        start = t + 100 + 1_000 * n
        rows.append([RTASK, k, veu, names[task.op], task.rtask_id, start, start + 800, 0])
    timeline = Timeline(plan, np.asarray(rows, dtype=np.int64))
    step = timeline.timing().steps[k]
    assert step.end_us - step.start_us == pytest.approx(5.0)
    spans = step.program.spans
    assert len(spans) == len(rows) - program.num_veu
    assert all(b - a == pytest.approx(0.8) for _, a, b in spans.values())


def test_collected_buffers_are_the_recording_s_records():
    trace.start(capacity=4)
    status.collect_cuda_trace(_FakeBuffer(np.arange(2 * TRACE_WORDS, dtype=np.int64)))
    records, dropped = trace.stop()
    assert dropped == 0 and records.shape == (2, TRACE_WORDS)
    assert records[1, 0] == TRACE_WORDS
    status.collect_cuda_trace(_FakeBuffer(np.zeros(TRACE_WORDS, dtype=np.int64)))
    assert status.stop_trace() == []  # not recording: nothing kept


class _FakeBuffer:
    """What the VM hands the collector: a tensor with ``numpy()``."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def numpy(self) -> np.ndarray:
        return self.values
