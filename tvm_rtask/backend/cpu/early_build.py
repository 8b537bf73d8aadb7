"""Build the body functions the plan will most likely call while it is still being made.

Planning and lowering run in one thread (ResNet-18: about 0.5 s of a 2.5 s compile on two
cores) while the other cores wait for the build. As soon as an operator's rKernel variants
are made, a forked process is told its name; it makes the same variants in its own copy of
the module (the rules are deterministic), takes the body function as the wavefront plans
call it almost always (the variant of one rTask per vEU, vEU ``v`` running rTask ``v``:
every call passes ``(v, 1, 1)``), specialises it as the build will
(:func:`parallel_build.specialise`) and builds it into an object file named after its code.
The build then takes every body whose code came out as predicted (the name says so: it is
hashed from the code) and builds only the others; a prediction the plan did not follow
costs only that process's time. Sending the bodies instead (TVM's JSON) cost this process
6 ms a body, more than the process saved.

The process builds in the PassContext the compile ran in, and stops when the build claims
what it made: the bodies it has not started go back to the build. Nothing waits on it
without a deadline, and a body it did not deliver is built by the build as any other. A job
that fails in the process leaves its reason in ``<i>.err``, which the claim notes as a
fallback (``tvm_rtask.fallbacks``): the process itself has no one to tell.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field

import tvm

from ...fallbacks import BUILT_LATE, note_fallback
from ...tir.rules import one_line
from .dispatch import KernelCall, body_function
from .parallel_build import build_object, side_module, specialise, symbol_of

__all__ = ["EarlyBuilds", "early_builds", "predicted_ranges"]

# a job index in the queue: 4 bytes, read whole (a pipe's reads of at most PIPE_BUF bytes
# are atomic), so this process and the builder never take one job both
_INDEX_BYTES = 4


def predicted_ranges(func: tvm.tirx.PrimFunc, num_rtasks: int) -> dict[int, tuple[int, int]]:
    """The ``(start, step, count)`` arguments' ranges of a body whose ``num_rtasks`` rTasks
    run one per vEU: start ``0..num_rtasks-1``, step and count 1 (as the build finds them in
    a wavefront plan's calls)."""
    first = len(func.params) - 3
    return {first: (0, num_rtasks - 1), first + 1: (1, 1), first + 2: (1, 1)}


def _context_key(context: tvm.transform.PassContext) -> str:
    """What of a PassContext changes the code a build makes (its instruments do not)."""
    return json.dumps(
        {
            "opt_level": int(context.opt_level),
            "required": sorted(str(p) for p in context.required_pass),
            "disabled": sorted(str(p) for p in context.disabled_pass),
            "config": {str(k): str(v) for k, v in context.config.items()},
        },
        sort_keys=True,
    )


def _without_instruments(context: tvm.transform.PassContext) -> tvm.transform.PassContext:
    """``context`` less its instruments (a progress log's, a user's timing): the builder's
    passes are not this process's."""
    return tvm.transform.PassContext(
        opt_level=context.opt_level,
        required_pass=list(context.required_pass),
        disabled_pass=list(context.disabled_pass),
        config=dict(context.config.items()),
    )


@dataclass
class _Builder:
    """The forked process and its queue: job ``i`` is ``<directory>/<i>.job`` (an operator's
    name); its body's object ``<directory>/<symbol>.o``, written whole or not at all."""

    pid: int
    feed: int
    queue: int
    directory: str
    context: str
    names: list[str] = field(default_factory=list)
    noted: set[int] = field(default_factory=set)  # the failed jobs already noted


@dataclass
class Claim:
    """What the build takes from the early builds: objects made (``ready``), bodies the
    builder is making (``coming``: :meth:`finish` waits for them)."""

    ready: dict[str, str]
    coming: set[str]
    builder: _Builder | None = None
    own: bool = False  # the builder built in this build's PassContext: its failures count

    def finish(self, deadline: float) -> dict[str, str]:
        """``ready`` and the objects of ``coming`` the builder delivered by ``deadline``; the
        builder is stopped then (or at once when nothing is coming: a body it builds that
        the plan did not call is not waited for)."""
        found = dict(self.ready)
        builder = self.builder
        if builder is None:
            return found
        waiting = set(self.coming)
        while waiting and time.monotonic() < deadline:
            waiting = {s for s in waiting if not os.path.exists(_object_path(builder.directory, s))}
            if waiting and os.waitpid(builder.pid, os.WNOHANG)[0]:
                builder.pid = 0  # it ended: what it did not deliver, it never will
                break
            if waiting:
                time.sleep(0.005)
        _stop(builder)
        if self.own:  # the jobs that failed since the claim
            _note_failures(builder, range(len(builder.names)))
        for symbol in self.coming:
            path = _object_path(builder.directory, symbol)
            if os.path.exists(path):
                found[symbol] = path
        return found

    def close(self) -> None:
        """Stop the builder if it still runs, and remove its files."""
        builder = self.builder
        if builder is None:
            return
        _stop(builder)
        shutil.rmtree(builder.directory, ignore_errors=True)


def _stop(builder: _Builder) -> None:
    """Kill the builder unless it was reaped already, and reap it."""
    if builder.pid:
        os.kill(builder.pid, signal.SIGKILL)
        os.waitpid(builder.pid, 0)
        builder.pid = 0


def _object_path(directory: str, symbol: str) -> str:
    return os.path.join(directory, f"{symbol}.o")


def _note_failures(builder: _Builder, indices) -> None:
    """Note each of the jobs ``indices`` that failed in the builder (its ``<i>.err``), once:
    the build makes that operator's body itself."""
    for index in indices:
        if index in builder.noted:
            continue
        try:
            with open(os.path.join(builder.directory, f"{index}.err"), encoding="utf-8") as f:
                reason = f.read()
        except FileNotFoundError:  # built, nothing to build, or not done
            continue
        builder.noted.add(index)
        note_fallback(
            BUILT_LATE, builder.names[index], f"its early build failed ({reason}): built later"
        )


def _serve(queue: int, directory: str, predict, target) -> None:
    """The builder: jobs from ``queue`` until it is closed and empty. Job ``i`` names an
    operator (``<i>.job``); its body's symbol goes to ``<i>.sym`` before the build (empty
    when there is nothing to build)."""
    with _without_instruments(tvm.transform.PassContext.current()):
        while len(data := os.read(queue, _INDEX_BYTES)) == _INDEX_BYTES:
            job = os.path.join(directory, str(int.from_bytes(data, "little")))
            try:
                _build_job(job, directory, predict, target)
            except Exception as error:  # noqa: BLE001 - any failure: the build makes the body
                _write(job + ".err", one_line(error))  # the claim notes why (a fallback)
                _write(job + ".sym", "")


def _build_job(job: str, directory: str, predict, target) -> None:
    with open(job + ".job", encoding="utf-8") as f:
        predicted = predict(f.read())
    if predicted is None:
        _write(job + ".sym", "")  # nothing to build: done
        return
    func, num_rtasks = predicted
    body = body_function(KernelCall(func, []))
    special = specialise(body, predicted_ranges(body, num_rtasks))
    symbol = symbol_of(special, target)
    _write(job + ".sym", symbol)
    build_object(side_module({symbol: special}), target, _object_path(directory, symbol))


def _write(path: str, text: str) -> None:
    """``text`` into ``path``, whole or not at all."""
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".part", path)


