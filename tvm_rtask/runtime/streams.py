"""The host's stream calls of a multi-stream plan (policy ``opara_streams``) and the CUDA
graph that captures them.

``main`` of such a build calls ``tvm_rtask.streams.fork/enter/record/join``
(``relax_passes/launch_on_streams``, protocol in ``core/streams``); they are registered here
when ``tvm_rtask`` is imported in a process that has TVM. Each thread keeps its own streams
and events, made on first use and kept for the next calls:

* on the CPU (device type 1) the calls do nothing: one thread issues the kernels in order;
* on CUDA they are CUDA runtime calls (``libcudart``, the one TVM's CUDA runtime loaded,
  through ctypes): ``enter`` sets the FFI environment's stream (``TVMFFIEnvGetStream`` is
  where TVM's CUDA modules launch) after ``cudaStreamWaitEvent`` on the events it is given.

:class:`StreamGraph` captures one call into a CUDA graph, Opara's own way of removing the
launches' host time: the forked streams join the capture through the fork's event and leave
it through the join's. :func:`recording` replaces the calls by a log, for the tests.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import tvm
import tvm_ffi

DEVICE_CPU, DEVICE_CUDA = 1, 2
_NON_BLOCKING = 1  # cudaStreamNonBlocking
_DISABLE_TIMING = 2  # cudaEventDisableTiming
_CAPTURE_RELAXED = 2  # cudaStreamCaptureModeRelaxed: allocations may happen in the capture


class CudaRuntime:
    """The few CUDA runtime functions the stream calls need, through ctypes."""

    def __init__(self, path: str | None = None) -> None:
        path = path or _loaded_cudart()
        try:
            self.lib = ctypes.CDLL(path or "libcudart.so")
        except OSError as err:
            raise RuntimeError(f"tvm_rtask streams: no CUDA runtime library ({err})") from None

    def _call(self, name: str, *args) -> None:
        code = getattr(self.lib, name)(*args)
        if code:
            text = self.lib.cudaGetErrorString
            text.restype = ctypes.c_char_p
            raise RuntimeError(f"tvm_rtask streams: {name} failed: {text(code).decode()}")

    def new_stream(self) -> int:
        handle = ctypes.c_void_p()
        self._call("cudaStreamCreateWithFlags", ctypes.byref(handle), _NON_BLOCKING)
        return handle.value or 0

    def new_event(self) -> int:
        handle = ctypes.c_void_p()
        self._call("cudaEventCreateWithFlags", ctypes.byref(handle), _DISABLE_TIMING)
        return handle.value or 0

    def record(self, event: int, stream: int) -> None:
        self._call("cudaEventRecord", ctypes.c_void_p(event), ctypes.c_void_p(stream))

    def wait(self, stream: int, event: int) -> None:
        self._call("cudaStreamWaitEvent", ctypes.c_void_p(stream), ctypes.c_void_p(event), 0)

    def device(self) -> int:
        index = ctypes.c_int()
        self._call("cudaGetDevice", ctypes.byref(index))
        return index.value

    def synchronize(self, stream: int) -> None:
        self._call("cudaStreamSynchronize", ctypes.c_void_p(stream))

    def begin_capture(self, stream: int) -> None:
        self._call("cudaStreamBeginCapture", ctypes.c_void_p(stream), _CAPTURE_RELAXED)

    def end_capture(self, stream: int) -> int:
        graph = ctypes.c_void_p()
        self._call("cudaStreamEndCapture", ctypes.c_void_p(stream), ctypes.byref(graph))
        return graph.value or 0

    def instantiate(self, graph: int) -> int:
        # CUDA 12 and later: cudaGraphInstantiate(cudaGraphExec_t*, cudaGraph_t, flags)
        executable = ctypes.c_void_p()
        self._call(
            "cudaGraphInstantiate", ctypes.byref(executable), ctypes.c_void_p(graph),
            ctypes.c_ulonglong(0),
        )  # fmt: skip
        return executable.value or 0

    def launch(self, executable: int, stream: int) -> None:
        self._call("cudaGraphLaunch", ctypes.c_void_p(executable), ctypes.c_void_p(stream))

    def destroy_graph(self, graph: int, executable: int) -> None:
        self._call("cudaGraphExecDestroy", ctypes.c_void_p(executable))
        self._call("cudaGraphDestroy", ctypes.c_void_p(graph))


def _loaded_cudart() -> str | None:
    """The path of the libcudart TVM's CUDA runtime loaded into this process, if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "/libcudart.so" in path:
            return path
    return None


_CUDA: CudaRuntime | None = None


def cuda_runtime() -> CudaRuntime:
    global _CUDA
    if _CUDA is None:
        _CUDA = CudaRuntime()
    return _CUDA


