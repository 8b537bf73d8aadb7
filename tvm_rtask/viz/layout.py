"""The Gantt layout: bars, waits, calls, legend and concurrency of a simulated plan, computed
without drawing (the PNG and the SVG draw the same layout)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall, Plan
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from ..errors import OptionError
from ..policies.cost import AnalyticalCostModel, CostModel
from ..policies.simulate import PlanTiming, simulate
from .colours import (
    _WAVE_PALETTE,
    COLOR_BY,
    KIND_COLOURS,
    KINDS,
    LAUNCH_COLOUR,
    WAIT_COLOUR,
    _bar_colour,
    _distinct,
    _mix,
    _pale,
    operator_kind,
)


@dataclass(frozen=True)
class GanttBar:
    """One rTask as drawn: ``start_us``/``end_us`` on the plan's time line."""

    op: str
    rtask_id: int
    veu: int
    start_us: float
    end_us: float
    program: str
    wave: int
    kind: str
    colour: str


@dataclass(frozen=True)
class GanttWait:
    """A barrier on the vEU that waits: it arrives at ``start_us``, is released at
    ``end_us``; ``wait_us`` of that is waiting for other vEUs, the rest the barrier's cost."""

    veu: int
    start_us: float
    end_us: float
    wait_us: float


@dataclass(frozen=True)
class GanttCall:
    """An ordinary call (or, with ``kind="launch"``, a kernel launch) over all rows."""

    op: str
    start_us: float
    end_us: float
    kind: str
    colour: str


@dataclass(frozen=True)
class LegendEntry:
    """``what`` is ``operator`` (a named operator: ``op``, ``rank``), ``kind`` (a kind, or the
    unnamed operators of a kind), ``wave`` or ``mark`` (waits, releases, launches)."""

    label: str
    colour: str
    what: str
    op: str | None = None
    rank: int | None = None


@dataclass
class GanttLayout:
    """Everything a Gantt chart draws, in plan time (microseconds); no drawing library."""

    timing: PlanTiming
    title: str
    subtitle: str
    color_by: str
    window: tuple[float, float]
    veus: list[int]
    num_veu: int
    bars: list[GanttBar]
    waits: list[GanttWait]
    releases: list[tuple[int, float]]
    calls: list[GanttCall]
    launches: list[GanttCall]
    labelled: list[str]
    """The named operators, largest first (their rank is the position + 1)."""
    op_time_us: dict[str, float]
    """rTask time per operator in view (drawn vEUs, clipped to the window)."""
    colours: dict[str, str]
    """Colour per operator (``color_by="wave"``: the colour of its legend entry)."""
    kinds: dict[str, str]
    legend: list[LegendEntry]
    concurrency: list[tuple[float, int]] = field(default_factory=list)
    """``(t, n)``: from ``t`` on, ``n`` operators run (all vEUs), until the next point."""
    measured: bool = False
    """A measured timeline (``runtime.trace``), not the simulation."""

    @property
    def time_axis(self) -> str:
        return "time (us, measured)" if self.measured else "time (us, simulated)"

    @property
    def hidden_veus(self) -> int:
        """vEUs not drawn (``max_veus``)."""
        return self.num_veu - len(self.veus)

    @property
    def rows(self) -> dict[int, int]:
        """vEU -> row (0 at the top)."""
        return {v: r for r, v in enumerate(self.veus)}

    @property
    def max_side_by_side(self) -> int:
        return max((n for _, n in self.concurrency), default=0)

    def rank(self, op: str) -> int | None:
        """1 for the largest named operator, None for an unnamed one."""
        try:
            return self.labelled.index(op) + 1
        except ValueError:
            return None

    def wait_us(self, veu: int) -> float:
        """Time vEU ``veu`` spends in barriers inside the window (waiting and their cost)."""
        t0, t1 = self.window
        return sum(
            max(0.0, min(w.end_us, t1) - max(w.start_us, t0)) for w in self.waits if w.veu == veu
        )

    def tooltip(self, bar: GanttBar) -> str:
        """What hovering an rTask says (SVG ``<title>``)."""
        return (
            f"{bar.op} rTask {bar.rtask_id} ({bar.kind}, wave {bar.wave}) on vEU {bar.veu}: "
            f"start {bar.start_us:.2f} us, end {bar.end_us:.2f} us "
            f"({bar.end_us - bar.start_us:.2f} us), {bar.program}"
        )


