"""Progress of long work: log lines with wall times, and a filter for TVM's known noise.

Compiling a large model takes minutes (planning Inception v1 for CUDA: about 30 s, its LLVM
build on the CPU: tens of seconds). ``tvm_rtask.compile`` / ``plan`` / ``lower`` / ``build``
log each stage to the Python logger ``tvm_rtask`` (import, prepare/fuse, plan, lower, the
rPrograms being built, build), each with its wall time. The logger is silent unless enabled::

    import logging
    logging.basicConfig(level=logging.INFO)   # or: tvm_rtask.progress.enable()

which prints, for example::

    [12:00:01] tvm_rtask INFO: import ...
    [12:00:02] tvm_rtask INFO: import done in 0.41 s
    [12:00:02] tvm_rtask INFO: prepare/fuse ...
    ...

(``python -m tvm_rtask.demo -v`` and ``tvm-rtask -v COMMAND`` show them.) Without ``-v``,
the command line shows :func:`stage_bar`: one tqdm bar over the same stages, on a terminal
only, and only once a compile has run for a few seconds.

:func:`quiet_tvm_warnings` drops two C++ ``LOG(WARNING)`` lines that TVM writes to file
descriptor 2 and that say nothing about the user's model; see ``KNOWN_TVM_WARNINGS``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator

__all__ = [
    "KNOWN_TVM_WARNINGS",
    "enable",
    "importing",
    "log_plan",
    "logger",
    "pass_stages",
    "quiet_tvm_warnings",
    "stage",
    "stage_bar",
]

logger = logging.getLogger("tvm_rtask")

# TVM's own C++ log lines look like "[12:00:01] /path/file.cc:123: Warning: ..."; ours take the
# same clock, then the logger name and level.
LOG_FORMAT = "[%(asctime)s] %(name)s %(levelname)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"


def enable(level: int = logging.INFO, stream=None) -> logging.Handler:
    """Print the ``tvm_rtask`` log lines (to ``stream``, default stderr) in TVM's style.

    The same as ``logging.basicConfig(level=level)`` restricted to the ``tvm_rtask`` logger;
    returns the handler, which ``logger.removeHandler`` takes away again. The logger is
    enabled again if a ``logging.config.dictConfig`` (default ``disable_existing_loggers``)
    switched it off: asking for the log lines wins.
    """
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    logger.disabled = False
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler


@contextlib.contextmanager
def stage(name: str, level: int = logging.INFO) -> Iterator[None]:
    """Log ``"<name> ..."`` on entry and ``"<name> done in X s"`` (wall seconds,
    ``time.perf_counter``) on exit, or ``"<name> failed after X s"`` if the block raises."""
    logger.log(level, "%s ...", name)
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        logger.log(level, "%s failed after %.2f s", name, time.perf_counter() - start)
        raise
    logger.log(level, "%s done in %.2f s", name, time.perf_counter() - start)


# The stages a compile logs, in order (stage_bar counts them)
COMPILE_STAGES = ("import", "prepare/fuse", "plan", "lower", "build")


class _BarHandler(logging.Handler):
    """Advances a tqdm bar by one at each ``"<stage> done in X s"`` record."""

    def __init__(self, bar, stages: tuple[str, ...]) -> None:
        super().__init__(logging.DEBUG)
        self.bar = bar
        self.stages = stages

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        name = message.partition(" ...")[0] if message.endswith(" ...") else None
        if name in self.stages:
            self.bar.set_description(name)
        elif any(message.startswith(f"{s} done in ") for s in self.stages):
            self.bar.update(1)


@contextlib.contextmanager
def stage_bar(stages: tuple[str, ...] = COMPILE_STAGES, delay: float = 3.0) -> Iterator[None]:
    """A tqdm progress bar over ``stages`` (the log's stage names) on stderr, shown only
    when stderr is a terminal, the ``tvm_rtask`` logger prints nothing itself (no ``-v``),
    and the block has run for ``delay`` seconds: a short compile prints nothing."""
    if not sys.stderr.isatty() or logger.handlers:
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=len(stages), unit="stage", delay=delay, file=sys.stderr, leave=False)
    handler = _BarHandler(bar, stages)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level or logging.INFO, logging.INFO))
    logger.propagate, propagate = False, logger.propagate
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        bar.close()


# The rTask passes, by the name they are registered with, and the stage each one is.
PASS_STAGES = {
    "IOSOperatorMerge": "ios_merge",
    "RTaskPrepare": "prepare/fuse",
    "PlanRPrograms": "plan",
    "LowerRPrograms": "lower",
}


def _stage_instrument():
    from tvm.ir.instrument import pass_instrument

    @pass_instrument
    class _Stages:
        """Logs the rTask passes of PASS_STAGES as stages (other passes are ignored)."""

        def __init__(self) -> None:
            # one entry per running pass of PASS_STAGES: (stage, start), or None for a pass
            # inside one of the same stage (RTaskPrepare runs a Sequential of that name)
            self.open: list[tuple[str, float] | None] = []

        def run_before_pass(self, _mod, info) -> None:
            name = PASS_STAGES.get(info.name)
            if name is None:
                return
            if any(entry is not None and entry[0] == name for entry in self.open):
                self.open.append(None)
                return
            logger.log(_level(name), "%s ...", name)
            self.open.append((name, time.perf_counter()))

        def run_after_pass(self, _mod, info) -> None:
            name = PASS_STAGES.get(info.name)
            if name is None or not self.open:
                return
            entry = self.open.pop()
            if entry is not None:
                seconds = time.perf_counter() - entry[1]
                logger.log(_level(name), "%s done in %.2f s", name, seconds)

        def exit_pass_ctx(self) -> None:
            # a pass that raised never reaches run_after_pass
            while self.open:
                entry = self.open.pop()
                if entry is not None:
                    seconds = time.perf_counter() - entry[1]
                    logger.log(_level(entry[0]), "%s failed after %.2f s", entry[0], seconds)

    return _Stages()


def _level(name: str) -> int:
    # IOSOperatorMerge runs in every pipeline but does nothing unless the policy is "ios".
    return logging.DEBUG if name == "ios_merge" else logging.INFO


@contextlib.contextmanager
def pass_stages() -> Iterator[None]:
    """Log the rTask passes (``PASS_STAGES``) that run inside the block as stages.

    Does nothing unless the ``tvm_rtask`` logger is enabled for INFO. It enters a PassContext
    equal to the current one plus a pass instrument; when the current context already has
    instruments (a user's timing, say) it leaves them alone and logs nothing per pass.
    """
    import tvm

    current = tvm.transform.PassContext.current()
    if not logger.isEnabledFor(logging.INFO) or len(current.instruments) > 0:
        yield
        return
    context = tvm.transform.PassContext(
        opt_level=current.opt_level,
        required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass),
        instruments=[_stage_instrument()],
        config=dict(current.config.items()),
    )
    with context:
        yield


def importing(model):
    """:func:`stage` ``"import"`` for ``frontend.load(model)``: INFO for a file or an ONNX or
    torch model, DEBUG for an IRModule, which the import only checks."""
    import tvm

    return stage("import", logging.DEBUG if isinstance(model, tvm.IRModule) else logging.INFO)


def log_plan(plan, what: str = "plan") -> None:
    """One INFO line summarising ``plan``; for ``what="build"`` also one INFO line per
    rProgram (DEBUG otherwise), named as the lowered module names it (``rprogram_<step>``)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    from .core import RProgram

    report = plan.report()
    logger.info(
        "%s: %d operators, %d rTasks in %d rPrograms, %d kernel launches, %d vEUs, policy %s",
        what,
        report["operators"],
        report["rtasks"],
        report["rprograms"],
        report["kernel_launches"],
        plan.vdevice.num_veu,
        plan.policy,
    )
    level = logging.INFO if what == "build" else logging.DEBUG
    for k, step in enumerate(plan.steps):
        if isinstance(step, RProgram):
            logger.log(
                level,
                "%s: rprogram_%d: %d operators, %d rTasks, %d %s",
                what,
                k,
                len(step.ops()),
                step.num_tasks,
                plan.waits_in(step),
                "counter waits" if plan.sync == "counters" else "barriers",
            )


# TVM's C++ LOG(WARNING) lines (written to file descriptor 2, so Python cannot filter them
# with the warnings or logging modules) that say nothing about the user's model.
KNOWN_TVM_WARNINGS = {
    "Fast mode segfaults when there are out-of-bounds indices": (
        "topi.take in its default 'fast' mode (no bounds check) logs this once per take "
        "that LegalizeOps lowers; the ONNX importer turns every Gather into such a take. "
        "It is harmless when the indices are in bounds, as the constant time-step indices "
        "of the zoo's LSTM-TC and Seq2Seq are."
    ),
    "Scope Saving:": (
        "when an executable is saved (export_library), the Relax VM's "
        "VMExecutable::SaveMemoryScopeSection logs every memory scope it writes, one line "
        "each; a debugging print of TVM's, not a problem."
    ),
}


@contextlib.contextmanager
def quiet_tvm_warnings(patterns=tuple(KNOWN_TVM_WARNINGS)) -> Iterator[None]:
    """Drop the lines of file descriptor 2 that contain one of ``patterns`` (by default the
    known TVM warnings) while the block runs; every other line passes through as it comes.

    File descriptor 2 is process-wide: do not enter this in two threads at once.
    """
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to filter
        yield
        return
    with contextlib.suppress(AttributeError, ValueError, OSError):
        sys.stderr.flush()
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                text = line.decode(errors="replace")
                if not any(p in text for p in patterns):
                    os.write(saved, line)

    reader = threading.Thread(target=forward, name="tvm_rtask-stderr-filter", daemon=True)
    reader.start()
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError, ValueError, OSError):
            sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the reader sees EOF
        reader.join()
        os.close(saved)
