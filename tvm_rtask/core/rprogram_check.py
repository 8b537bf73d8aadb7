"""Checking an rProgram: every dependency covered, no cyclic wait, vEUs within capacity.

:class:`ProgramChecks` holds the checks of :class:`~tvm_rtask.core.rprogram.RProgram` (which
inherits them), apart from the building in ``rprogram.py``: ``validate`` replays the
entries in an order the device could take and carries vector clocks through the barriers,
so a wrong plan is an error naming the tasks, never a hang on the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import CapacityError, DeadlockError, PlanError
from .entries import Barrier, RTask

if TYPE_CHECKING:
    from .graph import RGraph


class ProgramChecks:
    """The checks of an rProgram; the state they read is :class:`RProgram`'s."""

    def _describe(self, veu: int, index: int) -> str:
        """Name a barrier by the task it guards, for error messages."""
        for e in self.entries[veu][index + 1 :]:
            if isinstance(e, RTask):
                return f"barrier before {e} on vEU {veu}"
        return f"barrier at the end of vEU {veu}"

    def _entry_counts(self) -> list[int]:
        """rTasks per vEU counted from ``entries`` (they may have been edited by hand)."""
        return [sum(1 for e in es if isinstance(e, RTask)) for es in self.entries]

    def _check_waits_exist(self, counts: list[int]) -> None:
        n = self.num_veu
        limit = np.array([*counts, 0], dtype=np.int64)  # an unknown vEU runs nothing
        for v, es in enumerate(self.entries):
            for i, e in enumerate(es):
                if not isinstance(e, Barrier):
                    continue
                if len(e.waits) < 16:  # numpy only pays off on wide barriers
                    if all(0 <= u < n and 0 <= j < counts[u] for u, j in e.waits):
                        continue
                else:
                    a = e.array
                    us = np.where((a[:, 0] >= 0) & (a[:, 0] < n), a[:, 0], n)
                    if ((a[:, 1] >= 0) & (a[:, 1] < limit[us])).all():
                        continue
                for u, j in e.waits:
                    if not 0 <= u < self.num_veu:
                        raise DeadlockError(
                            f"{self._describe(v, i)} waits for vEU {u}, but rProgram "
                            f"{self.name!r} has only {self.num_veu} vEUs"
                        )
                    if not 0 <= j < counts[u]:
                        raise DeadlockError(
                            f"{self._describe(v, i)} waits for vEU {u} order {j} but vEU {u} "
                            f"runs only {counts[u]} rTasks"
                        )

    def execution_order(self) -> list[tuple[int, int]]:
        """Entries ``(veu, index)`` in an order that respects program order and barriers.

        It is what any run of the program could do, so it is also the deadlock check: a
        wait for a missing task or a cycle of waits raises DeadlockError naming the barriers.
        """
        self._check_waits_exist(self._entry_counts())
        n = self.num_veu
        idx = [0] * n
        pair = [0] * n  # next unchecked pair of the barrier each vEU is blocked on
        done = [0] * n
        waiters: dict[tuple[int, int], list[int]] = {}
        blocked_on: dict[int, tuple[int, int]] = {}
        out: list[tuple[int, int]] = []
        passed: set[int] = set()  # wide barrier objects already satisfied (shared ones)
        stack = list(range(n - 1, -1, -1))
        while stack:
            v = stack.pop()
            es = self.entries[v]
            i = idx[v]
            while i < len(es):
                e = es[i]
                if isinstance(e, Barrier):
                    if id(e) in passed:
                        pair[v] = 0
                        blocked_on.pop(v, None)
                        out.append((v, i))
                        i += 1
                        continue
                    waits = e.waits
                    k, m = pair[v], len(waits)
                    while k < m:
                        u, j = waits[k]
                        if done[u] <= j:
                            break
                        k += 1
                    if k < m:
                        pair[v] = k
                        waiters.setdefault(waits[k], []).append(v)
                        blocked_on[v] = waits[k]
                        break
                    pair[v] = 0
                    blocked_on.pop(v, None)
                    if m >= 16:
                        passed.add(id(e))
                    out.append((v, i))
                else:
                    out.append((v, i))
                    done[v] += 1
                    ws = waiters.pop((v, done[v] - 1), None)
                    if ws:
                        stack.extend(ws)
                i += 1
            idx[v] = i
        if len(out) < sum(len(es) for es in self.entries):
            raise DeadlockError(self._cycle_message(idx, blocked_on))
        return out

    def _cycle_message(self, idx: list[int], blocked_on: dict[int, tuple[int, int]]) -> str:
        """Each blocked vEU waits on another blocked one (all waits exist), so follow to a loop."""
        v = min(blocked_on)
        seen: dict[int, int] = {}
        path: list[int] = []
        while v not in seen:
            seen[v] = len(path)
            path.append(v)
            v = blocked_on[v][0]
        parts = []
        for w in path[seen[v] :]:
            u, j = blocked_on[w]
            parts.append(f"{self._describe(w, idx[w])} waits for vEU {u} order {j}")
        return (
            f"rProgram {self.name!r} deadlocks: its barriers wait in a cycle: "
            + "; ".join(parts)
            + "; each waits for the next"
        )

    def validate(self, graph: RGraph, capacity: int | None = None, barriers: bool = True) -> None:
        """Raise unless the program fits the device, is complete and covers every dependency.

        ``barriers=False`` checks placement only (fit, every task once, one kernel per
        operator): for a lowering that synchronises otherwise (dependency counters, checked
        by ``core.counters``), the barrier entries are not what runs.
        """
        if capacity is not None and self.num_veu > capacity:
            raise CapacityError(
                f"rProgram {self.name!r} uses {self.num_veu} vEUs but the device keeps only "
                f"{capacity} co-resident; fewer vEUs or smaller rTasks are needed"
            )
        tasks_of, pos = self._check_tasks(graph)
        if not barriers:
            return
        order = self.execution_order()
        counts = self._entry_counts()
        base = np.concatenate(([0], np.cumsum(counts)))  # row of (v, j) is base[v] + j
        before = self._clocks(order, base)
        self._check_coverage(graph, tasks_of, pos, before, base)

    def task_clocks(self) -> tuple[np.ndarray, dict[tuple[str, int], tuple[int, int, int]]]:
        """The vector clock before every rTask (what the barriers guarantee has finished,
        per vEU: its last order, -1 for none) and each task's ``(veu, order, row)`` by key.

        Raises DeadlockError where ``execution_order`` does."""
        order = self.execution_order()
        base = np.concatenate(([0], np.cumsum(self._entry_counts()))).astype(np.int64)
        before = self._clocks(order, base)
        where: dict[tuple[str, int], tuple[int, int, int]] = {}
        for v, es in enumerate(self.entries):
            j = 0
            for e in es:
                if isinstance(e, RTask):
                    where[e.key] = (v, j, int(base[v]) + j)
                    j += 1
        return before, where

    def check_waves(self, graph: RGraph) -> None:
        """Raise PlanError unless the ``wave`` fields suit a lowering with global barriers.

        Such a lowering (one parallel loop per wave, everything joined between waves) ignores
        the barrier entries, so it is correct only when each vEU runs its tasks in
        non-decreasing wave order and every dependency inside the program goes from a lower
        wave to a higher one.
        """
        lo: dict[str, int] = {}
        hi: dict[str, int] = {}
        for v, es in enumerate(self.entries):
            last: RTask | None = None
            for e in es:
                if not isinstance(e, RTask):
                    continue
                if last is not None and e.wave < last.wave:
                    raise PlanError(
                        f"rProgram {self.name!r}: vEU {v} runs {e} (wave {e.wave}) after "
                        f"{last} (wave {last.wave}); global barriers need each vEU's tasks "
                        "in wave order"
                    )
                last = e
                lo[e.op] = min(lo.get(e.op, e.wave), e.wave)
                hi[e.op] = max(hi.get(e.op, e.wave), e.wave)
        for b in lo:
            for a in graph.preds(b):
                if a in hi and hi[a] >= lo[b]:
                    raise PlanError(
                        f"rProgram {self.name!r}: {b} (wave {lo[b]}) reads {a} (wave {hi[a]}) "
                        "in the same or a later wave; a global-barrier lowering would race"
                    )

    def _check_tasks(
        self, graph: RGraph
    ) -> tuple[dict[str, list[RTask]], dict[tuple[str, int], tuple[int, int]]]:
        """Each task once, each op complete with one rKernel the graph knows."""
        tasks_of: dict[str, list[RTask]] = {}
        pos: dict[tuple[str, int], tuple[int, int]] = {}
        for v, es in enumerate(self.entries):
            j = 0
            for e in es:
                if not isinstance(e, RTask):
                    continue
                if e.key in pos:
                    u, i = pos[e.key]
                    raise PlanError(
                        f"{e} appears twice in rProgram {self.name!r}: on vEU {u} order {i} "
                        f"and on vEU {v} order {j}"
                    )
                pos[e.key] = (v, j)
                tasks_of.setdefault(e.op, []).append(e)
                j += 1
        for op, ts in tasks_of.items():
            rop = graph.op(op)
            if not rop.supported:
                raise PlanError(
                    f"operator {op!r} is unsupported ({rop.reason or 'no reason given'}) and "
                    f"cannot run inside rProgram {self.name!r}; keep it an ordinary call"
                )
            kernels = sorted({t.kernel for t in ts})
            if len(kernels) > 1:
                raise PlanError(
                    f"operator {op!r} runs with several rKernels {kernels} in rProgram "
                    f"{self.name!r}; one kernel per operator"
                )
            n = rop.kernel(kernels[0]).num_rtasks
            ids = {t.rtask_id for t in ts}
            missing = sorted(set(range(n)) - ids)
            extra = sorted(ids - set(range(n)))
            if missing or extra:
                raise PlanError(
                    f"operator {op!r} (rKernel {kernels[0]!r}, {n} rTasks) in rProgram "
                    f"{self.name!r}: missing rtask ids {missing[:10]}, unknown ids {extra[:10]}"
                )
        return tasks_of, pos

    def _clocks(self, order: list[tuple[int, int]], base: np.ndarray) -> np.ndarray:
        """Vector clock before each task (row ``base[v] + j``): for every vEU, the last order
        known to have finished before the task starts."""
        n = self.num_veu
        after = np.empty((int(base[-1]), n), dtype=np.int64)
        cur = np.full((n, n), -1, dtype=np.int64)
        done = [0] * n
        joined: dict[int, np.ndarray] = {}  # a barrier object shared by several vEUs: once
        for v, i in order:
            e = self.entries[v][i]
            if isinstance(e, Barrier):
                if e.waits:
                    clock = joined.get(id(e))
                    if clock is None:
                        w = e.array
                        clock = after[base[w[:, 0]] + w[:, 1]].max(axis=0)
                        if len(e.waits) >= 16:
                            joined[id(e)] = clock
                    np.maximum(cur[v], clock, out=cur[v])
                continue
            k = done[v]
            cur[v, v] = k
            done[v] = k + 1
            after[base[v] + k] = cur[v]
        before = after
        veu_of_row = np.repeat(np.arange(n), np.diff(base))
        before[np.arange(len(before)), veu_of_row] -= 1
        return before

    def _check_coverage(
        self,
        graph: RGraph,
        tasks_of: dict[str, list[RTask]],
        pos: dict[tuple[str, int], tuple[int, int]],
        before: np.ndarray,
        base: np.ndarray,
    ) -> None:
        """Every task of a pred A must happen-before every task of B: per vEU, it is enough
        that A's last task there is known finished."""
        n = self.num_veu
        last: dict[str, np.ndarray] = {}
        for op, ts in tasks_of.items():
            m = np.full(n, -1, dtype=np.int64)
            for t in ts:
                u, j = pos[t.key]
                m[u] = max(m[u], j)
            last[op] = m
        for b, bts in tasks_of.items():
            preds = [a for a in graph.preds(b) if a in tasks_of]
            if not preds:
                continue
            rows = np.fromiter(
                (base[pos[t.key][0]] + pos[t.key][1] for t in bts), dtype=np.int64, count=len(bts)
            )
            cb = before[rows]
            for a in preds:
                bad = cb < last[a]
                if bad.any():
                    k = int(np.argmax(bad.any(axis=1)))
                    u = int(np.argmax(bad[k]))
                    self._uncovered(a, tasks_of[a], bts[k], u, int(cb[k, u]), pos)

    def _uncovered(
        self,
        a: str,
        a_tasks: list[RTask],
        tb: RTask,
        u: int,
        known: int,
        pos: dict[tuple[str, int], tuple[int, int]],
    ) -> None:
        """Raise for the first task of ``a`` on vEU ``u`` that ``tb`` does not wait for."""
        late = [t for t in a_tasks if pos[t.key][0] == u and pos[t.key][1] > known]
        ta = min(late, key=lambda t: pos[t.key][1])
        (_, ja), (vb, jb) = pos[ta.key], pos[tb.key]
        raise PlanError(
            f"rProgram {self.name!r}: dependency {a} rtask {ta.rtask_id} (vEU {u}, "
            f"order {ja}) -> {tb.op} rtask {tb.rtask_id} (vEU {vb}, order {jb}) is covered "
            "neither by order nor by a barrier"
        )