class EarlyBuilds:
    """The process's early builds: one builder at a time, started by the first operator
    submitted after the last claim."""

    def __init__(self) -> None:
        self._builder: _Builder | None = None
        self._in_builder = False
        self._lock = threading.Lock()  # compiles in several threads share the builder

    def submit(self, name: str, predict, target: tvm.target.Target) -> None:
        """Build the body of operator ``name`` as predicted: ``predict(name)`` gives the
        rKernel PrimFunc and its rTask count (``None``: nothing to build). The builder calls
        it in its own copy of this process, so it must be deterministic."""
        if self._in_builder:
            return
        with self._lock:
            self._submit(name, predict, target)

    def _submit(self, name: str, predict, target: tvm.target.Target) -> None:
        context = _context_key(tvm.transform.PassContext.current())
        builder = self._builder
        if builder is not None and builder.context != context:
            return  # another compile's context: its code would not be this one's
        if builder is None:
            builder = self._start(context, predict, target)
            if builder is None:
                return
        index = len(builder.names)
        _write(os.path.join(builder.directory, f"{index}.job"), name)
        builder.names.append(name)
        os.write(builder.feed, index.to_bytes(_INDEX_BYTES, "little"))

    def _start(self, context: str, predict, target) -> _Builder | None:
        if not hasattr(os, "fork"):
            return None
        directory = tempfile.mkdtemp(prefix="tvm_rtask_early_")
        queue, feed = os.pipe()
        # the objects alive now out of the collector's walks until the claim: a walk writes
        # to every object, and each page written is copied while the builder shares it
        gc.freeze()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns that a fork of a threaded process may deadlock in the
                # child: the builder only builds, and the build kills it at a deadline
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:  # no process to be had: the build builds everything
            gc.unfreeze()
            os.close(queue)
            os.close(feed)
            shutil.rmtree(directory, ignore_errors=True)
            return None
        if pid == 0:  # the builder: leave without running the parent's exit handlers
            code = 1
            try:
                self._in_builder = True
                os.close(feed)
                _serve(queue, directory, predict, target)
                code = 0
            finally:
                os._exit(code)
        # this process keeps the reading end: the claim takes back the jobs not started
        self._builder = _Builder(pid, feed, queue, directory, context)
        return self._builder

    def running_pid(self) -> int | None:
        """The builder's process id while one runs."""
        return self._builder.pid if self._builder is not None else None

    def claim(self, symbols: set[str]) -> Claim:
        """Stop the builder and take what it made or is making of ``symbols``; the bodies it
        had not started are left to the build (as are all, when the build runs in another
        PassContext than the one the builder built in, and one whose symbol it had not
        found yet)."""
        with self._lock:
            builder, self._builder = self._builder, None
        if builder is None:
            return Claim({}, set())
        gc.unfreeze()
        os.close(builder.feed)  # no more jobs: the builder stops at the end of the queue
        not_started = set()
        while len(data := os.read(builder.queue, _INDEX_BYTES)) == _INDEX_BYTES:
            not_started.add(int.from_bytes(data, "little"))
        os.close(builder.queue)
        ready, coming = {}, set()
        own = builder.context == _context_key(tvm.transform.PassContext.current())
        if own:
            _note_failures(builder, sorted(set(range(len(builder.names))) - not_started))
            for index in set(range(len(builder.names))) - not_started:
                try:
                    with open(os.path.join(builder.directory, f"{index}.sym")) as f:
                        symbol = f.read()
                except FileNotFoundError:  # not found yet, or nothing to build
                    continue
                if not symbol or symbol not in symbols:
                    continue
                path = _object_path(builder.directory, symbol)
                if os.path.exists(path):
                    ready[symbol] = path
                else:
                    coming.add(symbol)
        return Claim(ready, coming, builder, own)


_SHARED = EarlyBuilds()


def early_builds() -> EarlyBuilds:
    """The process's :class:`EarlyBuilds`."""
    return _SHARED


@atexit.register
def _stop_at_exit() -> None:
    _SHARED.claim(set()).close()
