"""The CUDA dispatcher's TIR and task table (structure only: no GPU, no nvcc)."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import tirx

from tests.relax_passes.models import TwoBranches
from tvm_rtask.backend.cuda.dispatch import ENTRY_WORDS, RUN, SIGNAL, WAIT, program_table
from tvm_rtask.core import Plan
from tvm_rtask.relax_passes import PLAN_ATTR, LowerRPrograms, PlanRPrograms, RTaskPrepare


@pytest.fixture(scope="module")
def lowered():
    prepared = RTaskPrepare(None, "cuda")(TwoBranches)
    planned = PlanRPrograms("cuda", num_veu=8, verify_occupancy=False)(prepared)
    return LowerRPrograms()(planned), Plan.from_json(str(planned.attrs[PLAN_ATTR]))


def test_the_task_table_covers_every_rtask_once(lowered):
    _, plan = lowered
    for program in plan.programs():
        index = {op: i for i, op in enumerate(program.ops())}
        table, pairs = program_table(program, index)
        assert table.shape[0] == program.num_veu and table.shape[2] == ENTRY_WORDS
        ran: dict[int, list[int]] = {}
        for row in table:
            for kind, op, start, count, step in row:
                if kind == RUN:
                    ran.setdefault(op, []).extend(start + step * i for i in range(count))
                assert kind in (0, RUN, WAIT, SIGNAL)
        for op, i in index.items():
            assert sorted(ran[i]) == list(
                range(plan.graph.op(op).kernel(program.kernel_of(op)).num_rtasks)
            )
        assert pairs.ndim == 2 and pairs.shape[1] == 2


def test_persistent_kernels_index_in_int32_with_one_body_per_operator(lowered):
    mod, plan = lowered
    for k, program in enumerate(plan.steps):
        if not hasattr(program, "entries"):
            continue
        func = mod[f"rprogram_{k}"]
        dtypes = set()

        def visit(node, dtypes=dtypes):
            if isinstance(node, tirx.For):
                dtypes.add(str(node.loop_var.ty))

        tvm_ffi.structural_walk(func.body, visit)
        assert "int64" not in dtypes, dtypes
        text = func.script()
        # the vEU's block and grid, and each operator's body once, whatever the vEU count
        assert f'T.thread_binding({program.num_veu}, thread="blockIdx.x")' in text
        assert f'T.thread_binding({plan.vdevice.threads}, thread="threadIdx.x")' in text


def test_the_status_check_is_opt_in():
    prepared = RTaskPrepare(None, "cuda")(TwoBranches)
    plain = tvm.transform.Sequential([PlanRPrograms("cuda", num_veu=8), LowerRPrograms()])(prepared)
    checked = tvm.transform.Sequential(
        [PlanRPrograms("cuda", num_veu=8, check_status=True), LowerRPrograms()]
    )(prepared)
    assert "tvm_rtask.check_status" not in plain["main"].script()
    assert "tvm_rtask.check_status" in checked["main"].script()
