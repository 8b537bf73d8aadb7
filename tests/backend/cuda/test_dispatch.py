"""The CUDA dispatcher's TIR and task table (structure only: no GPU, no nvcc)."""

from __future__ import annotations

import re

import pytest
import tvm
import tvm_ffi
from tvm import tirx

import tvm_rtask
from tests.relax_passes.models import SharedKernels, TwoBranches
from tvm_rtask.backend.cuda.dispatch import (
    ARRIVE,
    ENTRY_WORDS,
    RUN,
    SIGNAL,
    WAIT,
    counter_table,
    operator_index,
    program_table,
)
from tvm_rtask.core import Plan
from tvm_rtask.core.counters import task_counts
from tvm_rtask.errors import OptionError
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


def _plan_and_lower_target(model, num_veu=8, **options):
    prepared = RTaskPrepare(None, "cuda")(model)
    planned = PlanRPrograms("cuda", num_veu=num_veu, verify_occupancy=False, **options)(prepared)
    return LowerRPrograms()(planned), Plan.from_json(str(planned.attrs[PLAN_ATTR]))


def _plan_and_lower(model, **options):
    return _plan_and_lower_target(model, **options)


def _index(plan, program):
    return operator_index(program.ops(), {op: plan.graph.op(op).func for op in program.ops()})


@pytest.mark.parametrize("model", [TwoBranches, SharedKernels])
def test_the_counter_table_runs_every_rtask_once_and_counts_what_is_awaited(model):
    _, plan = _plan_and_lower(model)
    for program in plan.programs():
        index = _index(plan, program)
        table, pairs = counter_table(program, plan.graph, index)
        total = task_counts(program)
        ran: dict[int, list[int]] = {}
        arrived: dict[int, int] = {}
        waited: set[int] = set()
        for row in table:
            for kind, a, b, c, d in row:
                assert kind in (0, RUN, WAIT, ARRIVE)
                if kind == RUN:
                    ran.setdefault(a, []).extend(b + d * i for i in range(c))
                elif kind == ARRIVE:
                    arrived[a] = arrived.get(a, 0) + b
                elif kind == WAIT:
                    for op, count in pairs[a : a + b]:
                        waited.add(int(op))
                        assert count == total[program.ops()[0]] or count in total.values()
        by_index = {i: op for op, i in index.items()}
        for i, tasks in ran.items():
            assert sorted(tasks) == list(range(total[by_index[i]]))
        assert len(ran) == len(index)
        # an operator that someone waits for is counted in full, others not at all
        assert {i: arrived[i] for i in waited} == {i: total[by_index[i]] for i in waited}
        assert set(arrived) == waited


def _run_loops(func) -> int:
    loops = []

    def visit(node):
        if isinstance(node, tirx.For) and node.loop_var.name == "run":
            loops.append(node)

    tvm_ffi.structural_walk(func.body, visit)
    return len(loops)


def _helpers_called(func) -> set[str]:
    """Names of the device helpers the persistent kernel calls."""
    return set(re.findall(r'func_call\("(tvm_rtask_\w+)"', func.script()))


def test_operators_with_one_rkernel_share_one_body():
    mod, plan = _plan_and_lower(SharedKernels)
    (program,) = plan.programs()
    funcs = {plan.graph.op(op).func for op in program.ops()}
    assert len(program.ops()) == 4 and len(funcs) == 2  # three convolutions, one add
    func = mod["rprogram_0"]
    assert _run_loops(func) == 2  # one rKernel body per distinct kernel, not per operator
    called = _helpers_called(func)
    assert {"tvm_rtask_ptr", "tvm_rtask_wait_count", "tvm_rtask_arrive"} <= called
    assert {"tvm_rtask_finish_epoch", "tvm_rtask_epoch"} <= called
    assert not called & {"tvm_rtask_wait", "tvm_rtask_signal", "tvm_rtask_finish"}


def test_step_arrays_stay_available_and_global_barriers_are_refused():
    mod, plan = _plan_and_lower(SharedKernels, barrier="fine")
    called = _helpers_called(mod["rprogram_0"])
    assert {"tvm_rtask_wait", "tvm_rtask_signal", "tvm_rtask_finish"} <= called
    assert not called & {"tvm_rtask_wait_count", "tvm_rtask_arrive", "tvm_rtask_epoch"}
    assert _run_loops(mod["rprogram_0"]) == 2
    with pytest.raises(OptionError, match="barrier='global' is not implemented on CUDA"):
        tvm_rtask.plan(SharedKernels, "cuda", barrier="global", verify_occupancy=False)


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


def test_nasnet_has_one_body_per_distinct_rkernel_and_waits_per_edge():
    """The zoo's NASNet (reduced): code grows with distinct kernels, waits with edges."""
    from tvm_rtask import models as zoo
    from tvm_rtask.core.counters import CounterWait, counter_scripts, counter_stats

    mod, _ = zoo.get("nasnet_cifar", reduced=True)
    lowered, plan = _plan_and_lower_target(mod, num_veu=132)
    assert plan.programs()
    counter_pairs = 0
    for k, program in enumerate(plan.steps):
        if not hasattr(program, "entries"):
            continue
        funcs = {plan.graph.op(op).func for op in program.ops()}
        assert len(funcs) < len(program.ops())  # NASNet repeats its cells
        assert _run_loops(lowered[f"rprogram_{k}"]) == len(funcs)
        scripts = counter_scripts(program, plan.graph)
        stats = counter_stats(program, plan.graph, scripts)
        assert stats["counters"] <= stats["operators"]
        assert program.num_barriers == 0  # planned for counters: no step barriers
        for script in scripts:  # a vEU waits at most once per dependency edge
            waited = [op for item in script if isinstance(item, CounterWait) for op in item.ops]
            assert len(waited) == len(set(waited)) <= stats["edges"]
        counter_pairs += stats["wait_pairs"]
    # across the whole module, each distinct rKernel that uses shared memory is one device
    # function, whichever rPrograms run it; its dispatchers call it, they do not inline it
    bodies = [
        gv.name_hint for gv in lowered.get_global_vars() if gv.name_hint.startswith("rtask_body_")
    ]
    shared = set()
    for program in plan.programs():
        for op in program.ops():
            if plan.graph.op(op).kernel(program.kernel_of(op)).shared_mem > 0:
                shared.add(plan.graph.op(op).func)
    assert 0 < len(bodies) == len(set(bodies)) <= len(shared)  # at most one per distinct rKernel
    # the same model planned for step arrays waits on far more (vEU, step) pairs
    fine = tvm_rtask.plan(mod, "cuda", num_veu=132, barrier="fine", verify_occupancy=False)
    step_pairs = sum(
        len(e.waits) for p in fine.programs() for es in p.entries for e in es if hasattr(e, "waits")
    )
    assert counter_pairs < step_pairs, (counter_pairs, step_pairs)