def _steps_of(
    plan_or_program: Plan | RProgram | Sequence[RProgram | OrdinaryCall],
    graph: RGraph | None,
    vdevice: VDevice | None,
    title: str | None,
) -> tuple[list[RProgram | OrdinaryCall], RGraph, VDevice, str]:
    if isinstance(plan_or_program, Plan):
        graph = graph or plan_or_program.graph
        vdevice = vdevice or plan_or_program.vdevice
        steps = list(plan_or_program.steps)
        title = title or f"{plan_or_program.policy or 'plan'} on {vdevice.spec.name}"
    elif isinstance(plan_or_program, RProgram):
        steps = [plan_or_program]
    else:
        steps = list(plan_or_program)
    if graph is None or vdevice is None:
        raise OptionError("gantt needs graph= and vdevice= unless it is given a Plan")
    return steps, graph, vdevice, title or "rProgram"


def _check_options(color_by: str, labels: int, max_veus: int | None) -> None:
    if color_by not in COLOR_BY:
        raise OptionError(f"gantt: color_by={color_by!r} is not one of {COLOR_BY}")
    if not isinstance(labels, int) or labels < 0:
        raise OptionError(f"gantt: labels={labels!r} must be an int >= 0")
    if max_veus is not None and (not isinstance(max_veus, int) or max_veus < 1):
        raise OptionError(f"gantt: max_veus={max_veus!r} must be an int >= 1 (or None: all)")


def _window(
    timing: PlanTiming,
    window: tuple[float, float] | None,
    program: int | None,
) -> tuple[tuple[float, float], str]:
    """The time window drawn and a note saying what was zoomed to."""
    total = timing.total_us
    t0, t1, note = 0.0, max(total, 1e-9), ""
    if program is not None:
        progs = [s for s in timing.steps if s.program is not None]
        if not isinstance(program, int) or not -len(progs) <= program < len(progs):
            raise OptionError(
                f"gantt: program={program!r} but the plan has {len(progs)} rPrograms "
                f"(0..{len(progs) - 1})"
            )
        st = progs[program]
        t0, t1 = st.start_us, max(st.end_us, st.start_us + 1e-9)
        note = f"rProgram {program % len(progs)} ({st.name})"
    if window is not None:
        try:
            w0, w1 = (float(x) for x in window)
        except (TypeError, ValueError):
            raise OptionError(f"gantt: window={window!r} must be (t0_us, t1_us)") from None
        if not (math.isfinite(w0) and math.isfinite(w1)) or w1 <= w0:
            raise OptionError(f"gantt: window={window!r} needs finite t0_us < t1_us")
        if program is None:
            t0, t1 = w0, w1
        else:
            t0, t1 = max(t0, w0), min(t1, w1)
        if t1 <= t0:
            raise OptionError(f"gantt: window={window!r} does not overlap {note}")
        note = (note + ", " if note else "") + f"window {w0:g}-{w1:g} us"
    return (t0, t1), note


