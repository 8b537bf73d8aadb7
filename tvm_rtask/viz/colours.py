"""Colours of Gantt charts: operator kinds, palettes that do not repeat, text on bars."""

from __future__ import annotations

import re

from ..core.graph import ROperator

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


def _bar_colour(color_by: str, colours: dict[str, str], op: str, wave: int) -> str:
    if color_by == "wave":
        return _WAVE_PALETTE[wave % len(_WAVE_PALETTE)]
    return colours[op]


def _text_colour(colour: str) -> str:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"
