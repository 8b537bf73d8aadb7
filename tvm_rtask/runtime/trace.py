"""The measured timeline of persistent kernels (option ``trace=True``).

A traced build's persistent kernels record, on each vEU, when each rTask and each wait
started and ended, and on the host when each rProgram call started and ended (launch and
join included), into the native library's buffer (``src/trace.c``). :func:`trace_call` runs
one traced call and returns a :class:`Timeline`; the timeline becomes a
:class:`~tvm_rtask.policies.simulate.PlanTiming`, the same form the simulator produces, so
the Gantt charts (``tvm_rtask.viz``) draw it beside the simulation of the same plan, and
:meth:`Timeline.breakdown` and :meth:`Timeline.operator_errors` say where the time went and
how far the cost model was from it.

Record format (``TRACE_WORDS`` int64 each, the same for every backend that traces):
``[kind, program, veu, a, b, start_ns, end_ns, 0]`` with ``kind`` 0 for an rTask (``a`` the
operator's index in the plan's graph, ``b`` its rtask_id), 1 for a wait (llvm: ``a`` the vEU
waited for, ``b`` the step count; CUDA: ``a`` the first pair's vEU or operator, ``b`` the
pairs), 2 for an rProgram call (llvm: one, ``veu`` -1, on the host, launch and join
included; CUDA: one per vEU, from its start to its end inside the kernel). A traced rProgram
runs each rTask on its own (an untraced one runs a vEU's rTasks of an operator in one loop):
the trace adds two clock reads per rTask and per wait, and the untraced build is unchanged.

Clocks: CLOCK_MONOTONIC on llvm; ``%globaltimer`` on CUDA (thread 0 of each vEU, each rTask
ending with ``__syncthreads``), where each rProgram's records are written into a device
buffer of fixed slots and copied to the host by ``main``'s last call
(``tvm_rtask.collect_cuda_trace``, ``backend/cuda/status.py``) while a recording is on.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import native
from ..backend.cuda import status as cuda_host
from ..core import OrdinaryCall, Plan, RProgram
from ..errors import OptionError
from ..policies.simulate import PlanTiming, ProgramTiming, StepTiming, simulate

TRACE_WORDS = 8
RTASK, WAIT, PROGRAM = 0, 1, 2
DEFAULT_CAPACITY = 1 << 20


@dataclass
class Timeline:
    """The records of one traced call of a plan's executable (``records``: int64 array of
    shape ``(n, TRACE_WORDS)``, times in nanoseconds of CLOCK_MONOTONIC)."""

    plan: Plan
    records: np.ndarray
    dropped: int = 0

    def _of(self, kind: int) -> np.ndarray:
        return self.records[self.records[:, 0] == kind]

    @property
    def origin_ns(self) -> int:
        """The first rProgram's start: time 0 of :meth:`timing`."""
        programs = self._of(PROGRAM)
        return int(programs[:, 5].min()) if len(programs) else int(self.records[:, 5].min())

    def timing(self) -> PlanTiming:
        """The measured run as a :class:`PlanTiming` (microseconds from the first rProgram's
        start): per rProgram its launch (from the call to its first rTask or wait), each
        rTask's span, each wait's span; an ordinary call fills the gap between the steps
        around it (it is not traced)."""
        plan = self.plan
        t0 = self.origin_ns
        us = 1e-3
        names = {plan.graph.index(op.name): op.name for op in plan.graph}
        spans: dict[int, list] = {}
        for r in self.records:
            spans.setdefault(int(r[1]), []).append(r)
        steps: list[StepTiming | None] = []
        for k, step in enumerate(plan.steps):
            rec = spans.get(k)
            if not isinstance(step, RProgram) or not rec:
                steps.append(None)
                continue
            steps.append(_program_step(step, k, rec, names, t0, us, plan.vdevice.num_veu))
        # ordinary calls (and untraced steps) between the traced ones
        out: list[StepTiming] = []
        for k, (step, st) in enumerate(zip(plan.steps, steps, strict=True)):
            if st is not None:
                out.append(st)
                continue
            start = out[-1].end_us if out else 0.0
            later = next((s for s in steps[k + 1 :] if s is not None), None)
            end = later.start_us if later is not None else start
            name = step.op if isinstance(step, OrdinaryCall) else f"rprogram_{k}"
            out.append(StepTiming(name, "ordinary", start, max(end, start), 0.0))
        return PlanTiming(out, plan.vdevice.num_veu, plan.ideal_us)

    def breakdown(self) -> dict[str, Any]:
        """Where the time went, per rProgram and in all (microseconds): the call's wall time,
        its launch and join (call minus the vEUs' span), and per vEU the time in rTask
        bodies, in waits and idle (neither: behind the critical path, or after its last
        rTask); the gaps between rPrograms (ordinary calls, the VM)."""
        timing = self.timing()
        programs = []
        for st in timing.steps:
            p = st.program
            if p is None:
                continue
            waits = [
                sum(b - a for v, a, b in p.barrier_spans if v == u) for u in range(len(p.busy_us))
            ]
            programs.append(
                {
                    "name": st.name,
                    "wall_us": st.end_us - st.start_us,
                    "launch_join_us": st.end_us - st.start_us - p.makespan_us,
                    "span_us": p.makespan_us,
                    "busy_us": p.busy_us,
                    "wait_us": waits,
                    "idle_us": [
                        max(0.0, p.makespan_us - b - w)
                        for b, w in zip(p.busy_us, waits, strict=True)
                    ],
                    "rtasks": len(p.spans),
                    "waits": p.num_barriers,
                }
            )
        total = timing.total_us
        wall = sum(p["wall_us"] for p in programs)
        veus = timing.num_veu
        busy = sum(sum(p["busy_us"]) for p in programs)
        wait = sum(sum(p["wait_us"]) for p in programs)
        idle = sum(sum(p["idle_us"]) for p in programs)
        launch = sum(p["launch_join_us"] for p in programs)
        return {
            "total_us": total,
            "programs": programs,
            "gaps_us": total - wall,
            # shares of vEU-time over the whole call (num_veu x total)
            "share": {
                "rtasks": busy / (veus * total) if total else 0.0,
                "waits": wait / (veus * total) if total else 0.0,
                "idle": idle / (veus * total) if total else 0.0,
                "launch_join": launch * veus / (veus * total) if total else 0.0,
                "gaps": (total - wall) * veus / (veus * total) if total else 0.0,
            },
        }

    def operator_errors(self, cost=None) -> dict[str, dict[str, float]]:
        """Per operator: the measured mean rTask time, the cost model's rTask time in the
        simulation of the same plan (``cost``: the analytical model by default) and their
        ratio (simulated / measured): the cost model's error, to calibrate it."""
        measured = _mean_rtask_us(self.timing())
        simulated = _mean_rtask_us(simulate(self.plan, cost=cost))
        out = {}
        for op, m in measured.items():
            s = simulated.get(op)
            if s is None:
                continue
            out[op] = {"measured_us": m, "simulated_us": s, "ratio": s / m if m > 0 else 0.0}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "tvm-rtask timeline 1",
            "words": ["kind", "program", "veu", "a", "b", "start_ns", "end_ns", "reserved"],
            "records": self.records.tolist(),
            "dropped": self.dropped,
            "plan": self.plan.to_dict(),
        }

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def load(cls, path: str) -> Timeline:
        with open(path) as f:
            data = json.load(f)
        if data.get("format") != "tvm-rtask timeline 1":
            raise OptionError(f"{path} is not a tvm-rtask timeline (no 'format' key)")
        records = np.asarray(data["records"], dtype=np.int64).reshape(-1, TRACE_WORDS)
        return cls(Plan.from_dict(data["plan"]), records, int(data.get("dropped", 0)))


