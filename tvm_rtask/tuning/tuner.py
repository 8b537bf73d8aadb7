"""``tune``: MetaSchedule over a model's fused operators, one operator at a time.

Each operator is one MetaSchedule task tuned by ``tune_tasks`` with the evolutionary search
and an XGBoost cost model shared by all tasks (it keeps learning across operators). Tuning
operator by operator is what makes the run resumable: every measured candidate is already in
the JSON database, and an operator that finished is entered in the ledger, so a killed run
loses at most the batch being measured (see :mod:`.database`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

from ..errors import OptionError
from ..records.database import Ledger, mean_secs, open_database, valid_records
from .measure import RPCSettings, make_builder, make_runner
from .tasks import TuningTask, extract_tasks, preparation_target, prepared, task_module


@dataclass
class TuneReport:
    """What a run did: trials measured now, operators reused, and per-operator details."""

    trials_run: int = 0
    reused: int = 0
    tuned: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # left for a later run (time budget)
    best_us: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        return f"trials run: {self.trials_run}, reused: {self.reused}"


def tuning_target(target, num_cores: int | None = None):
    """The target MetaSchedule tunes for (the backend's: llvm needs ``num-cores``)."""
    from ..backend import get_backend

    return get_backend(target).tuning_target(num_cores)


def split_budget(trials: int, tasks: list[TuningTask]) -> list[int]:
    """``trials`` shared out evenly (the first operators take the remainder)."""
    if not tasks:
        return []
    base, extra = divmod(trials, len(tasks))
    return [base + (i < extra) for i in range(len(tasks))]


class _Session:
    """MetaSchedule's builder, runner and cost model, made once and only when needed."""

    def __init__(self, target, work_dir: str, rpc: RPCSettings | None, seed: int) -> None:
        self.target = target
        self.work_dir = work_dir
        self.rpc = rpc
        self.seed = seed
        self.cores = int(target.attrs.get("num-cores", 1))  # cores a measurement ran on
        self._parts = None

    def parts(self):
        if self._parts is None:
            from tvm.s_tir.meta_schedule.cost_model import XGBModel

            self._parts = (
                make_builder(max(self.cores, 1)),
                make_runner(self.rpc),
                XGBModel(num_tuning_cores=max(self.cores, 1)),
            )
        return self._parts

    def tune(self, task: TuningTask, index: int, trials: int, per_iter: int, database, watch):
        """Run MetaSchedule on one task; ``watch`` counts trials and enforces the deadline."""
        from tvm.s_tir import meta_schedule as ms

        builder, runner, cost_model = self.parts()
        context = ms.TuneContext(
            mod=task_module(task.func),
            target=self.target,
            space_generator="post-order-apply",
            search_strategy=ms.search_strategy.EvolutionarySearch(
                population_size=population_size(trials)
            ),
            task_name=task.name,
            rand_state=self.seed + index,
            num_threads=max(self.cores, 1),
            logger=_task_logger(self.work_dir, task.name),
        ).clone()
        ms.tune_tasks(
            tasks=[context],
            task_weights=[float(task.calls)],
            work_dir=self.work_dir,
            max_trials_global=trials,
            num_trials_per_iter=min(per_iter, trials),
            builder=builder,
            runner=runner,
            database=database,
            cost_model=cost_model,
            measure_callbacks=[*ms.MeasureCallback.create("default"), watch],
            task_scheduler="round-robin",
        )


def population_size(trials: int) -> int:
    """The evolutionary search's population: MetaSchedule's 512 for real budgets, fewer for
    a handful of trials (each generation of 512 conv schedules costs seconds to evolve)."""
    return max(64, min(512, 16 * trials))


def _task_logger(work_dir: str, name: str):
    """A task's MetaSchedule log, in ``work_dir/logs/<name>.log`` only.

    MetaSchedule's own ``get_loggers_from_work_dir`` re-runs ``logging.config.dictConfig``
    on every call, prints its task tables to stdout, and failed on a second work directory in
    one process (a handler without a name); a plain file logger avoids all three.
    """
    import logging

    path = os.path.abspath(os.path.join(work_dir, "logs", f"{name}.log"))
    logger = logging.getLogger(f"tvm_rtask.tuning.task.{abs(hash(path)):x}")
    if not logger.handlers:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    return logger


def _watch(deadline: float | None, on_trials):
    """A measure callback that counts measured candidates and stops a task at the deadline."""
    import tvm
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @tvm.ir.utils.derived_object
    class Watch(PyMeasureCallback):
        def __init__(self) -> None:
            super().__init__()
            self.trials = 0
            self.stopped = False

        def apply(self, task_scheduler, task_id, _candidates, builder_results, _runner_results):
            self.trials += len(builder_results)
            on_trials(len(builder_results))
            if deadline is not None and time.monotonic() >= deadline:
                self.stopped = True
                task_scheduler.terminate_task(task_id)

    return Watch()


def tune(
    mod,
    target="llvm",
    work_dir: str | os.PathLike = "rtask_tuning",
    trials: int | None = 64,
    seconds: float | None = None,
    *,
    num_trials_per_iter: int = 16,
    rpc: RPCSettings | str | None = None,
    fusion: str | None = None,
    include_injective: bool = False,
    num_cores: int | None = None,
    seed: int = 0,
    progress: bool = True,
    out=None,
) -> TuneReport:
    """Tune the fused operators of ``mod`` (ONNX path or model, or Relax module) into
    ``work_dir``; print ``trials run: N, reused: M`` last.

    ``trials`` is the budget of the whole model, shared evenly among its operators (an
    operator in the ledger is reused, one with records but not in it resumes). ``seconds``
    stops measuring once elapsed (the current batch finishes, unfinished operators resume
    next run). ``rpc`` (``RPCSettings`` or ``"HOST:PORT:KEY"``) measures on the servers of a
    TVM RPC tracker instead of this machine.
    """
    if trials is None and seconds is None:
        raise OptionError("give a tuning budget: trials, seconds, or both")
    if trials is not None and trials < 1:
        raise OptionError(f"trials must be >= 1, not {trials}")
    if num_trials_per_iter < 1:
        raise OptionError(f"num_trials_per_iter must be >= 1, not {num_trials_per_iter}")
    if isinstance(rpc, str):
        rpc = RPCSettings.parse(rpc)
    start = time.monotonic()
    deadline = start + seconds if seconds is not None else None
    work_dir = os.fspath(work_dir)
    target = tuning_target(target, num_cores)
    kind = str(target.kind.name)
    tasks = extract_tasks(prepared(mod, fusion, preparation_target(target)), include_injective)
    ledger = Ledger(work_dir) if os.path.isdir(work_dir) else None
    # Shared over all operators, finished or not, so a resumed run gives each the same budget.
    # A time budget alone still needs a trial count per operator for MetaSchedule.
    shares = split_budget(trials if trials is not None else 1000 * len(tasks), tasks)
    budget_of = {t.key: n for t, n in zip(tasks, shares, strict=True)}
    todo = [t for t in tasks if ledger is None or not ledger.done(t.key, kind)]
    report = TuneReport(reused=len(tasks) - len(todo))
    database = open_database(work_dir)
    ledger = ledger or Ledger(work_dir)
    session = _Session(target, work_dir, rpc, seed)
    bar = _progress(len(tasks), report.reused, progress)
    try:
        for index, task in enumerate(todo):
            budget = budget_of[task.key]
            out_of_time = deadline is not None and time.monotonic() >= deadline
            if budget == 0 or out_of_time:  # fewer trials than operators, or no time left
                report.pending.append(task.name)
                continue
            done = len(valid_records(database, task_module(task.func), budget))
            if done < budget:
                watch = _watch(deadline, lambda n: _add_trials(report, bar, n))
                bar.set_description(task.name)
                session.tune(task, index, budget - done, num_trials_per_iter, database, watch)
                done += watch.trials
                if watch.stopped:
                    report.pending.append(task.name)
                    continue
                report.tuned.append(task.name)
            else:
                report.reused += 1  # all its trials were measured before a kill
            _finish(task, done, database, ledger, kind, report)
            bar.update(1)
    finally:
        bar.close()
    report.seconds = time.monotonic() - start
    print(report.summary(), file=out or sys.stdout, flush=True)
    return report


def _finish(task: TuningTask, trials: int, database, ledger: Ledger, kind: str, report) -> None:
    """Enter a task that used its budget in the ledger, with its best time."""
    best = valid_records(database, task_module(task.func), 1)
    best_us = 1e6 * mean_secs(best[0]) if best else None
    if best_us is not None:
        report.best_us[task.name] = best_us
    ledger.finish(task.key, kind, name=task.name, trials=trials, best_us=best_us)


def _add_trials(report: TuneReport, bar, n: int) -> None:
    report.trials_run += n
    bar.set_postfix(trials=report.trials_run)


def _progress(total: int, done: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="op", disable=not enabled, file=sys.stderr)
