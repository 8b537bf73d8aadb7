"""Bodies built while the plan is made (backend/cpu/early_build.py).

The builder runs beside the plan, so whether it has finished a body when the build claims
it depends on the machine: the tests that need a body built early wait for the builder
before the claim. Every compile is checked against the build without early bodies
(bitwise: the kernels' code must not change) and against numpy.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask
from tests.backend.cpu.test_body_functions import Twice
from tvm_rtask.backend.cpu import early_build, parallel_build
from tvm_rtask.backend.cpu.early_build import EarlyBuilds, early_builds
from tvm_rtask.fallbacks import BUILT_LATE


def _inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((64, 64)).astype("float32") for _ in range(3)]


def _run(ex, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


def _finished(builder, timeout_s: float = 120.0) -> None:
    """Wait until the builder has done every job it was given (or ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    directory = builder.directory
    while time.monotonic() < deadline:
        done = 0
        for index in range(len(builder.names)):
            try:
                with open(os.path.join(directory, f"{index}.sym")) as f:
                    symbol = f.read()
            except FileNotFoundError:
                break
            if symbol and not os.path.exists(os.path.join(directory, f"{symbol}.o")):
                break
            done += 1
        if done == len(builder.names):
            return
        time.sleep(0.01)
    raise AssertionError("the early builder did not finish in time")


@pytest.fixture
def claims(monkeypatch):
    """Each claim, made once the builder has finished its jobs."""
    made = []
    claim = EarlyBuilds.claim

    def claim_when_done(self, symbols):
        if self._builder is not None:
            _finished(self._builder)
        made.append(claim(self, symbols))
        return made[-1]

    monkeypatch.setattr(EarlyBuilds, "claim", claim_when_done)
    monkeypatch.setattr(parallel_build, "MIN_GROUP_SIZE", 1)
    return made


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def _compile(jobs: int):
    return tvm_rtask.compile(Twice, "llvm", num_veu=2, cpu_build_jobs=jobs)


def test_the_build_takes_the_bodies_built_early_and_computes_the_same(claims):
    args = _inputs()
    early = _compile(2)
    assert len(claims) == 1 and claims[0].ready, "the build took no body built early"
    assert isinstance(early, parallel_build.SideObjectsExecutable)
    out = _run(early, args)
    assert np.abs(out).max() > 10.0  # activations alive: a missing rTask would show
    np.testing.assert_array_equal(out, _run(_compile(1), args))
    x, w1, w2 = args
    np.testing.assert_allclose(out, np.maximum(x @ w1, 0) @ w2, rtol=1e-4, atol=1e-3)
    assert early_builds().running_pid() is None  # stopped by the claim


def test_lowering_alone_starts_no_builder():
    tvm_rtask.lower(Twice, "llvm", num_veu=2, cpu_build_jobs=2)
    assert early_builds().running_pid() is None


def test_a_single_build_process_starts_no_builder(claims):
    _compile(1)
    assert all(claim.builder is None for claim in claims)


def test_a_build_in_another_pass_context_takes_nothing_built_early(monkeypatch, claims):
    build = tvm_rtask.api.build

    def build_in_another_context(lowered, target):
        with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_vectorize": True}):
            return build(lowered, target)

    monkeypatch.setattr(tvm_rtask.api, "build", build_in_another_context)
    args = _inputs()
    ex = _compile(2)
    assert claims and not claims[0].ready and not claims[0].coming
    x, w1, w2 = args
    np.testing.assert_allclose(_run(ex, args), np.maximum(x @ w1, 0) @ w2, rtol=1e-4, atol=1e-3)


def test_a_body_the_builder_did_not_deliver_is_built_here(monkeypatch, caplog):
    parent = os.getpid()
    build_object = early_build.build_object

    def dies_in_the_builder(mod, target, path):
        if os.getpid() != parent:
            os._exit(3)
        build_object(mod, target, path)

    monkeypatch.setattr(early_build, "build_object", dies_in_the_builder)
    monkeypatch.setattr(parallel_build, "MIN_GROUP_SIZE", 1)
    claim = EarlyBuilds.claim

    def claim_once_it_died(self, symbols):
        builder = self._builder
        if builder is not None:  # it writes a body's symbol, then dies building it
            deadline = time.monotonic() + 120
            while _state(builder.pid) != "Z":
                assert time.monotonic() < deadline, "the builder did not die"
                time.sleep(0.01)
        return claim(self, symbols)

    monkeypatch.setattr(EarlyBuilds, "claim", claim_once_it_died)
    args = _inputs()
    with caplog.at_level(logging.INFO, logger="tvm_rtask"):
        ex = _compile(2)
    np.testing.assert_array_equal(_run(ex, args), _run(_compile(1), args))
    assert "did not deliver" in caplog.text


def test_a_job_that_fails_in_the_builder_is_noted_in_the_plan(monkeypatch, claims):
    """The builder has no one to tell: the claim notes its failure (the operator and the
    error), and the plan compile_with_plan returns lists it among its fallbacks."""
    parent = os.getpid()
    build_object = early_build.build_object

    def fails_in_the_builder(mod, target, path):
        if os.getpid() != parent:
            raise RuntimeError("no object for you")
        build_object(mod, target, path)

    monkeypatch.setattr(early_build, "build_object", fails_in_the_builder)
    args = _inputs()
    ex, plan = tvm_rtask.compile_with_plan(Twice, "llvm", num_veu=2, cpu_build_jobs=2)
    assert claims and not claims[0].ready and not claims[0].coming
    late = [f for f in plan.report()["fallbacks"] if f["kind"] == BUILT_LATE]
    assert late, plan.report()["fallbacks"]
    assert all("RuntimeError: no object for you" in f["reason"] for f in late)
    assert {f["subject"] for f in late} <= {op.func for op in plan.graph.ops}
    np.testing.assert_array_equal(_run(ex, args), _run(_compile(1), args))


def test_predicted_ranges_are_those_of_one_rtask_per_veu():
    params = [tvm.tirx.Var(n, "int32") for n in ("a", "b", "start", "step", "count")]
    func = tvm.tirx.PrimFunc(params, tvm.tirx.Evaluate(0))
    assert early_build.predicted_ranges(func, 4) == {2: (0, 3), 3: (1, 1), 4: (1, 1)}
