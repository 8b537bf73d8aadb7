"""The vEU script: what each vEU of an rProgram runs, waits for and signals.

Target-neutral data (pure Python): each backend only renders it, the CPU dispatcher as
calls into the native step-array primitives, the CUDA dispatcher as rows of a task table.
"""

from __future__ import annotations

from dataclasses import dataclass

from .rprogram import Barrier, RProgram, RTask


@dataclass(frozen=True)
class Run:
    """Run rTasks ``start, start + step, ...`` (``count`` of them) of one operator's rKernel.

    A run is emitted as one loop, so a vEU that runs every ``num_veu``-th rTask of an
    operator (the usual wavefront placement) costs one copy of the kernel, not one per rTask.
    """

    op: str
    start: int
    count: int = 1
    step: int = 1

    def ids(self) -> range:
        return range(self.start, self.start + self.count * self.step, self.step)


@dataclass(frozen=True)
class Wait:
    """Wait until ``step[veu] >= count`` for each pair."""

    pairs: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Signal:
    """Publish ``step[own vEU] = count`` (the number of rTasks this vEU has finished)."""

    count: int


def _runs(tasks: list, cut_after: set[int], first_order: int = 0) -> list[tuple[Run, int]]:
    """Group consecutive rTasks of one operator with evenly spaced ids into runs.

    Returns ``(run, order of its last task)`` pairs; a run ends at every order in
    ``cut_after`` so that a signal can follow that task.
    """
    out: list[tuple[Run, int]] = []
    for offset, task in enumerate(tasks):
        order = first_order + offset
        if out:
            last, last_order = out[-1]
            step = task.rtask_id - last.start if last.count == 1 else last.step
            follows = step > 0 and task.rtask_id == last.start + last.count * step
            if last.op == task.op and follows and last_order not in cut_after:
                out[-1] = (Run(last.op, last.start, last.count + 1, step), order)
                continue
        out.append((Run(task.op, task.rtask_id), order))
    return out


def scripts_from_program(program: RProgram) -> list[list[Run | Wait | Signal]]:
    """Per-vEU scripts for fine barriers: runs, waits before them, signals after waited tasks."""
    waited: list[set[int]] = [set() for _ in range(program.num_veu)]
    for entries in program.entries:
        for item in entries:
            if isinstance(item, Barrier):
                for u, order in item.waits:
                    waited[u].add(order)
    return [_script(entries, waited[veu]) for veu, entries in enumerate(program.entries)]


def _script(entries: list, waited: set[int]) -> list[Run | Wait | Signal]:
    """One vEU's script: its tasks as runs, a Wait per barrier, a Signal after waited tasks."""
    script: list[Run | Wait | Signal] = []
    segments: list[list] = [[]]
    for item in entries:
        if isinstance(item, Barrier):
            segments.append(item)
            segments.append([])
        else:
            segments[-1].append(item)
    order = 0
    for segment in segments:
        if isinstance(segment, Barrier):
            script.append(Wait(tuple((u, j + 1) for u, j in segment.waits)))
            continue
        for run, last in _runs(segment, waited, order):
            script.append(run)
            if last in waited:
                script.append(Signal(last + 1))
        order += len(segment)
    return script


def waves_from_program(program: RProgram) -> list[list[list[Run]]]:
    """Per-wave, per-vEU runs for global barriers (one parallel loop per wave)."""
    wave_ids = sorted(
        {t.wave for entries in program.entries for t in entries if isinstance(t, RTask)}
    )
    position = {w: i for i, w in enumerate(wave_ids)}
    waves: list[list[list]] = [[[] for _ in range(program.num_veu)] for _ in wave_ids]
    for veu, entries in enumerate(program.entries):
        last = -1
        for item in entries:
            if not isinstance(item, RTask):
                continue
            if item.wave < last:
                raise ValueError(
                    f"vEU {veu} runs {item.op} (wave {item.wave}) after a task of wave {last}: "
                    "global barriers need each vEU's tasks in wave order"
                )
            last = item.wave
            waves[position[item.wave]][veu].append(item)
    return [[[run for run, _ in _runs(tasks, set())] for tasks in wave] for wave in waves]
