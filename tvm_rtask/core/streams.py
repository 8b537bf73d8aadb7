"""The host's stream protocol for a plan whose steps launch on several streams (Opara).

A multi-stream plan (``Plan.streams``: operator -> stream) is run by the host as a list of
actions around the steps' launches, in the plan's order:

* ``Fork(n)`` once, first: stream 0 is the caller's current stream (the *origin*); streams
  ``1..n-1`` wait for the work already issued on it (what a CUDA graph capture needs to take
  them in);
* ``Enter(step, stream, waits)`` before a step's launch: later launches go to ``stream``,
  which first waits for the events ``waits``;
* ``Record(event)`` after a launch whose result another stream reads;
* ``Join()`` last: the origin waits for the tail of every other stream and becomes current.

:func:`stream_actions` derives the actions from the plan; :func:`check_stream_actions`
replays them as streams would order the work and raises :class:`PlanError` naming the first
data dependence that nothing orders. Both are pure Python; ``relax_passes/launch_on_streams``
turns the actions into host calls of ``main``, ``runtime/streams`` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PlanError
from .plan import Plan, _step_ops


@dataclass(frozen=True)
class Fork:
    streams: int


@dataclass(frozen=True)
class Enter:
    step: int
    stream: int
    waits: tuple[int, ...] = ()


@dataclass(frozen=True)
class Record:
    event: int


@dataclass(frozen=True)
class Join:
    pass


Action = Fork | Enter | Record | Join


def step_streams(plan: Plan, launches: list[int]) -> dict[int, int]:
    """The stream of each launching step: its first operator's, renumbered in launch order so
    that the first launch is on stream 0 (the origin)."""
    where: dict[int, int] = {}
    renumber: dict[int, int] = {}
    for k in launches:
        ops = _step_ops(plan.steps[k])
        raw = plan.streams.get(ops[0], 0) if ops else 0
        where[k] = renumber.setdefault(raw, len(renumber))
    return where


def launch_preds(plan: Plan, launches: list[int]) -> dict[int, set[int]]:
    """For each launching step, the launching steps whose results it reads: through steps that
    launch nothing (tuples, views), back to the launches that produced the data."""
    step_of = plan.step_of()
    launching = set(launches)
    direct: dict[int, set[int]] = {}
    for k, step in enumerate(plan.steps):
        direct[k] = {step_of[p] for op in _step_ops(step) for p in plan.graph.preds(op)}
        direct[k].discard(k)
    memo: dict[int, set[int]] = {}

    def sources(k: int) -> set[int]:
        if k not in memo:
            found: set[int] = set()
            for j in direct[k]:
                found |= {j} if j in launching else sources(j)
            memo[k] = found
        return memo[k]

    return {k: sources(k) for k in launches}


def stream_actions(plan: Plan, launches: list[int]) -> list[Action]:
    """The actions that run the launching steps ``launches`` (ascending step indices) on the
    plan's streams: a wait only where a result crosses streams and nothing the consumer's
    stream already waited for orders it (the latest producers first, so that none of the
    waits is implied by another)."""
    if not launches:
        return []
    stream = step_streams(plan, launches)
    preds = launch_preds(plan, launches)
    rank = {k: i for i, k in enumerate(launches)}
    crossing = sorted(
        {j for k in launches for j in preds[k] if stream[j] != stream[k]}, key=rank.__getitem__
    )
    event = {j: e for e, j in enumerate(crossing)}
    tail: dict[int, frozenset[int]] = {}  # stream -> the launches its next one comes after
    recorded: dict[int, frozenset[int]] = {}
    actions: list[Action] = [Fork(max(stream.values()) + 1)]
    for k in launches:
        s = stream[k]
        after = set(tail.get(s, frozenset()))
        waits = []
        for j in sorted(preds[k], key=rank.__getitem__, reverse=True):
            if j in after:
                continue
            waits.append(event[j])
            after |= recorded[event[j]]
        actions.append(Enter(k, s, tuple(sorted(waits))))
        tail[s] = frozenset(after | {k})
        if k in event:
            recorded[event[k]] = tail[s]
            actions.append(Record(event[k]))
    actions.append(Join())
    return actions


def check_stream_actions(plan: Plan, launches: list[int], actions: list[Action]) -> None:
    """Raise PlanError unless every launch that reads another's result runs after it, and the
    origin ends after every launch, when the actions run as streams order work: in issue
    order on one stream, and after an event's recording point where a stream waits for it."""
    preds = launch_preds(plan, launches)
    done_before: dict[int, frozenset[int]] = {}  # launch -> launches certainly finished
    tail: dict[int, frozenset[int]] = {}  # stream -> what its next launch comes after
    recorded: dict[int, frozenset[int]] = {}
    current: int | None = None
    issued: list[int] = []
    forked = joined = False
    pending = iter(launches)
    for action in actions:
        if isinstance(action, Fork):
            forked = True
            tail = {s: frozenset() for s in range(action.streams)}
        elif isinstance(action, Enter):
            if not forked or joined:
                raise PlanError(f"step {action.step} enters a stream outside fork and join")
            if action.stream not in tail:
                raise PlanError(f"step {action.step} enters stream {action.stream}, not forked")
            expected = next(pending, None)
            if expected != action.step:
                raise PlanError(f"the actions launch step {action.step} where {expected} is next")
            after = set(tail[action.stream])
            for e in action.waits:
                if e not in recorded:
                    raise PlanError(f"step {action.step} waits for event {e}, never recorded")
                after |= recorded[e]
            done_before[action.step] = frozenset(after)
            tail[action.stream] = frozenset(after | {action.step})
            current = action.stream
            issued.append(action.step)
        elif isinstance(action, Record):
            if current is None:
                raise PlanError(f"event {action.event} is recorded before any launch")
            recorded[action.event] = tail[current]
        elif isinstance(action, Join):
            joined = True
            everything = frozenset().union(*tail.values())
            if everything != frozenset(issued):
                raise PlanError("the join does not wait for every stream")
    if not joined:
        raise PlanError("the actions never join the streams back to the origin")
    missing = [k for k in launches if k not in done_before]
    if missing:
        raise PlanError(f"steps {missing} are never launched")
    for k in launches:
        for j in sorted(preds[k]):
            if j not in done_before[k]:
                raise PlanError(
                    f"step {k} reads the result of step {j} on another stream with no wait "
                    "between them"
                )