def gantt_layout(
    plan_or_program: Plan | RProgram | Sequence[RProgram | OrdinaryCall],
    graph: RGraph | None = None,
    vdevice: VDevice | None = None,
    cost: CostModel | None = None,
    title: str | None = None,
    *,
    color_by: str = "operator",
    labels: int = 12,
    window: tuple[float, float] | None = None,
    program: int | None = None,
    max_veus: int | None = None,
    timing: PlanTiming | None = None,
) -> GanttLayout:
    """Simulate a plan and lay its Gantt chart out (see the module's doc for the options).
    ``timing``: a measured timeline of the plan (``runtime.trace.Timeline.timing()``) drawn
    instead of the simulation."""
    _check_options(color_by, labels, max_veus)
    steps, graph, vdevice, title = _steps_of(plan_or_program, graph, vdevice, title)
    sync = plan_or_program.sync if isinstance(plan_or_program, Plan) else "steps"
    measured = timing is not None
    if timing is None:
        timing = simulate(steps, graph, vdevice, cost or AnalyticalCostModel(), sync)
    (t0, t1), zoom = _window(timing, window, program)
    n = vdevice.num_veu
    veus = list(range(n if max_veus is None else min(n, max_veus)))
    drawn = set(veus)

    def inside(a: float, b: float) -> bool:
        return b > t0 and a < t1 or a == b and t0 <= a <= t1

    def clipped(a: float, b: float) -> float:
        return max(0.0, min(b, t1) - max(a, t0))

    # rTasks, waits, releases, calls and launches in view; operator times and concurrency
    raw: list[tuple] = []
    waits: list[GanttWait] = []
    releases: list[tuple[int, float]] = []
    calls: list[tuple[str, float, float]] = []
    launches: list[GanttCall] = []
    op_time: dict[str, float] = {}
    events: list[tuple[float, int, str]] = []
    for step, st in zip(steps, timing.steps, strict=True):
        if st.launch_us > 0 and inside(st.start_us, st.run_start_us):
            launches.append(GanttCall(st.name, st.start_us, st.run_start_us, "launch", ""))
        if st.program is None:
            if inside(st.run_start_us, st.end_us):
                calls.append((st.name, st.run_start_us, st.end_us))
                d = clipped(st.run_start_us, st.end_us)
                op_time[st.name] = op_time.get(st.name, 0.0) + d * len(veus)
                events += [(st.run_start_us, 1, st.name), (st.end_us, -1, st.name)]
            continue
        base = st.run_start_us
        waves = {t.key: t.wave for t in step.tasks()} if isinstance(step, RProgram) else {}
        for key, (v, a, b) in st.program.spans.items():
            a, b = base + a, base + b
            if not inside(a, b):
                continue
            if b > a:
                events += [(a, 1, key[0]), (b, -1, key[0])]
            if v in drawn:
                raw.append((key[0], key[1], v, a, b, st.name, waves.get(key, 0)))
                op_time[key[0]] = op_time.get(key[0], 0.0) + clipped(a, b)
        nb = st.program.num_barriers
        fixed = st.program.barrier_us / nb if nb else 0.0
        for v, a, b in st.program.barrier_spans:
            a, b = base + a, base + b
            if v in drawn and b > a and inside(a, b):
                waits.append(GanttWait(v, a, b, max(0.0, b - a - fixed)))
            if v in drawn and t0 <= b <= t1:
                releases.append((v, b))

    kinds = {op: operator_kind(graph.op(op)) for op in op_time}
    labelled = sorted(op_time, key=lambda o: (-op_time[o], graph.index(o)))[:labels]
    colours, legend = _colours(color_by, labelled, op_time, kinds, raw)
    bars = [
        GanttBar(o, i, v, a, b, p, w, kinds[o], _bar_colour(color_by, colours, o, w))
        for o, i, v, a, b, p, w in raw
    ]
    ordinary = [
        GanttCall(o, a, b, kinds[o], "#a0a0a0" if color_by == "wave" else colours[o])
        for o, a, b in calls
    ]
    legend += [
        LegendEntry("barrier wait (hatched)", WAIT_COLOUR, "mark"),
        LegendEntry("barrier release", "#000000", "mark"),
    ]
    if launches:
        legend.append(LegendEntry("kernel launch", LAUNCH_COLOUR, "mark"))

    s = timing.summary()
    heading = (
        f"{title}: {s['total_us']:.1f} us {'measured' if measured else 'simulated'} "
        f"(ideal {s['ideal_us']:.1f}), "
        f"{s['launches']} launches, {s['barriers']} barriers, "
        f"utilisation {100 * s['utilisation']:.0f}%"
    )
    concurrency = _concurrency(events)
    layout = GanttLayout(
        timing=timing,
        title=heading,
        subtitle="",
        color_by=color_by,
        window=(t0, t1),
        veus=veus,
        num_veu=n,
        bars=bars,
        waits=waits,
        releases=releases,
        calls=ordinary,
        launches=launches,
        labelled=labelled,
        op_time_us=op_time,
        colours=colours,
        kinds=kinds,
        legend=legend,
        concurrency=concurrency,
        measured=measured,
    )
    busy = sum(op_time.values())
    waited = sum(layout.wait_us(v) for v in veus)
    parts = [zoom] if zoom else []
    parts.append(
        f"{len(op_time)} operators in view, up to {layout.max_side_by_side} side by side, "
        f"{_pct(waited / max(busy + waited, 1e-12))} of vEU time in barriers"
    )
    if layout.hidden_veus:
        parts.append(
            f"vEUs 0-{len(veus) - 1} of {n} drawn, {layout.hidden_veus} vEUs hidden "
            f"(max_veus={max_veus})"
        )
    layout.subtitle = "; ".join(parts)
    return layout


def _concurrency(events: list[tuple[float, int, str]]) -> list[tuple[float, int]]:
    """Distinct operators running, as a step function (ends before starts at equal times)."""
    events.sort(key=lambda e: (e[0], e[1]))
    active: dict[str, int] = {}
    out: list[tuple[float, int]] = []
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            _, d, op = events[i]
            c = active.get(op, 0) + d
            if c:
                active[op] = c
            else:
                active.pop(op, None)
            i += 1
        if not out or out[-1][1] != len(active):
            out.append((t, len(active)))
    return out


def _pct(x: float) -> str:
    """A fraction as a percentage, with a decimal below 10% so that small ones do not read 0."""
    p = 100 * x
    return f"{p:.1f}%" if 0 < p < 10 else f"{p:.0f}%"


def _ops(n: int) -> str:
    return f"{n} operator" + ("" if n == 1 else "s")


