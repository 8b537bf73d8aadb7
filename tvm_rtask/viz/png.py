"""Gantt charts as PNG, with matplotlib's object API on the Agg canvas (no ``pyplot``: it
works without a display and leaves the caller's matplotlib backend alone)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall, Plan
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from ..policies.cost import CostModel
from ..policies.simulate import PlanTiming
from .colours import LAUNCH_COLOUR, MIN_WAIT_PX, ROW_SHADE, WAIT_COLOUR, WAIT_EDGE, _text_colour
from .layout import GanttLayout, _pct, gantt_layout
from .svg import gantt_svg


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
    timing: PlanTiming | None = None,
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
        timing=timing,
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
        ax2.set_xlabel(lay.time_axis)
        ax2.set_xlim(t0, t1)
    else:
        ax.set_xlabel(lay.time_axis)

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
    timing: PlanTiming | None = None,
) -> PlanTiming:
    """Write a Gantt chart of the simulated run of a plan (or one rProgram) to ``path``:
    a PNG, or the hover SVG of :func:`gantt_svg` where ``path`` ends in ``.svg``.

    ``graph`` and ``vdevice`` are needed unless a Plan is given; ``cost`` defaults to the
    analytical model. ``color_by``: ``"operator"`` (the ``labels`` largest operators in
    distinct colours, the others pale by kind), ``"kind"`` or ``"wave"``; ``window=(t0_us,
    t1_us)`` or ``program=k`` (the k-th rProgram) zooms; ``max_veus`` caps the rows drawn;
    ``concurrency`` adds the strip counting operators running side by side; ``timing``, a
    measured timeline (``runtime.trace``), is drawn instead of the simulation. Returns the
    timing drawn.
    """
    opts = dict(
        color_by=color_by,
        labels=labels,
        window=window,
        program=program,
        max_veus=max_veus,
        timing=timing,
    )
    if os.fspath(path).lower().endswith(".svg"):
        return gantt_svg(
            plan_or_program, path, graph, vdevice, cost, title, concurrency=concurrency, **opts
        )
    fig, lay = gantt_figure(
        plan_or_program, graph, vdevice, cost, title, dpi, concurrency=concurrency, **opts
    )
    fig.savefig(os.fspath(path), format="png")
    return lay.timing
