"""The host side of the CUDA persistent kernels: the barrier timeout's status words turned
into an exception, and the timeline's records taken off the device.

Every CUDA rProgram gets a constant int32 array of sync words (dependency counters or step
counters, a finish counter, the epoch, then status words). A wait that times out sets
``status[0]`` (1: a step-array wait, 2: a dependency-counter wait, 3: the vEU claim by SM)
and records who waited for what; the kernel drains instead of hanging. ``main`` ends with a call to
``tvm_rtask.check_status`` on those arrays, registered here, which raises with the details.
Importing ``tvm_rtask`` (or this module) in the process that runs the executable registers it.

A traced build (option ``trace``) ends ``main`` with ``tvm_rtask.collect_cuda_trace`` on the
rPrograms' record buffers: while a recording is on (``runtime/trace.py``: :func:`start_trace`,
:func:`stop_trace`) it copies them to the host, else it does nothing.
"""

from __future__ import annotations

import numpy as np
import tvm

STATUS_WORDS = 8


# The sync words are a constant each VirtualMachine copies to the device when it is made
# (docs/cuda-kernels.md, "Concurrent callers"): a fresh VM starts from clean words.
_AFTER = "Make a new relax.VirtualMachine of the executable before calling it again."


@tvm.register_global_func("tvm_rtask.check_status", override=True)
def check_status(*sync_arrays) -> None:
    """Raise if any rProgram's status word reports a barrier timeout."""
    for k, array in enumerate(sync_arrays):
        words = array.numpy()
        num_veu = len(words) - 1 - STATUS_WORDS  # the status words are always the last
        status = words[num_veu + 1 :]
        if status[0] == 2:
            raise RuntimeError(
                f"tvm_rtask: a dependency-counter wait timed out in persistent CUDA kernel {k}: "
                f"vEU {status[1]} waited for operator {status[2]} of the rProgram (its index in "
                f"the task table) to finish its {status[3]} rTasks ({status[4]} finished). "
                "The plan waits for a task that never runs, or not all vEUs were co-resident; "
                "raise spin_timeout_ms if a task is just slow. " + _AFTER
            )
        if status[0] == 3:
            raise RuntimeError(
                f"tvm_rtask: the vEU claim by SM timed out in persistent CUDA kernel {k}: block "
                f"{status[1]} found no vEU left on its SM and waited for all {status[2]} blocks "
                f"to start ({status[4]} started). Not all blocks were co-resident (another "
                "kernel on the device?); cuda_veu_placement='block' takes no such wait. " + _AFTER
            )
        if status[0] != 0:
            raise RuntimeError(
                f"tvm_rtask: a step-array barrier timed out in persistent CUDA kernel {k}: "
                f"vEU {status[1]} waited for vEU {status[2]} to reach step {status[3]} "
                f"(it reached {status[4]}). The plan waits for a task that never runs, or "
                "not all vEUs were co-resident; raise spin_timeout_ms if a task is just slow. "
                + _AFTER
            )


def sync_words_ok(array) -> bool:
    """True when the status words of one sync array are clean (used by tests)."""
    words = np.asarray(array)
    return int(words[len(words) - STATUS_WORDS]) == 0


# the record buffers of the traced calls made while a recording is on; None: off
_trace_records: list[np.ndarray] | None = None


@tvm.register_global_func("tvm_rtask.collect_cuda_trace", override=True)
def collect_cuda_trace(*buffers) -> None:
    """Keep a copy of each traced rProgram's records (warm-up calls: nothing)."""
    if _trace_records is not None:
        _trace_records.extend(buffer.numpy() for buffer in buffers)


def start_trace() -> None:
    global _trace_records
    _trace_records = []


def stop_trace() -> list[np.ndarray]:
    """The buffers kept since :func:`start_trace`; recording stops."""
    global _trace_records
    kept, _trace_records = _trace_records or [], None
    return kept
