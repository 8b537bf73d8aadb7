"""Dependency counters: an rProgram's synchronisation as one counter per operator.

The step-array script (``script.py``) makes a vEU wait for the step of every vEU that ran a
producer task: one pair per (waiting vEU, producer vEU), 222 K pairs for SqueezeNet on 396
vEUs. With counters, every rTask of an operator ``P`` that another vEU waits for adds one to
``P``'s counter when it finishes (an ``Arrive`` per run of tasks, so one atomic add per run),
and a vEU waits before its first task of ``C`` until the counter of each predecessor of ``C``
reaches ``P``'s task count (a ``CounterWait``). What a vEU waits for grows with the
dependency edges, not with the vEUs that ran the producers.

A vEU skips the waits it already knows to be met: a predecessor whose tasks all ran earlier
on the same vEU, or one it waited for before, together with that operator's ancestors (every
task of ``P`` started only after ``P``'s own predecessors were complete, so ``P`` complete
implies its ancestors complete). ``check_counter_scripts`` verifies this independently, by a
fixed point over what each operator's tasks are guaranteed at their start, and simulates the
scripts to find a cycle of waits (a deadlock), so a wrong script is an error, never a hang.

Counts are per launch: the CUDA dispatcher keeps the counters monotonic across launches
(target ``(epoch + 1) * count``), so nothing is reset at the end of a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DeadlockError, PlanError
from .graph import RGraph
from .rprogram import RProgram, RTask
from .script import Run, _runs


@dataclass(frozen=True)
class CounterWait:
    """Wait until every rTask of each operator in ``ops`` has finished (this launch)."""

    ops: tuple[str, ...]


@dataclass(frozen=True)
class Arrive:
    """Add ``count`` to ``op``'s counter: the run just before it finished ``count`` rTasks."""

    op: str
    count: int


CounterItem = Run | CounterWait | Arrive


def task_counts(program: RProgram) -> dict[str, int]:
    """rTasks of each operator in the program (the counter's target per launch)."""
    counts: dict[str, int] = {}
    for task in program.tasks():
        counts[task.op] = counts.get(task.op, 0) + 1
    return counts


def _in_program_preds(program: RProgram, graph: RGraph) -> dict[str, list[str]]:
    inside = set(program.ops())
    return {op: [p for p in graph.preds(op) if p in inside] for op in program.ops()}


def _ancestors(program: RProgram, preds: dict[str, list[str]], graph: RGraph) -> dict[str, int]:
    """Each operator's bit and ancestors inside the program, as bitsets (Python ints)."""
    bit = {op: 1 << k for k, op in enumerate(sorted(program.ops(), key=graph.index))}
    closed: dict[str, int] = {}  # the operator itself and its ancestors
    for op in sorted(program.ops(), key=graph.index):
        mine = bit[op]
        for p in preds[op]:
            mine |= closed[p]
        closed[op] = mine
    return closed


def _own_bit(closed: int) -> int:
    """An operator's own bit in its closed set: the highest (ancestors come first)."""
    return 1 << (closed.bit_length() - 1)


def _veu_tasks(program: RProgram) -> list[list[RTask]]:
    return [[e for e in entries if isinstance(e, RTask)] for entries in program.entries]


def counter_scripts(program: RProgram, graph: RGraph) -> list[list[CounterItem]]:
    """Per-vEU scripts: runs of rTasks, the counter waits before them, arrivals after them.

    Validation, simulation and lowering all need them (seconds for NASNet's 190 K rTasks),
    so they are kept on the program, keyed by the graph and a hash of the entries: a
    program changed in any way (even by hand) gets new scripts."""
    key = (id(graph), hash(tuple(tuple(es) for es in program.entries)))
    cached = program.__dict__.get("_counter_scripts")
    if cached is not None and cached[0] == key and cached[1] is graph:
        return cached[2]
    scripts = _derive_scripts(program, graph)
    program._counter_scripts = (key, graph, scripts)
    return scripts


def _derive_scripts(program: RProgram, graph: RGraph) -> list[list[CounterItem]]:
    preds = _in_program_preds(program, graph)
    closed = _ancestors(program, preds, graph)
    total = task_counts(program)
    plans: list[list[tuple[tuple[str, ...], list[RTask]]]] = []
    awaited: set[str] = set()
    for tasks in _veu_tasks(program):
        known = 0  # bitset: operators known complete at this point of the vEU
        seen: dict[str, int] = {}
        segments: list[tuple[tuple[str, ...], list[RTask]]] = [((), [])]
        for task in tasks:
            # the latest predecessor first: waiting for it implies its ancestors
            missing = [p for p in preds[task.op] if not known & _own_bit(closed[p])]
            missing.sort(key=graph.index, reverse=True)
            waits = []
            for p in missing:
                if known & _own_bit(closed[p]):  # implied by an earlier wait of this task
                    continue
                known |= closed[p]
                if seen.get(p, 0) < total[p]:
                    waits.append(p)
            if waits:
                awaited.update(waits)
                segments.append((tuple(waits), []))
            segments[-1][1].append(task)
            seen[task.op] = seen.get(task.op, 0) + 1
            if seen[task.op] == total[task.op]:  # all of it ran here, before what follows
                known |= closed[task.op]
        plans.append(segments)
    scripts: list[list[CounterItem]] = []
    for segments in plans:
        script: list[CounterItem] = []
        for waits, tasks in segments:
            if waits:
                script.append(CounterWait(waits))
            for run, _ in _runs(tasks, set()):
                script.append(run)
                if run.op in awaited:
                    script.append(Arrive(run.op, run.count))
        scripts.append(script)
    return scripts