def _short(op: str, width: int = 40) -> str:
    if len(op) <= width:
        return op
    half = (width - 1) // 2
    return op[:half] + "\u2026" + op[-(width - 1 - half) :]


def _legend_label(op: str, rank: int, kind: str, share: float) -> str:
    return f"#{rank} {_short(op)} ({kind}, {100 * share:.1f}%)"


def _colours(
    color_by: str,
    labelled: list[str],
    op_time: dict[str, float],
    kinds: dict[str, str],
    raw: list[tuple],
) -> tuple[dict[str, str], list[LegendEntry]]:
    """Colour per operator and the legend's colour entries."""
    total = sum(op_time.values()) or 1.0
    named = set(labelled)
    colours: dict[str, str] = {}
    legend: list[LegendEntry] = []
    unnamed: dict[str, int] = {}
    for op in op_time:
        if op not in named:
            unnamed[kinds[op]] = unnamed.get(kinds[op], 0) + 1
    if color_by == "operator":
        pale = {k: _pale(c) for k, c in KIND_COLOURS.items()}
        for op, c in zip(labelled, _distinct(len(labelled), set(pale.values())), strict=True):
            colours[op] = c
        for op in op_time:
            colours.setdefault(op, pale[kinds[op]])
        for r, op in enumerate(labelled, 1):
            legend.append(
                LegendEntry(
                    _legend_label(op, r, kinds[op], op_time[op] / total),
                    colours[op],
                    "operator",
                    op,
                    r,
                )
            )
        for k in KINDS:
            if unnamed.get(k):
                legend.append(
                    LegendEntry(
                        f"{unnamed[k]} more {k} operator{'s' if unnamed[k] > 1 else ''}"
                        if k != "other"
                        else f"{_ops(unnamed[k])} of other kinds",
                        pale[k],
                        "kind",
                    )
                )
    elif color_by == "kind":
        # named operators get distinct shades of their kind (dark to light), the others the
        # kind's pale tone, so that colours never repeat among the named ones
        by_kind: dict[str, list[str]] = {}
        for op in labelled:
            by_kind.setdefault(kinds[op], []).append(op)
        for k, ops in by_kind.items():
            m = len(ops)
            for j, op in enumerate(ops):
                f = -0.45 + 0.8 * j / (m - 1) if m > 1 else 0.0
                base = KIND_COLOURS[k]
                colours[op] = (
                    _mix(base, "#000000", -f) if f < 0 else _mix(base, "#ffffff", f * 0.45)
                )
        seen: set[str] = set()
        for op in labelled:  # rounding could merge two shades: give the later one a new colour
            if colours[op] in seen:
                colours[op] = _distinct(1, seen | set(colours.values()))[0]
            seen.add(colours[op])
        for op in op_time:
            colours.setdefault(op, _pale(KIND_COLOURS[kinds[op]]))
        kind_time: dict[str, float] = {}
        for op, t in op_time.items():
            kind_time[kinds[op]] = kind_time.get(kinds[op], 0.0) + t
        for k in KINDS:
            if k in kind_time:
                count = sum(1 for o in op_time if kinds[o] == k)
                legend.append(
                    LegendEntry(
                        f"{k}: {_ops(count)}, {100 * kind_time[k] / total:.1f}%",
                        KIND_COLOURS[k],
                        "kind",
                    )
                )
        for r, op in enumerate(labelled, 1):
            legend.append(
                LegendEntry(
                    _legend_label(op, r, kinds[op], op_time[op] / total),
                    colours[op],
                    "operator",
                    op,
                    r,
                )
            )
    else:  # wave
        waves = sorted({w for *_, w in raw})
        for w in waves[: len(_WAVE_PALETTE)]:
            legend.append(LegendEntry(f"wave {w}", _WAVE_PALETTE[w % len(_WAVE_PALETTE)], "wave"))
        if len(waves) > len(_WAVE_PALETTE):
            legend.append(
                LegendEntry(
                    f"... {len(waves)} waves, colours cycle every {len(_WAVE_PALETTE)}",
                    "#ffffff",
                    "wave",
                )
            )
        first_wave: dict[str, int] = {}
        for o, _, _, _, _, _, w in raw:
            first_wave[o] = min(first_wave.get(o, w), w)
        for op in op_time:
            w = first_wave.get(op)
            colours[op] = "#a0a0a0" if w is None else _WAVE_PALETTE[w % len(_WAVE_PALETTE)]
        for r, op in enumerate(labelled, 1):
            legend.append(
                LegendEntry(
                    _legend_label(op, r, kinds[op], op_time[op] / total), "", "operator", op, r
                )
            )
    return colours, legend
