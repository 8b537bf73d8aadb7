"""Gantt charts as self-contained SVG, in which hovering a bar names the rTask."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall, Plan
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from ..policies.cost import CostModel
from ..policies.simulate import PlanTiming
from .colours import LAUNCH_COLOUR, MIN_WAIT_PX, ROW_SHADE, WAIT_COLOUR, WAIT_EDGE, _text_colour
from .layout import GanttLayout, _pct, gantt_layout


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
    timing: PlanTiming | None = None,
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
        timing=timing,
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
        f"{lay.time_axis[:-1]}; {us_px:.3g} us per pixel)</text>"
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
