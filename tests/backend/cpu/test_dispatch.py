"""Per-vEU scripts, strided runs, and the CPU dispatcher's shared workspaces."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import tvm_rtask
from tvm_rtask.core import Barrier, RProgram, RTask
from tvm_rtask.core.script import Run, Signal, Wait, scripts_from_program, waves_from_program


def _program():
    prog = RProgram(2)
    for i in range(4):
        prog.append(RTask("a", i, "a@4", wave=0), i % 2)
    for i in range(2):
        task = RTask("b", i, "b@2", wave=1)
        prog.wait(task, [RTask("a", j, "a@4", wave=0) for j in range(4)])
        prog.append(task, i)
    return prog


def test_scripts_use_strided_runs_and_signal_only_waited_tasks():
    scripts = scripts_from_program(_program())
    assert scripts[0][0] == Run("a", 0, count=2, step=2)
    assert scripts[1][0] == Run("a", 1, count=2, step=2)
    assert Signal(2) in scripts[0] and Signal(2) in scripts[1]
    assert Wait(((1, 2),)) in scripts[0] and Wait(((0, 2),)) in scripts[1]
    assert scripts[0][-1] == Run("b", 0) and scripts[1][-1] == Run("b", 1)
    assert not any(isinstance(s, Signal) for s in scripts[0][scripts[0].index(Run("b", 0)) :])


def test_waves_split_programs_for_global_barriers():
    waves = waves_from_program(_program())
    assert [len(w) for w in waves] == [2, 2]
    assert waves[1][0] == [Run("b", 0)]


def test_barrier_pairs_survive_into_scripts():
    prog = _program()
    barriers = [e for entries in prog.entries for e in entries if isinstance(e, Barrier)]
    scripts = scripts_from_program(prog)
    waits = [s for script in scripts for s in script if isinstance(s, Wait)]
    assert len(waits) == len(barriers)


@tvm.script.ir_module
class Exchange:
    """Two vEUs produce halves of intermediates that both then read: shared workspaces."""

    @R.function
    def main(
        x: R.Tensor((64, 64), "float32"),
        w1: R.Tensor((64, 64), "float32"),
        w2: R.Tensor((64, 64), "float32"),
    ):
        with R.dataflow():
            a = R.matmul(x, w1)
            b = R.matmul(x, w2)
            c = R.add(a, b)
            d = R.matmul(c, w2)  # not fusable into the join: a workspace of its own
            e = R.matmul(d, w1)
            R.output(e)
        return e


@pytest.mark.parametrize("barrier", ["fine", "global"])
def test_intermediates_are_shared_between_veus(barrier):
    """Regression: root-block workspaces were moved into the vEU loop (private copies)."""
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.standard_normal((64, 64)).astype("float32") for _ in range(3))
    expected = ((x @ w1 + x @ w2) @ w2) @ w1
    ex = tvm_rtask.compile(Exchange, "llvm", barrier=barrier, num_veu=2)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for _ in range(20):
        out = vm["main"](*(tvm.runtime.tensor(a) for a in (x, w1, w2))).numpy()
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


def test_one_parallel_launch_per_rprogram():
    mod = tvm_rtask.rtask_pipeline("llvm", barrier="global", num_veu=2)(Exchange)
    programs = [gv.name_hint for gv in mod.get_global_vars() if gv.name_hint.startswith("rprog")]
    plan = tvm_rtask.plan(Exchange, "llvm", num_veu=2)
    assert len(programs) == plan.report()["rprograms"]
    for name in programs:
        text = mod[name].script()
        assert text.count("pragma_parallel_launch_point") == 1


def test_fine_barrier_workspaces_share_one_arena():
    """On the CPU the join c is one matmul's epilogue, so a (or b) and c and d are the
    workspaces; d is written after every task that touches the first ended (the barriers say
    so), so it takes its bytes: one allocation of 2 tensors' size."""
    mod = tvm_rtask.rtask_pipeline("llvm", barrier="fine", num_veu=2)(Exchange)
    (name,) = [gv.name_hint for gv in mod.get_global_vars() if gv.name_hint.startswith("rprog")]
    text = mod[name].script()
    allocations = [line.strip() for line in text.splitlines() if "T.alloc_buffer" in line]
    assert allocations[0] == "rtask_arena_float32 = T.alloc_buffer((T.int64(8192),))"
    assert [a.split(" =")[0] for a in allocations[1:]] == ["rtask_step", "rtask_status"]
    assert text.count("= rtask_arena_float32.view(T.int64(64), T.int64(64))") == 2  # a, then d


@pytest.mark.parametrize("policy", ["wavefront", "sequential", "wavefront_global"])
def test_one_veu_with_global_barriers_runs_its_waves_in_order(policy):
    """One vEU and barrier='global': no parallel launch at all (TVM's code generator failed
    on a launch point whose extent-1 parallel loop it had removed; found by fuzzing)."""
    import numpy as np
    import tvm
    from tvm import relax

    import tvm_rtask
    from tests.relax_passes.models import SharedKernels
    from tests.runtime.test_trace import _inputs

    args = _inputs()
    expected = relax.VirtualMachine(tvm.compile(SharedKernels, "llvm"), tvm.cpu())["main"](*args)
    ex = tvm_rtask.compile(
        SharedKernels, "llvm", policy=policy, num_veu=1, barrier="global", nan_fill=True
    )
    actual = relax.VirtualMachine(ex, tvm.cpu())["main"](*args)
    assert np.abs(expected.numpy()).max() > 1.0
    np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