def _program_step(
    program: RProgram, k: int, records: list, names: dict[int, str], t0: int, us: float, n: int
) -> StepTiming:
    # one call record (llvm's host) or one per vEU (CUDA): the call spans them all
    calls = [r for r in records if r[0] == PROGRAM]
    inner = [r for r in records if r[0] != PROGRAM]
    start = min(int(r[5]) for r in (calls or inner)) - t0
    end = max(int(r[6]) for r in (calls or inner)) - t0
    first = min((int(r[5]) - t0 for r in inner), default=start)
    last = max((int(r[6]) - t0 for r in inner), default=first)
    base = first
    busy = [0.0] * n
    wait = [0.0] * n
    spans = {}
    barrier_spans = []
    for r in inner:
        kind, veu, a, b = int(r[0]), int(r[2]), int(r[3]), int(r[4])
        s, e = (int(r[5]) - t0 - base) * us, (int(r[6]) - t0 - base) * us
        if kind == RTASK:
            spans[(names[a], b)] = (veu, s, e)
            busy[veu] += e - s
        elif kind == WAIT:
            barrier_spans.append((veu, s, e))
            wait[veu] += e - s
    timing = ProgramTiming(
        makespan_us=(last - first) * us,
        busy_us=busy,
        launch_us=(first - start) * us,
        barrier_us=0.0,
        spans=spans,
        barrier_spans=barrier_spans,
        wait_us=wait,
        num_barriers=len(barrier_spans),
    )
    name = program.name or f"rprogram_{k}"
    return StepTiming(name, "rprogram", start * us, end * us, (first - start) * us, timing)