class _Streams(threading.local):
    """One thread's streams (index 0: the origin of the current call) and events."""

    def __init__(self) -> None:
        self.device_type = DEVICE_CPU
        self.device_id = 0
        self.side: list[int] = []  # streams 1..: made once, kept
        self.events: dict[int, int] = {}
        self.origin = 0
        self.forked = 1  # streams of the call in progress
        self.log: list[tuple] | None = None  # recording(): the calls, nothing run

    def stream(self, index: int) -> int:
        return self.origin if index == 0 else self.side[index - 1]

    def event(self, index: int) -> int:
        if index not in self.events:
            self.events[index] = cuda_runtime().new_event()
        return self.events[index]


_STATE = _Streams()


def _set_env_stream(stream: int) -> None:
    tvm_ffi.core._env_set_current_stream(DEVICE_CUDA, _STATE.device_id, stream)


@tvm.register_global_func("tvm_rtask.streams.fork", override=True)
def fork(device_type: int, streams: int) -> None:
    """Start a call on ``streams`` streams; the others wait for the origin's work so far."""
    state = _STATE
    state.device_type = int(device_type)
    if state.log is not None:
        state.log.append(("fork", int(streams)))
        return
    if state.device_type != DEVICE_CUDA:
        return
    cuda = cuda_runtime()
    state.device_id = cuda.device()
    state.origin = tvm_ffi.core._env_get_current_stream(DEVICE_CUDA, state.device_id) or 0
    while len(state.side) < streams - 1:
        state.side.append(cuda.new_stream())
    forked = state.event(-1)
    cuda.record(forked, state.origin)
    for s in range(1, streams):
        cuda.wait(state.stream(s), forked)
    state.forked = streams


@tvm.register_global_func("tvm_rtask.streams.enter", override=True)
def enter(stream: int, *events: int) -> None:
    """The next launches go to ``stream``, after the events ``events``."""
    state = _STATE
    if state.log is not None:
        state.log.append(("enter", int(stream), *map(int, events)))
        return
    if state.device_type != DEVICE_CUDA:
        return
    cuda = cuda_runtime()
    target = state.stream(int(stream))
    for e in events:
        cuda.wait(target, state.event(int(e)))
    _set_env_stream(target)


@tvm.register_global_func("tvm_rtask.streams.record", override=True)
def record(event: int) -> None:
    """Record ``event`` on the current stream, after the launch just issued."""
    state = _STATE
    if state.log is not None:
        state.log.append(("record", int(event)))
        return
    if state.device_type != DEVICE_CUDA:
        return
    current = tvm_ffi.core._env_get_current_stream(DEVICE_CUDA, state.device_id) or 0
    cuda_runtime().record(state.event(int(event)), current)


@tvm.register_global_func("tvm_rtask.streams.join", override=True)
def join(*tensors) -> None:
    """The origin waits for every stream and is current again (``tensors`` only stay alive
    to here)."""
    del tensors
    state = _STATE
    if state.log is not None:
        state.log.append(("join",))
        return
    if state.device_type != DEVICE_CUDA:
        return
    cuda = cuda_runtime()
    for s in range(1, state.forked):
        done = state.event(-1 - s)
        cuda.record(done, state.stream(s))
        cuda.wait(state.origin, done)
    _set_env_stream(state.origin)


@contextmanager
def recording() -> Iterator[list[tuple]]:
    """The stream calls made inside the block, as tuples (``("enter", stream, *events)``,
    ...), none of them run: for checking a build's calls without a GPU."""
    log: list[tuple] = []
    _STATE.log = log
    try:
        yield log
    finally:
        _STATE.log = None


class StreamGraph:
    """One call of ``vm[func]`` on ``args`` (device tensors) captured into a CUDA graph and
    replayed by :meth:`__call__` on the same tensors: write new inputs into ``args`` first.

    The capture runs the call once before (allocations, constants), then once under
    ``cudaStreamBeginCapture`` on a stream of its own; the outputs of that call are the
    graph's and are returned by every replay. While the graph lives the VM must not run
    ``func`` on this device otherwise: the storage the captured call freed back to TVM's
    memory pool is the graph's.
    """

    def __init__(self, vm, args: list, func: str = "main") -> None:
        device = args[0].device if args else None
        if device is None or device.dlpack_device_type() != DEVICE_CUDA:
            raise RuntimeError("StreamGraph: a CUDA graph needs the arguments on a CUDA device")
        self.cuda = cuda_runtime()
        self.device = device
        vm[func](*args)  # warm: allocations and constants happen outside the capture
        device.sync()
        self.stream = self.cuda.new_stream()
        with tvm_ffi.use_raw_stream(device, self.stream):
            self.cuda.begin_capture(self.stream)
            try:
                self.outputs = vm[func](*args)
            finally:
                self.graph = self.cuda.end_capture(self.stream)
        self.executable = self.cuda.instantiate(self.graph)

    def __call__(self):
        self.cuda.launch(self.executable, self.stream)
        return self.outputs

    def synchronize(self) -> None:
        self.cuda.synchronize(self.stream)

    def __del__(self) -> None:
        if getattr(self, "executable", None):
            try:
                self.cuda.destroy_graph(self.graph, self.executable)
            except RuntimeError:
                pass
