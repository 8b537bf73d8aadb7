"""One compiled executable, several callers at once (issue 27, "Concurrency").

CPU: TVM's thread pool belongs to the thread that launches parallel work, so every thread
that calls a persistent CPU kernel needs a pool with one worker per vEU. The dispatcher
sizes the calling thread's pool itself (``tvm_rtask_cpu_ensure_workers``, native library)
and fails at once, with a message naming the fix, when that pool was created earlier with
too few workers. Its step array and status are allocated per call.

CUDA (marked ``gpu``, skipped without a device): the sync words of a persistent kernel are a
Relax constant, which each ``VirtualMachine`` copies to the device when it is created, so
two VMs of one executable never share them (docs/cuda-kernels.md, "Concurrent
callers").
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask
from tests.relax_passes.models import SharedKernels, TwoBranches
from tvm_rtask.relax_passes import as_target
from tvm_rtask.runtime import export_library, native

NUM_VEU = 2
CALLS = 30
THREADS = 3
TIMEOUT_MS = 5000  # a wrong pool would make every call wait this long, then fail


def _inputs(mod, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [[int(d) for d in p.ty.shape] for p in mod["main"].params]
    return [rng.standard_normal(shape).astype("float32") for shape in shapes]


def _llvm_ir(ex) -> str:
    sources = []
    for module in [ex.mod, *ex.mod.imports]:
        try:
            sources.append(module.inspect_source("ll"))
        except Exception:  # noqa: BLE001 - modules without LLVM IR
            pass
    return "\n".join(sources)


class _Case:
    """A wavefront executable with fine barriers and TVM's default build of one module."""

    def __init__(self, mod, seed: int):
        self.ex = tvm_rtask.compile(
            mod, "llvm", policy="wavefront", num_veu=NUM_VEU, spin_timeout_ms=TIMEOUT_MS
        )
        assert "tvm_rtask_cpu_wait" in _llvm_ir(self.ex), "no fine barrier to exercise"
        self.inputs = _inputs(mod, seed)
        reference = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
        self.expected = reference["main"](*self._tensors()).numpy()
        # activations stay alive: a wrong or missing rTask shows in the output
        assert np.abs(self.expected).max() > 1.0

    def _tensors(self):
        return [tvm.runtime.tensor(x) for x in self.inputs]

    def check(self, vm) -> None:
        out = vm["main"](*self._tensors()).numpy()
        np.testing.assert_allclose(out, self.expected, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def cases():
    return [_Case(SharedKernels, seed=0), _Case(TwoBranches, seed=1)]


def _in_threads(target, count: int, timeout: float = 120.0) -> list:
    """Run ``target(i)`` in ``count`` fresh threads at once; their results (or errors)."""
    results: list = [None] * count
    start = threading.Barrier(count)

    def run(i):
        try:
            start.wait()
            results[i] = target(i)
        except BaseException as err:  # noqa: BLE001 - reported below
            results[i] = err

    workers = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout)
        assert not worker.is_alive(), "a caller hung"
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def test_threads_share_one_wavefront_executable(cases):
    case = cases[0]

    def calls(_):
        vm = relax.VirtualMachine(case.ex, tvm.cpu())
        for _ in range(CALLS):
            case.check(vm)
        return CALLS

    start = time.monotonic()
    assert sum(_in_threads(calls, THREADS)) == THREADS * CALLS
    assert time.monotonic() - start < TIMEOUT_MS / 1000  # not one call waited to the bound


def test_threads_call_two_executables_at_once(cases):
    def calls(i):
        vms = [relax.VirtualMachine(case.ex, tvm.cpu()) for case in cases]
        for k in range(CALLS):
            j = (i + k) % len(cases)
            cases[j].check(vms[j])
        return CALLS

    assert sum(_in_threads(calls, 2 * len(cases))) == 2 * len(cases) * CALLS


def test_first_call_sizes_a_fresh_threads_pool(cases):
    """No set_num_threads anywhere: the call itself gives the thread's pool NUM_VEU workers."""
    case = cases[0]

    def call(_):
        vm = relax.VirtualMachine(case.ex, tvm.cpu())
        case.check(vm)
        return int(tvm.get_global_func("runtime.NumThreads")())

    assert min(_in_threads(call, 1)) >= NUM_VEU


def test_call_keeps_a_larger_count_and_restores_a_lowered_one(cases):
    case = cases[0]
    count = tvm.get_global_func("runtime.NumThreads")

    def calls(_):
        vm = relax.VirtualMachine(case.ex, tvm.cpu())
        tvm_rtask.runtime.set_num_threads(NUM_VEU + 1)
        case.check(vm)
        kept = int(count())
        tvm_rtask.runtime.set_num_threads(1)  # lowered: the next call raises it again
        case.check(vm)
        return kept, int(count())

    assert _in_threads(calls, 1)[0] == (NUM_VEU + 1, NUM_VEU)