def _mean_rtask_us(timing: PlanTiming) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for st in timing.steps:
        if st.program is None:
            continue
        for (op, _), (_, a, b) in st.program.spans.items():
            sums.setdefault(op, []).append(b - a)
    return {op: sum(v) / len(v) for op, v in sums.items()}


def start(capacity: int = DEFAULT_CAPACITY) -> None:
    """Start recording into an empty buffer of ``capacity`` records (llvm; CUDA's records
    have their own slots on the device and are all kept)."""
    if native.load().tvm_rtask_trace_reset(int(capacity)) != 0:
        raise MemoryError(f"tvm-rtask: no memory for a timeline of {capacity} records")
    cuda_host.start_trace()


def stop() -> tuple[np.ndarray, int]:
    """Stop recording: the records held and the count of records dropped (buffer full)."""
    lib = native.load()
    n = int(lib.tvm_rtask_trace_count())
    dropped = int(lib.tvm_rtask_trace_dropped())
    out = np.zeros((n, TRACE_WORDS), dtype=np.int64)
    if n:
        lib.tvm_rtask_trace_copy(out.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), n)
    lib.tvm_rtask_trace_reset(0)
    cuda = [r.reshape(-1, TRACE_WORDS) for r in cuda_host.stop_trace()]
    return np.concatenate([out, *cuda]) if cuda else out, dropped


def trace_call(
    call: Callable[[], Any], plan: Plan, warmup: int = 3, capacity: int = DEFAULT_CAPACITY
) -> Timeline:
    """Call ``call()`` (one inference of an executable built from ``plan`` with
    ``trace=True``) ``warmup`` times untraced, then once recording; its :class:`Timeline`.

    Raises ``OptionError`` when the plan was not built with ``trace=True`` (nothing would
    be recorded)."""
    if not plan.options.get("trace"):
        raise OptionError("trace_call needs an executable built with trace=True")
    for _ in range(warmup):
        call()
    start(capacity)
    try:
        call()
    finally:
        records, dropped = stop()
    if dropped:
        import logging

        logging.getLogger("tvm_rtask").warning(
            "timeline: %d records dropped (capacity %d): pass a larger capacity", dropped, capacity
        )
    return Timeline(plan, records, dropped)
