"""Tests of the native step-array library, its loader, exporting, and TVM's thread pool."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from tvm_rtask.runtime import export_library, native, num_threads, set_num_threads

pytestmark = pytest.mark.timeout(60, method="thread")

LONG_US = 10_000_000  # 10 s: only reached if something is broken
SHORT_US = 50_000  # 50 ms


# --------------------------------------------------------------------------------------
# TIR functions calling the native library through T.call_extern
# --------------------------------------------------------------------------------------


@T.prim_func
def signal_wait(
    step: T.Buffer((2,), "int32"),
    status: T.Buffer((5,), "int32"),
    rc: T.Buffer((4,), "int32"),
    timeout_us: T.int64,
):
    # vEU 0 publishes step 3 and waits for it (reached); then waits for vEU 1 to reach
    # step 1, which never happens: a bounded wait that must time out and report.
    rc[0] = T.call_extern("int32", "tvm_rtask_cpu_signal", T.address_of(step[0]), 3)
    rc[1] = T.call_extern(
        "int32",
        "tvm_rtask_cpu_wait",
        T.address_of(step[0]),
        3,
        T.address_of(status[0]),
        timeout_us,
        0,
        0,
    )
    rc[2] = T.call_extern(
        "int32",
        "tvm_rtask_cpu_wait",
        T.address_of(step[1]),
        1,
        T.address_of(status[0]),
        timeout_us,
        0,
        1,
    )
    rc[3] = T.call_extern("int32", "tvm_rtask_cpu_status_ok", T.address_of(status[0]))


@T.prim_func
def ping_pong(
    step: T.Buffer((2,), "int32"),
    status: T.Buffer((5,), "int32"),
    rc: T.Buffer((2,), "int32"),
    tid: T.Buffer((2,), "int32"),
    timeout_us: T.int64,
):
    # Iteration i is vEU i: it signals its own step, then waits for the other vEU's.
    # Both can finish only if the two iterations run concurrently on two threads.
    for i in T.parallel(2):
        T.evaluate(T.call_extern("int32", "tvm_rtask_cpu_signal", T.address_of(step[i]), 1))
        rc[i] = T.call_extern(
            "int32",
            "tvm_rtask_cpu_wait",
            T.address_of(step[1 - i]),
            1,
            T.address_of(status[0]),
            timeout_us,
            i,
            1 - i,
        )
        tid[i] = T.call_extern("int32", "gettid")


@T.prim_func
def thread_ids(tid: T.Buffer((7,), "int32")):
    for i in T.parallel(7):
        tid[i] = T.call_extern("int32", "gettid")


# --------------------------------------------------------------------------------------
# helpers and fixtures
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lib():
    return native.load()


def _i32(n: int):
    return (ctypes.c_int32 * n)()


def _tensors(*shapes):
    dev = tvm.cpu()
    return [tvm.runtime.tensor(np.zeros(s, "int32"), dev) for s in shapes]


@pytest.fixture(scope="module")
def built(lib):
    def build(func, name):
        return tvm.compile(tvm.IRModule({name: func}), target="llvm")

    return {
        "signal_wait": build(signal_wait, "signal_wait"),
        "ping_pong": build(ping_pong, "ping_pong"),
        "thread_ids": build(thread_ids, "thread_ids"),
    }


def _in_fresh_thread(fn, *args):
    """Run fn in a new OS thread and return its result (re-raising its exception).

    TVM's thread pool and its max-concurrency setting are thread-local, and a pool cannot
    grow once created: a fresh thread makes these tests independent of whatever TVM work
    other tests did in the main thread.
    """
    box: dict[str, object] = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # re-raised in the caller
            box["error"] = err

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(50)
    assert not worker.is_alive(), "thread did not finish"
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --------------------------------------------------------------------------------------
# (a) the library from ctypes
# --------------------------------------------------------------------------------------


def test_library_found_and_versioned(lib):
    path = native.library_path()
    assert os.path.isfile(path) and os.path.basename(path) == native.LIBRARY_NAME
    assert native.load() is lib  # loaded once
    assert native.runtime_version() == "0.1.0"


def test_library_not_found_names_searched_paths(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_package_dirs", lambda: [tmp_path / "pkg"])
    monkeypatch.setattr(native, "_build_dirs", lambda: [tmp_path / "build"])
    monkeypatch.delenv(native.ENV_VAR, raising=False)
    with pytest.raises(RuntimeError) as info:
        native.library_path()
    msg = str(info.value)
    assert str(tmp_path / "pkg" / "lib" / native.LIBRARY_NAME) in msg
    assert str(tmp_path / "build" / native.LIBRARY_NAME) in msg
    assert "pip install -e ." in msg


def test_library_from_env_var(monkeypatch, tmp_path):
    real = native.library_path()
    monkeypatch.setattr(native, "_package_dirs", lambda: [tmp_path])
    monkeypatch.setattr(native, "_build_dirs", lambda: [])
    monkeypatch.setenv(native.ENV_VAR, real)
    assert native.library_path() == real


def test_status_ok(lib):
    status = _i32(5)
    assert lib.tvm_rtask_cpu_status_ok(status) == 1
    status[0] = 2
    assert lib.tvm_rtask_cpu_status_ok(status) == 0


def test_signal_then_wait_returns_at_once(lib):
    step, status = _i32(1), _i32(5)
    assert lib.tvm_rtask_cpu_signal(step, 4) == 0
    assert step[0] == 4
    start = time.monotonic()
    assert lib.tvm_rtask_cpu_wait(step, 4, status, LONG_US, 1, 0) == 0
    assert lib.tvm_rtask_cpu_wait(step, 2, status, LONG_US, 1, 0) == 0
    assert time.monotonic() - start < 1.0
    assert list(status) == [0] * 5


def test_two_python_threads_ping_pong(lib):
    # Two vEUs in strict alternation, one step counter each.  ctypes drops the GIL during
    # the calls, so a waiter really waits while the other thread runs.
    steps, status = [_i32(1), _i32(1)], _i32(5)
    rounds = 200
    results: dict[int, list[int]] = {0: [], 1: []}

    def veu(me: int) -> None:
        other = 1 - me
        for k in range(1, rounds + 1):
            if me == 1:  # vEU 1 goes first in each round
                lib.tvm_rtask_cpu_signal(steps[me], k)
            rc = lib.tvm_rtask_cpu_wait(steps[other], k, status, LONG_US, me, other)
            results[me].append(rc)
            if me == 0:
                lib.tvm_rtask_cpu_signal(steps[me], k)

    threads = [threading.Thread(target=veu, args=(v,)) for v in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert results == {0: [0] * rounds, 1: [0] * rounds}
    assert [steps[0][0], steps[1][0]] == [rounds, rounds]
    assert list(status) == [0] * 5


def test_wait_times_out_and_reports(lib, capfd):
    step, status = _i32(1), _i32(5)
    step[0] = 2
    start = time.monotonic()
    rc = lib.tvm_rtask_cpu_wait(step, 7, status, SHORT_US, 3, 5)
    elapsed = time.monotonic() - start
    assert rc == 1
    assert 0.045 <= elapsed < 1.0
    assert list(status) == [1, 3, 5, 7, 2]  # failed, waiter vEU, target vEU, target, seen
    err = capfd.readouterr().err
    assert "barrier timeout" in err and "vEU 3" in err and "vEU 5" in err
    assert err.count("\n") == 1
    assert lib.tvm_rtask_cpu_status_ok(status) == 0


def test_wait_after_failure_returns_at_once(lib, capfd):
    step, status = _i32(1), _i32(5)
    status[0] = 1
    start = time.monotonic()
    assert lib.tvm_rtask_cpu_wait(step, 1, status, LONG_US, 0, 1) == 1
    assert time.monotonic() - start < 0.1
    assert list(status) == [1, 0, 0, 0, 0]  # details of the first failure are kept
    assert capfd.readouterr().err == ""


def test_only_first_timeout_records(lib, capfd):
    step0, step1, status = _i32(1), _i32(1), _i32(5)
    assert lib.tvm_rtask_cpu_wait(step1, 1, status, 1_000, 0, 1) == 1
    status_before = list(status)
    assert lib.tvm_rtask_cpu_wait(step0, 1, status, 1_000, 1, 0) == 1
    assert list(status) == status_before == [1, 0, 1, 1, 0]
    assert capfd.readouterr().err.count("barrier timeout") == 1


def test_zero_timeout_does_not_wait(lib, capfd):
    step, status = _i32(1), _i32(5)
    step[0] = 1
    assert lib.tvm_rtask_cpu_wait(step, 1, status, 0, 2, 3) == 0  # already reached
    start = time.monotonic()
    assert lib.tvm_rtask_cpu_wait(step, 2, status, 0, 2, 3) == 1
    assert time.monotonic() - start < 0.1
    assert list(status) == [1, 2, 3, 2, 1]
    assert "barrier timeout" in capfd.readouterr().err


def test_concurrent_timeouts_record_once(lib, capfd):
    step, status = _i32(1), _i32(5)
    out: list[int] = []
    waiters = [
        threading.Thread(
            target=lambda v=v: out.append(lib.tvm_rtask_cpu_wait(step, 1, status, SHORT_US, v, 9))
        )
        for v in range(4)
    ]
    for t in waiters:
        t.start()
    for t in waiters:
        t.join(5)
    assert out == [1] * 4
    assert status[0] == 1 and status[1] in range(4) and list(status)[2:] == [9, 1, 0]
    assert capfd.readouterr().err.count("barrier timeout") == 1


def test_failure_elsewhere_releases_a_blocked_waiter(lib):
    step, status = _i32(1), _i32(5)
    out: list[int] = []
    waiter = threading.Thread(
        target=lambda: out.append(lib.tvm_rtask_cpu_wait(step, 1, status, LONG_US, 0, 1))
    )
    start = time.monotonic()
    waiter.start()
    time.sleep(0.05)  # let it reach the sleeping phase of its backoff
    status[0] = 9  # another vEU failed
    waiter.join(5)
    assert not waiter.is_alive()
    assert out == [1]
    assert time.monotonic() - start < 1.0
    assert list(status) == [9, 0, 0, 0, 0]


# --------------------------------------------------------------------------------------
# (b) from TIR: LLVM JIT and an exported library
# --------------------------------------------------------------------------------------


def test_tir_jit_signal_wait(built, capfd):
    step, status, rc = _tensors(2, 5, 4)
    built["signal_wait"]["signal_wait"](step, status, rc, SHORT_US)
    assert rc.numpy().tolist() == [0, 0, 1, 0]  # signal ok, wait ok, timeout, status failed
    assert step.numpy().tolist() == [3, 0]
    assert status.numpy().tolist() == [1, 0, 1, 1, 0]
    assert "barrier timeout" in capfd.readouterr().err


_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tvm

    mod = tvm.runtime.load_module(sys.argv[1])
    dev = tvm.cpu()
    step, status, rc = [tvm.runtime.tensor(np.zeros(n, "int32"), dev) for n in (2, 5, 4)]
    mod["signal_wait"](step, status, rc, 20000)
    assert "tvm_rtask" not in sys.modules, "the child must not import tvm_rtask"
    print("RESULT", rc.numpy().tolist(), step.numpy().tolist(), status.numpy().tolist())
    """
)


