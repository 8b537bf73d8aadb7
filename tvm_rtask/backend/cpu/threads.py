"""Size TVM's CPU thread pool: one worker thread per CPU vEU.

What TVM 0.27 does (read in ``src/runtime/thread_pool.cc`` and ``threading_backend.cc``,
shipped in the wheel under ``tvm/src/runtime``, and checked by running code):

- Global functions: ``runtime.config_threadpool(mode, nthreads[, cpus])`` and
  ``runtime.NumThreads()``.  ``mode`` is an AffinityMode: 1 = kBig, -1 = kLittle,
  -2 = kSpecifyOneCorePerThread, -3 = kSpecifyThreadShareAllCore.  ``nthreads`` is the
  number of workers to use (0 = the mode's default).  ``cpus`` is a list of CPU ids *as
  strings*; its length also becomes the calling thread's "max concurrency"
  (``SetMaxConcurrency(len(cpus))``; no list resets it to the default).
- The pool and the max concurrency are **thread-local**: each OS thread that launches
  parallel work has its own pool.  Configure the pool from the thread that will call the
  compiled function (the Relax VM runs on the caller's thread).
- The pool's size (``num_workers_``) is fixed when it is created, at the first use in a
  thread, to the max concurrency of that moment: ``TVM_NUM_THREADS`` / ``OMP_NUM_THREADS``,
  else ``hardware_concurrency() / 2`` on x86 (hyper-threading assumed), i.e. **1 on a 2-core
  x86 machine**.  ``config_threadpool`` can later lower the number of workers used but never
  raise it above that size.  ``runtime.NumThreads()`` itself creates the pool.
- ``TVMBackendParallelLaunch`` runs the lambda serially on the caller when the max
  concurrency is 1; otherwise it launches ``num_task = NumThreads()`` tasks: task 0 on the
  calling thread, tasks 1.. on the pool's workers.
- **Loop extent larger than the pool:** LLVM codegen of a ``T.parallel`` loop does not
  make one task per iteration.  Each task takes one static contiguous chunk of
  ``ceil(extent / num_task)`` iterations (task t runs ``[t*chunk, min((t+1)*chunk, extent))``)
  and runs them one after another on one thread.  Seen with 2 threads and extent 7: 4
  iterations on one thread, 3 on the other; with 3 threads: 3, 3, 1.  A loop with extent
  smaller than the pool leaves tasks with empty chunks.  So iterations that wait for each
  other (vEUs with barriers) must never outnumber the threads: with fewer threads a waiting
  iteration waits for one that runs later on its own thread, and only the bounded wait in
  ``tvm_rtask_cpu_wait`` keeps that from hanging.

**Every thread that calls a compiled function** needs such a pool, not only the thread that
compiled it: the dispatcher calls ``tvm_rtask_cpu_ensure_workers(num_veu)`` (native library,
``src/step_array.c``) before its parallel launch, which does in C what this module does in
Python.  The first call in a thread sizes the thread's pool as :func:`num_threads` would
(TVM's default count, at least ``num_veu``), unless this module already did in that thread
(a flag in the native library, per thread, shared with :func:`set_num_threads`); later calls
read ``runtime.NumThreads()`` and raise the count back to ``num_veu`` if it was lowered.  A
pool created earlier in the thread with fewer workers (TVM work before any tvm-rtask call,
``TVM_NUM_THREADS`` too small) cannot grow: the call then raises at once, naming the fix.

:func:`set_num_threads` therefore passes a CPU list of length ``max(n, #cpus)`` (all CPUs
this process may use, repeated if needed) with mode -3 and ``nthreads = n``.  The first call
in a thread thus creates a pool large enough to go back up to ``#cpus`` later, the max
concurrency is never 1 (no serial shortcut; same effect for n = 1), and no thread is pinned
to fewer CPUs than the process may use.  When ``n`` exceeds the number of CPUs, TVM logs a
warning that it cannot set thread affinity; that is harmless.
"""

from __future__ import annotations

import os
import platform

__all__ = ["num_threads", "set_num_threads"]

_MODE_SHARE_ALL_CORES = -3  # threading::ThreadGroup::kSpecifyThreadShareAllCore

# The CPUs this process may use, read before TVM changes any thread's affinity.
_CPUS: list[int] = (
    sorted(os.sched_getaffinity(0))
    if hasattr(os, "sched_getaffinity")
    else list(range(os.cpu_count() or 1))
)


def _funcs():
    import tvm

    return (
        tvm.get_global_func("runtime.config_threadpool"),
        tvm.get_global_func("runtime.NumThreads"),
    )


def _configured() -> bool:
    """Whether this thread's pool was sized by tvm-rtask (here or by a compiled function)."""
    from ... import native

    return bool(native.load().tvm_rtask_cpu_pool_configured())


def _note_configured() -> None:
    from ... import native

    native.load().tvm_rtask_cpu_note_pool_configured()


def _cpu_list(length: int) -> list[str]:
    return [str(_CPUS[i % len(_CPUS)]) for i in range(length)]


def _tvm_default_threads() -> int:
    """The worker count TVM uses in a thread nobody configured."""
    for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        val = os.environ.get(var)
        if val:
            try:
                return max(int(val), 1)
            except ValueError:
                pass
    n = os.cpu_count() or 1
    if platform.machine() in ("x86_64", "AMD64", "i686"):
        n //= 2
    return max(n, 1)


def set_num_threads(n: int) -> int:
    """Make TVM's CPU parallel launches in the calling thread use ``n`` worker threads
    (the calling thread included), and return ``n``.

    A tvm-rtask CPU function with more vEUs than ``n`` raises the count to its vEU count
    when it runs in this thread (the pool was made large enough for that here).

    Raises
    ------
    ValueError
        ``n < 1``.
    RuntimeError
        The calling thread's pool was created (by earlier TVM parallel work) with fewer
        than ``n`` workers and cannot grow; set ``TVM_NUM_THREADS`` before starting the
        process, or call this function before other parallel TVM work in the thread.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"set_num_threads: need at least one thread, got {n}")
    config, current = _funcs()
    config(_MODE_SHARE_ALL_CORES, n, _cpu_list(max(n, len(_CPUS))))
    got = int(current())
    _note_configured()
    if got != n:
        raise RuntimeError(
            f"tvm-rtask: TVM's thread pool in this thread was created with {got} worker "
            f"thread(s) before set_num_threads({n}) and cannot grow. Set "
            f"TVM_NUM_THREADS={n} in the environment before starting the process, or call "
            "set_num_threads earlier in this thread (before other parallel TVM work)."
        )
    return n


def num_threads() -> int:
    """Number of worker threads TVM's parallel launches use in the calling thread.

    In a thread that nobody configured, this first sizes the pool as
    :func:`set_num_threads` would, for TVM's default count, so that a later
    ``set_num_threads`` can still raise it up to the number of CPUs.
    """
    config, current = _funcs()
    if not _configured():
        n = _tvm_default_threads()
        config(_MODE_SHARE_ALL_CORES, n, _cpu_list(max(n, len(_CPUS))))
        _note_configured()
    return int(current())


def cpu_model_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` knows."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu
