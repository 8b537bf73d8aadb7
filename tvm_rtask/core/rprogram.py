"""rProgram: ``prog[veu][order]`` of rTasks and barrier rTasks (Rammer section 3.3).

One rProgram becomes one persistent kernel. A vEU runs its entries in order; a barrier
waits until ``step[u] > j`` for each of its ``(u, j)`` pairs, where ``step[u]`` counts the
rTasks (not barriers) vEU ``u`` has finished. Correctness is checked by ``validate`` with
vector clocks (``rprogram_check.py``), so a wrong plan is an error naming the tasks, never a
hang on the device.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import DeadlockError, OptionError, PlanError
from .entries import Barrier, Entry, RTask
from .rprogram_check import ProgramChecks

__all__ = ["Barrier", "Entry", "RProgram", "RTask"]


class RProgram(ProgramChecks):
    """Per-vEU entry lists built with Rammer's ``wait`` / ``append`` API.

    ``append`` keeps barriers minimal: it tracks, per vEU, which order of every other vEU is
    already known to be finished (a vector clock, transitive through earlier barriers), and
    emits only the waits that are not known yet.

    A global barrier (IOS stages, ``wavefront_global``) is one ``Barrier`` object appended to
    every vEU that passes it, waiting for the last task of every vEU of the stage before,
    the vEU's own pair included. Checks and simulation handle such a wide shared barrier
    once, not once per vEU; ``from_dict`` shares equal wide barriers again.
    """

    def __init__(self, num_veu: int, name: str = "", clocks: bool = True) -> None:
        """``clocks=False``: no vector clocks, so no barrier reduction (``append`` takes no
        waits): for a program synchronised by dependency counters (``core.counters``),
        whose waits come from the graph; it saves a vEU-wide clock row per rTask."""
        if num_veu < 1:
            raise OptionError(f"an rProgram needs at least one vEU, got num_veu={num_veu}")
        self.num_veu = num_veu
        self.name = name
        self.clocks = clocks
        self.entries: list[list[Entry]] = [[] for _ in range(num_veu)]
        self._pos: dict[tuple[str, int], tuple[int, int]] = {}
        self._counts = [0] * num_veu
        self._ops: list[str] = []
        self._kernels: dict[str, str] = {}
        self._log: list[tuple[str, int]] = []
        self._pending: dict[tuple[str, int], dict[int, int]] = {}
        # _known[v, u]: largest order of vEU u known finished at the current end of vEU v.
        self._known = np.full((num_veu, num_veu), -1, dtype=np.int64)
        # _after[_row_of[u][j]]: the clock right after task j of vEU u, to merge into waiters.
        self._after = np.empty((16, num_veu), dtype=np.int64)
        self._row_of: list[list[int]] = [[] for _ in range(num_veu)]
        # id(barrier) -> (barrier, generation, clock) for wide (global) barriers; a rollback
        # starts a new generation
        self._clock_cache: dict[int, tuple[Barrier, int, np.ndarray | None]] = {}
        self._generation = 0
        # op -> rTasks the planner costed it as running side by side with (its wave's width:
        # fewer than the vEUs spread over the SMs and share each less; policies/cost.py)
        self.widths: dict[str, int] = {}

    # -- building ----------------------------------------------------------------------
    def wait(self, task: RTask, deps: Iterable[RTask]) -> None:
        """Record that ``task`` (not appended yet) must start after the appended ``deps``."""
        if task.key in self._pos:
            raise PlanError(
                f"{task} is already placed in rProgram {self.name!r}: wait before append"
            )
        need = self._pending.setdefault(task.key, {})
        for d in deps:
            p = self._pos.get(d.key)
            if p is None:
                raise PlanError(
                    f"{task} waits for {d}, which is not in rProgram {self.name!r} yet: "
                    "append dependencies first"
                )
            u, j = p
            if need.get(u, -1) < j:
                need[u] = j

    def append(self, task: RTask, veu: int, after: Sequence[int] | np.ndarray | None = None) -> int:
        """Put ``task`` at the end of ``veu``, after a barrier for its not-yet-known waits.

        The waits are those recorded by ``wait`` and, when given, ``after``: one order per vEU
        (``after[u] = j`` means "after task j of vEU u"; -1 for none). ``after`` lets a policy
        that tracks the last task of each predecessor per vEU skip building RTask lists.
        Returns the task's order on the vEU.
        """
        if not 0 <= veu < self.num_veu:
            self._check_veu(veu)
        key = task.key
        if key in self._pos:
            raise PlanError(f"{task} is already in rProgram {self.name!r} at {self._pos[key]}")
        need = self._pending.pop(key, None) if self._pending else None
        if after is None and not need:
            return self._push_task(task, veu)
        if not self.clocks:
            raise PlanError(
                f"rProgram {self.name!r} keeps no vector clocks (dependency counters): "
                f"{task} cannot be appended behind step waits"
            )
        known = self._known[veu]
        waits: list[tuple[int, int]] = []
        if after is not None:
            a = np.asarray(after, dtype=np.int64)
            if a.shape != (self.num_veu,):
                raise PlanError(
                    f"{task}: after must hold one order per vEU ({self.num_veu}), got {a.shape}"
                )
            mask = known < a
            mask[veu] = False
            idx = np.flatnonzero(mask)
            if len(idx):
                us, js = idx.tolist(), a[idx].tolist()
                counts = self._counts
                if any(j >= counts[u] for u, j in zip(us, js, strict=True)):
                    raise PlanError(
                        f"{task} waits for a task that is not in rProgram {self.name!r} yet: "
                        "append dependencies first"
                    )
                waits = list(zip(us, js, strict=True))
        if need:
            merged = dict(waits)
            for u, j in need.items():
                if u != veu and known[u] < j and merged.get(u, -1) < j:
                    merged[u] = j
            waits = sorted(merged.items())
        if waits:
            self._append_waits(veu, waits)
        return self._push_task(task, veu)

    def _append_waits(self, veu: int, waits: list[tuple[int, int]]) -> None:
        """Append a barrier for ``waits`` (sorted, existing tasks, none known yet) without
        the waits another wait of it already implies.

        Happens-before is a partial order, so the waits no other wait implies remain and
        together still imply every dropped one; the clock after the barrier is the join of
        the clocks after all of them (a dropped one's is below its implier's).
        """
        rows = [self._row_of[u][j] for u, j in waits]
        after = self._after[rows]  # row k: the clock after wait k
        if len(waits) > 1:
            us = [u for u, _ in waits]
            js = np.array([j for _, j in waits], dtype=np.int64)
            implied = after[:, us] >= js  # [k, i]: wait k implies wait i
            np.fill_diagonal(implied, False)
            keep = ~implied.any(axis=0)
            if not keep.all():
                waits = [w for w, k in zip(waits, keep.tolist(), strict=True) if k]
        b = object.__new__(Barrier)  # the waits are already sorted pairs of ints
        object.__setattr__(b, "waits", tuple(waits))
        self.entries[veu].append(b)
        np.maximum(self._known[veu], after.max(axis=0), out=self._known[veu])

    def append_barrier(self, veu: int, waits: Iterable[tuple[int, int]] | Barrier) -> Barrier:
        """Append a barrier as given, without reduction (for tests, deserialisation and
        global barriers).

        A ``Barrier`` object may be appended to several vEUs: a global barrier is one object
        shared by every vEU that passes it (its own pair included, which is harmless), so
        its clock is merged once rather than once per vEU.
        """
        self._check_veu(veu)
        b = waits if isinstance(waits, Barrier) else Barrier(tuple(waits))
        self.entries[veu].append(b)
        if not self.clocks:
            return b
        clock = self._barrier_clock(b)
        if clock is not None:
            np.maximum(self._known[veu], clock, out=self._known[veu])
        return b

    def _barrier_clock(self, b: Barrier) -> np.ndarray | None:
        """What a vEU knows after ``b``: the join of the clocks of the tasks it waits for.

        Cached per Barrier object until the next rollback (which may replace the tasks it
        names); appending more tasks does not change it.
        """
        hit = self._clock_cache.get(id(b))
        if hit is not None and hit[0] is b and hit[1] == self._generation:
            return hit[2]
        if len(b.waits) < 16:
            rows = [
                self._row_of[u][j]
                for u, j in b.waits
                if 0 <= u < self.num_veu and 0 <= j < self._counts[u]
            ]
        else:
            a = b.array
            ok = (a[:, 0] >= 0) & (a[:, 0] < self.num_veu)
            a = a[ok]
            ok = (a[:, 1] >= 0) & (a[:, 1] < np.asarray(self._counts)[a[:, 0]])
            rows = [self._row_of[u][j] for u, j in a[ok].tolist()]
        clock = self._after[rows].max(axis=0) if rows else None
        if len(b.waits) >= 16:
            self._clock_cache[id(b)] = (b, self._generation, clock)
        return clock

    def _push_task(self, task: RTask, veu: int) -> int:
        order = self._counts[veu]
        self.entries[veu].append(task)
        self._pos[task.key] = (veu, order)
        self._counts[veu] = order + 1
        if self.clocks:
            self._known[veu, veu] = order
            r = len(self._log)
            if r == len(self._after):
                self._after = np.concatenate([self._after, np.empty_like(self._after)])
            self._after[r] = self._known[veu]
            self._row_of[veu].append(r)
        self._log.append(task.key)
        if task.op not in self._kernels:
            self._kernels[task.op] = task.kernel
            self._ops.append(task.op)
        return order

    def _check_veu(self, veu: int) -> None:
        if not 0 <= veu < self.num_veu:
            raise PlanError(
                f"vEU {veu} does not exist in rProgram {self.name!r} ({self.num_veu} vEUs)"
            )

    # -- trial placement -------------------------------------------------------------------
    def checkpoint(self) -> tuple:
        """A token to undo later appends: lets a policy try a placement and take it back."""
        return (
            [len(e) for e in self.entries],
            len(self._log),
            len(self._ops),
            self._known.copy() if self.clocks else None,
            {k: dict(v) for k, v in self._pending.items()},
        )

    def rollback(self, token: tuple) -> None:
        """Undo everything appended since ``checkpoint`` returned ``token``."""
        lens, nlog, nops, known, pending = token
        for v, n in enumerate(lens):
            del self.entries[v][n:]
        for key in self._log[nlog:]:
            v, _ = self._pos.pop(key)
            self._counts[v] -= 1
            if self.clocks:
                self._row_of[v].pop()
        del self._log[nlog:]
        for op in self._ops[nops:]:
            del self._kernels[op]
            self.widths.pop(op, None)
        del self._ops[nops:]
        self._known = known
        self._pending = pending
        self._generation += 1
        self._clock_cache.clear()

    # -- queries -----------------------------------------------------------------------
    def position(self, task: RTask) -> tuple[int, int]:
        """``(veu, order)`` of ``task``."""
        try:
            return self._pos[task.key]
        except KeyError:
            raise PlanError(f"{task} is not in rProgram {self.name!r}") from None

    def __contains__(self, task: object) -> bool:
        return isinstance(task, RTask) and task.key in self._pos

    def tasks(self) -> Iterator[RTask]:
        """All rTasks, vEU by vEU in order."""
        for es in self.entries:
            for e in es:
                if isinstance(e, RTask):
                    yield e

    def ops(self) -> list[str]:
        """Operator names in the order their first rTask was appended."""
        return list(self._ops)

    def kernel_of(self, op: str) -> str:
        """The rKernel the program runs for ``op``."""
        try:
            return self._kernels[op]
        except KeyError:
            raise PlanError(f"operator {op!r} is not in rProgram {self.name!r}") from None

    def known_matrix(self) -> np.ndarray:
        """Read-only view: ``[v, u]`` is the last order of vEU u known done at the end of v."""
        if not self.clocks:
            raise PlanError(f"rProgram {self.name!r} keeps no vector clocks (clocks=False)")
        view = self._known.view()
        view.flags.writeable = False
        return view

    @property
    def num_tasks(self) -> int:
        return sum(self._counts)

    @property
    def num_barriers(self) -> int:
        return sum(1 for es in self.entries for e in es if isinstance(e, Barrier))

    def count(self, veu: int) -> int:
        """rTasks (not barriers) on ``veu``: the final value of its step counter."""
        self._check_veu(veu)
        return self._counts[veu]

    def is_empty(self) -> bool:
        return not self._pos

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RProgram) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"RProgram({self.name!r}, {self.num_veu} vEUs, {self.num_tasks} rTasks, "
            f"{self.num_barriers} barriers, ops={self._ops})"
        )

    # -- serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Compact: a task is ``[op, rtask_id, kernel, wave]`` (indices into ``ops`` and
        ``kernels``), a barrier ``{"waits": [u0, j0, u1, j1, ...]}``. A NASNet plan has 195 K
        tasks and 2 M barrier pairs; as one dict per task and a list per pair it took 14 s
        to write (``from_dict`` reads that older form too)."""
        ops = list(self._ops)
        op_index = {op: i for i, op in enumerate(ops)}
        kernels: dict[str, int] = {}
        entries = []
        for es in self.entries:
            row: list = []
            for e in es:
                if isinstance(e, RTask):
                    k = kernels.setdefault(e.kernel, len(kernels))
                    row.append([op_index[e.op], e.rtask_id, k, e.wave])
                else:
                    row.append({"waits": list(itertools.chain.from_iterable(e.waits))})
            entries.append(row)
        return {
            "name": self.name,
            "num_veu": self.num_veu,
            "ops": ops,
            "kernels": list(kernels),
            "entries": entries,
            **({"widths": dict(self.widths)} if self.widths else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], clocks: bool = True) -> RProgram:
        """Rebuild entries as given; replayed in execution order so ``append`` stays minimal
        (``clocks=False``: a program of a counters plan, entries taken in order)."""
        p = cls(d["num_veu"], d.get("name", ""), clocks=clocks)
        shared: dict[tuple, Barrier] = {}  # equal barriers become one object again
        ops, kernels = d.get("ops") or [], d.get("kernels") or []

        def barrier(waits: list) -> Barrier:
            if waits and not isinstance(waits[0], list):  # flat u0, j0, u1, j1, ...
                waits = list(zip(waits[0::2], waits[1::2], strict=True))
            b = Barrier(tuple(map(tuple, waits)))
            return shared.setdefault(b.waits, b) if len(b.waits) >= 16 else b

        def entry(e) -> Entry:
            if isinstance(e, list):
                try:
                    return RTask(ops[e[0]], e[1], kernels[e[2]], e[3])
                except (IndexError, TypeError) as err:
                    raise PlanError(f"rProgram {p.name!r}: malformed task entry {e}") from err
            return barrier(e["waits"]) if "waits" in e else RTask(**e)

        raw: list[list[Entry]] = [[entry(e) for e in es] for es in d["entries"]]
        if len(raw) != p.num_veu:
            raise PlanError(f"rProgram {p.name!r}: {len(raw)} entry lists for {p.num_veu} vEUs")
        as_given = [(v, i) for v, es in enumerate(raw) for i in range(len(es))]
        order = as_given
        if clocks:  # barriers merge clocks: replay them after the tasks they wait for
            probe = cls(p.num_veu, p.name)
            probe.entries = raw  # execution_order reads only the entries
            try:
                order = probe.execution_order()
            except DeadlockError:  # keep an invalid program as it is, so validate() names it
                pass
        for v, i in order:
            e = raw[v][i]
            if isinstance(e, Barrier):
                p.append_barrier(v, e)
            elif not clocks and e.key in p._pos:
                raise PlanError(f"rProgram {p.name!r}: {e} appears twice")
            else:
                p._push_task(e, v)
        if ops and set(ops) == set(p._ops):
            p._ops = list(ops)
        p.widths = {op: int(w) for op, w in (d.get("widths") or {}).items()}
        return p
