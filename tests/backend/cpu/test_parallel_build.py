"""The outlined bodies built in forked processes (backend/cpu/parallel_build.py).

A small module is below the size worth a process, so the tests lower the threshold and ask
for two processes; every case checks the outputs against the serial build of the same
lowered module (bitwise: the kernels' code must not change) and against numpy.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import tvm_rtask
from tests.backend.cpu.test_body_functions import Twice
from tvm_rtask.api import lower
from tvm_rtask.backend.cpu import dispatch, parallel_build
from tvm_rtask.errors import OptionError
from tvm_rtask.runtime import export_library


def _inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((64, 64)).astype("float32") for _ in range(3)]


def _expected(x, w1, w2):
    return np.maximum(x @ w1, 0) @ w2


def _run(ex, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


@pytest.fixture
def small_groups(monkeypatch):
    monkeypatch.setattr(parallel_build, "MIN_GROUP_SIZE", 1)


@pytest.fixture(scope="module")
def lowered():
    return lower(Twice, "llvm", num_veu=2)


def _build(lowered, jobs: int):
    from tvm_rtask.options import RTaskOptions
    from tvm_rtask.relax_passes import plan_of

    plan = plan_of(lowered)
    options = RTaskOptions.from_dict({**plan.options, "cpu_build_jobs": jobs})
    backend = tvm_rtask.backend.get_backend(tvm_rtask.backend.as_target("llvm"))
    return backend.build(lowered, plan, options)


def test_bodies_built_apart_compute_what_the_serial_build_computes(lowered, small_groups):
    args = _inputs()
    serial = _build(lowered, 1)
    assert not isinstance(serial, parallel_build.SideObjectsExecutable)
    apart = _build(lowered, 2)
    assert isinstance(apart, parallel_build.SideObjectsExecutable)
    assert apart.side_objects
    out = _run(apart, args)
    assert np.abs(out).max() > 10.0  # activations alive: a missing rTask would show
    np.testing.assert_array_equal(out, _run(serial, args))
    np.testing.assert_allclose(out, _expected(*args), rtol=1e-4, atol=1e-3)


def test_moved_bodies_are_called_by_name_and_keep_no_copy_here(lowered, small_groups):
    apart = _build(lowered, 2)
    ll = apart.mod.imports[0].inspect_source("ll")
    assert "tvm_rtask_body_" in ll
    # the moved bodies are declared (called), not defined, in this process's module
    assert not [line for line in ll.splitlines() if line.startswith("define") and "_body_" in line]


def test_the_exported_library_runs_in_a_process_without_tvm_rtask(lowered, small_groups, tmp_path):
    args = _inputs()
    apart = _build(lowered, 2)
    path = export_library(apart, tmp_path / "twice.so")
    np.save(tmp_path / "args.npy", np.stack(args))
    code = textwrap.dedent(
        f"""
        import numpy as np, sys, tvm
        from tvm import relax
        args = np.load({str(tmp_path / "args.npy")!r})
        vm = relax.VirtualMachine(tvm.runtime.load_module({path!r}), tvm.cpu())
        out = vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()
        np.save({str(tmp_path / "out.npy")!r}, out)
        assert "tvm_rtask" not in sys.modules
        """
    )
    env = {**os.environ, "TVM_NUM_THREADS": "2"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), _run(apart, args))


def _child_that(fails: str, parent: int, work):
    """A ``_work`` whose forked child takes one group and then exits (``"dies"``) or never
    returns (``"hangs"``); in this process it works as usual."""

    def child_work(queue, sides, target, paths):
        if os.getpid() != parent:
            parallel_build._take(queue)
            if fails == "dies":
                os._exit(3)
            time.sleep(3600)
        work(queue, sides, target, paths)

    return child_work


@pytest.mark.parametrize("fails", ["dies", "hangs"])
def test_a_group_a_build_process_did_not_finish_is_built_here(
    lowered, small_groups, monkeypatch, caplog, fails
):
    monkeypatch.setattr(
        parallel_build, "_work", _child_that(fails, os.getpid(), parallel_build._work)
    )
    # a stuck process is killed this long after this process's own part
    monkeypatch.setattr(parallel_build, "DEADLINE_FLOOR_S", 0.5)
    monkeypatch.setattr(parallel_build, "DEADLINE_FACTOR", 0.0)
    args = _inputs()
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="tvm_rtask"):
        apart = _build(lowered, 2)
    assert time.monotonic() - start < 120
    assert "a build process failed" in caplog.text
    np.testing.assert_allclose(_run(apart, args), _expected(*args), rtol=1e-4, atol=1e-3)


def test_a_small_module_is_built_in_one_process(lowered):
    assert not isinstance(_build(lowered, 2), parallel_build.SideObjectsExecutable)


@pytest.mark.parametrize(
    "cores, elsewhere, jobs", [(2, 0, 2), (2, 1, 1), (2, 4, 1), (16, 3, 8), (4, 1, 3), (4, 0, 4)]
)
def test_the_default_uses_the_cores_other_work_leaves_idle(monkeypatch, cores, elsewhere, jobs):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(parallel_build, "_runnable_elsewhere", lambda **_: elsewhere)
    # the runnable tasks now, not the load average, which lags (a minute after other work)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert parallel_build.build_jobs(None) == jobs
    assert parallel_build.build_jobs(3) == 3  # asked for: as asked


@pytest.mark.parametrize(
    "cores, load, jobs",
    [(2, 0.2, 2), (2, 1.4, 2), (2, 1.6, 1), (2, 2.5, 1), (16, 3.0, 8), (4, 2.0, 3)],
)
def test_without_the_runnable_count_the_load_average_counts(monkeypatch, cores, load, jobs):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(parallel_build, "_runnable_elsewhere", lambda **_: None)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert parallel_build.build_jobs(None) == jobs


def test_the_runnable_count_is_read_where_linux_gives_it():
    elsewhere = parallel_build._runnable_elsewhere()
    if os.path.exists("/proc/loadavg"):
        assert isinstance(elsewhere, int) and elsewhere >= 0
    else:
        assert elsewhere is None


@pytest.mark.parametrize("jobs", [0, -1, 1.5, "2"])
def test_bad_job_counts_are_refused(jobs):
    with pytest.raises(OptionError, match="cpu_build_jobs"):
        tvm_rtask.plan(Twice, "llvm", cpu_build_jobs=jobs)


def test_groups_cover_every_body_once_longest_first_small_groups_last():
    sizes = {f"b{i}": s for i, s in enumerate([90, 10, 40, 40, 30, 20, 5, 5, 60, 25])}
    groups = parallel_build._partition(sizes, 2)
    names = [n for g in groups for n in g]
    assert sorted(names) == sorted(sizes)
    assert [sizes[n] for n in names] == sorted(sizes.values(), reverse=True)
    loads = [sum(sizes[n] for n in g) for g in groups]
    floor = parallel_build.MIN_GROUP_SHARE * sum(sizes.values()) / 2
    assert all(load >= floor for load in loads[:-1])
    assert loads[0] == max(loads) and loads[-1] < loads[0] / 4
    assert len(groups) > 2 * 2  # more groups than processes: the queue balances them
    assert parallel_build._partition({"a": 1}, 4) == [["a"]]


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ([0, 0, 0, 9], 0),
        ([1, 0, 0, 0], 0),
        ([1, 0, 1, 1, 1], 1),
        ([2, 0, 1, 2, 0], 1),
        ([None], None),
    ],
)
def test_runnable_count_is_the_median_of_a_few(monkeypatch, counts, expected):
    seen = iter(counts)
    monkeypatch.setattr(parallel_build, "_runnable_elsewhere_once", lambda _=(): next(seen))
    assert parallel_build._runnable_elsewhere(pause_s=0) == expected


def test_unrolled_loops_count_once_per_copy():
    i, j = tirx.Var("i", "int32"), tirx.Var("j", "int32")
    buf = tirx.decl_buffer((8, 4), "float32", "a")
    store = tirx.BufferStore(buf, tirx.FloatImm("float32", 1.0), [i, j])
    inner = tirx.For(j, 0, 4, tirx.ForKind.UNROLLED, store)
    assert parallel_build.unrolled_size(tirx.For(i, 0, 8, tirx.ForKind.SERIAL, inner)) == 4
    assert parallel_build.unrolled_size(tirx.For(i, 0, 8, tirx.ForKind.UNROLLED, inner)) == 32
    vector = tirx.For(j, 0, 4, tirx.ForKind.VECTORIZED, store)
    assert parallel_build.unrolled_size(tirx.For(i, 0, 8, tirx.ForKind.UNROLLED, vector)) == 8


def test_arguments_every_call_gives_become_constants_or_ranges(lowered):
    calls = dispatch.call_arguments(lowered)
    names = set(parallel_build._movable(lowered, calls))
    ranges = parallel_build._argument_ranges(calls, names)
    assert ranges and set(ranges) <= names
    for name, found in ranges.items():
        func = lowered[name]
        count = len(func.params)
        # the rTask range (start, step, count) is passed as constants by every run
        assert set(found) >= {count - 3, count - 2, count - 1}
        special = parallel_build.specialise(func, found)
        text = special.script()
        for i, (low, high) in found.items():
            name_of = func.params[i].name
            if low == high:
                assert name_of not in text.split("):", 1)[1]  # used nowhere in the body
            else:
                assert f"T.min({name_of}, {high})" in text


def test_a_body_given_other_constants_gets_another_name(lowered, monkeypatch):
    # two executables in one process share the loaded libraries' names: the same body
    # specialised on other call constants is other code and must not bind to the first
    calls = dispatch.call_arguments(lowered)
    names = sorted(parallel_build._movable(lowered, calls))
    target = tvm_rtask.backend.as_target("llvm")
    ranges = parallel_build._argument_ranges(calls, set(names))

    def symbols(step):
        changed = {n: {**r, len(lowered[n].params) - 2: (step, step)} for n, r in ranges.items()}
        monkeypatch.setattr(parallel_build, "_argument_ranges", lambda calls, moved: changed)
        _, symbols = parallel_build._specialised(lowered, set(names), target, calls)
        return [symbols[n] for n in names]

    assert symbols(1) == symbols(1)
    assert not set(symbols(1)) & set(symbols(2))


def _shifted_window_merge():
    """Swin-T's window reverse, cyclic shift back by 3 (``torch.roll``: two slices and a
    concatenation per axis) and residual add, at its 28x28x192 stage: the injective operator
    whose index arithmetic TVM's simplifier rewrote wrongly once the rTask bounds were
    written into its body."""
    windows = relax.Var("windows", relax.TensorType((16, 49, 192), "float32"))
    residual = relax.Var("residual", relax.TensorType((1, 28, 28, 192), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [windows, residual]):
        with bb.dataflow():
            x = bb.emit(relax.op.reshape(windows, (1, 4, 4, 7, 7, 192)))
            x = bb.emit(relax.op.permute_dims(x, [0, 1, 3, 2, 4, 5]))
            x = bb.emit(relax.op.reshape(x, (1, 28, 28, 192)))
            for axis in (1, 2):
                tail = bb.emit(relax.op.strided_slice(x, axes=[axis], begin=[25], end=[28]))
                head = bb.emit(relax.op.strided_slice(x, axes=[axis], begin=[0], end=[25]))
                x = bb.emit(relax.op.concat([tail, head], axis=axis))
            out = bb.emit_output(relax.op.add(x, residual))
        bb.emit_func_output(out)
    return bb.get()


def test_injective_bodies_built_apart_keep_their_parameters_and_match_tvm():
    mod = _shifted_window_merge()
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((16, 49, 192)), rng.standard_normal((1, 28, 28, 192))]
    args = [a.astype("float32") for a in args]
    expected = _run(tvm.compile(mod, "llvm"), args)
    lowered = lower(mod, "llvm-native", num_veu=2, db=False)
    calls = dispatch.call_arguments(lowered)
    bodies = parallel_build._movable(lowered, calls)
    ranges = parallel_build._argument_ranges(calls, set(bodies))
    injective = [
        n
        for n, f in bodies.items()
        if str(f.attrs.get(dispatch.BODY_RULE_ATTR, "")) in parallel_build.UNSPECIALISED_RULES
    ]
    assert injective  # the merge is one body of the Elementwise rule, split over two vEUs
    for name in injective:
        assert parallel_build.specialise(bodies[name], ranges.get(name, {})).same_as(bodies[name])
    for jobs in (1, 2):
        ex = tvm_rtask.compile(mod, "llvm-native", num_veu=2, db=False, cpu_build_jobs=jobs)
        np.testing.assert_array_equal(_run(ex, args), expected)