def counter_stats(program: RProgram, graph: RGraph, scripts=None) -> dict[str, int]:
    """What the synchronisation costs: counters, waits and (vEU, operator) wait pairs, beside
    the in-program dependency edges they stand for."""
    scripts = counter_scripts(program, graph) if scripts is None else scripts
    waits = [item for script in scripts for item in script if isinstance(item, CounterWait)]
    counters = {op for w in waits for op in w.ops}
    return {
        "operators": len(program.ops()),
        "edges": sum(len(p) for p in _in_program_preds(program, graph).values()),
        "counters": len(counters),
        "counter_waits": len(waits),
        "wait_pairs": sum(len(w.ops) for w in waits),
        "arrivals": sum(isinstance(i, Arrive) for script in scripts for i in script),
    }


def check_counter_scripts(program: RProgram, graph: RGraph, scripts) -> None:
    """Raise unless the scripts run every task once, count every awaited task right after
    running it, cover every dependency and cannot deadlock."""
    cached = program.__dict__.get("_counter_scripts")
    mine = cached is not None and cached[2] is scripts and cached[1] is graph
    if mine and program.__dict__.get("_counter_checked") == cached[0]:
        return  # these very scripts of this very program passed before
    _check(program, graph, scripts)
    if mine:
        program._counter_checked = cached[0]


def _check(program: RProgram, graph: RGraph, scripts) -> None:
    name = program.name or "rProgram"
    total = task_counts(program)
    preds = _in_program_preds(program, graph)
    ran: dict[tuple[str, int], int] = {}
    arrived: dict[str, int] = {}
    for veu, script in enumerate(scripts):
        for k, item in enumerate(script):
            if isinstance(item, Run):
                for i in item.ids():
                    if (item.op, i) in ran:
                        raise PlanError(f"{name}: {item.op} rtask {i} runs twice (vEU {veu})")
                    ran[(item.op, i)] = veu
            elif isinstance(item, Arrive):
                # the CUDA lowering publishes right after the run's closing __syncthreads
                before = script[k - 1] if k else None
                if not (
                    isinstance(before, Run) and (before.op, before.count) == (item.op, item.count)
                ):
                    raise PlanError(
                        f"{name}: vEU {veu} arrives at {item.op}'s counter without running "
                        f"{item.count} of its rTasks just before"
                    )
                arrived[item.op] = arrived.get(item.op, 0) + item.count
    if len(ran) != program.num_tasks:
        raise PlanError(f"{name}: the counter scripts run {len(ran)} of {program.num_tasks} rTasks")
    waited = {op for s in scripts for i in s if isinstance(i, CounterWait) for op in i.ops}
    for op in waited:
        if arrived.get(op, 0) != total.get(op, -1):
            raise PlanError(
                f"{name}: {op} is waited for, but its runs add {arrived.get(op, 0)} to its "
                f"counter instead of its {total.get(op, 0)} rTasks"
            )
    _simulate(name, scripts, total)
    _check_coverage(name, scripts, total, preds)


def _simulate(name: str, scripts, total: dict[str, int]) -> None:
    """Run the scripts on a model of the device; a cycle of waits is a DeadlockError."""
    pos = [0] * len(scripts)
    count: dict[str, int] = {}
    blocked: dict[str, list[int]] = {}
    stack = list(range(len(scripts) - 1, -1, -1))
    while stack:
        v = stack.pop()
        script = scripts[v]
        while pos[v] < len(script):
            item = script[pos[v]]
            if isinstance(item, CounterWait):
                unmet = next((op for op in item.ops if count.get(op, 0) < total[op]), None)
                if unmet is not None:
                    blocked.setdefault(unmet, []).append(v)
                    break
            elif isinstance(item, Arrive):
                count[item.op] = count.get(item.op, 0) + item.count
                if count[item.op] >= total[item.op]:
                    stack.extend(blocked.pop(item.op, []))
            pos[v] += 1
    stuck = [v for v, script in enumerate(scripts) if pos[v] < len(script)]
    if stuck:
        v = stuck[0]
        ops = scripts[v][pos[v]].ops
        unmet = [op for op in ops if count.get(op, 0) < total[op]]
        raise DeadlockError(
            f"{name} deadlocks under dependency counters: vEU {v} waits for {unmet[0]} "
            f"({count.get(unmet[0], 0)} of {total[unmet[0]]} rTasks finish); "
            f"{len(stuck)} vEUs never finish"
        )


def _check_coverage(name: str, scripts, total: dict[str, int], preds) -> None:
    """Every run starts only when its operator's predecessors are complete.

    ``done_before[op]``: operators complete before *every* task of ``op`` starts (a bitset
    over the operators); it grows from empty to a fixed point (a least fixed point: sound
    because the simulation has shown that the waits are well founded).
    """
    bit = {op: 1 << k for k, op in enumerate(total)}
    done_before = dict.fromkeys(total, 0)
    while True:
        guaranteed: dict[str, int] = {}
        for script in scripts:
            known = 0
            seen: dict[str, int] = {}
            for item in script:
                if isinstance(item, CounterWait):
                    for op in item.ops:
                        known |= bit[op] | done_before[op]
                elif isinstance(item, Run):
                    prior = guaranteed.get(item.op)
                    guaranteed[item.op] = known if prior is None else prior & known
                    seen[item.op] = seen.get(item.op, 0) + item.count
                    if seen[item.op] == total[item.op]:
                        known |= bit[item.op] | done_before[item.op]
        if all(guaranteed.get(op, 0) == done_before[op] for op in total):
            break
        done_before = {op: guaranteed.get(op, 0) for op in total}
    for op, before in done_before.items():
        unmet = [p for p in preds[op] if not before & bit[p]]
        if unmet:
            raise PlanError(
                f"{name}: a task of {op} can start before {unmet[0]} is complete under "
                "dependency counters (no wait covers it)"
            )
