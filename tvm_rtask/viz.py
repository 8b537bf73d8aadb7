"""Pictures of plans: Gantt charts of the simulated run, one row per vEU.

:func:`gantt` writes a PNG (matplotlib's object API on the Agg canvas directly, no
``pyplot``: it works without a display and leaves the caller's matplotlib backend alone),
:func:`gantt_svg` a self-contained SVG in which hovering a bar names the rTask. Both draw
the same :class:`GanttLayout`, which :func:`gantt_layout` computes without drawing:

- each rTask is a bar on its vEU's row; the ``labels`` largest operators (by simulated time
  in view) are named in the legend and numbered on their bars, with colours that do not
  repeat; ``color_by`` colours by operator (the rest in pale tones of their kind), by
  operator kind (:data:`KINDS`, from :func:`operator_kind`) or by wave;
- barrier waits are hatched grey bars on the vEU that waits (widened to a few pixels where
  they would be thinner, so that they stay visible on long plans), a black tick marks where
  the barrier releases; rows are alternately shaded, kernel launches shaded columns, ordinary
  calls hatched bars over all rows;
- a strip under the rows counts the operators running at each moment (side by side);
- ``window=(t0_us, t1_us)`` or ``program=k`` zooms, ``max_veus`` caps the rows drawn (the
  chart says how many are hidden).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from .core.graph import RGraph, ROperator
from .core.plan import OrdinaryCall, Plan
from .core.rprogram import RProgram
from .core.vdevice import VDevice
from .errors import OptionError
from .schedule.cost import AnalyticalCostModel, CostModel
from .schedule.simulate import PlanTiming, simulate

__all__ = [
    "COLOR_BY",
    "KINDS",
    "GanttBar",
    "GanttCall",
    "GanttLayout",
    "GanttWait",
    "LegendEntry",
    "gantt",
    "gantt_figure",
    "gantt_layout",
    "gantt_svg",
    "operator_kind",
]

KINDS = ("conv", "matmul", "pool", "elementwise", "reduction", "concat", "other")
"""Operator kinds of ``color_by="kind"``, in the order a fused name is searched for them."""

COLOR_BY = ("operator", "kind", "wave")

KIND_COLOURS = {
    "conv": "#4c78a8",
    "matmul": "#8e5ca8",
    "pool": "#3a9a3a",
    "elementwise": "#f58518",
    "reduction": "#d64545",
    "concat": "#2aa3a3",
    "other": "#b8a235",
}

# Distinct colours for named operators, most distinguishable first: tab10 without its grey
# (grey is the waits' colour), then the dark and middle tones of tab20b and tab20c.
_OPERATOR_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
    "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252",
    "#bd9e39", "#ad494a", "#a55194", "#6b6ecf", "#b5cf6b", "#e7ba52", "#d6616b", "#ce6dbd",
    "#3182bd", "#e6550d", "#31a354", "#756bb1", "#6baed6", "#fd8d3c", "#74c476", "#9e9ac8",
)  # fmt: skip

# Waves: neighbouring waves never share a colour (the palette cycles after twelve).
_WAVE_PALETTE = (
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2",
    "#eeca3b", "#9d755d", "#ff9da6", "#1f3f8f", "#8c9e1a", "#6f3fa0",
)  # fmt: skip

WAIT_COLOUR = "#c8c8c8"
WAIT_EDGE = "#505050"
ROW_SHADE = "#e9edf3"
LAUNCH_COLOUR = "#fbe2bd"
MIN_WAIT_PX = 2.5
"""Waits narrower than this many pixels are drawn this wide (they would vanish otherwise)."""

_CONV = re.compile(r"^(conv|deconv)")
_MATMUL = {"matmul", "dense", "linear", "gemm", "bmm", "mm", "einsum", "gemv", "batchmatmul"}
_REDUCTION = {
    "sum", "mean", "max", "min", "prod", "argmax", "argmin", "variance", "var", "std",
    "softmax", "logsumexp", "norm", "cumsum", "cumprod", "all", "any",
}  # fmt: skip
_ELEMENTWISE = {
    "add", "subtract", "sub", "multiply", "mul", "divide", "div", "relu", "relu6", "sigmoid",
    "tanh", "exp", "log", "sqrt", "rsqrt", "power", "pow", "maximum", "minimum", "clip",
    "erf", "gelu", "silu", "swish", "negative", "abs", "where", "cast", "astype", "floor",
    "ceil", "round", "square", "leakyrelu", "leaky", "hardswish", "hardsigmoid", "prelu",
    "elu", "selu", "softplus", "bias", "scale", "equal", "less", "greater", "not", "and",
    "or", "logical", "bitwise", "sin", "cos", "reciprocal", "sign", "mod", "floor_divide",
}  # fmt: skip


def operator_kind(op: ROperator | str, pattern: str = "opaque") -> str:
    """The kind of an rOperator (one of :data:`KINDS`), from its function name, else its
    pattern.

    A fused function name is searched for the kinds in :data:`KINDS` order, so
    ``fused_conv2d_add_relu`` is ``conv`` and ``fused_matmul_add`` ``matmul``; without a
    known name an ``elemwise``/``broadcast`` pattern is ``elementwise`` and ``reduce`` is
    ``reduction``. A string is read as a function name with the given ``pattern``.
    """
    if isinstance(op, ROperator):
        name, pattern = op.func or op.name, op.pattern
    else:
        name = op
    tokens = [re.sub(r"\d+$", "", t) for t in re.split(r"[^a-z0-9]+", name.lower()) if t]
    tokens = [t for t in tokens if t]
    if any(_CONV.match(t) for t in tokens):
        return "conv"
    if any(t in _MATMUL for t in tokens):
        return "matmul"
    if any("pool" in t for t in tokens):
        return "pool"
    if any(t.startswith("concat") for t in tokens):
        return "concat"
    if any(t in _REDUCTION for t in tokens):
        return "reduction"
    if any(t in _ELEMENTWISE for t in tokens):
        return "elementwise"
    if pattern in ("elemwise", "broadcast"):
        return "elementwise"
    if pattern == "reduce":
        return "reduction"
    return "other"


# -- layout -----------------------------------------------------------------------------------


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
) -> GanttLayout:
    """Simulate a plan and lay its Gantt chart out (see the module's doc for the options)."""
    _check_options(color_by, labels, max_veus)
    steps, graph, vdevice, title = _steps_of(plan_or_program, graph, vdevice, title)
    sync = plan_or_program.sync if isinstance(plan_or_program, Plan) else "steps"
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
        f"{title}: {s['total_us']:.1f} us simulated (ideal {s['ideal_us']:.1f}), "
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


def _mix(colour: str, other: str, f: float) -> str:
    """``colour`` moved a fraction ``f`` towards ``other`` (hex colours)."""
    a = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    b = [int(other[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b, strict=True))


def _pale(colour: str) -> str:
    return _mix(colour, "#ffffff", 0.62)


def _distinct(n: int, taken: set[str]) -> list[str]:
    """``n`` colours, none in ``taken`` nor repeated: the palette, then golden-ratio hues."""
    import colorsys

    out: list[str] = []
    for c in _OPERATOR_PALETTE:
        if len(out) == n:
            return out
        if c not in taken:
            out.append(c)
    k = 0
    while len(out) < n:
        h = (k * 0.618033988749895) % 1.0
        light = (0.38, 0.5, 0.3)[(k // 7) % 3]
        r, g, b = colorsys.hls_to_rgb(h, light, 0.75)
        c = "#" + "".join(f"{round(255 * x):02x}" for x in (r, g, b))
        k += 1
        if c not in taken and c not in out:
            out.append(c)
    return out


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


def _bar_colour(color_by: str, colours: dict[str, str], op: str, wave: int) -> str:
    if color_by == "wave":
        return _WAVE_PALETTE[wave % len(_WAVE_PALETTE)]
    return colours[op]


def _text_colour(colour: str) -> str:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"


# -- PNG (matplotlib) ---------------------------------------------------------------------------


def gantt_figure(
    plan_or_program: Plan | RProgram | Sequence[RProgram | OrdinaryCall],
    graph: RGraph | None = None,
    vdevice: VDevice | None = None,
    cost: CostModel | None = None,
    title: str | None = None,
    dpi: int = 100,
    *,
    color_by: str = "operator",
    labels: int = 12,
    window: tuple[float, float] | None = None,
    program: int | None = None,
    max_veus: int | None = None,
    concurrency: bool = True,
    width: float = 14.0,
):
    """The matplotlib ``Figure`` of :func:`gantt` (Agg canvas attached) and its layout.

    The rows' axes is ``fig.axes[0]`` (wait bars have gid ``"wait"``, row shading
    ``"row-shade"``, rTask bars ``"rtask"``), the concurrency strip ``fig.axes[1]``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lay = gantt_layout(
        plan_or_program,
        graph,
        vdevice,
        cost,
        title,
        color_by=color_by,
        labels=labels,
        window=window,
        program=program,
        max_veus=max_veus,
    )
    t0, t1 = lay.window
    rows = len(lay.veus)
    row_of = lay.rows
    legend_lines = len(lay.legend)
    label_chars = max((len(e.label) for e in lay.legend), default=10)
    legend_w = min(0.058 * label_chars + 0.6, width * 0.4)
    rows_in = min(max(1.5, 0.22 * rows), 34.0)
    strip_in = 0.7 if concurrency else 0.0
    height = min(max(rows_in + strip_in + 1.4, 0.165 * legend_lines + 0.8), 40.0)
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    if concurrency:
        ax, ax2 = fig.subplots(
            2, 1, sharex=True, height_ratios=[rows_in, strip_in], gridspec_kw={"hspace": 0.02}
        )
    else:
        ax, ax2 = fig.subplots(1, 1), None
    axes_px = max(50.0, (width - legend_w - 1.1) * dpi)
    us_per_px = (t1 - t0) / axes_px
    row_px = rows_in * dpi / max(rows, 1)
    bar_h = 0.8

    for r in range(1, rows, 2):  # alternate rows shaded
        ax.axhspan(r - 0.5, r + 0.5, color=ROW_SHADE, lw=0, zorder=0, gid="row-shade")
    for c in lay.launches:
        ax.axvspan(c.start_us, c.end_us, color=LAUNCH_COLOUR, lw=0, zorder=0.5)
    for c in lay.calls:
        ax.barh(
            (rows - 1) / 2,
            c.end_us - c.start_us,
            left=c.start_us,
            height=rows,
            color=c.colour,
            hatch="xx",
            edgecolor="0.3",
            lw=0.5,
            zorder=1,
        )
    if lay.bars:
        cont = ax.barh(
            [row_of[b.veu] for b in lay.bars],
            [b.end_us - b.start_us for b in lay.bars],
            left=[b.start_us for b in lay.bars],
            height=bar_h,
            color=[b.colour for b in lay.bars],
            edgecolor="white" if rows <= 64 else "none",
            lw=0.4,
            zorder=2,
        )
        for p in cont:
            p.set_gid("rtask")
    if lay.waits:
        widths = [max(w.end_us - w.start_us, MIN_WAIT_PX * us_per_px) for w in lay.waits]
        cont = ax.barh(
            [row_of[w.veu] for w in lay.waits],
            widths,
            left=[w.start_us for w in lay.waits],
            height=bar_h * 0.55,
            color=WAIT_COLOUR,
            edgecolor=WAIT_EDGE,
            hatch="////",
            lw=0.3,
            zorder=3,
        )
        for p in cont:
            p.set_gid("wait")
    if lay.releases:
        ax.scatter(
            [t for _, t in lay.releases],
            [row_of[v] for v, _ in lay.releases],
            marker="|",
            s=max(12.0, min(120.0, (0.9 * row_px) ** 2 / 4)),
            c="black",
            linewidths=1.0,
            zorder=4,
        )
    _rank_labels(ax, lay, us_per_px, row_px, dpi)

    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_xlim(t0, t1)
    ax.set_ylabel("vEU")
    if rows <= 16:
        ax.set_yticks(
            range(rows),
            [
                f"vEU {v}\n{_pct(lay.wait_us(v) / (t1 - t0))} in barriers"
                if rows <= 4
                else f"vEU {v} ({_pct(lay.wait_us(v) / (t1 - t0))} barr.)"
                for v in lay.veus
            ],
            fontsize=8,
        )
    elif rows <= 48:
        ax.set_yticks(range(rows), [str(v) for v in lay.veus], fontsize=7)
    ax.set_title(lay.title + "\n" + lay.subtitle, fontsize=9.5, loc="left")
    if lay.hidden_veus:
        ax.text(
            1.0,
            -0.5,
            f"+{lay.hidden_veus} vEUs not drawn",
            transform=ax.get_yaxis_transform(),
            ha="right",
            va="bottom",
            fontsize=8,
            color="#b00000",
        )
    if ax2 is not None:
        pts = lay.concurrency
        if pts:
            xs = [t for t, _ in pts] + [max(pts[-1][0], t1)]
            ys = [n for _, n in pts] + [pts[-1][1]]
            ax2.fill_between(xs, ys, step="post", color="#4c78a8", alpha=0.55, lw=0)
            ax2.step(xs, ys, where="post", color="#2b4f7a", lw=0.8)
        top = max(lay.max_side_by_side, 1)
        ax2.set_ylim(0, top + 0.5)
        ax2.set_yticks(sorted({0, top} if top > 2 else {0, 1, top}))
        ax2.set_ylabel("ops\nrunning", fontsize=8)
        ax2.tick_params(labelsize=8)
        ax2.grid(axis="y", color="0.85", lw=0.5)
        ax2.set_xlabel("time (us, simulated)")
        ax2.set_xlim(t0, t1)
    else:
        ax.set_xlabel("time (us, simulated)")

    handles = []
    for e in lay.legend:
        if e.label == "barrier release":
            handles.append(Line2D([], [], color="black", marker="|", ls="", label=e.label))
        elif e.label.startswith("barrier wait"):
            handles.append(
                Patch(facecolor=WAIT_COLOUR, edgecolor=WAIT_EDGE, hatch="////", label=e.label)
            )
        elif not e.colour:
            handles.append(Line2D([], [], ls="", label=e.label))
        else:
            handles.append(Patch(facecolor=e.colour, edgecolor="none", label=e.label))
    fig.legend(
        handles=handles,
        loc="outside right upper",
        fontsize=7.5,
        frameon=False,
        handlelength=1.4,
        title=f"largest operators by time (color_by={lay.color_by})" if lay.labelled else None,
        title_fontsize=8,
        alignment="left",
    )
    return fig, lay


def _rank_labels(ax, lay: GanttLayout, us_per_px: float, row_px: float, dpi: int) -> None:
    """Write each named operator's rank on its bars where it fits (at most 400 labels)."""
    if row_px < 8:
        return
    t0, t1 = lay.window
    row_of = lay.rows
    size = min(8.0, row_px * 0.45 * 72 / dpi)
    drawn = 0
    for b in lay.bars:
        r = lay.rank(b.op)
        if r is None:
            continue
        text = f"#{r}"
        a, e = max(b.start_us, t0), min(b.end_us, t1)
        if (e - a) / us_per_px < len(text) * size * 0.65 * dpi / 72 + 4:
            continue
        ax.text(
            (a + e) / 2,
            row_of[b.veu],
            text,
            ha="center",
            va="center",
            fontsize=size,
            color=_text_colour(b.colour),
            zorder=5,
            clip_on=True,
        )
        drawn += 1
        if drawn >= 400:
            return


def gantt(
    plan_or_program: Plan | RProgram | Sequence[RProgram | OrdinaryCall],
    path: str | os.PathLike,
    graph: RGraph | None = None,
    vdevice: VDevice | None = None,
    cost: CostModel | None = None,
    title: str | None = None,
    dpi: int = 100,
    *,
    color_by: str = "operator",
    labels: int = 12,
    window: tuple[float, float] | None = None,
    program: int | None = None,
    max_veus: int | None = None,
    concurrency: bool = True,
) -> PlanTiming:
    """Write a Gantt chart of the simulated run of a plan (or one rProgram) to ``path``:
    a PNG, or the hover SVG of :func:`gantt_svg` where ``path`` ends in ``.svg``.

    ``graph`` and ``vdevice`` are needed unless a Plan is given; ``cost`` defaults to the
    analytical model. ``color_by``: ``"operator"`` (the ``labels`` largest operators in
    distinct colours, the others pale by kind), ``"kind"`` or ``"wave"``; ``window=(t0_us,
    t1_us)`` or ``program=k`` (the k-th rProgram) zooms; ``max_veus`` caps the rows drawn;
    ``concurrency`` adds the strip counting operators running side by side. Returns the
    simulated timing.
    """
    opts = dict(color_by=color_by, labels=labels, window=window, program=program, max_veus=max_veus)
    if os.fspath(path).lower().endswith(".svg"):
        return gantt_svg(
            plan_or_program, path, graph, vdevice, cost, title, concurrency=concurrency, **opts
        )
    fig, lay = gantt_figure(
        plan_or_program, graph, vdevice, cost, title, dpi, concurrency=concurrency, **opts
    )
    fig.savefig(os.fspath(path), format="png")
    return lay.timing


# -- SVG --------------------------------------------------------------------------------------


def _nice_ticks(t0: float, t1: float, target: int = 8) -> list[float]:
    span = t1 - t0
    if span <= 0:
        return [t0]
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(t0 / step) * step
    return [first + i * step for i in range(int((t1 - first) / step + 1e-9) + 1)]


def gantt_svg(
    plan_or_program: Plan | RProgram | Sequence[RProgram | OrdinaryCall],
    path: str | os.PathLike,
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
    concurrency: bool = True,
    width: int = 1400,
) -> PlanTiming:
    """Write a self-contained SVG Gantt chart: the chart of :func:`gantt`, in which each
    rTask bar carries a ``<title>`` (a browser shows it on hover: operator, rTask id, vEU,
    start and end) and is outlined under the pointer. Waits and ordinary calls have
    tooltips too. Same options as :func:`gantt`; returns the simulated timing."""
    lay = gantt_layout(
        plan_or_program,
        graph,
        vdevice,
        cost,
        title,
        color_by=color_by,
        labels=labels,
        window=window,
        program=program,
        max_veus=max_veus,
    )
    with open(os.fspath(path), "w", encoding="utf-8") as f:
        f.write(_svg(lay, width, concurrency))
    return lay.timing


def _svg(lay: GanttLayout, width: int, concurrency: bool) -> str:
    t0, t1 = lay.window
    rows = len(lay.veus)
    row_of = lay.rows
    label_chars = max([len(e.label) for e in lay.legend] + [52 if lay.labelled else 10])
    legend_w = min(6.6 * label_chars + 40, width * 0.4)
    row_chars = len(f"vEU {max(lay.veus, default=0)} (10.0% in barriers)") if rows <= 16 else 8
    left, top = max(60.0, 6.4 * row_chars + 16, 160.0 if concurrency else 0.0), 62.0
    pw = max(100.0, width - left - legend_w - 20)
    rh = min(max(560.0 / max(rows, 1), 3.0), 36.0)
    ph = rows * rh
    strip = 56.0 if concurrency else 0.0
    axis_y = top + ph + strip + (8 if concurrency else 0)
    height = max(axis_y + 44, top + 18 * len(lay.legend) + 30)
    us_px = (t1 - t0) / pw

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * pw

    def clip(a: float, b: float) -> tuple[float, float]:
        xa, xb = x(max(a, t0)), x(min(b, t1))
        return xa, max(xb - xa, 0.0)

    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" '
        f'viewBox="0 0 {width} {height:.0f}" font-family="DejaVu Sans, Arial, sans-serif" '
        'font-size="11">',
        "<style>rect.rtask:hover,rect.wait:hover,rect.call:hover{stroke:#000;"
        "stroke-width:1.5px}text{fill:#222}</style>",
        f'<defs><clipPath id="plot"><rect x="{left}" y="{top}" width="{pw:.2f}" '
        f'height="{ph + strip + 8:.2f}"/></clipPath>'
        '<pattern id="hatch" width="5" height="5" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="5" height="5" fill="{WAIT_COLOUR}"/>'
        f'<line x1="0" y1="0" x2="0" y2="5" stroke="{WAIT_EDGE}" stroke-width="1.2"/>'
        "</pattern></defs>",
        f'<rect width="{width}" height="{height:.0f}" fill="#ffffff"/>',
        f'<text x="10" y="20" font-size="13" font-weight="bold">{escape(lay.title)}</text>',
        f'<text x="10" y="38">{escape(lay.subtitle)}</text>',
    ]
    out.append('<g clip-path="url(#plot)">')
    for r in range(1, rows, 2):
        out.append(
            f'<rect x="{left}" y="{top + r * rh:.2f}" width="{pw:.2f}" height="{rh:.2f}" '
            f'fill="{ROW_SHADE}"/>'
        )
    for c in lay.launches:
        xa, w = clip(c.start_us, c.end_us)
        out.append(
            f'<rect class="launch" x="{xa:.2f}" y="{top}" width="{max(w, 0.5):.2f}" '
            f'height="{ph:.2f}" fill="{LAUNCH_COLOUR}"/>'
        )
    for c in lay.calls:
        xa, w = clip(c.start_us, c.end_us)
        tip = f"{c.op} (ordinary call, {c.kind}): start {c.start_us:.2f} us, end {c.end_us:.2f} us"
        out.append(
            f'<rect class="call" x="{xa:.2f}" y="{top}" width="{max(w, 0.5):.2f}" '
            f'height="{ph:.2f}" fill="{c.colour}" fill-opacity="0.75">'
            f"<title>{escape(tip)}</title></rect>"
        )
    pad = 0.1 * rh
    for b in lay.bars:
        xa, w = clip(b.start_us, b.end_us)
        out.append(
            f'<rect class="rtask" data-op={quoteattr(b.op)} x="{xa:.2f}" '
            f'y="{top + row_of[b.veu] * rh + pad:.2f}" width="{max(w, 0.3):.2f}" '
            f'height="{rh - 2 * pad:.2f}" fill="{b.colour}" stroke="#ffffff" '
            f'stroke-width="{0.5 if rh >= 6 else 0}"><title>{escape(lay.tooltip(b))}</title></rect>'
        )
        r = lay.rank(b.op)
        if r is not None and rh >= 10 and w >= 7 * len(str(r)) + 12:
            out.append(
                f'<text x="{xa + w / 2:.2f}" y="{top + (row_of[b.veu] + 0.5) * rh + 4:.2f}" '
                f'text-anchor="middle" font-size="{min(10.0, rh * 0.5):.1f}" '
                f'style="fill:{_text_colour(b.colour)};pointer-events:none">#{r}</text>'
            )
    wpad = 0.22 * rh
    for wt in lay.waits:
        xa, w = clip(wt.start_us, wt.end_us)
        tip = (
            f"vEU {wt.veu} in a barrier: arrives {wt.start_us:.2f} us, released "
            f"{wt.end_us:.2f} us, {wt.wait_us:.2f} us waiting for other vEUs"
        )
        out.append(
            f'<rect class="wait" x="{xa:.2f}" y="{top + row_of[wt.veu] * rh + wpad:.2f}" '
            f'width="{max(w, MIN_WAIT_PX):.2f}" height="{rh - 2 * wpad:.2f}" '
            f'fill="url(#hatch)" stroke="{WAIT_EDGE}" stroke-width="0.3">'
            f"<title>{escape(tip)}</title></rect>"
        )
    for v, t in lay.releases:
        xr = x(t)
        y = top + row_of[v] * rh
        out.append(
            f'<line x1="{xr:.2f}" y1="{y + pad:.2f}" x2="{xr:.2f}" y2="{y + rh - pad:.2f}" '
            'stroke="#000" stroke-width="1"/>'
        )
    if concurrency and lay.concurrency:
        ys0 = top + ph + strip
        top_n = max(lay.max_side_by_side, 1)
        scale = (strip - 10) / top_n
        pts = [(max(t, t0), n) for t, n in lay.concurrency if t < t1]
        d = [f"M{x(pts[0][0]) if pts else left:.2f},{ys0:.2f}"]
        for i, (t, n) in enumerate(pts):
            nxt = pts[i + 1][0] if i + 1 < len(pts) else t1
            d.append(f"L{x(t):.2f},{ys0 - n * scale:.2f}L{x(nxt):.2f},{ys0 - n * scale:.2f}")
        d.append(f"L{x(t1):.2f},{ys0:.2f}Z")
        out.append(f'<path d="{"".join(d)}" fill="#4c78a8" fill-opacity="0.55" stroke="#2b4f7a"/>')
    out.append("</g>")
    # frame, axes, ticks
    out.append(
        f'<rect x="{left}" y="{top}" width="{pw:.2f}" height="{ph:.2f}" fill="none" '
        'stroke="#444" stroke-width="0.8"/>'
    )
    if concurrency:
        out.append(
            f'<rect x="{left}" y="{top + ph + 8:.2f}" width="{pw:.2f}" height="{strip:.2f}" '
            'fill="none" stroke="#444" stroke-width="0.8"/>'
            f'<text x="{left - 8}" y="{top + ph + 8 + strip / 2 + 4:.2f}" text-anchor="end">'
            f"ops running (max {lay.max_side_by_side})</text>"
        )
    step = max(1, math.ceil(rows / 40))
    for r in range(0, rows, step):
        v = lay.veus[r]
        label = f"vEU {v}"
        if rows <= 16:
            label += f" ({_pct(lay.wait_us(v) / (t1 - t0))} in barriers)"
        out.append(
            f'<text x="{left - 6}" y="{top + (r + 0.5) * rh + 4:.2f}" text-anchor="end" '
            f'font-size="{min(11.0, max(7.0, rh * 0.9)):.1f}">{escape(label)}</text>'
        )
    if lay.hidden_veus:
        out.append(
            f'<text x="{left + pw:.2f}" y="{top - 6}" text-anchor="end" fill="#b00000" '
            f'style="fill:#b00000">+{lay.hidden_veus} vEUs not drawn</text>'
        )
    for t in _nice_ticks(t0, t1):
        xt = x(t)
        out.append(
            f'<line x1="{xt:.2f}" y1="{axis_y:.2f}" x2="{xt:.2f}" y2="{axis_y + 5:.2f}" '
            f'stroke="#444"/><text x="{xt:.2f}" y="{axis_y + 17:.2f}" '
            f'text-anchor="middle">{t:g}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2:.2f}" y="{axis_y + 34:.2f}" text-anchor="middle">'
        f"time (us, simulated; {us_px:.3g} us per pixel)</text>"
    )
    # legend
    lx = left + pw + 20
    y = top + 4
    if lay.labelled:
        out.append(
            f'<text x="{lx}" y="{y}" font-weight="bold">largest operators by time '
            f"(color_by={escape(lay.color_by)})</text>"
        )
        y += 18
    for e in lay.legend:
        if e.label.startswith("barrier wait"):
            sw = f'<rect x="{lx}" y="{y - 10}" width="14" height="11" fill="url(#hatch)"/>'
        elif e.label == "barrier release":
            sw = f'<line x1="{lx + 7}" y1="{y - 11}" x2="{lx + 7}" y2="{y + 1}" stroke="#000"/>'
        elif e.colour:
            sw = f'<rect x="{lx}" y="{y - 10}" width="14" height="11" fill="{e.colour}"/>'
        else:
            sw = ""
        out.append(f'{sw}<text x="{lx + 20}" y="{y}">{escape(e.label)}</text>')
        y += 18
    out.append("</svg>")
    return "\n".join(out) + "\n"
