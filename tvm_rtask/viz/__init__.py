"""Pictures of plans: Gantt charts of the simulated run, one row per vEU.

:func:`gantt` writes a PNG (matplotlib's object API on the Agg canvas directly, no
``pyplot``: it works without a display and leaves the caller's matplotlib backend alone),
:func:`gantt_svg` a self-contained SVG in which hovering a bar names the rTask. Both draw
the same :class:`GanttLayout`, which :func:`gantt_layout` computes without drawing
(``layout.py``; colours in ``colours.py``, the PNG in ``png.py``, the SVG in ``svg.py``):

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

from .colours import COLOR_BY, KINDS, operator_kind
from .layout import GanttBar, GanttCall, GanttLayout, GanttWait, LegendEntry, gantt_layout
from .png import gantt, gantt_figure
from .svg import gantt_svg

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