def test_pool_created_too_small_fails_at_once_naming_the_fix(cases):
    case = cases[0]

    def call(_):
        # this thread's pool is created with one worker (as by earlier TVM work with
        # TVM_NUM_THREADS=1) and cannot grow
        tvm.get_global_func("runtime.config_threadpool")(-3, 1, ["0"])
        vm = relax.VirtualMachine(case.ex, tvm.cpu())
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            case.check(vm)
        return time.monotonic() - start, str(info.value)

    elapsed, message = _in_threads(call, 1)[0]
    assert elapsed < 1.0, "the call waited for a barrier instead of failing at once"
    assert "cannot grow" in message
    assert f"set_num_threads({NUM_VEU})" in message and "TVM_NUM_THREADS" in message
    assert "barrier timed out" not in message


_CHILD = textwrap.dedent(
    """
    import sys, threading
    import numpy as np
    import tvm
    from tvm import relax

    ex = tvm.runtime.load_module(sys.argv[1])
    data = np.load(sys.argv[2])
    inputs = [data[f"arg{i}"] for i in range(len(data.files) - 1)]
    expected = data["expected"]
    bad = []

    def calls():
        vm = relax.VirtualMachine(ex, tvm.cpu())
        for _ in range(20):
            out = vm["main"](*(tvm.runtime.tensor(x) for x in inputs)).numpy()
            if not np.allclose(out, expected, rtol=1e-4, atol=1e-4):
                bad.append(float(np.abs(out - expected).max()))

    workers = [threading.Thread(target=calls) for _ in range(3)]
    [w.start() for w in workers]
    [w.join() for w in workers]
    assert "tvm_rtask" not in sys.modules, "the child must not import tvm_rtask"
    print("RESULT", len(bad))
    """
)


def test_exported_library_serves_threads_without_tvm_rtask(cases, tmp_path):
    """The exported library sizes each caller's pool itself: no Python of tvm-rtask runs."""
    case = cases[0]
    so_path = export_library(case.ex, tmp_path / "model.so")
    data = tmp_path / "data.npz"
    arrays = {f"arg{i}": x for i, x in enumerate(case.inputs)}
    np.savez(data, expected=case.expected, **arrays)
    env = {k: v for k, v in os.environ.items() if k not in (native.ENV_VAR, "TVM_NUM_THREADS")}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(so_path), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT 0" in proc.stdout, proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------
# CUDA: two VMs of one executable at once (needs a GPU)
# --------------------------------------------------------------------------------------

CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}


def test_cuda_sync_words_are_a_host_constant_of_each_call():
    """No GPU needed. The persistent kernels' sync words reach them as a Relax constant held
    on the host (one per rProgram), never as module state: ``VirtualMachine.__init__``
    copies every host constant to the device, so each VM owns its copy (TVM's
    ``ConvertTensorToDevice`` in ``vm.cc``) and keeps it across its calls and CUDA-graph
    replays, as the epoch scheme needs."""
    import tvm_rtask.relax_passes as passes

    target = passes.as_target(CUDA_TARGET)
    main = tvm_rtask.rtask_pipeline(target, num_veu=4)(SharedKernels)["main"]
    calls = []

    def visit(expr):
        if isinstance(expr, relax.Call) and len(expr.args) >= 2:
            callee = expr.args[0]
            if isinstance(callee, tvm.ir.GlobalVar) and callee.name_hint.startswith("rprogram_"):
                calls.append(expr)

    relax.analysis.post_order_visit(main, visit)
    assert calls
    words = [call.args[1].fields[-1] for call in calls]
    for word in words:
        assert isinstance(word, tvm.ir.expr.GenericConst), type(word)
        tensor = word.value
        assert tensor.device.dlpack_device_type() == tvm.cpu().dlpack_device_type()
        assert tensor.numpy().dtype == np.int32 and not tensor.numpy().any()


@pytest.mark.gpu
@pytest.mark.parametrize("streams", ["default", "own"])
def test_two_cuda_vms_of_one_executable_at_once(streams):
    """Two threads, each with its own VM of one CUDA executable, on the default stream
    (kernels queue one after the other) or on a stream of their own (kernels may overlap
    on the device): every output matches TVM's default CUDA build."""
    import tvm_ffi

    from tvm_rtask.testing.onnx_light import load_light_model, random_inputs

    dev = tvm.cuda(0)
    model = load_light_model("squeezenet")
    inputs = list(random_inputs(model).values())
    mod = tvm_rtask.frontend.load(model)
    reference = relax.VirtualMachine(tvm.compile(mod, as_target(CUDA_TARGET)), dev)
    expected = reference["main"](*(tvm.runtime.tensor(x, dev) for x in inputs))
    expected = expected.numpy() if hasattr(expected, "numpy") else expected[0].numpy()
    assert np.abs(expected).max() > 1e-3
    ex = tvm_rtask.compile(mod, CUDA_TARGET, spin_timeout_ms=5000)

    def calls(_):
        vm = relax.VirtualMachine(ex, dev)
        stream = dev.create_raw_stream() if streams == "own" else 0
        try:
            for _ in range(20):
                with tvm_ffi.use_raw_stream(dev, stream):
                    out = vm["main"](*(tvm.runtime.tensor(x, dev) for x in inputs))
                dev.sync(stream)
                out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
                np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-3)
        finally:
            if stream:
                dev.free_raw_stream(stream)
        return 20

    assert sum(_in_threads(calls, 2, timeout=600)) == 40
