"""Pictures of plans: a Gantt chart of the simulated run, one row per vEU.

Drawing uses matplotlib's object API with the Agg canvas directly (no ``pyplot``), so it
works without a display and leaves the caller's matplotlib backend alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .core.graph import RGraph
from .core.plan import OrdinaryCall, Plan
from .core.rprogram import RProgram
from .core.vdevice import VDevice
from .errors import OptionError
from .schedule.cost import AnalyticalCostModel, CostModel
from .schedule.simulate import PlanTiming, simulate

_MAX_LEGEND = 24


def gantt(
    plan_or_program: Plan | RProgram | Sequence[RProgram | OrdinaryCall],
    path: str | os.PathLike,
    graph: RGraph | None = None,
    vdevice: VDevice | None = None,
    cost: CostModel | None = None,
    title: str | None = None,
    dpi: int = 100,
) -> PlanTiming:
    """Write a PNG Gantt chart of the simulated run of a plan (or one rProgram) to ``path``.

    One row per vEU; each rTask is a bar coloured by its operator; barriers are marked with
    a black tick where they release and a grey bar for the time spent waiting; launches are
    shaded and ordinary calls span all rows. ``graph`` and ``vdevice`` are needed unless a
    Plan is given; ``cost`` defaults to the analytical model. Returns the simulated timing.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

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
    cost = cost or AnalyticalCostModel()
    timing = simulate(steps, graph, vdevice, cost)
    n = vdevice.num_veu

    ops: list[str] = []
    for s in steps:
        ops.extend([s.op] if isinstance(s, OrdinaryCall) else s.ops())
    colour = _colours(ops)

    height = min(max(2.5, 0.22 * n + 1.6), 40.0)
    fig = Figure(figsize=(12, height), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bar_h = 0.8
    for st in timing.steps:
        if st.launch_us > 0:
            ax.axvspan(st.start_us, st.run_start_us, color="0.92", lw=0)
        if st.program is None:
            ax.barh(
                (n - 1) / 2,
                st.end_us - st.run_start_us,
                left=st.run_start_us,
                height=n,
                color=colour[st.name],
                hatch="//",
                edgecolor="0.3",
                lw=0.5,
            )
            continue
        t0 = st.run_start_us
        spans = st.program.spans
        if spans:
            keys = list(spans)
            ax.barh(
                [spans[k][0] for k in keys],
                [spans[k][2] - spans[k][1] for k in keys],
                left=[t0 + spans[k][1] for k in keys],
                height=bar_h,
                color=[colour[k[0]] for k in keys],
                edgecolor="white" if n <= 64 else "none",
                lw=0.3,
            )
        bars = st.program.barrier_spans
        if bars:
            waiting = [(v, a, e) for v, a, e in bars if e > a]
            if waiting:
                ax.barh(
                    [v for v, _, _ in waiting],
                    [e - a for _, a, e in waiting],
                    left=[t0 + a for _, a, _ in waiting],
                    height=bar_h * 0.35,
                    color="0.55",
                    lw=0,
                )
            ax.scatter(
                [t0 + e for _, _, e in bars],
                [v for v, _, _ in bars],
                marker="|",
                s=max(20.0, 120.0 * bar_h),
                c="black",
                linewidths=1.2,
                zorder=3,
            )
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, max(timing.total_us, 1e-9))
    ax.set_xlabel("time (us, simulated)")
    ax.set_ylabel("vEU")
    if n <= 40:
        ax.set_yticks(range(n))
    s = timing.summary()
    ax.set_title(
        f"{title or 'rProgram'}: {s['total_us']:.1f} us (ideal {s['ideal_us']:.1f}), "
        f"{s['launches']} launches, {s['barriers']} barriers, "
        f"utilisation {100 * s['utilisation']:.0f}%",
        fontsize=10,
    )
    if len(ops) <= _MAX_LEGEND:
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        handles = [Patch(color=colour[o], label=o) for o in ops]
        handles.append(Line2D([], [], color="black", marker="|", ls="", label="barrier"))
        ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=7,
            frameon=False,
        )
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")
    return timing


def _colours(ops: list[str]) -> dict[str, tuple]:
    """A distinct colour per operator (tab20 then hsv for more than twenty)."""
    from matplotlib import colormaps

    if len(ops) <= 20:
        cmap = colormaps["tab20"]
        return {op: cmap(i) for i, op in enumerate(ops)}
    cmap = colormaps["hsv"]
    return {op: cmap((i * 0.618033988749895) % 1.0) for i, op in enumerate(ops)}