def _run_child(so_path: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != native.ENV_VAR}
    return subprocess.run(
        [sys.executable, "-c", _CHILD, so_path],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        cwd=os.path.dirname(so_path),
    )


def test_exported_library_links_native_runtime(built, tmp_path):
    so_path = str(tmp_path / "signal_wait.so")
    assert export_library(built["signal_wait"], so_path) == so_path
    proc = _run_child(so_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT [0, 0, 1, 0] [3, 0] [1, 0, 1, 1, 0]" in proc.stdout
    assert "barrier timeout" in proc.stderr


def test_plain_export_does_not_resolve_symbols(built, tmp_path):
    # Control for the test above: without the link options the child cannot resolve them.
    so_path = str(tmp_path / "plain.so")
    built["signal_wait"].export_library(so_path)
    proc = _run_child(so_path)
    assert proc.returncode != 0
    assert "tvm_rtask_cpu_" in proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------
# (c) TVM's thread pool: T.parallel iterations as concurrent vEUs
# --------------------------------------------------------------------------------------


def test_set_num_threads():
    def check():
        assert num_threads() >= 1
        assert set_num_threads(2) == 2
        assert num_threads() == 2
        assert set_num_threads(1) == 1
        assert num_threads() == 1
        assert set_num_threads(2) == 2  # grows back: the pool was created large enough
        with pytest.raises(ValueError):
            set_num_threads(0)

    _in_fresh_thread(check)


def test_set_num_threads_after_pool_creation_is_an_error():
    def check():
        # Creates this thread's pool with a single worker, as earlier TVM work might.
        tvm.get_global_func("runtime.config_threadpool")(1, 1, ["0"])
        with pytest.raises(RuntimeError, match="TVM_NUM_THREADS=2"):
            set_num_threads(2)

    _in_fresh_thread(check)


def test_parallel_loop_runs_on_two_threads(built):
    def run():
        set_num_threads(2)
        step, status, rc, tid = _tensors(2, 5, 2, 2)
        start = time.monotonic()
        built["ping_pong"]["ping_pong"](step, status, rc, tid, LONG_US)
        return time.monotonic() - start, step, status, rc, tid

    elapsed, step, status, rc, tid = _in_fresh_thread(run)
    assert elapsed < 5.0
    assert rc.numpy().tolist() == [0, 0]
    assert status.numpy().tolist() == [0] * 5
    assert step.numpy().tolist() == [1, 1]
    t0, t1 = tid.numpy().tolist()
    assert t0 != t1 and t0 > 0 and t1 > 0


def test_parallel_loop_on_one_thread_times_out(built, capfd):
    # Both iterations run one after the other on one thread: iteration 0 waits for
    # iteration 1, which has not started.  The bounded wait must report, not hang.
    def run():
        set_num_threads(1)
        step, status, rc, tid = _tensors(2, 5, 2, 2)
        start = time.monotonic()
        built["ping_pong"]["ping_pong"](step, status, rc, tid, SHORT_US)
        return time.monotonic() - start, status, rc, tid

    elapsed, status, rc, tid = _in_fresh_thread(run)
    assert elapsed < 5.0
    assert rc.numpy().tolist() == [1, 1]  # 0 timed out; 1 saw the recorded failure
    assert status.numpy().tolist() == [1, 0, 1, 1, 0]
    t0, t1 = tid.numpy().tolist()
    assert t0 == t1
    assert "vEU 0 waited" in capfd.readouterr().err


def test_parallel_loop_extent_above_pool_size_is_chunked(built):
    # Each task runs one contiguous chunk of ceil(extent / threads) iterations.
    def run(n):
        set_num_threads(n)
        (tid,) = _tensors(7)
        built["thread_ids"]["thread_ids"](tid)
        return tid.numpy().tolist()

    ids = _in_fresh_thread(run, 2)  # chunks of 4: 4 + 3
    assert ids[:4] == [ids[0]] * 4 and ids[4:] == [ids[4]] * 3 and ids[0] != ids[4]
    ids = _in_fresh_thread(run, 3)  # chunks of 3: 3 + 3 + 1
    assert ids[:3] == [ids[0]] * 3 and ids[3:6] == [ids[3]] * 3
    assert len({ids[0], ids[3], ids[6]}) == 3
